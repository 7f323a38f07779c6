// This process's memory, for the "peak memory" lines that let users compare
// a run with `herd plan`.
#pragma once

#include <sys/resource.h>

#include <cstdint>

namespace herd {

// Peak resident set size so far (Linux reports ru_maxrss in KiB).
inline int64_t PeakRssBytes() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<int64_t>(u.ru_maxrss) * 1024;
}

}  // namespace herd
