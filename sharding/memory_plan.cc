#include "sharding/memory_plan.h"

#include <algorithm>
#include <optional>

#include "common/config.h"
#include "common/memory.h"
#include "common/ring_memory.h"
#include "model/cuda/device_memory.h"
#include "model/llama.h"
#include "model/optim/block_quantizer.h"
#include "sharding/diloco_plan.h"
#include "sharding/grid.h"
#include "sharding/job_options.h"
#include "sharding/pipeline_plan.h"
#include "sharding/tensor_slices.h"
#include "sharding/weight_window.h"

namespace herd {

const ProcessMemory& MemoryPlan::largest() const {
  return *std::max_element(processes.begin(), processes.end(),
                           [](const ProcessMemory& a, const ProcessMemory& b) { return a.total() < b.total(); });
}

int64_t MemoryPlan::JobTotal(int workers) const {
  int64_t total = 0;
  for (const ProcessMemory& p : processes) total += (p.role == "worker" ? workers : p.count) * p.total();
  return total;
}

Status CheckJobFitsHere(const config::JobConfig& config, const std::string& what) {
  HERD_ASSIGN_OR_RETURN(MemoryPlan plan, PlanMemory(config));
  return CheckFitsInMemory(plan.JobTotal(config.cluster().workers()), what);
}

namespace {

constexpr int64_t kF32 = sizeof(float);  // bytes of an fp32 element

// What every process's figures are made from: the model's layout, the
// wire format, and what one worker's step holds on either device.
struct JobSizes {
  explicit JobSizes(const config::JobConfig& c)
      : config(c),
        cluster(c.cluster()),
        train(c.train()),
        job(JobOptions::FromConfig(c)),
        shape(job.shape),
        layout(shape),
        P(layout.size()),
        W(cluster.workers()),
        bf16(cluster.wire_dtype() == config::ClusterConfig::BF16),
        wire(bf16 ? 2 : 4),
        gpu(c.device().kind() == config::DeviceConfig::CUDA),
        streamed(cluster.stream_weights()),
        windowed(WorkersHoldAWindow(c)) {
    const int64_t activations =
        LlamaModel<float>::ActivationBytes(shape, train.batch_size(), train.seq_len(), job.recompute,
                                           job.micro_batch_slots, {}, false,
                                           TokenSplit{1, std::max(1, cluster.context_parallel())}) +
        2 * static_cast<int64_t>(train.batch_size()) * train.seq_len() * static_cast<int64_t>(sizeof(int32_t));
    const bool gpu_bf16 = config.device().dtype() == config::DeviceConfig::BF16;
    if (gpu && windowed) {
      gpu_bytes = cuda::StreamedGpuWorkerDeviceBytes(shape, train.batch_size(), train.seq_len(), gpu_bf16,
                                                     job.recompute, train.grad_accum() > 1);
    } else if (gpu) {
      cuda::CudaModelPart part;
      part.context_ranks = std::max(1, cluster.context_parallel());
      gpu_bytes = cuda::GpuWorkerDeviceBytes(shape, train.batch_size(), train.seq_len(), gpu_bf16, job.recompute, part);
    }
    // A CUDA worker: activations on the GPU, a page-locked gradient staging
    // buffer on the host; with a window, the staging is a ring each way.
    host_activations = gpu ? 0 : activations;
    staging = !gpu ? 0 : windowed ? 2 * cuda::kStagingSlots * cuda::kStagingSlotFloats * kF32 : P * kF32;
  }

  const config::JobConfig& config;
  const config::ClusterConfig& cluster;
  const config::TrainConfig& train;
  const JobOptions job;
  const LlamaShape shape;
  const ParamLayout layout;
  const int64_t P;  // elements of the flat parameter space
  const int W;      // workers
  const bool bf16;  // on the wire
  const int wire;   // bytes per wire element
  const bool gpu, streamed, windowed;
  int64_t gpu_bytes = 0;         // a worker's device memory
  int64_t host_activations = 0;  // a worker's activations in host memory
  int64_t staging = 0;           // a CUDA worker's page-locked gradient staging
};

// Server s: its range's weights, AdamW state and accumulator, and wire buffers.
ProcessMemory ServerMemory(const JobSizes& j, const ShardPlan& shards, int s) {
  ProcessMemory m;
  m.role = "server";
  m.rank = s;
  m.range = shards.shard(s);
  const int64_t n = m.range.size();
  int64_t bucket = 0;
  for (const Bucket& b : shards.buckets()) {
    if (b.server == s) bucket = std::max(bucket, b.range.size());
  }
  m.weights = n * kF32;
  m.optimizer = 2 * n * kF32;
  // A bucket's first contributor's gradients land where the sum starts
  // (fp32: the sum; bf16: a bf16 copy of the range, which is the sum of a
  // bucket of one contributor) but in an elastic job; the others' in a
  // receive buffer each. A tensor-parallel rank's part has its replicas'
  // workers alone. bf16: the outgoing weights' copy too.
  const int contributors = j.W / std::max(1, j.cluster.tensor_parallel()) / Regions(j.config);
  const bool elastic = j.cluster.elastic();
  const bool fp32_sum = !j.bf16 || elastic || contributors > 1;
  m.gradients = fp32_sum ? n * kF32 : 0;
  m.buffers = (j.bf16 ? n * 2 : 0) + (j.bf16 && !elastic ? n * 2 : 0) +
              (contributors - (elastic ? 0 : 1)) * bucket * j.wire;
  // A background checkpoint's snapshot of weights, m and v (a job of
  // regions: and of the outer weights, momentum and kept error).
  if (!j.config.checkpoint().dir().empty() && j.config.checkpoint().background()) {
    m.buffers += (Regions(j.config) > 1 ? 6 : 3) * n * kF32;
  }
  // A job of regions: the outer step's weights and momentum (and the kept
  // error of a rounded or quantised wire); for the longest fragment, the
  // regions' sum, this server's contribution as it travels, the outer
  // wire's copy of it and the other regions' contributions it may hold
  // (kOuterHeldPerRegion each); the buffers of the region's
  // ring.
  if (const int R = Regions(j.config); R > 1) {
    const config::DilocoConfig& d = j.cluster.diloco();
    const bool exact = d.wire_dtype() == config::DilocoConfig::FP32;
    m.optimizer += (exact ? 2 : 3) * n * kF32;
    auto diloco = DilocoPlan::Make(d, shards, j.config.train().steps());
    const int64_t longest = diloco.ok() ? diloco->LongestRun(s) : n;  // a plan the job refuses: its whole range
    const int64_t contribution = ContributionBytes(d.wire_dtype(), longest);
    m.buffers += longest * kF32 + (2 + kOuterHeldPerRegion * (R - 1)) * contribution +
                 kRingChunksAhead * kRingChunkBytes;
  }
  m.runtime = kRuntimeBytes;
  return m;
}

// A parameter-server worker: the whole model's weights and gradients, or
// with cluster.stream_weights its window's at the fullest.
ProcessMemory PsWorkerMemory(const JobSizes& j, const ShardPlan& shards) {
  ProcessMemory w;
  w.role = "worker";
  w.range = {0, j.P};
  w.weights = j.P * kF32;
  w.gradients = j.P * kF32;
  w.activations = j.host_activations;
  w.buffers = (j.bf16 ? j.P * 2 : 0) + j.staging;
  if (j.streamed) {
    // The window at its fullest, replayed through the worker's own policy
    // (on a CPU, gradients whole until the last micro-batch unless one
    // layer-major pass serves them all: micro_batch_slots; a GPU keeps the
    // micro-batches' sum itself and declares each unit final one unit
    // late); each bucket boundary may keep one shared page of weights,
    // gradients and staging backed.
    const StreamedPeak peak = ReplayStreamedStep(shards, j.layout, ReplayOfJob(j.config, j.job.micro_batch_slots));
    w.weights = peak.weights;
    w.gradients = peak.gradients;
    w.buffers = peak.staging + j.staging +
                static_cast<int64_t>(shards.buckets().size() + 1) * (j.bf16 ? 3 : 2) * kPageBytes;
  }
  // A context-parallel worker's rings (the job's and its group's: the
  // model's gathers), their chunks sent ahead of it.
  if (j.cluster.context_parallel() > 1) w.buffers += 2 * kRingChunksAhead * kRingChunkBytes;
  w.device = j.gpu_bytes;
  w.runtime = kRuntimeBytes;
  return w;
}

// A collective reducer's state under ZeRO over a space of `layout` (the
// flat one, or a tensor-parallel rank's packed one), cut among the workers
// of a shard group (data replicas and context ranks of the same
// placement): the moments of worker 0's slices (the largest), under ZeRO-2
// on a CPU the gradients its policy holds at most, under ZeRO-3 the
// window's weights and gradients at their fullest beside its slices'
// master weights.
Status AddZeroState(const JobSizes& j, const ParamLayout& layout, ProcessMemory* t) {
  const Grid grid = Grid::FromConfig(j.config);
  const int group = grid.degree(Axis::kShard) * grid.degree(Axis::kContext);
  HERD_ASSIGN_OR_RETURN(ShardPlan plan, CollectivePlan(layout, j.cluster, group));
  int64_t owned = 0;
  for (const ParamRange& r : OwnedSlices(plan, group, 0)) owned += r.size();
  t->optimizer = 2 * owned * kF32;
  // Each bucket boundary may keep a shared page of each paged buffer backed.
  const int64_t boundary_pages = static_cast<int64_t>(plan.buckets().size() + 1) * kPageBytes;
  const bool accumulates = j.train.grad_accum() > j.job.micro_batch_slots;
  if (j.cluster.zero_stage() == 2 && !j.gpu && !accumulates) {
    // Gradients whole until the last micro-batch, unless a layer-major
    // pass serves them all.
    t->gradients = ReplayZero2Gradients(plan, layout, group, 0) + 2 * boundary_pages;
  } else if (j.cluster.zero_stage() == 3) {
    // The window at its fullest, replayed through the worker's policy,
    // a retired bucket keeping this worker's slice of its gradients; the
    // slices' master weights beside it.
    StreamedReplay replay = ReplayOfJob(j.config, j.job.micro_batch_slots);
    // A slice that steps as it is reduced lets its gradients go too.
    const bool steps_as_scattered = StepsSlicesAsScattered(j.config);
    for (auto b = plan.buckets().rbegin(); b != plan.buckets().rend(); ++b) {
      replay.kept_on_retire.push_back(steps_as_scattered ? 0 : OwnerParts(*b, group)[0]);
    }
    const StreamedPeak peak = ReplayStreamedStep(plan, layout, replay);
    t->weights = peak.weights + owned * kF32;
    t->gradients = peak.gradients;
    t->buffers += 3 * boundary_pages;
  }
  return Status::OK();
}

// A single process, or an all-reduce worker: the whole model and its
// AdamW state (on the GPU, where the whole step is: StepsOnTheDevice);
// under ZeRO the moments of worker 0's slices (the largest),
// under ZeRO-2 on a CPU the gradients its policy holds at most, under
// ZeRO-3 the window's weights and gradients at their fullest.
StatusOr<ProcessMemory> TrainerMemory(const JobSizes& j) {
  ProcessMemory t;
  t.role = j.cluster.sync() == config::ClusterConfig::NONE ? "trainer" : "worker";
  t.range = {0, j.P};
  t.weights = j.P * kF32;
  t.gradients = j.P * kF32;
  t.optimizer = 2 * j.P * kF32;
  if (t.role == "worker" && j.cluster.zero_stage() > 0) HERD_RETURN_IF_ERROR(AddZeroState(j, j.layout, &t));
  t.activations = j.host_activations;
  t.buffers += j.staging;
  if (j.cluster.sync() == config::ClusterConfig::ALLREDUCE && j.W > 1 && !(j.gpu && j.cluster.nccl())) {
    // Each ring's chunk buffers (common/ring_memory.h): the chunks sent
    // ahead of this worker, and with a bf16 wire its rounded copies being
    // sent. A hybrid worker runs three rings (all, its group, its
    // replicas); a context-parallel one its group's too.
    const int G = ShardGroupSize(j.cluster, j.W);
    const int rings = (G < j.W ? 3 : 1) + (j.cluster.context_parallel() > 1 ? 1 : 0);
    t.buffers += rings * (kRingChunksAhead + (j.bf16 ? kRingChunksInFlight : 0)) * kRingChunkBytes;
  }
  t.device = j.gpu_bytes;
  t.runtime = kRuntimeBytes;
  if (StepsOnTheDevice(j.config)) {
    // The whole step on the GPU (cuda::DeviceTrainer): one process, or
    // DDP and ZeRO over NCCL, the owned slices' moments (worker 0's, the
    // largest) and in bf16 their master weights there; ZeRO-3's compute
    // weights a window of gathered units. The host holds
    // the state only while it loads it and writes a checkpoint of it.
    const int64_t owned = t.role == "worker" && j.cluster.zero_stage() > 0 ? t.optimizer / (2 * kF32) : j.P;
    t.weights = 0;
    t.gradients = 0;
    t.optimizer = 0;
    t.buffers = 0;
    const bool bf16 = j.config.device().dtype() == config::DeviceConfig::BF16;
    t.device = j.cluster.zero_stage() == 3 && t.role == "worker"
                   ? cuda::GatheredTrainerDeviceBytes(j.shape, j.train.batch_size(), j.train.seq_len(), bf16,
                                                      j.job.recompute, j.train.grad_accum() > 1, owned)
                   : cuda::DeviceTrainerDeviceBytes(j.shape, j.train.batch_size(), j.train.seq_len(), bf16,
                                                    j.job.recompute, owned);
  }
  return t;
}

// Each stage's worker of a pipeline (CPU workers; with parameter servers,
// `shards` theirs, the optimizer's state is theirs, and with
// cluster.stream_weights a window over the stage's ranges; with tensor
// parallelism, a rank's packed model over its stage's layers).
// The rings a stage's worker opens (worker/axis_rings.h): the job's, its
// tensor and context groups', and in all-reduce mode its stage's replicas'
// and context ranks' (ZeRO's shard group is the same workers, the same
// ring, but with hybrid sharding, which adds its shard group's and its
// replicas'); over parameter servers none without tensor or context
// parallelism.
int StageRings(const Grid& grid, bool ps) {
  const int tensor = grid.degree(Axis::kTensor), context = grid.degree(Axis::kContext);
  const int groups = (tensor > 1 ? 1 : 0) + (context > 1 ? 1 : 0);
  if (ps) return groups > 0 ? 1 + groups : 0;
  const int shard = grid.degree(Axis::kShard) * context, replicate = grid.degree(Axis::kReplicate);
  return 1 + groups + (shard * replicate > 1 ? 1 : 0) + (shard > 1 && replicate > 1 ? 2 : 0);
}

// ZeRO among stage `d`'s replicas (`zero_plan` cut at the stages' ends):
// the moments of the first shard group rank's slices of its buckets (the
// largest); under ZeRO-3 the window over its ranges at its fullest,
// replayed through its passes, beside the slices' master weights. Its
// micro-batches' gradients add up whole, as without ZeRO, until the last
// one's backward reduce-scatters them.
void AddStageZeroState(const JobSizes& j, const PipelinePlan& pipeline, int d, const ParamLayout& layout,
                       const ShardPlan& zero_plan, ProcessMemory* m) {
  const int group = pipeline.grid.degree(Axis::kShard) * pipeline.grid.degree(Axis::kContext);
  const std::vector<Bucket> buckets = BucketsWithin(zero_plan, pipeline.RangesOf(d, layout));
  int64_t owned = 0;
  for (const ParamRange& r : OwnedSlices(buckets, group, 0)) owned += r.size();
  m->optimizer = 2 * owned * kF32;
  if (j.cluster.zero_stage() != 3) return;
  StreamedReplay replay = ReplayOfJob(j.config, j.job.micro_batch_slots);
  for (const Bucket& b : buckets) replay.kept_on_retire.push_back(OwnerParts(b, group)[0]);
  const StreamedPeak peak = ReplayStreamedStage(zero_plan, layout, replay, StageReplayOf(pipeline, d, layout));
  m->weights = peak.weights + owned * kF32;
  m->gradients = peak.gradients;
  // Each bucket boundary may keep a shared page of each paged buffer backed.
  m->buffers += 3 * static_cast<int64_t>(buckets.size() + 1) * kPageBytes;
}

// A CUDA stage's (model/cuda/stage_model.h) in place of a CPU stage's
// activations: each chunk's slot models and its units on the device; on
// the host each slot's staged activations (`activation` elements) and
// their gradients, in and out. `shape`: the space a stage computes in.
void AddCudaStage(const JobSizes& j, const PipelinePlan& pipeline, int d, const LlamaShape& shape, bool sequence,
                  int64_t activation, ProcessMemory* m) {
  const PipelineSchedule& s = pipeline.schedule;
  const std::vector<int> slots = ChunkSlots(s, d);
  const bool bf16 = j.config.device().dtype() == config::DeviceConfig::BF16;
  m->activations = 0;
  for (int c = 0; c < s.chunks; ++c) {
    const PipelineStage& st = pipeline.split.stage(s.VirtualStage(d, c));
    const cuda::CudaModelPart part{pipeline.grid.degree(Axis::kTensor), sequence, st.layers, 1,
                                   s.kind == PipelineScheduleKind::kZeroBubble};
    m->device += cuda::StageWorkerDeviceBytes(shape, j.train.batch_size(), j.train.seq_len(), bf16, j.job.recompute,
                                              part, slots[c], cuda::StageHeldElements(shape, st.layers));
    m->buffers += 4 * slots[c] * activation * kF32;
  }
}

StatusOr<std::vector<ProcessMemory>> StageMemory(const JobSizes& j, const ShardPlan* shards = nullptr) {
  const bool ps = j.cluster.sync() == config::ClusterConfig::PARAMETER_SERVER;
  HERD_ASSIGN_OR_RETURN(const PipelinePlan pipeline, PipelinePlan::FromConfig(j.config));
  const PipelineSchedule& s = pipeline.schedule;
  const int64_t B = j.train.batch_size(), T = j.train.seq_len();
  LlamaShape shape = j.shape;
  if (const int T = pipeline.grid.degree(Axis::kTensor); T > 1) {
    HERD_ASSIGN_OR_RETURN(const TensorSlices slices, TensorSlices::Make(j.shape, T, 0));
    shape = slices.shape();
  }
  const ParamLayout layout(shape);  // the space a stage's worker computes in
  const int64_t embedding = layout.layer(0).input_norm;
  // A context rank computes (and sends) its chunks' rows alone, a
  // sequence-parallel rank its share of them (rounded up).
  const int C = pipeline.grid.degree(Axis::kContext);
  const int S = j.cluster.sequence_parallel() ? pipeline.grid.degree(Axis::kTensor) : 1;
  const int64_t activation = (B * (T / C) + S - 1) / S * j.shape.hidden_size;
  const bool wire_bf16 = j.cluster.pipeline_wire_dtype() == config::ClusterConfig::BF16;
  // ZeRO among a stage's replicas: its buckets, cut at the stages' ends.
  std::optional<ShardPlan> zero_plan;
  if (!ps && j.cluster.zero_stage() > 0) {
    HERD_ASSIGN_OR_RETURN(zero_plan, AllReducePlan(j.config));
  }
  std::vector<ProcessMemory> out;
  for (int d = 0; d < s.devices; ++d) {
    ProcessMemory m;
    m.role = "stage";
    m.rank = d;
    m.count = pipeline.grid.size() / s.devices;
    const std::vector<int> slots = ChunkSlots(s, d);
    int64_t held = 0;
    for (int c = 0; c < s.chunks; ++c) {
      const PipelineStage& st = pipeline.split.stage(s.VirtualStage(d, c));
      m.activations += LlamaModel<float>::ActivationBytes(shape, B, T, j.job.recompute, slots[c], st.layers,
                                                          s.kind == PipelineScheduleKind::kZeroBubble,
                                                          TokenSplit{S, C});
      if (c == 0) m.range.begin = st.params.begin;
      m.range.end = st.params.end;
    }
    const bool tied_end = shape.tie_word_embeddings && s.devices > 1 && (d == 0 || d == s.devices - 1);
    // Its own ranges (the last stage's copy of a tied embedding too).
    const std::vector<ParamRange> ranges = pipeline.RangesOf(d, layout);
    for (const ParamRange& r : ranges) held += r.size();
    m.weights = held * kF32;
    m.gradients = held * kF32;
    m.optimizer = ps ? 0 : 2 * held * kF32;
    if (zero_plan) AddStageZeroState(j, pipeline, d, layout, *zero_plan, &m);
    int64_t staging = ps && j.bf16 ? held * 2 : 0;
    if (j.streamed) {
      // The window over the stage's ranges at its fullest, replayed
      // through the stage's passes in its schedule's order; each bucket
      // boundary may keep one shared page of weights, gradients and
      // staging backed.
      // (A tensor-parallel stage's: of its rank's part of the servers'
      // space, every rank's alike.)
      const StreamedPeak peak =
          ReplayStreamedStage(shards->Part({0, layout.size()}), layout,
                              ReplayOfJob(j.config, j.job.micro_batch_slots), StageReplayOf(pipeline, d, layout));
      m.weights = peak.weights;
      m.gradients = peak.gradients;
      staging = peak.staging + static_cast<int64_t>(shards->buckets().size() + 1) * (j.bf16 ? 3 : 2) * kPageBytes;
    }
    if (j.gpu) AddCudaStage(j, pipeline, d, shape, S > 1, activation, &m);
    // The step's drawn micro-batches, as every worker holds them.
    m.activations += 2 * B * T * j.train.grad_accum() * static_cast<int64_t>(sizeof(int32_t));
    m.buffers += StageRings(pipeline.grid, ps) * (kRingChunksAhead + (j.bf16 ? kRingChunksInFlight : 0)) * kRingChunkBytes +
                2 * activation * (wire_bf16 ? 2 : kF32) + (tied_end && !ps ? embedding * kF32 : 0) + staging;
    m.runtime = kRuntimeBytes;
    out.push_back(m);
  }
  return out;
}

// A tensor-parallel worker: its rank's packed slices' weights,
// gradients and (all-reduce mode) AdamW state, its slice model's
// activations (every rank's alike; with sequence parallelism, the
// residual's and norms' rows of its share, rounded up), the rings' buffers
// (all the workers, its group, its replicas), and (all-reduce mode) one
// tensor whole while it initialises; parameter servers (`shards`) hold the
// rest, and with cluster.stream_weights it holds a window over its part of
// their space. A CUDA worker's model is on its device.
StatusOr<ProcessMemory> TensorParallelMemory(const JobSizes& j, const ShardPlan* shards = nullptr) {
  const bool ps = j.cluster.sync() == config::ClusterConfig::PARAMETER_SERVER;
  HERD_ASSIGN_OR_RETURN(const TensorSlices slices, TensorSlices::Make(j.shape, j.cluster.tensor_parallel(), 0));
  const int64_t n = slices.layout().size();
  ProcessMemory t;
  t.role = "worker";
  t.count = j.W;
  t.range = {0, j.P};  // the span its slices lie in
  t.weights = n * kF32;
  t.gradients = n * kF32;
  t.optimizer = ps ? 0 : 2 * n * kF32;
  if (!ps && j.cluster.zero_stage() > 0) HERD_RETURN_IF_ERROR(AddZeroState(j, slices.layout(), &t));
  if (j.streamed) {
    // The window at its fullest, as PsWorkerMemory's over the whole model.
    const ShardPlan part = shards->Part({0, n});
    const StreamedPeak peak = ReplayStreamedStep(part, slices.layout(), ReplayOfJob(j.config, j.job.micro_batch_slots));
    t.weights = peak.weights;
    t.gradients = peak.gradients;
    t.buffers += peak.staging + static_cast<int64_t>(part.buckets().size() + 1) * (j.bf16 ? 3 : 2) * kPageBytes;
  }
  t.activations =
      LlamaModel<float>::ActivationBytes(slices.shape(), j.train.batch_size(), j.train.seq_len(), j.job.recompute,
                                         j.job.micro_batch_slots, {}, false,
                                         TokenSplit{j.cluster.sequence_parallel() ? j.cluster.tensor_parallel() : 1,
                                                    std::max(1, j.cluster.context_parallel())}) +
      2 * static_cast<int64_t>(j.train.batch_size()) * j.train.seq_len() * static_cast<int64_t>(sizeof(int32_t));
  // The job's ring, its group's (when not every worker) and its
  // replicas'; hybrid sharding's shard group and replicas; a context
  // group's.
  const int rings = (j.W > j.cluster.tensor_parallel() ? 3 : 1) + (!ps && ShardsInGroups(j.cluster) ? 2 : 0) +
                    (j.cluster.context_parallel() > 1 ? 1 : 0);
  int64_t largest = 0;
  for (const TensorSpec& x : j.layout.tensors()) largest = std::max(largest, x.numel);
  t.buffers += rings * (kRingChunksAhead + (!ps && j.bf16 ? kRingChunksInFlight : 0)) * kRingChunkBytes +
               (ps ? 0 : largest * kF32);
  t.runtime = kRuntimeBytes;
  if (j.gpu) {
    // A CUDA rank: its slice model's activations, compute weights and
    // gradients on the device (the group's sums there too), its gradients
    // staged out through page-locked host memory.
    t.activations = 0;
    t.buffers += n * kF32;
    t.device = cuda::GpuWorkerDeviceBytes(slices.shape(), j.train.batch_size(), j.train.seq_len(),
                                          j.config.device().dtype() == config::DeviceConfig::BF16, j.job.recompute,
                                          cuda::CudaModelPart{j.cluster.tensor_parallel(),
                                                              j.cluster.sequence_parallel(), {}});
  }
  return t;
}

}  // namespace

StatusOr<MemoryPlan> PlanMemory(const config::JobConfig& config) {
  const JobSizes j(config);
  MemoryPlan plan;
  plan.parameters = j.layout.num_parameters();
  if (j.cluster.sync() == config::ClusterConfig::PARAMETER_SERVER) {
    HERD_ASSIGN_OR_RETURN(ShardPlan shards, ParameterServerPlan(config));
    // Each region's servers hold the plan's shards alike.
    for (int s = 0; s < shards.num_servers() * Regions(config); ++s) {
      ProcessMemory m = ServerMemory(j, shards, s % shards.num_servers());
      m.rank = s;
      plan.processes.push_back(m);
    }
    if (HasPipeline(config)) {
      HERD_ASSIGN_OR_RETURN(const std::vector<ProcessMemory> stages, StageMemory(j, &shards));
      plan.processes.insert(plan.processes.end(), stages.begin(), stages.end());
    } else if (j.cluster.tensor_parallel() > 1) {
      HERD_ASSIGN_OR_RETURN(ProcessMemory worker, TensorParallelMemory(j, &shards));
      plan.processes.push_back(worker);
    } else {
      plan.processes.push_back(PsWorkerMemory(j, shards));
    }
    return plan;
  }
  if (HasPipeline(config)) {
    HERD_ASSIGN_OR_RETURN(plan.processes, StageMemory(j));
    return plan;
  }
  if (config.cluster().tensor_parallel() > 1) {
    HERD_ASSIGN_OR_RETURN(ProcessMemory worker, TensorParallelMemory(j));
    plan.processes.push_back(worker);
    return plan;
  }
  HERD_ASSIGN_OR_RETURN(ProcessMemory trainer, TrainerMemory(j));
  plan.processes.push_back(trainer);
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
  // A pipeline needs a layer a stage.
  const int least = std::max(1, config.cluster().pipeline_stages() * config.cluster().virtual_stages());
  HERD_ASSIGN_OR_RETURN(bool one, fits(least));
  if (!one) {
    const std::string what = least == 1 ? "one layer" : std::to_string(least) + " layers (one a pipeline stage)";
    return Status::NotFound("not even " + what + " of this width fits in " + std::to_string(bytes) + " bytes");
  }
  // Memory grows with depth: double, then bisect, no deeper than a config
  // may be.
  int lo = least, hi = std::min(2 * least, kMaxLayers + 1);
  while (hi <= kMaxLayers) {
    HERD_ASSIGN_OR_RETURN(bool ok, fits(hi));
    if (!ok) break;
    lo = hi;
    hi = std::min(2 * hi, kMaxLayers + 1);
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
