#include "worker/share_compute.h"

#include "common/trace.h"

namespace herd {
namespace {

class MicroBatches : public ShareCompute {
 public:
  explicit MicroBatches(const PassOptions& o) : o_(o) {}

  StatusOr<double> Compute(int64_t t, int share, const ShareBatches& batches, StepBoundary& previous) override {
    const int A = static_cast<int>(batches.inputs.size());
    WeightHome& home = *o_.home;
    home.ClearGradients(o_.grads, o_.model->layout().size());
    double loss = 0;
    for (int micro = 0; micro < A; ++micro) {
      {
        // The step's first forward waits for the weights layer by layer;
        // the step before ends once they are all in.
        trace::Span span("forward", "compute", {"step", t + 1}, {"micro", micro}, {"share", share});
        loss += o_.model->Forward(o_.weights, batches.inputs[micro], batches.targets[micro], o_.batch, o_.seq_len,
                                  home.ForwardNeed(micro == 0 && !previous.settled()));
      }
      if (micro == 0) HERD_RETURN_IF_ERROR(previous.Settle());
      const bool last_micro = micro == A - 1;
      if (last_micro) o_.sync->BeginStep(o_.grads, {static_cast<uint64_t>(t), share, batches.drawn_to});
      trace::Span span("backward", "compute", {"step", t + 1}, {"micro", micro}, {"share", share});
      o_.model->Backward(o_.weights, o_.grads, o_.loss_scale, home.BackwardDone(last_micro), last_micro,
                         home.BackwardNeed());
    }
    return loss / A;
  }

 private:
  const PassOptions o_;
};

class LayerMajor : public ShareCompute {
 public:
  explicit LayerMajor(const PassOptions& o) : o_(o) {}

  StatusOr<double> Compute(int64_t t, int share, const ShareBatches& batches, StepBoundary& previous) override {
    const int A = static_cast<int>(batches.inputs.size());
    WeightHome& home = *o_.home;
    home.ClearGradients(o_.grads, o_.model->layout().size());
    o_.sync->BeginStep(o_.grads, {static_cast<uint64_t>(t), share, batches.drawn_to});
    double loss = 0;
    {
      trace::Span span("forward and backward", "compute", {"step", t + 1}, {"micro_batches", A}, {"share", share});
      loss = o_.model->ForwardBackwardLayerMajor(o_.weights, o_.grads, batches.inputs, batches.targets, o_.batch,
                                                 o_.seq_len, o_.loss_scale, home.ForwardNeed(!previous.settled()),
                                                 home.BackwardNeed(), home.BackwardDone(/*last_micro_batch=*/true));
    }
    HERD_RETURN_IF_ERROR(previous.Settle());
    return loss / A;
  }

 private:
  const PassOptions o_;
};

}  // namespace

std::unique_ptr<ShareCompute> MicroBatchPasses(const PassOptions& options) {
  return std::make_unique<MicroBatches>(options);
}

std::unique_ptr<ShareCompute> LayerMajorPasses(const PassOptions& options) {
  return std::make_unique<LayerMajor>(options);
}

}  // namespace herd
