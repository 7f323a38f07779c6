#include "model/stage_model.h"

namespace herd {
namespace {

class CpuStageModel final : public StageModel {
 public:
  explicit CpuStageModel(std::unique_ptr<LlamaModel<float>> model) : model_(std::move(model)) {}

  const ParamLayout& layout() const override { return model_->layout(); }
  int max_batch() const override { return model_->max_batch(); }
  int max_seq_len() const override { return model_->max_seq_len(); }
  int slots() const override { return model_->slots(); }
  std::string Describe() const override { return "CPU"; }
  int64_t StageElements(int B, int T) const override { return model_->StageElements(B, T); }
  float* StageInput(int slot) override { return model_->StageInput(slot); }
  double StageForward(int slot, const float* params, const int32_t* tokens, const int32_t* targets,
                      const float* input, int B, int T, float* grads, double loss_scale,
                      const NeedUpTo& need) override {
    return model_->StageForward(slot, params, tokens, targets, input, B, T, grads, loss_scale, need);
  }
  const float* StageOutput(int slot) override { return model_->StageOutput(slot); }
  float* StageOutputGrad(int slot) override { return model_->StageOutputGrad(slot); }
  void StageBackward(int slot, const float* params, float* grads, const float* output_grad,
                     bool /*last_micro_batch: the CPU's gradients are always in place*/, const FinalFrom& final_from,
                     const NeedFrom& need_from) override {
    model_->StageBackward(slot, params, grads, output_grad, final_from, need_from);
  }
  const float* StageInputGrad(int slot) override { return model_->StageInputGrad(slot); }
  void StageBackwardInput(int slot, const float* params, float* grads, const float* output_grad,
                          const FinalFrom& done, const NeedFrom& need_from) override {
    model_->StageBackwardInput(slot, params, grads, output_grad, done, need_from);
  }
  void StageBackwardWeights(int slot, float* grads, const FinalFrom& final_from) override {
    model_->StageBackwardWeights(slot, grads, final_from);
  }
  const float* logits() override { return model_->logits(); }

 private:
  const std::unique_ptr<LlamaModel<float>> model_;
};

}  // namespace

std::unique_ptr<StageModel> NewCpuStageModel(std::unique_ptr<LlamaModel<float>> model) {
  return std::make_unique<CpuStageModel>(std::move(model));
}

}  // namespace herd
