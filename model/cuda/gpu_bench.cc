#include "model/cuda/gpu_bench.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/clock.h"
#include "common/rng.h"
#include "model/cuda/check.h"
#include "model/cuda/cublaslt_loader.h"
#include "model/cuda/kernels.h"
#include "model/cuda/llama_cuda.h"
#include "model/cuda/staged_model.h"
#include "model/optim/adamw.h"
#include "model/param_layout.h"

namespace herd::cuda {
namespace {

template <typename T>
StatusOr<GpuBenchResult> Run(const GpuBenchOptions& o) {
  HERD_CUDA_CHECK(cudaSetDevice(o.device));
  cudaStream_t stream;
  HERD_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  size_t free_before = 0, total = 0;
  HERD_CUDA_CHECK(cudaMemGetInfo(&free_before, &total));
  GpuBenchResult result;
  {
    CudaLlamaModel<T> model(o.shape, o.batch, o.seq_len, stream);
    const ParamLayout& layout = model.layout();
    const int64_t P = layout.size();
    result.parameters = layout.num_parameters();
    std::vector<float> host(P);
    InitParameters(layout, o.seed, o.init_std, host.data());
    float *master, *grads, *m, *v;
    double* partials;
    T* compute = nullptr;
    const int64_t chunks = SumOfSquaresChunks(P);
    HERD_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&master), P * 4));
    HERD_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&grads), P * 4));
    HERD_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&m), P * 4));
    HERD_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&v), P * 4));
    HERD_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&partials), chunks * 8));
    if constexpr (!std::is_same_v<T, float>) HERD_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&compute), P * 2));
    HERD_CUDA_CHECK(cudaMemcpy(master, host.data(), P * 4, cudaMemcpyHostToDevice));
    HERD_CUDA_CHECK(cudaMemset(m, 0, P * 4));
    HERD_CUDA_CHECK(cudaMemset(v, 0, P * 4));
    std::vector<double> host_partials(chunks);

    // AdamW runs per run of equal decay (the tensors' order alternates).
    std::vector<DecaySegment> runs;
    for (const DecaySegment& s : DecaySegments(layout, 0, P)) {
      if (!runs.empty() && runs.back().decay == s.decay && runs.back().end == s.begin)
        runs.back().end = s.end;
      else
        runs.push_back(s);
    }
    const AdamWOptions adamw = AdamWOptions::FromConfig(o.optimizer);
    const int N = o.batch * o.seq_len;
    const int total_steps = o.warmup + o.steps;
    Rng rng(o.seed);
    std::vector<int32_t> inputs(N), targets(N);
    std::vector<double> step_s;
    for (int t = 0; t < total_steps; ++t) {
      for (int i = 0; i < N; ++i) {
        inputs[i] = static_cast<int32_t>(rng.Below(o.shape.vocab_size));
        targets[i] = static_cast<int32_t>(rng.Below(o.shape.vocab_size));
      }
      HERD_CUDA_CHECK(cudaStreamSynchronize(stream));
      Stopwatch clock;
      const T* params;
      if constexpr (std::is_same_v<T, float>) {
        params = master;
      } else {
        Convert(compute, master, P, stream);
        params = compute;
      }
      HERD_CUDA_CHECK(cudaMemsetAsync(grads, 0, P * 4, stream));
      const double loss = model.Forward(params, inputs.data(), targets.data(), o.batch, o.seq_len);
      model.Backward(params, grads, 1.0 / N);
      SumOfSquaresPartials(partials, grads, P, stream);
      HERD_CUDA_CHECK(cudaMemcpyAsync(host_partials.data(), partials, chunks * 8, cudaMemcpyDeviceToHost, stream));
      HERD_CUDA_CHECK(cudaStreamSynchronize(stream));
      double squares = 0;
      for (double p : host_partials) squares += p;
      const double lr = LearningRate(o.optimizer, total_steps, t);
      const double bc1 = 1.0 - std::pow(adamw.beta1, t + 1.0), bc2 = 1.0 - std::pow(adamw.beta2, t + 1.0);
      for (const DecaySegment& s : runs) {
        const AdamWScalars k{static_cast<float>(adamw.beta1),
                             static_cast<float>(1.0 - adamw.beta1),
                             static_cast<float>(adamw.beta2),
                             static_cast<float>(1.0 - adamw.beta2),
                             static_cast<float>(lr / bc1),
                             static_cast<float>(std::sqrt(bc2)),
                             static_cast<float>(adamw.eps),
                             s.decay ? static_cast<float>(1.0 - lr * adamw.weight_decay) : 1.0f,
                             static_cast<float>(ClipCoefficient(std::sqrt(squares), o.optimizer.clip_norm()))};
        AdamW(master + s.begin, grads + s.begin, m + s.begin, v + s.begin, s.end - s.begin, k, stream);
      }
      HERD_CUDA_CHECK(cudaStreamSynchronize(stream));
      HERD_CUDA_CHECK_LAUNCH();
      if (t == 0) result.loss_first = loss;
      result.loss_last = loss;
      if (t >= o.warmup) step_s.push_back(clock.Seconds());
      if (!std::isfinite(loss))
        return Status::FailedPrecondition("bench gpu: the loss is not finite at step " + std::to_string(t + 1));
    }
    size_t free_after = 0;
    HERD_CUDA_CHECK(cudaMemGetInfo(&free_after, &total));
    result.device_bytes = static_cast<int64_t>(free_before) - static_cast<int64_t>(free_after);
    for (void* p : {static_cast<void*>(master), static_cast<void*>(grads), static_cast<void*>(m), static_cast<void*>(v),
                    static_cast<void*>(partials), static_cast<void*>(compute)})
      cudaFree(p);
    std::vector<double> sorted = step_s;
    std::sort(sorted.begin(), sorted.end());
    result.median_step_s = sorted.empty() ? 0 : sorted[sorted.size() / 2];
    double sum = 0;
    for (double s : step_s) sum += s;
    result.mean_step_s = step_s.empty() ? 0 : sum / step_s.size();
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, o.device) == cudaSuccess) result.device_name = prop.name;
  HERD_CUDA_CHECK(cudaStreamDestroy(stream));
  return result;
}

}  // namespace

StatusOr<GpuBenchResult> RunGpuTrainBench(const GpuBenchOptions& o) {
  if (DeviceCount() == 0) return Status::FailedPrecondition("bench gpu: no CUDA device is visible");
#if !defined(HERD_CUDA_EMULATION)
  std::string missing;
  if (!CublasLtAvailable(&missing)) return Status::FailedPrecondition("bench gpu: " + missing);
#endif
  const std::string why = CudaLlamaModel<float>::CheckShape(o.shape);
  if (!why.empty()) return Status::InvalidArgument("bench gpu: " + why);
  return o.bf16 ? Run<__nv_bfloat16>(o) : Run<float>(o);
}

}  // namespace herd::cuda
