#include "worker/pipeline_sync.h"

#include <cmath>
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
using transport::StageMessage;

class PipelineSync : public SyncStrategy {
 public:
  PipelineSync(const PipelineSyncOptions& o, std::unique_ptr<OptimizerSlices> own,
               std::unique_ptr<OptimizerSlices> embedding)
      : o_(o),
        replica_(o.stage_replicas != nullptr ? o.stage_replicas->rank() : 0),
        first_(o.device == 0),
        last_(o.device == o.schedule->devices - 1),
        embedding_end_(o.layout->shape().tie_word_embeddings && o.schedule->devices > 1
                           ? o.layout->layer(0).input_norm
                           : 0),
        own_(std::move(own)),
        embedding_(std::move(embedding)) {
    report_.version = static_cast<uint64_t>(own_->step());
    if (embedding_end_ > 0) scratch_.resize(embedding_end_);
  }

  void BeginStep(float* grads, const StepShare& share) override {
    grads_ = grads;
    step_ = share.step;
  }
  void FinalFrom(int64_t) override {}

  Status FinishStep(double loss) override {
    Status st = ReduceAmongReplicas();
    if (st.ok()) st = ExchangeEmbedding();
    // Every replica holds the same sums: the first one's are counted.
    double sumsq = 0;
    for (const ParamRange& r : own_->ranges()) sumsq += replica_ == 0 ? SumOfSquares(grads_ + r.begin, r.size()) : 0;
    // Every stage of a replica knows its loss: the last stage's alone is
    // added, so that the mean over the replicas is exact.
    double sums[2] = {sumsq, last_ ? loss : 0.0};
    Collectives& c = *o_.everyone;
    if (st.ok()) {
      trace::Span span("norm exchange", "collective", {"step", static_cast<int64_t>(step_ + 1)});
      st = wait_.Timed([&] { return c.Wait(c.AllReduce(sums, 2, DType::kFloat64)); });
    }
    HERD_RETURN_IF_ERROR(st.WithContext("step " + std::to_string(step_ + 1) + ": "));
    const double norm = std::sqrt(sums[0]), mean_loss = sums[1] / (c.size() / o_.schedule->devices);
    HERD_RETURN_IF_ERROR(CheckNotDiverged("gradient norm", norm));
    trace::Span span("adamw", "compute", {"step", static_cast<int64_t>(step_ + 1)});
    const OptimizerShard::Scalars s = own_->Step(grads_, norm, mean_loss);
    if (embedding_ != nullptr) embedding_->Step(grads_, norm, mean_loss);
    report_ = ReportOf(s.step, norm, s.lr, mean_loss, s.spike);
    return Status::OK();
  }

  // The weights are this worker's own, stepped in place.
  void IssueWeights(float*, uint64_t) override {}
  void WaitUpTo(int64_t) override {}
  Status FinishWeights() override { return Status::OK(); }
  const StepReport& report() const override { return report_; }
  double TakeWaitSeconds() override { return wait_.Take(); }

  Status WriteCheckpointParts(const std::string& step_dir) override {
    if (replica_ != 0) return Status::OK();
    return own_->Save(JoinPath(step_dir, ShardFileName(o_.device)));
  }
  int shard_files() const override { return o_.schedule->devices; }

 private:
  // DDP inside the stage: its ranges (and the last stage's part of a tied
  // embedding) all-reduced among its replicas, all issued, then waited for.
  Status ReduceAmongReplicas() {
    Collectives* replicas = o_.stage_replicas;
    if (replicas == nullptr) return Status::OK();
    trace::Span span("stage all-reduce", "collective", {"step", static_cast<int64_t>(step_ + 1)});
    std::vector<ParamRange> ranges = own_->ranges();
    if (embedding_ != nullptr) ranges.insert(ranges.begin(), embedding_->ranges().begin(), embedding_->ranges().end());
    std::vector<Collectives::Handle> handles;
    for (const ParamRange& r : ranges) {
      handles.push_back(replicas->AllReduce(grads_ + r.begin, r.size(), DType::kFloat32, o_.gradient_wire));
    }
    Status first;
    for (Collectives::Handle h : handles) {
      Status st = wait_.Timed([&] { return replicas->Wait(h); });
      if (first.ok()) first = st;
    }
    return first.WithContext("all-reduce among stage " + std::to_string(o_.device) + "'s replicas: ");
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
  const int replica_;  // among the stage's replicas
  const bool first_, last_;
  const int64_t embedding_end_;  // tied across stages: the embedding's end; else 0
  const std::unique_ptr<OptimizerSlices> own_;        // this worker's virtual stages
  const std::unique_ptr<OptimizerSlices> embedding_;  // the last stage's copy of a tied embedding
  std::vector<float> scratch_;                        // the other stage's part of the embedding's gradient
  float* grads_ = nullptr;
  uint64_t step_ = 0;
  StepReport report_;
  WaitClock wait_;
};

}  // namespace

StatusOr<std::unique_ptr<SyncStrategy>> CreatePipelineSync(const PipelineSyncOptions& o, float* weights,
                                                           const std::optional<VerifiedCheckpoint>& resume_from) {
  const PipelineSchedule& s = *o.schedule;
  std::vector<ParamRange> ranges;
  for (int c = 0; c < s.chunks; ++c) ranges.push_back(o.split->stage(s.VirtualStage(o.device, c)).params);
  HERD_ASSIGN_OR_RETURN(std::unique_ptr<OptimizerSlices> own,
                        OptimizerSlices::InitOrResume(o.job->optimizer, o.job->init, *o.layout, ranges, resume_from,
                                                      weights));
  std::unique_ptr<OptimizerSlices> embedding;
  if (o.split->stage(s.virtual_stages() - 1).reads_embedding && o.device == s.devices - 1) {
    const ParamRange embed{0, o.layout->layer(0).input_norm};
    HERD_ASSIGN_OR_RETURN(embedding, OptimizerSlices::InitOrResume(o.job->optimizer, o.job->init, *o.layout, {embed},
                                                                   resume_from, weights));
  }
  return std::unique_ptr<SyncStrategy>(std::make_unique<PipelineSync>(o, std::move(own), std::move(embedding)));
}

}  // namespace herd
