#include "worker/placements/model_group_steps.h"

#include <algorithm>
#include <string>
#include <vector>

#include "common/trace.h"

namespace herd {
namespace {

// What a model-parallel worker's step adds to any reducer's: a failure of
// the model's group collectives (tensor, context; kept by their rings)
// ends the step, and with sequence parallelism the norms' gradients (each
// rank's rows' part) are summed over the group, packed together into one
// sum and back, those at offsets >= x at once when backward has finished
// them (SumFrom).
class GroupGradients {
 public:
  explicit GroupGradients(const ModelGroupOptions& o) : o_(o) {
    if (!o.sequence_parallel) return;
    std::vector<ParamRange> held = o.held;
    if (held.empty()) held.push_back({0, o.slices->layout().size()});
    for (const ParamRange& h : held) {
      for (const TensorSlices::Run& r : o.slices->RunsWithin(h)) {
        if (r.replicated) norms_.push_back(r);
      }
    }
    std::sort(norms_.begin(), norms_.end(),
              [](const TensorSlices::Run& a, const TensorSlices::Run& b) { return a.local < b.local; });
  }

  // Before a step: every norm's gradient still to be summed.
  void Begin(float* grads, uint64_t step) {
    grads_ = grads;
    step_ = step;
    unsummed_ = norms_.size();
  }
  // Sums the norms' gradients at offsets >= `offset` not summed yet (the
  // packed space's), once backward has finished them.
  Status SumFrom(int64_t offset) {
    size_t first = unsummed_;
    while (first > 0 && norms_[first - 1].local >= offset) --first;
    if (first == unsummed_) return Status::OK();
    trace::Span span("norm gradients' sum", "collective", {"step", static_cast<int64_t>(step_ + 1)});
    int64_t n = 0;
    for (size_t i = first; i < unsummed_; ++i) n += norms_[i].flat.size();
    packed_.resize(n);
    n = 0;
    for (size_t i = first; i < unsummed_; ++i) {
      const TensorSlices::Run& r = norms_[i];
      std::copy(grads_ + r.local, grads_ + r.local + r.flat.size(), packed_.begin() + n);
      n += r.flat.size();
    }
    Status st = o_.tensor_ring->Sum(packed_.data(), n);
    n = 0;
    for (size_t i = first; i < unsummed_; ++i) {
      const TensorSlices::Run& r = norms_[i];
      std::copy(packed_.begin() + n, packed_.begin() + n + r.flat.size(), grads_ + r.local);
      n += r.flat.size();
    }
    unsummed_ = first;
    return st.WithContext(At() + "tensor-parallel sum: ");
  }
  // Before the step's gradients leave: the rest summed, and the groups'
  // collectives' failures.
  Status Finish() {
    HERD_RETURN_IF_ERROR(SumFrom(0));
    if (o_.tensor_ring != nullptr) {
      HERD_RETURN_IF_ERROR(o_.tensor_ring->failure().WithContext(At() + "tensor-parallel sum: "));
    }
    if (o_.context_ring != nullptr) {
      HERD_RETURN_IF_ERROR(o_.context_ring->failure().WithContext(At() + "context-parallel gather: "));
    }
    if (o_.device_tensor != nullptr) {
      HERD_RETURN_IF_ERROR(o_.device_tensor->Finish().WithContext(At() + "tensor-parallel sum: "));
    }
    if (o_.device_context != nullptr) {
      HERD_RETURN_IF_ERROR(o_.device_context->Finish().WithContext(At() + "context-parallel gather: "));
    }
    return Status::OK();
  }

  // The group rings' waits since the last call.
  double TakeWaitSeconds() {
    return (o_.tensor_ring != nullptr ? o_.tensor_ring->TakeWaitSeconds() : 0.0) +
           (o_.context_ring != nullptr ? o_.context_ring->TakeWaitSeconds() : 0.0) +
           (o_.device_tensor != nullptr ? o_.device_tensor->TakeWaitSeconds() : 0.0) +
           (o_.device_context != nullptr ? o_.device_context->TakeWaitSeconds() : 0.0);
  }

 private:
  std::string At() const { return "step " + std::to_string(step_ + 1) + ": "; }

  const ModelGroupOptions o_;
  std::vector<TensorSlices::Run> norms_;  // sequence parallelism: the norms' runs, ascending
  float* grads_ = nullptr;
  uint64_t step_ = 0;
  size_t unsummed_ = 0;        // norms_[0, unsummed_) are still to be summed this step
  std::vector<float> packed_;  // their gradients packed for a sum
};

// Any reducer of the placement's space with the groups' part of a step
// before it: a unit's norms' gradients summed over the tensor group before
// the reducer takes them as final, and the groups' failures ending the
// step.
class ModelGroupStep : public SyncStrategy {
 public:
  ModelGroupStep(const ModelGroupOptions& o, std::unique_ptr<SyncStrategy> reducer)
      : reducer_(std::move(reducer)), group_(o) {}

  void BeginStep(float* grads, const StepShare& share) override {
    group_.Begin(grads, share.step);
    reducer_->BeginStep(grads, share);
  }
  void FinalFrom(int64_t offset) override {
    // A failed sum is kept by the group's ring and returned by Finish.
    (void)group_.SumFrom(offset);
    reducer_->FinalFrom(offset);
  }
  Status FinishStep(double loss) override {
    Status st = group_.Finish();
    Status reduced = reducer_->FinishStep(loss);
    HERD_RETURN_IF_ERROR(st);
    return reduced;
  }
  void IssueWeights(float* weights, uint64_t version) override { reducer_->IssueWeights(weights, version); }
  void WaitUpTo(int64_t end) override { reducer_->WaitUpTo(end); }
  Status FinishWeights() override { return reducer_->FinishWeights(); }
  StatusOr<bool> FinishWeightsUnless(const std::function<bool()>& interrupted) override {
    return reducer_->FinishWeightsUnless(interrupted);
  }
  void Wake() override { reducer_->Wake(); }
  const StepReport& report() const override { return reducer_->report(); }
  double TakeWaitSeconds() override { return reducer_->TakeWaitSeconds() + group_.TakeWaitSeconds(); }
  Status WriteCheckpointParts(const std::string& step_dir) override {
    return reducer_->WriteCheckpointParts(step_dir);
  }
  int shard_files() const override { return reducer_->shard_files(); }

 private:
  const std::unique_ptr<SyncStrategy> reducer_;
  GroupGradients group_;
};

}  // namespace

std::unique_ptr<SyncStrategy> ModelGroupSteps(const ModelGroupOptions& options,
                                              std::unique_ptr<SyncStrategy> reducer) {
  return std::make_unique<ModelGroupStep>(options, std::move(reducer));
}

}  // namespace herd
