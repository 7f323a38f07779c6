// herd-server: one parameter-server process of a PARAMETER_SERVER job.
//
// Joins the job through the coordinator, takes the range of the flat
// parameter space the shard plan gives its rank, initialises it (from
// (seed, tensor name), so any number of servers builds the same model) or
// loads it from the newest complete checkpoint (any number of servers may
// have written it), then runs the synchronous step of ParameterShard for
// every step of the run: partial squared norms are exchanged among the
// servers, so every server clips with the same global norm. Writes its
// shard into each checkpoint; server 0 writes the job config and, once
// every process has reported its part written, the manifest.
#pragma once

#include "common/run_options.h"
#include "common/status.h"
#include "proto/herd.pb.h"
#include "transport/coordinator_client.h"

namespace herd {

Status RunParameterServer(const config::JobConfig& config, const TrainOptions& options,
                          const transport::JoinOptions& join);

}  // namespace herd
