// How a pipeline stage's worker computes its share of a step
// (cluster.pipeline_stages, docs/design.md "Parallel axes"): the step's
// micro-batches pass through the stages in the order of the schedule's
// table for this worker's device (sharding/pipeline_schedule.h), each
// chunk a StageModel over its layers (sharding/pipeline_split.h; the CPU's
// LlamaModel, or a CUDA stage's, model/stage_model.h). A
// forward receives its input activations from the previous virtual stage
// (the first embeds the tokens) and sends its output to the next; a
// backward receives the gradient of its output from the next (the last
// starts from its loss) and sends the gradient of its input back, with the
// micro-batch's loss, so that every stage knows the step's loss. Messages
// travel over transport/pipeline_wire.h.
//
// Each chunk takes its micro-batches' backwards in ascending order (the
// schedules promise it), so a chunk's gradients accumulate bitwise as one
// whole model's do. A chunk keeps as many micro-batches' activations as
// the table has in flight on it (slots: micro-batch m in slot m % slots).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model/model.h"
#include "model/stage_model.h"
#include "sharding/pipeline_schedule.h"
#include "sharding/pipeline_split.h"
#include "transport/pipeline_wire.h"
#include "worker/reducers/sync_strategy.h"
#include "worker/reducers/weight_home.h"
#include "worker/share_compute.h"

namespace herd {

struct PipelinePassOptions {
  const PipelineSchedule* schedule = nullptr;
  const PipelineSplit* split = nullptr;  // one stage per virtual stage
  int device = 0;                        // this worker's place in the pipeline
  transport::PipelineWire* wire = nullptr;
  // [device]: the PeerId of the worker of this replica at each device.
  std::vector<transport::PeerId> peers;
  WeightHome* home = nullptr;
  SyncStrategy* sync = nullptr;
  const float* weights = nullptr;  // the whole flat space (this stage's ranges held)
  float* grads = nullptr;
  int64_t flat_size = 0;
  int batch = 0, seq_len = 0;
  double loss_scale = 0;  // 1 / the global batch's tokens
  // Tensor parallelism inside the stages: this worker's group (its models
  // hold its rank's slices), over which a sampled position's logits, each
  // rank's vocabulary rows, are gathered. One rank without.
  TensorGroup<float> tensor;
  // Context parallelism inside the stages: this worker's group (its models
  // compute its chunks of each sequence), over which the evaluator's loss
  // is averaged and a sampled position's logits gathered from the rank
  // that holds it. One rank without.
  ContextGroup<float> context;
};

// `models[c]`: chunk c's model over split->stage(VirtualStage(device, c))'s
// layers, with ChunkSlots(...)[c] slots.
std::unique_ptr<ShareCompute> PipelinePasses(const PipelinePassOptions& options,
                                             std::vector<StageModel*> models);

// Evaluation through the stages, as a Model for the step loop's held-out
// loss (worker/evaluate.h): every worker of a replica calls Forward for
// the same batches in the same order at a step boundary; each passes the
// batch through its chunks (forward only, slot 0), and the last stage
// sends the loss to the others, so that every worker returns it. Its
// messages are the wire's of the step just taken, micro-batches numbered
// after the step's own. Sampling (no targets, one sequence) passes the
// tokens through the stages alike, and the last stage sends the last
// position's logits, fp32, to the others (LastLogits), so that every
// worker draws the same tokens as one process (with tensor parallelism
// each rank's vocabulary rows of them, gathered over its group; with
// context parallelism the prompt padded to whole chunks and the row
// gathered from the context rank that holds it, and the loss the context
// group's mean). Backward and logits() are not served.
std::unique_ptr<Model> PipelineEvaluator(const PipelinePassOptions& options, std::vector<StageModel*> models,
                                         const std::string& device_name);

}  // namespace herd
