// herd plan CONFIG [--set path=value ...] [--mem BYTES] [--gpu-mem BYTES] [--json]
//
// Prints what every process of the job will hold (sharding/memory_plan.h;
// CUDA workers' GPU bytes in their own column) and, with --mem and/or
// --gpu-mem, the deepest model of the config's width that fits that much
// host memory per process and device memory per GPU worker.
#include <cstdint>
#include <cstdio>
#include <optional>

#include "common/config.h"
#include "common/logging.h"
#include "common/strings.h"
#include "model/param_layout.h"
#include "sharding/memory_plan.h"
#include "tools/args.h"
#include "tools/commands.h"

namespace herd::tools {
namespace {

std::string Name(const ProcessMemory& p, int workers) {
  if (p.role == "server") return "server " + std::to_string(p.rank);
  if (p.role == "worker") return workers > 1 ? "worker (each of " + std::to_string(workers) + ")" : "worker";
  return p.role;
}

void PrintJson(const config::JobConfig& config, const MemoryPlan& plan, const config::JobConfig* fit, int64_t mem,
               int64_t gpu_mem) {
  // The job's process counts, for scripts that start it (examples/slurm).
  std::printf("{\"parameters\": %lld, \"sync\": \"%s\", \"servers\": %d, \"workers\": %d, \"processes\": [",
              static_cast<long long>(plan.parameters), config::ClusterConfig::Sync_Name(config.cluster().sync()).c_str(),
              config.cluster().sync() == config::ClusterConfig::NONE ? 0 : config.cluster().servers(),
              NumWorkers(config));
  for (size_t i = 0; i < plan.processes.size(); ++i) {
    const ProcessMemory& p = plan.processes[i];
    std::printf(
        "%s{\"role\": \"%s\", \"rank\": %d, \"begin\": %lld, \"end\": %lld, \"weights\": %lld, "
        "\"optimizer\": %lld, \"gradients\": %lld, \"activations\": %lld, \"buffers\": %lld, "
        "\"runtime\": %lld, \"total\": %lld, \"device\": %lld}",
        i ? ", " : "", p.role.c_str(), p.rank, static_cast<long long>(p.range.begin),
        static_cast<long long>(p.range.end), static_cast<long long>(p.weights), static_cast<long long>(p.optimizer),
        static_cast<long long>(p.gradients), static_cast<long long>(p.activations), static_cast<long long>(p.buffers),
        static_cast<long long>(p.runtime), static_cast<long long>(p.total()), static_cast<long long>(p.device));
  }
  std::printf("]");
  if (fit != nullptr) {
    const ParamLayout layout(LlamaShape::FromConfig(fit->model()));
    std::printf(
        ", \"mem\": %lld, \"gpu_mem\": %lld, \"largest_fitting\": {\"num_hidden_layers\": %d, "
        "\"parameters\": %lld}",
        static_cast<long long>(mem), static_cast<long long>(gpu_mem), fit->model().num_hidden_layers(),
        static_cast<long long>(layout.num_parameters()));
  }
  std::printf("}\n");
}

void PrintTable(const std::string& path, const config::JobConfig& config, const MemoryPlan& plan,
                const config::JobConfig* fit, int64_t mem, int64_t gpu_mem) {
  const bool gpu = config.device().kind() == config::DeviceConfig::CUDA;
  const auto& cl = config.cluster();
  std::printf("%s: %.2fM parameters, sync %s", path.c_str(), plan.parameters / 1e6,
              config::ClusterConfig::Sync_Name(cl.sync()).c_str());
  if (cl.sync() == config::ClusterConfig::PARAMETER_SERVER) {
    std::printf(", %d servers (%s), %d workers, wire %s, buckets of %.1f MiB", cl.servers(),
                config::ClusterConfig::ShardStrategy_Name(cl.shard_strategy()).c_str(), cl.workers(),
                config::ClusterConfig::WireDType_Name(cl.wire_dtype()).c_str(), cl.bucket_mb());
  }
  if (gpu) {
    std::printf(", CUDA workers (%s)", config::DeviceConfig::DType_Name(config.device().dtype()).c_str());
  }
  std::printf("\n%-22s %-24s %11s %11s %11s %11s %11s %11s %11s%s\n", "process", "range", "weights", "adamw m+v",
              "gradients", "activations", "buffers", "runtime", "total", gpu ? "         gpu" : "");
  for (const ProcessMemory& p : plan.processes) {
    const std::string range = FormatRange(p.range.begin, p.range.end);
    std::string device;
    if (gpu) device.append(" ").append(p.device > 0 ? FormatBytes(p.device) : "-");
    std::printf("%-22s %-24s %11s %11s %11s %11s %11s %11s %11s%12s\n", Name(p, cl.workers()).c_str(), range.c_str(),
                FormatBytes(p.weights).c_str(), FormatBytes(p.optimizer).c_str(), FormatBytes(p.gradients).c_str(),
                FormatBytes(p.activations).c_str(), FormatBytes(p.buffers).c_str(), FormatBytes(p.runtime).c_str(),
                FormatBytes(p.total()).c_str(), device.c_str());
  }
  if (fit != nullptr) {
    const ParamLayout layout(LlamaShape::FromConfig(fit->model()));
    std::string budget = mem > 0 ? FormatBytes(mem) + " per process" : "";
    if (gpu_mem > 0) budget += (budget.empty() ? "" : " and ") + FormatBytes(gpu_mem) + " per GPU";
    std::printf("largest model of this width within %s: %d layers, %.2fM parameters\n", budget.c_str(),
                fit->model().num_hidden_layers(), layout.num_parameters() / 1e6);
  }
}

}  // namespace

int RunPlan(int argc, char** argv) {
  const char* usage = "usage: herd plan CONFIG [--set path=value ...] [--mem BYTES] [--gpu-mem BYTES] [--json]";
  Args args({"set", "mem", "gpu-mem"}, {"json"});
  Status st = args.Parse(argc, argv);
  if (!st.ok()) return ReportError(st.WithContext("plan: "));
  if (args.positional().size() != 1) return ReportError(Status::InvalidArgument(usage));
  auto config = LoadJobConfig(args.positional()[0], args.GetAll("set"));
  if (!config.ok()) return ReportError(config.status());
  auto plan = PlanMemory(*config);
  if (!plan.ok()) return ReportError(plan.status().WithContext(args.positional()[0] + ": "));
  int64_t budget[2] = {0, 0};  // --mem, --gpu-mem
  const char* flags[2] = {"mem", "gpu-mem"};
  for (int i = 0; i < 2; ++i) {
    if (!args.Has(flags[i])) continue;
    budget[i] = ParseByteSize(args.Get(flags[i]));
    if (budget[i] <= 0) {
      return ReportError(Status::InvalidArgument(std::string("--") + flags[i] + " " + args.Get(flags[i]) +
                                                 ": expected a size such as 24GiB"));
    }
  }
  if (budget[1] > 0 && config->device().kind() != config::DeviceConfig::CUDA) {
    return ReportError(Status::InvalidArgument("--gpu-mem: the job's workers are not on GPUs (device.kind CPU)"));
  }
  std::optional<config::JobConfig> fit;
  if (budget[0] > 0 || budget[1] > 0) {
    auto best = LargestFitting(*config, budget[0] > 0 ? budget[0] : INT64_MAX, budget[1]);
    if (!best.ok()) return ReportError(best.status().WithContext("plan: "));
    fit = *best;
  }
  if (args.Has("json")) {
    PrintJson(*config, *plan, fit ? &*fit : nullptr, budget[0], budget[1]);
  } else {
    PrintTable(args.positional()[0], *config, *plan, fit ? &*fit : nullptr, budget[0], budget[1]);
  }
  return 0;
}

}  // namespace herd::tools
