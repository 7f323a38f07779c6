#include "worker/ps_worker.h"

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
#include "common/memory.h"
#include "common/strings.h"
#include "data/prepare.h"
#include "data/sampler.h"
#include "data/token_file.h"
#include "model/checkpoint.h"
#include "model/llama.h"
#include "sharding/memory_plan.h"
#include "sharding/shard_plan.h"
#include "transport/join.h"
#include "transport/push_pull.h"
#include "transport/wire.h"
#include "worker/evaluate.h"
#include "worker/progress_log.h"

namespace herd {
namespace {

using transport::PeerId;

// The worker's side of the push/pull traffic: its buffers in the plan's
// layout, and the time spent blocked on the network.
class ParameterExchange {
 public:
  ParameterExchange(const ShardPlan& plan, int num_workers, bool bf16, transport::PushPullClient* client,
                    PeerId first_server)
      : plan_(plan),
        W_(num_workers),
        bf16_(bf16),
        wire_bytes_(bf16 ? 2 : 4),
        client_(client),
        first_server_(first_server),
        reports_(plan.num_servers()) {
    for (int s = 0; s < plan.num_servers(); ++s) spaces_.push_back(ServerSpace::For(plan.shard(s), W_, wire_bytes_));
    if (bf16_) wire_.resize(plan.shard(plan.num_servers() - 1).end);
  }

  uint16_t* wire_buffer() { return wire_.data(); }
  size_t wire_buffer_bytes() const { return wire_.size() * sizeof(uint16_t); }

  // Starts a step's pushes: buckets go out as backward finishes them.
  void BeginPushes(const float* grads, uint64_t step) {
    grads_ = grads;
    step_ = step;
    next_bucket_ = 0;
  }
  // Backward has finished every gradient at offsets >= `offset`.
  void PushFinalFrom(int64_t offset) {
    const auto& buckets = plan_.buckets();
    while (next_bucket_ < buckets.size() && buckets[next_bucket_].range.begin >= offset) {
      const Bucket& b = buckets[next_bucket_++];
      const void* data = grads_ + b.range.begin;
      if (bf16_) {
        FloatsToBf16(grads_ + b.range.begin, wire_.data() + b.range.begin, b.range.size());
        data = wire_.data() + b.range.begin;
      }
      client_->Push(first_server_ + b.server, ByteOffset(b), data, b.range.size() * wire_bytes_, step_);
    }
  }
  // After backward: this worker's loss to server 0, then waits for every push.
  Status FinishPushes(int rank, const double* loss) {
    CHECK_EQ(next_bucket_, plan_.buckets().size()) << "backward did not finish every bucket";
    client_->Push(first_server_, spaces_[0].losses_offset + sizeof(double) * rank, loss, sizeof(double), step_);
    return Timed([&] { return client_->WaitAll(); });
  }

  // Starts pulling the weights of `version` (forward order, into `weights`)
  // and every server's report of the step that produced it.
  void IssuePulls(float* weights, uint64_t version) {
    weights_ = weights;
    version_ = version;
    pulls_.clear();
    next_pull_ = 0;
    pull_status_ = Status::OK();
    const auto& buckets = plan_.buckets();
    for (auto it = buckets.rbegin(); it != buckets.rend(); ++it) {
      void* dst = bf16_ ? static_cast<void*>(wire_.data() + it->range.begin) : weights + it->range.begin;
      pulls_.emplace_back(&*it, client_->Pull(first_server_ + it->server, ByteOffset(*it), dst,
                                              it->range.size() * wire_bytes_, version));
    }
    report_tickets_.clear();
    for (int s = 0; s < plan_.num_servers(); ++s) {
      report_tickets_.push_back(
          client_->Pull(first_server_ + s, spaces_[s].report_offset, &reports_[s], sizeof(StepReport), version));
    }
  }
  // Blocks until every weight below flat offset `end` has arrived (forward
  // calls this layer by layer). A failure is kept for FinishPulls.
  void WaitUpTo(int64_t end) {
    while (next_pull_ < pulls_.size() && pulls_[next_pull_].first->range.begin < end) {
      const auto [bucket, ticket] = pulls_[next_pull_++];
      Status st = Timed([&] { return client_->Wait(ticket); });
      if (!st.ok() && pull_status_.ok()) pull_status_ = st;
      if (bf16_ && st.ok()) {
        Bf16ToFloats(wire_.data() + bucket->range.begin, weights_ + bucket->range.begin, bucket->range.size());
      }
    }
  }
  // Waits for the rest of the weights and for the reports; checks them.
  Status FinishPulls() {
    WaitUpTo(plan_.shard(plan_.num_servers() - 1).end);
    for (auto ticket : report_tickets_) {
      Status st = Timed([&] { return client_->Wait(ticket); });
      if (!st.ok() && pull_status_.ok()) pull_status_ = st;
    }
    report_tickets_.clear();
    HERD_RETURN_IF_ERROR(pull_status_);
    for (int s = 0; s < plan_.num_servers(); ++s) {
      if (reports_[s].version != version_) {
        return Status::Corruption("server " + std::to_string(s) + " reported version " +
                                  std::to_string(reports_[s].version) + ", expected " + std::to_string(version_));
      }
    }
    return Status::OK();
  }
  const StepReport& report() const { return reports_[0]; }

  // Seconds blocked on pushes and pulls since the last call.
  double TakeWaitSeconds() {
    const double s = wait_s_;
    wait_s_ = 0;
    return s;
  }

 private:
  uint64_t ByteOffset(const Bucket& b) const {
    return static_cast<uint64_t>(b.range.begin - plan_.shard(b.server).begin) * wire_bytes_;
  }
  template <typename F>
  Status Timed(F&& f) {
    Stopwatch sw;
    Status st = f();
    wait_s_ += sw.Seconds();
    return st;
  }

  const ShardPlan& plan_;
  const int W_;
  const bool bf16_;
  const int wire_bytes_;
  transport::PushPullClient* client_;
  const PeerId first_server_;
  std::vector<ServerSpace> spaces_;
  std::vector<uint16_t> wire_;  // bf16 staging for pushes and pulls
  std::vector<StepReport> reports_;
  // Pulls in flight: bucket tickets in forward order, the next to wait for.
  std::vector<std::pair<const Bucket*, transport::PushPullClient::Ticket>> pulls_;
  std::vector<transport::PushPullClient::Ticket> report_tickets_;
  size_t next_pull_ = 0;
  float* weights_ = nullptr;
  uint64_t version_ = 0;
  Status pull_status_;
  const float* grads_ = nullptr;
  uint64_t step_ = 0;
  size_t next_bucket_ = 0;
  double wait_s_ = 0;
};

// The largest bucket in the wire dtype: pushes and pulls travel whole.
uint64_t LargestBucketBytes(const ShardPlan& plan, int wire_bytes) {
  int64_t largest = 0;
  for (const Bucket& b : plan.buckets()) largest = std::max(largest, b.range.size());
  return static_cast<uint64_t>(largest) * wire_bytes;
}

}  // namespace

Status TrainParameterServerWorker(const config::JobConfig& config, const TrainOptions& options,
                                  const transport::JoinOptions& join) {
  const auto& train = config.train();
  if (train.threads() > 0) omp_set_num_threads(train.threads());
  const LlamaShape shape = LlamaShape::FromConfig(config.model());
  const int B = train.batch_size(), T = train.seq_len(), A = train.grad_accum();
  const bool bf16 = config.cluster().wire_dtype() == config::ClusterConfig::BF16;

  HERD_ASSIGN_OR_RETURN(JobData data, OpenJobData(config.data(), shape.vocab_size));
  const TokenFile& train_file = data.train;
  const std::unique_ptr<TokenFile>& val_file = data.val;
  LlamaModel<float> model(shape, B, T);
  const ParamLayout& layout = model.layout();
  const int64_t P = layout.size();
  HERD_ASSIGN_OR_RETURN(ShardPlan plan, ShardPlan::Create(layout, ShardPlanOptions::FromConfig(config.cluster())));
  const std::string& ckpt_dir = config.checkpoint().dir();
  std::optional<VerifiedCheckpoint> resume_from;
  if (options.resume) {
    if (ckpt_dir.empty()) return Status::InvalidArgument("--resume needs checkpoint.dir to be set");
    HERD_ASSIGN_OR_RETURN(resume_from, LatestVerifiedCheckpoint(ckpt_dir));
    HERD_RETURN_IF_ERROR(CheckSameModel(resume_from->dir, config));
  }
  // Buffers before the transport: they must outlive it.
  std::vector<float> weights(P), grads(P);

  HERD_ASSIGN_OR_RETURN(auto transport, transport::UcxTransport::Create(-1));
  auto pushpull = std::make_unique<transport::PushPullClient>(transport.get(), LargestBucketBytes(plan, bf16 ? 2 : 4));
  std::optional<DistributedSampler> sampler;
  int rank = -1, W = 0;
  auto prepare = [&](transport::CoordinatorClient& client) -> Status {
    rank = client.rank();
    W = client.num_workers();
    HERD_RETURN_IF_ERROR(transport::AgreeOn(client, "herd/resume",
                                            resume_from ? BaseName(resume_from->dir) : std::string("none"),
                                            "the checkpoint to resume from"));
    HERD_ASSIGN_OR_RETURN(sampler, DistributedSampler::Create(train_file, T, W, rank, train.seed()));
    HERD_RETURN_IF_ERROR(sampler->CheckBatch(B).WithContext("train.batch_size: "));
    if (resume_from) {
      const std::string path = JoinPath(resume_from->dir, WorkerFileName(rank));
      HERD_ASSIGN_OR_RETURN(std::string loader, ReadFile(path));
      HERD_RETURN_IF_ERROR(sampler->RestoreState(loader).WithContext(path + ": "));
    }
    return Status::OK();
  };
  HERD_ASSIGN_OR_RETURN(auto client, transport::JoinJob(join, transport.get(), {wire::SERVER}, prepare));
  transport::PushPullClient* pp = pushpull.get();
  client->OnFailure([pp](const Status& failure) { pp->Fail(-1, failure); });
  ParameterExchange exchange(plan, W, bf16, pp, transport::MemberPeerId(*client, wire::SERVER, 0));
  HERD_RETURN_IF_ERROR(transport->RegisterMemory(weights.data(), P * sizeof(float)));
  HERD_RETURN_IF_ERROR(transport->RegisterMemory(grads.data(), P * sizeof(float)));
  if (bf16) HERD_RETURN_IF_ERROR(transport->RegisterMemory(exchange.wire_buffer(), exchange.wire_buffer_bytes()));

  const bool leader = rank == 0;
  const int64_t start = resume_from ? resume_from->manifest.step : 0;
  const int64_t total_steps = train.steps();
  const int64_t last = options.LastStep(total_steps);
  ProgressLog log;
  if (leader) {
    HERD_RETURN_IF_ERROR(log.Open(config.log().metrics(), options.resume));
    if (resume_from)
      std::printf("resumed from %s (step %lld)\n", resume_from->dir.c_str(), static_cast<long long>(start));
    std::printf("model: %.2fM parameters (%d layers, d=%d, %d heads, %d kv heads, vocab %d) | %d threads per worker\n",
                layout.num_parameters() / 1e6, shape.num_layers, shape.hidden_size, shape.num_heads, shape.num_kv_heads,
                shape.vocab_size, omp_get_max_threads());
    std::printf(
        "parameter servers: %d, workers: %d, wire %s, %zu buckets | batch %d x %d tokens x %d accum x %d "
        "workers = %lld tokens/step\n",
        plan.num_servers(), W, bf16 ? "bf16" : "fp32", plan.buckets().size(), B, T, A, W,
        static_cast<long long>(B) * T * A * W);
    std::fflush(stdout);
  }

  const int64_t tokens_per_step = static_cast<int64_t>(B) * T * A * W;
  const double loss_scale = 1.0 / static_cast<double>(tokens_per_step);
  std::vector<int32_t> inputs(static_cast<size_t>(B) * T), targets(inputs.size());
  const LlamaModel<float>::FinalFrom push_ready = [&exchange](int64_t offset) { exchange.PushFinalFrom(offset); };
  const LlamaModel<float>::NeedUpTo wait_pulled = [&exchange](int64_t end) { exchange.WaitUpTo(end); };

  Stopwatch run_clock, window_clock;
  int64_t window_tokens = 0;
  double window_wait = 0;
  std::string loader_state;  // the data position after the step to checkpoint
  // Progress, evaluation and checkpoint of `step`, once its weights are in.
  auto finish_step = [&](int64_t step) -> Status {
    const StepReport& report = exchange.report();
    window_tokens += tokens_per_step;
    window_wait += exchange.TakeWaitSeconds();
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
      if (eval_now) e.val_loss = ValidationLoss(model, weights.data(), val_file.get(), config);
      log.Write(e);
      window_clock.Reset();
      window_tokens = 0;
      window_wait = 0;
    }
    if (!CheckpointDue(config.checkpoint(), step, last)) return Status::OK();
    Stopwatch sw;
    const std::string step_dir = StepDirName(ckpt_dir, step);
    Status part = BeginCheckpointPart(step_dir);
    if (part.ok()) part = WriteFileAtomic(JoinPath(step_dir, WorkerFileName(rank)), loader_state);
    HERD_RETURN_IF_ERROR(transport::AllSucceeded(*client, "herd/checkpoint/" + std::to_string(step), part)
                             .WithContext("checkpoint " + step_dir + ": "));
    HERD_RETURN_IF_ERROR(transport::AllSucceeded(*client, "herd/committed/" + std::to_string(step), Status::OK())
                             .WithContext("checkpoint " + step_dir + ": "));
    if (leader) {
      std::printf("checkpoint: %s (%.1fs)\n", step_dir.c_str(), sw.Seconds());
      std::fflush(stdout);
    }
    return Status::OK();
  };

  // Pulls run ahead: step t's forward starts on the first layers while the
  // last ones are still arriving; step t's report is handled once all of
  // its weights are in (after the first forward of step t+1).
  exchange.IssuePulls(weights.data(), static_cast<uint64_t>(start));
  for (int64_t t = start; t < last; ++t) {
    const std::string at = "step " + std::to_string(t + 1) + ": ";
    std::fill(grads.begin(), grads.end(), 0.0f);
    double loss = 0;
    for (int micro = 0; micro < A; ++micro) {
      sampler->NextBatch(B, inputs.data(), targets.data());
      loss += model.Forward(weights.data(), inputs.data(), targets.data(), B, T, micro == 0 ? wait_pulled : nullptr);
      if (micro == 0) {
        HERD_RETURN_IF_ERROR(exchange.FinishPulls().WithContext(t == start ? "initial weights: " : at));
        if (t > start) HERD_RETURN_IF_ERROR(finish_step(t));
        if (t == start) exchange.TakeWaitSeconds();
      }
      const bool last_micro = micro == A - 1;
      if (last_micro) exchange.BeginPushes(grads.data(), static_cast<uint64_t>(t));
      model.Backward(weights.data(), grads.data(), loss_scale, last_micro ? push_ready : nullptr);
    }
    loss /= A;
    HERD_RETURN_IF_ERROR(exchange.FinishPushes(rank, &loss).WithContext(at));
    if (CheckpointDue(config.checkpoint(), t + 1, last)) loader_state = sampler->SaveState();
    exchange.IssuePulls(weights.data(), static_cast<uint64_t>(t + 1));
  }
  HERD_RETURN_IF_ERROR(exchange.FinishPulls().WithContext("step " + std::to_string(last) + ": "));
  if (last > start) HERD_RETURN_IF_ERROR(finish_step(last));
  if (leader) {
    if (last < total_steps) {
      std::printf("stopped at step %lld of %lld (--stop-at); continue with --resume\n", static_cast<long long>(last),
                  static_cast<long long>(total_steps));
    } else {
      PrintSample(model, weights.data(), config);
      std::printf("done: %lld steps in %s\n", static_cast<long long>(last),
                  FormatDuration(run_clock.Seconds()).c_str());
    }
    if (auto memory = PlanMemory(config); memory.ok()) {
      std::printf("peak memory: %s (herd plan: %s)\n", FormatBytes(PeakRssBytes()).c_str(),
                  FormatBytes(memory->processes.back().total()).c_str());
    }
    std::fflush(stdout);
  }
  HERD_RETURN_IF_ERROR(client->Barrier("herd/done"));
  HERD_RETURN_IF_ERROR(client->Leave());
  pushpull.reset();  // stops the transport before the buffers go
  return Status::OK();
}

}  // namespace herd
