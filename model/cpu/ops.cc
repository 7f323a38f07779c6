#include "model/cpu/ops.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numbers>

#include "model/cpu/vec_math.h"

namespace herd::cpu {
namespace {

// Row-major GEMM: C[M,N] = alpha * op(A) op(B) + beta * C.
void Gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
          const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, M, N, K,
              alpha, A, lda, B, ldb, beta, C, ldc);
}
void Gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, double alpha, const double* A, int64_t lda,
          const double* B, int64_t ldb, double beta, double* C, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, M, N, K,
              alpha, A, lda, B, ldb, beta, C, ldc);
}

// Splits [0, n) into `parts` nearly equal blocks; block i is [lo, hi).
inline void Block(int64_t n, int parts, int i, int64_t* lo, int64_t* hi) {
  *lo = n * i / parts;
  *hi = n * (i + 1) / parts;
}

}  // namespace

// ---------------------------------------------------------------- embedding

template <typename T>
void EmbeddingForward(T* out, const int32_t* tokens, const T* table, int64_t N, int64_t C, int64_t first,
                      int64_t rows) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    const int64_t row = static_cast<int64_t>(tokens[i]) - first;
    if (rows >= 0 && (row < 0 || row >= rows)) {
      std::fill(out + i * C, out + (i + 1) * C, T(0));
      continue;
    }
    std::memcpy(out + i * C, table + row * C, sizeof(T) * C);
  }
}

template <typename T>
void EmbeddingBackward(T* dtable, const T* dout, const int32_t* tokens, int64_t N, int64_t C, int64_t first,
                       int64_t rows) {
  // Each thread owns a block of channels and walks all tokens in order:
  // no atomics, and every element's sum order is fixed.
#pragma omp parallel
  {
    int64_t lo, hi;
    Block(C, omp_get_num_threads(), omp_get_thread_num(), &lo, &hi);
    for (int64_t i = 0; i < N; ++i) {
      const int64_t r = static_cast<int64_t>(tokens[i]) - first;
      if (rows >= 0 && (r < 0 || r >= rows)) continue;
      T* row = dtable + r * C;
      const T* g = dout + i * C;
#pragma omp simd
      for (int64_t c = lo; c < hi; ++c) row[c] += g[c];
    }
  }
}

// ---------------------------------------------------------------- RMSNorm

template <typename T>
void RmsNormForward(T* out, T* rstd, const T* in, const T* weight, int64_t N, int64_t C, double eps) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    const T* x = in + i * C;
    T* y = out + i * C;
    T ss = 0;
#pragma omp simd reduction(+ : ss)
    for (int64_t c = 0; c < C; ++c) ss += x[c] * x[c];
    T r = T(1) / std::sqrt(ss / T(C) + T(eps));
    rstd[i] = r;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) y[c] = weight[c] * (x[c] * r);
  }
}

template <typename T>
void RmsNormBackward(T* din, T* dweight, const T* dout, const T* in, const T* weight, const T* rstd, int64_t N,
                     int64_t C) {
  // din: rows are independent.
  if (din != nullptr) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N; ++i) {
      const T* x = in + i * C;
      const T* g = dout + i * C;
      T* dx = din + i * C;
      const T r = rstd[i];
      T dot = 0;  // sum_c g_c w_c xhat_c
#pragma omp simd reduction(+ : dot)
      for (int64_t c = 0; c < C; ++c) dot += g[c] * weight[c] * (x[c] * r);
      const T mean = dot / T(C);
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) dx[c] += r * (g[c] * weight[c] - (x[c] * r) * mean);
    }
  }
  // dweight: channel blocks per thread, rows in order.
  if (dweight == nullptr) return;
#pragma omp parallel
  {
    int64_t lo, hi;
    Block(C, omp_get_num_threads(), omp_get_thread_num(), &lo, &hi);
    for (int64_t i = 0; i < N; ++i) {
      const T* x = in + i * C;
      const T* g = dout + i * C;
      const T r = rstd[i];
#pragma omp simd
      for (int64_t c = lo; c < hi; ++c) dweight[c] += g[c] * (x[c] * r);
    }
  }
}

// ---------------------------------------------------------------- matmul

template <typename T>
void MatmulForward(T* out, const T* in, const T* weight, int64_t N, int64_t Cin, int64_t Cout) {
  Gemm(false, true, N, Cout, Cin, T(1), in, Cin, weight, Cin, T(0), out, Cout);
}

template <typename T>
void MatmulBackward(T* din, T* dweight, const T* dout, const T* in, const T* weight, int64_t N, int64_t Cin,
                    int64_t Cout, bool accumulate_din) {
  if (din != nullptr) {
    Gemm(false, false, N, Cin, Cout, T(1), dout, Cout, weight, Cin, accumulate_din ? T(1) : T(0), din, Cin);
  }
  if (dweight != nullptr) Gemm(true, false, Cout, Cin, N, T(1), dout, Cout, in, Cin, T(1), dweight, Cin);
}

// ---------------------------------------------------------------- RoPE

namespace {

// transformers' _compute_llama3_parameters for one frequency, operation for
// operation in the working precision (torch evaluates `scalar / tensor` as
// tensor.reciprocal() * scalar).
template <typename T>
T Llama3InvFreq(T inv_freq, const RopeScaling& s) {
  const T factor = static_cast<T>(s.factor);
  const T low_freq_wavelen = static_cast<T>(s.original_max_position_embeddings / s.low_freq_factor);
  const T high_freq_wavelen = static_cast<T>(s.original_max_position_embeddings / s.high_freq_factor);
  const T wavelen = (T(1) / inv_freq) * static_cast<T>(2 * std::numbers::pi);
  const T scaled = wavelen > low_freq_wavelen ? inv_freq / factor : inv_freq;
  if (wavelen < high_freq_wavelen || wavelen > low_freq_wavelen) return scaled;
  const T smooth = ((T(1) / wavelen) * static_cast<T>(s.original_max_position_embeddings) -
                    static_cast<T>(s.low_freq_factor)) /
                   static_cast<T>(s.high_freq_factor - s.low_freq_factor);
  return (T(1) - smooth) * scaled / factor + smooth * scaled;
}

}  // namespace

template <typename T>
void RopeTables(T* cos, T* sin, int64_t T_, int64_t head_dim, double theta, const RopeScaling& scaling) {
  // Same arithmetic as HF's LlamaRotaryEmbedding in the working precision:
  // inv_freq = 1 / theta^(2i/hd), angle = t * inv_freq, then cos/sin.
  const int64_t half = head_dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    T exponent = static_cast<T>(2 * i) / static_cast<T>(head_dim);
    T inv_freq = T(1) / std::pow(static_cast<T>(theta), exponent);
    if (scaling.llama3()) inv_freq = Llama3InvFreq(inv_freq, scaling);
    for (int64_t t = 0; t < T_; ++t) {
      T angle = static_cast<T>(t) * inv_freq;
      cos[t * half + i] = static_cast<T>(std::cos(static_cast<double>(angle)));
      sin[t * half + i] = static_cast<T>(std::sin(static_cast<double>(angle)));
    }
  }
}

namespace {

// direction +1: forward rotation; -1: its transpose (backward).
template <typename T>
void RopeApply(T* x, const T* cos, const T* sin, int64_t B, int64_t T_, int64_t heads, int64_t head_dim,
               T direction) {
  const int64_t half = head_dim / 2;
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T_; ++t) {
      const T* c = cos + t * half;
      const T* s = sin + t * half;
      for (int64_t h = 0; h < heads; ++h) {
        T* v = x + ((b * T_ + t) * heads + h) * head_dim;
#pragma omp simd
        for (int64_t i = 0; i < half; ++i) {
          T x1 = v[i], x2 = v[i + half];
          T sn = direction * s[i];
          v[i] = x1 * c[i] - x2 * sn;
          v[i + half] = x2 * c[i] + x1 * sn;
        }
      }
    }
  }
}

}  // namespace

template <typename T>
void RopeForward(T* x, const T* cos, const T* sin, int64_t B, int64_t T_, int64_t heads, int64_t head_dim) {
  RopeApply(x, cos, sin, B, T_, heads, head_dim, T(1));
}

template <typename T>
void RopeBackward(T* dx, const T* cos, const T* sin, int64_t B, int64_t T_, int64_t heads, int64_t head_dim) {
  RopeApply(dx, cos, sin, B, T_, heads, head_dim, T(-1));
}

// ---------------------------------------------------------------- attention

// kPositions: the queries' positions among the keys are `positions`; else
// query t is at key t (the compiler then sees the bound it always saw, and
// the loops vectorise, and round, as they always did).
template <typename T, bool kPositions>
void AttentionForwardOver(T* out, T* probs, const T* q, const T* k, const T* v, int64_t B, int64_t T_, int64_t H,
                          int64_t KV, int64_t head_dim, int64_t Tk, const int32_t* positions) {
  const int64_t hd = head_dim, group = H / KV;
  const T scale = T(1) / std::sqrt(static_cast<T>(hd));
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      const int64_t kvh = h / group;
      const T* qb = q + (b * T_ * H + h) * hd;
      const T* kb = k + (b * Tk * KV + kvh) * hd;
      const T* vb = v + (b * Tk * KV + kvh) * hd;
      T* p = probs + (b * H + h) * T_ * Tk;
      T* ob = out + (b * T_ * H + h) * hd;
      // Scores for the whole rectangle (BLAS is faster than skipping the
      // masked part by hand); the mask is applied in the softmax.
      Gemm(false, true, T_, Tk, hd, scale, qb, H * hd, kb, KV * hd, T(0), p, Tk);
      for (int64_t t = 0; t < T_; ++t) {
        const int64_t last = kPositions ? positions[t] : t;
        T* row = p + t * Tk;
        T mx = row[0];
        for (int64_t s = 1; s <= last; ++s) mx = std::max(mx, row[s]);
        T sum = 0;
#pragma omp simd reduction(+ : sum)
        for (int64_t s = 0; s <= last; ++s) {
          row[s] = Exp(row[s] - mx);
          sum += row[s];
        }
        const T inv = T(1) / sum;
#pragma omp simd
        for (int64_t s = 0; s <= last; ++s) row[s] *= inv;
        std::fill(row + last + 1, row + Tk, T(0));
      }
      Gemm(false, false, T_, hd, Tk, T(1), p, Tk, vb, KV * hd, T(0), ob, H * hd);
    }
  }
}

template <typename T>
void AttentionForward(T* out, T* probs, const T* q, const T* k, const T* v, int64_t B, int64_t T_, int64_t H,
                      int64_t KV, int64_t head_dim, int64_t Tk, const int32_t* positions) {
  if (positions != nullptr) {
    return AttentionForwardOver<T, true>(out, probs, q, k, v, B, T_, H, KV, head_dim, Tk, positions);
  }
  AttentionForwardOver<T, false>(out, probs, q, k, v, B, T_, H, KV, head_dim, Tk == 0 ? T_ : Tk, nullptr);
}

int64_t AttentionScratchSize(int64_t T_, int64_t /*H*/, int64_t /*KV*/, int64_t Tk) {
  return static_cast<int64_t>(omp_get_max_threads()) * T_ * (Tk == 0 ? T_ : Tk);
}

template <typename T, bool kPositions>
void AttentionBackwardOver(T* dq, T* dk, T* dv, const T* dout, const T* probs, const T* q, const T* k, const T* v,
                           int64_t B, int64_t T_, int64_t H, int64_t KV, int64_t head_dim, T* scratch, int64_t Tk,
                           const int32_t* positions) {
  const int64_t hd = head_dim, group = H / KV;
  const T scale = T(1) / std::sqrt(static_cast<T>(hd));
  // One task per (batch, kv head): it alone writes that kv head's dk/dv,
  // summing the heads of its group in order.
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t kvh = 0; kvh < KV; ++kvh) {
      T* ds = scratch + static_cast<int64_t>(omp_get_thread_num()) * T_ * Tk;
      const T* kb = k + (b * Tk * KV + kvh) * hd;
      const T* vb = v + (b * Tk * KV + kvh) * hd;
      T* dkb = dk + (b * Tk * KV + kvh) * hd;
      T* dvb = dv + (b * Tk * KV + kvh) * hd;
      for (int64_t g = 0; g < group; ++g) {
        const int64_t h = kvh * group + g;
        const T* qb = q + (b * T_ * H + h) * hd;
        const T* dob = dout + (b * T_ * H + h) * hd;
        const T* p = probs + (b * H + h) * T_ * Tk;
        T* dqb = dq + (b * T_ * H + h) * hd;
        const T beta = g == 0 ? T(0) : T(1);
        // dV += P^T dO
        Gemm(true, false, Tk, hd, T_, T(1), p, Tk, dob, H * hd, beta, dvb, KV * hd);
        // dP = dO V^T, then dS = P * (dP - rowsum(P * dP)) in place.
        Gemm(false, true, T_, Tk, hd, T(1), dob, H * hd, vb, KV * hd, T(0), ds, Tk);
        for (int64_t t = 0; t < T_; ++t) {
          const int64_t last = kPositions ? positions[t] : t;
          T* row = ds + t * Tk;
          const T* prow = p + t * Tk;
          T dot = 0;
#pragma omp simd reduction(+ : dot)
          for (int64_t s = 0; s <= last; ++s) dot += prow[s] * row[s];
#pragma omp simd
          for (int64_t s = 0; s <= last; ++s) row[s] = prow[s] * (row[s] - dot);
          std::fill(row + last + 1, row + Tk, T(0));
        }
        // dQ = scale dS K;  dK += scale dS^T Q
        Gemm(false, false, T_, hd, Tk, scale, ds, Tk, kb, KV * hd, T(0), dqb, H * hd);
        Gemm(true, false, Tk, hd, T_, scale, ds, Tk, qb, H * hd, beta, dkb, KV * hd);
      }
    }
  }
}

template <typename T>
void AttentionBackward(T* dq, T* dk, T* dv, const T* dout, const T* probs, const T* q, const T* k, const T* v,
                       int64_t B, int64_t T_, int64_t H, int64_t KV, int64_t head_dim, T* scratch, int64_t Tk,
                       const int32_t* positions) {
  if (positions != nullptr) {
    return AttentionBackwardOver<T, true>(dq, dk, dv, dout, probs, q, k, v, B, T_, H, KV, head_dim, scratch, Tk,
                                          positions);
  }
  AttentionBackwardOver<T, false>(dq, dk, dv, dout, probs, q, k, v, B, T_, H, KV, head_dim, scratch,
                                  Tk == 0 ? T_ : Tk, nullptr);
}

// ---------------------------------------------------------------- SwiGLU

template <typename T>
void SwigluForward(T* out, const T* gate, const T* up, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    T g = gate[i];
    out[i] = g / (T(1) + Exp(-g)) * up[i];
  }
}

template <typename T>
void SwigluBackward(T* dgate, T* dup, const T* dout, const T* gate, const T* up, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    T g = gate[i];
    T sig = T(1) / (T(1) + Exp(-g));
    T silu = g * sig;
    dup[i] = dout[i] * silu;
    dgate[i] = dout[i] * up[i] * (sig * (T(1) + g * (T(1) - sig)));
  }
}

template <typename T>
void AddForward(T* out, const T* a, const T* b, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

// ---------------------------------------------------------------- cross-entropy

template <typename T>
double CrossEntropyForward(T* losses, const T* logits, const int32_t* targets, int64_t N, int64_t V) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    const T* x = logits + i * V;
    T mx = -std::numeric_limits<T>::infinity();
    for (int64_t j = 0; j < V; ++j) mx = std::max(mx, x[j]);
    T sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < V; ++j) sum += Exp(x[j] - mx);
    losses[i] = mx + std::log(sum) - x[targets[i]];
  }
  double total = 0;  // in order: the mean does not depend on threads
  for (int64_t i = 0; i < N; ++i) total += losses[i];
  return N > 0 ? total / static_cast<double>(N) : 0.0;
}

template <typename T>
void CrossEntropyBackward(T* dlogits, const T* logits, const int32_t* targets, int64_t N, int64_t V, double scale) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    const T* x = logits + i * V;
    T* dx = dlogits + i * V;
    T mx = -std::numeric_limits<T>::infinity();
    for (int64_t j = 0; j < V; ++j) mx = std::max(mx, x[j]);
    T sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < V; ++j) {
      dx[j] = Exp(x[j] - mx);
      sum += dx[j];
    }
    const T s = static_cast<T>(scale) / sum;
#pragma omp simd
    for (int64_t j = 0; j < V; ++j) dx[j] *= s;
    dx[targets[i]] -= static_cast<T>(scale);
  }
}

// ---------------------------------------------------------------- instantiation

template <typename T>
void VocabParallelStats(T* stats, const T* logits, const int32_t* targets, int64_t N, int64_t V, int64_t first,
                        int rank, int ranks) {
  const int64_t W = VocabStatsWidth(ranks);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    const T* x = logits + i * V;
    T* row = stats + i * W;
    std::fill(row, row + W, T(0));
    T mx = -std::numeric_limits<T>::infinity();
    for (int64_t j = 0; j < V; ++j) mx = std::max(mx, x[j]);
    T sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < V; ++j) sum += Exp(x[j] - mx);
    row[2 * rank] = mx;
    row[2 * rank + 1] = sum;
    const int64_t t = static_cast<int64_t>(targets[i]) - first;
    if (t >= 0 && t < V) row[W - 1] = x[t];
  }
}

template <typename T>
double VocabParallelLoss(T* lse, T* losses, const T* stats, int64_t N, int ranks) {
  const int64_t W = VocabStatsWidth(ranks);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    const T* row = stats + i * W;
    T mx = -std::numeric_limits<T>::infinity();
    for (int r = 0; r < ranks; ++r) mx = std::max(mx, row[2 * r]);
    T sum = 0;
    for (int r = 0; r < ranks; ++r) sum += row[2 * r + 1] * Exp(row[2 * r] - mx);
    lse[i] = mx + std::log(sum);
    losses[i] = lse[i] - row[W - 1];
  }
  double total = 0;  // in order: the mean does not depend on threads
  for (int64_t i = 0; i < N; ++i) total += losses[i];
  return N > 0 ? total / static_cast<double>(N) : 0.0;
}

template <typename T>
void VocabParallelBackward(T* dlogits, const T* logits, const T* lse, const int32_t* targets, int64_t N, int64_t V,
                           int64_t first, double scale) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    const T* x = logits + i * V;
    T* dx = dlogits + i * V;
    const T s = static_cast<T>(scale);
#pragma omp simd
    for (int64_t j = 0; j < V; ++j) dx[j] = s * Exp(x[j] - lse[i]);
    const int64_t t = static_cast<int64_t>(targets[i]) - first;
    if (t >= 0 && t < V) dx[t] -= s;
  }
}

#define HERD_INSTANTIATE_OPS(T)                                                                                    \
  template void EmbeddingForward<T>(T*, const int32_t*, const T*, int64_t, int64_t, int64_t, int64_t);             \
  template void EmbeddingBackward<T>(T*, const T*, const int32_t*, int64_t, int64_t, int64_t, int64_t);            \
  template void VocabParallelStats<T>(T*, const T*, const int32_t*, int64_t, int64_t, int64_t, int, int);          \
  template double VocabParallelLoss<T>(T*, T*, const T*, int64_t, int);                                            \
  template void VocabParallelBackward<T>(T*, const T*, const T*, const int32_t*, int64_t, int64_t, int64_t, double); \
  template void RmsNormForward<T>(T*, T*, const T*, const T*, int64_t, int64_t, double);                           \
  template void RmsNormBackward<T>(T*, T*, const T*, const T*, const T*, const T*, int64_t, int64_t);              \
  template void MatmulForward<T>(T*, const T*, const T*, int64_t, int64_t, int64_t);                               \
  template void MatmulBackward<T>(T*, T*, const T*, const T*, const T*, int64_t, int64_t, int64_t, bool);          \
  template void RopeTables<T>(T*, T*, int64_t, int64_t, double, const RopeScaling&);                               \
  template void RopeForward<T>(T*, const T*, const T*, int64_t, int64_t, int64_t, int64_t);                        \
  template void RopeBackward<T>(T*, const T*, const T*, int64_t, int64_t, int64_t, int64_t);                       \
  template void AttentionForward<T>(T*, T*, const T*, const T*, const T*, int64_t, int64_t, int64_t, int64_t,      \
                                    int64_t, int64_t, const int32_t*);                                             \
  template void AttentionBackward<T>(T*, T*, T*, const T*, const T*, const T*, const T*, const T*, int64_t,        \
                                     int64_t, int64_t, int64_t, int64_t, T*, int64_t, const int32_t*);             \
  template void SwigluForward<T>(T*, const T*, const T*, int64_t);                                                 \
  template void SwigluBackward<T>(T*, T*, const T*, const T*, const T*, int64_t);                                  \
  template void AddForward<T>(T*, const T*, const T*, int64_t);                                                    \
  template double CrossEntropyForward<T>(T*, const T*, const int32_t*, int64_t, int64_t);                          \
  template void CrossEntropyBackward<T>(T*, const T*, const int32_t*, int64_t, int64_t, double);

HERD_INSTANTIATE_OPS(float)
HERD_INSTANTIATE_OPS(double)

}  // namespace herd::cpu
