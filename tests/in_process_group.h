// Ranks as threads of one process, for the model's tensor- and
// context-parallel tests: OnRanks runs a function on each, and
// InProcessSum gives them the collectives a group's model calls (sum,
// reduce-scatter, all-gather), each rank's part added in rank order so
// that every rank holds the same bits.
#pragma once

#include <algorithm>
#include <barrier>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "common/partition.h"

namespace herd {

// The ranks' sum: each rank's buffer added in rank order into one result
// every rank copies, so all ranks hold the same bits.
template <typename V>
class InProcessSum {
 public:
  explicit InProcessSum(int ranks) : slots_(ranks), barrier_(ranks) {}
  void AllReduce(int rank, V* data, int64_t n) {
    slots_[rank] = data;
    barrier_.arrive_and_wait();
    if (rank == 0) {
      sum_.assign(n, V(0));
      for (V* slot : slots_) {
        for (int64_t i = 0; i < n; ++i) sum_[i] += slot[i];
      }
    }
    barrier_.arrive_and_wait();
    std::copy(sum_.begin(), sum_.end(), data);
    barrier_.arrive_and_wait();
  }
  // The sum, of which each rank keeps its part.
  void ReduceScatter(int rank, V* data, const Partition& parts) {
    int64_t n = 0, at = 0;
    for (size_t r = 0; r < parts.size(); ++r) {
      if (static_cast<int>(r) < rank) at += parts[r];
      n += parts[r];
    }
    slots_[rank] = data;
    barrier_.arrive_and_wait();
    if (rank == 0) {
      sum_.assign(n, V(0));
      for (V* slot : slots_) {
        for (int64_t i = 0; i < n; ++i) sum_[i] += slot[i];
      }
    }
    barrier_.arrive_and_wait();
    std::copy(sum_.begin() + at, sum_.begin() + at + parts[rank], data + at);
    barrier_.arrive_and_wait();
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
  std::vector<V*> slots_;
  std::vector<V> sum_;
  std::barrier<> barrier_;
};

inline void OnRanks(int ranks, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) threads.emplace_back(fn, r);
  for (std::thread& t : threads) t.join();
}

}  // namespace herd
