#include "worker/pipeline_sync.h"

#include <cmath>
#include <vector>

#include "common/file_util.h"
#include "common/trace.h"
#include "model/checkpoint_format.h"
#include "model/checkpoint_load.h"
#include "model/hf_io.h"
#include "model/optim/adamw.h"
#include "model/optim/optimizer_shard.h"
#include "transport/ps_protocol.h"

namespace herd {
namespace {

using transport::Collectives;
using transport::DType;
using transport::StageMessage;

class PipelineSync : public SyncStrategy {
 public:
  // `buckets` (ZeRO): the stage's buckets, a tied embedding's on the last
  // stage too, in ascending offsets; `weights` the whole flat space.
  PipelineSync(const PipelineSyncOptions& o, std::unique_ptr<OptimizerSlices> own,
               std::unique_ptr<OptimizerSlices> embedding, std::vector<Bucket> buckets, float* weights)
      : o_(o),
        replica_(o.stage_replicas != nullptr ? o.stage_replicas->rank() : 0),
        replicas_(o.stage_replicas != nullptr ? o.stage_replicas->size() : 1),
        zero_(o.zero_plan != nullptr),
        buckets_(std::move(buckets)),
        weights_(weights),
        first_(o.device == 0),
        last_(o.device == o.schedule->devices - 1),
        embedding_end_(o.layout->shape().tie_word_embeddings && o.schedule->devices > 1
                           ? o.layout->layer(0).input_norm
                           : 0),
        tensor_rank_(o.slices != nullptr ? o.slices->rank() : 0),
        tensor_ranks_(o.slices != nullptr ? o.slices->ranks() : 1),
        own_(std::move(own)),
        embedding_(std::move(embedding)) {
    report_.version = static_cast<uint64_t>(own_->step());
    if (embedding_end_ > 0) scratch_.resize(embedding_end_);
    for (const Bucket& b : buckets_) parts_.push_back(OwnerParts(b, replicas_));
    // The ranges counted in the norm: the norms on tensor rank 0 alone.
    for (const ParamRange& r : own_->ranges()) {
      if (o.slices == nullptr) {
        counted_.push_back(r);
        continue;
      }
      for (const TensorSlices::Run& run : o.slices->RunsWithin(r)) {
        if (!run.replicated || tensor_rank_ == 0) counted_.push_back({run.local, run.local + run.flat.size()});
      }
    }
  }

  void BeginStep(float* grads, const StepShare& share) override {
    grads_ = grads;
    step_ = share.step;
  }
  void FinalFrom(int64_t) override {}

  Status FinishStep(double loss) override {
    Status st = ReduceAmongReplicas();
    if (st.ok()) st = ExchangeEmbedding();
    // Every replica holds the same sums: the first one's are counted
    // (ZeRO: each its own slices').
    double sumsq = 0;
    for (const ParamRange& r : counted_) sumsq += replica_ == 0 || zero_ ? SumOfSquares(grads_ + r.begin, r.size()) : 0;
    // Every stage of a replica knows its loss: the last stage's (tensor
    // rank 0's) alone is added, so that the mean over the replicas is exact.
    double sums[2] = {sumsq, last_ && tensor_rank_ == 0 ? loss : 0.0};
    Collectives& c = *o_.everyone;
    if (st.ok()) {
      trace::Span span("norm exchange", "collective", {"step", static_cast<int64_t>(step_ + 1)});
      st = wait_.Timed([&] { return c.Wait(c.AllReduce(sums, 2, DType::kFloat64)); });
    }
    HERD_RETURN_IF_ERROR(st.WithContext("step " + std::to_string(step_ + 1) + ": "));
    const double norm = std::sqrt(sums[0]),
                 mean_loss = sums[1] / (c.size() / (o_.schedule->devices * tensor_ranks_));
    HERD_RETURN_IF_ERROR(CheckNotDiverged("gradient norm", norm));
    OptimizerShard::Scalars s;
    {
      trace::Span span("adamw", "compute", {"step", static_cast<int64_t>(step_ + 1)});
      s = own_->Step(grads_, norm, mean_loss);
      if (embedding_ != nullptr) embedding_->Step(grads_, norm, mean_loss);
    }
    report_ = ReportOf(s.step, norm, s.lr, mean_loss, s.spike);
    return GatherAmongReplicas();
  }

  // The weights are this worker's own, stepped in place.
  void IssueWeights(float*, uint64_t) override {}
  void WaitUpTo(int64_t) override {}
  Status FinishWeights() override { return Status::OK(); }
  const StepReport& report() const override { return report_; }
  double TakeWaitSeconds() override { return wait_.Take(); }

  Status WriteCheckpointParts(const std::string& step_dir) override {
    // Stage `device`'s tensor rank t: file device * T + t, under ZeRO each
    // of its replicas r a file of its own, (device * T + t) * R + r.
    if (!zero_ && replica_ != 0) return Status::OK();
    const int file = (o_.device * tensor_ranks_ + tensor_rank_) * (zero_ ? replicas_ : 1) + (zero_ ? replica_ : 0);
    const std::string path = JoinPath(step_dir, ShardFileName(file));
    if (o_.slices == nullptr) return own_->Save(path);
    return WriteShardPieces(path, o_.slices->FlatPieces(own_->views(), /*with_norms=*/tensor_rank_ == 0));
  }
  int shard_files() const override { return o_.schedule->devices * tensor_ranks_ * (zero_ ? replicas_ : 1); }

 private:
  // Inside the stage: its ranges (and the last stage's part of a tied
  // embedding) all-reduced among its replicas (ZeRO-1: each bucket
  // reduce-scattered to its owners), all issued, then waited for.
  Status ReduceAmongReplicas() {
    Collectives* replicas = o_.stage_replicas;
    if (replicas == nullptr) return Status::OK();
    trace::Span span(zero_ ? "stage reduce-scatter" : "stage all-reduce", "collective",
                     {"step", static_cast<int64_t>(step_ + 1)});
    std::vector<Collectives::Handle> handles;
    if (zero_) {
      for (size_t i = 0; i < buckets_.size(); ++i) {
        handles.push_back(replicas->ReduceScatter(grads_ + buckets_[i].range.begin, parts_[i], o_.gradient_wire));
      }
    } else {
      std::vector<ParamRange> ranges = own_->ranges();
      if (embedding_ != nullptr) ranges.insert(ranges.begin(), embedding_->ranges().begin(), embedding_->ranges().end());
      for (const ParamRange& r : ranges) {
        handles.push_back(replicas->AllReduce(grads_ + r.begin, r.size(), DType::kFloat32, o_.gradient_wire));
      }
    }
    return WaitAll(handles, zero_ ? "reduce-scatter" : "all-reduce");
  }

  // ZeRO-1: every replica's stepped slices to the others.
  Status GatherAmongReplicas() {
    if (!zero_ || o_.stage_replicas == nullptr) return Status::OK();
    trace::Span span("stage all-gather", "collective", {"step", static_cast<int64_t>(step_ + 1)});
    std::vector<Collectives::Handle> handles;
    for (size_t i = 0; i < buckets_.size(); ++i) {
      handles.push_back(o_.stage_replicas->AllGather(weights_ + buckets_[i].range.begin, parts_[i]));
    }
    return WaitAll(handles, "all-gather").WithContext("step " + std::to_string(step_ + 1) + ": ");
  }

  Status WaitAll(const std::vector<Collectives::Handle>& handles, const std::string& what) {
    Status first;
    for (Collectives::Handle h : handles) {
      Status st = wait_.Timed([&] { return o_.stage_replicas->Wait(h); });
      if (first.ok()) first = st;
    }
    return first.WithContext(what + " among stage " + std::to_string(o_.device) + "'s replicas: ");
  }

  // Tied embeddings: the first and the last stage swap their parts of the
  // embedding's gradient and each adds them head part first, so both hold
  // bitwise the same sum.
  Status ExchangeEmbedding() {
    if (embedding_end_ == 0 || !(first_ || last_)) return Status::OK();
    trace::Span span("embedding exchange", "collective", {"step", static_cast<int64_t>(step_ + 1)});
    const int last_vs = o_.schedule->virtual_stages() - 1;
    StageMessage out{StageMessage::kEmbeddingGradient, step_, 0, first_ ? last_vs : 0, embedding_end_};
    StageMessage in{StageMessage::kEmbeddingGradient, step_, 0, first_ ? 0 : last_vs, embedding_end_};
    const transport::PeerId peer = first_ ? o_.last_stage : o_.first_stage;
    const auto sent = o_.wire->Send(peer, out, grads_);
    Status st = wait_.Timed([&] { return o_.wire->Receive(peer, in, scratch_.data()).status(); });
    Status sent_st = o_.wire->WaitSent(sent);
    if (st.ok()) st = sent_st;
    HERD_RETURN_IF_ERROR(st.WithContext("tied embedding exchange: "));
    const float* head = first_ ? scratch_.data() : grads_;
    const float* lookup = first_ ? grads_ : scratch_.data();
    for (int64_t i = 0; i < embedding_end_; ++i) grads_[i] = head[i] + lookup[i];
    return Status::OK();
  }

  const PipelineSyncOptions o_;
  const int replica_, replicas_;  // this worker's place among the stage's replicas, and their number
  const bool zero_;               // ZeRO-1 among them
  const std::vector<Bucket> buckets_;  // ZeRO: the stage's, ascending
  std::vector<Partition> parts_;       // per bucket: its owners' slices
  float* const weights_;
  const bool first_, last_;
  const int64_t embedding_end_;  // tied across stages: the embedding's end; else 0
  const int tensor_rank_, tensor_ranks_;  // in the stage's tensor-parallel group (0 of 1 without)
  std::vector<ParamRange> counted_;       // the own ranges' parts counted in the global norm
  const std::unique_ptr<OptimizerSlices> own_;        // this worker's virtual stages
  const std::unique_ptr<OptimizerSlices> embedding_;  // the last stage's copy of a tied embedding
  std::vector<float> scratch_;                        // the other stage's part of the embedding's gradient
  float* grads_ = nullptr;
  uint64_t step_ = 0;
  StepReport report_;
  WaitClock wait_;
};

}  // namespace

namespace {

// The weights of `ranges` whole, where the optimizer holds slices of them:
// from the checkpoint, init_from's file or the initialisation (a function
// of the seed and the tensor, so every replica starts alike).
Status LoadWhole(const PipelineSyncOptions& o, const std::vector<ParamRange>& ranges,
                 const std::optional<VerifiedCheckpoint>& resume_from, float* weights) {
  if (o.slices != nullptr) return LoadPackedWeights(*o.slices, ranges, o.job->init, *o.flat, resume_from, weights);
  if (resume_from) {
    return ReadShardRanges(resume_from->dir, resume_from->manifest, ranges, false, weights).status();
  }
  const WeightInit& init = o.job->init;
  for (const ParamRange& r : ranges) {
    if (init.init_from.empty()) {
      InitParameterRange(*o.layout, init.seed, init.initializer_range, r.begin, r.end, weights + r.begin);
      continue;
    }
    HERD_ASSIGN_OR_RETURN(std::vector<float> loaded, LoadInitialWeights(init.init_from, init.model, r.begin, r.end));
    std::copy(loaded.begin(), loaded.end(), weights + r.begin);
  }
  return Status::OK();
}

}  // namespace

StatusOr<std::unique_ptr<SyncStrategy>> CreatePipelineSync(const PipelineSyncOptions& o, float* weights,
                                                           const std::optional<VerifiedCheckpoint>& resume_from) {
  const PipelineSchedule& s = *o.schedule;
  std::vector<ParamRange> ranges;
  for (int c = 0; c < s.chunks; ++c) ranges.push_back(o.split->stage(s.VirtualStage(o.device, c)).params);
  std::vector<ParamRange> embedding_ranges;
  if (o.split->stage(s.virtual_stages() - 1).reads_embedding && o.device == s.devices - 1) {
    embedding_ranges.push_back({0, o.layout->layer(0).input_norm});
  }
  // ZeRO-1: the optimizer's ranges are this replica's slices of the
  // stage's buckets; the weights are loaded whole beside them.
  std::vector<Bucket> buckets;
  const int replicas = o.stage_replicas != nullptr ? o.stage_replicas->size() : 1;
  const int replica = o.stage_replicas != nullptr ? o.stage_replicas->rank() : 0;
  std::vector<ParamRange> own_ranges = ranges, embedding_own = embedding_ranges;
  if (o.zero_plan != nullptr) {
    std::vector<ParamRange> all = embedding_ranges;
    all.insert(all.end(), ranges.begin(), ranges.end());
    buckets = BucketsWithin(*o.zero_plan, all);
    own_ranges = OwnedSlices(BucketsWithin(*o.zero_plan, ranges), replicas, replica);
    embedding_own = OwnedSlices(BucketsWithin(*o.zero_plan, embedding_ranges), replicas, replica);
    if (own_ranges.empty()) {
      return Status::InvalidArgument("cluster.zero_stage: stage " + std::to_string(o.device) +
                                     "'s buckets are too small to shard over its " + std::to_string(replicas) +
                                     " replicas");
    }
    HERD_RETURN_IF_ERROR(LoadWhole(o, all, resume_from, weights));
  }
  // The optimizer of `rs`: initialised or resumed over the flat space, or
  // (tensor parallelism) through the slices into the packed one.
  auto load = [&](const std::vector<ParamRange>& rs) -> StatusOr<std::unique_ptr<OptimizerSlices>> {
    if (o.slices == nullptr) {
      return OptimizerSlices::InitOrResume(o.job->optimizer, o.job->init, *o.layout, rs, resume_from, weights);
    }
    return PackedOptimizerSlices(*o.slices, o.job->optimizer, o.job->init, *o.flat, rs, resume_from, weights);
  };
  HERD_ASSIGN_OR_RETURN(std::unique_ptr<OptimizerSlices> own, load(own_ranges));
  std::unique_ptr<OptimizerSlices> embedding;
  if (!embedding_own.empty()) {
    HERD_ASSIGN_OR_RETURN(embedding, load(embedding_own));
  }
  return std::unique_ptr<SyncStrategy>(
      std::make_unique<PipelineSync>(o, std::move(own), std::move(embedding), std::move(buckets), weights));
}

}  // namespace herd
