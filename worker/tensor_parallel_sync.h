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
// TensorGroup) run inside its passes through a GroupRing; a failure there
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
#include <vector>

#include "common/status.h"
#include "model/checkpoint_load.h"
#include "model/llama.h"
#include "sharding/job_options.h"
#include "sharding/tensor_slices.h"
#include "transport/collectives.h"
#include "worker/group_ring.h"
#include "worker/sync_strategy.h"

namespace herd {

struct TensorParallelSyncOptions {
  const JobOptions* job = nullptr;
  const ParamLayout* layout = nullptr;  // the model's flat space
  const TensorSlices* slices = nullptr;
  GroupRing* tensor_ring = nullptr;
  // Tensor x context: the context-parallel group's gathers (their waits
  // and failures are the step's too).
  GroupRing* context_ring = nullptr;
  transport::Collectives* everyone = nullptr;  // the norm and the losses
  bool sequence_parallel = false;
  // This rank's data-parallel replicas (null: one replica), among which
  // the packed gradients are all-reduced, `gradient_wire` on the wire.
  transport::Collectives* replicas = nullptr;
  transport::Wire gradient_wire = transport::Wire::kFloat32;
  // The ranges of the packed space this worker holds (a pipeline stage's;
  // empty: all of it): sequence parallelism sums the norms' gradients of
  // these alone.
  std::vector<ParamRange> held;
};

// Loads or initialises the packed `weights` (slices->layout().size()) and
// their optimizer state; `resume_from` continues this run.
StatusOr<std::unique_ptr<SyncStrategy>> CreateTensorParallelSync(const TensorParallelSyncOptions& options,
                                                                 float* weights,
                                                                 const std::optional<VerifiedCheckpoint>& resume_from);

// A model-parallel placement's step over any reducer of its space: a
// tensor-parallel rank's packed one or a context rank's whole one
// (`reducer`: worker/parameter_server_sync.h's over the rank's part of the
// servers' space, sharding/tensor_slices.h's TensorParallelSpace, or
// worker/collective_sync.h's among the rank's replicas, ZeRO's stages
// included): with sequence parallelism each unit's norms' gradients are
// summed over the tensor group as backward finishes them, before the
// reducer takes them as final; a failure of the groups' collectives ends
// the step. Only `tensor_ring`, `context_ring` (either may be null),
// `slices`, `sequence_parallel` and `held` of the options are read.
std::unique_ptr<SyncStrategy> ModelGroupSteps(const TensorParallelSyncOptions& options,
                                              std::unique_ptr<SyncStrategy> reducer);

}  // namespace herd
