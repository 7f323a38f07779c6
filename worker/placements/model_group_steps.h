// A model-parallel placement's part of a step around any reducer of its
// space (see worker/reducers/sync_strategy.h's AroundReducer): a tensor-parallel
// rank's packed one, a context rank's whole one, a pipeline stage's ranges
// of either. The model's own collectives over its tensor and context
// groups (model/llama.h's TensorGroup and ContextGroup) run inside its
// passes through GroupRings; a failure there is kept by the ring and ends
// the step. With sequence parallelism the norms' gradients (each rank's
// rows' part) are summed over the tensor group unit by unit as backward
// finishes them, before the reducer takes them as final.
#pragma once

#include <memory>
#include <vector>

#include "sharding/tensor_slices.h"
#include "worker/placements/device_group_sums.h"
#include "worker/placements/group_ring.h"
#include "worker/reducers/sync_strategy.h"

namespace herd {

struct ModelGroupOptions {
  // A tensor-parallel rank's slices (null without tensor parallelism).
  const TensorSlices* slices = nullptr;
  GroupRing* tensor_ring = nullptr;   // null without tensor parallelism
  GroupRing* context_ring = nullptr;  // null without context parallelism
  // A CUDA worker's tensor group's sums on the device (null: none, or
  // staged through tensor_ring).
  DeviceGroupSums* device_tensor = nullptr;
  DeviceGroupSums* device_context = nullptr;  // likewise, the context group's gathers
  bool sequence_parallel = false;
  // The ranges of the packed space this worker holds (a pipeline stage's;
  // empty: all of it): sequence parallelism sums the norms' gradients of
  // these alone.
  std::vector<ParamRange> held;
};

// `reducer` (worker/reducers/parameter_server_sync.h's over the rank's part of the
// servers' space, sharding/tensor_slices.h's TensorParallelSpace, or
// worker/reducers/collective_sync.h's among the rank's replicas) with the groups'
// part of a step before it.
std::unique_ptr<SyncStrategy> ModelGroupSteps(const ModelGroupOptions& options, std::unique_ptr<SyncStrategy> reducer);

}  // namespace herd
