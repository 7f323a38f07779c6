#include "worker/collective_sync.h"

#include <glog/logging.h>

#include <cmath>
#include <cstring>
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
using transport::Partition;

class CollectiveSync : public SyncStrategy {
 public:
  CollectiveSync(const CollectiveSyncOptions& o, float* weights, std::unique_ptr<OptimizerShard> optimizer,
                     bool broadcast_first)
      : o_(o),
        c_(*o.collectives),
        W_(c_.size()),
        rank_(c_.rank()),
        P_(o.layout->size()),
        owned_(optimizer->range()),
        optimizer_(std::move(optimizer)),
        weights_(weights),
        broadcast_first_(broadcast_first) {
    report_.version = static_cast<uint64_t>(optimizer_->step());
  }

  void BeginStep(float* grads, const StepShare& share) override {
    grads_ = grads;  // reduced in place
    step_ = share.step;
    next_bucket_ = 0;
    grad_handles_.clear();
  }

  void FinalFrom(int64_t offset) override {
    if (o_.device_reduction != nullptr) return;  // reduced before they reached us
    const auto& buckets = o_.plan->buckets();
    while (next_bucket_ < buckets.size() && buckets[next_bucket_].range.begin >= offset) {
      const Bucket& b = buckets[next_bucket_++];
      float* g = grads_ + b.range.begin;
      grad_handles_.push_back(o_.zero1 ? c_.ReduceScatter(g, OwnerOnly(b))
                                       : c_.AllReduce(g, b.range.size(), DType::kFloat32));
    }
  }

  Status FinishStep(double loss) override {
    Status st;
    if (o_.device_reduction != nullptr) {
      st = wait_.Timed([&] { return o_.device_reduction->FinishStep(); });
    } else {
      CHECK_EQ(next_bucket_, o_.plan->buckets().size()) << "backward did not finish every bucket";
      st = WaitAll();
    }
    // The global squared norm: DDP workers all hold the summed gradients;
    // ZeRO-1 owners each hold their range's.
    double sums[2] = {o_.zero1 ? SumOfSquares(grads_ + owned_.begin, owned_.size()) : 0.0, loss};
    if (st.ok()) {
      trace::Span span("norm exchange", "collective", {"step", static_cast<int64_t>(step_ + 1)});
      st = wait_.Timed([&] { return c_.Wait(c_.AllReduce(sums, 2, DType::kFloat64)); });
    }
    HERD_RETURN_IF_ERROR(st.WithContext("all-reduce of step " + std::to_string(step_ + 1) + ": "));
    const double norm = std::sqrt(o_.zero1 ? sums[0] : SumOfSquares(grads_, P_));
    HERD_RETURN_IF_ERROR(CheckNotDiverged("gradient norm", norm));
    CHECK_EQ(static_cast<uint64_t>(optimizer_->step()), step_) << "the strategy and the optimizer disagree on the step";
    trace::Span span("adamw", "compute", {"step", static_cast<int64_t>(step_ + 1)});
    const OptimizerShard::Scalars s = optimizer_->Step(grads_ + owned_.begin, norm, sums[1] / W_);
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
    if (!o_.zero1) return;  // DDP: every worker has stepped the same weights
    const auto& buckets = o_.plan->buckets();
    for (auto it = buckets.rbegin(); it != buckets.rend(); ++it) {
      weight_handles_.push_back(c_.AllGather(weights + it->range.begin, OwnerOnly(*it)));
      weight_ends_.push_back(it->range.end);
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
    if (!o_.zero1 && rank_ != 0) return Status::OK();
    return optimizer_->Save(JoinPath(step_dir, ShardFileName(o_.zero1 ? rank_ : 0)));
  }
  int shard_files() const override { return o_.zero1 ? W_ : 1; }

 private:
  // A bucket's partition: all of it to its owner.
  Partition OwnerOnly(const Bucket& b) const {
    Partition p(W_, 0);
    p[b.server] = b.range.size();
    return p;
  }
  Status WaitAll() {
    Status first;
    for (size_t i = 0; i < grad_handles_.size(); ++i) {
      trace::Span span("wait for gradients", "wait", {"bucket", static_cast<int64_t>(i)},
                       {"step", static_cast<int64_t>(step_ + 1)});
      Status st = wait_.Timed([&] { return c_.Wait(grad_handles_[i]); });
      if (!st.ok() && first.ok()) first = st;
    }
    grad_handles_.clear();
    return first;
  }

  const CollectiveSyncOptions o_;
  Collectives& c_;
  const int W_, rank_;
  const int64_t P_;
  const ParamRange owned_;  // the optimizer's range: all (DDP) or this worker's (ZeRO-1)
  // Its master weights are [owned_) of the worker's weights (attached).
  const std::unique_ptr<OptimizerShard> optimizer_;
  float* weights_;
  float* grads_ = nullptr;
  bool broadcast_first_, first_weights_ = true;
  uint64_t step_ = 0;
  size_t next_bucket_ = 0;
  std::vector<Collectives::Handle> grad_handles_, weight_handles_;
  std::vector<int64_t> weight_ends_;
  size_t next_weight_ = 0;
  Status weight_status_;
  StepReport report_;
  WaitClock wait_;
};

}  // namespace

StatusOr<ShardPlan> CollectivePlan(const ParamLayout& layout, const config::JobConfig& config, int num_workers) {
  ShardPlanOptions o = ShardPlanOptions::FromConfig(config.cluster());
  o.servers = config.cluster().zero_stage() == 1 ? num_workers : 1;
  o.strategy = config::ClusterConfig::BALANCED;
  return ShardPlan::Create(layout, o);
}

StatusOr<std::unique_ptr<SyncStrategy>> CreateCollectiveSync(
    const CollectiveSyncOptions& o, float* weights, const std::optional<VerifiedCheckpoint>& resume_from) {
  const int rank = o.collectives->rank();
  const int64_t P = o.layout->size();
  const ParamRange owned = o.zero1 ? o.plan->shard(rank) : ParamRange{0, P};
  HERD_ASSIGN_OR_RETURN(std::unique_ptr<OptimizerShard> optimizer,
                        o.job->MakeOptimizer(*o.layout, owned, resume_from));
  if (resume_from && owned.size() < P) {
    // ZeRO-1: the model needs the other workers' weights too.
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
