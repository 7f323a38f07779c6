// The coordinator: rendezvous and liveness for one job, over TCP.
//
// Processes connect, present the job token, their role, an optional rank,
// their UCX worker address and the hash of their config. The coordinator
// refuses a wrong token, a config hash different from the first arrival's,
// a rank out of range or taken, and joiners beyond the job's size, each with
// one line to both sides. When every expected server and worker has joined
// it sends each one the membership (Welcome). Afterwards it runs named
// barriers and small all-gathers, exchanges heartbeats, and, when a member
// is lost (connection closed without Leave, protocol violation, or silence
// beyond heartbeat_timeout), tells every other member which role and rank
// it was, and then ends the job or (max_restarts) waits for it to form
// again. In an elastic job a lost worker is dropped from the membership
// instead (MembershipChanged), and a worker that says it joins (--join)
// takes the place of a lost one: admitted one at a time, welcomed once
// every member has acknowledged the change. A connection that sends an
// oversized or garbage message is closed
// with a logged reason; the coordinator keeps serving everyone else.
//
// Single-threaded: one Boost.Asio io_context runs everything.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include <optional>

#include "common/config.h"
#include "common/status.h"
#include "transport/rendezvous.h"

namespace herd::transport {

struct CoordinatorOptions {
  std::string listen = "127.0.0.1:0";  // HOST:PORT; port 0 picks a free one
  std::string token;                   // the job token every process must present
  // A fixed job shape (everyone must have joined join_timeout_s after
  // Run()), or none: the shape and timing of the first process to join,
  // whose config hash then binds everyone else, with JobShape's defaults
  // until then.
  std::optional<JobShape> job;
  // How long a lost job waits for the remaining members to disconnect.
  double drain_timeout_s = 10.0;
  // A member lost after the job has formed ends the job, or, this many
  // times, restarts it: every member is told who was lost and let go, and
  // the job forms anew from whoever joins next (processes started with
  // --max-restarts rejoin by themselves), with the same config hash.
  int max_restarts = 0;
  // Called on the coordinator's thread when every process has joined, and
  // with the pid its host reported when a member is declared lost for
  // silence (stopped or hung: a launcher kills it then rather than wait).
  std::function<void()> on_formed;
  std::function<void(int64_t pid)> on_silent;
  // Called on the coordinator's thread, with the pid its host reported,
  // when an elastic job goes on without a lost worker, or a job of regions
  // without a lost region's member (once for each): its place is free for
  // a process that joins.
  std::function<void(int64_t pid)> on_member_dropped;

  // Address and fixed shape from the job config; the caller adds the token.
  static CoordinatorOptions FromConfig(const JobConfig& config);
};

class Coordinator {
 public:
  // Binds and listens; the job starts when Run() is called.
  static StatusOr<std::unique_ptr<Coordinator>> Start(const CoordinatorOptions& options);
  ~Coordinator();
  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

  // The bound port (useful with port 0).
  uint16_t port() const;

  // Serves until the job ends: OK when every member has left; an error that
  // names the lost member (or the join timeout, or Stop's reason) otherwise.
  Status Run();

  // After Run() has returned: the pid its host reported for the first
  // member lost (the job's first failure), or 0.
  int64_t first_lost_pid() const;

  // From any thread (e.g. a signal watcher): tells every member the job is
  // shut down and makes Run() return Aborted(reason).
  void Stop(const std::string& reason);

 private:
  class Impl;
  explicit Coordinator(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace herd::transport
