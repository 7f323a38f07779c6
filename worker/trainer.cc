#include "worker/trainer.h"

#include <glog/logging.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <vector>

#include "common/clock.h"
#include "common/config.h"
#include "common/file_util.h"
#include "data/prepare.h"
#include "data/sampler.h"
#include "data/token_file.h"
#include "model/checkpoint.h"
#include "model/cuda/device_trainer.h"
#include "model/hf_io.h"
#include "model/optim/adamw.h"
#include "model/optim/optimizer_shard.h"
#include "sharding/memory_plan.h"
#include "worker/evaluate.h"
#include "worker/model_factory.h"
#include "worker/progress_log.h"

namespace herd {

Status TrainSingleProcess(const config::JobConfig& config, const TrainOptions& options) {
  const auto& train = config.train();
  if (train.threads() > 0) omp_set_num_threads(train.threads());
  const LlamaShape shape = LlamaShape::FromConfig(config.model());
  const int B = train.batch_size(), T = train.seq_len(), A = train.grad_accum();
  // Refusals before anything is prepared, allocated or written.
  HERD_RETURN_IF_ERROR(CheckJobFitsHere(config, "this job (herd plan)"));
  const std::string& ckpt_dir = config.checkpoint().dir();
  if (!ckpt_dir.empty()) HERD_RETURN_IF_ERROR(CheckWritable(ckpt_dir));
  if (!options.resume) HERD_RETURN_IF_ERROR(CheckFreshRun(ckpt_dir, options.overwrite));

  // Data.
  HERD_ASSIGN_OR_RETURN(JobData data, OpenJobData(config.data(), shape.vocab_size));
  const TokenFile& train_file = data.train;
  const std::unique_ptr<TokenFile>& val_file = data.val;
  HERD_ASSIGN_OR_RETURN(DistributedSampler sampler,
                        DistributedSampler::Create(train_file, T, /*world_size=*/1, /*rank=*/0, train.seed()));
  HERD_RETURN_IF_ERROR(sampler.CheckBatch(B).WithContext("train.batch_size: "));

  // Model state: weights, gradients, AdamW moments over the flat space.
  // On a GPU the whole step runs there (cuda::DeviceTrainer: weights, AdamW
  // state and gradients resident); on the CPU, LlamaModel and model/optim.
  HERD_ASSIGN_OR_RETURN(std::unique_ptr<cuda::DeviceTrainer> gpu, CreateDeviceTrainer(config, LocalRank(0)));
  std::unique_ptr<Model> cpu_model;
  if (!gpu) {
    HERD_ASSIGN_OR_RETURN(cpu_model, CreateModel(config, B, T, 0));
  }
  Model& model = gpu ? gpu->evaluator() : *cpu_model;
  const ParamLayout& layout = model.layout();
  const int64_t P = layout.size();
  std::vector<float> grads(gpu ? 0 : P, 0.0f);  // the GPU keeps its own

  std::optional<VerifiedCheckpoint> resume_from;
  if (options.resume) {
    if (ckpt_dir.empty()) return Status::InvalidArgument("--resume needs checkpoint.dir to be set");
    HERD_ASSIGN_OR_RETURN(resume_from, LatestVerifiedCheckpoint(ckpt_dir));
    HERD_RETURN_IF_ERROR(CheckSameRun(resume_from->dir, config));
  }
  // The whole space's optimizer state; any number of shards (a
  // parameter-server checkpoint too) assembles into it.
  HERD_ASSIGN_OR_RETURN(std::unique_ptr<OptimizerShard> optimizer,
                        OptimizerShard::InitOrResume(config, layout, {0, P}, resume_from));
  if (resume_from) {
    HERD_ASSIGN_OR_RETURN(std::string loader, ReadFile(JoinPath(resume_from->dir, WorkerFileName(0))));
    HERD_RETURN_IF_ERROR(sampler.RestoreState(loader).WithContext(resume_from->dir + ": "));
    std::printf("resumed from %s (step %lld)\n", resume_from->dir.c_str(),
                static_cast<long long>(optimizer->step()));
  } else if (!config.checkpoint().init_from().empty()) {
    std::printf("initial weights from %s\n", config.checkpoint().init_from().c_str());
  }

  ProgressLog log;
  HERD_RETURN_IF_ERROR(log.Open(config.log().metrics(), options.resume));
  std::printf("model: %.2fM parameters (%d layers, d=%d, %d heads, %d kv heads, vocab %d) | %s\n",
              layout.num_parameters() / 1e6, shape.num_layers, shape.hidden_size, shape.num_heads, shape.num_kv_heads,
              shape.vocab_size, model.Describe().c_str());
  std::printf("data: %s (%lld tokens) | batch %d x %d tokens x %d accum = %lld tokens/step\n",
              config.data().train().c_str(), static_cast<long long>(train_file.size()), B, T, A,
              static_cast<long long>(B) * T * A);
  std::fflush(stdout);

  const int64_t total_steps = train.steps();
  const int64_t tokens_per_step = static_cast<int64_t>(B) * T * A;
  const double loss_scale = 1.0 / static_cast<double>(tokens_per_step);
  // One micro-batch's tokens per slot (the GPU step takes all at once).
  std::vector<std::vector<int32_t>> inputs(A, std::vector<int32_t>(static_cast<size_t>(B) * T)), targets = inputs;
  std::vector<const int32_t*> input_ptrs, target_ptrs;
  for (int a = 0; a < A; ++a) {
    input_ptrs.push_back(inputs[a].data());
    target_ptrs.push_back(targets[a].data());
  }
  OptimizerShard& state = *optimizer;
  if (gpu) gpu->SetState(state.weights(), state.m(), state.v());

  auto save_checkpoint = [&](int64_t step) -> Status {
    const std::string step_dir = StepDirName(ckpt_dir, step);
    Stopwatch sw;
    if (gpu) gpu->GetState(state.weights(), state.m(), state.v());
    HERD_RETURN_IF_ERROR(WriteSingleShardCheckpoint(step_dir, config, state.view(), sampler.SaveState()));
    std::printf("checkpoint: %s (%.1fs)\n", step_dir.c_str(), sw.Seconds());
    std::fflush(stdout);
    return Status::OK();
  };

  Stopwatch run_clock, window_clock;
  int64_t window_tokens = 0;
  const int64_t stop_at = options.LastStep(total_steps);
  for (int64_t t = state.step(); t < stop_at; ++t) {
    for (int micro = 0; micro < A; ++micro) sampler.NextBatch(B, inputs[micro].data(), targets[micro].data());
    double loss = 0, lr = 0, norm = 0;
    if (gpu) {
      loss = gpu->Step(input_ptrs, target_ptrs, t, &norm, &lr);
      state.EndStep();  // the device holds the state until a checkpoint asks for it
    } else {
      std::fill(grads.begin(), grads.end(), 0.0f);
      for (int micro = 0; micro < A; ++micro) {
        loss += model.Forward(state.weights(), inputs[micro].data(), targets[micro].data(), B, T);
        model.Backward(state.weights(), grads.data(), loss_scale);
      }
      loss /= A;
      norm = std::sqrt(SumOfSquares(grads.data(), P));
      lr = state.Step(grads.data(), norm).lr;
    }
    const int64_t step = state.step();
    window_tokens += tokens_per_step;
    if (!std::isfinite(loss)) {
      return Status::FailedPrecondition("step " + std::to_string(t + 1) + ": loss is " + std::to_string(loss) +
                                        " (diverged; lower optimizer.lr or raise warmup_steps)");
    }

    const bool last = step == stop_at;
    const bool eval_now = last || (config.log().eval_every() > 0 && step % config.log().eval_every() == 0);
    if (step % config.log().every() == 0 || t == 0 || last || eval_now) {
      ProgressLog::Entry e;
      e.step = step;
      e.total_steps = total_steps;
      e.loss = loss;
      e.lr = lr;
      e.grad_norm = norm;
      const double window_s = window_clock.Seconds();
      e.tokens_per_s = window_s > 0 ? window_tokens / window_s : 0;
      e.elapsed_s = run_clock.Seconds();
      e.eta_s = e.tokens_per_s > 0 ? (total_steps - step) * tokens_per_step / e.tokens_per_s : 0;
      if (eval_now) e.val_loss = ValidationLoss(model, state.weights(), val_file.get(), config);
      HERD_RETURN_IF_ERROR(log.Write(e));
      window_clock.Reset();
      window_tokens = 0;
    }
    if (CheckpointDue(config.checkpoint(), step, stop_at)) {
      HERD_RETURN_IF_ERROR(save_checkpoint(step));
    }
  }
  if (!ckpt_dir.empty() && !PathExists(StepDirName(ckpt_dir, state.step()))) {
    HERD_RETURN_IF_ERROR(save_checkpoint(state.step()));  // resumed at the end
  }
  HERD_RETURN_IF_ERROR(log.Close());
  if (state.step() < total_steps) {
    std::printf("stopped at step %lld of %lld (--stop-at); continue with --resume\n",
                static_cast<long long>(state.step()), static_cast<long long>(total_steps));
    return Status::OK();
  }

  PrintSample(model, state.weights(), config);
  std::printf("done: %lld steps in %s\n", static_cast<long long>(state.step()),
              FormatDuration(run_clock.Seconds()).c_str());
  return Status::OK();
}

}  // namespace herd
