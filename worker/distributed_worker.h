// herd-worker: the training loop of the single-process trainer, with the
// optimizer step done by a GradientExchange: on the servers
// (PARAMETER_SERVER) or by the workers after an all-reduce (ALLREDUCE,
// optionally ZeRO-1).
//
// Each step: forward/backward on this worker's micro-batches (its own
// disjoint sequences of the global batch); during the last backward every
// gradient bucket leaves as soon as backward has finished it, while the
// rest of backward runs; the next weights arrive bucket by bucket (in
// forward order) and the next forward waits only for its layer's. The loss
// and gradient norm printed are global: the mean over workers and the norm
// of the summed gradient. Worker 0 prints
// progress, evaluates and samples; every worker writes its data-loader
// position into each checkpoint.
#pragma once

#include "common/run_options.h"
#include "common/status.h"
#include "proto/herd.pb.h"
#include "transport/coordinator_client.h"

namespace herd {

Status TrainDistributedWorker(const config::JobConfig& config, const TrainOptions& options,
                              const transport::JoinOptions& join);

}  // namespace herd
