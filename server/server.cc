#include "server/server.h"

#include <glog/logging.h>
#include <omp.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>

#include "common/clock.h"
#include "common/file_util.h"
#include "common/run_summary.h"
#include "common/trace.h"
#include "data/sampler.h"
#include "model/checkpoint_format.h"
#include "model/checkpoint_load.h"
#include "model/checkpoint_run.h"
#include "model/optim/adamw.h"
#include "model/optim/optimizer_shard.h"
#include "server/parameter_shard.h"
#include "sharding/memory_plan.h"
#include "sharding/shard_plan.h"
#include "transport/checkpoint_commit.h"
#include "transport/join.h"
#include "transport/node_runtime.h"
#include "transport/push_pull.h"
#include "transport/trace_session.h"
#include "transport/wire.h"

namespace herd {
namespace {

// The combined norm of every server's partial sum of squares, added in
// server order so that every server computes the same value.
// The servers' squared partial norms summed in rank order, and server 0's
// loss (the one server that collects the workers').
StatusOr<ParameterShard::StepHooks::Global> GlobalScalars(transport::CoordinatorClient& client, int64_t step,
                                                          double partial, double loss) {
  if (client.num_servers() == 1) return ParameterShard::StepHooks::Global{std::sqrt(partial), loss};
  trace::Span span("norm exchange", "server", {"step", step});
  const double mine[2] = {partial, loss};
  HERD_ASSIGN_OR_RETURN(auto all, client.AllGather("herd/norm/" + std::to_string(step),
                                                   std::string(reinterpret_cast<const char*>(mine), sizeof mine),
                                                   wire::SERVERS));
  double total = 0, first_loss = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    double x[2];
    if (all[i].size() != sizeof x) return Status::Corruption("a server sent a malformed partial norm and loss");
    std::memcpy(x, all[i].data(), sizeof x);
    total += x[0];
    if (i == 0) first_loss = x[1];
  }
  return ParameterShard::StepHooks::Global{std::sqrt(total), first_loss};
}

}  // namespace

Status RunParameterServer(const config::JobConfig& config, const TrainOptions& options,
                          const transport::JoinOptions& join) {
  if (config.train().threads() > 0) omp_set_num_threads(config.train().threads());
  const ParamLayout layout(LlamaShape::FromConfig(config.model()));
  HERD_ASSIGN_OR_RETURN(ShardPlan plan, ShardPlan::Create(layout, ShardPlanOptions::FromConfig(config.cluster())));
  HERD_ASSIGN_OR_RETURN(const std::optional<VerifiedCheckpoint> resume_from, ResumePoint(config, options));
  const std::string& ckpt_dir = config.checkpoint().dir();

  transport::TraceSession trace;  // log.trace: goes last, after everything that records spans
  // The service reaches into the shard: it is declared before the runtime,
  // which stops the service before the shard goes.
  std::unique_ptr<ParameterShard> shard_holder;
  int rank = -1;
  transport::NodeRuntime::Options ro;
  ro.join = join;
  ro.connect_to = {wire::WORKER};
  auto prepare = [&](transport::NodeRuntime& rt, transport::CoordinatorClient& client) -> Status {
    rank = client.rank();
    HERD_RETURN_IF_ERROR(transport::AgreeOn(client, "herd/resume",
                                            resume_from ? BaseName(resume_from->dir) : std::string("none"),
                                            "the checkpoint to resume from"));
    Stopwatch sw;
    HERD_ASSIGN_OR_RETURN(std::unique_ptr<OptimizerShard> optimizer,
                          OptimizerShard::InitOrResume(config, layout, plan.shard(rank), resume_from));
    ParameterShardOptions o;
    o.layout = &layout;
    o.plan = &plan;
    o.server = rank;
    o.num_workers = client.num_workers();
    o.first_worker_peer = transport::MemberPeerId(client, wire::WORKER, 0);
    o.bf16_wire = config.cluster().wire_dtype() == config::ClusterConfig::BF16;
    o.collects_losses = rank == 0;
    o.elastic = config.cluster().elastic();
    o.stream_updates = StreamsUpdates(config);
    shard_holder = std::make_unique<ParameterShard>(o, std::move(optimizer));
    const uint64_t bytes = plan.shard(rank).size() * sizeof(float);
    HERD_RETURN_IF_ERROR(rt.transport().RegisterMemory(shard_holder->weights(), bytes));
    HERD_RETURN_IF_ERROR(rt.transport().RegisterMemory(shard_holder->gradients(), bytes));
    rt.Serve(shard_holder.get());
    LOG(INFO) << "server " << rank << ": [" << plan.shard(rank).begin << ", " << plan.shard(rank).end << ") "
              << (resume_from ? "loaded from " + resume_from->dir : std::string("initialised")) << " in "
              << sw.Seconds() << " s";
    return Status::OK();
  };
  HERD_ASSIGN_OR_RETURN(std::unique_ptr<transport::NodeRuntime> runtime, transport::NodeRuntime::Join(ro, prepare));
  transport::CoordinatorClient* client = &runtime->client();
  HERD_RETURN_IF_ERROR(trace.Start(config.log().trace(), wire::SERVER, rank, client));
  ParameterShard& shard = *shard_holder;
  client->OnFailure([&shard](const Status& failure) { shard.Fail(failure); });
  client->OnMembershipChange([rank, &shard](const transport::MembershipChange& change) {
    shard.SetMembershipEpoch(change.epoch);
    LOG_IF(INFO, change.joined) << "server " << rank << ": " << transport::DescribeMember(change.member)
                                << " joined; the job goes on with " << change.live_workers.size() << " workers";
    LOG_IF(WARNING, !change.joined) << "server " << rank << ": " << transport::DescribeMember(change.member)
                                    << " was lost (" << change.reason << "); the job goes on with "
                                    << change.live_workers.size() << " workers";
  });
  if (rank == 0) LOG(INFO) << "shard plan: " << plan.Describe();

  // The workers' pushes drive the shard's steps; a checkpoint follows each
  // step the schedule names, written in the background from a snapshot
  // (checkpoint.background) or in place while the workers wait.
  const int64_t start = shard.optimizer().step(), last = options.LastStep(config.train().steps());
  // Declared after the runtime, so they go first: the commits vote through
  // the client, and write the snapshot, which outlives them.
  ShardImage snapshot;
  transport::BackgroundCommit background;
  ParameterShard::StepHooks hooks;
  hooks.global_scalars = [client](int64_t step, double partial, double loss) {
    return GlobalScalars(*client, step, partial, loss);
  };
  const bool elastic = config.cluster().elastic();
  hooks.after_step = [&](int64_t step) -> Status {
    if (!CheckpointDue(config.checkpoint(), step, last)) return Status::OK();
    const std::string step_dir = StepDirName(ckpt_dir, step);
    // Server 0 commits: the servers hold the optimizer state. In an elastic
    // job the workers come and go, so the servers alone vote, and server 0
    // writes every worker's data file: the step's data position (the same
    // for every rank), which the workers' loss pushes brought it.
    const std::string path = JoinPath(step_dir, ShardFileName(rank));
    std::string data_position;
    if (elastic && rank == 0) {
      const DataPosition& d = shard.report().data;
      data_position = SamplerStateLine(d.epoch, d.taken, d.tokens, config.train().seq_len(), config.train().seed());
    }
    auto commit = [client, step_dir, step, &config, rank, elastic, data_position](const std::function<Status()>& write) {
      Stopwatch sw;
      auto write_parts = [&]() -> Status {
        HERD_RETURN_IF_ERROR(write());
        if (data_position.empty()) return Status::OK();
        for (int r = 0; r < client->num_workers(); ++r) {
          HERD_RETURN_IF_ERROR(WriteFileAtomic(JoinPath(step_dir, WorkerFileName(r)), data_position));
        }
        return Status::OK();
      };
      HERD_RETURN_IF_ERROR(transport::CommitCheckpoint(
          client, step_dir, step, config, /*committer=*/rank == 0,
          CheckpointParts(client->num_servers(), client->num_workers()), write_parts,
          elastic ? wire::SERVERS : wire::EVERYONE));
      if (elastic && rank == 0) {
        std::printf("checkpoint: %s (%.1fs)\n", step_dir.c_str(), sw.Seconds());
        std::fflush(stdout);
      }
      return Status::OK();
    };
    if (!config.checkpoint().background()) return commit([&] { return WriteShard(path, shard.optimizer().view()); });
    HERD_RETURN_IF_ERROR(background.Wait());  // the previous checkpoint first
    snapshot.Capture(shard.optimizer().view());
    background.Start([commit, &snapshot, path] { return commit([&] { return snapshot.Write(path); }); });
    return Status::OK();
  };
  Status served = shard.ServeSteps(last, hooks);
  Status written = background.Wait();
  HERD_RETURN_IF_ERROR(runtime->Conclude(served.ok() ? written : served));
  HERD_RETURN_IF_ERROR(trace.Finish(client));
  HERD_RETURN_IF_ERROR(client->Barrier("herd/done"));
  if (auto memory = PlanMemory(config); memory.ok()) {
    RunSummary run;
    run.role = "server";
    run.rank = rank;
    run.steps = last - start;
    run.plan_bytes = memory->processes[rank].total();
    run.pushes_dropped = shard.pushes_dropped();
    const transport::UcxStats ucx = runtime->transport().stats();
    run.unauthenticated_dropped = static_cast<int64_t>(ucx.unauthenticated_dropped);
    HERD_RETURN_IF_ERROR(ReportRunSummary(run, ucx.bytes_sent, config.log().summary_dir()));
  }
  return client->Leave();
}

}  // namespace herd
