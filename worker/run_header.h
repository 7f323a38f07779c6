// The lines a run starts with, printed by worker 0 (or the one process):
// the model and where it runs; the data and the global batch; in a job,
// the placement (pipeline stage, tensor slices, context chunks) on a line
// of its own and the reducer (parameter servers, regions, all-reduce,
// ZeRO and its groups) on another.
#pragma once

#include <cstdint>
#include <string>

#include "model/param_layout.h"
#include "proto/herd.pb.h"
#include "sharding/grid.h"
#include "sharding/job_options.h"
#include "sharding/pipeline_plan.h"
#include "sharding/shard_plan.h"
#include "transport/ucx_transport.h"

namespace herd {

// `transport` null: one process (`train_tokens` its data's size); `plan`
// and `pipeline` null where the job has none; `nccl`: CUDA workers'
// gradients go through NCCL.
void PrintRunHeader(const config::JobConfig& config, const JobOptions& job, const ParamLayout& layout,
                    const std::string& device, int64_t train_tokens, const ShardPlan* plan, const Grid& grid,
                    bool nccl, const transport::UcxTransport* transport, const PipelinePlan* pipeline);

}  // namespace herd
