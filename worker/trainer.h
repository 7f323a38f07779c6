// The single-process trainer (cluster.sync NONE): data, model, AdamW,
// progress, metrics, evaluation, checkpoints and resume in one process —
// the baseline that the distributed modes must reproduce.
//
// Promises: the same config gives bitwise-identical runs (for a given
// thread count); a run resumed from a step-K checkpoint continues exactly
// as the uninterrupted run would; checkpoints are committed atomically.
#pragma once

#include <string>

#include "common/run_options.h"
#include "common/status.h"
#include "proto/herd.pb.h"

namespace herd {

Status TrainSingleProcess(const config::JobConfig& config, const TrainOptions& options);

}  // namespace herd
