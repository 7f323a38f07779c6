// Failing CUDA and cuBLASLt calls stop the process with one line naming
// the call, where it was made and the library's own words.
#pragma once

#include <cublasLt.h>
#include <glog/logging.h>

#include "model/cuda/device_compat.h"

#define HERD_CUDA_CHECK(call)                                                      \
  do {                                                                             \
    const cudaError_t herd_cuda_error = (call);                                    \
    LOG_IF(FATAL, herd_cuda_error != cudaSuccess)                                  \
        << "CUDA call failed: " #call ": " << cudaGetErrorString(herd_cuda_error); \
  } while (0)

#define HERD_CUBLAS_CHECK(call)                                                                \
  do {                                                                                         \
    const cublasStatus_t herd_cublas_status = (call);                                          \
    LOG_IF(FATAL, herd_cublas_status != CUBLAS_STATUS_SUCCESS)                                 \
        << "cuBLASLt call failed: " #call ": " << cublasLtGetStatusString(herd_cublas_status); \
  } while (0)

// After a kernel launch: launch errors (bad configuration) surface here.
#define HERD_CUDA_CHECK_LAUNCH() HERD_CUDA_CHECK(cudaGetLastError())
