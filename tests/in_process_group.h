// Ranks as threads of one process, for the model's tensor- and
// context-parallel tests: OnRanks runs a function on each, and
// InProcessSum gives them the collectives a group's model calls (sum,
// reduce-scatter, all-gather), each rank's part added in rank order so
// that every rank holds the same bits; GroupTestShape, the model they run.
#pragma once

#include <algorithm>
#include <barrier>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "common/partition.h"
#include "model/llama_config.h"

namespace herd {

// The ranks' sum: each rank's buffer added in rank order into one result
// every rank copies, so all ranks hold the same bits.
template <typename V>
class InProcessSum {
 public:
  explicit InProcessSum(int ranks) : slots_(ranks), barrier_(ranks) {}
  void AllReduce(int rank, V* data, int64_t n) { SumInto(rank, data, 0, n, n); }
  // The sum, of which each rank keeps its part.
  void ReduceScatter(int rank, V* data, const Partition& parts) {
    int64_t n = 0, at = 0;
    for (size_t r = 0; r < parts.size(); ++r) {
      if (static_cast<int>(r) < rank) at += parts[r];
      n += parts[r];
    }
    SumInto(rank, data, at, parts[rank], n);
  }
  // Every rank's part from that rank.
  void AllGather(int rank, V* data, const Partition& parts) {
    slots_[rank] = data;
    barrier_.arrive_and_wait();
    int64_t at = 0;
    for (size_t r = 0; r < parts.size(); ++r) {
      if (static_cast<int>(r) != rank) std::copy(slots_[r] + at, slots_[r] + at + parts[r], data + at);
      at += parts[r];
    }
    barrier_.arrive_and_wait();
  }

 private:
  // Every rank's data[0, n) added in rank order; this rank keeps
  // [at, at + count) of the sum.
  void SumInto(int rank, V* data, int64_t at, int64_t count, int64_t n) {
    slots_[rank] = data;
    barrier_.arrive_and_wait();
    if (rank == 0) {
      sum_.assign(n, V(0));
      for (V* slot : slots_) {
        for (int64_t i = 0; i < n; ++i) sum_[i] += slot[i];
      }
    }
    barrier_.arrive_and_wait();
    std::copy(sum_.begin() + at, sum_.begin() + at + count, data + at);
    barrier_.arrive_and_wait();
  }

  std::vector<V*> slots_;
  std::vector<V> sum_;
  std::barrier<> barrier_;
};

// The shape the group tests run: 8 heads and 4 key/value heads, which 2
// and 4 ranks divide, as they divide the intermediate size and vocabulary.
inline LlamaShape GroupTestShape(bool tied) {
  LlamaShape s;
  s.vocab_size = 96;
  s.hidden_size = 64;
  s.intermediate_size = 128;
  s.num_layers = 2;
  s.num_heads = 8;
  s.num_kv_heads = 4;
  s.tie_word_embeddings = tied;
  return s;
}

inline void OnRanks(int ranks, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) threads.emplace_back(fn, r);
  for (std::thread& t : threads) t.join();
}

}  // namespace herd
