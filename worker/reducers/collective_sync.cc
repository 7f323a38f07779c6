#include "worker/reducers/collective_sync.h"

#include <glog/logging.h>

#include <algorithm>
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
#include "sharding/weight_window.h"
#include "worker/reducers/window_runner.h"

namespace herd {
namespace {

using transport::Collectives;
using transport::DType;

// The plan's buckets the placement holds, in push order (descending
// offsets).
std::vector<Bucket> HeldBuckets(const CollectiveSyncOptions& o) {
  if (o.placement.held.empty()) return o.plan->buckets();
  std::vector<Bucket> held = BucketsWithin(*o.plan, o.placement.held);
  std::reverse(held.begin(), held.end());
  return held;
}

// What every all-reduce-mode strategy shares: the optimizer over this
// worker's slices (or, DDP, the whole space), the step from the reduced
// gradients (the norm from the owners' partials, one all-reduce with the
// losses), its report, and the checkpoint parts.
class CollectiveStep : public SyncStrategy {
 public:
  CollectiveStep(const CollectiveSyncOptions& o, std::unique_ptr<OptimizerSlices> optimizer)
      : o_(o),
        c_(o.collectives != nullptr ? *o.collectives : solo_),
        everyone_(o.everyone != nullptr ? *o.everyone : c_),
        g_(o.shard_group != nullptr ? *o.shard_group : c_),
        replicas_(o.replicas),
        W_(g_.size()),
        rank_(g_.rank()),
        P_(o.layout->size()),
        zero_(o.zero_stage > 0),
        writes_shards_(replicas_ == nullptr || replicas_->rank() == 0),
        buckets_(HeldBuckets(o)),
        norm_slices_(CountedInNorm(o, buckets_, W_, rank_)),
        optimizer_(std::move(optimizer)) {
    report_.version = static_cast<uint64_t>(optimizer_->step());
    for (const Bucket& b : buckets_) parts_.push_back(OwnerParts(b, W_));
  }

  const StepReport& report() const override { return report_; }
  double TakeWaitSeconds() override { return wait_.Take(); }

  Status WriteCheckpointParts(const std::string& step_dir) override {
    if ((!zero_ && rank_ != 0) || !writes_shards_) return Status::OK();
    const ReducedPlacement& p = o_.placement;
    const std::string path = JoinPath(step_dir, ShardFileName(p.index * (zero_ ? W_ : 1) + (zero_ ? rank_ : 0)));
    // Another place writes the copy.
    std::vector<ShardView> views;
    for (const ShardView& v : optimizer_->views()) {
      if (!Inside({v.begin, v.end}, p.copy)) views.push_back(v);
    }
    if (p.slices == nullptr) return WriteShardPieces(path, views);
    return WriteShardPieces(path, p.slices->FlatPieces(views, /*with_norms=*/p.slices->rank() == 0));
  }
  int shard_files() const override { return o_.placement.count * (zero_ ? W_ : 1); }

 protected:
  // The step once the gradients are reduced (`reduced`: how that went):
  // the global norm from the slices' partial squares (under DDP every
  // worker holds every sum and takes the same slices' partials; hybrid,
  // the first group's) added by one all-reduce with the losses, then
  // AdamW on this worker's ranges.
  Status StepOptimizer(float* grads, double loss, Status reduced) {
    reduced = AfterReduction(grads, std::move(reduced));
    double sumsq = 0.0;
    for (const ParamRange& r : norm_slices_) sumsq += SumOfSquares(grads + r.begin, r.size());
    double norm = 0.0, mean_loss = 0.0;
    HERD_RETURN_IF_ERROR(ExchangeNorm(sumsq, loss, std::move(reduced), &norm, &mean_loss));
    CHECK_EQ(static_cast<uint64_t>(optimizer_->step()), step_) << "the strategy and the optimizer disagree on the step";
    trace::Span span("adamw", "compute", {"step", static_cast<int64_t>(step_ + 1)});
    const OptimizerShard::Scalars s = optimizer_->Step(grads, norm, mean_loss);
    report_ = ReportOf(s.step, norm, s.lr, mean_loss, s.spike);
    return Status::OK();
  }

  // The placement's part between the gradients' reductions and the norm,
  // once they went as `reduced` says.
  Status AfterReduction(float* grads, Status reduced) {
    if (!reduced.ok() || !o_.placement.after_reduction) return reduced;
    return wait_.Timed([&] { return o_.placement.after_reduction(grads, step_); });
  }

  // The step's global gradient norm and mean loss: this worker's partial
  // squared norm (of norm_slices_, in their order) and its loss added over
  // the workers by one all-reduce, once the gradients' reductions have
  // gone as `reduced` says.
  Status ExchangeNorm(double sumsq, double loss, Status reduced, double* norm, double* mean_loss) {
    // Each replica's loss is added once, by the placement that adds it.
    double sums[2] = {writes_shards_ ? sumsq : 0.0, o_.placement.adds_loss ? loss : 0.0};
    if (reduced.ok()) {
      trace::Span span("norm exchange", "collective", {"step", static_cast<int64_t>(step_ + 1)});
      reduced = wait_.Timed([&] { return everyone_.Wait(everyone_.AllReduce(sums, 2, DType::kFloat64)); });
    }
    HERD_RETURN_IF_ERROR(reduced.WithContext("all-reduce of step " + std::to_string(step_ + 1) + ": "));
    *norm = std::sqrt(sums[0]);
    *mean_loss = sums[1] / (everyone_.size() / o_.placement.loss_holders);
    return CheckNotDiverged("gradient norm", *norm);
  }

  // Once plan bucket `b`'s reduce-scatter is done: gives back its
  // gradients but for this worker's slice (`grads` paged), and hybrid,
  // starts the slice's all-reduce with its replicas (FinishReplicas waits).
  void ScatteredBucket(float* grads, PagedBuffer* paged, size_t b) {
    const ParamRange whole = buckets_[b].range;
    const ParamRange mine = SliceOf(buckets_[b], parts_[b], rank_);
    if (paged != nullptr && o_.zero_stage >= 2) {
      paged->Release(whole.begin * sizeof(float), (mine.begin - whole.begin) * sizeof(float));
      paged->Release(mine.end * sizeof(float), (whole.end - mine.end) * sizeof(float));
    }
    // Reduced with the replicas on the device too, when it reduces.
    if (replicas_ != nullptr && o_.device_reduction == nullptr && mine.size() > 0) {
      replica_handles_.push_back(
          replicas_->AllReduce(grads + mine.begin, mine.size(), DType::kFloat32, o_.gradient_wire));
    }
  }
  // Waits for the slices' all-reduces with the replicas; the first failure
  // is kept in `*first`.
  void FinishReplicas(Status* first) {
    for (Collectives::Handle h : replica_handles_) WaitFor({replicas_, h}, first);
    replica_handles_.clear();
  }

  // An operation issued over one of the rings.
  struct InFlight {
    Collectives* over;
    Collectives::Handle handle;
  };
  // Waits for `op`, its time counted; the first failure is kept in `*first`.
  void WaitFor(InFlight op, Status* first) {
    Status st = wait_.Timed([&] { return op.over->Wait(op.handle); });
    if (!st.ok() && first->ok()) *first = st;
  }

  static bool Inside(const ParamRange& r, const ParamRange& outer) {
    return outer.size() > 0 && r.begin >= outer.begin && r.end <= outer.end;
  }

  // What this worker (rank `rank` of `ranks` in its shard group) adds to
  // the global norm, ascending: its slices' squares (under DDP of the whole
  // model the cut ZeRO would own, so that the two agree bitwise); under DDP
  // of a part of the model (a tensor rank's slices, a stage's ranges) the
  // part whole, on its first replica. Not the copy, and of a tensor rank's
  // slices not the norms (every rank's alike) but on rank 0.
  static std::vector<ParamRange> CountedInNorm(const CollectiveSyncOptions& o, const std::vector<Bucket>& buckets,
                                               int ranks, int rank) {
    const ReducedPlacement& p = o.placement;
    std::vector<ParamRange> parts;
    if (o.zero_stage > 0 || (p.slices == nullptr && p.held.empty())) {
      parts = OwnedSlices(buckets, ranks, rank);
    } else if (rank == 0) {
      parts = p.held.empty() ? std::vector<ParamRange>{{0, o.layout->size()}} : p.held;
    }
    std::vector<ParamRange> counted;
    for (const ParamRange& r : parts) {
      if (Inside(r, p.copy)) continue;
      if (p.slices == nullptr) {
        counted.push_back(r);
        continue;
      }
      for (const TensorSlices::Run& run : p.slices->RunsWithin(r)) {
        if (!run.replicated || p.slices->rank() == 0) counted.push_back({run.local, run.local + run.flat.size()});
      }
    }
    return counted;
  }

  transport::SoloCollectives solo_;  // the replicas of a placement that has none
  const CollectiveSyncOptions o_;
  Collectives& c_;                // the placement's replicas (all the workers without model axes)
  Collectives& everyone_;         // all the workers: the norm and the losses
  Collectives& g_;                // the shard group: c_ unless hybrid
  Collectives* const replicas_;   // hybrid: this place in the other groups
  const int W_, rank_;            // in the shard group
  const int64_t P_;
  const bool zero_;  // the optimizer holds this worker's slices only
  const bool writes_shards_;  // the first group (every worker unless hybrid)
  const std::vector<Bucket> buckets_;  // the plan's that the placement holds, in push order
  // The ranges whose squared gradients this worker adds to the norm
  // (CountedInNorm).
  const std::vector<ParamRange> norm_slices_;
  const std::unique_ptr<OptimizerSlices> optimizer_;
  std::vector<Partition> parts_;  // each bucket's cut among the ranks (buckets_ order)
  uint64_t step_ = 0;
  StepReport report_;
  WaitClock wait_;
  std::vector<Collectives::Handle> replica_handles_;  // the step's slices' all-reduces (hybrid)
};

// DDP, ZeRO-1 and ZeRO-2: every weight held; the master weights (of the
// optimizer's ranges) are the worker's own buffer, attached.
class CollectiveSync : public CollectiveStep {
 public:
  CollectiveSync(const CollectiveSyncOptions& o, float* weights, std::unique_ptr<OptimizerSlices> optimizer,
                 bool broadcast_first)
      : CollectiveStep(o, std::move(optimizer)),
        units_(o.layout->UnitBoundaries()),
        weights_(weights),
        broadcast_first_(broadcast_first) {
    if (o.recycle_gradient_pages) {
      // Per unit, the parts of its range outside this worker's slices.
      recycled_.resize(units_.size() - 1);
      unit_recycled_.resize(recycled_.size());
      const auto& buckets = buckets_;
      for (size_t u = 0; u + 1 < units_.size(); ++u) {
        for (size_t b = 0; b < buckets.size(); ++b) {
          const ParamRange whole = buckets[b].range, mine = SliceOf(buckets[b], parts_[b], rank_);
          for (ParamRange part : {ParamRange{whole.begin, mine.begin}, ParamRange{mine.end, whole.end}}) {
            part = {std::max(part.begin, units_[u]), std::min(part.end, units_[u + 1])};
            if (part.begin < part.end) recycled_[u].push_back(part);
          }
        }
      }
    }
  }

  void BeginStep(float* grads, const StepShare& share) override {
    grads_ = grads;  // reduced in place
    step_ = share.step;
    next_bucket_ = 0;
    grad_handles_.clear();
    retired_ = 0;
    if (!recycled_.empty()) {
      // The head's backward comes first, and writes tied embeddings' too.
      std::fill(unit_recycled_.begin(), unit_recycled_.end(), false);
      RecycleUnit(recycled_.size() - 1);
      if (o_.layout->shape().tie_word_embeddings) RecycleUnit(0);
    }
  }

  void FinalFrom(int64_t offset) override {
    if (o_.device_reduction != nullptr) return;  // reduced before they reached us
    const auto& buckets = buckets_;
    const size_t issued_before = next_bucket_;
    while (next_bucket_ < buckets.size() && buckets[next_bucket_].range.begin >= offset) {
      const Bucket& b = buckets[next_bucket_];
      float* g = grads_ + b.range.begin;
      grad_handles_.push_back(
          zero_ ? InFlight{&g_, g_.ReduceScatter(g, parts_[next_bucket_], o_.gradient_wire)}
                : InFlight{&c_, c_.AllReduce(g, b.range.size(), DType::kFloat32, o_.gradient_wire)});
      ++next_bucket_;
    }
    // Paged gradients are let go, and a hybrid slice goes on to its
    // replicas, as the reduce-scatters complete: those of the unit before
    // are waited for now, while the ones just issued run beside the next
    // unit's backward (FSDP's one module in flight).
    if (o_.paged_grads != nullptr || replicas_ != nullptr) {
      while (retired_ < issued_before) Retire();
    }
    // Backward goes on with the unit that ends here: its pages come from
    // what was let go of.
    if (!recycled_.empty()) {
      const auto u = std::lower_bound(units_.begin(), units_.end(), offset);
      if (u != units_.begin() && u != units_.end() && *u == offset) RecycleUnit(u - units_.begin() - 1);
    }
  }

  Status FinishStep(double loss) override {
    Status st;
    if (o_.device_reduction != nullptr) {
      st = wait_.Timed([&] { return o_.device_reduction->FinishStep(); });
    } else {
      CHECK_EQ(next_bucket_, buckets_.size()) << "backward did not finish every bucket";
      while (retired_ < grad_handles_.size()) Retire();
      FinishReplicas(&grad_status_);
      st = std::exchange(grad_status_, Status::OK());
    }
    return StepOptimizer(grads_, loss, st);
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
        weight_handles_.push_back({&c_, c_.Broadcast(weights, P_, 0)});
        weight_ends_.push_back(P_);
      }
      return;
    }
    if (!zero_) return;  // DDP: every worker has stepped the same weights
    const auto& buckets = buckets_;
    for (size_t i = buckets.size(); i-- > 0;) {
      weight_handles_.push_back({&g_, g_.AllGather(weights + buckets[i].range.begin, parts_[i])});
      weight_ends_.push_back(buckets[i].range.end);
    }
  }

  void WaitUpTo(int64_t end) override {
    // Handle i brings [weight_ends_[i-1], weight_ends_[i]).
    while (next_weight_ < weight_handles_.size() && (next_weight_ == 0 || weight_ends_[next_weight_ - 1] < end)) {
      trace::Span span("wait for weights", "wait", {"handle", static_cast<int64_t>(next_weight_)});
      WaitFor(weight_handles_[next_weight_], &weight_status_);
      ++next_weight_;
    }
  }

  Status FinishWeights() override {
    WaitUpTo(P_);
    weight_handles_.clear();
    return std::exchange(weight_status_, Status::OK()).WithContext("weights: ");
  }

 private:
  // Waits for the oldest gradient bucket's reduction not waited for yet;
  // under ZeRO its slice is then done with (ScatteredBucket).
  void Retire() {
    const size_t i = retired_++;
    trace::Span span("wait for gradients", "wait", {"bucket", static_cast<int64_t>(i)},
                     {"step", static_cast<int64_t>(step_ + 1)});
    WaitFor(grad_handles_[i], &grad_status_);
    if (zero_) ScatteredBucket(grads_, o_.paged_grads, i);
  }

  // Zeroes and backs unit `u`'s gradients outside this worker's slices
  // with pooled pages, once a step: before backward writes there (tied
  // embeddings' with the head).
  void RecycleUnit(size_t u) {
    if (unit_recycled_[u]) return;
    unit_recycled_[u] = true;
    for (const ParamRange& r : recycled_[u]) o_.paged_grads->Recycle(r.begin * sizeof(float), r.size() * sizeof(float));
  }

  const std::vector<int64_t> units_;  // the layout's unit boundaries
  // recycle_gradient_pages: per unit, the ranges its backward writes that
  // are let go after the reduce-scatter, and whether it was recycled this
  // step.
  std::vector<std::vector<ParamRange>> recycled_;
  std::vector<bool> unit_recycled_;
  float* weights_;
  float* grads_ = nullptr;
  bool broadcast_first_, first_weights_ = true;
  size_t next_bucket_ = 0, retired_ = 0;
  std::vector<InFlight> grad_handles_, weight_handles_;
  Status grad_status_;
  std::vector<int64_t> weight_ends_;
  size_t next_weight_ = 0;
  Status weight_status_;
};

// ZeRO-3: the weights are a window (sharding/weight_window.h, the policy
// streamed parameter-server workers run) over a guarded PagedBuffer of the
// flat space. Filling a bucket is an all-gather among its owners, each
// contributing its master slice (the optimizer's own memory); pushing its
// gradients is a reduce-scatter, and a pushed bucket is let go but for
// this worker's slice once the window retires it. Every worker runs the
// same hooks, so every worker issues the same collectives in the same
// order.
class GatheredWeightsSync : public CollectiveStep, public WindowHooks, private BucketMoves {
 public:
  GatheredWeightsSync(const CollectiveSyncOptions& o, std::unique_ptr<OptimizerSlices> optimizer)
      : CollectiveStep(o, std::move(optimizer)),
        paged_grads_(o.paged_grads),
        step_as_scattered_(o.step_slices_as_scattered && !o.placement.after_reduction),
        runner_(WeightWindow(*o.plan, *o.layout, o.prefetch_layers, !o.reshard_after_forward, o.placement.held),
                o.paged_weights, this),
        window_(runner_.window()),
        gathers_(window_.num_buckets()),
        scatters_(window_.num_buckets()),
        slice_of_(window_.num_buckets(), -1),
        counted_of_slice_(optimizer_->ranges().size()),
        slice_sumsq_(optimizer_->ranges().size(), 0.0) {
    // The window lists buckets in forward order; each owns one slice of
    // this worker's (both ascending).
    const std::vector<ParamRange>& slices = optimizer_->ranges();
    size_t k = 0;
    for (int i = 0; i < window_.num_buckets(); ++i) {
      const ParamRange& r = window_.bucket(i).range;
      while (k < slices.size() && slices[k].end <= r.begin) ++k;
      if (k < slices.size() && slices[k].begin < r.end) slice_of_[i] = static_cast<int>(k);
    }
    for (size_t j = 0; j < slices.size(); ++j) {
      for (const ParamRange& c : norm_slices_) {
        if (c.begin >= slices[j].begin && c.end <= slices[j].end) counted_of_slice_[j].push_back(c);
      }
    }
  }

  void BeginStep(float* grads, const StepShare& share) override {
    grads_ = grads;
    step_ = share.step;
  }
  void FinalFrom(int64_t offset) override { Execute(window_.FinalFrom(offset)); }
  Status FinishStep(double loss) override {
    Execute(window_.RetireAll());
    FinishReplicas(&scatter_status_);
    if (o_.device_reduction != nullptr) {
      Status reduced = wait_.Timed([&] { return o_.device_reduction->FinishStep(); });
      if (!reduced.ok() && scatter_status_.ok()) scatter_status_ = reduced;
    }
    Status st = std::exchange(gather_status_, Status::OK());
    if (st.ok()) st = std::exchange(scatter_status_, Status::OK());
    if (!step_as_scattered_) return StepOptimizer(grads_, loss, st);
    // Every slice has stepped: what is left is the step's report.
    double sumsq = 0.0, norm = 0.0, mean_loss = 0.0;
    for (double partial : slice_sumsq_) sumsq += partial;
    HERD_RETURN_IF_ERROR(ExchangeNorm(sumsq, loss, std::move(st), &norm, &mean_loss));
    CHECK_EQ(static_cast<uint64_t>(optimizer_->step()), step_ + 1) << "a slice did not step";
    report_ = ReportOf(scalars_.step, norm, scalars_.lr, mean_loss, scalars_.spike);
    return Status::OK();
  }

  void IssueWeights(float* weights, uint64_t) override {
    weights_ = weights;
    Execute(window_.ReleaseAll());
    Execute(window_.Start());
  }
  void WaitUpTo(int64_t end) override { Execute(window_.NeedUpTo(end)); }
  // The weights come as the passes ask for them.
  Status FinishWeights() override { return std::exchange(gather_status_, Status::OK()).WithContext("weights: "); }

  void WaitFrom(int64_t begin) override { Execute(window_.NeedFrom(begin)); }
  void DoneFrom(int64_t offset) override { Execute(window_.DoneFrom(offset)); }
  void ReleaseWeights() override { Execute(window_.ReleaseAll()); }

 private:
  void Execute(const WeightWindow::Actions& a) { runner_.Execute(a); }

  // The moves of the window's buckets. A fill: this worker's slice from
  // its master weights into place, then the all-gather of the rest.
  void Fill(int i) override {
    if (slice_of_[i] >= 0) {
      OptimizerShard& mine = optimizer_->slice(slice_of_[i]);
      std::memcpy(weights_ + mine.range().begin, mine.weights(), mine.size() * sizeof(float));
    }
    gathers_[i] = g_.AllGather(weights_ + window_.bucket(i).range.begin, parts_[PlanIndex(i)]);
  }
  void Land(int i) override {
    trace::Span span("wait for weights", "wait", {"bucket", i});
    WaitFor({&g_, gathers_[i]}, &gather_status_);
  }
  void Send(int i) override {
    if (o_.device_reduction != nullptr) return;  // reduced on the device before they reached us
    scatters_[i] = g_.ReduceScatter(grads_ + window_.bucket(i).range.begin, parts_[PlanIndex(i)], o_.gradient_wire);
  }
  // The bucket's gradients are let go but for this worker's slice, which
  // steps at once when nothing global enters the update (and is let go
  // too).
  void Retire(int i) override {
    if (o_.device_reduction == nullptr) {
      trace::Span span("wait for gradients", "wait", {"bucket", i}, {"step", static_cast<int64_t>(step_ + 1)});
      WaitFor({&g_, scatters_[i]}, &scatter_status_);
    }
    ScatteredBucket(grads_, paged_grads_, PlanIndex(i));
    if (step_as_scattered_ && slice_of_[i] >= 0 && scatter_status_.ok()) StepSlice(slice_of_[i]);
  }
  void StepSlice(int k) {
    OptimizerShard& slice = optimizer_->slice(k);
    const ParamRange r = slice.range();
    trace::Span span("adamw", "compute", {"step", static_cast<int64_t>(step_ + 1)});
    slice_sumsq_[k] = 0.0;
    for (const ParamRange& c : counted_of_slice_[k]) slice_sumsq_[k] += SumOfSquares(grads_ + c.begin, c.size());
    // No clipping and no spike guard (StepsSlicesAsScattered): the scalars
    // need neither the norm nor the loss.
    scalars_ = slice.BeginStep(0.0, 0.0);
    slice.Apply(scalars_, r, grads_ + r.begin);
    slice.EndStep();
    paged_grads_->Release(r.begin * sizeof(float), r.size() * sizeof(float));
  }
  // The window lists the plan's buckets in forward order, the plan in
  // backward order.
  size_t PlanIndex(int window_index) const { return parts_.size() - 1 - static_cast<size_t>(window_index); }

  PagedBuffer* const paged_grads_;
  // Each slice steps once its gradients are reduced (not where the
  // placement has a part after the reductions: a tied embedding's sum).
  const bool step_as_scattered_;
  WindowRunner runner_;  // pages the weights
  WeightWindow& window_;  // runner_'s
  float* weights_ = nullptr;
  float* grads_ = nullptr;
  // Per bucket (forward index): its latest gather and reduce-scatter, and
  // which of the optimizer's slices is this worker's part of it (-1: none).
  std::vector<Collectives::Handle> gathers_, scatters_;
  std::vector<int> slice_of_;
  // step_as_scattered_: each slice's parts counted in the norm, their
  // squared gradient norm (the norm is added in slice order, as
  // StepOptimizer does), and the step's scalars.
  std::vector<std::vector<ParamRange>> counted_of_slice_;
  std::vector<double> slice_sumsq_;
  OptimizerShard::Scalars scalars_;
  Status gather_status_, scatter_status_;
};

}  // namespace

namespace {

// The weights of `ranges` whole, where the optimizer holds slices of them
// (every replica loads them alike): from the checkpoint, init_from's file
// or the initialisation (a function of the seed and the tensor), or a
// tensor-parallel rank's through its slices.
Status LoadWholeWeights(const CollectiveSyncOptions& o, const std::vector<ParamRange>& ranges,
                        const std::optional<VerifiedCheckpoint>& resume_from, float* weights) {
  const ReducedPlacement& p = o.placement;
  if (p.slices != nullptr) return LoadPackedWeights(*p.slices, ranges, o.job->init, *p.flat, resume_from, weights);
  return LoadWeightRanges(*o.layout, o.job->init, ranges, resume_from, weights);
}

}  // namespace

StatusOr<CollectiveSyncParts> CreateCollectiveSync(const CollectiveSyncOptions& o, float* weights,
                                                   const std::optional<VerifiedCheckpoint>& resume_from) {
  const ReducedPlacement& p = o.placement;
  const int rank = o.collectives != nullptr ? o.collectives->rank() : 0;
  const int64_t P = o.layout->size();
  const bool zero = o.zero_stage > 0;
  // Part of the model: a tensor-parallel rank's slices, a stage's ranges.
  const bool partial = p.slices != nullptr || !p.held.empty();
  const std::vector<ParamRange> held = p.held.empty() ? std::vector<ParamRange>{{0, P}} : p.held;
  const transport::Collectives* shard_group = o.shard_group != nullptr ? o.shard_group : o.collectives;
  const int group_size = shard_group != nullptr ? shard_group->size() : 1;
  const int group_rank = shard_group != nullptr ? shard_group->rank() : 0;
  const std::vector<ParamRange> owned = zero ? OwnedSlices(HeldBuckets(o), group_size, group_rank) : held;
  if (owned.empty()) {
    return Status::InvalidArgument("cluster.zero_stage: this worker's buckets (" + std::to_string(held.size()) +
                                   " ranges) are too small to shard over its " + std::to_string(group_size) +
                                   " replicas");
  }
  // The master weights of the optimizer's ranges are the worker's own
  // buffer, but under ZeRO-3 (which holds no whole buffer).
  const bool gathered = o.zero_stage == 3;
  HERD_ASSIGN_OR_RETURN(std::unique_ptr<OptimizerSlices> optimizer,
                        p.slices == nullptr
                            ? OptimizerSlices::InitOrResume(o.job->optimizer, o.job->init, *o.layout, owned,
                                                            resume_from, gathered ? nullptr : weights)
                            : PackedOptimizerSlices(*p.slices, o.job->optimizer, o.job->init, *p.flat, owned,
                                                    resume_from, gathered ? nullptr : weights));
  CollectiveSyncParts parts;
  if (gathered) {
    // Each worker's slices start from the same initialisation (a function
    // of the seed and the tensor, or init_from's file) or the checkpoint;
    // the rest of the model is gathered as the passes reach it.
    if (o.paged_weights == nullptr || o.paged_grads == nullptr) {
      return Status::InvalidArgument("ZeRO-3 needs paged weights and gradients");
    }
    auto sync = std::make_unique<GatheredWeightsSync>(o, std::move(optimizer));
    WindowHooks& window = *sync;
    parts.sync = Around(o.around, std::move(sync));
    parts.home = WindowedWeights(*parts.sync, window, o.paged_grads);
    return parts;
  }
  if (zero && (partial || resume_from)) {
    // ZeRO: the model needs the other workers' weights too.
    HERD_RETURN_IF_ERROR(LoadWholeWeights(o, held, resume_from, weights));
  } else if (zero && rank == 0) {
    // A fresh start broadcasts worker 0's whole model (under DDP its
    // optimizer's range is the whole space, initialised already).
    const WeightInit& init = o.job->init;
    if (!init.init_from.empty()) {
      HERD_ASSIGN_OR_RETURN(std::vector<float> loaded, LoadInitialWeights(init.init_from, init.model, 0, P));
      std::copy(loaded.begin(), loaded.end(), weights);
    } else {
      InitParameters(*o.layout, init.seed, init.initializer_range, weights);
    }
  }
  if (o.recycle_gradient_pages) {
    CHECK(o.zero_stage == 2 && o.paged_grads != nullptr && o.device_reduction == nullptr && p.held.empty())
        << "gradient pages are recycled by ZeRO-2 of the whole model on paged host gradients only";
    // The pool holds what backward holds beyond the slices at its fullest.
    int64_t slices = 0;
    for (const ParamRange& r : owned) slices += r.size();
    const int64_t most = ReplayZero2Gradients(*o.plan, *o.layout, group_size, group_rank);
    HERD_RETURN_IF_ERROR(o.paged_grads->KeepPool(static_cast<size_t>(most - slices * sizeof(float))));
  }
  // A fresh start takes worker 0's weights; a resumed one, or a part of
  // the model (loaded alike by every replica), has them.
  parts.sync = Around(o.around, std::make_unique<CollectiveSync>(o, weights, std::move(optimizer),
                                                                 /*broadcast_first=*/!resume_from && !partial));
  parts.home = WholeWeights(*parts.sync, o.paged_grads);
  return parts;
}

}  // namespace herd
