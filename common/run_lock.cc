#include "common/run_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/file_util.h"
#include "common/strings.h"

namespace herd {
namespace {

// This process's command line, as `ps` shows it (arguments joined by
// spaces), for the holder's description.
std::string CommandLine() {
  auto text = ReadFile("/proc/self/cmdline", 1 << 16);
  if (!text.ok()) return "";
  std::string line = *text;
  while (!line.empty() && line.back() == '\0') line.pop_back();
  for (char& c : line) {
    if (c == '\0') c = ' ';
  }
  return line;
}

std::string UtcNow() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S UTC", &tm);
  return buf;
}

// Who holds the lock, from what it wrote in the file; a holder that has
// locked but not yet written gets a moment to do so.
std::string DescribeHolder(int fd) {
  for (int attempt = 0; attempt < 20; ++attempt) {
    char buf[4096];
    const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
    if (n > 0) {
      const auto holder = nlohmann::json::parse(std::string(buf, static_cast<size_t>(n)), nullptr, false);
      if (holder.is_object() && holder.contains("pid") && holder["pid"].is_number_integer()) {
        std::string s = "pid " + std::to_string(holder["pid"].get<long long>());
        if (holder.contains("host") && holder["host"].is_string()) s += " on " + holder["host"].get<std::string>();
        std::string command, since;
        if (holder.contains("command") && holder["command"].is_string()) command = holder["command"];
        if (holder.contains("since") && holder["since"].is_string()) since = holder["since"];
        if (!command.empty() || !since.empty()) {
          s += " (" + command + (command.empty() || since.empty() ? "" : ", ") + (since.empty() ? "" : "since " + since) +
               ")";
        }
        return s;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return "a process that has not said who it is";
}

}  // namespace

StatusOr<FileLock> FileLock::Acquire(const std::string& path, const std::string& what) {
  // The holder removes the file when it lets go: a lock taken on a file
  // that was removed meanwhile guards nothing, so the file locked must
  // still be the one at `path`.
  for (int attempt = 0; attempt < 100; ++attempt) {
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return Status::IOError(what + ": cannot open its lock file " + path + ": " + std::strerror(errno));
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      if (err != EWOULDBLOCK) {
        ::close(fd);
        return Status::IOError(what + ": cannot lock " + path + ": " + std::strerror(err));
      }
      const std::string holder = DescribeHolder(fd);
      ::close(fd);
      return Status::InvalidArgument(what + " is in use by another run: " + holder +
                                     "; stop that run or give this one another (lock file " + path + ")");
    }
    struct stat locked {}, named {};
    if (::fstat(fd, &locked) != 0 || ::stat(path.c_str(), &named) != 0 || locked.st_ino != named.st_ino ||
        locked.st_dev != named.st_dev) {
      ::close(fd);
      continue;
    }
    nlohmann::json holder = {{"pid", static_cast<long long>(::getpid())},
                             {"host", HostName()},
                             {"command", CommandLine()},
                             {"since", UtcNow()}};
    const std::string text = holder.dump() + "\n";
    if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size())) {
      const int err = errno;
      ::unlink(path.c_str());
      ::close(fd);
      return Status::IOError(what + ": cannot write its lock file " + path + ": " + std::strerror(err));
    }
    return FileLock(path, fd);
  }
  return Status::IOError(what + ": its lock file " + path + " keeps being removed and created again");
}

FileLock::FileLock(FileLock&& other) noexcept : path_(std::move(other.path_)), fd_(other.fd_) { other.fd_ = -1; }

FileLock& FileLock::operator=(FileLock&& other) noexcept {
  if (this != &other) {
    Release();
    path_ = std::move(other.path_);
    fd_ = other.fd_;
    other.fd_ = -1;
  }
  return *this;
}

FileLock::~FileLock() { Release(); }

void FileLock::Release() {
  if (fd_ < 0) return;
  // Removed while still locked: whoever opened it meanwhile finds it gone
  // once it has the lock, and tries again.
  ::unlink(path_.c_str());
  ::close(fd_);
  fd_ = -1;
}

std::string CheckpointLockPath(const std::string& checkpoint_dir) { return JoinPath(checkpoint_dir, "LOCK"); }

std::string MetricsLockPath(const std::string& metrics_path) { return metrics_path + ".lock"; }

bool RunLockedByParent() {
  const char* by = std::getenv(kRunLockedByVariable);
  return by != nullptr && std::to_string(::getppid()) == by;
}

std::string RunLockedByThisProcessVariable() {
  return std::string(kRunLockedByVariable) + "=" + std::to_string(::getpid());
}

Status RunLocks::Take(const std::string& checkpoint_dir, const std::string& metrics_path, bool take_checkpoint,
                      bool take_metrics) {
  if (RunLockedByParent()) return Status::OK();
  if (take_checkpoint && !checkpoint_dir.empty() && !checkpoint_) {
    HERD_RETURN_IF_ERROR(MakeDirs(checkpoint_dir).WithContext("checkpoint.dir: "));
    HERD_ASSIGN_OR_RETURN(checkpoint_,
                          FileLock::Acquire(CheckpointLockPath(checkpoint_dir), "checkpoint.dir " + checkpoint_dir));
  }
  if (take_metrics && !metrics_path.empty() && !metrics_) {
    HERD_RETURN_IF_ERROR(MakeDirs(DirName(metrics_path)).WithContext("log.metrics: "));
    HERD_ASSIGN_OR_RETURN(metrics_, FileLock::Acquire(MetricsLockPath(metrics_path), "log.metrics " + metrics_path));
  }
  return Status::OK();
}

}  // namespace herd
