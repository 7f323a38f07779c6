// herd bench gpu [CONFIG] [--set path=value ...] [--steps N] [--warmup K] [--fp32]
//                [--peak-tflops 989] [--python python3] [--torch-modes eager,compile|none]
//                [--torch-device cuda]
//   Single-GPU training throughput: herd's CUDA step (model/cuda/gpu_bench.h,
//   everything resident on the device) on synthetic tokens, then the same
//   model in plain PyTorch (bench/torch_train.py: eager and torch.compile,
//   bf16 autocast) on the same GPU in the same run. One JSON line per
//   implementation with tokens_per_s and mfu (6N + 12*L*d*T FLOPs per token
//   over --peak-tflops, 989 = H100/H200 bf16 dense), then one with the
//   ratios. Without CONFIG: SmolLM-135M's shape (d576, 30 layers, 9 heads,
//   3 kv heads, ffn 1536, vocab 49152, tied) at batch 8 x 1024 tokens.
#include <sys/wait.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/file_util.h"
#include "common/logging.h"
#include "common/strings.h"
#include "tools/args.h"
#include "tools/commands.h"
#if HERD_HAVE_CUDA
#include "model/cuda/gpu_bench.h"
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
  const int64_t flops_per_token_attention = 12LL * m.num_hidden_layers() * m.hidden_size() * T;
#if !HERD_HAVE_CUDA
  (void)B;
  (void)flops_per_token_attention;
  return ReportError(Status::FailedPrecondition("bench gpu: this herd was built without CUDA"));
#else
  cuda::GpuBenchOptions o;
  o.trainer = cuda::DeviceTrainer::Options::FromConfig(*config, /*device=*/0);
  o.trainer.bf16 = bf16;  // --fp32, whatever the config's device.dtype
  o.steps = static_cast<int>(*steps);
  o.warmup = static_cast<int>(*warmup);
  o.seed = train.seed();
  o.init_std = m.initializer_range();
  std::fprintf(stderr, "bench gpu: herd, %d x %d tokens, %s, %lld + %lld steps\n", B, T, bf16 ? "bf16" : "fp32",
               static_cast<long long>(*warmup), static_cast<long long>(*steps));
  auto r = cuda::RunGpuTrainBench(o);
  if (!r.ok()) return ReportError(r.status());
  const double flops_per_token = 6.0 * static_cast<double>(r->parameters) + flops_per_token_attention;
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
