#include "data/sampler.h"

#include <glog/logging.h>

#include <algorithm>
#include <cstdio>
#include <numeric>

#include "common/rng.h"

namespace herd {
namespace {

// The window of T + 1 tokens at `start`, split into inputs and targets
// without a staging buffer: targets are the inputs shifted by one.
void ReadWindow(const TokenFile& file, int64_t start, int T, int32_t* inputs, int32_t* targets) {
  file.Read(start, T, inputs);
  std::copy(inputs + 1, inputs + T, targets);
  targets[T - 1] = file[start + T];
}

std::string N(int64_t v) { return std::to_string(v); }

}  // namespace

DistributedSampler::DistributedSampler(const TokenFile& file, int seq_len, int world_size, int rank, uint64_t seed)
    : file_(&file),
      seq_len_(seq_len),
      world_size_(world_size),
      rank_(rank),
      seed_(seed),
      num_sequences_(file.size() > 0 ? (file.size() - 1) / seq_len : 0) {}

StatusOr<DistributedSampler> DistributedSampler::Create(const TokenFile& file, int seq_len, int world_size, int rank,
                                                        uint64_t seed) {
  if (seq_len < 1) return Status::InvalidArgument(file.path() + ": seq_len must be >= 1, got " + N(seq_len));
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return Status::InvalidArgument(file.path() + ": rank " + N(rank) + " is not in [0, " + N(world_size) + ")");
  }
  DistributedSampler s(file, seq_len, world_size, rank, seed);
  if (s.num_sequences_ < world_size) {
    return Status::InvalidArgument(file.path() + ": " + N(file.size()) + " tokens hold " + N(s.num_sequences_) +
                                   " sequences of " + N(seq_len) + "+1 tokens, fewer than the " + N(world_size) +
                                   " workers (needs at least " + N(int64_t{world_size} * seq_len + 1) + " tokens)");
  }
  s.Shuffle();
  return s;
}

Status DistributedSampler::CheckBatch(int batch_size) const {
  if (batch_size < 1) return Status::InvalidArgument("batch size must be >= 1, got " + N(batch_size));
  if (per_rank() < batch_size) {
    return Status::InvalidArgument(file_->path() + ": " + N(file_->size()) + " tokens give each of " + N(world_size_) +
                                   " workers " + N(per_rank()) + " sequences of " + N(seq_len_) +
                                   "+1 tokens, fewer than one batch of " + N(batch_size) + " (needs at least " +
                                   N(int64_t{batch_size} * world_size_ * seq_len_ + 1) + " tokens)");
  }
  return Status::OK();
}

void DistributedSampler::Shuffle() {
  order_.resize(num_sequences_);
  std::iota(order_.begin(), order_.end(), int64_t{0});
  // Seeded from (seed, epoch) alone, so any epoch's order can be rebuilt
  // on resume without replaying earlier ones.
  Rng rng(Mix64(seed_) ^ Mix64(static_cast<uint64_t>(epoch_) + 1));
  for (int64_t i = num_sequences_ - 1; i > 0; --i) {
    std::swap(order_[i], order_[rng.Below(static_cast<uint64_t>(i) + 1)]);
  }
}

void DistributedSampler::NextBatch(int batch_size, int32_t* inputs, int32_t* targets) {
  NextBatches(batch_size, {rank_}, inputs, targets);
}

void DistributedSampler::NextBatches(int batch_size, const std::vector<int>& ranks, int32_t* inputs,
                                     int32_t* targets) {
  CHECK(batch_size >= 1 && batch_size <= per_rank()) << "DistributedSampler::NextBatch(" << batch_size << ") on "
                                                     << per_rank() << " sequences per rank: call CheckBatch first";
  for (int r : ranks) CHECK(r >= 0 && r < world_size_) << "rank " << r << " of " << world_size_;
  // Every rank crosses the epoch boundary at the same step.
  const int64_t step = int64_t{batch_size} * world_size_;
  if (taken_ + step > per_rank() * world_size_) {
    ++epoch_;
    taken_ = 0;
    Shuffle();
  }
  const int64_t T = seq_len_;
  for (size_t i = 0; i < ranks.size(); ++i) {
    for (int b = 0; b < batch_size; ++b) {
      const int64_t seq = order_[taken_ + int64_t{b} * world_size_ + ranks[i]];
      const int64_t row = (static_cast<int64_t>(i) * batch_size + b) * T;
      ReadWindow(*file_, seq * T, seq_len_, inputs + row, targets + row);
    }
  }
  taken_ += step;
}

std::string SamplerStateLine(int64_t epoch, int64_t taken, int64_t tokens, int seq_len, uint64_t seed) {
  char buf[256];
  std::snprintf(buf, sizeof(buf), "epoch %lld taken %lld tokens %lld seq_len %d seed %llu\n",
                static_cast<long long>(epoch), static_cast<long long>(taken), static_cast<long long>(tokens), seq_len,
                static_cast<unsigned long long>(seed));
  return buf;
}

std::string DistributedSampler::SaveState() const {
  return SamplerStateLine(epoch_, taken_, file_->size(), seq_len_, seed_);
}

int64_t DistributedSampler::file_tokens() const { return file_->size(); }

Status DistributedSampler::RestoreState(const std::string& state) {
  long long epoch = -1, taken = -1, position = -1, tokens = -1;
  unsigned long long seed = 0;
  int seq_len = 0, world_size = 1, rank = 0, consumed = 0;
  auto read = [&](int fields, const char* format, auto*... out) {
    consumed = 0;
    return std::sscanf(state.c_str(), format, out..., &consumed) == fields &&
           static_cast<size_t>(consumed) == state.size();
  };
  bool parsed = read(5, "epoch %lld taken %lld tokens %lld seq_len %d seed %llu %n", &epoch, &taken, &tokens,
                     &seq_len, &seed);
  if (!parsed) {
    // The older form: one rank's position, and the world size behind it.
    parsed = read(7, "epoch %lld position %lld tokens %lld seq_len %d world_size %d rank %d seed %llu %n", &epoch,
                  &position, &tokens, &seq_len, &world_size, &rank, &seed);
    if (parsed && world_size >= 1 && rank >= 0 && rank < world_size && position >= 0) taken = position * world_size;
  }
  if (!parsed) {
    const std::string shown = state.substr(0, std::min<size_t>(state.find('\n'), 80));
    return Status::Corruption("data-loader state is malformed: '" + shown +
                              "' (expected 'epoch E taken G tokens N seq_len T seed S')");
  }
  // The seed decides every epoch's shuffle: a different one would silently
  // train on other sequences than the run being resumed.
  if (tokens != file_->size() || seq_len != seq_len_ || seed != seed_) {
    return Status::FailedPrecondition("data-loader state was saved for " + N(tokens) + " tokens, seq_len " +
                                      N(seq_len) + ", seed " + std::to_string(seed) + "; this run has " +
                                      N(file_->size()) + " tokens (" + file_->path() + "), seq_len " + N(seq_len_) +
                                      ", seed " + std::to_string(seed_));
  }
  if (epoch < 0 || taken < 0 || taken > num_sequences_) {
    return Status::Corruption("data-loader state is out of range: epoch " + N(epoch) + ", " + N(taken) +
                              " sequences taken of " + N(num_sequences_));
  }
  epoch_ = epoch;
  taken_ = taken;
  Shuffle();
  return Status::OK();
}

StatusOr<EvalReader> EvalReader::Create(const TokenFile& file, int seq_len, int batch_size, int64_t batches) {
  if (seq_len < 1 || batch_size < 1 || batches < 0) {
    return Status::InvalidArgument(file.path() +
                                   ": evaluation needs seq_len >= 1, batch size >= 1 and batches >= 0, got " +
                                   N(seq_len) + ", " + N(batch_size) + ", " + N(batches));
  }
  const int64_t per_batch = int64_t{batch_size} * seq_len;
  const int64_t full_batches = (file.size() - 1) / per_batch;
  const int64_t wanted = batches > 0 ? batches : 1;
  if (full_batches < wanted) {
    return Status::InvalidArgument(file.path() + ": " + N(file.size()) + " tokens, but " + N(wanted) +
                                   (wanted == 1 ? " batch of " : " batches of ") + N(batch_size) + "x" + N(seq_len) +
                                   " need " + N(wanted * per_batch + 1));
  }
  return EvalReader(file, seq_len, batch_size, batches > 0 ? batches : full_batches);
}

void EvalReader::ReadBatch(int64_t b, int32_t* inputs, int32_t* targets) const {
  const int64_t T = seq_len_;
  for (int j = 0; j < batch_size_; ++j) {
    ReadWindow(*file_, (b * batch_size_ + j) * T, seq_len_, inputs + j * T, targets + j * T);
  }
}

}  // namespace herd
