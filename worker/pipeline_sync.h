// All-reduce mode's strategy for a pipeline stage's worker
// (cluster.pipeline_stages; see worker/sync_strategy.h): the worker holds
// and steps its own virtual stages' ranges of the flat space
// (sharding/pipeline_split.h) and nothing else, so the optimizer's state
// is partitioned among the stages as the layers are.
//
// A step: with data-parallel replicas of the pipeline, the stage's
// gradients all-reduced among the workers of that stage (DDP inside the
// stage, in the ring's order); the tied embedding's two parts of the gradient (the lookup's on
// the first stage, the head's on the last) are exchanged between those two
// workers and added head part first, the same on both, and both step the
// embedding alike (Megatron's word-embedding all-reduce); the global norm
// from each stage's partial squares (the embedding counted once, on the
// first stage, by the first replica), added with the losses over all the
// workers by one all-reduce; AdamW on this worker's ranges. Every stage reports the same
// step (the loss travels back with the gradients, worker/pipeline_passes.h).
//
// ZeRO-1 inside the stages (cluster.zero_stage 1 with replicas): each
// bucket of the stage's ranges (`plan`, cut at the stages' ends) is
// reduce-scattered among the stage's replicas rather than all-reduced,
// each replica steps its owned slice (OwnerParts: 1/R of the stage's
// AdamW state) and the slices are all-gathered back, so every replica
// holds the stage's weights whole, as DDP inside the stage does. A tied
// embedding's parts are exchanged after the reduce-scatter; every worker
// writes its slices to the checkpoint (shard file = its rank).
//
// The norm is summed stage by stage, not in one process's order, so a run
// with clipping or the spike guard is within rounding of one process; the
// update itself is bitwise (untied embeddings) when neither is on.
//
// Checkpoints: the first replica's worker of each stage writes its ranges
// as shard file `device` (pieces, model/checkpoint_format.h), so a pipeline's
// checkpoint resumes at any other pipeline depth, mode or worker count with
// the same global batch, and any checkpoint resumes here.
//
// Tensor parallelism inside the stages (`slices`): the worker's space is
// its rank's packed one (sharding/tensor_slices.h), the stage's ranges are
// of it, its replicas are those of the same stage and tensor rank, and the
// tied embedding's exchange is with the same tensor rank's other end. The
// norms, which every rank of a group holds alike, are counted in the global
// norm by tensor rank 0 alone, the loss added by the last stage's rank 0
// alone; the first replica's rank t of stage p writes its ranges' runs as
// pieces of the flat space, shard file p·T + t (the norms by t = 0); under
// ZeRO-1 each replica r its slices', shard file (p·T + t)·R + r.
#pragma once

#include <memory>
#include <optional>

#include "common/status.h"
#include "model/checkpoint_load.h"
#include "sharding/job_options.h"
#include "sharding/pipeline_schedule.h"
#include "sharding/pipeline_split.h"
#include "sharding/shard_plan.h"
#include "sharding/tensor_slices.h"
#include "transport/collectives.h"
#include "transport/pipeline_wire.h"
#include "worker/sync_strategy.h"

namespace herd {

struct PipelineSyncOptions {
  const JobOptions* job = nullptr;
  const ParamLayout* layout = nullptr;
  const PipelineSplit* split = nullptr;
  const PipelineSchedule* schedule = nullptr;
  int device = 0;  // this worker's place in the pipeline
  // All the workers: the norm and the losses.
  transport::Collectives* everyone = nullptr;
  // This stage's data-parallel replicas (null: one replica), among which
  // the stage's gradients are all-reduced, `gradient_wire` on the wire.
  transport::Collectives* stage_replicas = nullptr;
  transport::Wire gradient_wire = transport::Wire::kFloat32;
  // The tied embedding's exchange between the first and the last stage.
  transport::PipelineWire* wire = nullptr;
  transport::PeerId first_stage = 0, last_stage = 0;  // of this worker's replica
  // ZeRO-1 among the stage's replicas: the buckets of the whole space, cut
  // at the stages' ends (null: DDP inside the stage).
  const ShardPlan* zero_plan = nullptr;
  // Tensor parallelism: this worker's rank's slices (`layout` is then their
  // packed layout, and `zero_plan` of it) and the model's flat space.
  const TensorSlices* slices = nullptr;
  const ParamLayout* flat = nullptr;
};

// Loads or initialises this worker's ranges of `weights` (the whole flat
// space, or with `slices` the packed one) and their optimizer state;
// `resume_from` continues this run.
StatusOr<std::unique_ptr<SyncStrategy>> CreatePipelineSync(const PipelineSyncOptions& options, float* weights,
                                                           const std::optional<VerifiedCheckpoint>& resume_from);

}  // namespace herd
