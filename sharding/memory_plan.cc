#include "sharding/memory_plan.h"

#include <algorithm>

#include "common/memory.h"
#include "model/cuda/device_memory.h"
#include "model/llama.h"
#include "sharding/weight_window.h"

namespace herd {

const ProcessMemory& MemoryPlan::largest() const {
  return *std::max_element(processes.begin(), processes.end(),
                           [](const ProcessMemory& a, const ProcessMemory& b) { return a.total() < b.total(); });
}

int64_t MemoryPlan::JobTotal(int workers) const {
  int64_t total = 0;
  for (const ProcessMemory& p : processes) total += p.role == "worker" ? workers * p.total() : p.total();
  return total;
}

Status CheckJobFitsHere(const config::JobConfig& config, const std::string& what) {
  HERD_ASSIGN_OR_RETURN(MemoryPlan plan, PlanMemory(config));
  return CheckFitsInMemory(plan.JobTotal(config.cluster().workers()), what);
}

StatusOr<MemoryPlan> PlanMemory(const config::JobConfig& config) {
  const LlamaShape shape = LlamaShape::FromConfig(config.model());
  const ParamLayout layout(shape);
  const auto& cluster = config.cluster();
  const auto& train = config.train();
  const int64_t P = layout.size(), f32 = sizeof(float);
  const int W = cluster.workers();
  const bool bf16 = cluster.wire_dtype() == config::ClusterConfig::BF16;
  const int wire = bf16 ? 2 : 4;
  const int64_t activations =
      LlamaModel<float>::ActivationBytes(shape, train.batch_size(), train.seq_len(), RecomputeFromConfig(train),
                                         MicroBatchSlots(config)) +
      2 * static_cast<int64_t>(train.batch_size()) * train.seq_len() * static_cast<int64_t>(sizeof(int32_t));
  MemoryPlan plan;
  plan.parameters = layout.num_parameters();
  // A CUDA worker: activations on the GPU, a page-locked gradient staging
  // buffer on the host.
  const bool gpu = config.device().kind() == config::DeviceConfig::CUDA;
  const bool gpu_bf16 = config.device().dtype() == config::DeviceConfig::BF16;
  const bool streamed = cluster.stream_weights();
  int64_t gpu_bytes = 0;
  if (gpu && streamed) {
    gpu_bytes = cuda::StreamedGpuWorkerDeviceBytes(shape, train.batch_size(), train.seq_len(), gpu_bf16,
                                                   RecomputeFromConfig(train), train.grad_accum() > 1);
  } else if (gpu) {
    gpu_bytes = cuda::GpuWorkerDeviceBytes(shape, train.batch_size(), train.seq_len(), gpu_bf16,
                                           RecomputeFromConfig(train));
  }
  const int64_t host_activations = gpu ? 0 : activations;
  // Streamed, the page-locked staging is a ring each way.
  const int64_t staging = !gpu ? 0 : streamed ? 2 * cuda::kStagingSlots * cuda::kStagingSlotFloats * f32 : P * f32;

  if (cluster.sync() == config::ClusterConfig::PARAMETER_SERVER) {
    HERD_ASSIGN_OR_RETURN(ShardPlan shards, ShardPlan::Create(layout, ShardPlanOptions::FromConfig(cluster)));
    for (int s = 0; s < shards.num_servers(); ++s) {
      ProcessMemory m;
      m.role = "server";
      m.rank = s;
      m.range = shards.shard(s);
      const int64_t n = m.range.size();
      int64_t bucket = 0;
      for (const Bucket& b : shards.buckets()) {
        if (b.server == s) bucket = std::max(bucket, b.range.size());
      }
      m.weights = n * f32;
      m.optimizer = 2 * n * f32;
      m.gradients = n * f32;
      // Worker 0's fp32 gradients land in the accumulator; the others (all
      // of them with bf16) in a receive buffer each.
      m.buffers = (bf16 ? n * 2 : 0) + (W - (bf16 ? 0 : 1)) * bucket * wire;
      // A background checkpoint's snapshot of weights, m and v.
      if (!config.checkpoint().dir().empty() && config.checkpoint().background()) m.buffers += 3 * n * f32;
      m.runtime = kRuntimeBytes;
      plan.processes.push_back(m);
    }
    ProcessMemory w;
    w.role = "worker";
    w.range = {0, P};
    w.weights = P * f32;
    w.gradients = P * f32;
    w.activations = host_activations;
    w.buffers = (bf16 ? P * 2 : 0) + staging;
    if (streamed) {
      // The window at its fullest, replayed through the worker's own policy
      // (on a CPU, gradients whole until the last micro-batch unless one
      // layer-major pass serves them all: MicroBatchSlots; a GPU keeps the
      // micro-batches' sum itself and declares each unit final one unit
      // late); each bucket boundary may keep one shared page of weights,
      // gradients and staging backed.
      const StreamedPeak peak =
          ReplayStreamedStep(shards, layout, cluster.stream_prefetch_layers(), wire,
                             !gpu && train.grad_accum() > MicroBatchSlots(config), /*final_lag=*/gpu ? 1 : 0);
      w.weights = peak.weights;
      w.gradients = peak.gradients;
      w.buffers = peak.staging + staging +
                  static_cast<int64_t>(shards.buckets().size() + 1) * (bf16 ? 3 : 2) * kPageBytes;
    }
    w.device = gpu_bytes;
    w.runtime = kRuntimeBytes;
    plan.processes.push_back(w);
    return plan;
  }
  ProcessMemory t;
  t.role = cluster.sync() == config::ClusterConfig::NONE ? "trainer" : "worker";
  t.range = {0, P};
  t.weights = P * f32;
  t.gradients = P * f32;
  t.optimizer = 2 * P * f32 / (cluster.zero_stage() == 1 ? W : 1);
  t.activations = host_activations;
  t.buffers = staging;
  t.device = gpu_bytes;
  t.runtime = kRuntimeBytes;
  if (gpu && t.role == "trainer") {
    // One process on a GPU keeps the whole step there (cuda::DeviceTrainer);
    // the host holds the state only to load and checkpoint it.
    t.gradients = 0;
    t.buffers = 0;
    t.device = cuda::DeviceTrainerDeviceBytes(shape, train.batch_size(), train.seq_len(),
                                              config.device().dtype() == config::DeviceConfig::BF16,
                                              RecomputeFromConfig(train));
  }
  plan.processes.push_back(t);
  return plan;
}

bool FitsBudget(const MemoryPlan& plan, int64_t bytes, int64_t gpu_bytes) {
  const double usable = 1.0 - kBudgetHeadroom;
  for (const ProcessMemory& p : plan.processes) {
    if (p.total() > bytes * usable || (gpu_bytes > 0 && p.device > gpu_bytes * usable)) return false;
  }
  return true;
}

StatusOr<config::JobConfig> LargestFitting(const config::JobConfig& config, int64_t bytes, int64_t gpu_bytes) {
  auto fits = [&](int layers) -> StatusOr<bool> {
    config::JobConfig c = config;
    c.mutable_model()->set_num_hidden_layers(layers);
    HERD_ASSIGN_OR_RETURN(MemoryPlan plan, PlanMemory(c));
    return FitsBudget(plan, bytes, gpu_bytes);
  };
  HERD_ASSIGN_OR_RETURN(bool one, fits(1));
  if (!one) return Status::NotFound("not even one layer of this width fits in " + std::to_string(bytes) + " bytes");
  // Memory grows with depth: double, then bisect.
  int lo = 1, hi = 2;
  for (;;) {
    HERD_ASSIGN_OR_RETURN(bool ok, fits(hi));
    if (!ok) break;
    lo = hi;
    if (hi > (1 << 20)) break;
    hi *= 2;
  }
  while (hi - lo > 1) {
    const int mid = lo + (hi - lo) / 2;
    HERD_ASSIGN_OR_RETURN(bool ok, fits(mid));
    (ok ? lo : hi) = mid;
  }
  config::JobConfig best = config;
  best.mutable_model()->set_num_hidden_layers(lo);
  return best;
}

}  // namespace herd
