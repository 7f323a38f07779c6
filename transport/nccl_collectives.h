// Collectives for GPU buffers through NCCL (built when a CUDA toolkit is
// found). Every rank's operations run in order on one CUDA stream; a
// handle is an event recorded after the operation, and Wait synchronises
// on it and checks the communicator for asynchronous errors.
//
// All-reduce and broadcast are NCCL's. Reduce-scatter and all-gather over
// a Partition of arbitrary (possibly empty) parts are grouped ncclReduce /
// ncclBroadcast calls, one per part, rooted at the part's rank: herd's
// ZeRO slices are near-equal, not equal (a bucket's last part is shorter,
// and a staged range cuts buckets anywhere), which NCCL's equal-count
// ncclReduceScatter / ncclAllGather cannot express.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <string>
#include <vector>

#include "transport/collectives.h"
#include "transport/coordinator_client.h"

namespace herd::transport {

// Whether libnccl can be opened (transport/nccl_loader.cc); `why` if not.
bool NcclAvailable(std::string* why);

class NcclCollectives : public Collectives {
 public:
  // A communicator among `members` (worker ranks, ascending, this one
  // among them; empty: every worker), ranked in that order. The first
  // member creates the NCCL unique id; it reaches the others through the
  // coordinator's all-gather under `group`'s name, which every worker of
  // the job calls alike (a grid's groups of one axis set: one name, one
  // gather, a communicator each). Uses the current CUDA device.
  static StatusOr<std::unique_ptr<NcclCollectives>> Create(CoordinatorClient& client,
                                                           const std::vector<int>& members = {},
                                                           const std::string& group = "workers");
  // The number of CUDA devices visible (0 without a GPU or a driver).
  static int DeviceCount();
  ~NcclCollectives() override;

  int rank() const override;
  int size() const override;
  // The wire is always the buffer's dtype here (a bf16 wire is refused).
  Handle AllReduce(void* data, int64_t n, DType dtype, Wire wire = Wire::kFloat32) override;
  Handle ReduceScatter(float* data, const Partition& parts, Wire wire = Wire::kFloat32) override;
  Handle AllGather(float* data, const Partition& parts) override;
  Handle Broadcast(float* data, int64_t n, int root) override;
  // The sum and reduce-scatter of bf16 elements in place (a bf16 model's
  // activations).
  Handle AllReduceBf16(void* data, int64_t n);
  Handle ReduceScatterBf16(void* data, const Partition& parts);
  // AllGather of elements of `element_bytes` each (a bf16 compute copy's).
  Handle AllGather(void* data, const Partition& parts, int element_bytes);
  Status Wait(Handle handle) override;
  void Fail(const Status& status) override;

  // The stream every operation runs on, in issue order: a caller orders
  // them after other device work with cudaStreamWaitEvent on it, and
  // follows them with an event recorded on it.
  cudaStream_t stream() const;

 private:
  class Impl;
  explicit NcclCollectives(std::unique_ptr<Impl> impl);
  template <typename PerPart>
  Handle Grouped(const Partition& parts, const char* what, PerPart per_part);
  std::unique_ptr<Impl> impl_;
};

}  // namespace herd::transport
