// All-reduce mode's strategy for a tensor-parallel worker
// (cluster.tensor_parallel; see worker/sync_strategy.h): the worker holds
// its rank's slices of the model packed (sharding/tensor_slices.h), and
// its weights, gradients and AdamW state are those of the packed space,
// so no worker holds a layer whole.
//
// A step: with sequence parallelism, the norms' gradients (each rank's
// rows' part) summed over the tensor-parallel group; with data-parallel
// replicas, the packed gradients all-reduced among the workers of the
// same tensor-parallel rank (DDP over the slice); the global norm from each rank's slices (the norms, which
// every rank holds alike, counted on rank 0 alone) and the losses added
// over all the workers by one all-reduce; AdamW on the packed space.
// The model's own sums over the tensor-parallel group (model/llama.h's
// TensorGroup) run inside its passes through TensorRing; a failure there
// is kept and returned by FinishStep.
//
// Checkpoints stay the flat space: the first replica's worker of each
// tensor-parallel rank writes its slices as pieces of shard file `rank`
// (the norms by rank 0), so the checkpoint resumes at any other grid, mode
// or worker count with the same global batch, and any checkpoint resumes
// here (each rank reads its slices' runs).
#pragma once

#include <memory>
#include <optional>

#include "common/status.h"
#include "model/checkpoint_load.h"
#include "model/llama.h"
#include "sharding/job_options.h"
#include "sharding/tensor_slices.h"
#include "transport/collectives.h"
#include "worker/sync_strategy.h"

namespace herd {

// The tensor-parallel group's sums for a model (TensorGroup::all_reduce)
// over `ring`, or a context-parallel group's gathers: a failure (a peer
// gone) is kept and the collectives after it are skipped, so a pass runs
// to its end and the step fails with the line (a context-parallel
// worker's, at the gradients' all-reduce, which the lost peer is in too).
class TensorRing {
 public:
  explicit TensorRing(transport::Collectives* ring) : ring_(ring) {}
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

struct TensorParallelSyncOptions {
  const JobOptions* job = nullptr;
  const ParamLayout* layout = nullptr;  // the model's flat space
  const TensorSlices* slices = nullptr;
  TensorRing* tensor_ring = nullptr;
  transport::Collectives* everyone = nullptr;  // the norm and the losses
  bool sequence_parallel = false;
  // This rank's data-parallel replicas (null: one replica).
  transport::Collectives* replicas = nullptr;
};

// Loads or initialises the packed `weights` (slices->layout().size()) and
// their optimizer state; `resume_from` continues this run.
StatusOr<std::unique_ptr<SyncStrategy>> CreateTensorParallelSync(const TensorParallelSyncOptions& options,
                                                                 float* weights,
                                                                 const std::optional<VerifiedCheckpoint>& resume_from);

}  // namespace herd
