#include "common/logging.h"

#include <glog/logging.h>

#include <cstdio>

#include "common/clock.h"

namespace herd {

void InitLogging(const char* argv0) {
  static bool initialised = false;
  if (initialised) return;
  initialised = true;
  FLAGS_logtostderr = true;
  FLAGS_colorlogtostderr = false;
  google::InitGoogleLogging(argv0);
}

int ReportError(const Status& status) {
  std::fprintf(stderr, "herd: error: %s\n", status.message().c_str());
  std::fflush(stderr);
  return ExitCode(status);
}

int ExitCode(const Status& status) {
  switch (status.code()) {
    case Status::Code::kInvalidArgument: return kExitBadInput;
    case Status::Code::kAborted:
    case Status::Code::kCancelled: return kExitStoppedByJob;
    default: return kExitFailure;
  }
}

std::string FormatDuration(double seconds) {
  if (!(seconds >= 0) || seconds > 1e9) return "?";
  long s = static_cast<long>(seconds + 0.5);
  char buf[32];
  if (s >= 3600) {
    std::snprintf(buf, sizeof(buf), "%ldh%02ldm", s / 3600, (s / 60) % 60);
  } else if (s >= 60) {
    std::snprintf(buf, sizeof(buf), "%ldm%02lds", s / 60, s % 60);
  } else {
    std::snprintf(buf, sizeof(buf), "%lds", s);
  }
  return buf;
}

}  // namespace herd
