#include "model/model.h"

#include <omp.h>

#include "model/llama.h"

namespace herd {

namespace {

class CpuModel final : public Model {
 public:
  CpuModel(const LlamaShape& shape, int max_batch, int max_seq_len, Recompute recompute, int slots,
           TensorGroup<float> group)
      : model_(shape, max_batch, max_seq_len, recompute, slots) {
    model_.SetTensorGroup(std::move(group));
  }

  const ParamLayout& layout() const override { return model_.layout(); }
  int max_batch() const override { return model_.max_batch(); }
  int max_seq_len() const override { return model_.max_seq_len(); }
  std::string Describe() const override { return "cpu (" + std::to_string(omp_get_max_threads()) + " threads)"; }
  double Forward(const float* params, const int32_t* tokens, const int32_t* targets, int B, int T,
                 const NeedUpTo& need) override {
    return model_.Forward(params, tokens, targets, B, T, need);
  }
  void Backward(const float* params, float* grads, double loss_scale, const FinalFrom& final_from,
                bool /*last_micro_batch: the CPU's gradients are always in host memory*/,
                const NeedFrom& need_from) override {
    model_.Backward(params, grads, loss_scale, final_from, need_from);
  }
  const float* logits() override { return model_.logits(); }
  int layer_major_slots() const override { return model_.slots(); }
  double ForwardBackwardLayerMajor(const float* params, float* grads, const std::vector<const int32_t*>& tokens,
                                   const std::vector<const int32_t*>& targets, int B, int T, double loss_scale,
                                   const NeedUpTo& need, const NeedFrom& need_from,
                                   const FinalFrom& final_from) override {
    return model_.ForwardBackwardLayerMajor(params, grads, tokens, targets, B, T, loss_scale, need, need_from,
                                            final_from);
  }

 private:
  LlamaModel<float> model_;
};

}  // namespace

std::unique_ptr<Model> NewCpuModel(const LlamaShape& shape, int max_batch, int max_seq_len, Recompute recompute,
                                   int slots, TensorGroup<float> group) {
  return std::make_unique<CpuModel>(shape, max_batch, max_seq_len, recompute, slots, std::move(group));
}

}  // namespace herd
