#include "worker/nccl_gradients.h"

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
  NcclGradientReduction(std::unique_ptr<transport::NcclCollectives> nccl, const ShardPlan* owners)
      : nccl_(std::move(nccl)), owners_(owners) {}
  ~NcclGradientReduction() override {
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
  }

  // Enqueues the reduction of [begin, end) after `ready`.
  cudaEvent_t Reduce(float* grads, int64_t begin, int64_t end, cudaEvent_t ready) {
    HERD_CUDA_CHECK(cudaStreamWaitEvent(nccl_->stream(), ready, 0));
    float* data = grads + begin;
    if (owners_ == nullptr) {
      handles_.push_back(nccl_->AllReduce(data, end - begin, transport::DType::kFloat32));
    } else {
      transport::Partition parts(nccl_->size(), 0);  // each owner's piece of the range
      for (int r = 0; r < nccl_->size(); ++r) {
        const ParamRange owned = owners_->shard(r);
        parts[r] = std::max<int64_t>(0, std::min(end, owned.end) - std::max(begin, owned.begin));
      }
      handles_.push_back(nccl_->ReduceScatter(data, parts));
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
  const ShardPlan* owners_;
  std::vector<transport::Collectives::Handle> handles_;
  std::vector<cudaEvent_t> events_;
  size_t next_event_ = 0;
};

}  // namespace

StatusOr<std::unique_ptr<DeviceGradientReduction>> ReduceGradientsWithNccl(transport::CoordinatorClient& client,
                                                                           Model& model, const ShardPlan* owners) {
  HERD_ASSIGN_OR_RETURN(auto nccl, transport::NcclCollectives::Create(client));
  auto reduction = std::make_unique<NcclGradientReduction>(std::move(nccl), owners);
  NcclGradientReduction* r = reduction.get();
  HERD_RETURN_IF_ERROR(cuda::AttachGradientReducer(model, [r](float* grads, int64_t begin, int64_t end, cudaEvent_t ready) {
    return r->Reduce(grads, begin, end, ready);
  }));
  return std::unique_ptr<DeviceGradientReduction>(std::move(reduction));
}

#else

bool BuiltWithNccl() { return false; }

StatusOr<std::unique_ptr<DeviceGradientReduction>> ReduceGradientsWithNccl(transport::CoordinatorClient&, Model&,
                                                                           const ShardPlan*) {
  return Status::Unavailable("this herd was built without NCCL");
}

#endif

}  // namespace herd
