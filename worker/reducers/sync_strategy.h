// How a worker's gradients become the next weights: the one thing that
// differs between the modes. worker/step_loop.cc drives every strategy
// through the same calls, step t:
//
//   BeginStep(grads, {t, share, drawn_to}); FinalFrom(x) as backward
//   finishes the gradients at offsets >= x (each bucket that is ready may
//   leave at once); FinishStep(loss) waits for them and, where the
//   optimizer runs on this worker, steps it; IssueWeights(weights, t+1)
//   starts bringing the weights of version t+1 into `weights`; WaitUpTo(
//   end) as the next forward reaches each layer; FinishWeights() before
//   anything else reads the weights or the step's report.
//
// Push verbs (BeginStep, FinalFrom, FinishStep) and pull verbs
// (IssueWeights, WaitUpTo, FinishWeights); the model reaches them through
// the worker's WeightHome (worker/reducers/weight_home.h), never directly.
//
// The strategies (docs/design.md lists them): one process on the CPU
// (worker/reducers/local_sync.h), the whole step on each worker's GPU (worker/
// reducers/device_resident_sync.h: one process, or DDP and ZeRO-1/2 over
// NCCL), parameter servers (worker/reducers/parameter_server_sync.h: whole
// or streamed weights), collectives (worker/reducers/collective_sync.h:
// DDP and ZeRO-1/2/3 over the UCX ring, or with gradients reduced by NCCL
// before the host's optimizer, of the whole model, a pipeline stage's
// ranges or a tensor-parallel rank's slices).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "transport/ps_protocol.h"

namespace herd {

// Time blocked on communication: the "waiting on the network" figures.
class WaitClock {
 public:
  template <typename F>
  Status Timed(F&& wait) {
    Stopwatch sw;
    Status st = wait();
    seconds_ += sw.Seconds();
    return st;
  }
  // Seconds since the last call.
  double Take() {
    const double s = seconds_;
    seconds_ = 0;
    return s;
  }

 private:
  double seconds_ = 0;
};

// What a BeginStep..FinishStep's gradients are: step `step`'s (0-based)
// share of the global batch of rank `share`. Each worker computes its own
// rank's share; in an elastic parameter-server job a worker also computes
// the shares of lost ones. `drawn_to` is the data position after the
// step's draw, which a parameter-server worker reports with the share's
// loss (transport/ps_protocol.h's ShareLoss): where a worker that joins
// later starts, and what server 0 writes as the workers' data files of an
// elastic job's checkpoints.
struct StepShare {
  uint64_t step = 0;
  int share = 0;
  DataPosition drawn_to;
};

class SyncStrategy {
 public:
  virtual ~SyncStrategy() = default;

  // `grads` (the whole flat space) may be reduced in place; it stays valid
  // until FinishStep returns.
  virtual void BeginStep(float* grads, const StepShare& share) = 0;
  virtual void FinalFrom(int64_t offset) = 0;
  // `loss`: this worker's mean loss for the step.
  virtual Status FinishStep(double loss) = 0;

  virtual void IssueWeights(float* weights, uint64_t version) = 0;
  virtual void WaitUpTo(int64_t end) = 0;

  virtual Status FinishWeights() = 0;
  // FinishWeights that gives up (false: not all in yet; call it again) as
  // soon as `interrupted` returns true, checked as transfers complete and
  // after each Wake(): an elastic job's worker stops waiting to take over a
  // lost worker's share.
  virtual StatusOr<bool> FinishWeightsUnless(const std::function<bool()>& /*interrupted*/) {
    HERD_RETURN_IF_ERROR(FinishWeights());
    return true;
  }
  virtual void Wake() {}
  // The step that produced the current weights: global norm, lr, mean loss.
  virtual const StepReport& report() const = 0;

  // Seconds blocked on communication since the last call.
  virtual double TakeWaitSeconds() = 0;

  // Checkpoint of step `step` (after FinishWeights): writes this worker's
  // optimizer parts, if it holds any, into step_dir. `shard_files()` is how
  // many shard_*.bin the workers write in all (0 in parameter-server mode:
  // the servers write them and server 0 commits; otherwise worker 0
  // commits).
  virtual Status WriteCheckpointParts(const std::string& step_dir) = 0;
  virtual int shard_files() const = 0;
};

// A placement's part of a step around a reducer's strategy (worker/
// model_group_steps.h's ModelGroupSteps): what the worker drives and
// the model's hooks reach, so a reducer's factory makes its home over it.
using AroundReducer = std::function<std::unique_ptr<SyncStrategy>(std::unique_ptr<SyncStrategy>)>;
inline std::unique_ptr<SyncStrategy> Around(const AroundReducer& around, std::unique_ptr<SyncStrategy> reducer) {
  return around ? around(std::move(reducer)) : std::move(reducer);
}

}  // namespace herd
