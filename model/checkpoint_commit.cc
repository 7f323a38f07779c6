#include "model/checkpoint_commit.h"

#include "common/file_util.h"

namespace herd {

Status BeginCheckpointPart(const std::string& step_dir) {
  HERD_RETURN_IF_ERROR(MakeDirs(step_dir));
  return RemoveManifest(step_dir);
}

Status CommitOneProcessCheckpoint(const std::string& step_dir, int64_t step, const config::JobConfig& config,
                                  const std::vector<std::string>& parts, const std::function<Status()>& write_parts) {
  HERD_RETURN_IF_ERROR(BeginCheckpointPart(step_dir));
  HERD_RETURN_IF_ERROR(WriteConfigPart(step_dir, config));
  HERD_RETURN_IF_ERROR(write_parts());
  return WriteManifest(step_dir, step, parts);
}

Status WriteSingleShardCheckpoint(const std::string& step_dir, const config::JobConfig& config, const ShardView& shard) {
  return CommitOneProcessCheckpoint(step_dir, shard.step, config, CheckpointParts(/*shards=*/1, /*workers=*/0),
                                    [&] { return WriteShard(JoinPath(step_dir, ShardFileName(0)), shard); });
}

}  // namespace herd
