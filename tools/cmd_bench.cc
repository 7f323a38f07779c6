// herd bench train CONFIG [--set ...] [--steps N] [--warmup K]
//   Training throughput of one process on synthetic tokens (no data file):
//   forward + backward + the one-process trainer's optimizer step (norm,
//   clip, AdamW: LocalSync's). One JSON line. bench/train_throughput.py
//   runs it next to PyTorch.
#include <omp.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <vector>

#include "common/clock.h"
#include "common/config.h"
#include "common/logging.h"
#include "common/rng.h"
#include "model/llama.h"
#include "model/optim/optimizer_shard.h"
#include "sharding/job_options.h"
#include "tools/args.h"
#include "tools/commands.h"
#include "worker/reducers/local_sync.h"

namespace herd::tools {
namespace {

int BenchTrain(int argc, char** argv) {
  Args args({"set", "steps", "warmup"}, {});
  Status st = args.Parse(argc, argv);
  if (!st.ok()) return ReportError(st.WithContext("bench train: "));
  if (args.positional().size() != 1) {
    return ReportError(Status::InvalidArgument("usage: herd bench train CONFIG [--set path=value ...] [--steps N] [--warmup K]"));
  }
  auto config = LoadJobConfig(args.positional()[0], args.GetAll("set"));
  if (!config.ok()) return ReportError(config.status());
  auto steps = args.GetInt("steps", 10, 1);
  auto warmup = args.GetInt("warmup", 2, 0);
  if (!steps.ok()) return ReportError(steps.status());
  if (!warmup.ok()) return ReportError(warmup.status());
  const auto& train = config->train();
  if (train.threads() > 0) omp_set_num_threads(train.threads());
  const LlamaShape shape = LlamaShape::FromConfig(config->model());
  const int B = train.batch_size(), T = train.seq_len(), A = train.grad_accum();
  LlamaModel<float> model(shape, B, T);
  const ParamLayout& layout = model.layout();
  const int64_t P = layout.size();
  const int64_t total_steps = *steps + *warmup;
  // The one-process trainer's optimizer step (LocalSync): global norm,
  // clipping, the schedule and AdamW over the whole space, in place.
  std::vector<float> params(P), grads(P);
  // The deterministic initialisation (no checkpoint.init_from), with the
  // schedule over the bench's steps.
  JobOptions job = JobOptions::FromConfig(*config);
  job.optimizer.schedule.total_steps = total_steps;
  job.init.init_from.clear();
  auto shard = job.MakeOptimizer(layout, {0, P}, std::nullopt);
  if (!shard.ok()) return ReportError(shard.status().WithContext("bench train: "));
  std::unique_ptr<SyncStrategy> optimizer = CreateLocalSync(std::move(*shard), params.data());
  Rng rng(train.seed());
  std::vector<int32_t> tokens(static_cast<size_t>(B) * (T + 1));
  std::vector<int32_t> inputs(static_cast<size_t>(B) * T), targets(inputs.size());

  double forward_s = 0, backward_s = 0, optimizer_s = 0, total_s = 0;
  for (int64_t t = 0; t < total_steps; ++t) {
    const bool timed = t >= *warmup;
    Stopwatch step_clock;
    std::fill(grads.begin(), grads.end(), 0.0f);
    double loss = 0;
    for (int micro = 0; micro < A; ++micro) {
      for (int32_t& tok : tokens) tok = static_cast<int32_t>(rng.Below(shape.vocab_size));
      for (int b = 0; b < B; ++b) {
        std::copy_n(tokens.begin() + b * (T + 1), T, inputs.begin() + b * T);
        std::copy_n(tokens.begin() + b * (T + 1) + 1, T, targets.begin() + b * T);
      }
      Stopwatch sw;
      loss += model.Forward(params.data(), inputs.data(), targets.data(), B, T);
      if (timed) forward_s += sw.Seconds();
      sw.Reset();
      model.Backward(params.data(), grads.data(), 1.0 / (static_cast<double>(B) * T * A));
      if (timed) backward_s += sw.Seconds();
    }
    Stopwatch sw;
    optimizer->BeginStep(grads.data(), {static_cast<uint64_t>(t), /*share=*/0, {}});
    st = optimizer->FinishStep(loss / A);
    if (!st.ok()) return ReportError(st.WithContext("bench train: step " + std::to_string(t + 1) + ": "));
    if (timed) {
      optimizer_s += sw.Seconds();
      total_s += step_clock.Seconds();
    }
  }
  const double timed_tokens = static_cast<double>(*steps) * B * T * A;
  std::printf(
      "{\"bench\": \"train\", \"impl\": \"herd\", \"config\": \"%s\", \"parameters\": %lld, \"threads\": %d, "
      "\"batch\": %d, \"seq_len\": %d, \"steps\": %lld, \"tokens_per_s\": %.1f, \"step_s\": %.6f, "
      "\"forward_s\": %.6f, \"backward_s\": %.6f, \"optimizer_s\": %.6f}\n",
      args.positional()[0].c_str(), static_cast<long long>(layout.num_parameters()), omp_get_max_threads(), B, T,
      static_cast<long long>(*steps), timed_tokens / total_s, total_s / *steps, forward_s / *steps, backward_s / *steps,
      optimizer_s / *steps);
  return 0;
}

}  // namespace

int RunBench(int argc, char** argv) {
  if (argc >= 2 && std::string(argv[1]) == "train") return BenchTrain(argc - 1, argv + 1);
  if (argc >= 2 && std::string(argv[1]) == "transport") return RunBenchTransport(argc - 1, argv + 1);
  if (argc >= 2 && std::string(argv[1]) == "allreduce") return RunBenchAllReduce(argc - 1, argv + 1);
  if (argc >= 2 && std::string(argv[1]) == "compare") return RunBenchCompare(argc - 1, argv + 1);
  if (argc >= 2 && std::string(argv[1]) == "gpu") return RunBenchGpu(argc - 1, argv + 1);
  if (argc >= 2 && std::string(argv[1]) == "memory") return RunBenchMemory(argc - 1, argv + 1);
  return ReportError(Status::InvalidArgument(
      "usage: herd bench train CONFIG [--set ...] [--steps N] [--warmup K]\n"
      "       herd bench transport [--sizes B,...] [--concurrency C,...] [--seconds S] [--paths single-copy,ucx] "
      "[--no-perftest]\n"
      "       herd bench compare CONFIG [--set ...] [--steps N] [--warmup K] [--servers S] [--json]\n"
      "       herd bench gpu [CONFIG] [--set ...] [--steps N] [--warmup K] [--fp32] [--peak-tflops 989] "
      "[--python python3] [--torch-modes eager,compile|none]\n"
      "       herd bench memory [--mb M] [--threads N] [--reps R]\n"
      "       herd bench allreduce --rank R --world W --coordinator HOST:PORT [--sizes B,...] [--iters N]"));
}

}  // namespace herd::tools
