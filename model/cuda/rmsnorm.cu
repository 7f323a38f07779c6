// RMSNorm forward and backward. A warp per row for the row reductions; the
// weight gradient sums rows in a fixed two-level order (row partitions,
// then partitions in order) instead of atomics.
#include "model/cuda/device_math.cuh"
#include "model/cuda/kernels.h"

namespace herd::cuda {

namespace {

constexpr int kRowsPerBlock = 8;  // warps per block, a row each
constexpr int kThreads = 256;

template <typename T>
__global__ void RmsNormForwardKernel(T* out, float* rstd, const T* in, const T* weight, int64_t N, int64_t C,
                                     float eps) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;  // whole warps leave together
  const T* x = in + row * C;
  float ss = 0;
  for (int64_t c = lane; c < C; c += 32) {
    const float xc = ToFloat(x[c]);
    ss += xc * xc;
  }
  ss = WarpSum(ss);
  const float r = 1.0f / sqrtf(ss / static_cast<float>(C) + eps);
  if (lane == 0) rstd[row] = r;
  T* y = out + row * C;
  for (int64_t c = lane; c < C; c += 32) y[c] = FromFloat<T>(ToFloat(weight[c]) * (ToFloat(x[c]) * r));
}

// __restrict__: din is read and written in place; without it every store
// would order the next iteration's loads behind it.
template <typename T>
__global__ void RmsNormBackwardInputKernel(T* __restrict__ din, const T* __restrict__ dout, const T* __restrict__ in,
                                           const T* __restrict__ weight, const float* __restrict__ rstd, int64_t N,
                                           int64_t C) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= N) return;
  const T* x = in + row * C;
  const T* g = dout + row * C;
  const float r = rstd[row];
  float dot = 0;  // sum_c g_c w_c xhat_c
  HERD_UNROLL_BY(4)
  for (int64_t c = lane; c < C; c += 32) dot += ToFloat(g[c]) * ToFloat(weight[c]) * (ToFloat(x[c]) * r);
  const float mean = WarpSum(dot) / static_cast<float>(C);
  T* dx = din + row * C;
  HERD_UNROLL_BY(4)
  for (int64_t c = lane; c < C; c += 32) {
    const float xhat = ToFloat(x[c]) * r;
    dx[c] = FromFloat<T>(ToFloat(dx[c]) + r * (ToFloat(g[c]) * ToFloat(weight[c]) - xhat * mean));
  }
}

// partial[p, c] = sum over rows p, p + P, p + 2P, ... of g * xhat.
template <typename T>
__global__ void RmsNormWeightPartialKernel(float* partial, const T* dout, const T* in, const float* rstd, int64_t N,
                                           int64_t C, int partitions) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int p = blockIdx.y;
  if (c >= C) return;
  float sum = 0;
  for (int64_t row = p; row < N; row += partitions)
    sum += ToFloat(dout[row * C + c]) * (ToFloat(in[row * C + c]) * rstd[row]);
  partial[static_cast<int64_t>(p) * C + c] = sum;
}

__global__ void RmsNormWeightSumKernel(float* dweight, const float* partial, int64_t C, int partitions) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float sum = 0;
  for (int p = 0; p < partitions; ++p) sum += partial[static_cast<int64_t>(p) * C + c];
  dweight[c] += sum;
}

int Partitions(int64_t N) { return static_cast<int>(N < kRmsNormPartitions ? N : kRmsNormPartitions); }

}  // namespace

template <typename T>
void RmsNormForward(T* out, float* rstd, const T* in, const T* weight, int64_t N, int64_t C, float eps,
                    cudaStream_t stream) {
  if (N == 0) return;
  HERD_LAUNCH(RmsNormForwardKernel<T>, GridFor(N, kRowsPerBlock), kRowsPerBlock * 32, 0, stream, out, rstd, in, weight,
              N, C, eps);
}

template <typename T>
void RmsNormBackward(T* din, float* dweight, const T* dout, const T* in, const T* weight, const float* rstd, int64_t N,
                     int64_t C, float* scratch, cudaStream_t stream) {
  if (N == 0) return;
  HERD_LAUNCH(RmsNormBackwardInputKernel<T>, GridFor(N, kRowsPerBlock), kRowsPerBlock * 32, 0, stream, din, dout, in,
              weight, rstd, N, C);
  const int partitions = Partitions(N);
  const dim3 grid(GridFor(C, kThreads), static_cast<unsigned>(partitions));
  HERD_LAUNCH(RmsNormWeightPartialKernel<T>, grid, kThreads, 0, stream, scratch, dout, in, rstd, N, C, partitions);
  HERD_LAUNCH(RmsNormWeightSumKernel, GridFor(C, kThreads), kThreads, 0, stream, dweight, scratch, C, partitions);
}

template void RmsNormForward<float>(float*, float*, const float*, const float*, int64_t, int64_t, float, cudaStream_t);
template void RmsNormForward<bf16>(bf16*, float*, const bf16*, const bf16*, int64_t, int64_t, float, cudaStream_t);
template void RmsNormBackward<float>(float*, float*, const float*, const float*, const float*, const float*, int64_t,
                                     int64_t, float*, cudaStream_t);
template void RmsNormBackward<bf16>(bf16*, float*, const bf16*, const bf16*, const bf16*, const float*, int64_t,
                                    int64_t, float*, cudaStream_t);

}  // namespace herd::cuda
