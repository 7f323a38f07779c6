// herd plan CONFIG [--set path=value ...] [--mem BYTES] [--gpu-mem BYTES] [--frontier] [--json]
//
// Prints what every process of the job will hold (sharding/memory_plan.h;
// CUDA workers' GPU bytes in their own column), what a worker's link
// carries per step (sharding/traffic_plan.h) and, with --mem and/or
// --gpu-mem, the deepest model of the config's width that fits that much
// host memory per process and device memory per GPU worker. --frontier
// asks that for every mode herd has (DDP, ZeRO-1/2/3, parameter servers, with
// full activation recomputation, with streamed weights, and both) at the job's
// worker and server counts, batch and sequence length, and whether each
// of a few standard shapes fits: the ZeRO paper's table for this job.
#include <algorithm>
#include <cstdint>
#include <iterator>
#include <cstdio>
#include <map>
#include <optional>
#include <tuple>

#include <nlohmann/json.hpp>

#include "common/config.h"
#include "common/logging.h"
#include "common/strings.h"
#include "model/param_layout.h"
#include "sharding/grid.h"
#include "sharding/memory_plan.h"
#include "sharding/pipeline_plan.h"
#include "sharding/traffic_plan.h"
#include "tools/args.h"
#include "tools/commands.h"

namespace herd::tools {
namespace {

std::string Name(const ProcessMemory& p, int workers) {
  if (p.role == "server") return "server " + std::to_string(p.rank);
  if (p.role == "worker") return workers > 1 ? "worker (each of " + std::to_string(workers) + ")" : "worker";
  if (p.role == "stage") {
    return "stage " + std::to_string(p.rank) + (p.count > 1 ? " (each of " + std::to_string(p.count) + ")" : "");
  }
  return p.role;
}

// The groups each worker sums with, by kind: its tensor group, its
// context group, and its gradient group (a tensor rank's slices with its
// kind across replicas, context ranks and regions; a pipeline's: of its
// stage). Every worker is in one group of each kind, so the groups are
// listed once and each worker names its own: linear in the workers.
struct GridGroups {
  enum Kind { kTensor, kContext, kGradient };
  static std::vector<Axis> AxesOf(int kind) {
    if (kind == kTensor) return {Axis::kTensor};
    if (kind == kContext) return {Axis::kContext};
    return {Axis::kContext, Axis::kShard, Axis::kReplicate, Axis::kRegion};
  }
  std::vector<std::vector<int>> groups[3];
  std::vector<int> group_of[3];  // by kind, by rank: the index of its group

  explicit GridGroups(const Grid& grid) {
    for (int k = 0; k < 3; ++k) {
      std::vector<int> index_of_leader(grid.size(), -1);
      for (int w = 0; w < grid.size(); ++w) {
        GridCoords leader = grid.CoordsOf(w);
        for (Axis a : AxesOf(k)) leader[a] = 0;
        int& index = index_of_leader[grid.RankOf(leader)];
        if (index < 0) {
          index = static_cast<int>(groups[k].size());
          groups[k].emplace_back();
        }
        groups[k][index].push_back(w);
        group_of[k].push_back(index);
      }
    }
  }
  const std::vector<int>& GroupOf(Kind kind, int rank) const { return groups[kind][group_of[kind][rank]]; }
};

std::string Ranks(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ",") + std::to_string(r);
  return s;
}

// The same for a person: a long group by its ends and size.
std::string RanksBrief(const std::vector<int>& ranks) {
  if (ranks.size() <= 16) return Ranks(ranks);
  return Ranks({ranks.begin(), ranks.begin() + 4}) + ",...," + std::to_string(ranks.back()) + " (" +
         std::to_string(ranks.size()) + " workers)";
}

bool HasGrid(const config::JobConfig& config) {
  return config.cluster().tensor_parallel() > 1 || config.cluster().context_parallel() > 1;
}

// "region 1 x pipeline 2 x data 2 x context 1 x tensor 2 (rank = ((stage x 2
// + replica) x 1 + context) x 2 + tensor)": the degrees and the one rank order.
std::string GridShape(const Grid& grid) {
  auto d = [&grid](Axis a) { return std::to_string(grid.degree(a)); };
  std::string order = "stage";
  if (grid.degree(Axis::kRegion) > 1) order = "(region x " + d(Axis::kPipeline) + " + stage)";
  return grid.Describe() + " (rank = ((" + order + " x " + std::to_string(grid.data()) + " + replica) x " +
         d(Axis::kContext) + " + context) x " + d(Axis::kTensor) + " + tensor)";
}

void PrintJson(const config::JobConfig& config, const MemoryPlan& plan, const WorkerTraffic& traffic,
               int64_t region_bytes, const config::JobConfig* fit, int64_t mem, int64_t gpu_mem) {
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
  std::printf("], \"worker_traffic\": {\"sent\": %lld, \"received\": %lld}", static_cast<long long>(traffic.sent),
              static_cast<long long>(traffic.received));
  if (region_bytes > 0) {
    std::printf(", \"region_traffic\": {\"per_outer_period\": %lld, \"every\": %d}",
                static_cast<long long>(region_bytes), config.cluster().diloco().every());
  }
  if (HasGrid(config)) {
    const Grid grid = Grid::FromConfig(config);
    std::printf(", \"grid\": {\"data\": %d, \"pipeline\": %d, \"context\": %d, \"tensor\": %d, \"workers\": [",
                grid.replicas(), grid.degree(Axis::kPipeline), grid.degree(Axis::kContext),
                grid.degree(Axis::kTensor));
    const GridGroups groups(grid);
    for (int w = 0; w < grid.size(); ++w) {
      const GridCoords g = grid.CoordsOf(w);
      std::printf("%s{\"rank\": %d, \"replica\": %d, \"stage\": %d, \"context\": %d, \"tensor\": %d, "
                  "\"tensor_group\": %d, \"context_group\": %d, \"gradient_group\": %d}",
                  w ? ", " : "", w, grid.ReplicaOf(w), g[Axis::kPipeline], g[Axis::kContext], g[Axis::kTensor],
                  groups.group_of[GridGroups::kTensor][w], groups.group_of[GridGroups::kContext][w],
                  groups.group_of[GridGroups::kGradient][w]);
    }
    // The groups, by index: the ranks of each.
    const char* names[3] = {"tensor_groups", "context_groups", "gradient_groups"};
    for (int k = 0; k < 3; ++k) {
      std::printf("], \"%s\": [", names[k]);
      for (size_t i = 0; i < groups.groups[k].size(); ++i) {
        std::printf("%s[%s]", i ? ", " : "", Ranks(groups.groups[k][i]).c_str());
      }
    }
    std::printf("]}");
  }
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

// A pipeline's stages (layers, ranges, share of the FLOPs), its schedule's
// table and the idle share theory gives it.
void PrintPipeline(const PipelinePlan& p) {
  const PipelineSchedule& s = p.schedule;
  double flops = 0;
  for (const PipelineStage& st : p.split.stages()) flops += st.flops_per_token;
  // Backward as twice forward, as the schedules' theory counts it; split
  // (ZERO_BUBBLE), its input and weight parts as long as a forward each.
  const PipelineTimes times = s.kind == PipelineScheduleKind::kZeroBubble ? PipelineTimes{1, 1, 1} : PipelineTimes{};
  const double idle = TheoreticalBubble(s.kind, s.devices, s.chunks, s.micro_batches, times);
  std::string virtual_stages;
  if (s.chunks > 1) {
    virtual_stages = " x ";
    virtual_stages += std::to_string(s.chunks);
    virtual_stages += " virtual";
  }
  std::printf("pipeline: %d stages%s, %s, %d micro-batches, %d replica%s: idle %.1f%% of a step in theory\n",
              s.devices, virtual_stages.c_str(),
              PipelineScheduleName(s.kind), s.micro_batches, p.grid.data(), p.grid.data() == 1 ? "" : "s", 100 * idle);
  for (int vs = 0; vs < s.virtual_stages(); ++vs) {
    const PipelineStage& st = p.split.stage(vs);
    const int device = s.DeviceOf(vs);
    // A stage's workers: a block of consecutive ranks.
    const std::vector<int> stage = p.grid.GroupOf(p.grid.Along(0, Axis::kPipeline, device),
                                                  {Axis::kTensor, Axis::kContext, Axis::kShard, Axis::kReplicate});
    std::string who = "worker ";
    who += std::to_string(stage.front());
    if (stage.size() > 1) {
      who += '-';
      who += std::to_string(stage.back());
    }
    std::string chunk;
    if (s.chunks > 1) {
      chunk = '.';
      chunk += std::to_string(s.ChunkOf(vs));
    }
    std::printf("  stage %d%s (%s): layers %d-%d%s%s, %s, %.0f%% of the FLOPs\n", device, chunk.c_str(), who.c_str(),
                st.layers.first,
                st.layers.end - 1, vs == 0 ? " + embedding" : "",
                vs == s.virtual_stages() - 1 ? (st.reads_embedding ? " + norm, head (tied)" : " + norm, head") : "",
                FormatRange(st.params.begin, st.params.end).c_str(), 100 * st.flops_per_token / flops);
  }
  std::printf("schedule (F forward, B backward of a micro-batch%s):\n", s.chunks > 1 ? ".chunk" : "");
  const std::vector<std::string> lines = Split(RenderPipelineSchedule(s), '\n');
  for (size_t d = 0; d < lines.size(); ++d) std::printf("  stage %zu: %s\n", d, lines[d].c_str());
}

void PrintTable(const std::string& path, const config::JobConfig& config, const MemoryPlan& plan,
                const WorkerTraffic& traffic, int64_t region_bytes, const config::JobConfig* fit, int64_t mem,
                int64_t gpu_mem, const PipelinePlan* pipeline) {
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
  if (traffic.sent > 0 || traffic.received > 0) {
    std::printf("a worker's link per step: %s sent, %s received\n", FormatBytes(traffic.sent).c_str(),
                FormatBytes(traffic.received).c_str());
  }
  if (region_bytes > 0) {
    const config::DilocoConfig& d = cl.diloco();
    std::printf("regions: %d (%d servers, %d workers each), an outer step every %d steps in %d fragment%s, wire %s: "
                "%s between regions a period, %s per 1000 steps\n",
                d.regions(), cl.servers() / d.regions(), cl.workers() / d.regions(), d.every(), d.fragments(),
                d.fragments() == 1 ? "" : "s", config::DilocoConfig::WireDtype_Name(d.wire_dtype()).c_str(),
                FormatBytes(region_bytes).c_str(), FormatBytes(region_bytes * 1000 / d.every()).c_str());
  }
  if (pipeline != nullptr) PrintPipeline(*pipeline);
  const Grid grid = Grid::FromConfig(config);
  if (grid.size() > 1) std::printf("grid: %s\n", GridShape(grid).c_str());
  if (HasGrid(config)) {
    const bool pipeline_grid = cl.pipeline_stages() > 1;
    const GridGroups groups(grid);
    for (int w = 0; w < grid.size(); ++w) {
      if (w == 8 && grid.size() > 9) {
        std::printf("  ... (--json lists every worker)\n");
        break;
      }
      const GridCoords g = grid.CoordsOf(w);
      const std::string where = pipeline_grid ? "stage " + std::to_string(g[Axis::kPipeline])
                                              : "context rank " + std::to_string(g[Axis::kContext]);
      const std::string context =
          pipeline_grid ? "" : ", context group " + RanksBrief(groups.GroupOf(GridGroups::kContext, w));
      std::printf("  worker %d: replica %d, %s, tensor rank %d; sums with: tensor group %s%s, gradients %s%s\n",
                  w, grid.ReplicaOf(w), where.c_str(), g[Axis::kTensor],
                  RanksBrief(groups.GroupOf(GridGroups::kTensor, w)).c_str(), context.c_str(),
                  RanksBrief(groups.GroupOf(GridGroups::kGradient, w)).c_str(),
                  cl.sync() == config::ClusterConfig::PARAMETER_SERVER ? " (on the servers)" : "");
    }
  }
  if (fit != nullptr) {
    const ParamLayout layout(LlamaShape::FromConfig(fit->model()));
    std::string budget = mem > 0 ? FormatBytes(mem) + " per process" : "";
    if (gpu_mem > 0) budget += (budget.empty() ? "" : " and ") + FormatBytes(gpu_mem) + " per GPU";
    std::printf("largest model of this width within %s: %d layers, %.2fM parameters\n", budget.c_str(),
                fit->model().num_hidden_layers(), layout.num_parameters() / 1e6);
  }
}

// The modes the frontier compares, as changes to the job's config (its
// worker count, and server count for the servers, kept).
struct Mode {
  const char* name;
  config::ClusterConfig::Sync sync;
  int zero_stage;
  config::TrainConfig::Recompute recompute;
  bool stream;     // cluster.stream_weights
  int replicas = 1;  // > 1: hybrid sharding, shard groups of workers / replicas
  bool pipeline = false;  // a stage a worker (1F1B, at least a micro-batch a stage)
  bool tensor = false;    // every worker a tensor-parallel rank of one group (CPU workers);
                          // with `pipeline`, two stages of a group of half the workers each
  bool context = false;   // every worker a context-parallel rank of one group (CPU workers)
};
constexpr Mode kModes[] = {
    {"DDP", config::ClusterConfig::ALLREDUCE, 0, config::TrainConfig::NONE, false},
    {"ZeRO-1", config::ClusterConfig::ALLREDUCE, 1, config::TrainConfig::NONE, false},
    {"ZeRO-2", config::ClusterConfig::ALLREDUCE, 2, config::TrainConfig::NONE, false},
    {"ZeRO-3", config::ClusterConfig::ALLREDUCE, 3, config::TrainConfig::NONE, false},
    {"HSDP (ZeRO-3, 2 groups)", config::ClusterConfig::ALLREDUCE, 3, config::TrainConfig::NONE, false, 2},
    {"PS", config::ClusterConfig::PARAMETER_SERVER, 0, config::TrainConfig::NONE, false},
    {"PS + recompute", config::ClusterConfig::PARAMETER_SERVER, 0, config::TrainConfig::FULL, false},
    {"PS + streaming", config::ClusterConfig::PARAMETER_SERVER, 0, config::TrainConfig::NONE, true},
    {"PS + streaming + recompute", config::ClusterConfig::PARAMETER_SERVER, 0, config::TrainConfig::FULL, true},
    {"pipeline stages", config::ClusterConfig::ALLREDUCE, 0, config::TrainConfig::NONE, false, 1, true},
    {"PS + pipeline stages", config::ClusterConfig::PARAMETER_SERVER, 0, config::TrainConfig::NONE, false, 1,
     true},
    {"tensor parallel", config::ClusterConfig::ALLREDUCE, 0, config::TrainConfig::NONE, false, 1, false, true},
    {"PS + tensor parallel", config::ClusterConfig::PARAMETER_SERVER, 0, config::TrainConfig::NONE, false, 1, false,
     true},
    {"pipeline 2 x tensor", config::ClusterConfig::ALLREDUCE, 0, config::TrainConfig::NONE, false, 1, true, true},
    {"context parallel", config::ClusterConfig::ALLREDUCE, 0, config::TrainConfig::NONE, false, 1, false, false,
     true},
};

// Standard shapes, from their HuggingFace config.json.
struct StandardShape {
  const char* name;
  int vocab, hidden, intermediate, layers, heads, kv_heads;
  bool tied;
};
constexpr StandardShape kShapes[] = {
    {"SmolLM-135M", 49152, 576, 1536, 30, 9, 3, true},      {"SmolLM-360M", 49152, 960, 2560, 32, 15, 5, true},
    {"TinyLlama-1.1B", 32000, 2048, 5632, 22, 32, 4, false}, {"SmolLM-1.7B", 49152, 2048, 8192, 24, 32, 32, true},
    {"Llama-3-8B", 128256, 4096, 14336, 32, 32, 8, false},
};

// 135M, 1.10B.
std::string Parameters(int64_t n) {
  char s[32];
  if (n >= 1000000000) {
    std::snprintf(s, sizeof s, "%.2fB", n / 1e9);
  } else {
    std::snprintf(s, sizeof s, "%.0fM", n / 1e6);
  }
  return s;
}

config::JobConfig InMode(const config::JobConfig& job, const Mode& mode) {
  config::JobConfig c = job;
  auto* cl = c.mutable_cluster();
  cl->set_sync(mode.sync);
  cl->set_zero_stage(mode.zero_stage);
  cl->set_workers(std::max(1, cl->workers()));
  cl->set_servers(mode.sync == config::ClusterConfig::PARAMETER_SERVER ? std::max(1, cl->servers()) : 0);
  c.mutable_train()->set_recompute(mode.recompute);
  cl->set_stream_weights(mode.stream);
  cl->set_shard_group_size(mode.replicas > 1 ? cl->workers() / mode.replicas : 0);
  // CUDA workers shard in groups over the UCX ring only.
  if (c.device().kind() == config::DeviceConfig::CUDA && mode.replicas > 1) cl->set_nccl(false);
  const int stages = !mode.pipeline ? 1 : mode.tensor ? 2 : cl->workers();
  cl->set_pipeline_stages(stages);
  cl->set_tensor_parallel(mode.tensor ? cl->workers() / stages : 1);
  cl->set_context_parallel(mode.context ? cl->workers() : 1);
  if (mode.pipeline) {
    cl->set_pipeline_schedule(config::ClusterConfig::ONE_F_ONE_B);
    c.mutable_train()->set_grad_accum(std::max(c.train().grad_accum(), stages));
  }
  return c;
}

config::JobConfig WithShape(const config::JobConfig& job, const StandardShape& s) {
  config::JobConfig c = job;
  auto* m = c.mutable_model();
  m->set_vocab_size(s.vocab);
  m->set_hidden_size(s.hidden);
  m->set_intermediate_size(s.intermediate);
  m->set_num_hidden_layers(s.layers);
  m->set_num_attention_heads(s.heads);
  m->set_num_key_value_heads(s.kv_heads);
  m->set_tie_word_embeddings(s.tied);
  return c;
}

// The frontier's first lines: the budget and the columns, or the JSON's start.
void PrintFrontierHead(const config::JobConfig& job, int64_t mem, int64_t gpu_mem, bool json) {
  if (json) {
    std::printf("{\"mem\": %lld, \"gpu_mem\": %lld, \"frontier\": [", static_cast<long long>(mem),
                static_cast<long long>(gpu_mem));
    return;
  }
  const auto& train = job.train();
  std::string budget = mem > 0 ? FormatBytes(mem) + " per process" : "";
  if (gpu_mem > 0) budget += (budget.empty() ? "" : " and ") + FormatBytes(gpu_mem) + " per GPU";
  std::printf("what fits within %s: %d workers (PS: %d servers), batch %d x %d tokens, %s workers\n",
              budget.c_str(), std::max(1, job.cluster().workers()), std::max(1, job.cluster().servers()),
              train.batch_size(), train.seq_len(),
              job.device().kind() == config::DeviceConfig::CUDA ? "GPU" : "CPU");
  std::printf("(each shape: fits or not, and the %s)\n",
              gpu_mem > 0 ? "device memory of a GPU worker" : "memory of the largest process");
  std::printf("%-27s %-26s", "mode", ("deepest at d" + std::to_string(job.model().hidden_size())).c_str());
  for (const StandardShape& s : kShapes) std::printf(" %15s", s.name);
  std::printf("\n");
}

// Whether `mode` can run the job's workers (hybrid groups of at least 2,
// model axes on CPU workers, context chunks that split the sequence).
bool ModeRunsHere(const Mode& mode, const config::JobConfig& job) {
  const int workers = std::max(1, job.cluster().workers());
  const bool gpu = job.device().kind() == config::DeviceConfig::CUDA;
  if (mode.replicas > 1 && (workers % mode.replicas != 0 || workers < 2 * mode.replicas)) return false;
  if (mode.pipeline && workers < 2) return false;
  if (mode.tensor && (workers < 2 || gpu)) return false;
  if (mode.tensor && mode.pipeline && (workers < 4 || workers % 2 != 0)) return false;
  // Context parallelism: each sequence in 2 x workers equal chunks.
  return !mode.context || (workers >= 2 && !gpu && job.train().seq_len() % (2 * workers) == 0);
}

Status PrintFrontier(const config::JobConfig& job, int64_t mem, int64_t gpu_mem, bool json) {
  const int64_t host = mem > 0 ? mem : INT64_MAX;
  PrintFrontierHead(job, mem, gpu_mem, json);
  bool first = true;
  for (size_t i = 0; i < std::size(kModes); ++i) {
    if (!ModeRunsHere(kModes[i], job)) continue;
    const config::JobConfig c = InMode(job, kModes[i]);
    int layers = 0;
    int64_t parameters = 0;
    // Tensor parallelism splits the heads, the intermediate columns and the
    // vocabulary: a shape the workers do not divide has no row entry.
    auto splits = [&](const config::ModelConfig& m) {
      const int T = c.cluster().tensor_parallel();
      return m.num_attention_heads() % T == 0 && m.num_key_value_heads() % T == 0 && m.intermediate_size() % T == 0 &&
             m.vocab_size() % T == 0;
    };
    auto best = splits(c.model()) ? LargestFitting(c, host, gpu_mem) : StatusOr<config::JobConfig>(Status::NotFound(""));
    if (best.ok()) {
      layers = best->model().num_hidden_layers();
      parameters = ParamLayout(LlamaShape::FromConfig(best->model())).num_parameters();
    } else if (best.status().code() != Status::Code::kNotFound) {
      return best.status();
    }
    if (json) {
      std::printf("%s{\"mode\": \"%s\", \"layers\": %d, \"parameters\": %lld, \"shapes\": {", first ? "" : ", ",
                  kModes[i].name, layers, static_cast<long long>(parameters));
    } else {
      const std::string deepest =
          layers > 0 ? std::to_string(layers) + " layers, " + Parameters(parameters) : std::string("not one layer");
      std::printf("%-27s %-26s", kModes[i].name, deepest.c_str());
    }
    for (size_t k = 0; k < std::size(kShapes); ++k) {
      const config::JobConfig shaped = WithShape(c, kShapes[k]);
      if (!splits(shaped.model())) {
        if (json) {
          std::printf("%s\"%s\": {\"fits\": false, \"splits\": false}", k ? ", " : "", kShapes[k].name);
        } else {
          std::printf(" %15s", ("T=" + std::to_string(c.cluster().tensor_parallel()) + ": no split").c_str());
        }
        continue;
      }
      HERD_ASSIGN_OR_RETURN(const MemoryPlan plan, PlanMemory(shaped));
      const bool fits = FitsBudget(plan, host, gpu_mem);
      int64_t device = 0;
      for (const ProcessMemory& p : plan.processes) device = std::max(device, p.device);
      const int64_t process = plan.largest().total();
      if (json) {
        std::printf("%s\"%s\": {\"fits\": %s, \"largest_process\": %lld, \"largest_device\": %lld}", k ? ", " : "",
                    kShapes[k].name, fits ? "true" : "false", static_cast<long long>(process),
                    static_cast<long long>(device));
      } else {
        // What binds: a GPU worker's device memory, else the largest process.
        std::printf(" %15s", ((fits ? "yes " : "no ") + FormatBytes(gpu_mem > 0 ? device : process)).c_str());
      }
    }
    std::printf(json ? "}}" : "\n");
    first = false;
  }
  if (json) std::printf("]}\n");
  return Status::OK();
}

}  // namespace

namespace {

// The table of what is not built yet (common/config.h), one JSON object a
// row: for programs (tests/docs_test.py holds docs/modes.md to it).
void PrintNotBuilt() {
  for (const NotBuilt& row : NotBuiltTable()) {
    const nlohmann::json line = {
        {"setting", row.setting}, {"with", row.with}, {"reason", row.reason}, {"example", row.example}};
    std::printf("%s\n", line.dump().c_str());
  }
}

}  // namespace

int RunPlan(int argc, char** argv) {
  const char* usage =
      "usage: herd plan CONFIG [--set path=value ...] [--mem BYTES] [--gpu-mem BYTES] [--frontier] [--json]\n"
      "       herd plan --not-built";
  Args args({"set", "mem", "gpu-mem"}, {"json", "frontier", "not-built"});
  Status st = args.Parse(argc, argv);
  if (!st.ok()) return ReportError(st.WithContext("plan: "));
  if (args.Has("not-built") && args.positional().empty()) {
    PrintNotBuilt();
    return 0;
  }
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
  if (args.Has("frontier")) {
    if (budget[0] <= 0 && budget[1] <= 0) {
      return ReportError(Status::InvalidArgument("--frontier needs a budget: --mem BYTES and/or --gpu-mem BYTES"));
    }
    st = PrintFrontier(*config, budget[0], budget[1], args.Has("json"));
    return st.ok() ? 0 : ReportError(st.WithContext("plan: "));
  }
  std::optional<config::JobConfig> fit;
  if (budget[0] > 0 || budget[1] > 0) {
    auto best = LargestFitting(*config, budget[0] > 0 ? budget[0] : INT64_MAX, budget[1]);
    if (!best.ok()) return ReportError(best.status().WithContext("plan: "));
    fit = *best;
  }
  auto traffic = PlanWorkerTraffic(*config);
  if (!traffic.ok()) return ReportError(traffic.status().WithContext(args.positional()[0] + ": "));
  auto region_bytes = PlanRegionTraffic(*config);
  if (!region_bytes.ok()) return ReportError(region_bytes.status().WithContext(args.positional()[0] + ": "));
  if (args.Has("json")) {
    PrintJson(*config, *plan, *traffic, *region_bytes, fit ? &*fit : nullptr, budget[0], budget[1]);
  } else {
    std::optional<PipelinePlan> pipeline;
    if (HasPipeline(*config)) {
      auto made = PipelinePlan::FromConfig(*config);
      if (!made.ok()) return ReportError(made.status().WithContext(args.positional()[0] + ": "));
      pipeline = *std::move(made);
    }
    PrintTable(args.positional()[0], *config, *plan, *traffic, *region_bytes, fit ? &*fit : nullptr, budget[0],
               budget[1], pipeline ? &*pipeline : nullptr);
  }
  return 0;
}

}  // namespace herd::tools
