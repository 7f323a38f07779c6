// herd-worker in a PARAMETER_SERVER job: the training loop of the
// single-process trainer with the optimizer moved to the servers.
//
// Each step: forward/backward on this worker's micro-batches (its own
// disjoint sequences of the global batch); during the last backward every
// gradient bucket is pushed as soon as backward has finished it, while the
// rest of backward runs; then the new weights are pulled bucket by bucket
// (in forward order) together with every server's step report. The loss
// and gradient norm printed are global: the mean over workers (summed in
// rank order by server 0) and the servers' combined norm. Worker 0 prints
// progress, evaluates and samples; every worker writes its data-loader
// position into each checkpoint.
#pragma once

#include "common/run_options.h"
#include "common/status.h"
#include "proto/herd.pb.h"
#include "transport/coordinator_client.h"

namespace herd {

Status TrainParameterServerWorker(const config::JobConfig& config, const TrainOptions& options,
                                  const transport::JoinOptions& join);

}  // namespace herd
