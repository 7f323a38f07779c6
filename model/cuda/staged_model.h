// A Model (model/model.h) computed on a CUDA device: CudaLlamaModel behind
// host-memory weights and gradients.
//
// Weights: as the device model reaches each layer, the caller's need() is
// asked first (a worker waits there for its pulls), then the layer's range
// is copied host -> device on a copy stream that the compute stream waits
// on (and converted to bf16 on the device in bf16 mode). Gradients: as
// backward finishes a layer, its range is copied device -> page-locked
// staging on the copy stream; once all kernels are enqueued the host takes
// the ranges in order as their copies complete, adds them to the caller's
// buffer and calls final_from(), while the device computes the rest. The
// caller's buffers are page-locked in place (cudaHostRegister) on first
// use, so the copies are DMA transfers without an extra host copy.
//
// Debian's UCX has no CUDA support, so this host staging is the path for
// parameter-server mode; with a CUDA-aware UCX the device buffers could be
// handed to UCX directly (not done: UCX_MEMTYPE detection is future work).
#pragma once

#include <memory>

#include "common/status.h"
#include "model/model.h"
#include "proto/herd.pb.h"

namespace herd::cuda {

// Number of CUDA devices this process sees (0 without a driver or device).
int DeviceCount();

// A model on device `device` (an index < DeviceCount()) computing in
// `dtype`; an error names the device problem or the unsupported shape.
StatusOr<std::unique_ptr<Model>> NewStagedCudaModel(const LlamaShape& shape, int max_batch, int max_seq_len,
                                                    config::DeviceConfig::DType dtype, int device);

}  // namespace herd::cuda
