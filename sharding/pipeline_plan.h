// A job's pipeline (cluster.pipeline_stages > 1): its layers cut into
// virtual stages (sharding/pipeline_split.h), the schedule every device
// follows (sharding/pipeline_schedule.h) and the job's grid, which says
// where each worker sits (sharding/grid.h: a stage is a block of
// consecutive ranks, its replicas' tensor groups inside it). With tensor
// parallelism the split is of a rank's packed model
// (sharding/tensor_slices.h: its heads, intermediate columns and
// vocabulary divided by T), and the ranges are of its packed space.
#pragma once

#include "common/status.h"
#include "proto/herd.pb.h"
#include "sharding/grid.h"
#include "sharding/pipeline_schedule.h"
#include "sharding/pipeline_split.h"
#include "sharding/shard_plan.h"

namespace herd {

struct PipelinePlan {
  PipelineSplit split;
  PipelineSchedule schedule;
  Grid grid;  // the job's

  // From the config; errors in one line naming the fields (a split or a
  // schedule the model or the micro-batches cannot take), before any
  // process starts.
  static StatusOr<PipelinePlan> FromConfig(const config::JobConfig& config);

  int devices() const { return schedule.devices; }
  // The ranges of the flat space `device` computes and holds: its chunks'
  // (ascending) and, on the last device with tied embeddings, the
  // embedding's too (first).
  std::vector<ParamRange> RangesOf(int device, const ParamLayout& layout) const;
  // A tied embedding that two stages compute, the first and the last:
  // [0, its end) of `layout`; empty when none is.
  ParamRange TiedEmbedding(const ParamLayout& layout) const;
  // The worker ranks whose gradients of `range` (inside one stage's range
  // of `layout`, tensor rank `tensor_rank`'s packed one with tensor
  // parallelism) are summed: its stage's replicas and context ranks of
  // that tensor rank; a
  // tied embedding's, the first and the last stage's, first stage first.
  std::vector<int> ContributorsOf(ParamRange range, const ParamLayout& layout, int tensor_rank = 0) const;
  // Where buckets must be cut: between the stages, and at the end of a
  // tied embedding (which two stages push).
  std::vector<int64_t> BucketCuts(const ParamLayout& layout) const;
};

// Whether the job runs a pipeline (cluster.pipeline_stages > 1).
bool HasPipeline(const config::JobConfig& config);

// A parameter-server job's shard plan (every process computes it alike):
// the cluster's servers, strategy and buckets over the flat space, cut at a
// pipeline's stages; with tensor parallelism, over the servers' space of
// the ranks' packed parts (sharding/tensor_slices.h's TensorParallelSpace),
// cut at each part's end. In a job of regions (cluster.diloco) the plan
// of one region's servers, each region's alike.
StatusOr<ShardPlan> ParameterServerPlan(const config::JobConfig& config);
// An all-reduce job's buckets (every process computes them alike): the
// space a worker computes in (the model's flat one, with tensor
// parallelism a rank's packed one) in the cluster's bucket size, cut at a
// pipeline's stages, one "server". Errors: too small to give every rank of
// a shard group a slice (whole-model ZeRO; a stage's buckets are checked
// by the worker that holds them).
StatusOr<ShardPlan> AllReducePlan(const config::JobConfig& config);

}  // namespace herd
