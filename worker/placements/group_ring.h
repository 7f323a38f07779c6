// The collectives a model-parallel group's model runs inside its passes
// (worker/placements/model_group_steps.h uses them), over
// a ring of the group's workers.
#pragma once

#include <functional>

#include "common/partition.h"
#include "common/status.h"
#include "model/llama_config.h"
#include "sharding/tensor_slices.h"
#include "transport/collectives.h"
#include "worker/reducers/sync_strategy.h"

namespace herd {

// A model-parallel group's collectives for a model's passes over `ring`
// (model/llama_config.h): a tensor-parallel group's sums, gathers and
// reduce-scatters (TensorGroup), a context-parallel group's gathers and
// reduce-scatters (ContextGroup). A failure (a peer gone) is kept and the
// collectives after it are skipped, so a pass runs to its end and the
// step fails with the line (the sync strategy asks for failure()).
class GroupRing {
 public:
  explicit GroupRing(transport::Collectives* ring) : ring_(ring) {}
  // The group's sums for `slices`' rank; with sequence parallelism its
  // gathers and reduce-scatters too.
  TensorGroup<float> Group(const TensorSlices& slices, bool sequence_parallel);
  // The same ring as a context-parallel group's gathers (ContextGroup).
  ContextGroup<float> Context(int ranks, int rank);
  // data[0, n) summed over the group outside the passes (a failure kept as
  // in them, and returned).
  Status Sum(float* data, int64_t n);
  const Status& failure() const { return failure_; }
  // Seconds the sums blocked the passes since the last call (the step's
  // time waiting on the network, with the strategy's own).
  double TakeWaitSeconds() { return wait_.Take(); }

 private:
  // The group's gathers and reduce-scatters over the ring, each a span
  // named `span_name` in the trace.
  std::function<void(float*, const Partition&)> Gathers(const char* span_name);
  std::function<void(float*, const Partition&)> ReduceScatters(const char* span_name);

  transport::Collectives* const ring_;
  Status failure_;  // the first failed sum
  WaitClock wait_;
};

}  // namespace herd
