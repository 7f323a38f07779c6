// The Llama model on the CPU: forward and backward over the flat parameter
// space, with every activation in a named buffer (llm.c style).
//
// The model owns activations only; parameters and gradients are flat
// buffers laid out by ParamLayout and owned by the caller, so that the same
// model serves a trainer, a parameter-server worker and an evaluator.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "model/llama_config.h"
#include "model/param_layout.h"

namespace herd {

template <typename T>
class LlamaModel {
 public:
  // Activations are allocated for up to max_batch sequences of max_seq_len,
  // those that `recompute` keeps (llama_config.h): backward recomputes the
  // rest, with the same kernels on the same inputs, so gradients are the
  // same bit for bit whatever it says. `slots`: micro-batches a
  // layer-major pass (ForwardBackwardLayerMajor) holds at once, each with
  // its own activations (the head's and backward's scratch are shared).
  //
  // `layers`: the layers this model computes; activations are allocated
  // for those alone. A model over part of the layers runs the stage passes
  // below, not Forward and Backward. `split_backward` (no recomputation):
  // StageBackward may be split in two, StageBackwardInput then
  // StageBackwardWeights (zero-bubble pipelines), for which each slot
  // keeps its layers' output gradients between the two.
  //
  // `split`: a sequence-parallel group's ranks, whose rows alone of the
  // residual stream and the norms are kept (TensorGroup), and a
  // context-parallel group's, whose chunks of each sequence alone are
  // computed (ContextGroup; 2 x context must divide max_seq_len). Either
  // may be a model of any layers (a pipeline stage's input and output are
  // its rank's rows: its chunks', its share of the residual stream's);
  // sequence parallelism's backward is not split.
  LlamaModel(const LlamaShape& shape, int max_batch, int max_seq_len, Recompute recompute = Recompute::kNone,
             int slots = 1, LayerRange layers = {}, bool split_backward = false, TokenSplit split = {});
  ~LlamaModel();
  LlamaModel(const LlamaModel&) = delete;
  LlamaModel& operator=(const LlamaModel&) = delete;

  const LlamaShape& shape() const { return layout_.shape(); }
  const ParamLayout& layout() const { return layout_; }
  int max_batch() const { return max_batch_; }
  int max_seq_len() const { return max_seq_len_; }
  int slots() const { return static_cast<int>(acts_.size()); }
  int first_layer() const { return first_layer_; }
  int end_layer() const { return end_layer_; }
  bool embeds() const { return first_layer_ == 0; }
  bool has_head() const { return end_layer_ == shape().num_layers; }

  // Forward over tokens[B, T_]. With targets, returns the mean cross-entropy
  // and keeps what Backward needs; without, returns 0 and only logits()
  // are meaningful. Token ids must be < vocab_size (checked by the caller).
  //
  // `need(end)`, when given, is called before Forward first reads a
  // parameter below flat offset `end` (end rises layer by layer to the
  // layout's size): a worker waits there for the weights it is still
  // pulling, so the first layers compute while the last ones arrive.
  using NeedUpTo = std::function<void(int64_t end)>;
  double Forward(const T* params, const int32_t* tokens, const int32_t* targets, int B, int T_,
                 const NeedUpTo& need = nullptr);

  // grads += d(loss_scale * sum of per-token losses)/d(params), for the last
  // Forward with targets. loss_scale = 1/(B*T_) gives the gradient of the
  // mean; the trainer folds in micro-batches and workers.
  //
  // `final_from(x)`, when given, is called as backward proceeds: every
  // gradient at flat offset >= x has received this call's contribution (x
  // falls layer by layer to 0), so a worker can ship those while the rest
  // of backward runs; backward reads no parameter at offset >= x after it.
  //
  // `need_from(x)`, when given, is called before Backward first reads a
  // parameter at flat offset >= x (x falls unit by unit: the final norm's
  // offset for the head, then each layer's first tensor): a worker that
  // streams its weights pulls them again there. (Tied embeddings: the head
  // reads the embedding too, which need_from does not announce.)
  using FinalFrom = std::function<void(int64_t offset)>;
  using NeedFrom = std::function<void(int64_t begin)>;
  void Backward(const T* params, T* grads, double loss_scale, const FinalFrom& final_from = nullptr,
                const NeedFrom& need_from = nullptr);

  // Every micro-batch of a step (tokens[m], targets[m], each B x T_; at
  // most `slots`), unit by unit: the embedding's forward for all of them,
  // then each layer's, then the head's forward and backward for one after
  // the other, then each layer's backward for all of them, then the
  // embedding's. A worker that streams its weights so holds each unit once
  // a pass however many micro-batches it accumulates, and gradients become
  // final unit by unit. The hooks are called as by one Forward and
  // Backward, final_from once every micro-batch's part is in. Returns the
  // sum of the micro-batches' mean losses. grads receive the same values
  // bit for bit as Forward and Backward on each micro-batch in turn, each
  // tensor's parts added in micro-batch order -- except with tied
  // embeddings, where the head's parts of the embedding's gradient come
  // before the embedding's own.
  double ForwardBackwardLayerMajor(const T* params, T* grads, const std::vector<const int32_t*>& tokens,
                                   const std::vector<const int32_t*>& targets, int B, int T_, double loss_scale,
                                   const NeedUpTo& need = nullptr, const NeedFrom& need_from = nullptr,
                                   const FinalFrom& final_from = nullptr);

  // Stage passes: one micro-batch in `slot` through this model's layers,
  // which may be any LayerRange. Forward starts from `tokens` on the model
  // that embeds (input null) or from the previous stage's output `input`
  // ([B*T_, hidden]); the model with the head also runs the head's
  // backward at once (its buffers are shared by the slots: the scheme of
  // ForwardBackwardLayerMajor), adding to `grads`, and returns the
  // micro-batch's mean loss (0 elsewhere); with `grads` null it computes
  // the forward alone (evaluation). StageOutput(slot): this stage's
  // output, the next stage's input (not on the head's stage).
  //
  // StageBackward: the layers' backward for the micro-batch in `slot`,
  // from `output_grad` (d loss / d StageOutput, from the next stage; null
  // on the head's stage, which has it from its forward). Adds to `grads`
  // exactly what Backward adds for those layers (the embedding on the
  // first stage), so stages that take the micro-batches in the same order
  // as one model does accumulate bitwise the same gradients; with tied
  // embeddings the head's part of the embedding's gradient is on the last
  // stage and the embedding's own on the first. StageInputGrad(slot):
  // d loss / d input, for the previous stage (not on the first).
  // The hooks are called as by Forward and Backward, over this model's
  // ranges only.
  double StageForward(int slot, const T* params, const int32_t* tokens, const int32_t* targets, const T* input, int B,
                      int T_, T* grads, double loss_scale, const NeedUpTo& need = nullptr);
  const T* StageOutput(int slot) const;
  // The elements of a stage's output (and of its input, and their
  // gradients) for B sequences of T_ tokens: [B*T_, hidden], a
  // context-parallel rank's chunks' rows alone, a sequence-parallel rank's
  // share of them.
  int64_t StageElements(int B, int T_) const;
  // Where StageForward's `input` and StageBackward's `output_grad` may be
  // received for `slot` (StageElements each), so that nothing is copied.
  T* StageInput(int slot);
  T* StageOutputGrad(int slot);
  void StageBackward(int slot, const T* params, T* grads, const T* output_grad, const FinalFrom& final_from = nullptr,
                     const NeedFrom& need_from = nullptr);
  const T* StageInputGrad(int slot) const;
  // StageBackward in two parts (a model made with split_backward): the
  // input gradients (on a pipeline's critical path: StageInputGrad is
  // ready after it; the embedding's gradient on the first stage too), then,
  // any time before the slot's next StageForward, the weight gradients,
  // which add to `grads` bitwise what StageBackward adds. The first part
  // reads the weights: need_from(x) before it reads a layer's, done(x)
  // once it no longer does; final_from is called by the second part,
  // which reads none (the head's first, then each layer's, then the
  // embedding's).
  void StageBackwardInput(int slot, const T* params, T* grads, const T* output_grad, const FinalFrom& done = nullptr,
                          const NeedFrom& need_from = nullptr);
  void StageBackwardWeights(int slot, T* grads, const FinalFrom& final_from = nullptr);

  // [B*T_, vocab] logits of the last Forward (overwritten by Backward);
  // a tensor-parallel rank's: its vocabulary's columns.
  const T* logits() const;

  // Makes this model a tensor-parallel rank's (before any pass); a
  // sequence-parallel group's must match split.sequence.
  void SetTensorGroup(TensorGroup<T> group);
  // Makes this model a context-parallel rank's (before any pass); the
  // group's ranks must be split.context.
  void SetContextGroup(ContextGroup<T> group);

  // Bytes of every activation and backward scratch buffer a model of this
  // shape allocates for max_batch x max_seq_len (at the current OpenMP
  // thread count) and `slots`: the worker's share of a memory plan.
  static int64_t ActivationBytes(const LlamaShape& shape, int max_batch, int max_seq_len,
                                 Recompute recompute = Recompute::kNone, int slots = 1, LayerRange layers = {},
                                 bool split_backward = false, TokenSplit split = {});

 private:
  struct Activations;
  // Each unit's forward and backward for the micro-batch whose activations
  // are `a`, side by side. Layer l's forward runs from its input (kept in
  // every mode) into the layer's buffers; `to_output`: through its last
  // product and residual add into the next layer's input (backward's
  // recomputation stops before them: nothing there is needed).
  // The micro-batch's B x T_ shape, and the rows of it this model
  // computes (a context-parallel rank's chunks: their tokens, targets and
  // RoPE rows); `tokens` and `targets` may be null.
  void TakeRows(Activations& a, const int32_t* tokens, const int32_t* targets, int B, int T_);
  void EmbedForward(Activations& a, const T* params, const int32_t* tokens, const int32_t* targets, int B, int T_);
  void LayerForward(Activations& a, const T* params, int l, bool to_output);
  double HeadForward(Activations& a, const T* params);  // the mean loss (0 without targets)
  void HeadBackward(Activations& a, const T* params, T* grads, double loss_scale);
  // `grads` null: the input part of a split backward (the layer's output
  // gradients kept in the slot for LayerBackwardWeights, its second part).
  void LayerBackward(Activations& a, const T* params, T* grads, int l);
  void LayerBackwardWeights(Activations& a, T* grads, int l);
  void EmbedBackward(Activations& a, T* grads);
  int64_t LayerEnd(int l) const;  // where layer l's tensors end
  void BackwardScratch();         // allocated on the first backward
  // The sum over the tensor-parallel ranks (none without).
  void AllReduce(T* data, int64_t n) {
    if (tp_.ranks > 1) tp_.all_reduce(data, n);
  }
  // Sequence parallelism's rows of N tokens: the parts of a [N, width]
  // buffer (elements per rank), this rank's first row, and its rows.
  Partition RowParts(int64_t N, int64_t width) const;
  int64_t FirstRow(int64_t N) const;
  int64_t HeldRows(int64_t N) const;
  // [N, d] whole from this rank's rows `mine` (itself without sequence
  // parallelism; else gathered in the shared `whole` buffer).
  const T* Gathered(const T* mine, int64_t N, int64_t d);
  // The group's sum of the [N, d] partial sums `part`, in place: this
  // rank's rows of it (all of them without sequence parallelism).
  const T* Summed(T* part, int64_t N, int64_t d);
  // Context parallelism: the group's keys and values of layer l's `k` and
  // `v` ([B, Tl, kv]) in k_all and v_all, each [B, T, kv] in position
  // order; and the sums of dk_all's and dv_all's, this rank's
  // positions' rows, into dk and dv.
  void GatherKeysValues(Activations& a, const T* k, const T* v);
  void ScatterKeyValueGrads(Activations& a, T* dk, T* dv);
  // Calls fn(ranks_row, position_row) for every key row of the last
  // Forward: its offset (rows) in the gathered kv_ranks buffer's keys, and
  // in k_all (values: the same, kv_ranks' value half and v_all).
  template <typename F>
  void ForEachKeyRow(const Activations& a, F fn) const;
  // RoPE's tables for this model's rows: its positions' with context
  // parallelism, else from position 0.
  std::pair<const T*, const T*> RopeRows() const;

  ParamLayout layout_;
  int max_batch_, max_seq_len_;
  int first_layer_, end_layer_;  // the LayerRange, resolved
  // One per slot, each holding the recompute mode, which shapes it; slot 0
  // holds the shared buffers too.
  std::vector<std::unique_ptr<Activations>> acts_;
  const int seq_ranks_;  // the sequence-parallel group's ranks (1: none)
  const int ctx_ranks_;  // the context-parallel group's ranks (1: none)
  TensorGroup<T> tp_;
  ContextGroup<T> cp_;
  std::vector<T> vocab_stats_;  // tensor-parallel: the cross-entropy's statistics, summed over the ranks
};

extern template class LlamaModel<float>;
extern template class LlamaModel<double>;

}  // namespace herd
