#include "model/checkpoint_run.h"

#include <glog/logging.h>
#include <google/protobuf/util/message_differencer.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "common/config.h"
#include "common/file_util.h"
#include "common/strings.h"
#include "model/checkpoint_format.h"
#include "model/checkpoint_load.h"
#include "model/hf_io.h"

namespace herd {

bool CheckpointSchedule::Due(int64_t step, int64_t last_step) const {
  if (dir.empty()) return false;
  return step == last_step || (every > 0 && step % every == 0);
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

Status CheckSameModel(const std::string& step_dir, const config::ModelConfig& model) {
  HERD_ASSIGN_OR_RETURN(config::JobConfig saved, ReadCheckpointConfig(step_dir));
  return CheckSameShape(saved.model(), model, step_dir);
}

// What --resume may change (docs/checkpoints.md lists the same); "log" stands for log.*.
constexpr const char* kResumableFields[] = {
    "train.steps", "train.threads", "checkpoint.dir", "checkpoint.every", "checkpoint.init_from", "data.val",
    "data.prepare_from", "data.val_fraction", "log", "cluster", "device"};

namespace {

// Sequences per step: train.batch_size x train.grad_accum x data-parallel replicas.
int64_t GlobalBatch(const config::JobConfig& c) {
  return int64_t{c.train().batch_size()} * c.train().grad_accum() * DataParallelReplicas(c);
}

std::string DescribeGlobalBatch(const config::JobConfig& c) {
  return std::to_string(GlobalBatch(c)) + " sequences per step (train.batch_size " +
         std::to_string(c.train().batch_size()) + " x train.grad_accum " + std::to_string(c.train().grad_accum()) +
         " x " + std::to_string(DataParallelReplicas(c)) + " replica(s))";
}

}  // namespace

Status CheckSameRun(const std::string& step_dir, const config::JobConfig& config, bool new_global_batch) {
  HERD_ASSIGN_OR_RETURN(config::JobConfig saved, ReadCheckpointConfig(step_dir));
  HERD_RETURN_IF_ERROR(CheckSameShape(saved.model(), config.model(), step_dir));
  config::JobConfig resumed = config;
  resumed.mutable_train()->set_batch_size(saved.train().batch_size());
  resumed.mutable_train()->set_grad_accum(saved.train().grad_accum());
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
  resumable += ", and train.batch_size and train.grad_accum with the same global batch";
  differ.ReportDifferencesToString(&diff);
  if (!differ.Compare(saved, resumed)) {
    diff.clear();
    differ.Compare(saved, config);  // the message names the split too
    return Status::InvalidArgument("--resume: " + step_dir + " was written by a run with other settings (" +
                                   Changes(diff) + "); a resume may change only " + resumable +
                                   " (train with the new settings in another checkpoint.dir)");
  }
  // Any number of processes continues the run as long as each step takes
  // the same sequences: the global batch, not its split, is the run's.
  // Another global batch is another run's schedule of data (the data goes on
  // right after the last sequence taken): only when asked for.
  if (GlobalBatch(saved) != GlobalBatch(config) && !new_global_batch) {
    const int64_t split = int64_t{config.train().grad_accum()} * DataParallelReplicas(config);
    const bool splits = GlobalBatch(saved) % split == 0;
    return Status::InvalidArgument(
        "--resume: " + step_dir + " was written with a global batch of " + DescribeGlobalBatch(saved) +
        "; this run has " + DescribeGlobalBatch(config) + ": a resume keeps the global batch (" +
        (splits ? "set train.batch_size=" + std::to_string(GlobalBatch(saved) / split)
                : "choose train.batch_size, train.grad_accum and workers whose product is " +
                      std::to_string(GlobalBatch(saved))) +
        "; or pass --allow-global-batch-change to go on with the new one)");
  }
  return Status::OK();
}

StatusOr<std::optional<VerifiedCheckpoint>> ResumePoint(const config::JobConfig& config, const TrainOptions& options) {
  const std::string& dir = config.checkpoint().dir();
  if (!dir.empty()) HERD_RETURN_IF_ERROR(CheckWritable(dir));
  if (!options.resume || (dir.empty() && options.start_if_none)) return std::optional<VerifiedCheckpoint>();
  if (dir.empty()) return Status::InvalidArgument("--resume needs checkpoint.dir to be set");
  StatusOr<VerifiedCheckpoint> found = LatestVerifiedCheckpoint(dir);
  if (!found.ok() && found.status().code() == Status::Code::kNotFound && options.start_if_none) {
    return std::optional<VerifiedCheckpoint>();
  }
  HERD_ASSIGN_OR_RETURN(VerifiedCheckpoint latest, std::move(found));
  HERD_RETURN_IF_ERROR(CheckSameRun(latest.dir, config, options.allow_global_batch_change));
  return std::optional<VerifiedCheckpoint>(std::move(latest));
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

namespace {

// NAME.tmp.PID (file_util's TempPathFor) of a process that is not alive.
bool DeadProcessTemp(const std::string& name) {
  const size_t at = name.rfind(".tmp.");
  if (at == std::string::npos || at + 5 == name.size()) return false;
  const std::string pid = name.substr(at + 5);
  if (pid.find_first_not_of("0123456789") != std::string::npos || pid.size() > 9) return false;
  return ::kill(static_cast<pid_t>(std::stol(pid)), 0) != 0 && errno == ESRCH;
}

}  // namespace

Status RemoveFailedCheckpointWrites(const std::string& root) {
  const std::vector<std::string> steps = StepDirsNewestFirst(root);
  // Directories after the newest committed one (a manifest, checked or
  // not: a resume checks it) hold checkpoints whose vote never completed.
  std::string newest_committed;
  for (const std::string& name : steps) {
    if (PathExists(JoinPath(JoinPath(root, name), "manifest.json"))) {
      newest_committed = name;
      break;
    }
  }
  if (newest_committed.empty()) return Status::OK();  // nothing to resume from: leave everything
  int64_t files = 0, dirs = 0;
  for (const std::string& name : steps) {
    const std::string step_dir = JoinPath(root, name);
    bool live_temp = false;
    HERD_ASSIGN_OR_RETURN(const std::vector<std::string> entries, ListDirectory(step_dir));
    for (const std::string& entry : entries) {
      if (entry.find(".tmp.") == std::string::npos) continue;
      if (!DeadProcessTemp(entry)) {
        live_temp = true;
        continue;
      }
      if (::unlink(JoinPath(step_dir, entry).c_str()) != 0 && errno != ENOENT) {
        return Status::IOError(JoinPath(step_dir, entry) + ": cannot remove: " + std::strerror(errno));
      }
      ++files;
    }
    if (name > newest_committed && !live_temp) {
      HERD_RETURN_IF_ERROR(RemoveFlatDirectory(step_dir));
      ++dirs;
    }
  }
  if (files + dirs > 0) {
    std::printf("checkpoint.dir %s: removed what failed writes left: %lld temporary files, %lld step directories "
                "without a manifest\n",
                root.c_str(), static_cast<long long>(files), static_cast<long long>(dirs));
    std::fflush(stdout);
  }
  return Status::OK();
}

Status CheckRunCanStart(const config::JobConfig& config, const TrainOptions& options) {
  if (options.resume) {
    const std::string& dir = config.checkpoint().dir();
    return dir.empty() ? Status::OK() : RemoveFailedCheckpointWrites(dir).WithContext("checkpoint.dir: ");
  }
  HERD_RETURN_IF_ERROR(CheckInitFrom(config.checkpoint().init_from(), config.model()));
  const std::string& dir = config.checkpoint().dir();
  if (!dir.empty()) HERD_RETURN_IF_ERROR(CheckWritable(dir));
  return CheckFreshRun(dir, options.overwrite);
}

}  // namespace herd
