// herd-server and herd-worker: the processes of a multi-process job. Built
// twice from this file (HERD_NODE_SERVER=1 or 0); `herd launch` starts them
// on one machine, or start them by hand on several:
//
//   herd-server CONFIG [--set path=value ...] [--rank R] [--coordinator HOST:PORT]
//               [--token-file F] [--resume | --resume-if-any | --overwrite]
//               [--allow-global-batch-change] [--stop-at STEP] [--max-restarts N]
//   herd-worker (the same flags)
//   either with --join: a worker joining an elastic job, or a region's
//   process rejoining a job of regions
//
// herd-worker --join joins an elastic job (cluster.elastic) under way in
// place of a lost worker: it takes the lowest lost rank (or --rank's, if
// that one is lost) and the step, the data position and the weights from
// the servers, so it needs neither --resume nor a checkpoint. In a job of
// regions (cluster.diloco) a lost region's processes, servers and workers,
// start again with --join and --rank: the region rejoins whole, its
// servers taking the job's state from another region's (with
// --resume-if-any too, should the job be forming, they take part in
// that). With
// --resume-if-any too, a worker that finds the job forming (not started,
// or starting again after a failure) takes part in that instead, from the
// newest checkpoint: what a supervisor can always start a worker with.
//
// Every process of a job must get the same CONFIG, --set overrides,
// --resume and --stop-at. Ranks and the coordinator's address come from
// the flags, Slurm, torchrun's variables, HERD_COORDINATOR or
// cluster.coordinator; the job token from --token-file, HERD_JOB_TOKEN or
// HERD_JOB_TOKEN_FILE.
//
// With --max-restarts N, a process whose job fails (a peer or the
// coordinator lost, an error of its own other than bad input) starts
// itself again, up to N times: it executes itself anew with
// --resume-if-any (a worker of an elastic job, or any process of a job of
// regions, with --join too, for the job may have gone on without it),
// rejoins the coordinator (waiting up to
// cluster.join_timeout_s for it to come back) and continues from the
// newest complete checkpoint, or the job's step if it joined one under
// way. A run that failed within 10 s of its start waits before the next
// (0.5 s, doubling to 8 s), so that a link that is down for a while does
// not use the restarts up at once. A job shut down on purpose is not
// restarted.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common/config.h"
#include "common/descriptors.h"
#include "common/file_util.h"
#include "common/logging.h"
#include "common/run_lock.h"
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
    " CONFIG [--set path=value ...] [--rank R] [--coordinator HOST:PORT] [--token-file F] "
    "[--resume | --resume-if-any | --overwrite] [--allow-global-batch-change] [--stop-at STEP] [--max-restarts N] "
    "[--join]";

// This process's command line for its next start: one restart fewer, and
// --resume-if-any in place of --resume / --overwrite; a worker of an
// elastic job, and any process of a job of regions, adds --join, for the
// job it comes back to may be under way without it (or its region) or
// forming again.
std::vector<std::string> RestartArgv(int argc, char** argv, long long restarts_left, bool joins) {
  std::vector<std::string> out = {argv[0]};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--resume" || a == "--overwrite" || a == "--resume-if-any" || a == "--join" ||
        a.rfind("--max-restarts=", 0) == 0) {
      continue;
    }
    if (a == "--max-restarts") {
      ++i;
      continue;
    }
    out.push_back(a);
  }
  out.push_back("--resume-if-any");
  if (joins) out.push_back("--join");
  out.insert(out.end(), {"--max-restarts", std::to_string(restarts_left)});
  return out;
}

// How long to wait before a restart: nothing after a run of 10 s or more;
// after a shorter one, twice the last wait (0.5 s at first, at most 8 s),
// carried to the next start in HERD_RESTART_WAIT_S.
double RestartWaitSeconds(double ran_s) {
  constexpr char kVariable[] = "HERD_RESTART_WAIT_S";
  const char* last = std::getenv(kVariable);
  const double wait = ran_s >= 10 ? 0 : last != nullptr ? std::min(8.0, std::max(0.5, 2 * std::atof(last))) : 0.5;
  ::setenv(kVariable, std::to_string(wait).c_str(), 1);
  return wait;
}

// Executes this program anew; returns only when that fails. Whatever this
// process holds open (sockets, UCX's files) closes on the way.
Status ExecAgain(const std::vector<std::string>& argv) {
  std::fflush(nullptr);
  CloseOnExecAboveStdio();
  std::vector<char*> cargv;
  for (const std::string& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  const std::string self = ThisExecutable();
  ::execv(self.c_str(), cargv.data());
  return Status::IOError(self + ": cannot start again: " + std::strerror(errno));
}

// What --join may be given with: refused in one line before anything
// connects.
Status CheckJoin(const tools::Args& args, const JobConfig& config, const transport::JoinOptions& join) {
  const bool regions = config.cluster().diloco().regions() > 1;
  if (join.join && HERD_NODE_SERVER && !regions) {
    return Status::InvalidArgument("--join: only a worker can join a job under way (a server: with its region, in a "
                                   "job of regions)");
  }
  if (join.join && !config.cluster().elastic() && !regions) {
    return Status::InvalidArgument("--join: " + args.positional()[0] +
                                   " is neither an elastic job (cluster.elastic) nor one of regions "
                                   "(cluster.diloco.regions); only a worker of one can join it");
  }
  if (join.join && regions && join.rank < 0) {
    return Status::InvalidArgument("--join: a process rejoining a job of regions names its rank (--rank, or the "
                                   "launcher's variables): it rejoins in its own place in its region");
  }
  if (join.join && (args.Has("resume") || args.Has("overwrite"))) {
    return Status::InvalidArgument(
        "--join takes the job's state from its servers: drop --resume and --overwrite (--resume-if-any: from the "
        "newest checkpoint should the job be forming)");
  }
  return Status::OK();
}

// Whether the process of `rank` commits checkpoints: server 0, or worker 0
// without servers.
bool CommitsCheckpoints(config::ClusterConfig::Sync sync, int rank) {
  return rank == 0 && (HERD_NODE_SERVER || sync != config::ClusterConfig::PARAMETER_SERVER);
}

Status Run(int argc, char** argv, long long* max_restarts, bool* joins) {
  tools::Args args({"set", "rank", "coordinator", "token-file", "stop-at", "max-restarts"},
                   {"resume", "resume-if-any", "overwrite", "allow-global-batch-change", "join"});
  HERD_RETURN_IF_ERROR(args.Parse(argc, argv));
  if (args.positional().size() != 1) return Status::InvalidArgument(kUsage);
  HERD_ASSIGN_OR_RETURN(*max_restarts, args.GetInt("max-restarts", 0, 0));
  HERD_ASSIGN_OR_RETURN(JobConfig config, LoadJobConfig(args.positional()[0], args.GetAll("set")));
  const auto sync = config.cluster().sync();
  *joins = (!HERD_NODE_SERVER && config.cluster().elastic()) || config.cluster().diloco().regions() > 1;
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
  join.join = args.Has("join");
  join.resume_if_forming = args.Has("resume-if-any");  // meaningful with --join only
  HERD_RETURN_IF_ERROR(CheckJoin(args, config, join));
  TrainOptions options;
  options.resume = args.Has("resume") || args.Has("resume-if-any");
  options.start_if_none = args.Has("resume-if-any");
  options.allow_global_batch_change = args.Has("allow-global-batch-change");
  options.overwrite = args.Has("overwrite");
  if (options.resume && options.overwrite) {
    return Status::InvalidArgument("--resume continues checkpoints and --overwrite deletes them: pass one of them");
  }
  HERD_ASSIGN_OR_RETURN(options.stop_at_step, args.GetInt("stop-at", 0, 1, config.train().steps()));
  // Started by hand, the process that writes a run's files owns them while
  // it runs: the committer (server 0; worker 0 without servers) the
  // checkpoint folder, worker 0 the metrics file. One joining a job under
  // way was admitted into the run that owns them already.
  RunLocks locks;
  const auto claim = [&locks, &config, sync](int rank) {
    return locks.Take(config.checkpoint().dir(), config.log().metrics(), CommitsCheckpoints(sync, rank),
                      /*take_metrics=*/!HERD_NODE_SERVER && rank == 0);
  };
  if (!join.join && join.rank >= 0) HERD_RETURN_IF_ERROR(claim(join.rank));
  if (!join.join && join.rank < 0) join.on_ranked = claim;
  if (!options.resume && !join.join) {
    // Checkpoints already there would pass for this run's on a later
    // --resume. With --overwrite, the process that commits checkpoints
    // (server 0; worker 0 without servers) removes them, so it must know
    // its rank before joining.
    if (options.overwrite && join.rank < 0) {
      return Status::InvalidArgument("--overwrite needs the process's rank (--rank, SLURM_PROCID or RANK)");
    }
    if (!options.overwrite || CommitsCheckpoints(sync, join.rank)) {
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
  if (herd::tools::AsksForHelp(argc, argv)) {
    std::printf("%s\n(every flag, and what each error means: docs/commands.md)\n", herd::kUsage);
    return 0;
  }
  long long max_restarts = 0;
  bool joins = false;
  const auto started = std::chrono::steady_clock::now();
  herd::Status st = herd::Run(argc, argv, &max_restarts, &joins);
  if (st.ok()) return 0;
  const bool retry = st.code() != herd::Status::Code::kInvalidArgument && st.code() != herd::Status::Code::kCancelled;
  if (max_restarts > 0 && retry) {
    const double ran_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    const double wait_s = herd::RestartWaitSeconds(ran_s);
    std::printf(HERD_NODE_NAME ": restart after: %s; %lld restart%s left after this one", st.message().c_str(),
                max_restarts - 1, max_restarts == 2 ? "" : "s");
    if (wait_s > 0) std::printf(" (in %.1f s: the run lasted %.1f s)", wait_s, ran_s);
    std::printf("\n");
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::duration<double>(wait_s));
    st = herd::ExecAgain(herd::RestartArgv(argc, argv, max_restarts - 1, joins));
  }
  return herd::ReportError(st);
}
