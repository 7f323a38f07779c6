// A tensor-parallel group's sums for CUDA workers' models (model/cuda/
// llama_cuda.h's DeviceTensorGroup), or a context-parallel group's gathers
// of keys and values (DeviceContextGroup), through NCCL, on the device: each sum
// waits on the device for the model's work before it and the model's work
// after it waits for the sum, so the host only issues (Megatron's
// tensor-parallel all-reduces on NCCL's stream). A failed sum (a peer gone)
// is kept, and the sums after it are still issued, so a pass runs to its
// end and the step fails with the line (ModelGroupSteps asks Finish()).
// Without NCCL (cluster.nccl false, or none in this build) the group's sums
// are staged through its ring over host memory instead
// (worker/model_factory.h's StagedTensorGroup over a GroupRing's).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "model/llama_config.h"
#include "sharding/tensor_slices.h"
#include "transport/coordinator_client.h"

namespace herd {

class DeviceGroupSums {
 public:
  // NCCL among `members` (worker ranks, ascending; this worker's tensor
  // group), its unique id gathered under `name`: every worker of the job
  // calls it alike, after its device is current.
  static StatusOr<std::unique_ptr<DeviceGroupSums>> Create(transport::CoordinatorClient& client,
                                                           const std::vector<int>& members, const std::string& name);
  virtual ~DeviceGroupSums() = default;

  // The group's sums for `slices`' rank; with `sequence_parallel` its
  // gathers and reduce-scatters too.
  virtual DeviceTensorGroup Group(const TensorSlices& slices, bool sequence_parallel) = 0;
  // The same communicator as a context-parallel group's gathers and
  // reduce-scatters (rank `rank` of `ranks`).
  virtual DeviceContextGroup Context(int ranks, int rank) = 0;
  // Waits for every sum issued so far; the first failure since the last
  // call.
  virtual Status Finish() = 0;
  // Seconds Finish waited since the last call.
  virtual double TakeWaitSeconds() = 0;
};

}  // namespace herd
