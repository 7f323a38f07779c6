// The rings a worker runs its collectives over, one per group of the
// grid's axes it names (sharding/grid.h): its tensor group ({tp}), its
// context group ({cp}), the replicas of its placement ({cp, dp_shard,
// dp_replicate}: the workers that hold the same parameters and compute
// other tokens), hybrid sharding's shard group and replicas. Any number a
// process; every worker of the job opens the same axis sets, in the
// NodeRuntime's prepare (before any peer can send), each on the group
// ring of its axes' mask, so that the members of a group meet on one AM
// id and no two of a process's rings share one.
//
// A group of every worker is the job's ring (NodeRuntime::ring(), opened
// by StartRing first), a group of the same workers as one opened before is
// that ring, and a group of one worker has no ring (null).
#pragma once

#include <initializer_list>
#include <map>
#include <vector>

#include "sharding/grid.h"
#include "transport/collectives.h"
#include "transport/node_runtime.h"

namespace herd {

class AxisRings {
 public:
  explicit AxisRings(const Grid& grid) : grid_(grid) {}

  // In prepare, after the runtime's StartRing: the ring of this worker's
  // (client.rank()'s) group along `axes` (none of them kRegion), opened once.
  transport::Collectives* Open(transport::NodeRuntime& runtime, transport::CoordinatorClient& client,
                               std::initializer_list<Axis> axes);
  // The ring Open made for `axes` (null: a group of one, or never opened).
  transport::Collectives* Of(std::initializer_list<Axis> axes) const;
  // A reducer's groups: the placement's replicas ({cp, dp_shard,
  // dp_replicate}), ZeRO's shard group ({cp, dp_shard}) and hybrid
  // sharding's replicas ({dp_replicate}); OpenReducerRings opens them.
  void OpenReducerRings(transport::NodeRuntime& runtime, transport::CoordinatorClient& client, bool zero);
  transport::Collectives* placement_replicas() const { return Of({Axis::kContext, Axis::kShard, Axis::kReplicate}); }
  transport::Collectives* shard_group() const { return Of({Axis::kContext, Axis::kShard}); }
  transport::Collectives* hybrid_replicas() const { return Of({Axis::kReplicate}); }

 private:
  static int MaskOf(std::initializer_list<Axis> axes);

  const Grid grid_;
  std::map<int, transport::Collectives*> rings_;  // by axis mask; the runtime owns them
  std::map<std::vector<int>, transport::Collectives*> by_members_;  // the same rings, by their ranks
};

}  // namespace herd
