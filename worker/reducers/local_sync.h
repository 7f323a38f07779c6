// The one-process strategy on the CPU (see worker/reducers/sync_strategy.h):
// nothing to exchange, AdamW over the summed micro-batch gradients of the
// whole flat space; its master weights are the loop's weights (attached),
// stepped in place. One process on a GPU is DeviceResidentSync's
// (worker/reducers/device_resident_sync.h).
#pragma once

#include <memory>

#include "model/optim/optimizer_shard.h"
#include "worker/reducers/sync_strategy.h"

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

}  // namespace herd
