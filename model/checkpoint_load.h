// Finding and reading back checkpoints (the format: model/checkpoint_format.h).
// Only complete steps are ever returned: a step directory whose manifest is
// missing or does not match its parts is skipped with a warning, and the
// next older one is tried.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "model/checkpoint_format.h"
#include "model/param_layout.h"
#include "proto/herd.pb.h"

namespace herd {

// The names of the step_* directories under `root`, newest first (none
// when `root` does not exist), complete or not.
std::vector<std::string> StepDirsNewestFirst(const std::string& root);

struct VerifiedCheckpoint {
  std::string dir;
  Manifest manifest;
};
// The newest step directory under `root` with a valid manifest, with that
// manifest; NotFound if there is none.
StatusOr<VerifiedCheckpoint> LatestVerifiedCheckpoint(const std::string& root);
// LatestVerifiedCheckpoint's directory alone.
StatusOr<std::string> LatestCheckpoint(const std::string& root);

// Whether `root` has a step directory with a manifest — a cheap look (no
// checksums) for warnings, not a promise that it loads.
bool HasCheckpoints(const std::string& root);

// Assembles [begin, end) of the flat space from every shard the manifest of
// `step_dir` lists, whatever number of servers wrote them; weights always,
// AdamW moments when `with_moments`. Errors name the step directory when
// the shards leave part of the range uncovered or disagree on the step.
// `prefix`: the parts that tile the flat space ("shard_"; a job of regions
// also writes each further region's replica, "region_K_shard_", and the
// outer optimizer's state, "outer_": model/checkpoint_format.h).
StatusOr<ShardState> ReadShardRange(const std::string& step_dir, const Manifest& manifest, int64_t begin, int64_t end,
                                    bool with_moments, std::string_view prefix = kShardPrefix);
// ReadShardRange of several ranges (ascending, disjoint) at once, each
// shard file read once: a ZeRO owner's slices. With `weights_into` (the
// whole flat space) the weights land there and the states' stay empty.
StatusOr<std::vector<ShardState>> ReadShardRanges(const std::string& step_dir, const Manifest& manifest,
                                                  const std::vector<ParamRange>& ranges, bool with_moments,
                                                  float* weights_into = nullptr,
                                                  std::string_view prefix = kShardPrefix);

// A whole model read back from a checkpoint: its job config and the fp32
// weights of the full flat space (shards assembled, checked to tile it).
struct CheckpointModel {
  config::JobConfig config;
  int64_t step = 0;
  std::vector<float> weights;
};
// `path` is a step directory or a root (then the latest valid step).
StatusOr<CheckpointModel> LoadCheckpointModel(const std::string& path);

}  // namespace herd
