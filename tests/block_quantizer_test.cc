// The INT8 and FP4 block codes of pseudo-gradients between regions: their
// sizes, their codes' exactness on values a code holds, and bytes from
// another process that no quantiser writes (a bad scale, int8 −128)
// refused with the block named, not added.
#include "model/optim/block_quantizer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace herd {
namespace {

TEST(BlockQuantizer, SizesAreScalesAndCodesABlock) {
  EXPECT_EQ(QuantizedBytes(BlockCode::kInt8, 256), 4 + 256);
  EXPECT_EQ(QuantizedBytes(BlockCode::kInt8, 257), 4 + 256 + 4 + 1);
  EXPECT_EQ(QuantizedBytes(BlockCode::kFp4, 64), 4 + 32);
  EXPECT_EQ(QuantizedBytes(BlockCode::kFp4, 65), 4 + 32 + 4 + 1);
  EXPECT_EQ(QuantizedBytes(BlockCode::kFp4, 0), 0);
}

// Values that are codes times the block's scale come back exactly and
// leave no error; a zero block sends a zero scale.
TEST(BlockQuantizer, CodesTimesTheScaleComeBackExactly) {
  const std::vector<float> fp4 = {0, 0.5f, -1, 1.5f, 2, -3, 4, 6, -6, 0.5f};
  std::vector<float> x(fp4), sum(fp4.size(), 0.0f);
  for (float& v : x) v *= 0.125f;
  std::vector<uint8_t> bytes(QuantizedBytes(BlockCode::kFp4, x.size()));
  ASSERT_TRUE(QuantizeKeepingError(x.data(), x.size(), BlockCode::kFp4, bytes.data()).ok());
  ASSERT_TRUE(AddDequantized(bytes.data(), x.size(), BlockCode::kFp4, sum.data()).ok());
  for (size_t i = 0; i < fp4.size(); ++i) {
    EXPECT_EQ(sum[i], fp4[i] * 0.125f) << i;
    EXPECT_EQ(x[i], 0.0f) << i;
  }
  std::vector<float> zero(300, 0.0f), out(300, 1.0f);
  std::vector<uint8_t> zb(QuantizedBytes(BlockCode::kInt8, 300));
  ASSERT_TRUE(QuantizeKeepingError(zero.data(), 300, BlockCode::kInt8, zb.data()).ok());
  ASSERT_TRUE(AddDequantized(zb.data(), 300, BlockCode::kInt8, out.data()).ok());
  for (float v : out) EXPECT_EQ(v, 1.0f);
}

TEST(BlockQuantizer, RefusesBytesNoQuantiserWrites) {
  std::vector<float> x(600, 0.25f), sum(600, 0.0f);
  std::vector<uint8_t> good(QuantizedBytes(BlockCode::kInt8, 600));
  ASSERT_TRUE(QuantizeKeepingError(x.data(), 600, BlockCode::kInt8, good.data()).ok());
  std::vector<uint8_t> bad = good;
  bad[260 + 4 + 7] = 0x80;  // block 1's eighth code
  Status s = AddDequantized(bad.data(), 600, BlockCode::kInt8, sum.data());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("block 1"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("-128"), std::string::npos) << s.message();
  bad = good;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(bad.data() + 2 * 260, &nan, 4);
  s = AddDequantized(bad.data(), 600, BlockCode::kInt8, sum.data());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("block 2"), std::string::npos) << s.message();
  const float negative = -1.0f;
  std::vector<uint8_t> fp4(QuantizedBytes(BlockCode::kFp4, 600));
  ASSERT_TRUE(QuantizeKeepingError(x.data(), 600, BlockCode::kFp4, fp4.data()).ok());
  std::memcpy(fp4.data(), &negative, 4);
  EXPECT_FALSE(AddDequantized(fp4.data(), 600, BlockCode::kFp4, sum.data()).ok());
  x[5] = std::numeric_limits<float>::infinity();
  EXPECT_FALSE(QuantizeKeepingError(x.data(), 600, BlockCode::kInt8, good.data()).ok());
}

}  // namespace
}  // namespace herd
