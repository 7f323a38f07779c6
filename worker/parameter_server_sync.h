// The worker's side of parameter-server mode (see worker/sync_strategy.h):
// gradient buckets pushed to the servers that own them as backward
// finishes them (fp32 or bf16 on the wire), this worker's loss to server 0,
// the next weights pulled bucket by bucket in forward order together with
// every server's step report.
#pragma once

#include <cstdint>
#include <memory>

#include "common/status.h"
#include "sharding/shard_plan.h"
#include "transport/push_pull.h"
#include "worker/sync_strategy.h"

namespace herd {

// `client` talks to the servers, server s being PeerId first_server + s;
// bf16 staging memory is registered with `transport`.
StatusOr<std::unique_ptr<SyncStrategy>> CreateParameterServerSync(const ShardPlan& plan,
                                                                    bool bf16, transport::UcxTransport* transport,
                                                                    transport::PushPullClient* client,
                                                                    transport::PeerId first_server);

// The largest bucket in the wire dtype: pushes and pulls travel whole.
uint64_t LargestBucketBytes(const ShardPlan& plan, int wire_bytes);

}  // namespace herd
