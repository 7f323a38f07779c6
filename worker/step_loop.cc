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

DataPosition PositionOf(const DistributedSampler& sampler) {
  return {sampler.epoch(), sampler.taken(), sampler.file_tokens()};
}

}  // namespace

StepLoop::StepLoop(const StepLoopParts& parts)
    : p_(parts),
      config_(*parts.config),
      strategy_(*parts.strategy),
      leader_(parts.shares != nullptr ? parts.shares->leader() == parts.rank : parts.rank == 0),
      total_steps_(config_.train().steps()),
      last_step_(parts.options.LastStep(total_steps_)),
      tokens_per_step_(static_cast<int64_t>(config_.train().batch_size()) * config_.train().seq_len() *
                       config_.train().grad_accum() * parts.num_workers),
      flops_per_token_(TrainingFlopsPerToken(LlamaShape::FromConfig(config_.model()), config_.train().seq_len())),
      peak_tflops_(config_.log().peak_tflops() > 0 ? config_.log().peak_tflops() : parts.model->PeakTflops()),
      wait_pulled_([this](int64_t end) { strategy_.WaitUpTo(end); }) {}

Model::NeedUpTo StepLoop::streamed_need() const { return strategy_.streams_weights() ? wait_pulled_ : nullptr; }

Status StepLoop::Run(int64_t start) {
  const int B = config_.train().batch_size(), T = config_.train().seq_len(), A = config_.train().grad_accum();
  start_ = start;
  if (leader_) HERD_RETURN_IF_ERROR(log_.Open(config_.log().metrics(), config_.log().tensorboard(), p_.options.resume));
  // A step's micro-batches are all drawn before its first forward (a
  // strategy that computes the step takes them at once); an elastic
  // worker's micro-batch a holds each of its shares' rows one after the
  // other.
  const int max_shares = p_.shares != nullptr ? p_.num_workers : 1;
  inputs_.assign(A, std::vector<int32_t>(static_cast<size_t>(max_shares) * B * T));
  targets_ = inputs_;
  strategy_.IssueWeights(p_.weights, static_cast<uint64_t>(start));
  for (int64_t t = start; t < last_step_; ++t) {
    trace::Span step_span("step", "step", {"step", t + 1});
    const std::string at = "step " + std::to_string(t + 1) + ": ";
    // Version t of the weights is all in: step t's epilogue (none before
    // the run's first step).
    bool settled = false;
    auto settle = [&]() -> Status {
      if (settled) return Status::OK();
      settled = true;
      HERD_RETURN_IF_ERROR(AwaitWeights(t).WithContext(t == start ? "initial weights: " : at));
      if (t == start) {
        strategy_.TakeWaitSeconds();  // the first pull is not a step's
        return Status::OK();
      }
      return Epilogue(t);
    };
    // Elastic: which shares this worker computes is settled at the step
    // boundary, after the weights (and any share taken over) are in, by
    // the membership the previous step's report names.
    std::vector<int> shares{p_.rank};
    if (p_.shares != nullptr) {
      HERD_RETURN_IF_ERROR(settle());
      drawn_stamp_ = static_cast<int>(strategy_.report().membership_epoch);
      HERD_RETURN_IF_ERROR(p_.shares->AwaitEpoch(drawn_stamp_, [this] { return p_.client->health(); }));
      shares = p_.shares->Mine(drawn_stamp_);
      drawn_from_ = p_.sampler->SaveState();
    }
    Draw(*p_.sampler, shares);
    strategy_.SetDrawnTo(PositionOf(*p_.sampler));
    if (strategy_.computes_step() || EvaluatesAt(t)) HERD_RETURN_IF_ERROR(settle());

    if (strategy_.computes_step()) {
      std::vector<const int32_t*> input_ptrs, target_ptrs;
      for (int a = 0; a < A; ++a) {
        input_ptrs.push_back(inputs_[a].data());
        target_ptrs.push_back(targets_[a].data());
      }
      HERD_ASSIGN_OR_RETURN(const double loss, strategy_.ComputeStep(input_ptrs, target_ptrs, static_cast<uint64_t>(t)));
      HERD_RETURN_IF_ERROR(strategy_.FinishStep(loss).WithContext(at));
    } else {
      for (size_t i = 0; i < shares.size(); ++i) {
        // The first forward waits for the weights layer by layer, and the
        // previous step's epilogue runs once they are all in.
        HERD_RETURN_IF_ERROR(ComputeShare(t, shares[i], i, !settled, settle).WithContext(at));
      }
    }
    computed_ = shares;
    if (CheckpointDue(config_.checkpoint(), t + 1, last_step_)) loader_state_ = p_.sampler->SaveState();
    strategy_.IssueWeights(p_.weights, static_cast<uint64_t>(t + 1));
  }
  HERD_RETURN_IF_ERROR(AwaitWeights(last_step_).WithContext("step " + std::to_string(last_step_) + ": "));
  if (last_step_ > start) HERD_RETURN_IF_ERROR(Epilogue(last_step_));
  HERD_RETURN_IF_ERROR(background_.Wait());
  HERD_RETURN_IF_ERROR(log_.Close());

  const bool done = last_step_ == total_steps_;
  if (leader_ && done) PrintSample(*p_.model, p_.weights, config_, streamed_need());
  // Every worker: a streaming window's pulls land before the transport
  // that carries them goes away.
  strategy_.ReleaseWeights();
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

void StepLoop::Draw(DistributedSampler& sampler, const std::vector<int>& shares) {
  trace::Span span("draw batches", "data");
  const int B = config_.train().batch_size();
  for (size_t a = 0; a < inputs_.size(); ++a) {
    if (p_.shares != nullptr) {
      sampler.NextBatches(B, shares, inputs_[a].data(), targets_[a].data());
    } else {
      sampler.NextBatch(B, inputs_[a].data(), targets_[a].data());
    }
  }
}

Status StepLoop::ComputeShare(int64_t t, int share, size_t slot, bool wait_first,
                              const std::function<Status()>& settle) {
  const int B = config_.train().batch_size(), T = config_.train().seq_len(), A = config_.train().grad_accum();
  const int64_t P = p_.model->layout().size();
  const double loss_scale = 1.0 / static_cast<double>(tokens_per_step_);
  const size_t rows = static_cast<size_t>(B) * T * slot;
  // Every backward tells a streaming strategy where it no longer reads
  // weights; the last one also hands over the gradients.
  const Model::FinalFrom push_ready = [this](int64_t offset) {
    strategy_.FinalFrom(offset);
    strategy_.DoneFrom(offset);
  };
  const Model::FinalFrom done = [this](int64_t offset) { strategy_.DoneFrom(offset); };
  const Model::NeedFrom need_from = [this](int64_t begin) { strategy_.WaitFrom(begin); };
  const bool streams = strategy_.streams_weights();
  strategy_.SetShare(share);
  ++shares_computed_;
  if (!streams) std::fill(p_.grads, p_.grads + P, 0.0f);  // a streaming strategy keeps them zero
  if (streams && A > 1 && p_.model->layer_major_slots() >= A) {
    // Every micro-batch through each unit at once: each unit pulled once
    // a pass, and its gradients final (and pushed) as the pass leaves it.
    std::vector<const int32_t*> tokens, targets;
    for (int micro = 0; micro < A; ++micro) {
      tokens.push_back(inputs_[micro].data() + rows);
      targets.push_back(targets_[micro].data() + rows);
    }
    strategy_.BeginStep(p_.grads, static_cast<uint64_t>(t));
    double loss = 0;
    {
      trace::Span span("forward and backward", "compute", {"step", t + 1}, {"micro_batches", A}, {"share", share});
      loss = p_.model->ForwardBackwardLayerMajor(p_.weights, p_.grads, tokens, targets, B, T, loss_scale, wait_pulled_,
                                                 need_from, push_ready);
    }
    HERD_RETURN_IF_ERROR(settle());
    return strategy_.FinishStep(loss / A);
  }
  double loss = 0;
  for (int micro = 0; micro < A; ++micro) {
    {
      trace::Span span("forward", "compute", {"step", t + 1}, {"micro", micro}, {"share", share});
      loss += p_.model->Forward(p_.weights, inputs_[micro].data() + rows, targets_[micro].data() + rows, B, T,
                                (micro == 0 && wait_first) || streams ? wait_pulled_ : nullptr);
    }
    if (micro == 0) HERD_RETURN_IF_ERROR(settle());
    const bool last_micro = micro == A - 1;
    if (last_micro) strategy_.BeginStep(p_.grads, static_cast<uint64_t>(t));
    trace::Span span("backward", "compute", {"step", t + 1}, {"micro", micro}, {"share", share});
    p_.model->Backward(p_.weights, p_.grads, loss_scale, last_micro ? push_ready : (streams ? done : nullptr), last_micro,
                       streams ? need_from : nullptr);
  }
  return strategy_.FinishStep(loss / A);
}

Status StepLoop::AwaitWeights(int64_t version) {
  if (p_.shares == nullptr) return strategy_.FinishWeights();
  for (;;) {
    const int seen = p_.shares->epoch();
    // Workers lost while the step that makes `version` was under way (before
    // this wait or during it): this worker computes the lost shares the
    // membership now gives it (the servers drop any that turn out to be in
    // already).
    if (version > start_) HERD_RETURN_IF_ERROR(TakeOverShares(version - 1));
    HERD_ASSIGN_OR_RETURN(const bool in, strategy_.FinishWeightsUnless([&] { return p_.shares->epoch() != seen; }));
    if (in) break;
  }
  NoteMembership(version);
  return Status::OK();
}

Status StepLoop::TakeOverShares(int64_t t) {
  std::vector<int> todo;
  for (int share : p_.shares->Mine(drawn_stamp_)) {
    if (std::find(computed_.begin(), computed_.end(), share) == computed_.end()) todo.push_back(share);
  }
  if (todo.empty()) return Status::OK();
  // The step's sequences of those shares: drawn from where the step's
  // were, by a copy of the sampler (this one has moved on).
  DistributedSampler replay = *p_.sampler;
  HERD_RETURN_IF_ERROR(replay.RestoreState(drawn_from_));
  Draw(replay, todo);
  strategy_.SetDrawnTo(PositionOf(replay));
  const auto none = [] { return Status::OK(); };
  for (size_t i = 0; i < todo.size(); ++i) HERD_RETURN_IF_ERROR(ComputeShare(t, todo[i], i, /*wait_first=*/false, none));
  computed_.insert(computed_.end(), todo.begin(), todo.end());
  return Status::OK();
}

void StepLoop::NoteMembership(int64_t step) {
  const std::vector<transport::MembershipChange> changes = p_.shares->ChangesSince(reported_epoch_);
  if (changes.empty()) return;
  reported_epoch_ = changes.back().epoch;
  if (p_.shares->leader() != p_.rank) return;
  if (!leader_) {
    // The leader was lost: this worker prints and records progress now.
    leader_ = true;
    Status opened = log_.TakeOver(config_.log().metrics(), config_.log().tensorboard());
    if (opened.ok() && held_line_.step > 0) opened = log_.Write(held_line_);
    if (!opened.ok()) LOG(WARNING) << opened.message();
  }
  for (const auto& c : changes) {
    if (c.joined) {
      std::printf("worker %d joined at step %lld: continuing with %zu\n", c.member.rank(),
                  static_cast<long long>(step), c.live_workers.size());
    } else {
      std::printf("worker %d lost at step %lld: continuing with %zu (%s)\n", c.member.rank(),
                  static_cast<long long>(step), c.live_workers.size(), c.reason.c_str());
    }
  }
  std::fflush(stdout);
}

bool StepLoop::EvaluatesAt(int64_t step) const {
  return step == last_step_ || (config_.log().eval_every() > 0 && step % config_.log().eval_every() == 0);
}

Status StepLoop::Epilogue(int64_t step) {
  trace::Span span("epilogue", "step", {"step", step});
  const StepReport& report = strategy_.report();
  window_tokens_ += tokens_per_step_;
  ++window_steps_;
  window_wait_ += strategy_.TakeWaitSeconds();
  HERD_RETURN_IF_ERROR(CheckNotDiverged("loss", report.mean_loss).WithContext("step " + std::to_string(step) + ": "));
  if (report.skipped != 0) {
    ++skipped_updates_;
    if (leader_) {
      std::printf("step %lld: update skipped: loss %.4f at z-score %.2f, gradient norm %.3f at z-score %.2f "
                  "(optimizer.skip_spikes_zscore %g; %lld skipped so far)\n",
                  static_cast<long long>(step), report.mean_loss, report.loss_z, report.grad_norm, report.norm_z,
                  config_.optimizer().skip_spikes_zscore(), static_cast<long long>(skipped_updates_));
      std::fflush(stdout);
    }
  }

  const bool evaluates = EvaluatesAt(step);
  const bool logs = step % config_.log().every() == 0 || step == start_ + 1 || step == last_step_ || evaluates;
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
    if (leader_) {
      if (evaluates) {
        trace::Span eval("evaluate", "compute", {"step", step});
        e.val_loss = ValidationLoss(*p_.model, p_.weights, p_.val, config_, streamed_need());
        strategy_.ReleaseWeights();
      }
      HERD_RETURN_IF_ERROR(log_.Write(e));
    } else {
      held_line_ = e;
    }
    window_clock_.Reset();
    window_tokens_ = 0;
    window_steps_ = 0;
    window_wait_ = 0;
  }
  // An elastic job's servers write its checkpoints, the data position too.
  if (CheckpointDue(config_.checkpoint(), step, last_step_) && p_.shares == nullptr) {
    HERD_RETURN_IF_ERROR(CommitCheckpoint(step));
  }
  return Status::OK();
}

Status StepLoop::CommitCheckpoint(int64_t step) {
  const std::string step_dir = StepDirName(config_.checkpoint().dir(), step);
  const int shards = strategy_.shard_files();
  const std::vector<std::string> parts = CheckpointParts(shards, p_.num_workers);
  // Worker 0 commits unless servers hold the optimizer (they commit then).
  auto commit = [this, step_dir, step, parts, shards, leader = leader_, loader = loader_state_] {
    Stopwatch sw;
    auto write_parts = [&] {
      HERD_RETURN_IF_ERROR(WriteFileAtomic(JoinPath(step_dir, WorkerFileName(p_.rank)), loader));
      return strategy_.WriteCheckpointParts(step_dir);
    };
    HERD_RETURN_IF_ERROR(
        transport::CommitCheckpoint(p_.client, step_dir, step, config_, leader && shards > 0, parts, write_parts));
    if (leader) {
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
