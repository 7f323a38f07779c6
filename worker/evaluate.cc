#include "worker/evaluate.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/rng.h"

namespace herd {

StatusOr<EvalResult> EvaluateLoss(LlamaModel<float>& model, const float* params, const TokenFile& file, int B,
                                  int T, int64_t batches) {
  const int64_t windows_in_file = (file.size() - 1) / T;
  const int64_t full_batches = windows_in_file / B;
  if (batches <= 0) batches = full_batches;
  if (full_batches < batches || batches == 0) {
    return Status::InvalidArgument(file.path() + ": " + std::to_string(file.size()) + " tokens, but " +
                                   std::to_string(std::max<int64_t>(batches, 1)) + " batches of " +
                                   std::to_string(B) + "x" + std::to_string(T) + " need " +
                                   std::to_string(std::max<int64_t>(batches, 1) * B * T + 1));
  }
  std::vector<int32_t> window(T + 1), inputs(static_cast<size_t>(B) * T), targets(inputs.size());
  double total = 0;
  for (int64_t b = 0; b < batches; ++b) {
    for (int j = 0; j < B; ++j) {
      file.Read((b * B + j) * T, T + 1, window.data());
      std::copy(window.begin(), window.begin() + T, inputs.begin() + j * T);
      std::copy(window.begin() + 1, window.end(), targets.begin() + j * T);
    }
    total += model.Forward(params, inputs.data(), targets.data(), B, T);
  }
  EvalResult r;
  r.loss = total / static_cast<double>(batches);
  r.tokens = batches * B * T;
  return r;
}

std::vector<int32_t> Generate(LlamaModel<float>& model, const float* params, std::vector<int32_t> tokens, int count,
                              double temperature, uint64_t seed) {
  Rng rng(seed);
  const int V = model.shape().vocab_size;
  std::vector<double> probs(V);
  if (tokens.empty()) tokens.push_back(0);
  for (int n = 0; n < count; ++n) {
    const int T = std::min<int>(static_cast<int>(tokens.size()), model.max_seq_len());
    const int32_t* context = tokens.data() + tokens.size() - T;
    model.Forward(params, context, nullptr, 1, T);
    const float* logits = model.logits() + static_cast<int64_t>(T - 1) * V;
    int32_t next = 0;
    if (temperature <= 0) {
      next = static_cast<int32_t>(std::max_element(logits, logits + V) - logits);
    } else {
      const double mx = *std::max_element(logits, logits + V);
      double sum = 0;
      for (int i = 0; i < V; ++i) sum += probs[i] = std::exp((logits[i] - mx) / temperature);
      double u = rng.Uniform() * sum;
      next = V - 1;
      for (int i = 0; i < V; ++i) {
        if ((u -= probs[i]) < 0) {
          next = i;
          break;
        }
      }
    }
    tokens.push_back(next);
  }
  return tokens;
}

}  // namespace herd
