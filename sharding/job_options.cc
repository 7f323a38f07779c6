#include "sharding/job_options.h"

#include <algorithm>

namespace herd {
namespace {

Recompute RecomputeOf(const config::TrainConfig& t) {
  switch (t.recompute()) {
    case config::TrainConfig::ATTENTION:
      return Recompute::kAttention;
    case config::TrainConfig::FULL:
      return Recompute::kFull;
    default:
      return Recompute::kNone;
  }
}

int MicroBatchSlotsOf(const config::JobConfig& c) {
  const auto& cl = c.cluster();
  const bool paged_grads = (cl.sync() == config::ClusterConfig::PARAMETER_SERVER && cl.stream_weights()) ||
                           (cl.sync() == config::ClusterConfig::ALLREDUCE && cl.zero_stage() >= 2);
  const bool layer_major =
      paged_grads && !c.model().tie_word_embeddings() && c.device().kind() == config::DeviceConfig::CPU;
  return layer_major ? std::max(1, c.train().grad_accum()) : 1;
}

}  // namespace

OptimizerOptions OptimizerOptionsOf(const config::OptimizerConfig& o, int64_t total_steps) {
  OptimizerOptions options;
  options.adamw = {o.beta1(), o.beta2(), o.eps(), o.weight_decay()};
  options.schedule = {o.lr(), o.min_lr(), o.warmup_steps(), total_steps};
  options.clip_norm = o.clip_norm();
  options.skip_spikes_zscore = o.skip_spikes_zscore();
  options.skip_spikes_window = o.skip_spikes_window();
  return options;
}

JobOptions JobOptions::FromConfig(const config::JobConfig& config) {
  const auto& train = config.train();
  JobOptions o;
  o.shape = LlamaShape::FromConfig(config.model());
  o.batch = train.batch_size();
  o.seq_len = train.seq_len();
  o.grad_accum = train.grad_accum();
  o.recompute = RecomputeOf(train);
  o.micro_batch_slots = MicroBatchSlotsOf(config);
  o.optimizer = OptimizerOptionsOf(config.optimizer(), train.steps());
  o.init.seed = train.seed();
  o.init.initializer_range = config.model().initializer_range();
  o.init.init_from = config.checkpoint().init_from();
  o.init.model = config.model();
  o.steps = train.steps();
  o.seed = train.seed();
  const auto& log = config.log();
  o.log.metrics = log.metrics();
  o.log.tensorboard = log.tensorboard();
  o.log.every = log.every();
  o.log.eval_every = log.eval_every();
  o.log.eval_batches = log.eval_batches();
  o.log.peak_tflops = log.peak_tflops();
  o.log.sample_tokens = log.sample_tokens();
  o.log.sample_temperature = log.sample_temperature();
  o.log.sample_prompt = log.sample_prompt();
  o.tokenizer = config.data().tokenizer();
  o.checkpoints = CheckpointSchedule::Of(config.checkpoint());
  return o;
}

}  // namespace herd
