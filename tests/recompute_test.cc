// train.recompute: the CPU model that keeps fewer activations and
// recomputes the rest in backward gives the same loss, the same gradients
// and the same order of final_from calls, bit for bit, as the one that
// keeps everything (micro-batches accumulated, at any thread count the two
// share); and the activation table it allocates shrinks by exactly what
// it no longer keeps.
#include <gtest/gtest.h>
#include <omp.h>

#include <cstring>
#include <vector>

#include "model/llama.h"
#include "model/param_layout.h"

namespace herd {
namespace {

LlamaShape Shape(bool tied) {
  LlamaShape s;
  s.vocab_size = 97;
  s.hidden_size = 48;
  s.intermediate_size = 112;
  s.num_layers = 3;
  s.num_heads = 6;
  s.num_kv_heads = 2;
  s.tie_word_embeddings = tied;
  return s;
}

struct Result {
  std::vector<double> losses;
  std::vector<float> grads;
  std::vector<int64_t> final_from;
};

// Two micro-batches (the second shorter), forward and backward each.
Result Train(const LlamaShape& shape, Recompute recompute, int threads) {
  omp_set_num_threads(threads);
  const ParamLayout layout(shape);
  std::vector<float> params(layout.size());
  InitParameters(layout, 11, 0.05, params.data());
  constexpr int B = 3, T = 20;
  LlamaModel<float> model(shape, B, T, recompute);
  Result r;
  r.grads.assign(layout.size(), 0.0f);
  for (int micro = 0; micro < 2; ++micro) {
    const int t = micro == 0 ? T : T - 7;
    std::vector<int32_t> tokens(B * t), targets(B * t);
    for (int i = 0; i < B * t; ++i) {
      tokens[i] = (i * 31 + micro * 7) % shape.vocab_size;
      targets[i] = (i * 17 + 5 + micro) % shape.vocab_size;
    }
    r.losses.push_back(model.Forward(params.data(), tokens.data(), targets.data(), B, t));
    model.Backward(params.data(), r.grads.data(), 1.0 / (2 * B * t),
                   [&](int64_t offset) { r.final_from.push_back(offset); });
  }
  return r;
}

TEST(Recompute, AttentionAndFullGiveTheSameGradientsBitForBit) {
  for (bool tied : {true, false}) {
    for (int threads : {1, 3}) {
      const Result none = Train(Shape(tied), Recompute::kNone, threads);
      for (Recompute mode : {Recompute::kAttention, Recompute::kFull}) {
        const Result r = Train(Shape(tied), mode, threads);
        const char* name = mode == Recompute::kFull ? "FULL" : "ATTENTION";
        EXPECT_EQ(r.losses, none.losses) << name << ", tied " << tied << ", threads " << threads;
        EXPECT_EQ(r.final_from, none.final_from) << name;
        ASSERT_EQ(r.grads.size(), none.grads.size());
        EXPECT_EQ(std::memcmp(r.grads.data(), none.grads.data(), r.grads.size() * sizeof(float)), 0)
            << name << ", tied " << tied << ", threads " << threads;
      }
    }
  }
}

TEST(Recompute, KeepsOnlyWhatItSays) {
  const LlamaShape s = Shape(true);
  const int B = 4, T = 64;
  const int64_t N = B * T, L = s.num_layers, d = s.hidden_size, f = s.intermediate_size;
  const int64_t probs = int64_t{B} * s.num_heads * T * T;
  // Per layer besides the probabilities: ln1, q, k, v, att, mid, ln2 and
  // gate, up, act, and the two norms' 1/rms.
  const int64_t layer = N * (d + s.q_dim() + 2 * s.kv_dim() + s.q_dim() + d + d + 3 * f) + 2 * N;
  const int64_t none = LlamaModel<float>::ActivationBytes(s, B, T, Recompute::kNone);
  const int64_t attention = LlamaModel<float>::ActivationBytes(s, B, T, Recompute::kAttention);
  const int64_t full = LlamaModel<float>::ActivationBytes(s, B, T, Recompute::kFull);
  EXPECT_EQ(none - attention, (L - 1) * probs * 4);
  EXPECT_EQ(attention - full, (L - 1) * layer * 4);
}

}  // namespace
}  // namespace herd
