#include "model/model.h"

#include <glog/logging.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "model/llama.h"

namespace herd {

namespace {

class CpuModel final : public Model {
 public:
  CpuModel(const LlamaShape& shape, int max_batch, int max_seq_len, Recompute recompute, int slots,
           TensorGroup<float> group, ContextGroup<float> context)
      : model_(shape, max_batch, max_seq_len, recompute, slots, {}, false,
               TokenSplit{group.sequence_parallel ? group.ranks : 1, context.ranks}),
        group_(group),
        context_(context) {
    model_.SetTensorGroup(std::move(group));
    if (context_.ranks > 1) model_.SetContextGroup(context_);
  }

  const ParamLayout& layout() const override { return model_.layout(); }
  int max_batch() const override { return model_.max_batch(); }
  int max_seq_len() const override { return model_.max_seq_len(); }
  std::string Describe() const override { return "cpu (" + std::to_string(omp_get_max_threads()) + " threads)"; }
  double Forward(const float* params, const int32_t* tokens, const int32_t* targets, int B, int T,
                 const NeedUpTo& need) override {
    if (context_.ranks == 1) return model_.Forward(params, tokens, targets, B, T, need);
    forward_len_ = static_cast<int>(ContextPaddedLength(context_.ranks, T));
    if (forward_len_ != T) {
      CHECK(targets == nullptr) << "a context-parallel loss over " << T << " tokens: not " << 2 * context_.ranks
                                << " chunks";
      padded_.assign(static_cast<size_t>(B) * forward_len_, 0);
      for (int b = 0; b < B; ++b) std::copy(tokens + b * T, tokens + (b + 1) * T, padded_.begin() + b * forward_len_);
      tokens = padded_.data();
    }
    return GroupMean(model_.Forward(params, tokens, targets, B, forward_len_, need));
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
    if (context_.ranks > 1) return ContextLastLogits(T);
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
    const double loss = model_.ForwardBackwardLayerMajor(params, grads, tokens, targets, B, T, loss_scale, need,
                                                         need_from, final_from);
    return context_.ranks > 1 ? GroupMean(loss) : loss;
  }

 private:
  double GroupMean(double loss) { return ContextGroupMean(context_, loss); }

  // Position T - 1 of the last Forward (forward_len_ long) is in one
  // rank's chunk: its row, gathered.
  const float* ContextLastLogits(int T) {
    return ContextGatherRow(context_, model_.logits(), forward_len_, T - 1, shape().vocab_size, row_);
  }

  LlamaModel<float> model_;
  const TensorGroup<float> group_;
  const ContextGroup<float> context_;
  std::vector<float> row_;          // a tensor-parallel rank's gathered row of logits (context: every rank's)
  std::vector<int32_t> padded_;     // context parallelism: a Forward's tokens padded to whole chunks
  int forward_len_ = 0;             // context parallelism: the last Forward's length, padded
};

}  // namespace

double ContextGroupMean(const ContextGroup<float>& group, double loss) {
  const int C = group.ranks;
  std::vector<float> bits(2 * C);
  std::memcpy(bits.data() + 2 * group.rank, &loss, sizeof(double));
  group.all_gather(bits.data(), Partition(C, 2));
  double sum = 0;
  for (int r = 0; r < C; ++r) {
    double x;
    std::memcpy(&x, bits.data() + 2 * r, sizeof(double));
    sum += x;
  }
  return sum / C;
}

const float* ContextGatherRow(const ContextGroup<float>& group, const float* mine, int64_t padded_len, int64_t position,
                              int vocab, std::vector<float>& row) {
  const int C = group.ranks;
  const ContextRow at = ContextRowOf(C, padded_len / (2 * C), position);
  row.assign(static_cast<size_t>(C) * vocab, 0.0f);
  if (group.rank == at.rank) std::copy(mine + at.row * vocab, mine + (at.row + 1) * vocab, row.begin() + at.rank * vocab);
  group.all_gather(row.data(), Partition(C, vocab));
  return row.data() + static_cast<int64_t>(at.rank) * vocab;
}

namespace {

class NoComputeModel final : public Model {
 public:
  NoComputeModel(const LlamaShape& shape, int max_batch, int max_seq_len)
      : layout_(shape), max_batch_(max_batch), max_seq_len_(max_seq_len) {}

  const ParamLayout& layout() const override { return layout_; }
  int max_batch() const override { return max_batch_; }
  int max_seq_len() const override { return max_seq_len_; }
  std::string Describe() const override { return "no compute (device.compute false)"; }
  double Forward(const float* /*params*/, const int32_t* /*tokens*/, const int32_t* /*targets*/, int B, int T,
                 const NeedUpTo& need) override {
    if (need) need(layout_.size());
    rows_ = static_cast<int64_t>(B) * T;
    return std::log(static_cast<double>(shape().vocab_size));
  }
  void Backward(const float* /*params*/, float* /*grads*/, double /*loss_scale*/, const FinalFrom& final_from,
                bool /*last_micro_batch*/, const NeedFrom& /*need_from*/) override {
    if (final_from) final_from(0);
  }
  // Allocated when asked for (sampling, evaluation): a data-path job asks
  // for none, and [B*T, vocab] of a large vocabulary is gigabytes.
  const float* logits() override {
    logits_.assign(static_cast<size_t>(std::max<int64_t>(rows_, 1)) * shape().vocab_size, 0.0f);
    return logits_.data();
  }

 private:
  const ParamLayout layout_;
  const int max_batch_, max_seq_len_;
  int64_t rows_ = 0;
  std::vector<float> logits_;
};

}  // namespace

std::unique_ptr<Model> NewNoComputeModel(const LlamaShape& shape, int max_batch, int max_seq_len) {
  return std::make_unique<NoComputeModel>(shape, max_batch, max_seq_len);
}

std::unique_ptr<Model> NewCpuModel(const LlamaShape& shape, int max_batch, int max_seq_len, Recompute recompute,
                                   int slots, TensorGroup<float> group, ContextGroup<float> context) {
  return std::make_unique<CpuModel>(shape, max_batch, max_seq_len, recompute, slots, std::move(group),
                                    std::move(context));
}

}  // namespace herd
