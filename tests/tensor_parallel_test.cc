// Tensor parallelism in one process: T ranks, each a thread computing a
// LlamaModel of its slice's shape (sharding/tensor_slices.h) on the
// weights packed from the flat space, the ranks' sums done by an
// in-process all-reduce (ranks in order, the same bits on every rank).
//
//  - Against one whole model on the same micro-batches: the losses within
//    1e-6 relative and every gradient, unpacked into the flat space,
//    within 1e-5 relative plus 2e-6 of its tensor's largest
//    (ExpectGradientsMatch; fp32: the row-parallel products and the
//    cross-entropy add their parts in another order), tied and untied,
//    T = 2 and 4, grouped-query attention; every rank computes the same
//    loss and the same norm gradients, bit for bit.
//  - A finite-difference check in double of every rank's every weight
//    (the vocabulary-parallel embedding and cross-entropy, the split
//    attention and MLP) at T = 2, five-point stencil, h = 2e-4, the
//    tolerance of tests/gradcheck_test.cc: |a - n| <= 1e-7 (|a| + |n|) +
//    1e-10 max(1, |L|).
//  - Pack and Unpack: every element of every tensor belongs to exactly one
//    rank but the norms, which are every rank's; Ranges() lists them.
//  - Shapes T does not divide are refused in one line naming the field.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

#include "model/llama.h"
#include "model/param_layout.h"
#include "sharding/tensor_slices.h"
#include "tests/in_process_group.h"

namespace herd {
namespace {

constexpr int B = 2, T = 12, kMicro = 2;

std::vector<int32_t> Tokens(const LlamaShape& s, int micro, int salt) {
  std::vector<int32_t> t(B * T);
  for (int i = 0; i < B * T; ++i) t[i] = (i * 31 + micro * 7 + salt) % s.vocab_size;
  return t;
}

// Each rank's model on its packed slice of `flat`, in a group summing over
// `sum`.
template <typename V>
struct Rank {
  TensorSlices slices;
  std::unique_ptr<LlamaModel<V>> model;
  std::vector<V> weights, grads;
};

template <typename V>
std::vector<Rank<V>> MakeRanks(const LlamaShape& shape, int ranks, const std::vector<float>& flat, InProcessSum<V>* sum,
                               int batch, int seq, bool sequence_parallel = false) {
  std::vector<Rank<V>> out;
  for (int r = 0; r < ranks; ++r) {
    auto slices = TensorSlices::Make(shape, ranks, r);
    EXPECT_TRUE(slices.ok()) << slices.status().message();
    Rank<V> k{*slices,
              std::make_unique<LlamaModel<V>>(slices->shape(), batch, seq, Recompute::kNone, 1, LayerRange{}, false,
                                              TokenSplit{sequence_parallel ? ranks : 1, 1}),
              {},
              {}};
    std::vector<float> packed(slices->layout().size(), 0.0f);
    slices->Pack(flat.data(), packed.data());
    k.weights.assign(packed.begin(), packed.end());
    k.grads.assign(packed.size(), V(0));
    TensorGroup<V> group;
    group.ranks = ranks;
    group.rank = r;
    group.vocab_first = slices->vocab_first();
    group.all_reduce = [sum, r](V* data, int64_t n) { sum->AllReduce(r, data, n); };
    group.sequence_parallel = sequence_parallel;
    group.all_gather = [sum, r](V* data, const Partition& parts) { sum->AllGather(r, data, parts); };
    group.reduce_scatter = [sum, r](V* data, const Partition& parts) { sum->ReduceScatter(r, data, parts); };
    k.model->SetTensorGroup(std::move(group));
    out.push_back(std::move(k));
  }
  return out;
}

// Sequence parallelism leaves each rank its rows' part of the norms'
// gradients: summed over the ranks (rank order), as the worker does.
template <typename V>
void SumNormGradients(std::vector<Rank<V>>& rk) {
  for (const TensorSpec& t : rk[0].slices.layout().tensors()) {
    if (t.shape.size() != 1) continue;
    for (int64_t i = t.offset; i < t.offset + t.numel; ++i) {
      V sum = 0;
      for (const Rank<V>& k : rk) sum += k.grads[i];
      for (Rank<V>& k : rk) k.grads[i] = sum;
    }
  }
}

TEST(TensorParallel, MatchesTheWholeModel) {
  for (bool tied : {true, false}) {
    for (int ranks : {2, 4}) {
      for (bool sp : {false, true}) {
        SCOPED_TRACE(testing::Message() << (tied ? "tied" : "untied") << ", T=" << ranks << (sp ? " + SP" : ""));
        const LlamaShape shape = GroupTestShape(tied);
        const ParamLayout layout(shape);
        std::vector<float> flat(layout.size());
        InitParameters(layout, 5, 0.05, flat.data());
        // One whole model.
        LlamaModel<float> whole(shape, B, T);
        std::vector<float> whole_grads(layout.size(), 0.0f);
        std::vector<double> whole_losses;
        for (int m = 0; m < kMicro; ++m) {
          whole_losses.push_back(
              whole.Forward(flat.data(), Tokens(shape, m, 0).data(), Tokens(shape, m, 5).data(), B, T));
          whole.Backward(flat.data(), whole_grads.data(), 1.0 / (kMicro * B * T));
        }
        // T ranks.
        InProcessSum<float> sum(ranks);
        std::vector<Rank<float>> rk = MakeRanks<float>(shape, ranks, flat, &sum, B, T, sp);
        std::vector<std::vector<double>> losses(ranks);
        OnRanks(ranks, [&](int r) {
          for (int m = 0; m < kMicro; ++m) {
            losses[r].push_back(rk[r].model->Forward(rk[r].weights.data(), Tokens(shape, m, 0).data(),
                                                     Tokens(shape, m, 5).data(), B, T));
            rk[r].model->Backward(rk[r].weights.data(), rk[r].grads.data(), 1.0 / (kMicro * B * T));
          }
        });
        if (sp) SumNormGradients(rk);
        for (int r = 1; r < ranks; ++r) EXPECT_EQ(losses[r], losses[0]) << "rank " << r;
        for (int m = 0; m < kMicro; ++m) EXPECT_NEAR(losses[0][m], whole_losses[m], 1e-6 * whole_losses[m]);
        // Every rank's gradients in the flat space; the norms' alike on all.
        std::vector<float> tp_grads(layout.size(), 0.0f);
        rk[0].slices.Unpack(rk[0].grads.data(), tp_grads.data());
        for (int r = 1; r < ranks; ++r) {
          std::vector<float> mine(layout.size(), 0.0f);
          rk[r].slices.Unpack(rk[r].grads.data(), mine.data());
          for (const TensorSpec& t : layout.tensors()) {
            const bool norm = t.shape.size() == 1;
            for (int64_t i = t.offset; i < t.offset + t.numel; ++i) {
              if (norm) {
                ASSERT_EQ(mine[i], tp_grads[i]) << t.name << " on rank " << r;
              } else if (mine[i] != 0.0f) {
                tp_grads[i] = mine[i];
              }
            }
          }
        }
        const double used = ExpectGradientsMatch(layout, whole_grads, tp_grads);
        std::printf("[ tensor parallel ] %s T=%d%s: loss off by %.2e relative, gradients at %.2f of their "
                    "tolerance\n", tied ? "tied" : "untied", ranks, sp ? " + SP" : "",
                    std::fabs(losses[0][0] - whole_losses[0]) / whole_losses[0], used);
      }
    }
  }
}

// The mean loss of one micro-batch through the ranks (every rank the same).
double RankLoss(std::vector<Rank<double>>& rk, const std::vector<int32_t>& x, const std::vector<int32_t>& y, int seq) {
  std::vector<double> loss(rk.size());
  OnRanks(static_cast<int>(rk.size()),
          [&](int r) { loss[r] = rk[r].model->Forward(rk[r].weights.data(), x.data(), y.data(), 1, seq); });
  return loss[0];
}

// Every rank's every weight against finite differences of the ranks' loss;
// with sequence parallelism the 5 tokens split 3 + 2, so uneven rows too.
void CheckFiniteDifferences(bool sequence_parallel) {
  LlamaShape shape;
  shape.vocab_size = 12;
  shape.hidden_size = 8;
  shape.intermediate_size = 8;
  shape.num_layers = 1;
  shape.num_heads = 2;
  shape.num_kv_heads = 2;
  shape.tie_word_embeddings = false;
  const int ranks = 2, seq = 5;
  const ParamLayout layout(shape);
  std::vector<float> flat(layout.size());
  InitParameters(layout, 3, 0.3, flat.data());
  // Norm weights away from 1, so that their gradients are checked on
  // something other than the identity.
  for (const TensorSpec& t : layout.tensors()) {
    if (t.shape.size() == 1) {
      for (int64_t i = 0; i < t.numel; ++i) flat[t.offset + i] = 0.7f + 0.05f * static_cast<float>(i % 7);
    }
  }
  InProcessSum<double> sum(ranks);
  std::vector<Rank<double>> rk = MakeRanks<double>(shape, ranks, flat, &sum, 1, seq, sequence_parallel);
  const std::vector<int32_t> x{1, 7, 3, 11, 4}, y{7, 3, 11, 4, 9};
  OnRanks(ranks, [&](int r) {
    rk[r].model->Forward(rk[r].weights.data(), x.data(), y.data(), 1, seq);
    rk[r].model->Backward(rk[r].weights.data(), rk[r].grads.data(), 1.0 / seq);
  });
  if (sequence_parallel) SumNormGradients(rk);
  const double L = RankLoss(rk, x, y, seq);
  const double h = 2e-4;
  double worst_rel = 0;
  int64_t checked = 0;
  for (int r = 0; r < ranks; ++r) {
    for (const TensorSpec& t : rk[r].slices.layout().tensors()) {
      // A norm's weight is every rank's: perturbed on all at once.
      const bool norm = t.shape.size() == 1;
      for (int64_t i = t.offset; i < t.offset + t.numel; ++i) {
        if (norm && r > 0) continue;
        auto at = [&](double delta) {
          for (int q = 0; q < ranks; ++q) {
            if (q == r || norm) rk[q].weights[i] += delta;
          }
          const double l = RankLoss(rk, x, y, seq);
          for (int q = 0; q < ranks; ++q) {
            if (q == r || norm) rk[q].weights[i] -= delta;
          }
          return l;
        };
        const double numeric = (8 * (at(h) - at(-h)) - (at(2 * h) - at(-2 * h))) / (12 * h);
        // A norm's gradient is the same on every rank (its inputs are whole).
        const double analytic = rk[r].grads[i];
        const double err = std::fabs(analytic - numeric);
        EXPECT_LE(err, 1e-7 * (std::fabs(analytic) + std::fabs(numeric)) + 1e-10 * std::max(1.0, std::fabs(L)))
            << t.name << "[" << i - t.offset << "] on rank " << r << ": analytic " << analytic << " numeric " << numeric;
        if (std::fabs(analytic) + std::fabs(numeric) > 1e-6) {
          worst_rel = std::max(worst_rel, err / (std::fabs(analytic) + std::fabs(numeric)));
        }
        ++checked;
      }
    }
  }
  std::printf("[ tensor parallel%s ] finite differences: %lld weights, worst relative error %.2e\n",
              sequence_parallel ? " + SP" : "", static_cast<long long>(checked), worst_rel);
}

TEST(TensorParallel, GradientsMatchFiniteDifferencesInDouble) { CheckFiniteDifferences(false); }

TEST(TensorParallel, SequenceParallelGradientsMatchFiniteDifferencesInDouble) { CheckFiniteDifferences(true); }

TEST(TensorSlices, EveryElementIsOneRanksButTheNormsEveryRanks) {
  for (bool tied : {true, false}) {
    const LlamaShape shape = GroupTestShape(tied);
    const ParamLayout layout(shape);
    std::vector<float> flat(layout.size());
    for (size_t i = 0; i < flat.size(); ++i) flat[i] = static_cast<float>(i + 1);
    for (int ranks : {1, 2, 4}) {
      std::vector<int> owners(layout.size(), 0);
      std::vector<float> back(layout.size(), 0.0f);
      for (int r = 0; r < ranks; ++r) {
        auto s = TensorSlices::Make(shape, ranks, r);
        ASSERT_TRUE(s.ok()) << s.status().message();
        std::vector<float> local(s->layout().size());
        s->Pack(flat.data(), local.data());
        s->Unpack(local.data(), back.data());
        int64_t last_end = -1;
        for (const ParamRange& x : s->Ranges()) {
          EXPECT_GT(x.begin, last_end - 1) << "ranges ascend";
          last_end = x.end;
          for (int64_t i = x.begin; i < x.end; ++i) ++owners[i];
        }
        EXPECT_EQ(s->shape().head_dim(), shape.head_dim());
        EXPECT_EQ(s->vocab_first(), r * shape.vocab_size / ranks);
      }
      for (const TensorSpec& t : layout.tensors()) {
        const int want = t.shape.size() == 1 ? ranks : 1;
        for (int64_t i = t.offset; i < t.offset + t.numel; ++i) {
          ASSERT_EQ(owners[i], want) << t.name << " element " << i - t.offset << " at T=" << ranks;
          ASSERT_EQ(back[i], flat[i]) << t.name;
        }
      }
    }
  }
}

TEST(TensorSlices, RefusesShapesTheRanksDoNotDivideInOneLine) {
  auto error = [](LlamaShape s, int ranks) {
    auto r = TensorSlices::Make(s, ranks, 0);
    EXPECT_FALSE(r.ok());
    const std::string m = r.status().message();
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
    return m;
  };
  LlamaShape s = GroupTestShape(true);
  EXPECT_NE(error(s, 3).find("model.num_attention_heads"), std::string::npos);
  s.num_kv_heads = 2;
  EXPECT_NE(error(s, 4).find("model.num_key_value_heads"), std::string::npos);
  s = GroupTestShape(true);
  s.num_kv_heads = 8;
  s.intermediate_size = 100;
  EXPECT_NE(error(s, 8).find("model.intermediate_size"), std::string::npos);
  EXPECT_NE(error(s, 8).find("cluster.tensor_parallel"), std::string::npos);
  s = GroupTestShape(true);
  s.vocab_size = 97;
  EXPECT_NE(error(s, 2).find("model.vocab_size"), std::string::npos);
}

// The servers' space of a tensor-parallel job: the ranks' packed parts one
// after the other. Cut anywhere (as servers' shards are), its runs hold
// every element of the flat space once but the norms' copies, its flat
// pieces tile the flat space in order, its decay is the matrices', and
// what it loads fresh is each rank's Pack of the initial weights.
TEST(TensorParallelSpace, AnyCutHoldsTheFlatSpaceOnceAndDecaysTheMatrices) {
  for (bool tied : {true, false}) {
    const LlamaShape shape = GroupTestShape(tied);
    const ParamLayout layout(shape);
    std::vector<float> flat(layout.size());
    const WeightInit init{11, 0.02, "", {}};
    InitParameters(layout, init.seed, init.initializer_range, flat.data());
    for (int ranks : {2, 4}) {
      auto space = TensorParallelSpace::Make(shape, ranks);
      ASSERT_TRUE(space.ok()) << space.status().message();
      std::vector<float> packed(space->size(), 0.0f);
      for (int r = 0; r < ranks; ++r) space->slices(r).Pack(flat.data(), packed.data() + space->RankRange(r).begin);
      std::vector<bool> decays(space->size(), false);
      for (int r = 0; r < ranks; ++r) {
        for (const TensorSpec& t : space->slices(r).layout().tensors()) {
          std::fill_n(decays.begin() + space->RankRange(r).begin + t.offset, t.numel, t.decay());
        }
      }
      // Shards cut at 64-element steps that do not fall on the parts' ends.
      std::vector<int64_t> cuts = {0};
      for (int64_t at = 64 * 7; at < space->size(); at += 64 * 13) cuts.push_back(at);
      cuts.push_back(space->size());
      std::vector<int> held(layout.size(), 0);
      int64_t copied = 0, last_end = 0;
      for (size_t k = 0; k + 1 < cuts.size(); ++k) {
        const ParamRange range{cuts[k], cuts[k + 1]};
        for (const TensorParallelSpace::Run& run : space->RunsWithin(range)) {
          ASSERT_GE(run.at, range.begin);
          ASSERT_LE(run.at + run.flat.size(), range.end);
          for (int64_t i = 0; i < run.flat.size(); ++i) ASSERT_EQ(packed[run.at + i], flat[run.flat.begin + i]);
          if (run.copy) copied += run.flat.size();
        }
        auto state = space->Load(range, init, layout, std::nullopt);
        ASSERT_TRUE(state.ok()) << state.status().message();
        ASSERT_TRUE(std::equal(state->weights.begin(), state->weights.end(), packed.begin() + range.begin));
        for (const DecaySegment& d : space->DecaySegmentsOf(range)) {
          for (int64_t i = d.begin; i < d.end; ++i) ASSERT_EQ(d.decay, decays[i]) << "element " << i;
        }
        const ShardView view{range.begin, range.end, 0, packed.data() + range.begin, packed.data() + range.begin,
                             packed.data() + range.begin, {}};
        for (const ShardView& piece : space->FlatPieces(view)) {
          for (int64_t i = piece.begin; i < piece.end; ++i) {
            ++held[i];
            ASSERT_EQ(piece.weights[i - piece.begin], flat[i]);
          }
        }
        last_end = range.end;
      }
      EXPECT_EQ(last_end, space->size());
      int64_t norms = 0;
      for (const TensorSpec& t : layout.tensors()) {
        if (t.shape.size() == 1) norms += t.numel;
        for (int64_t i = t.offset; i < t.offset + t.numel; ++i) ASSERT_EQ(held[i], 1) << t.name << " at T=" << ranks;
      }
      EXPECT_EQ(copied, (ranks - 1) * norms);
      int64_t copies = 0;
      for (const ParamRange& c : space->Copies()) copies += c.size();
      EXPECT_EQ(copies, copied);
    }
  }
}

}  // namespace
}  // namespace herd
