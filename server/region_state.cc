#include "server/region_state.h"

#include <bit>
#include <cmath>
#include <cstring>

namespace herd {
namespace {

static_assert(std::endian::native == std::endian::little, "sent in host order: little-endian only");

// The fixed part, as it travels.
struct Fixed {
  int64_t steps = 0;
  int64_t floats = 0;
  int32_t regions = 0;
  int32_t reserved = 0;
  SpikeStats spikes;
  DataPosition data;
};
static_assert(sizeof(Fixed) == 24 + sizeof(SpikeStats) + sizeof(DataPosition), "Fixed travels as is");

}  // namespace

int64_t RegionState::Bytes(int regions, int64_t floats) {
  return static_cast<int64_t>(sizeof(Fixed)) + 2 * regions + 4 * floats * static_cast<int64_t>(sizeof(float));
}

std::string RegionState::Encode() const {
  const int regions = static_cast<int>(in_job.size());
  const int64_t n = static_cast<int64_t>(outer.size());
  std::string bytes(Bytes(regions, n), '\0');
  Fixed f;
  f.steps = steps;
  f.floats = n;
  f.regions = regions;
  f.spikes = spikes;
  f.data = data;
  char* p = bytes.data();
  std::memcpy(p, &f, sizeof f);
  p += sizeof f;
  for (int k = 0; k < regions; ++k) *p++ = in_job[k] ? 1 : 0;
  for (int k = 0; k < regions; ++k) *p++ = counted[k] ? 1 : 0;
  for (const std::vector<float>* a : {&outer, &momentum, &m, &v}) {
    std::memcpy(p, a->data(), n * sizeof(float));
    p += n * sizeof(float);
  }
  return bytes;
}

StatusOr<RegionState> RegionState::Decode(const std::string& bytes, int regions, int64_t floats, int64_t last_step,
                                          int receiver_region, const std::string& from) {
  auto bad = [&](const std::string& why) {
    return Status::Corruption("the job's state from " + from + ": " + why);
  };
  if (static_cast<int64_t>(bytes.size()) != Bytes(regions, floats)) {
    return bad(std::to_string(bytes.size()) + " bytes, expected " + std::to_string(Bytes(regions, floats)));
  }
  Fixed f;
  const char* p = bytes.data();
  std::memcpy(&f, p, sizeof f);
  p += sizeof f;
  if (f.regions != regions || f.floats != floats) {
    return bad(std::to_string(f.regions) + " regions of " + std::to_string(f.floats) + " values, expected " +
               std::to_string(regions) + " of " + std::to_string(floats));
  }
  if (f.steps < 0 || f.steps > last_step) {
    return bad("step " + std::to_string(f.steps) + " is outside the run (0.." + std::to_string(last_step) + ")");
  }
  if (f.data.epoch < 0 || f.data.taken < 0 || f.data.tokens < 0 || f.spikes.count < 0) {
    return bad("a negative data position or spike count");
  }
  RegionState s;
  s.steps = f.steps;
  s.spikes = f.spikes;
  s.data = f.data;
  for (std::vector<bool>* mask : {&s.in_job, &s.counted}) {
    for (int k = 0; k < regions; ++k) {
      const uint8_t b = static_cast<uint8_t>(*p++);
      if (b > 1) return bad("a region mask byte of " + std::to_string(b));
      mask->push_back(b == 1);
    }
  }
  if (!s.in_job[receiver_region] || s.counted[receiver_region]) {
    return bad("region " + std::to_string(receiver_region) + ", rejoining, is " +
               (s.in_job[receiver_region] ? "counted by the last outer step" : "not in the job"));
  }
  int counted = 0;
  for (int k = 0; k < regions; ++k) counted += s.counted[k] && s.in_job[k];
  if (counted == 0) return bad("no region in the job was counted by the last outer step");
  const char* names[] = {"outer weight", "outer momentum", "first moment", "second moment"};
  int a = 0;
  for (std::vector<float>* array : {&s.outer, &s.momentum, &s.m, &s.v}) {
    array->resize(floats);
    std::memcpy(array->data(), p, floats * sizeof(float));
    p += floats * sizeof(float);
    for (int64_t i = 0; i < floats; ++i) {
      const float x = (*array)[i];
      if (!std::isfinite(x) || (array == &s.v && x < 0)) {
        return bad("the " + std::string(names[a]) + " at offset " + std::to_string(i) + " is " + std::to_string(x));
      }
    }
    ++a;
  }
  return s;
}

}  // namespace herd
