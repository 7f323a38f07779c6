// The Llama model on a CUDA device: model/llama.h's forward and backward
// over the flat parameter space, with every activation in a named device
// buffer and the kernels of model/cuda/kernels.h.
//
// Parameters are a flat device space of the compute dtype T (float for
// parity with the CPU, __nv_bfloat16 by default on GPUs); gradients are a
// flat device fp32 space of the same layout, accumulated (+=) like the CPU
// model's. Either may be one buffer or held unit by unit (unit_space.h).
// Token ids arrive from the host. Everything runs in order on the model's
// stream; Forward returns after the losses are on the host.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "model/cuda/device_compat.h"
#include "model/cuda/device_memory.h"
#include "model/cuda/unit_space.h"
#include "model/llama_config.h"
#include "model/param_layout.h"

namespace herd::cuda {

template <typename T>
class CudaLlamaModel {
 public:
  // Device activations for up to max_batch sequences of max_seq_len. The
  // shape's head_dim must be one AttentionHeadDimSupported accepts (checked
  // by CheckShape before construction).
  // `recompute` kFull keeps one layer's intermediates and recomputes each
  // layer's before its backward (the same kernels on the same inputs: the
  // same gradients bit for bit); kAttention is kNone here (the attention
  // keeps no probabilities anyway).
  //
  // `group`: a tensor-parallel rank's (DeviceTensorGroup, model/llama_config.h;
  // `shape` is then its slice's, sharding/tensor_slices.h): every product
  // is its part, and the group's sums make whole what the layers need
  // whole, as model/llama.h's TensorGroup does (o_proj's and down_proj's
  // outputs, the embedding's lookup, the norms' and the head's input
  // gradients, the cross-entropy's statistics), so every rank returns the
  // whole vocabulary's loss and computes the norms' gradients whole. With
  // the group's sequence parallelism (model/llama.h's scheme) the residual
  // stream and the norms hold this rank's rows of the tokens alone, the
  // sums are reduce-scatters and gathers make the products' inputs whole,
  // and the norms' gradients are this rank's rows' part (the caller sums
  // them over the group).
  //
  // `layers`: a pipeline stage's (model/llama.h's LayerRange), whose
  // activations alone are allocated (the head's only on the last stage);
  // such a model runs the stage passes below, not Forward and Backward.
  //
  // `context`: a context-parallel rank's (model/llama_config.h's
  // ContextGroup scheme): given whole sequences it computes its chunks'
  // tokens alone, its attention against the group's keys and values
  // gathered on the device (their gradients' sums reduce-scattered back),
  // and returns its tokens' mean loss; 2 x ranks must divide every
  // sequence's length.
  //
  // `split_backward` (no recomputation): StageBackward may be split in
  // two, StageBackwardInput then StageBackwardWeights (zero-bubble
  // pipelines), each layer's products' output gradients kept between.
  CudaLlamaModel(const LlamaShape& shape, int max_batch, int max_seq_len, cudaStream_t stream,
                 Recompute recompute = Recompute::kNone, DeviceTensorGroup group = {}, LayerRange layers = {},
                 DeviceContextGroup context = {}, bool split_backward = false);
  ~CudaLlamaModel();
  CudaLlamaModel(const CudaLlamaModel&) = delete;
  CudaLlamaModel& operator=(const CudaLlamaModel&) = delete;

  // Why this model cannot run the shape, or "" if it can.
  static std::string CheckShape(const LlamaShape& shape);

  const ParamLayout& layout() const { return layout_; }
  cudaStream_t stream() const { return stream_; }

  // Forward over host tokens[B, T_]; with host targets returns the mean
  // cross-entropy (summed in order in double, as the CPU model does).
  // `need(end)` is called before the first kernel that reads parameters
  // below flat offset `end` is enqueued: the caller makes them present in
  // stream order (e.g. enqueues their copy onto this stream).
  using NeedUpTo = std::function<void(int64_t end)>;
  double Forward(UnitSpace<const T> params, const int32_t* host_tokens, const int32_t* host_targets, int B, int T_,
                 const NeedUpTo& need = nullptr);

  // grads += d(loss_scale * sum of per-token losses)/d(params) for the last
  // Forward with targets. `final_from(x)` is called once the kernels that
  // finish every gradient at offset >= x are enqueued: work enqueued on the
  // stream after the call sees them final. `need_from(x)` is called before
  // the first kernel of the unit (ParamLayout::UnitBoundaries) at x is
  // enqueued, for every unit whose backward reads parameters: the head's,
  // each layer's. The embedding's reads none; its kernels follow the
  // lowest layer's final_from.
  using FinalFrom = std::function<void(int64_t offset)>;
  using NeedFrom = std::function<void(int64_t begin)>;
  void Backward(UnitSpace<const T> params, UnitSpace<float> grads, double loss_scale,
                const FinalFrom& final_from = nullptr, const NeedFrom& need_from = nullptr);

  int first_layer() const { return first_layer_; }
  int end_layer() const { return end_layer_; }
  bool embeds() const { return first_layer_ == 0; }
  bool has_head() const { return end_layer_ == layout_.shape().num_layers; }

  // Stage passes (model/llama.h's contract, one micro-batch at a time):
  // forward through this model's layers from host tokens on the model that
  // embeds or from `input` (device, StageElements; StageInput() to land it
  // in place) elsewhere; the model with the head runs the head's backward
  // at once into `grads` (null: forward alone) and returns the mean loss
  // (0 elsewhere). StageBackward: the layers' backward from `output_grad`
  // (device, d loss / d StageOutput(); null on the head's model), adding
  // to `grads` what Backward adds for those layers (the embedding on the
  // first); StageInputGrad(): d loss / d input. The hooks as Forward's and
  // Backward's, over this model's ranges.
  double StageForward(UnitSpace<const T> params, const int32_t* host_tokens, const int32_t* host_targets,
                      const T* input, int B, int T_, UnitSpace<float>* grads, double loss_scale,
                      const NeedUpTo& need = nullptr);
  void StageBackward(UnitSpace<const T> params, UnitSpace<float> grads, const T* output_grad,
                     const FinalFrom& final_from = nullptr, const NeedFrom& need_from = nullptr);
  // StageBackward in two parts (a model made with split_backward): the
  // input gradients (StageInputGrad ready after it; the norms' and on the
  // first stage the embedding's gradients too), then, before the model's
  // next pass, the products' weight gradients; together they add to
  // `grads` what StageBackward adds.
  void StageBackwardInput(UnitSpace<const T> params, UnitSpace<float> grads, const T* output_grad);
  void StageBackwardWeights(UnitSpace<float> grads);
  // A stage's input and output elements for B x T_ tokens ([B*T_, hidden];
  // with sequence parallelism the rank's rows).
  int64_t StageElements(int B, int T_) const;
  T* StageInput();
  const T* StageOutput() const;
  T* StageOutputGrad();
  const T* StageInputGrad() const;

  // Device [B*T_, vocab] logits of the last Forward (overwritten by Backward);
  // a tensor-parallel rank's: its vocabulary's columns.
  const T* logits() const;
  // The last Forward's logits as fp32 on the host (waits for the stream).
  void LogitsToHost(std::vector<float>* out) const;
  // Row `row` of the last Forward's logits over the whole vocabulary, fp32
  // on the host: a tensor-parallel rank's columns with the others' summed
  // in (every rank calls it alike).
  void LogitsRowToHost(int64_t row, std::vector<float>* out);
  const DeviceTensorGroup& tensor_group() const { return tp_; }
  const DeviceContextGroup& context_group() const { return cp_; }

 private:
  struct Buffers;
  // Layer l's forward from its input into the layer's buffers; `to_output`:
  // through its last product into the next layer's input.
  void LayerForward(UnitSpace<const T> params, int l, bool to_output);
  // The constructor's buffers of the model's part (the head, a group's,
  // a split backward's), from the one table `z`.
  void AllocatePartBuffers(const CudaActivationSizes& z, Recompute recompute, int max_batch, int max_seq_len);
  // The passes' pieces, each unit's forward beside its backward: the batch
  // taken (tokens to the model that embeds, targets to the one with the
  // head), the embedding, the head (its loss; its backward into dres), a
  // layer's backward, the embedding's.
  void TakeBatch(const int32_t* host_tokens, const int32_t* host_targets, int B, int T_);
  void EmbedForward(UnitSpace<const T> params);
  double HeadForward(UnitSpace<const T> params);
  void HeadBackward(UnitSpace<const T> params, UnitSpace<float> grads, double loss_scale);
  // `split`: the products' weight gradients left for LayerBackwardWeights
  // (their output gradients kept).
  void LayerBackward(UnitSpace<const T> params, UnitSpace<float> grads, int l, bool split = false);
  void LayerBackwardWeights(UnitSpace<float> grads, int l);
  void EmbedBackward(UnitSpace<float> grads);
  int64_t LayerEnd(int l) const;  // where layer l's tensors end
  // Context parallelism: layer l's keys and values (this rank's rows) of
  // the group gathered into k_all and v_all in position order; and the
  // sums of dk_all's and dv_all's, this rank's rows', into dk and dv. The
  // rank-major rows <-> position order (gather: to position order).
  void GatherKeysValues(const T* k, const T* v);
  void ScatterKeyValueGrads(T* dk, T* dv);
  void ReorderKeyRows(T* rank_major, T* by_position, bool gather);
  // The tensor-parallel group's sum of data[0, n) in place (nothing
  // without a group).
  void AllReduce(T* data, int64_t n);
  bool sequence_parallel() const { return tp_.sequence_parallel && tp_.ranks > 1; }
  // Sequence parallelism's rows of N tokens: the parts of an [N, d]
  // buffer (elements per rank), this rank's first row, and its rows (0
  // and N without).
  Partition RowParts(int64_t N) const;
  int64_t FirstRow(int64_t N) const;
  int64_t HeldRows(int64_t N) const;
  // [N, d] whole from this rank's rows `mine` (itself without sequence
  // parallelism; else gathered in the `whole` buffer).
  const T* Gathered(const T* mine, int64_t N);
  // The group's sum of the [N, d] partial sums `part`, in place: this
  // rank's rows of it (all of them without sequence parallelism).
  T* Summed(T* part, int64_t N);

  ParamLayout layout_;
  const DeviceTensorGroup tp_;
  const DeviceContextGroup cp_;
  const int first_layer_, end_layer_;  // the LayerRange, resolved
  const bool split_backward_;
  int max_batch_, max_seq_len_;
  cudaStream_t stream_;
  std::unique_ptr<Buffers> b_;
};

extern template class CudaLlamaModel<float>;
extern template class CudaLlamaModel<__nv_bfloat16>;

}  // namespace herd::cuda
