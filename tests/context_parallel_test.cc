// Context parallelism in one process: C ranks, each a thread computing a
// LlamaModel made for its chunks of every sequence (model/llama_config.h's
// ContextGroup: chunks r and 2C - 1 - r), given the whole sequences, the
// group's keys and values gathered and their gradients reduce-scattered
// by an in-process group (tests/in_process_group.h).
//
//  - Against one whole model on the same micro-batches: the mean of the
//    ranks' losses within 1e-6 relative, and the sum of the ranks'
//    gradients, element by element, within 1e-5 relative plus 2e-6 of
//    their tensor's largest (ExpectGradientsMatch; fp32: attention's rows
//    and the weights' sums are added in another order), C = 2 and 4, tied
//    and untied, grouped-query attention, without recomputation and with
//    attention's or the full layer's (the keys and values gathered again).
//  - Composed with tensor parallelism (T = 2 x C = 2, four threads, rank
//    (c, t) in a tensor group of the same c and a context group of the
//    same t), with and without sequence parallelism: the same, gradients
//    unpacked from each tensor rank's slices, the norms' summed over the
//    context ranks (and the tensor ranks' rows with sequence parallelism).
//  - A finite-difference check in double of every weight at C = 2 (ring
//    attention's chunks, the gathers and the reduce-scatters), five-point
//    stencil, h = 2e-4, tests/gradcheck_test.cc's tolerance: |a - n| <=
//    1e-7 (|a| + |n|) + 1e-10 max(1, |L|).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "model/llama.h"
#include "model/param_layout.h"
#include "sharding/tensor_slices.h"
#include "tests/in_process_group.h"

namespace herd {
namespace {

std::vector<int32_t> Tokens(int n, int vocab, int micro, int salt) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = (i * 31 + micro * 7 + salt) % vocab;
  return t;
}

template <typename V>
struct Rank {
  std::unique_ptr<LlamaModel<V>> model;
  std::vector<V> grads;
};

template <typename V>
std::vector<Rank<V>> MakeRanks(const LlamaShape& shape, int ranks, InProcessSum<V>* group, int batch, int seq,
                               Recompute recompute) {
  std::vector<Rank<V>> out;
  for (int r = 0; r < ranks; ++r) {
    Rank<V> k{std::make_unique<LlamaModel<V>>(shape, batch, seq, recompute, 1, LayerRange{}, false, TokenSplit{1, ranks}),
              std::vector<V>(ParamLayout(shape).size(), V(0))};
    ContextGroup<V> g;
    g.ranks = ranks;
    g.rank = r;
    g.all_gather = [group, r](V* data, const Partition& parts) { group->AllGather(r, data, parts); };
    g.reduce_scatter = [group, r](V* data, const Partition& parts) { group->ReduceScatter(r, data, parts); };
    k.model->SetContextGroup(std::move(g));
    out.push_back(std::move(k));
  }
  return out;
}

template <typename V>
std::vector<V> SummedGradients(const std::vector<Rank<V>>& rk) {
  std::vector<V> sum(rk[0].grads.size(), V(0));
  for (const Rank<V>& k : rk) {
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += k.grads[i];
  }
  return sum;
}

TEST(ContextParallel, MatchesTheWholeModel) {
  constexpr int B = 2, T = 16, kMicro = 2;
  for (bool tied : {true, false}) {
    for (int ranks : {2, 4}) {
      for (Recompute recompute : {Recompute::kNone, Recompute::kAttention, Recompute::kFull}) {
        SCOPED_TRACE(testing::Message() << (tied ? "tied" : "untied") << ", C=" << ranks << ", recompute "
                                        << static_cast<int>(recompute));
        const LlamaShape shape = GroupTestShape(tied);
        const ParamLayout layout(shape);
        std::vector<float> flat(layout.size());
        InitParameters(layout, 5, 0.05, flat.data());
        LlamaModel<float> whole(shape, B, T);
        std::vector<float> whole_grads(layout.size(), 0.0f);
        std::vector<double> whole_losses;
        for (int m = 0; m < kMicro; ++m) {
          whole_losses.push_back(whole.Forward(flat.data(), Tokens(B * T, shape.vocab_size, m, 0).data(),
                                               Tokens(B * T, shape.vocab_size, m, 5).data(), B, T));
          whole.Backward(flat.data(), whole_grads.data(), 1.0 / (kMicro * B * T));
        }
        InProcessSum<float> group(ranks);
        std::vector<Rank<float>> rk = MakeRanks<float>(shape, ranks, &group, B, T, recompute);
        std::vector<std::vector<double>> losses(ranks);
        OnRanks(ranks, [&](int r) {
          for (int m = 0; m < kMicro; ++m) {
            losses[r].push_back(rk[r].model->Forward(flat.data(), Tokens(B * T, shape.vocab_size, m, 0).data(),
                                                     Tokens(B * T, shape.vocab_size, m, 5).data(), B, T));
            rk[r].model->Backward(flat.data(), rk[r].grads.data(), 1.0 / (kMicro * B * T));
          }
        });
        double worst_loss = 0;
        for (int m = 0; m < kMicro; ++m) {
          double mean = 0;
          for (int r = 0; r < ranks; ++r) mean += losses[r][m] / ranks;
          EXPECT_NEAR(mean, whole_losses[m], 1e-6 * whole_losses[m]);
          worst_loss = std::max(worst_loss, std::fabs(mean - whole_losses[m]) / whole_losses[m]);
        }
        const std::vector<float> cp_grads = SummedGradients(rk);
        const double used = ExpectGradientsMatch(layout, whole_grads, cp_grads);
        std::printf("[ context parallel ] %s C=%d recompute %d: loss off by %.2e relative, gradients at %.2f of "
                    "their tolerance\n",
                    tied ? "tied" : "untied", ranks, static_cast<int>(recompute), worst_loss, used);
      }
    }
  }
}

TEST(ContextParallel, ComposesWithTensorParallelism) {
  constexpr int B = 2, S = 16, T = 2, C = 2;
  for (bool sp : {false, true}) {
    SCOPED_TRACE(sp ? "with sequence parallelism" : "tensor x context");
    const LlamaShape shape = GroupTestShape(false);
    const ParamLayout layout(shape);
    std::vector<float> flat(layout.size());
    InitParameters(layout, 5, 0.05, flat.data());
    LlamaModel<float> whole(shape, B, S);
    std::vector<float> whole_grads(layout.size(), 0.0f);
    const double whole_loss = whole.Forward(flat.data(), Tokens(B * S, shape.vocab_size, 0, 0).data(),
                                            Tokens(B * S, shape.vocab_size, 0, 5).data(), B, S);
    whole.Backward(flat.data(), whole_grads.data(), 1.0 / (B * S));
    // Rank (c, t) = c * T + t: tensor group c, context group t.
    std::vector<std::unique_ptr<InProcessSum<float>>> tensor_groups, context_groups;
    for (int c = 0; c < C; ++c) tensor_groups.push_back(std::make_unique<InProcessSum<float>>(T));
    for (int t = 0; t < T; ++t) context_groups.push_back(std::make_unique<InProcessSum<float>>(C));
    std::vector<TensorSlices> slices;
    std::vector<std::unique_ptr<LlamaModel<float>>> models;
    std::vector<std::vector<float>> weights, grads;
    for (int rank = 0; rank < T * C; ++rank) {
      const int c = rank / T, t = rank % T;
      slices.push_back(*TensorSlices::Make(shape, T, t));
      models.push_back(std::make_unique<LlamaModel<float>>(slices.back().shape(), B, S, Recompute::kNone, 1,
                                                           LayerRange{}, false, TokenSplit{sp ? T : 1, C}));
      InProcessSum<float>* tg = tensor_groups[c].get();
      InProcessSum<float>* cg = context_groups[t].get();
      TensorGroup<float> g;
      g.ranks = T;
      g.rank = t;
      g.vocab_first = slices.back().vocab_first();
      g.all_reduce = [tg, t](float* data, int64_t n) { tg->AllReduce(t, data, n); };
      g.sequence_parallel = sp;
      g.all_gather = [tg, t](float* data, const Partition& parts) { tg->AllGather(t, data, parts); };
      g.reduce_scatter = [tg, t](float* data, const Partition& parts) { tg->ReduceScatter(t, data, parts); };
      models.back()->SetTensorGroup(std::move(g));
      ContextGroup<float> k;
      k.ranks = C;
      k.rank = c;
      k.all_gather = [cg, c](float* data, const Partition& parts) { cg->AllGather(c, data, parts); };
      k.reduce_scatter = [cg, c](float* data, const Partition& parts) { cg->ReduceScatter(c, data, parts); };
      models.back()->SetContextGroup(std::move(k));
      weights.emplace_back(slices.back().layout().size(), 0.0f);
      slices.back().Pack(flat.data(), weights.back().data());
      grads.emplace_back(weights.back().size(), 0.0f);
    }
    std::vector<double> losses(T * C);
    OnRanks(T * C, [&](int rank) {
      losses[rank] = models[rank]->Forward(weights[rank].data(), Tokens(B * S, shape.vocab_size, 0, 0).data(),
                                           Tokens(B * S, shape.vocab_size, 0, 5).data(), B, S);
      models[rank]->Backward(weights[rank].data(), grads[rank].data(), 1.0 / (B * S));
    });
    double mean = 0;
    for (int c = 0; c < C; ++c) mean += losses[c * T] / C;
    EXPECT_NEAR(mean, whole_loss, 1e-6 * whole_loss);
    // Every rank's slices unpacked and added: a norm's (every tensor
    // rank's alike, or its rows' part with sequence parallelism) once per
    // tensor rank unless its rows were split.
    std::vector<float> sum(layout.size(), 0.0f);
    for (int rank = 0; rank < T * C; ++rank) {
      std::vector<float> mine(layout.size(), 0.0f);
      slices[rank].Unpack(grads[rank].data(), mine.data());
      for (const TensorSpec& x : layout.tensors()) {
        const bool norm = x.shape.size() == 1;
        if (norm && !sp && rank % T != 0) continue;
        for (int64_t i = x.offset; i < x.offset + x.numel; ++i) sum[i] += mine[i];
      }
    }
    const double used = ExpectGradientsMatch(layout, whole_grads, sum);
    std::printf("[ context parallel ] T=2 x C=2%s: loss off by %.2e relative, gradients at %.2f of their tolerance\n",
                sp ? " + SP" : "", std::fabs(mean - whole_loss) / whole_loss, used);
  }
}

TEST(ContextParallel, GradientsMatchFiniteDifferencesInDouble) {
  LlamaShape shape;
  shape.vocab_size = 12;
  shape.hidden_size = 8;
  shape.intermediate_size = 8;
  shape.num_layers = 1;
  shape.num_heads = 2;
  shape.num_kv_heads = 1;
  shape.tie_word_embeddings = false;
  const int ranks = 2, seq = 8;
  const ParamLayout layout(shape);
  std::vector<float> init(layout.size());
  InitParameters(layout, 3, 0.3, init.data());
  std::vector<double> w(init.begin(), init.end());
  for (const TensorSpec& t : layout.tensors()) {
    if (t.shape.size() == 1) {
      for (int64_t i = 0; i < t.numel; ++i) w[t.offset + i] = 0.7 + 0.05 * static_cast<double>(i % 7);
    }
  }
  InProcessSum<double> group(ranks);
  std::vector<Rank<double>> rk = MakeRanks<double>(shape, ranks, &group, 1, seq, Recompute::kNone);
  const std::vector<int32_t> x{1, 7, 3, 11, 4, 0, 9, 2}, y{7, 3, 11, 4, 9, 5, 2, 8};
  // The sequence's mean loss: the mean of the ranks' (each its half of the tokens).
  auto loss = [&]() {
    std::vector<double> l(ranks);
    OnRanks(ranks, [&](int r) { l[r] = rk[r].model->Forward(w.data(), x.data(), y.data(), 1, seq); });
    return (l[0] + l[1]) / 2;
  };
  OnRanks(ranks, [&](int r) {
    rk[r].model->Forward(w.data(), x.data(), y.data(), 1, seq);
    rk[r].model->Backward(w.data(), rk[r].grads.data(), 1.0 / seq);
  });
  const std::vector<double> analytic = SummedGradients(rk);
  const double L = loss(), h = 2e-4;
  double worst_rel = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    auto at = [&](double delta) {
      w[i] += delta;
      const double l = loss();
      w[i] -= delta;
      return l;
    };
    const double numeric = (8 * (at(h) - at(-h)) - (at(2 * h) - at(-2 * h))) / (12 * h);
    const double err = std::fabs(analytic[i] - numeric);
    EXPECT_LE(err, 1e-7 * (std::fabs(analytic[i]) + std::fabs(numeric)) + 1e-10 * std::max(1.0, std::fabs(L)))
        << "weight " << i << ": analytic " << analytic[i] << " numeric " << numeric;
    if (std::fabs(analytic[i]) + std::fabs(numeric) > 1e-6) {
      worst_rel = std::max(worst_rel, err / (std::fabs(analytic[i]) + std::fabs(numeric)));
    }
  }
  std::printf("[ context parallel ] finite differences: %zu weights, worst relative error %.2e\n", w.size(),
              worst_rel);
}

}  // namespace
}  // namespace herd
