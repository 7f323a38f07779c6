// The distributed sampler: which training sequences each worker sees, in
// which order, with the semantics of PyTorch's DistributedSampler
// (shuffle=True, drop_last=True).
//
// The token file is cut into n = (size - 1) / T sequences of T + 1 tokens
// starting every T tokens (inputs = first T, targets = last T). Epoch e
// orders them by a permutation drawn from (seed, e); rank r of W owns
// positions r, r + W, r + 2W, ... of it (floor(n / W) sequences) and takes
// them B at a time, dropping a tail shorter than B before moving to epoch
// e + 1.
//
// Promise (what makes the distributed modes match one process): at every
// step, the union over ranks of the rank batches (B each) is exactly the
// batch a W = 1 sampler with batch W * B takes at that step.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "data/token_file.h"

namespace herd {

class DistributedSampler {
 public:
  // Fails if the file holds fewer than 2 tokens per sequence or fewer
  // sequences than world_size.
  static StatusOr<DistributedSampler> Create(const TokenFile& file, int seq_len, int world_size, int rank,
                                             uint64_t seed);

  // Fails (naming the numbers) if a rank cannot fill one batch of B.
  Status CheckBatch(int batch_size) const;

  // Fills B rows of inputs and targets ([B, T] each).
  void NextBatch(int batch_size, int32_t* inputs, int32_t* targets);

  int64_t epoch() const { return epoch_; }
  int64_t position() const { return position_; }
  int64_t num_sequences() const { return num_sequences_; }

  // Text state ("epoch E position P" plus what it was made for); Restore
  // rejects state from a different dataset size, T, W or rank.
  std::string SaveState() const;
  Status RestoreState(const std::string& state);

 private:
  DistributedSampler(const TokenFile& file, int seq_len, int world_size, int rank, uint64_t seed);
  void Shuffle();
  int64_t PerRank() const { return num_sequences_ / world_size_; }

  const TokenFile* file_;
  int seq_len_, world_size_, rank_;
  uint64_t seed_;
  int64_t num_sequences_;
  int64_t epoch_ = 0, position_ = 0;  // position: sequences taken this epoch by this rank
  std::vector<int64_t> order_;        // permutation of the current epoch
  std::vector<int32_t> window_;
};

}  // namespace herd
