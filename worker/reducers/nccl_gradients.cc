#include "worker/reducers/nccl_gradients.h"

#if HERD_HAVE_NCCL && HERD_HAVE_CUDA_MODEL
#include <vector>

#include "model/cuda/check.h"
#include "model/cuda/staged_model.h"
#include "transport/nccl_collectives.h"
#endif

namespace herd {

#if HERD_HAVE_NCCL && HERD_HAVE_CUDA_MODEL

bool BuiltWithNccl() { return true; }

namespace {

class NcclGradientReduction : public DeviceGradientReduction {
 public:
  NcclGradientReduction(std::unique_ptr<transport::NcclCollectives> nccl, const ShardPlan& plan, bool zero)
      : nccl_(std::move(nccl)), plan_(plan), zero_(zero) {
    for (const Bucket& b : plan.buckets()) owners_.push_back(OwnerParts(b, nccl_->size()));
  }
  ~NcclGradientReduction() override {
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
  }

  // Enqueues the reduction of [begin, end) after `ready`.
  cudaEvent_t Reduce(float* grads, int64_t begin, int64_t end, cudaEvent_t ready) {
    HERD_CUDA_CHECK(cudaStreamWaitEvent(nccl_->stream(), ready, 0));
    if (!zero_) {
      handles_.push_back(nccl_->AllReduce(grads + begin, end - begin, transport::DType::kFloat32));
    } else {
      // Each bucket's piece of the range, cut as the bucket is among its
      // owners: rank r gets the overlap of its slice with the range.
      for (size_t i = 0; i < owners_.size(); ++i) {
        const Bucket& b = plan_.buckets()[i];
        const int64_t lo = std::max(begin, b.range.begin), hi = std::min(end, b.range.end);
        if (lo >= hi) continue;
        const Partition& owners = owners_[i];
        Partition parts(owners.size(), 0);
        int64_t at = b.range.begin;
        for (size_t r = 0; r < owners.size(); ++r) {
          parts[r] = std::max<int64_t>(0, std::min(hi, at + owners[r]) - std::max(lo, at));
          at += owners[r];
        }
        handles_.push_back(nccl_->ReduceScatter(grads + lo, parts));
      }
    }
    if (next_event_ == events_.size()) {
      cudaEvent_t e;
      HERD_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      events_.push_back(e);
    }
    cudaEvent_t done = events_[next_event_++];
    HERD_CUDA_CHECK(cudaEventRecord(done, nccl_->stream()));
    return done;
  }

  Status FinishStep() override {
    Status first;
    for (transport::Collectives::Handle h : handles_) {
      Status st = nccl_->Wait(h);
      if (!st.ok() && first.ok()) first = st;
    }
    handles_.clear();
    next_event_ = 0;
    return first;
  }

 private:
  std::unique_ptr<transport::NcclCollectives> nccl_;
  const ShardPlan& plan_;
  const bool zero_;
  std::vector<Partition> owners_;  // each bucket's cut among the ranks (plan order)
  std::vector<transport::Collectives::Handle> handles_;
  std::vector<cudaEvent_t> events_;
  size_t next_event_ = 0;
};

}  // namespace

StatusOr<std::unique_ptr<DeviceGradientReduction>> ReduceGradientsWithNccl(transport::CoordinatorClient& client,
                                                                           Model& model, const ShardPlan& plan,
                                                                           bool zero) {
  HERD_ASSIGN_OR_RETURN(auto nccl, transport::NcclCollectives::Create(client));
  auto reduction = std::make_unique<NcclGradientReduction>(std::move(nccl), plan, zero);
  NcclGradientReduction* r = reduction.get();
  HERD_RETURN_IF_ERROR(cuda::AttachGradientReducer(model, [r](float* grads, int64_t begin, int64_t end, cudaEvent_t ready) {
    return r->Reduce(grads, begin, end, ready);
  }));
  return std::unique_ptr<DeviceGradientReduction>(std::move(reduction));
}

#else

bool BuiltWithNccl() { return false; }

StatusOr<std::unique_ptr<DeviceGradientReduction>> ReduceGradientsWithNccl(transport::CoordinatorClient&, Model&,
                                                                           const ShardPlan&, bool) {
  return Status::Unavailable("this herd was built without NCCL");
}

#endif

}  // namespace herd
