// Finite-difference gradient checks in double precision: every CPU kernel
// (model/cpu/ops.h) and the whole model, tied and untied, with grouped-query
// attention. Five-point central differences with h = 1e-3: truncation
// O(h^4) ~ 1e-12 and rounding ~ 1e-16 * |L| / h ~ 1e-12, so a tolerance of
// 1e-6 on |analytic - numeric| / max(|analytic| + |numeric|, 1e-5) catches
// any real mistake (which shows up as O(1)) on every element.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <vector>

#include "common/rng.h"
#include "model/cpu/ops.h"
#include "model/llama.h"

namespace herd {
namespace {

using Vec = std::vector<double>;
constexpr double kH = 1e-3;
constexpr double kTolerance = 1e-6;

Vec Random(size_t n, uint64_t seed, double scale = 1.0) {
  Rng rng(seed);
  Vec v(n);
  for (double& x : v) x = scale * rng.Normal();
  return v;
}

double Dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

double RelErr(double a, double n) { return std::fabs(a - n) / std::max(std::fabs(a) + std::fabs(n), 1e-5); }

// Checks `analytic` against five-point central differences of `loss`
// w.r.t. `x`.
void CheckGradient(const char* what, Vec& x, const Vec& analytic, const std::function<double()>& loss) {
  ASSERT_EQ(x.size(), analytic.size());
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double keep = x[i];
    auto at = [&](double offset) {
      x[i] = keep + offset;
      return loss();
    };
    const double numeric = (8 * (at(kH) - at(-kH)) - (at(2 * kH) - at(-2 * kH))) / (12 * kH);
    x[i] = keep;
    worst = std::max(worst, RelErr(analytic[i], numeric));
    ASSERT_LT(RelErr(analytic[i], numeric), kTolerance)
        << what << "[" << i << "]: analytic " << analytic[i] << " vs numeric " << numeric;
  }
  ::testing::Test::RecordProperty(what, std::to_string(worst));
}

TEST(GradCheckOps, Embedding) {
  const int64_t N = 7, C = 5, V = 4;
  std::vector<int32_t> tokens = {0, 3, 3, 1, 0, 2, 3};
  Vec table = Random(V * C, 1), R = Random(N * C, 2), out(N * C), dtable(V * C, 0.0);
  auto loss = [&] {
    cpu::EmbeddingForward(out.data(), tokens.data(), table.data(), N, C);
    return Dot(out, R);
  };
  cpu::EmbeddingBackward(dtable.data(), R.data(), tokens.data(), N, C);
  CheckGradient("embedding.table", table, dtable, loss);
}

TEST(GradCheckOps, RmsNorm) {
  const int64_t N = 3, C = 6;
  Vec x = Random(N * C, 3), w = Random(C, 4), R = Random(N * C, 5), out(N * C), rstd(N);
  Vec dx(N * C, 0.0), dw(C, 0.0);
  auto loss = [&] {
    cpu::RmsNormForward(out.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5);
    return Dot(out, R);
  };
  loss();
  cpu::RmsNormBackward(dx.data(), dw.data(), R.data(), x.data(), w.data(), rstd.data(), N, C);
  CheckGradient("rmsnorm.x", x, dx, loss);
  CheckGradient("rmsnorm.weight", w, dw, loss);
  // din accumulates (the residual stream adds its branches).
  Vec dx2 = dx, dw2(C, 0.0);
  cpu::RmsNormBackward(dx2.data(), dw2.data(), R.data(), x.data(), w.data(), rstd.data(), N, C);
  for (size_t i = 0; i < dx.size(); ++i) EXPECT_DOUBLE_EQ(dx2[i], 2 * dx[i]);
}

TEST(GradCheckOps, Matmul) {
  const int64_t N = 4, Cin = 5, Cout = 3;
  Vec x = Random(N * Cin, 6), w = Random(Cout * Cin, 7), R = Random(N * Cout, 8), out(N * Cout);
  Vec dx(N * Cin, 0.0), dw(Cout * Cin, 0.0);
  auto loss = [&] {
    cpu::MatmulForward(out.data(), x.data(), w.data(), N, Cin, Cout);
    return Dot(out, R);
  };
  cpu::MatmulBackward(dx.data(), dw.data(), R.data(), x.data(), w.data(), N, Cin, Cout);
  CheckGradient("matmul.x", x, dx, loss);
  CheckGradient("matmul.weight", w, dw, loss);
  Vec dx2 = dx, dw2 = dw;  // weight gradients accumulate; din accumulates on request
  cpu::MatmulBackward(dx2.data(), dw2.data(), R.data(), x.data(), w.data(), N, Cin, Cout, true);
  for (size_t i = 0; i < dw.size(); ++i) EXPECT_DOUBLE_EQ(dw2[i], 2 * dw[i]);
  for (size_t i = 0; i < dx.size(); ++i) EXPECT_DOUBLE_EQ(dx2[i], 2 * dx[i]);
}

TEST(GradCheckOps, Rope) {
  const int64_t B = 2, T = 5, H = 3, hd = 4;
  Vec cos(T * hd / 2), sin(T * hd / 2);
  cpu::RopeTables(cos.data(), sin.data(), T, hd, 500000.0);
  Vec x = Random(B * T * H * hd, 9), R = Random(x.size(), 10);
  auto loss = [&] {
    Vec y = x;
    cpu::RopeForward(y.data(), cos.data(), sin.data(), B, T, H, hd);
    return Dot(y, R);
  };
  Vec dx = R;
  cpu::RopeBackward(dx.data(), cos.data(), sin.data(), B, T, H, hd);
  CheckGradient("rope.x", x, dx, loss);
  // A rotation: backward undoes forward.
  Vec y = x;
  cpu::RopeForward(y.data(), cos.data(), sin.data(), B, T, H, hd);
  cpu::RopeBackward(y.data(), cos.data(), sin.data(), B, T, H, hd);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(y[i], x[i], 1e-14);
}

void CheckAttention(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd) {
  Vec q = Random(B * T * H * hd, 11), k = Random(B * T * KV * hd, 12), v = Random(B * T * KV * hd, 13);
  Vec R = Random(B * T * H * hd, 14), out(q.size()), probs(B * H * T * T);
  auto loss = [&] {
    cpu::AttentionForward(out.data(), probs.data(), q.data(), k.data(), v.data(), B, T, H, KV, hd);
    return Dot(out, R);
  };
  loss();
  // Causality: the softmax never looks ahead.
  for (int64_t bh = 0; bh < B * H; ++bh) {
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t s = t + 1; s < T; ++s) ASSERT_EQ(probs[(bh * T + t) * T + s], 0.0);
    }
  }
  Vec dq(q.size()), dk(k.size()), dv(v.size()), scratch(cpu::AttentionScratchSize(T, H, KV));
  cpu::AttentionBackward(dq.data(), dk.data(), dv.data(), R.data(), probs.data(), q.data(), k.data(), v.data(), B, T,
                         H, KV, hd, scratch.data());
  CheckGradient("attention.q", q, dq, loss);
  CheckGradient("attention.k", k, dk, loss);
  CheckGradient("attention.v", v, dv, loss);
}

TEST(GradCheckOps, AttentionGroupedQuery) { CheckAttention(2, 5, 4, 2, 4); }
TEST(GradCheckOps, AttentionMultiHead) { CheckAttention(1, 7, 3, 3, 2); }
TEST(GradCheckOps, AttentionMultiQuery) { CheckAttention(2, 3, 4, 1, 6); }

TEST(GradCheckOps, Swiglu) {
  const int64_t n = 23;
  Vec gate = Random(n, 15, 3.0), up = Random(n, 16), R = Random(n, 17), out(n), dgate(n), dup(n);
  auto loss = [&] {
    cpu::SwigluForward(out.data(), gate.data(), up.data(), n);
    return Dot(out, R);
  };
  cpu::SwigluBackward(dgate.data(), dup.data(), R.data(), gate.data(), up.data(), n);
  CheckGradient("swiglu.gate", gate, dgate, loss);
  CheckGradient("swiglu.up", up, dup, loss);
}

TEST(GradCheckOps, CrossEntropy) {
  const int64_t N = 5, V = 7;
  std::vector<int32_t> targets = {0, 6, 3, 3, 1};
  Vec logits = Random(N * V, 18, 2.0), losses(N), dlogits(N * V);
  const double scale = 1.0 / N;  // gradient of the mean
  auto loss = [&] { return cpu::CrossEntropyForward(losses.data(), logits.data(), targets.data(), N, V); };
  cpu::CrossEntropyBackward(dlogits.data(), logits.data(), targets.data(), N, V, scale);
  CheckGradient("cross_entropy.logits", logits, dlogits, loss);
  // In place (dlogits aliasing logits) gives the same result.
  Vec in_place = logits;
  cpu::CrossEntropyBackward(in_place.data(), in_place.data(), targets.data(), N, V, scale);
  for (size_t i = 0; i < in_place.size(); ++i) EXPECT_DOUBLE_EQ(in_place[i], dlogits[i]);
}

void CheckModel(bool tied, int kv_heads) {
  LlamaShape s;
  s.vocab_size = 11;
  s.hidden_size = 8;
  s.intermediate_size = 12;
  s.num_layers = 2;
  s.num_heads = 4;
  s.num_kv_heads = kv_heads;
  s.tie_word_embeddings = tied;
  s.rms_norm_eps = 1e-6;
  const int B = 2, T = 5;
  LlamaModel<double> model(s, B, T);
  const ParamLayout& layout = model.layout();
  Vec params = Random(layout.size(), 19, 0.5);
  for (const TensorSpec& t : layout.tensors()) {
    if (t.shape.size() == 1) {
      for (int64_t i = 0; i < t.numel; ++i) params[t.offset + i] += 1.0;  // norms near 1, not 0
    }
  }
  // Token 10 never appears: its embedding row gets no gradient unless the
  // head is tied to it.
  std::vector<int32_t> tokens = {0, 3, 3, 1, 9, 2, 5, 7, 8, 4}, targets = {3, 3, 1, 9, 2, 5, 7, 8, 4, 6};
  Vec grads(layout.size(), 0.0);
  const double mean = model.Forward(params.data(), tokens.data(), targets.data(), B, T);
  model.Backward(params.data(), grads.data(), 1.0 / (B * T));
  auto loss = [&] { return model.Forward(params.data(), tokens.data(), targets.data(), B, T); };
  for (const TensorSpec& t : layout.tensors()) {
    Vec x(params.begin() + t.offset, params.begin() + t.offset + t.numel);
    Vec g(grads.begin() + t.offset, grads.begin() + t.offset + t.numel);
    auto tensor_loss = [&] {
      std::copy(x.begin(), x.end(), params.begin() + t.offset);
      return loss();
    };
    CheckGradient(t.name.c_str(), x, g, tensor_loss);
    std::copy(x.begin(), x.end(), params.begin() + t.offset);
  }
  const TensorSpec* embed = layout.Find("model.embed_tokens.weight");
  double unused_row = 0;
  for (int c = 0; c < s.hidden_size; ++c) unused_row += std::fabs(grads[embed->offset + 10 * s.hidden_size + c]);
  if (tied) {
    EXPECT_GT(unused_row, 0.0);
  } else {
    EXPECT_EQ(unused_row, 0.0);
  }
  // A second micro-batch accumulates: grads double for the same batch.
  EXPECT_DOUBLE_EQ(model.Forward(params.data(), tokens.data(), targets.data(), B, T), mean);
  Vec twice = grads;
  model.Backward(params.data(), twice.data(), 1.0 / (B * T));
  for (size_t i = 0; i < grads.size(); ++i) ASSERT_NEAR(twice[i], 2 * grads[i], 1e-15 + 1e-12 * std::fabs(grads[i]));
}

TEST(GradCheckModel, TiedGroupedQuery) { CheckModel(true, 2); }
TEST(GradCheckModel, UntiedGroupedQuery) { CheckModel(false, 2); }
TEST(GradCheckModel, UntiedMultiHead) { CheckModel(false, 4); }

}  // namespace
}  // namespace herd
