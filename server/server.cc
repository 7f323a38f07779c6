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
#include "model/checkpoint.h"
#include "model/optim/optimizer_shard.h"
#include "server/parameter_shard.h"
#include "sharding/memory_plan.h"
#include "sharding/shard_plan.h"
#include "transport/join.h"
#include "transport/push_pull.h"
#include "transport/wire.h"

namespace herd {
namespace {

// The combined norm of every server's partial sum of squares, added in
// server order so that every server computes the same value.
StatusOr<double> GlobalNorm(transport::CoordinatorClient& client, int64_t step, double partial) {
  if (client.num_servers() == 1) return std::sqrt(partial);
  std::string mine(sizeof(double), '\0');
  std::memcpy(mine.data(), &partial, sizeof partial);
  HERD_ASSIGN_OR_RETURN(auto all, client.AllGather("herd/norm/" + std::to_string(step), mine, wire::SERVERS));
  double total = 0;
  for (const std::string& p : all) {
    if (p.size() != sizeof(double)) return Status::Corruption("a server sent a malformed partial norm");
    double x;
    std::memcpy(&x, p.data(), sizeof x);
    total += x;
  }
  return std::sqrt(total);
}

// Everything that needs the rank: built during the join.
struct Served {
  std::unique_ptr<ShardPlan> plan;
  std::unique_ptr<ParameterShard> shard;
  std::unique_ptr<transport::PushPullServer> service;
};

}  // namespace

Status RunParameterServer(const config::JobConfig& config, const TrainOptions& options,
                          const transport::JoinOptions& join) {
  if (config.train().threads() > 0) omp_set_num_threads(config.train().threads());
  const ParamLayout layout(LlamaShape::FromConfig(config.model()));
  HERD_ASSIGN_OR_RETURN(ShardPlan plan, ShardPlan::Create(layout, ShardPlanOptions::FromConfig(config.cluster())));
  const std::string& ckpt_dir = config.checkpoint().dir();
  if (!ckpt_dir.empty()) HERD_RETURN_IF_ERROR(CheckWritable(ckpt_dir));
  std::optional<VerifiedCheckpoint> resume_from;
  if (options.resume) {
    if (ckpt_dir.empty()) return Status::InvalidArgument("--resume needs checkpoint.dir to be set");
    HERD_ASSIGN_OR_RETURN(resume_from, LatestVerifiedCheckpoint(ckpt_dir));
  }

  HERD_ASSIGN_OR_RETURN(auto transport, transport::UcxTransport::Create(-1));
  Served served;
  int rank = -1;
  auto prepare = [&](transport::CoordinatorClient& client) -> Status {
    rank = client.rank();
    HERD_RETURN_IF_ERROR(transport::AgreeOn(client, "herd/resume",
                                            resume_from ? BaseName(resume_from->dir) : std::string("none"),
                                            "the checkpoint to resume from"));
    Stopwatch sw;
    if (resume_from) HERD_RETURN_IF_ERROR(CheckSameRun(resume_from->dir, config));
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
    served.shard = std::make_unique<ParameterShard>(o, std::move(optimizer));
    HERD_RETURN_IF_ERROR(transport->RegisterMemory(served.shard->weights(), plan.shard(rank).size() * sizeof(float)));
    HERD_RETURN_IF_ERROR(transport->RegisterMemory(served.shard->gradients(), plan.shard(rank).size() * sizeof(float)));
    served.service = std::make_unique<transport::PushPullServer>(transport.get(), served.shard.get());
    LOG(INFO) << "server " << rank << ": [" << plan.shard(rank).begin << ", " << plan.shard(rank).end << ") "
              << (resume_from ? "loaded from " + resume_from->dir : std::string("initialised")) << " in "
              << sw.Seconds() << " s";
    return Status::OK();
  };
  // Goes first: its failure handler (below) reaches into the shard and the
  // service, which `served` then takes down in order (service, shard).
  HERD_ASSIGN_OR_RETURN(auto client, transport::JoinJob(join, transport.get(), {wire::WORKER}, prepare));
  ParameterShard& shard = *served.shard;
  client->OnFailure([&shard](const Status& failure) { shard.Fail(failure); });
  if (rank == 0) LOG(INFO) << "shard plan: " << plan.Describe();

  const int64_t start = shard.optimizer().step(), last = options.LastStep(config.train().steps());
  for (int64_t t = start; t < last; ++t) {
    HERD_ASSIGN_OR_RETURN(double partial, shard.WaitForGradients());
    HERD_ASSIGN_OR_RETURN(double norm, GlobalNorm(*client, t, partial));
    if (!std::isfinite(norm)) {
      return Status::FailedPrecondition("step " + std::to_string(t + 1) + ": the gradient norm is " +
                                        std::to_string(norm) + " (diverged; lower optimizer.lr)");
    }
    shard.ApplyStep(shard.optimizer().BeginStep(norm));
    const int64_t step = t + 1;
    if (CheckpointDue(config.checkpoint(), step, last)) {
      const std::string step_dir = StepDirName(ckpt_dir, step);
      // Server 0 commits: the servers hold the optimizer state.
      HERD_RETURN_IF_ERROR(transport::CommitCheckpoint(
          *client, step_dir, step, config, /*committer=*/rank == 0,
          CheckpointParts(client->num_servers(), client->num_workers()),
          [&] { return shard.optimizer().Save(JoinPath(step_dir, ShardFileName(rank))); }));
    }
  }
  HERD_RETURN_IF_ERROR(client->Barrier("herd/done"));
  if (auto memory = PlanMemory(config); memory.ok()) {
    HERD_RETURN_IF_ERROR(ReportRunSummary("server", rank, last - start, memory->processes[rank].total(),
                                          transport->stats().bytes_sent, config.log().summary_dir()));
  }
  return client->Leave();
}

}  // namespace herd
