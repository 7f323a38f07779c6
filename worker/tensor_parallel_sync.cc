#include "worker/tensor_parallel_sync.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "common/file_util.h"
#include "common/trace.h"
#include "model/checkpoint_format.h"
#include "model/optim/adamw.h"
#include "model/optim/optimizer_shard.h"
#include "transport/ps_protocol.h"

namespace herd {
namespace {

using transport::Collectives;
using transport::DType;

// What a model-parallel worker's step adds to any reducer's: a failure of
// the model's group collectives (tensor, context; kept by their rings)
// ends the step, and
// with sequence parallelism the norms' gradients (each rank's rows' part)
// are summed over the group, packed together into one sum and back, those
// at offsets >= x at once when backward has finished them (SumFrom).
class GroupGradients {
 public:
  explicit GroupGradients(const TensorParallelSyncOptions& o) : o_(o) {
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
    return Status::OK();
  }

  // The group rings' waits since the last call.
  double TakeWaitSeconds() {
    return (o_.tensor_ring != nullptr ? o_.tensor_ring->TakeWaitSeconds() : 0.0) +
           (o_.context_ring != nullptr ? o_.context_ring->TakeWaitSeconds() : 0.0);
  }

 private:
  std::string At() const { return "step " + std::to_string(step_ + 1) + ": "; }

  const TensorParallelSyncOptions o_;
  std::vector<TensorSlices::Run> norms_;  // sequence parallelism: the norms' runs, ascending
  float* grads_ = nullptr;
  uint64_t step_ = 0;
  size_t unsummed_ = 0;        // norms_[0, unsummed_) are still to be summed this step
  std::vector<float> packed_;  // their gradients packed for a sum
};

class TensorParallelSync : public SyncStrategy {
 public:
  TensorParallelSync(const TensorParallelSyncOptions& o, std::unique_ptr<OptimizerShard> optimizer)
      : o_(o),
        replica_(o.replicas != nullptr ? o.replicas->rank() : 0),
        replicas_(o.replicas != nullptr ? o.replicas->size() : 1),
        optimizer_(std::move(optimizer)),
        group_(o) {
    report_.version = static_cast<uint64_t>(optimizer_->step());
  }

  void BeginStep(float* grads, const StepShare& share) override {
    grads_ = grads;
    step_ = share.step;
    group_.Begin(grads, share.step);
  }
  void FinalFrom(int64_t) override {}

  Status FinishStep(double loss) override {
    const std::string at = "step " + std::to_string(step_ + 1) + ": ";
    HERD_RETURN_IF_ERROR(group_.Finish());
    const int64_t n = optimizer_->size();
    if (o_.replicas != nullptr) {
      trace::Span span("slice all-reduce", "collective", {"step", static_cast<int64_t>(step_ + 1)});
      HERD_RETURN_IF_ERROR(wait_.Timed([&] {
                                  return o_.replicas->Wait(o_.replicas->AllReduce(grads_, n, DType::kFloat32, o_.gradient_wire));
                                })
                               .WithContext(at + "all-reduce among tensor-parallel rank " +
                                            std::to_string(o_.slices->rank()) + "'s replicas: "));
    }
    // Every replica holds the same sums: the first one's are counted, and
    // the norms' (every rank's alike) on tensor-parallel rank 0 alone.
    double sumsq = 0;
    if (replica_ == 0) {
      for (const TensorSlices::Run& r : o_.slices->runs()) {
        if (!r.replicated || o_.slices->rank() == 0) sumsq += SumOfSquares(grads_ + r.local, r.flat.size());
      }
    }
    // Every rank of a replica knows its loss: rank 0's alone is added.
    double sums[2] = {sumsq, o_.slices->rank() == 0 ? loss : 0.0};
    {
      trace::Span span("norm exchange", "collective", {"step", static_cast<int64_t>(step_ + 1)});
      Collectives& c = *o_.everyone;
      HERD_RETURN_IF_ERROR(
          wait_.Timed([&] { return c.Wait(c.AllReduce(sums, 2, DType::kFloat64)); }).WithContext(at));
    }
    const double norm = std::sqrt(sums[0]), mean_loss = sums[1] / replicas_;
    HERD_RETURN_IF_ERROR(CheckNotDiverged("gradient norm", norm));
    trace::Span span("adamw", "compute", {"step", static_cast<int64_t>(step_ + 1)});
    const OptimizerShard::Scalars s = optimizer_->Step(grads_, norm, mean_loss);
    report_ = ReportOf(s.step, norm, s.lr, mean_loss, s.spike);
    return Status::OK();
  }

  // The weights are this worker's own, stepped in place.
  void IssueWeights(float*, uint64_t) override {}
  void WaitUpTo(int64_t) override {}
  Status FinishWeights() override { return Status::OK(); }
  const StepReport& report() const override { return report_; }
  double TakeWaitSeconds() override { return wait_.Take() + group_.TakeWaitSeconds(); }

  // The slices as pieces of the flat space; the norms by rank 0.
  Status WriteCheckpointParts(const std::string& step_dir) override {
    if (replica_ != 0) return Status::OK();
    return WriteShardPieces(JoinPath(step_dir, ShardFileName(o_.slices->rank())),
                            o_.slices->FlatPieces(optimizer_->view(), /*with_norms=*/o_.slices->rank() == 0));
  }
  int shard_files() const override { return o_.slices->ranks(); }

 private:
  const TensorParallelSyncOptions o_;
  const int replica_, replicas_;  // among the rank's data-parallel replicas
  const std::unique_ptr<OptimizerShard> optimizer_;  // the packed space, weights attached
  GroupGradients group_;
  float* grads_ = nullptr;
  uint64_t step_ = 0;
  StepReport report_;
  WaitClock wait_;
};

// Any reducer of the rank's packed space (`reducer`: parameter servers,
// or collectives among its replicas) with the group's part of a step
// before it: a unit's norms' gradients summed over the group before the
// reducer takes them as final, and the group's failures ending the step.
class ModelGroupStep : public SyncStrategy {
 public:
  ModelGroupStep(const TensorParallelSyncOptions& o, std::unique_ptr<SyncStrategy> reducer)
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

StatusOr<std::unique_ptr<SyncStrategy>> CreateTensorParallelSync(const TensorParallelSyncOptions& o, float* weights,
                                                                 const std::optional<VerifiedCheckpoint>& resume_from) {
  const TensorSlices& slices = *o.slices;
  const int64_t n = slices.layout().size();
  ShardState state;
  state.begin = 0;
  state.end = n;
  state.m.assign(n, 0.0f);
  state.v.assign(n, 0.0f);
  std::fill(weights, weights + n, 0.0f);
  HERD_RETURN_IF_ERROR(LoadPackedRange(slices, {0, n}, o.job->init, *o.layout, resume_from,
                                       {weights, state.m.data(), state.v.data(), &state.step, &state.spikes}));
  auto optimizer = std::make_unique<OptimizerShard>(slices.layout(), o.job->optimizer, std::move(state), weights);
  return std::unique_ptr<SyncStrategy>(std::make_unique<TensorParallelSync>(o, std::move(optimizer)));
}

std::unique_ptr<SyncStrategy> ModelGroupSteps(const TensorParallelSyncOptions& options,
                                              std::unique_ptr<SyncStrategy> reducer) {
  return std::make_unique<ModelGroupStep>(options, std::move(reducer));
}

}  // namespace herd
