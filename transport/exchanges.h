// The coordinator's all-gathers, typed: each purpose is an Exchange with
// its key, its scope and its message (proto/wire.proto), so that a process
// sends and receives messages, never bytes it decodes itself. Every
// contribution is parsed before use; one that does not parse is an error
// naming who sent it. A receiver still checks the fields it needs (a lost
// member's contribution is empty).
//
// Barriers carry nothing; their names are here too, so that every key the
// processes of a job meet under is listed in one place.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "proto/wire.pb.h"
#include "transport/coordinator_client.h"
#include "transport/join.h"

namespace herd::transport {

template <typename Message>
struct Exchange {
  std::string key;  // unique for the job's life
  wire::Scope scope;
};

// The servers' partial norms and losses of step `step` (1-based).
inline Exchange<wire::NormShare> NormExchange(int64_t step) {
  return {"herd/norm/" + std::to_string(step), wire::SERVERS};
}
// The checkpoint every process resumes from.
inline Exchange<wire::ResumeChoice> ResumeExchange() { return {"herd/resume", wire::EVERYONE}; }
// Step `step`'s checkpoint: the parts written, then the manifest.
inline Exchange<wire::CheckpointVote> PartsWrittenVote(int64_t step, wire::Scope voters) {
  return {"herd/checkpoint/" + std::to_string(step), voters};
}
inline Exchange<wire::CheckpointVote> CommittedVote(int64_t step, wire::Scope voters) {
  return {"herd/committed/" + std::to_string(step), voters};
}
// A job of regions: the servers' vote on the outer step's exchange sent
// after step `step` (0-based) of `fragment`.
inline Exchange<wire::OuterVote> OuterVoteExchange(int64_t step, int fragment) {
  return {"herd/outer/" + std::to_string(step) + "/" + std::to_string(fragment), wire::SERVERS};
}
// The ncclUniqueId of each NCCL communicator of `group` (one per group of
// the grid's same axes), contributed by its first member.
inline Exchange<wire::NcclId> NcclIdExchange(const std::string& group) {
  return {"herd/nccl-id/" + group, wire::WORKERS};
}

// Barriers: every process is done training (it then leaves); every
// process of a forming job (or of a region rejoining one) has connected
// its UCX endpoints; a rejoining region's servers have taken up the job's
// state and serve.
inline constexpr char kDoneBarrier[] = "herd/done";
inline constexpr char kUcxConnectedBarrier[] = "herd/ucx-connected";
inline constexpr char kRegionServesBarrier[] = "herd/region-serves";

// Everyone in the exchange's scope contributes `mine` (or, named, the
// `voters` of it: CoordinatorClient::AllGather); every contribution,
// parsed, in scope order (servers by rank, then workers by rank).
template <typename Message>
StatusOr<std::vector<Message>> Gather(CoordinatorClient& client, const Exchange<Message>& exchange,
                                      const Message& mine, const Voters& voters = {}) {
  HERD_ASSIGN_OR_RETURN(std::vector<std::string> all,
                        client.AllGather(exchange.key, mine.SerializeAsString(), exchange.scope, voters));
  const size_t first = exchange.scope == wire::WORKERS ? client.num_servers() : 0;
  std::vector<Message> out(all.size());
  for (size_t i = 0; i < all.size(); ++i) {
    if (!out[i].ParseFromString(all[i])) {
      return Status::Corruption(exchange.key + ": " + DescribeMember(client.members()[first + i]) +
                                " sent a malformed " + Message::descriptor()->name());
    }
  }
  return out;
}

}  // namespace herd::transport
