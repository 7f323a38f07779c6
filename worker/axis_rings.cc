#include "worker/axis_rings.h"

#include <glog/logging.h>

#include <vector>

namespace herd {

static_assert(1 << static_cast<int>(Axis::kRegion) <= transport::kGroupRings,
              "every mask of a region's axes is a group ring");

int AxisRings::MaskOf(std::initializer_list<Axis> axes) {
  int mask = 0;
  for (Axis a : axes) {
    CHECK(a != Axis::kRegion) << "a worker's rings stay inside its region";
    mask |= 1 << static_cast<int>(a);
  }
  return mask;
}

transport::Collectives* AxisRings::Open(transport::NodeRuntime& runtime, transport::CoordinatorClient& client,
                                        std::initializer_list<Axis> axes) {
  const int mask = MaskOf(axes);
  auto found = rings_.find(mask);
  if (found != rings_.end()) return found->second;
  const std::vector<int> ranks = grid_.GroupOf(client.rank(), axes);
  transport::Collectives* ring = nullptr;
  if (static_cast<int>(ranks.size()) == grid_.size()) {
    ring = runtime.ring();
    CHECK(ring != nullptr) << "the job's ring before its groups' (StartRing)";
  } else if (auto same = by_members_.find(ranks); same != by_members_.end()) {
    ring = same->second;
  } else if (ranks.size() > 1) {
    ring = runtime.StartGroupRingOf(client, ranks, mask);
    by_members_[ranks] = ring;
  }
  rings_[mask] = ring;
  return ring;
}

void AxisRings::OpenReducerRings(transport::NodeRuntime& runtime, transport::CoordinatorClient& client, bool zero) {
  Open(runtime, client, {Axis::kContext, Axis::kShard, Axis::kReplicate});
  if (!zero) return;
  Open(runtime, client, {Axis::kContext, Axis::kShard});
  Open(runtime, client, {Axis::kReplicate});
}

transport::Collectives* AxisRings::Of(std::initializer_list<Axis> axes) const {
  auto found = rings_.find(MaskOf(axes));
  return found != rings_.end() ? found->second : nullptr;
}

}  // namespace herd
