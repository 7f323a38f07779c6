// A worker's part in committing a checkpoint (transport/checkpoint_commit.h):
// what it writes and whether training waits for the commit.
//
//   Foreground: its data position and the SyncStrategy's optimizer parts
//     (one process, all-reduce, parameter-server mode without
//     checkpoint.background); worker 0 commits where the workers hold the
//     optimizer. The step waits for the commit.
//   Background (parameter-server mode with checkpoint.background): the
//     data position only (the servers hold the rest and commit), on a
//     thread of its own while training goes on; one commit at a time.
//   None (an elastic job): the servers write the data position too, from
//     the positions the workers report with their losses.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"
#include "proto/herd.pb.h"
#include "transport/coordinator_client.h"
#include "worker/reducers/sync_strategy.h"

namespace herd {

class CheckpointWriter {
 public:
  virtual ~CheckpointWriter() = default;
  // Commits the checkpoint of step `step` (1-based, its weights all in):
  // `loader` is the data position after the step; `leader`: this worker
  // says that it did.
  virtual Status Commit(int64_t step, const std::string& loader, bool leader) = 0;
  // Waits for a commit under way; how the last one ended.
  virtual Status Wait() = 0;
};

struct CheckpointWriterParts {
  const config::JobConfig* config = nullptr;
  SyncStrategy* sync = nullptr;
  transport::CoordinatorClient* client = nullptr;  // null: one process
  int rank = 0, num_workers = 1;
};

std::unique_ptr<CheckpointWriter> ForegroundCheckpoints(const CheckpointWriterParts& parts);
// Destroying it waits for the commit under way: it must go before `client`.
std::unique_ptr<CheckpointWriter> BackgroundCheckpoints(const CheckpointWriterParts& parts);
std::unique_ptr<CheckpointWriter> NoCheckpoints();

}  // namespace herd
