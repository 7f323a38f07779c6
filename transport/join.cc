#include "transport/join.h"

#include <glog/logging.h>

#include <algorithm>
#include <cstdio>

#include "transport/exchanges.h"
#include "transport/network_devices.h"
#include "transport/wire.h"

namespace herd::transport {

PeerId MemberPeerId(const CoordinatorClient& client, wire::Role role, int rank) {
  return role == wire::SERVER ? rank : client.num_servers() + rank;
}

std::string DescribeMember(const wire::Member& member) {
  return DescribeRole(member.role(), member.rank()) + " (" + member.host() + ", pid " + std::to_string(member.pid()) +
         ")";
}

void PrintEndpoints(const CoordinatorClient& client, UcxTransport& transport, const std::vector<wire::Role>& roles) {
  // Peers grouped by the lanes UCX gave their endpoints, in member order.
  std::vector<std::pair<std::string, std::vector<std::string>>> groups;
  const PeerId self = MemberPeerId(client, client.role(), client.rank());
  for (size_t i = 0; i < client.members().size(); ++i) {
    const wire::Member& m = client.members()[i];
    if (static_cast<PeerId>(i) == self || m.ucx_address().empty()) continue;
    if (std::find(roles.begin(), roles.end(), m.role()) == roles.end()) continue;
    const EndpointLanes lanes = transport.Lanes(static_cast<PeerId>(i));
    std::string text;
    for (const std::string& t : lanes.transports) text += (text.empty() ? "" : ", ") + t;
    if (lanes.single_copy) {
      text += "; payloads from " + std::to_string(kSingleCopyMinBytes >> 10) +
              " KiB read in one copy (process_vm_readv)";
    } else if (lanes.shared_memory) {
      text += "; payloads from " + std::to_string(kSharedMemoryRendezvousBytes >> 10) + " KiB by UCX rendezvous";
    }
    auto g = std::find_if(groups.begin(), groups.end(), [&](const auto& x) { return x.first == text; });
    if (g == groups.end()) g = groups.insert(groups.end(), {text, {}});
    g->second.push_back(DescribeRole(m.role(), m.rank()));
  }
  std::string line;
  for (const auto& [lanes, peers] : groups) {
    std::string who = peers.size() <= 3 ? "" : std::to_string(peers.size()) + " peers, ";
    for (size_t i = 0; i < peers.size() && i < 3; ++i) who += (i == 0 ? "" : ", ") + peers[i];
    if (peers.size() > 3) who += ", ...";
    line += (line.empty() ? "" : " | ") + who + ": " + lanes;
  }
  if (!line.empty()) std::printf("ucx endpoints: %s\n", line.c_str());
  std::fflush(stdout);
}

StatusOr<UcxOptions> DataPlaneOptions(const JoinOptions& options) {
  UcxOptions ucx;
  ucx.key = DataPlaneKey::FromToken(options.token);
  HERD_ASSIGN_OR_RETURN(ucx.net_devices, DataPlaneDevices(options.coordinator, options.data_interface));
  return ucx;
}

StatusOr<std::unique_ptr<CoordinatorClient>> JoinJob(const JoinOptions& options, UcxTransport* transport,
                                                     const std::vector<wire::Role>& connect_to,
                                                     const PrepareFn& prepare) {
  JoinOptions with_address = options;
  with_address.ucx_address = transport->address();
  HERD_ASSIGN_OR_RETURN(auto client, CoordinatorClient::Join(with_address));
  if (options.on_ranked) HERD_RETURN_IF_ERROR(options.on_ranked(client->rank()));
  // A failed job closes its endpoints forcibly: flushing towards a dead
  // peer would never end.
  client->OnFailure([transport](const Status& failure) { transport->Abort(failure); });
  // An elastic job goes on without a lost worker: its endpoint is closed
  // at once, so that nothing is left pending towards it until shutdown. A
  // worker that joins in its place is connected to before the coordinator
  // hears that this process has acted on the change.
  CoordinatorClient* c = client.get();
  client->OnMembershipChange([transport, c, connect_to](const MembershipChange& change) {
    const PeerId peer = MemberPeerId(*c, change.member.role(), change.member.rank());
    if (!change.joined) {
      const Status why = Status::Unavailable(DescribeMember(change.member) + " was lost: " + change.reason);
      transport->Disconnect(peer, why);
      // A job of regions goes on without the lost member's whole region.
      for (const wire::Member& m : change.let_go) transport->Disconnect(MemberPeerId(*c, m.role(), m.rank()), why);
      return;
    }
    // A job of regions: a region rejoins whole; its own processes have
    // connected to each other already.
    std::vector<wire::Member> joined = change.joined_with;
    joined.push_back(change.member);
    const PeerId self = MemberPeerId(*c, c->role(), c->rank());
    for (const wire::Member& m : joined) {
      if (MemberPeerId(*c, m.role(), m.rank()) == self) return;
    }
    for (const wire::Member& m : joined) {
      if (std::find(connect_to.begin(), connect_to.end(), m.role()) == connect_to.end()) continue;
      const Status connected = transport->Connect(MemberPeerId(*c, m.role(), m.rank()), m.ucx_address(),
                                                  DescribeMember(m));
      if (!connected.ok()) LOG(WARNING) << "cannot connect to " << DescribeMember(m) << ", which joined: " << connected.message();
    }
  });
  const PeerId self = MemberPeerId(*client, client->role(), client->rank());
  transport->set_self(self);
  if (prepare) HERD_RETURN_IF_ERROR(prepare(*client));
  for (size_t i = 0; i < client->members().size(); ++i) {
    const wire::Member& m = client->members()[i];
    if (static_cast<PeerId>(i) == self) continue;
    if (std::find(connect_to.begin(), connect_to.end(), m.role()) == connect_to.end()) continue;
    if (m.ucx_address().empty()) continue;  // lost: a job of regions went on without it
    Status connected = transport->Connect(static_cast<PeerId>(i), m.ucx_address(), DescribeMember(m));
    // A peer that stopped because the job was stopped cannot be reached:
    // that is the job's failure, not this process's.
    if (!connected.ok()) return client->health().ok() ? connected : client->health();
  }
  // A worker joining a job under way is welcomed once every member has
  // connected to it; the others passed this barrier long ago. A region
  // rejoining is admitted once its own processes have all connected (the
  // job's members then connect to them before they hear of anything to
  // send).
  if (client->joining_region() >= 0) {
    HERD_RETURN_IF_ERROR(client->Barrier(kUcxConnectedBarrier, wire::REGION));
  } else if (!client->joined_under_way()) {
    HERD_RETURN_IF_ERROR(client->Barrier(kUcxConnectedBarrier));
  }
  LOG(INFO) << DescribeRole(client->role(), client->rank()) << ": joined a job of " << client->num_servers()
            << " servers and " << client->num_workers() << " workers";
  return client;
}

Status AgreeOnResume(CoordinatorClient& client, const std::string& checkpoint) {
  wire::ResumeChoice mine;
  mine.set_checkpoint(checkpoint);
  HERD_ASSIGN_OR_RETURN(std::vector<wire::ResumeChoice> all, Gather(client, ResumeExchange(), mine));
  for (size_t i = 0; i < all.size(); ++i) {
    if (all[i].checkpoint() != checkpoint) {
      return Status::FailedPrecondition("the checkpoint to resume from differs: " +
                                        DescribeMember(client.members()[i]) + " has '" + all[i].checkpoint() +
                                        "', this process '" + checkpoint + "'");
    }
  }
  return Status::OK();
}

}  // namespace herd::transport
