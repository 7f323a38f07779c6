// Elementwise and gather/scatter kernels: embedding, RoPE, SwiGLU, the
// residual add, dtype conversion, AdamW and the gradient norm's partials.
#include <algorithm>
#include <numeric>

#include "model/cuda/device_math.cuh"
#include "model/cuda/kernels.h"

namespace herd::cuda {

namespace {

constexpr int kThreads = 256;

// ---- embedding
template <typename T>
__global__ void EmbeddingForwardKernel(T* out, const int32_t* tokens, const T* table, int64_t N, int64_t C,
                                       int64_t first, int64_t rows) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= N * C) return;
  const int64_t row = i / C, c = i % C;
  const int64_t id = static_cast<int64_t>(tokens[row]) - first;
  out[i] = rows < 0 || (id >= 0 && id < rows) ? table[id * C + c] : FromFloat<T>(0.0f);
}

// Block (group, channel tile): one thread per channel walks the group's
// positions in order, so each dtable element has one writer and one order.
template <typename T>
__global__ void EmbeddingBackwardKernel(float* dtable, const T* dout, const int32_t* tokens, const int32_t* starts,
                                        const int32_t* positions, int64_t C) {
  const int64_t c = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const int g = blockIdx.x;
  float sum = 0;
  for (int32_t p = starts[g]; p < starts[g + 1]; ++p) sum += ToFloat(dout[static_cast<int64_t>(positions[p]) * C + c]);
  dtable[static_cast<int64_t>(tokens[g]) * C + c] += sum;
}

// ---- RoPE: one thread per (token, head, i < hd/2) pair of elements.
template <typename T, bool kInverse>
__global__ void RopeKernel(T* x, const float* cos, const float* sin, int64_t T_, int64_t heads, int64_t half,
                           int64_t pairs) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= pairs) return;
  const int64_t j = i % half, head_row = i / half;  // head_row = (b*T + t)*heads + h
  const int64_t t = (head_row / heads) % T_;
  T* p = x + head_row * 2 * half;
  const float c = cos[t * half + j], s = kInverse ? -sin[t * half + j] : sin[t * half + j];
  const float x1 = ToFloat(p[j]), x2 = ToFloat(p[j + half]);
  p[j] = FromFloat<T>(x1 * c - x2 * s);
  p[j + half] = FromFloat<T>(x2 * c + x1 * s);
}

// ---- SwiGLU and the residual add (fp32 arithmetic in model/cpu's order).
template <typename T>
__global__ void SwigluForwardKernel(T* out, const T* gate, const T* up, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float g = ToFloat(gate[i]);
  out[i] = FromFloat<T>(g / (1.0f + expf(-g)) * ToFloat(up[i]));
}

template <typename T>
__global__ void SwigluBackwardKernel(T* dgate, T* dup, const T* dout, const T* gate, const T* up, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float g = ToFloat(gate[i]), d = ToFloat(dout[i]);
  const float sig = 1.0f / (1.0f + expf(-g));
  dup[i] = FromFloat<T>(d * (g * sig));
  dgate[i] = FromFloat<T>(d * ToFloat(up[i]) * (sig * (1.0f + g * (1.0f - sig))));
}

template <typename T>
__global__ void AddKernel(T* out, const T* a, const T* b, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = FromFloat<T>(ToFloat(a[i]) + ToFloat(b[i]));
}

template <typename From, typename To>
__global__ void ConvertKernel(To* out, const From* in, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = FromFloat<To>(ToFloat(in[i]));
}

// ---- AdamW, model/optim/adamw.cc's element math.
__global__ void AdamWKernel(float* params, const float* grads, float* m, float* v, int64_t n, AdamWScalars s,
                            float decay) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float g = grads[i] * s.grad_scale;
  const float p = params[i] * decay;
  const float mi = m[i] * s.beta1 + g * s.one_minus_beta1;
  const float vi = v[i] * s.beta2 + (g * g) * s.one_minus_beta2;
  m[i] = mi;
  v[i] = vi;
  params[i] = p - s.step_size * (mi / (sqrtf(vi) / s.bc2_sqrt + s.eps));
}

__global__ void SumOfSquaresKernel(double* partial, const float* x, int64_t n) {
  __shared__ double shared[32];
  const int64_t lo = static_cast<int64_t>(blockIdx.x) * kSumOfSquaresChunk;
  const int64_t hi = lo + kSumOfSquaresChunk < n ? lo + kSumOfSquaresChunk : n;
  double s = 0;
  for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) s += static_cast<double>(x[i]) * x[i];
  s = BlockSum(s, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

}  // namespace

EmbeddingGroups EmbeddingGroups::Build(const int32_t* host_tokens, int64_t N, int64_t first, int64_t rows) {
  auto held = [&](int32_t token) { return rows < 0 || (token >= first && token < first + rows); };
  std::vector<int32_t> order;
  order.reserve(N);
  for (int32_t i = 0; i < N; ++i) {
    if (held(host_tokens[i])) order.push_back(i);
  }
  // Stable: positions of one token stay in increasing order.
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return host_tokens[a] < host_tokens[b]; });
  EmbeddingGroups g;
  g.positions = order;
  const int64_t n = static_cast<int64_t>(order.size());
  for (int64_t i = 0; i < n; ++i) {
    if (i == 0 || host_tokens[order[i]] != host_tokens[order[i - 1]]) {
      g.tokens.push_back(static_cast<int32_t>(host_tokens[order[i]] - first));
      g.starts.push_back(static_cast<int32_t>(i));
    }
  }
  g.starts.push_back(static_cast<int32_t>(n));
  return g;
}

template <typename T>
void EmbeddingForward(T* out, const int32_t* tokens, const T* table, int64_t N, int64_t C, cudaStream_t stream,
                      int64_t first, int64_t rows) {
  if (N * C == 0) return;
  HERD_LAUNCH(EmbeddingForwardKernel<T>, GridFor(N * C, kThreads), kThreads, 0, stream, out, tokens, table, N, C,
              first, rows);
}

template <typename T>
void EmbeddingBackward(float* dtable, const T* dout, const int32_t* group_tokens, const int32_t* group_starts,
                       const int32_t* group_positions, int64_t groups, int64_t C, cudaStream_t stream) {
  if (groups == 0 || C == 0) return;
  const dim3 grid(static_cast<unsigned>(groups), GridFor(C, kThreads));
  HERD_LAUNCH(EmbeddingBackwardKernel<T>, grid, kThreads, 0, stream, dtable, dout, group_tokens, group_starts,
              group_positions, C);
}

template <typename T, bool kInverse>
void Rope(T* x, const float* cos, const float* sin, int64_t B, int64_t T_, int64_t heads, int64_t head_dim,
          cudaStream_t stream) {
  const int64_t half = head_dim / 2, pairs = B * T_ * heads * half;
  if (pairs == 0) return;
  auto* kernel = &RopeKernel<T, kInverse>;
  HERD_LAUNCH(kernel, GridFor(pairs, kThreads), kThreads, 0, stream, x, cos, sin, T_, heads, half, pairs);
}

template <typename T>
void RopeForward(T* x, const float* cos, const float* sin, int64_t B, int64_t T_, int64_t heads, int64_t head_dim,
                 cudaStream_t stream) {
  Rope<T, false>(x, cos, sin, B, T_, heads, head_dim, stream);
}

template <typename T>
void RopeBackward(T* dx, const float* cos, const float* sin, int64_t B, int64_t T_, int64_t heads, int64_t head_dim,
                  cudaStream_t stream) {
  Rope<T, true>(dx, cos, sin, B, T_, heads, head_dim, stream);
}

template <typename T>
void SwigluForward(T* out, const T* gate, const T* up, int64_t n, cudaStream_t stream) {
  if (n > 0) HERD_LAUNCH(SwigluForwardKernel<T>, GridFor(n, kThreads), kThreads, 0, stream, out, gate, up, n);
}

template <typename T>
void SwigluBackward(T* dgate, T* dup, const T* dout, const T* gate, const T* up, int64_t n, cudaStream_t stream) {
  if (n > 0)
    HERD_LAUNCH(SwigluBackwardKernel<T>, GridFor(n, kThreads), kThreads, 0, stream, dgate, dup, dout, gate, up, n);
}

template <typename T>
void AddForward(T* out, const T* a, const T* b, int64_t n, cudaStream_t stream) {
  if (n > 0) HERD_LAUNCH(AddKernel<T>, GridFor(n, kThreads), kThreads, 0, stream, out, a, b, n);
}

template <typename From, typename To>
void Convert(To* out, const From* in, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  auto* kernel = &ConvertKernel<From, To>;
  HERD_LAUNCH(kernel, GridFor(n, kThreads), kThreads, 0, stream, out, in, n);
}

void AdamW(float* params, const float* grads, float* m, float* v, int64_t n, const AdamWScalars& s, float decay,
           cudaStream_t stream) {
  if (n > 0) HERD_LAUNCH(AdamWKernel, GridFor(n, kThreads), kThreads, 0, stream, params, grads, m, v, n, s, decay);
}

void SumOfSquaresPartials(double* partial, const float* x, int64_t n, cudaStream_t stream) {
  const int64_t chunks = SumOfSquaresChunks(n);
  if (chunks > 0) HERD_LAUNCH(SumOfSquaresKernel, static_cast<unsigned>(chunks), kThreads, 0, stream, partial, x, n);
}

#define HERD_INSTANTIATE_ELEMENTWISE(T)                                                                            \
  template void EmbeddingForward<T>(T*, const int32_t*, const T*, int64_t, int64_t, cudaStream_t, int64_t,       \
                                    int64_t);                                                                      \
  template void EmbeddingBackward<T>(float*, const T*, const int32_t*, const int32_t*, const int32_t*, int64_t,    \
                                     int64_t, cudaStream_t);                                                       \
  template void RopeForward<T>(T*, const float*, const float*, int64_t, int64_t, int64_t, int64_t, cudaStream_t);  \
  template void RopeBackward<T>(T*, const float*, const float*, int64_t, int64_t, int64_t, int64_t, cudaStream_t); \
  template void SwigluForward<T>(T*, const T*, const T*, int64_t, cudaStream_t);                                   \
  template void SwigluBackward<T>(T*, T*, const T*, const T*, const T*, int64_t, cudaStream_t);                    \
  template void AddForward<T>(T*, const T*, const T*, int64_t, cudaStream_t);
HERD_INSTANTIATE_ELEMENTWISE(float)
HERD_INSTANTIATE_ELEMENTWISE(bf16)
template void Convert<float, bf16>(bf16*, const float*, int64_t, cudaStream_t);
template void Convert<bf16, float>(float*, const bf16*, int64_t, cudaStream_t);
template void Convert<float, float>(float*, const float*, int64_t, cudaStream_t);

}  // namespace herd::cuda
