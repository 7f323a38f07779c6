#include "transport/node_runtime.h"

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
  rt.client_->OnFailure([&rt](const Status& failure) {
    if (rt.push_pull_) rt.push_pull_->Fail(-1, failure);
    if (rt.ring_) rt.ring_->Fail(failure);
  });
  return runtime;
}

void NodeRuntime::StartRing(CoordinatorClient& client) {
  std::vector<PeerId> peers;
  for (int r = 0; r < client.num_workers(); ++r) peers.push_back(MemberPeerId(client, wire::WORKER, r));
  ring_ = std::make_unique<RingCollectives>(transport_.get(), client.rank(), peers);
}

void NodeRuntime::Serve(ShardHandler* shard) { served_ = std::make_unique<PushPullServer>(transport_.get(), shard); }

Status NodeRuntime::Conclude(const Status& local) {
  Status st = client_->Explain(local);
  if (!st.ok()) transport_->Abort(st);
  return st;
}

}  // namespace herd::transport
