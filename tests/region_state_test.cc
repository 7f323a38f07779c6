// What a rejoining region takes up (server/region_state.h): it travels
// exactly, and every byte out of place is refused with one line.
#include "server/region_state.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>

namespace herd {
namespace {

RegionState Example() {
  RegionState s;
  s.steps = 41;
  s.in_job = {true, false, true};
  s.counted = {true, false, false};
  s.spikes = {7, 1.5, 0.25, 2.5, 0.125};
  s.data = {1, 300, 4096};
  s.outer = {1.0f, -2.0f, 3.5f};
  s.momentum = {0.0f, 0.5f, -0.25f};
  s.m = {0.1f, 0.2f, 0.3f};
  s.v = {0.01f, 0.0f, 0.03f};
  return s;
}

TEST(RegionState, TravelsExactly) {
  const RegionState s = Example();
  const std::string bytes = s.Encode();
  ASSERT_EQ(static_cast<int64_t>(bytes.size()), RegionState::Bytes(3, 3));
  StatusOr<RegionState> back = RegionState::Decode(bytes, 3, 3, 100, 2, "region 0's server 0");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->steps, 41);
  EXPECT_EQ(back->in_job, s.in_job);
  EXPECT_EQ(back->counted, s.counted);
  EXPECT_EQ(back->spikes.count, 7);
  EXPECT_EQ(back->spikes.norm_var, 0.125);
  EXPECT_TRUE(back->data == s.data);
  EXPECT_EQ(back->outer, s.outer);
  EXPECT_EQ(back->momentum, s.momentum);
  EXPECT_EQ(back->m, s.m);
  EXPECT_EQ(back->v, s.v);
}

TEST(RegionState, EveryByteOutOfPlaceIsRefusedWithOneLine) {
  auto refused = [](const std::string& bytes, int receiver = 2) {
    StatusOr<RegionState> s = RegionState::Decode(bytes, 3, 3, 100, receiver, "region 0's server 0");
    EXPECT_FALSE(s.ok());
    return s.status().message();
  };
  const std::string good = Example().Encode();
  EXPECT_EQ(refused(good.substr(1)), "the job's state from region 0's server 0: " + std::to_string(good.size() - 1) +
                                         " bytes, expected " + std::to_string(good.size()));
  RegionState late = Example();
  late.steps = 101;
  EXPECT_NE(refused(late.Encode()).find("step 101 is outside the run (0..100)"), std::string::npos);
  EXPECT_NE(refused(good, /*receiver=*/1).find("region 1, rejoining, is not in the job"), std::string::npos);
  RegionState counted = Example();
  counted.counted[2] = true;
  EXPECT_NE(refused(counted.Encode()).find("region 2, rejoining, is counted by the last outer step"),
            std::string::npos);
  RegionState none = Example();
  none.counted = {false, false, false};
  EXPECT_NE(refused(none.Encode()).find("no region in the job was counted"), std::string::npos);
  RegionState nan = Example();
  nan.m[1] = std::nanf("");
  EXPECT_NE(refused(nan.Encode()).find("the first moment at offset 1 is nan"), std::string::npos);
  RegionState negative = Example();
  negative.v[2] = -1.0f;
  EXPECT_NE(refused(negative.Encode()).find("the second moment at offset 2 is -1"), std::string::npos);
  std::string mask = good;
  mask[RegionState::Bytes(3, 3) - 4 * 3 * sizeof(float) - 6] = 2;  // in_job[0]
  EXPECT_NE(refused(mask).find("a region mask byte of 2"), std::string::npos);
}

}  // namespace
}  // namespace herd
