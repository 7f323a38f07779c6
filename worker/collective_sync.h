// The worker's side of all-reduce mode (see worker/sync_strategy.h): synchronous
// data parallelism among the workers alone, over Collectives.
//
//   zero_stage 0 (DDP): every gradient bucket is all-reduced as backward
//     finishes it; every worker then holds the same summed gradients and
//     applies the same AdamW to its full copy of the weights and moments.
//   zero_stage 1: each worker owns one contiguous range of the flat space
//     (the shard plan with one "server" per worker) and only that range's
//     AdamW moments. Buckets never straddle two owners; each is
//     reduce-scattered to its owner, the owners' partial squared norms and
//     the losses are all-reduced, each owner steps its range, and the new
//     weights are all-gathered bucket by bucket in forward order (the next
//     forward overlaps them, as in parameter-server mode).
//
// At a fresh start worker 0's weights (seed or checkpoint.init_from) are
// broadcast; on resume every worker reads what it needs from the
// checkpoint. Checkpoints: DDP worker 0 writes the one shard; under ZeRO-1
// each worker writes its own range, so `--resume` works with either, and
// with PS checkpoints, of the same number of workers.
#pragma once

#include <memory>
#include <optional>

#include "common/status.h"
#include "model/checkpoint_load.h"
#include "proto/herd.pb.h"
#include "sharding/job_options.h"
#include "sharding/shard_plan.h"
#include "transport/collectives.h"
#include "worker/sync_strategy.h"

namespace herd {

// Gradients that reach host memory already reduced across the workers
// (CUDA workers: NCCL on the device, worker/nccl_gradients.h). The strategy
// then sends no gradient itself and only waits for the step's reductions.
class DeviceGradientReduction {
 public:
  virtual ~DeviceGradientReduction() = default;
  // Waits for every reduction of the step; the first failure, if any.
  virtual Status FinishStep() = 0;
};

struct CollectiveSyncOptions {
  const JobOptions* job = nullptr;
  const ParamLayout* layout = nullptr;
  // Buckets (and, for ZeRO-1, owners: one shard per worker).
  const ShardPlan* plan = nullptr;
  bool zero1 = false;
  transport::Collectives* collectives = nullptr;
  // Set when gradients arrive reduced (then `collectives` carries only the
  // norms, the losses and the weights).
  DeviceGradientReduction* device_reduction = nullptr;
};

// Plans for the mode: one shard (DDP) or one per worker (ZeRO-1).
StatusOr<ShardPlan> CollectivePlan(const ParamLayout& layout, const config::JobConfig& config, int num_workers);

// Loads or initialises this worker's state into `weights` (the full flat
// space) and its optimizer moments; `resume_from` continues this run (the
// caller has checked it with CheckSameRun).
StatusOr<std::unique_ptr<SyncStrategy>> CreateCollectiveSync(
    const CollectiveSyncOptions& options, float* weights, const std::optional<VerifiedCheckpoint>& resume_from);

}  // namespace herd
