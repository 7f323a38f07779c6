// Process-wide logging set-up (glog to stderr) and the one-line fatal error
// that every command ends with on bad input.
#pragma once

#include <string>

#include "common/status.h"

namespace herd {

// glog to stderr, no log files; `role` prefixes nothing yet but names the
// process in glog's program name.
void InitLogging(const char* argv0);

// Exit codes of every herd program.
inline constexpr int kExitFailure = 1;
inline constexpr int kExitBadInput = 2;  // Status::InvalidArgument
// Status::Aborted and Cancelled: the process stopped because another
// process of its job failed or the job was stopped; a launcher looks past
// these for the cause.
inline constexpr int kExitStoppedByJob = 3;

// The exit code for a process that ends with `status` (not OK).
int ExitCode(const Status& status);
// Prints "herd: error: <message>" to stderr and returns ExitCode(status).
int ReportError(const Status& status);

}  // namespace herd
