#include "common/bf16.h"

#include <omp.h>

#include <algorithm>

#include "common/cpu_dispatch.h"

namespace herd {
namespace {

HERD_CPU_CLONES void Round(const float* __restrict in, uint16_t* __restrict out, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = FloatToBf16(in[i]);
}

HERD_CPU_CLONES void Widen(const uint16_t* __restrict in, float* __restrict out, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = Bf16ToFloat(in[i]);
}

constexpr int64_t kThreadedFrom = int64_t{1} << 20;

// f(lo, hi) over [0, n) in one part per thread, each a whole number of
// 64-byte lines of the output.
template <typename F>
void Split(int64_t n, F f) {
  if (n < kThreadedFrom) return f(0, n);
#pragma omp parallel
  {
    constexpr int64_t kLine = 32;
    const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t per = (n / threads + kLine - 1) / kLine * kLine;
    const int64_t a = std::min(n, t * per), b = t + 1 == threads ? n : std::min(n, a + per);
    if (a < b) f(a, b);
  }
}

}  // namespace

void FloatsToBf16(const float* in, uint16_t* out, int64_t n) {
  Split(n, [&](int64_t a, int64_t b) { Round(in + a, out + a, b - a); });
}

void Bf16ToFloats(const uint16_t* in, float* out, int64_t n) {
  Split(n, [&](int64_t a, int64_t b) { Widen(in + a, out + a, b - a); });
}

}  // namespace herd
