// Fused cross-entropy over the vocabulary: a block per row. The forward
// keeps only the fp32 log-sum-exp per row; the backward writes
// scale * (softmax - onehot) over the logits in place, so no [N, V]
// probability tensor exists beside the logits.
#include "model/cuda/device_math.cuh"
#include "model/cuda/kernels.h"

namespace herd::cuda {

namespace {

constexpr int kThreads = 256;

// The row's max and sum of exp(x - max) over x[0, V), every thread of the
// block with the same result: online per thread over a strided slice, then
// combined (the block's max first, each thread's sum rescaled to it, then
// summed).
struct RowStats {
  float max, sum;
};
template <typename T>
__device__ RowStats RowMaxAndSum(const T* x, int64_t V, float* shared) {
  float m = -INFINITY, s = 0;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
    const float xj = ToFloat(x[j]);
    if (xj > m) {
      s = s * expf(m - xj) + 1.0f;
      m = xj;
    } else {
      s += expf(xj - m);
    }
  }
  const float block_max = BlockMax(m, shared);
  const float scaled = m == -INFINITY ? 0.0f : s * expf(m - block_max);
  return {block_max, BlockSum(scaled, shared)};
}

template <typename T>
__global__ void CrossEntropyForwardKernel(float* losses, float* lse, const T* logits, const int32_t* targets,
                                          int64_t V) {
  __shared__ float shared[32];
  const int64_t row = blockIdx.x;
  const T* x = logits + row * V;
  const RowStats r = RowMaxAndSum(x, V, shared);
  if (threadIdx.x == 0) {
    const float row_lse = r.max + logf(r.sum);
    lse[row] = row_lse;
    losses[row] = row_lse - ToFloat(x[targets[row]]);
  }
}

template <typename T>
__global__ void CrossEntropyBackwardKernel(T* logits, const float* lse, const int32_t* targets, int64_t V,
                                           float scale, int64_t first) {
  const int64_t row = blockIdx.x;
  T* x = logits + row * V;
  const float row_lse = lse[row];
  const int64_t target = targets[row] - first;  // outside [0, V): another rank's column
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
    const float p = expf(ToFloat(x[j]) - row_lse);
    x[j] = FromFloat<T>(scale * (j == target ? p - 1.0f : p));
  }
}

// A block per row: its columns' max and sum of exp(x - max), and the
// target's logit where it is one of them.
template <typename T>
__global__ void VocabParallelStatsKernel(float* stats, const T* logits, const int32_t* targets, int64_t V,
                                         int64_t first, int rank, int64_t width) {
  __shared__ float shared[32];
  const int64_t row = blockIdx.x;
  const RowStats r = RowMaxAndSum(logits + row * V, V, shared);
  const T* x = logits + row * V;
  float* out = stats + row * width;
  for (int64_t j = threadIdx.x; j < width; j += blockDim.x) out[j] = 0.0f;
  __syncthreads();
  if (threadIdx.x == 0) {
    out[2 * rank] = r.max;
    out[2 * rank + 1] = r.sum;
    const int64_t t = targets[row] - first;
    if (t >= 0 && t < V) out[width - 1] = ToFloat(x[t]);
  }
}

// A thread per row: the ranks' stats in rank order, as model/cpu's.
__global__ void VocabParallelLossKernel(float* losses, float* lse, const float* stats, int64_t N, int ranks) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (row >= N) return;
  const int64_t width = 2 * static_cast<int64_t>(ranks) + 1;
  const float* s = stats + row * width;
  float m = -INFINITY;
  for (int r = 0; r < ranks; ++r) m = fmaxf(m, s[2 * r]);
  float sum = 0;
  for (int r = 0; r < ranks; ++r) sum += s[2 * r + 1] * expf(s[2 * r] - m);
  lse[row] = m + logf(sum);
  losses[row] = lse[row] - s[width - 1];
}

}  // namespace

template <typename T>
void VocabParallelStats(float* stats, const T* logits, const int32_t* targets, int64_t N, int64_t V, int64_t first,
                        int rank, int ranks, cudaStream_t stream) {
  if (N == 0) return;
  HERD_LAUNCH(VocabParallelStatsKernel<T>, static_cast<unsigned>(N), kThreads, 0, stream, stats, logits, targets, V,
              first, rank, 2 * static_cast<int64_t>(ranks) + 1);
}

void VocabParallelLoss(float* losses, float* lse, const float* stats, int64_t N, int ranks, cudaStream_t stream) {
  if (N == 0) return;
  HERD_LAUNCH(VocabParallelLossKernel, static_cast<unsigned>((N + kThreads - 1) / kThreads), kThreads, 0, stream,
              losses, lse, stats, N, ranks);
}

template <typename T>
void CrossEntropyForward(float* losses, float* lse, const T* logits, const int32_t* targets, int64_t N, int64_t V,
                         cudaStream_t stream) {
  if (N == 0) return;
  HERD_LAUNCH(CrossEntropyForwardKernel<T>, static_cast<unsigned>(N), kThreads, 0, stream, losses, lse, logits, targets,
              V);
}

template <typename T>
void CrossEntropyBackward(T* logits, const float* lse, const int32_t* targets, int64_t N, int64_t V, float scale,
                          cudaStream_t stream, int64_t first) {
  if (N == 0) return;
  HERD_LAUNCH(CrossEntropyBackwardKernel<T>, static_cast<unsigned>(N), kThreads, 0, stream, logits, lse, targets, V,
              scale, first);
}

template void CrossEntropyForward<float>(float*, float*, const float*, const int32_t*, int64_t, int64_t, cudaStream_t);
template void CrossEntropyForward<bf16>(float*, float*, const bf16*, const int32_t*, int64_t, int64_t, cudaStream_t);
template void CrossEntropyBackward<float>(float*, const float*, const int32_t*, int64_t, int64_t, float, cudaStream_t,
                                          int64_t);
template void CrossEntropyBackward<bf16>(bf16*, const float*, const int32_t*, int64_t, int64_t, float, cudaStream_t,
                                         int64_t);
template void VocabParallelStats<float>(float*, const float*, const int32_t*, int64_t, int64_t, int64_t, int, int,
                                        cudaStream_t);
template void VocabParallelStats<bf16>(float*, const bf16*, const int32_t*, int64_t, int64_t, int64_t, int, int,
                                       cudaStream_t);

}  // namespace herd::cuda
