#include "worker/reducers/weight_home.h"

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
    // What the last step kept (ZeRO-2: the worker's slices) is written
    // again at once: zeroed in place rather than given back.
    if (paged_grads_ != nullptr) return paged_grads_->ZeroBacked();
    std::fill(grads, grads + count, 0.0f);
  }
  Model::NeedUpTo EvalNeed() override { return nullptr; }
  void Release() override {}

 private:
  SyncStrategy& sync_;
  PagedBuffer* const paged_grads_;
};

class Windowed : public WeightHome {
 public:
  Windowed(SyncStrategy& sync, WindowHooks& window, PagedBuffer* paged_grads)
      : sync_(sync), window_(window), paged_grads_(paged_grads) {}

  Model::NeedUpTo ForwardNeed(bool) override { return EvalNeed(); }
  Model::NeedFrom BackwardNeed() override {
    return [this](int64_t begin) { window_.WaitFrom(begin); };
  }
  Model::FinalFrom BackwardDone(bool last_micro_batch) override {
    if (!last_micro_batch) return [this](int64_t offset) { window_.DoneFrom(offset); };
    return [this](int64_t offset) {
      sync_.FinalFrom(offset);
      window_.DoneFrom(offset);
    };
  }
  // A window's gradients start from nothing: what the last step kept (a
  // ZeRO-3 owner's slices) goes back until backward writes it again.
  void ClearGradients(float*, int64_t) override { paged_grads_->Release(0, paged_grads_->size()); }
  Model::NeedUpTo EvalNeed() override {
    return [this](int64_t end) { sync_.WaitUpTo(end); };
  }
  void Release() override { window_.ReleaseWeights(); }

 private:
  SyncStrategy& sync_;
  WindowHooks& window_;
  PagedBuffer* const paged_grads_;
};

}  // namespace

std::unique_ptr<WeightHome> WindowedWeights(SyncStrategy& sync, WindowHooks& window, PagedBuffer* paged_grads) {
  return std::make_unique<Windowed>(sync, window, paged_grads);
}

std::unique_ptr<WeightHome> WholeWeights(SyncStrategy& sync, PagedBuffer* paged_grads) {
  return std::make_unique<Whole>(sync, paged_grads);
}

}  // namespace herd
