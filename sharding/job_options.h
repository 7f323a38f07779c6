// The job's config as the plain values the layers below take: the model's
// shape and what it keeps (model/), the optimizer's options and how a
// fresh run's weights start (model/optim/), what the step loop logs,
// evaluates and checkpoints (worker/step_loop.h). A process converts its config
// once (JobOptions::FromConfig) and hands these down, so that model/ never
// reads the job's config; the memory plan converts with the same function,
// so that it counts what the processes make.
//
// It lives here, the lowest layer above model/, because the memory plan
// (sharding/memory_plan.h) needs it as much as the workers and servers do.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "model/checkpoint_run.h"
#include "model/llama_config.h"
#include "model/optim/adamw.h"
#include "model/optim/optimizer_shard.h"
#include "proto/herd.pb.h"

namespace herd {

struct JobOptions {
  LlamaShape shape;
  int batch = 1, seq_len = 1, grad_accum = 1;  // train.batch_size, seq_len, grad_accum
  Recompute recompute = Recompute::kNone;      // train.recompute
  // How many micro-batches a CPU worker's model keeps activations for at
  // once: a step's all (train.grad_accum) when it keeps only part of its
  // gradients (cluster.stream_weights, ZeRO-2) and the embeddings are
  // untied, so that one layer-major pass serves them all
  // (LlamaModel::ForwardBackwardLayerMajor: each unit pulled once a pass,
  // no gradient kept whole until the last micro-batch, the same bits);
  // else 1, one micro-batch after the other.
  int micro_batch_slots = 1;
  OptimizerOptions optimizer;  // with a schedule of train.steps steps
  WeightInit init;
  int64_t steps = 0;  // train.steps
  uint64_t seed = 0;  // train.seed (the sample's draws too)
  // What the loop logs and evaluates (the log block).
  struct Log {
    std::string metrics, tensorboard;  // log.metrics, log.tensorboard (empty: none)
    int every = 1, eval_every = 0;     // log.every, log.eval_every (0: at the end only)
    int64_t eval_batches = 0;          // log.eval_batches (<= 0: the whole file)
    double peak_tflops = 0;            // log.peak_tflops (0: the device's)
    int sample_tokens = 0;             // log.sample_tokens (0: no sample)
    double sample_temperature = 0;
    std::string sample_prompt;
  } log;
  std::string tokenizer;        // data.tokenizer (empty: byte-level)
  CheckpointSchedule checkpoints;  // checkpoint.dir and every

  static JobOptions FromConfig(const config::JobConfig& config);

  // The optimizer over `range` of `layout`'s space: fresh from `init`, or
  // resumed (OptimizerShard::InitOrResume).
  StatusOr<std::unique_ptr<OptimizerShard>> MakeOptimizer(const ParamLayout& layout, ParamRange range,
                                                          const std::optional<VerifiedCheckpoint>& resume_from) const {
    return OptimizerShard::InitOrResume(optimizer, init, layout, range, resume_from);
  }
};

// The job's optimizer block, with a schedule of `total_steps` steps.
OptimizerOptions OptimizerOptionsOf(const config::OptimizerConfig& optimizer, int64_t total_steps);

}  // namespace herd
