#include "common/memory.h"

#include <algorithm>
#include <fstream>
#include <limits>

#include "common/file_util.h"
#include "common/strings.h"

namespace herd {
namespace {

// A number from a one-value cgroup file; false for "max" or no file.
bool ReadCgroupValue(const std::string& path, int64_t* value) {
  std::ifstream f(path);
  std::string text;
  if (!(f >> text) || text == "max") return false;
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (end == text.c_str() || *end != '\0' || v < 0) return false;
  *value = v;
  return true;
}

// Room left under the memory cgroup's limit, when it has one. The cgroup
// file system may be mounted at the process's own cgroup (a container) or
// at the hierarchy's root, so both places are tried.
bool CgroupRoom(int64_t* room) {
  std::ifstream self("/proc/self/cgroup");
  std::string line, v1_path, v2_path;
  bool v2 = false;
  while (std::getline(self, line)) {
    const std::vector<std::string> parts = Split(line, ':');
    if (parts.size() < 3) continue;
    if (parts[0] == "0" && parts[1].empty()) {
      v2 = true;
      v2_path = parts[2];
    }
    for (const std::string& c : Split(parts[1], ',')) {
      if (c == "memory") v1_path = parts[2];
    }
  }
  const int64_t unlimited = int64_t{1} << 60;  // v1 reports "no limit" as ~2^63
  auto room_at = [&](const std::string& dir, const char* limit_file, const char* usage_file) {
    int64_t limit = 0, usage = 0;
    if (!ReadCgroupValue(JoinPath(dir, limit_file), &limit) || limit >= unlimited) return false;
    if (!ReadCgroupValue(JoinPath(dir, usage_file), &usage)) usage = 0;
    *room = std::max<int64_t>(0, limit - usage);
    return true;
  };
  if (!v1_path.empty()) {
    for (const std::string& dir : {"/sys/fs/cgroup/memory" + v1_path, std::string("/sys/fs/cgroup/memory")}) {
      if (room_at(dir, "memory.limit_in_bytes", "memory.usage_in_bytes")) return true;
    }
  }
  if (v2) {
    for (const std::string& dir : {"/sys/fs/cgroup" + v2_path, std::string("/sys/fs/cgroup")}) {
      if (room_at(dir, "memory.max", "memory.current")) return true;
    }
  }
  return false;
}

}  // namespace

AvailableMemory AvailableMemoryBytes() {
  AvailableMemory out{std::numeric_limits<int64_t>::max(), ""};
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib) {
    std::getline(meminfo, unit);
    if (key == "MemAvailable:") {
      out = {kib * 1024, "MemAvailable"};
      break;
    }
  }
  int64_t room = 0;
  if (CgroupRoom(&room) && room < out.bytes) out = {room, "cgroup memory limit"};
  return out;
}

Status CheckFitsInMemory(int64_t needed, const std::string& what) {
  const AvailableMemory available = AvailableMemoryBytes();
  if (available.source.empty() || needed <= available.bytes) return Status::OK();
  return Status::InvalidArgument(what + " needs " + FormatBytes(needed) + " of memory; this machine has " +
                                 FormatBytes(available.bytes) + " available (" + available.source + ")");
}

}  // namespace herd
