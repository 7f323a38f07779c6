// Every CUDA kernel against model/cpu's implementation (run in double, the
// reference), in both compute dtypes. fp32: 2e-5 relative to the largest
// element of each row (kFp32Tolerance). bf16: the reference is fed the same
// bf16-rounded inputs and the tolerance is stated per tensor below (bf16
// keeps 8 significant bits, 3.9e-3 relative per rounding; outputs that
// pass through several rounded intermediates get more).
#include "model/cuda/kernels.h"

#include <gtest/gtest.h>

#include <numeric>

#include "model/cpu/ops.h"
#include "model/cuda/matmul.h"
#include "model/llama_config.h"
#include "model/optim/adamw.h"
#include "tests/cuda/device_test_util.h"

namespace herd::cuda {
namespace {

using namespace ::herd::cuda::testing;  // NOLINT

// fp32 mode's bound, row by row (Tolerance): what the emulated device
// meets with room to spare (its worst, 7.2e-6, is attention's dq).
constexpr double kFp32Tolerance = 2e-5;

template <typename T>
class KernelTest : public ::testing::Test {
 protected:
  // fp32 mode's bound, or the bf16 bound stated at the call.
  static Tolerance Tol(double bf16_tol, int64_t row = 0) {
    return std::is_same_v<T, float> ? Tolerance(kFp32Tolerance, row) : Tolerance(bf16_tol);
  }
  static std::vector<float> Input(int64_t n, uint32_t seed, float scale = 1.0f) {
    return Rounded<T>(Random(n, seed, scale));
  }
  cudaStream_t stream = nullptr;  // the default stream
};
using ComputeTypes = ::testing::Types<float, bf16>;
TYPED_TEST_SUITE(KernelTest, ComputeTypes);

TYPED_TEST(KernelTest, Embedding) {
  HERD_REQUIRE_DEVICE();
  using T = TypeParam;
  const int64_t N = 40, C = 96, V = 11;
  std::vector<int32_t> tokens(N);
  for (int64_t i = 0; i < N; ++i) tokens[i] = static_cast<int32_t>((i * 7 + i / 5) % V);  // repeats
  const auto table = this->Input(V * C, 1), dout = this->Input(N * C, 2);
  const auto dtable0 = Random(V * C, 3);

  std::vector<double> out_ref(N * C), dtable_ref = ToDouble(dtable0);
  cpu::EmbeddingForward(out_ref.data(), tokens.data(), ToDouble(table).data(), N, C);
  cpu::EmbeddingBackward(dtable_ref.data(), ToDouble(dout).data(), tokens.data(), N, C);

  DeviceArray<int32_t> d_tokens(N);
  HERD_CUDA_CHECK(cudaMemcpy(d_tokens.get(), tokens.data(), N * sizeof(int32_t), cudaMemcpyHostToDevice));
  DeviceArray<T> d_table(table), d_dout(dout), d_out(N * C);
  DeviceArray<float> d_dtable(dtable0);
  EmbeddingForward(d_out.get(), d_tokens.get(), d_table.get(), N, C, this->stream);
  const EmbeddingGroups groups = EmbeddingGroups::Build(tokens.data(), N);
  const int64_t G = static_cast<int64_t>(groups.tokens.size());
  DeviceArray<int32_t> g_tokens(G), g_starts(G + 1), g_positions(N);
  HERD_CUDA_CHECK(cudaMemcpy(g_tokens.get(), groups.tokens.data(), G * 4, cudaMemcpyHostToDevice));
  HERD_CUDA_CHECK(cudaMemcpy(g_starts.get(), groups.starts.data(), (G + 1) * 4, cudaMemcpyHostToDevice));
  HERD_CUDA_CHECK(cudaMemcpy(g_positions.get(), groups.positions.data(), N * 4, cudaMemcpyHostToDevice));
  EmbeddingBackward(d_dtable.get(), d_dout.get(), g_tokens.get(), g_starts.get(), g_positions.get(), G, C,
                    this->stream);

  EXPECT_CLOSE(d_out.Download(), out_ref, 0.0, "embedding out (a copy: exact)");
  EXPECT_CLOSE(d_dtable.Download(), dtable_ref, 1e-6, "embedding dtable (fp32 accumulation)");
}

TYPED_TEST(KernelTest, RmsNorm) {
  HERD_REQUIRE_DEVICE();
  using T = TypeParam;
  const int64_t N = 37, C = 200;  // C not a multiple of the warp; N not of the block's rows
  const auto x = this->Input(N * C, 4), w = this->Input(C, 5), dout = this->Input(N * C, 6);
  const auto din0 = this->Input(N * C, 7), dw0 = Random(C, 8);
  std::vector<double> out_ref(N * C), rstd_ref(N), din_ref = ToDouble(din0), dw_ref = ToDouble(dw0);
  cpu::RmsNormForward(out_ref.data(), rstd_ref.data(), ToDouble(x).data(), ToDouble(w).data(), N, C, 1e-5);
  cpu::RmsNormBackward(din_ref.data(), dw_ref.data(), ToDouble(dout).data(), ToDouble(x).data(), ToDouble(w).data(),
                       rstd_ref.data(), N, C);

  DeviceArray<T> d_x(x), d_w(w), d_dout(dout), d_din(din0), d_out(N * C);
  DeviceArray<float> d_rstd(N), d_dw(dw0), scratch(RmsNormScratchFloats(N, C));
  RmsNormForward(d_out.get(), d_rstd.get(), d_x.get(), d_w.get(), N, C, 1e-5f, this->stream);
  RmsNormBackward(d_din.get(), d_dw.get(), d_dout.get(), d_x.get(), d_w.get(), d_rstd.get(), N, C, scratch.get(),
                  this->stream);
  EXPECT_CLOSE(d_out.Download(), out_ref, this->Tol(5e-3, C), "rmsnorm out");
  EXPECT_CLOSE(d_rstd.Download(), rstd_ref, 1e-5, "rmsnorm rstd (fp32)");
  EXPECT_CLOSE(d_din.Download(), din_ref, this->Tol(1e-2, C), "rmsnorm din");
  EXPECT_CLOSE(d_dw.Download(), dw_ref, this->Tol(1e-4), "rmsnorm dweight (fp32)");
}

TYPED_TEST(KernelTest, Rope) {
  HERD_REQUIRE_DEVICE();
  using T = TypeParam;
  const int64_t B = 2, T_ = 13, heads = 3, hd = 32, n = B * T_ * heads * hd;
  std::vector<float> cos(T_ * hd / 2), sin(T_ * hd / 2);
  cpu::RopeTables(cos.data(), sin.data(), T_, hd, 10000.0);
  const auto x = this->Input(n, 9), dx = this->Input(n, 10);
  std::vector<double> x_ref = ToDouble(x), dx_ref = ToDouble(dx);
  cpu::RopeForward(x_ref.data(), ToDouble(cos).data(), ToDouble(sin).data(), B, T_, heads, hd);
  cpu::RopeBackward(dx_ref.data(), ToDouble(cos).data(), ToDouble(sin).data(), B, T_, heads, hd);
  DeviceArray<T> d_x(x), d_dx(dx);
  DeviceArray<float> d_cos(cos), d_sin(sin);
  RopeForward(d_x.get(), d_cos.get(), d_sin.get(), B, T_, heads, hd, this->stream);
  RopeBackward(d_dx.get(), d_cos.get(), d_sin.get(), B, T_, heads, hd, this->stream);
  EXPECT_CLOSE(d_x.Download(), x_ref, this->Tol(5e-3, hd), "rope out");
  EXPECT_CLOSE(d_dx.Download(), dx_ref, this->Tol(5e-3, hd), "rope dx");
}

// Causal GQA with T not a multiple of any tile and two query heads per
// key/value head.
void CheckAttention(int64_t B, int64_t T_, int64_t H, int64_t KV, int64_t hd, Tolerance tol_out, Tolerance tol_grad,
                    bool bf16_mode) {
  const int64_t nq = B * T_ * H * hd, nkv = B * T_ * KV * hd;
  auto round = [&](std::vector<float> v) { return bf16_mode ? Rounded<bf16>(v) : v; };
  const auto q = round(Random(nq, 11)), k = round(Random(nkv, 12)), v = round(Random(nkv, 13));
  const auto dout = round(Random(nq, 14));
  std::vector<double> out_ref(nq), probs(B * H * T_ * T_), dq_ref(nq), dk_ref(nkv), dv_ref(nkv);
  std::vector<double> scratch(cpu::AttentionScratchSize(T_, H, KV));
  cpu::AttentionForward(out_ref.data(), probs.data(), ToDouble(q).data(), ToDouble(k).data(), ToDouble(v).data(), B, T_,
                        H, KV, hd);
  cpu::AttentionBackward(dq_ref.data(), dk_ref.data(), dv_ref.data(), ToDouble(dout).data(), probs.data(),
                         ToDouble(q).data(), ToDouble(k).data(), ToDouble(v).data(), B, T_, H, KV, hd, scratch.data());
  auto run = [&](auto tag) {
    using T = decltype(tag);
    DeviceArray<T> d_q(q), d_k(k), d_v(v), d_dout(dout), d_out(nq), d_dq(nq), d_dk(nkv), d_dv(nkv);
    DeviceArray<float> d_lse(B * H * T_), d_scratch(AttentionScratchFloats(B, T_, H));
    AttentionForward(d_out.get(), d_lse.get(), d_q.get(), d_k.get(), d_v.get(), B, T_, H, KV, hd, nullptr);
    AttentionBackward(d_dq.get(), d_dk.get(), d_dv.get(), d_dout.get(), d_out.get(), d_lse.get(), d_q.get(), d_k.get(),
                      d_v.get(), B, T_, H, KV, hd, d_scratch.get(), nullptr);
    const std::string shape = " (T=" + std::to_string(T_) + " hd=" + std::to_string(hd) + ")";
    EXPECT_CLOSE(d_out.Download(), out_ref, tol_out, "attention out" + shape);
    EXPECT_CLOSE(d_dq.Download(), dq_ref, tol_grad, "attention dq" + shape);
    EXPECT_CLOSE(d_dk.Download(), dk_ref, tol_grad, "attention dk" + shape);
    EXPECT_CLOSE(d_dv.Download(), dv_ref, tol_grad, "attention dv" + shape);
    // A second backward is bitwise the first (no atomics, fixed order).
    const auto first = d_dk.Raw();
    AttentionBackward(d_dq.get(), d_dk.get(), d_dv.get(), d_dout.get(), d_out.get(), d_lse.get(), d_q.get(), d_k.get(),
                      d_v.get(), B, T_, H, KV, hd, d_scratch.get(), nullptr);
    const auto second = d_dk.Raw();
    EXPECT_EQ(0, std::memcmp(first.data(), second.data(), first.size() * sizeof(T))) << "attention dk rerun";
  };
  if (bf16_mode)
    run(bf16{});
  else
    run(float{});
}

TYPED_TEST(KernelTest, Attention) {
  HERD_REQUIRE_DEVICE();
  const bool bf16_mode = std::is_same_v<TypeParam, bf16>;
  CheckAttention(2, 70, 4, 2, 32, this->Tol(5e-3, 32), this->Tol(1e-2, 32), bf16_mode);
  CheckAttention(1, 33, 3, 1, 64, this->Tol(5e-3, 64), this->Tol(1e-2, 64), bf16_mode);
  CheckAttention(1, 65, 4, 4, 16, this->Tol(5e-3, 16), this->Tol(1e-2, 16), bf16_mode);
  // bf16 takes the tensor-core kernels here (head_dim 64 and 128): several
  // 64-row tiles, a ragged last one, and a group of two.
  CheckAttention(1, 130, 2, 1, 128, this->Tol(5e-3, 128), this->Tol(1e-2, 128), bf16_mode);
  CheckAttention(2, 100, 4, 2, 64, this->Tol(5e-3, 64), this->Tol(1e-2, 64), bf16_mode);
}

// Context parallelism's attention: rank r of C's two chunks of each
// sequence (model/llama_config.h's ContextPosition) as the queries, the
// whole sequences' keys and values, against the CPU's with the same
// positions (the FMA kernels, whatever the dtype).
TYPED_TEST(KernelTest, AttentionOfAContextRanksChunks) {
  HERD_REQUIRE_DEVICE();
  using T = TypeParam;
  const int64_t B = 2, Tk = 96, H = 4, KV = 2, hd = 32, C = 2, chunk = Tk / (2 * C), Tl = 2 * chunk;
  for (int rank = 0; rank < C; ++rank) {
    std::vector<int32_t> positions(Tl);
    for (int64_t t = 0; t < Tl; ++t) positions[t] = static_cast<int32_t>(ContextPosition(rank, C, chunk, t));
    const int64_t nq = B * Tl * H * hd, nkv = B * Tk * KV * hd;
    const auto q = this->Input(nq, 31), k = this->Input(nkv, 32), v = this->Input(nkv, 33), dout = this->Input(nq, 34);
    std::vector<double> out_ref(nq), probs(B * H * Tl * Tk), dq_ref(nq), dk_ref(nkv), dv_ref(nkv);
    std::vector<double> scratch(cpu::AttentionScratchSize(Tl, H, KV, Tk));
    cpu::AttentionForward(out_ref.data(), probs.data(), ToDouble(q).data(), ToDouble(k).data(), ToDouble(v).data(), B,
                          Tl, H, KV, hd, Tk, positions.data());
    cpu::AttentionBackward(dq_ref.data(), dk_ref.data(), dv_ref.data(), ToDouble(dout).data(), probs.data(),
                           ToDouble(q).data(), ToDouble(k).data(), ToDouble(v).data(), B, Tl, H, KV, hd,
                           scratch.data(), Tk, positions.data());
    DeviceArray<T> d_q(q), d_k(k), d_v(v), d_dout(dout), d_out(nq), d_dq(nq), d_dk(nkv), d_dv(nkv);
    DeviceArray<float> d_lse(B * H * Tl), d_scratch(AttentionScratchFloats(B, Tl, H));
    DeviceArray<int32_t> d_positions(Tl);
    HERD_CUDA_CHECK(cudaMemcpy(d_positions.get(), positions.data(), Tl * 4, cudaMemcpyHostToDevice));
    AttentionForward(d_out.get(), d_lse.get(), d_q.get(), d_k.get(), d_v.get(), B, Tl, H, KV, hd, this->stream, Tk,
                     d_positions.get());
    AttentionBackward(d_dq.get(), d_dk.get(), d_dv.get(), d_dout.get(), d_out.get(), d_lse.get(), d_q.get(), d_k.get(),
                      d_v.get(), B, Tl, H, KV, hd, d_scratch.get(), this->stream, Tk, d_positions.get());
    const std::string who = " (context rank " + std::to_string(rank) + " of 2)";
    EXPECT_CLOSE(d_out.Download(), out_ref, this->Tol(5e-3, hd), "attention out" + who);
    EXPECT_CLOSE(d_dq.Download(), dq_ref, this->Tol(1e-2, hd), "attention dq" + who);
    EXPECT_CLOSE(d_dk.Download(), dk_ref, this->Tol(1e-2, hd), "attention dk (every key row)" + who);
    EXPECT_CLOSE(d_dv.Download(), dv_ref, this->Tol(1e-2, hd), "attention dv (every key row)" + who);
  }
}

TYPED_TEST(KernelTest, SwigluAndAdd) {
  HERD_REQUIRE_DEVICE();
  using T = TypeParam;
  const int64_t n = 1000;
  const auto gate = this->Input(n, 15, 2.0f), up = this->Input(n, 16), dout = this->Input(n, 17);
  std::vector<double> out_ref(n), dgate_ref(n), dup_ref(n), sum_ref(n);
  cpu::SwigluForward(out_ref.data(), ToDouble(gate).data(), ToDouble(up).data(), n);
  cpu::SwigluBackward(dgate_ref.data(), dup_ref.data(), ToDouble(dout).data(), ToDouble(gate).data(),
                      ToDouble(up).data(), n);
  cpu::AddForward(sum_ref.data(), ToDouble(gate).data(), ToDouble(up).data(), n);
  DeviceArray<T> d_gate(gate), d_up(up), d_dout(dout), d_out(n), d_dgate(n), d_dup(n), d_sum(n);
  SwigluForward(d_out.get(), d_gate.get(), d_up.get(), n, this->stream);
  SwigluBackward(d_dgate.get(), d_dup.get(), d_dout.get(), d_gate.get(), d_up.get(), n, this->stream);
  AddForward(d_sum.get(), d_gate.get(), d_up.get(), n, this->stream);
  EXPECT_CLOSE(d_out.Download(), out_ref, this->Tol(5e-3), "swiglu out");
  EXPECT_CLOSE(d_dgate.Download(), dgate_ref, this->Tol(5e-3), "swiglu dgate");
  EXPECT_CLOSE(d_dup.Download(), dup_ref, this->Tol(5e-3), "swiglu dup");
  EXPECT_CLOSE(d_sum.Download(), sum_ref, this->Tol(5e-3), "residual add");
}

TYPED_TEST(KernelTest, CrossEntropy) {
  HERD_REQUIRE_DEVICE();
  using T = TypeParam;
  const int64_t N = 9, V = 1000;
  const auto logits = this->Input(N * V, 18, 3.0f);
  std::vector<int32_t> targets(N);
  for (int64_t i = 0; i < N; ++i) targets[i] = static_cast<int32_t>((i * 131) % V);
  const double scale = 1.0 / N;
  std::vector<double> losses_ref(N), dlogits_ref(N * V);
  cpu::CrossEntropyForward(losses_ref.data(), ToDouble(logits).data(), targets.data(), N, V);
  cpu::CrossEntropyBackward(dlogits_ref.data(), ToDouble(logits).data(), targets.data(), N, V, scale);
  DeviceArray<T> d_logits(logits);
  DeviceArray<float> d_losses(N), d_lse(N);
  DeviceArray<int32_t> d_targets(N);
  HERD_CUDA_CHECK(cudaMemcpy(d_targets.get(), targets.data(), N * 4, cudaMemcpyHostToDevice));
  CrossEntropyForward(d_losses.get(), d_lse.get(), d_logits.get(), d_targets.get(), N, V, this->stream);
  CrossEntropyBackward(d_logits.get(), d_lse.get(), d_targets.get(), N, V, static_cast<float>(scale), this->stream);
  EXPECT_CLOSE(d_losses.Download(), losses_ref, 1e-5, "cross-entropy losses (fp32 math on exact inputs)");
  EXPECT_CLOSE(d_logits.Download(), dlogits_ref, this->Tol(5e-3, V), "cross-entropy dlogits (in place)");
}

// A tensor-parallel rank's pieces, each rank's columns (vocabulary rows)
// computed apart and put together on the host as the group's sums would:
// the embedding's lookup and backward of [first, first + rows), and the
// vocabulary-parallel cross-entropy, against the whole table's and row's.
TYPED_TEST(KernelTest, VocabularyParallelPartsMakeTheWhole) {
  HERD_REQUIRE_DEVICE();
  using T = TypeParam;
  const int ranks = 2;
  const int64_t N = 9, V = 1000, part = V / ranks, C = 24;
  const auto logits = this->Input(N * V, 18, 3.0f), table = this->Input(V * C, 25), dout = this->Input(N * C, 26);
  std::vector<int32_t> targets(N);
  for (int64_t i = 0; i < N; ++i) targets[i] = static_cast<int32_t>((i * 131) % V);
  const double scale = 1.0 / N;
  std::vector<double> losses_ref(N), dlogits_ref(N * V), lookup_ref(N * C), dtable_ref(V * C, 0.0);
  cpu::CrossEntropyForward(losses_ref.data(), ToDouble(logits).data(), targets.data(), N, V);
  cpu::CrossEntropyBackward(dlogits_ref.data(), ToDouble(logits).data(), targets.data(), N, V, scale);
  cpu::EmbeddingForward(lookup_ref.data(), targets.data(), ToDouble(table).data(), N, C);
  cpu::EmbeddingBackward(dtable_ref.data(), ToDouble(dout).data(), targets.data(), N, C);

  DeviceArray<int32_t> d_targets(N);
  HERD_CUDA_CHECK(cudaMemcpy(d_targets.get(), targets.data(), N * 4, cudaMemcpyHostToDevice));
  const int64_t W = 2 * ranks + 1;
  std::vector<double> stats(N * W, 0.0), lookup(N * C, 0.0);
  std::vector<std::vector<float>> columns(ranks);
  std::vector<float> dtable(V * C);
  for (int r = 0; r < ranks; ++r) {
    columns[r].resize(N * part);
    for (int64_t i = 0; i < N; ++i) {
      std::copy(logits.begin() + i * V + r * part, logits.begin() + i * V + (r + 1) * part,
                columns[r].begin() + i * part);
    }
    DeviceArray<T> d_columns(columns[r]);
    DeviceArray<float> d_stats(N * W);
    VocabParallelStats(d_stats.get(), d_columns.get(), d_targets.get(), N, part, r * part, r, ranks, this->stream);
    const std::vector<float> mine = d_stats.Download();
    for (int64_t i = 0; i < N * W; ++i) stats[i] += mine[i];
    // The embedding's rows of this rank alone.
    const std::vector<float> rows(table.begin() + r * part * C, table.begin() + (r + 1) * part * C);
    DeviceArray<T> d_rows(rows), d_out(N * C), d_dout(dout);
    EmbeddingForward(d_out.get(), d_targets.get(), d_rows.get(), N, C, this->stream, r * part, part);
    const std::vector<float> out = d_out.Download();
    for (int64_t i = 0; i < N * C; ++i) lookup[i] += out[i];
    const EmbeddingGroups g = EmbeddingGroups::Build(targets.data(), N, r * part, part);
    const int64_t G = static_cast<int64_t>(g.tokens.size()), P = static_cast<int64_t>(g.positions.size());
    DeviceArray<int32_t> g_tokens(G), g_starts(G + 1), g_positions(P);
    HERD_CUDA_CHECK(cudaMemcpy(g_tokens.get(), g.tokens.data(), G * 4, cudaMemcpyHostToDevice));
    HERD_CUDA_CHECK(cudaMemcpy(g_starts.get(), g.starts.data(), (G + 1) * 4, cudaMemcpyHostToDevice));
    HERD_CUDA_CHECK(cudaMemcpy(g_positions.get(), g.positions.data(), P * 4, cudaMemcpyHostToDevice));
    DeviceArray<float> d_dtable(std::vector<float>(part * C, 0.0f));
    EmbeddingBackward(d_dtable.get(), d_dout.get(), g_tokens.get(), g_starts.get(), g_positions.get(), G, C,
                      this->stream);
    const std::vector<float> drows = d_dtable.Download();
    std::copy(drows.begin(), drows.end(), dtable.begin() + r * part * C);
  }
  EXPECT_CLOSE(std::vector<float>(lookup.begin(), lookup.end()), lookup_ref, 0.0,
               "the ranks' lookups, summed (each a copy or zeros: exact)");
  EXPECT_CLOSE(dtable, dtable_ref, 1e-6, "the ranks' embedding rows' gradients");

  DeviceArray<float> d_summed(std::vector<float>(stats.begin(), stats.end())), d_losses(N), d_lse(N);
  VocabParallelLoss(d_losses.get(), d_lse.get(), d_summed.get(), N, ranks, this->stream);
  EXPECT_CLOSE(d_losses.Download(), losses_ref, 1e-5, "vocabulary-parallel losses (fp32 math on exact inputs)");
  for (int r = 0; r < ranks; ++r) {
    DeviceArray<T> d_columns(columns[r]);
    CrossEntropyBackward(d_columns.get(), d_lse.get(), d_targets.get(), N, part, static_cast<float>(scale),
                         this->stream, r * part);
    std::vector<double> want(N * part);
    for (int64_t i = 0; i < N; ++i) {
      std::copy(dlogits_ref.begin() + i * V + r * part, dlogits_ref.begin() + i * V + (r + 1) * part,
                want.begin() + i * part);
    }
    EXPECT_CLOSE(d_columns.Download(), want, this->Tol(5e-3, part), "a rank's dlogits from the whole row's lse");
  }
}

TYPED_TEST(KernelTest, Matmul) {
  HERD_REQUIRE_DEVICE();
  using T = TypeParam;
  const int64_t N = 23, Cin = 40, Cout = 24;
  const auto in = this->Input(N * Cin, 19), w = this->Input(Cout * Cin, 20), res = this->Input(N * Cout, 21);
  const auto dout = this->Input(N * Cout, 22), din0 = this->Input(N * Cin, 23), dw0 = Random(Cout * Cin, 24);
  std::vector<double> out_ref(N * Cout), din_ref(N * Cin), din_acc_ref = ToDouble(din0), dw_ref = ToDouble(dw0);
  cpu::MatmulForward(out_ref.data(), ToDouble(in).data(), ToDouble(w).data(), N, Cin, Cout);
  for (int64_t i = 0; i < N * Cout; ++i) out_ref[i] += res[i];
  cpu::MatmulBackward(din_ref.data(), dw_ref.data(), ToDouble(dout).data(), ToDouble(in).data(), ToDouble(w).data(), N,
                      Cin, Cout);
  std::vector<double> unused(Cout * Cin);
  cpu::MatmulBackward(din_acc_ref.data(), unused.data(), ToDouble(dout).data(), ToDouble(in).data(), ToDouble(w).data(),
                      N, Cin, Cout, /*accumulate_din=*/true);

  Matmul matmul;
  DeviceArray<T> d_in(in), d_w(w), d_res(res), d_dout(dout), d_out(N * Cout), d_din(N * Cin), d_din_acc(din0);
  DeviceArray<float> d_dw(dw0);
  matmul.Forward(d_out.get(), d_in.get(), d_w.get(), N, Cin, Cout, d_res.get(), this->stream);
  matmul.BackwardInput(d_din.get(), d_dout.get(), d_w.get(), N, Cin, Cout, false, this->stream);
  matmul.BackwardInput(d_din_acc.get(), d_dout.get(), d_w.get(), N, Cin, Cout, true, this->stream);
  matmul.BackwardWeight(d_dw.get(), d_dout.get(), d_in.get(), N, Cin, Cout, this->stream);
  EXPECT_CLOSE(d_out.Download(), out_ref, this->Tol(5e-3, Cout), "matmul out + residual");
  EXPECT_CLOSE(d_din.Download(), din_ref, this->Tol(5e-3, Cin), "matmul din");
  EXPECT_CLOSE(d_din_acc.Download(), din_acc_ref, this->Tol(5e-3, Cin), "matmul din accumulated");
  EXPECT_CLOSE(d_dw.Download(), dw_ref, this->Tol(1e-4, Cin), "matmul dweight (fp32, accumulated)");
}

TEST(OptimizerKernels, AdamWAndSumOfSquaresMatchTheCpu) {
  HERD_REQUIRE_DEVICE();
  const int64_t n = 10000;
  auto params = Random(n, 25), m = Random(n, 26, 0.1f), v = Random(n, 27, 0.1f);
  for (float& x : v) x = x * x;
  const auto grads = Random(n, 28);
  const AdamWOptions o{0.9, 0.95, 1e-8, 0.1};
  const int64_t step = 3;
  const double lr = 1e-3, grad_scale = 0.7;
  const AdamWScalars s = MakeAdamWScalars(o, step, lr, grad_scale);
  DeviceArray<float> d_p(params), d_g(grads), d_m(m), d_v(v);
  DeviceArray<double> d_partial(SumOfSquaresChunks(n));
  AdamW(d_p.get(), d_g.get(), d_m.get(), d_v.get(), n, s, s.DecayFor(true), nullptr);  // one decayed segment
  SumOfSquaresPartials(d_partial.get(), d_g.get(), n, nullptr);
  double squares = 0;
  for (double partial : d_partial.Raw()) squares += partial;
  EXPECT_NEAR(squares, SumOfSquares(grads.data(), n), 1e-9 * squares) << "sum of squares";
  const std::vector<DecaySegment> segments{{0, n, true}};
  AdamWStep(segments, 0, params.data(), grads.data(), m.data(), v.data(), step, lr, grad_scale, o);
  EXPECT_CLOSE(d_p.Download(), ToDouble(params), 1e-6, "adamw params");
  EXPECT_CLOSE(d_m.Download(), ToDouble(m), 1e-6, "adamw m");
  EXPECT_CLOSE(d_v.Download(), ToDouble(v), 1e-6, "adamw v");
}

}  // namespace
}  // namespace herd::cuda
