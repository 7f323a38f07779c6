// The training step, written once for every mode (DESIGN.md "One training
// step"). Each step: this worker's micro-batches (its own disjoint
// sequences of the global batch), forward and backward on them, and the
// SyncStrategy (worker/sync_strategy.h) that turns the gradients into the
// next weights — by itself (one process), through parameter servers, or by
// all-reduce among the workers. Then one epilogue for every mode: the
// divergence check, the progress line and metrics, evaluation, and the
// checkpoint commit.
//
// Overlap: during the last backward each gradient bucket leaves as soon as
// backward has finished it; the next weights arrive bucket by bucket in
// forward order while the next forward runs, which waits only for its
// layer's. So step t's epilogue runs once all of version t is in, after
// step t+1's first forward — or before it when the epilogue evaluates
// (evaluation reuses the model's activations, which backward needs).
// With streamed weights (SyncStrategy::streams_weights) every forward and
// backward, evaluation's and the sample's too, goes through the
// strategy's hooks, which bring each layer in and let it go.
//
// Promises: the loss and gradient norm reported are global (the mean over
// workers, the norm of the summed gradient); the same config gives
// bitwise-identical runs (for a given thread count); a run resumed from a
// step-K checkpoint continues exactly as the uninterrupted one; a
// checkpoint is committed only once every part of it is written. Worker 0
// prints progress, evaluates and samples; every worker writes its
// data-loader position into each checkpoint (in parameter-server mode with
// checkpoint.background, on a thread of its own while training goes on;
// in an elastic job the servers write it, from the position the workers
// report with their losses).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/run_options.h"
#include "common/status.h"
#include "data/sampler.h"
#include "data/token_file.h"
#include "model/model.h"
#include "proto/herd.pb.h"
#include "transport/checkpoint_commit.h"
#include "transport/coordinator_client.h"
#include "worker/elastic_shares.h"
#include "worker/progress_log.h"
#include "worker/sync_strategy.h"

namespace herd {

// What the loop drives; the caller (worker/worker.cc) owns every part and
// keeps it alive for the loop's life.
struct StepLoopParts {
  const config::JobConfig* config = nullptr;
  TrainOptions options;
  Model* model = nullptr;  // forward, backward, evaluation and sampling
  SyncStrategy* strategy = nullptr;
  DistributedSampler* sampler = nullptr;  // this worker's sequences
  const TokenFile* val = nullptr;         // held-out data, or null
  // The whole flat space: the weights the model computes on, and its
  // gradients (null when the strategy computes the step itself).
  float* weights = nullptr;
  float* grads = nullptr;
  int rank = 0, num_workers = 1;
  // Null for one process: nobody to wait for or vote with.
  transport::CoordinatorClient* client = nullptr;
  // An elastic parameter-server job (cluster.elastic): which shares of the
  // global batch this worker computes, as workers are lost and join; else
  // null. A worker that joined starts at the step its caller found (the
  // sampler already at that step's data position).
  const ElasticShares* shares = nullptr;
};

class StepLoop {
 public:
  explicit StepLoop(const StepLoopParts& parts);

  // Takes the steps after `start` (steps already taken) up to the run's
  // last step (options.LastStep), then prints how the run ended.
  Status Run(int64_t start);
  // The run's last step (options.LastStep of train.steps).
  int64_t last_step() const { return last_step_; }
  // Shares of the global batch computed (one a step, but in an elastic job).
  int64_t shares_computed() const { return shares_computed_; }

 private:
  // Draws the step's micro-batches of `shares` from `sampler`.
  void Draw(DistributedSampler& sampler, const std::vector<int>& shares);
  // Forward and backward of one share of step t (0-based) on the rows at
  // `slot` of the drawn micro-batches, its gradients pushed as backward
  // finishes them; `wait_first` lets the first forward wait for the
  // weights layer by layer (every forward does when they are streamed),
  // and `settle` runs after it.
  Status ComputeShare(int64_t t, int share, size_t slot, bool wait_first, const std::function<Status()>& settle);
  // Waits until all of weights `version` are in. Elastic: a worker lost
  // meanwhile has this worker compute its part of the lost shares of the
  // step that makes `version`, and the progress line says who was lost
  // (or joined).
  Status AwaitWeights(int64_t version);
  Status TakeOverShares(int64_t t);
  void NoteMembership(int64_t step);
  // Step `step` (1-based) is done and its weights are in.
  Status Epilogue(int64_t step);
  bool EvaluatesAt(int64_t step) const;
  Status CommitCheckpoint(int64_t step);

  const StepLoopParts p_;
  const config::JobConfig& config_;
  SyncStrategy& strategy_;
  bool leader_;  // prints progress and evaluates (elastic: the lowest live rank)
  const int64_t total_steps_, last_step_, tokens_per_step_;
  const double flops_per_token_;
  // One worker's peak for MFU: log.peak_tflops, else the device's own
  // (model/peak_flops.h); 0: no MFU.
  const double peak_tflops_;
  // Forward's hook: waits for the weights it reaches (all of them, layer by
  // layer, when the strategy streams them).
  const Model::NeedUpTo wait_pulled_;
  // What a forward outside training (evaluation, the sample) needs:
  // wait_pulled_ when the weights are streamed, else nothing.
  Model::NeedUpTo streamed_need() const;

  int64_t start_ = 0;
  ProgressLog log_;
  Stopwatch run_clock_, window_clock_;
  int64_t window_tokens_ = 0, window_steps_ = 0;
  int64_t skipped_updates_ = 0;  // by the spike guard, this run
  double window_wait_ = 0;
  std::string loader_state_;  // the data position after the step to checkpoint
  // The step's micro-batches: [grad_accum][shares x batch x seq_len].
  std::vector<std::vector<int32_t>> inputs_, targets_;
  std::vector<int> computed_;  // the shares this worker computed of the step in flight
  std::string drawn_from_;     // elastic: the data position the step in flight was drawn from
  int drawn_stamp_ = 0;        // elastic: the membership epoch its shares were dealt by
  int64_t shares_computed_ = 0;
  int reported_epoch_ = 0;     // elastic: the membership changes told so far
  ProgressLog::Entry held_line_;  // a follower's latest progress line (step 0: none)
  // Checkpoints whose parts here are only the data position (the servers
  // hold the optimizer state) are committed in the background.
  transport::BackgroundCommit background_;
};

}  // namespace herd
