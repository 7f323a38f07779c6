// Fused cross-entropy over the vocabulary: a block per row. The forward
// keeps only the fp32 log-sum-exp per row; the backward writes
// scale * (softmax - onehot) over the logits in place, so no [N, V]
// probability tensor exists beside the logits.
#include "model/cuda/device_math.cuh"
#include "model/cuda/kernels.h"

namespace herd::cuda {

namespace {

constexpr int kThreads = 256;

template <typename T>
__global__ void CrossEntropyForwardKernel(float* losses, float* lse, const T* logits, const int32_t* targets,
                                          int64_t V) {
  __shared__ float shared[32];
  const int64_t row = blockIdx.x;
  const T* x = logits + row * V;
  // Online max/sum per thread over a strided slice, then combined: the
  // block's max first, each thread's sum rescaled to it, then summed.
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
  const float total = BlockSum(scaled, shared);
  if (threadIdx.x == 0) {
    const float row_lse = block_max + logf(total);
    lse[row] = row_lse;
    losses[row] = row_lse - ToFloat(x[targets[row]]);
  }
}

template <typename T>
__global__ void CrossEntropyBackwardKernel(T* logits, const float* lse, const int32_t* targets, int64_t V,
                                           float scale) {
  const int64_t row = blockIdx.x;
  T* x = logits + row * V;
  const float row_lse = lse[row];
  const int64_t target = targets[row];
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
    const float p = expf(ToFloat(x[j]) - row_lse);
    x[j] = FromFloat<T>(scale * (j == target ? p - 1.0f : p));
  }
}

}  // namespace

template <typename T>
void CrossEntropyForward(float* losses, float* lse, const T* logits, const int32_t* targets, int64_t N, int64_t V,
                         cudaStream_t stream) {
  if (N == 0) return;
  HERD_LAUNCH(CrossEntropyForwardKernel<T>, static_cast<unsigned>(N), kThreads, 0, stream, losses, lse, logits, targets,
              V);
}

template <typename T>
void CrossEntropyBackward(T* logits, const float* lse, const int32_t* targets, int64_t N, int64_t V, float scale,
                          cudaStream_t stream) {
  if (N == 0) return;
  HERD_LAUNCH(CrossEntropyBackwardKernel<T>, static_cast<unsigned>(N), kThreads, 0, stream, logits, lse, targets, V,
              scale);
}

template void CrossEntropyForward<float>(float*, float*, const float*, const int32_t*, int64_t, int64_t, cudaStream_t);
template void CrossEntropyForward<bf16>(float*, float*, const bf16*, const int32_t*, int64_t, int64_t, cudaStream_t);
template void CrossEntropyBackward<float>(float*, const float*, const int32_t*, int64_t, int64_t, float, cudaStream_t);
template void CrossEntropyBackward<bf16>(bf16*, const float*, const int32_t*, int64_t, int64_t, float, cudaStream_t);

}  // namespace herd::cuda
