// bfloat16 conversions (the wire dtype for pushes and pulls, and a
// safetensors dtype): round to nearest even, NaN kept a NaN.
#pragma once

#include <bit>
#include <cstdint>

namespace herd {

// Always inlined: they run inside the vector loops that common/cpu_dispatch.h
// clones per ISA, into which GCC inlines nothing else.
// (std::bit_cast is a function template, not inlined there: the builtin.)
#if defined(__CUDACC__)
#define HERD_BIT_CAST(T, x) std::bit_cast<T>(x)
#else
#define HERD_BIT_CAST(T, x) __builtin_bit_cast(T, x)
#endif
[[gnu::always_inline]] inline float Bf16ToFloat(uint16_t bits) {
  return HERD_BIT_CAST(float, static_cast<uint32_t>(bits) << 16);
}

[[gnu::always_inline]] inline uint16_t FloatToBf16(float x) {
  const uint32_t u = HERD_BIT_CAST(uint32_t, x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// The same over arrays, vectorised for the CPU they run on
// (common/cpu_dispatch.h) and, from a million elements up, split over the
// OpenMP threads: the bf16 wire's casts run at memory speed.
void FloatsToBf16(const float* in, uint16_t* out, int64_t n);
void Bf16ToFloats(const uint16_t* in, float* out, int64_t n);

}  // namespace herd
