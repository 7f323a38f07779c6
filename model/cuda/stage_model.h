// A pipeline stage computed on a CUDA device (model/stage_model.h): a
// CudaLlamaModel over the stage's layers for each micro-batch slot (each
// its own activations, one stream), the units of the flat space the stage
// reads on the device (its layers', the embedding on the first stage, the
// final norm and the head on the last, and there a tied embedding too),
// everything else of the space never allocated.
//
// Weights: the first pass after a step (EndStep) uploads each unit as the
// model reaches it, the caller's need() asked first (a worker waits there
// for its pulls), and converts it to bf16 on the device in bf16 mode; later
// passes of the step read the device copy. Activations and their
// gradients: the wire's host buffers are copied in before a pass and out
// after it (staged; fp32 on the host, converted on the device in bf16).
// Gradients: the step's micro-batches accumulate on the device; the last
// one's backward adds the sum to the caller's host buffer unit by unit,
// final_from() called as each lands.
#pragma once

#include <memory>

#include "common/status.h"
#include "model/stage_model.h"

namespace herd::cuda {

// A stage over `layers` with `slots` micro-batches in flight on device
// `device`, computing in bf16 or fp32, its backward split in two with
// `split_backward` (zero bubble: the weights' part adds the step's last
// micro-batch's gradients and delivers the sums); with `group`, a
// tensor-parallel rank's (`shape` its slices'). Errors: the device, the
// shape, the memory (one line each, before anything is allocated).
StatusOr<std::unique_ptr<StageModel>> NewCudaStageModel(const LlamaShape& shape, int max_batch, int max_seq_len,
                                                        bool bf16, int device, Recompute recompute, LayerRange layers,
                                                        int slots, bool split_backward, DeviceTensorGroup group = {});

}  // namespace herd::cuda
