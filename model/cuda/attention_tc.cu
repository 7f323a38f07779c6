// Tensor-core flash attention for bf16 (head_dim 64 and 128), the algorithm
// of FlashAttention-2: a block of 4 warps owns 64 rows (16 a warp: queries
// in the forward and dq kernels, keys in the dk/dv kernel) and streams
// 64-row tiles of the other operands through shared memory, double
// buffered with cp.async. Every product is an mma.sync on register
// fragments (tensor_core.cuh); scores, probabilities and their gradients
// never leave registers: a score fragment's rows are those of the next
// product's left operand, so P and dS are rounded to bf16 and fed on
// directly. Softmax statistics are per row, reduced over the 4 lanes that
// hold it, in log2 units (exp2). Shared-memory tiles are swizzled so that
// ldmatrix reads them without bank conflicts.
//
// Deterministic without atomics, like attention.cu: dq and dk/dv are
// separate kernels, each output row owned by one warp, sums in fixed order.
#include <glog/logging.h>

#include <initializer_list>

#include "model/cuda/attention_dims.h"
#include "model/cuda/attention_tc.h"
#include "model/cuda/device_math.cuh"
#include "model/cuda/tensor_core.cuh"

namespace herd::cuda {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kRows = 16 * kWarps;  // rows a block owns
constexpr int kTile = 64;           // rows of a streamed tile
constexpr int kTileN = kTile / 8;   // a score row's 8-column fragments per tile
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

template <int N>
__device__ __forceinline__ void Zero(float (&acc)[N][4]) {
  HERD_UNROLL
  for (int n = 0; n < N; ++n)
    HERD_UNROLL
    for (int e = 0; e < 4; ++e) acc[n][e] = 0.0f;
}

// Issues the copies of rows [first, first + kTile) of one head of a
// [B, T, heads, HD] tensor into a swizzled tile (zeros past T).
template <int HD>
__device__ __forceinline__ void LoadTileAsync(bf16* tile, const bf16* base, int64_t b, int64_t first, int64_t heads,
                                              int64_t head, int64_t T_) {
  constexpr int kChunksPerRow = HD / 8;
  for (int c = threadIdx.x; c < kTile * kChunksPerRow; c += kThreads) {
    const int r = c / kChunksPerRow, col = (c % kChunksPerRow) * 8;
    const int64_t row = first + r;
    const bool valid = row < T_;
    CpAsync16(tile + Swizzled<HD>(r, col), valid ? base + ((b * T_ + row) * heads + head) * HD + col : base, valid);
  }
}

// The A fragment of rows [r0, r0 + 16) and columns [16 kk, 16 kk + 16).
template <int HD>
__device__ __forceinline__ void LoadA(uint32_t (&a)[4], const bf16* tile, int r0, int kk, int lane) {
  LdMatrixX4(a, tile + Swizzled<HD>(r0 + lane % 8 + (lane / 8) % 2 * 8, kk * 16 + lane / 16 * 8));
}
// B fragments of X . Y^T for a tile Y stored [n][k]: rows [n0, n0 + 16) as
// two 8-column fragments (b[0..1] the first, b[2..3] the second), k in
// [16 kk, 16 kk + 16).
template <int HD>
__device__ __forceinline__ void LoadBOfTransposed(uint32_t (&b)[4], const bf16* tile, int n0, int kk, int lane) {
  LdMatrixX4(b, tile + Swizzled<HD>(n0 + lane % 8 + lane / 16 * 8, kk * 16 + (lane / 8) % 2 * 8));
}
// B fragments of X . Y for a tile Y stored [k][n]: k in [k0, k0 + 16),
// columns [c0, c0 + 16) as two 8-column fragments.
template <int HD>
__device__ __forceinline__ void LoadB(uint32_t (&b)[4], const bf16* tile, int k0, int c0, int lane) {
  LdMatrixX4Trans(b, tile + Swizzled<HD>(k0 + lane % 8 + (lane / 8) % 2 * 8, c0 + lane / 16 * 8));
}

// acc[j] = rows [r0, r0 + 16) of x times the tile y^T (a [16 x 64] product,
// fragment j holding columns 8j..8j+7).
template <int HD>
__device__ __forceinline__ void RowsTimesTileT(float (&acc)[kTileN][4], const bf16* x, int r0, const bf16* y,
                                               int lane) {
  Zero(acc);
  HERD_UNROLL
  for (int kk = 0; kk < HD / 16; ++kk) {
    uint32_t a[4];
    LoadA<HD>(a, x, r0, kk, lane);
    HERD_UNROLL
    for (int j = 0; j < kTileN; j += 2) {
      uint32_t b[4];
      LoadBOfTransposed<HD>(b, y, j * 8, kk, lane);
      MmaBf16(acc[j], a, b[0], b[1]);
      MmaBf16(acc[j + 1], a, b[2], b[3]);
    }
  }
}

// acc += p . y, p a [16 x 64] score fragment set rounded to bf16 here, y a
// [64 x HD] tile.
template <int HD>
__device__ __forceinline__ void AccumulateScoresTimesTile(float (&acc)[HD / 8][4], const float (&p)[kTileN][4],
                                                          const bf16* y, int lane) {
  HERD_UNROLL
  for (int kc = 0; kc < kTile / 16; ++kc) {
    const uint32_t a[4] = {PackBf16(p[2 * kc][0], p[2 * kc][1]), PackBf16(p[2 * kc][2], p[2 * kc][3]),
                           PackBf16(p[2 * kc + 1][0], p[2 * kc + 1][1]), PackBf16(p[2 * kc + 1][2], p[2 * kc + 1][3])};
    HERD_UNROLL
    for (int n = 0; n < HD / 8; n += 2) {
      uint32_t b[4];
      LoadB<HD>(b, y, kc * 16, n * 8, lane);
      MmaBf16(acc[n], a, b[0], b[1]);
      MmaBf16(acc[n + 1], a, b[2], b[3]);
    }
  }
}

// The streamed K and V of the forward and dq kernels, two tiles each at
// ks, vs: issues tile i + 1's copies into the other slot (when there is
// one), then waits until tile i (and whatever was asked for before it) has
// landed for every thread of the block.
template <int HD>
__device__ __forceinline__ void NextKeyValueTile(bf16* ks, bf16* vs, const bf16* k, const bf16* v, int64_t i,
                                                 int64_t tiles, int64_t b, int64_t kvh, const AttentionDims& d) {
  const int64_t other = (1 - i % 2) * kTile * HD;
  if (i + 1 < tiles) {
    LoadTileAsync<HD>(ks + other, k, b, (i + 1) * kTile, d.KV, kvh, d.T);
    LoadTileAsync<HD>(vs + other, v, b, (i + 1) * kTile, d.KV, kvh, d.T);
  }
  CpAsyncCommit();
  CpAsyncWait<1>();  // everything but the tile just asked for
  __syncthreads();
}

// Sum over the 4 lanes holding one fragment row.
__device__ __forceinline__ float QuadSum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}
__device__ __forceinline__ float QuadMax(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

// Writes rows [r0, r0 + 16) of acc * factor as bf16 into one head of a
// [B, T, heads, HD] tensor (rows past T skipped).
template <int HD>
__device__ __forceinline__ void StoreRows(bf16* dst, const float (&acc)[HD / 8][4], int64_t b, int64_t r0,
                                          int64_t heads, int64_t head, int64_t T_, float factor, int lane) {
  const int g = lane / 4, t = lane % 4;
  HERD_UNROLL
  for (int half = 0; half < 2; ++half) {
    const int64_t row = r0 + g + 8 * half;
    if (row >= T_) continue;
    bf16* o = dst + ((b * T_ + row) * heads + head) * HD + 2 * t;
    HERD_UNROLL
    for (int n = 0; n < HD / 8; ++n) {
      const uint32_t pair = PackBf16(acc[n][2 * half] * factor, acc[n][2 * half + 1] * factor);
      memcpy(static_cast<void*>(o + n * 8), &pair, sizeof(pair));
    }
  }
}

// The block of the forward and dq kernels: 64 queries from q0 (the
// longest blocks, the last queries, first), the key tiles they attend to,
// and this lane's two fragment rows.
struct QueryBlock {
  int64_t q0, tiles, rows[2];
  __device__ QueryBlock(const AttentionDims& d, int warp, int g)
      : q0(static_cast<int64_t>(gridDim.x - 1 - blockIdx.x) * kRows),
        tiles(((q0 + kRows < d.T ? q0 + kRows : d.T) - 1) / kTile + 1),
        rows{q0 + warp * 16 + g, q0 + warp * 16 + g + 8} {}
};

template <int HD>
struct ForwardSmem {  // Q, then K and V twice
  static constexpr size_t kBytes = static_cast<size_t>(kRows + 4 * kTile) * HD * sizeof(bf16);
};

// grid (query blocks of 64, H, B), 128 threads; the longest blocks (the
// last queries) first.
template <int HD>
__global__ void __launch_bounds__(kThreads)
    TcForwardKernel(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v, AttentionDims d) {
  HERD_DYNAMIC_SHARED(bf16, smem);
  bf16* qs = smem;
  bf16* const ks = qs + kRows * HD;              // two K tiles (slot s at s * kTile * HD)
  bf16* const vs = qs + (kRows + 2 * kTile) * HD;  // two V tiles
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t b = blockIdx.z, h = blockIdx.y, kvh = h / d.group;
  const QueryBlock qb(d, warp, g);
  const float scale2 = d.scale * kLog2e;

  LoadTileAsync<HD>(qs, q, b, qb.q0, d.H, h, d.T);
  LoadTileAsync<HD>(ks, k, b, 0, d.KV, kvh, d.T);
  LoadTileAsync<HD>(vs, v, b, 0, d.KV, kvh, d.T);
  CpAsyncCommit();
  float o[HD / 8][4];
  Zero(o);
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // l: this lane's part of the row sum
  for (int64_t i = 0; i < qb.tiles; ++i) {
    const int cur = static_cast<int>(i % 2);
    NextKeyValueTile<HD>(ks, vs, k, v, i, qb.tiles, b, kvh, d);
    float s[kTileN][4];
    RowsTimesTileT<HD>(s, qs, warp * 16, ks + cur * kTile * HD, lane);
    float tile_max[2] = {-INFINITY, -INFINITY};
    HERD_UNROLL
    for (int j = 0; j < kTileN; ++j)
      HERD_UNROLL
      for (int e = 0; e < 4; ++e) {
        const int64_t col = i * kTile + 8 * j + 2 * t + e % 2, row = qb.rows[e / 2];
        s[j][e] = col <= row && col < d.T ? s[j][e] * scale2 : -INFINITY;
        tile_max[e / 2] = fmaxf(tile_max[e / 2], s[j][e]);
      }
    float base[2];
    HERD_UNROLL
    for (int r = 0; r < 2; ++r) {
      const float m_new = fmaxf(m[r], QuadMax(tile_max[r]));
      base[r] = m_new == -INFINITY ? 0.0f : m_new;  // a row with nothing unmasked yet stays at zero
      const float correction = exp2f(m[r] - base[r]);
      m[r] = m_new;
      l[r] *= correction;
      HERD_UNROLL
      for (int n = 0; n < HD / 8; ++n) {
        o[n][2 * r] *= correction;
        o[n][2 * r + 1] *= correction;
      }
    }
    HERD_UNROLL
    for (int j = 0; j < kTileN; ++j)
      HERD_UNROLL
      for (int e = 0; e < 4; ++e) {
        s[j][e] = exp2f(s[j][e] - base[e / 2]);
        l[e / 2] += s[j][e];
      }
    AccumulateScoresTimesTile<HD>(o, s, vs + cur * kTile * HD, lane);
    __syncthreads();  // this tile is read before the next iteration's copies overwrite it
  }
  float inv[2];
  HERD_UNROLL
  for (int r = 0; r < 2; ++r) {
    l[r] = QuadSum(l[r]);
    inv[r] = 1.0f / l[r];
  }
  HERD_UNROLL
  for (int n = 0; n < HD / 8; ++n)
    HERD_UNROLL
    for (int e = 0; e < 4; ++e) o[n][e] *= inv[e / 2];
  StoreRows<HD>(out, o, b, qb.q0 + warp * 16, d.H, h, d.T, 1.0f, lane);
  HERD_UNROLL
  for (int r = 0; r < 2; ++r)
    if (t == 0 && qb.rows[r] < d.T) lse[(b * d.H + h) * d.T + qb.rows[r]] = m[r] * kLn2 + logf(l[r]);
}

template <int HD>
struct BackwardSmem {  // two own-row tiles, two streamed operands twice, the streamed rows' statistics twice
  static constexpr size_t kBytes =
      static_cast<size_t>(2 * kRows + 4 * kTile) * HD * sizeof(bf16) + 2 * 2 * kTile * sizeof(float);
};

// grid (query blocks of 64, H, B): each warp owns 16 queries' dq.
template <int HD>
__global__ void __launch_bounds__(kThreads)
    TcBackwardQueryKernel(bf16* dq, const bf16* dout, const float* lse, const float* delta, const bf16* q,
                          const bf16* k, const bf16* v, AttentionDims d) {
  HERD_DYNAMIC_SHARED(bf16, smem);
  bf16* qs = smem;
  bf16* dos = qs + kRows * HD;
  bf16* const ks = dos + kRows * HD;              // two K tiles (slot s at s * kTile * HD)
  bf16* const vs = dos + (kRows + 2 * kTile) * HD;  // two V tiles
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t b = blockIdx.z, h = blockIdx.y, kvh = h / d.group;
  const QueryBlock qb(d, warp, g);
  const float scale2 = d.scale * kLog2e;
  float L[2], D[2];  // per row: lse in log2 units, delta
  HERD_UNROLL
  for (int r = 0; r < 2; ++r) {
    const bool live = qb.rows[r] < d.T;
    L[r] = live ? lse[(b * d.H + h) * d.T + qb.rows[r]] * kLog2e : 0.0f;
    D[r] = live ? delta[(b * d.H + h) * d.T + qb.rows[r]] : 0.0f;
  }

  LoadTileAsync<HD>(qs, q, b, qb.q0, d.H, h, d.T);
  LoadTileAsync<HD>(dos, dout, b, qb.q0, d.H, h, d.T);
  LoadTileAsync<HD>(ks, k, b, 0, d.KV, kvh, d.T);
  LoadTileAsync<HD>(vs, v, b, 0, d.KV, kvh, d.T);
  CpAsyncCommit();
  float acc[HD / 8][4];
  Zero(acc);
  for (int64_t i = 0; i < qb.tiles; ++i) {
    const int cur = static_cast<int>(i % 2);
    NextKeyValueTile<HD>(ks, vs, k, v, i, qb.tiles, b, kvh, d);
    float s[kTileN][4], dp[kTileN][4];
    RowsTimesTileT<HD>(s, qs, warp * 16, ks + cur * kTile * HD, lane);    // S = Q K^T
    RowsTimesTileT<HD>(dp, dos, warp * 16, vs + cur * kTile * HD, lane);  // dP = dO V^T
    HERD_UNROLL
    for (int j = 0; j < kTileN; ++j)
      HERD_UNROLL
      for (int e = 0; e < 4; ++e) {
        const int64_t col = i * kTile + 8 * j + 2 * t + e % 2, row = qb.rows[e / 2];
        const float p = col <= row && row < d.T ? exp2f(s[j][e] * scale2 - L[e / 2]) : 0.0f;
        s[j][e] = p * (dp[j][e] - D[e / 2]);  // dS
      }
    AccumulateScoresTimesTile<HD>(acc, s, ks + cur * kTile * HD, lane);  // dQ += dS K
    __syncthreads();
  }
  StoreRows<HD>(dq, acc, b, qb.q0 + warp * 16, d.H, h, d.T, d.scale, lane);
}

// grid (key blocks of 64, KV, B): each warp owns 16 keys' dk and dv and
// walks the group's query heads, then the queries from its block on.
template <int HD>
__global__ void __launch_bounds__(kThreads)
    TcBackwardKeyValueKernel(bf16* dk, bf16* dv, const bf16* dout, const float* lse, const float* delta, const bf16* q,
                             const bf16* k, const bf16* v, AttentionDims d) {
  HERD_DYNAMIC_SHARED(bf16, smem);
  bf16* ks = smem;
  bf16* vs = ks + kRows * HD;
  bf16* const qs = vs + kRows * HD;                // two Q tiles (slot s at s * kTile * HD)
  bf16* const dos = vs + (kRows + 2 * kTile) * HD;  // two dO tiles
  float* stats = reinterpret_cast<float*>(vs + (kRows + 4 * kTile) * HD);  // [2][lse, delta][kTile]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t b = blockIdx.z, kvh = blockIdx.y;
  const int64_t j0 = static_cast<int64_t>(blockIdx.x) * kRows;
  const int64_t keys[2] = {j0 + warp * 16 + g, j0 + warp * 16 + g + 8};
  const float scale2 = d.scale * kLog2e;
  const int64_t query_tiles = (d.T - j0 + kTile - 1) / kTile;  // queries i >= j0 only
  const int64_t steps = d.group * query_tiles;
  // Step i: query head kvh * group + i / query_tiles, queries from
  // j0 + (i % query_tiles) * kTile; copies into buffer `slot`.
  auto load_step = [&](int64_t i, int slot) {
    const int64_t h = kvh * d.group + i / query_tiles, i0 = j0 + (i % query_tiles) * kTile;
    LoadTileAsync<HD>(qs + slot * kTile * HD, q, b, i0, d.H, h, d.T);
    LoadTileAsync<HD>(dos + slot * kTile * HD, dout, b, i0, d.H, h, d.T);
    float* st = stats + slot * 2 * kTile;
    for (int c = threadIdx.x; c < kTile; c += kThreads) {
      const int64_t row = i0 + c;
      st[c] = row < d.T ? lse[(b * d.H + h) * d.T + row] * kLog2e : 0.0f;
      st[kTile + c] = row < d.T ? delta[(b * d.H + h) * d.T + row] : 0.0f;
    }
  };

  LoadTileAsync<HD>(ks, k, b, j0, d.KV, kvh, d.T);
  LoadTileAsync<HD>(vs, v, b, j0, d.KV, kvh, d.T);
  load_step(0, 0);
  CpAsyncCommit();
  float dk_acc[HD / 8][4], dv_acc[HD / 8][4];
  Zero(dk_acc);
  Zero(dv_acc);
  for (int64_t i = 0; i < steps; ++i) {
    const int cur = static_cast<int>(i % 2);
    if (i + 1 < steps) load_step(i + 1, 1 - cur);
    CpAsyncCommit();
    CpAsyncWait<1>();
    __syncthreads();
    const int64_t i0 = j0 + (i % query_tiles) * kTile;
    const float* L = stats + cur * 2 * kTile;
    const float* D = L + kTile;
    float s[kTileN][4], dp[kTileN][4];
    RowsTimesTileT<HD>(s, ks, warp * 16, qs + cur * kTile * HD, lane);    // S^T = K Q^T
    RowsTimesTileT<HD>(dp, vs, warp * 16, dos + cur * kTile * HD, lane);  // dP^T = V dO^T
    HERD_UNROLL
    for (int j = 0; j < kTileN; ++j)
      HERD_UNROLL
      for (int e = 0; e < 4; ++e) {
        const int c = 8 * j + 2 * t + e % 2;
        const int64_t query = i0 + c, key = keys[e / 2];
        const float p = query >= key && query < d.T && key < d.T ? exp2f(s[j][e] * scale2 - L[c]) : 0.0f;
        s[j][e] = p;                   // P^T
        dp[j][e] = p * (dp[j][e] - D[c]);  // dS^T
      }
    AccumulateScoresTimesTile<HD>(dv_acc, s, dos + cur * kTile * HD, lane);  // dV += P^T dO
    AccumulateScoresTimesTile<HD>(dk_acc, dp, qs + cur * kTile * HD, lane);  // dK += dS^T Q
    __syncthreads();
  }
  StoreRows<HD>(dk, dk_acc, b, j0 + warp * 16, d.KV, kvh, d.T, d.scale, lane);
  StoreRows<HD>(dv, dv_acc, b, j0 + warp * 16, d.KV, kvh, d.T, 1.0f, lane);
}

template <typename Kernel>
void AllowSharedMemory(Kernel kernel, size_t bytes) {
  // Above 48 KiB a kernel must opt in (sm_80: up to 163 KiB, sm_90: 227 KiB).
  const cudaError_t e = cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  LOG_IF(FATAL, e != cudaSuccess) << "attention: " << bytes
                                  << " bytes of shared memory refused: " << cudaGetErrorString(e);
}

void CheckAligned(std::initializer_list<const void*> tensors) {
  for (const void* p : tensors)
    CHECK_EQ(reinterpret_cast<uintptr_t>(p) % 16, 0u) << "tensor-core attention: a tensor not 16-byte aligned";
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
  CheckAligned({out, q, k, v});
  const AttentionDims d = AttentionDims::Make(T_, H, KV, head_dim);
  if (head_dim == 64) return Forward<64>(out, lse, q, k, v, B, d, stream);
  if (head_dim == 128) return Forward<128>(out, lse, q, k, v, B, d, stream);
  LOG(FATAL) << "tensor-core attention: head_dim " << head_dim;
}

void TensorCoreAttentionBackward(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const float* lse, const float* delta,
                                 const bf16* q, const bf16* k, const bf16* v, int64_t B, int64_t T_, int64_t H,
                                 int64_t KV, int64_t head_dim, cudaStream_t stream) {
  CheckAligned({dq, dk, dv, dout, q, k, v});
  const AttentionDims d = AttentionDims::Make(T_, H, KV, head_dim);
  if (head_dim == 64) return Backward<64>(dq, dk, dv, dout, lse, delta, q, k, v, B, d, stream);
  if (head_dim == 128) return Backward<128>(dq, dk, dv, dout, lse, delta, q, k, v, B, d, stream);
  LOG(FATAL) << "tensor-core attention: head_dim " << head_dim;
}

}  // namespace herd::cuda
