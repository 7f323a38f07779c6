// bfloat16 conversions (the wire dtype for pushes and pulls, and a
// safetensors dtype): round to nearest even, NaN kept a NaN.
#pragma once

#include <bit>
#include <cstdint>

namespace herd {

inline float Bf16ToFloat(uint16_t bits) { return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16); }

inline uint16_t FloatToBf16(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// Loops the compiler vectorises.
inline void FloatsToBf16(const float* in, uint16_t* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = FloatToBf16(in[i]);
}
inline void Bf16ToFloats(const uint16_t* in, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = Bf16ToFloat(in[i]);
}

}  // namespace herd
