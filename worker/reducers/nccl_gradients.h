// All-reduce mode with CUDA workers: each range of the step's gradients is
// reduced by NCCL on the device as soon as backward has finished it (on
// NCCL's stream, overlapping the rest of backward), then staged to the host
// already reduced, where the optimizer runs (ZeRO-Offload's split: device
// compute and communication, host optimizer). DDP all-reduces; under ZeRO
// each bucket's part of the range is reduce-scattered to the bucket's
// owners, slice by slice (sharding/shard_plan.h's OwnerParts). The norms,
// losses and ZeRO's weight all-gather stay on the UCX ring over host memory.
#pragma once

#include <memory>

#include "common/status.h"
#include "model/model.h"
#include "sharding/shard_plan.h"
#include "transport/coordinator_client.h"
#include "worker/reducers/collective_sync.h"

namespace herd {

// Whether this build reduces CUDA workers' gradients with NCCL.
bool BuiltWithNccl();

// Creates the NCCL communicator among the job's workers (every worker calls
// it, after its CUDA model exists) and attaches the reduction to `model`.
// `plan`: the buckets, each cut among the workers with `zero`.
StatusOr<std::unique_ptr<DeviceGradientReduction>> ReduceGradientsWithNccl(transport::CoordinatorClient& client,
                                                                           Model& model, const ShardPlan& plan,
                                                                           bool zero);

}  // namespace herd
