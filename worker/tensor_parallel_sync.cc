#include "worker/tensor_parallel_sync.h"

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

// What a tensor-parallel worker's step adds in either mode: a failure of
// the model's group collectives (kept by their rings) ends the step, and
// with sequence parallelism the norms' gradients (each rank's rows' part)
// are summed over the group, packed together into one sum and back.
class GroupGradients {
 public:
  explicit GroupGradients(const TensorParallelSyncOptions& o) : o_(o) {
    if (!o.sequence_parallel) return;
    for (const TensorSlices::Run& r : o.slices->runs()) {
      if (r.replicated) norms_size_ += r.flat.size();
    }
  }

  // Before step `step`'s gradients `grads` (the packed space) leave.
  Status Finish(float* grads, uint64_t step) {
    const std::string at = "step " + std::to_string(step + 1) + ": ";
    HERD_RETURN_IF_ERROR(o_.tensor_ring->failure().WithContext(at + "tensor-parallel sum: "));
    if (o_.context_ring != nullptr) {
      HERD_RETURN_IF_ERROR(o_.context_ring->failure().WithContext(at + "context-parallel gather: "));
    }
    if (norms_size_ == 0) return Status::OK();
    trace::Span span("norm gradients' sum", "collective", {"step", static_cast<int64_t>(step + 1)});
    norms_.resize(norms_size_);
    int64_t n = 0;
    for (const TensorSlices::Run& r : o_.slices->runs()) {
      if (!r.replicated) continue;
      std::copy(grads + r.local, grads + r.local + r.flat.size(), norms_.begin() + n);
      n += r.flat.size();
    }
    HERD_RETURN_IF_ERROR(o_.tensor_ring->Sum(norms_.data(), norms_size_).WithContext(at + "tensor-parallel sum: "));
    n = 0;
    for (const TensorSlices::Run& r : o_.slices->runs()) {
      if (!r.replicated) continue;
      std::copy(norms_.begin() + n, norms_.begin() + n + r.flat.size(), grads + r.local);
      n += r.flat.size();
    }
    return Status::OK();
  }

  // The group rings' waits since the last call.
  double TakeWaitSeconds() {
    return o_.tensor_ring->TakeWaitSeconds() +
           (o_.context_ring != nullptr ? o_.context_ring->TakeWaitSeconds() : 0.0);
  }

 private:
  const TensorParallelSyncOptions o_;
  int64_t norms_size_ = 0;    // sequence parallelism: the norms' elements
  std::vector<float> norms_;  // their gradients packed for the sum
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
  }
  void FinalFrom(int64_t) override {}

  Status FinishStep(double loss) override {
    const std::string at = "step " + std::to_string(step_ + 1) + ": ";
    HERD_RETURN_IF_ERROR(group_.Finish(grads_, step_));
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

// Parameter-server mode: `pushes` moves the rank's packed part to and
// from the servers; the group's part comes first. With sequence
// parallelism no bucket leaves before the norms' gradients are summed, so
// the pushes wait for backward's end.
class TensorParallelPushPull : public SyncStrategy {
 public:
  TensorParallelPushPull(const TensorParallelSyncOptions& o, std::unique_ptr<SyncStrategy> pushes)
      : pushes_(std::move(pushes)), hold_pushes_(o.sequence_parallel), group_(o) {}

  void BeginStep(float* grads, const StepShare& share) override {
    grads_ = grads;
    step_ = share.step;
    pushes_->BeginStep(grads, share);
  }
  void FinalFrom(int64_t offset) override {
    if (!hold_pushes_) pushes_->FinalFrom(offset);
  }
  Status FinishStep(double loss) override {
    HERD_RETURN_IF_ERROR(group_.Finish(grads_, step_));
    if (hold_pushes_) pushes_->FinalFrom(0);
    return pushes_->FinishStep(loss);
  }
  void IssueWeights(float* weights, uint64_t version) override { pushes_->IssueWeights(weights, version); }
  void WaitUpTo(int64_t end) override { pushes_->WaitUpTo(end); }
  Status FinishWeights() override { return pushes_->FinishWeights(); }
  const StepReport& report() const override { return pushes_->report(); }
  double TakeWaitSeconds() override { return pushes_->TakeWaitSeconds() + group_.TakeWaitSeconds(); }
  Status WriteCheckpointParts(const std::string& step_dir) override {
    return pushes_->WriteCheckpointParts(step_dir);
  }
  int shard_files() const override { return pushes_->shard_files(); }

 private:
  const std::unique_ptr<SyncStrategy> pushes_;
  const bool hold_pushes_;
  GroupGradients group_;
  float* grads_ = nullptr;
  uint64_t step_ = 0;
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

std::unique_ptr<SyncStrategy> TensorParallelPushes(const TensorParallelSyncOptions& options,
                                                   std::unique_ptr<SyncStrategy> pushes) {
  return std::make_unique<TensorParallelPushPull>(options, std::move(pushes));
}

}  // namespace herd
