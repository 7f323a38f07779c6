// A job's pipeline (cluster.pipeline_stages > 1): its layers cut into
// virtual stages (sharding/pipeline_split.h), the schedule every device
// follows (sharding/pipeline_schedule.h) and where each worker sits.
// Worker ranks are stage-major: device p's replicas are ranks p·R …
// p·R+R−1, R = workers / pipeline_stages data-parallel replicas, so that
// the workers of one stage are neighbours (Megatron puts the pipeline
// outermost the same way).
#pragma once

#include "common/status.h"
#include "proto/herd.pb.h"
#include "sharding/pipeline_schedule.h"
#include "sharding/pipeline_split.h"

namespace herd {

struct PipelinePlan {
  PipelineSplit split;
  PipelineSchedule schedule;
  int replicas = 1;

  // From the config; errors in one line naming the fields (a split or a
  // schedule the model or the micro-batches cannot take), before any
  // process starts.
  static StatusOr<PipelinePlan> FromConfig(const config::JobConfig& config);

  int devices() const { return schedule.devices; }
  int DeviceOf(int rank) const { return rank / replicas; }
  int ReplicaOf(int rank) const { return rank % replicas; }
  int RankOf(int device, int replica) const { return device * replicas + replica; }
};

// Whether the job runs a pipeline (cluster.pipeline_stages > 1).
bool HasPipeline(const config::JobConfig& config);

}  // namespace herd
