#include "worker/placements/device_group_sums.h"

#if HERD_HAVE_NCCL && HERD_HAVE_CUDA_MODEL
#include <deque>
#include <utility>

#include "common/trace.h"
#include "model/cuda/check.h"
#include "transport/nccl_collectives.h"
#include "worker/reducers/sync_strategy.h"
#endif

namespace herd {

#if HERD_HAVE_NCCL && HERD_HAVE_CUDA_MODEL

namespace {

class NcclGroupSums final : public DeviceGroupSums {
 public:
  explicit NcclGroupSums(std::unique_ptr<transport::NcclCollectives> nccl) : nccl_(std::move(nccl)) {
    HERD_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    HERD_CUDA_CHECK(cudaEventCreateWithFlags(&summed_, cudaEventDisableTiming));
  }
  ~NcclGroupSums() override {
    (void)Finish();
    cudaEventDestroy(ready_);
    cudaEventDestroy(summed_);
  }

  DeviceTensorGroup Group(const TensorSlices& slices, bool sequence_parallel) override {
    DeviceTensorGroup g;
    g.ranks = slices.ranks();
    g.rank = slices.rank();
    g.vocab_first = slices.vocab_first();
    g.all_reduce = [this](void* data, int64_t n, int element_bytes, void* stream) {
      Issue("tensor-parallel sum", static_cast<cudaStream_t>(stream), [&] {
        return element_bytes == 2 ? nccl_->AllReduceBf16(data, n)
                                  : nccl_->AllReduce(data, n, transport::DType::kFloat32);
      });
    };
    g.sequence_parallel = sequence_parallel;
    g.all_gather = [this](void* data, const Partition& parts, int element_bytes, void* stream) {
      Issue("tensor-parallel gather", static_cast<cudaStream_t>(stream),
            [&] { return nccl_->AllGather(data, parts, element_bytes); });
    };
    g.reduce_scatter = [this](void* data, const Partition& parts, int element_bytes, void* stream) {
      Issue("tensor-parallel reduce-scatter", static_cast<cudaStream_t>(stream), [&] {
        return element_bytes == 2 ? nccl_->ReduceScatterBf16(data, parts)
                                  : nccl_->ReduceScatter(static_cast<float*>(data), parts);
      });
    };
    return g;
  }

  DeviceContextGroup Context(int ranks, int rank) override {
    DeviceContextGroup g;
    g.ranks = ranks;
    g.rank = rank;
    g.all_gather = [this](void* data, const Partition& parts, int element_bytes, void* stream) {
      Issue("context-parallel gather", static_cast<cudaStream_t>(stream),
            [&] { return nccl_->AllGather(data, parts, element_bytes); });
    };
    g.reduce_scatter = [this](void* data, const Partition& parts, int element_bytes, void* stream) {
      Issue("context-parallel reduce-scatter", static_cast<cudaStream_t>(stream), [&] {
        return element_bytes == 2 ? nccl_->ReduceScatterBf16(data, parts)
                                  : nccl_->ReduceScatter(static_cast<float*>(data), parts);
      });
    };
    return g;
  }

  Status Finish() override {
    (void)wait_.Timed([&] {
      while (!pending_.empty()) Retire();
      return Status::OK();
    });
    return std::exchange(failure_, Status::OK());
  }

  double TakeWaitSeconds() override { return wait_.Take(); }

 private:
  // Enough sums in flight for a pass's layers; an older one is waited for
  // (it has long finished) so that its handle's event is let go.
  static constexpr size_t kMostPending = 256;

  // The collective `issue` enqueues on NCCL's stream, between the model's
  // work before it and after it on `stream`.
  template <typename F>
  void Issue(const char* what, cudaStream_t stream, F issue) {
    trace::Span span(what, "collective");
    // A wait takes the event as last recorded, so two events serve every sum.
    HERD_CUDA_CHECK(cudaEventRecord(ready_, stream));
    HERD_CUDA_CHECK(cudaStreamWaitEvent(nccl_->stream(), ready_, 0));
    pending_.push_back(issue());
    HERD_CUDA_CHECK(cudaEventRecord(summed_, nccl_->stream()));
    HERD_CUDA_CHECK(cudaStreamWaitEvent(stream, summed_, 0));
    while (pending_.size() > kMostPending) Retire();
  }

  void Retire() {
    Status st = nccl_->Wait(pending_.front());
    pending_.pop_front();
    if (!st.ok() && failure_.ok()) failure_ = std::move(st);
  }

  const std::unique_ptr<transport::NcclCollectives> nccl_;
  cudaEvent_t ready_ = nullptr, summed_ = nullptr;
  std::deque<transport::Collectives::Handle> pending_;  // issued, not yet waited for
  Status failure_;
  WaitClock wait_;
};

}  // namespace

StatusOr<std::unique_ptr<DeviceGroupSums>> DeviceGroupSums::Create(transport::CoordinatorClient& client,
                                                                   const std::vector<int>& members,
                                                                   const std::string& name) {
  HERD_ASSIGN_OR_RETURN(std::unique_ptr<transport::NcclCollectives> nccl,
                        transport::NcclCollectives::Create(client, members, name));
  return std::unique_ptr<DeviceGroupSums>(new NcclGroupSums(std::move(nccl)));
}

#else

StatusOr<std::unique_ptr<DeviceGroupSums>> DeviceGroupSums::Create(transport::CoordinatorClient&,
                                                                   const std::vector<int>&, const std::string&) {
  return Status::Unavailable("NCCL: this herd was built without NCCL");
}

#endif

}  // namespace herd
