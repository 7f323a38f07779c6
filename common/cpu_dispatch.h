// Runtime dispatch of the memory-bound loops (AdamW, the servers' sums,
// bf16 rounding) over the vector ISAs of x86-64: a function marked
// HERD_CPU_CLONES is compiled for AVX-512 (x86-64-v4), AVX2 + FMA
// (x86-64-v3) and the build's baseline, and the loader picks the best the
// CPU has (GCC's and clang's target_clones, an ifunc). Elementwise
// arithmetic gives the same bits in every clone that has FMA (v3, v4, and
// a -march=native baseline on such a CPU); reductions are not cloned, so
// that their order stays the build's.
//
// GCC inlines into a clone only what is marked always_inline (the clone's
// arch differs from its callees'): a cloned loop calls builtins
// (__builtin_sqrtf, not std::sqrt) and always_inline helpers alone, or it
// runs scalar, calling out per element.
#pragma once

#include <string>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__)
#define HERD_CPU_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define HERD_CPU_CLONES
#endif

namespace herd {

// The clone HERD_CPU_CLONES functions run on this CPU: "avx512", "avx2"
// or "baseline" (what run headers and benchmarks print).
inline std::string CpuVectorIsa() {
#if defined(__x86_64__) && defined(__clang__)
  // clang 14 knows the levels' features, not their names.
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl")) {
    return "avx512";
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "avx2";
#elif defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("x86-64-v4")) return "avx512";
  if (__builtin_cpu_supports("x86-64-v3")) return "avx2";
#endif
  return "baseline";
}

}  // namespace herd
