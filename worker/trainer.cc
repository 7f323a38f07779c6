#include "worker/trainer.h"

#include <glog/logging.h>
#include <google/protobuf/util/message_differencer.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <vector>

#include "common/clock.h"
#include "common/config.h"
#include "common/file_util.h"
#include "data/prepare.h"
#include "data/sampler.h"
#include "data/token_file.h"
#include "model/checkpoint.h"
#include "model/llama.h"
#include "model/optim/adamw.h"
#include "worker/evaluate.h"

namespace herd {
namespace {

// Progress lines on stdout and metrics as JSON lines.
class ProgressLog {
 public:
  Status Open(const std::string& metrics_path, bool append) {
    if (metrics_path.empty()) return Status::OK();
    const std::string dir = DirName(metrics_path);
    HERD_RETURN_IF_ERROR(MakeDirs(dir).WithContext("log.metrics: "));
    metrics_ = std::fopen(metrics_path.c_str(), append ? "a" : "w");
    if (metrics_ == nullptr) return Status::IOError("log.metrics: " + metrics_path + ": cannot open for writing");
    return Status::OK();
  }
  ~ProgressLog() {
    if (metrics_ != nullptr) std::fclose(metrics_);
  }

  struct Entry {
    int64_t step = 0, total_steps = 0;
    double loss = 0, lr = 0, grad_norm = 0, tokens_per_s = 0, eta_s = 0, elapsed_s = 0;
    double val_loss = NAN;
  };

  void Write(const Entry& e) {
    std::printf("step %6lld/%lld | loss %.4f | lr %.2e | norm %.3f | %8.0f tok/s | eta %s",
                static_cast<long long>(e.step), static_cast<long long>(e.total_steps), e.loss, e.lr, e.grad_norm,
                e.tokens_per_s, FormatDuration(e.eta_s).c_str());
    if (!std::isnan(e.val_loss)) std::printf(" | val %.4f", e.val_loss);
    std::printf("\n");
    std::fflush(stdout);
    if (metrics_ != nullptr) {
      std::fprintf(metrics_,
                   "{\"step\": %lld, \"loss\": %.17g, \"lr\": %.17g, \"grad_norm\": %.17g, \"tokens_per_s\": %.6g, "
                   "\"elapsed_s\": %.6g",
                   static_cast<long long>(e.step), e.loss, e.lr, e.grad_norm, e.tokens_per_s, e.elapsed_s);
      if (!std::isnan(e.val_loss)) std::fprintf(metrics_, ", \"val_loss\": %.17g", e.val_loss);
      std::fprintf(metrics_, "}\n");
      std::fflush(metrics_);
    }
  }

 private:
  std::FILE* metrics_ = nullptr;
};

// Fails early, before any training, if checkpoints could not be written.
Status CheckWritable(const std::string& dir) {
  HERD_RETURN_IF_ERROR(MakeDirs(dir).WithContext("checkpoint.dir: "));
  const std::string probe = JoinPath(dir, ".herd_write_probe." + std::to_string(::getpid()));
  std::FILE* f = std::fopen(probe.c_str(), "w");
  if (f == nullptr) return Status::IOError("checkpoint.dir: " + dir + ": not writable");
  std::fclose(f);
  ::unlink(probe.c_str());
  return Status::OK();
}

// A checkpoint only continues the job it came from: same model shape.
Status CheckSameModel(const std::string& step_dir, const config::JobConfig& config) {
  const std::string path = JoinPath(step_dir, "config.textproto");
  HERD_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  HERD_ASSIGN_OR_RETURN(config::JobConfig saved, ParseJobConfig(text, path));
  std::string diff;
  google::protobuf::util::MessageDifferencer differ;
  differ.set_message_field_comparison(google::protobuf::util::MessageDifferencer::EQUIVALENT);
  // Metadata kept for export, not part of the shape: an imported model
  // continues under a config that does not repeat it.
  differ.IgnoreField(config::ModelConfig::descriptor()->FindFieldByName("max_position_embeddings"));
  differ.ReportDifferencesToString(&diff);
  if (!differ.Compare(saved.model(), config.model())) {
    while (!diff.empty() && diff.back() == '\n') diff.pop_back();
    std::replace(diff.begin(), diff.end(), '\n', ';');
    return Status::FailedPrecondition(step_dir + ": checkpoint was written for a different model (" + diff + ")");
  }
  return Status::OK();
}

std::string TokensToText(const std::vector<int32_t>& tokens) {
  std::string text;
  for (int32_t t : tokens) text.push_back(static_cast<char>(t & 0xff));
  return text;
}

}  // namespace

Status TrainSingleProcess(const config::JobConfig& config, const TrainOptions& options) {
  const auto& train = config.train();
  const auto& opt = config.optimizer();
  if (train.threads() > 0) omp_set_num_threads(train.threads());
  const LlamaShape shape = LlamaShape::FromConfig(config.model());
  const int B = train.batch_size(), T = train.seq_len(), A = train.grad_accum();

  // Data.
  HERD_RETURN_IF_ERROR(EnsurePrepared(config.data()));
  HERD_ASSIGN_OR_RETURN(TokenFile train_file, TokenFile::Open(config.data().train(), shape.vocab_size));
  std::unique_ptr<TokenFile> val_file;
  if (!config.data().val().empty()) {
    HERD_ASSIGN_OR_RETURN(TokenFile val, TokenFile::Open(config.data().val(), shape.vocab_size));
    val_file = std::make_unique<TokenFile>(std::move(val));
  }
  HERD_ASSIGN_OR_RETURN(DistributedSampler sampler,
                        DistributedSampler::Create(train_file, T, /*world_size=*/1, /*rank=*/0, train.seed()));
  HERD_RETURN_IF_ERROR(sampler.CheckBatch(B).WithContext("train.batch_size: "));

  // Model state: weights, gradients, AdamW moments over the flat space.
  LlamaModel<float> model(shape, B, T);
  const ParamLayout& layout = model.layout();
  const int64_t P = layout.size();
  ShardState state;
  state.begin = 0;
  state.end = P;
  std::vector<float> grads(P, 0.0f);

  const std::string& ckpt_dir = config.checkpoint().dir();
  if (!ckpt_dir.empty()) HERD_RETURN_IF_ERROR(CheckWritable(ckpt_dir));
  if (options.resume) {
    if (ckpt_dir.empty()) return Status::InvalidArgument("--resume needs checkpoint.dir to be set");
    HERD_ASSIGN_OR_RETURN(std::string step_dir, LatestCheckpoint(ckpt_dir));
    HERD_RETURN_IF_ERROR(CheckSameModel(step_dir, config));
    HERD_ASSIGN_OR_RETURN(state, ReadShard(JoinPath(step_dir, ShardFileName(0))));
    if (state.begin != 0 || state.end != P) {
      return Status::FailedPrecondition(step_dir + ": checkpoint holds [" + std::to_string(state.begin) + ", " +
                                        std::to_string(state.end) + ") but this model has " + std::to_string(P) +
                                        " elements (different model shape?)");
    }
    HERD_ASSIGN_OR_RETURN(std::string loader, ReadFile(JoinPath(step_dir, WorkerFileName(0))));
    HERD_RETURN_IF_ERROR(sampler.RestoreState(loader).WithContext(step_dir + ": "));
    std::printf("resumed from %s (step %lld)\n", step_dir.c_str(), static_cast<long long>(state.step));
  } else {
    state.weights.resize(P);
    state.m.assign(P, 0.0f);
    state.v.assign(P, 0.0f);
    InitParameters(layout, train.seed(), config.model().initializer_range(), state.weights.data());
    if (!ckpt_dir.empty() && HasCheckpoints(ckpt_dir)) {
      LOG(WARNING) << "checkpoint.dir " << ckpt_dir
                   << " already holds checkpoints; starting from scratch (pass --resume to continue)";
    }
  }

  ProgressLog log;
  HERD_RETURN_IF_ERROR(log.Open(config.log().metrics(), options.resume));
  std::printf("model: %.2fM parameters (%d layers, d=%d, %d heads, %d kv heads, vocab %d) | %d threads\n",
              layout.num_parameters() / 1e6, shape.num_layers, shape.hidden_size, shape.num_heads,
              shape.num_kv_heads, shape.vocab_size, omp_get_max_threads());
  std::printf("data: %s (%lld tokens) | batch %d x %d tokens x %d accum = %lld tokens/step\n",
              config.data().train().c_str(), static_cast<long long>(train_file.size()), B, T, A,
              static_cast<long long>(B) * T * A);
  std::fflush(stdout);

  const std::vector<DecaySegment> segments = DecaySegments(layout, 0, P);
  const AdamWOptions adamw = AdamWOptions::FromConfig(opt);
  const int64_t total_steps = train.steps();
  const int64_t tokens_per_step = static_cast<int64_t>(B) * T * A;
  const double loss_scale = 1.0 / static_cast<double>(tokens_per_step);
  std::vector<int32_t> inputs(static_cast<size_t>(B) * T), targets(inputs.size());

  auto save_checkpoint = [&](int64_t step) -> Status {
    const std::string step_dir = StepDirName(ckpt_dir, step);
    Stopwatch sw;
    HERD_RETURN_IF_ERROR(WriteSingleShardCheckpoint(step_dir, config, state, sampler.SaveState()));
    std::printf("checkpoint: %s (%.1fs)\n", step_dir.c_str(), sw.Seconds());
    std::fflush(stdout);
    return Status::OK();
  };
  auto evaluate = [&]() -> double {
    if (val_file == nullptr) return NAN;
    auto r = EvaluateLoss(model, state.weights.data(), *val_file, B, T, config.log().eval_batches());
    if (!r.ok()) {
      LOG(WARNING) << "evaluation skipped: " << r.status().message();
      return NAN;
    }
    return r->loss;
  };

  Stopwatch run_clock, window_clock;
  int64_t window_tokens = 0;
  const int64_t stop_at = options.stop_at_step > 0 ? std::min(options.stop_at_step, total_steps) : total_steps;
  for (int64_t t = state.step; t < stop_at; ++t) {
    std::fill(grads.begin(), grads.end(), 0.0f);
    double loss = 0;
    for (int micro = 0; micro < A; ++micro) {
      sampler.NextBatch(B, inputs.data(), targets.data());
      loss += model.Forward(state.weights.data(), inputs.data(), targets.data(), B, T);
      model.Backward(state.weights.data(), grads.data(), loss_scale);
    }
    loss /= A;
    const double lr = LearningRate(opt, total_steps, t);
    const double norm = ClipAndAdamWStep(segments, 0, P, state.weights.data(), grads.data(), state.m.data(),
                                         state.v.data(), t + 1, lr, opt.clip_norm(), adamw);
    state.step = t + 1;
    window_tokens += tokens_per_step;
    if (!std::isfinite(loss)) {
      return Status::FailedPrecondition("step " + std::to_string(t + 1) + ": loss is " + std::to_string(loss) +
                                        " (diverged; lower optimizer.lr or raise warmup_steps)");
    }

    const bool last = state.step == stop_at;
    const bool eval_now = last || (config.log().eval_every() > 0 && state.step % config.log().eval_every() == 0);
    if (state.step % config.log().every() == 0 || t == 0 || last || eval_now) {
      ProgressLog::Entry e;
      e.step = state.step;
      e.total_steps = total_steps;
      e.loss = loss;
      e.lr = lr;
      e.grad_norm = norm;
      const double window_s = window_clock.Seconds();
      e.tokens_per_s = window_s > 0 ? window_tokens / window_s : 0;
      e.elapsed_s = run_clock.Seconds();
      e.eta_s = e.tokens_per_s > 0 ? (total_steps - state.step) * tokens_per_step / e.tokens_per_s : 0;
      if (eval_now) e.val_loss = evaluate();
      log.Write(e);
      window_clock.Reset();
      window_tokens = 0;
    }
    const int64_t every = config.checkpoint().every();
    if (!ckpt_dir.empty() && (last || (every > 0 && state.step % every == 0))) {
      HERD_RETURN_IF_ERROR(save_checkpoint(state.step));
    }
  }
  if (!ckpt_dir.empty() && !PathExists(StepDirName(ckpt_dir, state.step))) {
    HERD_RETURN_IF_ERROR(save_checkpoint(state.step));  // e.g. steps: 0, or resumed at the end
  }
  if (state.step < total_steps) {
    std::printf("stopped at step %lld of %lld (--stop-at); continue with --resume\n",
                static_cast<long long>(state.step), static_cast<long long>(total_steps));
    return Status::OK();
  }

  if (config.log().sample_tokens() > 0 && shape.vocab_size >= 256) {
    std::vector<int32_t> prompt;
    for (unsigned char c : config.log().sample_prompt()) prompt.push_back(c);
    std::vector<int32_t> out = Generate(model, state.weights.data(), prompt, config.log().sample_tokens(),
                                        config.log().sample_temperature(), train.seed());
    std::printf("sample (temperature %.2f):\n%s\n", config.log().sample_temperature(), TokensToText(out).c_str());
  }
  std::printf("done: %lld steps in %s\n", static_cast<long long>(state.step), FormatDuration(run_clock.Seconds()).c_str());
  return Status::OK();
}

}  // namespace herd
