#include "worker/step_loop.h"

#include <algorithm>
#include <cstdio>
#include <vector>

#include "common/file_util.h"
#include "common/strings.h"
#include "model/checkpoint_format.h"
#include "model/checkpoint_run.h"
#include "model/optim/optimizer_shard.h"
#include "transport/checkpoint_commit.h"
#include "worker/evaluate.h"

namespace herd {

StepLoop::StepLoop(const StepLoopParts& parts)
    : p_(parts),
      config_(*parts.config),
      strategy_(*parts.strategy),
      leader_(parts.rank == 0),
      total_steps_(config_.train().steps()),
      last_step_(parts.options.LastStep(total_steps_)),
      tokens_per_step_(static_cast<int64_t>(config_.train().batch_size()) * config_.train().seq_len() *
                       config_.train().grad_accum() * parts.num_workers) {}

Status StepLoop::Run(int64_t start) {
  const int B = config_.train().batch_size(), T = config_.train().seq_len(), A = config_.train().grad_accum();
  const int64_t P = p_.model->layout().size();
  const double loss_scale = 1.0 / static_cast<double>(tokens_per_step_);
  start_ = start;
  if (leader_) HERD_RETURN_IF_ERROR(log_.Open(config_.log().metrics(), p_.options.resume));
  // A step's micro-batches are all drawn before its first forward (a
  // strategy that computes the step takes them at once).
  std::vector<std::vector<int32_t>> inputs(A, std::vector<int32_t>(static_cast<size_t>(B) * T)), targets = inputs;
  std::vector<const int32_t*> input_ptrs, target_ptrs;
  for (int a = 0; a < A; ++a) {
    input_ptrs.push_back(inputs[a].data());
    target_ptrs.push_back(targets[a].data());
  }
  const Model::FinalFrom push_ready = [this](int64_t offset) { strategy_.FinalFrom(offset); };
  const Model::NeedUpTo wait_pulled = [this](int64_t end) { strategy_.WaitUpTo(end); };

  strategy_.IssueWeights(p_.weights, static_cast<uint64_t>(start));
  for (int64_t t = start; t < last_step_; ++t) {
    const std::string at = "step " + std::to_string(t + 1) + ": ";
    for (int a = 0; a < A; ++a) p_.sampler->NextBatch(B, inputs[a].data(), targets[a].data());
    // Version t of the weights is all in: step t's epilogue (none before
    // the run's first step).
    bool settled = false;
    auto settle = [&]() -> Status {
      if (settled) return Status::OK();
      settled = true;
      HERD_RETURN_IF_ERROR(strategy_.FinishWeights().WithContext(t == start ? "initial weights: " : at));
      if (t == start) {
        strategy_.TakeWaitSeconds();  // the first pull is not a step's
        return Status::OK();
      }
      return Epilogue(t);
    };
    if (strategy_.computes_step() || EvaluatesAt(t)) HERD_RETURN_IF_ERROR(settle());

    double loss = 0;
    if (strategy_.computes_step()) {
      HERD_ASSIGN_OR_RETURN(loss, strategy_.ComputeStep(input_ptrs, target_ptrs, static_cast<uint64_t>(t)));
    } else {
      std::fill(p_.grads, p_.grads + P, 0.0f);
      for (int micro = 0; micro < A; ++micro) {
        loss += p_.model->Forward(p_.weights, inputs[micro].data(), targets[micro].data(), B, T,
                                  micro == 0 ? wait_pulled : nullptr);
        if (micro == 0) HERD_RETURN_IF_ERROR(settle());
        const bool last_micro = micro == A - 1;
        if (last_micro) strategy_.BeginStep(p_.grads, static_cast<uint64_t>(t));
        p_.model->Backward(p_.weights, p_.grads, loss_scale, last_micro ? push_ready : nullptr, last_micro);
      }
      loss /= A;
    }
    HERD_RETURN_IF_ERROR(strategy_.FinishStep(loss).WithContext(at));
    if (CheckpointDue(config_.checkpoint(), t + 1, last_step_)) loader_state_ = p_.sampler->SaveState();
    strategy_.IssueWeights(p_.weights, static_cast<uint64_t>(t + 1));
  }
  HERD_RETURN_IF_ERROR(strategy_.FinishWeights().WithContext("step " + std::to_string(last_step_) + ": "));
  if (last_step_ > start) HERD_RETURN_IF_ERROR(Epilogue(last_step_));
  HERD_RETURN_IF_ERROR(background_.Wait());
  HERD_RETURN_IF_ERROR(log_.Close());

  if (!leader_) return Status::OK();
  if (last_step_ < total_steps_) {
    std::printf("stopped at step %lld of %lld (--stop-at); continue with --resume\n",
                static_cast<long long>(last_step_), static_cast<long long>(total_steps_));
  } else {
    PrintSample(*p_.model, p_.weights, config_);
    std::printf("done: %lld steps in %s\n", static_cast<long long>(last_step_),
                FormatDuration(run_clock_.Seconds()).c_str());
  }
  std::fflush(stdout);
  return Status::OK();
}

bool StepLoop::EvaluatesAt(int64_t step) const {
  return step == last_step_ || (config_.log().eval_every() > 0 && step % config_.log().eval_every() == 0);
}

Status StepLoop::Epilogue(int64_t step) {
  const StepReport& report = strategy_.report();
  window_tokens_ += tokens_per_step_;
  window_wait_ += strategy_.TakeWaitSeconds();
  HERD_RETURN_IF_ERROR(CheckNotDiverged("loss", report.mean_loss).WithContext("step " + std::to_string(step) + ": "));

  const bool evaluates = EvaluatesAt(step);
  if (leader_ && (step % config_.log().every() == 0 || step == start_ + 1 || step == last_step_ || evaluates)) {
    ProgressLog::Entry e;
    e.step = step;
    e.total_steps = total_steps_;
    e.loss = report.mean_loss;
    e.lr = report.lr;
    e.grad_norm = report.grad_norm;
    const double window_s = window_clock_.Seconds();
    e.tokens_per_s = window_s > 0 ? window_tokens_ / window_s : 0;
    if (p_.client != nullptr) e.network_wait = window_s > 0 ? window_wait_ / window_s : 0;
    e.elapsed_s = run_clock_.Seconds();
    e.eta_s = e.tokens_per_s > 0 ? (total_steps_ - step) * tokens_per_step_ / e.tokens_per_s : 0;
    if (evaluates) e.val_loss = ValidationLoss(*p_.model, p_.weights, p_.val, config_);
    HERD_RETURN_IF_ERROR(log_.Write(e));
    window_clock_.Reset();
    window_tokens_ = 0;
    window_wait_ = 0;
  }
  if (CheckpointDue(config_.checkpoint(), step, last_step_)) HERD_RETURN_IF_ERROR(CommitCheckpoint(step));
  return Status::OK();
}

Status StepLoop::CommitCheckpoint(int64_t step) {
  const std::string step_dir = StepDirName(config_.checkpoint().dir(), step);
  const int shards = strategy_.shard_files();
  const std::vector<std::string> parts = CheckpointParts(shards, p_.num_workers);
  // Worker 0 commits unless servers hold the optimizer (they commit then).
  auto commit = [this, step_dir, step, parts, shards, loader = loader_state_] {
    Stopwatch sw;
    auto write_parts = [&] {
      Status part = WriteFileAtomic(JoinPath(step_dir, WorkerFileName(p_.rank)), loader);
      return part.ok() ? strategy_.WriteCheckpointParts(step_dir) : part;
    };
    HERD_RETURN_IF_ERROR(
        transport::CommitCheckpoint(p_.client, step_dir, step, config_, leader_ && shards > 0, parts, write_parts));
    if (leader_) {
      std::printf("checkpoint: %s (%.1fs)\n", step_dir.c_str(), sw.Seconds());
      std::fflush(stdout);
    }
    return Status::OK();
  };
  // Only the data position is written here when servers hold the rest.
  if (shards > 0 || p_.client == nullptr || !config_.checkpoint().background()) return commit();
  HERD_RETURN_IF_ERROR(background_.Wait());  // the previous checkpoint first
  background_.Start(commit);
  return Status::OK();
}

}  // namespace herd
