#include "worker/model_factory.h"

#include <cstdlib>
#include <string>

#include "common/config.h"

#if HERD_HAVE_CUDA_MODEL
#include "model/cuda/stage_model.h"
#include "model/cuda/staged_model.h"
#include "model/cuda/streamed_model.h"
#endif

namespace herd {

bool BuiltWithCuda() { return HERD_HAVE_CUDA_MODEL != 0; }

int CudaDeviceCount() {
#if HERD_HAVE_CUDA_MODEL
  return cuda::DeviceCount();
#else
  return 0;
#endif
}

int LocalRank(int rank) {
  for (const char* name : {"LOCAL_RANK", "SLURM_LOCALID"}) {
    const char* v = std::getenv(name);
    if (v != nullptr && *v != '\0') return std::atoi(v);
  }
  return rank;
}

namespace {

// The device a CUDA job's process uses: local rank modulo the devices it
// sees; one line when there is none, or no CUDA in this build.
StatusOr<int> PickDevice(int local_rank) {
  if (!BuiltWithCuda()) {
    return Status::InvalidArgument(
        "device.kind is CUDA but this herd was built without CUDA (no toolkit was found at configure time)");
  }
  const int devices = CudaDeviceCount();
  if (devices == 0) {
    return Status::FailedPrecondition(
        "device.kind is CUDA but this process sees no CUDA device (driver, CUDA_VISIBLE_DEVICES?)");
  }
  return local_rank % devices;
}

}  // namespace

StatusOr<int> UseCudaDevice(int local_rank) {
  HERD_ASSIGN_OR_RETURN(const int device, PickDevice(local_rank));
#if HERD_HAVE_CUDA_MODEL
  (void)cuda::DeviceFreeBytes(device);  // makes it current
#endif
  return device;
}

StatusOr<std::unique_ptr<Model>> CreateTensorParallelCudaModel(const config::JobConfig& config, const JobOptions& job,
                                                               int local_rank, const LlamaShape& slice,
                                                               DeviceTensorGroup group) {
  HERD_ASSIGN_OR_RETURN(const int device, PickDevice(local_rank));
#if HERD_HAVE_CUDA_MODEL
  const bool bf16 = config.device().dtype() == config::DeviceConfig::BF16;
  return cuda::NewStagedCudaModel(slice, job.batch, job.seq_len, bf16, device, job.recompute, std::move(group));
#else
  (void)device;
  (void)config;
  (void)job;
  (void)slice;
  (void)group;
  return std::unique_ptr<Model>();  // not reached: PickDevice refused
#endif
}

StatusOr<std::unique_ptr<StageModel>> CreateCudaStageModel(const config::JobConfig& config, const JobOptions& job,
                                                           int local_rank, const LlamaShape& shape, LayerRange layers,
                                                           int slots, bool split_backward, DeviceTensorGroup group) {
  HERD_ASSIGN_OR_RETURN(const int device, PickDevice(local_rank));
#if HERD_HAVE_CUDA_MODEL
  const bool bf16 = config.device().dtype() == config::DeviceConfig::BF16;
  return cuda::NewCudaStageModel(shape, job.batch, job.seq_len, bf16, device, job.recompute, layers, slots,
                                 split_backward, std::move(group));
#else
  (void)device;
  (void)config;
  (void)job;
  (void)shape;
  (void)layers;
  (void)slots;
  (void)split_backward;
  (void)group;
  return std::unique_ptr<StageModel>();  // not reached: PickDevice refused
#endif
}

StatusOr<std::unique_ptr<Model>> CreateContextParallelCudaModel(const config::JobConfig& config, const JobOptions& job,
                                                                int local_rank, DeviceContextGroup group,
                                                                ContextGroup<float> host) {
  HERD_ASSIGN_OR_RETURN(const int device, PickDevice(local_rank));
#if HERD_HAVE_CUDA_MODEL
  const bool bf16 = config.device().dtype() == config::DeviceConfig::BF16;
  return cuda::NewStagedCudaModel(job.shape, job.batch, job.seq_len, bf16, device, job.recompute, {},
                                  std::move(group), std::move(host));
#else
  (void)device;
  (void)config;
  (void)job;
  (void)group;
  (void)host;
  return std::unique_ptr<Model>();  // not reached: PickDevice refused
#endif
}

namespace {

// cuda::StagedGroup of a tensor or context group.
template <typename DeviceGroup, typename HostGroup>
DeviceGroup Staged(const HostGroup& host) {
#if HERD_HAVE_CUDA_MODEL
  return cuda::StagedGroup(host);
#else
  (void)host;
  return {};  // not reached: a build without CUDA makes no CUDA model
#endif
}

}  // namespace

DeviceContextGroup StagedContextGroup(const ContextGroup<float>& host) { return Staged<DeviceContextGroup>(host); }

DeviceTensorGroup StagedTensorGroup(const TensorGroup<float>& host) { return Staged<DeviceTensorGroup>(host); }

StatusOr<std::unique_ptr<cuda::DeviceTrainer>> CreateDeviceTrainer(const config::JobConfig& config,
                                                                   const JobOptions& job, int local_rank,
                                                                   const DevicePart& part) {
  if (config.device().kind() == config::DeviceConfig::CPU) return std::unique_ptr<cuda::DeviceTrainer>();
  HERD_ASSIGN_OR_RETURN(const int device, PickDevice(local_rank));
#if HERD_HAVE_CUDA_MODEL
  const bool bf16 = config.device().dtype() == config::DeviceConfig::BF16;
  cuda::DeviceTrainer::Options o = cuda::DeviceTrainer::Options::ForJob(job, bf16, device);
  o.owned = part.owned;
  o.counted = part.counted;
  o.replicas = part.replicas;
  o.gathered = part.gathered;
  o.accumulates = job.grad_accum > 1;
  return cuda::DeviceTrainer::Create(o);
#else
  (void)device;
  (void)part;
  return std::unique_ptr<cuda::DeviceTrainer>();  // not reached: PickDevice refused
#endif
}

StatusOr<std::unique_ptr<Model>> CreateModel(const config::JobConfig& config, const JobOptions& job, int local_rank) {
  if (!config.device().compute()) return NewNoComputeModel(job.shape, job.batch, job.seq_len);
  if (config.device().kind() == config::DeviceConfig::CPU) {
    return NewCpuModel(job.shape, job.batch, job.seq_len, job.recompute, job.micro_batch_slots);
  }
  HERD_ASSIGN_OR_RETURN(const int device, PickDevice(local_rank));
#if HERD_HAVE_CUDA_MODEL
  const bool bf16 = config.device().dtype() == config::DeviceConfig::BF16;
  if (WorkersHoldAWindow(config)) {
    return cuda::NewStreamedCudaModel(job.shape, job.batch, job.seq_len, bf16, device, job.recompute,
                                      job.grad_accum > 1);
  }
  return cuda::NewStagedCudaModel(job.shape, job.batch, job.seq_len, bf16, device, job.recompute);
#else
  (void)device;
  return std::unique_ptr<Model>();  // not reached: PickDevice refused
#endif
}

}  // namespace herd
