// The one-process strategies (see worker/reducers/sync_strategy.h): nothing to
// exchange, the optimizer over the whole flat space.
//
//   Local: AdamW on the CPU over the summed micro-batch gradients; its
//     master weights are the loop's weights (attached), stepped in place.
//   DeviceResident: the whole step on one GPU (cuda::DeviceTrainer: fp32
//     master weights, AdamW state and gradients resident there, as llm.c
//     keeps them); the OptimizerShard holds the state on the host only to
//     load it and to checkpoint it.
#pragma once

#include <memory>

#include "model/model.h"
#include "model/optim/optimizer_shard.h"
#include "worker/cuda/device_trainer.h"
#include "worker/reducers/sync_strategy.h"
#include "worker/share_compute.h"

namespace herd {

// `optimizer` covers the whole space; its weights move into `weights`.
std::unique_ptr<SyncStrategy> CreateLocalSync(std::unique_ptr<OptimizerShard> optimizer, float* weights);

// The strategies of one process: nothing to exchange, the weights are the
// optimizer's own (pulled and pushed nowhere).
class OneProcessSync : public SyncStrategy {
 public:
  void BeginStep(float*, const StepShare&) override {}
  void FinalFrom(int64_t) override {}
  void IssueWeights(float*, uint64_t) override {}
  void WaitUpTo(int64_t) override {}
  Status FinishWeights() override { return Status::OK(); }
  double TakeWaitSeconds() override { return 0; }
  int shard_files() const override { return 1; }
};

class DeviceResidentSync : public OneProcessSync {
 public:
  // Loads the optimizer's state (the whole space) onto the device; its
  // host copy of the weights moves into `weights`.
  DeviceResidentSync(std::unique_ptr<cuda::DeviceTrainer> device, std::unique_ptr<OptimizerShard> optimizer,
                     float* weights);

  // The device's current weights, for evaluation and sampling (its
  // Forward ignores the weights it is given).
  Model& evaluator() { return device_->evaluator(); }

  // Forward, backward and the optimizer's update of the step's
  // micro-batches on the device; the mean loss.
  StatusOr<double> ComputeStep(const std::vector<const int32_t*>& inputs, const std::vector<const int32_t*>& targets,
                               uint64_t step);

  Status FinishStep(double) override { return Status::OK(); }
  const StepReport& report() const override { return report_; }
  // Brings the state back from the device first.
  Status WriteCheckpointParts(const std::string& step_dir) override;

 private:
  const std::unique_ptr<cuda::DeviceTrainer> device_;
  const std::unique_ptr<OptimizerShard> optimizer_;
  StepReport report_;
};

// The step's ShareCompute (worker/share_compute.h) on `sync`'s device:
// forward, backward and update at once (ComputeStep), after the step before
// has ended (its evaluation reads the device's weights, which the step
// replaces).
std::unique_ptr<ShareCompute> DeviceResidentSteps(DeviceResidentSync& sync);

}  // namespace herd
