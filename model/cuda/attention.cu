// Causal grouped-query attention, flash style (Dao et al.): the forward
// streams key/value tiles through shared memory with an online softmax and
// keeps only the output and the log-sum-exp; the backward recomputes the
// probabilities tile by tile. Memory is O(B*H*T) whatever T is.
//
// Determinism without atomics: the backward is two kernels, one owning dq
// (a thread per query row, walking keys in order) and one owning dk/dv (a
// thread per key row, walking the group's query heads, then queries, in
// order), instead of FlashAttention-2's atomic dq accumulation.
//
// These kernels are the straightforward FMA formulation: one thread per
// row, fp32 arithmetic for every compute dtype. They serve fp32 mode (exact
// parity with the CPU) and head dimensions without a tensor-core kernel;
// bf16 with head_dim 64 or 128 goes to attention_tc.cu.
#include <glog/logging.h>

#include "model/cuda/attention_dims.h"
#include "model/cuda/attention_tc.h"
#include "model/cuda/device_math.cuh"
#include "model/cuda/kernels.h"

namespace herd::cuda {

namespace {

constexpr int kRowsPerBlock = 64;  // query rows (forward, dq) or key rows (dk/dv) per block
constexpr int kTile = 32;          // rows of the streamed operand per shared-memory tile

// Row `row` of head `head` in a [B, T, heads, HD] tensor, as fp32.
template <int HD, typename T>
__device__ __forceinline__ void LoadRow(float* dst, const T* base, int64_t b, int64_t row, int64_t heads, int64_t head,
                                        int64_t T_, float factor) {
  const T* p = base + ((b * T_ + row) * heads + head) * HD;
  for (int c = 0; c < HD; ++c) dst[c] = ToFloat(p[c]) * factor;
}

// Rows [first, first + kTile) of one head into shared memory (zeros past T).
template <int HD, typename T>
__device__ __forceinline__ void LoadTile(float (*tile)[HD], const T* base, int64_t b, int64_t first, int64_t heads,
                                         int64_t head, int64_t T_) {
  for (int idx = threadIdx.x; idx < kTile * HD; idx += blockDim.x) {
    const int r = idx / HD, c = idx % HD;
    const int64_t row = first + r;
    tile[r][c] = row < T_ ? ToFloat(base[((b * T_ + row) * heads + head) * HD + c]) : 0.0f;
  }
}

// Query row i's position among the keys (context parallelism: its chunk's).
__device__ __forceinline__ int64_t PositionOf(const AttentionDims& d, int64_t i) {
  return d.positions != nullptr ? d.positions[i] : i;
}

template <int HD>
__device__ __forceinline__ float Dot(const float* a, const float* b) {
  float s = 0;
  for (int c = 0; c < HD; ++c) s += a[c] * b[c];
  return s;
}

// grid (query tiles, H, B); a thread per query row.
template <typename T, int HD>
__global__ void __launch_bounds__(kRowsPerBlock)
    FlashForwardKernel(T* out, float* lse, const T* q, const T* k, const T* v, AttentionDims d) {
  __shared__ float ks[kTile][HD];
  __shared__ float vs[kTile][HD];
  const int64_t b = blockIdx.z, h = blockIdx.y, kvh = h / d.group;
  const int64_t first_q = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock;
  const int64_t i = first_q + threadIdx.x;
  const bool valid = i < d.T;
  const int64_t pos = valid ? PositionOf(d, i) : 0;
  // The block's last query's position: the keys it reads end there.
  const int64_t last_q =
      PositionOf(d, first_q + kRowsPerBlock - 1 < d.T - 1 ? first_q + kRowsPerBlock - 1 : d.T - 1);

  float qr[HD], acc[HD];
  if (valid) LoadRow<HD>(qr, q, b, i, d.H, h, d.T, d.scale);
  for (int c = 0; c < HD; ++c) acc[c] = 0;
  float m = -INFINITY, l = 0;
  for (int64_t first_k = 0; first_k <= last_q; first_k += kTile) {
    __syncthreads();  // the previous tile is no longer read
    LoadTile<HD>(ks, k, b, first_k, d.KV, kvh, d.Tk);
    LoadTile<HD>(vs, v, b, first_k, d.KV, kvh, d.Tk);
    __syncthreads();
    if (!valid || first_k > pos) continue;
    const int rows = pos - first_k + 1 < kTile ? static_cast<int>(pos - first_k + 1) : kTile;  // keys j <= pos
    float s[kTile];
    float tile_max = -INFINITY;
    for (int r = 0; r < rows; ++r) {
      s[r] = Dot<HD>(qr, ks[r]);
      tile_max = fmaxf(tile_max, s[r]);
    }
    const float m_new = fmaxf(m, tile_max);
    const float correction = expf(m - m_new);  // 0 on the first tile (m = -inf)
    l *= correction;
    for (int c = 0; c < HD; ++c) acc[c] *= correction;
    for (int r = 0; r < rows; ++r) {
      const float p = expf(s[r] - m_new);
      l += p;
      for (int c = 0; c < HD; ++c) acc[c] += p * vs[r][c];
    }
    m = m_new;
  }
  if (!valid) return;
  T* o = out + ((b * d.T + i) * d.H + h) * HD;
  const float inv_l = 1.0f / l;
  for (int c = 0; c < HD; ++c) o[c] = FromFloat<T>(acc[c] * inv_l);
  lse[(b * d.H + h) * d.T + i] = m + logf(l);
}

// delta[b, h, i] = sum_c dout * out: a warp per (b, i, h) row.
template <typename T, int HD>
__global__ void FlashDeltaKernel(float* delta, const T* dout, const T* out, int64_t rows, AttentionDims d) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;  // (b*T + i)*H + h
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  float s = 0;
  for (int c = lane; c < HD; c += 32) s += ToFloat(dout[row * HD + c]) * ToFloat(out[row * HD + c]);
  s = WarpSum(s);
  const int64_t h = row % d.H, bt = row / d.H, b = bt / d.T, i = bt % d.T;
  if (lane == 0) delta[(b * d.H + h) * d.T + i] = s;
}

// grid (query tiles, H, B); a thread per query row owns dq.
template <typename T, int HD>
__global__ void __launch_bounds__(kRowsPerBlock)
    FlashBackwardQueryKernel(T* dq, const T* dout, const float* lse, const float* delta, const T* q, const T* k,
                             const T* v, AttentionDims d) {
  __shared__ float ks[kTile][HD];
  __shared__ float vs[kTile][HD];
  const int64_t b = blockIdx.z, h = blockIdx.y, kvh = h / d.group;
  const int64_t first_q = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock;
  const int64_t i = first_q + threadIdx.x;
  const bool valid = i < d.T;
  const int64_t pos = valid ? PositionOf(d, i) : 0;
  // The block's last query's position: the keys it reads end there.
  const int64_t last_q =
      PositionOf(d, first_q + kRowsPerBlock - 1 < d.T - 1 ? first_q + kRowsPerBlock - 1 : d.T - 1);

  float qr[HD], dor[HD], acc[HD];
  float L = 0, D = 0;
  if (valid) {
    LoadRow<HD>(qr, q, b, i, d.H, h, d.T, d.scale);
    LoadRow<HD>(dor, dout, b, i, d.H, h, d.T, 1.0f);
    L = lse[(b * d.H + h) * d.T + i];
    D = delta[(b * d.H + h) * d.T + i];
  }
  for (int c = 0; c < HD; ++c) acc[c] = 0;
  for (int64_t first_k = 0; first_k <= last_q; first_k += kTile) {
    __syncthreads();
    LoadTile<HD>(ks, k, b, first_k, d.KV, kvh, d.Tk);
    LoadTile<HD>(vs, v, b, first_k, d.KV, kvh, d.Tk);
    __syncthreads();
    if (!valid || first_k > pos) continue;
    const int rows = pos - first_k + 1 < kTile ? static_cast<int>(pos - first_k + 1) : kTile;
    for (int r = 0; r < rows; ++r) {
      const float p = expf(Dot<HD>(qr, ks[r]) - L);
      const float ds = p * (Dot<HD>(dor, vs[r]) - D);
      for (int c = 0; c < HD; ++c) acc[c] += ds * ks[r][c];
    }
  }
  if (!valid) return;
  T* o = dq + ((b * d.T + i) * d.H + h) * HD;
  for (int c = 0; c < HD; ++c) o[c] = FromFloat<T>(acc[c] * d.scale);
}

// grid (key tiles, KV, B); a thread per key row owns dk and dv, summing the
// group's query heads in order.
template <typename T, int HD>
__global__ void __launch_bounds__(kRowsPerBlock)
    FlashBackwardKeyValueKernel(T* dk, T* dv, const T* dout, const float* lse, const float* delta, const T* q,
                                const T* k, const T* v, AttentionDims d) {
  __shared__ float qs[kTile][HD];
  __shared__ float dos[kTile][HD];
  __shared__ float Ls[kTile], Ds[kTile];
  const int64_t b = blockIdx.z, kvh = blockIdx.y;
  const int64_t first_j = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock;
  const int64_t j = first_j + threadIdx.x;
  const bool valid = j < d.Tk;

  float kr[HD], vr[HD], dk_acc[HD], dv_acc[HD];
  if (valid) {
    LoadRow<HD>(kr, k, b, j, d.KV, kvh, d.Tk, d.scale);
    LoadRow<HD>(vr, v, b, j, d.KV, kvh, d.Tk, 1.0f);
  }
  for (int c = 0; c < HD; ++c) dk_acc[c] = dv_acc[c] = 0;
  for (int64_t g = 0; g < d.group; ++g) {
    const int64_t h = kvh * d.group + g;
    // Queries at positions >= j: tiles from the one holding the block's
    // first key (with positions, from the first).
    for (int64_t first_i = d.positions != nullptr ? 0 : first_j / kTile * kTile; first_i < d.T; first_i += kTile) {
      __syncthreads();
      LoadTile<HD>(qs, q, b, first_i, d.H, h, d.T);
      LoadTile<HD>(dos, dout, b, first_i, d.H, h, d.T);
      for (int r = threadIdx.x; r < kTile; r += blockDim.x) {
        const int64_t i = first_i + r;
        Ls[r] = i < d.T ? lse[(b * d.H + h) * d.T + i] : 0.0f;
        Ds[r] = i < d.T ? delta[(b * d.H + h) * d.T + i] : 0.0f;
      }
      __syncthreads();
      if (!valid) continue;
      for (int r = 0; r < kTile; ++r) {
        const int64_t i = first_i + r;
        if (i >= d.T || PositionOf(d, i) < j) continue;
        const float p = expf(Dot<HD>(qs[r], kr) - Ls[r]);
        const float ds = p * (Dot<HD>(dos[r], vr) - Ds[r]);
        for (int c = 0; c < HD; ++c) {
          dv_acc[c] += p * dos[r][c];
          dk_acc[c] += ds * qs[r][c];
        }
      }
    }
  }
  if (!valid) return;
  T* dko = dk + ((b * d.Tk + j) * d.KV + kvh) * HD;
  T* dvo = dv + ((b * d.Tk + j) * d.KV + kvh) * HD;
  for (int c = 0; c < HD; ++c) {
    dko[c] = FromFloat<T>(dk_acc[c] * d.scale);
    dvo[c] = FromFloat<T>(dv_acc[c]);
  }
}

template <typename T, int HD>
void Forward(T* out, float* lse, const T* q, const T* k, const T* v, int64_t B, const AttentionDims& d,
             cudaStream_t stream) {
  const dim3 grid(GridFor(d.T, kRowsPerBlock), static_cast<unsigned>(d.H), static_cast<unsigned>(B));
  auto* kernel = &FlashForwardKernel<T, HD>;
  HERD_LAUNCH(kernel, grid, kRowsPerBlock, 0, stream, out, lse, q, k, v, d);
}

template <typename T, int HD>
void Backward(T* dq, T* dk, T* dv, const T* dout, const T* out, const float* lse, const T* q, const T* k, const T* v,
              int64_t B, const AttentionDims& d, float* delta, cudaStream_t stream) {
  const int64_t rows = B * d.T * d.H;
  auto* delta_kernel = &FlashDeltaKernel<T, HD>;
  HERD_LAUNCH(delta_kernel, GridFor(rows, 8), 256, 0, stream, delta, dout, out, rows, d);
  const dim3 qgrid(GridFor(d.T, kRowsPerBlock), static_cast<unsigned>(d.H), static_cast<unsigned>(B));
  auto* query_kernel = &FlashBackwardQueryKernel<T, HD>;
  HERD_LAUNCH(query_kernel, qgrid, kRowsPerBlock, 0, stream, dq, dout, lse, delta, q, k, v, d);
  const dim3 kgrid(GridFor(d.Tk, kRowsPerBlock), static_cast<unsigned>(d.KV), static_cast<unsigned>(B));
  auto* kv_kernel = &FlashBackwardKeyValueKernel<T, HD>;
  HERD_LAUNCH(kv_kernel, kgrid, kRowsPerBlock, 0, stream, dk, dv, dout, lse, delta, q, k, v, d);
}

}  // namespace

bool AttentionHeadDimSupported(int64_t head_dim) {
  return head_dim == 16 || head_dim == 32 || head_dim == 64 || head_dim == 128;
}

template <typename T>
void AttentionForward(T* out, float* lse, const T* q, const T* k, const T* v, int64_t B, int64_t T_, int64_t H,
                      int64_t KV, int64_t head_dim, cudaStream_t stream, int64_t Tk, const int32_t* positions) {
  if (B * T_ == 0) return;
  if constexpr (std::is_same_v<T, bf16>) {
    if (TensorCoreAttentionSupports(head_dim) && positions == nullptr)
      return TensorCoreAttentionForward(out, lse, q, k, v, B, T_, H, KV, head_dim, stream);
  }
  AttentionDims d = AttentionDims::Make(T_, H, KV, head_dim);
  if (positions != nullptr) {
    d.Tk = Tk;
    d.positions = positions;
  }
  switch (head_dim) {
    case 16:
      return Forward<T, 16>(out, lse, q, k, v, B, d, stream);
    case 32:
      return Forward<T, 32>(out, lse, q, k, v, B, d, stream);
    case 64:
      return Forward<T, 64>(out, lse, q, k, v, B, d, stream);
    case 128:
      return Forward<T, 128>(out, lse, q, k, v, B, d, stream);
    default:
      LOG(FATAL) << "AttentionForward: head_dim " << head_dim << " has no kernel (AttentionHeadDimSupported)";
  }
}

template <typename T>
void AttentionBackward(T* dq, T* dk, T* dv, const T* dout, const T* out, const float* lse, const T* q, const T* k,
                       const T* v, int64_t B, int64_t T_, int64_t H, int64_t KV, int64_t head_dim, float* scratch,
                       cudaStream_t stream, int64_t Tk, const int32_t* positions) {
  if (B * T_ == 0) return;
  if constexpr (std::is_same_v<T, bf16>) {
    if (TensorCoreAttentionSupports(head_dim) && positions == nullptr) {
      const int64_t rows = B * T_ * H;
      const AttentionDims d = AttentionDims::Make(T_, H, KV, head_dim);
      auto* delta_kernel = head_dim == 64 ? &FlashDeltaKernel<T, 64> : &FlashDeltaKernel<T, 128>;
      HERD_LAUNCH(delta_kernel, GridFor(rows, 8), 256, 0, stream, scratch, dout, out, rows, d);
      return TensorCoreAttentionBackward(dq, dk, dv, dout, lse, scratch, q, k, v, B, T_, H, KV, head_dim, stream);
    }
  }
  AttentionDims d = AttentionDims::Make(T_, H, KV, head_dim);
  if (positions != nullptr) {
    d.Tk = Tk;
    d.positions = positions;
  }
  switch (head_dim) {
    case 16:
      return Backward<T, 16>(dq, dk, dv, dout, out, lse, q, k, v, B, d, scratch, stream);
    case 32:
      return Backward<T, 32>(dq, dk, dv, dout, out, lse, q, k, v, B, d, scratch, stream);
    case 64:
      return Backward<T, 64>(dq, dk, dv, dout, out, lse, q, k, v, B, d, scratch, stream);
    case 128:
      return Backward<T, 128>(dq, dk, dv, dout, out, lse, q, k, v, B, d, scratch, stream);
    default:
      LOG(FATAL) << "AttentionBackward: head_dim " << head_dim << " has no kernel (AttentionHeadDimSupported)";
  }
}

template void AttentionForward<float>(float*, float*, const float*, const float*, const float*, int64_t, int64_t,
                                      int64_t, int64_t, int64_t, cudaStream_t, int64_t, const int32_t*);
template void AttentionForward<bf16>(bf16*, float*, const bf16*, const bf16*, const bf16*, int64_t, int64_t, int64_t,
                                     int64_t, int64_t, cudaStream_t, int64_t, const int32_t*);
template void AttentionBackward<float>(float*, float*, float*, const float*, const float*, const float*, const float*,
                                       const float*, const float*, int64_t, int64_t, int64_t, int64_t, int64_t, float*,
                                       cudaStream_t, int64_t, const int32_t*);
template void AttentionBackward<bf16>(bf16*, bf16*, bf16*, const bf16*, const bf16*, const float*, const bf16*,
                                      const bf16*, const bf16*, int64_t, int64_t, int64_t, int64_t, int64_t, float*,
                                      cudaStream_t, int64_t, const int32_t*);

}  // namespace herd::cuda
