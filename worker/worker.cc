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
#include "sharding/memory_plan.h"
#include "sharding/shard_plan.h"
#include "transport/join.h"
#include "transport/node_runtime.h"
#include "transport/trace_session.h"
#include "transport/wire.h"
#include "worker/collective_sync.h"
#include "worker/elastic_shares.h"
#include "worker/local_sync.h"
#include "worker/model_factory.h"
#include "worker/nccl_gradients.h"
#include "worker/parameter_server_sync.h"
#include "worker/step_loop.h"

namespace herd {
namespace {

using config::ClusterConfig;

// A worker's parts in the order they are made; they go in the reverse
// order. The buffers come first: a GPU model page-locks them and the
// transport registers them, and both must let go before they are freed.
// The runtime comes last, so it goes first: nothing it runs afterwards can
// reach into the strategy, the sampler or the buffers.
struct Worker {
  transport::TraceSession trace;  // log.trace: goes last, after everything that records spans
  std::vector<float> weights, grads;
  // cluster.stream_weights: the same flat spaces, backed only where the
  // window is (weights and grads then stay empty).
  PagedBuffer streamed_weights, streamed_grads;
  float* weights_data() { return streamed_weights.data() ? reinterpret_cast<float*>(streamed_weights.data()) : weights.data(); }
  float* grads_data() { return streamed_grads.data() ? reinterpret_cast<float*>(streamed_grads.data()) : grads.data(); }
  std::unique_ptr<Model> model;  // none when a DeviceResident strategy has its own
  std::unique_ptr<DeviceGradientReduction> device_reduction;  // CUDA workers in all-reduce mode: NCCL
  std::optional<DistributedSampler> sampler;
  std::optional<ElasticShares> shares;  // cluster.elastic
  std::unique_ptr<SyncStrategy> strategy;
  std::unique_ptr<transport::NodeRuntime> runtime;
};

// The lines a run starts with, from worker 0.
void PrintRunHeader(const config::JobConfig& config, const ParamLayout& layout, const std::string& device,
                    int64_t train_tokens, const ShardPlan* plan, int num_workers, bool nccl,
                    const transport::UcxTransport* transport) {
  const LlamaShape& shape = layout.shape();
  const auto& train = config.train();
  const auto& cluster = config.cluster();
  std::printf("model: %.2fM parameters (%d layers, d=%d, %d heads, %d kv heads, vocab %d) | %s%s\n",
              layout.num_parameters() / 1e6, shape.num_layers, shape.hidden_size, shape.num_heads, shape.num_kv_heads,
              shape.vocab_size, transport ? "worker 0 on " : "", device.c_str());
  const long long tokens = static_cast<long long>(train.batch_size()) * train.seq_len() * train.grad_accum();
  if (transport == nullptr) {
    std::printf("data: %s (%lld tokens) | batch %d x %d tokens x %d accum = %lld tokens/step\n",
                config.data().train().c_str(), static_cast<long long>(train_tokens), train.batch_size(),
                train.seq_len(), train.grad_accum(), tokens);
  } else {
    const bool ps = cluster.sync() == ClusterConfig::PARAMETER_SERVER;
    if (ps && config.device().kind() == config::DeviceConfig::CUDA) {
      // Device pointers could go to a CUDA-aware UCX directly; herd does not
      // do that yet, so say which case this is.
      std::printf("GPU workers push and pull through page-locked host memory (%s)\n",
                  transport->cuda_memory()
                      ? "this UCX could move CUDA memory itself; direct transfers are not used yet"
                      : "this UCX has no CUDA memory support");
    }
    if (ps) {
      std::printf("parameter servers: %d, workers: %d, wire %s", plan->num_servers(), num_workers,
                  cluster.wire_dtype() == ClusterConfig::BF16 ? "bf16" : "fp32");
      if (cluster.stream_weights()) {
        std::printf(", weights streamed (%d layer%s of prefetch%s)", cluster.stream_prefetch_layers(),
                    cluster.stream_prefetch_layers() == 1 ? "" : "s",
                    MicroBatchSlots(config) > 1 ? ", micro-batches layer by layer" : "");
      }
    } else {
      std::printf("all-reduce (%s) among %d workers%s", nccl ? "gradients by NCCL, the rest by UCX ring" : "UCX ring",
                  num_workers, cluster.zero_stage() == 1 ? ", ZeRO-1" : "");
    }
    std::printf(", %zu buckets | batch %d x %d tokens x %d accum x %d workers = %lld tokens/step\n",
                plan->buckets().size(), train.batch_size(), train.seq_len(), train.grad_accum(), num_workers,
                tokens * num_workers);
  }
  std::fflush(stdout);
}

}  // namespace

Status RunWorker(const config::JobConfig& config, const TrainOptions& options, const transport::JoinOptions* join) {
  const auto& train = config.train();
  if (train.threads() > 0) omp_set_num_threads(train.threads());
  const LlamaShape shape = LlamaShape::FromConfig(config.model());
  const int B = train.batch_size(), T = train.seq_len();
  const auto& cluster = config.cluster();
  const bool in_job = join != nullptr;
  // A worker joining an elastic job under way: its state (the step, the
  // data position, the weights) comes from the servers, not a checkpoint.
  // With resume_if_forming it may find the job forming instead and take
  // part in that: which it was is known once the coordinator welcomes it.
  const bool may_join = in_job && join->join;
  bool joining = may_join && !join->resume_if_forming;
  const bool ps = in_job && cluster.sync() == ClusterConfig::PARAMETER_SERVER;
  const bool collective = in_job && cluster.sync() == ClusterConfig::ALLREDUCE;
  const bool on_gpu = config.device().kind() == config::DeviceConfig::CUDA;
  // One process on a GPU runs the whole step there.
  const bool device_resident = !in_job && on_gpu;

  HERD_ASSIGN_OR_RETURN(JobData data, OpenJobData(config.data(), shape.vocab_size));
  const ParamLayout layout(shape);
  const int64_t P = layout.size();
  std::optional<ShardPlan> plan;
  if (ps) {
    HERD_ASSIGN_OR_RETURN(plan, ShardPlan::Create(layout, ShardPlanOptions::FromConfig(cluster)));
  } else if (collective) {
    HERD_ASSIGN_OR_RETURN(plan, CollectivePlan(layout, config, cluster.workers()));
  }
  std::optional<VerifiedCheckpoint> resume_from;
  if (!joining) {
    HERD_ASSIGN_OR_RETURN(resume_from, ResumePoint(config, options));
  }

  Worker w;
  const bool streamed = ps && cluster.stream_weights();
  if (streamed) {
    // Weights are guarded: a read outside the window faults.
    HERD_ASSIGN_OR_RETURN(w.streamed_weights, PagedBuffer::Reserve(P * sizeof(float), /*guarded=*/true));
    HERD_ASSIGN_OR_RETURN(w.streamed_grads, PagedBuffer::Reserve(P * sizeof(float), /*guarded=*/false));
  } else {
    w.weights.resize(P);
    if (!device_resident) w.grads.resize(P);
  }
  Model* model = nullptr;
  int rank = 0, num_workers = 1;
  // What depends on the rank; in a job, before any peer can send to us.
  auto prepare = [&](transport::CoordinatorClient* client) -> Status {
    if (client != nullptr) {
      rank = client->rank();
      num_workers = client->num_workers();
      if (may_join) joining = client->joined_under_way();
      if (joining) resume_from.reset();
    }
    if (client != nullptr && !joining) {
      HERD_RETURN_IF_ERROR(transport::AgreeOn(*client, "herd/resume",
                                              resume_from ? BaseName(resume_from->dir) : std::string("none"),
                                              "the checkpoint to resume from"));
    }
    HERD_ASSIGN_OR_RETURN(w.sampler, DistributedSampler::Create(data.train, T, num_workers, rank, train.seed()));
    HERD_RETURN_IF_ERROR(w.sampler->CheckBatch(B).WithContext("train.batch_size: "));
    if (resume_from) {
      // Every worker's state holds the same global position: worker 0's
      // serves any number of workers now.
      const std::string path = JoinPath(resume_from->dir, WorkerFileName(0));
      HERD_ASSIGN_OR_RETURN(std::string loader, ReadFile(path));
      HERD_RETURN_IF_ERROR(w.sampler->RestoreState(loader).WithContext(path + ": "));
    }
    if (device_resident) {
      HERD_ASSIGN_OR_RETURN(std::unique_ptr<cuda::DeviceTrainer> gpu, CreateDeviceTrainer(config, LocalRank(0)));
      HERD_ASSIGN_OR_RETURN(std::unique_ptr<OptimizerShard> optimizer,
                            OptimizerShard::InitOrResume(config, layout, {0, P}, resume_from));
      auto strategy = std::make_unique<DeviceResidentSync>(std::move(gpu), std::move(optimizer), w.weights_data());
      model = &strategy->evaluator();
      w.strategy = std::move(strategy);
      return Status::OK();
    }
    HERD_ASSIGN_OR_RETURN(w.model, CreateModel(config, B, T, LocalRank(rank)));
    model = w.model.get();
    if (collective && on_gpu && cluster.nccl() && BuiltWithNccl()) {
      HERD_ASSIGN_OR_RETURN(w.device_reduction,
                            ReduceGradientsWithNccl(*client, *model, cluster.zero_stage() == 1 ? &*plan : nullptr));
    }
    if (!in_job) {
      // The whole space's optimizer state; any number of shards (a
      // parameter-server checkpoint too) assembles into it.
      HERD_ASSIGN_OR_RETURN(std::unique_ptr<OptimizerShard> optimizer,
                            OptimizerShard::InitOrResume(config, layout, {0, P}, resume_from));
      w.strategy = CreateLocalSync(std::move(optimizer), w.weights_data());
    }
    return Status::OK();
  };
  if (!in_job) {
    HERD_RETURN_IF_ERROR(prepare(nullptr));
  } else {
    transport::NodeRuntime::Options o;
    o.join = *join;
    o.connect_to = {ps ? wire::SERVER : wire::WORKER};
    const bool bf16 = ps && cluster.wire_dtype() == ClusterConfig::BF16;
    if (ps) o.push_pull_piece_bytes = LargestBucketBytes(*plan, bf16 ? 2 : 4);
    HERD_ASSIGN_OR_RETURN(w.runtime,
                          transport::NodeRuntime::Join(o, [&](transport::NodeRuntime& rt, transport::CoordinatorClient& c) {
                            if (collective) rt.StartRing(c);
                            return prepare(&c);
                          }));
    transport::NodeRuntime& rt = *w.runtime;
    // A paged buffer is not registered whole (that would back and pin all
    // of it): UCX registers what it moves as it goes.
    if (!streamed) {
      HERD_RETURN_IF_ERROR(rt.transport().RegisterMemory(w.weights.data(), P * sizeof(float)));
      HERD_RETURN_IF_ERROR(rt.transport().RegisterMemory(w.grads.data(), P * sizeof(float)));
    }
    if (ps) {
      ParameterServerSyncOptions po;
      po.plan = &*plan;
      po.bf16 = bf16;
      po.elastic = cluster.elastic();
      po.stream = StreamsUpdates(config);  // as the servers do
      po.rank = rank;
      po.first_server = transport::MemberPeerId(rt.client(), wire::SERVER, 0);
      if (streamed) {
        po.streamed_weights = &w.streamed_weights;
        po.streamed_grads = &w.streamed_grads;
        po.layout = &layout;
        po.prefetch_layers = cluster.stream_prefetch_layers();
      }
      HERD_ASSIGN_OR_RETURN(w.strategy, CreateParameterServerSync(po, &rt.transport(), rt.push_pull()));
      if (po.elastic) {
        w.shares.emplace(num_workers, rank, rt.client().welcomed_membership());
        rt.client().OnMembershipChange([&w](const transport::MembershipChange& change) {
          w.shares->Apply(change);
          w.strategy->Wake();  // a worker waiting for weights may have shares to take over
        });
      }
    } else {
      CollectiveSyncOptions c;
      c.config = &config;
      c.layout = &layout;
      c.plan = &*plan;
      c.zero1 = cluster.zero_stage() == 1;
      c.collectives = rt.ring();
      c.device_reduction = w.device_reduction.get();
      HERD_ASSIGN_OR_RETURN(w.strategy, CreateCollectiveSync(c, w.weights_data(), resume_from));
    }
  }

  HERD_RETURN_IF_ERROR(w.trace.Start(config.log().trace(), wire::WORKER, rank, in_job ? &w.runtime->client() : nullptr));
  int64_t start = resume_from ? resume_from->manifest.step : 0;
  if (joining) {
    const int epoch = w.shares->joined_at();
    HERD_ASSIGN_OR_RETURN(const StepReport at,
                          FindJoinPoint(w.runtime->push_pull(), transport::MemberPeerId(w.runtime->client(), wire::SERVER, 0),
                                        epoch, options.LastStep(train.steps())));
    start = static_cast<int64_t>(at.version);
    if (at.data.tokens > 0) {  // a step's report, not the servers' first
      HERD_RETURN_IF_ERROR(w.sampler->RestoreState(
          SamplerStateLine(at.data.epoch, at.data.taken, at.data.tokens, T, train.seed())).WithContext("the servers' data position: "));
    }
    std::printf("worker %d joined the job: it computes from step %lld on (membership epoch %d)\n", rank,
                static_cast<long long>(start + 1), epoch);
    std::fflush(stdout);
  } else if (rank == 0) {
    if (resume_from) {
      std::printf("resumed from %s (step %lld)\n", resume_from->dir.c_str(), static_cast<long long>(start));
    } else if (!config.checkpoint().init_from().empty()) {
      std::printf("initial weights from %s\n", config.checkpoint().init_from().c_str());
    }
    PrintRunHeader(config, layout, model->Describe(), data.train.size(), plan ? &*plan : nullptr, num_workers,
                   w.device_reduction != nullptr, w.runtime ? &w.runtime->transport() : nullptr);
    if (config.log().peak_tflops() == 0 && model->PeakTflops() > 0) {
      std::printf("mfu: against the datasheet peak of %s, %g TFLOP/s (log.peak_tflops overrides it)\n",
                  model->Describe().c_str(), model->PeakTflops());
      std::fflush(stdout);
    }
  }
  StepLoopParts parts;
  parts.config = &config;
  parts.options = options;
  parts.options.resume = resume_from.has_value();  // a run that starts afresh starts its metrics afresh
  parts.model = model;
  parts.strategy = w.strategy.get();
  parts.sampler = &*w.sampler;
  parts.val = data.val.get();
  parts.weights = w.weights_data();
  parts.grads = device_resident ? nullptr : w.grads_data();
  parts.rank = rank;
  parts.num_workers = num_workers;
  parts.client = in_job ? &w.runtime->client() : nullptr;
  parts.shares = w.shares ? &*w.shares : nullptr;
  StepLoop loop(parts);
  if (!in_job) {
    HERD_RETURN_IF_ERROR(loop.Run(start));
    return w.trace.Finish(nullptr);
  }
  HERD_RETURN_IF_ERROR(w.runtime->Conclude(loop.Run(start)));
  HERD_RETURN_IF_ERROR(w.trace.Finish(&w.runtime->client()));

  // Every worker of a job: what it cost, for `herd bench compare` and
  // curious users.
  transport::NodeRuntime& rt = *w.runtime;
  if (auto memory = PlanMemory(config); memory.ok()) {
    RunSummary run;
    run.role = "worker";
    run.rank = rank;
    run.steps = loop.last_step() - start;
    run.plan_bytes = memory->processes.back().total();
    run.device_plan_bytes = memory->processes.back().device;
    run.device_peak_bytes = w.model ? w.model->DevicePeakBytes() : 0;
    run.shares_computed = loop.shares_computed();
    const transport::UcxStats ucx = rt.transport().stats();
    run.unauthenticated_dropped = static_cast<int64_t>(ucx.unauthenticated_dropped);
    HERD_RETURN_IF_ERROR(ReportRunSummary(run, ucx.bytes_sent, config.log().summary_dir()));
  }
  HERD_RETURN_IF_ERROR(rt.client().Barrier("herd/done"));
  return rt.client().Leave();
}

}  // namespace herd
