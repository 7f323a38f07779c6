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
// Micro-batches of one step accumulate in device memory; the sum is staged
// out once, with the step's last micro-batch.
//
// Debian's UCX has no CUDA support, so this host staging is the path for
// parameter-server mode; with a CUDA-aware UCX the device buffers could be
// handed to UCX directly (not done: UCX_MEMTYPE detection is future work).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "common/status.h"
#include "model/cuda/device_compat.h"
#include "model/model.h"

namespace herd::cuda {

// Reduces device gradients [begin, end) across workers (e.g. NCCL) once
// `ready` (an event on the compute stream) has happened; returns an event
// after which the reduced range may be copied out.
using GradientReducer = std::function<cudaEvent_t(float* device_grads, int64_t begin, int64_t end, cudaEvent_t ready)>;

// A CUDA model's interface beyond Model: its gradients may be reduced on
// the device before they are copied out (AttachGradientReducer).
class CudaModelBase : public Model {
 public:
  virtual void SetGradientReducer(GradientReducer reducer) = 0;
};

// From now on, each range of the step's summed gradients is reduced on the
// device before it is copied to the host, so the host receives the
// reduced gradients (all-reduce mode over NCCL: ZeRO-Offload's layout,
// with the optimizer on the host). `model` must be a CUDA model (staged, or
// streamed: each unit is reduced as it is shipped out).
Status AttachGradientReducer(Model& model, GradientReducer reducer);

// Number of CUDA devices this process sees (0 without a driver or device).
int DeviceCount();

// The current device's memory in use, by every process (cudaMemGetInfo).
int64_t UsedDeviceBytes();

// For the CUDA models' factories: an M<__nv_bfloat16> (bf16) or M<float>
// made from `args`, told (set_allocated) the device memory its making took.
template <template <typename> class M, typename... Args>
std::unique_ptr<Model> MakeCudaModel(bool bf16, const Args&... args) {
  const int64_t before = UsedDeviceBytes();
  auto make = [&](auto zero) -> std::unique_ptr<Model> {
    auto model = std::make_unique<M<decltype(zero)>>(args...);
    model->set_allocated(UsedDeviceBytes() - before);
    return model;
  };
  return bf16 ? make(__nv_bfloat16{}) : make(float{});
}

// Makes `device` current and returns its free memory in bytes.
int64_t DeviceFreeBytes(int device);

// Checks that `device` can run the shape with `needed_bytes` free (device
// present, cuBLASLt loadable, attention kernels for the head dimension,
// memory), makes it current, and names it ("cuda:0 NVIDIA H100 ..., bf16").
StatusOr<std::string> PrepareDevice(const LlamaShape& shape, int device, bool bf16, int64_t needed_bytes);

// A model on device `device` (an index < DeviceCount()) computing in bf16
// or fp32, keeping what `recompute` says; with `group`, a tensor-parallel
// rank's (`shape` its slice's: CudaLlamaModel's group), whose LastLogits
// are the whole vocabulary's. An error names the device problem or the
// unsupported shape.
//
// With `context`, a context-parallel rank's (CudaLlamaModel's context):
// given whole sequences it computes its chunks, returns the group's mean
// loss (`host_context`: the same group over host memory, whose gather
// gives every rank the same bits), pads a length its chunks do not divide
// (a prompt being sampled) at the end, and gathers a sampled row from the
// rank that holds it.
StatusOr<std::unique_ptr<Model>> NewStagedCudaModel(const LlamaShape& shape, int max_batch, int max_seq_len, bool bf16,
                                                    int device, Recompute recompute = Recompute::kNone,
                                                    DeviceTensorGroup group = {}, DeviceContextGroup context = {},
                                                    ContextGroup<float> host_context = {});

// A DeviceTensorGroup whose sums (and with sequence parallelism gathers
// and reduce-scatters) are `host`'s over host memory (a ring's), each
// staged: the device buffer copied out (fp32, a bf16 buffer converted),
// `host`'s operation, copied back, the stream waited for on each side.
// For groups without NCCL.
DeviceTensorGroup StagedGroup(const TensorGroup<float>& host);
DeviceContextGroup StagedGroup(const ContextGroup<float>& host);

}  // namespace herd::cuda
