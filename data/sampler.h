// Which token windows each worker trains on (DistributedSampler) and which
// it evaluates on (EvalReader).
//
// DistributedSampler has the semantics of PyTorch's DistributedSampler with
// shuffle=True and drop_last=True, fed to a DataLoader with drop_last=True.
// The token file is cut into n = (size - 1) / T sequences of T + 1 tokens
// starting every T tokens (sequence i = tokens [i*T, i*T + T + 1); inputs
// are its first T tokens, targets its last T). Epoch e orders them by a
// Fisher-Yates permutation drawn from (seed, e); a step of all W ranks
// takes the next W x B positions of it, rank r the positions r, r + W,
// r + 2W, ... among them (so each rank owns floor(n / W) sequences of an
// epoch), and a step that would go past floor(n / W) x W moves to epoch
// e + 1 first.
//
// Promise (what makes the distributed modes match one process): at every
// step, across epoch boundaries too, the union over ranks of the rank
// batches (B each) is, as a multiset of sequences, exactly the batch that a
// W = 1 sampler with batch W * B takes at that step. Within an epoch the
// ranks' sequences are disjoint.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "data/token_file.h"

namespace herd {

class DistributedSampler {
 public:
  // `file` must outlive the sampler. Fails when seq_len < 1, rank is not
  // in [0, world_size), or the file holds fewer sequences than world_size
  // (the message names the file and the numbers).
  static StatusOr<DistributedSampler> Create(const TokenFile& file, int seq_len, int world_size, int rank,
                                             uint64_t seed);

  // Fails (naming the file and the tokens needed) if a rank cannot fill one
  // batch of batch_size; call it before NextBatch with that size.
  Status CheckBatch(int batch_size) const;

  // Fills batch_size rows of inputs and targets ([batch_size, T] each,
  // row-major) and advances; moves to the next epoch first when fewer than
  // batch_size sequences are left in this one. batch_size must have passed
  // CheckBatch (checked: a violation aborts).
  void NextBatch(int batch_size, int32_t* inputs, int32_t* targets);
  // What the samplers of `ranks` (ranks of this sampler's world size, each
  // at most once) take at this step, one after the other: rank ranks[i]'s
  // rows at inputs + i * batch_size * T. It advances as NextBatch does, so
  // one process can take the shares of several ranks (a worker that stands
  // in for lost ones).
  void NextBatches(int batch_size, const std::vector<int>& ranks, int32_t* inputs, int32_t* targets);

  int64_t epoch() const { return epoch_; }
  // Sequences every rank together has taken in the current epoch.
  int64_t taken() const { return taken_; }
  int64_t num_sequences() const { return num_sequences_; }
  // Sequences rank r owns per epoch: floor(n / W).
  int64_t per_rank() const { return num_sequences_ / world_size_; }

  // One text line: the epoch, the sequences all ranks have taken in it,
  // and what the state was made for (dataset size, seq_len, seed). Every
  // rank's state is the same, so any rank's state restores any rank of any
  // world size and batch size: the next step takes the positions after
  // those taken, whatever the number of workers and the batch (no sequence
  // skipped or repeated). RestoreState also reads the older form (a rank's
  // position and the world size it was made for). It rejects malformed
  // text and state made for another dataset size, T or seed, with one line
  // saying which; on error the sampler is unchanged.
  std::string SaveState() const;
  Status RestoreState(const std::string& state);
  // The training file's size in tokens: what a state is valid for.
  int64_t file_tokens() const;

 private:
  DistributedSampler(const TokenFile& file, int seq_len, int world_size, int rank, uint64_t seed);
  void Shuffle();

  const TokenFile* file_;
  int seq_len_, world_size_, rank_;
  uint64_t seed_;
  int64_t num_sequences_;
  int64_t epoch_ = 0, taken_ = 0;
  std::vector<int64_t> order_;  // the current epoch's permutation of [0, n)
};

// The line SaveState writes for a sampler at `epoch` with `taken`
// sequences taken in it, over a `tokens`-token file: what a process that
// only knows the position (a parameter server writing the workers' data
// files of an elastic job) writes into a checkpoint.
std::string SamplerStateLine(int64_t epoch, int64_t taken, int64_t tokens, int seq_len, uint64_t seed);

// Evaluation windows in file order, for `herd eval` and held-out loss:
// row j of batch b is the window that starts at token (b * B + j) * T
// (inputs: the T tokens there; targets: the T tokens one further on).
// Windows do not overlap, so batches * B * T + 1 tokens are read in all.
class EvalReader {
 public:
  // `file` must outlive the reader. batches == 0 means every full batch in
  // the file. Fails, naming the file and the tokens needed, when the file
  // holds fewer than batches * B * T + 1 tokens (or not even one batch).
  static StatusOr<EvalReader> Create(const TokenFile& file, int seq_len, int batch_size, int64_t batches);

  int64_t num_batches() const { return batches_; }
  int64_t tokens_per_batch() const { return static_cast<int64_t>(batch_size_) * seq_len_; }
  // Fills inputs and targets ([B, T] each) for batch b in [0, num_batches()).
  void ReadBatch(int64_t b, int32_t* inputs, int32_t* targets) const;

 private:
  EvalReader(const TokenFile& file, int seq_len, int batch_size, int64_t batches)
      : file_(&file), seq_len_(seq_len), batch_size_(batch_size), batches_(batches) {}

  const TokenFile* file_;
  int seq_len_, batch_size_;
  int64_t batches_;
};

}  // namespace herd
