// When each part of a server's range takes DiLoCo's outer step in a job of
// regions (cluster.diloco): the fragments (Streaming DiLoCo) and the steps
// their exchanges are sent after and land after. A pure function of the
// config and the region's shard plan, so that every server of every region
// (and a resumed one) agrees on it.
//
// Fragment f is the plan's buckets b with ⌊b·F/B⌋ = f (B buckets, in the
// plan's order, backward's: fragment 0 holds the last layers): a run of
// each server's range, possibly empty. It is sent
// after the inner steps s with s mod H = ⌊H·(f+1)/F⌋ mod H, and lands (its
// new weights replace the region's) after step s + overlap. The last step
// of the run sends and lands the whole range at once, after any exchange
// still in flight has landed, so that every region ends with the same
// weights. With overlap < ⌊H/F⌋ at most one exchange is in flight.
#pragma once

#include <cstdint>
#include <optional>

#include "common/config.h"
#include "common/status.h"
#include "model/param_layout.h"
#include "sharding/shard_plan.h"

namespace herd {

class DilocoPlan {
 public:
  // An exchange: of fragment `fragment` (kWhole: every fragment), sent
  // after step `sent`, landing after step `lands`.
  static constexpr int kWhole = -1;
  struct Exchange {
    int fragment = kWhole;
    int64_t sent = 0, lands = 0;
  };

  // Errors, each naming its setting: fragments < 1, above H or above the
  // plan's buckets; overlap < 0, or ≥ ⌊H/F⌋ when above 0 (common/config.h's
  // ValidateDilocoSchedule, and the buckets).
  static StatusOr<DilocoPlan> Make(const config::DilocoConfig& diloco, const ShardPlan& plan, int64_t last_step);

  int fragments() const { return fragments_; }
  // Fragment f's run of server `server`'s range (kWhole: the whole range),
  // as offsets into that range.
  ParamRange RunOf(int server, int fragment) const;
  // The longest of server `server`'s fragments' runs: its buffers' size.
  int64_t LongestRun(int server) const;
  // The exchange sent after `step`, if one is.
  std::optional<Exchange> SentAfter(int64_t step) const;
  // The exchange in flight after `step`: sent after it or before, landing
  // after a later step. A checkpoint after `step` holds its outer step
  // taken and its landing pending.
  std::optional<Exchange> InFlightAfter(int64_t step) const;

 private:
  DilocoPlan(const config::DilocoConfig& diloco, const ShardPlan& plan, int64_t last_step);
  // The fragment sent after `step` (not the last), or none.
  std::optional<int> FragmentSentAfter(int64_t step) const;

  const int64_t every_, overlap_, last_step_;
  const int fragments_;
  const ShardPlan plan_;
};

}  // namespace herd
