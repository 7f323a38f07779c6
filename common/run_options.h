// How a training run starts and stops, beyond its config: shared by the
// single-process trainer, parameter servers and workers (every process of
// a job gets the same options from `herd launch`).
#pragma once

#include <algorithm>
#include <cstdint>

namespace herd {

struct TrainOptions {
  // Continue from the newest complete checkpoint in checkpoint.dir.
  bool resume = false;
  // With `resume`: when checkpoint.dir holds no complete checkpoint yet,
  // start the run from the beginning instead of failing (a process that is
  // started again after a failure does not know whether one was written).
  bool start_if_none = false;
  // With `resume`: the checkpoint's global batch (sequences per step) may
  // differ from this run's; the data goes on right after the last sequence
  // it took.
  bool allow_global_batch_change = false;
  // A fresh run into a checkpoint.dir that holds checkpoints removes them
  // (otherwise it is refused).
  bool overwrite = false;
  // Stop after this step (checkpointing there) without changing the
  // schedule, which still spans train.steps; 0 = run to the end.
  int64_t stop_at_step = 0;

  // The last step this run takes, of `total_steps`.
  int64_t LastStep(int64_t total_steps) const {
    return stop_at_step > 0 ? std::min(stop_at_step, total_steps) : total_steps;
  }
};

}  // namespace herd
