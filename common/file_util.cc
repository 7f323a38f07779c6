#include "common/file_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <glob.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>

namespace herd {
namespace {

std::string ErrnoText() { return std::strerror(errno); }

}  // namespace

StatusOr<std::string> ReadFile(const std::string& path, int64_t max_bytes) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    if (errno == ENOENT) return Status::NotFound(path + ": no such file");
    return Status::IOError(path + ": cannot open: " + ErrnoText());
  }
  // A device or pipe (/dev/zero, a FIFO) would be read without end.
  struct stat st;
  if (::fstat(::fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
    std::fclose(f);
    return Status::InvalidArgument(path + ": not a regular file");
  }
  if (st.st_size > max_bytes) {
    std::fclose(f);
    return Status::InvalidArgument(path + ": " + std::to_string(st.st_size) + " bytes, more than the " +
                                   std::to_string(max_bytes) + " expected of this file");
  }
  std::string data;
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0 && static_cast<int64_t>(data.size()) <= max_bytes) {
    data.append(buf, n);
  }
  bool failed = std::ferror(f);
  std::fclose(f);
  if (failed) return Status::IOError(path + ": read failed: " + ErrnoText());
  if (static_cast<int64_t>(data.size()) > max_bytes) {
    return Status::InvalidArgument(path + ": grew beyond " + std::to_string(max_bytes) + " bytes while being read");
  }
  return data;
}

Status WriteFileAtomic(const std::string& path, std::string_view data) {
  AtomicFile file;
  HERD_RETURN_IF_ERROR(file.Open(path));
  HERD_RETURN_IF_ERROR(file.Append(data));
  return file.Commit();
}

Status MakeDirs(const std::string& path) {
  if (path.empty()) return Status::OK();
  std::string partial;
  size_t pos = 0;
  while (pos != std::string::npos) {
    pos = path.find('/', pos + 1);
    partial = path.substr(0, pos);
    if (partial.empty()) continue;
    if (::mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST) {
      return Status::IOError(partial + ": cannot create directory: " + ErrnoText());
    }
  }
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return Status::IOError(path + ": not a directory");
  }
  return Status::OK();
}

Status FsyncDir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return Status::IOError(dir + ": cannot open directory: " + ErrnoText());
  int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) return Status::IOError(dir + ": fsync failed: " + ErrnoText());
  return Status::OK();
}

bool PathExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

std::vector<std::string> Glob(const std::string& pattern) {
  std::vector<std::string> out;
  glob_t g;
  if (::glob(pattern.c_str(), 0, nullptr, &g) == 0) {
    for (size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  }
  ::globfree(&g);
  return out;  // glob() sorts by default
}

StatusOr<std::vector<std::string>> ListDirectory(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return Status::IOError(dir + ": cannot list: " + ErrnoText());
  std::vector<std::string> names;
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  ::closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

Status RemoveFlatDirectory(const std::string& dir) {
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      if (e->d_type != DT_DIR) ::unlink(JoinPath(dir, e->d_name).c_str());
    }
    ::closedir(d);
  }
  if (::rmdir(dir.c_str()) != 0) return Status::IOError(dir + ": cannot remove: " + ErrnoText());
  return Status::OK();
}

Status WriteNewDirectory(const std::string& dir, const std::function<Status(const std::string& tmp)>& fill) {
  const std::string parent = DirName(dir);
  HERD_RETURN_IF_ERROR(MakeDirs(parent));
  std::string tmp = dir + ".tmp.XXXXXX";
  if (::mkdtemp(tmp.data()) == nullptr) {
    return Status::IOError(dir + ": cannot create a directory in " + parent + ": " + ErrnoText());
  }
  ::chmod(tmp.c_str(), 0755);  // mkdtemp makes it 0700
  Status st = fill(tmp);
  if (st.ok() && ::rename(tmp.c_str(), dir.c_str()) != 0) {
    st = Status::IOError(dir + ": cannot rename the finished directory into place: " + ErrnoText());
  }
  if (!st.ok()) {
    (void)RemoveFlatDirectory(tmp);
    std::string msg = st.message();
    for (size_t pos; (pos = msg.find(tmp)) != std::string::npos;) msg.replace(pos, tmp.size(), dir);
    return Status::IOError(msg);
  }
  return FsyncDir(parent);
}

std::string DirName(const std::string& path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string ThisExecutable() {
  char path[4096];
  const ssize_t n = ::readlink("/proc/self/exe", path, sizeof path - 1);
  if (n <= 0) return "";
  path[n] = '\0';
  return path;
}

std::string HostName() {
  char name[256] = {0};
  if (::gethostname(name, sizeof name - 1) != 0) return "unknown-host";
  return name;
}

Status TempDir::Create(const std::string& prefix) {
  std::string tmpl = "/tmp/" + prefix + "-" + std::to_string(::getpid()) + "-XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) return Status::IOError("cannot create a temporary directory " + tmpl);
  path_ = tmpl;
  return Status::OK();
}

int TempDir::RemoveStale(const std::string& prefix) {
  int removed = 0;
  const std::string start = prefix + "-";
  DIR* d = ::opendir("/tmp");
  if (d == nullptr) return 0;
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (!name.starts_with(start)) continue;
    const std::string rest = name.substr(start.size());
    const size_t dash = rest.find('-');
    if (dash == 0 || dash == std::string::npos ||
        !std::all_of(rest.begin(), rest.begin() + dash, [](char c) { return c >= '0' && c <= '9'; })) {
      continue;
    }
    const pid_t pid = static_cast<pid_t>(std::stol(rest.substr(0, dash)));
    const std::string path = "/tmp/" + name;
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::geteuid()) continue;
    if (::kill(pid, 0) == 0 || errno != ESRCH) continue;  // its maker lives (or is not ours to judge)
    if (RemoveFlatDirectory(path).ok()) ++removed;
  }
  ::closedir(d);
  return removed;
}

TempDir::~TempDir() {
  if (!path_.empty()) (void)RemoveFlatDirectory(path_);
}

std::string BaseName(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  const size_t slash = p.find_last_of('/');
  return slash == std::string::npos ? p : p.substr(slash + 1);
}

std::string JoinPath(const std::string& a, const std::string& b) {
  if (a.empty() || b.starts_with('/')) return b;
  return a.ends_with('/') ? a + b : a + "/" + b;
}

namespace {

// Where a file is written before it replaces `path`.
std::string TempPathFor(const std::string& path) { return path + ".tmp." + std::to_string(::getpid()); }

// Renames the written and fsynced `tmp` over `path` and makes the rename
// durable; `tmp` is removed when the rename fails.
Status Publish(const std::string& tmp, const std::string& path) {
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string err = ErrnoText();
    ::unlink(tmp.c_str());
    return Status::IOError(path + ": rename failed: " + err);
  }
  return FsyncDir(DirName(path));
}

}  // namespace

AtomicFile::~AtomicFile() { Abandon(); }

Status AtomicFile::Open(const std::string& path) {
  Abandon();
  path_ = path;
  tmp_path_ = TempPathFor(path);
  file_ = std::fopen(tmp_path_.c_str(), "wb");
  if (file_ == nullptr) {
    return Status::IOError(path + ": cannot write (" + DirName(path) + "): " + ErrnoText());
  }
  bytes_ = 0;
  return Status::OK();
}

Status AtomicFile::Append(const void* data, size_t size) {
  if (file_ == nullptr) return Status::Internal(path_ + ": write to a file that is not open");
  if (size > 0 && std::fwrite(data, 1, size, file_) != size) {
    return Status::IOError(path_ + ": write failed: " + ErrnoText());
  }
  bytes_ += size;
  return Status::OK();
}

Status AtomicFile::WriteAt(uint64_t offset, const void* data, size_t size) {
  if (file_ == nullptr) return Status::Internal(path_ + ": write to a file that is not open");
  if (offset + size > bytes_) return Status::Internal(path_ + ": WriteAt beyond what was appended");
  if (std::fflush(file_) != 0 ||
      ::pwrite(::fileno(file_), data, size, static_cast<off_t>(offset)) != static_cast<ssize_t>(size)) {
    return Status::IOError(path_ + ": write failed: " + ErrnoText());
  }
  return Status::OK();
}

Status AtomicFile::Commit() {
  if (file_ == nullptr) return Status::Internal(path_ + ": commit of a file that is not open");
  bool ok = std::fflush(file_) == 0 && ::fsync(::fileno(file_)) == 0;
  std::string err = ErrnoText();
  ok = (std::fclose(file_) == 0) && ok;
  file_ = nullptr;
  if (!ok) {
    ::unlink(tmp_path_.c_str());
    return Status::IOError(path_ + ": write failed: " + err);
  }
  const std::string tmp = std::move(tmp_path_);
  tmp_path_.clear();
  return Publish(tmp, path_);
}

void AtomicFile::Abandon() {
  if (file_ != nullptr) {
    std::fclose(file_);
    file_ = nullptr;
  }
  if (!tmp_path_.empty()) {
    ::unlink(tmp_path_.c_str());
    tmp_path_.clear();
  }
}

namespace {

// Writes all of data[0, size) to fd; false with errno set on failure.
bool WriteAll(int fd, const char* data, size_t size) {
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

Status WriteAlignedFileAtomic(const std::string& path, const void* data, size_t size) {
  const std::string tmp = TempPathFor(path);
  const size_t padded = (size + kDirectIoAlignment - 1) / kDirectIoAlignment * kDirectIoAlignment;
  const char* bytes = static_cast<const char*>(data);
  auto fail = [&](int fd, const std::string& what) {
    const std::string err = ErrnoText();
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    return Status::IOError(path + ": " + what + ": " + err);
  };
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_DIRECT, 0666);
  bool direct = fd >= 0;
  // Whole aligned blocks go directly; the file is then cut to its size.
  if (direct && !(WriteAll(fd, bytes, padded) && ::ftruncate(fd, static_cast<off_t>(size)) == 0)) {
    if (errno != EINVAL) return fail(fd, "write failed");
    ::close(fd);  // O_DIRECT refused at the first write: an ordinary one below
    direct = false;
  }
  if (!direct) {
    fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd < 0) return fail(fd, "cannot write (" + DirName(path) + ")");
    if (!WriteAll(fd, bytes, size)) return fail(fd, "write failed");
  }
  if (::fsync(fd) != 0) return fail(fd, "write failed");
  if (::close(fd) != 0) return fail(-1, "write failed");
  return Publish(tmp, path);
}

uint32_t Crc32(const void* data, size_t size, uint32_t crc) {
  const auto* p = static_cast<const Bytef*>(data);
  while (size > 0) {  // zlib takes uInt lengths
    uInt chunk = size > (1u << 30) ? (1u << 30) : static_cast<uInt>(size);
    crc = static_cast<uint32_t>(::crc32(crc, p, chunk));
    p += chunk;
    size -= chunk;
  }
  return crc;
}

uint32_t Crc32Combine(uint32_t crc_a, uint32_t crc_b, uint64_t size_b) {
  return static_cast<uint32_t>(::crc32_combine64(crc_a, crc_b, static_cast<z_off64_t>(size_b)));
}

}  // namespace herd
