// What each process of a job will hold, in bytes, before it starts: the
// numbers `herd plan` prints, and the largest model of a config's shape
// that fits a memory budget per process (like DeepSpeed's memory
// estimators, but per process of this job's layout).
//
//   server   fp32 master weights + AdamW m and v + the gradient
//            accumulator for its range, plus wire buffers (a bf16 copy of
//            its weights with bf16 on the wire, and receive buffers for
//            contributions that arrive out of rank order: one bucket per
//            worker that cannot land in place), and with background
//            checkpoints the snapshot of its range (a job of regions': of
//            its outer state too);
//   worker   weights + gradients of the whole model + activations for its
//            micro-batch and sequence length (+ the bf16 staging buffer);
//            with cluster.stream_weights, the weights, gradients and
//            staging of its window at its fullest (sharding/weight_window.h)
//            instead of the whole model's;
//   stage    a pipeline stage's worker (cluster.pipeline_stages): the
//            weights, gradients and AdamW state of its own ranges (the last
//            stage's copy of a tied embedding too), its chunks'
//            activations for the micro-batches its schedule holds at once
//            (sharding/pipeline_schedule.h's ChunkSlots: GPipe all of them,
//            1F1B at most the stages after it), the rings' chunk buffers
//            and the wire's buffers (a message each way, the tied
//            embedding's exchange);
//   single / all-reduce: weights + gradients + AdamW state + activations;
//            under ZeRO the AdamW state of the worker's slices (1/W of
//            it), under ZeRO-2 the gradients of its slices and of the
//            buckets being reduce-scattered (ReplayZero2Gradients), under
//            ZeRO-3 its slices' master weights and the gathered window's
//            weights and gradients at their fullest (ReplayStreamedStep).
// CUDA workers (device.kind CUDA) hold their activations, a compute copy of
// the weights and the gradients on the GPU (`device`, see
// model/cuda/device_memory.h) and a page-locked gradient staging buffer on
// the host (in `buffers`); one process on a GPU keeps weights, AdamW state
// and gradients on the device too (cuda::DeviceTrainer) and only its state
// on the host.
// A checkpoint holds nothing else: every part is written from the arrays
// it holds, and the committer takes the checksum of each part in the shard
// format from its header (model/checkpoint_format.h).
// Every process also carries a fixed runtime (libraries, UCX, allocator),
// kRuntimeBytes, measured on an idle herd-server.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "proto/herd.pb.h"
#include "sharding/shard_plan.h"

namespace herd {

struct ProcessMemory {
  std::string role;  // "server", "worker" (each worker alike), "stage" or "trainer"
  int rank = -1;     // servers: their rank; stages: their place in the pipeline; -1: every worker
  int count = 1;     // processes of the job alike (a stage's replicas); workers: every worker
  ParamRange range;  // the server's range; the whole space otherwise
  int64_t weights = 0, optimizer = 0, gradients = 0, activations = 0, buffers = 0, runtime = 0;
  int64_t device = 0;  // GPU bytes (CUDA workers), not part of total()
  int64_t total() const { return weights + optimizer + gradients + activations + buffers + runtime; }
};

struct MemoryPlan {
  int64_t parameters = 0;
  std::vector<ProcessMemory> processes;  // servers by rank, then workers
  // The process needing the most.
  const ProcessMemory& largest() const;
  // Every process of the job together, each of `workers` workers counted:
  // what one machine needs to run the whole job (`herd launch`).
  int64_t JobTotal(int workers) const;
};

// Fixed per-process overhead (binary, libraries, UCX, allocator pools).
inline constexpr int64_t kRuntimeBytes = 20ll << 20;
// The page size paged buffers (common/paged_buffer.h) work in.
inline constexpr int64_t kPageBytes = 4096;

StatusOr<MemoryPlan> PlanMemory(const config::JobConfig& config);

// Before anything is allocated or started: the whole job's plan
// (JobTotal) against this machine's available memory (common/memory.h);
// one line naming `what` and both figures when it does not fit.
Status CheckJobFitsHere(const config::JobConfig& config, const std::string& what);

// Whether every process of `plan` fits in `bytes` of host memory and, when
// gpu_bytes > 0, every GPU worker in `gpu_bytes` of device memory, with
// kBudgetHeadroom of each left for what a plan cannot see to the byte
// (allocator and page rounding: measured peaks come within 1% of plans).
inline constexpr double kBudgetHeadroom = 0.02;
bool FitsBudget(const MemoryPlan& plan, int64_t bytes, int64_t gpu_bytes);

// The deepest model of the config's width (hidden, intermediate, heads,
// vocab kept; num_hidden_layers scaled) whose every process fits in
// `bytes` of host memory and, when gpu_bytes > 0, every GPU worker in
// `gpu_bytes` of device memory; NotFound when not even one layer fits.
StatusOr<config::JobConfig> LargestFitting(const config::JobConfig& config, int64_t bytes, int64_t gpu_bytes = 0);

}  // namespace herd
