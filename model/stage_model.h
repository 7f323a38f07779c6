// A pipeline stage's model as the stage passes drive it
// (worker/placements/pipeline_passes.h): model/llama.h's stage passes, one
// micro-batch in a slot at a time, over *host* buffers (the weights and
// gradients of the flat space, the activations and their gradients the
// pipeline's wire carries), on whatever device computes them. The CPU's is
// a LlamaModel<float> (NewCpuStageModel); a CUDA stage's
// (model/cuda/stage_model.h) stages its inputs in and its outputs out.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "model/llama.h"
#include "model/model.h"

namespace herd {

class StageModel {
 public:
  using NeedUpTo = Model::NeedUpTo;
  using NeedFrom = Model::NeedFrom;
  using FinalFrom = Model::FinalFrom;

  virtual ~StageModel() = default;

  virtual const ParamLayout& layout() const = 0;
  virtual int max_batch() const = 0;
  virtual int max_seq_len() const = 0;
  virtual int slots() const = 0;
  virtual std::string Describe() const = 0;
  // The most device memory the model has held (0 on the CPU).
  virtual int64_t DevicePeakBytes() const { return 0; }

  // LlamaModel::StageElements, StageInput ... StageInputGrad: the same
  // contracts, the buffers host memory. StageOutput(slot) and
  // StageInputGrad(slot) are meaningful once the pass that writes them
  // has returned.
  virtual int64_t StageElements(int B, int T) const = 0;
  virtual float* StageInput(int slot) = 0;
  virtual double StageForward(int slot, const float* params, const int32_t* tokens, const int32_t* targets,
                              const float* input, int B, int T, float* grads, double loss_scale,
                              const NeedUpTo& need) = 0;
  virtual const float* StageOutput(int slot) = 0;
  virtual float* StageOutputGrad(int slot) = 0;
  // `last_micro_batch`: the step's last backward on this model; a device
  // model may keep the earlier ones' gradients on the device and deliver
  // the step's sum into `grads` then (final_from as it arrives), as
  // Model::Backward may.
  virtual void StageBackward(int slot, const float* params, float* grads, const float* output_grad,
                             bool last_micro_batch, const FinalFrom& final_from, const NeedFrom& need_from) = 0;
  virtual const float* StageInputGrad(int slot) = 0;
  // Zero bubble's split backward (LlamaModel's StageBackwardInput and
  // StageBackwardWeights), for a model made with split_backward.
  virtual void StageBackwardInput(int slot, const float* params, float* grads, const float* output_grad,
                                  const FinalFrom& done, const NeedFrom& need_from) = 0;
  virtual void StageBackwardWeights(int slot, float* grads, const FinalFrom& final_from) = 0;
  // The step's passes are done: the weights change before the next pass.
  virtual void EndStep() {}
  // [B*T, vocab] host logits of the last forward (the head's stage).
  virtual const float* logits() = 0;
};

// A CPU stage over `model`'s layers.
std::unique_ptr<StageModel> NewCpuStageModel(std::unique_ptr<LlamaModel<float>> model);

}  // namespace herd
