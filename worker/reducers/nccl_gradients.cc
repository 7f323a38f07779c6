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

// Both sides of a CUDA worker's NCCL: the staged model's reducer
// (DeviceGradientReduction, Reduce attached to the model) and the
// device-resident trainer's exchange (DeviceExchange).
class NcclGradientReduction : public DeviceGradientReduction, public cuda::DeviceExchange {
 public:
  NcclGradientReduction(std::unique_ptr<transport::NcclCollectives> nccl,
                        std::unique_ptr<transport::NcclCollectives> replicas, const ShardPlan& plan, bool zero)
      : nccl_(std::move(nccl)), replicas_(std::move(replicas)), plan_(plan), zero_(zero) {
    for (const Bucket& b : plan.buckets()) owners_.push_back(OwnerParts(b, nccl_->size()));
  }
  ~NcclGradientReduction() override {
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
  }

  // Enqueues the reduction of [begin, end) after `ready`.
  cudaEvent_t Reduce(float* grads, int64_t begin, int64_t end, cudaEvent_t ready) {
    HERD_CUDA_CHECK(cudaStreamWaitEvent(nccl_->stream(), ready, 0));
    std::vector<ParamRange> owned;  // of the range, this worker's slices (ZeRO)
    if (!zero_) {
      handles_.push_back(nccl_->AllReduce(grads + begin, end - begin, transport::DType::kFloat32));
    } else {
      // Each bucket's piece of the range, cut as the bucket is among its
      // owners: rank r gets the overlap of its slice with the range.
      for (size_t i = 0; i < owners_.size(); ++i) {
        const Bucket& b = plan_.buckets()[i];
        const int64_t lo = std::max(begin, b.range.begin), hi = std::min(end, b.range.end);
        if (lo >= hi) continue;
        handles_.push_back(nccl_->ReduceScatter(grads + lo, PartsWithin(i, lo, hi)));
        const ParamRange mine = SliceOf(b, owners_[i], nccl_->rank());
        owned.push_back({std::max(lo, mine.begin), std::min(hi, mine.end)});
      }
    }
    cudaEvent_t done = NextEvent();
    HERD_CUDA_CHECK(cudaEventRecord(done, nccl_->stream()));
    if (replicas_ == nullptr) return done;
    // The owned pieces, reduced in the group, with the other groups'.
    HERD_CUDA_CHECK(cudaStreamWaitEvent(replicas_->stream(), done, 0));
    for (const ParamRange& r : owned) {
      if (r.size() > 0) replica_handles_.push_back(replicas_->AllReduce(grads + r.begin, r.size(), transport::DType::kFloat32));
    }
    done = NextEvent();
    HERD_CUDA_CHECK(cudaEventRecord(done, replicas_->stream()));
    return done;
  }

  void ReduceGradients(float* grads, int64_t begin, int64_t end, void* stream) override {
    cudaEvent_t ready = NextEvent();
    HERD_CUDA_CHECK(cudaEventRecord(ready, static_cast<cudaStream_t>(stream)));
    reduced_ = Reduce(grads, begin, end, ready);
  }
  void AwaitGradients(void* stream) override {
    if (reduced_ != nullptr) HERD_CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), reduced_, 0));
    reduced_ = nullptr;
  }
  void GatherWeights(void* weights, int64_t begin, int64_t end, int element_bytes, void* stream) override {
    if (!zero_) return;  // every worker stepped every weight
    auto* s = static_cast<cudaStream_t>(stream);
    cudaEvent_t stepped = NextEvent();
    HERD_CUDA_CHECK(cudaEventRecord(stepped, s));
    HERD_CUDA_CHECK(cudaStreamWaitEvent(nccl_->stream(), stepped, 0));
    char* bytes = static_cast<char*>(weights);
    for (size_t i = 0; i < owners_.size(); ++i) {
      const ParamRange& b = plan_.buckets()[i].range;
      const int64_t lo = std::max(begin, b.begin), hi = std::min(end, b.end);
      if (lo < hi) handles_.push_back(nccl_->AllGather(bytes + lo * element_bytes, PartsWithin(i, lo, hi), element_bytes));
    }
    cudaEvent_t gathered = NextEvent();
    HERD_CUDA_CHECK(cudaEventRecord(gathered, nccl_->stream()));
    HERD_CUDA_CHECK(cudaStreamWaitEvent(s, gathered, 0));
  }
  Status Finish() override { return FinishStep(); }

  Status FinishStep() override {
    Status first;
    for (transport::Collectives::Handle h : handles_) {
      Status st = nccl_->Wait(h);
      if (!st.ok() && first.ok()) first = st;
    }
    for (transport::Collectives::Handle h : replica_handles_) {
      Status st = replicas_->Wait(h);
      if (!st.ok() && first.ok()) first = st;
    }
    handles_.clear();
    replica_handles_.clear();
    next_event_ = 0;
    return first;
  }

 private:
  // Bucket i's cut among the ranks, of its piece [lo, hi): rank r's part is
  // the overlap of its slice with the piece.
  Partition PartsWithin(size_t i, int64_t lo, int64_t hi) const {
    const Partition& owners = owners_[i];
    Partition parts(owners.size(), 0);
    int64_t at = plan_.buckets()[i].range.begin;
    for (size_t r = 0; r < owners.size(); ++r) {
      parts[r] = std::max<int64_t>(0, std::min(hi, at + owners[r]) - std::max(lo, at));
      at += owners[r];
    }
    return parts;
  }

  cudaEvent_t NextEvent() {
    if (next_event_ == events_.size()) {
      cudaEvent_t e;
      HERD_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      events_.push_back(e);
    }
    return events_[next_event_++];
  }

  std::unique_ptr<transport::NcclCollectives> nccl_;      // the shard group
  std::unique_ptr<transport::NcclCollectives> replicas_;  // hybrid: this place in the other groups
  const ShardPlan& plan_;
  const bool zero_;
  std::vector<Partition> owners_;  // each bucket's cut among the ranks (plan order)
  std::vector<transport::Collectives::Handle> handles_, replica_handles_;
  std::vector<cudaEvent_t> events_;
  size_t next_event_ = 0;
  cudaEvent_t reduced_ = nullptr;  // after the last ReduceGradients' reductions
};

// The communicators of `groups` (every worker makes the same ones, in
// the same order) and the reduction over them.
StatusOr<std::unique_ptr<NcclGradientReduction>> MakeReduction(transport::CoordinatorClient& client,
                                                               const ShardPlan& plan, bool zero,
                                                               const NcclGroups& groups) {
  HERD_ASSIGN_OR_RETURN(auto nccl, transport::NcclCollectives::Create(client, groups.shard_group, "shard-group"));
  std::unique_ptr<transport::NcclCollectives> replicas;
  if (groups.replicas.size() > 1) {
    HERD_ASSIGN_OR_RETURN(replicas, transport::NcclCollectives::Create(client, groups.replicas, "replicas"));
  }
  return std::make_unique<NcclGradientReduction>(std::move(nccl), std::move(replicas), plan, zero);
}

}  // namespace

StatusOr<std::unique_ptr<DeviceGradientReduction>> ReduceGradientsWithNccl(transport::CoordinatorClient& client,
                                                                           Model& model, const ShardPlan& plan,
                                                                           bool zero, const NcclGroups& groups) {
  HERD_ASSIGN_OR_RETURN(std::unique_ptr<NcclGradientReduction> reduction, MakeReduction(client, plan, zero, groups));
  NcclGradientReduction* r = reduction.get();
  HERD_RETURN_IF_ERROR(cuda::AttachGradientReducer(model, [r](float* grads, int64_t begin, int64_t end, cudaEvent_t ready) {
    return r->Reduce(grads, begin, end, ready);
  }));
  return std::unique_ptr<DeviceGradientReduction>(std::move(reduction));
}

StatusOr<std::unique_ptr<cuda::DeviceExchange>> ExchangeWithNccl(transport::CoordinatorClient& client,
                                                                 const ShardPlan& plan, bool zero,
                                                                 const NcclGroups& groups) {
  HERD_ASSIGN_OR_RETURN(std::unique_ptr<NcclGradientReduction> reduction, MakeReduction(client, plan, zero, groups));
  return std::unique_ptr<cuda::DeviceExchange>(std::move(reduction));
}

#else

bool BuiltWithNccl() { return false; }

StatusOr<std::unique_ptr<cuda::DeviceExchange>> ExchangeWithNccl(transport::CoordinatorClient&, const ShardPlan&,
                                                                 bool, const NcclGroups&) {
  return Status::Unavailable("this herd was built without NCCL");
}

StatusOr<std::unique_ptr<DeviceGradientReduction>> ReduceGradientsWithNccl(transport::CoordinatorClient&, Model&,
                                                                           const ShardPlan&, bool, const NcclGroups&) {
  return Status::Unavailable("this herd was built without NCCL");
}

#endif

}  // namespace herd
