// The checkpoint's on-disk format: one directory per step,
// ROOT/step_NNNNNNNN/, holding
//   config.textproto   the complete job config (model shape included)
//   shard_NNNNN.bin    a range [begin, end) of the flat parameter space:
//                      an 80-byte little-endian header (magic "HERDSHRD",
//                      version 2, CRC-32 of the payload, begin, end, step,
//                      then the spike guard's count, loss mean and variance,
//                      norm mean and variance), then fp32 weights, AdamW m
//                      and v, each end - begin long (version 1, read too:
//                      the 40 bytes up to step, no spike statistics).
//                      Version 3 holds several ranges ("pieces": a ZeRO
//                      owner's slice of every bucket): the same 80 bytes
//                      (begin, end: the first piece's begin, the last's
//                      end), then the piece count and each piece's begin
//                      and end (int64), then the pieces' weights one after
//                      the other, then their m, then their v
//   worker_NNNNN.state a worker's data-loader position (text)
//   manifest.json      written last: format, version, step and every part's
//                      file name, size and CRC-32
//
// Promise: every file is written atomically (temp name, fsync, rename); a
// step directory without a manifest, or whose parts do not match the
// manifest, is never loaded. The manifest is written only once every part
// has been written successfully, by whoever commits the checkpoint:
// model/checkpoint_commit.h for one process, transport/checkpoint_commit.h
// for several.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "model/optim/spike_guard.h"
#include "proto/herd.pb.h"

namespace herd {

// What a shard file holds: a range of the flat parameter space with its
// fp32 weights, AdamW moments and optimizer step, borrowed (ShardView) or
// owned (ShardState).
struct ShardView {
  int64_t begin = 0, end = 0;  // range of the flat parameter space
  int64_t step = 0;            // optimizer steps taken
  // Each end - begin long. A null v is written as zeros (an outer state
  // whose wire keeps no rounding error), without an array of them.
  const float *weights = nullptr, *m = nullptr, *v = nullptr;
  SpikeStats spikes;           // the loss-spike guard's state (the same in every shard)
};
struct ShardState {
  int64_t begin = 0, end = 0;
  int64_t step = 0;
  std::vector<float> weights, m, v;
  SpikeStats spikes;
  ShardView view() const { return {begin, end, step, weights.data(), m.data(), v.data(), spikes}; }
};

std::string StepDirName(const std::string& root, int64_t step);
std::string ShardFileName(int shard_index);   // "shard_00000.bin"
inline constexpr std::string_view kShardPrefix = "shard_";
// A job of regions (cluster.diloco): region k's servers' replica, k >= 1
// ("region_01_shard_00000.bin"; region 0's are the shard files), and each
// region's outer optimizer state of shard j ("outer_00000.bin" for region
// 0, "region_01_outer_00000.bin": the weights of the last outer step, the
// momentum as m, the kept rounding error of a bf16 wire as v), all in the
// shard file format; a reader of the flat space (ReadShardRange) passes
// them by.
std::string RegionShardFileName(int region, int shard_index);
std::string RegionShardPrefix(int region);  // "region_01_shard_"
std::string OuterFileName(int region, int shard_index);
std::string OuterPrefix(int region);  // "outer_", "region_01_outer_"
std::string WorkerFileName(int worker_rank);  // "worker_00000.state"

Status WriteShard(const std::string& path, const ShardView& shard);
// Several ranges of one optimizer (the same step and spike statistics),
// ascending and disjoint, as one file: version 3, or version 2 when there
// is one.
Status WriteShardPieces(const std::string& path, const std::vector<ShardView>& pieces);

// A shard file's bytes in memory: a snapshot of a shard that changes
// meanwhile, written later (on another thread) as WriteShard would have
// written it then, without another copy of its arrays and straight to the
// disk where the file system allows (WriteAlignedFileAtomic). One image
// serves every checkpoint of a shard: its memory is taken once.
class ShardImage {
 public:
  // Copies the arrays; the checksum is left to Write.
  void Capture(const ShardView& shard);
  // Several ranges as WriteShardPieces writes them (ascending, disjoint,
  // of one step): a tensor-parallel server's.
  void Capture(const std::vector<ShardView>& pieces);
  // The last capture, as a shard file.
  Status Write(const std::string& path);

 private:
  struct Free {
    void operator()(char* p) const { std::free(p); }
  };
  size_t size_ = 0, capacity_ = 0;
  size_t arrays_at_ = 0;  // the checksummed arrays' first byte (after the piece table)
  std::unique_ptr<char, Free> bytes_;  // aligned for direct writes
};

// Validates magic, version, sizes and CRC; errors name the file. ReadShard
// takes a file of one range; ReadShardPieces any, each range a state.
StatusOr<ShardState> ReadShard(const std::string& path);
StatusOr<std::vector<ShardState>> ReadShardPieces(const std::string& path);

// Which range (of several pieces: from the first's begin to the last's
// end) and step a shard file holds, from its validated header alone (its
// arrays are neither read nor checked).
struct ShardExtent {
  int64_t begin = 0, end = 0;
  int64_t step = 0;
};
StatusOr<ShardExtent> ReadShardExtent(const std::string& path);

// config.textproto: the complete job config.
Status WriteConfigPart(const std::string& step_dir, const config::JobConfig& config);
// The job config a step directory was written with.
StatusOr<config::JobConfig> ReadCheckpointConfig(const std::string& step_dir);

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

// Whether step_dir has a manifest — a look, not a verification.
bool HasManifest(const std::string& step_dir);
// Removes step_dir's manifest, if any: the step is then incomplete again.
Status RemoveManifest(const std::string& step_dir);

}  // namespace herd
