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
#include "model/optim/spike_guard.h"
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

// Where the training data stands after a step's draw (data/sampler.h's
// global position): the same for every share of the step, whoever drew it.
struct DataPosition {
  int64_t epoch = 0, taken = 0;
  int64_t tokens = 0;  // the size of the training file it is a position in
  bool operator==(const DataPosition& o) const {
    return epoch == o.epoch && taken == o.taken && tokens == o.tokens;
  }
};

// What a worker pushes to server 0 for each share it computed of a step (a
// loss push, transport/push_pull.h).
struct ShareLoss {
  double loss = 0;  // the share's mean loss
  DataPosition data;
};
static_assert(sizeof(ShareLoss) == 32);

// What a server reports about the step that produced weights `version`
// (pulled as a report request, transport/push_pull.h).
struct StepReport {
  uint64_t version = 0;  // optimizer steps applied
  double grad_norm = 0;  // global, before clipping
  double lr = 0;
  double mean_loss = 0;  // over workers, summed in rank order (server 0)
  DataPosition data;     // after the step's draw (server 0)
  // Server 0, in an elastic job: the membership changes it had seen when the
  // step was done. The next step's shares are dealt by the membership of
  // this epoch, so a worker that joined later starts a step later.
  int64_t membership_epoch = 0;
  // The spike guard (optimizer.skip_spikes_zscore) skipped this step's
  // update; the loss's and the norm's z-scores it judged.
  int32_t skipped = 0;
  float loss_z = 0, norm_z = 0;
};
static_assert(sizeof(StepReport) == 80);

// The report of step `step` taken with these scalars (the data position
// and membership epoch are the caller's to fill in).
StepReport ReportOf(int64_t step, double grad_norm, double lr, double mean_loss, const SpikeVerdict& spike);

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
