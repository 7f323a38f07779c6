#include "server/server.h"

#include <glog/logging.h>
#include <omp.h>

#include <algorithm>
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
#include "model/optim/outer_optimizer.h"
#include "server/outer_steps.h"
#include "server/parameter_shard.h"
#include "server/region_state.h"
#include "sharding/diloco_plan.h"
#include "sharding/grid.h"
#include "sharding/job_options.h"
#include "sharding/memory_plan.h"
#include "sharding/pipeline_plan.h"
#include "sharding/shard_plan.h"
#include "sharding/tensor_slices.h"
#include "transport/checkpoint_commit.h"
#include "transport/exchanges.h"
#include "transport/join.h"
#include "transport/node_runtime.h"
#include "transport/push_pull.h"
#include "transport/trace_session.h"
#include "transport/wire.h"

namespace herd {
namespace {

// The servers' squared partial norms summed in rank order (every server
// computes the same value), and server 0's loss (the one server that
// collects the workers').
StatusOr<ParameterShard::StepHooks::Global> GlobalScalars(transport::CoordinatorClient& client, int64_t step,
                                                          double partial, double loss) {
  if (client.num_servers() == 1) return ParameterShard::StepHooks::Global{std::sqrt(partial), loss};
  trace::Span span("norm exchange", "server", {"step", step});
  wire::NormShare mine;
  mine.set_sum_of_squares(partial);
  mine.set_loss(loss);
  HERD_ASSIGN_OR_RETURN(std::vector<wire::NormShare> all,
                        transport::Gather(client, transport::NormExchange(step), mine));
  double total = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    if (!all[i].has_sum_of_squares() || !all[i].has_loss()) {
      return Status::Corruption("step " + std::to_string(step) + ": server " + std::to_string(i) +
                                " sent no partial norm and loss");
    }
    total += all[i].sum_of_squares();
  }
  return ParameterShard::StepHooks::Global{std::sqrt(total), all[0].loss()};
}

// One parameter server's process. Members in the order they are made;
// they go in reverse: the checkpoint writer (which votes through the
// runtime's client and writes the snapshot) before the snapshot and the
// runtime; the runtime, which stops the service, before the shard the
// service reaches into; the trace last, after everything that records
// spans.
class ServerProcess {
 public:
  // Errors: the shard plan, or a checkpoint that cannot be resumed.
  static StatusOr<std::unique_ptr<ServerProcess>> Create(const config::JobConfig& config,
                                                         const TrainOptions& options);

  // Joins, serves every step of the run, writes the run summary, leaves.
  Status Run(const transport::JoinOptions& join);

 private:
  ServerProcess(const config::JobConfig& config, const TrainOptions& options, ShardPlan plan,
                std::optional<TensorParallelSpace> space, std::optional<VerifiedCheckpoint> resume_from);

  // Before any peer can reach this server: the shard, loaded or made, and
  // served; a job of regions' rings and outer wire. A server rejoining
  // with its region makes its shard once it has the job's state
  // (TakeUpState).
  Status Prepare(transport::NodeRuntime& runtime, transport::CoordinatorClient& client);
  // The shard over `optimizer`, its first report at data position `data`.
  // A job of regions: the outer step's state, from the checkpoint's outer
  // parts (the first region's that has them, for a region lost before it),
  // else from this server's weights.
  Status ResumeOuterSteps(transport::CoordinatorClient& client, ParamRange range);
  // Whether the checkpoint resumed from has parts whose names begin with
  // `prefix`.
  bool ResumeHasParts(std::string_view prefix) const;
  // `range` of the plan's space from the checkpoint's parts of `prefix`
  // (the flat space's pieces; through the tensor-parallel space's runs).
  StatusOr<ShardState> ReadResumedRange(ParamRange range, std::string_view prefix) const;
  Status MakeShard(transport::CoordinatorClient& client, std::unique_ptr<OptimizerShard> optimizer,
                   const DataPosition& data);
  // The workers whose pushes each bucket sums, where not every worker's: a
  // pipeline stage's replicas, a tensor rank's workers, or both.
  Status AddContributors(ParameterShardOptions* o) const;
  // A job of regions: the outer steps over `outer`, landing `landing`
  // when it is due (OuterSteps' constructor).
  void MakeOuterSteps(transport::CoordinatorClient& client, std::unique_ptr<OuterOptimizer> outer,
                      std::optional<DilocoPlan::Exchange> landing);
  // The shard's memory registered, and its pushes and pulls answered.
  Status ServeShard(transport::NodeRuntime& runtime);
  // A server rejoining with its region: waits for the job's state (a
  // region that goes on gives it, server/outer_steps.h), makes the shard
  // and the outer steps from it and serves; then its region's workers
  // may start (kRegionServesBarrier).
  Status TakeUpState(transport::NodeRuntime& runtime, transport::CoordinatorClient& client);
  // After step `step`: the regions the outer step admitted are in the job;
  // the first region it counted gives them the job's state.
  Status GiveState(int64_t step);
  // Failures and membership changes reach the shard.
  void Watch(transport::CoordinatorClient& client);
  // After step `step`: this server's part of the checkpoint the schedule
  // names, in the background from a snapshot (checkpoint.background) or
  // in place while the workers wait.
  Status CheckpointAfter(int64_t step);
  // Who writes and votes on a checkpoint, as this server sees it once the
  // outer exchange in flight has settled: a job of regions' counted
  // regions write (the first of them the shard files, and commits), a
  // region rejoined since the last outer step votes but writes nothing.
  struct CheckpointRoles {
    int first = 0;  // the first region the last outer step counted
    bool writes = true, committer = false;
    transport::Voters voters;
    std::vector<std::string> parts;
    std::vector<bool> writers;  // a job of regions: by server, whether it writes a part
  };
  StatusOr<CheckpointRoles> RolesInCheckpoint();
  // What this server's shard file holds: its range of the flat space, or
  // (tensor parallelism) its runs of the ranks' slices, as pieces of it.
  std::vector<ShardView> CheckpointPieces() const;
  // `range` of the plan's space (this server's) as pieces of the flat
  // space: the tensor-parallel space's runs, copies left out.
  std::vector<ShardView> FlatPiecesOf(const ShardView& range) const;
  Status ReportSummary(int64_t steps) const;
  // A job of regions: GlobalScalars over this region's servers alone, on
  // their ring (so that the regions never wait for each other between
  // outer steps).
  StatusOr<ParameterShard::StepHooks::Global> RegionScalars(int64_t step, double partial, double loss);
  // The outer step's weights, momentum and kept rounding error of this
  // server's range (zeros where none is kept), as a shard file's arrays
  // (model/checkpoint_format.h's OuterFileName).
  ShardView OuterState();
  // What this server's range holds now, for the run summary: the end of a
  // hand-over of the job's state to or from `region`.
  RunSummary::HandOver HandOverNow(int region) const;

  // Constant after construction.
  const config::JobConfig& config_;
  const TrainOptions options_;
  const ParamLayout layout_;
  const ShardPlan plan_;
  // Tensor parallelism: the space the plan cuts (the ranks' packed parts);
  // otherwise the plan cuts the flat space.
  const std::optional<TensorParallelSpace> space_;
  const std::optional<VerifiedCheckpoint> resume_from_;
  const int64_t last_step_;

  // Set once the coordinator has given this process its rank (Prepare).
  int rank_ = -1;

  // Set once the coordinator has given this process its rank (Prepare):
  // its region (cluster.diloco; 0 of 1 without), the region's servers and
  // its index among them (the plan's server it is); whether it rejoins the
  // job with its region.
  int region_ = 0, region_servers_ = 1, local_ = 0;
  bool rejoining_ = false;

  // Owned by the thread that runs Run; in lifetime order.
  transport::TraceSession trace_;  // log.trace
  std::unique_ptr<ParameterShard> shard_;
  std::unique_ptr<transport::NodeRuntime> runtime_;
  // A job of regions: the runtime's outer wire, and the outer steps of
  // this server's range over it (so after the runtime).
  transport::OuterWire* outer_wire_ = nullptr;
  std::optional<DilocoPlan> diloco_;
  std::unique_ptr<OuterSteps> outer_;
  ShardImage snapshot_, outer_snapshot_;
  transport::BackgroundCommit background_;
  // The hand-overs of the job's state, for the run summary.
  std::optional<RunSummary::HandOver> took_up_;
  std::vector<RunSummary::HandOver> gave_;
};

StatusOr<std::unique_ptr<ServerProcess>> ServerProcess::Create(const config::JobConfig& config,
                                                               const TrainOptions& options) {
  const ParamLayout layout(LlamaShape::FromConfig(config.model()));
  HERD_ASSIGN_OR_RETURN(ShardPlan plan, ParameterServerPlan(config));
  std::optional<TensorParallelSpace> space;
  if (const int T = config.cluster().tensor_parallel(); T > 1) {
    HERD_ASSIGN_OR_RETURN(space, TensorParallelSpace::Make(layout.shape(), T));
  }
  HERD_ASSIGN_OR_RETURN(std::optional<VerifiedCheckpoint> resume_from, ResumePoint(config, options));
  return std::unique_ptr<ServerProcess>(
      new ServerProcess(config, options, std::move(plan), std::move(space), std::move(resume_from)));
}

ServerProcess::ServerProcess(const config::JobConfig& config, const TrainOptions& options, ShardPlan plan,
                             std::optional<TensorParallelSpace> space, std::optional<VerifiedCheckpoint> resume_from)
    : config_(config),
      options_(options),
      layout_(LlamaShape::FromConfig(config.model())),
      plan_(std::move(plan)),
      space_(std::move(space)),
      resume_from_(std::move(resume_from)),
      last_step_(options.LastStep(config.train().steps())) {}

Status ServerProcess::Prepare(transport::NodeRuntime& runtime, transport::CoordinatorClient& client) {
  rank_ = client.rank();
  const int regions = Regions(config_);
  region_servers_ = client.num_servers() / regions;
  region_ = RegionOf(config_, /*server=*/true, rank_);
  local_ = rank_ % region_servers_;
  rejoining_ = client.joining_region() >= 0;
  if (!rejoining_) {
    HERD_RETURN_IF_ERROR(transport::AgreeOnResume(client, resume_from_ ? BaseName(resume_from_->dir) : "none"));
  }
  const ParamRange range = plan_.shard(local_);
  if (regions > 1) {
    // A region's servers (their norm).
    runtime.StartGroupRing(client, region_servers_, wire::SERVER);
    const config::DilocoConfig& d = config_.cluster().diloco();
    HERD_ASSIGN_OR_RETURN(DilocoPlan diloco, DilocoPlan::Make(d, plan_, config_.train().steps()));
    diloco_.emplace(std::move(diloco));
    // The same range's servers of every region (the outer steps).
    std::vector<transport::PeerId> peers;
    for (int k = 0; k < regions; ++k) {
      peers.push_back(transport::MemberPeerId(client, wire::SERVER, k * region_servers_ + local_));
    }
    transport::OuterWire::Options wire = OuterSteps::WireOptions(d, *diloco_, local_, region_, std::move(peers));
    // The coordinator declares a dead process lost within its heartbeat
    // timeout; an endpoint that fails without that is a failure.
    wire.unreachable_timeout_s = 2 * config_.cluster().heartbeat_timeout_s() + 5;
    if (rejoining_) wire.state_bytes = RegionState::Bytes(regions, range.size());
    outer_wire_ = runtime.StartOuterWire(std::move(wire));
  }
  if (rejoining_) return Status::OK();
  Stopwatch sw;
  const JobOptions job = JobOptions::FromConfig(config_);
  std::unique_ptr<OptimizerShard> optimizer;
  // A job of regions resumes each region's replica from its own parts
  // (region 0's are the shard files), and the outer step's state from
  // its; a checkpoint without them (of another mode) starts every region
  // from its shards, the outer momentum from zero.
  const std::string prefix = region_ > 0 && ResumeHasParts(RegionShardPrefix(region_)) ? RegionShardPrefix(region_)
                                                                                          : std::string(kShardPrefix);
  if (space_) {
    HERD_ASSIGN_OR_RETURN(ShardState state, space_->Load(range, job.init, layout_, resume_from_, prefix));
    optimizer = std::make_unique<OptimizerShard>(space_->DecaySegmentsOf(range), job.optimizer, std::move(state));
  } else if (prefix != kShardPrefix) {
    HERD_ASSIGN_OR_RETURN(ShardState state, ReadResumedRange(range, prefix));
    optimizer = std::make_unique<OptimizerShard>(layout_, job.optimizer, std::move(state));
  } else {
    HERD_ASSIGN_OR_RETURN(optimizer, job.MakeOptimizer(layout_, range, resume_from_));
  }
  HERD_RETURN_IF_ERROR(MakeShard(client, std::move(optimizer), DataPosition{}));
  if (regions > 1) HERD_RETURN_IF_ERROR(ResumeOuterSteps(client, range));
  HERD_RETURN_IF_ERROR(ServeShard(runtime));
  LOG(INFO) << "server " << rank_ << ": [" << range.begin << ", " << range.end << ") "
            << (resume_from_ ? "loaded from " + resume_from_->dir : std::string("initialised")) << " in "
            << sw.Seconds() << " s";
  return Status::OK();
}

Status ServerProcess::ResumeOuterSteps(transport::CoordinatorClient& client, ParamRange range) {
  const int regions = Regions(config_);
  const config::DilocoConfig& d = config_.cluster().diloco();
  const OuterStep step = OuterStepOf(d);
  const OuterOptions outer{step.lr, step.momentum};
  std::unique_ptr<OuterOptimizer> optimizer;
  // A checkpoint taken while a fragment's exchange was in flight holds
  // its outer step taken; the fragment lands when it is due.
  std::optional<DilocoPlan::Exchange> landing;
  // A region lost before the checkpoint has no outer parts in it: it
  // takes the first region's that has (the outer weights and momentum
  // are every region's alike), without its kept error (a region's own).
  int from = region_;
  for (int k = 0; k < regions && !ResumeHasParts(OuterPrefix(from)); ++k) {
    if (ResumeHasParts(OuterPrefix(k))) from = k;
  }
  if (ResumeHasParts(OuterPrefix(from))) {
    HERD_ASSIGN_OR_RETURN(ShardState state, ReadResumedRange(range, OuterPrefix(from)));
    if (from != region_) std::fill(state.v.begin(), state.v.end(), 0.0f);
    optimizer = std::make_unique<OuterOptimizer>(outer, state.weights.data(), range.size(), state.m.data(),
                                                 state.v.data());
    landing = diloco_->InFlightAfter(shard_->optimizer().step());
  } else {
    optimizer = std::make_unique<OuterOptimizer>(outer, shard_->weights(), range.size());
  }
  MakeOuterSteps(client, std::move(optimizer), landing);
  return Status::OK();
}

StatusOr<ShardState> ServerProcess::ReadResumedRange(ParamRange range, std::string_view prefix) const {
  if (space_) return space_->Load(range, JobOptions::FromConfig(config_).init, layout_, resume_from_, prefix);
  return ReadShardRange(resume_from_->dir, resume_from_->manifest, range.begin, range.end, /*with_moments=*/true,
                        prefix);
}

bool ServerProcess::ResumeHasParts(std::string_view prefix) const {
  return resume_from_ && std::any_of(resume_from_->manifest.parts.begin(), resume_from_->manifest.parts.end(),
                                     [&](const std::string& p) { return p.starts_with(prefix); });
}

Status ServerProcess::MakeShard(transport::CoordinatorClient& client, std::unique_ptr<OptimizerShard> optimizer,
                                const DataPosition& data) {
  const int regions = Regions(config_);
  ParameterShardOptions o;
  o.layout = &layout_;
  o.plan = &plan_;
  o.server = local_;
  o.num_workers = client.num_workers() / regions;
  o.first_worker_peer = transport::MemberPeerId(client, wire::WORKER, region_ * o.num_workers);
  o.bf16_wire = config_.cluster().wire_dtype() == config::ClusterConfig::BF16;
  o.collects_losses = local_ == 0;
  o.data = data;
  o.elastic = config_.cluster().elastic();
  o.stream_updates = StreamsUpdates(config_);
  HERD_RETURN_IF_ERROR(AddContributors(&o));
  if (space_) o.uncounted = space_->Copies();
  shard_ = std::make_unique<ParameterShard>(o, std::move(optimizer));
  return Status::OK();
}

Status ServerProcess::AddContributors(ParameterShardOptions* o) const {
  const bool pipelined = HasPipeline(config_);
  if (!pipelined && !space_) return Status::OK();  // every worker pushes every bucket
  std::optional<PipelinePlan> pipeline;
  if (pipelined) {
    HERD_ASSIGN_OR_RETURN(pipeline, PipelinePlan::FromConfig(config_));
  }
  const Grid grid = Grid::FromConfig(config_);
  for (const Bucket& b : plan_.buckets()) {
    // With tensor parallelism, a rank's part is pushed by the workers of
    // that rank (a pipeline's: of that rank and the stage that holds it).
    const int rank = space_ ? static_cast<int>(b.range.begin / space_->part()) : 0;
    if (pipeline) {
      const int64_t origin = space_ ? rank * space_->part() : 0;
      const ParamLayout& layout = space_ ? space_->slices(rank).layout() : layout_;
      o->contributors.push_back(
          pipeline->ContributorsOf({b.range.begin - origin, b.range.end - origin}, layout, rank));
      continue;
    }
    // A region's workers, as its pushes name them (region 0's ranks).
    std::vector<int>& workers = o->contributors.emplace_back();
    for (int w = 0; w < grid.size() / grid.degree(Axis::kRegion); ++w) {
      if (grid.CoordsOf(w)[Axis::kTensor] == rank) workers.push_back(w);
    }
  }
  return Status::OK();
}

void ServerProcess::MakeOuterSteps(transport::CoordinatorClient& client, std::unique_ptr<OuterOptimizer> outer,
                                   std::optional<DilocoPlan::Exchange> landing) {
  outer_ = std::make_unique<OuterSteps>(config_.cluster().diloco(), *diloco_, local_, region_servers_,
                                        std::move(outer), outer_wire_, &client, landing);
}

Status ServerProcess::ServeShard(transport::NodeRuntime& runtime) {
  for (const auto& [data, bytes] : shard_->transfer_buffers()) {
    HERD_RETURN_IF_ERROR(runtime.transport().RegisterMemory(data, bytes));
  }
  runtime.Serve(shard_.get());
  return Status::OK();
}

Status ServerProcess::TakeUpState(transport::NodeRuntime& runtime, transport::CoordinatorClient& client) {
  Stopwatch sw;
  const ParamRange range = plan_.shard(local_);
  const int regions = Regions(config_);
  // A region is admitted at the first outer step after every region has
  // heard of it: within H inner steps of the job's, unless the job ends
  // first.
  HERD_ASSIGN_OR_RETURN(auto sent, outer_wire_->AwaitState(config_.cluster().join_timeout_s()));
  const int from = sent.first;
  HERD_ASSIGN_OR_RETURN(RegionState state,
                        RegionState::Decode(sent.second, regions, range.size(), last_step_, region_,
                                            "region " + std::to_string(from) + "'s server " + std::to_string(local_)));
  ShardState inner;
  inner.begin = range.begin;
  inner.end = range.end;
  inner.step = state.steps;
  inner.weights = state.outer;  // the job's newest outer weights
  inner.m = std::move(state.m);
  inner.v = std::move(state.v);
  inner.spikes = state.spikes;
  HERD_RETURN_IF_ERROR(MakeShard(client, std::make_unique<OptimizerShard>(layout_, JobOptions::FromConfig(config_).optimizer,
                                                                          std::move(inner)),
                                 state.data));
  const OuterStep step = OuterStepOf(config_.cluster().diloco());
  MakeOuterSteps(client,
                 std::make_unique<OuterOptimizer>(OuterOptions{step.lr, step.momentum}, state.outer.data(),
                                                  range.size(), state.momentum.data(), nullptr),
                 diloco_->InFlightAfter(state.steps));
  outer_->StartFrom(state.in_job, state.counted);
  took_up_ = HandOverNow(from);
  HERD_RETURN_IF_ERROR(ServeShard(runtime));
  HERD_RETURN_IF_ERROR(client.Barrier(transport::kRegionServesBarrier, wire::REGION));
  if (local_ == 0) {
    std::printf("region %d rejoined the job: from step %lld on, with the job's state from region %d (%.1f MB in %.2f s)\n",
                region_, static_cast<long long>(state.steps + 1), from, sent.second.size() / 1e6, sw.Seconds());
    std::fflush(stdout);
  }
  return Status::OK();
}

Status ServerProcess::GiveState(int64_t step) {
  if (!outer_) return Status::OK();
  const std::vector<int> admitted = outer_->Admit();
  if (admitted.empty()) return Status::OK();
  const std::vector<bool>& live = outer_->live_regions();
  const int first = static_cast<int>(std::find(live.begin(), live.end(), true) - live.begin());
  for (int k : admitted) {
    LOG(INFO) << "server " << rank_ << ": region " << k << " is admitted after step " << step
              << "; it counts from the next outer step on" << (region_ == first ? ", its state from this region" : "");
  }
  if (region_ != first) return Status::OK();
  const ShardView now = shard_->optimizer().view();
  const OuterOptimizer& outer = outer_->optimizer();
  const int64_t n = now.end - now.begin;
  RegionState state;
  state.steps = step;
  state.in_job = outer_->wire().InJob();
  state.counted = live;
  state.spikes = now.spikes;
  if (local_ == 0) state.data = shard_->report().data;
  state.outer.assign(outer.outer(), outer.outer() + n);
  state.momentum.assign(outer.momentum(), outer.momentum() + n);
  state.m.assign(now.m, now.m + n);
  state.v.assign(now.v, now.v + n);
  const std::string bytes = state.Encode();
  for (int k : admitted) {
    gave_.push_back(HandOverNow(k));
    // A region lost again meanwhile is let go again: not this server's
    // failure.
    if (Status sent = outer_->wire().SendState(k, bytes); !sent.ok()) {
      LOG(WARNING) << "server " << rank_ << ": could not give region " << k << " the job's state: " << sent.message();
    }
  }
  return Status::OK();
}

void ServerProcess::Watch(transport::CoordinatorClient& client) {
  ParameterShard& shard = *shard_;
  client.OnFailure([&shard](const Status& failure) { shard.Fail(failure); });
  client.OnMembershipChange([this, rank = rank_, &shard](const transport::MembershipChange& change) {
    shard.SetMembershipEpoch(change.epoch);
    if (outer_ && change.joined) {
      const int k = RegionOf(config_, change.member.role() == wire::SERVER, change.member.rank());
      if (k == region_) return;  // this one's own region, rejoining
      outer_->Heard(k);
      LOG(INFO) << "server " << rank << ": region " << k << " rejoins the job; it is admitted at the next outer "
                << "step every region has heard of it by";
      return;
    }
    if (outer_ && !change.joined) {
      // A job of regions goes on without the lost member's region.
      const int k = RegionOf(config_, change.member.role() == wire::SERVER, change.member.rank());
      outer_->Lose(k);
      LOG(WARNING) << "server " << rank << ": region " << k << " was let go (" << transport::DescribeMember(change.member)
                   << " was lost: " << change.reason << "); the outer steps go on without it";
      return;
    }
    LOG_IF(INFO, change.joined) << "server " << rank << ": " << transport::DescribeMember(change.member)
                                << " joined; the job goes on with " << change.live_workers.size() << " workers";
    LOG_IF(WARNING, !change.joined) << "server " << rank << ": " << transport::DescribeMember(change.member)
                                    << " was lost (" << change.reason << "); the job goes on with "
                                    << change.live_workers.size() << " workers";
  });
}

Status ServerProcess::Run(const transport::JoinOptions& join) {
  transport::NodeRuntime::Options ro;
  ro.join = join;
  ro.connect_to = {wire::WORKER};
  if (Regions(config_) > 1) ro.connect_to.push_back(wire::SERVER);  // the outer steps
  HERD_ASSIGN_OR_RETURN(runtime_, transport::NodeRuntime::Join(ro, [this](transport::NodeRuntime& rt,
                                                                          transport::CoordinatorClient& client) {
                          return Prepare(rt, client);
                        }));
  transport::CoordinatorClient* client = &runtime_->client();
  if (rejoining_) HERD_RETURN_IF_ERROR(TakeUpState(*runtime_, *client));
  HERD_RETURN_IF_ERROR(trace_.Start(config_.log().trace(), wire::SERVER, rank_, client));
  Watch(*client);
  if (rank_ == 0) LOG(INFO) << "shard plan: " << plan_.Describe();

  // The workers' pushes drive the shard's steps.
  const int64_t start = shard_->optimizer().step();
  ParameterShard::StepHooks hooks;
  hooks.global_scalars = [this, client](int64_t step, double partial, double loss) {
    return outer_ ? RegionScalars(step, partial, loss)
                  : GlobalScalars(*client, step, partial, loss);
  };
  // A region admitted after a step starts from the next: the step's
  // checkpoint is the job's before it.
  hooks.after_step = [this](int64_t step) {
    HERD_RETURN_IF_ERROR(CheckpointAfter(step));
    return GiveState(step);
  };
  if (outer_) {
    // As the plan schedules them (a pure function of the config: a stop
    // with --stop-at changes no step).
    hooks.replaces = [this](int64_t step) { return outer_->Replaces(step); };
    hooks.replace = [this](int64_t step, float* weights) { return outer_->After(step, weights); };
  }
  Status served = shard_->ServeSteps(last_step_, hooks);
  if (outer_ && !served.ok()) outer_->Abandon(served);
  Status written = background_.Wait();
  HERD_RETURN_IF_ERROR(runtime_->Conclude(served.ok() ? written : served));
  HERD_RETURN_IF_ERROR(trace_.Finish(client));
  HERD_RETURN_IF_ERROR(client->Barrier(transport::kDoneBarrier));
  HERD_RETURN_IF_ERROR(ReportSummary(last_step_ - start));
  return client->Leave();
}

StatusOr<ServerProcess::CheckpointRoles> ServerProcess::RolesInCheckpoint() {
  const int R = Regions(config_);
  std::vector<bool> live(R, true);
  if (outer_) {
    HERD_RETURN_IF_ERROR(outer_->Settle());
    live = outer_->live_regions();
  }
  CheckpointRoles roles;
  roles.first = static_cast<int>(std::find(live.begin(), live.end(), true) - live.begin());
  const int first = roles.first;
  // A region rejoined since the last outer step votes but writes nothing:
  // the parts are the counted regions'.
  roles.writes = live[region_];
  transport::Voters& voters = roles.voters;
  if (outer_) {
    voters.epoch = runtime_->client().membership_epoch();  // before the names it holds for
    const std::vector<bool> in_job = outer_->wire().InJob();
    for (int i = 0; i < runtime_->client().num_servers(); ++i) {
      if (in_job[i / region_servers_]) voters.members.push_back(i);
    }
  }
  roles.committer = region_ == first && local_ == 0;
  std::vector<std::string>& parts = roles.parts;
  parts = CheckpointParts(region_servers_, runtime_->client().num_workers());
  for (int k = first + 1; k < R; ++k) {
    for (int j = 0; live[k] && j < region_servers_; ++j) parts.push_back(RegionShardFileName(k, j));
  }
  for (int k = 0; outer_ && k < R; ++k) {
    for (int j = 0; live[k] && j < region_servers_; ++j) parts.push_back(OuterFileName(k, j));
  }
  // A job of regions: the voters that write a part (the servers of the
  // live regions); one of them lost since abandons the checkpoint.
  for (int i = 0; R > 1 && i < runtime_->client().num_servers(); ++i) {
    roles.writers.push_back(live[i / region_servers_]);
  }
  return roles;
}

Status ServerProcess::CheckpointAfter(int64_t step) {
  if (!CheckpointDue(config_.checkpoint(), step, last_step_)) return Status::OK();
  const std::string step_dir = StepDirName(config_.checkpoint().dir(), step);
  // Server 0 commits: the servers hold the optimizer state. In an elastic
  // job the workers come and go, and in a job of regions a region may be
  // lost, so the servers alone vote, and the committer writes every
  // worker's data file: the step's data position (the same for every
  // rank), which the workers' loss pushes brought it.
  //
  // A job of regions: the regions the last outer step counted write (every
  // server knows the same last step once the one in flight has settled).
  // The first of them writes the shard files and commits; the others
  // their replicas' own parts; each its outer step's state.
  HERD_ASSIGN_OR_RETURN(const CheckpointRoles roles, RolesInCheckpoint());
  const bool servers_vote = config_.cluster().elastic() || Regions(config_) > 1;
  const std::string path =
      JoinPath(step_dir, region_ == roles.first ? ShardFileName(local_) : RegionShardFileName(region_, local_));
  std::string data_position;
  if (servers_vote && roles.committer) {
    const DataPosition& d = shard_->report().data;
    data_position = SamplerStateLine(d.epoch, d.taken, d.tokens, config_.train().seq_len(), config_.train().seed());
  }
  transport::CoordinatorClient* client = &runtime_->client();
  auto commit = [client, step_dir, step, &config = config_, roles, servers_vote,
                 data_position](const std::function<Status()>& write) {
    Stopwatch sw;
    auto write_parts = [&]() -> Status {
      if (!roles.writes) return Status::OK();
      HERD_RETURN_IF_ERROR(write());
      if (data_position.empty()) return Status::OK();
      for (int r = 0; r < client->num_workers(); ++r) {
        HERD_RETURN_IF_ERROR(WriteFileAtomic(JoinPath(step_dir, WorkerFileName(r)), data_position));
      }
      return Status::OK();
    };
    HERD_RETURN_IF_ERROR(transport::CommitCheckpoint(client, step_dir, step, config, roles.committer, roles.parts,
                                                     write_parts, servers_vote ? wire::SERVERS : wire::EVERYONE,
                                                     roles.writers, roles.voters));
    if (servers_vote && roles.committer) {
      std::printf("checkpoint: %s (%.1fs)\n", step_dir.c_str(), sw.Seconds());
      std::fflush(stdout);
    }
    return Status::OK();
  };
  // A job of regions: its outer state too, once the exchange in flight
  // has taken its outer step.
  const std::string outer_path = outer_ ? JoinPath(step_dir, OuterFileName(region_, local_)) : "";

  if (!config_.checkpoint().background()) {
    return commit([&]() -> Status {
      HERD_RETURN_IF_ERROR(WriteShardPieces(path, CheckpointPieces()));
      return outer_ ? WriteShardPieces(outer_path, FlatPiecesOf(OuterState())) : Status::OK();
    });
  }
  HERD_RETURN_IF_ERROR(background_.Wait());  // the previous checkpoint first
  snapshot_.Capture(CheckpointPieces());
  if (outer_) outer_snapshot_.Capture(FlatPiecesOf(OuterState()));
  background_.Start([commit, snapshot = &snapshot_, outer = &outer_snapshot_, path, outer_path] {
    return commit([&]() -> Status {
      HERD_RETURN_IF_ERROR(snapshot->Write(path));
      return outer_path.empty() ? Status::OK() : outer->Write(outer_path);
    });
  });
  return Status::OK();
}

StatusOr<ParameterShard::StepHooks::Global> ServerProcess::RegionScalars(int64_t step, double partial,
                                                                          double loss) {
  if (region_servers_ == 1) return ParameterShard::StepHooks::Global{std::sqrt(partial), loss};
  trace::Span span("norm exchange", "server", {"step", step});
  // The loss is the region's first server's (the others know none).
  double sums[2] = {partial, local_ == 0 ? loss : 0.0};
  transport::Collectives& ring = *runtime_->shard_ring();
  HERD_RETURN_IF_ERROR(ring.Wait(ring.AllReduce(sums, 2, transport::DType::kFloat64))
                           .WithContext("step " + std::to_string(step) + ": the region's norm: "));
  return ParameterShard::StepHooks::Global{std::sqrt(sums[0]), sums[1]};
}

ShardView ServerProcess::OuterState() {
  const ShardView now = shard_->optimizer().view();
  const OuterOptimizer& outer = outer_->optimizer();
  return {now.begin, now.end, now.step, outer.outer(), outer.momentum(), outer.error(), now.spikes};
}

RunSummary::HandOver ServerProcess::HandOverNow(int region) const {
  const ShardView now = shard_->optimizer().view();
  const size_t bytes = (now.end - now.begin) * sizeof(float);
  RunSummary::HandOver h;
  h.region = region;
  h.step = now.step;
  h.weights_crc32 = Crc32(now.weights, bytes);
  h.m_crc32 = Crc32(now.m, bytes);
  h.v_crc32 = Crc32(now.v, bytes);
  h.outer_crc32 = Crc32(outer_->optimizer().outer(), bytes);
  h.momentum_crc32 = Crc32(outer_->optimizer().momentum(), bytes);
  const DataPosition data = shard_->report().data;
  h.data_epoch = data.epoch;
  h.data_taken = data.taken;
  return h;
}

std::vector<ShardView> ServerProcess::CheckpointPieces() const { return FlatPiecesOf(shard_->optimizer().view()); }

std::vector<ShardView> ServerProcess::FlatPiecesOf(const ShardView& range) const {
  return space_ ? space_->FlatPieces(range) : std::vector<ShardView>{range};
}

Status ServerProcess::ReportSummary(int64_t steps) const {
  auto memory = PlanMemory(config_);
  if (!memory.ok()) return Status::OK();
  RunSummary run;
  run.role = "server";
  run.rank = rank_;
  run.steps = steps;
  run.plan_bytes = memory->processes[rank_].total();
  run.pushes_dropped = shard_->pushes_dropped();
  const ShardView final_weights = shard_->optimizer().view();
  run.weights_crc32 = Crc32(final_weights.weights, (final_weights.end - final_weights.begin) * sizeof(float));
  const transport::UcxStats ucx = runtime_->transport().stats();
  run.unauthenticated_dropped = static_cast<int64_t>(ucx.unauthenticated_dropped);
  run.took_up = took_up_;
  run.gave = gave_;
  return ReportRunSummary(run, ucx.bytes_sent, config_.log().summary_dir());
}

}  // namespace

Status RunParameterServer(const config::JobConfig& config, const TrainOptions& options,
                          const transport::JoinOptions& join) {
  if (config.train().threads() > 0) omp_set_num_threads(config.train().threads());
  HERD_ASSIGN_OR_RETURN(std::unique_ptr<ServerProcess> server, ServerProcess::Create(config, options));
  return server->Run(join);
}

}  // namespace herd
