#include "sharding/traffic_plan.h"

#include <algorithm>

#include "model/llama.h"
#include "model/optim/block_quantizer.h"
#include "sharding/diloco_plan.h"
#include "sharding/job_options.h"
#include "sharding/pipeline_plan.h"
#include "sharding/shard_plan.h"
#include "sharding/tensor_slices.h"
#include "sharding/weight_window.h"

namespace herd {
namespace {

// What the window pulls (gathers) over a step, in elements.
int64_t WindowPulls(const ShardPlan& plan, const ParamLayout& layout, const config::JobConfig& config,
                    const JobOptions& job) {
  const StreamedReplay replay = ReplayOfJob(config, job.micro_batch_slots);
  // Micro-batches in turn each pull what one pass does; a layer-major
  // pass serves micro_batch_slots of them at once.
  const int passes = std::max(1, config.train().grad_accum() / job.micro_batch_slots);
  return passes * ReplayStreamedStep(plan, layout, replay).pulled;
}

// One pass of a ring of n over `elements`, each way.
double RingPass(int n, double elements, double bytes) { return (n - 1) / static_cast<double>(n) * elements * bytes; }

// A tensor-parallel worker: the group's sums in each micro-batch's passes
// (Megatron's count: the lookup and o_proj's and down_proj's outputs
// forward, the head's and each layer's two norms' input gradients
// backward, o_proj's again where FULL recomputation reruns the layer, all
// of B x T x hidden floats; the cross-entropy's statistics, 2T + 1 per
// token), each an all-reduce over the group's ring; and the packed
// gradients' all-reduce among the rank's replicas (parameter servers: the
// packed gradients pushed, the packed weights pulled).
//
// Sequence parallelism moves each all-reduce's two halves as a
// reduce-scatter and an all-gather (the same bytes), and adds what
// Megatron-LM's backward does too: each layer's two norm outputs gathered
// again for the products' weight gradients (the rows alone are kept);
// where FULL recomputation reruns a layer, its two gathers and one
// reduce-scatter are one half more than the all-reduce they replace;
// once a step, the norms' gradients summed over the group.
double TensorGroupSums(const config::JobConfig& config, const JobOptions& job) {
  const int T = config.cluster().tensor_parallel(), C = std::max(1, config.cluster().context_parallel());
  // A context-parallel rank's tokens: its chunks of each sequence.
  const double tokens = static_cast<double>(job.batch) * job.seq_len / C, L = job.shape.num_layers;
  const double d = job.shape.hidden_size;
  const double recomputed = job.recompute == Recompute::kFull ? L : 0;
  const double sums = tokens * d * (2 + 4 * L + recomputed) + tokens * (2.0 * T + 1);
  double passes = 2 * RingPass(T, sums, 4);
  if (config.cluster().sequence_parallel()) passes += RingPass(T, tokens * d * (2 * L + recomputed), 4);
  return job.grad_accum * passes;
}

// A pipeline's worker, averaged over the workers: each boundary between
// virtual stages carries every micro-batch's activations one way and their
// gradients the other. All-reduce: a tied embedding's gradient parts
// cross between the first and the last stage, and each stage's replicas
// all-reduce its range. Parameter servers: each stage pushes its range's
// gradients and pulls its weights (the tied embedding by two stages), with
// streamed weights as often as its window takes them again.
//
// With tensor parallelism each rank of a stage sends the whole activations
// to the same rank of the next, its ranges are of its packed space, and
// its group's sums are those of its stage's layers (on average over the
// stages, the whole model's over the stages).
StatusOr<WorkerTraffic> PipelineTraffic(const config::JobConfig& config, const JobOptions& job,
                                        const ParamLayout& flat, double wire) {
  HERD_ASSIGN_OR_RETURN(const PipelinePlan pipeline, PipelinePlan::FromConfig(config));
  const PipelineSchedule& s = pipeline.schedule;
  LlamaShape shape = flat.shape();
  const int tensor = pipeline.grid.degree(Axis::kTensor);
  if (tensor > 1) {
    HERD_ASSIGN_OR_RETURN(const TensorSlices slices, TensorSlices::Make(shape, tensor, 0));
    shape = slices.shape();
  }
  const ParamLayout layout(shape);  // the space a stage's worker computes in
  const double act_bytes = config.cluster().pipeline_wire_dtype() == config::ClusterConfig::BF16 ? 2 : 4;
  const double activation = static_cast<double>(job.batch) * job.seq_len * job.shape.hidden_size * act_bytes;
  const double embedding = job.shape.tie_word_embeddings ? static_cast<double>(layout.layer(0).input_norm) : 0;
  const double P = static_cast<double>(layout.size()), R = pipeline.grid.data(), W = R * s.devices;
  const double messages = (s.virtual_stages() - 1) * 2.0 * s.micro_batches * activation * R / W;
  WorkerTraffic t;
  if (config.cluster().sync() == config::ClusterConfig::PARAMETER_SERVER) {
    const double pushed = (P + embedding) * R * wire / W;
    double pulled = pushed;
    if (config.cluster().stream_weights()) {
      HERD_ASSIGN_OR_RETURN(const ShardPlan shards, ParameterServerPlan(config));
      const StreamedReplay replay = ReplayOfJob(config, job.micro_batch_slots);
      double elements = 0;
      for (int d = 0; d < s.devices; ++d) {
        elements += static_cast<double>(
            ReplayStreamedStage(shards, layout, replay, StageReplayOf(pipeline, d, layout)).pulled);
      }
      pulled = elements * R * wire / W;
    }
    t.sent = static_cast<int64_t>(messages + pushed);
    t.received = static_cast<int64_t>(messages + pulled);
    return t;
  }
  const double ring = 2 * RingPass(static_cast<int>(R), P / s.devices, wire);
  const double group = tensor > 1 ? TensorGroupSums(config, job) / s.devices : 0;
  t.sent = t.received = static_cast<int64_t>(messages + 2 * embedding * 4 * R / W + ring + group);
  return t;
}

// Context parallelism (C ranks): each micro-batch's layers gather the
// group's keys and values forward and again backward, and reduce-scatter
// their gradients (B x T x kv_dim floats each, twice: keys and values);
// each micro-batch's loss is gathered (two floats a rank).
double ContextTraffic(const JobOptions& job, int C, int64_t kv_dim) {
  if (C <= 1) return 0;
  const double kv = 2.0 * job.batch * job.seq_len * kv_dim;
  return job.grad_accum * (3 * job.shape.num_layers * RingPass(C, kv, 4) + RingPass(C, 2.0 * C, 4));
}

StatusOr<WorkerTraffic> TensorParallelTraffic(const config::JobConfig& config, const JobOptions& job) {
  const int T = config.cluster().tensor_parallel(), R = config.cluster().workers() / T;
  const int C = std::max(1, config.cluster().context_parallel());
  HERD_ASSIGN_OR_RETURN(const TensorSlices slices, TensorSlices::Make(job.shape, T, 0));
  // The packed gradients all-reduced among the rank's replicas, or pushed
  // to the servers and the weights pulled back (one of each way).
  const double packed = static_cast<double>(slices.layout().size());
  double step = config.cluster().sync() == config::ClusterConfig::PARAMETER_SERVER ? packed * 4
                                                                                  : 2 * RingPass(R, packed, 4);
  if (config.cluster().sequence_parallel()) {
    step += 2 * RingPass(T, (2 * job.shape.num_layers + 1) * job.shape.hidden_size, 4);
  }
  WorkerTraffic t;
  t.sent = t.received =
      static_cast<int64_t>(TensorGroupSums(config, job) + step + ContextTraffic(job, C, slices.shape().kv_dim()));
  return t;
}

}  // namespace

StatusOr<WorkerTraffic> PlanWorkerTraffic(const config::JobConfig& config) {
  const config::ClusterConfig& cluster = config.cluster();
  const JobOptions job = JobOptions::FromConfig(config);
  const ParamLayout layout(job.shape);
  const double P = static_cast<double>(layout.size());
  const double wire = cluster.wire_dtype() == config::ClusterConfig::BF16 ? 2 : 4;  // gradients' bytes
  WorkerTraffic t;
  if (HasPipeline(config)) return PipelineTraffic(config, job, layout, wire);
  if (cluster.tensor_parallel() > 1) return TensorParallelTraffic(config, job);
  if (cluster.sync() == config::ClusterConfig::PARAMETER_SERVER) {
    double pulled = P;
    if (cluster.stream_weights()) {
      HERD_ASSIGN_OR_RETURN(ShardPlan shards, ParameterServerPlan(config));
      pulled = static_cast<double>(WindowPulls(shards, layout, config, job));
    }
    t.sent = static_cast<int64_t>(P * wire);
    t.received = static_cast<int64_t>(pulled * wire);
    return t;
  }
  if (cluster.sync() != config::ClusterConfig::ALLREDUCE || cluster.workers() < 2) return t;
  const int W = cluster.workers(), G = ShardGroupSize(cluster, W), R = W / G;
  double bytes = 0;
  switch (cluster.zero_stage()) {
    case 0:
      bytes = 2 * RingPass(W, P, wire);
      break;
    case 1:
    case 2:
      bytes = RingPass(G, P, wire) + RingPass(G, P, 4);
      break;
    default: {
      HERD_ASSIGN_OR_RETURN(ShardPlan plan, CollectivePlan(layout, cluster, G));
      bytes = RingPass(G, P, wire) + RingPass(G, static_cast<double>(WindowPulls(plan, layout, config, job)), 4);
    }
  }
  // Hybrid: each worker's slices (1/G of the model) all-reduced among its
  // R replicas.
  if (cluster.zero_stage() > 0 && R > 1) bytes += 2 * RingPass(R, P / G, wire);
  bytes += ContextTraffic(job, cluster.context_parallel(), job.shape.kv_dim());
  t.sent = t.received = static_cast<int64_t>(bytes);
  return t;
}

StatusOr<int64_t> PlanRegionTraffic(const config::JobConfig& config) {
  const int R = Regions(config);
  if (R < 2) return 0;
  const config::DilocoConfig& d = config.cluster().diloco();
  HERD_ASSIGN_OR_RETURN(const ShardPlan shards, ParameterServerPlan(config));
  HERD_ASSIGN_OR_RETURN(const DilocoPlan diloco, DilocoPlan::Make(d, shards, config.train().steps()));
  double bytes = 0;  // one region's servers'
  for (int s = 0; s < shards.num_servers(); ++s) {
    for (int f = 0; f < diloco.fragments(); ++f) {
      // Its contribution to every other region's server of the range.
      const int64_t n = diloco.RunOf(s, f).size();
      if (n > 0) bytes += (R - 1) * static_cast<double>(ContributionBytes(d.wire_dtype(), n));
    }
  }
  return static_cast<int64_t>(R * bytes);
}

}  // namespace herd
