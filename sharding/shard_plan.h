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

#include "common/partition.h"
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
  // Offsets no bucket straddles (a pipeline's stage boundaries: each
  // bucket is one stage's to push and pull).
  std::vector<int64_t> bucket_cuts;

  // servers, strategy and bucket_mb (MiB of fp32 gradients) from the config.
  static ShardPlanOptions FromConfig(const config::ClusterConfig& cluster);
};

class ShardPlan {
 public:
  // Errors: fewer elements (or tensors, per-tensor) than servers.
  static StatusOr<ShardPlan> Create(const ParamLayout& layout, const ShardPlanOptions& options);
  // The same over a space of `size` elements whose tensors start at
  // `tensor_starts` (ascending, the first 0): a tensor-parallel job's
  // servers' (sharding/tensor_slices.h's TensorParallelSpace).
  static StatusOr<ShardPlan> Create(int64_t size, const std::vector<int64_t>& tensor_starts,
                                    const ShardPlanOptions& options);

  int num_servers() const { return static_cast<int>(shards_.size()); }
  const ParamRange& shard(int server) const { return shards_[server]; }
  const std::vector<ParamRange>& shards() const { return shards_; }
  // In push order: backward's order (descending offsets).
  const std::vector<Bucket>& buckets() const { return buckets_; }
  // The server owning element `offset`.
  int ServerOf(int64_t offset) const;
  // The plan as `part` of its space names it (a tensor-parallel rank's
  // packed part of the servers' space): its buckets inside `part`, each
  // inside it or outside, and the shards clipped to it, shifted so that
  // part.begin is offset 0; buckets keep their servers.
  ShardPlan Part(ParamRange part) const;
  // "server 0 [0, 412160) 0.41M elements in 2 buckets; server 1 ..." for logs.
  std::string Describe() const;

 private:
  std::vector<ParamRange> shards_;
  std::vector<Bucket> buckets_;
};

// ZeRO's ownership in all-reduce mode: each of `ranks` workers owns a
// slice of every bucket, cut by EvenPartition(size, ranks,
// kCollectiveAlign) (common/partition.h), the cut a ring all-reduce of the
// bucket sums by. So a bucket's reduce-scatter keeps every link busy, each
// owner's slice holds bitwise what DDP's all-reduce gives it, and its
// all-gather moves what the all-reduce's second half does.
Partition OwnerParts(const Bucket& bucket, int ranks);
// Rank `rank`'s slice of `bucket` cut by `parts` (OwnerParts).
ParamRange SliceOf(const Bucket& bucket, const Partition& parts, int rank);
// Rank `rank`'s slices of every bucket, ascending offsets, empty ones left out.
std::vector<ParamRange> OwnedSlices(const ShardPlan& plan, int ranks, int rank);
// The same of some buckets (BucketsWithin's: a pipeline stage's).
std::vector<ParamRange> OwnedSlices(const std::vector<Bucket>& buckets, int ranks, int rank);
// The plan's buckets that lie inside one of `ranges`, ascending offsets
// (none for no ranges).
std::vector<Bucket> BucketsWithin(const ShardPlan& plan, const std::vector<ParamRange>& ranges);
// The workers ZeRO cuts each bucket among: a shard group of
// cluster.shard_group_size (hybrid sharding), or all `workers`.
int ShardGroupSize(const config::ClusterConfig& cluster, int workers);
// All-reduce mode's plan: buckets (cluster.bucket_mb) of the whole space
// (`layout`'s: the flat one, or a tensor-parallel rank's packed one), one
// "server"; under ZeRO (cluster.zero_stage) each of the `group` workers
// that cut a bucket must own part of some bucket (InvalidArgument for a
// model too small for them).
StatusOr<ShardPlan> CollectivePlan(const ParamLayout& layout, const config::ClusterConfig& cluster, int group);
// The most gradient bytes a ZeRO-2 worker of rank `rank` holds over one
// backward, replayed through its policy (worker/reducers/collective_sync.h): a
// unit's gradients are written as backward computes it (the head's first;
// tied embeddings' with the head too); once a unit is done, the buckets
// whose gradients are final are reduce-scattered and those issued after
// the unit before are waited for and let go but for the rank's slice; the
// slices themselves stay backed from step to step.
int64_t ReplayZero2Gradients(const ShardPlan& plan, const ParamLayout& layout, int ranks, int rank);

}  // namespace herd
