// Process-wide logging set-up (glog to stderr) and the one-line fatal error
// that every command ends with on bad input.
#pragma once

#include <string>
#include <string_view>

#include "common/status.h"

namespace herd {

// glog to stderr, no log files; `role` prefixes nothing yet but names the
// process in glog's program name.
void InitLogging(const char* argv0);

// From now on this process's log lines go to `path` (appended to; created
// with the first line) instead of stderr, where only a fatal one still
// goes: a launcher keeps its stderr for the one line that says why a job
// failed.
void LogToFile(const std::string& path);
// The file LogToFile's lines went to, once one has; else empty.
std::string LogFileWritten();
// Appends `line` as it is to LogToFile's file (to stderr without one): what
// another process logged, already formatted.
void LogLine(std::string_view line);

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
