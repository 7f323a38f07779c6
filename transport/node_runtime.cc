#include "transport/node_runtime.h"

#include <glog/logging.h>

#include "transport/wire.h"

namespace herd::transport {

StatusOr<std::unique_ptr<NodeRuntime>> NodeRuntime::Join(const Options& options, const PrepareFn& prepare) {
  std::unique_ptr<NodeRuntime> runtime(new NodeRuntime);
  NodeRuntime& rt = *runtime;
  HERD_ASSIGN_OR_RETURN(const UcxOptions ucx, DataPlaneOptions(options.join));
  HERD_ASSIGN_OR_RETURN(rt.transport_, UcxTransport::Create(ucx));
  // Before joining: its handlers must exist before any peer can send.
  if (options.push_pull_piece_bytes > 0) {
    rt.push_pull_ = std::make_unique<PushPullClient>(rt.transport_.get(), options.push_pull_piece_bytes);
  }
  HERD_ASSIGN_OR_RETURN(rt.client_, JoinJob(options.join, rt.transport_.get(), options.connect_to,
                                            [&](CoordinatorClient& client) { return prepare(rt, client); }));
  PrintEndpoints(*rt.client_, *rt.transport_, options.connect_to);
  rt.client_->OnFailure([&rt](const Status& failure) {
    if (rt.push_pull_) rt.push_pull_->Fail(-1, failure);
    for (RingCollectives* ring : {rt.ring_.get(), rt.shard_ring_.get(), rt.replica_ring_.get()}) {
      if (ring != nullptr) ring->Fail(failure);
    }
    for (const auto& ring : rt.group_rings_) ring->Fail(failure);
    if (rt.outer_wire_) rt.outer_wire_->Fail(failure);
    // A stage waiting on a lost neighbour: UCX may not fail the endpoint of
    // a peer killed on this machine for longer than the launcher waits, so
    // the coordinator's word is what ends the wait.
    if (rt.pipeline_wire_) rt.pipeline_wire_->Fail(failure);
  });
  return runtime;
}

void NodeRuntime::StartRing(CoordinatorClient& client, int shard_group_size, wire::Role role) {
  const int W = role == wire::WORKER ? client.num_workers() : client.num_servers(), rank = client.rank(),
            G = shard_group_size;
  auto peers_of = [&](int first, int stride, int count) {
    std::vector<PeerId> peers;
    for (int i = 0; i < count; ++i) peers.push_back(MemberPeerId(client, role, first + i * stride));
    return peers;
  };
  ring_ = std::make_unique<RingCollectives>(transport_.get(), rank, peers_of(0, 1, W));
  if (G > 0 && G < W && W % G == 0) {
    shard_ring_ = std::make_unique<RingCollectives>(transport_.get(), rank % G, peers_of(rank / G * G, 1, G),
                                                    kRingChunkBytes, kAmShardRing);
    replica_ring_ = std::make_unique<RingCollectives>(transport_.get(), rank / G, peers_of(rank % G, G, W / G),
                                                      kRingChunkBytes, kAmReplicaRing);
  }
}

void NodeRuntime::StartGroupRing(CoordinatorClient& client, int group_size, wire::Role role) {
  const int rank = client.rank(), G = group_size;
  std::vector<PeerId> peers;
  for (int i = 0; i < G; ++i) peers.push_back(MemberPeerId(client, role, rank / G * G + i));
  shard_ring_ = std::make_unique<RingCollectives>(transport_.get(), rank % G, peers, kRingChunkBytes, kAmShardRing);
}

OuterWire* NodeRuntime::StartOuterWire(OuterWire::Options options) {
  outer_wire_ = std::make_unique<OuterWire>(transport_.get(), std::move(options));
  return outer_wire_.get();
}

PipelineWire* NodeRuntime::StartPipelineWire(bool bf16, int64_t max_elements, int max_early) {
  CHECK(pipeline_wire_ == nullptr) << "a second pipeline wire";
  pipeline_wire_ = std::make_unique<PipelineWire>(transport_.get(), bf16, max_elements, max_early);
  return pipeline_wire_.get();
}

RingCollectives* NodeRuntime::StartGroupRingOf(CoordinatorClient& client, const std::vector<int>& ranks, int group,
                                               wire::Role role) {
  CHECK(group >= 0 && group < kGroupRings) << "group ring " << group << " of " << kGroupRings;
  int mine = -1;
  std::vector<PeerId> peers;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] == client.rank()) mine = static_cast<int>(i);
    peers.push_back(MemberPeerId(client, role, ranks[i]));
  }
  CHECK_GE(mine, 0) << "a group ring without this process";
  group_rings_.push_back(std::make_unique<RingCollectives>(transport_.get(), mine, std::move(peers), kRingChunkBytes,
                                                           static_cast<uint16_t>(kAmGroupRings + group)));
  return group_rings_.back().get();
}

void NodeRuntime::Serve(ShardHandler* shard) { served_ = std::make_unique<PushPullServer>(transport_.get(), shard); }

Status NodeRuntime::Conclude(const Status& local) {
  Status st = client_->Explain(local);
  if (!st.ok()) transport_->Abort(st);
  return st;
}

}  // namespace herd::transport
