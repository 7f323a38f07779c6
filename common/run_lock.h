// Who owns a run's files while it runs: an advisory lock (flock) on a file
// beside what the run writes, as LevelDB's LOCK. A second run that names
// the same checkpoint folder or metrics file is refused at once, in one
// line naming the holder (pid, host, command); the lock goes with its
// holder however it ends (the kernel releases it when the process dies,
// SIGKILL included), so a dead run's folder is simply taken over.
//
// Who holds them: `herd launch` (for the whole job and its restarts); by
// hand, the process that writes the files (the checkpoint committer,
// server 0 or worker 0 without servers; the worker that writes the
// metrics). Processes a launcher started find the launcher holding them
// (RunLockedByParent) and take none; a process joining a running job
// takes none either: the coordinator admitted it into the run that owns
// them.
#pragma once

#include <optional>
#include <string>

#include "common/status.h"

namespace herd {

// An exclusive lock on `path` (created if absent, with the holder's pid,
// host and command in it). Released, and the file removed, when the object
// goes; a holder that dies leaves the file, unlocked, for the next.
class FileLock {
 public:
  // `what` names the thing guarded in the refusal ("checkpoint.dir ckpt").
  // InvalidArgument when another process holds it: the run must be given
  // other files or wait for that one, a restart would not help.
  static StatusOr<FileLock> Acquire(const std::string& path, const std::string& what);

  FileLock(FileLock&& other) noexcept;
  FileLock& operator=(FileLock&& other) noexcept;
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;
  ~FileLock();

  const std::string& path() const { return path_; }

 private:
  FileLock(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  void Release();

  std::string path_;
  int fd_ = -1;
};

// The lock files of a run's outputs.
std::string CheckpointLockPath(const std::string& checkpoint_dir);  // DIR/LOCK
std::string MetricsLockPath(const std::string& metrics_path);       // FILE.lock

// Whether this process's parent is a launcher that holds its run's locks:
// it started the process with kRunLockedByVariable=its pid.
inline constexpr char kRunLockedByVariable[] = "HERD_RUN_LOCKED_BY";
bool RunLockedByParent();
// "HERD_RUN_LOCKED_BY=<this process's pid>", for a launcher's children.
std::string RunLockedByThisProcessVariable();

// The locks of one run: the checkpoint folder's and the metrics file's,
// each when the config names it and `take_*` says this process writes it.
class RunLocks {
 public:
  Status Take(const std::string& checkpoint_dir, const std::string& metrics_path, bool take_checkpoint,
              bool take_metrics);

 private:
  std::optional<FileLock> checkpoint_, metrics_;
};

}  // namespace herd
