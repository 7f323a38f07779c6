#include "worker/checkpoint_writer.h"

#include <cstdio>
#include <vector>

#include "common/clock.h"
#include "common/file_util.h"
#include "model/checkpoint_format.h"
#include "transport/checkpoint_commit.h"

namespace herd {
namespace {

class Foreground : public CheckpointWriter {
 public:
  explicit Foreground(const CheckpointWriterParts& p) : p_(p) {}

  Status Commit(int64_t step, const std::string& loader, bool leader) override {
    const std::string step_dir = StepDirName(p_.config->checkpoint().dir(), step);
    const int shards = p_.sync->shard_files();
    const std::vector<std::string> parts = CheckpointParts(shards, p_.num_workers);
    Stopwatch sw;
    auto write_parts = [&] {
      HERD_RETURN_IF_ERROR(WriteFileAtomic(JoinPath(step_dir, WorkerFileName(p_.rank)), loader));
      return p_.sync->WriteCheckpointParts(step_dir);
    };
    // Worker 0 commits unless servers hold the optimizer (they commit then).
    HERD_RETURN_IF_ERROR(transport::CommitCheckpoint(p_.client, step_dir, step, *p_.config, leader && shards > 0,
                                                     parts, write_parts));
    if (leader) {
      std::printf("checkpoint: %s (%.1fs)\n", step_dir.c_str(), sw.Seconds());
      std::fflush(stdout);
    }
    return Status::OK();
  }
  Status Wait() override { return Status::OK(); }

 private:
  const CheckpointWriterParts p_;
};

class Background : public CheckpointWriter {
 public:
  explicit Background(const CheckpointWriterParts& p) : foreground_(p) {}

  Status Commit(int64_t step, const std::string& loader, bool leader) override {
    HERD_RETURN_IF_ERROR(background_.Wait());  // the previous checkpoint first
    background_.Start([this, step, loader, leader] { return foreground_.Commit(step, loader, leader); });
    return Status::OK();
  }
  Status Wait() override { return background_.Wait(); }

 private:
  Foreground foreground_;  // what each commit does, on background_'s thread
  transport::BackgroundCommit background_;
};

class None : public CheckpointWriter {
 public:
  Status Commit(int64_t, const std::string&, bool) override { return Status::OK(); }
  Status Wait() override { return Status::OK(); }
};

}  // namespace

std::unique_ptr<CheckpointWriter> ForegroundCheckpoints(const CheckpointWriterParts& parts) {
  return std::make_unique<Foreground>(parts);
}

std::unique_ptr<CheckpointWriter> BackgroundCheckpoints(const CheckpointWriterParts& parts) {
  return std::make_unique<Background>(parts);
}

std::unique_ptr<CheckpointWriter> NoCheckpoints() { return std::make_unique<None>(); }

}  // namespace herd
