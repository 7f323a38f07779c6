// Joining a job: the coordinator handshake plus the UCX endpoints that go
// with it, in the one order that is safe.
//
// The caller creates the UcxTransport and its services (so that their
// handlers exist before any peer can send), then calls JoinJob: it joins
// with the transport's address, names this process's PeerId (its member
// index: servers by rank, then workers by rank), connects to every member
// of the roles in `connect_to`, and waits in a barrier until all processes
// have done the same, so no message ever reaches a process that does not
// yet know its sender. When the job fails, the transport is aborted (its
// endpoints then close forcibly); it must outlive the returned client.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "transport/coordinator_client.h"
#include "transport/ucx_transport.h"

namespace herd::transport {

// `prepare`, when given, runs after the membership is known (rank
// assigned, all-gathers available) and before any peer can send to us: the
// place to set up services that depend on this process's rank.
using PrepareFn = std::function<Status(CoordinatorClient& client)>;
StatusOr<std::unique_ptr<CoordinatorClient>> JoinJob(const JoinOptions& options, UcxTransport* transport,
                                                     const std::vector<wire::Role>& connect_to,
                                                     const PrepareFn& prepare = nullptr);

// Every process contributes `value` under `name`; OK when all agree, else
// an error naming the first process whose value differs from ours (`what`
// describes the value in that line).
Status AgreeOn(CoordinatorClient& client, const std::string& name, const std::string& value, const std::string& what);

// Two-phase commit's vote: everyone reports how its part went; OK when all
// succeeded, else the first failure, naming its process.
Status AllSucceeded(CoordinatorClient& client, const std::string& name, const Status& mine);

// A checkpoint written by several processes, committed in two phases: each
// creates the step directory and writes its parts (`write_parts`; the
// committer also the job's config), everyone votes through the
// coordinator, and only when every part succeeded does the committer write
// the manifest listing `parts`; a second vote tells everyone whether it
// did. A step directory without a manifest is never loaded, so a failure
// anywhere leaves no checkpoint that could be. Errors name the step
// directory and the first process that failed (this one's own first).
Status CommitCheckpoint(CoordinatorClient& client, const std::string& step_dir, int64_t step,
                        const config::JobConfig& config, bool committer, const std::vector<std::string>& parts,
                        const std::function<Status()>& write_parts);

// The PeerId of a member: its index in the membership.
PeerId MemberPeerId(const CoordinatorClient& client, wire::Role role, int rank);

// "server rank 1 (node7, pid 4242)".
std::string DescribeMember(const wire::Member& member);

}  // namespace herd::transport
