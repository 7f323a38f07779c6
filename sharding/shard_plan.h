// Partition plans for parameter-server mode: which contiguous range of the
// flat parameter space each server owns, and how those ranges are cut into
// push/pull buckets.
//
// Promises: the shards tile [0, layout.size()) in server order, each range
// non-empty and 64-element aligned; buckets tile each shard, never cross a
// shard boundary, and are listed in the order backward produces them
// (highest offsets first, since the flat space is in forward order). The
// plan is a pure function of (layout, servers, strategy, bucket size): every
// process computes the same plan from the same config.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "model/param_layout.h"
#include "proto/herd.pb.h"

namespace herd {

struct Bucket {
  int server = 0;
  ParamRange range;  // absolute offsets in the flat space
};

struct ShardPlanOptions {
  int servers = 1;
  config::ClusterConfig::ShardStrategy strategy = config::ClusterConfig::BALANCED;
  int64_t bucket_elements = 1 << 20;  // rounded down to the 64-element alignment

  // servers, strategy and bucket_mb (MiB of fp32 gradients) from the config.
  static ShardPlanOptions FromConfig(const config::ClusterConfig& cluster);
};

class ShardPlan {
 public:
  // Errors: fewer elements (or tensors, per-tensor) than servers.
  static StatusOr<ShardPlan> Create(const ParamLayout& layout, const ShardPlanOptions& options);

  int num_servers() const { return static_cast<int>(shards_.size()); }
  const ParamRange& shard(int server) const { return shards_[server]; }
  const std::vector<ParamRange>& shards() const { return shards_; }
  // In push order: backward's order (descending offsets).
  const std::vector<Bucket>& buckets() const { return buckets_; }
  // The server owning element `offset`.
  int ServerOf(int64_t offset) const;
  // "server 0 [0, 412160) 0.41M elements in 2 buckets; server 1 ..." for logs.
  std::string Describe() const;

 private:
  std::vector<ParamRange> shards_;
  std::vector<Bucket> buckets_;
};

}  // namespace herd
