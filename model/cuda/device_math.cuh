// Device helpers shared by the kernels: dtype conversion (fp32 arithmetic
// whatever the storage dtype), warp and block reductions in a fixed order,
// and launch shapes.
#pragma once

#include <cmath>
#include <cstdint>

#include "model/cuda/device_compat.h"

namespace herd::cuda {

__device__ __forceinline__ float ToFloat(float x) { return x; }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T>
__device__ __forceinline__ T FromFloat(float x);
template <>
__device__ __forceinline__ float FromFloat<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float x) {
  return __float2bfloat16(x);
}

// Butterfly sums: every lane ends with the same value, in the same order.
__device__ __forceinline__ float WarpSum(float v) {
  for (int m = 16; m > 0; m >>= 1) v += __shfl_xor_sync(0xffffffffu, v, m);
  return v;
}
__device__ __forceinline__ double WarpSum(double v) {
  for (int m = 16; m > 0; m >>= 1) v += __shfl_xor_sync(0xffffffffu, v, m);
  return v;
}
__device__ __forceinline__ float WarpMax(float v) {
  for (int m = 16; m > 0; m >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, m));
  return v;
}

// Sum over a 1-D block whose size is a multiple of 32 (at most 1024); every
// thread gets the result. `shared` holds 32 values; callers that reduce
// twice in a row need a __syncthreads() between (done here at the start).
template <typename F>
__device__ __forceinline__ F BlockSum(F v, F* shared) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = WarpSum(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : F(0);
  return WarpSum(v);
}
__device__ __forceinline__ float BlockMax(float v, float* shared) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = WarpMax(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : -INFINITY;
  return WarpMax(v);
}

inline unsigned GridFor(int64_t n, int threads) { return static_cast<unsigned>((n + threads - 1) / threads); }

}  // namespace herd::cuda
