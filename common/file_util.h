// Files: whole-file reads and crash-safe writes.
//
// Promise of AtomicFile: the destination either keeps its old content (or
// stays absent) or has the complete new content — the data goes to a
// temporary name in the same directory, is fsynced, renamed over the
// destination, and the directory is fsynced. A writer destroyed without
// Commit() removes its temporary file.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace herd {

// The whole of a regular file (anything else, e.g. /dev/zero or a FIFO, is
// refused), of at most `max_bytes`.
StatusOr<std::string> ReadFile(const std::string& path, int64_t max_bytes = INT64_MAX);
Status WriteFileAtomic(const std::string& path, std::string_view data);
// mkdir -p; the error names the path that could not be created.
Status MakeDirs(const std::string& path);
Status FsyncDir(const std::string& dir);
bool PathExists(const std::string& path);
// Creates the directory `dir` (which must not exist) all at once: `fill`
// writes plain files into a temporary sibling, which is then renamed to
// `dir` and the parent fsynced. On any failure the sibling is removed,
// nothing appears at `dir`, and the error names `dir`, not the sibling.
Status WriteNewDirectory(const std::string& dir, const std::function<Status(const std::string& tmp)>& fill);
// Removes `dir` with the plain files directly in it; fails, naming `dir`,
// when something else (a subdirectory) keeps it from going.
Status RemoveFlatDirectory(const std::string& dir);
// The names in `dir` (not . or ..), sorted; fails naming `dir`.
StatusOr<std::vector<std::string>> ListDirectory(const std::string& dir);
// Sorted matches of a glob pattern (no error when nothing matches).
std::vector<std::string> Glob(const std::string& pattern);
// The running program's path (/proc/self/exe); "" when unknown.
std::string ThisExecutable();
// This machine's name ("unknown-host" when it has none).
std::string HostName();

// A private (0700) scratch directory under /tmp, removed with the files in
// it (not subdirectories) when the object goes.
class TempDir {
 public:
  TempDir() = default;
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  // `prefix`: "herd-job" gives /tmp/herd-job-PID-XXXXXX (PID: this
  // process's, so that RemoveStale can tell a dead maker's directory).
  Status Create(const std::string& prefix);
  // Removes this user's /tmp/PREFIX-PID-* directories whose process is gone
  // (killed before it could clean up); returns how many.
  static int RemoveStale(const std::string& prefix);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Directory part of a path ("." when there is none).
std::string DirName(const std::string& path);
// Last component of a path ("step_00000010" of "ckpt/step_00000010").
std::string BaseName(const std::string& path);
std::string JoinPath(const std::string& a, const std::string& b);

class AtomicFile {
 public:
  AtomicFile() = default;
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  Status Open(const std::string& path);
  Status Append(const void* data, size_t size);
  Status Append(std::string_view s) { return Append(s.data(), s.size()); }
  // Overwrites bytes already appended (a header whose counts are known
  // only at the end).
  Status WriteAt(uint64_t offset, const void* data, size_t size);
  // fsync, rename over the destination, fsync the directory.
  Status Commit();
  // Removes the temporary file; the destination is untouched.
  void Abandon();
  uint64_t bytes_written() const { return bytes_; }

 private:
  std::string path_, tmp_path_;
  std::FILE* file_ = nullptr;
  uint64_t bytes_ = 0;
};

// Writes data[0, size) to `path` as AtomicFile does (temporary name, fsync,
// rename, fsync of the directory), straight to the disk where the file
// system allows it (O_DIRECT: no copy into the page cache, which costs a
// core about as much time as the disk takes), else as an ordinary write.
// REQUIRES: `data` is kDirectIoAlignment-aligned and readable up to `size`
// rounded up to a multiple of kDirectIoAlignment.
inline constexpr size_t kDirectIoAlignment = 4096;
Status WriteAlignedFileAtomic(const std::string& path, const void* data, size_t size);

// CRC-32 (zlib polynomial), incremental: pass the previous value as `crc`.
uint32_t Crc32(const void* data, size_t size, uint32_t crc = 0);
// The CRC-32 of A followed by B, from crc_a, crc_b and B's length.
uint32_t Crc32Combine(uint32_t crc_a, uint32_t crc_b, uint64_t size_b);

}  // namespace herd
