// All-reduce mode with CUDA workers: each range of the step's gradients is
// reduced by NCCL on the device as soon as backward has finished it (on
// NCCL's stream, overlapping the rest of backward), then staged to the host
// already reduced, where the optimizer runs (ZeRO-Offload's split: device
// compute and communication, host optimizer). DDP all-reduces; under ZeRO
// each bucket's part of the range is reduce-scattered to the bucket's
// owners, slice by slice (sharding/shard_plan.h's OwnerParts), among the
// worker's shard group; with hybrid sharding each owned piece is then
// all-reduced with the same piece in the other groups (a second
// communicator, of the worker's replicas), so that the host receives its
// slices reduced over the whole job. The norms, losses and ZeRO's weight
// all-gather stay on the UCX ring over host memory.
#pragma once

#include <memory>
#include <vector>

#include "common/status.h"
#include "model/model.h"
#include "sharding/shard_plan.h"
#include "transport/coordinator_client.h"
#include "worker/cuda/device_trainer.h"
#include "worker/reducers/collective_sync.h"

namespace herd {

// Whether this build reduces CUDA workers' gradients with NCCL.
bool BuiltWithNccl();

// The workers a CUDA worker's gradients are reduced among (worker ranks,
// ascending, from the job's grid): its shard group, which ZeRO cuts the
// buckets among (every worker unless hybrid; DDP all-reduces over it), and
// hybrid sharding's replicas (one worker, itself: none).
struct NcclGroups {
  std::vector<int> shard_group, replicas;
};

// Creates the NCCL communicators of `groups` (every worker calls it, after
// its CUDA model exists) and attaches the reduction to `model`. `plan`:
// the buckets, each cut among the shard group with `zero`.
StatusOr<std::unique_ptr<DeviceGradientReduction>> ReduceGradientsWithNccl(transport::CoordinatorClient& client,
                                                                           Model& model, const ShardPlan& plan,
                                                                           bool zero, const NcclGroups& groups);

// The same communicators as the device-resident trainer's exchange
// (cuda::DeviceTrainer::SetExchange): DDP all-reduces each range of the
// gradients, ZeRO reduce-scatters it to its owners (and, hybrid, reduces
// each owned piece with the replicas), and after the update the owners'
// slices of the compute weights are all-gathered on the device.
StatusOr<std::unique_ptr<cuda::DeviceExchange>> ExchangeWithNccl(transport::CoordinatorClient& client,
                                                                 const ShardPlan& plan, bool zero,
                                                                 const NcclGroups& groups);

}  // namespace herd
