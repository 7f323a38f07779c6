// A CPU stand-in for the CUDA device, so that herd's kernels and the host
// code that drives them run (slowly, exactly) on machines without a GPU.
//
// What it promises: a kernel launched through HERD_LAUNCH runs every thread
// of every block as a fiber on the calling thread, block after block, with
// __syncthreads, __syncwarp and warp shuffles honoured (a thread that waits
// lets the others run until all have arrived); "device" memory is host
// memory filled with 0xff bytes (NaN as floats) on allocation, so reading
// what no kernel wrote shows up as NaN; streams and events are ordered
// trivially because every call completes before it returns. The CUDA
// runtime and cuBLASLt functions herd calls are defined by the emulation
// library with the real headers' signatures, so host code compiles
// unchanged against either.
//
// Tensor-core instructions (model/cuda/tensor_core.cuh) exchange the
// warp's registers through WarpAllGather and follow PTX's fragment layouts,
// so a kernel that misplaces a fragment element fails here too.
//
// What it does not model: concurrency between streams, the memory model
// (races between threads of a block that a real GPU would expose), timing.
// Tests built on it check the arithmetic and the indexing; only a real GPU
// checks the rest.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>

namespace herd_emu {

struct ThreadCoordinates {
  uint3 thread_idx{0, 0, 0}, block_idx{0, 0, 0};
  dim3 block_dim, grid_dim;
};
extern thread_local ThreadCoordinates coords;

// Runs body() once per thread of grid x block; returns once all are done.
void LaunchKernel(dim3 grid, dim3 block, size_t dynamic_shared_bytes, const std::function<void()>& body);
void SyncThreads();
void SyncWarp();
// The value `v` of lane `src_lane` of this warp (all live lanes must call).
uint64_t WarpExchange(uint64_t v, int src_lane);
// Every lane's `bytes` (at most kGatherBytes) at `mine`, lane by lane, into
// `all` (32 * bytes); all 32 lanes of the warp must call (tensor-core
// instructions exchange their operands this way).
constexpr size_t kGatherBytes = 32;
void WarpAllGather(const void* mine, size_t bytes, void* all);
void* DynamicShared();

template <typename T>
T Shuffle(T v, int src_lane) {
  static_assert(sizeof(T) <= sizeof(uint64_t));
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  bits = WarpExchange(bits, src_lane);
  T out;
  std::memcpy(&out, &bits, sizeof(T));
  return out;
}
inline int LaneId() {
  const ThreadCoordinates& c = coords;
  const unsigned linear = c.thread_idx.x + c.block_dim.x * (c.thread_idx.y + c.block_dim.y * c.thread_idx.z);
  return static_cast<int>(linear % 32);
}

}  // namespace herd_emu

// The CUDA keywords and built-ins the kernels use, for a host compiler.
#undef __global__
#undef __device__
#undef __host__
#undef __shared__
#undef __launch_bounds__
#undef __forceinline__
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
// Blocks run one after another on one host thread, so a per-thread static
// is exactly one block's shared memory.
#define __shared__ static thread_local
#define threadIdx (::herd_emu::coords.thread_idx)
#define blockIdx (::herd_emu::coords.block_idx)
#define blockDim (::herd_emu::coords.block_dim)
#define gridDim (::herd_emu::coords.grid_dim)

inline void __syncthreads() { ::herd_emu::SyncThreads(); }
inline void __syncwarp(unsigned = 0xffffffffu) { ::herd_emu::SyncWarp(); }
template <typename T>
T __shfl_xor_sync(unsigned, T v, int lane_mask, int width = 32) {
  const int lane = ::herd_emu::LaneId();
  return ::herd_emu::Shuffle(v, (lane & ~(width - 1)) | ((lane ^ lane_mask) & (width - 1)));
}
template <typename T>
T __shfl_sync(unsigned, T v, int src, int width = 32) {
  const int lane = ::herd_emu::LaneId();
  return ::herd_emu::Shuffle(v, (lane & ~(width - 1)) | (src & (width - 1)));
}
template <typename T>
T __ldg(const T* p) {
  return *p;
}
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __fdividef(float a, float b) { return a / b; }

#define HERD_LAUNCH(kernel, grid, block, smem, stream, ...) \
  ((void)(stream), ::herd_emu::LaunchKernel((grid), (block), (smem), [&] { kernel(__VA_ARGS__); }))
#define HERD_DYNAMIC_SHARED(T, name) T* name = static_cast<T*>(::herd_emu::DynamicShared())
