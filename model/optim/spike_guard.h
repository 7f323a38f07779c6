// The loss-spike guard (llm.c's -sl/-sg): a step whose loss or global
// gradient norm lies more than z standard deviations above its running
// mean has its update skipped. The mean and variance are exponential
// (weight 2 / (window + 1) on the newest value), so the whole state is five
// numbers that a checkpoint's shard header carries; llm.c keeps the last
// 128 values instead. Every step's values enter the statistics, skipped
// or not, so that a lasting change of level is learned rather than skipped
// for ever. Nothing is skipped before `window` steps have been seen.
//
// Every process that steps the optimizer judges the same global loss and
// norm in the same order with the same arithmetic, so all agree, and a
// rerun or a resume (the state is restored) decides bit for bit the same.
#pragma once

#include <cstdint>

namespace herd {

struct SpikeStats {
  int64_t count = 0;  // steps seen
  double loss_mean = 0, loss_var = 0, norm_mean = 0, norm_var = 0;
};

struct SpikeVerdict {
  bool skip = false;
  double loss_z = 0, norm_z = 0;  // against the statistics before this step
};

// Judges (loss, norm) against *stats, then adds them to it. zscore <= 0:
// never skips (the statistics are still kept).
SpikeVerdict JudgeAndUpdate(SpikeStats* stats, double loss, double norm, double zscore, int window);

}  // namespace herd
