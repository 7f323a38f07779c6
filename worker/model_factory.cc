#include "worker/model_factory.h"

#include <cstdlib>
#include <string>

#if HERD_HAVE_CUDA_MODEL
#include "model/cuda/staged_model.h"
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

StatusOr<std::unique_ptr<cuda::DeviceTrainer>> CreateDeviceTrainer(const config::JobConfig& config, int local_rank) {
  if (config.device().kind() == config::DeviceConfig::CPU) return std::unique_ptr<cuda::DeviceTrainer>();
#if HERD_HAVE_CUDA_MODEL
  const int devices = CudaDeviceCount();
  if (devices == 0) {
    return Status::FailedPrecondition(
        "device.kind is CUDA but this process sees no CUDA device (driver, "
        "CUDA_VISIBLE_DEVICES?)");
  }
  cuda::DeviceTrainer::Options o;
  o.shape = LlamaShape::FromConfig(config.model());
  o.batch = config.train().batch_size();
  o.seq_len = config.train().seq_len();
  o.bf16 = config.device().dtype() == config::DeviceConfig::BF16;
  o.optimizer = config.optimizer();
  o.total_steps = config.train().steps();
  o.device = local_rank % devices;
  return cuda::DeviceTrainer::Create(o);
#else
  (void)local_rank;
  return Status::InvalidArgument(
      "device.kind is CUDA but this herd was built without CUDA (no toolkit was found at "
      "configure time)");
#endif
}

StatusOr<std::unique_ptr<Model>> CreateModel(const config::JobConfig& config, int max_batch, int max_seq_len,
                                             int local_rank) {
  const LlamaShape shape = LlamaShape::FromConfig(config.model());
  if (config.device().kind() == config::DeviceConfig::CPU) return NewCpuModel(shape, max_batch, max_seq_len);
#if HERD_HAVE_CUDA_MODEL
  const int devices = CudaDeviceCount();
  if (devices == 0) {
    return Status::FailedPrecondition(
        "device.kind is CUDA but this process sees no CUDA device (driver, "
        "CUDA_VISIBLE_DEVICES?)");
  }
  return cuda::NewStagedCudaModel(shape, max_batch, max_seq_len, config.device().dtype(), local_rank % devices);
#else
  (void)local_rank;
  return Status::InvalidArgument(
      "device.kind is CUDA but this herd was built without CUDA (no toolkit was found at "
      "configure time)");
#endif
}

}  // namespace herd
