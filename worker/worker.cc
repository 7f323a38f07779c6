#include "worker/worker.h"

#include <omp.h>

#include <cstdio>
#include <memory>
#include <optional>
#include <vector>

#include "common/file_util.h"
#include "common/paged_buffer.h"
#include "common/run_summary.h"
#include "data/prepare.h"
#include "data/sampler.h"
#include "model/checkpoint_format.h"
#include "model/checkpoint_load.h"
#include "model/checkpoint_run.h"
#include "model/optim/adamw.h"
#include "model/optim/optimizer_shard.h"
#include "sharding/grid.h"
#include "sharding/job_options.h"
#include "sharding/memory_plan.h"
#include "sharding/pipeline_plan.h"
#include "sharding/shard_plan.h"
#include "sharding/tensor_slices.h"
#include "transport/exchanges.h"
#include "transport/join.h"
#include "transport/node_runtime.h"
#include "transport/trace_session.h"
#include "transport/wire.h"
#include "worker/axis_rings.h"
#include "worker/checkpoint_writer.h"
#include "worker/elastic_shares.h"
#include "worker/model_factory.h"
#include "worker/placements/model_group_steps.h"
#include "worker/placements/pipeline_passes.h"
#include "worker/placements/tied_embedding.h"
#include "worker/reducers/collective_sync.h"
#include "worker/reducers/device_resident_sync.h"
#include "worker/reducers/local_sync.h"
#include "worker/reducers/nccl_gradients.h"
#include "worker/reducers/parameter_server_sync.h"
#include "worker/reducers/weight_home.h"
#include "worker/run_header.h"
#include "worker/share_compute.h"
#include "worker/share_schedule.h"
#include "worker/step_loop.h"

namespace herd {
namespace {

using config::ClusterConfig;

// How the replicas of this worker's placement reduce and step (its
// SyncStrategy); the placement (pipeline stage, tensor slices, context
// chunks) is another matter, any of them with any of these.
enum class Reducer {
  kOneProcess,        // the whole job, on the CPU (LocalSync)
  kOneGpu,            // the whole job, its whole step on one GPU (DeviceResidentSync)
  kParameterServers,  // pushes and pulls to the servers
  kCollectives,       // all-reduce mode: DDP, ZeRO, hybrid groups among the replicas
  kGpuCollectives,    // all-reduce mode, each worker's whole step on its GPU over NCCL (DeviceResidentSync)
};

Reducer ReducerOf(const config::JobConfig& config, bool in_job) {
  if (!in_job) return config.device().kind() == config::DeviceConfig::CUDA ? Reducer::kOneGpu : Reducer::kOneProcess;
  if (config.cluster().sync() == ClusterConfig::PARAMETER_SERVER) return Reducer::kParameterServers;
  return StepsOnTheDevice(config) && BuiltWithNccl() ? Reducer::kGpuCollectives : Reducer::kCollectives;
}

// The reducers whose whole step runs on the GPU, where the weights and
// gradients live: the host holds neither.
bool OnTheDevice(Reducer r) { return r == Reducer::kOneGpu || r == Reducer::kGpuCollectives; }

// How gradients travel on the all-reduce rings (cluster.wire_dtype).
transport::Wire GradientWire(const ClusterConfig& cluster) {
  return cluster.wire_dtype() == ClusterConfig::BF16 ? transport::Wire::kBf16 : transport::Wire::kFloat32;
}

// One worker process. Members in the order they are made; they go in the
// reverse order. The buffers come first: a GPU model page-locks them and
// the transport registers them, and both must let go before they are
// freed. The runtime comes last, so it goes first: nothing it runs
// afterwards can reach into the strategy, the sampler or the buffers.
class WorkerProcess {
 public:
  // Errors: the data, the shard plan, or a checkpoint that cannot be
  // resumed.
  static StatusOr<std::unique_ptr<WorkerProcess>> Create(const config::JobConfig& config, const TrainOptions& options,
                                                         const transport::JoinOptions* join);

  // Joins (in a job), trains, and in a job reports what it cost and leaves.
  Status Run();

 private:
  WorkerProcess(const config::JobConfig& config, const TrainOptions& options, const transport::JoinOptions* join,
                JobData data, ParamLayout layout);

  // The weights and gradients of the whole flat space (backed only where
  // the window is, when streamed).
  Status AllocateSpaces();
  // What depends on the rank (in a job, before any peer can send to us):
  // the data sampler and the model.
  Status Prepare(transport::CoordinatorClient* client);
  // The groups of the reducer's NCCL communicators: those of the rings
  // AxisRings opens for it.
  NcclGroups NcclGroupsOf() const;
  // A pipeline stage's models, one per chunk of its layers.
  Status PreparePipelineStage(transport::CoordinatorClient* client);
  // A tensor-parallel worker's slices and its model over them (a CUDA
  // worker's group sums on the device, made here through `client`).
  Status PrepareTensorParallel(transport::CoordinatorClient* client);
  // A CUDA tensor-parallel worker's group on the device: NCCL's sums among
  // the group (made once, through `client`), or staged through its ring.
  StatusOr<DeviceTensorGroup> DeviceTensorGroupOf(transport::CoordinatorClient* client);
  // This worker's place in the job's grid.
  GridCoords place() const { return grid_.CoordsOf(rank_); }
  // This worker's context-parallel group (none without).
  ContextGroup<float> ContextGroupOf();
  // A pipeline stage's wire to the other stages, over `runtime`'s
  // transport (in the join, before any peer can send).
  void OpenPipelineWire(transport::NodeRuntime& runtime);
  // In the join: the rings of the groups this worker's collectives run
  // over (AxisRings), before any peer can send.
  void OpenRings(transport::NodeRuntime& runtime, transport::CoordinatorClient& client);
  // In a job: joins it through the NodeRuntime (Prepare runs in there)
  // and registers the spaces with its transport.
  Status JoinJob();
  // The one place a worker's axes are made: how its gradients become the
  // next weights (SyncStrategy), where its weights live (WeightHome), how
  // it computes a share (ShareCompute), which shares (ShareSchedule) and
  // what it writes of a checkpoint (CheckpointWriter).
  Status MakeAxes();
  StatusOr<std::unique_ptr<SyncStrategy>> MakeStrategy();
  // MakeStrategy's for parameter servers and collectives.
  StatusOr<std::unique_ptr<SyncStrategy>> MakeParameterServerSync();
  StatusOr<std::unique_ptr<SyncStrategy>> MakeCollectiveSync();
  // MakeStrategy's for the whole step on the GPU (one process, or
  // all-reduce mode over NCCL).
  StatusOr<std::unique_ptr<SyncStrategy>> MakeDeviceResidentSync();
  // What the collectives reducer steps of this worker's placement: its
  // part of the space, its part of the norm and the loss, its shard files.
  ReducedPlacement CollectivePlacement();
  std::unique_ptr<ShareCompute> MakeCompute();
  // A tensor-parallel or context-parallel worker's group part of a step
  // around its reducer (ModelGroupSteps); null for the whole model.
  AroundReducer ModelGroupAround();
  // Whether the step's last backward is the only pass that writes its
  // gradients: one micro-batch, or paged gradients computed layer-major.
  bool OneBackwardWritesTheGradients() const;
  std::unique_ptr<CheckpointWriter> MakeCheckpointWriter();
  // Elastic: the shares this worker computes follow the membership.
  void FollowMembership();
  // The steps already taken: the join point of a worker that joined, else
  // the checkpoint's; worker 0 prints the run's first lines.
  StatusOr<int64_t> StartingStep();
  StepLoopParts LoopParts();
  Status ReportSummary(const StepLoop& loop, int64_t start);

  // The space this worker computes in: the model's flat space, or a
  // tensor-parallel rank's packed one.
  const ParamLayout& stage_layout() const { return slices_ ? slices_->layout() : layout_; }
  float* weights() {
    return paged_weights_.data() ? reinterpret_cast<float*>(paged_weights_.data()) : weights_.data();
  }
  float* grads() { return paged_grads_.data() ? reinterpret_cast<float*>(paged_grads_.data()) : grads_.data(); }
  bool in_job() const { return join_ != nullptr; }

  // Constant after construction.
  const config::JobConfig& config_;
  const JobOptions job_;  // config_, converted once for the layers below
  const TrainOptions options_;
  const transport::JoinOptions* const join_;  // null: the job is this one process
  const Reducer reducer_;
  const bool streamed_;  // cluster.stream_weights
  // The weights are a window: streamed, or gathered (ZeRO-3).
  const bool windowed_;
  // The weights are paged: a window's (guarded), or a pipeline stage's
  // ranges (the rest of the flat space never backed).
  const bool pages_weights_;
  // The gradients are paged: a window's, ZeRO-2's slices, or a pipeline
  // stage's ranges.
  const bool pages_grads_;
  const JobData data_;
  const ParamLayout layout_;
  const Grid grid_;  // the job's workers, by axis

  // Settled before the loop starts, constant afterwards.
  std::optional<ShardPlan> plan_;  // the modes of a job
  std::optional<PipelinePlan> pipeline_;  // a pipeline stage's worker
  // A tensor-parallel worker: its rank's slices (set in Prepare), and the
  // packed space's size (every rank's alike).
  std::optional<TensorSlices> slices_;
  int64_t packed_size_ = 0;
  AxisRings rings_;  // the runtime's rings, by the grid's axes (OpenRings)
  std::unique_ptr<GroupRing> tensor_ring_;
  // A context-parallel worker (all-reduce mode): its group's ring, for the
  // model's gathers (set in JoinJob).
  std::unique_ptr<GroupRing> context_ring_;
  std::optional<VerifiedCheckpoint> resume_from_;
  // A worker joining an elastic job under way: its state (the step, the
  // data position, the weights) comes from the servers, not a checkpoint.
  // With resume_if_forming it may find the job forming instead and take
  // part in that: which it was is known once the coordinator welcomes it.
  bool joining_ = false;
  int rank_ = 0, num_workers_ = 1;
  Model* model_ = nullptr;  // model_holder_, or the GPU trainer's evaluator

  // Owned by the thread that runs Run; in lifetime order.
  transport::TraceSession trace_;  // log.trace: goes last, after everything that records spans
  std::vector<float> weights_, grads_;
  // The same flat spaces, backed only where the window is (streamed or
  // gathered weights; weights_ and grads_ then stay empty) or, for
  // gradients, where they are still needed (ZeRO-2: grads_ stays empty).
  PagedBuffer paged_weights_, paged_grads_;
  // A CUDA tensor-parallel worker's group sums over NCCL (its model's, so
  // made before it and let go after it).
  std::unique_ptr<DeviceGroupSums> device_tensor_sums_;
  std::unique_ptr<DeviceGroupSums> device_context_sums_;  // a CUDA context-parallel worker's, likewise
  std::unique_ptr<Model> model_holder_;                      // none when the GPU trainer has its own
  // A pipeline stage: one model per chunk, over its layers (model_ is
  // then the evaluator through the stages, in model_holder_).
  std::vector<std::unique_ptr<StageModel>> chunk_models_;
  std::unique_ptr<DeviceGradientReduction> device_reduction_;  // CUDA workers in all-reduce mode: NCCL
  // kGpuCollectives: the device's NCCL, until the strategy takes it.
  std::unique_ptr<cuda::DeviceExchange> device_exchange_;
  std::optional<DistributedSampler> sampler_;
  std::optional<ElasticShares> shares_;  // cluster.elastic
  // The axes; each refers to those before it.
  std::optional<TiedEmbeddingExchange> tied_embedding_;  // a pipeline's first and last stage's
  std::unique_ptr<SyncStrategy> strategy_;
  DeviceResidentSync* device_sync_ = nullptr;  // strategy_, when the whole step is on the GPU
  std::unique_ptr<WeightHome> home_;
  std::unique_ptr<ShareCompute> compute_;
  std::unique_ptr<ShareSchedule> schedule_;
  std::unique_ptr<transport::NodeRuntime> runtime_;
  // Goes before the runtime: a commit under way votes through its client.
  std::unique_ptr<CheckpointWriter> checkpoints_;
  // A pipeline stage's wire to the others: the runtime's, failed with the
  // job as its other services are.
  transport::PipelineWire* pipeline_wire_ = nullptr;
};

StatusOr<std::unique_ptr<WorkerProcess>> WorkerProcess::Create(const config::JobConfig& config,
                                                               const TrainOptions& options,
                                                               const transport::JoinOptions* join) {
  const LlamaShape shape = LlamaShape::FromConfig(config.model());
  HERD_ASSIGN_OR_RETURN(JobData data, OpenJobData(config.data(), shape.vocab_size));
  std::unique_ptr<WorkerProcess> w(new WorkerProcess(config, options, join, std::move(data), ParamLayout(shape)));
  if (config.cluster().tensor_parallel() > 1 && w->join_ != nullptr) {
    // A tensor-parallel rank's packed space (every rank's alike).
    HERD_ASSIGN_OR_RETURN(const TensorSlices any, TensorSlices::Make(shape, config.cluster().tensor_parallel(), 0));
    w->packed_size_ = any.layout().size();
  }
  if (w->reducer_ == Reducer::kParameterServers) {
    HERD_ASSIGN_OR_RETURN(w->plan_, ParameterServerPlan(config));
  } else if (w->reducer_ == Reducer::kCollectives || w->reducer_ == Reducer::kGpuCollectives) {
    HERD_ASSIGN_OR_RETURN(w->plan_, AllReducePlan(config));
  }
  if (HasPipeline(config) && w->join_ != nullptr) {
    HERD_ASSIGN_OR_RETURN(w->pipeline_, PipelinePlan::FromConfig(config));
  }
  if (!w->joining_) {
    HERD_ASSIGN_OR_RETURN(w->resume_from_, ResumePoint(config, options));
  }
  return w;
}

WorkerProcess::WorkerProcess(const config::JobConfig& config, const TrainOptions& options,
                             const transport::JoinOptions* join, JobData data, ParamLayout layout)
    : config_(config),
      job_(JobOptions::FromConfig(config)),
      options_(options),
      join_(join),
      reducer_(ReducerOf(config, join != nullptr)),
      streamed_(reducer_ == Reducer::kParameterServers && config.cluster().stream_weights()),
      windowed_(WorkersHoldAWindow(config) && !OnTheDevice(reducer_)),
      pages_weights_(windowed_ || (join != nullptr && HasPipeline(config))),
      pages_grads_(pages_weights_ ||
                   (reducer_ == Reducer::kCollectives &&
                    config.cluster().zero_stage() == 2 && config.device().kind() == config::DeviceConfig::CPU)),
      data_(std::move(data)),
      layout_(std::move(layout)),
      grid_(Grid::FromConfig(config)),
      rings_(grid_),
      joining_(join != nullptr && join->join && !join->resume_if_forming) {}

Status WorkerProcess::AllocateSpaces() {
  const int64_t P = packed_size_ > 0 ? packed_size_ : layout_.size();
  if (OnTheDevice(reducer_)) return Status::OK();  // the GPU trainer keeps its own
  if (pages_grads_) {
    HERD_ASSIGN_OR_RETURN(paged_grads_, PagedBuffer::Reserve(P * sizeof(float), /*guarded=*/false));
  }
  if (pages_weights_) {
    // A window's weights are guarded: a read outside it faults.
    HERD_ASSIGN_OR_RETURN(paged_weights_, PagedBuffer::Reserve(P * sizeof(float), /*guarded=*/windowed_));
    return Status::OK();
  }
  weights_.resize(P);
  if (!pages_grads_) grads_.resize(P);
  return Status::OK();
}

Status WorkerProcess::Prepare(transport::CoordinatorClient* client) {
  const auto& train = config_.train();
  if (client != nullptr) {
    rank_ = client->rank();
    num_workers_ = client->num_workers();
    if (join_->join) joining_ = client->joined_under_way();
    if (joining_) resume_from_.reset();
    if (!joining_) {
      HERD_RETURN_IF_ERROR(transport::AgreeOnResume(*client, resume_from_ ? BaseName(resume_from_->dir) : "none"));
    }
  }
  // The workers of a pipeline's replica, or of a tensor-parallel group,
  // draw the same sequences.
  HERD_ASSIGN_OR_RETURN(sampler_, DistributedSampler::Create(data_.train, train.seq_len(), grid_.replicas(),
                                                             grid_.ReplicaOf(rank_), train.seed()));
  HERD_RETURN_IF_ERROR(sampler_->CheckBatch(train.batch_size()).WithContext("train.batch_size: "));
  if (resume_from_) {
    // Every worker's state holds the same global position: worker 0's
    // serves any number of workers now.
    const std::string path = JoinPath(resume_from_->dir, WorkerFileName(0));
    HERD_ASSIGN_OR_RETURN(std::string loader, ReadFile(path));
    HERD_RETURN_IF_ERROR(sampler_->RestoreState(loader).WithContext(path + ": "));
  }
  const bool gpu = config_.device().kind() == config::DeviceConfig::CUDA;
  // NCCL's communicators below are made on the current device.
  if (gpu && client != nullptr) HERD_RETURN_IF_ERROR(UseCudaDevice(LocalRank(rank_)).status());
  if (reducer_ == Reducer::kGpuCollectives) {
    HERD_ASSIGN_OR_RETURN(device_exchange_,
                          ExchangeWithNccl(*client, *plan_, config_.cluster().zero_stage() > 0, NcclGroupsOf()));
  }
  if (OnTheDevice(reducer_)) return Status::OK();  // the GPU trainer brings its model
  if (pipeline_) return PreparePipelineStage(client);
  if (tensor_ring_) {
    HERD_RETURN_IF_ERROR(PrepareTensorParallel(client));
  } else if (context_ring_ && !gpu) {
    model_holder_ = NewCpuModel(job_.shape, job_.batch, job_.seq_len, job_.recompute, job_.micro_batch_slots, {},
                                ContextGroupOf());
  } else if (context_ring_) {
    // The keys' and values' gathers on the device through NCCL, or staged
    // through the group's ring.
    DeviceContextGroup group;
    if (config_.cluster().nccl() && BuiltWithNccl()) {
      HERD_ASSIGN_OR_RETURN(device_context_sums_,
                            DeviceGroupSums::Create(*client, grid_.GroupOf(rank_, {Axis::kContext}), "context"));
      group = device_context_sums_->Context(grid_.degree(Axis::kContext), place()[Axis::kContext]);
    } else {
      group = StagedContextGroup(ContextGroupOf());
    }
    HERD_ASSIGN_OR_RETURN(model_holder_, CreateContextParallelCudaModel(config_, job_, LocalRank(rank_),
                                                                      std::move(group), ContextGroupOf()));
  } else {
    HERD_ASSIGN_OR_RETURN(model_holder_, CreateModel(config_, job_, LocalRank(rank_)));
  }
  model_ = model_holder_.get();
  if (reducer_ == Reducer::kCollectives && gpu && config_.cluster().nccl() && BuiltWithNccl()) {
    HERD_ASSIGN_OR_RETURN(device_reduction_, ReduceGradientsWithNccl(*client, *model_, *plan_,
                                                                     config_.cluster().zero_stage() > 0,
                                                                     NcclGroupsOf()));
  }
  return Status::OK();
}

NcclGroups WorkerProcess::NcclGroupsOf() const {
  if (config_.cluster().zero_stage() == 0) {
    return {grid_.GroupOf(rank_, {Axis::kContext, Axis::kShard, Axis::kReplicate}), {}};
  }
  return {grid_.GroupOf(rank_, {Axis::kContext, Axis::kShard}), grid_.GroupOf(rank_, {Axis::kReplicate})};
}

Status WorkerProcess::PreparePipelineStage(transport::CoordinatorClient* client) {
  const PipelineSchedule& s = pipeline_->schedule;
  const int device = place()[Axis::kPipeline];
  const std::vector<int> slots = ChunkSlots(s, device);
  if (tensor_ring_) {
    HERD_ASSIGN_OR_RETURN(slices_, TensorSlices::Make(job_.shape, grid_.degree(Axis::kTensor), place()[Axis::kTensor]));
  }
  const bool gpu = config_.device().kind() == config::DeviceConfig::CUDA;
  DeviceTensorGroup device_group;
  if (gpu && slices_) {
    HERD_ASSIGN_OR_RETURN(device_group, DeviceTensorGroupOf(client));
  }
  for (int c = 0; c < s.chunks; ++c) {
    const PipelineStage& stage = pipeline_->split.stage(s.VirtualStage(device, c));
    if (gpu) {
      HERD_ASSIGN_OR_RETURN(std::unique_ptr<StageModel> model,
                            CreateCudaStageModel(config_, job_, LocalRank(rank_), stage_layout().shape(), stage.layers,
                                                 slots[c], s.kind == PipelineScheduleKind::kZeroBubble, device_group));
      chunk_models_.push_back(std::move(model));
      continue;
    }
    const int C = grid_.degree(Axis::kContext);
    const bool sequence = config_.cluster().sequence_parallel();
    auto model = std::make_unique<LlamaModel<float>>(
        stage_layout().shape(), job_.batch, job_.seq_len, job_.recompute, slots[c], stage.layers,
        s.kind == PipelineScheduleKind::kZeroBubble, TokenSplit{sequence ? grid_.degree(Axis::kTensor) : 1, C});
    if (slices_) model->SetTensorGroup(tensor_ring_->Group(*slices_, sequence));
    if (C > 1) model->SetContextGroup(ContextGroupOf());
    chunk_models_.push_back(NewCpuStageModel(std::move(model)));
  }
  return Status::OK();
}

Status WorkerProcess::PrepareTensorParallel(transport::CoordinatorClient* client) {
  const int T = config_.cluster().tensor_parallel();
  HERD_ASSIGN_OR_RETURN(slices_, TensorSlices::Make(job_.shape, T, place()[Axis::kTensor]));
  if (config_.device().kind() == config::DeviceConfig::CPU) {
    model_holder_ = NewCpuModel(slices_->shape(), job_.batch, job_.seq_len, job_.recompute, job_.micro_batch_slots,
                                tensor_ring_->Group(*slices_, config_.cluster().sequence_parallel()), ContextGroupOf());
    return Status::OK();
  }
  HERD_ASSIGN_OR_RETURN(DeviceTensorGroup group, DeviceTensorGroupOf(client));
  HERD_ASSIGN_OR_RETURN(model_holder_, CreateTensorParallelCudaModel(config_, job_, LocalRank(rank_),
                                                                     slices_->shape(), std::move(group)));
  return Status::OK();
}

StatusOr<DeviceTensorGroup> WorkerProcess::DeviceTensorGroupOf(transport::CoordinatorClient* client) {
  const bool sequence = config_.cluster().sequence_parallel();
  if (!config_.cluster().nccl() || !BuiltWithNccl()) {
    return StagedTensorGroup(tensor_ring_->Group(*slices_, sequence));
  }
  if (device_tensor_sums_ == nullptr) {
    HERD_ASSIGN_OR_RETURN(device_tensor_sums_,
                          DeviceGroupSums::Create(*client, grid_.GroupOf(rank_, {Axis::kTensor}), "tensor"));
  }
  return device_tensor_sums_->Group(*slices_, sequence);
}

ContextGroup<float> WorkerProcess::ContextGroupOf() {
  if (!context_ring_) return {};
  return context_ring_->Context(grid_.degree(Axis::kContext), place()[Axis::kContext]);
}

void WorkerProcess::OpenPipelineWire(transport::NodeRuntime& runtime) {
  // Activations, their gradients and (tied) the embedding's gradient; a
  // neighbour runs ahead by at most the micro-batches a chunk holds.
  const PipelineSchedule& s = pipeline_->schedule;
  const int64_t activation = static_cast<int64_t>(job_.batch) * job_.seq_len * job_.shape.hidden_size;
  const int64_t largest = std::max(activation, layout_.layer(0).input_norm);
  pipeline_wire_ = runtime.StartPipelineWire(config_.cluster().pipeline_wire_dtype() == ClusterConfig::BF16, largest,
                                             2 * s.micro_batches * s.chunks + 2 + config_.log().eval_batches());
}

void WorkerProcess::OpenRings(transport::NodeRuntime& runtime, transport::CoordinatorClient& client) {
  const bool tensor = grid_.degree(Axis::kTensor) > 1, context = grid_.degree(Axis::kContext) > 1;
  // A parameter-server worker's gradients go to the servers: it runs the
  // model's own group collectives alone.
  const bool reduces = reducer_ != Reducer::kParameterServers;
  if (!reduces && !tensor && !context) return;
  runtime.StartRing(client);
  if (tensor) tensor_ring_ = std::make_unique<GroupRing>(rings_.Open(runtime, client, {Axis::kTensor}));
  if (context) context_ring_ = std::make_unique<GroupRing>(rings_.Open(runtime, client, {Axis::kContext}));
  if (reduces) rings_.OpenReducerRings(runtime, client, config_.cluster().zero_stage() > 0);
}

Status WorkerProcess::JoinJob() {
  transport::NodeRuntime::Options o;
  o.join = *join_;
  o.connect_to = {reducer_ == Reducer::kParameterServers ? wire::SERVER : wire::WORKER};
  // A pipeline's stages exchange activations in either mode, a
  // tensor-parallel group its sums.
  if (reducer_ == Reducer::kParameterServers &&
      (pipeline_ || grid_.degree(Axis::kTensor) > 1 || grid_.degree(Axis::kContext) > 1)) {
    o.connect_to.push_back(wire::WORKER);
  }
  if (reducer_ == Reducer::kParameterServers) {
    o.push_pull_piece_bytes =
        LargestBucketBytes(*plan_, config_.cluster().wire_dtype() == ClusterConfig::BF16 ? 2 : 4);
  }
  HERD_ASSIGN_OR_RETURN(runtime_, transport::NodeRuntime::Join(o, [this](transport::NodeRuntime& rt,
                                                                         transport::CoordinatorClient& c) {
                          OpenRings(rt, c);
                          if (pipeline_) OpenPipelineWire(rt);
                          HERD_RETURN_IF_ERROR(Prepare(&c));
                          // The step the others' first messages are for, before they can send.
                          if (pipeline_wire_) pipeline_wire_->SetStep(resume_from_ ? resume_from_->manifest.step : 0);
                          return Status::OK();
                        }));
  // A paged buffer is not registered whole (that would back and pin all
  // of it): UCX registers what it moves as it goes.
  const uint64_t bytes = (packed_size_ > 0 ? packed_size_ : layout_.size()) * sizeof(float);
  if (!pages_weights_ && !weights_.empty()) {
    HERD_RETURN_IF_ERROR(runtime_->transport().RegisterMemory(weights_.data(), bytes));
  }
  if (!pages_grads_ && !grads_.empty()) HERD_RETURN_IF_ERROR(runtime_->transport().RegisterMemory(grads_.data(), bytes));
  return Status::OK();
}

StatusOr<std::unique_ptr<SyncStrategy>> WorkerProcess::MakeStrategy() {
  const ParamRange whole{0, layout_.size()};
  switch (reducer_) {
    case Reducer::kOneProcess: {
      // The whole space's optimizer state; any number of shards (a
      // parameter-server checkpoint too) assembles into it.
      HERD_ASSIGN_OR_RETURN(std::unique_ptr<OptimizerShard> optimizer,
                            job_.MakeOptimizer(layout_, whole, resume_from_));
      return CreateLocalSync(std::move(optimizer), weights());
    }
    case Reducer::kOneGpu:
    case Reducer::kGpuCollectives:
      return MakeDeviceResidentSync();
    case Reducer::kParameterServers:
      return MakeParameterServerSync();
    case Reducer::kCollectives:
      return MakeCollectiveSync();
  }
  return Status::Internal("unknown reducer");
}

StatusOr<std::unique_ptr<SyncStrategy>> WorkerProcess::MakeDeviceResidentSync() {
  const int64_t P = layout_.size();
  DeviceResidentOptions d;
  DevicePart part;
  part.owned = {{0, P}};
  if (reducer_ == Reducer::kGpuCollectives) {
    // As the ring's reducer cuts them (CollectiveStep): a ZeRO owner's
    // slices; DDP counts in the norm the slices ZeRO would own.
    const NcclGroups groups = NcclGroupsOf();
    const std::vector<int>& group = groups.shard_group;
    const int G = static_cast<int>(group.size());
    const int g = static_cast<int>(std::find(group.begin(), group.end(), rank_) - group.begin());
    const bool zero = config_.cluster().zero_stage() > 0;
    part.counted = OwnedSlices(plan_->buckets(), G, g);
    if (zero && part.counted.empty()) {
      return Status::InvalidArgument("cluster.zero_stage: the model's buckets are too small to shard over " +
                                     std::to_string(G) + " workers (worker " + std::to_string(rank_) +
                                     " would own nothing)");
    }
    if (zero) part.owned = part.counted;
    part.replicas = grid_.data();
    part.gathered = config_.cluster().zero_stage() == 3;
    // Hybrid: every group holds the same sums; the first one counts them.
    const bool first_group = groups.replicas.empty() || groups.replicas.front() == rank_;
    d.everyone = runtime_->ring();
    d.counts_in_norm = first_group;
    d.shard_files = zero ? G : 1;
    d.shard_file = !first_group || (!zero && g != 0) ? -1 : (zero ? g : 0);
  }
  HERD_ASSIGN_OR_RETURN(std::unique_ptr<cuda::DeviceTrainer> gpu,
                        CreateDeviceTrainer(config_, job_, LocalRank(rank_), part));
  // The whole space's weights (every worker loads them alike: no
  // broadcast; ZeRO-3's device takes its slices alone) and the owned
  // slices' moments, on the host only until the device has them.
  const std::vector<ParamRange>& owned = part.owned;
  std::vector<float> weights(P);
  if (!part.gathered && (owned.size() > 1 || owned.front().size() < P)) {
    HERD_RETURN_IF_ERROR(LoadWeightRanges(layout_, job_.init, {{0, P}}, resume_from_, weights.data()));
  }
  HERD_ASSIGN_OR_RETURN(std::unique_ptr<OptimizerSlices> optimizer,
                        OptimizerSlices::InitOrResume(job_.optimizer, job_.init, layout_, owned, resume_from_,
                                                      weights.data()));
  auto strategy = std::make_unique<DeviceResidentSync>(std::move(device_exchange_), std::move(gpu),
                                                       std::move(optimizer), weights.data(), d);
  model_ = &strategy->evaluator();
  device_sync_ = strategy.get();
  return std::unique_ptr<SyncStrategy>(std::move(strategy));
}

StatusOr<std::unique_ptr<SyncStrategy>> WorkerProcess::MakeParameterServerSync() {
  const auto& cluster = config_.cluster();
  ParameterServerSyncOptions po;
  po.plan = &*plan_;
  po.bf16 = cluster.wire_dtype() == ClusterConfig::BF16;
  po.elastic = cluster.elastic();
  po.stream = StreamsUpdates(config_);  // as the servers do
  // Its region's servers and its rank among the region's workers (the
  // whole job's without regions).
  const int regions = Regions(config_), region_workers = num_workers_ / regions;
  po.rank = rank_ % region_workers;
  po.first_server =
      transport::MemberPeerId(runtime_->client(), wire::SERVER, rank_ / region_workers * plan_->num_servers());
  if (slices_) {
    // The rank's packed part of the servers' space (TensorParallelSpace);
    // a stage's ranges of it.
    po.origin = slices_->rank() * packed_size_;
    po.ranges = {{0, packed_size_}};
  }
  if (pipeline_) po.ranges = pipeline_->RangesOf(place()[Axis::kPipeline], stage_layout());
  for (ParamRange& r : po.ranges) r = {po.origin + r.begin, po.origin + r.end};
  if (streamed_) {
    po.streamed_weights = &paged_weights_;
    po.streamed_grads = &paged_grads_;
    po.layout = &stage_layout();
    po.prefetch_layers = cluster.stream_prefetch_layers();
  }
  po.around = ModelGroupAround();
  HERD_ASSIGN_OR_RETURN(ParameterServerSyncParts parts,
                        CreateParameterServerSync(po, &runtime_->transport(), runtime_->push_pull()));
  // A stage's gradients are paged: with its weights whole, MakeAxes
  // makes its home.
  if (!pipeline_ || streamed_) home_ = std::move(parts.home);
  return std::move(parts.sync);
}

StatusOr<std::unique_ptr<SyncStrategy>> WorkerProcess::MakeCollectiveSync() {
  const auto& cluster = config_.cluster();
  CollectiveSyncOptions c;
  c.job = &job_;
  c.layout = &stage_layout();
  c.plan = &*plan_;
  c.zero_stage = cluster.zero_stage();
  // Among the placement's replicas (every worker without model axes).
  c.collectives = rings_.placement_replicas();
  c.everyone = runtime_->ring();
  c.shard_group = rings_.shard_group();
  c.replicas = rings_.hybrid_replicas();
  c.placement = CollectivePlacement();
  c.around = ModelGroupAround();
  c.gradient_wire = GradientWire(cluster);
  c.device_reduction = device_reduction_.get();
  if (pages_grads_) c.paged_grads = &paged_grads_;
  c.recycle_gradient_pages = pages_grads_ && cluster.zero_stage() == 2 && c.placement.held.empty() &&
                             OneBackwardWritesTheGradients();
  if (windowed_) c.paged_weights = &paged_weights_;
  c.prefetch_layers = cluster.stream_prefetch_layers();
  c.reshard_after_forward = cluster.reshard_after_forward();
  c.step_slices_as_scattered = StepsSlicesAsScattered(config_);
  HERD_ASSIGN_OR_RETURN(CollectiveSyncParts parts, CreateCollectiveSync(c, weights(), resume_from_));
  home_ = std::move(parts.home);
  return std::move(parts.sync);
}

ReducedPlacement WorkerProcess::CollectivePlacement() {
  ReducedPlacement p;
  const GridCoords at = place();
  const int T = grid_.degree(Axis::kTensor), stages = grid_.degree(Axis::kPipeline);
  // A replica's loss, which its tensor group and its stages all know, is
  // added by the last stage's tensor rank 0; every context rank adds its
  // chunks'.
  p.adds_loss = at[Axis::kTensor] == 0 && at[Axis::kPipeline] == stages - 1;
  p.loss_holders = T * stages;
  p.index = grid_.IndexInGroup(rank_, {Axis::kTensor, Axis::kPipeline});
  p.count = T * stages;
  if (slices_) {
    p.slices = &*slices_;
    p.flat = &layout_;
  }
  if (!pipeline_) return p;
  const int device = at[Axis::kPipeline];
  p.held = pipeline_->RangesOf(device, stage_layout());
  const ParamRange tied = pipeline_->TiedEmbedding(stage_layout());
  const bool first = device == 0, last = device == stages - 1;
  if (tied.size() == 0 || !(first || last)) return p;
  if (last) p.copy = tied;
  const int other = grid_.Along(rank_, Axis::kPipeline, first ? stages - 1 : 0);
  tied_embedding_.emplace(pipeline_wire_, transport::MemberPeerId(runtime_->client(), wire::WORKER, other), first,
                          pipeline_->schedule.virtual_stages() - 1, tied.end);
  p.after_reduction = [this](float* grads, uint64_t step) { return tied_embedding_->Exchange(grads, step); };
  return p;
}

AroundReducer WorkerProcess::ModelGroupAround() {
  if (!slices_ && !context_ring_) return nullptr;
  return [this](std::unique_ptr<SyncStrategy> reducer) {
    ModelGroupOptions g;
    g.slices = slices_ ? &*slices_ : nullptr;
    g.tensor_ring = tensor_ring_.get();
    g.context_ring = context_ring_.get();
    g.device_tensor = device_tensor_sums_.get();
    g.device_context = device_context_sums_.get();
    g.sequence_parallel = config_.cluster().sequence_parallel();
    if (pipeline_) g.held = pipeline_->RangesOf(place()[Axis::kPipeline], stage_layout());
    return ModelGroupSteps(g, std::move(reducer));
  };
}

Status WorkerProcess::MakeAxes() {
  HERD_ASSIGN_OR_RETURN(strategy_, MakeStrategy());
  if (home_ == nullptr) home_ = WholeWeights(*strategy_, pipeline_ ? &paged_grads_ : nullptr);
  compute_ = MakeCompute();
  checkpoints_ = MakeCheckpointWriter();
  if (!config_.cluster().elastic() || reducer_ != Reducer::kParameterServers) {
    schedule_ = FixedShare(*strategy_, grid_.ReplicaOf(rank_), /*leads=*/rank_ == 0);
    return Status::OK();
  }
  FollowMembership();
  ElasticScheduleParts e;
  e.shares = &*shares_;
  e.sync = strategy_.get();
  e.sampler = &*sampler_;
  e.client = &runtime_->client();
  e.rank = rank_;
  schedule_ = ElasticSchedule(e);
  return Status::OK();
}

std::unique_ptr<ShareCompute> WorkerProcess::MakeCompute() {
  if (device_sync_ != nullptr) return DeviceResidentSteps(*device_sync_);
  if (pipeline_) {
    PipelinePassOptions p;
    p.schedule = &pipeline_->schedule;
    p.split = &pipeline_->split;
    p.device = place()[Axis::kPipeline];
    p.wire = pipeline_wire_;
    for (int d = 0; d < pipeline_->devices(); ++d) {
      p.peers.push_back(
          transport::MemberPeerId(runtime_->client(), wire::WORKER, grid_.Along(rank_, Axis::kPipeline, d)));
    }
    p.home = home_.get();
    p.sync = strategy_.get();
    p.weights = weights();
    p.grads = grads();
    p.flat_size = stage_layout().size();
    p.batch = job_.batch;
    p.seq_len = job_.seq_len;
    p.loss_scale = 1.0 / static_cast<double>(static_cast<int64_t>(job_.batch) * job_.seq_len * job_.grad_accum *
                                             grid_.data());
    if (slices_) p.tensor = tensor_ring_->Group(*slices_, /*sequence_parallel=*/false);
    p.context = ContextGroupOf();
    std::vector<StageModel*> models;
    for (const auto& m : chunk_models_) models.push_back(m.get());
    model_holder_ = PipelineEvaluator(p, models, chunk_models_.front()->Describe() + ", pipeline stage " +
                                                     std::to_string(p.device));
    model_ = model_holder_.get();
    return PipelinePasses(p, std::move(models));
  }
  PassOptions o;
  o.model = model_;
  o.home = home_.get();
  o.sync = strategy_.get();
  o.weights = weights();
  o.grads = grads();
  o.batch = job_.batch;
  o.seq_len = job_.seq_len;
  // 1 / the global batch's tokens (in a job of regions, the region's:
  // each region's gradient is its own batch's mean).
  o.loss_scale = 1.0 / static_cast<double>(static_cast<int64_t>(job_.batch) * job_.seq_len * job_.grad_accum *
                                           grid_.data());
  // Paged gradients (streamed weights, ZeRO-2): every micro-batch through
  // each unit at once, so that each unit is pulled once a pass and its
  // gradients leave (and are let go) once a step.
  if (pages_grads_ && job_.grad_accum > 1 && OneBackwardWritesTheGradients()) return LayerMajorPasses(o);
  return MicroBatchPasses(o);
}

bool WorkerProcess::OneBackwardWritesTheGradients() const {
  return job_.grad_accum == 1 || (pages_grads_ && model_->layer_major_slots() >= job_.grad_accum);
}

std::unique_ptr<CheckpointWriter> WorkerProcess::MakeCheckpointWriter() {
  // An elastic job's servers, and a job of regions', write the data
  // position too.
  if (reducer_ == Reducer::kParameterServers && (config_.cluster().elastic() || Regions(config_) > 1)) {
    return NoCheckpoints();
  }
  CheckpointWriterParts c;
  c.config = &config_;
  c.sync = strategy_.get();
  c.client = runtime_ ? &runtime_->client() : nullptr;
  c.rank = rank_;
  c.num_workers = num_workers_;
  // Only the data position is written here when the servers hold the rest.
  if (reducer_ == Reducer::kParameterServers && config_.checkpoint().background()) return BackgroundCheckpoints(c);
  return ForegroundCheckpoints(c);
}

void WorkerProcess::FollowMembership() {
  shares_.emplace(num_workers_, rank_, runtime_->client().welcomed_membership());
  runtime_->client().OnMembershipChange([this](const transport::MembershipChange& change) {
    shares_->Apply(change);
    strategy_->Wake();  // a worker waiting for weights may have shares to take over
  });
}

StatusOr<int64_t> WorkerProcess::StartingStep() {
  if (joining_) {
    transport::CoordinatorClient& client = runtime_->client();
    // A region rejoining: its own servers, once they have the job's state,
    // hold where it stands (their first report); an elastic job's server 0
    // the first step dealt with this worker.
    const int region = client.joining_region();
    int epoch = 0;
    transport::PeerId server = transport::MemberPeerId(client, wire::SERVER, 0);
    if (region >= 0) {
      HERD_RETURN_IF_ERROR(client.Barrier(transport::kRegionServesBarrier, wire::REGION));
      server = transport::MemberPeerId(client, wire::SERVER, region * (client.num_servers() / Regions(config_)));
    } else {
      epoch = shares_->joined_at();
    }
    HERD_ASSIGN_OR_RETURN(const StepReport at, FindJoinPoint(runtime_->push_pull(), server, epoch,
                                                             options_.LastStep(config_.train().steps())));
    if (at.data.tokens > 0) {  // a step's report, not the servers' first
      HERD_RETURN_IF_ERROR(sampler_->RestoreState(SamplerStateLine(at.data.epoch, at.data.taken, at.data.tokens,
                                                                   config_.train().seq_len(), config_.train().seed()))
                               .WithContext("the servers' data position: "));
    }
    if (region >= 0) {
      std::printf("worker %d rejoined the job with region %d: it computes from step %lld on\n", rank_, region,
                  static_cast<long long>(at.version + 1));
    } else {
      std::printf("worker %d joined the job: it computes from step %lld on (membership epoch %d)\n", rank_,
                  static_cast<long long>(at.version + 1), epoch);
    }
    std::fflush(stdout);
    return static_cast<int64_t>(at.version);
  }
  const int64_t start = resume_from_ ? resume_from_->manifest.step : 0;
  if (rank_ != 0) return start;
  if (resume_from_) {
    std::printf("resumed from %s (step %lld)\n", resume_from_->dir.c_str(), static_cast<long long>(start));
  } else if (!config_.checkpoint().init_from().empty()) {
    std::printf("initial weights from %s\n", config_.checkpoint().init_from().c_str());
  }
  PrintRunHeader(config_, job_, layout_, model_ ? model_->Describe() : "CPU", data_.train.size(),
                 plan_ ? &*plan_ : nullptr, grid_,
                 reducer_ == Reducer::kGpuCollectives ? NcclUse::kWholeStep
                                                      : (device_reduction_ ? NcclUse::kGradients : NcclUse::kNone),
                 runtime_ ? &runtime_->transport() : nullptr, pipeline_ ? &*pipeline_ : nullptr);
  if (config_.log().peak_tflops() == 0 && model_ != nullptr && model_->PeakTflops() > 0) {
    std::printf("mfu: against the datasheet peak of %s, %g TFLOP/s (log.peak_tflops overrides it)\n",
                model_->Describe().c_str(), model_->PeakTflops());
    std::fflush(stdout);
  }
  return start;
}

StepLoopParts WorkerProcess::LoopParts() {
  StepLoopParts parts;
  parts.job = &job_;
  parts.options = options_;
  parts.options.resume = resume_from_.has_value();  // a run that starts afresh starts its metrics afresh
  parts.model = model_;
  parts.strategy = strategy_.get();
  parts.home = home_.get();
  parts.compute = compute_.get();
  parts.schedule = schedule_.get();
  parts.checkpoints = checkpoints_.get();
  parts.sampler = &*sampler_;
  parts.val = data_.val.get();
  parts.weights = weights();
  parts.rank = rank_;
  parts.num_workers = num_workers_;
  parts.data_parallel = grid_.replicas();
  parts.client = runtime_ ? &runtime_->client() : nullptr;
  parts.joined_under_way = joining_;
  return parts;
}

Status WorkerProcess::Run() {
  HERD_RETURN_IF_ERROR(AllocateSpaces());
  if (in_job()) {
    HERD_RETURN_IF_ERROR(JoinJob());
  } else {
    HERD_RETURN_IF_ERROR(Prepare(nullptr));
  }
  HERD_RETURN_IF_ERROR(MakeAxes());
  HERD_RETURN_IF_ERROR(trace_.Start(config_.log().trace(), wire::WORKER, rank_, runtime_ ? &runtime_->client() : nullptr));
  HERD_ASSIGN_OR_RETURN(const int64_t start, StartingStep());
  StepLoop loop(LoopParts());
  if (!in_job()) {
    HERD_RETURN_IF_ERROR(loop.Run(start));
    return trace_.Finish(nullptr);
  }
  HERD_RETURN_IF_ERROR(runtime_->Conclude(loop.Run(start)));
  HERD_RETURN_IF_ERROR(trace_.Finish(&runtime_->client()));
  HERD_RETURN_IF_ERROR(ReportSummary(loop, start));
  HERD_RETURN_IF_ERROR(runtime_->client().Barrier(transport::kDoneBarrier));
  return runtime_->client().Leave();
}

// Every worker of a job: what it cost, for `herd bench compare` and
// curious users.
Status WorkerProcess::ReportSummary(const StepLoop& loop, int64_t start) {
  auto memory = PlanMemory(config_);
  if (!memory.ok()) return Status::OK();
  RunSummary run;
  run.role = "worker";
  run.rank = rank_;
  run.steps = loop.last_step() - start;
  // This worker's line of the plan: its stage's, or the workers' (last).
  const ProcessMemory* mine = &memory->processes.back();
  for (const ProcessMemory& p : memory->processes) {
    if (pipeline_ && p.role == "stage" && p.rank == place()[Axis::kPipeline]) mine = &p;
  }
  run.plan_bytes = mine->total();
  run.device_plan_bytes = mine->device;
  run.device_peak_bytes = model_ ? model_->DevicePeakBytes() : 0;
  run.shares_computed = loop.shares_computed();
  const transport::UcxStats ucx = runtime_->transport().stats();
  run.unauthenticated_dropped = static_cast<int64_t>(ucx.unauthenticated_dropped);
  return ReportRunSummary(run, ucx.bytes_sent, config_.log().summary_dir());
}

}  // namespace

Status RunWorker(const config::JobConfig& config, const TrainOptions& options, const transport::JoinOptions* join) {
  if (config.train().threads() > 0) omp_set_num_threads(config.train().threads());
  HERD_ASSIGN_OR_RETURN(std::unique_ptr<WorkerProcess> worker, WorkerProcess::Create(config, options, join));
  return worker->Run();
}

}  // namespace herd
