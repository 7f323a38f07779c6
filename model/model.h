// What trainers, workers and evaluators drive: the Llama forward and
// backward over *host* flat buffers (weights in, fp32 gradients out), on
// whatever device computes them. The CPU model computes in place; a CUDA
// model (model/cuda/staged_model.h) stages weights in and gradients out
// through page-locked memory, range by range, so the hooks below keep
// their meaning and a parameter-server worker overlaps its pulls and
// pushes with the device's work.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "model/llama_config.h"
#include "model/param_layout.h"

namespace herd {

class Model {
 public:
  using NeedUpTo = std::function<void(int64_t end)>;
  using NeedFrom = std::function<void(int64_t begin)>;
  using FinalFrom = std::function<void(int64_t offset)>;

  virtual ~Model() = default;

  virtual const ParamLayout& layout() const = 0;
  const LlamaShape& shape() const { return layout().shape(); }
  virtual int max_batch() const = 0;
  virtual int max_seq_len() const = 0;
  // "cpu (8 threads)", "cuda:0 NVIDIA H100 80GB HBM3, bf16", ...
  virtual std::string Describe() const = 0;
  // The device's peak for the dtype it computes in, TFLOP/s
  // (model/peak_flops.h); 0 when unknown, as for CPUs.
  virtual double PeakTflops() const { return 0; }
  // The most device memory the model has held at once since it was made
  // (its buffers and what it allocated since); 0 for the CPU model.
  virtual int64_t DevicePeakBytes() const { return 0; }

  // LlamaModel::Forward's contract: the mean cross-entropy with targets
  // (0 without); need(end) before parameters below `end` are read.
  virtual double Forward(const float* params, const int32_t* tokens, const int32_t* targets, int B, int T,
                         const NeedUpTo& need = nullptr) = 0;
  // LlamaModel::Backward's contract: grads += d(loss_scale * sum of
  // losses)/d(params); final_from(x) once every gradient at offset >= x
  // holds this call's contribution *in host memory*. With
  // last_micro_batch false a device model may keep the contribution on the
  // device and deliver it with the next call's: callers read `grads` only
  // after a call with last_micro_batch true (the step's last micro-batch).
  // need_from(x) before parameters at offsets >= x are read (the CPU model:
  // see LlamaModel::Backward; a device model that holds every weight
  // itself need not call it).
  virtual void Backward(const float* params, float* grads, double loss_scale, const FinalFrom& final_from = nullptr,
                        bool last_micro_batch = true, const NeedFrom& need_from = nullptr) = 0;
  // Host [B*T, vocab] logits of the last Forward (before any Backward).
  virtual const float* logits() = 0;
  // The last Forward's logits at position T - 1 of its first sequence
  // ([vocab]), what sampling reads: a row of logits(), unless the model's
  // logits are elsewhere (a pipeline's, on its last stage).
  virtual const float* LastLogits(int T) { return logits() + static_cast<int64_t>(T - 1) * shape().vocab_size; }
  // How many logits LastLogits gives: the vocabulary (a tensor-parallel
  // rank's model, whose shape holds its part: the whole model's).
  virtual int vocab_size() const { return shape().vocab_size; }

  // LlamaModel::ForwardBackwardLayerMajor's contract, for up to
  // layer_major_slots() micro-batches (0: the model has no such pass).
  virtual int layer_major_slots() const { return 0; }
  virtual double ForwardBackwardLayerMajor(const float* /*params*/, float* /*grads*/,
                                           const std::vector<const int32_t*>& /*tokens*/,
                                           const std::vector<const int32_t*>& /*targets*/, int /*B*/, int /*T*/,
                                           double /*loss_scale*/, const NeedUpTo& /*need*/,
                                           const NeedFrom& /*need_from*/, const FinalFrom& /*final_from*/) {
    return 0;
  }
};

// A context-parallel group's mean of each rank's `loss` (its chunks'
// tokens' mean: the ranks hold as many): the doubles' bits gathered, then
// added in rank order, so that every rank has the same bits.
double ContextGroupMean(const ContextGroup<float>& group, double loss);
// The logits row of position `position` of sequences `padded_len` long
// cut over `group` (`mine`: this rank's logits, [its rows, vocab]): the
// owning rank's row, gathered into `row` (C x vocab) and returned.
const float* ContextGatherRow(const ContextGroup<float>& group, const float* mine, int64_t padded_len, int64_t position,
                              int vocab, std::vector<float>& row);
// The length a context-parallel group computes `length` tokens as: padded
// to whole chunks (2 x ranks), which causal attention never reads past.
inline int64_t ContextPaddedLength(int ranks, int64_t length) {
  const int64_t chunks = 2 * static_cast<int64_t>(ranks);
  return (length + chunks - 1) / chunks * chunks;
}

// The CPU model (LlamaModel<float>, OpenMP threads), keeping what
// `recompute` says (llama_config.h), with `slots` for layer-major passes;
// with `group`, a tensor-parallel rank's (`shape` its slice's); with
// `context`, a context-parallel rank's: given whole sequences it computes
// its chunks, returns the group's mean loss (every rank the same bits),
// and a length its chunks do not divide (a prompt being sampled) is
// padded at the end, which causal attention never reads.
std::unique_ptr<Model> NewCpuModel(const LlamaShape& shape, int max_batch, int max_seq_len,
                                   Recompute recompute = Recompute::kNone, int slots = 1,
                                   TensorGroup<float> group = {}, ContextGroup<float> context = {});

// A model that computes nothing (device.compute false): Forward waits for
// every weight and returns ln(vocab), Backward adds nothing and finishes
// every gradient at once; its logits are zeros. What times a job's data
// path alone.
std::unique_ptr<Model> NewNoComputeModel(const LlamaShape& shape, int max_batch, int max_seq_len);

}  // namespace herd
