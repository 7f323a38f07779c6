// The model a job's config asks for (device.kind, device.dtype): the CPU
// model, or a CUDA one where this build has CUDA and the process sees a
// device. Workers on one machine share its GPUs round-robin by local rank.
#pragma once

#include <memory>
#include <vector>

#include "common/status.h"
#include "model/model.h"
#include "model/stage_model.h"
#include "proto/herd.pb.h"
#include "sharding/job_options.h"
#include "worker/cuda/device_trainer.h"

namespace herd {

// Sized for `job`'s train.batch_size x seq_len, keeping what it says.
StatusOr<std::unique_ptr<Model>> CreateModel(const config::JobConfig& config, const JobOptions& job, int local_rank);

// A CUDA worker's device, made current (NCCL's communicators are made on
// the current device, before the model): local rank modulo the devices;
// one line when there is none, or no CUDA in this build.
StatusOr<int> UseCudaDevice(int local_rank);

// A tensor-parallel rank's CUDA model: `slice` its slices' shape
// (sharding/tensor_slices.h), `group` the group's sums on the device.
StatusOr<std::unique_ptr<Model>> CreateTensorParallelCudaModel(const config::JobConfig& config, const JobOptions& job,
                                                               int local_rank, const LlamaShape& slice,
                                                               DeviceTensorGroup group);

// A context-parallel rank's CUDA model: `group` its gathers on the device,
// `host` the same group over host memory (the loss's mean, a sampled row).
StatusOr<std::unique_ptr<Model>> CreateContextParallelCudaModel(const config::JobConfig& config, const JobOptions& job,
                                                                int local_rank, DeviceContextGroup group,
                                                                ContextGroup<float> host);
// A context-parallel CUDA rank's gathers staged through `host`'s.
DeviceContextGroup StagedContextGroup(const ContextGroup<float>& host);

// A pipeline stage's CUDA model over `layers` (`shape` the model's, or a
// tensor-parallel rank's slices' with `group`), `slots` micro-batches in
// flight, its backward split for zero bubble with `split_backward`.
StatusOr<std::unique_ptr<StageModel>> CreateCudaStageModel(const config::JobConfig& config, const JobOptions& job,
                                                           int local_rank, const LlamaShape& shape, LayerRange layers,
                                                           int slots, bool split_backward, DeviceTensorGroup group);

// A tensor-parallel CUDA rank's group whose sums (gathers and
// reduce-scatters) are `host`'s (a ring over host memory), each staged
// through the host: for groups without NCCL.
DeviceTensorGroup StagedTensorGroup(const TensorGroup<float>& host);

// The single-process trainer's GPU engine for device.kind CUDA: weights,
// AdamW state and gradients resident on the device (null for CPU jobs).
// A worker's part of the device-resident step in all-reduce mode
// (cuda::DeviceTrainer::Options' fields of the same names); the default
// is one process's: everything.
struct DevicePart {
  std::vector<ParamRange> owned, counted;
  int replicas = 1;
  bool gathered = false;
};
StatusOr<std::unique_ptr<cuda::DeviceTrainer>> CreateDeviceTrainer(const config::JobConfig& config,
                                                                   const JobOptions& job, int local_rank,
                                                                   const DevicePart& part = {});

// The local rank for device selection: LOCAL_RANK (torchrun) or
// SLURM_LOCALID when set, else the global rank (one machine).
int LocalRank(int rank);

// Whether this build can run CUDA workers, and how many devices this
// process sees (0 without CUDA in the build, a driver or a device).
bool BuiltWithCuda();
int CudaDeviceCount();

}  // namespace herd
