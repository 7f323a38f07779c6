// herd launch CONFIG [--set path=value ...] [--resume [--allow-global-batch-change] | --overwrite]
//             [--stop-at STEP] [--max-restarts N]
#include <cstdio>

#include "common/config.h"
#include "common/logging.h"
#include "common/run_lock.h"
#include "model/checkpoint_run.h"
#include "sharding/memory_plan.h"
#include "tools/args.h"
#include "tools/commands.h"
#include "tools/local_job.h"
#include "worker/model_factory.h"
#include "worker/worker.h"

namespace herd::tools {

int RunLaunch(int argc, char** argv) {
  Args args({"set", "stop-at", "max-restarts"}, {"resume", "overwrite", "allow-global-batch-change"});
  Status st = args.Parse(argc, argv);
  if (!st.ok()) return ReportError(st.WithContext("launch: "));
  if (args.positional().size() != 1) {
    return ReportError(Status::InvalidArgument("usage: herd launch CONFIG [--set path=value ...] [--resume [--allow-global-batch-change] | "
                                               "--overwrite] [--stop-at STEP] [--max-restarts N]"));
  }
  auto config = LoadJobConfig(args.positional()[0], args.GetAll("set"));
  if (!config.ok()) return ReportError(config.status());
  if (config->device().kind() == config::DeviceConfig::CUDA && !BuiltWithCuda()) {
    return ReportError(Status::InvalidArgument(args.positional()[0] +
                                               ": device.kind CUDA, but this herd was built without CUDA; use CPU"));
  }
  // Every process of a launch runs here: no GPU is one line before any starts.
  if (config->device().kind() == config::DeviceConfig::CUDA && CudaDeviceCount() == 0) {
    return ReportError(Status::FailedPrecondition(
        args.positional()[0] + ": device.kind CUDA, but this machine shows no CUDA device (driver, "
                               "CUDA_VISIBLE_DEVICES?)"));
  }
  if (config->data().train().empty()) {
    return ReportError(Status::InvalidArgument(args.positional()[0] + ": data.train is not set"));
  }
  TrainOptions options;
  options.resume = args.Has("resume");
  options.overwrite = args.Has("overwrite");
  options.allow_global_batch_change = args.Has("allow-global-batch-change");
  if (options.resume && options.overwrite) {
    return ReportError(Status::InvalidArgument("launch: --resume continues checkpoints and --overwrite deletes them: "
                                               "pass one of them"));
  }
  auto stop_at = args.GetInt("stop-at", 0, 1, config->train().steps());  // beyond: the job ends first
  if (!stop_at.ok()) return ReportError(stop_at.status());
  options.stop_at_step = *stop_at;
  auto max_restarts = args.GetInt("max-restarts", 0, 0);
  if (!max_restarts.ok()) return ReportError(max_restarts.status());
  if (config->cluster().sync() != config::ClusterConfig::NONE) {
    return RunLocalJob(*config, {args.positional()[0], args.GetAll("set"), options, static_cast<int>(*max_restarts),
                                 /*log_file=*/""});
  }
  if (*max_restarts > 0) {
    // Nothing outside the one process could start it again.
    return ReportError(Status::InvalidArgument(
        "launch: --max-restarts needs a job of several processes (cluster.sync); one process restarts with --resume"));
  }
  // One process: the job is this one; the checks a launch makes of every
  // job, before anything is prepared, allocated or written.
  st = CheckJobFitsHere(*config, "this job (herd plan)");
  RunLocks locks;  // the run's files are this process's until it ends
  if (st.ok()) st = locks.Take(config->checkpoint().dir(), config->log().metrics(), true, true);
  if (st.ok()) st = CheckRunCanStart(*config, options);
  if (st.ok()) st = RunWorker(*config, options, /*join=*/nullptr);
  if (!st.ok()) return ReportError(st);
  return 0;
}

}  // namespace herd::tools
