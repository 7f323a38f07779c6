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

// What CUDA workers do with NCCL in all-reduce mode: nothing (the UCX
// ring), reduce the gradients before the host's optimizer, or the whole
// step on the device (weights and AdamW state too).
enum class NcclUse { kNone, kGradients, kWholeStep };

// `transport` null: one process (`train_tokens` its data's size); `plan`
// and `pipeline` null where the job has none.
void PrintRunHeader(const config::JobConfig& config, const JobOptions& job, const ParamLayout& layout,
                    const std::string& device, int64_t train_tokens, const ShardPlan* plan, const Grid& grid,
                    NcclUse nccl, const transport::UcxTransport* transport, const PipelinePlan* pipeline);

}  // namespace herd
