#include "sharding/shard_plan.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace herd {
namespace {

constexpr int64_t kAlign = ParamLayout::kAlign;

int64_t AlignDown(int64_t x) { return x / kAlign * kAlign; }

// Server boundaries cut anywhere on the alignment: boundary k sits at the
// aligned element nearest k*P/S.
std::vector<int64_t> BalancedCuts(int64_t P, int S) {
  std::vector<int64_t> cuts = {0};
  for (int k = 1; k < S; ++k) {
    const double ideal = static_cast<double>(P) * k / S;
    cuts.push_back(std::llround(ideal / kAlign) * kAlign);
  }
  cuts.push_back(P);
  return cuts;
}

// Server boundaries only at tensor starts: boundary k goes to the tensor
// start nearest k*P/S that keeps every range non-empty.
std::vector<int64_t> PerTensorCuts(const std::vector<int64_t>& starts, int64_t P, int S) {
  std::vector<int64_t> cuts = {0};
  size_t next = 1;  // candidates are starts[next..]
  for (int k = 1; k < S; ++k) {
    const double ideal = static_cast<double>(P) * k / S;
    // Leave at least one tensor for each remaining server.
    const size_t last_allowed = starts.size() - static_cast<size_t>(S - k);
    size_t best = next;
    for (size_t i = next; i <= last_allowed; ++i) {
      if (std::abs(starts[i] - ideal) < std::abs(starts[best] - ideal)) best = i;
    }
    cuts.push_back(starts[best]);
    next = best + 1;
  }
  cuts.push_back(P);
  return cuts;
}

}  // namespace

ShardPlanOptions ShardPlanOptions::FromConfig(const config::ClusterConfig& cluster) {
  ShardPlanOptions o;
  o.servers = std::max(1, cluster.servers());
  o.strategy = cluster.shard_strategy();
  o.bucket_elements = static_cast<int64_t>(cluster.bucket_mb() * (1 << 20) / sizeof(float));
  return o;
}

StatusOr<ShardPlan> ShardPlan::Create(const ParamLayout& layout, const ShardPlanOptions& options) {
  std::vector<int64_t> starts;
  for (const TensorSpec& t : layout.tensors()) starts.push_back(t.offset);
  return Create(layout.size(), starts, options);
}

StatusOr<ShardPlan> ShardPlan::Create(int64_t size, const std::vector<int64_t>& tensor_starts,
                                      const ShardPlanOptions& options) {
  const int S = options.servers;
  const int64_t P = size;
  if (S < 1) return Status::InvalidArgument("cluster.servers: must be >= 1 for a shard plan");
  if (P / kAlign < S) {
    return Status::InvalidArgument("cluster.servers: " + std::to_string(S) + " servers for a model of only " +
                                   std::to_string(P) + " elements");
  }
  std::vector<int64_t> cuts;
  if (options.strategy == config::ClusterConfig::PER_TENSOR) {
    if (static_cast<int64_t>(tensor_starts.size()) < S) {
      return Status::InvalidArgument("cluster.servers: " + std::to_string(S) + " servers with shard_strategy " +
                                     "PER_TENSOR but the model has only " + std::to_string(tensor_starts.size()) +
                                     " tensors");
    }
    cuts = PerTensorCuts(tensor_starts, P, S);
  } else {
    cuts = BalancedCuts(P, S);
  }
  ShardPlan plan;
  for (int s = 0; s < S; ++s) plan.shards_.push_back({cuts[s], cuts[s + 1]});

  // Buckets: each shard cut from its end downwards, so the bucket holding
  // a shard's highest offsets (produced first by backward) is full-sized and
  // the remainder sits at the shard's start.
  const int64_t bucket = std::max(kAlign, AlignDown(options.bucket_elements));
  for (int s = S - 1; s >= 0; --s) {
    const ParamRange& r = plan.shards_[s];
    for (int64_t end = r.end; end > r.begin;) {
      int64_t begin = std::max(r.begin, end - bucket);
      for (int64_t cut : options.bucket_cuts) {
        if (cut > begin && cut < end) begin = cut;
      }
      plan.buckets_.push_back({s, {begin, end}});
      end = begin;
    }
  }
  return plan;
}

int ShardPlan::ServerOf(int64_t offset) const {
  auto it = std::upper_bound(shards_.begin(), shards_.end(), offset,
                             [](int64_t x, const ParamRange& r) { return x < r.end; });
  return static_cast<int>(it - shards_.begin());
}

std::string ShardPlan::Describe() const {
  std::string out;
  for (size_t s = 0; s < shards_.size(); ++s) {
    char line[160];
    int buckets = 0;
    for (const Bucket& b : buckets_) buckets += b.server == static_cast<int>(s);
    std::snprintf(line, sizeof line, "%sserver %zu [%lld, %lld) %.2fM elements in %d buckets", s ? "; " : "", s,
                  static_cast<long long>(shards_[s].begin), static_cast<long long>(shards_[s].end),
                  shards_[s].size() / 1e6, buckets);
    out += line;
  }
  return out;
}

ShardPlan ShardPlan::Part(ParamRange part) const {
  ShardPlan out;
  for (const ParamRange& s : shards_) {
    const int64_t begin = std::clamp(s.begin, part.begin, part.end), end = std::clamp(s.end, part.begin, part.end);
    out.shards_.push_back({begin - part.begin, end - part.begin});
  }
  for (const Bucket& b : buckets_) {
    if (b.range.begin >= part.begin && b.range.end <= part.end) {
      out.buckets_.push_back({b.server, {b.range.begin - part.begin, b.range.end - part.begin}});
    }
  }
  return out;
}

Partition OwnerParts(const Bucket& bucket, int ranks) {
  return EvenPartition(bucket.range.size(), ranks, kCollectiveAlign);
}

ParamRange SliceOf(const Bucket& bucket, const Partition& parts, int rank) {
  int64_t begin = bucket.range.begin;
  for (int r = 0; r < rank; ++r) begin += parts[r];
  return {begin, begin + parts[rank]};
}

std::vector<ParamRange> OwnedSlices(const ShardPlan& plan, int ranks, int rank) {
  return OwnedSlices(plan.buckets(), ranks, rank);
}

std::vector<ParamRange> OwnedSlices(const std::vector<Bucket>& buckets, int ranks, int rank) {
  std::vector<ParamRange> slices;
  for (const Bucket& b : buckets) {
    const ParamRange mine = SliceOf(b, OwnerParts(b, ranks), rank);
    if (mine.size() > 0) slices.push_back(mine);
  }
  std::sort(slices.begin(), slices.end(), [](const ParamRange& a, const ParamRange& b) { return a.begin < b.begin; });
  return slices;
}

std::vector<Bucket> BucketsWithin(const ShardPlan& plan, const std::vector<ParamRange>& ranges) {
  std::vector<Bucket> out;
  for (auto b = plan.buckets().rbegin(); b != plan.buckets().rend(); ++b) {
    for (const ParamRange& r : ranges) {
      if (b->range.begin >= r.begin && b->range.end <= r.end) out.push_back(*b);
    }
  }
  return out;
}

int ShardGroupSize(const config::ClusterConfig& cluster, int workers) {
  return cluster.shard_group_size() > 0 ? cluster.shard_group_size() : workers;
}

StatusOr<ShardPlan> CollectivePlan(const ParamLayout& layout, const config::ClusterConfig& cluster, int group) {
  ShardPlanOptions o = ShardPlanOptions::FromConfig(cluster);
  o.servers = 1;
  o.strategy = config::ClusterConfig::BALANCED;
  HERD_ASSIGN_OR_RETURN(ShardPlan plan, ShardPlan::Create(layout, o));
  // The last rank's slices are the smallest (EvenPartition).
  if (cluster.zero_stage() > 0 && OwnedSlices(plan, group, group - 1).empty()) {
    return Status::InvalidArgument("cluster.zero_stage: a model of " + std::to_string(layout.size()) +
                                   " elements is too small to shard over " + std::to_string(group) + " workers");
  }
  return plan;
}

int64_t ReplayZero2Gradients(const ShardPlan& plan, const ParamLayout& layout, int ranks, int rank) {
  const std::vector<Bucket>& buckets = plan.buckets();  // descending offsets
  const size_t n = buckets.size();
  // Per bucket: the lowest offset written so far (its end: none), and
  // whether it has been let go but for the slice.
  std::vector<int64_t> written_from(n);
  std::vector<bool> retired(n, false);
  for (size_t i = 0; i < n; ++i) written_from[i] = buckets[i].range.end;
  // Each bucket's slice stays backed from one step to the next (zeroed in
  // place, WeightHome::ClearGradients): resident from the start.
  std::vector<ParamRange> slice(n);
  for (size_t i = 0; i < n; ++i) slice[i] = SliceOf(buckets[i], OwnerParts(buckets[i], ranks), rank);
  int64_t peak = 0;
  auto resident = [&] {
    int64_t sum = 0;
    for (size_t i = 0; i < n; ++i) {
      const int64_t written = buckets[i].range.end - written_from[i];
      const int64_t slice_below = std::max<int64_t>(0, std::min(slice[i].end, written_from[i]) - slice[i].begin);
      sum += retired[i] ? slice[i].size() : written + slice_below;
    }
    peak = std::max(peak, sum);
  };
  auto write = [&](int64_t lo, int64_t hi) {
    for (size_t i = 0; i < n; ++i) {
      const ParamRange& r = buckets[i].range;
      if (r.end > lo && r.begin < hi && !retired[i]) {
        written_from[i] = std::min(written_from[i], std::max(r.begin, lo));  // from there to its end, or more
      }
    }
  };
  const std::vector<int64_t> units = layout.UnitBoundaries();
  size_t issued = 0, oldest = 0;
  for (size_t u = units.size() - 1; u-- > 0;) {
    write(units[u], units[u + 1]);
    if (u + 2 == units.size() && layout.shape().tie_word_embeddings) write(0, units[1]);  // the head's
    resident();
    const size_t issued_before = issued;
    while (issued < n && buckets[issued].range.begin >= units[u]) ++issued;
    while (oldest < issued_before) retired[oldest++] = true;
  }
  return peak * static_cast<int64_t>(sizeof(float));
}

}  // namespace herd
