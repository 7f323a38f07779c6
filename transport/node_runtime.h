// One process's place in a job: its UCX transport, the data-plane services
// on that transport and its coordinator client, held as members in the
// order they are made. They go in the reverse order: the client first (its
// failure handler reaches into the services), then the services (each
// shuts the transport down as it goes, so no completion runs afterwards),
// the transport last.
//
// Whatever the services reach into — registered buffers, a ShardHandler, a
// sync strategy whose pulls land in its own memory — belongs to the caller
// and must be declared before the NodeRuntime, so that it outlives every
// transfer.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "common/status.h"
#include "transport/coordinator_client.h"
#include "transport/join.h"
#include "transport/outer_wire.h"
#include "transport/pipeline_wire.h"
#include "transport/push_pull.h"
#include "transport/ring_collectives.h"
#include "transport/ucx_transport.h"

namespace herd::transport {

class NodeRuntime {
 public:
  struct Options {
    JoinOptions join;
    // The roles this process sends to (JoinJob's connect_to).
    std::vector<wire::Role> connect_to;
    // > 0: a push/pull client whose requests travel in pieces of at most
    // this many bytes (a worker of a parameter-server job).
    uint64_t push_pull_piece_bytes = 0;
  };
  // Runs once the membership is known and before any peer can send: the
  // place to make what depends on the rank and to start the rank's
  // services (StartRing, Serve).
  using PrepareFn = std::function<Status(NodeRuntime& runtime, CoordinatorClient& client)>;

  // Creates the transport (and the push/pull client), joins the job
  // (transport/join.h's JoinJob) and, from then on, fails every service
  // when the job fails.
  static StatusOr<std::unique_ptr<NodeRuntime>> Join(const Options& options, const PrepareFn& prepare);

  NodeRuntime(const NodeRuntime&) = delete;
  NodeRuntime& operator=(const NodeRuntime&) = delete;

  // In prepare: a ring among the job's members of `role` (this process's:
  // the workers in all-reduce mode). With 0 < shard_group_size < members
  // (hybrid sharding) also a ring within this member's group (ranks g·G …
  // g·G+G−1, G = shard_group_size) and one through the groups' members of
  // the same place in their group (its replicas). A job of regions'
  // servers: the group is a region's servers (their norm), the replicas
  // one range's servers across the regions (the outer steps).
  void StartRing(CoordinatorClient& client, int shard_group_size = 0, wire::Role role = wire::WORKER);
  // In prepare: a ring within this member's group of `group_size` members
  // of `role` (ranks g·G … g·G+G−1) alone, as shard_ring(): a job of
  // regions' servers, whose group is a region's servers (their norm).
  void StartGroupRing(CoordinatorClient& client, int group_size, wire::Role role);
  // In prepare: the wire of a job of regions' outer steps (a server's).
  OuterWire* StartOuterWire(OuterWire::Options options);
  // In prepare: the wire between a pipeline's stages (a stage's worker;
  // PipelineWire's arguments).
  PipelineWire* StartPipelineWire(bool bf16, int64_t max_elements, int max_early);
  // In prepare: a ring among the members `ranks` of `role` (ascending, this
  // process among them; its place in the list is its rank in the ring) on
  // group ring `group` (< kGroupRings): the AM id of its own, which every
  // member of the group names alike and no other ring of this process
  // uses. A worker's rings along the grid's axes are these
  // (worker/axis_rings.h): any number a process.
  RingCollectives* StartGroupRingOf(CoordinatorClient& client, const std::vector<int>& ranks, int group,
                                    wire::Role role = wire::WORKER);
  // In prepare: answers the workers' pushes and pulls with `shard`.
  void Serve(ShardHandler* shard);

  // What this process's run ends with: `local` as the coordinator explains
  // it (CoordinatorClient::Explain). On a failure the transport is aborted
  // first, so that its endpoints are left to the process's exit: transfers
  // may still be in flight to and from peers that go on, and UCX 1.13
  // asserts when an endpoint is destroyed under one.
  Status Conclude(const Status& local);

  UcxTransport& transport() { return *transport_; }
  CoordinatorClient& client() { return *client_; }
  // Null unless asked for (Options) or started (StartRing).
  PushPullClient* push_pull() { return push_pull_.get(); }
  RingCollectives* ring() { return ring_.get(); }
  // Null unless hybrid (StartRing).
  RingCollectives* shard_ring() { return shard_ring_.get(); }
  RingCollectives* replica_ring() { return replica_ring_.get(); }
  // Null unless started (StartOuterWire).
  OuterWire* outer_wire() { return outer_wire_.get(); }
  // Null unless started (StartPipelineWire).
  PipelineWire* pipeline_wire() { return pipeline_wire_.get(); }

 private:
  NodeRuntime() = default;

  std::unique_ptr<UcxTransport> transport_;
  std::unique_ptr<PushPullClient> push_pull_;
  std::unique_ptr<PushPullServer> served_;
  std::unique_ptr<RingCollectives> ring_;
  std::unique_ptr<RingCollectives> shard_ring_;
  std::unique_ptr<RingCollectives> replica_ring_;
  std::vector<std::unique_ptr<RingCollectives>> group_rings_;  // StartGroupRingOf's
  std::unique_ptr<OuterWire> outer_wire_;
  std::unique_ptr<PipelineWire> pipeline_wire_;
  std::unique_ptr<CoordinatorClient> client_;
};

}  // namespace herd::transport
