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
std::vector<int64_t> PerTensorCuts(const ParamLayout& layout, int S) {
  std::vector<int64_t> starts;
  for (const TensorSpec& t : layout.tensors()) starts.push_back(t.offset);
  const int64_t P = layout.size();
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
  const int S = options.servers;
  const int64_t P = layout.size();
  if (S < 1) return Status::InvalidArgument("cluster.servers: must be >= 1 for a shard plan");
  if (P / kAlign < S) {
    return Status::InvalidArgument("cluster.servers: " + std::to_string(S) + " servers for a model of only " +
                                   std::to_string(P) + " elements");
  }
  std::vector<int64_t> cuts;
  if (options.strategy == config::ClusterConfig::PER_TENSOR) {
    if (static_cast<int64_t>(layout.tensors().size()) < S) {
      return Status::InvalidArgument("cluster.servers: " + std::to_string(S) + " servers with shard_strategy " +
                                     "PER_TENSOR but the model has only " + std::to_string(layout.tensors().size()) +
                                     " tensors");
    }
    cuts = PerTensorCuts(layout, S);
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
      const int64_t begin = std::max(r.begin, end - bucket);
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

}  // namespace herd
