// How a distributed worker turns its gradients into the next weights: the
// one thing that differs between parameter-server and all-reduce mode. The
// training loop (worker/distributed_worker.cc) drives it through one step:
//
//   BeginStep(grads, t); FinalFrom(x) as backward finishes gradients at
//   offsets >= x (each ready bucket leaves at once); FinishStep(loss)
//   waits for them and, where the optimizer runs on the worker, steps it;
//   IssueWeights(weights, t+1) starts bringing version t+1 into `weights`;
//   WaitUpTo(end) as the next forward reaches each layer; FinishWeights()
//   before anything else reads the weights or the step's report.
#pragma once

#include <cstdint>
#include <string>

#include "common/clock.h"
#include "common/status.h"
#include "sharding/shard_plan.h"

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

class GradientExchange {
 public:
  virtual ~GradientExchange() = default;

  virtual void BeginStep(const float* grads, uint64_t step) = 0;
  virtual void FinalFrom(int64_t offset) = 0;
  // `loss`: this worker's mean loss for the step.
  virtual Status FinishStep(double loss) = 0;

  virtual void IssueWeights(float* weights, uint64_t version) = 0;
  virtual void WaitUpTo(int64_t end) = 0;
  virtual Status FinishWeights() = 0;
  // The step that produced the current weights: global norm, lr, mean loss.
  virtual const StepReport& report() const = 0;

  // Seconds blocked on communication since the last call.
  virtual double TakeWaitSeconds() = 0;

  // Checkpoint of step `step` (after FinishWeights): writes this worker's
  // optimizer parts, if it holds any, into step_dir. `shard_files()` is how
  // many shard_*.bin the workers write in all (0 in PS mode: the servers
  // write them and server 0 commits; otherwise worker 0 commits).
  virtual Status WriteCheckpointParts(const std::string& step_dir) = 0;
  virtual int shard_files() const = 0;
};

}  // namespace herd
