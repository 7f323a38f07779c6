// herd-server and herd-worker: the processes of a multi-process job. Built
// twice from this file (HERD_NODE_SERVER=1 or 0); `herd launch` starts them
// on one machine, or start them by hand on several:
//
//   herd-server CONFIG [--set path=value ...] [--rank R] [--coordinator HOST:PORT]
//               [--token-file F] [--resume | --overwrite] [--stop-at STEP]
//   herd-worker (the same flags)
//
// Every process of a job must get the same CONFIG, --set overrides,
// --resume and --stop-at. Ranks and the coordinator's address come from
// the flags, Slurm, torchrun's variables, HERD_COORDINATOR or
// cluster.coordinator; the job token from --token-file, HERD_JOB_TOKEN or
// HERD_JOB_TOKEN_FILE.
#include <cstdio>

#include "common/config.h"
#include "common/logging.h"
#include "model/checkpoint_run.h"
#include "tools/args.h"
#include "transport/rendezvous.h"
#include "transport/ucx_transport.h"

#if HERD_NODE_SERVER
#include "server/server.h"
#define HERD_NODE_NAME "herd-server"
#else
#include "worker/worker.h"
#define HERD_NODE_NAME "herd-worker"
#endif

namespace herd {
namespace {

constexpr char kUsage[] =
    "usage: " HERD_NODE_NAME
    " CONFIG [--set path=value ...] [--rank R] [--coordinator HOST:PORT] [--token-file F] [--resume | --overwrite] "
    "[--stop-at STEP]";

Status Run(int argc, char** argv) {
  tools::Args args({"set", "rank", "coordinator", "token-file", "stop-at"}, {"resume", "overwrite"});
  HERD_RETURN_IF_ERROR(args.Parse(argc, argv));
  if (args.positional().size() != 1) return Status::InvalidArgument(kUsage);
  HERD_ASSIGN_OR_RETURN(JobConfig config, LoadJobConfig(args.positional()[0], args.GetAll("set")));
  const auto sync = config.cluster().sync();
  if (sync == config::ClusterConfig::NONE || (HERD_NODE_SERVER && sync != config::ClusterConfig::PARAMETER_SERVER)) {
    return Status::InvalidArgument(
        args.positional()[0] + ": cluster.sync is " + config::ClusterConfig::Sync_Name(sync) +
        "; " HERD_NODE_NAME " runs " +
        (HERD_NODE_SERVER ? "PARAMETER_SERVER jobs" : "PARAMETER_SERVER and ALLREDUCE jobs"));
  }
  // device.kind concerns workers only (servers hold fp32 state on the CPU);
  // a worker that cannot make its model says why when it joins.
  HERD_ASSIGN_OR_RETURN(
      transport::JoinOptions join,
      transport::JoinOptions::ForProcess(config, HERD_NODE_SERVER ? wire::SERVER : wire::WORKER, args.Get("rank"),
                                         args.Get("coordinator"), args.Get("token-file")));
  TrainOptions options;
  options.resume = args.Has("resume");
  options.overwrite = args.Has("overwrite");
  HERD_ASSIGN_OR_RETURN(options.stop_at_step, args.GetInt("stop-at", 0, 1));
  if (!options.resume) {
    // Checkpoints already there would pass for this run's on a later
    // --resume. With --overwrite, the process that commits checkpoints
    // (server 0; worker 0 without servers) removes them, so it must know
    // its rank before joining.
    const bool committer = (HERD_NODE_SERVER || sync == config::ClusterConfig::ALLREDUCE) && join.rank == 0;
    if (options.overwrite && join.rank < 0) {
      return Status::InvalidArgument("--overwrite needs the process's rank (--rank, SLURM_PROCID or RANK)");
    }
    if (!options.overwrite || committer) {
      HERD_RETURN_IF_ERROR(CheckFreshRun(config.checkpoint().dir(), options.overwrite));
    }
  }
  transport::RemoveStaleUcxShmFiles();
#if HERD_NODE_SERVER
  return RunParameterServer(config, options, join);
#else
  return RunWorker(config, options, &join);
#endif
}

}  // namespace
}  // namespace herd

int main(int argc, char** argv) {
  herd::InitLogging(argv[0]);
  const herd::Status st = herd::Run(argc, argv);
  if (!st.ok()) return herd::ReportError(st);
  return 0;
}
