#include "worker/weight_home.h"

#include <algorithm>

namespace herd {
namespace {

class Whole : public WeightHome {
 public:
  Whole(SyncStrategy& sync, PagedBuffer* paged_grads) : sync_(sync), paged_grads_(paged_grads) {}

  Model::NeedUpTo ForwardNeed(bool arriving) override {
    if (!arriving) return nullptr;
    return [this](int64_t end) { sync_.WaitUpTo(end); };
  }
  Model::NeedFrom BackwardNeed() override { return nullptr; }
  Model::FinalFrom BackwardDone(bool last_micro_batch) override {
    if (!last_micro_batch) return nullptr;
    return [this](int64_t offset) { sync_.FinalFrom(offset); };
  }
  void ClearGradients(float* grads, int64_t count) override {
    if (paged_grads_ != nullptr) return paged_grads_->Release(0, paged_grads_->size());
    std::fill(grads, grads + count, 0.0f);
  }
  Model::NeedUpTo EvalNeed() override { return nullptr; }
  void Release() override {}

 private:
  SyncStrategy& sync_;
  PagedBuffer* const paged_grads_;
};

}  // namespace

std::unique_ptr<WeightHome> WholeWeights(SyncStrategy& sync, PagedBuffer* paged_grads) {
  return std::make_unique<Whole>(sync, paged_grads);
}

}  // namespace herd
