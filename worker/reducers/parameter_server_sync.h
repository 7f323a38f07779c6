// The worker's side of parameter-server mode (see worker/reducers/sync_strategy.h):
// gradient buckets pushed to the servers that own them as backward
// finishes them (fp32 or bf16 on the wire), this worker's loss to server 0,
// the next weights pulled bucket by bucket in forward order together with
// every server's step report. With `stream` (the servers step each bucket
// as soon as its sum is complete: no clipping), each bucket's pull is
// issued right after its push, so that the link carries gradients out and
// weights in at once; backward no longer reads a bucket's weights once its
// gradients are final, so the pull may land while backward goes on.
//
// With streamed weights (cluster.stream_weights) the worker's weights and
// gradients are PagedBuffers of which only a window is backed: the
// sharding/weight_window.h policy says which buckets are pulled (again in
// backward), waited for and let go, and when pushed gradients are waited
// for and let go. Every bucket holds the same bytes as without streaming
// when it is used, so training is bitwise the same. The model reaches that
// window through the WeightHome CreateParameterServerSync returns with the
// strategy (worker/reducers/weight_home.h).
#pragma once

#include <cstdint>
#include <memory>

#include "common/paged_buffer.h"
#include "common/status.h"
#include "sharding/shard_plan.h"
#include "transport/push_pull.h"
#include "worker/reducers/sync_strategy.h"
#include "worker/reducers/weight_home.h"

namespace herd {

struct ParameterServerSyncOptions {
  const ShardPlan* plan = nullptr;
  bool bf16 = false;    // cluster.wire_dtype BF16
  bool stream = false;  // the servers step each bucket as its sum completes
  bool elastic = false;  // cluster.elastic: this worker may compute other ranks' shares
  // This worker's rank among its servers' workers (its region's, in a job
  // of regions), which its pushes carry; elastic: the share it computes
  // unless BeginStep says another.
  int rank = 0;
  transport::PeerId first_server = 0;  // server s is PeerId first_server + s
  // Streamed weights: the worker's weights (guarded) and gradients, each
  // spanning the worker's space; null otherwise. Needs `layout` (of the
  // worker's space), not `elastic`; no pull is issued early (`stream`):
  // the window decides.
  PagedBuffer* streamed_weights = nullptr;
  PagedBuffer* streamed_grads = nullptr;
  const ParamLayout* layout = nullptr;
  int prefetch_layers = 1;  // cluster.stream_prefetch_layers
  // A pipeline stage's worker: the ranges it computes (its buckets are
  // pushed and pulled, no other), and its pushes carry its rank as their
  // share whatever share of the data it computes (the servers know a
  // bucket's contributors by rank). Empty: every bucket. With streamed
  // weights, the window covers these ranges alone. Not elastic.
  std::vector<ParamRange> ranges;
  // Element 0 of the worker's weights and gradients is this element of the
  // servers' space, and the offsets the model names (FinalFrom, WaitUpTo)
  // count from it: a tensor-parallel rank's packed part, `ranges` then
  // being that part alone (or a stage's ranges of it).
  int64_t origin = 0;
  // The placement's part of a step around this strategy (null: none).
  AroundReducer around;
};

// The strategy (`around` the pushes' own, if given) and where its weights
// live: whole, or (streamed weights) the window the strategy pages; the
// home refers to the strategy.
struct ParameterServerSyncParts {
  std::unique_ptr<SyncStrategy> sync;
  std::unique_ptr<WeightHome> home;
};

// `client` talks to the servers; bf16 staging memory is registered with
// `transport`.
StatusOr<ParameterServerSyncParts> CreateParameterServerSync(const ParameterServerSyncOptions& options,
                                                             transport::UcxTransport* transport,
                                                             transport::PushPullClient* client);

// Where a worker joining an elastic job under way at membership epoch
// `epoch` starts: the report (server 0's, at PeerId `server`) of the first
// step done once the servers had acted on the join, i.e. the newest report
// if it carries `epoch` or a later one, else the next (pulled as soon as
// that step is done). Shares of the steps after it are dealt with the
// joiner among the workers (worker/elastic_shares.h). A report of the
// run's `last_step` ends the search whatever its epoch.
StatusOr<StepReport> FindJoinPoint(transport::PushPullClient* client, transport::PeerId server, int epoch,
                                   int64_t last_step);

// The largest bucket in the wire dtype: pushes and pulls travel whole.
uint64_t LargestBucketBytes(const ShardPlan& plan, int wire_bytes);

}  // namespace herd
