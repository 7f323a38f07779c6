// How n elements split into parts, one per rank in rank order: the one cut
// collectives use (transport/collectives.h) and ZeRO's ownership of each
// bucket follows (sharding/shard_plan.h), so that a rank's slice of a
// bucket is exactly the part a reduce-scatter leaves it and the part an
// all-reduce sums in the same ring order.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace herd {

// counts[r] contiguous elements for rank r (some may be 0).
using Partition = std::vector<int64_t>;

// The grain a collective cuts a buffer at: 16 fp32 elements, a 64-byte line.
inline constexpr int64_t kCollectiveAlign = 16;

// Near-equal parts, each but the last a multiple of `align` elements.
inline Partition EvenPartition(int64_t n, int parts, int64_t align = 1) {
  Partition p(parts, 0);
  const int64_t units = (n + align - 1) / align;  // aligned blocks, the last maybe short
  int64_t at = 0;
  for (int r = 0; r < parts; ++r) {
    const int64_t blocks = units / parts + (r < units % parts ? 1 : 0);
    p[r] = std::min(n - at, blocks * align);
    at += p[r];
  }
  return p;
}

}  // namespace herd
