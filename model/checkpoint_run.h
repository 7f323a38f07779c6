// A run and its checkpoints: when it writes one, whether it can write any,
// and whether a checkpoint (or a checkpoint.dir) may start or continue it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "common/status.h"
#include "common/run_options.h"
#include "model/checkpoint_load.h"
#include "proto/herd.pb.h"

namespace herd {

// When a run writes checkpoints (checkpoint.dir and checkpoint.every).
struct CheckpointSchedule {
  std::string dir;     // empty: never
  int64_t every = 0;   // 0: at the last step only
  static CheckpointSchedule Of(const config::CheckpointConfig& checkpoint) {
    return {checkpoint.dir(), checkpoint.every()};
  }
  // Whether a checkpoint is written after `step` (1-based count of steps
  // taken): every `every` steps and at `last_step`; never without a dir.
  bool Due(int64_t step, int64_t last_step) const;
};
inline bool CheckpointDue(const config::CheckpointConfig& checkpoint, int64_t step, int64_t last_step) {
  return CheckpointSchedule::Of(checkpoint).Due(step, last_step);
}

// Fails early, before any training, if checkpoints could not be written.
Status CheckWritable(const std::string& dir);

// The model-shape comparison of the checks below (max_position_embeddings,
// export metadata, aside); the error names `what` and every field that
// differs.
Status CheckSameShape(const config::ModelConfig& found, const config::ModelConfig& expected, const std::string& what);

// A checkpoint's weights start a new run (checkpoint.init_from) only into
// the same model shape.
Status CheckSameModel(const std::string& step_dir, const config::ModelConfig& model);

// A checkpoint only continues the run it came from: the same model shape
// and the same config, but for what --resume may change (the run's length
// train.steps, train.threads, log.*, checkpoint.dir/every/init_from,
// data.val/prepare_from/val_fraction, cluster.*, device.*, and how the
// global batch is split: train.batch_size and train.grad_accum, as long as
// batch_size x grad_accum x workers stays the same, or with
// `new_global_batch` whatever it becomes); the error names each field that
// differs, or the global batch and what to set.
Status CheckSameRun(const std::string& step_dir, const config::JobConfig& config, bool new_global_batch = false);

// Where a process of a run starts: with options.resume, the newest complete
// checkpoint in checkpoint.dir, checked to continue this run
// (CheckSameRun), or none when there is none and options.start_if_none;
// without, none. Either way it first makes sure that checkpoints can be
// written (CheckWritable), before any training.
StatusOr<std::optional<VerifiedCheckpoint>> ResumePoint(const config::JobConfig& config, const TrainOptions& options);

// A fresh run (no --resume) into `root`: refused when it already holds
// step directories, unless `overwrite`, which removes them first (they
// would otherwise be mistaken for this run's on a later --resume).
Status CheckFreshRun(const std::string& root, bool overwrite);

// Before a resume: what failed checkpoint writes left under `root` goes —
// temporary files (NAME.tmp.PID) of processes no longer alive, in any step
// directory, and step directories newer than the newest one with a
// manifest (checkpoints whose vote never completed; the run writes those
// steps again). Committed checkpoints, even damaged ones, are kept, and
// nothing goes when none is committed. One line says what was removed.
Status RemoveFailedCheckpointWrites(const std::string& root);

// What a launcher checks once, before any process of a run starts or
// anything is written. A fresh run: checkpoint.init_from has this model's
// shape, checkpoint.dir can be written and holds no checkpoints
// (CheckFreshRun; --overwrite removes them). A resume's checks are
// ResumePoint's, which every process makes; the launcher also removes what
// failed writes left (RemoveFailedCheckpointWrites).
Status CheckRunCanStart(const config::JobConfig& config, const TrainOptions& options);

}  // namespace herd
