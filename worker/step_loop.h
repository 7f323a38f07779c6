// The training step, written once for every mode (docs/design.md "One training
// step"). Each step: the shares of the global batch this worker computes
// (ShareSchedule: its own, or in an elastic job those the membership gives
// it), forward and backward on them (ShareCompute, reaching the weights
// through the WeightHome), and the SyncStrategy (worker/reducers/sync_strategy.h)
// that turns the gradients into the next weights — by itself (one
// process), through parameter servers, or by all-reduce among the workers.
// Then one epilogue for every mode: the divergence check, the progress
// line and metrics, evaluation, and the checkpoint commit. The loop names
// none of the modes: each axis is the object it is handed.
//
// Overlap: during the last backward each gradient bucket leaves as soon as
// backward has finished it; the next weights arrive bucket by bucket in
// forward order while the next forward runs, which waits only for its
// layer's. So step t's epilogue runs once all of version t is in, after
// step t+1's first forward (StepBoundary, worker/share_compute.h) — or
// before it when the epilogue evaluates (evaluation reuses the model's
// activations, which backward needs).
//
// Promises: the loss and gradient norm reported are global (the mean over
// workers, the norm of the summed gradient); the same job gives
// bitwise-identical runs (for a given thread count); a run resumed from a
// step-K checkpoint continues exactly as the uninterrupted one; a
// checkpoint is committed only once every part of it is written. Every
// worker evaluates and samples (so that a window gathered from all of them,
// ZeRO-3, can serve those passes); the leading worker prints and records
// them with the progress; every worker writes its data-loader position into each checkpoint (in
// parameter-server mode with checkpoint.background, on a thread of its own
// while training goes on) unless the servers write it.
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
#include "sharding/job_options.h"
#include "transport/coordinator_client.h"
#include "worker/checkpoint_writer.h"
#include "worker/progress_log.h"
#include "worker/reducers/sync_strategy.h"
#include "worker/reducers/weight_home.h"
#include "worker/share_compute.h"
#include "worker/share_schedule.h"

namespace herd {

// What the loop drives; the caller (worker/worker.cc) owns every part and
// keeps it alive for the loop's life.
struct StepLoopParts {
  const JobOptions* job = nullptr;
  TrainOptions options;
  Model* model = nullptr;  // evaluation and sampling
  SyncStrategy* strategy = nullptr;
  WeightHome* home = nullptr;
  ShareCompute* compute = nullptr;
  ShareSchedule* schedule = nullptr;
  CheckpointWriter* checkpoints = nullptr;
  DistributedSampler* sampler = nullptr;  // this worker's sequences
  const TokenFile* val = nullptr;         // held-out data, or null
  float* weights = nullptr;               // the whole flat space the model computes on
  int rank = 0, num_workers = 1;
  // Replicas of the model that each take a share of the global batch:
  // num_workers, but for a pipeline (num_workers / its stages).
  int data_parallel = 1;
  // Null for one process: nobody to wait for or vote with.
  transport::CoordinatorClient* client = nullptr;
  // A worker that joined the job under way: leading, it continues the
  // metrics file (ProgressLog::TakeOver) rather than starting it.
  bool joined_under_way = false;
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
  // Draws the step's micro-batches of `shares` from `sampler`; the data
  // position after the draw.
  DataPosition Draw(DistributedSampler& sampler, const std::vector<int>& shares);
  // Forward and backward of one share of step t (0-based) on the rows at
  // `slot` of the drawn micro-batches, then the strategy's FinishStep.
  Status ComputeShare(int64_t t, int share, size_t slot, const DataPosition& drawn_to, StepBoundary& previous);
  // The end of step `step` (its weights `step` all in): the epilogue, but
  // for the run's first weights.
  Status EndStep(int64_t step);
  // Waits until all of weights `version` are in (the schedule may redo
  // lost shares meanwhile); takes over the progress log if the lead came
  // here.
  Status AwaitWeights(int64_t version);
  void TakeLeadIfGiven();
  // Step `step` (1-based) is done and its weights are in.
  Status Epilogue(int64_t step);
  bool EvaluatesAt(int64_t step) const;

  const StepLoopParts p_;
  const JobOptions& job_;
  SyncStrategy& strategy_;
  WeightHome& home_;
  ShareCompute& compute_;
  ShareSchedule& schedule_;
  CheckpointWriter& checkpoints_;
  bool leader_;  // prints and records progress (schedule_.leads(), once it does)
  const int64_t total_steps_, last_step_, tokens_per_step_;
  const double flops_per_token_;
  // One worker's peak for MFU: log.peak_tflops, else the device's own
  // (model/peak_flops.h); 0: no MFU.
  const double peak_tflops_;

  int64_t start_ = 0;
  ProgressLog log_;
  Stopwatch run_clock_, window_clock_;
  int64_t window_tokens_ = 0, window_steps_ = 0;
  int64_t skipped_updates_ = 0;  // by the spike guard, this run
  double window_wait_ = 0;
  std::string loader_state_;  // the data position after the step to checkpoint
  // The step's micro-batches: [grad_accum][shares x batch x seq_len].
  std::vector<std::vector<int32_t>> inputs_, targets_;
  int64_t shares_computed_ = 0;
  ProgressLog::Entry held_line_;  // a follower's latest progress line (step 0: none)
};

}  // namespace herd
