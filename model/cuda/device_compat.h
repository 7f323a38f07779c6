// What every CUDA source of herd includes instead of the CUDA headers: the
// real ones under nvcc, the CPU emulation (emulation/device_emulation.h)
// when the same sources are compiled for it (HERD_CUDA_EMULATION). Kernels
// are launched with HERD_LAUNCH(kernel, grid, block, shared_bytes, stream,
// args...) and name their dynamic shared memory with HERD_DYNAMIC_SHARED, the
// two spellings that differ; a kernel template whose arguments hold commas
// is launched through a pointer (`auto* k = &Kernel<T, 64>;`).
#pragma once

#if defined(HERD_CUDA_EMULATION)
#include "model/cuda/emulation/device_emulation.h"
#define HERD_UNROLL
#define HERD_UNROLL_BY(n)
#else
// Loops over register fragments must be unrolled to stay in registers.
#define HERD_UNROLL _Pragma("unroll")
#define HERD_UNROLL_BY_(text) _Pragma(#text)
#define HERD_UNROLL_BY(n) HERD_UNROLL_BY_(unroll n)
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#define HERD_LAUNCH(kernel, grid, block, smem, stream, ...) kernel<<<(grid), (block), (smem), (stream)>>>(__VA_ARGS__)
#define HERD_DYNAMIC_SHARED(T, name)                          \
  extern __shared__ __align__(128) unsigned char name##_raw[]; \
  T* name = reinterpret_cast<T*>(name##_raw)
#endif
