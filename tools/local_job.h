// `herd launch` for multi-process jobs on this machine (torchrun
// --standalone's role): a coordinator on a thread of this process on a
// free loopback port, a fresh job token in a private temporary file
// (removed once everyone has joined), then cluster.servers herd-server and
// cluster.workers herd-worker processes (found beside this binary) with
// explicit ranks, once the whole job's memory plan fits this machine.
//
// Children never outlive the launcher (the kernel kills them when it
// dies) and sit in process groups of their own, so that SIGINT/SIGTERM
// reach the launcher alone: it stops spawning, shuts the job down in
// order through the coordinator, kills what remains after a grace period
// and exits 130/143. A process the coordinator declares lost is killed at
// once. Output is forwarded line by line with a "server 0: " / "worker 1: "
// prefix, log lines (the launcher's and the processes' stderr) to a log
// file; stderr gets one line when the job fails, naming the process whose
// failure stopped it, with its own message, and the log file; the exit
// code is that process's. With
// max_restarts, a failure instead stops every process and starts the job
// again from the newest complete checkpoint, with one line saying why.
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
  // After a failure of a job that had started (every process joined), the
  // job is started again this many times at most, from the newest
  // complete checkpoint; a process's bad input (exit code 2) is not
  // retried.
  int max_restarts = 0;
  // Where log lines go, the launcher's and its processes' (their stderr);
  // empty: LaunchLogPath.
  std::string log_file;
};

// The run's launch.log in checkpoint.dir (the run owns that folder), else
// herd-launch-PID.log in $TMPDIR or /tmp.
std::string LaunchLogPath(const config::JobConfig& config);

// Returns the exit code for the launcher.
int RunLocalJob(const config::JobConfig& config, const LocalJobOptions& options);

}  // namespace herd::tools
