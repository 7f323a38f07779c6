#include "model/optim/adamw.h"

#include <algorithm>
#include <cmath>

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

void AdamWStep(const std::vector<DecaySegment>& segments, int64_t range_begin, float* params, const float* grads,
               float* m, float* v, int64_t step, double lr, double grad_scale, const AdamWOptions& o) {
  // Scalars are formed in double and rounded once, then the element math
  // runs in float in PyTorch's order of operations.
  const AdamWScalars k = MakeAdamWScalars(o, step, lr, grad_scale);
  const float b1 = k.beta1, one_minus_b1 = k.one_minus_beta1, b2 = k.beta2, one_minus_b2 = k.one_minus_beta2;
  const float step_size = k.step_size, bc2_sqrt = k.bc2_sqrt, eps = k.eps, scale = k.grad_scale;
  for (const DecaySegment& seg : segments) {
    const float decay = k.DecayFor(seg.decay);
    const int64_t lo = seg.begin - range_begin, hi = seg.end - range_begin;
#pragma omp parallel for simd schedule(static)
    for (int64_t i = lo; i < hi; ++i) {
      const float g = grads[i] * scale;
      const float p = params[i] * decay;
      const float mi = m[i] * b1 + g * one_minus_b1;
      const float vi = v[i] * b2 + (g * g) * one_minus_b2;
      m[i] = mi;
      v[i] = vi;
      params[i] = p - step_size * (mi / (std::sqrt(vi) / bc2_sqrt + eps));
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
    double s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t i = lo; i < hi; ++i) s += static_cast<double>(x[i]) * x[i];
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
