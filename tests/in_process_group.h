// Ranks as threads of one process, for the model's tensor- and
// context-parallel tests: OnRanks runs a function on each, and
// InProcessSum gives them the collectives a group's model calls (sum,
// reduce-scatter, all-gather), each rank's part added in rank order so
// that every rank holds the same bits; GroupTestShape, the model they run;
// ExpectGradientsMatch, their gradients against one whole model's.
#pragma once

#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "common/partition.h"
#include "model/llama_config.h"
#include "model/param_layout.h"

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

// How far a group's fp32 gradients (its ranks' parts added in another
// order than one model adds them) may stray from one whole model's, element
// by element: relative to the pair, plus a floor for elements whose terms
// cancel, scaled by the largest gradient of the element's own tensor, so
// that a small tensor is held to its own size and not the model's. The
// clean gap stays under ~1e-6 of a tensor's largest (the "[ ... ]" lines
// print the worst share of this tolerance used).
constexpr double kGroupGradRel = 1e-5, kGroupGradAbs = 2e-6;

// Every element of `got` against `want` (the flat space of `layout`); a
// failure names the tensor and index. Returns the largest share of its
// tolerance an element used (under 1 when all pass).
inline double ExpectGradientsMatch(const ParamLayout& layout, const std::vector<float>& want,
                                   const std::vector<float>& got) {
  double worst = 0;
  int failures = 0;
  for (const TensorSpec& t : layout.tensors()) {
    double largest = 0;
    for (int64_t i = t.offset; i < t.offset + t.numel; ++i) largest = std::max(largest, std::fabs(double(want[i])));
    EXPECT_GT(largest, 0.0) << t.name << ": no gradient at all";
    for (int64_t i = t.offset; i < t.offset + t.numel; ++i) {
      const double w = want[i], g = got[i];
      const double tolerance = kGroupGradRel * (std::fabs(w) + std::fabs(g)) + kGroupGradAbs * largest;
      const double used = std::fabs(g - w) / tolerance;
      worst = std::max(worst, std::isfinite(used) ? used : HUGE_VAL);
      if (!(used <= 1) && ++failures <= 5) {
        ADD_FAILURE() << t.name << "[" << i - t.offset << "]: " << g << " against one model's " << w
                      << " (its tensor's largest " << largest << ")";
      }
    }
  }
  EXPECT_EQ(failures, 0) << failures << " gradients out of tolerance";
  return worst;
}

}  // namespace herd
