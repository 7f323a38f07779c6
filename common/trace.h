// A process's step timeline (log.trace): spans of what each thread does
// (forward and backward per layer, a server's sums and AdamW per bucket,
// waits, checkpoint writes) and of transfers in flight (pushes, pulls, ring
// chunks), written as Chrome/Perfetto trace JSON to one file per process.
// `herd trace merge` aligns the files' clocks into one trace that
// ui.perfetto.dev or chrome://tracing opens.
//
// Promises:
// - Off (the default), a span costs one relaxed atomic load: nothing is
//   timed, allocated or written.
// - On, a span costs two clock reads and an append to the calling thread's
//   own buffer (its mutex is taken by the writer only to swap buffers); a
//   writer thread formats and writes the buffers every quarter second, so
//   memory stays bounded and a killed process leaves all but its last
//   moment on disk.
// - The file is the JSON Array Format, one event per line: "[" then
//   "EVENT,\n" lines; a stopped trace ends with an end marker and "]", one
//   cut short lacks them (viewers and `herd trace merge` accept both).
// - Timestamps are the process's monotonic clock; metadata records
//   ("herd_clock") give its offset from the coordinator's clock, measured
//   when the trace starts and stops, which is what merging aligns with.
//
// Names, categories and argument keys are string literals: only the
// pointers are kept.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "common/status.h"

namespace herd::trace {

// The trace clock (CLOCK_MONOTONIC, as std::chrono::steady_clock), in ns.
int64_t Now();

// An integer argument shown with a span ({"layer": 3}); no key: none.
struct Arg {
  const char* key = nullptr;
  int64_t value = 0;
};

namespace internal {
extern std::atomic<bool> g_on;
void Add(char phase, const char* name, const char* category, int64_t start_ns, int64_t end_ns, const Arg& a,
         const Arg& b, const Arg& c);
}  // namespace internal

// Whether a trace is being recorded.
inline bool On() { return internal::g_on.load(std::memory_order_relaxed); }

// A span on the calling thread, from construction to destruction. Spans of
// one thread nest as the scopes that hold them do.
class Span {
 public:
  Span(const char* name, const char* category, Arg a = {}, Arg b = {}, Arg c = {})
      : name_(name), category_(category), a_(a), b_(b), c_(c), start_(On() ? Now() : -1) {}
  ~Span() {
    if (start_ >= 0) internal::Add('X', name_, category_, start_, Now(), a_, b_, c_);
  }
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

 private:
  const char* const name_;
  const char* const category_;
  const Arg a_, b_, c_;
  const int64_t start_;
};

// A span on the calling thread that began at `start_ns` (a Now() taken
// when On()) and ends now, for work whose start and end are not one scope.
// Nothing when start_ns is negative (trace off when it began).
inline void Complete(const char* name, const char* category, int64_t start_ns, Arg a = {}, Arg b = {}, Arg c = {}) {
  if (start_ns >= 0 && On()) internal::Add('X', name, category, start_ns, Now(), a, b, c);
}
// Something in flight from `start_ns` until now, begun and ended on any
// threads (a transfer: issued by one, completed by another); such spans
// may overlap and are shown on tracks of their own. Nothing when start_ns
// is negative.
inline void Async(const char* name, const char* category, int64_t start_ns, Arg a = {}, Arg b = {}, Arg c = {}) {
  if (start_ns >= 0 && On()) internal::Add('b', name, category, start_ns, Now(), a, b, c);
}
// Now() when tracing, else -1: the start of a Complete or Async span.
inline int64_t StartTime() { return On() ? Now() : -1; }

// Names the calling thread in the trace ("step thread", "ucx progress").
void NameThread(const char* name);

// Where a process's trace goes and what it is called there.
struct Options {
  std::string path;     // the file, replaced if it is a herd trace; any other file is refused
  std::string process;  // its name in the viewer: "worker 1"
  std::string role;     // "server" or "worker"
  int rank = 0;
};
// Starts recording into options.path. One trace per process at a time.
Status Start(const Options& options);
// The coordinator's clock minus this process's at local time `local_ns`,
// measured with a round trip of `rtt_ns` (the error is at most half of it).
void RecordClockOffset(int64_t local_ns, int64_t offset_ns, int64_t rtt_ns);
// Writes what is buffered, the end marker, and closes the file; the first
// write error, if any. Nothing when no trace is recording.
Status Stop();

// DIR/ROLE_RRRRR.trace.json, as log.summary_dir names its files.
std::string TraceFileName(const std::string& dir, const std::string& role, int rank);

}  // namespace herd::trace
