#include "worker/placements/pipeline_passes.h"

#include <glog/logging.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "common/trace.h"

namespace herd {
namespace {

using transport::PipelineWire;
using transport::StageMessage;

class PipelineSteps : public ShareCompute {
 public:
  PipelineSteps(const PipelinePassOptions& o, std::vector<StageModel*> models)
      : o_(o),
        s_(*o.schedule),
        models_(std::move(models)),
        last_vs_(s_.virtual_stages() - 1),
        split_(s_.kind == PipelineScheduleKind::kZeroBubble) {
    for (StageModel* m : models_) pending_.emplace_back(m->slots(), kNone);
  }

  StatusOr<double> Compute(int64_t t, int share, const ShareBatches& batches, StepBoundary& previous) override {
    // The stage's weights are all in (or, streamed, the window's hooks
    // bring them as the passes reach them).
    HERD_RETURN_IF_ERROR(previous.Settle());
    WeightHome& home = *o_.home;
    home.ClearGradients(o_.grads, o_.flat_size);
    o_.sync->BeginStep(o_.grads, {static_cast<uint64_t>(t), share, batches.drawn_to});
    o_.wire->SetStep(static_cast<uint64_t>(t));
    const int M = s_.micro_batches;
    std::vector<double> losses(M, 0.0);
    for (const PipelineAction& a : s_.actions[o_.device]) {
      const int vs = s_.VirtualStage(o_.device, a.chunk);
      StageModel& model = *models_[a.chunk];
      const int slot = a.micro_batch % model.slots();
      HERD_RETURN_IF_ERROR(WaitSlot(a.chunk, slot));
      if (a.kind == PipelineAction::kForward) {
        HERD_RETURN_IF_ERROR(Forward(t, a, vs, slot, batches, &losses[a.micro_batch]));
      } else if (a.kind == PipelineAction::kBackward) {
        HERD_RETURN_IF_ERROR(Backward(t, a, vs, slot, &losses[a.micro_batch]));
      } else {
        trace::Span span("weight gradients", "compute", {"step", t + 1}, {"micro", a.micro_batch},
                         {"chunk", a.chunk});
        // It reads no weights: its hook is the final gradients' alone.
        Model::FinalFrom final_from = nullptr;
        if (a.micro_batch == M - 1) final_from = [this](int64_t x) { o_.sync->FinalFrom(x); };
        model.StageBackwardWeights(slot, o_.grads, final_from);
      }
    }
    // Every gradient this stage computes is final now (a tied
    // embedding's head part on the last stage too).
    o_.sync->FinalFrom(0);
    for (StageModel* m : models_) m->EndStep();
    for (size_t c = 0; c < models_.size(); ++c) {
      for (int slot = 0; slot < models_[c]->slots(); ++slot) HERD_RETURN_IF_ERROR(WaitSlot(c, slot));
    }
    double loss = 0;
    for (double l : losses) loss += l;  // micro-batch order, as one process adds them
    return loss / M;
  }

 private:
  static constexpr PipelineWire::Handle kNone = 0;

  Status Forward(int64_t t, const PipelineAction& a, int vs, int slot, const ShareBatches& batches,
                 double* loss) {
    StageModel& model = *models_[a.chunk];
    const int m = a.micro_batch;
    const int64_t elements = model.StageElements(o_.batch, o_.seq_len);
    const float* input = nullptr;
    if (vs > 0) {
      trace::Span span("wait for activations", "wait", {"step", t + 1}, {"micro", m});
      const StageMessage expected{StageMessage::kActivation, static_cast<uint64_t>(t), m, vs, elements};
      HERD_ASSIGN_OR_RETURN(const double ignored,
                            o_.wire->Receive(o_.peers[s_.DeviceOf(vs - 1)], expected, model.StageInput(slot)));
      (void)ignored;
      input = model.StageInput(slot);
    }
    {
      trace::Span span("forward", "compute", {"step", t + 1}, {"micro", m}, {"chunk", a.chunk});
      const double l = model.StageForward(slot, o_.weights, batches.inputs[m], batches.targets[m], input, o_.batch,
                                          o_.seq_len, o_.grads, o_.loss_scale, o_.home->ForwardNeed(false));
      if (vs == last_vs_) *loss = l;
    }
    if (vs < last_vs_) {
      const StageMessage out{StageMessage::kActivation, static_cast<uint64_t>(t), m, vs + 1, elements};
      pending_[a.chunk][slot] = o_.wire->Send(o_.peers[s_.DeviceOf(vs + 1)], out, model.StageOutput(slot));
    }
    return Status::OK();
  }

  Status Backward(int64_t t, const PipelineAction& a, int vs, int slot, double* loss) {
    StageModel& model = *models_[a.chunk];
    const int m = a.micro_batch;
    const int64_t elements = model.StageElements(o_.batch, o_.seq_len);
    const float* output_grad = nullptr;
    if (vs < last_vs_) {
      trace::Span span("wait for gradients", "wait", {"step", t + 1}, {"micro", m});
      const StageMessage expected{StageMessage::kGradient, static_cast<uint64_t>(t), m, vs, elements};
      HERD_ASSIGN_OR_RETURN(*loss,
                            o_.wire->Receive(o_.peers[s_.DeviceOf(vs + 1)], expected, model.StageOutputGrad(slot)));
      output_grad = model.StageOutputGrad(slot);
    }
    {
      trace::Span span("backward", "compute", {"step", t + 1}, {"micro", m}, {"chunk", a.chunk});
      if (split_) {
        // ZERO_BUBBLE: the input gradients now, the weights' later.
        model.StageBackwardInput(slot, o_.weights, o_.grads, output_grad, o_.home->BackwardDone(false),
                                 o_.home->BackwardNeed());
      } else {
        const bool last_micro = m == s_.micro_batches - 1;
        model.StageBackward(slot, o_.weights, o_.grads, output_grad, last_micro, o_.home->BackwardDone(last_micro),
                            o_.home->BackwardNeed());
      }
    }
    if (vs > 0) {
      StageMessage out{StageMessage::kGradient, static_cast<uint64_t>(t), m, vs - 1, elements};
      out.loss = *loss;
      pending_[a.chunk][slot] = o_.wire->Send(o_.peers[s_.DeviceOf(vs - 1)], out, model.StageInputGrad(slot));
    }
    return Status::OK();
  }

  // A slot's buffers are reused only once what was sent from them is out.
  Status WaitSlot(size_t chunk, int slot) {
    PipelineWire::Handle& h = pending_[chunk][slot];
    if (h == kNone) return Status::OK();
    const PipelineWire::Handle sent = h;
    h = kNone;
    trace::Span span("wait for send", "wait");
    return o_.wire->WaitSent(sent);
  }

  const PipelinePassOptions o_;
  const PipelineSchedule& s_;
  const std::vector<StageModel*> models_;
  const int last_vs_;
  const bool split_;  // ZERO_BUBBLE: backward in two parts (kBackward, kWeightGrad)
  std::vector<std::vector<PipelineWire::Handle>> pending_;  // [chunk][slot]: the last send from it
};

class PipelineForward : public Model {
 public:
  PipelineForward(const PipelinePassOptions& o, std::vector<StageModel*> models, std::string name)
      : o_(o), s_(*o.schedule), models_(std::move(models)), name_(std::move(name)) {}

  const ParamLayout& layout() const override { return models_[0]->layout(); }
  int max_batch() const override { return models_[0]->max_batch(); }
  int max_seq_len() const override { return models_[0]->max_seq_len(); }
  std::string Describe() const override { return name_; }
  int64_t DevicePeakBytes() const override {
    int64_t bytes = 0;
    for (const StageModel* m : models_) bytes += m->DevicePeakBytes();
    return bytes;
  }

  // Evaluation and sampling have no way to return a failure: a peer that
  // died or a bad message fails the wire (so that the next step fails
  // with its line), is said once, and every Forward until then returns NaN.
  double Forward(const float* params, const int32_t* tokens, const int32_t* targets, int B, int T,
                 const NeedUpTo& need) override {
    if (!failed_.ok()) return std::nan("");
    StatusOr<double> loss = Pass(params, tokens, targets, B, T, need);
    if (loss.ok()) return *loss;
    failed_ = loss.status().WithContext("evaluation through the pipeline: ");
    LOG(ERROR) << failed_.message();
    o_.wire->Fail(failed_);
    return std::nan("");
  }

  void Backward(const float*, float*, double, const FinalFrom&, bool, const NeedFrom&) override {
    LOG(FATAL) << "the pipeline's evaluator computes no gradients";
  }
  const float* logits() override {
    LOG(FATAL) << "a pipeline's logits are on its last stage: read LastLogits";
    return nullptr;
  }
  // The last Forward's row T - 1, as the last stage had it (Pass keeps it:
  // with context parallelism gathered from the rank that holds it).
  const float* LastLogits(int T) override {
    CHECK_EQ(T, forward_len_) << "LastLogits of another length than the last Forward's";
    const int V = layout().shape().vocab_size;
    const float* mine = last_logits_.data();
    const TensorGroup<float>& g = o_.tensor;
    if (g.ranks == 1) return mine;
    row_.assign(vocab_size(), 0.0f);
    std::copy(mine, mine + V, row_.begin() + g.vocab_first);
    g.all_reduce(row_.data(), vocab_size());
    return row_.data();
  }
  int vocab_size() const override { return layout().shape().vocab_size * o_.tensor.ranks; }

 private:
  StatusOr<double> Pass(const float* params, const int32_t* tokens, const int32_t* targets, int B, int T,
                        const NeedUpTo& need) {
    const uint64_t step = o_.wire->step();
    if (step != step_) step_ = step, next_ = 0;
    const int micro = s_.micro_batches + next_++;
    const int last_vs = s_.virtual_stages() - 1;
    forward_len_ = T;
    // A context group computes whole chunks: a prompt is padded at the end.
    const int C = o_.context.ranks;
    const int padded = static_cast<int>(ContextPaddedLength(C, T));
    if (padded != T) {
      CHECK(targets == nullptr) << "a context-parallel loss over " << T << " tokens: not " << 2 * C << " chunks";
      padded_.assign(static_cast<size_t>(B) * padded, 0);
      for (int b = 0; b < B; ++b) std::copy(tokens + b * T, tokens + (b + 1) * T, padded_.begin() + b * padded);
      tokens = padded_.data();
    }
    const int64_t elements = models_[0]->StageElements(B, padded);
    const int vocab = layout().shape().vocab_size;
    last_logits_.resize(vocab);
    double loss = 0;
    for (int c = 0; c < s_.chunks; ++c) {
      const int vs = s_.VirtualStage(o_.device, c);
      StageModel& model = *models_[c];
      const float* input = nullptr;
      if (vs > 0) {
        const StageMessage in{StageMessage::kActivation, step, micro, vs, elements};
        HERD_RETURN_IF_ERROR(o_.wire->Receive(o_.peers[s_.DeviceOf(vs - 1)], in, model.StageInput(0)).status());
        input = model.StageInput(0);
      }
      double l = model.StageForward(0, params, tokens, targets, input, B, padded, /*grads=*/nullptr, 0, need);
      if (vs < last_vs) {
        const StageMessage out{StageMessage::kActivation, step, micro, vs + 1, elements};
        HERD_RETURN_IF_ERROR(o_.wire->WaitSent(o_.wire->Send(o_.peers[s_.DeviceOf(vs + 1)], out, model.StageOutput(0))));
        continue;
      }
      // The last stage: the loss (evaluation; the context group's mean) or
      // the last position's logits (sampling; gathered from the context
      // rank that holds it) to every other worker of the replica.
      if (C > 1 && targets != nullptr) l = ContextGroupMean(o_.context, l);
      const float* row = model.logits() + static_cast<int64_t>(T - 1) * vocab;
      if (C > 1 && targets == nullptr) row = ContextGatherRow(o_.context, model.logits(), padded, T - 1, vocab, row_);
      if (targets == nullptr) std::copy(row, row + vocab, last_logits_.begin());
      loss = l;
      const float payload = static_cast<float>(l);
      for (int d = 0; d < s_.devices; ++d) {
        if (d == o_.device) continue;
        StageMessage out{StageMessage::kGradient, step, micro, s_.VirtualStage(d, 0), 1};
        out.loss = l;
        const float* data = &payload;
        if (targets == nullptr) {
          out.kind = StageMessage::kLogits;
          out.elements = vocab;
          data = last_logits_.data();
        }
        HERD_RETURN_IF_ERROR(o_.wire->WaitSent(o_.wire->Send(o_.peers[d], out, data)));
      }
    }
    if (s_.DeviceOf(last_vs) != o_.device) {
      float payload = 0;
      StageMessage in{StageMessage::kGradient, step, micro, s_.VirtualStage(o_.device, 0), 1};
      float* into = &payload;
      if (targets == nullptr) {
        in.kind = StageMessage::kLogits;
        in.elements = vocab;
        into = last_logits_.data();
      }
      HERD_ASSIGN_OR_RETURN(loss, o_.wire->Receive(o_.peers[s_.DeviceOf(last_vs)], in, into));
    }
    return loss;
  }

  const PipelinePassOptions o_;
  const PipelineSchedule& s_;
  const std::vector<StageModel*> models_;
  const std::string name_;
  uint64_t step_ = ~uint64_t{0};  // the wire's step of the last Forward
  int next_ = 0;                  // the Forwards since the step changed
  std::vector<float> last_logits_;  // a sampled sequence's last row, this rank's vocabulary (from the last stage)
  std::vector<float> row_;          // tensor parallelism: the group's rows of it gathered (context: every rank's)
  std::vector<int32_t> padded_;     // context parallelism: a Forward's tokens padded to whole chunks
  int forward_len_ = 0;             // the last Forward's length
  Status failed_;                   // the first failed pass
};

}  // namespace

std::unique_ptr<ShareCompute> PipelinePasses(const PipelinePassOptions& options,
                                             std::vector<StageModel*> models) {
  return std::make_unique<PipelineSteps>(options, std::move(models));
}

std::unique_ptr<Model> PipelineEvaluator(const PipelinePassOptions& options, std::vector<StageModel*> models,
                                         const std::string& device_name) {
  return std::make_unique<PipelineForward>(options, std::move(models), device_name);
}

}  // namespace herd
