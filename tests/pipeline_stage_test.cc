// Pipeline stages in one process: the layers cut by PipelineSplit, each
// stage a LlamaModel over its layers, the activations handed from stage to
// stage and their gradients back. Every stage that takes the micro-batches
// in ascending order accumulates bitwise the gradients one whole model
// does, whatever the order the stages interleave (GPipe's or 1F1B's); with
// tied embeddings the embedding's two parts (the head's on the last
// stage, the lookup's on the first) are summed in a fixed order, equal to
// one model's within float rounding (and bitwise for one micro-batch). A
// backward split into its input and weight parts (zero-bubble schedules),
// the weight parts run after every input part, adds the same bits. The
// split tiles the flat space in order and refuses bad inputs in one line.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "model/llama.h"
#include "model/param_layout.h"
#include "sharding/pipeline_split.h"

namespace herd {
namespace {

LlamaShape Shape(int layers, bool tied) {
  LlamaShape s;
  s.vocab_size = 97;
  s.hidden_size = 64;
  s.intermediate_size = 128;
  s.num_layers = layers;
  s.num_heads = 4;
  s.num_kv_heads = 2;
  s.tie_word_embeddings = tied;
  return s;
}

LlamaShape SmolLm135m() {
  LlamaShape s;
  s.vocab_size = 49152;
  s.hidden_size = 576;
  s.intermediate_size = 1536;
  s.num_layers = 30;
  s.num_heads = 9;
  s.num_kv_heads = 3;
  return s;
}

constexpr int B = 2, T = 12;

std::vector<int32_t> Tokens(const LlamaShape& s, int micro, int salt) {
  std::vector<int32_t> t(B * T);
  for (int i = 0; i < B * T; ++i) t[i] = (i * 31 + micro * 7 + salt) % s.vocab_size;
  return t;
}

struct Step {
  std::vector<double> losses;  // per micro-batch
  std::vector<float> grads;    // the whole flat space
};

// One model, micro-batch after micro-batch.
Step WholeModel(const LlamaShape& s, const std::vector<float>& w, int micro, Recompute recompute) {
  LlamaModel<float> model(s, B, T, recompute);
  Step out;
  out.grads.assign(w.size(), 0.0f);
  for (int m = 0; m < micro; ++m) {
    const auto x = Tokens(s, m, 0), y = Tokens(s, m, 5);
    out.losses.push_back(model.Forward(w.data(), x.data(), y.data(), B, T));
    model.Backward(w.data(), out.grads.data(), 1.0 / (B * T * micro));
  }
  return out;
}

enum class Order { kGPipe, kOneFOneB, kSplitBackward };

// The stages of `split` in one process. Each stage keeps its gradients in
// a flat buffer of its own; the step's gradient is each stage's range of
// its buffer, the tied embedding's two parts added last stage first.
Step Staged(const LlamaShape& s, const std::vector<float>& w, const PipelineSplit& split, int micro,
            Recompute recompute, Order order) {
  const int P = split.size();
  const int slots = order == Order::kOneFOneB ? P : micro;
  const bool split_backward = order == Order::kSplitBackward;
  std::vector<std::unique_ptr<LlamaModel<float>>> stages;
  std::vector<std::vector<float>> grads(P, std::vector<float>(w.size(), 0.0f));
  for (const PipelineStage& st : split.stages()) {
    stages.push_back(std::make_unique<LlamaModel<float>>(s, B, T, recompute, slots, st.layers, split_backward));
  }
  Step out;
  out.losses.assign(micro, 0.0);
  const double scale = 1.0 / (B * T * micro);
  std::vector<std::vector<int32_t>> x(micro), y(micro);
  for (int m = 0; m < micro; ++m) x[m] = Tokens(s, m, 0), y[m] = Tokens(s, m, 5);
  auto forward = [&](int m) {
    const float* input = nullptr;
    for (int p = 0; p < P; ++p) {
      const double loss = stages[p]->StageForward(m % slots, w.data(), x[m].data(), y[m].data(), input, B, T,
                                                  grads[p].data(), scale);
      if (p == P - 1) out.losses[m] = loss;
      input = stages[p]->StageOutput(m % slots);
    }
  };
  auto backward = [&](int m) {
    const float* output_grad = nullptr;
    for (int p = P - 1; p >= 0; --p) {
      if (split_backward) {
        stages[p]->StageBackwardInput(m % slots, w.data(), grads[p].data(), output_grad);
      } else {
        stages[p]->StageBackward(m % slots, w.data(), grads[p].data(), output_grad);
      }
      output_grad = p > 0 ? stages[p]->StageInputGrad(m % slots) : nullptr;
    }
  };
  if (split_backward) {
    // Every input part first, then the weight parts, micro-batch order.
    for (int m = 0; m < micro; ++m) forward(m);
    for (int m = 0; m < micro; ++m) backward(m);
    for (int m = 0; m < micro; ++m) {
      for (int p = 0; p < P; ++p) stages[p]->StageBackwardWeights(m % slots, grads[p].data());
    }
  } else if (order == Order::kGPipe) {
    for (int m = 0; m < micro; ++m) forward(m);
    for (int m = 0; m < micro; ++m) backward(m);
  } else {
    // At most P micro-batches in flight, as 1F1B's first stage holds.
    int next = 0;
    for (int m = 0; m < micro; ++m) {
      while (next < micro && next < m + P) forward(next++);
      backward(m);
    }
  }
  out.grads.assign(w.size(), 0.0f);
  for (int p = 0; p < P; ++p) {
    const ParamRange r = split.stage(p).params;
    std::memcpy(out.grads.data() + r.begin, grads[p].data() + r.begin, r.size() * sizeof(float));
  }
  if (split.stage(P - 1).reads_embedding) {
    const ParamLayout layout(s);
    const int64_t end = layout.layer(0).input_norm;
    for (int64_t i = 0; i < end; ++i) out.grads[i] = grads[P - 1][i] + grads[0][i];
  }
  return out;
}

std::vector<float> Weights(const LlamaShape& s) {
  const ParamLayout layout(s);
  std::vector<float> w(layout.size());
  InitParameters(layout, 7, 0.05, w.data());
  return w;
}

TEST(PipelineSplit, TilesTheFlatSpaceInOrderWithAtLeastOneLayerAStage) {
  for (bool tied : {true, false}) {
    for (int layers : {1, 4, 8, 30}) {
      const LlamaShape s = layers == 30 ? SmolLm135m() : Shape(layers, tied);
      const ParamLayout layout(s);
      for (int P = 1; P <= std::min(layers, 8); ++P) {
        auto split = PipelineSplit::Make(s, P, "", 1024);
        ASSERT_TRUE(split.ok()) << split.status().message();
        int64_t at = 0;
        int layer = 0;
        for (int p = 0; p < P; ++p) {
          const PipelineStage& st = split->stage(p);
          EXPECT_EQ(st.params.begin, at);
          EXPECT_EQ(st.layers.first, layer);
          EXPECT_GE(st.layers.end - st.layers.first, 1);
          EXPECT_EQ(st.reads_embedding, s.tie_word_embeddings && p == P - 1 && P > 1);
          at = st.params.end;
          layer = st.layers.end;
        }
        EXPECT_EQ(at, layout.size());
        EXPECT_EQ(layer, layers);
      }
    }
  }
}

TEST(PipelineSplit, BalancesFlopsWithTheHeadOnTheLastStage) {
  // Uniform layers and a small head: as even as the layers allow, the
  // extra layers on the earlier stages.
  EXPECT_EQ(PipelineSplit::Make(Shape(8, true), 2, "", 12)->Describe(), "0,4");
  EXPECT_EQ(PipelineSplit::Make(Shape(8, true), 3, "", 12)->Describe(), "0,3,6");
  // SmolLM-135M: the head (6 x 576 x 49152 FLOPs a token) weighs about
  // six layers at 1024 tokens, so the last stage takes fewer layers, and
  // no stage costs more than the costliest layer above the even share.
  auto split = PipelineSplit::Make(SmolLm135m(), 4, "", 1024);
  ASSERT_TRUE(split.ok());
  const auto& st = split->stages();
  EXPECT_LT(st[3].layers.end - st[3].layers.first, st[0].layers.end - st[0].layers.first);
  double total = 0, most = 0, layer = st[0].flops_per_token / (st[0].layers.end - st[0].layers.first);
  for (const PipelineStage& p : st) total += p.flops_per_token, most = std::max(most, p.flops_per_token);
  EXPECT_LE(most, total / 4 + layer);
  // An explicit split is taken as it is.
  EXPECT_EQ(PipelineSplit::Make(SmolLm135m(), 4, "0, 6,12,18", 1024)->Describe(), "0,6,12,18");
}

TEST(PipelineSplit, RefusesBadSplitsInOneLine) {
  const LlamaShape s = Shape(4, true);
  auto error = [&](int stages, const char* split) {
    auto r = PipelineSplit::Make(s, stages, split, 12);
    EXPECT_FALSE(r.ok()) << split;
    const std::string m = r.ok() ? "" : r.status().message();
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
    return m;
  };
  EXPECT_NE(error(5, "").find("model has 4 layers"), std::string::npos);
  EXPECT_NE(error(2, "0,2,3").find("expected 2 first layers"), std::string::npos);
  EXPECT_NE(error(2, "1,3").find("start at layer 0"), std::string::npos);
  EXPECT_NE(error(3, "0,2,2").find("not increasing"), std::string::npos);
  EXPECT_NE(error(2, "0,4").find("model has 4 layers"), std::string::npos);
  EXPECT_NE(error(2, "0,x").find("not a layer number"), std::string::npos);
  EXPECT_NE(error(0, "").find("must be >= 1"), std::string::npos);
}

TEST(PipelineStages, AccumulateTheWholeModelsGradientsBitwiseWhenUntied) {
  for (int layers : {4, 8}) {
    const LlamaShape s = Shape(layers, /*tied=*/false);
    const auto w = Weights(s);
    for (Recompute recompute : {Recompute::kNone, Recompute::kFull}) {
      const Step whole = WholeModel(s, w, 4, recompute);
      for (int P = 1; P <= 4; ++P) {
        const PipelineSplit split = *PipelineSplit::Make(s, P, "", T);
        for (Order order : {Order::kGPipe, Order::kOneFOneB}) {
          const Step staged = Staged(s, w, split, 4, recompute, order);
          EXPECT_EQ(staged.losses, whole.losses) << "P=" << P;
          EXPECT_EQ(std::memcmp(staged.grads.data(), whole.grads.data(), w.size() * sizeof(float)), 0)
              << "layers " << layers << " P=" << P << " order " << static_cast<int>(order);
        }
      }
    }
  }
}

TEST(PipelineStages, SplitTheirBackwardIntoInputAndWeightPartsBitwise) {
  const LlamaShape s = Shape(4, /*tied=*/false);
  const auto w = Weights(s);
  const Step whole = WholeModel(s, w, 3, Recompute::kNone);
  for (int P = 1; P <= 4; ++P) {
    const Step staged = Staged(s, w, *PipelineSplit::Make(s, P, "", T), 3, Recompute::kNone, Order::kSplitBackward);
    EXPECT_EQ(staged.losses, whole.losses);
    EXPECT_EQ(std::memcmp(staged.grads.data(), whole.grads.data(), w.size() * sizeof(float)), 0) << "P=" << P;
  }
}

TEST(PipelineStages, SumTheTiedEmbeddingsTwoPartsInAFixedOrder) {
  const LlamaShape s = Shape(4, /*tied=*/true);
  const ParamLayout layout(s);
  const auto w = Weights(s);
  const int64_t embed_end = layout.layer(0).input_norm;
  for (int micro : {1, 3}) {
    const Step whole = WholeModel(s, w, micro, Recompute::kNone);
    for (int P = 2; P <= 4; ++P) {
      const Step staged = Staged(s, w, *PipelineSplit::Make(s, P, "", T), micro, Recompute::kNone, Order::kOneFOneB);
      EXPECT_EQ(staged.losses, whole.losses);
      // Past the embedding: bitwise.
      EXPECT_EQ(std::memcmp(staged.grads.data() + embed_end, whole.grads.data() + embed_end,
                            (w.size() - embed_end) * sizeof(float)),
                0);
      // The embedding: head part + lookup part, against one model's
      // per-micro-batch interleaving of the two; one micro-batch adds them
      // in the same order.
      // Reordered float sums: measured against the largest element (an
      // element that nearly cancels may differ more relative to itself).
      double worst = 0, largest = 0;
      for (int64_t i = 0; i < embed_end; ++i) largest = std::max(largest, std::abs(double{whole.grads[i]}));
      for (int64_t i = 0; i < embed_end; ++i) {
        const double a = staged.grads[i], b = whole.grads[i];
        worst = std::max(worst, std::abs(a - b) / largest);
        if (micro == 1) {
          ASSERT_EQ(staged.grads[i], whole.grads[i]) << i;
        }
      }
      EXPECT_LT(worst, 1e-5) << "P=" << P << " micro " << micro;
    }
  }
}

TEST(PipelineStages, AllocateActivationsForTheirOwnLayersOnly) {
  const LlamaShape s = Shape(8, true);
  const int64_t whole = LlamaModel<float>::ActivationBytes(s, B, T, Recompute::kNone, 1);
  const PipelineSplit split = *PipelineSplit::Make(s, 4, "", T);
  int64_t largest = 0;
  for (const PipelineStage& st : split.stages()) {
    largest = std::max(largest, LlamaModel<float>::ActivationBytes(s, B, T, Recompute::kNone, 1, st.layers));
  }
  // Two layers of eight, the head's buffers on one stage only.
  EXPECT_LT(largest, whole / 2);
}

}  // namespace
}  // namespace herd
