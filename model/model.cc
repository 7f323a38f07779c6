#include "model/model.h"

#include <omp.h>

#include <algorithm>
#include <vector>

#include "model/llama.h"

namespace herd {

namespace {

class CpuModel final : public Model {
 public:
  CpuModel(const LlamaShape& shape, int max_batch, int max_seq_len, Recompute recompute, int slots,
           TensorGroup<float> group)
      : model_(shape, max_batch, max_seq_len, recompute, slots, {}, false,
               TokenSplit{group.sequence_parallel ? group.ranks : 1, 1}),
        group_(group) {
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
  // A tensor-parallel rank's: its columns of the row, the others' summed in.
  const float* LastLogits(int T) override {
    const int V = shape().vocab_size;
    const float* mine = model_.logits() + static_cast<int64_t>(T - 1) * V;
    if (group_.ranks == 1) return mine;
    row_.assign(vocab_size(), 0.0f);
    std::copy(mine, mine + V, row_.begin() + group_.vocab_first);
    group_.all_reduce(row_.data(), vocab_size());
    return row_.data();
  }
  int vocab_size() const override { return shape().vocab_size * group_.ranks; }
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
  const TensorGroup<float> group_;
  std::vector<float> row_;  // a tensor-parallel rank's gathered row of logits
};

}  // namespace

std::unique_ptr<Model> NewCpuModel(const LlamaShape& shape, int max_batch, int max_seq_len, Recompute recompute,
                                   int slots, TensorGroup<float> group) {
  return std::make_unique<CpuModel>(shape, max_batch, max_seq_len, recompute, slots, std::move(group));
}

}  // namespace herd
