// What a region rejoining a job of regions takes up from a region that
// goes on (cluster.diloco): for one server's range, the job's newest outer
// weights (which become the region's weights), the outer momentum, the
// inner AdamW moments and step of the sender's replica, its spike guard's
// statistics and (a region's first server) the data position after the
// step; and which regions are in the job and which the last outer step
// counted. Sent once, over the outer wire (transport/outer_wire.h's
// SendState), as bytes laid out by Encode; Decode checks every byte of it
// before anything is used.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "model/optim/spike_guard.h"
#include "transport/ps_protocol.h"

namespace herd {

struct RegionState {
  int64_t steps = 0;         // inner steps done
  std::vector<bool> in_job;  // [k]: region k is in the job (the receiver's included)
  std::vector<bool> counted; // [k]: the last outer step counted region k
  SpikeStats spikes;
  DataPosition data;
  // The range's arrays, each of the range's size.
  std::vector<float> outer, momentum, m, v;

  // The bytes of a state of `regions` regions and `floats` values a range.
  static int64_t Bytes(int regions, int64_t floats);
  std::string Encode() const;
  // Errors: a size, step, mask or value out of place (`regions`,
  // `floats` and `last_step` are the receiver's); `from` names the sender.
  static StatusOr<RegionState> Decode(const std::string& bytes, int regions, int64_t floats, int64_t last_step,
                                      int receiver_region, const std::string& from);
};

}  // namespace herd
