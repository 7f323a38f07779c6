#include "worker/run_header.h"

#include <cstdio>
#include <string>

#include "common/config.h"

namespace herd {
namespace {

using config::ClusterConfig;

// The run header's line of how a job's replicas step: parameter servers
// (and regions) or an all-reduce, with what each was given, and the
// global batch over the job's `replicas`.
void PrintReducerLine(const config::JobConfig& config, const JobOptions& job, const ShardPlan* plan, int num_workers,
                      int replicas, NcclUse nccl, const transport::UcxTransport* transport) {
  const auto& train = config.train();
  const auto& cluster = config.cluster();
  const long long tokens = static_cast<long long>(train.batch_size()) * train.seq_len() * train.grad_accum();
  const bool ps = cluster.sync() == ClusterConfig::PARAMETER_SERVER;
  if (ps && config.device().kind() == config::DeviceConfig::CUDA) {
    // Device pointers could go to a CUDA-aware UCX directly; herd does not
    // do that yet, so say which case this is.
    std::printf("GPU workers push and pull through page-locked host memory (%s)\n",
                transport->cuda_memory()
                    ? "this UCX could move CUDA memory itself; direct transfers are not used yet"
                    : "this UCX has no CUDA memory support");
  }
  if (ps && Regions(config) > 1) {
    const config::DilocoConfig& d = cluster.diloco();
    std::printf("regions: %d, each %d parameter servers and %d workers (inner AdamW); every %d steps an outer "
                "step (Nesterov, %s) | ",
                d.regions(), plan->num_servers(), num_workers / d.regions(), d.every(),
                OuterStepOf(d).Describe(d.every()).c_str());
  }
  if (ps) {
    std::printf("parameter servers: %d, workers: %d, wire %s", plan->num_servers() * Regions(config), num_workers,
                cluster.wire_dtype() == ClusterConfig::BF16 ? "bf16" : "fp32");
    if (cluster.stream_weights()) {
      std::printf(", weights streamed (%d layer%s of prefetch%s)", cluster.stream_prefetch_layers(),
                  cluster.stream_prefetch_layers() == 1 ? "" : "s",
                  job.micro_batch_slots > 1 ? ", micro-batches layer by layer" : "");
    }
  } else {
    const char* how = nccl == NcclUse::kWholeStep
                          ? "gradients by NCCL, weights and AdamW state on the device, norms by UCX ring"
                          : (nccl == NcclUse::kGradients ? "gradients by NCCL, the rest by UCX ring, the optimizer on the host"
                                                          : "UCX ring");
    std::printf("all-reduce (%s) among %d workers", how, num_workers);
    if (cluster.wire_dtype() == ClusterConfig::BF16) std::printf(", gradients bf16 on the wire");
    if (cluster.zero_stage() > 0) std::printf(", ZeRO-%d", cluster.zero_stage());
    if (ShardsInGroups(cluster)) {
      std::printf(" in shard groups of %d, replicated %d times", cluster.shard_group_size(),
                  num_workers / std::max(1, cluster.pipeline_stages()) / cluster.shard_group_size());
    }
    if (cluster.zero_stage() == 3 && nccl == NcclUse::kWholeStep) {
      std::printf(" (weights gathered on the device unit by unit as the passes reach them)");
    } else if (cluster.zero_stage() == 3) {
      std::printf(" (weights gathered %d layer%s ahead%s)", cluster.stream_prefetch_layers(),
                  cluster.stream_prefetch_layers() == 1 ? "" : "s",
                  cluster.reshard_after_forward() ? "" : ", kept from forward to backward");
    }
  }
  if (plan != nullptr) std::printf(", %zu bucket%s", plan->buckets().size(), plan->buckets().size() == 1 ? "" : "s");
  std::printf(" | batch %d x %d tokens x %d accum x %d replica%s = %lld tokens/step\n", train.batch_size(),
              train.seq_len(), train.grad_accum(), replicas, replicas == 1 ? "" : "s", tokens * replicas);
}

// The run header's line of what part of the model a worker computes, in a
// job with model axes: its pipeline stage, tensor slices, context chunks.
void PrintPlacementLine(const config::JobConfig& config, const LlamaShape& shape, const Grid& grid,
                        const ShardPlan* plan, const PipelinePlan* pipeline) {
  const auto& cluster = config.cluster();
  const int T = grid.degree(Axis::kTensor), C = grid.degree(Axis::kContext), replicas = grid.replicas();
  std::string line;
  if (pipeline != nullptr) {
    line = "pipeline: " + std::to_string(pipeline->devices()) + " stages (first layers " +
           pipeline->split.Describe() + "), schedule " + PipelineScheduleName(pipeline->schedule.kind) + ", " +
           std::to_string(pipeline->schedule.micro_batches) + " micro-batches" +
           (cluster.pipeline_wire_dtype() == ClusterConfig::BF16 ? ", activations bf16 on the wire" : "") +
           (cluster.stream_weights() ? ", each stage's weights streamed" : "");
  }
  if (T > 1) {
    line += std::string(line.empty() ? "tensor parallel: " : "; each stage tensor-parallel: ") + std::to_string(T) +
            " ranks (" + std::to_string(shape.num_heads / T) + " heads, " +
            std::to_string(shape.intermediate_size / T) + " intermediate columns and " +
            std::to_string(shape.vocab_size / T) + " vocabulary rows each" +
            (cluster.sequence_parallel() ? "; sequence parallel: the norms' and residual's rows split too" : "") +
            ")" +
            (plan != nullptr && cluster.sync() == ClusterConfig::PARAMETER_SERVER
                 ? ", each rank's slices on " + std::to_string(plan->num_servers()) + " parameter server" +
                       (plan->num_servers() == 1 ? "" : "s")
                 : "");
  }
  if (C > 1) {
    line += std::string(line.empty() ? "" : "; ") + "context parallel: " + std::to_string(C) + " ranks (chunks r and " +
            std::to_string(2 * C - 1) + "-r of each sequence's " + std::to_string(2 * C) + ", " +
            std::to_string(config.train().seq_len() / (2 * C)) + " tokens each)";
  }
  std::printf("%s; %d replica%s\n", line.c_str(), replicas, replicas == 1 ? "" : "s");
}

}  // namespace

void PrintRunHeader(const config::JobConfig& config, const JobOptions& job, const ParamLayout& layout,
                    const std::string& device, int64_t train_tokens, const ShardPlan* plan, const Grid& grid,
                    NcclUse nccl, const transport::UcxTransport* transport, const PipelinePlan* pipeline) {
  const LlamaShape& shape = layout.shape();
  const auto& train = config.train();
  std::printf("model: %.2fM parameters (%d layers, d=%d, %d heads, %d kv heads, vocab %d) | %s%s\n",
              layout.num_parameters() / 1e6, shape.num_layers, shape.hidden_size, shape.num_heads, shape.num_kv_heads,
              shape.vocab_size, transport ? "worker 0 on " : "", device.c_str());
  if (transport == nullptr) {
    const long long tokens = static_cast<long long>(train.batch_size()) * train.seq_len() * train.grad_accum();
    std::printf("data: %s (%lld tokens) | batch %d x %d tokens x %d accum = %lld tokens/step\n",
                config.data().train().c_str(), static_cast<long long>(train_tokens), train.batch_size(),
                train.seq_len(), train.grad_accum(), tokens);
  } else {
    const bool model_axes = pipeline != nullptr || grid.degree(Axis::kTensor) > 1 || grid.degree(Axis::kContext) > 1;
    if (model_axes) PrintPlacementLine(config, shape, grid, plan, pipeline);
    PrintReducerLine(config, job, plan, grid.size(), grid.replicas(), nccl, transport);
  }
  std::fflush(stdout);
}


}  // namespace herd
