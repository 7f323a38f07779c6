// A flat space (model/param_layout.h) as the CUDA model addresses it on the
// device: one buffer holding it whole, or one buffer per unit
// (ParamLayout::UnitBoundaries) of which only some are on the device at a
// time (a worker that streams its weights). `space + offset` is the device
// address of flat offset `offset` either way, so the model's code is the
// same for both. An offset in a unit that is not on the device stops the
// process (CHECK): a missing upload is loud, never a read of stale memory.
#pragma once

#include <glog/logging.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

namespace herd::cuda {

// Which units are on the device, and where. The owner keeps it current:
// the model reads it when it enqueues each kernel.
template <typename E>
struct UnitTable {
  std::vector<int64_t> begins;  // UnitBoundaries without the space's end
  std::vector<E*> bases;        // unit i's buffer (element begins[i]), or null
  int Unit(int64_t offset) const {
    return static_cast<int>(std::upper_bound(begins.begin(), begins.end(), offset) - begins.begin()) - 1;
  }
};

template <typename U>
class UnitSpace {
 public:
  using Table = UnitTable<std::remove_const_t<U>>;

  UnitSpace(U* whole) : whole_(whole) {}  // NOLINT: a pointer is a space held whole
  explicit UnitSpace(const Table* units) : units_(units) {}

  U* operator+(int64_t offset) const {
    if (units_ == nullptr) return whole_ + offset;
    const int u = units_->Unit(offset);
    CHECK(u >= 0 && units_->bases[u] != nullptr) << "flat offset " << offset << " (unit " << u
                                                 << ") is not on the device";
    return units_->bases[u] + (offset - units_->begins[u]);
  }

 private:
  U* whole_ = nullptr;
  const Table* units_ = nullptr;
};

}  // namespace herd::cuda
