// Committing a checkpoint (format and promise: model/checkpoint_format.h).
// Every writer of a part begins with BeginCheckpointPart, then writes its
// parts atomically; the committer writes the config part with its own and,
// once every part has been written, the manifest that makes the step
// complete. For several processes, whose parts report their success by a
// vote, see transport/checkpoint_commit.h; one process commits alone here.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/status.h"
#include "model/checkpoint_format.h"
#include "proto/herd.pb.h"

namespace herd {

// Creates the step directory and retracts a manifest left there by an
// earlier run of the same step, which would otherwise vouch for a mix of
// old and new parts.
Status BeginCheckpointPart(const std::string& step_dir);

// One process writes the whole checkpoint of `step`: begins, writes the
// config part, then its other parts (`write_parts`), and commits the
// manifest listing `parts`. The first failure is returned and leaves no
// manifest.
Status CommitOneProcessCheckpoint(const std::string& step_dir, int64_t step, const config::JobConfig& config,
                                  const std::vector<std::string>& parts, const std::function<Status()>& write_parts);

// A complete checkpoint of one shard covering the whole space, without a
// data position: how `herd import` saves a model.
Status WriteSingleShardCheckpoint(const std::string& step_dir, const config::JobConfig& config, const ShardView& shard);

}  // namespace herd
