// Job configuration: loading a text-format JobConfig, applying --set
// overrides, and validating values.
//
// Every error is one line that says where: "FILE:LINE:COL: ..." for a field
// written in the file, "--set PATH=VALUE: ..." for an override, or
// "FILE: model.x (default N): ..." for a default that does not fit the rest.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "proto/herd.pb.h"

namespace herd {

using config::JobConfig;

// Compute threads per process beyond which OpenMP runtimes fail (libgomp
// crashes creating 100,000): train.threads and --threads stop here.
inline constexpr int kMaxThreads = 1024;
// A config file larger than this is not a config (e.g. /dev/zero, a
// token file given by mistake).
inline constexpr int64_t kMaxConfigBytes = 4ll << 20;

// Bounds on the counts every table of a job is sized from, checked (in
// 64-bit or wider arithmetic) before anything is built from them, so that
// no product overflows and `herd plan` answers any config in well under a
// second. Workers and servers: the largest published training job ran on
// 16,384 accelerators (Llama 3 405B), and the coordinator holds one
// connection a process.
inline constexpr int kMaxWorkers = 16384;
inline constexpr int kMaxServers = 16384;
// 30 times the deepest published LLMs (126 layers), and shallow enough that
// the layout's per-layer tables, and `herd plan --mem`'s search for the
// deepest model that fits, stay small.
inline constexpr int kMaxLayers = 4096;
// Micro-batches a step: every worker draws a step's micro-batches before
// its first forward, and a pipeline's schedule lists each one.
inline constexpr int kMaxGradAccum = 65536;
// A pipeline schedule's passes, pipeline stages x virtual stages x
// micro-batches: each is a row of every stage's table (Megatron's largest
// runs have tens of thousands).
inline constexpr int64_t kMaxPipelinePasses = int64_t{1} << 18;
// What one process may be planned to hold: 64 PiB, far beyond any machine,
// and far enough below 2^63 that the memory plan's sums of such terms
// cannot overflow.
inline constexpr int64_t kMaxProcessBytes = int64_t{1} << 56;

// What herd does not build yet: one setting together with another axis or
// setting. The one table of such refusals: the config check refuses each
// row in one line (the setting: the reason), `herd plan --not-built` prints
// it, docs/modes.md lists it (tests/docs_test.py holds the two alike), and
// each row's example is a job that has both, which the tests see refused.
struct NotBuilt {
  const char* setting;  // the field the refusal names
  const char* with;     // the other axis or setting, in words
  const char* reason;
  const char* example;  // a textproto fragment (cluster, device) of a job with both
  bool (*given)(const JobConfig&);
};
const std::vector<NotBuilt>& NotBuiltTable();

// Loads `path`, applies `overrides` ("a.b.c=value", in order) and validates.
StatusOr<JobConfig> LoadJobConfig(const std::string& path, const std::vector<std::string>& overrides);

// Parses text-format JobConfig from a string; `origin` names it in errors.
StatusOr<JobConfig> ParseJobConfig(const std::string& text, const std::string& origin,
                                   const std::vector<std::string>& overrides = {});

// Applies one "a.b.c=value" override.
Status ApplyOverride(const std::string& assignment, JobConfig* config);

// Checks values and their relations (e.g. heads divisible by kv heads).
// Errors name the field path, e.g. "model.num_key_value_heads: ...".
Status ValidateJobConfig(const JobConfig& config);
// The part of it that a DiLoCo schedule's fragments, period and overlap
// keep among themselves (sharding/diloco_plan.h checks them again where a
// plan is made from a config no one validated).
Status ValidateDilocoSchedule(const config::DilocoConfig& diloco);

// The DiLoCo outer step in force. cluster.diloco.outer_lr and
// outer_momentum are kept as given; each one left unset takes the default
// for the period H (cluster.diloco.every): DiLoCo's lr 0.7 with Nesterov
// momentum 0.9 from H = kDilocoTunedEvery inner steps, where DiLoCo tuned
// them, and below it lr 1 without momentum (the mean of the regions'
// weights), since that momentum overshoots on short periods.
inline constexpr int kDilocoTunedEvery = 100;
struct OuterStep {
  double lr = 0;
  double momentum = 0;
  bool lr_given = false, momentum_given = false;
  // "lr 1, momentum 0 (the default for every 10 < 100)", "lr 0.5, momentum
  // 0.9 (lr as given, momentum the default for every 500 >= 100)".
  std::string Describe(int every) const;
};
OuterStep OuterStepOf(const config::DilocoConfig& diloco);

// Text format of the whole config with defaults filled in (the outer step's
// as OuterStepOf resolves them), for logs and checkpoints.
std::string ConfigToText(const JobConfig& config);

// The job's workers: cluster.workers, or 1 for one process (sync NONE).
int NumWorkers(const JobConfig& config);
// The regions of a parameter-server job (cluster.diloco.regions; 1
// without): region k's servers are ranks k·S/R …, its workers k·W/R ….
int Regions(const JobConfig& config);
// The region of a server or worker of that rank (0 without regions).
int RegionOf(const JobConfig& config, bool server, int rank);
// The same from the counts alone: rank `rank` of `count` processes of a
// role, in `regions` blocks of consecutive ranks.
int RegionOfRank(int rank, int count, int regions);
// The replicas that each take a share of the global batch: the workers,
// over cluster.pipeline_stages, cluster.tensor_parallel and
// cluster.context_parallel (a pipeline's stages, a tensor-parallel group
// and a context-parallel group share one).
int DataParallelReplicas(const JobConfig& config);

// Parameter-server mode steps each bucket as soon as its sum is complete
// (and workers pull it at once) when nothing global enters the update: no
// clipping (the norm), no spike guard (the norm and the loss), and not an
// elastic job (whose steps are transactions).
bool StreamsUpdates(const JobConfig& config);
// ZeRO-3's owners step each slice as soon as its gradients are reduced,
// for the same reason (StreamsUpdates), when one shard group holds every
// slice (no hybrid replicas whose all-reduce would come first).
bool StepsSlicesAsScattered(const JobConfig& config);
// Whether a worker holds only a window of the weights: streamed from the
// parameter servers (cluster.stream_weights) or gathered from the other
// workers (ZeRO-3).
bool WorkersHoldAWindow(const JobConfig& config);
// Whether CUDA workers keep the whole step on their GPU (weights,
// gradients and AdamW state resident, as llm.c, PyTorch DDP and FSDP2 do):
// one process (sync NONE), and all-reduce mode over NCCL (cluster.nccl),
// every ZeRO stage, unless cluster.offload_optimizer. Parameter servers,
// cluster.nccl false and offload_optimizer stage the gradients through
// host memory, where the optimizer runs.
bool StepsOnTheDevice(const JobConfig& config);
// Whether ZeRO shards inside groups smaller than the job (hybrid sharding,
// cluster.shard_group_size), replicating across them.
bool ShardsInGroups(const config::ClusterConfig& cluster);

}  // namespace herd
