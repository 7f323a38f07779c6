// Tensor-core flash attention for bf16 (head_dim 64 and 128): the same
// algorithm and contracts as attention.cu's FMA kernels, with every
// [16 x 16] product of Q K^T, P V, and in the backward dP, dV, dK, dQ on the
// tensor cores through the warp matrix API (mma.h, bf16 in, fp32
// accumulate). A block is 4 warps; each warp owns 16 rows (queries in the
// forward and dq kernels, keys in the dk/dv kernel) and streams 64-row
// tiles of the other operand through shared memory. Softmax statistics,
// masking and rescaling are done by the lanes on fp32 scores staged in
// shared memory (fragment element layouts are not portable); P and dS are
// rounded to bf16 for their products, as FlashAttention does.
//
// Deterministic without atomics, like attention.cu: dq and dk/dv are
// separate kernels, each output row owned by one warp, sums in fixed order.
#include <glog/logging.h>

#include "model/cuda/attention_dims.h"
#include "model/cuda/attention_tc.h"
#include "model/cuda/device_math.cuh"

namespace herd::cuda {
namespace {

namespace wmma = nvcuda::wmma;
using bf16 = __nv_bfloat16;

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kRows = 16 * kWarps;  // rows a block owns
constexpr int kTile = 64;           // rows of the streamed operand per tile
static_assert(kRows == kTile, "the backward's shared-memory layout sizes own rows and tiles alike");

using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major>;
using FragBRow = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major>;
using FragBCol = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// Rows [first, first + kTile) of one head of a [B, T, heads, HD] tensor
// into shared memory as bf16 (zeros past T).
template <int HD>
__device__ __forceinline__ void LoadTile(bf16* tile, const bf16* base, int64_t b, int64_t first, int64_t heads,
                                         int64_t head, int64_t T_) {
  for (int idx = threadIdx.x; idx < kTile * HD; idx += blockDim.x) {
    const int r = idx / HD, c = idx % HD;
    const int64_t row = first + r;
    tile[idx] = row < T_ ? base[((b * T_ + row) * heads + head) * HD + c] : __float2bfloat16(0.0f);
  }
}

// out[16, 64] (fp32, leading dimension ld) = a[16, HD] . b^T where b is
// [64, HD] row-major: b^T is b read column-major.
template <int HD>
__device__ __forceinline__ void RowsTimesTileT(float* out, int ld, const bf16* a, const bf16* b) {
  for (int j = 0; j < kTile / 16; ++j) {
    FragC acc;
    wmma::fill_fragment(acc, 0.0f);
    for (int k = 0; k < HD / 16; ++k) {
      FragA fa;
      FragBCol fb;
      wmma::load_matrix_sync(fa, a + k * 16, HD);
      wmma::load_matrix_sync(fb, b + j * 16 * HD + k * 16, HD);
      wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(out + j * 16, acc, ld, wmma::mem_row_major);
  }
}

// acc[n] += p[16, 64] (bf16, ld kTile) . v[64, HD] (row-major) for the
// HD/16 column blocks n.
template <int HD>
__device__ __forceinline__ void AccumulateRowsTimesTile(FragC* acc, const bf16* p, const bf16* v) {
  for (int k = 0; k < kTile / 16; ++k) {
    FragA fa;
    wmma::load_matrix_sync(fa, p + k * 16, kTile);
    for (int n = 0; n < HD / 16; ++n) {
      FragBRow fb;
      wmma::load_matrix_sync(fb, v + k * 16 * HD + n * 16, HD);
      wmma::mma_sync(acc[n], fa, fb, acc[n]);
    }
  }
}

// Shared memory of the forward: Q, K, V tiles, and per warp its scores /
// P.V scratch (fp32), P (bf16), O (fp32) and row statistics.
template <int HD>
struct ForwardSmem {
  static constexpr int kScratch = HD > kTile ? HD : kTile;  // row length of the fp32 scratch
  static constexpr size_t kBytes = 3 * kTile * HD * sizeof(bf16) + kWarps * 16 * kScratch * sizeof(float) +
                                   kWarps * 16 * kTile * sizeof(bf16) + kWarps * 16 * HD * sizeof(float) +
                                   3 * kRows * sizeof(float);
};

// grid (query blocks of 64, H, B), 128 threads.
template <int HD>
__global__ void __launch_bounds__(kThreads)
    TcForwardKernel(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, AttentionDims d) {
  using S = ForwardSmem<HD>;
  HERD_DYNAMIC_SHARED(unsigned char, smem);
  bf16* qs = reinterpret_cast<bf16*>(smem);
  bf16* ks = qs + kTile * HD;
  bf16* vs = ks + kTile * HD;
  float* scratch = reinterpret_cast<float*>(vs + kTile * HD);               // [warps][16][kScratch]
  bf16* ps = reinterpret_cast<bf16*>(scratch + kWarps * 16 * S::kScratch);  // [warps][16][kTile]
  float* os = reinterpret_cast<float*>(ps + kWarps * 16 * kTile);           // [warps][16][HD]
  float* row_max = os + kWarps * 16 * HD;                                   // [kRows]
  float* row_sum = row_max + kRows;
  float* row_scale = row_sum + kRows;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t b = blockIdx.z, h = blockIdx.y, kvh = h / d.group;
  const int64_t q0 = static_cast<int64_t>(blockIdx.x) * kRows;
  const int64_t last_q = q0 + kRows - 1 < d.T - 1 ? q0 + kRows - 1 : d.T - 1;
  float* my_scratch = scratch + warp * 16 * S::kScratch;
  bf16* my_p = ps + warp * 16 * kTile;
  float* my_o = os + warp * 16 * HD;
  // A lane pair per row: lane/2 is the row, lane%2 the half of the columns.
  const int r = lane / 2, half = lane % 2;
  const int64_t qi = q0 + warp * 16 + r;

  LoadTile<HD>(qs, q, b, q0, d.H, h, d.T);
  for (int idx = lane; idx < 16 * HD; idx += 32) my_o[idx] = 0.0f;
  if (half == 0) {
    row_max[warp * 16 + r] = -INFINITY;
    row_sum[warp * 16 + r] = 0.0f;
  }
  for (int64_t k0 = 0; k0 <= last_q; k0 += kTile) {
    __syncthreads();  // the previous tiles are no longer read
    LoadTile<HD>(ks, k, b, k0, d.KV, kvh, d.T);
    LoadTile<HD>(vs, v, b, k0, d.KV, kvh, d.T);
    __syncthreads();
    RowsTimesTileT<HD>(my_scratch, S::kScratch, qs + warp * 16 * HD, ks);
    __syncwarp();
    // Online softmax over this tile's 32 columns per lane.
    const float* srow = my_scratch + r * S::kScratch;
    float local_max = -INFINITY;
    for (int c = half * 32; c < half * 32 + 32; ++c) {
      const int64_t kj = k0 + c;
      if (kj <= qi && kj < d.T) local_max = fmaxf(local_max, srow[c] * d.scale);
    }
    const float tile_max = fmaxf(local_max, __shfl_xor_sync(0xffffffffu, local_max, 1));
    const float m_old = row_max[warp * 16 + r];
    const float m_new = fmaxf(m_old, tile_max);
    float local_sum = 0;
    for (int c = half * 32; c < half * 32 + 32; ++c) {
      const int64_t kj = k0 + c;
      const float p = (kj <= qi && kj < d.T && m_new != -INFINITY) ? expf(srow[c] * d.scale - m_new) : 0.0f;
      my_p[r * kTile + c] = __float2bfloat16(p);
      local_sum += p;
    }
    const float tile_sum = local_sum + __shfl_xor_sync(0xffffffffu, local_sum, 1);
    const float correction = m_new == -INFINITY ? 1.0f : expf(m_old - m_new);  // 0 on the first tile
    __syncwarp();
    if (half == 0) {
      row_sum[warp * 16 + r] = row_sum[warp * 16 + r] * correction + tile_sum;
      row_max[warp * 16 + r] = m_new;
      row_scale[warp * 16 + r] = correction;
    }
    // P.V into the scratch, then O = O * correction + P.V by the lanes.
    FragC acc[HD / 16];
    for (int n = 0; n < HD / 16; ++n) wmma::fill_fragment(acc[n], 0.0f);
    AccumulateRowsTimesTile<HD>(acc, my_p, vs);
    __syncwarp();  // every lane has read the scores before they are overwritten
    for (int n = 0; n < HD / 16; ++n)
      wmma::store_matrix_sync(my_scratch + n * 16, acc[n], S::kScratch, wmma::mem_row_major);
    __syncwarp();
    for (int c = half * (HD / 2); c < half * (HD / 2) + HD / 2; ++c)
      my_o[r * HD + c] = my_o[r * HD + c] * row_scale[warp * 16 + r] + my_scratch[r * S::kScratch + c];
    __syncwarp();
  }
  if (qi >= d.T) return;
  const float l = row_sum[warp * 16 + r];
  bf16* o = out + ((b * d.T + qi) * d.H + h) * HD;
  for (int c = half * (HD / 2); c < half * (HD / 2) + HD / 2; ++c) o[c] = __float2bfloat16(my_o[r * HD + c] / l);
  if (half == 0) lse[(b * d.H + h) * d.T + qi] = row_max[warp * 16 + r] + logf(l);
}

// Shared memory of the backward kernels: two own-row tiles, two streamed
// tiles, per warp two fp32 [16 x kScratch] scratches and one bf16
// [16 x kTile], and the streamed rows' statistics.
template <int HD>
struct BackwardSmem {
  static constexpr int kScratch = HD > kTile ? HD : kTile;
  static constexpr size_t kBytes = 4 * kTile * HD * sizeof(bf16) + 2 * kWarps * 16 * kScratch * sizeof(float) +
                                   kWarps * 16 * kTile * sizeof(bf16) + 2 * kTile * sizeof(float);

  // The layout, carved from the block's dynamic shared memory.
  bf16 *own_a, *own_b;    // the block's own rows of two operands [kTile, HD]
  bf16 *tile_a, *tile_b;  // the two streamed operands' tile
  float *s, *dp;          // per warp [16, kScratch] fp32 scratch
  bf16* p;                // per warp [16, kTile] bf16 operand
  float* stats;           // the streamed rows' lse [kTile], then delta [kTile]
  __device__ explicit BackwardSmem(unsigned char* smem) {
    own_a = reinterpret_cast<bf16*>(smem);
    own_b = own_a + kTile * HD;
    tile_a = own_b + kTile * HD;
    tile_b = tile_a + kTile * HD;
    s = reinterpret_cast<float*>(tile_b + kTile * HD);
    dp = s + kWarps * 16 * kScratch;
    p = reinterpret_cast<bf16*>(dp + kWarps * 16 * kScratch);
    stats = reinterpret_cast<float*>(p + kWarps * 16 * kTile);
  }
};

// Writes acc[n] * factor (16 x HD) as bf16 rows of a [B, T, heads, HD]
// tensor, staged through the warp's scratch.
template <int HD>
__device__ __forceinline__ void StoreRows(bf16* dst, FragC* acc, float* scratch, int ld, int64_t b, int64_t first,
                                          int64_t heads, int64_t head, int64_t T_, float factor) {
  for (int n = 0; n < HD / 16; ++n) wmma::store_matrix_sync(scratch + n * 16, acc[n], ld, wmma::mem_row_major);
  __syncwarp();
  const int lane = threadIdx.x % 32, r = lane / 2, half = lane % 2;
  const int64_t row = first + r;
  if (row < T_) {
    bf16* o = dst + ((b * T_ + row) * heads + head) * HD;
    for (int c = half * (HD / 2); c < half * (HD / 2) + HD / 2; ++c)
      o[c] = __float2bfloat16(scratch[r * ld + c] * factor);
  }
  __syncwarp();
}

// grid (query blocks of 64, H, B): each warp owns 16 queries' dq.
template <int HD>
__global__ void __launch_bounds__(kThreads)
    TcBackwardQueryKernel(bf16* dq, const bf16* dout, const float* lse, const float* delta, const bf16* q,
                          const bf16* k, const bf16* v, AttentionDims d) {
  using S = BackwardSmem<HD>;
  HERD_DYNAMIC_SHARED(unsigned char, smem);
  const S m(smem);
  bf16 *qs = m.own_a, *dos = m.own_b, *ks = m.tile_a, *vs = m.tile_b;
  float *s_scratch = m.s, *dp_scratch = m.dp, *stats = m.stats;  // stats: the block's rows here (kRows = kTile)
  bf16* ds_tile = m.p;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, r = lane / 2, half = lane % 2;
  const int64_t b = blockIdx.z, h = blockIdx.y, kvh = h / d.group;
  const int64_t q0 = static_cast<int64_t>(blockIdx.x) * kRows;
  const int64_t last_q = q0 + kRows - 1 < d.T - 1 ? q0 + kRows - 1 : d.T - 1;
  float* my_s = s_scratch + warp * 16 * S::kScratch;
  float* my_dp = dp_scratch + warp * 16 * S::kScratch;
  bf16* my_ds = ds_tile + warp * 16 * kTile;
  const int64_t qi = q0 + warp * 16 + r;

  LoadTile<HD>(qs, q, b, q0, d.H, h, d.T);
  LoadTile<HD>(dos, dout, b, q0, d.H, h, d.T);
  for (int i = threadIdx.x; i < kRows; i += blockDim.x) {
    const int64_t row = q0 + i;
    stats[i] = row < d.T ? lse[(b * d.H + h) * d.T + row] : 0.0f;
    stats[kRows + i] = row < d.T ? delta[(b * d.H + h) * d.T + row] : 0.0f;
  }
  FragC acc[HD / 16];
  for (int n = 0; n < HD / 16; ++n) wmma::fill_fragment(acc[n], 0.0f);
  for (int64_t k0 = 0; k0 <= last_q; k0 += kTile) {
    __syncthreads();
    LoadTile<HD>(ks, k, b, k0, d.KV, kvh, d.T);
    LoadTile<HD>(vs, v, b, k0, d.KV, kvh, d.T);
    __syncthreads();
    RowsTimesTileT<HD>(my_s, S::kScratch, qs + warp * 16 * HD, ks);    // S = Q K^T
    RowsTimesTileT<HD>(my_dp, S::kScratch, dos + warp * 16 * HD, vs);  // dP = dO V^T
    __syncwarp();
    const float L = stats[warp * 16 + r], D = stats[kRows + warp * 16 + r];
    for (int c = half * 32; c < half * 32 + 32; ++c) {
      const int64_t kj = k0 + c;
      const bool live = kj <= qi && kj < d.T && qi < d.T;
      const float p = live ? expf(my_s[r * S::kScratch + c] * d.scale - L) : 0.0f;
      my_ds[r * kTile + c] = __float2bfloat16(p * (my_dp[r * S::kScratch + c] - D));
    }
    __syncwarp();
    AccumulateRowsTimesTile<HD>(acc, my_ds, ks);  // dQ += dS K
  }
  __syncwarp();
  StoreRows<HD>(dq, acc, my_s, S::kScratch, b, q0 + warp * 16, d.H, h, d.T, d.scale);
}

// grid (key blocks of 64, KV, B): each warp owns 16 keys' dk and dv and
// walks the group's query heads, then the queries, in order.
template <int HD>
__global__ void __launch_bounds__(kThreads)
    TcBackwardKeyValueKernel(bf16* dk, bf16* dv, const bf16* dout, const float* lse, const float* delta, const bf16* q,
                             const bf16* k, const bf16* v, AttentionDims d) {
  using S = BackwardSmem<HD>;
  HERD_DYNAMIC_SHARED(unsigned char, smem);
  const S m(smem);
  bf16 *ks = m.own_a, *vs = m.own_b, *qs = m.tile_a, *dos = m.tile_b;
  float *s_scratch = m.s, *dp_scratch = m.dp, *stats = m.stats;
  bf16* p_tile = m.p;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, r = lane / 2, half = lane % 2;
  const int64_t b = blockIdx.z, kvh = blockIdx.y;
  const int64_t j0 = static_cast<int64_t>(blockIdx.x) * kRows;
  float* my_s = s_scratch + warp * 16 * S::kScratch;
  float* my_dp = dp_scratch + warp * 16 * S::kScratch;
  bf16* my_p = p_tile + warp * 16 * kTile;
  const int64_t kj = j0 + warp * 16 + r;

  LoadTile<HD>(ks, k, b, j0, d.KV, kvh, d.T);
  LoadTile<HD>(vs, v, b, j0, d.KV, kvh, d.T);
  FragC dk_acc[HD / 16], dv_acc[HD / 16];
  for (int n = 0; n < HD / 16; ++n) {
    wmma::fill_fragment(dk_acc[n], 0.0f);
    wmma::fill_fragment(dv_acc[n], 0.0f);
  }
  for (int64_t g = 0; g < d.group; ++g) {
    const int64_t h = kvh * d.group + g;
    for (int64_t i0 = j0; i0 < d.T; i0 += kTile) {  // queries i >= j only
      __syncthreads();
      LoadTile<HD>(qs, q, b, i0, d.H, h, d.T);
      LoadTile<HD>(dos, dout, b, i0, d.H, h, d.T);
      for (int i = threadIdx.x; i < kTile; i += blockDim.x) {
        const int64_t row = i0 + i;
        stats[i] = row < d.T ? lse[(b * d.H + h) * d.T + row] : 0.0f;
        stats[kTile + i] = row < d.T ? delta[(b * d.H + h) * d.T + row] : 0.0f;
      }
      __syncthreads();
      RowsTimesTileT<HD>(my_s, S::kScratch, ks + warp * 16 * HD, qs);    // S^T = K Q^T
      RowsTimesTileT<HD>(my_dp, S::kScratch, vs + warp * 16 * HD, dos);  // dP^T = V dO^T
      __syncwarp();
      for (int c = half * 32; c < half * 32 + 32; ++c) {
        const int64_t qi = i0 + c;
        const bool live = qi >= kj && qi < d.T && kj < d.T;
        const float p = live ? expf(my_s[r * S::kScratch + c] * d.scale - stats[c]) : 0.0f;
        my_p[r * kTile + c] = __float2bfloat16(p);
        my_s[r * S::kScratch + c] = p * (my_dp[r * S::kScratch + c] - stats[kTile + c]);  // dS^T, fp32
      }
      __syncwarp();
      AccumulateRowsTimesTile<HD>(dv_acc, my_p, dos);  // dV += P^T dO
      __syncwarp();                                    // P^T is read; its buffer takes dS^T
      for (int c = half * 32; c < half * 32 + 32; ++c)
        my_p[r * kTile + c] = __float2bfloat16(my_s[r * S::kScratch + c]);
      __syncwarp();
      AccumulateRowsTimesTile<HD>(dk_acc, my_p, qs);  // dK += dS^T Q
      __syncwarp();
    }
  }
  StoreRows<HD>(dk, dk_acc, my_s, S::kScratch, b, j0 + warp * 16, d.KV, kvh, d.T, d.scale);
  StoreRows<HD>(dv, dv_acc, my_s, S::kScratch, b, j0 + warp * 16, d.KV, kvh, d.T, 1.0f);
}

template <typename Kernel>
void AllowSharedMemory(Kernel kernel, size_t bytes) {
  // Above 48 KiB a kernel must opt in (sm_80: up to 163 KiB, sm_90: 227 KiB).
  const cudaError_t e = cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  LOG_IF(FATAL, e != cudaSuccess) << "attention: " << bytes
                                  << " bytes of shared memory refused: " << cudaGetErrorString(e);
}

template <int HD>
void Forward(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, int64_t B, const AttentionDims& d,
             cudaStream_t stream) {
  auto* kernel = &TcForwardKernel<HD>;
  const size_t smem = ForwardSmem<HD>::kBytes;
  AllowSharedMemory(kernel, smem);
  const dim3 grid(GridFor(d.T, kRows), static_cast<unsigned>(d.H), static_cast<unsigned>(B));
  HERD_LAUNCH(kernel, grid, kThreads, smem, stream, out, lse, q, k, v, d);
}

template <int HD>
void Backward(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const float* lse, const float* delta, const bf16* q,
              const bf16* k, const bf16* v, int64_t B, const AttentionDims& d, cudaStream_t stream) {
  const size_t smem = BackwardSmem<HD>::kBytes;
  auto* query_kernel = &TcBackwardQueryKernel<HD>;
  AllowSharedMemory(query_kernel, smem);
  const dim3 qgrid(GridFor(d.T, kRows), static_cast<unsigned>(d.H), static_cast<unsigned>(B));
  HERD_LAUNCH(query_kernel, qgrid, kThreads, smem, stream, dq, dout, lse, delta, q, k, v, d);
  auto* kv_kernel = &TcBackwardKeyValueKernel<HD>;
  AllowSharedMemory(kv_kernel, smem);
  const dim3 kgrid(GridFor(d.T, kRows), static_cast<unsigned>(d.KV), static_cast<unsigned>(B));
  HERD_LAUNCH(kv_kernel, kgrid, kThreads, smem, stream, dk, dv, dout, lse, delta, q, k, v, d);
}

}  // namespace

bool TensorCoreAttentionSupports(int64_t head_dim) { return head_dim == 64 || head_dim == 128; }

void TensorCoreAttentionForward(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, int64_t B,
                                int64_t T_, int64_t H, int64_t KV, int64_t head_dim, cudaStream_t stream) {
  const AttentionDims d = AttentionDims::Make(T_, H, KV, head_dim);
  if (head_dim == 64) return Forward<64>(out, lse, q, k, v, B, d, stream);
  if (head_dim == 128) return Forward<128>(out, lse, q, k, v, B, d, stream);
  LOG(FATAL) << "tensor-core attention: head_dim " << head_dim;
}

void TensorCoreAttentionBackward(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const float* lse, const float* delta,
                                 const bf16* q, const bf16* k, const bf16* v, int64_t B, int64_t T_, int64_t H,
                                 int64_t KV, int64_t head_dim, cudaStream_t stream) {
  const AttentionDims d = AttentionDims::Make(T_, H, KV, head_dim);
  if (head_dim == 64) return Backward<64>(dq, dk, dv, dout, lse, delta, q, k, v, B, d, stream);
  if (head_dim == 128) return Backward<128>(dq, dk, dv, dout, lse, delta, q, k, v, B, d, stream);
  LOG(FATAL) << "tensor-core attention: head_dim " << head_dim;
}

}  // namespace herd::cuda
