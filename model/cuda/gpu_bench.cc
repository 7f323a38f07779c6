#include "model/cuda/gpu_bench.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/clock.h"
#include "common/rng.h"
#include "model/cuda/check.h"
#include "model/cuda/device_trainer.h"
#include "model/param_layout.h"

namespace herd::cuda {

StatusOr<GpuBenchResult> RunGpuTrainBench(const GpuBenchOptions& o) {
  DeviceTrainer::Options t = o.trainer;
  t.total_steps = o.warmup + o.steps;
  size_t free_before = 0, free_after = 0, total = 0;
  HERD_CUDA_CHECK(cudaSetDevice(t.device));
  HERD_CUDA_CHECK(cudaMemGetInfo(&free_before, &total));
  HERD_ASSIGN_OR_RETURN(std::unique_ptr<DeviceTrainer> trainer, DeviceTrainer::Create(t));

  const ParamLayout layout(t.shape);
  const int64_t P = layout.size();
  GpuBenchResult result;
  result.parameters = layout.num_parameters();
  result.device_name = trainer->Describe();
  {
    std::vector<float> weights(P), zeros(P, 0.0f);
    InitParameters(layout, o.seed, o.init_std, weights.data());
    trainer->SetState(weights.data(), zeros.data(), zeros.data());
  }
  const int N = t.batch * t.seq_len;
  Rng rng(o.seed);
  std::vector<int32_t> inputs(N), targets(N);
  std::vector<double> step_s;
  for (int s = 0; s < o.warmup + o.steps; ++s) {
    for (int i = 0; i < N; ++i) {
      inputs[i] = static_cast<int32_t>(rng.Below(t.shape.vocab_size));
      targets[i] = static_cast<int32_t>(rng.Below(t.shape.vocab_size));
    }
    // Step returns with the norm on the host (a synchronisation) but the
    // optimizer still running; the clock covers whole steps back to back.
    Stopwatch clock;
    double norm = 0, lr = 0;
    const double loss = trainer->Step({inputs.data()}, {targets.data()}, s, &norm, &lr);
    if (s == 0) {
      HERD_CUDA_CHECK(cudaMemGetInfo(&free_after, &total));
      result.device_bytes = static_cast<int64_t>(free_before) - static_cast<int64_t>(free_after);
      result.loss_first = loss;
    }
    HERD_CUDA_CHECK(cudaDeviceSynchronize());
    if (s >= o.warmup) step_s.push_back(clock.Seconds());
    result.loss_last = loss;
    if (!std::isfinite(loss)) {
      return Status::FailedPrecondition("bench gpu: the loss is not finite at step " + std::to_string(s + 1));
    }
  }
  std::vector<double> sorted = step_s;
  std::sort(sorted.begin(), sorted.end());
  result.median_step_s = sorted.empty() ? 0 : sorted[sorted.size() / 2];
  double sum = 0;
  for (double x : step_s) sum += x;
  result.mean_step_s = step_s.empty() ? 0 : sum / step_s.size();
  return result;
}

}  // namespace herd::cuda
