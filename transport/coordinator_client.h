// A process's link to the coordinator: join the job, learn the membership,
// barriers, all-gathers, heartbeats, and being told when the job fails.
//
// Join() blocks until every expected process has joined (or the coordinator
// refuses this one, or join_timeout passes). Afterwards a background thread
// sends heartbeats and watches for PeerLost / Shutdown / a silent or closed
// coordinator; from then on every blocking call returns the failure instead
// of waiting forever, and the failure handler runs once.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/status.h"
#include "proto/wire.pb.h"
#include "transport/rendezvous.h"

namespace herd::transport {

struct JoinOptions {
  std::string coordinator;  // HOST:PORT
  std::string token;
  wire::Role role = wire::WORKER;
  int rank = -1;        // -1: assigned by the coordinator
  int world_size = -1;  // from the launcher, checked against the job's count
  std::string host;     // defaults to this machine's name
  std::string ucx_address;
  uint64_t config_hash = 0;
  JobShape job;
  std::string data_interface;  // cluster.data_interface (transport/network_devices.h)
  // A worker joining an elastic job under way in place of a lost one
  // (herd-worker --join); welcomed once every member knows of it.
  bool join = false;
  // With join: takes part in the job's formation instead, should the job
  // be forming (herd-worker --join --resume-if-any); joined_under_way()
  // then says which it was.
  bool resume_if_forming = false;
  // Runs once this process's rank is known (assigned by the coordinator
  // when not given), before it connects to anyone: where a process
  // started without a rank claims what its rank writes (common/run_lock.h).
  std::function<Status(int rank)> on_ranked;

  // Shape, timing and hash from the job config; the caller fills in role,
  // rank, coordinator, token and UCX address.
  static JoinOptions FromConfig(const JobConfig& config);
  // Everything a process started by hand or by a launcher needs: FromConfig
  // plus its rank and the coordinator (flags, Slurm, torchrun's variables,
  // HERD_COORDINATOR, the config; see ResolvePlacement) and the job token
  // (--token-file or the environment).
  static StatusOr<JoinOptions> ForProcess(const JobConfig& config, wire::Role role, const std::string& flag_rank,
                                          const std::string& flag_coordinator, const std::string& token_file);
};

// An elastic job went on without a lost worker, or a worker joined in
// place of a lost one; a job of regions went on without a lost region, or
// a region rejoined (wire::MembershipChanged).
struct MembershipChange {
  int epoch = 0;  // 1 for the job's first change, then 2, 3, ...
  bool joined = false;
  wire::Member member;  // the worker lost (joined: the one that joined); a job of regions: a server too
  std::string reason;
  std::vector<int> live_workers;  // ascending ranks
  // A job of regions: the lost member's region's other members, let go
  // with it; or the joined member's, joining with it.
  std::vector<wire::Member> let_go;
  std::vector<wire::Member> joined_with;
};

// An elastic job's membership when this process was welcomed into it.
struct WelcomedMembership {
  int epoch = 0;                  // the changes before it (0 for a process there since the job formed)
  std::vector<int> live_workers;  // ascending ranks
  std::vector<int> joined_at;     // per live worker, the epoch it joined at (0: since the job formed)
};

// The members of a gather's scope that take part (indices into members():
// servers by rank, then workers by rank), named as of membership epoch
// `epoch`, the caller's view when it chose them (read before choosing):
// a member index whose process joined the job after it names the process
// that one replaced, which was lost. Every contributor names the same.
struct Voters {
  std::vector<int> members;  // empty: every member of the scope that takes part
  int epoch = 0;
};

// This process's clock against the coordinator's (trace::Now on both).
struct ClockOffset {
  int64_t local_ns = 0;   // when it was measured, on this process's clock
  int64_t offset_ns = 0;  // the coordinator's clock minus this process's
  int64_t rtt_ns = 0;     // the round trip it was measured with: the error is at most half of it
};

class CoordinatorClient {
 public:
  static StatusOr<std::unique_ptr<CoordinatorClient>> Join(const JoinOptions& options);
  // Without Leave() first, closing the connection tells the coordinator this
  // process failed.
  ~CoordinatorClient();
  CoordinatorClient(const CoordinatorClient&) = delete;
  CoordinatorClient& operator=(const CoordinatorClient&) = delete;

  wire::Role role() const;
  int rank() const;
  // Servers by rank, then workers by rank.
  const std::vector<wire::Member>& members() const;
  int num_servers() const;
  int num_workers() const;
  const wire::Member& member(wire::Role role, int rank) const;

  // Waits until every process in `scope` has entered barrier `name`.
  Status Barrier(const std::string& name, wire::Scope scope = wire::EVERYONE);
  // Everyone in `scope` contributes `data`; returns all contributions in
  // scope order (servers by rank, then workers by rank). `voters`, when
  // named, are the members of the scope that take part (this one among
  // them): the others' shares are empty, as a lost member's.
  StatusOr<std::vector<std::string>> AllGather(const std::string& name, const std::string& data,
                                               wire::Scope scope = wire::EVERYONE, const Voters& voters = {});

  // `handler` runs once, on the client's thread, when the job fails (a peer
  // lost, the coordinator gone or shutting down); handlers run in the order
  // added. Runs at once if the job already has failed.
  void OnFailure(std::function<void(const Status&)> handler);
  // `handler` runs on the client's thread for each change of an elastic
  // job's membership, in epoch order; at once for the changes before it
  // was added. Barriers and all-gathers complete with the live members
  // from then on (a lost member's all-gather share is empty). Once every
  // handler has run for a change, the coordinator is told (MembershipAck):
  // a joining worker is welcomed only when every member has acted on it.
  void OnMembershipChange(std::function<void(const MembershipChange&)> handler);
  WelcomedMembership welcomed_membership() const;
  // The membership changes seen so far (the newest epoch).
  int membership_epoch() const;
  // Whether this process was welcomed into a job under way (it joined in
  // place of a lost worker, or with its region in place of a lost
  // region's), rather than at the job's formation.
  bool joined_under_way() const;
  // A job of regions: the region this process rejoins the job with, or -1.
  int joining_region() const;
  // OK while the job is healthy; the failure otherwise.
  Status health() const;
  // What a process that fails with `local` should say. A data-plane
  // failure (Unavailable: a send rejected, a peer unreachable) is most
  // often the echo of another process's end, whose endpoints closed as it
  // stopped; the coordinator's word on the job names the cause, so it is
  // awaited for up to `wait_s` and returned when it comes. Any other
  // error, or no word in time: `local`.
  Status Explain(const Status& local, double wait_s = 2.0) const;

  // Reads the coordinator's clock `probes` times, one round trip after
  // another (as NTP does), and keeps the reading with the shortest round
  // trip.
  StatusOr<ClockOffset> MeasureClockOffset(int probes = 16);

  // Orderly goodbye: the coordinator will not treat our disconnection as a
  // failure. Waits (briefly) until the coordinator has seen it.
  Status Leave();

 private:
  class Impl;
  explicit CoordinatorClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace herd::transport
