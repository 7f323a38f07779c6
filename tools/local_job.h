// `herd launch` for multi-process jobs on this machine (torchrun
// --standalone's role): a coordinator in this process on a free loopback
// port, a fresh job token in a private temporary file, then
// cluster.servers herd-server and cluster.workers herd-worker processes
// (found beside this binary) with explicit ranks. Their output is forwarded
// line by line with a "server 0: " / "worker 1: " prefix. The job's exit
// code is the first failing process's (1 when only the coordinator saw a
// failure); processes still running some time after a failure are killed.
// SIGINT/SIGTERM shut the job down in order through the coordinator.
#pragma once

#include <string>
#include <vector>

#include "common/run_options.h"
#include "common/status.h"
#include "proto/herd.pb.h"

namespace herd::tools {

struct LocalJobOptions {
  std::string config_path;
  std::vector<std::string> overrides;  // --set, passed on to every process
  TrainOptions train;
};

// Returns the exit code for the launcher.
int RunLocalJob(const config::JobConfig& config, const LocalJobOptions& options);

}  // namespace herd::tools
