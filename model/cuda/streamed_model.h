// A Model (model/model.h) computed on a CUDA device that holds only a
// window of the model: the GPU side of streamed weights
// (cluster.stream_weights), for a worker whose host weights and gradients
// are themselves windows (common/paged_buffer.h).
//
// The device holds the weights and gradients unit by unit
// (ParamLayout::UnitBoundaries: the embedding, each layer, the final norm
// with the head), each in a buffer of its own from a stream-ordered pool
// (model/cuda/unit_space.h addresses them). A forward uploads each unit as
// the model reaches it, after the caller's need(end) (a worker waits there
// for its pulls), and lets it go once its kernels are enqueued; backward
// uploads each unit again after the caller's need_from(x). The host is
// kept at most two units ahead of the device, so the device holds two
// consecutive units' weights (one computed, the next arriving), plus the
// head from the forward's end into backward and, with tied embeddings, the
// embedding for the whole step.
//
// Uploads go through a ring of page-locked host slots on a copy stream of
// their own (the host's buffers are not page-locked: they are mostly not
// there); in bf16 mode each slot lands in device memory and is converted
// there. A unit's gradients are zeroed on the device when its backward
// starts and, on the step's last micro-batch, copied out through a second
// ring on a third stream once the unit's kernels are done, added to the
// caller's buffer, and announced with final_from: a unit's final_from comes
// after the next unit's need_from, so the device computes one unit while
// the host ships the one before. Earlier micro-batches keep their sums on
// the device (every unit's gradients stay there until the last one); their
// final_from(x) comes as soon as the unit's kernels are enqueued (the host
// weights are no longer needed then).
//
// The same kernels read the same bytes as in the staged model
// (staged_model.h), so the gradients are bitwise the same.
#pragma once

#include <memory>

#include "common/status.h"
#include "model/llama_config.h"
#include "model/model.h"

namespace herd::cuda {

// `accumulates`: grad_accum > 1 (sizes the device check only).
StatusOr<std::unique_ptr<Model>> NewStreamedCudaModel(const LlamaShape& shape, int max_batch, int max_seq_len,
                                                      bool bf16, int device, Recompute recompute, bool accumulates);

}  // namespace herd::cuda
