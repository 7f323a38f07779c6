// Checkpoints: one directory per step, ROOT/step_NNNNNNNN/, holding
//   config.textproto   the complete job config (model shape included)
//   shard_NNNNN.bin    a range [begin, end) of the flat parameter space:
//                      fp32 weights, AdamW m and v, optimizer step
//   worker_NNNNN.state a worker's data-loader position (text)
//   manifest.json      written last: step and every part's size and CRC-32
//
// Promise: every file is written atomically (temp name, fsync, rename); a
// step directory without a manifest, or whose parts do not match the
// manifest, is never loaded. The manifest is written by whoever commits the
// checkpoint (the single process; server 0, or worker 0 without servers,
// after the two-phase vote of transport/join.h's CommitCheckpoint) only
// after every part reported success.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "proto/herd.pb.h"

namespace herd {

// What a shard file holds: a range of the flat parameter space with its
// fp32 weights, AdamW moments and optimizer step, borrowed (ShardView) or
// owned (ShardState).
struct ShardView {
  int64_t begin = 0, end = 0;  // range of the flat parameter space
  int64_t step = 0;            // optimizer steps taken
  const float *weights = nullptr, *m = nullptr, *v = nullptr;  // each end - begin long
};
struct ShardState {
  int64_t begin = 0, end = 0;
  int64_t step = 0;
  std::vector<float> weights, m, v;
  ShardView view() const { return {begin, end, step, weights.data(), m.data(), v.data()}; }
};

std::string StepDirName(const std::string& root, int64_t step);
std::string ShardFileName(int shard_index);   // "shard_00000.bin"
std::string WorkerFileName(int worker_rank);  // "worker_00000.state"

Status WriteShard(const std::string& path, const ShardView& shard);
// Validates magic, version, sizes and CRC; errors name the file.
StatusOr<ShardState> ReadShard(const std::string& path);

// The parts of a complete checkpoint written by `shards` shard files and
// `workers` data positions: config, shards, worker states.
std::vector<std::string> CheckpointParts(int shards, int workers);

// Writes manifest.json listing `parts` (file names inside step_dir) with
// their sizes and CRCs. Call only when every part has been written.
Status WriteManifest(const std::string& step_dir, int64_t step, const std::vector<std::string>& parts);

struct Manifest {
  int64_t step = 0;
  std::vector<std::string> parts;
};
// Reads the manifest and checks every part's size and CRC.
StatusOr<Manifest> VerifyCheckpoint(const std::string& step_dir);

// The newest step directory under `root` with a valid manifest; NotFound if
// there is none. Directories without a manifest are skipped (with a
// warning), never loaded.
StatusOr<std::string> LatestCheckpoint(const std::string& root);

struct VerifiedCheckpoint {
  std::string dir;
  Manifest manifest;
};
// LatestCheckpoint with the verified manifest.
StatusOr<VerifiedCheckpoint> LatestVerifiedCheckpoint(const std::string& root);

// Whether `root` has a step directory with a manifest — a cheap look (no
// checksums) for warnings, not a promise that it loads.
bool HasCheckpoints(const std::string& root);

// Assembles [begin, end) of the flat space from every shard the manifest of
// `step_dir` lists, whatever number of servers wrote them; weights always,
// AdamW moments when `with_moments`. Errors name the step directory when
// the shards leave part of the range uncovered or disagree on the step.
StatusOr<ShardState> ReadShardRange(const std::string& step_dir, const Manifest& manifest, int64_t begin, int64_t end,
                                    bool with_moments);

// Multi-process checkpoints: every writer of a part calls BeginCheckpointPart
// first (creates the step directory and retracts a manifest left there by an
// earlier run of the same step, which would otherwise vouch for a mix of old
// and new parts), then writes its part atomically; the committer calls
// WriteManifest once every part has reported success.
Status BeginCheckpointPart(const std::string& step_dir);
// config.textproto: the complete job config.
Status WriteConfigPart(const std::string& step_dir, const config::JobConfig& config);

// Whether a checkpoint is written after `step` (1-based count of steps
// taken): every checkpoint.every steps and at `last_step`; never without
// checkpoint.dir.
bool CheckpointDue(const config::CheckpointConfig& checkpoint, int64_t step, int64_t last_step);

// Fails early, before any training, if checkpoints could not be written.
Status CheckWritable(const std::string& dir);

// The job config a step directory was written with (config.textproto).
StatusOr<config::JobConfig> ReadCheckpointConfig(const std::string& step_dir);

// A checkpoint's weights start a new run (checkpoint.init_from) only into
// the same model shape.
Status CheckSameModel(const std::string& step_dir, const config::JobConfig& config);

// A checkpoint only continues the run it came from: the same model shape
// and the same config, but for what --resume may change (the run's length
// train.steps, train.threads, log.*, checkpoint.dir/every/init_from,
// data.val/prepare_from/val_fraction, cluster.*, device.*); the error
// names each field that differs.
Status CheckSameRun(const std::string& step_dir, const config::JobConfig& config);

// A fresh run (no --resume) into `root`: refused when it already holds
// step directories, unless `overwrite`, which removes them first (they
// would otherwise be mistaken for this run's on a later --resume).
Status CheckFreshRun(const std::string& root, bool overwrite);
// The shape comparison itself (max_position_embeddings, export metadata,
// aside); the error names `what` and every field that differs.
Status CheckSameShape(const config::ModelConfig& found, const config::ModelConfig& expected, const std::string& what);

// A whole model read back from a checkpoint: its job config and the fp32
// weights of the full flat space (shards assembled, checked to tile it).
struct CheckpointModel {
  config::JobConfig config;
  int64_t step = 0;
  std::vector<float> weights;
};
// `path` is a step directory or a root (then the latest valid step).
StatusOr<CheckpointModel> LoadCheckpointModel(const std::string& path);

// Writes a complete one-shard checkpoint (config, shard 0 covering the whole
// space, optional worker state, manifest) — the single-process trainer's
// and `herd import`'s way to save.
Status WriteSingleShardCheckpoint(const std::string& step_dir, const config::JobConfig& config,
                                  const ShardView& shard, const std::string& worker_state);

}  // namespace herd
