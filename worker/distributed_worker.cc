#include "worker/distributed_worker.h"

#include <glog/logging.h>
#include <omp.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <vector>

#include "common/bf16.h"
#include "common/clock.h"
#include "common/file_util.h"
#include "common/run_summary.h"
#include "common/strings.h"
#include "data/prepare.h"
#include "data/sampler.h"
#include "data/token_file.h"
#include "model/checkpoint.h"
#include "sharding/memory_plan.h"
#include "sharding/shard_plan.h"
#include "transport/join.h"
#include "transport/push_pull.h"
#include "transport/ring_collectives.h"
#include "transport/wire.h"
#include "worker/collective_exchange.h"
#include "worker/evaluate.h"
#include "worker/model_factory.h"
#include "worker/nccl_gradients.h"
#include "worker/progress_log.h"
#include "worker/ps_exchange.h"

namespace herd {

Status TrainDistributedWorker(const config::JobConfig& config, const TrainOptions& options,
                              const transport::JoinOptions& join) {
  const auto& train = config.train();
  if (train.threads() > 0) omp_set_num_threads(train.threads());
  const LlamaShape shape = LlamaShape::FromConfig(config.model());
  const int B = train.batch_size(), T = train.seq_len(), A = train.grad_accum();
  const auto& cluster = config.cluster();
  const bool ps = cluster.sync() == config::ClusterConfig::PARAMETER_SERVER;
  const bool bf16 = ps && cluster.wire_dtype() == config::ClusterConfig::BF16;

  HERD_ASSIGN_OR_RETURN(JobData data, OpenJobData(config.data(), shape.vocab_size));
  const TokenFile& train_file = data.train;
  const std::unique_ptr<TokenFile>& val_file = data.val;
  const ParamLayout layout(shape);
  const int64_t P = layout.size();
  HERD_ASSIGN_OR_RETURN(ShardPlan plan, ps ? ShardPlan::Create(layout, ShardPlanOptions::FromConfig(cluster))
                                           : CollectivePlan(layout, config, cluster.workers()));
  const std::string& ckpt_dir = config.checkpoint().dir();
  std::optional<VerifiedCheckpoint> resume_from;
  if (options.resume) {
    if (ckpt_dir.empty()) return Status::InvalidArgument("--resume needs checkpoint.dir to be set");
    HERD_ASSIGN_OR_RETURN(resume_from, LatestVerifiedCheckpoint(ckpt_dir));
    HERD_RETURN_IF_ERROR(CheckSameRun(resume_from->dir, config));
  }
  if (!ckpt_dir.empty()) HERD_RETURN_IF_ERROR(CheckWritable(ckpt_dir));
  // Buffers before the transport: they must outlive it.
  std::vector<float> weights(P), grads(P);
  // Made once the rank (and so the GPU) is known; after the buffers, so
  // that a GPU model (which page-locks them) goes first.
  std::unique_ptr<Model> model;
  std::unique_ptr<DeviceGradientReduction> device_reduction;  // CUDA workers in all-reduce mode: NCCL

  HERD_ASSIGN_OR_RETURN(auto transport, transport::UcxTransport::Create(-1));
  // Made after the join; declared here so that it goes after the services
  // below (whose completions reach into it) and before the transport.
  std::unique_ptr<GradientExchange> exchange;
  // The data plane's services, registered before any peer can send; they
  // go after the coordinator client (declared later), whose failure
  // handlers reach into them, and before the exchange and the transport.
  std::unique_ptr<transport::PushPullClient> pushpull;
  std::unique_ptr<transport::RingCollectives> ring;
  if (ps)
    pushpull = std::make_unique<transport::PushPullClient>(transport.get(), LargestBucketBytes(plan, bf16 ? 2 : 4));
  std::optional<DistributedSampler> sampler;
  int rank = -1, W = 0;
  auto prepare = [&](transport::CoordinatorClient& client) -> Status {
    rank = client.rank();
    W = client.num_workers();
    if (!ps) {
      std::vector<transport::PeerId> peers;
      for (int r = 0; r < W; ++r) peers.push_back(transport::MemberPeerId(client, wire::WORKER, r));
      ring = std::make_unique<transport::RingCollectives>(transport.get(), rank, peers);
    }
    HERD_RETURN_IF_ERROR(transport::AgreeOn(client, "herd/resume",
                                            resume_from ? BaseName(resume_from->dir) : std::string("none"),
                                            "the checkpoint to resume from"));
    HERD_ASSIGN_OR_RETURN(model, CreateModel(config, B, T, LocalRank(rank)));
    if (!ps && config.device().kind() == config::DeviceConfig::CUDA && cluster.nccl() && BuiltWithNccl()) {
      HERD_ASSIGN_OR_RETURN(device_reduction,
                            ReduceGradientsWithNccl(client, *model, cluster.zero_stage() == 1 ? &plan : nullptr));
    }
    HERD_ASSIGN_OR_RETURN(sampler, DistributedSampler::Create(train_file, T, W, rank, train.seed()));
    HERD_RETURN_IF_ERROR(sampler->CheckBatch(B).WithContext("train.batch_size: "));
    if (resume_from) {
      const std::string path = JoinPath(resume_from->dir, WorkerFileName(rank));
      HERD_ASSIGN_OR_RETURN(std::string loader, ReadFile(path));
      HERD_RETURN_IF_ERROR(sampler->RestoreState(loader).WithContext(path + ": "));
    }
    return Status::OK();
  };
  HERD_ASSIGN_OR_RETURN(auto client,
                        transport::JoinJob(join, transport.get(), {ps ? wire::SERVER : wire::WORKER}, prepare));
  HERD_RETURN_IF_ERROR(transport->RegisterMemory(weights.data(), P * sizeof(float)));
  HERD_RETURN_IF_ERROR(transport->RegisterMemory(grads.data(), P * sizeof(float)));
  if (ps) {
    transport::PushPullClient* pp = pushpull.get();
    client->OnFailure([pp](const Status& failure) { pp->Fail(-1, failure); });
    HERD_ASSIGN_OR_RETURN(exchange, CreateParameterExchange(plan, rank, W, bf16, transport.get(), pp,
                                                            transport::MemberPeerId(*client, wire::SERVER, 0)));
  } else {
    transport::RingCollectives* rc = ring.get();
    client->OnFailure([rc](const Status& failure) { rc->Fail(failure); });
    CollectiveExchangeOptions o;
    o.config = &config;
    o.layout = &layout;
    o.plan = &plan;
    o.zero1 = cluster.zero_stage() == 1;
    o.collectives = rc;
    o.device_reduction = device_reduction.get();
    HERD_ASSIGN_OR_RETURN(exchange, CreateCollectiveExchange(o, weights.data(), resume_from));
  }

  const bool leader = rank == 0;
  const int64_t start = resume_from ? resume_from->manifest.step : 0;
  const int64_t total_steps = train.steps();
  const int64_t last = options.LastStep(total_steps);
  ProgressLog log;
  if (leader) {
    HERD_RETURN_IF_ERROR(log.Open(config.log().metrics(), options.resume));
    if (resume_from)
      std::printf("resumed from %s (step %lld)\n", resume_from->dir.c_str(), static_cast<long long>(start));
    std::printf("model: %.2fM parameters (%d layers, d=%d, %d heads, %d kv heads, vocab %d) | worker 0 on %s\n",
                layout.num_parameters() / 1e6, shape.num_layers, shape.hidden_size, shape.num_heads, shape.num_kv_heads,
                shape.vocab_size, model->Describe().c_str());
    if (ps && config.device().kind() == config::DeviceConfig::CUDA) {
      // Device pointers could go to a CUDA-aware UCX directly; herd does not
      // do that yet, so say which case this is.
      std::printf("GPU workers push and pull through page-locked host memory (%s)\n",
                  transport->cuda_memory() ? "this UCX could move CUDA memory itself; direct transfers are not used yet"
                                           : "this UCX has no CUDA memory support");
    }
    if (ps) {
      std::printf("parameter servers: %d, workers: %d, wire %s", plan.num_servers(), W, bf16 ? "bf16" : "fp32");
    } else {
      std::printf("all-reduce (%s) among %d workers%s",
                  device_reduction ? "gradients by NCCL, the rest by UCX ring" : "UCX ring", W,
                  cluster.zero_stage() == 1 ? ", ZeRO-1" : "");
    }
    std::printf(", %zu buckets | batch %d x %d tokens x %d accum x %d workers = %lld tokens/step\n",
                plan.buckets().size(), B, T, A, W, static_cast<long long>(B) * T * A * W);
    std::fflush(stdout);
  }

  const int64_t tokens_per_step = static_cast<int64_t>(B) * T * A * W;
  const double loss_scale = 1.0 / static_cast<double>(tokens_per_step);
  std::vector<int32_t> inputs(static_cast<size_t>(B) * T), targets(inputs.size());
  const Model::FinalFrom push_ready = [&exchange](int64_t offset) { exchange->FinalFrom(offset); };
  const Model::NeedUpTo wait_pulled = [&exchange](int64_t end) { exchange->WaitUpTo(end); };

  Stopwatch run_clock, window_clock;
  int64_t window_tokens = 0;
  double window_wait = 0;
  std::string loader_state;  // the data position after the step to checkpoint
  // Progress, evaluation and checkpoint of `step`, once its weights are in.
  auto finish_step = [&](int64_t step) -> Status {
    const StepReport& report = exchange->report();
    window_tokens += tokens_per_step;
    window_wait += exchange->TakeWaitSeconds();
    if (!std::isfinite(report.mean_loss)) {
      return Status::FailedPrecondition("step " + std::to_string(step) + ": loss is " +
                                        std::to_string(report.mean_loss) +
                                        " (diverged; lower optimizer.lr or raise warmup_steps)");
    }
    const bool is_last = step == last;
    const bool eval_now = is_last || (config.log().eval_every() > 0 && step % config.log().eval_every() == 0);
    if (leader && (step % config.log().every() == 0 || step == start + 1 || is_last || eval_now)) {
      ProgressLog::Entry e;
      e.step = step;
      e.total_steps = total_steps;
      e.loss = report.mean_loss;
      e.lr = report.lr;
      e.grad_norm = report.grad_norm;
      const double window_s = window_clock.Seconds();
      e.tokens_per_s = window_s > 0 ? window_tokens / window_s : 0;
      e.network_wait = window_s > 0 ? window_wait / window_s : 0;
      e.elapsed_s = run_clock.Seconds();
      e.eta_s = e.tokens_per_s > 0 ? (total_steps - step) * tokens_per_step / e.tokens_per_s : 0;
      if (eval_now) e.val_loss = ValidationLoss(*model, weights.data(), val_file.get(), config);
      HERD_RETURN_IF_ERROR(log.Write(e));
      window_clock.Reset();
      window_tokens = 0;
      window_wait = 0;
    }
    if (!CheckpointDue(config.checkpoint(), step, last)) return Status::OK();
    Stopwatch sw;
    const std::string step_dir = StepDirName(ckpt_dir, step);
    // Worker 0 commits unless servers hold the optimizer (they commit then).
    const bool commits = leader && exchange->shard_files() > 0;
    HERD_RETURN_IF_ERROR(transport::CommitCheckpoint(
        *client, step_dir, step, config, commits, CheckpointParts(exchange->shard_files(), W), [&] {
          Status part = WriteFileAtomic(JoinPath(step_dir, WorkerFileName(rank)), loader_state);
          return part.ok() ? exchange->WriteCheckpointParts(step_dir) : part;
        }));
    if (leader) {
      std::printf("checkpoint: %s (%.1fs)\n", step_dir.c_str(), sw.Seconds());
      std::fflush(stdout);
    }
    return Status::OK();
  };

  // Pulls run ahead: step t's forward starts on the first layers while the
  // last ones are still arriving; step t's report is handled once all of
  // its weights are in (after the first forward of step t+1).
  exchange->IssueWeights(weights.data(), static_cast<uint64_t>(start));
  for (int64_t t = start; t < last; ++t) {
    const std::string at = "step " + std::to_string(t + 1) + ": ";
    std::fill(grads.begin(), grads.end(), 0.0f);
    double loss = 0;
    for (int micro = 0; micro < A; ++micro) {
      sampler->NextBatch(B, inputs.data(), targets.data());
      loss += model->Forward(weights.data(), inputs.data(), targets.data(), B, T, micro == 0 ? wait_pulled : nullptr);
      if (micro == 0) {
        HERD_RETURN_IF_ERROR(exchange->FinishWeights().WithContext(t == start ? "initial weights: " : at));
        if (t > start) HERD_RETURN_IF_ERROR(finish_step(t));
        if (t == start) exchange->TakeWaitSeconds();
      }
      const bool last_micro = micro == A - 1;
      if (last_micro) exchange->BeginStep(grads.data(), static_cast<uint64_t>(t));
      model->Backward(weights.data(), grads.data(), loss_scale, last_micro ? push_ready : nullptr, last_micro);
    }
    loss /= A;
    HERD_RETURN_IF_ERROR(exchange->FinishStep(loss).WithContext(at));
    if (CheckpointDue(config.checkpoint(), t + 1, last)) loader_state = sampler->SaveState();
    exchange->IssueWeights(weights.data(), static_cast<uint64_t>(t + 1));
  }
  HERD_RETURN_IF_ERROR(exchange->FinishWeights().WithContext("step " + std::to_string(last) + ": "));
  if (last > start) HERD_RETURN_IF_ERROR(finish_step(last));
  HERD_RETURN_IF_ERROR(log.Close());
  if (leader) {
    if (last < total_steps) {
      std::printf("stopped at step %lld of %lld (--stop-at); continue with --resume\n", static_cast<long long>(last),
                  static_cast<long long>(total_steps));
    } else {
      PrintSample(*model, weights.data(), config);
      std::printf("done: %lld steps in %s\n", static_cast<long long>(last),
                  FormatDuration(run_clock.Seconds()).c_str());
    }
    std::fflush(stdout);
  }
  // Every worker: what it cost, for `herd bench compare` and curious users.
  if (auto memory = PlanMemory(config); memory.ok()) {
    HERD_RETURN_IF_ERROR(ReportRunSummary("worker", rank, last - start, memory->processes.back().total(),
                                          transport->stats().bytes_sent, config.log().summary_dir()));
  }
  HERD_RETURN_IF_ERROR(client->Barrier("herd/done"));
  return client->Leave();
}

}  // namespace herd
