#include "worker/tensor_parallel_sync.h"

#include <cmath>
#include <string>
#include <vector>

#include "common/file_util.h"
#include "common/trace.h"
#include "model/checkpoint_format.h"
#include "model/hf_io.h"
#include "model/optim/adamw.h"
#include "model/optim/optimizer_shard.h"
#include "transport/ps_protocol.h"

namespace herd {
namespace {

using transport::Collectives;
using transport::DType;

class TensorParallelSync : public SyncStrategy {
 public:
  TensorParallelSync(const TensorParallelSyncOptions& o, std::unique_ptr<OptimizerShard> optimizer)
      : o_(o),
        replica_(o.replicas != nullptr ? o.replicas->rank() : 0),
        replicas_(o.replicas != nullptr ? o.replicas->size() : 1),
        optimizer_(std::move(optimizer)) {
    report_.version = static_cast<uint64_t>(optimizer_->step());
    if (o.sequence_parallel) {
      for (const TensorSlices::Run& r : o.slices->runs()) {
        if (r.replicated) norms_size_ += r.flat.size();
      }
    }
  }

  void BeginStep(float* grads, const StepShare& share) override {
    grads_ = grads;
    step_ = share.step;
  }
  void FinalFrom(int64_t) override {}

  Status FinishStep(double loss) override {
    const std::string at = "step " + std::to_string(step_ + 1) + ": ";
    HERD_RETURN_IF_ERROR(o_.tensor_ring->failure().WithContext(at + "tensor-parallel sum: "));
    if (o_.context_ring != nullptr) {
      HERD_RETURN_IF_ERROR(o_.context_ring->failure().WithContext(at + "context-parallel gather: "));
    }
    if (norms_size_ > 0) HERD_RETURN_IF_ERROR(SumNormGradients().WithContext(at + "tensor-parallel sum: "));
    const int64_t n = optimizer_->size();
    if (o_.replicas != nullptr) {
      trace::Span span("slice all-reduce", "collective", {"step", static_cast<int64_t>(step_ + 1)});
      HERD_RETURN_IF_ERROR(wait_.Timed([&] {
                                  return o_.replicas->Wait(o_.replicas->AllReduce(grads_, n, DType::kFloat32));
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
  double TakeWaitSeconds() override {
    return wait_.Take() + o_.tensor_ring->TakeWaitSeconds() +
           (o_.context_ring != nullptr ? o_.context_ring->TakeWaitSeconds() : 0.0);
  }

  // The slices as pieces of the flat space; the norms by rank 0.
  Status WriteCheckpointParts(const std::string& step_dir) override {
    if (replica_ != 0) return Status::OK();
    const ShardView whole = optimizer_->view();
    std::vector<ShardView> pieces;
    for (const TensorSlices::Run& r : o_.slices->runs()) {
      if (r.replicated && o_.slices->rank() != 0) continue;
      pieces.push_back({r.flat.begin, r.flat.end, whole.step, whole.weights + r.local, whole.m + r.local,
                        whole.v + r.local, whole.spikes});
    }
    return WriteShardPieces(JoinPath(step_dir, ShardFileName(o_.slices->rank())), pieces);
  }
  int shard_files() const override { return o_.slices->ranks(); }

 private:
  // Sequence parallelism: the norms' gradients, each rank's rows' part,
  // summed over the group in one sum (packed together, then back).
  Status SumNormGradients() {
    trace::Span span("norm gradients' sum", "collective", {"step", static_cast<int64_t>(step_ + 1)});
    norms_.resize(norms_size_);
    int64_t at = 0;
    for (const TensorSlices::Run& r : o_.slices->runs()) {
      if (!r.replicated) continue;
      std::copy(grads_ + r.local, grads_ + r.local + r.flat.size(), norms_.begin() + at);
      at += r.flat.size();
    }
    HERD_RETURN_IF_ERROR(o_.tensor_ring->Sum(norms_.data(), norms_size_));
    at = 0;
    for (const TensorSlices::Run& r : o_.slices->runs()) {
      if (!r.replicated) continue;
      std::copy(norms_.begin() + at, norms_.begin() + at + r.flat.size(), grads_ + r.local);
      at += r.flat.size();
    }
    return Status::OK();
  }

  const TensorParallelSyncOptions o_;
  const int replica_, replicas_;  // among the rank's data-parallel replicas
  const std::unique_ptr<OptimizerShard> optimizer_;  // the packed space, weights attached
  int64_t norms_size_ = 0;   // sequence parallelism: the norms' elements
  std::vector<float> norms_;  // their gradients packed for the sum
  float* grads_ = nullptr;
  uint64_t step_ = 0;
  StepReport report_;
  WaitClock wait_;
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
  std::fill(weights, weights + n, 0.0f);  // the packed space's padding
  if (resume_from) {
    // Each run of the slices from whatever shards wrote it.
    HERD_ASSIGN_OR_RETURN(std::vector<ShardState> runs,
                          ReadShardRanges(resume_from->dir, resume_from->manifest, slices.Ranges(), true));
    for (size_t i = 0; i < runs.size(); ++i) {
      const TensorSlices::Run& r = slices.runs()[i];
      std::copy(runs[i].weights.begin(), runs[i].weights.end(), weights + r.local);
      std::copy(runs[i].m.begin(), runs[i].m.end(), state.m.begin() + r.local);
      std::copy(runs[i].v.begin(), runs[i].v.end(), state.v.begin() + r.local);
    }
    if (!runs.empty()) {
      state.step = runs.front().step;
      state.spikes = runs.front().spikes;
    }
  } else {
    // Tensor by tensor (a function of the seed and the tensor, or
    // init_from's file), this rank's runs of it kept: no more than one
    // tensor is ever held whole.
    const WeightInit& init = o.job->init;
    const std::vector<TensorSlices::Run>& runs = slices.runs();
    size_t next = 0;
    std::vector<float> tensor;
    for (const TensorSpec& t : o.layout->tensors()) {
      if (init.init_from.empty()) {
        tensor.resize(t.numel);
        InitTensor(t, init.seed, init.initializer_range, tensor.data());
      } else {
        HERD_ASSIGN_OR_RETURN(tensor, LoadInitialWeights(init.init_from, init.model, t.offset, t.offset + t.numel));
      }
      for (; next < runs.size() && runs[next].flat.begin < t.offset + t.numel; ++next) {
        const TensorSlices::Run& r = runs[next];
        std::copy(tensor.begin() + (r.flat.begin - t.offset), tensor.begin() + (r.flat.end - t.offset),
                  weights + r.local);
      }
    }
  }
  auto optimizer = std::make_unique<OptimizerShard>(slices.layout(), o.job->optimizer, std::move(state), weights);
  return std::unique_ptr<SyncStrategy>(std::make_unique<TensorParallelSync>(o, std::move(optimizer)));
}

}  // namespace herd
