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

// The data plane of a process of the job `options` describes: the job's
// key (from its token) and the network devices UCX may use
// (transport/network_devices.h). The transport is created with it before
// joining.
StatusOr<UcxOptions> DataPlaneOptions(const JoinOptions& options);

// `prepare`, when given, runs after the membership is known (rank
// assigned, all-gathers available) and before any peer can send to us: the
// place to set up services that depend on this process's rank.
using PrepareFn = std::function<Status(CoordinatorClient& client)>;
StatusOr<std::unique_ptr<CoordinatorClient>> JoinJob(const JoinOptions& options, UcxTransport* transport,
                                                     const std::vector<wire::Role>& connect_to,
                                                     const PrepareFn& prepare = nullptr);

// One line on stdout ("ucx endpoints: server 0, server 1: sysv/memory
// (am am_bw); ..."): the UCX transports of this process's endpoints to the
// members of `roles`, peers of the same lanes together; part of each
// process's run header.
void PrintEndpoints(const CoordinatorClient& client, UcxTransport& transport, const std::vector<wire::Role>& roles);

// Every process names the checkpoint it resumes from (its step directory's
// name, or "none"); OK when all agree, else an error naming the first
// process whose choice differs from ours.
Status AgreeOnResume(CoordinatorClient& client, const std::string& checkpoint);

// The PeerId of a member: its index in the membership.
PeerId MemberPeerId(const CoordinatorClient& client, wire::Role role, int rank);

// "server rank 1 (node7, pid 4242)".
std::string DescribeMember(const wire::Member& member);

}  // namespace herd::transport
