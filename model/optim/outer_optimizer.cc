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

void OuterOptimizer::PseudoGradient(const float* weights, float* delta) const {
  const int64_t n = size();
  const float* outer = outer_.data();
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) delta[i] = outer[i] - weights[i];
}

void OuterOptimizer::RoundedPseudoGradient(const float* weights, float* delta) {
  const int64_t n = size();
  if (error_.empty()) error_.assign(n, 0.0f);
  const float* outer = outer_.data();
  float* e = error_.data();
  for (int64_t i = 0; i < n; ++i) {
    const float want = (outer[i] - weights[i]) + e[i];
    delta[i] = Bf16ToFloat(FloatToBf16(want));
    e[i] = want - delta[i];
  }
}

void OuterOptimizer::Step(const float* summed, int regions, float* weights) {
  const int64_t n = size();
  const float r = static_cast<float>(regions), mu = static_cast<float>(options_.momentum),
              lr = static_cast<float>(options_.lr);
  float* outer = outer_.data();
  float* b = momentum_.data();
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float delta = summed[i] / r;
    b[i] = mu * b[i] + delta;
    outer[i] -= lr * (delta + mu * b[i]);
    weights[i] = outer[i];
  }
}

}  // namespace herd
