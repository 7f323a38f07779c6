// Finite-difference gradient checks in double precision for every CPU kernel
// of model/cpu/ops.h and for the whole LlamaModel<double> (tied and untied
// embeddings, grouped-query, multi-query and multi-head attention), plus the
// accumulate / overwrite contract of every backward.
//
// Method. Each op is reduced to a scalar L = sum(out * R) with a fixed random
// R (so dL/dout = R is what the backward gets), or, for cross-entropy and the
// model, to the mean loss. Every element of every input and parameter is
// perturbed in turn and dL/dx is estimated with the five-point central
// stencil
//     n = (8 (L(x+h) - L(x-h)) - (L(x+2h) - L(x-2h))) / (12 h),
// h = 1e-3 for the kernels and 2e-4 for the model (whose higher derivatives
// are larger): truncation (h^4 |d5L/dx5| / 30) and rounding (~ eps_mach |L| / h)
// both stay around 1e-11.
//
// Tolerance. An element passes when
//     |a - n| <= kRelTol (|a| + |n|) + kAbsTol max(1, |L|),
//     kRelTol = 1e-7, kAbsTol = 1e-10,
// a the analytic (backward) value and n the numeric one. Observed: worst
// relative error 7e-10 over the kernels and 2.4e-8 over the model (the
// latter on gradients ~1e-3, i.e. the 1e-11 rounding floor); worst absolute
// error 5.5e-9 (on a gradient of ~5) in the kernels and 1.4e-11 in the
// model. The "[ gradcheck ]" lines print these per op. A real mistake
// (wrong sign, index, scale, missing term or accumulation) gives O(|a|);
// every such mutation of ops.cc / llama.cc tried while writing this file
// failed here, and CheckerCatchesSmallErrors shows that a single element off
// by 1e-5 relative fails.
//
// Overwrite semantics are checked by filling every overwritten output with
// NaN before the backward (any read of it, or any element left unwritten,
// leaves a NaN); accumulate semantics by starting parameter gradients (and
// RmsNorm's din, and Matmul's din with accumulate_din) at random values.
// Kernels are also run at several OpenMP thread counts (1, 2, 3, and more
// than the channel count, so that some threads own empty channel blocks):
// the gradients of parameters reduced by hand (norm weights, embeddings) must
// be bitwise equal across thread counts, as ops.h promises.
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "common/rng.h"
#include "model/cpu/ops.h"
#include "model/llama.h"
#include "model/param_layout.h"

namespace herd {
namespace {

using Vec = std::vector<double>;

constexpr double kStep = 1e-3;       // kernels
constexpr double kModelStep = 2e-4;  // whole model (larger higher derivatives)
constexpr double kRelTol = 1e-7;
constexpr double kAbsTol = 1e-10;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

Vec Random(size_t n, uint64_t seed, double scale = 1.0, double shift = 0.0) {
  Rng rng(seed);
  Vec v(n);
  for (double& x : v) x = shift + scale * rng.Normal();
  return v;
}

double Dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Sets the OpenMP thread count for a scope.
class ScopedThreads {
 public:
  explicit ScopedThreads(int n) : saved_(omp_get_max_threads()) { omp_set_num_threads(n); }
  ~ScopedThreads() { omp_set_num_threads(saved_); }

 private:
  int saved_;
};

// Relative errors are reported over elements with |a| + |n| >= kSignificant;
// below that the absolute error (FD rounding noise, ~1e-11) is what counts.
constexpr double kSignificant = 1e-6;

struct GradStats {
  double worst_rel = 0;  // |a - n| / (|a| + |n|), over significant elements
  double worst_abs = 0;  // |a - n|, over all elements
  int64_t elements = 0;
  std::string worst_where;
  void Merge(const GradStats& o) {
    if (o.worst_rel > worst_rel) {
      worst_rel = o.worst_rel;
      worst_where = o.worst_where;
    }
    worst_abs = std::max(worst_abs, o.worst_abs);
    elements += o.elements;
  }
  void Print(const std::string& what) const {
    std::printf("[ gradcheck ] %-44s %5lld elements  worst rel %.2e (%s)  worst abs %.2e\n", what.c_str(),
                static_cast<long long>(elements), worst_rel, worst_where.c_str(), worst_abs);
  }
};

// Compares analytic[i] with the five-point central difference of `loss`
// with respect to x[i], for every i < n. x is perturbed in place and
// restored bit for bit. The absolute tolerance scales with max(1, |L|), as
// the rounding error of L does. The thousands of tiny forwards run on one
// thread, where OpenMP start-up would cost more than it saves (the analytic
// gradients and the reference checks run at the thread counts under test).
GradStats CheckGradient(const std::string& what, double* x, const double* analytic, int64_t n,
                        const std::function<double()>& loss, double step = kStep) {
  ScopedThreads one(1);
  GradStats st;
  int failures = 0;
  const double abs_tol = kAbsTol * std::max(1.0, std::fabs(loss()));
  for (int64_t i = 0; i < n; ++i) {
    const double keep = x[i];
    auto at = [&](double offset) {
      x[i] = keep + offset;
      return loss();
    };
    const double numeric = (8 * (at(step) - at(-step)) - (at(2 * step) - at(-2 * step))) / (12 * step);
    x[i] = keep;
    const double a = analytic[i], err = std::fabs(a - numeric);
    const double rel = err / std::max(std::fabs(a) + std::fabs(numeric), 1e-300);
    ++st.elements;
    if (std::fabs(a) + std::fabs(numeric) >= kSignificant && rel > st.worst_rel) {
      st.worst_rel = rel;
      st.worst_where = what + "[" + std::to_string(i) + "]";
    }
    st.worst_abs = std::max(st.worst_abs, err);
    const bool ok = std::isfinite(a) && err <= kRelTol * (std::fabs(a) + std::fabs(numeric)) + abs_tol;
    if (!ok && ++failures <= 5) {
      ADD_FAILURE() << what << "[" << i << "]: analytic " << a << " vs numeric " << numeric << " (rel " << rel << ")";
    }
  }
  EXPECT_EQ(failures, 0) << what << ": " << failures << " of " << n << " elements out of tolerance";
  return st;
}

GradStats CheckGradient(const std::string& what, Vec& x, const Vec& analytic, const std::function<double()>& loss) {
  EXPECT_EQ(x.size(), analytic.size()) << what;
  return CheckGradient(what, x.data(), analytic.data(), static_cast<int64_t>(x.size()), loss);
}

// The checker itself: an analytic gradient wrong by 1e-5 relative in a
// single element (far smaller than any real kernel mistake) is caught.
TEST(GradCheckKernels, CheckerCatchesSmallErrors) {
  Vec x = Random(6, 1), R = Random(6, 2);
  auto loss = [&] {
    double s = 0;
    for (size_t i = 0; i < x.size(); ++i) s += std::sin(x[i]) * R[i];
    return s;
  };
  Vec g(6);
  for (size_t i = 0; i < x.size(); ++i) g[i] = std::cos(x[i]) * R[i];
  CheckGradient("sin", x, g, loss);  // the exact gradient passes
  g[3] *= 1 + 1e-5;
  ::testing::TestPartResultArray failures;
  {
    ::testing::ScopedFakeTestPartResultReporter reporter(
        ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD, &failures);
    CheckGradient("sin (perturbed)", x, g, loss);
  }
  EXPECT_GE(failures.size(), 1) << "a 1e-5 relative error went unnoticed";
}

void ExpectAllFinite(const Vec& v, const std::string& what) {
  for (size_t i = 0; i < v.size(); ++i) ASSERT_TRUE(std::isfinite(v[i])) << what << "[" << i << "] = " << v[i];
}

// |a - b| <= tol * (1 + |b|) elementwise.
void ExpectClose(const Vec& a, const Vec& b, double tol, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_NEAR(a[i], b[i], tol * (1.0 + std::fabs(b[i]))) << what << "[" << i << "]";
  }
}

void ExpectBitwise(const Vec& a, const Vec& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], b[i]) << what << "[" << i << "]";
}

// ---------------------------------------------------------------- embedding

// Gradient of L = sum(out * R) w.r.t. the table, at `threads` threads.
Vec EmbeddingGrad(const std::vector<int32_t>& tokens, const Vec& R, const Vec& start, int64_t C, int threads) {
  ScopedThreads scope(threads);
  Vec dtable = start;
  cpu::EmbeddingBackward(dtable.data(), R.data(), tokens.data(), static_cast<int64_t>(tokens.size()), C);
  return dtable;
}

void CheckEmbedding(int64_t V, int64_t C, const std::vector<int32_t>& tokens, const std::vector<int32_t>& unused) {
  const int64_t N = static_cast<int64_t>(tokens.size());
  Vec table = Random(V * C, 101), R = Random(N * C, 102), out(N * C, kNaN);
  cpu::EmbeddingForward(out.data(), tokens.data(), table.data(), N, C);
  for (int64_t i = 0; i < N; ++i) {
    for (int64_t c = 0; c < C; ++c) ASSERT_EQ(out[i * C + c], table[tokens[i] * C + c]);
  }
  auto loss = [&] {
    cpu::EmbeddingForward(out.data(), tokens.data(), table.data(), N, C);
    return Dot(out, R);
  };
  const Vec zero(V * C, 0.0);
  const Vec g = EmbeddingGrad(tokens, R, zero, C, 1);
  for (int threads : {2, 3, 5}) ExpectBitwise(EmbeddingGrad(tokens, R, zero, C, threads), g, "embedding threads");
  CheckGradient("embedding.table C=" + std::to_string(C), table, g, loss)
      .Print("embedding.table C=" + std::to_string(C));
  for (int32_t row : unused) {
    for (int64_t c = 0; c < C; ++c) ASSERT_EQ(g[row * C + c], 0.0) << "unused row " << row;
  }
  // Accumulates into what is there: start + g, and twice from zero = 2 g.
  const Vec start = Random(V * C, 103);
  const Vec acc = EmbeddingGrad(tokens, R, start, C, 3);
  for (int64_t i = 0; i < V * C; ++i) ASSERT_NEAR(acc[i], start[i] + g[i], 1e-14 * (1 + std::fabs(g[i])));
  const Vec twice = EmbeddingGrad(tokens, R, g, C, 3);
  for (int64_t i = 0; i < V * C; ++i) ASSERT_NEAR(twice[i], 2 * g[i], 1e-14 * (1 + std::fabs(g[i])));
}

TEST(GradCheckKernels, Embedding) {
  // Repeated tokens (rows summed), unused rows (exactly zero), first and last row.
  CheckEmbedding(6, 5, {0, 3, 3, 1, 0, 5, 3}, {2, 4});
  // Fewer channels than threads: some threads own empty channel blocks.
  CheckEmbedding(4, 2, {3, 3, 1, 3, 1}, {0, 2});
}

// ---------------------------------------------------------------- RMSNorm

void CheckRmsNorm(int64_t N, int64_t C, double eps, double in_scale) {
  char tag_buf[48];
  std::snprintf(tag_buf, sizeof(tag_buf), "rmsnorm eps=%g C=%lld", eps, static_cast<long long>(C));
  const std::string tag = tag_buf;
  Vec x = Random(N * C, 201, in_scale), w = Random(C, 202, 0.5, 1.0), R = Random(N * C, 203);
  Vec out(N * C, kNaN), rstd(N, kNaN);
  cpu::RmsNormForward(out.data(), rstd.data(), x.data(), w.data(), N, C, eps);
  for (int64_t i = 0; i < N; ++i) {  // reference forward
    double ss = 0;
    for (int64_t c = 0; c < C; ++c) ss += x[i * C + c] * x[i * C + c];
    const double r = 1 / std::sqrt(ss / C + eps);
    ASSERT_NEAR(rstd[i], r, 1e-14 * r);
    for (int64_t c = 0; c < C; ++c) ASSERT_NEAR(out[i * C + c], w[c] * x[i * C + c] * r, 1e-14);
  }
  auto loss = [&] {
    cpu::RmsNormForward(out.data(), rstd.data(), x.data(), w.data(), N, C, eps);
    return Dot(out, R);
  };
  loss();
  auto backward = [&](const Vec& din0, const Vec& dw0, int threads, Vec* din, Vec* dw) {
    ScopedThreads scope(threads);
    *din = din0;
    *dw = dw0;
    cpu::RmsNormBackward(din->data(), dw->data(), R.data(), x.data(), w.data(), rstd.data(), N, C);
  };
  const Vec zin(N * C, 0.0), zw(C, 0.0);
  Vec dx, dw;
  backward(zin, zw, 1, &dx, &dw);
  for (int threads : {2, 3, 7}) {
    Vec dx_t, dw_t;
    backward(zin, zw, threads, &dx_t, &dw_t);
    ExpectBitwise(dx_t, dx, tag + " din threads");
    ExpectBitwise(dw_t, dw, tag + " dweight threads");
  }
  CheckGradient(tag + ".in", x, dx, loss).Print(tag + ".in");
  CheckGradient(tag + ".weight", w, dw, loss).Print(tag + ".weight");
  // Both din and dweight accumulate into what is there.
  const Vec din0 = Random(N * C, 204), dw0 = Random(C, 205);
  Vec dx_acc, dw_acc;
  backward(din0, dw0, 3, &dx_acc, &dw_acc);
  for (int64_t i = 0; i < N * C; ++i) ASSERT_NEAR(dx_acc[i], din0[i] + dx[i], 1e-14) << tag << " din accumulates";
  for (int64_t c = 0; c < C; ++c) ASSERT_NEAR(dw_acc[c], dw0[c] + dw[c], 1e-13) << tag << " dweight accumulates";
  backward(dx, dw, 3, &dx_acc, &dw_acc);
  for (int64_t i = 0; i < N * C; ++i) ASSERT_NEAR(dx_acc[i], 2 * dx[i], 1e-14) << tag << " twice";
  for (int64_t c = 0; c < C; ++c) ASSERT_NEAR(dw_acc[c], 2 * dw[c], 1e-13) << tag << " twice";
}

TEST(GradCheckKernels, RmsNorm) {
  CheckRmsNorm(4, 6, 1e-5, 1.0);
  // eps comparable to mean(x^2): the eps term of rstd matters in the gradient.
  CheckRmsNorm(3, 5, 0.3, 0.4);
  CheckRmsNorm(5, 2, 1e-6, 2.0);  // fewer channels than threads
}

// ---------------------------------------------------------------- matmul

TEST(GradCheckKernels, Matmul) {
  const int64_t N = 5, Cin = 4, Cout = 3;
  Vec x = Random(N * Cin, 301), w = Random(Cout * Cin, 302), R = Random(N * Cout, 303), out(N * Cout, kNaN);
  cpu::MatmulForward(out.data(), x.data(), w.data(), N, Cin, Cout);
  for (int64_t i = 0; i < N; ++i) {
    for (int64_t o = 0; o < Cout; ++o) {
      double s = 0;
      for (int64_t c = 0; c < Cin; ++c) s += x[i * Cin + c] * w[o * Cin + c];
      ASSERT_NEAR(out[i * Cout + o], s, 1e-14);
    }
  }
  auto loss = [&] {
    cpu::MatmulForward(out.data(), x.data(), w.data(), N, Cin, Cout);
    return Dot(out, R);
  };
  Vec dx(N * Cin, kNaN), dw(Cout * Cin, 0.0);  // din is overwritten: NaN must not survive
  cpu::MatmulBackward(dx.data(), dw.data(), R.data(), x.data(), w.data(), N, Cin, Cout);
  ExpectAllFinite(dx, "matmul din");
  CheckGradient("matmul.in", x, dx, loss).Print("matmul.in");
  CheckGradient("matmul.weight", w, dw, loss).Print("matmul.weight");
  // dweight accumulates; din accumulates only when asked; din may be null.
  const Vec din0 = Random(N * Cin, 304), dw0 = Random(Cout * Cin, 305);
  Vec dx_acc = din0, dw_acc = dw0;
  cpu::MatmulBackward(dx_acc.data(), dw_acc.data(), R.data(), x.data(), w.data(), N, Cin, Cout, true);
  ExpectClose(
      dx_acc,
      [&] {
        Vec e(din0);
        for (size_t i = 0; i < e.size(); ++i) e[i] += dx[i];
        return e;
      }(),
      1e-14, "matmul accumulate_din");
  ExpectClose(
      dw_acc,
      [&] {
        Vec e(dw0);
        for (size_t i = 0; i < e.size(); ++i) e[i] += dw[i];
        return e;
      }(),
      1e-14, "matmul dweight accumulates");
  Vec dx2 = dx, dw2 = dw;
  cpu::MatmulBackward(dx2.data(), dw2.data(), R.data(), x.data(), w.data(), N, Cin, Cout, true);
  for (size_t i = 0; i < dx.size(); ++i) ASSERT_NEAR(dx2[i], 2 * dx[i], 1e-14 * (1 + std::fabs(dx[i])));
  for (size_t i = 0; i < dw.size(); ++i) ASSERT_NEAR(dw2[i], 2 * dw[i], 1e-14 * (1 + std::fabs(dw[i])));
  Vec dw_only = dw0;
  cpu::MatmulBackward<double>(nullptr, dw_only.data(), R.data(), x.data(), w.data(), N, Cin, Cout);
  ExpectBitwise(dw_only, dw_acc, "matmul din=null");
}

// ---------------------------------------------------------------- RoPE

void CheckRope(int64_t B, int64_t T, int64_t heads, int64_t hd, double theta) {
  const std::string tag = "rope hd=" + std::to_string(hd);
  const int64_t half = hd / 2;
  Vec cos(T * half, kNaN), sin(T * half, kNaN);
  cpu::RopeTables(cos.data(), sin.data(), T, hd, theta);
  for (int64_t t = 0; t < T; ++t) {  // HF: inv_freq = theta^(-2i/hd), angle = t * inv_freq
    for (int64_t i = 0; i < half; ++i) {
      const double angle = t * std::pow(theta, -2.0 * i / hd);
      ASSERT_NEAR(cos[t * half + i], std::cos(angle), 1e-14);
      ASSERT_NEAR(sin[t * half + i], std::sin(angle), 1e-14);
    }
  }
  Vec x = Random(B * T * heads * hd, 401), R = Random(x.size(), 402);
  Vec y = x;
  cpu::RopeForward(y.data(), cos.data(), sin.data(), B, T, heads, hd);
  for (int64_t b = 0; b < B; ++b) {  // reference: rotate-half
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t base = ((b * T + t) * heads + h) * hd;
        for (int64_t i = 0; i < half; ++i) {
          const double c = cos[t * half + i], s = sin[t * half + i];
          const double x1 = x[base + i], x2 = x[base + half + i];
          ASSERT_NEAR(y[base + i], x1 * c - x2 * s, 1e-15);
          ASSERT_NEAR(y[base + half + i], x2 * c + x1 * s, 1e-15);
        }
      }
    }
  }
  auto loss = [&] {
    Vec z = x;
    cpu::RopeForward(z.data(), cos.data(), sin.data(), B, T, heads, hd);
    return Dot(z, R);
  };
  Vec dx = R;
  cpu::RopeBackward(dx.data(), cos.data(), sin.data(), B, T, heads, hd);
  CheckGradient(tag + ".x", x, dx, loss).Print(tag + ".x");
  // An orthogonal rotation: backward undoes forward and forward undoes
  // backward, up to rounding (a few ulps of the pair's norm).
  Vec z = y;
  cpu::RopeBackward(z.data(), cos.data(), sin.data(), B, T, heads, hd);
  for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(z[i], x[i], 1e-15 * (1 + std::fabs(x[i]) + 4)) << i;
  z = x;
  cpu::RopeBackward(z.data(), cos.data(), sin.data(), B, T, heads, hd);
  cpu::RopeForward(z.data(), cos.data(), sin.data(), B, T, heads, hd);
  for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(z[i], x[i], 1e-15 * (1 + std::fabs(x[i]) + 4)) << i;
  // Position 0 is the identity.
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t k = 0; k < heads * hd; ++k) ASSERT_EQ(y[b * T * heads * hd + k], x[b * T * heads * hd + k]);
  }
}

TEST(GradCheckKernels, Rope) {
  CheckRope(2, 7, 3, 6, 10000.0);  // odd half (3 frequencies)
  CheckRope(1, 5, 2, 8, 10.0);     // small theta: large angles on every frequency
  CheckRope(2, 5, 4, 2, 500000.0);
}

// ---------------------------------------------------------------- attention

// Naive causal GQA: head h reads kv head h / (H / KV) (HF's repeat_kv).
void ReferenceAttention(Vec* out, Vec* probs, const Vec& q, const Vec& k, const Vec& v, int64_t B, int64_t T, int64_t H,
                        int64_t KV, int64_t hd) {
  out->assign(B * T * H * hd, 0.0);
  probs->assign(B * H * T * T, 0.0);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / (H / KV);
      for (int64_t t = 0; t < T; ++t) {
        std::vector<double> s(t + 1);
        double mx = -1e300;
        for (int64_t u = 0; u <= t; ++u) {
          double dot = 0;
          for (int64_t e = 0; e < hd; ++e)
            dot += q[((b * T + t) * H + h) * hd + e] * k[((b * T + u) * KV + g) * hd + e];
          s[u] = dot / std::sqrt(static_cast<double>(hd));
          mx = std::max(mx, s[u]);
        }
        double sum = 0;
        for (int64_t u = 0; u <= t; ++u) sum += (s[u] = std::exp(s[u] - mx));
        for (int64_t u = 0; u <= t; ++u) {
          const double p = s[u] / sum;
          (*probs)[((b * H + h) * T + t) * T + u] = p;
          for (int64_t e = 0; e < hd; ++e)
            (*out)[((b * T + t) * H + h) * hd + e] += p * v[((b * T + u) * KV + g) * hd + e];
        }
      }
    }
  }
}

void CheckAttention(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd, int threads) {
  ScopedThreads scope(threads);
  const std::string tag = "attention H" + std::to_string(H) + "/KV" + std::to_string(KV) + " T" + std::to_string(T);
  Vec q = Random(B * T * H * hd, 501), k = Random(B * T * KV * hd, 502), v = Random(B * T * KV * hd, 503);
  Vec R = Random(B * T * H * hd, 504), out(q.size(), kNaN), probs(B * H * T * T, kNaN);
  cpu::AttentionForward(out.data(), probs.data(), q.data(), k.data(), v.data(), B, T, H, KV, hd);
  Vec ref_out, ref_probs;
  ReferenceAttention(&ref_out, &ref_probs, q, k, v, B, T, H, KV, hd);
  ExpectClose(out, ref_out, 1e-14, tag + " forward");
  ExpectClose(probs, ref_probs, 1e-14, tag + " probs");  // upper triangle exactly 0 included
  for (int64_t bh = 0; bh < B * H; ++bh) {
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t u = t + 1; u < T; ++u) ASSERT_EQ(probs[(bh * T + t) * T + u], 0.0);
    }
  }
  auto loss = [&] {
    cpu::AttentionForward(out.data(), probs.data(), q.data(), k.data(), v.data(), B, T, H, KV, hd);
    return Dot(out, R);
  };
  loss();
  // Outputs (and scratch) that the backward overwrites start as NaN.
  Vec dq(q.size(), kNaN), dk(k.size(), kNaN), dv(v.size(), kNaN);
  Vec scratch(cpu::AttentionScratchSize(T, H, KV), kNaN);
  cpu::AttentionBackward(dq.data(), dk.data(), dv.data(), R.data(), probs.data(), q.data(), k.data(), v.data(), B, T, H,
                         KV, hd, scratch.data());
  ExpectAllFinite(dq, tag + " dq");
  ExpectAllFinite(dk, tag + " dk");
  ExpectAllFinite(dv, tag + " dv");
  GradStats st = CheckGradient(tag + " q", q, dq, loss);
  st.Merge(CheckGradient(tag + " k", k, dk, loss));
  st.Merge(CheckGradient(tag + " v", v, dv, loss));
  st.Print(tag + " q,k,v @" + std::to_string(threads) + "thr");
  // Causality, directly: changing position u's q/k/v leaves outputs at t < u
  // bit for bit unchanged.
  if (T < 2) return;
  loss();
  const Vec base = out;
  const int64_t u = T - 2;
  for (Vec* in : {&q, &k, &v}) {
    const int64_t heads = in == &q ? H : KV;
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t e = 0; e < heads * hd; ++e) (*in)[(b * T + u) * heads * hd + e] += 0.5;
    }
    loss();
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t t = 0; t < u; ++t) {
        for (int64_t e = 0; e < H * hd; ++e) {
          ASSERT_EQ(out[(b * T + t) * H * hd + e], base[(b * T + t) * H * hd + e]) << tag << " causality";
        }
      }
    }
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t e = 0; e < heads * hd; ++e) (*in)[(b * T + u) * heads * hd + e] -= 0.5;
    }
  }
}

TEST(GradCheckKernels, AttentionGroupedQuery) {
  CheckAttention(2, 5, 4, 2, 3, 1);
  CheckAttention(2, 7, 4, 2, 2, 3);
}
TEST(GradCheckKernels, AttentionMultiHead) {
  CheckAttention(2, 5, 4, 4, 2, 1);
  CheckAttention(1, 7, 3, 3, 3, 3);
}
TEST(GradCheckKernels, AttentionMultiQuery) { CheckAttention(2, 7, 4, 1, 2, 2); }
TEST(GradCheckKernels, AttentionSingleToken) { CheckAttention(3, 1, 4, 2, 2, 2); }

// ---------------------------------------------------------------- SwiGLU

TEST(GradCheckKernels, Swiglu) {
  Vec gate = Random(29, 601, 3.0), up = Random(29, 602);
  for (double g : {0.0, 25.0, -25.0}) {
    gate.push_back(g);
    up.push_back(0.7);
  }
  const int64_t n = static_cast<int64_t>(gate.size());
  Vec R = Random(n, 603), out(n, kNaN), dgate(n, kNaN), dup(n, kNaN);
  cpu::SwigluForward(out.data(), gate.data(), up.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    const double g = gate[i];
    ASSERT_NEAR(out[i], g / (1 + std::exp(-g)) * up[i], 1e-14 * (1 + std::fabs(out[i])));
  }
  auto loss = [&] {
    cpu::SwigluForward(out.data(), gate.data(), up.data(), n);
    return Dot(out, R);
  };
  cpu::SwigluBackward(dgate.data(), dup.data(), R.data(), gate.data(), up.data(), n);
  ExpectAllFinite(dgate, "swiglu dgate");
  ExpectAllFinite(dup, "swiglu dup");
  CheckGradient("swiglu.gate", gate, dgate, loss).Print("swiglu.gate");
  CheckGradient("swiglu.up", up, dup, loss).Print("swiglu.up");
  // Saturated tails, where exp(-g) overflows (g = -800) or underflows
  // (g = 800): finite, with the limits silu -> 0 / g and silu' -> 0 / 1.
  const Vec sat_gate = {-800.0, 800.0}, sat_up = {0.7, 0.7}, sat_dout = {1.3, 1.3};
  Vec sat_out(2, kNaN), sat_dgate(2, kNaN), sat_dup(2, kNaN);
  cpu::SwigluForward(sat_out.data(), sat_gate.data(), sat_up.data(), 2);
  cpu::SwigluBackward(sat_dgate.data(), sat_dup.data(), sat_dout.data(), sat_gate.data(), sat_up.data(), 2);
  EXPECT_EQ(sat_out[0], 0.0);
  EXPECT_EQ(sat_out[1], 800.0 * 0.7);
  EXPECT_EQ(sat_dgate[0], 0.0);
  EXPECT_NEAR(sat_dgate[1], 1.3 * 0.7, 1e-15);
  EXPECT_EQ(sat_dup[0], 0.0);
  EXPECT_EQ(sat_dup[1], 1.3 * 800.0);
}

// ---------------------------------------------------------------- cross-entropy

TEST(GradCheckKernels, CrossEntropy) {
  const int64_t N = 6, V = 7;
  const std::vector<int32_t> targets = {0, 6, 3, 3, 1, 6};
  Vec logits = Random(N * V, 701, 2.0);
  for (int64_t j = 0; j < V; ++j) logits[5 * V + j] += 40.0;  // large logits: max subtraction
  Vec losses(N, kNaN);
  const double mean = cpu::CrossEntropyForward(losses.data(), logits.data(), targets.data(), N, V);
  double sum = 0;
  for (int64_t i = 0; i < N; ++i) {
    double mx = -1e300, z = 0;
    for (int64_t j = 0; j < V; ++j) mx = std::max(mx, logits[i * V + j]);
    for (int64_t j = 0; j < V; ++j) z += std::exp(logits[i * V + j] - mx);
    ASSERT_NEAR(losses[i], mx + std::log(z) - logits[i * V + targets[i]], 1e-13);
    sum += losses[i];
  }
  ASSERT_NEAR(mean, sum / N, 1e-15);
  auto mean_loss = [&] { return cpu::CrossEntropyForward(losses.data(), logits.data(), targets.data(), N, V); };
  // scale = 1/N: the gradient of the mean.
  Vec dlogits(N * V, kNaN);
  cpu::CrossEntropyBackward(dlogits.data(), logits.data(), targets.data(), N, V, 1.0 / N);
  ExpectAllFinite(dlogits, "cross_entropy dlogits");
  CheckGradient("cross_entropy.logits (mean)", logits, dlogits, mean_loss).Print("cross_entropy.logits (mean)");
  // Any other scale: the gradient of scale * sum of losses.
  const double scale = 0.37;
  Vec dscaled(N * V, kNaN);
  cpu::CrossEntropyBackward(dscaled.data(), logits.data(), targets.data(), N, V, scale);
  auto scaled_loss = [&] { return scale * N * mean_loss(); };
  CheckGradient("cross_entropy.logits (scale 0.37)", logits, dscaled, scaled_loss)
      .Print("cross_entropy.logits (scale 0.37)");
  // In place (dlogits aliasing logits), as the model calls it.
  Vec in_place = logits;
  cpu::CrossEntropyBackward(in_place.data(), in_place.data(), targets.data(), N, V, 1.0 / N);
  ExpectBitwise(in_place, dlogits, "cross_entropy in place");
  // Each row's gradient sums to 0 (softmax minus one-hot).
  for (int64_t i = 0; i < N; ++i) {
    double s = 0;
    for (int64_t j = 0; j < V; ++j) s += dlogits[i * V + j];
    ASSERT_NEAR(s, 0.0, 1e-16);
  }
}

// ---------------------------------------------------------------- whole model

LlamaShape TinyShape(bool tied, int heads, int kv_heads, int hidden = 8) {
  LlamaShape s;
  s.vocab_size = 11;
  s.hidden_size = hidden;
  s.intermediate_size = 12;
  s.num_layers = 2;
  s.num_heads = heads;
  s.num_kv_heads = kv_heads;
  s.rope_theta = 100.0;  // large angles on every frequency at T = 5
  s.rms_norm_eps = 1e-5;
  s.tie_word_embeddings = tied;
  return s;
}

// Random parameters, one stream per tensor: embeddings/lm_head N(0, 1),
// other matrices N(0, 0.4^2), norm weights 1 + N(0, 0.2^2). Padding between
// tensors is NaN: the model must never read it.
Vec RandomParams(const ParamLayout& layout, uint64_t seed) {
  Vec p(layout.size(), kNaN);
  for (const TensorSpec& t : layout.tensors()) {
    Rng rng(Mix64(seed) ^ HashName(t.name));
    const bool norm = t.shape.size() == 1;
    const bool vocab = t.name == "model.embed_tokens.weight" || t.name == "lm_head.weight";
    const double scale = norm ? 0.2 : vocab ? 1.0 : 0.4;
    for (int64_t i = 0; i < t.numel; ++i) p[t.offset + i] = (norm ? 1.0 : 0.0) + scale * rng.Normal();
  }
  return p;
}

std::vector<bool> IsPadding(const ParamLayout& layout) {
  std::vector<bool> pad(layout.size(), true);
  for (const TensorSpec& t : layout.tensors())
    std::fill(pad.begin() + t.offset, pad.begin() + t.offset + t.numel, false);
  return pad;
}

constexpr int kB = 2, kT = 5;
// Tokens 6 and 10 never appear as inputs (10 does appear as a target).
const std::vector<int32_t> kTokens = {0, 3, 3, 1, 9, 2, 5, 7, 8, 4};
const std::vector<int32_t> kTargets = {3, 3, 1, 9, 10, 5, 7, 8, 4, 0};
const std::vector<int32_t> kUnusedInputs = {6, 10};

// grads_start + d(scale * sum of losses)/d params for one Forward/Backward.
Vec ModelGrad(LlamaModel<double>& model, const Vec& params, const std::vector<int32_t>& tokens,
              const std::vector<int32_t>& targets, int B, int T, double scale, const Vec& start, double* loss) {
  Vec g = start;
  const double l = model.Forward(params.data(), tokens.data(), targets.data(), B, T);
  if (loss != nullptr) *loss = l;
  model.Backward(params.data(), g.data(), scale);
  return g;
}

void CheckModel(const LlamaShape& s, const std::string& tag) {
  LlamaModel<double> model(s, kB, kT);
  const ParamLayout& layout = model.layout();
  Vec params = RandomParams(layout, 801);
  const std::vector<bool> pad = IsPadding(layout);
  const int64_t n = layout.size();
  const double mean_scale = 1.0 / (kB * kT);

  const Vec zero(n, 0.0);
  double mean = 0;
  const Vec grads = ModelGrad(model, params, kTokens, kTargets, kB, kT, mean_scale, zero, &mean);
  ASSERT_TRUE(std::isfinite(mean)) << tag << ": the forward read NaN padding";
  for (int64_t i = 0; i < n; ++i) {
    if (pad[i]) {
      ASSERT_EQ(grads[i], 0.0) << tag << ": Backward wrote padding at " << i;
    }
  }

  // The analytic gradient above used the default thread count; everything
  // below runs on one thread (tiny sizes, where OpenMP start-up costs more
  // than it saves, and a loaded machine makes it cost a lot more), which
  // gives the same gradient to rounding.
  ScopedThreads one(1);
  const Vec one_thread = ModelGrad(model, params, kTokens, kTargets, kB, kT, mean_scale, zero, nullptr);
  ExpectClose(one_thread, grads, 1e-13, tag + " 1 thread vs default");

  // Every element of every tensor against the mean loss.
  auto loss = [&] { return model.Forward(params.data(), kTokens.data(), kTargets.data(), kB, kT); };
  GradStats all;
  for (const TensorSpec& t : layout.tensors()) {
    all.Merge(CheckGradient(tag + " " + t.name, params.data() + t.offset, grads.data() + t.offset, t.numel, loss,
                            kModelStep));
    if (::testing::Test::HasFailure()) return;
  }
  all.Print("model " + tag);
  EXPECT_EQ(loss(), mean) << tag << ": parameters not restored";

  // Embedding rows of tokens that never occur as inputs: exactly zero when
  // untied; with tied embeddings the lm_head gives every row a gradient.
  for (int32_t row : kUnusedInputs) {
    double norm = 0;
    for (int c = 0; c < s.hidden_size; ++c) norm += std::fabs(grads[layout.embed() + row * s.hidden_size + c]);
    if (s.tie_word_embeddings) {
      EXPECT_GT(norm, 1e-6) << tag << " row " << row;
    } else {
      EXPECT_EQ(norm, 0.0) << tag << " row " << row;
    }
  }

  // loss_scale: scale 1 gives B*T times the gradient of the mean.
  const Vec sum_grads = ModelGrad(model, params, kTokens, kTargets, kB, kT, 1.0, zero, nullptr);
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_NEAR(sum_grads[i], kB * kT * grads[i], 1e-13 * (1 + std::fabs(sum_grads[i]))) << tag << " scale " << i;
  }

  // Backward accumulates: a random start plus the gradient; the same batch
  // twice gives twice; two different micro-batches give the sum of each.
  const Vec start = Random(n, 802);
  const Vec acc = ModelGrad(model, params, kTokens, kTargets, kB, kT, mean_scale, start, nullptr);
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_NEAR(acc[i], start[i] + grads[i], 1e-14 * (1 + std::fabs(start[i]))) << tag << " accumulate " << i;
  }
  const Vec twice = ModelGrad(model, params, kTokens, kTargets, kB, kT, mean_scale, grads, nullptr);
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_NEAR(twice[i], 2 * grads[i], 1e-14 * (1 + std::fabs(grads[i]))) << tag << " twice " << i;
  }
  const std::vector<int32_t> tokens2 = {10, 6, 6, 2, 0, 1, 1, 4, 9, 3}, targets2 = {6, 6, 2, 0, 1, 8, 4, 9, 3, 3};
  const Vec g2 = ModelGrad(model, params, tokens2, targets2, kB, kT, mean_scale, zero, nullptr);
  Vec both = ModelGrad(model, params, kTokens, kTargets, kB, kT, mean_scale, zero, nullptr);
  both = ModelGrad(model, params, tokens2, targets2, kB, kT, mean_scale, both, nullptr);
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_NEAR(both[i], grads[i] + g2[i], 1e-14 * (1 + std::fabs(g2[i]))) << tag << " micro-batches " << i;
  }

  // A model sized for more (B 3, T 7) run on B 2, T 5, after a full-size
  // step: same loss and gradients as the exact-size model (no stride or
  // stale-state mistakes).
  LlamaModel<double> big(s, 3, 7);
  std::vector<int32_t> big_tokens(21), big_targets(21);
  for (int i = 0; i < 21; ++i) big_tokens[i] = (i * 7 + 3) % 11, big_targets[i] = (i * 5 + 1) % 11;
  ModelGrad(big, params, big_tokens, big_targets, 3, 7, 1.0 / 21, zero, nullptr);
  double big_mean = 0;
  const Vec big_grads = ModelGrad(big, params, kTokens, kTargets, kB, kT, mean_scale, zero, &big_mean);
  EXPECT_NEAR(big_mean, mean, 1e-14) << tag;
  ExpectClose(big_grads, grads, 1e-13, tag + " max-size model");
}

TEST(GradCheckLlama, TiedGroupedQuery) { CheckModel(TinyShape(true, 4, 2), "tied H4/KV2"); }
TEST(GradCheckLlama, UntiedGroupedQuery) { CheckModel(TinyShape(false, 4, 2), "untied H4/KV2"); }
TEST(GradCheckLlama, UntiedMultiHead) { CheckModel(TinyShape(false, 4, 4), "untied H4/KV4"); }
// head_dim 4 (two RoPE frequencies, where head_dim 2 has one) and one kv head.
TEST(GradCheckLlama, TiedMultiQueryHeadDim4) { CheckModel(TinyShape(true, 2, 1), "tied H2/KV1 hd4"); }

}  // namespace
}  // namespace herd
