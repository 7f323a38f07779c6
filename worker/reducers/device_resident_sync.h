// The whole step on each worker's GPU (cuda::DeviceTrainer): forward,
// backward and AdamW with the weights, gradients and moments resident
// there, as llm.c keeps them on one GPU and PyTorch DDP, FSDP2 and
// DeepSpeed's ZeRO across several.
//
//   One process: the whole space's state on the device.
//   All-reduce mode over NCCL (DeviceExchange, worker/reducers/
//     nccl_gradients.h): each range of the step's gradients is
//     all-reduced (DDP) or reduce-scattered to its owners (ZeRO;
//     hybrid sharding reduces each owned piece with the other groups too)
//     on the device as backward finishes it; each worker adds the squares
//     of its counted slices, and one all-reduce over the UCX ring of every
//     worker makes the global norm and the mean loss; the owners step
//     their slices on the device and all-gather them into every worker's
//     compute weights (ZeRO-3: unit by unit as the passes reach them).
//
// The host's OptimizerSlices make the step's numbers (learning rate,
// clipping coefficient, spike verdict), as on every path, and keep the
// step count and the spike guard's state; they hold no weights or moments
// once the device has them (loaded once, brought back for a checkpoint).
//
// DDP counts the slices ZeRO would own in the norm, so DDP and ZeRO take
// the same steps wherever their reductions add alike (the emulated NCCL
// always; NCCL's all-reduce and its rooted reduces add in different
// orders, so on GPUs within rounding).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model/model.h"
#include "model/optim/optimizer_shard.h"
#include "transport/collectives.h"
#include "worker/cuda/device_trainer.h"
#include "worker/reducers/sync_strategy.h"
#include "worker/share_compute.h"

namespace herd {

struct DeviceResidentOptions {
  // The ring of every worker, over which the squares and the losses are
  // added (null: one process).
  transport::Collectives* everyone = nullptr;
  // Whether this worker's squares enter the norm (hybrid: the first
  // group's only, every group holding the same sums).
  bool counts_in_norm = true;
  // The shard file this worker writes of a checkpoint (-1: none, as DDP's
  // other workers and hybrid's other groups), and how many the workers
  // write in all.
  int shard_file = 0, shard_files = 1;
};

class DeviceResidentSync : public SyncStrategy {
 public:
  // Loads the state onto the device: `weights`, the whole flat space
  // (its compute weights), and the optimizer's slices (the device's owned
  // ranges), whose arrays are then let go. `exchange` (null: one process)
  // is the device's way to the other workers.
  DeviceResidentSync(std::unique_ptr<cuda::DeviceExchange> exchange, std::unique_ptr<cuda::DeviceTrainer> device,
                     std::unique_ptr<OptimizerSlices> optimizer, const float* weights,
                     const DeviceResidentOptions& options);
  ~DeviceResidentSync() override;

  // The device's current weights, for evaluation and sampling (its
  // Forward ignores the weights it is given).
  Model& evaluator() { return device_->evaluator(); }

  // Forward, backward, the reductions and the optimizer's update of the
  // step's micro-batches on the device; this worker's mean loss.
  StatusOr<double> ComputeStep(const std::vector<const int32_t*>& inputs, const std::vector<const int32_t*>& targets);

  // The step is whole by the time ComputeStep returns: nothing to push or
  // pull.
  void BeginStep(float*, const StepShare&) override {}
  void FinalFrom(int64_t) override {}
  Status FinishStep(double) override { return Status::OK(); }
  void IssueWeights(float*, uint64_t) override {}
  void WaitUpTo(int64_t) override {}
  Status FinishWeights() override { return Status::OK(); }
  const StepReport& report() const override { return report_; }
  double TakeWaitSeconds() override { return wait_.Take(); }
  // Brings the owned state back from the device first.
  Status WriteCheckpointParts(const std::string& step_dir) override;
  int shard_files() const override { return options_.shard_files; }

 private:
  // The exchange goes after the device (whose stream it orders against).
  const std::unique_ptr<cuda::DeviceExchange> exchange_;
  const std::unique_ptr<cuda::DeviceTrainer> device_;
  const std::unique_ptr<OptimizerSlices> optimizer_;
  const DeviceResidentOptions options_;
  StepReport report_;
  WaitClock wait_;
};

// The step's ShareCompute (worker/share_compute.h) on `sync`'s device:
// forward, backward and update at once (ComputeStep), after the step before
// has ended (its evaluation reads the device's weights, which the step
// replaces).
std::unique_ptr<ShareCompute> DeviceResidentSteps(DeviceResidentSync& sync);

}  // namespace herd
