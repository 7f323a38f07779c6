// The servers' one-pass kernels against the passes they fuse: a bucket's
// sum and its squares (server/share_sums.h) have the bits of adding the
// contributions one by one and then taking SumOfSquares over each counted
// range; AdamW reading bf16 gradients and writing the bf16 weights in the
// same pass (model/optim/adamw.h's AdamWStreams) has the bits of widening
// the gradients first and rounding the weights after; no thread count
// changes a bit.
#include <gtest/gtest.h>
#include <omp.h>

#include <cstring>
#include <random>
#include <vector>

#include "common/bf16.h"
#include "model/optim/adamw.h"
#include "server/share_sums.h"

namespace herd {
namespace {

std::vector<float> Random(int64_t n, int seed, float scale = 0.1f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0, scale);
  std::vector<float> x(n);
  for (float& v : x) v = d(rng);
  return x;
}

std::vector<uint16_t> ToBf16(const std::vector<float>& x) {
  std::vector<uint16_t> out(x.size());
  FloatsToBf16(x.data(), out.data(), static_cast<int64_t>(x.size()));
  return out;
}

// A bucket that is not a whole number of chunks, counted in three pieces
// with gaps (tensor-parallel copies left out of the norm) between.
constexpr int64_t kN = 3 * kSumOfSquaresChunk + 1234;
const std::vector<ParamRange> kCounted = {{5, 5000}, {5100, 9000}, {9001, kN - 7}};

double SquaresOf(const std::vector<float>& sum) {
  double total = 0;
  for (const ParamRange& c : kCounted) total += SumOfSquares(sum.data() + c.begin, c.size());
  return total;
}

TEST(ShareSums, Fp32SharesAddInOrderAndTheLastGivesSumOfSquaresBits) {
  for (int threads : {1, 2}) {
    omp_set_num_threads(threads);
    const auto g0 = Random(kN, 1), g1 = Random(kN, 2), g2 = Random(kN, 3);
    std::vector<float> sum(kN, 0.0f);
    EXPECT_EQ(AddShare(sum.data(), {g0.data(), false, nullptr, /*first=*/true}, kN, nullptr), 0.0);
    AddShare(sum.data(), {g1.data(), false, nullptr, false}, kN, nullptr);
    const double squares = AddShare(sum.data(), {g2.data(), false, nullptr, false}, kN, &kCounted);
    std::vector<float> expected(kN);
    for (int64_t i = 0; i < kN; ++i) expected[i] = (g0[i] + g1[i]) + g2[i];
    ASSERT_EQ(0, std::memcmp(expected.data(), sum.data(), kN * sizeof(float))) << threads << " threads";
    EXPECT_EQ(squares, SquaresOf(expected)) << threads << " threads";
  }
}

TEST(ShareSums, Bf16SharesWidenAsTheyAreAdded) {
  const auto g0 = ToBf16(Random(kN, 4)), g1 = ToBf16(Random(kN, 5)), g2 = ToBf16(Random(kN, 6));
  std::vector<float> expected(kN);
  for (int64_t i = 0; i < kN; ++i) expected[i] = (Bf16ToFloat(g0[i]) + Bf16ToFloat(g1[i])) + Bf16ToFloat(g2[i]);
  // The first share landed in place (bf16) and is widened with the second.
  std::vector<float> sum(kN, 0.0f);
  AddShare(sum.data(), {g1.data(), true, g0.data(), false}, kN, nullptr);
  double squares = AddShare(sum.data(), {g2.data(), true, nullptr, false}, kN, &kCounted);
  ASSERT_EQ(0, std::memcmp(expected.data(), sum.data(), kN * sizeof(float)));
  EXPECT_EQ(squares, SquaresOf(expected));
  // The first share in scratch (elastic) starts the sum.
  std::fill(sum.begin(), sum.end(), 0.0f);
  AddShare(sum.data(), {g0.data(), true, nullptr, /*first=*/true}, kN, nullptr);
  AddShare(sum.data(), {g1.data(), true, nullptr, false}, kN, nullptr);
  squares = AddShare(sum.data(), {g2.data(), true, nullptr, false}, kN, &kCounted);
  ASSERT_EQ(0, std::memcmp(expected.data(), sum.data(), kN * sizeof(float)));
  EXPECT_EQ(squares, SquaresOf(expected));
  // One share, bf16, as it landed: its own order, the same value to
  // double rounding.
  std::vector<float> widened(kN);
  Bf16ToFloats(g0.data(), widened.data(), kN);
  EXPECT_NEAR(SumOfSquaresOverBf16(g0.data(), kCounted), SquaresOf(widened), 1e-12 * SquaresOf(widened));
}

struct AdamWState {
  std::vector<float> w, m, v;
};

AdamWState Fresh() { return {Random(kN, 7, 0.02f), Random(kN, 8, 0.01f), Random(kN, 9, 0.0f)}; }

TEST(AdamWStreams, Bf16GradientsAndTheBf16CopyGiveTheBitsOfTheSeparatePasses) {
  const auto grads = ToBf16(Random(kN, 10));
  std::vector<float> widened(kN);
  Bf16ToFloats(grads.data(), widened.data(), kN);
  // Decayed and undecayed segments, starting at element 100 of the space.
  const std::vector<DecaySegment> segments = {{100, 2100, false}, {2100, 100 + kN, true}};
  AdamWOptions o;
  o.weight_decay = 0.1;
  AdamWState separate = Fresh();
  AdamWStep(segments, 100, separate.w.data(), widened.data(), separate.m.data(), separate.v.data(), 3, 1e-3, 0.7, o);
  const std::vector<uint16_t> rounded = ToBf16(separate.w);
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    for (bool from_bf16 : {false, true}) {
      AdamWState fused = Fresh();
      std::vector<uint16_t> copy(kN, 0);
      AdamWStreams io;
      if (from_bf16) {
        io.grads_bf16 = grads.data();
      } else {
        io.grads = widened.data();
      }
      io.weights_bf16 = copy.data();
      AdamWStep(segments, 100, fused.w.data(), io, fused.m.data(), fused.v.data(), 3, 1e-3, 0.7, o);
      const std::string what = std::to_string(threads) + " threads, " + (from_bf16 ? "bf16" : "fp32") + " gradients";
      ASSERT_EQ(0, std::memcmp(separate.w.data(), fused.w.data(), kN * sizeof(float))) << what;
      ASSERT_EQ(0, std::memcmp(separate.m.data(), fused.m.data(), kN * sizeof(float))) << what;
      ASSERT_EQ(0, std::memcmp(separate.v.data(), fused.v.data(), kN * sizeof(float))) << what;
      ASSERT_EQ(rounded, copy) << what;
    }
  }
}

}  // namespace
}  // namespace herd
