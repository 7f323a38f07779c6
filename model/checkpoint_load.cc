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

StatusOr<std::vector<ShardState>> ReadShardRanges(const std::string& step_dir, const Manifest& manifest,
                                                  const std::vector<ParamRange>& ranges, bool with_moments,
                                                  float* weights_into, std::string_view prefix) {
  std::vector<ShardState> out(ranges.size());
  for (size_t i = 0; i < ranges.size(); ++i) {
    const size_t n = static_cast<size_t>(ranges[i].size());
    if (ranges[i].begin < 0 || ranges[i].end < ranges[i].begin || (i > 0 && ranges[i].begin < ranges[i - 1].end)) {
      return Status::Internal(step_dir + ": ranges to read must be ascending and disjoint");
    }
    out[i].begin = ranges[i].begin;
    out[i].end = ranges[i].end;
    out[i].step = manifest.step;
    if (weights_into == nullptr) out[i].weights.assign(n, 0.0f);
    if (with_moments) {
      out[i].m.assign(n, 0.0f);
      out[i].v.assign(n, 0.0f);
    }
  }
  if (ranges.empty()) return out;
  const int64_t lo = ranges.front().begin, hi = ranges.back().end;
  std::vector<std::vector<std::pair<int64_t, int64_t>>> covered(ranges.size());
  for (const std::string& part : manifest.parts) {
    if (!part.starts_with(prefix)) continue;
    const std::string path = JoinPath(step_dir, part);
    // Shards outside the ranges are not read (a server reads only its own).
    HERD_ASSIGN_OR_RETURN(ShardExtent extent, ReadShardExtent(path));
    if (extent.end <= lo || extent.begin >= hi) continue;
    HERD_ASSIGN_OR_RETURN(std::vector<ShardState> pieces, ReadShardPieces(path));
    // Both lists ascend: one walk pairs every piece with the ranges it meets.
    size_t first = 0;
    for (const ShardState& piece : pieces) {
      if (piece.step != manifest.step) {
        return Status::Corruption(path + ": holds step " + std::to_string(piece.step) + " but the manifest says " +
                                  std::to_string(manifest.step));
      }
      while (first < ranges.size() && ranges[first].end <= piece.begin) ++first;
      for (size_t i = first; i < ranges.size() && ranges[i].begin < piece.end; ++i) {
        ShardState& o = out[i];
        // Every shard carries the same spike statistics (its writer judged
        // the same losses and norms).
        if (piece.spikes.count > o.spikes.count) o.spikes = piece.spikes;
        const int64_t b = std::max(o.begin, piece.begin), e = std::min(o.end, piece.end);
        if (b >= e) continue;
        const size_t from = static_cast<size_t>(b - piece.begin), to = static_cast<size_t>(b - o.begin);
        const size_t count = static_cast<size_t>(e - b);
        std::copy_n(piece.weights.begin() + from, count,
                    weights_into != nullptr ? weights_into + b : o.weights.data() + to);
        if (with_moments) {
          std::copy_n(piece.m.begin() + from, count, o.m.begin() + to);
          std::copy_n(piece.v.begin() + from, count, o.v.begin() + to);
        }
        covered[i].emplace_back(b, e);
      }
    }
  }
  for (size_t i = 0; i < ranges.size(); ++i) {
    std::sort(covered[i].begin(), covered[i].end());
    int64_t reached = ranges[i].begin;
    for (auto [b, e] : covered[i]) {
      if (b > reached) break;
      reached = std::max(reached, e);
    }
    if (reached < ranges[i].end) {
      return Status::Corruption(step_dir + ": its shards do not cover [" + std::to_string(reached) + ", " +
                                std::to_string(ranges[i].end) + ") of the parameter space (a different model shape?)");
    }
  }
  return out;
}

StatusOr<ShardState> ReadShardRange(const std::string& step_dir, const Manifest& manifest, int64_t begin, int64_t end,
                                    bool with_moments, std::string_view prefix) {
  HERD_ASSIGN_OR_RETURN(std::vector<ShardState> one,
                        ReadShardRanges(step_dir, manifest, {ParamRange{begin, end}}, with_moments, nullptr, prefix));
  return std::move(one[0]);
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
