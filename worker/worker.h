// A worker: the process that computes forward and backward. The one
// process of a single-process job (cluster.sync NONE), or one worker of a
// parameter-server or all-reduce job (herd-worker).
//
// Sets up, in order: the data, the resume point, the model, this worker's
// sampler, its SyncStrategy (worker/reducers/sync_strategy.h) and, in a job, its
// place in it (transport::NodeRuntime); then runs the StepLoop
// (worker/step_loop.h), and in a job reports what it cost and leaves.
#pragma once

#include "common/run_options.h"
#include "common/status.h"
#include "proto/herd.pb.h"
#include "transport/coordinator_client.h"

namespace herd {

// `join` null: the job is this one process (the caller has checked that
// it fits here and that a fresh run does not meet old checkpoints, as the
// launcher does for a job's processes).
Status RunWorker(const config::JobConfig& config, const TrainOptions& options, const transport::JoinOptions* join);

}  // namespace herd
