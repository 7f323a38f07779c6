// How a worker computes one share of a step (its sequences of the global
// batch): the model's forward and backward passes over the share's
// micro-batches, or the whole step on a device that holds everything
// (worker/reducers/device_resident_sync.h). The gradients go to the
// SyncStrategy as backward finishes them; the weights are reached through
// the WeightHome (worker/reducers/weight_home.h).
//
//   MicroBatchPasses: each micro-batch's forward, then its backward.
//   LayerMajorPasses: every micro-batch through each unit at once
//     (Model::ForwardBackwardLayerMajor), so that a streamed unit is
//     brought in once a pass and its gradients are final (and pushed) as
//     the pass leaves it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "common/status.h"
#include "model/model.h"
#include "worker/reducers/sync_strategy.h"
#include "worker/reducers/weight_home.h"

namespace herd {

// Where the step before the one being computed ends: its weights all in,
// then its epilogue (progress, evaluation, checkpoint). Settle() runs that
// once, at the first point the computation allows: after the step's first
// forward, which overlaps the weights' arrival layer by layer, or before
// anything when nothing overlaps.
class StepBoundary {
 public:
  explicit StepBoundary(std::function<Status()> end_of_previous) : end_of_previous_(std::move(end_of_previous)) {}
  // A boundary already passed (a share computed again later in the step).
  static StepBoundary Passed() {
    StepBoundary b(nullptr);
    b.settled_ = true;
    return b;
  }

  Status Settle() {
    if (settled_) return Status::OK();
    settled_ = true;
    return end_of_previous_();
  }
  bool settled() const { return settled_; }

 private:
  std::function<Status()> end_of_previous_;
  bool settled_ = false;
};

// A share's micro-batches: B x T tokens and targets each, in order, and
// the data position after the step's draw.
struct ShareBatches {
  std::vector<const int32_t*> inputs, targets;
  DataPosition drawn_to;
};

class ShareCompute {
 public:
  virtual ~ShareCompute() = default;
  // Forward and backward of one share of step t (0-based), its gradients
  // handed to the SyncStrategy (BeginStep with the share, then FinalFrom
  // as they become final); settles `previous` on the way. The share's mean loss, which
  // the caller passes to FinishStep.
  virtual StatusOr<double> Compute(int64_t t, int share, const ShareBatches& batches, StepBoundary& previous) = 0;
};

struct PassOptions {
  Model* model = nullptr;
  WeightHome* home = nullptr;
  SyncStrategy* sync = nullptr;
  // The whole flat space: the weights passes read, the gradients they
  // accumulate.
  const float* weights = nullptr;
  float* grads = nullptr;
  int batch = 0, seq_len = 0;
  double loss_scale = 0;   // 1 / the global batch's tokens
};

std::unique_ptr<ShareCompute> MicroBatchPasses(const PassOptions& options);
// Needs model->layer_major_slots() >= the micro-batches of a share.
std::unique_ptr<ShareCompute> LayerMajorPasses(const PassOptions& options);

}  // namespace herd
