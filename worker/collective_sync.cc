#include "worker/collective_sync.h"

#include <glog/logging.h>

#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "common/file_util.h"
#include "common/trace.h"
#include "model/checkpoint_format.h"
#include "model/checkpoint_load.h"
#include "model/hf_io.h"
#include "model/optim/optimizer_shard.h"

namespace herd {
namespace {

using transport::Collectives;
using transport::DType;

// A rank's slice of a bucket: [begin, end) of the flat space.
ParamRange SliceOf(const Bucket& b, const Partition& parts, int rank) {
  int64_t begin = b.range.begin;
  for (int r = 0; r < rank; ++r) begin += parts[r];
  return {begin, begin + parts[rank]};
}

class CollectiveSync : public SyncStrategy {
 public:
  CollectiveSync(const CollectiveSyncOptions& o, float* weights, std::unique_ptr<OptimizerSlices> optimizer,
                 bool broadcast_first)
      : o_(o),
        c_(*o.collectives),
        W_(c_.size()),
        rank_(c_.rank()),
        P_(o.layout->size()),
        zero_(o.zero_stage > 0),
        norm_slices_(OwnedSlices(*o.plan, W_, rank_)),
        optimizer_(std::move(optimizer)),
        weights_(weights),
        broadcast_first_(broadcast_first) {
    report_.version = static_cast<uint64_t>(optimizer_->step());
    for (const Bucket& b : o.plan->buckets()) parts_.push_back(OwnerParts(b, W_));
  }

  void BeginStep(float* grads, const StepShare& share) override {
    grads_ = grads;  // reduced in place
    step_ = share.step;
    next_bucket_ = 0;
    grad_handles_.clear();
    retired_ = 0;
  }

  void FinalFrom(int64_t offset) override {
    if (o_.device_reduction != nullptr) return;  // reduced before they reached us
    const auto& buckets = o_.plan->buckets();
    while (next_bucket_ < buckets.size() && buckets[next_bucket_].range.begin >= offset) {
      const Bucket& b = buckets[next_bucket_];
      float* g = grads_ + b.range.begin;
      grad_handles_.push_back(zero_ ? c_.ReduceScatter(g, parts_[next_bucket_])
                                    : c_.AllReduce(g, b.range.size(), DType::kFloat32));
      ++next_bucket_;
      if (o_.paged_grads != nullptr) {
        while (next_bucket_ - retired_ > static_cast<size_t>(kReduceScattersInFlight)) Retire();
      }
    }
  }

  Status FinishStep(double loss) override {
    Status st;
    if (o_.device_reduction != nullptr) {
      st = wait_.Timed([&] { return o_.device_reduction->FinishStep(); });
    } else {
      CHECK_EQ(next_bucket_, o_.plan->buckets().size()) << "backward did not finish every bucket";
      while (retired_ < grad_handles_.size()) Retire();
      st = std::exchange(grad_status_, Status::OK());
    }
    // The global squared norm: the owners' partials (under DDP every worker
    // holds every sum, and takes the same slices' partials), added by one
    // all-reduce with the losses.
    double sums[2] = {0.0, loss};
    for (const ParamRange& r : norm_slices_) sums[0] += SumOfSquares(grads_ + r.begin, r.size());
    if (st.ok()) {
      trace::Span span("norm exchange", "collective", {"step", static_cast<int64_t>(step_ + 1)});
      st = wait_.Timed([&] { return c_.Wait(c_.AllReduce(sums, 2, DType::kFloat64)); });
    }
    HERD_RETURN_IF_ERROR(st.WithContext("all-reduce of step " + std::to_string(step_ + 1) + ": "));
    const double norm = std::sqrt(sums[0]);
    HERD_RETURN_IF_ERROR(CheckNotDiverged("gradient norm", norm));
    CHECK_EQ(static_cast<uint64_t>(optimizer_->step()), step_) << "the strategy and the optimizer disagree on the step";
    trace::Span span("adamw", "compute", {"step", static_cast<int64_t>(step_ + 1)});
    const OptimizerShard::Scalars s = optimizer_->Step(grads_, norm, sums[1] / W_);
    report_ = ReportOf(s.step, norm, s.lr, sums[1] / W_, s.spike);
    return Status::OK();
  }

  void IssueWeights(float* weights, uint64_t) override {
    weights_ = weights;
    weight_handles_.clear();
    weight_ends_.clear();
    next_weight_ = 0;
    if (first_weights_) {
      // A fresh start takes worker 0's weights; a resumed one has read them.
      first_weights_ = false;
      if (broadcast_first_) {
        weight_handles_.push_back(c_.Broadcast(weights, P_, 0));
        weight_ends_.push_back(P_);
      }
      return;
    }
    if (!zero_) return;  // DDP: every worker has stepped the same weights
    const auto& buckets = o_.plan->buckets();
    for (size_t i = buckets.size(); i-- > 0;) {
      weight_handles_.push_back(c_.AllGather(weights + buckets[i].range.begin, parts_[i]));
      weight_ends_.push_back(buckets[i].range.end);
    }
  }

  void WaitUpTo(int64_t end) override {
    // Handle i brings [weight_ends_[i-1], weight_ends_[i]).
    while (next_weight_ < weight_handles_.size() && (next_weight_ == 0 || weight_ends_[next_weight_ - 1] < end)) {
      trace::Span span("wait for weights", "wait", {"handle", static_cast<int64_t>(next_weight_)});
      Status st = wait_.Timed([&] { return c_.Wait(weight_handles_[next_weight_]); });
      if (!st.ok() && weight_status_.ok()) weight_status_ = st;
      ++next_weight_;
    }
  }

  Status FinishWeights() override {
    WaitUpTo(P_);
    Status st = weight_status_;
    weight_status_ = Status::OK();
    weight_handles_.clear();
    return st.WithContext("weights: ");
  }

  const StepReport& report() const override { return report_; }

  double TakeWaitSeconds() override { return wait_.Take(); }

  Status WriteCheckpointParts(const std::string& step_dir) override {
    if (!zero_ && rank_ != 0) return Status::OK();
    return optimizer_->Save(JoinPath(step_dir, ShardFileName(zero_ ? rank_ : 0)));
  }
  int shard_files() const override { return zero_ ? W_ : 1; }

 private:
  // Waits for the oldest gradient bucket's reduction not waited for yet;
  // ZeRO-2 then lets go of the bucket outside this worker's slice.
  void Retire() {
    const size_t i = retired_++;
    trace::Span span("wait for gradients", "wait", {"bucket", static_cast<int64_t>(i)},
                     {"step", static_cast<int64_t>(step_ + 1)});
    Status st = wait_.Timed([&] { return c_.Wait(grad_handles_[i]); });
    if (!st.ok() && grad_status_.ok()) grad_status_ = st;
    if (o_.paged_grads == nullptr) return;
    const Bucket& b = o_.plan->buckets()[i];
    const ParamRange mine = SliceOf(b, parts_[i], rank_);
    o_.paged_grads->Release(b.range.begin * sizeof(float), (mine.begin - b.range.begin) * sizeof(float));
    o_.paged_grads->Release(mine.end * sizeof(float), (b.range.end - mine.end) * sizeof(float));
  }

  const CollectiveSyncOptions o_;
  Collectives& c_;
  const int W_, rank_;
  const int64_t P_;
  const bool zero_;  // stage 1 or 2: the optimizer holds this worker's slices only
  // The slices whose squared gradients this worker adds to the norm (its
  // own under ZeRO; the same cut under DDP).
  const std::vector<ParamRange> norm_slices_;
  // Each bucket's cut among the ranks (plan order).
  std::vector<Partition> parts_;
  // The whole space (DDP) or this worker's slices; master weights in the
  // worker's weights (attached).
  const std::unique_ptr<OptimizerSlices> optimizer_;
  float* weights_;
  float* grads_ = nullptr;
  bool broadcast_first_, first_weights_ = true;
  uint64_t step_ = 0;
  size_t next_bucket_ = 0, retired_ = 0;
  std::vector<Collectives::Handle> grad_handles_, weight_handles_;
  Status grad_status_;
  std::vector<int64_t> weight_ends_;
  size_t next_weight_ = 0;
  Status weight_status_;
  StepReport report_;
  WaitClock wait_;
};

}  // namespace

StatusOr<std::unique_ptr<SyncStrategy>> CreateCollectiveSync(
    const CollectiveSyncOptions& o, float* weights, const std::optional<VerifiedCheckpoint>& resume_from) {
  const int rank = o.collectives->rank();
  const int64_t P = o.layout->size();
  const bool zero = o.zero_stage > 0;
  const std::vector<ParamRange> owned =
      zero ? OwnedSlices(*o.plan, o.collectives->size(), rank) : std::vector<ParamRange>{{0, P}};
  HERD_ASSIGN_OR_RETURN(std::unique_ptr<OptimizerSlices> optimizer,
                        OptimizerSlices::InitOrResume(o.job->optimizer, o.job->init, *o.layout, owned, resume_from));
  if (resume_from && zero) {
    // ZeRO: the model needs the other workers' weights too.
    HERD_ASSIGN_OR_RETURN(ShardState all, ReadShardRange(resume_from->dir, resume_from->manifest, 0, P, false));
    std::copy(all.weights.begin(), all.weights.end(), weights);
  } else if (!resume_from && rank == 0) {
    // A fresh start broadcasts worker 0's whole model.
    const WeightInit& init = o.job->init;
    if (!init.init_from.empty()) {
      HERD_ASSIGN_OR_RETURN(std::vector<float> loaded, LoadInitialWeights(init.init_from, init.model, 0, P));
      std::copy(loaded.begin(), loaded.end(), weights);
    } else {
      InitParameters(*o.layout, init.seed, init.initializer_range, weights);
    }
  }
  optimizer->AttachWeights(weights);
  return std::unique_ptr<SyncStrategy>(
      new CollectiveSync(o, weights, std::move(optimizer), /*broadcast_first=*/!resume_from));
}

}  // namespace herd
