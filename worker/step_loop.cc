#include "worker/step_loop.h"

#include <algorithm>
#include <cstdio>
#include <vector>

#include "common/file_util.h"
#include "common/strings.h"
#include "common/trace.h"
#include "model/checkpoint_format.h"
#include "model/checkpoint_run.h"
#include "model/optim/optimizer_shard.h"
#include "model/param_layout.h"
#include "transport/checkpoint_commit.h"
#include "worker/evaluate.h"

#include <glog/logging.h>

namespace herd {
namespace {

// An error's prefix: "step 12: " (1-based).
std::string StepContext(int64_t step) { return "step " + std::to_string(step) + ": "; }

}  // namespace

StepLoop::StepLoop(const StepLoopParts& parts)
    : p_(parts),
      job_(*parts.job),
      strategy_(*parts.strategy),
      home_(*parts.home),
      compute_(*parts.compute),
      schedule_(*parts.schedule),
      checkpoints_(*parts.checkpoints),
      leader_(schedule_.leads()),
      total_steps_(job_.steps),
      last_step_(parts.options.LastStep(total_steps_)),
      tokens_per_step_(static_cast<int64_t>(job_.batch) * job_.seq_len * job_.grad_accum * parts.data_parallel),
      flops_per_token_(TrainingFlopsPerToken(job_.shape, job_.seq_len)),
      peak_tflops_(job_.log.peak_tflops > 0 ? job_.log.peak_tflops
                   : parts.model != nullptr                ? parts.model->PeakTflops()
                                                           : 0) {}

Status StepLoop::Run(int64_t start) {
  const int B = job_.batch, T = job_.seq_len, A = job_.grad_accum;
  start_ = start;
  if (leader_) {
    HERD_RETURN_IF_ERROR(p_.joined_under_way
                             ? log_.TakeOver(job_.log.metrics, job_.log.tensorboard)
                             : log_.Open(job_.log.metrics, job_.log.tensorboard, p_.options.resume));
  }
  // A step's micro-batches are all drawn before its first forward; micro-
  // batch a holds each of the step's shares' rows one after the other.
  inputs_.assign(A, std::vector<int32_t>(static_cast<size_t>(schedule_.max_shares()) * B * T));
  targets_ = inputs_;
  strategy_.IssueWeights(p_.weights, static_cast<uint64_t>(start));
  for (int64_t t = start; t < last_step_; ++t) {
    trace::Span step_span("step", "step", {"step", t + 1});
    StepBoundary previous([this, t] { return EndStep(t); });
    HERD_ASSIGN_OR_RETURN(const std::vector<int> shares, schedule_.SharesOf(t, previous));
    const DataPosition drawn_to = Draw(*p_.sampler, shares);
    if (EvaluatesAt(t)) HERD_RETURN_IF_ERROR(previous.Settle());
    for (size_t i = 0; i < shares.size(); ++i) {
      HERD_RETURN_IF_ERROR(ComputeShare(t, shares[i], i, drawn_to, previous));
    }
    if (job_.checkpoints.Due(t + 1, last_step_)) loader_state_ = p_.sampler->SaveState();
    strategy_.IssueWeights(p_.weights, static_cast<uint64_t>(t + 1));
  }
  HERD_RETURN_IF_ERROR(AwaitWeights(last_step_).WithContext(StepContext(last_step_)));
  if (last_step_ > start) HERD_RETURN_IF_ERROR(Epilogue(last_step_));
  HERD_RETURN_IF_ERROR(checkpoints_.Wait());
  HERD_RETURN_IF_ERROR(log_.Close());

  const bool done = last_step_ == total_steps_;
  // Every worker samples and evaluates, the leader alone prints and
  // records: a window gathered from the workers (ZeRO-3) needs them all.
  if (done) {
    const std::string sample = SampleText(*p_.model, p_.weights, job_, home_.EvalNeed());
    if (leader_) std::fputs(sample.c_str(), stdout);
  }
  // Every worker: a streaming window's pulls land before the transport
  // that carries them goes away.
  home_.Release();
  if (!leader_) return Status::OK();
  if (!done) {
    std::printf("stopped at step %lld of %lld (--stop-at); continue with --resume\n",
                static_cast<long long>(last_step_), static_cast<long long>(total_steps_));
  } else {
    std::printf("done: %lld steps in %s\n", static_cast<long long>(last_step_),
                FormatDuration(run_clock_.Seconds()).c_str());
  }
  std::fflush(stdout);
  return Status::OK();
}

DataPosition StepLoop::Draw(DistributedSampler& sampler, const std::vector<int>& shares) {
  trace::Span span("draw batches", "data");
  const int B = job_.batch;
  for (size_t a = 0; a < inputs_.size(); ++a) sampler.NextBatches(B, shares, inputs_[a].data(), targets_[a].data());
  return {sampler.epoch(), sampler.taken(), sampler.file_tokens()};
}

Status StepLoop::ComputeShare(int64_t t, int share, size_t slot, const DataPosition& drawn_to,
                              StepBoundary& previous) {
  const size_t rows = static_cast<size_t>(job_.batch) * job_.seq_len * slot;
  ShareBatches batches;
  for (size_t a = 0; a < inputs_.size(); ++a) {
    batches.inputs.push_back(inputs_[a].data() + rows);
    batches.targets.push_back(targets_[a].data() + rows);
  }
  batches.drawn_to = drawn_to;
  ++shares_computed_;
  // The compute's own errors say where they happened (the step before's
  // end, settled on the way, says its step).
  HERD_ASSIGN_OR_RETURN(const double loss, compute_.Compute(t, share, batches, previous));
  return strategy_.FinishStep(loss).WithContext(StepContext(t + 1));
}

Status StepLoop::EndStep(int64_t step) {
  HERD_RETURN_IF_ERROR(AwaitWeights(step).WithContext(step == start_ ? "initial weights: " : StepContext(step + 1)));
  if (step > start_) return Epilogue(step);
  strategy_.TakeWaitSeconds();  // the first pull is not a step's
  return Status::OK();
}

Status StepLoop::AwaitWeights(int64_t version) {
  const ShareSchedule::Redo redo = [this](int64_t t, const std::vector<int>& shares, DistributedSampler& sampler) {
    const DataPosition drawn_to = Draw(sampler, shares);
    StepBoundary passed = StepBoundary::Passed();
    for (size_t i = 0; i < shares.size(); ++i) HERD_RETURN_IF_ERROR(ComputeShare(t, shares[i], i, drawn_to, passed));
    return Status::OK();
  };
  HERD_RETURN_IF_ERROR(schedule_.AwaitWeights(version, version > start_, redo));
  TakeLeadIfGiven();
  return Status::OK();
}

void StepLoop::TakeLeadIfGiven() {
  if (leader_ || !schedule_.leads()) return;
  // The leader was lost: this worker prints and records progress now,
  // starting with the line it holds (the step the leader may not have
  // lived to record).
  leader_ = true;
  Status opened = log_.TakeOver(job_.log.metrics, job_.log.tensorboard);
  if (opened.ok() && held_line_.step > 0) opened = log_.Write(held_line_);
  if (!opened.ok()) LOG(WARNING) << opened.message();
}

bool StepLoop::EvaluatesAt(int64_t step) const {
  return step == last_step_ || (job_.log.eval_every > 0 && step % job_.log.eval_every == 0);
}

Status StepLoop::Epilogue(int64_t step) {
  trace::Span span("epilogue", "step", {"step", step});
  const StepReport& report = strategy_.report();
  window_tokens_ += tokens_per_step_;
  ++window_steps_;
  window_wait_ += strategy_.TakeWaitSeconds();
  HERD_RETURN_IF_ERROR(CheckNotDiverged("loss", report.mean_loss).WithContext(StepContext(step)));
  if (report.skipped != 0) {
    ++skipped_updates_;
    if (leader_) {
      std::printf("step %lld: update skipped: loss %.4f at z-score %.2f, gradient norm %.3f at z-score %.2f "
                  "(optimizer.skip_spikes_zscore %g; %lld skipped so far)\n",
                  static_cast<long long>(step), report.mean_loss, report.loss_z, report.grad_norm, report.norm_z,
                  job_.optimizer.skip_spikes_zscore, static_cast<long long>(skipped_updates_));
      std::fflush(stdout);
    }
  }

  const bool evaluates = EvaluatesAt(step);
  const bool logs = step % job_.log.every == 0 || step == start_ + 1 || step == last_step_ || evaluates;
  if (logs) {
    // Every worker makes the line; the leader writes it. One taking over
    // from a lost leader writes the line it holds (the step the leader may
    // not have lived to record) and reports the rate since then.
    ProgressLog::Entry e;
    e.step = step;
    e.total_steps = total_steps_;
    e.loss = report.mean_loss;
    e.lr = report.lr;
    e.grad_norm = report.grad_norm;
    e.skipped = report.skipped != 0;
    const double window_s = window_clock_.Seconds();
    e.tokens_per_s = window_s > 0 ? window_tokens_ / window_s : 0;
    e.step_s = window_s / window_steps_;
    if (peak_tflops_ > 0) e.mfu = e.tokens_per_s * flops_per_token_ / (peak_tflops_ * 1e12 * p_.num_workers);
    if (p_.client != nullptr) e.network_wait = window_s > 0 ? window_wait_ / window_s : 0;
    e.elapsed_s = run_clock_.Seconds();
    e.eta_s = e.tokens_per_s > 0 ? (total_steps_ - step) * tokens_per_step_ / e.tokens_per_s : 0;
    if (evaluates) {
      trace::Span eval("evaluate", "compute", {"step", step});
      e.val_loss = ValidationLoss(*p_.model, p_.weights, p_.val, job_, home_.EvalNeed());
      home_.Release();
    }
    if (leader_) {
      HERD_RETURN_IF_ERROR(log_.Write(e));
    } else {
      held_line_ = e;
    }
    window_clock_.Reset();
    window_tokens_ = 0;
    window_steps_ = 0;
    window_wait_ = 0;
  }
  if (job_.checkpoints.Due(step, last_step_)) {
    HERD_RETURN_IF_ERROR(checkpoints_.Commit(step, loader_state_, leader_));
  }
  return Status::OK();
}

}  // namespace herd
