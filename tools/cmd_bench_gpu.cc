// herd bench gpu [CONFIG] [--set path=value ...] [--steps N] [--warmup K] [--fp32]
//                [--peak-tflops 989] [--python python3] [--torch-modes eager,compile|none]
//                [--torch-device cuda]
//   Single-GPU training throughput: herd's CUDA step (cuda::DeviceTrainer,
//   everything resident on the device) on synthetic tokens, then the same
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
#include "worker/cuda/device_trainer.h"
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
// device-resident trainer on synthetic tokens, each timed to the device's
// end (the schedule's total_steps becomes their number).
StatusOr<GpuBenchResult> TimeDeviceSteps(cuda::DeviceTrainer::Options trainer, int steps, int warmup, uint64_t seed,
                                         double init_std) {
  trainer.optimizer.schedule.total_steps = warmup + steps;
  if (trainer.device >= cuda::DeviceCount()) {
    return Status::FailedPrecondition("bench gpu: this process sees no CUDA device " + std::to_string(trainer.device) +
                                      " (driver, CUDA_VISIBLE_DEVICES?)");
  }
  const int64_t free_before = cuda::DeviceFreeBytes(trainer.device);
  HERD_ASSIGN_OR_RETURN(std::unique_ptr<cuda::DeviceTrainer> device, cuda::DeviceTrainer::Create(trainer));
  const ParamLayout layout(trainer.shape);
  const int64_t P = layout.size();
  GpuBenchResult result;
  result.parameters = layout.num_parameters();
  result.device_name = device->Describe();
  {
    std::vector<float> weights(P), zeros(P, 0.0f);
    InitParameters(layout, seed, init_std, weights.data());
    device->SetState(weights.data(), zeros.data(), zeros.data());
  }
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
    double norm = 0, lr = 0;
    const double loss = device->Step({inputs.data()}, {targets.data()}, s, &norm, &lr);
    if (s == 0) {
      result.device_bytes = free_before - cuda::DeviceFreeBytes(trainer.device);
      result.loss_first = loss;
    }
    device->Synchronize();  // the clock covers whole steps, back to back
    if (s >= warmup) step_s.push_back(clock.Seconds());
    result.loss_last = loss;
    if (!std::isfinite(loss)) {
      return Status::FailedPrecondition("bench gpu: the loss is not finite at step " + std::to_string(s + 1));
    }
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

}  // namespace

int RunBenchGpu(int argc, char** argv) {
  Args args({"set", "steps", "warmup", "peak-tflops", "python", "torch-modes", "torch-device"}, {"fp32"});
  Status st = args.Parse(argc, argv);
  if (!st.ok()) return ReportError(st.WithContext("bench gpu: "));
  if (args.positional().size() > 1) {
    return ReportError(Status::InvalidArgument(
        "usage: herd bench gpu [CONFIG] [--set path=value ...] [--steps N] [--warmup K] [--fp32] "
        "[--peak-tflops 989] [--python python3] [--torch-modes eager,compile]"));
  }
  auto config = args.positional().empty() ? ParseJobConfig(kSmolLm135m, "SmolLM-135M shape", args.GetAll("set"))
                                          : LoadJobConfig(args.positional()[0], args.GetAll("set"));
  if (!config.ok()) return ReportError(config.status());
  auto steps = args.GetInt("steps", 20, 1);
  auto warmup = args.GetInt("warmup", 5, 1);
  if (!steps.ok()) return ReportError(steps.status());
  if (!warmup.ok()) return ReportError(warmup.status());
  const double peak_tflops = std::atof(args.Get("peak-tflops", "989").c_str());
  if (!(peak_tflops > 0)) return ReportError(Status::InvalidArgument("--peak-tflops: must be > 0"));
  const bool bf16 = !args.Has("fp32");
  const auto& m = config->model();
  const auto& train = config->train();
  const int B = train.batch_size(), T = train.seq_len();
  const double flops_per_token = TrainingFlopsPerToken(LlamaShape::FromConfig(m), T);
#if !HERD_HAVE_CUDA
  (void)B;
  (void)flops_per_token;
  return ReportError(Status::FailedPrecondition("bench gpu: this herd was built without CUDA"));
#else
  cuda::DeviceTrainer::Options trainer = cuda::DeviceTrainer::Options::FromConfig(*config, /*device=*/0);
  trainer.bf16 = bf16;  // --fp32, whatever the config's device.dtype
  std::fprintf(stderr, "bench gpu: herd, %d x %d tokens, %s, %lld + %lld steps\n", B, T, bf16 ? "bf16" : "fp32",
               static_cast<long long>(*warmup), static_cast<long long>(*steps));
  auto r = TimeDeviceSteps(trainer, static_cast<int>(*steps), static_cast<int>(*warmup), train.seed(),
                           m.initializer_range());
  if (!r.ok()) return ReportError(r.status());
  const double herd_tps = B * T / r->median_step_s;
  nlohmann::json ours = {{"bench", "gpu"},
                         {"impl", "herd"},
                         {"dtype", bf16 ? "bf16" : "fp32"},
                         {"device", r->device_name},
                         {"parameters", r->parameters},
                         {"batch", B},
                         {"seq", T},
                         {"steps", *steps},
                         {"tokens_per_s", herd_tps},
                         {"step_s", r->median_step_s},
                         {"flops_per_token", flops_per_token},
                         {"mfu", herd_tps * flops_per_token / (peak_tflops * 1e12)},
                         {"device_bytes", r->device_bytes},
                         {"loss_first", r->loss_first},
                         {"loss_last", r->loss_last}};
  std::printf("%s\n", ours.dump().c_str());
  std::fflush(stdout);

  // The anchor: the same shape in PyTorch, same GPU, same run.
  const std::string modes = args.Get("torch-modes", "eager,compile");
  if (modes == "none") return 0;
  std::string cmd = ShellQuote(args.Get("python", "python3")) + " " + ShellQuote(TorchScript()) + " --device " +
                    ShellQuote(args.Get("torch-device", "cuda")) + " --dtype " + (bf16 ? "bf16" : "fp32") +
                    " --modes " + ShellQuote(modes);
  const std::vector<std::pair<const char*, long long> > shape = {{"vocab", m.vocab_size()},
                                                                 {"hidden", m.hidden_size()},
                                                                 {"ffn", m.intermediate_size()},
                                                                 {"layers", m.num_hidden_layers()},
                                                                 {"heads", m.num_attention_heads()},
                                                                 {"kv-heads", m.num_key_value_heads()},
                                                                 {"tied", m.tie_word_embeddings()},
                                                                 {"batch", B},
                                                                 {"seq", T},
                                                                 {"steps", *steps},
                                                                 {"warmup", *warmup}};
  for (const auto& [flag, value] : shape) cmd += std::string(" --") + flag + " " + std::to_string(value);
  cmd += " --peak-tflops " + std::to_string(peak_tflops);
  std::fprintf(stderr, "bench gpu: %s\n", cmd.c_str());
  std::FILE* out = ::popen(cmd.c_str(), "r");
  if (out == nullptr) return ReportError(Status::IOError("bench gpu: cannot run " + cmd));
  nlohmann::json summary = {{"bench", "gpu"}, {"summary", "herd tokens/s over PyTorch's"}, {"herd_mfu", ours["mfu"]}};
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
#endif
}

}  // namespace herd::tools
