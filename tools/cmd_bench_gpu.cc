// herd bench gpu [CONFIG] [--set path=value ...] [--steps N] [--warmup K] [--fp32]
//                [--peak-tflops 989] [--python python3] [--torch-modes eager,compile|none]
//                [--torch-device cuda]
//   Single-GPU training throughput: herd's CUDA step (the single-process
//   trainer's, everything resident on the device) on synthetic tokens, then the same
//   model in plain PyTorch (bench/torch_train.py: eager and torch.compile,
//   bf16 autocast) on the same GPU in the same run. One JSON line per
//   implementation with tokens_per_s and mfu (6N + 12*L*d*T FLOPs per token
//   over --peak-tflops, 989 = H100/H200 bf16 dense), then one with the
//   ratios. Without CONFIG: SmolLM-135M's shape (d576, 30 layers, 9 heads,
//   3 kv heads, ffn 1536, vocab 49152, tied) at batch 8 x 1024 tokens.
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/file_util.h"
#include "common/logging.h"
#include "common/strings.h"
#include "model/param_layout.h"
#include "tools/args.h"
#include "tools/commands.h"
#if HERD_HAVE_CUDA
#include "common/clock.h"
#include "common/rng.h"
#include "model/cuda/staged_model.h"
#include "model/optim/optimizer_shard.h"
#include "sharding/job_options.h"
#include "worker/cuda/device_trainer.h"
#include "worker/reducers/device_resident_sync.h"
#endif

namespace herd::tools {
namespace {

constexpr char kSmolLm135m[] = R"(
model { vocab_size: 49152 hidden_size: 576 intermediate_size: 1536 num_hidden_layers: 30
        num_attention_heads: 9 num_key_value_heads: 3 tie_word_embeddings: true rope_theta: 10000 }
train { batch_size: 8 seq_len: 1024 seed: 0 }
optimizer { lr: 3e-4 min_lr: 3e-5 warmup_steps: 5 weight_decay: 0.1 beta1: 0.9 beta2: 0.95 clip_norm: 1.0 }
device { kind: CUDA dtype: BF16 }
)";

#if HERD_HAVE_CUDA
struct GpuBenchResult {
  std::string device_name;
  double median_step_s = 0;
  double loss_first = 0, loss_last = 0;
  int64_t parameters = 0;    // without padding; tied embeddings once
  int64_t device_bytes = 0;  // allocated by the run: state + activations
};

// herd's side of the measurement: `warmup` + `steps` whole steps of the
// single-process GPU trainer (DeviceResidentSync: the device's forward,
// backward and AdamW with the host optimizer's numbers) on synthetic
// tokens, each timed to the device's end (the schedule's total_steps
// becomes their number).
StatusOr<GpuBenchResult> TimeDeviceSteps(const config::JobConfig& config, cuda::DeviceTrainer::Options trainer,
                                         int steps, int warmup) {
  if (trainer.device >= cuda::DeviceCount()) {
    return Status::FailedPrecondition("bench gpu: this process sees no CUDA device " + std::to_string(trainer.device) +
                                      " (driver, CUDA_VISIBLE_DEVICES?)");
  }
  const int64_t free_before = cuda::DeviceFreeBytes(trainer.device);
  HERD_ASSIGN_OR_RETURN(std::unique_ptr<cuda::DeviceTrainer> created, cuda::DeviceTrainer::Create(trainer));
  cuda::DeviceTrainer* device = created.get();
  const ParamLayout layout(trainer.shape);
  const int64_t P = layout.size();
  GpuBenchResult result;
  result.parameters = layout.num_parameters();
  result.device_name = device->Describe();
  // The deterministic initialisation (no checkpoint.init_from), with the
  // schedule over the bench's steps.
  JobOptions job = JobOptions::FromConfig(config);
  job.optimizer.schedule.total_steps = warmup + steps;
  job.init.init_from.clear();
  std::vector<float> weights(P);
  HERD_ASSIGN_OR_RETURN(std::unique_ptr<OptimizerSlices> optimizer,
                        OptimizerSlices::InitOrResume(job.optimizer, job.init, layout, {{0, P}}, std::nullopt,
                                                      weights.data()));
  DeviceResidentSync sync(nullptr, std::move(created), std::move(optimizer), weights.data(), {});
  const uint64_t seed = config.train().seed();
  const int N = trainer.batch * trainer.seq_len;
  Rng rng(seed);
  std::vector<int32_t> inputs(N), targets(N);
  std::vector<double> step_s;
  for (int s = 0; s < warmup + steps; ++s) {
    for (int i = 0; i < N; ++i) {
      inputs[i] = static_cast<int32_t>(rng.Below(trainer.shape.vocab_size));
      targets[i] = static_cast<int32_t>(rng.Below(trainer.shape.vocab_size));
    }
    Stopwatch clock;
    const std::string at = "bench gpu: step " + std::to_string(s + 1) + ": ";
    StatusOr<double> stepped = sync.ComputeStep({inputs.data()}, {targets.data()});
    if (!stepped.ok()) return stepped.status().WithContext(at);
    const double loss = *stepped;
    HERD_RETURN_IF_ERROR(CheckNotDiverged("loss", loss).WithContext(at));
    if (s == 0) {
      result.device_bytes = free_before - cuda::DeviceFreeBytes(trainer.device);
      result.loss_first = loss;
    }
    device->Synchronize();  // the clock covers whole steps, back to back
    if (s >= warmup) step_s.push_back(clock.Seconds());
    result.loss_last = loss;
  }
  std::sort(step_s.begin(), step_s.end());
  result.median_step_s = step_s.empty() ? 0 : step_s[step_s.size() / 2];
  return result;
}
#endif

// bench/torch_train.py from an installed tree (share/herd/bench) or the
// source tree this herd was built from.
std::string TorchScript() {
  const std::string installed = JoinPath(DirName(DirName(ThisExecutable())), "share/herd/bench/torch_train.py");
  if (PathExists(installed)) return installed;
  return JoinPath(HERD_SOURCE_DIR, "bench/torch_train.py");
}

// What the bench measures, as the command line and config give it.
struct GpuBenchRun {
  config::JobConfig config;
  int64_t steps = 0, warmup = 0;
  double peak_tflops = 0;
  bool bf16 = true;
  int batch() const { return config.train().batch_size(); }
  int seq() const { return config.train().seq_len(); }
};

#if HERD_HAVE_CUDA
// herd's JSON line.
nlohmann::json HerdLine(const GpuBenchRun& run, const GpuBenchResult& r, double flops_per_token) {
  const double tokens_per_s = run.batch() * run.seq() / r.median_step_s;
  return {{"bench", "gpu"},
          {"impl", "herd"},
          {"dtype", run.bf16 ? "bf16" : "fp32"},
          {"device", r.device_name},
          {"parameters", r.parameters},
          {"batch", run.batch()},
          {"seq", run.seq()},
          {"steps", run.steps},
          {"tokens_per_s", tokens_per_s},
          {"step_s", r.median_step_s},
          {"flops_per_token", flops_per_token},
          {"mfu", tokens_per_s * flops_per_token / (run.peak_tflops * 1e12)},
          {"device_bytes", r.device_bytes},
          {"loss_first", r.loss_first},
          {"loss_last", r.loss_last}};
}
#endif

// The command that runs the anchor: the same shape in PyTorch.
std::string TorchCommand(const Args& args, const GpuBenchRun& run, const std::string& modes) {
  const auto& m = run.config.model();
  std::string cmd = ShellQuote(args.Get("python", "python3")) + " " + ShellQuote(TorchScript()) + " --device " +
                    ShellQuote(args.Get("torch-device", "cuda")) + " --dtype " + (run.bf16 ? "bf16" : "fp32") +
                    " --modes " + ShellQuote(modes);
  const std::vector<std::pair<const char*, long long> > shape = {{"vocab", m.vocab_size()},
                                                                 {"hidden", m.hidden_size()},
                                                                 {"ffn", m.intermediate_size()},
                                                                 {"layers", m.num_hidden_layers()},
                                                                 {"heads", m.num_attention_heads()},
                                                                 {"kv-heads", m.num_key_value_heads()},
                                                                 {"tied", m.tie_word_embeddings()},
                                                                 {"batch", run.batch()},
                                                                 {"seq", run.seq()},
                                                                 {"steps", run.steps},
                                                                 {"warmup", run.warmup}};
  for (const auto& [flag, value] : shape) cmd += std::string(" --") + flag + " " + std::to_string(value);
  return cmd + " --peak-tflops " + std::to_string(run.peak_tflops);
}

// Runs the anchor and prints its lines, then the ratios to `ours`.
int CompareWithTorch(const std::string& cmd, const nlohmann::json& ours) {
  std::fprintf(stderr, "bench gpu: %s\n", cmd.c_str());
  std::FILE* out = ::popen(cmd.c_str(), "r");
  if (out == nullptr) return ReportError(Status::IOError("bench gpu: cannot run " + cmd));
  nlohmann::json summary = {{"bench", "gpu"}, {"summary", "herd tokens/s over PyTorch's"}, {"herd_mfu", ours["mfu"]}};
  const double herd_tps = ours["tokens_per_s"].get<double>();
  char line[8192];
  while (std::fgets(line, sizeof line, out) != nullptr) {
    nlohmann::json theirs = nlohmann::json::parse(line, nullptr, false);
    if (theirs.is_discarded() || !theirs.is_object()) continue;
    theirs["bench"] = "gpu";
    std::printf("%s\n", theirs.dump().c_str());
    std::fflush(stdout);
    if (theirs.contains("tokens_per_s") && theirs["tokens_per_s"].get<double>() > 0) {
      summary["vs_" + theirs.value("impl", std::string("pytorch"))] = herd_tps / theirs["tokens_per_s"].get<double>();
    }
  }
  const int rc = ::pclose(out);
  if (rc != 0) {
    return ReportError(Status::Internal("bench gpu: the PyTorch reference failed (exit " +
                                        std::to_string(WEXITSTATUS(rc)) + "): " + cmd));
  }
  std::printf("%s\n", summary.dump().c_str());
  return 0;
}

// The run the command line asks for; errors name the flag.
StatusOr<GpuBenchRun> ParseRun(const Args& args) {
  if (args.positional().size() > 1) {
    return Status::InvalidArgument(
        "usage: herd bench gpu [CONFIG] [--set path=value ...] [--steps N] [--warmup K] [--fp32] "
        "[--peak-tflops 989] [--python python3] [--torch-modes eager,compile]");
  }
  GpuBenchRun run;
  HERD_ASSIGN_OR_RETURN(run.config, args.positional().empty()
                                        ? ParseJobConfig(kSmolLm135m, "SmolLM-135M shape", args.GetAll("set"))
                                        : LoadJobConfig(args.positional()[0], args.GetAll("set")));
  HERD_ASSIGN_OR_RETURN(run.steps, args.GetInt("steps", 20, 1));
  HERD_ASSIGN_OR_RETURN(run.warmup, args.GetInt("warmup", 5, 1));
  run.peak_tflops = std::atof(args.Get("peak-tflops", "989").c_str());
  if (!(run.peak_tflops > 0)) return Status::InvalidArgument("--peak-tflops: must be > 0");
  run.bf16 = !args.Has("fp32");
  return run;
}

}  // namespace

int RunBenchGpu(int argc, char** argv) {
  Args args({"set", "steps", "warmup", "peak-tflops", "python", "torch-modes", "torch-device"}, {"fp32"});
  Status st = args.Parse(argc, argv);
  if (!st.ok()) return ReportError(st.WithContext("bench gpu: "));
  StatusOr<GpuBenchRun> run = ParseRun(args);
  if (!run.ok()) return ReportError(run.status());
#if !HERD_HAVE_CUDA
  return ReportError(Status::FailedPrecondition("bench gpu: this herd was built without CUDA"));
#else
  const double flops_per_token = TrainingFlopsPerToken(LlamaShape::FromConfig(run->config.model()), run->seq());
  // --fp32 or not, whatever the config's device.dtype.
  cuda::DeviceTrainer::Options trainer =
      cuda::DeviceTrainer::Options::ForJob(JobOptions::FromConfig(run->config), run->bf16, /*device=*/0);
  std::fprintf(stderr, "bench gpu: herd, %d x %d tokens, %s, %lld + %lld steps\n", run->batch(), run->seq(),
               run->bf16 ? "bf16" : "fp32", static_cast<long long>(run->warmup), static_cast<long long>(run->steps));
  auto r = TimeDeviceSteps(run->config, trainer, static_cast<int>(run->steps), static_cast<int>(run->warmup));
  if (!r.ok()) return ReportError(r.status());
  const nlohmann::json ours = HerdLine(*run, *r, flops_per_token);
  std::printf("%s\n", ours.dump().c_str());
  std::fflush(stdout);
  // The anchor: the same shape in PyTorch, same GPU, same run.
  const std::string modes = args.Get("torch-modes", "eager,compile");
  if (modes == "none") return 0;
  return CompareWithTorch(TorchCommand(args, *run, modes), ours);
#endif
}

}  // namespace herd::tools
