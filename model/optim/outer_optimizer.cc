#include "model/optim/outer_optimizer.h"

#include <algorithm>

#include "common/bf16.h"

namespace herd {

OuterOptimizer::OuterOptimizer(const OuterOptions& options, const float* weights, int64_t n, const float* momentum,
                               const float* error)
    : options_(options),
      outer_(weights, weights + n),
      momentum_(momentum != nullptr ? std::vector<float>(momentum, momentum + n) : std::vector<float>(n, 0.0f)),
      error_(error != nullptr ? std::vector<float>(error, error + n) : std::vector<float>()) {}

void OuterOptimizer::PseudoGradient(int64_t at, int64_t n, const float* weights, float* delta) const {
  const float* outer = outer_.data() + at;
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) delta[i] = outer[i] - weights[i];
}

void OuterOptimizer::RoundedPseudoGradient(int64_t at, int64_t n, const float* weights, float* delta) {
  if (error_.empty()) error_.assign(size(), 0.0f);
  const float* outer = outer_.data() + at;
  float* e = error_.data() + at;
  for (int64_t i = 0; i < n; ++i) {
    const float want = (outer[i] - weights[i]) + e[i];
    delta[i] = Bf16ToFloat(FloatToBf16(want));
    e[i] = want - delta[i];
  }
}

Status OuterOptimizer::QuantizedPseudoGradient(int64_t at, int64_t n, const float* weights, BlockCode code,
                                               uint8_t* out) {
  if (error_.empty()) error_.assign(size(), 0.0f);
  const float* outer = outer_.data() + at;
  float* e = error_.data() + at;
  // The error becomes what is wanted, then what its codes leave of it.
  for (int64_t i = 0; i < n; ++i) e[i] += outer[i] - weights[i];
  return QuantizeKeepingError(e, n, code, out);
}

void OuterOptimizer::Step(int64_t at, int64_t n, const float* summed, int regions) {
  const float r = static_cast<float>(regions), mu = static_cast<float>(options_.momentum),
              lr = static_cast<float>(options_.lr);
  float* outer = outer_.data() + at;
  float* b = momentum_.data() + at;
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float delta = summed[i] / r;
    b[i] = mu * b[i] + delta;
    outer[i] -= lr * (delta + mu * b[i]);
  }
}

}  // namespace herd
