#include "common/config.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <sstream>

#include "common/file_util.h"
#include "common/strings.h"

namespace herd {
namespace {

namespace pb = google::protobuf;

// Collects the parser's first error with its 1-based position.
class FirstErrorCollector : public pb::io::ErrorCollector {
 public:
  explicit FirstErrorCollector(std::string origin) : origin_(std::move(origin)) {}
  void AddError(int line, int column, const std::string& message) override {
    if (!error_.empty()) return;
    error_ = origin_ + ":" + std::to_string(line + 1) + ":" + std::to_string(column + 1) + ": " + message;
  }
  void AddWarning(int, int, const std::string&) override {}
  const std::string& error() const { return error_; }

 private:
  std::string origin_;
  std::string error_;
};

size_t EditDistance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] != b[j - 1] ? 1 : 0)});
      diag = up;
    }
  }
  return row[b.size()];
}

std::string FieldNames(const pb::Descriptor* d) {
  std::string names;
  for (int i = 0; i < d->field_count(); ++i) names += (i ? ", " : "") + d->field(i)->name();
  return names;
}

std::string UnknownFieldMessage(const pb::Descriptor* d, const std::string& name) {
  std::string best;
  size_t best_dist = 3;
  for (int i = 0; i < d->field_count(); ++i) {
    size_t dist = EditDistance(name, d->field(i)->name());
    if (dist < best_dist) best_dist = dist, best = d->field(i)->name();
  }
  std::string msg = d->name() + " has no field '" + name + "'";
  if (!best.empty()) return msg + " (did you mean '" + best + "'?)";
  return msg + " (fields: " + FieldNames(d) + ")";
}

// Where each field of the file is, so that value errors can point at it.
struct FieldLocations {
  std::string origin;
  pb::TextFormat::ParseInfoTree tree;
  std::map<std::string, std::string> overrides;  // field path -> "--set ..."

  std::string Locate(const JobConfig& config, const std::string& path) const {
    auto ov = overrides.find(path);
    if (ov != overrides.end()) return ov->second;
    const pb::Message* msg = &config;
    const pb::TextFormat::ParseInfoTree* node = &tree;
    const std::vector<std::string> names = Split(path, '.');
    for (size_t i = 0; i < names.size() && node != nullptr; ++i) {
      const pb::FieldDescriptor* f = msg->GetDescriptor()->FindFieldByName(names[i]);
      if (f == nullptr) break;
      if (i + 1 == names.size()) {
        pb::TextFormat::ParseLocation loc = node->GetLocation(f, f->is_repeated() ? 0 : -1);
        if (loc.line >= 0) {
          return origin + ":" + std::to_string(loc.line + 1) + ":" + std::to_string(loc.column + 1);
        }
        break;
      }
      if (f->cpp_type() != pb::FieldDescriptor::CPPTYPE_MESSAGE) break;
      node = node->GetTreeForNested(f, -1);
      msg = &msg->GetReflection()->GetMessage(*msg, f);
    }
    return origin + ": " + path + " (not set: default)";
  }
};

Status ApplyOverrideImpl(const std::string& assignment, JobConfig* config, std::string* field_path) {
  std::string where = "--set " + assignment;
  size_t eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0) {
    return Status::InvalidArgument(where + ": expected PATH=VALUE, e.g. train.steps=100");
  }
  std::string path = assignment.substr(0, eq);
  std::string value = assignment.substr(eq + 1);
  *field_path = path;
  pb::Message* msg = config;
  const std::vector<std::string> names = Split(path, '.');
  for (size_t i = 0; i < names.size(); ++i) {
    const pb::Descriptor* d = msg->GetDescriptor();
    const pb::FieldDescriptor* f = d->FindFieldByName(names[i]);
    if (f == nullptr) return Status::InvalidArgument(where + ": " + UnknownFieldMessage(d, names[i]));
    bool last = i + 1 == names.size();
    if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE) {
      if (last) return Status::InvalidArgument(where + ": " + path + " is a message; set one of its fields (" + FieldNames(f->message_type()) + ")");
      msg = msg->GetReflection()->MutableMessage(msg, f);
      continue;
    }
    if (!last) return Status::InvalidArgument(where + ": " + names[i] + " is not a message");
    const pb::Reflection* r = msg->GetReflection();
    std::vector<std::string> values = {value};
    if (f->is_repeated()) {
      r->ClearField(msg, f);
      values = Split(value, ',');
    }
    if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_STRING) {
      for (std::string s : values) {
        // Accept both bare and quoted strings on the command line.
        if (s.size() >= 2 && (s.front() == '"' || s.front() == '\'') && s.back() == s.front()) {
          s = s.substr(1, s.size() - 2);
        }
        if (f->is_repeated()) r->AddString(msg, f, s); else r->SetString(msg, f, s);
      }
      return Status::OK();
    }
    if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_ENUM) {
      // The text format takes an enum's number too; a number on the
      // command line is a guess at an order nobody promised.
      for (const std::string& v : values) {
        if (f->enum_type()->FindValueByName(v) == nullptr) {
          std::string names;
          for (int k = 0; k < f->enum_type()->value_count(); ++k)
            names += (k ? ", " : "") + f->enum_type()->value(k)->name();
          return Status::InvalidArgument(where + ": expected one of " + names + " for " + path + ", got '" + v + "'");
        }
      }
    }
    // Numbers, bools and enums: let the text-format parser judge the value.
    std::string text;
    for (const std::string& v : values) text += f->name() + ": " + v + "\n";
    std::unique_ptr<pb::Message> scratch(msg->New());
    FirstErrorCollector errors(where);
    pb::TextFormat::Parser parser;
    parser.RecordErrorsTo(&errors);
    if (!parser.ParseFromString(text, scratch.get())) {
      std::string err = errors.error();
      // The parser's position is inside our synthetic "name: value" text;
      // keep only its reason.
      size_t reason = err.find(": ", where.size() + 1);
      std::string type = f->cpp_type() == pb::FieldDescriptor::CPPTYPE_ENUM
                             ? std::string("one of the ") + f->enum_type()->name() + " values"
                             : std::string(f->cpp_type_name());
      return Status::InvalidArgument(where + ": expected " + type + " for " + path +
                                     (reason == std::string::npos ? "" : " (" + err.substr(reason + 2) + ")"));
    }
    r->ClearField(msg, f);
    r->SwapFields(msg, scratch.get(), {f});
  }
  return Status::OK();
}

// A failed check: the field path and what was expected.
struct Violation {
  std::string field;
  std::string message;
};

// Every floating-point field of `msg` that holds inf or NaN (a typo such as
// lr=inf would otherwise train, diverge and write files first).
void NonFiniteFields(const pb::Message& msg, const std::string& prefix, std::vector<Violation>* v) {
  const pb::Descriptor* d = msg.GetDescriptor();
  const pb::Reflection* r = msg.GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const pb::FieldDescriptor* f = d->field(i);
    if (f->is_repeated()) continue;
    const std::string path = prefix + f->name();
    if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE) {
      if (r->HasField(msg, f)) NonFiniteFields(r->GetMessage(msg, f), path + ".", v);
    } else if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_DOUBLE ||
               f->cpp_type() == pb::FieldDescriptor::CPPTYPE_FLOAT) {
      const double x = f->cpp_type() == pb::FieldDescriptor::CPPTYPE_DOUBLE ? r->GetDouble(msg, f) : r->GetFloat(msg, f);
      if (!std::isfinite(x)) v->push_back({path, "must be a finite number, got " + std::to_string(x)});
    }
  }
}

// Collects the violations of one block's rules.
class Rules {
 public:
  explicit Rules(std::vector<Violation>* v) : v_(v) {}
  void operator()(bool ok, const std::string& field, const std::string& msg) const {
    if (!ok) v_->push_back({field, msg});
  }

 private:
  std::vector<Violation>* v_;
};

// The fragments of a DiLoCo schedule against its period and overlap.
void CheckDilocoSchedule(const config::DilocoConfig& d, const Rules& need) {
  need(d.fragments() >= 1, "cluster.diloco.fragments", "must be >= 1 (1: the whole range at once)");
  need(d.fragments() <= d.every(), "cluster.diloco.fragments",
       std::to_string(d.fragments()) + " is above cluster.diloco.every " + std::to_string(d.every()) +
           ": each fragment needs a step of its own");
  need(d.overlap() >= 0 && (d.overlap() == 0 || d.overlap() < d.every() / std::max(1, d.fragments())),
       "cluster.diloco.overlap",
       "must be in [0, every / fragments): one fragment's exchange in flight at a time");
}

void CheckModel(const config::ModelConfig& m, const Rules& need) {
  need(m.vocab_size() > 0, "model.vocab_size", "must be > 0");
  need(m.hidden_size() > 0, "model.hidden_size", "must be > 0");
  need(m.intermediate_size() > 0, "model.intermediate_size", "must be > 0");
  need(m.num_hidden_layers() > 0 && m.num_hidden_layers() <= kMaxLayers, "model.num_hidden_layers",
       "must be between 1 and " + std::to_string(kMaxLayers));
  need(m.num_attention_heads() > 0, "model.num_attention_heads", "must be > 0");
  need(m.num_key_value_heads() > 0, "model.num_key_value_heads", "must be > 0");
  if (m.num_attention_heads() > 0 && m.num_key_value_heads() > 0) {
    need(m.num_attention_heads() % m.num_key_value_heads() == 0, "model.num_key_value_heads",
         "num_attention_heads (" + std::to_string(m.num_attention_heads()) +
             ") must be divisible by num_key_value_heads (" + std::to_string(m.num_key_value_heads()) + ")");
  }
  if (m.num_attention_heads() > 0 && m.hidden_size() > 0) {
    need(m.hidden_size() % m.num_attention_heads() == 0, "model.num_attention_heads",
         "hidden_size (" + std::to_string(m.hidden_size()) + ") must be divisible by num_attention_heads (" +
             std::to_string(m.num_attention_heads()) + ")");
    need((m.hidden_size() / m.num_attention_heads()) % 2 == 0, "model.num_attention_heads",
         "head dimension hidden_size/num_attention_heads must be even for RoPE");
  }
  need(m.rope_theta() > 0, "model.rope_theta", "must be > 0");
  need(m.rms_norm_eps() > 0, "model.rms_norm_eps", "must be > 0");
  need(m.initializer_range() >= 0, "model.initializer_range", "must be >= 0");
  need(m.max_position_embeddings() >= 0, "model.max_position_embeddings", "must be >= 0 (0 = unset)");
  if (m.has_rope_scaling()) {
    const auto& rs = m.rope_scaling();
    if (rs.rope_type() == config::RopeScaling::LLAMA3) {
      need(rs.factor() > 0, "model.rope_scaling.factor", "must be > 0 for rope_type LLAMA3");
      need(rs.low_freq_factor() > 0, "model.rope_scaling.low_freq_factor", "must be > 0 for rope_type LLAMA3");
      need(rs.high_freq_factor() > rs.low_freq_factor(), "model.rope_scaling.high_freq_factor",
           "must be > low_freq_factor for rope_type LLAMA3");
      need(rs.original_max_position_embeddings() > 0, "model.rope_scaling.original_max_position_embeddings",
           "must be > 0 for rope_type LLAMA3");
    } else {
      need(!rs.has_factor() && !rs.has_low_freq_factor() && !rs.has_high_freq_factor() &&
               !rs.has_original_max_position_embeddings(),
           "model.rope_scaling.rope_type",
           "LLAMA3 is needed for factor, low_freq_factor, high_freq_factor and original_max_position_embeddings");
    }
  }
}

void CheckDeviceAndTrain(const JobConfig& c, const Rules& need) {
  const auto& m = c.model();
  need(c.device().kind() == config::DeviceConfig::CUDA || c.device().dtype() == config::DeviceConfig::FP32,
       "device.dtype", "BF16 needs device.kind CUDA (CPU workers compute in fp32)");
  const auto& cl = c.cluster();
  need(c.device().compute() || (c.device().kind() == config::DeviceConfig::CPU && cl.pipeline_stages() <= 1 &&
                                cl.tensor_parallel() <= 1 && cl.context_parallel() <= 1),
       "device.compute", "false is for CPU workers without pipeline stages, tensor or context parallelism");

  const auto& t = c.train();
  need(t.steps() > 0, "train.steps", "must be > 0");
  need(t.batch_size() > 0, "train.batch_size", "must be > 0");
  need(t.seq_len() > 0, "train.seq_len", "must be > 0");
  need(t.grad_accum() > 0 && t.grad_accum() <= kMaxGradAccum, "train.grad_accum",
       "must be between 1 and " + std::to_string(kMaxGradAccum) + " micro-batches a step");
  need(t.threads() >= 0 && t.threads() <= kMaxThreads, "train.threads",
       "must be between 0 (all cores) and " + std::to_string(kMaxThreads));
  if (m.max_position_embeddings() > 0) {
    need(t.seq_len() <= m.max_position_embeddings(), "train.seq_len",
         "must be <= model.max_position_embeddings (" + std::to_string(m.max_position_embeddings()) + ")");
  }
}

void CheckOptimizerDataAndLog(const JobConfig& c, const Rules& need) {
  const auto& o = c.optimizer();
  need(o.lr() >= 0, "optimizer.lr", "must be >= 0");
  need(o.min_lr() >= 0 && o.min_lr() <= o.lr(), "optimizer.min_lr", "must be in [0, lr]");
  need(o.warmup_steps() >= 0, "optimizer.warmup_steps", "must be >= 0");
  need(o.weight_decay() >= 0, "optimizer.weight_decay", "must be >= 0");
  need(o.beta1() >= 0 && o.beta1() < 1, "optimizer.beta1", "must be in [0, 1)");
  need(o.beta2() >= 0 && o.beta2() < 1, "optimizer.beta2", "must be in [0, 1)");
  need(o.eps() > 0, "optimizer.eps", "must be > 0");
  need(o.clip_norm() >= 0, "optimizer.clip_norm", "must be >= 0 (0 disables clipping)");
  need(o.skip_spikes_zscore() >= 0, "optimizer.skip_spikes_zscore", "must be >= 0 (0 disables the spike guard)");
  need(o.skip_spikes_window() >= 1, "optimizer.skip_spikes_window", "must be >= 1");

  need(c.data().val_fraction() >= 0 && c.data().val_fraction() < 1, "data.val_fraction", "must be in [0, 1)");
  need(c.checkpoint().every() >= 0, "checkpoint.every", "must be >= 0 (0 = only at the end)");
  need(c.log().every() > 0, "log.every", "must be > 0");
  need(c.log().eval_every() >= 0, "log.eval_every", "must be >= 0");
  need(c.log().eval_batches() > 0, "log.eval_batches", "must be > 0");
  need(c.log().sample_tokens() >= 0, "log.sample_tokens", "must be >= 0");
  need(c.log().sample_temperature() >= 0, "log.sample_temperature", "must be >= 0 (0 = greedy)");
}

bool Pipelined(const JobConfig& c) { return c.cluster().pipeline_stages() > 1; }
bool Tensor(const JobConfig& c) { return c.cluster().tensor_parallel() > 1; }
bool Context(const JobConfig& c) { return c.cluster().context_parallel() > 1; }
bool HasRegions(const JobConfig& c) { return c.cluster().diloco().regions() > 1; }
bool Cuda(const JobConfig& c) { return c.device().kind() == config::DeviceConfig::CUDA; }
bool NcclReduces(const JobConfig& c) {
  return Cuda(c) && c.cluster().nccl() && c.cluster().sync() == config::ClusterConfig::ALLREDUCE;
}

}  // namespace

const std::vector<NotBuilt>& NotBuiltTable() {
  using Cluster = config::ClusterConfig;
  static const std::vector<NotBuilt> table = {
      {"cluster.elastic", "pipeline stages, tensor or context parallelism",
       "elastic workers with model-parallel groups (pipeline stages, tensor or context parallelism) are not built "
       "yet: a lost rank's group would have to leave and rejoin whole, as a region does",
       "cluster { sync: PARAMETER_SERVER servers: 1 workers: 4 pipeline_stages: 2 elastic: true }",
       [](const JobConfig& c) { return (Pipelined(c) || Tensor(c) || Context(c)) && c.cluster().elastic(); }},
      {"cluster.elastic", "cluster.diloco.regions",
       "elastic workers in a job of regions (cluster.diloco.regions) are not built yet: there a region is what "
       "is lost and rejoins whole, and a region's survivors would need its own servers to deal its shares",
       "cluster { sync: PARAMETER_SERVER servers: 2 workers: 4 elastic: true diloco { regions: 2 every: 5 } }",
       [](const JobConfig& c) { return HasRegions(c) && c.cluster().elastic(); }},
      {"cluster.stream_weights", "cluster.wire_dtype BF16 in pipeline stages with tied embeddings",
       "streamed weights with a bf16 wire inside pipeline stages of tied embeddings are not built yet: the "
       "stages' pushes then depart from the unstreamed job's from the first step (fp32, untied embeddings or no "
       "stages are bitwise the same)",
       "cluster { sync: PARAMETER_SERVER servers: 2 workers: 2 pipeline_stages: 2 stream_weights: true "
       "wire_dtype: BF16 }",
       [](const JobConfig& c) {
         return Pipelined(c) && c.cluster().stream_weights() && c.cluster().wire_dtype() == Cluster::BF16 &&
                c.model().tie_word_embeddings();
       }},
      {"cluster.stream_weights", "cluster.elastic",
       "streamed weights in an elastic job (cluster.elastic) are not built yet: a survivor redoes a lost "
       "worker's share on the step's weights, which its window has let go, with the next version's pulls in "
       "flight over them",
       "cluster { sync: PARAMETER_SERVER servers: 1 workers: 2 elastic: true stream_weights: true }",
       [](const JobConfig& c) { return c.cluster().stream_weights() && c.cluster().elastic(); }},
      {"cluster.wire_dtype", "NCCL (device.kind CUDA, sync ALLREDUCE)",
       "BF16 in all-reduce mode applies to the UCX ring only yet (NCCL sums fp32 gradients; cluster.nccl: false "
       "reduces CUDA workers' gradients through the ring)",
       "cluster { sync: ALLREDUCE workers: 2 wire_dtype: BF16 } device { kind: CUDA }",
       [](const JobConfig& c) { return NcclReduces(c) && c.cluster().wire_dtype() != Cluster::FP32; }},
      {"device.kind", "cluster.context_parallel with tensor parallelism or pipeline stages",
       "context parallelism on CUDA workers runs beside data parallelism alone yet (not in tensor groups or "
       "pipeline stages)",
       "cluster { sync: ALLREDUCE workers: 4 context_parallel: 2 tensor_parallel: 2 } device { kind: CUDA }",
       [](const JobConfig& c) { return Context(c) && Cuda(c) && (Tensor(c) || Pipelined(c)); }},
      {"device.kind", "cluster.context_parallel with windowed weights (ZeRO-3, cluster.stream_weights)",
       "context parallelism on CUDA workers holds the weights whole yet: not with ZeRO-3 or streamed weights",
       "cluster { sync: ALLREDUCE workers: 2 context_parallel: 2 zero_stage: 3 } device { kind: CUDA }",
       [](const JobConfig& c) { return Context(c) && Cuda(c) && WorkersHoldAWindow(c); }},
      {"device.kind", "cluster.tensor_parallel with windowed weights (ZeRO-3, cluster.stream_weights)",
       "tensor parallelism on CUDA workers holds its slices' weights whole yet: not with ZeRO-3 or streamed weights",
       "cluster { sync: ALLREDUCE workers: 4 tensor_parallel: 2 zero_stage: 3 } device { kind: CUDA }",
       [](const JobConfig& c) { return Tensor(c) && Cuda(c) && WorkersHoldAWindow(c); }},
      {"device.kind", "cluster.pipeline_stages with windowed weights (cluster.stream_weights, ZeRO-3)",
       "CUDA pipeline stages hold their units' weights whole yet: not with streamed weights or ZeRO-3",
       "cluster { sync: PARAMETER_SERVER servers: 1 workers: 2 pipeline_stages: 2 stream_weights: true } device { "
       "kind: CUDA }",
       [](const JobConfig& c) { return Pipelined(c) && Cuda(c) && WorkersHoldAWindow(c); }},
  };
  return table;
}

namespace {

// The cluster's counts, its sync mode and what each mode needs.
void CheckClusterShape(const config::ClusterConfig& cl, const Rules& need) {
  need(cl.workers() > 0 && cl.workers() <= kMaxWorkers, "cluster.workers",
       "must be between 1 and " + std::to_string(kMaxWorkers));
  need(cl.servers() >= 0 && cl.servers() <= kMaxServers, "cluster.servers",
       "must be between 0 and " + std::to_string(kMaxServers));
  // A bucket's bytes are counted in 64 bits; one beyond 64 GiB would be the model whole.
  need(cl.bucket_mb() > 0 && cl.bucket_mb() <= 65536, "cluster.bucket_mb", "must be > 0 and at most 65536 (64 GiB)");
  need(cl.heartbeat_interval_s() > 0, "cluster.heartbeat_interval_s", "must be > 0");
  need(cl.heartbeat_timeout_s() > cl.heartbeat_interval_s(), "cluster.heartbeat_timeout_s",
       "must be greater than heartbeat_interval_s");
  need(cl.join_timeout_s() > 0, "cluster.join_timeout_s", "must be > 0");
  need(cl.max_control_message_mb() >= 0.0625 && cl.max_control_message_mb() <= 1024, "cluster.max_control_message_mb",
       "must be between 0.0625 and 1024");
  need(cl.zero_stage() >= 0 && cl.zero_stage() <= 3, "cluster.zero_stage", "must be 0, 1, 2 or 3");
  switch (cl.sync()) {
    case config::ClusterConfig::NONE:
      need(cl.workers() == 1, "cluster.workers", "sync NONE trains in one process: workers must be 1");
      need(cl.servers() == 0, "cluster.servers", "sync NONE has no servers: servers must be 0");
      break;
    case config::ClusterConfig::PARAMETER_SERVER:
      need(cl.servers() > 0, "cluster.servers", "PARAMETER_SERVER needs servers >= 1");
      break;
    case config::ClusterConfig::ALLREDUCE:
      need(cl.servers() == 0, "cluster.servers", "ALLREDUCE has no servers: servers must be 0");
      break;
  }
  if (cl.zero_stage() > 0) {
    need(!cl.elastic(), "cluster.elastic",
         "is not supported together with cluster.zero_stage " + std::to_string(cl.zero_stage()) +
             " (ZeRO keeps state on every worker; an elastic job's workers hold none)");
    need(cl.sync() == config::ClusterConfig::ALLREDUCE, "cluster.zero_stage",
         "ZeRO applies to sync ALLREDUCE only (parameter servers shard the optimizer state themselves, and "
         "cluster.stream_weights is their counterpart of sharded weights)");
  }
  if (cl.elastic()) {
    need(cl.sync() == config::ClusterConfig::PARAMETER_SERVER, "cluster.elastic",
         "elastic workers need sync PARAMETER_SERVER (there the servers hold all the state)");
    need(cl.workers() >= 2, "cluster.elastic",
         "needs at least 2 workers: the survivors take a lost worker's sequences, and one worker has none");
  }
  need(cl.stream_prefetch_layers() >= 0, "cluster.stream_prefetch_layers", "must be >= 0");
  if (cl.shard_group_size() != 0) {
    // A shard group is some of a pipeline stage's workers (all of the
    // job's without stages).
    const int stage_workers = cl.workers() / std::max(1, cl.pipeline_stages());
    need(cl.shard_group_size() > 0 && stage_workers % cl.shard_group_size() == 0, "cluster.shard_group_size",
         std::to_string(cl.shard_group_size()) + " does not divide " +
             (cl.pipeline_stages() > 1 ? "a pipeline stage's " + std::to_string(stage_workers) +
                                             " workers (cluster.workers / cluster.pipeline_stages)"
                                       : "cluster.workers " + std::to_string(cl.workers())) +
             " into groups of that size");
    // A shard group is whole tensor x context groups: ZeRO cuts a slice's
    // space among the workers that hold the same parameters.
    const int64_t model_group = int64_t{std::max(1, cl.tensor_parallel())} * std::max(1, cl.context_parallel());
    need(cl.shard_group_size() % model_group == 0, "cluster.shard_group_size",
         std::to_string(cl.shard_group_size()) + " is not a multiple of cluster.tensor_parallel x " +
             "cluster.context_parallel " + std::to_string(model_group) +
             ": a shard group holds whole tensor and context groups");
  }
}

// The model-parallel axes' degrees: each at least 1 and dividing the
// workers with the others.
void CheckParallelDegrees(const config::ClusterConfig& cl, const Rules& need) {
  need(cl.pipeline_stages() >= 1, "cluster.pipeline_stages", "must be >= 1 (1: no pipeline)");
  need(cl.virtual_stages() >= 1, "cluster.virtual_stages", "must be >= 1");
  if (cl.pipeline_stages() > 1) {
    const std::string P = std::to_string(cl.pipeline_stages());
    need(cl.workers() % cl.pipeline_stages() == 0, "cluster.pipeline_stages",
         P + " does not divide cluster.workers " + std::to_string(cl.workers()) +
             ": every stage needs as many data-parallel replicas");
    need(cl.sync() != config::ClusterConfig::NONE, "cluster.pipeline_stages",
         "pipeline stages need workers: sync ALLREDUCE or PARAMETER_SERVER");
  }
  need(cl.tensor_parallel() >= 1, "cluster.tensor_parallel", "must be >= 1 (1: no tensor parallelism)");
  need(cl.context_parallel() >= 1, "cluster.context_parallel", "must be >= 1 (1: no context parallelism)");
  if (cl.context_parallel() > 1) {
    const std::string C = std::to_string(cl.context_parallel());
    const int64_t group =
        int64_t{cl.context_parallel()} * std::max(1, cl.tensor_parallel()) * std::max(1, cl.pipeline_stages());
    need(cl.workers() % group == 0, "cluster.context_parallel",
         C + (cl.tensor_parallel() > 1 ? " x cluster.tensor_parallel " + std::to_string(cl.tensor_parallel()) : "") +
             (cl.pipeline_stages() > 1 ? " x cluster.pipeline_stages " + std::to_string(cl.pipeline_stages()) : "") +
             " does not divide cluster.workers " + std::to_string(cl.workers()) +
             ": every data-parallel replica needs as many context-parallel (tensor-parallel, pipeline) ranks");
  }
  if (cl.tensor_parallel() > 1) {
    const std::string T = std::to_string(cl.tensor_parallel());
    need(cl.workers() % cl.tensor_parallel() == 0, "cluster.tensor_parallel",
         T + " does not divide cluster.workers " + std::to_string(cl.workers()) +
             ": every data-parallel replica needs as many tensor-parallel ranks");
    need(cl.sync() != config::ClusterConfig::NONE, "cluster.tensor_parallel",
         "tensor parallelism needs workers: sync ALLREDUCE or PARAMETER_SERVER");
    need(cl.zero_stage() == 0 || cl.workers() > cl.tensor_parallel(), "cluster.zero_stage",
         "shards a tensor-parallel rank's state over the workers of the same rank: with cluster.tensor_parallel " + T +
             " over all " + std::to_string(cl.workers()) + " workers there is one");
    if (cl.pipeline_stages() > 1) {
      need(cl.workers() % (int64_t{cl.pipeline_stages()} * cl.tensor_parallel()) == 0, "cluster.tensor_parallel",
           "cluster.pipeline_stages " + std::to_string(cl.pipeline_stages()) + " x " + T +
               " does not divide cluster.workers " + std::to_string(cl.workers()) +
               ": every data-parallel replica needs as many stages, each as many tensor-parallel ranks");
    }
  }
}

// The data plane's devices, regions and streamed weights.
void CheckNetworkAndRegions(const config::ClusterConfig& cl, const Rules& need) {
  bool devices_named = true;
  for (const std::string& name : Split(cl.data_interface(), ',')) {
    devices_named &= !name.empty() && name.size() <= 64 &&
                     std::none_of(name.begin(), name.end(), [](unsigned char ch) { return std::isspace(ch) != 0; });
  }
  need(cl.data_interface().empty() || devices_named, "cluster.data_interface",
       "must be comma-separated interface or RDMA port names (\"eth1\", \"ib0,mlx5_0:1\"), without spaces");
  if (const config::DilocoConfig& d = cl.diloco(); d.regions() != 1) {
    const std::string R = std::to_string(d.regions());
    need(d.regions() > 1, "cluster.diloco.regions", "must be >= 1 (1: no regions)");
    need(cl.sync() == config::ClusterConfig::PARAMETER_SERVER, "cluster.diloco.regions",
         "regions are parameter-server jobs of their own: sync PARAMETER_SERVER");
    need(d.regions() > 0 && cl.servers() % d.regions() == 0, "cluster.diloco.regions",
         R + " does not divide cluster.servers " + std::to_string(cl.servers()) +
             ": every region needs as many servers");
    need(d.regions() > 0 && cl.workers() % d.regions() == 0, "cluster.diloco.regions",
         R + " does not divide cluster.workers " + std::to_string(cl.workers()) +
             ": every region needs as many workers");
    need(d.every() >= 1, "cluster.diloco.every", "must be >= 1 inner step between outer steps");
    const bool quantised = d.wire_dtype() == config::DilocoConfig::INT8 || d.wire_dtype() == config::DilocoConfig::FP4;
    const OuterStep outer = OuterStepOf(d);
    need(outer.lr > 0, "cluster.diloco.outer_lr",
         quantised ? "must be > 0: with outer_lr 0 the outer weights never move and a quantised wire's kept error "
                     "grows without end"
                   : "must be > 0");
    CheckDilocoSchedule(d, need);
    need(outer.momentum >= 0 && outer.momentum < 1, "cluster.diloco.outer_momentum", "must be in [0, 1)");
  }
  if (cl.stream_weights()) {
    need(cl.sync() == config::ClusterConfig::PARAMETER_SERVER, "cluster.stream_weights",
         "streamed weights need sync PARAMETER_SERVER (the servers are where the weights stream from)");
  }
}

void CheckCluster(const config::ClusterConfig& cl, const Rules& need) {
  CheckClusterShape(cl, need);
  CheckParallelDegrees(cl, need);
  CheckNetworkAndRegions(cl, need);
}

// What is not built yet, refused in one line: one row of the project's
// table (NotBuiltTable) at a time, after the settings' own checks.
void CheckNotBuilt(const JobConfig& c, const Rules& need) {
  for (const NotBuilt& row : NotBuiltTable()) need(!row.given(c), row.setting, row.reason);
}

// Settings that have no effect in the mode they are given in, refused rather
// than ignored: one row each of the setting, whether it holds anything but
// its default, whether it acts in this job, and what it applies to.
struct InertRule {
  const char* field;
  bool (*given)(const JobConfig&);
  bool (*acts)(const JobConfig&);
  const char* reason;
};
using Cluster = config::ClusterConfig;
// Whether the outer lr and momentum are set to other than the default for
// the period (a checkpoint's config records those as set).
std::pair<bool, bool> OuterStepOffDefault(const JobConfig& c) {
  config::DilocoConfig unset = c.cluster().diloco();
  unset.clear_outer_lr();
  unset.clear_outer_momentum();
  const OuterStep given = OuterStepOf(c.cluster().diloco()), fitted = OuterStepOf(unset);
  return {given.lr_given && given.lr != fitted.lr, given.momentum_given && given.momentum != fitted.momentum};
}

constexpr const char* kPipelineOnly = "applies to cluster.pipeline_stages > 1 only";
constexpr const char* kRegionsOnly = "applies to a job of regions only (cluster.diloco.regions > 1)";
const InertRule kInertRules[] = {
    {"cluster.virtual_stages", [](const JobConfig& c) { return c.cluster().virtual_stages() != 1; }, Pipelined,
     kPipelineOnly},
    {"cluster.pipeline_schedule", [](const JobConfig& c) { return c.cluster().pipeline_schedule() != Cluster::ONE_F_ONE_B; },
     Pipelined, kPipelineOnly},
    {"cluster.pipeline_split", [](const JobConfig& c) { return !c.cluster().pipeline_split().empty(); }, Pipelined,
     kPipelineOnly},
    {"cluster.pipeline_wire_dtype", [](const JobConfig& c) { return c.cluster().pipeline_wire_dtype() != Cluster::FP32; },
     Pipelined, kPipelineOnly},
    {"cluster.sequence_parallel", [](const JobConfig& c) { return c.cluster().sequence_parallel(); },
     [](const JobConfig& c) { return c.cluster().tensor_parallel() > 1; },
     "splits the tensor-parallel group's tokens: needs cluster.tensor_parallel > 1"},
    {"cluster.shard_group_size", [](const JobConfig& c) { return c.cluster().shard_group_size() != 0; },
     [](const JobConfig& c) { return c.cluster().zero_stage() > 0; }, "applies to cluster.zero_stage 1, 2 or 3 only"},
    {"cluster.reshard_after_forward", [](const JobConfig& c) { return !c.cluster().reshard_after_forward(); },
     [](const JobConfig& c) { return c.cluster().zero_stage() == 3; }, "applies to cluster.zero_stage 3 only"},
    {"cluster.wire_dtype", [](const JobConfig& c) { return c.cluster().wire_dtype() != Cluster::FP32; },
     [](const JobConfig& c) { return c.cluster().sync() != Cluster::NONE; },
     "is how parameter servers' pushes and pulls or the all-reduce ring travel: one process (sync NONE) sends "
     "nothing"},
    {"cluster.shard_strategy", [](const JobConfig& c) { return c.cluster().shard_strategy() != Cluster::BALANCED; },
     [](const JobConfig& c) { return c.cluster().sync() == Cluster::PARAMETER_SERVER; },
     "cuts the parameter space among parameter servers: applies to sync PARAMETER_SERVER only"},
    {"cluster.offload_optimizer", [](const JobConfig& c) { return c.cluster().offload_optimizer(); },
     [](const JobConfig& c) { return NcclReduces(c); },
     "keeps CUDA workers' optimizer on the host while NCCL reduces: applies to sync ALLREDUCE with device.kind CUDA "
     "and cluster.nccl only (cluster.nccl false steps on the host anyway)"},
    {"cluster.nccl", [](const JobConfig& c) { return !c.cluster().nccl(); },
     [](const JobConfig& c) {
       return (c.cluster().sync() == Cluster::ALLREDUCE || c.cluster().tensor_parallel() > 1 ||
               c.cluster().context_parallel() > 1) &&
              c.device().kind() == config::DeviceConfig::CUDA;
     },
     "chooses how CUDA workers all-reduce and sum over their tensor and context groups: applies to device.kind "
     "CUDA with sync ALLREDUCE, tensor or context parallelism only"},
    {"optimizer.skip_spikes_window", [](const JobConfig& c) { return c.optimizer().skip_spikes_window() != 128; },
     [](const JobConfig& c) { return c.optimizer().skip_spikes_zscore() > 0; },
     "is the spike guard's: applies with optimizer.skip_spikes_zscore > 0 only"},
    {"cluster.diloco.every", [](const JobConfig& c) { return c.cluster().diloco().every() != 100; }, HasRegions,
     kRegionsOnly},
    // A checkpoint's config records the outer step in force: its defaults.
    {"cluster.diloco.outer_lr", [](const JobConfig& c) { return OuterStepOffDefault(c).first; }, HasRegions,
     kRegionsOnly},
    {"cluster.diloco.outer_momentum", [](const JobConfig& c) { return OuterStepOffDefault(c).second; }, HasRegions,
     kRegionsOnly},
    {"cluster.diloco.wire_dtype",
     [](const JobConfig& c) { return c.cluster().diloco().wire_dtype() != config::DilocoConfig::FP32; }, HasRegions,
     kRegionsOnly},
    {"cluster.diloco.fragments", [](const JobConfig& c) { return c.cluster().diloco().fragments() != 1; }, HasRegions,
     kRegionsOnly},
    {"cluster.diloco.overlap", [](const JobConfig& c) { return c.cluster().diloco().overlap() != 0; }, HasRegions,
     kRegionsOnly},
};

void CheckInertSettings(const JobConfig& c, const Rules& need) {
  for (const InertRule& rule : kInertRules) need(!rule.given(c) || rule.acts(c), rule.field, rule.reason);
}

// What a process would hold, roughly and from above, in a type that cannot
// overflow: a model or a batch beyond kMaxProcessBytes is refused before the
// memory plan sums its bytes in 64 bits.
void CheckSizes(const JobConfig& c, const Rules& need) {
  const config::ModelConfig& m = c.model();
  const config::TrainConfig& t = c.train();
  if (m.vocab_size() <= 0 || m.hidden_size() <= 0 || m.intermediate_size() <= 0 || m.num_hidden_layers() <= 0 ||
      m.num_attention_heads() <= 0 || t.batch_size() <= 0 || t.seq_len() <= 0 || t.grad_accum() <= 0) {
    return;  // refused field by field
  }
  using Big = long double;
  const Big V = m.vocab_size(), h = m.hidden_size(), f = m.intermediate_size(), L = m.num_hidden_layers(),
            heads = m.num_attention_heads(), B = t.batch_size(), T = t.seq_len(), A = t.grad_accum();
  const Big parameters = 2 * V * h + L * (4 * h * h + 3 * h * f + 2 * h) + h;
  const Big state = 16 * parameters;  // fp32 weights, gradients, AdamW m and v
  // Every layer's intermediates and attention probabilities for each
  // micro-batch kept at once, the logits, and the step's token ids.
  const Big activations = 4 * A * (L + 1) * B * T * (8 * h + 3 * f + heads * T) + 12 * B * T * V + 8 * A * B * T;
  const Big bound = static_cast<Big>(kMaxProcessBytes);
  auto about = [](Big bytes) {
    if (bytes < 0x1p62L) return FormatBytes(static_cast<int64_t>(bytes));
    char text[32];
    std::snprintf(text, sizeof text, "%.3Lg EiB", bytes / 0x1p60L);
    return std::string(text);
  };
  const std::string limit = std::to_string(kMaxProcessBytes >> 50) + " PiB";
  char count[32];
  std::snprintf(count, sizeof count, "%.3Lg", parameters);
  need(state <= bound, "model.hidden_size",
       "the model's shape makes about " + std::string(count) + " parameters, whose weights and AdamW state need " +
           about(state) + ", beyond the " + limit + " herd plans for");
  need(activations <= bound, "train.batch_size",
       "train.batch_size x train.seq_len x train.grad_accum x the model's layers and width: a worker would hold " +
           about(activations) + " of activations, beyond the " + limit + " herd plans for");
}

// A pipeline's stages x virtual stages against the layers they cut, and its
// schedule's passes against their bound, before a schedule is built.
void CheckPipelineSize(const JobConfig& c, const Rules& need) {
  const config::ClusterConfig& cl = c.cluster();
  if (cl.pipeline_stages() <= 1 || cl.virtual_stages() < 1 || c.train().grad_accum() < 1) return;
  const int64_t stages = int64_t{cl.pipeline_stages()} * cl.virtual_stages();
  need(stages <= c.model().num_hidden_layers(), "cluster.virtual_stages",
       "cluster.pipeline_stages " + std::to_string(cl.pipeline_stages()) + " x cluster.virtual_stages " +
           std::to_string(cl.virtual_stages()) + " = " + std::to_string(stages) + " stages, but the model has " +
           std::to_string(c.model().num_hidden_layers()) + " layers: every stage needs at least one");
  need(stages * c.train().grad_accum() <= kMaxPipelinePasses, "train.grad_accum",
       std::to_string(stages) + " pipeline stages (virtual ones included) x " +
           std::to_string(c.train().grad_accum()) + " micro-batches is more than the " +
           std::to_string(kMaxPipelinePasses) + " passes a pipeline schedule may hold");
}

std::vector<Violation> CheckValues(const JobConfig& c) {
  std::vector<Violation> v;
  NonFiniteFields(c, "", &v);
  const Rules need(&v);
  CheckModel(c.model(), need);
  CheckDeviceAndTrain(c, need);
  CheckOptimizerDataAndLog(c, need);
  CheckCluster(c.cluster(), need);
  CheckNotBuilt(c, need);
  CheckInertSettings(c, need);
  CheckSizes(c, need);
  CheckPipelineSize(c, need);
  if (const int C = c.cluster().context_parallel(); C > 1) {
    need(c.train().seq_len() % (2 * C) == 0, "train.seq_len",
         std::to_string(c.train().seq_len()) + " does not split into 2 x cluster.context_parallel " +
             std::to_string(C) + " equal chunks");
  }
  if (const int T = c.cluster().tensor_parallel(); T > 1) {
    const config::ModelConfig& m = c.model();
    auto divides = [&](int n, const char* field, const char* what) {
      need(n % T == 0, field,
           std::to_string(n) + " " + what + " do not split over cluster.tensor_parallel " + std::to_string(T));
    };
    divides(m.num_attention_heads(), "model.num_attention_heads", "attention heads");
    divides(m.num_key_value_heads(), "model.num_key_value_heads", "key/value heads");
    divides(m.intermediate_size(), "model.intermediate_size", "intermediate columns");
    divides(m.vocab_size(), "model.vocab_size", "vocabulary rows");
  }
  if (c.cluster().pipeline_stages() > 1) {
    need(c.cluster().pipeline_schedule() != config::ClusterConfig::ZERO_BUBBLE ||
             c.train().recompute() == config::TrainConfig::NONE,
         "train.recompute", "ZERO_BUBBLE keeps the activations its deferred weight gradients read: no recomputation");
  }
  return v;
}

StatusOr<JobConfig> ParseWithLocations(const std::string& text, const std::string& origin,
                                       const std::vector<std::string>& overrides) {
  FieldLocations locations;
  locations.origin = origin;
  JobConfig config;
  FirstErrorCollector errors(origin);
  pb::TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  parser.WriteLocationsTo(&locations.tree);
  if (!parser.ParseFromString(text, &config)) {
    return Status::InvalidArgument(errors.error().empty() ? origin + ": cannot parse config" : errors.error());
  }
  for (const std::string& assignment : overrides) {
    std::string field;
    HERD_RETURN_IF_ERROR(ApplyOverrideImpl(assignment, &config, &field));
    const auto [earlier, fresh] = locations.overrides.try_emplace(field, "--set " + assignment);
    if (!fresh) {
      return Status::InvalidArgument(earlier->second + " and --set " + assignment + ": " + field +
                                     " set twice; give it once");
    }
  }
  std::vector<Violation> violations = CheckValues(config);
  if (!violations.empty()) {
    const Violation& first = violations.front();
    return Status::InvalidArgument(locations.Locate(config, first.field) + ": " + first.field + ": " + first.message);
  }
  return config;
}

}  // namespace

StatusOr<JobConfig> LoadJobConfig(const std::string& path, const std::vector<std::string>& overrides) {
  auto text = ReadFile(path, kMaxConfigBytes);
  if (!text.ok()) return text.status().WithContext("config: ");
  return ParseWithLocations(*text, path, overrides);
}

StatusOr<JobConfig> ParseJobConfig(const std::string& text, const std::string& origin,
                                   const std::vector<std::string>& overrides) {
  return ParseWithLocations(text, origin, overrides);
}

Status ApplyOverride(const std::string& assignment, JobConfig* config) {
  std::string field;
  return ApplyOverrideImpl(assignment, config, &field);
}

namespace {

Status FirstViolation(const std::vector<Violation>& violations) {
  if (violations.empty()) return Status::OK();
  return Status::InvalidArgument(violations.front().field + ": " + violations.front().message);
}

}  // namespace

Status ValidateJobConfig(const JobConfig& config) { return FirstViolation(CheckValues(config)); }

Status ValidateDilocoSchedule(const config::DilocoConfig& diloco) {
  std::vector<Violation> violations;
  CheckDilocoSchedule(diloco, Rules(&violations));
  return FirstViolation(violations);
}

bool StreamsUpdates(const JobConfig& config) {
  return config.optimizer().clip_norm() <= 0 && config.optimizer().skip_spikes_zscore() <= 0 &&
         !config.cluster().elastic();
}

bool StepsSlicesAsScattered(const JobConfig& config) {
  const config::ClusterConfig& cl = config.cluster();
  return cl.sync() == config::ClusterConfig::ALLREDUCE && cl.zero_stage() == 3 && StreamsUpdates(config) &&
         !ShardsInGroups(cl);
}

bool WorkersHoldAWindow(const JobConfig& config) {
  const config::ClusterConfig& cl = config.cluster();
  return cl.stream_weights() || (cl.sync() == config::ClusterConfig::ALLREDUCE && cl.zero_stage() == 3);
}

bool StepsOnTheDevice(const JobConfig& config) {
  const config::ClusterConfig& cl = config.cluster();
  if (config.device().kind() != config::DeviceConfig::CUDA) return false;
  // A model-parallel placement's optimizer steps on the host yet.
  if (cl.tensor_parallel() > 1 || cl.pipeline_stages() > 1 || cl.context_parallel() > 1) return false;
  return cl.sync() == config::ClusterConfig::NONE ||
         (cl.sync() == config::ClusterConfig::ALLREDUCE && cl.nccl() && !cl.offload_optimizer());
}

bool ShardsInGroups(const config::ClusterConfig& cluster) {
  return cluster.shard_group_size() > 0 &&
         cluster.shard_group_size() < cluster.workers() / std::max(1, cluster.pipeline_stages());
}

int NumWorkers(const JobConfig& config) {
  return config.cluster().sync() == config::ClusterConfig::NONE ? 1 : config.cluster().workers();
}

int Regions(const JobConfig& config) {
  return config.cluster().sync() == config::ClusterConfig::PARAMETER_SERVER
             ? std::max(1, config.cluster().diloco().regions())
             : 1;
}

int RegionOf(const JobConfig& config, bool server, int rank) {
  return RegionOfRank(rank, server ? config.cluster().servers() : NumWorkers(config), Regions(config));
}

int RegionOfRank(int rank, int count, int regions) {
  const int per_region = count / std::max(1, regions);
  return per_region > 0 ? rank / per_region : 0;
}

int DataParallelReplicas(const JobConfig& config) {
  // Each factor of a validated config is at most kMaxWorkers: 64 bits hold the product.
  const int64_t group = int64_t{std::max(1, config.cluster().pipeline_stages())} *
                        std::max(1, config.cluster().tensor_parallel()) *
                        std::max(1, config.cluster().context_parallel());
  return static_cast<int>(NumWorkers(config) / group);
}

OuterStep OuterStepOf(const config::DilocoConfig& diloco) {
  const bool tuned = diloco.every() >= kDilocoTunedEvery;
  OuterStep step;
  step.lr_given = diloco.has_outer_lr();
  step.momentum_given = diloco.has_outer_momentum();
  step.lr = step.lr_given ? diloco.outer_lr() : tuned ? 0.7 : 1.0;
  step.momentum = step.momentum_given ? diloco.outer_momentum() : tuned ? 0.9 : 0.0;
  return step;
}

std::string OuterStep::Describe(int every) const {
  char values[64];
  std::snprintf(values, sizeof values, "lr %g, momentum %g", lr, momentum);
  if (lr_given && momentum_given) return std::string(values) + " (as given)";
  const std::string rule = "the default for every " + std::to_string(every) +
                           (every >= kDilocoTunedEvery ? " >= " : " < ") + std::to_string(kDilocoTunedEvery);
  if (!lr_given && !momentum_given) return std::string(values) + " (" + rule + ")";
  return std::string(values) + " (" + (lr_given ? "lr as given, momentum " : "momentum as given, lr ") + rule + ")";
}

std::string ConfigToText(const JobConfig& config) {
  // Fill every default in so that the text is a complete record of the job.
  JobConfig full = config;
  const OuterStep outer = OuterStepOf(config.cluster().diloco());
  full.mutable_cluster()->mutable_diloco()->set_outer_lr(outer.lr);
  full.mutable_cluster()->mutable_diloco()->set_outer_momentum(outer.momentum);
  std::function<void(pb::Message*)> fill = [&fill](pb::Message* m) {
    const pb::Reflection* r = m->GetReflection();
    const pb::Descriptor* d = m->GetDescriptor();
    for (int i = 0; i < d->field_count(); ++i) {
      const pb::FieldDescriptor* f = d->field(i);
      if (f->is_repeated()) continue;
      if (f->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE) {
        fill(r->MutableMessage(m, f));
      } else if (!r->HasField(*m, f) && f->has_default_value()) {
        switch (f->cpp_type()) {
          case pb::FieldDescriptor::CPPTYPE_INT32: r->SetInt32(m, f, f->default_value_int32()); break;
          case pb::FieldDescriptor::CPPTYPE_INT64: r->SetInt64(m, f, f->default_value_int64()); break;
          case pb::FieldDescriptor::CPPTYPE_UINT32: r->SetUInt32(m, f, f->default_value_uint32()); break;
          case pb::FieldDescriptor::CPPTYPE_UINT64: r->SetUInt64(m, f, f->default_value_uint64()); break;
          case pb::FieldDescriptor::CPPTYPE_DOUBLE: r->SetDouble(m, f, f->default_value_double()); break;
          case pb::FieldDescriptor::CPPTYPE_FLOAT: r->SetFloat(m, f, f->default_value_float()); break;
          case pb::FieldDescriptor::CPPTYPE_BOOL: r->SetBool(m, f, f->default_value_bool()); break;
          case pb::FieldDescriptor::CPPTYPE_ENUM: r->SetEnum(m, f, f->default_value_enum()); break;
          case pb::FieldDescriptor::CPPTYPE_STRING: r->SetString(m, f, f->default_value_string()); break;
          default: break;
        }
      }
    }
  };
  fill(&full);
  std::string out;
  pb::TextFormat::Printer printer;
  printer.PrintToString(full, &out);
  return out;
}

}  // namespace herd
