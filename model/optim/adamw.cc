#include "model/optim/adamw.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "common/bf16.h"
#include "common/cpu_dispatch.h"

namespace herd {

std::vector<DecaySegment> DecaySegments(const ParamLayout& layout, int64_t begin, int64_t end) {
  std::vector<DecaySegment> segments;
  int64_t cursor = begin;
  for (const TensorSpec& t : layout.tensors()) {
    int64_t lo = std::max(begin, t.offset), hi = std::min(end, t.offset + t.numel);
    if (lo >= hi) continue;
    if (cursor < lo) segments.push_back({cursor, lo, false});  // alignment padding
    segments.push_back({lo, hi, t.decay()});
    cursor = hi;
  }
  if (cursor < end) segments.push_back({cursor, end, false});
  return segments;
}

AdamWScalars MakeAdamWScalars(const AdamWOptions& o, int64_t step, double lr, double grad_scale) {
  const double bc1 = 1.0 - std::pow(o.beta1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(o.beta2, static_cast<double>(step));
  AdamWScalars k;
  k.beta1 = static_cast<float>(o.beta1);
  k.one_minus_beta1 = static_cast<float>(1.0 - o.beta1);
  k.beta2 = static_cast<float>(o.beta2);
  k.one_minus_beta2 = static_cast<float>(1.0 - o.beta2);
  k.step_size = static_cast<float>(lr / bc1);
  k.bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  k.eps = static_cast<float>(o.eps);
  k.grad_scale = static_cast<float>(grad_scale);
  k.decay = static_cast<float>(1.0 - lr * o.weight_decay);
  return k;
}

namespace {

// One thread's part of one segment: AdamWStep's element arithmetic, in
// PyTorch's order, with the gradients' type and the bf16 copy chosen at
// compile time.
template <typename Grad, bool kWeightsBf16>
[[gnu::always_inline]] inline void AdamWLoop(const AdamWScalars& k, float decay, float* __restrict params,
                                             const Grad* __restrict grads, float* __restrict m, float* __restrict v,
                                             uint16_t* __restrict weights_bf16, int64_t n) {
  const float b1 = k.beta1, one_minus_b1 = k.one_minus_beta1, b2 = k.beta2, one_minus_b2 = k.one_minus_beta2;
  const float step_size = k.step_size, bc2_sqrt = k.bc2_sqrt, eps = k.eps, scale = k.grad_scale;
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    float gi;
    if constexpr (std::is_same_v<Grad, uint16_t>) {
      gi = Bf16ToFloat(grads[i]);
    } else {
      gi = grads[i];
    }
    const float g = gi * scale;
    const float p = params[i] * decay;
    const float mi = m[i] * b1 + g * one_minus_b1;
    const float vi = v[i] * b2 + (g * g) * one_minus_b2;
    m[i] = mi;
    v[i] = vi;
    const float out = p - step_size * (mi / (__builtin_sqrtf(vi) / bc2_sqrt + eps));
    params[i] = out;
    if constexpr (kWeightsBf16) weights_bf16[i] = FloatToBf16(out);
  }
}

#define HERD_ADAMW_SPAN(name, Grad, bf16_out)                                                                  \
  HERD_CPU_CLONES void name(const AdamWScalars& k, float decay, float* params, const Grad* grads, float* m,    \
                            float* v, uint16_t* weights_bf16, int64_t n) {                                    \
    AdamWLoop<Grad, bf16_out>(k, decay, params, grads, m, v, weights_bf16, n);                                \
  }
HERD_ADAMW_SPAN(AdamWSpan, float, false)
HERD_ADAMW_SPAN(AdamWSpanToBf16, float, true)
HERD_ADAMW_SPAN(AdamWSpanFromBf16, uint16_t, false)
HERD_ADAMW_SPAN(AdamWSpanBf16, uint16_t, true)
#undef HERD_ADAMW_SPAN

template <typename Grad>
void AdamWSegment(const AdamWScalars& k, float decay, float* params, const Grad* grads, float* m, float* v,
                  uint16_t* weights_bf16, int64_t n) {
  if constexpr (std::is_same_v<Grad, uint16_t>) {
    if (weights_bf16 != nullptr) return AdamWSpanBf16(k, decay, params, grads, m, v, weights_bf16, n);
    return AdamWSpanFromBf16(k, decay, params, grads, m, v, nullptr, n);
  } else {
    if (weights_bf16 != nullptr) return AdamWSpanToBf16(k, decay, params, grads, m, v, weights_bf16, n);
    return AdamWSpan(k, decay, params, grads, m, v, nullptr, n);
  }
}

// [lo, hi) cut into one part per thread, each a whole number of 64-byte
// lines of floats (the split does not change any element's arithmetic).
template <typename Grad>
void AdamWThreads(const AdamWScalars& k, float decay, float* params, const Grad* grads, float* m, float* v,
                  uint16_t* weights_bf16, int64_t lo, int64_t hi) {
  constexpr int64_t kLine = 16;
  const int64_t n = hi - lo;
#pragma omp parallel if (n >= 4 * 4096)
  {
    const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t per = (n / threads + kLine - 1) / kLine * kLine;
    const int64_t a = std::min(n, t * per), b = t + 1 == threads ? n : std::min(n, a + per);
    if (a < b) {
      AdamWSegment(k, decay, params + lo + a, grads + lo + a, m + lo + a, v + lo + a,
                   weights_bf16 == nullptr ? nullptr : weights_bf16 + lo + a, b - a);
    }
  }
}

}  // namespace

void AdamWStep(const std::vector<DecaySegment>& segments, int64_t range_begin, float* params, const float* grads,
               float* m, float* v, int64_t step, double lr, double grad_scale, const AdamWOptions& o) {
  AdamWStep(segments, range_begin, params, AdamWStreams{grads, nullptr, nullptr}, m, v, step, lr, grad_scale, o);
}

void AdamWStep(const std::vector<DecaySegment>& segments, int64_t range_begin, float* params,
               const AdamWStreams& io, float* m, float* v, int64_t step, double lr, double grad_scale,
               const AdamWOptions& o) {
  // Scalars are formed in double and rounded once, then the element math
  // runs in float in PyTorch's order of operations.
  const AdamWScalars k = MakeAdamWScalars(o, step, lr, grad_scale);
  for (const DecaySegment& seg : segments) {
    const float decay = k.DecayFor(seg.decay);
    const int64_t lo = seg.begin - range_begin, hi = seg.end - range_begin;
    if (io.grads_bf16 != nullptr) {
      AdamWThreads(k, decay, params, io.grads_bf16, m, v, io.weights_bf16, lo, hi);
    } else {
      AdamWThreads(k, decay, params, io.grads, m, v, io.weights_bf16, lo, hi);
    }
  }
}

double LearningRate(const LrSchedule& s, int64_t t) {
  const int64_t warmup = s.warmup_steps;
  if (t < warmup) return s.lr * static_cast<double>(t + 1) / static_cast<double>(warmup);
  const int64_t decay_steps = s.total_steps - warmup;
  if (decay_steps <= 1) return s.lr;
  double ratio = static_cast<double>(t - warmup) / static_cast<double>(decay_steps - 1);
  ratio = std::clamp(ratio, 0.0, 1.0);
  const double coeff = 0.5 * (1.0 + std::cos(M_PI * ratio));
  return s.min_lr + coeff * (s.lr - s.min_lr);
}

double SumOfSquares(const float* x, int64_t n) {
  constexpr int64_t kChunk = kSumOfSquaresChunk;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> partial(chunks);
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t lo = c * kChunk, hi = std::min(n, lo + kChunk);
    partial[c] = ChunkSumOfSquares(x + lo, hi - lo);
  }
  double total = 0;
  for (double s : partial) total += s;
  return total;
}

double SumOfSquaresBf16(const uint16_t* x, int64_t n) {
  constexpr int64_t kChunk = kSumOfSquaresChunk;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> partial(chunks);
#pragma omp parallel for schedule(static) if (chunks >= 4)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t lo = c * kChunk, hi = std::min(n, lo + kChunk);
    double s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t i = lo; i < hi; ++i) {
      const double xi = Bf16ToFloat(x[i]);
      s += xi * xi;
    }
    partial[c] = s;
  }
  double total = 0;
  for (double s : partial) total += s;
  return total;
}

double ClipCoefficient(double global_norm, double clip_norm) {
  if (clip_norm <= 0) return 1.0;
  return std::min(1.0, clip_norm / (global_norm + 1e-6));
}

}  // namespace herd
