#include "model/checkpoint_load.h"

#include <dirent.h>
#include <glog/logging.h>

#include <algorithm>
#include <utility>

#include "common/file_util.h"
#include "model/llama_config.h"
#include "model/param_layout.h"

namespace herd {

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
    if (HasManifest(JoinPath(root, name))) return true;
  }
  return false;
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
    HERD_ASSIGN_OR_RETURN(ShardExtent extent, ReadShardExtent(path));
    if (extent.end <= begin || extent.begin >= end) continue;
    HERD_ASSIGN_OR_RETURN(ShardState shard, ReadShard(path));
    if (shard.step != manifest.step) {
      return Status::Corruption(path + ": holds step " + std::to_string(shard.step) + " but the manifest says " +
                                std::to_string(manifest.step));
    }
    // Every shard carries the same spike statistics (its writer judged the
    // same losses and norms).
    if (shard.spikes.count > out.spikes.count) out.spikes = shard.spikes;
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

StatusOr<CheckpointModel> LoadCheckpointModel(const std::string& path) {
  VerifiedCheckpoint step;
  if (HasManifest(path)) {
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

}  // namespace herd
