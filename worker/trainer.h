// The single-process trainer (cluster.sync NONE): data, model, AdamW,
// progress, metrics, evaluation, checkpoints and resume in one process —
// the baseline that the distributed modes must reproduce.
//
// Promises: the same config gives bitwise-identical runs (for a given
// thread count); a run resumed from a step-K checkpoint continues exactly
// as the uninterrupted run would; checkpoints are committed atomically.
#pragma once

#include <string>

#include "common/status.h"
#include "proto/herd.pb.h"

namespace herd {

struct TrainOptions {
  // Continue from the newest complete checkpoint in checkpoint.dir.
  bool resume = false;
  // Stop after this step (checkpointing there) without changing the
  // schedule, which still spans train.steps; 0 = run to the end.
  int64_t stop_at_step = 0;
};

Status TrainSingleProcess(const config::JobConfig& config, const TrainOptions& options);

}  // namespace herd
