#include "data/sampler.h"

#include <algorithm>
#include <cstdio>
#include <numeric>

#include "common/rng.h"

namespace herd {

DistributedSampler::DistributedSampler(const TokenFile& file, int seq_len, int world_size, int rank, uint64_t seed)
    : file_(&file),
      seq_len_(seq_len),
      world_size_(world_size),
      rank_(rank),
      seed_(seed),
      num_sequences_(file.size() > 0 ? (file.size() - 1) / seq_len : 0),
      window_(seq_len + 1) {}

StatusOr<DistributedSampler> DistributedSampler::Create(const TokenFile& file, int seq_len, int world_size, int rank,
                                                        uint64_t seed) {
  if (seq_len <= 0 || world_size <= 0 || rank < 0 || rank >= world_size) {
    return Status::InvalidArgument("sampler: invalid seq_len/world_size/rank");
  }
  DistributedSampler s(file, seq_len, world_size, rank, seed);
  if (s.num_sequences_ < world_size) {
    return Status::InvalidArgument(file.path() + ": " + std::to_string(file.size()) + " tokens hold " +
                                   std::to_string(s.num_sequences_) + " sequences of " + std::to_string(seq_len) +
                                   "+1 tokens, fewer than the " + std::to_string(world_size) + " workers");
  }
  s.Shuffle();
  return s;
}

Status DistributedSampler::CheckBatch(int batch_size) const {
  if (PerRank() < batch_size) {
    return Status::InvalidArgument(file_->path() + ": " + std::to_string(file_->size()) + " tokens give each of " +
                                   std::to_string(world_size_) + " workers " + std::to_string(PerRank()) +
                                   " sequences, fewer than one batch of " + std::to_string(batch_size) +
                                   " (needs at least " +
                                   std::to_string(static_cast<int64_t>(batch_size) * world_size_ * seq_len_ + 1) +
                                   " tokens)");
  }
  return Status::OK();
}

void DistributedSampler::Shuffle() {
  order_.resize(num_sequences_);
  std::iota(order_.begin(), order_.end(), 0);
  Rng rng(Mix64(seed_) ^ Mix64(static_cast<uint64_t>(epoch_) + 1));
  for (int64_t i = num_sequences_ - 1; i > 0; --i) {  // Fisher-Yates
    std::swap(order_[i], order_[rng.Below(static_cast<uint64_t>(i) + 1)]);
  }
}

void DistributedSampler::NextBatch(int batch_size, int32_t* inputs, int32_t* targets) {
  if (position_ + batch_size > PerRank()) {
    ++epoch_;
    position_ = 0;
    Shuffle();
  }
  for (int b = 0; b < batch_size; ++b) {
    const int64_t seq = order_[(position_ + b) * world_size_ + rank_];
    file_->Read(seq * seq_len_, seq_len_ + 1, window_.data());
    std::copy(window_.begin(), window_.end() - 1, inputs + static_cast<int64_t>(b) * seq_len_);
    std::copy(window_.begin() + 1, window_.end(), targets + static_cast<int64_t>(b) * seq_len_);
  }
  position_ += batch_size;
}

std::string DistributedSampler::SaveState() const {
  char buf[256];
  std::snprintf(buf, sizeof(buf), "epoch %lld position %lld tokens %lld seq_len %d world_size %d rank %d\n",
                static_cast<long long>(epoch_), static_cast<long long>(position_),
                static_cast<long long>(file_->size()), seq_len_, world_size_, rank_);
  return buf;
}

Status DistributedSampler::RestoreState(const std::string& state) {
  long long epoch, position, tokens;
  int seq_len, world_size, rank;
  if (std::sscanf(state.c_str(), "epoch %lld position %lld tokens %lld seq_len %d world_size %d rank %d", &epoch,
                  &position, &tokens, &seq_len, &world_size, &rank) != 6 ||
      epoch < 0 || position < 0 || position > PerRank()) {
    return Status::Corruption("data-loader state is malformed: '" + state.substr(0, 80) + "'");
  }
  if (tokens != file_->size() || seq_len != seq_len_ || world_size != world_size_ || rank != rank_) {
    return Status::FailedPrecondition(
        "data-loader state was saved for " + std::to_string(tokens) + " tokens, seq_len " + std::to_string(seq_len) +
        ", " + std::to_string(world_size) + " workers, rank " + std::to_string(rank) + "; this run has " +
        std::to_string(file_->size()) + " tokens, seq_len " + std::to_string(seq_len_) + ", " +
        std::to_string(world_size_) + " workers, rank " + std::to_string(rank_));
  }
  epoch_ = epoch;
  position_ = position;
  Shuffle();
  return Status::OK();
}

}  // namespace herd
