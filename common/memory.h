// This process's and this machine's memory: the "peak memory" lines that
// let users compare a run with `herd plan`, and the check that a job fits
// before anything is allocated or started.
#pragma once

#include <sys/resource.h>

#include <cstdint>
#include <string>

#include "common/status.h"

namespace herd {

// Peak resident set size so far (Linux reports ru_maxrss in KiB).
inline int64_t PeakRssBytes() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<int64_t>(u.ru_maxrss) * 1024;
}

// What this process may still allocate: the kernel's MemAvailable, or less
// when the process's memory cgroup (v1 or v2) has a limit nearer than that.
struct AvailableMemory {
  int64_t bytes = 0;
  std::string source;  // "MemAvailable" or "cgroup memory limit"
};
AvailableMemory AvailableMemoryBytes();

// OK when `needed` bytes fit in what is available; otherwise one line:
// "<what> needs 108.9 GiB of memory; this machine has 22.1 GiB available
// (MemAvailable)". Unknown availability (no /proc) passes.
Status CheckFitsInMemory(int64_t needed, const std::string& what);

}  // namespace herd
