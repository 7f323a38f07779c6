#include "model/checkpoint.h"

#include <dirent.h>
#include <glog/logging.h>
#include <google/protobuf/util/message_differencer.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

#include "common/config.h"
#include "common/file_util.h"
#include "common/strings.h"
#include "model/llama_config.h"
#include "model/param_layout.h"

namespace herd {
namespace {

using json = nlohmann::json;

constexpr char kShardMagic[8] = {'H', 'E', 'R', 'D', 'S', 'H', 'R', 'D'};
constexpr uint32_t kShardVersion = 1;
constexpr char kManifest[] = "manifest.json";
constexpr char kConfigFile[] = "config.textproto";

// Fixed-size little-endian header in front of a shard's three arrays.
struct ShardHeader {
  char magic[8];
  uint32_t version;
  uint32_t payload_crc;  // CRC-32 of weights, m, v
  int64_t begin, end, step;
};
static_assert(sizeof(ShardHeader) == 40);

}  // namespace

std::string StepDirName(const std::string& root, int64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "step_%08" PRId64, step);
  return JoinPath(root, name);
}

std::string ShardFileName(int shard_index) {
  char name[32];
  std::snprintf(name, sizeof(name), "shard_%05d.bin", shard_index);
  return name;
}

std::string WorkerFileName(int worker_rank) {
  char name[32];
  std::snprintf(name, sizeof(name), "worker_%05d.state", worker_rank);
  return name;
}

Status WriteShard(const std::string& path, const ShardView& shard) {
  const size_t n = static_cast<size_t>(shard.end - shard.begin);
  if (shard.end < shard.begin || (n > 0 && (shard.weights == nullptr || shard.m == nullptr || shard.v == nullptr))) {
    return Status::Internal(path + ": shard arrays do not match its range");
  }
  ShardHeader h{};
  std::memcpy(h.magic, kShardMagic, sizeof(kShardMagic));
  h.version = kShardVersion;
  h.begin = shard.begin;
  h.end = shard.end;
  h.step = shard.step;
  uint32_t crc = Crc32(shard.weights, n * sizeof(float));
  crc = Crc32(shard.m, n * sizeof(float), crc);
  h.payload_crc = Crc32(shard.v, n * sizeof(float), crc);
  AtomicFile file;
  HERD_RETURN_IF_ERROR(file.Open(path));
  HERD_RETURN_IF_ERROR(file.Append(&h, sizeof(h)));
  HERD_RETURN_IF_ERROR(file.Append(shard.weights, n * sizeof(float)));
  HERD_RETURN_IF_ERROR(file.Append(shard.m, n * sizeof(float)));
  HERD_RETURN_IF_ERROR(file.Append(shard.v, n * sizeof(float)));
  return file.Commit();
}

namespace {

// The fixed header of `data` (a whole shard file or its first bytes),
// validated.
StatusOr<ShardHeader> ParseShardHeader(const std::string& path, std::string_view data) {
  if (data.size() < sizeof(ShardHeader)) {
    return Status::Corruption(path + ": " + std::to_string(data.size()) + " bytes is shorter than a shard header");
  }
  ShardHeader h;
  std::memcpy(&h, data.data(), sizeof(h));
  if (std::memcmp(h.magic, kShardMagic, sizeof(kShardMagic)) != 0) {
    return Status::Corruption(path + ": not a herd shard (bad magic)");
  }
  if (h.version != kShardVersion) {
    return Status::Corruption(path + ": shard version " + std::to_string(h.version) + ", expected " +
                              std::to_string(kShardVersion));
  }
  if (h.begin < 0 || h.end < h.begin || h.step < 0 || (h.end - h.begin) > (int64_t{1} << 40)) {
    return Status::Corruption(path + ": invalid range [" + std::to_string(h.begin) + ", " + std::to_string(h.end) +
                              ") or step " + std::to_string(h.step));
  }
  return h;
}

// Only the header: which range a shard holds, without reading its arrays.
StatusOr<ShardHeader> ReadShardHeader(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return Status::NotFound(path + ": cannot open");
  std::string head(sizeof(ShardHeader), '\0');
  head.resize(std::fread(head.data(), 1, head.size(), f));
  std::fclose(f);
  return ParseShardHeader(path, head);
}

}  // namespace

StatusOr<ShardState> ReadShard(const std::string& path) {
  HERD_ASSIGN_OR_RETURN(std::string data, ReadFile(path));
  HERD_ASSIGN_OR_RETURN(ShardHeader h, ParseShardHeader(path, data));
  const size_t n = static_cast<size_t>(h.end - h.begin);
  const size_t expected = sizeof(ShardHeader) + 3 * n * sizeof(float);
  if (data.size() != expected) {
    return Status::Corruption(path + ": range of " + std::to_string(n) + " elements needs " +
                              std::to_string(expected) + " bytes, file has " + std::to_string(data.size()));
  }
  const char* payload = data.data() + sizeof(ShardHeader);
  if (Crc32(payload, 3 * n * sizeof(float)) != h.payload_crc) {
    return Status::Corruption(path + ": checksum mismatch (file is damaged)");
  }
  ShardState s;
  s.begin = h.begin;
  s.end = h.end;
  s.step = h.step;
  s.weights.resize(n);
  s.m.resize(n);
  s.v.resize(n);
  std::memcpy(s.weights.data(), payload, n * sizeof(float));
  std::memcpy(s.m.data(), payload + n * sizeof(float), n * sizeof(float));
  std::memcpy(s.v.data(), payload + 2 * n * sizeof(float), n * sizeof(float));
  return s;
}

std::vector<std::string> CheckpointParts(int shards, int workers) {
  std::vector<std::string> parts = {kConfigFile};
  for (int s = 0; s < shards; ++s) parts.push_back(ShardFileName(s));
  for (int w = 0; w < workers; ++w) parts.push_back(WorkerFileName(w));
  return parts;
}

Status WriteManifest(const std::string& step_dir, int64_t step, const std::vector<std::string>& parts) {
  json manifest;
  manifest["format"] = "herd-checkpoint";
  manifest["version"] = 1;
  manifest["step"] = step;
  json list = json::array();
  for (const std::string& part : parts) {
    HERD_ASSIGN_OR_RETURN(std::string data, ReadFile(JoinPath(step_dir, part)));
    list.push_back({{"file", part}, {"bytes", data.size()}, {"crc32", Crc32(data.data(), data.size())}});
  }
  manifest["parts"] = list;
  return WriteFileAtomic(JoinPath(step_dir, kManifest), manifest.dump(2) + "\n");
}

StatusOr<Manifest> VerifyCheckpoint(const std::string& step_dir) {
  const std::string path = JoinPath(step_dir, kManifest);
  auto text = ReadFile(path);
  if (!text.ok()) {
    if (text.status().code() == Status::Code::kNotFound) {
      return Status::NotFound(step_dir + ": no manifest.json: the checkpoint is incomplete and is not loaded");
    }
    return text.status();
  }
  json m = json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (m.is_discarded() || !m.is_object()) return Status::Corruption(path + ": not valid JSON");
  if (m.value("format", "") != "herd-checkpoint" || !m.contains("step") || !m["step"].is_number_integer() ||
      !m.contains("parts") || !m["parts"].is_array()) {
    return Status::Corruption(path + ": not a herd manifest (needs format, step, parts)");
  }
  Manifest out;
  out.step = m["step"].get<int64_t>();
  for (const json& part : m["parts"]) {
    if (!part.is_object() || !part.contains("file") || !part["file"].is_string() || !part.contains("bytes") ||
        !part["bytes"].is_number_unsigned() || !part.contains("crc32") || !part["crc32"].is_number_unsigned()) {
      return Status::Corruption(path + ": malformed part entry");
    }
    const std::string file = part["file"].get<std::string>();
    if (file.empty() || file.find('/') != std::string::npos || file.starts_with(".")) {
      return Status::Corruption(path + ": part name '" + file + "' is not a plain file name");
    }
    HERD_ASSIGN_OR_RETURN(std::string data, ReadFile(JoinPath(step_dir, file)));
    if (data.size() != part["bytes"].get<uint64_t>() || Crc32(data.data(), data.size()) != part["crc32"].get<uint32_t>()) {
      return Status::Corruption(JoinPath(step_dir, file) + ": does not match the manifest (size or checksum)");
    }
    out.parts.push_back(file);
  }
  return out;
}

namespace {

// step_* directory names under `root`, newest first (empty if none).
std::vector<std::string> StepDirsNewestFirst(const std::string& root) {
  std::vector<std::string> steps;
  DIR* dir = ::opendir(root.c_str());
  if (dir == nullptr) return steps;
  while (dirent* e = ::readdir(dir)) {
    std::string name = e->d_name;
    if (name.size() == 13 && name.starts_with("step_") &&
        std::all_of(name.begin() + 5, name.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      steps.push_back(name);
    }
  }
  ::closedir(dir);
  std::sort(steps.rbegin(), steps.rend());
  return steps;
}

}  // namespace

StatusOr<VerifiedCheckpoint> LatestVerifiedCheckpoint(const std::string& root) {
  if (!PathExists(root)) return Status::NotFound(root + ": no checkpoint directory");
  for (const std::string& name : StepDirsNewestFirst(root)) {
    std::string step_dir = JoinPath(root, name);
    auto manifest = VerifyCheckpoint(step_dir);
    if (manifest.ok()) return VerifiedCheckpoint{step_dir, std::move(manifest).value()};
    LOG(WARNING) << "skipping " << manifest.status().message();
  }
  return Status::NotFound(root + ": no complete checkpoint (a step_* directory with a valid manifest.json)");
}

StatusOr<std::string> LatestCheckpoint(const std::string& root) {
  HERD_ASSIGN_OR_RETURN(VerifiedCheckpoint latest, LatestVerifiedCheckpoint(root));
  return latest.dir;
}

bool HasCheckpoints(const std::string& root) {
  for (const std::string& name : StepDirsNewestFirst(root)) {
    if (PathExists(JoinPath(JoinPath(root, name), kManifest))) return true;
  }
  return false;
}

StatusOr<CheckpointModel> LoadCheckpointModel(const std::string& path) {
  VerifiedCheckpoint step;
  if (PathExists(JoinPath(path, kManifest))) {
    step.dir = path;
    HERD_ASSIGN_OR_RETURN(step.manifest, VerifyCheckpoint(path));
  } else {
    if (!PathExists(path)) return Status::NotFound(path + ": no such checkpoint");
    auto latest = LatestVerifiedCheckpoint(path);
    if (!latest.ok()) {
      // A step directory without manifest is reported as such.
      if (path.find("step_") != std::string::npos) return VerifyCheckpoint(path).status();
      return latest.status();
    }
    step = std::move(latest).value();
  }
  const std::string& step_dir = step.dir;
  const Manifest& manifest = step.manifest;
  CheckpointModel out;
  out.step = manifest.step;
  HERD_ASSIGN_OR_RETURN(out.config, ReadCheckpointConfig(step_dir));
  ParamLayout layout(LlamaShape::FromConfig(out.config.model()));
  HERD_ASSIGN_OR_RETURN(ShardState all, ReadShardRange(step_dir, manifest, 0, layout.size(), /*with_moments=*/false));
  out.weights = std::move(all.weights);
  return out;
}

StatusOr<ShardState> ReadShardRange(const std::string& step_dir, const Manifest& manifest, int64_t begin, int64_t end,
                                    bool with_moments) {
  const size_t n = static_cast<size_t>(end - begin);
  ShardState out;
  out.begin = begin;
  out.end = end;
  out.step = manifest.step;
  out.weights.assign(n, 0.0f);
  if (with_moments) {
    out.m.assign(n, 0.0f);
    out.v.assign(n, 0.0f);
  }
  std::vector<std::pair<int64_t, int64_t>> covered;
  for (const std::string& part : manifest.parts) {
    if (!part.starts_with("shard_")) continue;
    const std::string path = JoinPath(step_dir, part);
    // Shards outside the range are not read (a server reads only its own).
    HERD_ASSIGN_OR_RETURN(ShardHeader header, ReadShardHeader(path));
    if (header.end <= begin || header.begin >= end) continue;
    HERD_ASSIGN_OR_RETURN(ShardState shard, ReadShard(path));
    if (shard.step != manifest.step) {
      return Status::Corruption(path + ": holds step " + std::to_string(shard.step) + " but the manifest says " +
                                std::to_string(manifest.step));
    }
    const int64_t lo = std::max(begin, shard.begin), hi = std::min(end, shard.end);
    if (lo >= hi) continue;
    const size_t from = static_cast<size_t>(lo - shard.begin), to = static_cast<size_t>(lo - begin);
    const size_t count = static_cast<size_t>(hi - lo);
    std::copy_n(shard.weights.begin() + from, count, out.weights.begin() + to);
    if (with_moments) {
      std::copy_n(shard.m.begin() + from, count, out.m.begin() + to);
      std::copy_n(shard.v.begin() + from, count, out.v.begin() + to);
    }
    covered.emplace_back(lo, hi);
  }
  std::sort(covered.begin(), covered.end());
  int64_t reached = begin;
  for (auto [b, e] : covered) {
    if (b > reached) break;
    reached = std::max(reached, e);
  }
  if (reached < end) {
    return Status::Corruption(step_dir + ": its shards do not cover [" + std::to_string(reached) + ", " +
                              std::to_string(end) + ") of the parameter space (a different model shape?)");
  }
  return out;
}

Status BeginCheckpointPart(const std::string& step_dir) {
  HERD_RETURN_IF_ERROR(MakeDirs(step_dir));
  const std::string manifest_path = JoinPath(step_dir, kManifest);
  if (::unlink(manifest_path.c_str()) != 0 && errno != ENOENT) {
    return Status::IOError(manifest_path + ": cannot remove the old manifest");
  }
  return Status::OK();
}

Status WriteConfigPart(const std::string& step_dir, const config::JobConfig& config) {
  return WriteFileAtomic(JoinPath(step_dir, kConfigFile), ConfigToText(config));
}

bool CheckpointDue(const config::CheckpointConfig& checkpoint, int64_t step, int64_t last_step) {
  if (checkpoint.dir().empty()) return false;
  return step == last_step || (checkpoint.every() > 0 && step % checkpoint.every() == 0);
}

Status CheckWritable(const std::string& dir) {
  HERD_RETURN_IF_ERROR(MakeDirs(dir).WithContext("checkpoint.dir: "));
  const std::string probe = JoinPath(dir, ".herd_write_probe." + std::to_string(::getpid()));
  std::FILE* f = std::fopen(probe.c_str(), "w");
  if (f == nullptr) return Status::IOError("checkpoint.dir: " + dir + ": not writable");
  std::fclose(f);
  ::unlink(probe.c_str());
  return Status::OK();
}

namespace {

// "modified: a.b: x -> y" lines of a MessageDifferencer report, joined.
std::string Changes(const std::string& report) {
  std::string changes;
  for (const std::string& line : Split(report, '\n')) {
    if (line.empty() || line.starts_with("ignored:")) continue;
    changes += (changes.empty() ? "" : "; ") + line;
  }
  return changes;
}

const google::protobuf::FieldDescriptor* Field(const google::protobuf::Descriptor* d, const char* name) {
  const google::protobuf::FieldDescriptor* f = d->FindFieldByName(name);
  CHECK(f != nullptr) << d->name() << " has no field " << name;
  return f;
}

// What is not part of a model's shape: metadata kept for export (an
// imported model continues under a config that does not repeat it), and
// how the model was initialised.
void IgnoreNonShapeFields(google::protobuf::util::MessageDifferencer* differ) {
  differ->IgnoreField(Field(config::ModelConfig::descriptor(), "max_position_embeddings"));
  differ->IgnoreField(Field(config::ModelConfig::descriptor(), "initializer_range"));
}

}  // namespace

Status CheckSameShape(const config::ModelConfig& found, const config::ModelConfig& expected, const std::string& what) {
  std::string diff;
  google::protobuf::util::MessageDifferencer differ;
  differ.set_message_field_comparison(google::protobuf::util::MessageDifferencer::EQUIVALENT);
  IgnoreNonShapeFields(&differ);
  differ.ReportDifferencesToString(&diff);
  if (!differ.Compare(found, expected)) {
    return Status::FailedPrecondition(what + ": holds a different model (" + Changes(diff) + ")");
  }
  return Status::OK();
}

StatusOr<config::JobConfig> ReadCheckpointConfig(const std::string& step_dir) {
  const std::string path = JoinPath(step_dir, kConfigFile);
  HERD_ASSIGN_OR_RETURN(std::string text, ReadFile(path, kMaxConfigBytes));
  return ParseJobConfig(text, path);
}

Status CheckSameModel(const std::string& step_dir, const config::JobConfig& config) {
  HERD_ASSIGN_OR_RETURN(config::JobConfig saved, ReadCheckpointConfig(step_dir));
  return CheckSameShape(saved.model(), config.model(), step_dir);
}

// What --resume may change (README lists the same); "log" stands for log.*.
constexpr const char* kResumableFields[] = {
    "train.steps", "train.threads", "checkpoint.dir", "checkpoint.every", "checkpoint.init_from", "data.val",
    "data.prepare_from", "data.val_fraction", "log", "cluster", "device"};

Status CheckSameRun(const std::string& step_dir, const config::JobConfig& config) {
  HERD_ASSIGN_OR_RETURN(config::JobConfig saved, ReadCheckpointConfig(step_dir));
  HERD_RETURN_IF_ERROR(CheckSameShape(saved.model(), config.model(), step_dir));
  std::string diff;
  google::protobuf::util::MessageDifferencer differ;
  differ.set_message_field_comparison(google::protobuf::util::MessageDifferencer::EQUIVALENT);
  IgnoreNonShapeFields(&differ);
  std::string resumable;
  for (const char* name : kResumableFields) {
    const google::protobuf::Descriptor* d = config::JobConfig::descriptor();
    const std::vector<std::string> parts = Split(name, '.');
    for (size_t i = 0; i + 1 < parts.size(); ++i) d = Field(d, parts[i].c_str())->message_type();
    differ.IgnoreField(Field(d, parts.back().c_str()));
    resumable += (resumable.empty() ? "" : ", ") + std::string(name) + (parts.size() == 1 ? ".*" : "");
  }
  differ.ReportDifferencesToString(&diff);
  if (!differ.Compare(saved, config)) {
    return Status::InvalidArgument("--resume: " + step_dir + " was written by a run with other settings (" +
                                   Changes(diff) + "); a resume may change only " + resumable +
                                   " (train with the new settings in another checkpoint.dir)");
  }
  return Status::OK();
}

Status CheckFreshRun(const std::string& root, bool overwrite) {
  if (root.empty() || !PathExists(root)) return Status::OK();
  const std::vector<std::string> steps = StepDirsNewestFirst(root);
  if (steps.empty()) return Status::OK();
  if (!overwrite) {
    return Status::InvalidArgument("checkpoint.dir " + root + " already holds checkpoints (newest: " +
                                   steps.front() +
                                   "); pass --resume to continue them, or --overwrite to delete them and start over");
  }
  for (const std::string& name : steps) {
    HERD_RETURN_IF_ERROR(RemoveFlatDirectory(JoinPath(root, name)).WithContext("--overwrite: "));
  }
  std::printf("--overwrite: removed %zu checkpoint(s) from %s\n", steps.size(), root.c_str());
  std::fflush(stdout);
  return Status::OK();
}

Status WriteSingleShardCheckpoint(const std::string& step_dir, const config::JobConfig& config,
                                  const ShardView& shard, const std::string& worker_state) {
  HERD_RETURN_IF_ERROR(BeginCheckpointPart(step_dir));
  std::vector<std::string> parts = {kConfigFile, ShardFileName(0)};
  HERD_RETURN_IF_ERROR(WriteConfigPart(step_dir, config));
  HERD_RETURN_IF_ERROR(WriteShard(JoinPath(step_dir, ShardFileName(0)), shard));
  if (!worker_state.empty()) {
    HERD_RETURN_IF_ERROR(WriteFileAtomic(JoinPath(step_dir, WorkerFileName(0)), worker_state));
    parts.push_back(WorkerFileName(0));
  }
  return WriteManifest(step_dir, shard.step, parts);
}

}  // namespace herd
