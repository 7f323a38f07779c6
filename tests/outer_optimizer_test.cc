// DiLoCo's outer optimizer against a double-precision reference of SGD
// with Nesterov momentum (PyTorch's order) over several outer steps, and
// its degenerate case: lr 1 and no momentum give the mean of the regions'
// weights, to rounding (each element within 2 ulps, of the larger of it and
// the outer weight, of the mean computed in double).
#include "model/optim/outer_optimizer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cmath>
#include <random>
#include <vector>

namespace herd {
namespace {

TEST(OuterOptimizer, IsNesterovSgdOnTheRegionsMeanPseudoGradient) {
  const int64_t n = 1000;
  const int regions = 3;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> start(n);
  for (float& x : start) x = normal(rng);
  const OuterOptions options{0.7, 0.9};
  // Every region's optimizer starts alike and sees the same sums.
  std::vector<OuterOptimizer> outer;
  for (int k = 0; k < regions; ++k) outer.emplace_back(options, start.data(), n);
  std::vector<double> ref_outer(start.begin(), start.end()), ref_buf(n, 0.0);
  for (int step = 0; step < 4; ++step) {
    // Each region's weights wander off from the outer weights.
    std::vector<std::vector<float>> weights(regions, std::vector<float>(n));
    std::vector<float> summed(n, 0.0f);
    std::vector<double> ref_sum(n, 0.0);
    for (int k = 0; k < regions; ++k) {
      for (int64_t i = 0; i < n; ++i) weights[k][i] = outer[0].outer()[i] + 0.01f * normal(rng);
      std::vector<float> delta(n);
      outer[k].PseudoGradient(0, n, weights[k].data(), delta.data());
      for (int64_t i = 0; i < n; ++i) {
        summed[i] += delta[i];
        ref_sum[i] += static_cast<double>(outer[0].outer()[i]) - weights[k][i];
      }
    }
    for (int64_t i = 0; i < n; ++i) {
      const double d = ref_sum[i] / regions;
      ref_buf[i] = 0.9 * ref_buf[i] + d;
      ref_outer[i] -= 0.7 * (d + 0.9 * ref_buf[i]);
    }
    for (int k = 0; k < regions; ++k) {
      outer[k].Step(0, n, summed.data(), regions);
      std::copy(outer[k].outer(), outer[k].outer() + n, weights[k].begin());
    }
    for (int64_t i = 0; i < n; ++i) {
      for (int k = 0; k < regions; ++k) ASSERT_EQ(weights[k][i], outer[0].outer()[i]) << "every region alike";
      ASSERT_NEAR(outer[0].outer()[i], ref_outer[i], 1e-5 * (1 + std::abs(ref_outer[i]))) << "element " << i;
    }
  }
}

TEST(OuterOptimizer, LrOneWithoutMomentumAveragesTheRegions) {
  const int64_t n = 4096;
  std::mt19937 rng(9);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int regions : {2, 3, 4}) {
    std::vector<float> start(n);
    for (float& x : start) x = normal(rng);
    OuterOptimizer outer({1.0, 0.0}, start.data(), n);
    std::vector<float> summed(n, 0.0f), delta(n), mine(n);
    std::vector<double> mean(n, 0.0);
    for (int k = 0; k < regions; ++k) {
      std::vector<float> w(n);
      for (int64_t i = 0; i < n; ++i) w[i] = start[i] - 0.003f * normal(rng);
      outer.PseudoGradient(0, n, w.data(), delta.data());
      for (int64_t i = 0; i < n; ++i) {
        summed[i] += delta[i];
        mean[i] += static_cast<double>(w[i]) / regions;
      }
    }
    outer.Step(0, n, summed.data(), regions);
    std::copy(outer.outer(), outer.outer() + n, mine.begin());
    for (int64_t i = 0; i < n; ++i) {
      const float m = static_cast<float>(mean[i]), big = std::max(std::abs(m), std::abs(start[i]));
      const float ulp = std::nextafter(big, INFINITY) - big;
      ASSERT_LE(std::abs(mine[i] - m), 2 * ulp) << "element " << i << " of " << regions << " regions";
    }
  }
}

// A bf16 wire's pseudo-gradient: every value a bf16 one, and what it left
// out kept, so that what is sent plus the new error is exactly the
// pseudo-gradient plus the old error: nothing is lost for good.
TEST(OuterOptimizer, RoundedPseudoGradientFeedsItsErrorBack) {
  const int64_t n = 2048;
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> start(n);
  for (float& x : start) x = normal(rng);
  OuterOptimizer outer({0.7, 0.9}, start.data(), n);
  std::vector<float> before(n, 0.0f), delta(n), exact(n);
  for (int step = 0; step < 3; ++step) {
    std::vector<float> w(n);
    for (int64_t i = 0; i < n; ++i) w[i] = start[i] - 0.01f * normal(rng);
    outer.PseudoGradient(0, n, w.data(), exact.data());
    outer.RoundedPseudoGradient(0, n, w.data(), delta.data());
    ASSERT_NE(outer.error(), nullptr);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(std::bit_cast<uint32_t>(delta[i]) & 0xffffu, 0u) << "a bf16 value";
      ASSERT_EQ(delta[i] + outer.error()[i], exact[i] + before[i]) << "element " << i << ", step " << step;
    }
    std::copy(outer.error(), outer.error() + n, before.begin());
  }
}

// INT8 and FP4 wires alike, on a fragment [at, at + m) of the range: what
// the codes carry (dequantised as a receiving region does) plus the new
// error is exactly the pseudo-gradient plus the old error; each value is
// within half a code's gap of what was wanted; the rest of the range's
// error is untouched.
TEST(OuterOptimizer, QuantizedPseudoGradientFeedsItsErrorBack) {
  const int64_t n = 3000, at = 700, m = 1100;  // m is no multiple of either block
  std::mt19937 rng(4);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> start(n);
  for (float& x : start) x = normal(rng);
  for (const BlockCode code : {BlockCode::kInt8, BlockCode::kFp4}) {
    OuterOptimizer outer({0.7, 0.9}, start.data(), n);
    std::vector<float> before(n, 0.0f), exact(m);
    std::vector<uint8_t> bytes(QuantizedBytes(code, m));
    for (int step = 0; step < 3; ++step) {
      std::vector<float> w(m);
      for (int64_t i = 0; i < m; ++i) w[i] = start[at + i] - 0.01f * normal(rng);
      outer.PseudoGradient(at, m, w.data(), exact.data());
      ASSERT_TRUE(outer.QuantizedPseudoGradient(at, m, w.data(), code, bytes.data()).ok());
      std::vector<float> sent(m, 0.0f);
      ASSERT_TRUE(AddDequantized(bytes.data(), m, code, sent.data()).ok());
      const float gap = code == BlockCode::kInt8 ? 1.0f / 127 : 2.0f / 6;  // the widest, over the block's amax
      for (int64_t i = 0; i < m; ++i) {
        const float want = exact[i] + before[at + i];
        ASSERT_EQ(sent[i] + outer.error()[at + i], want) << "element " << i << ", step " << step;
        float amax = 0;
        const int64_t b = BlockValues(code), first = i / b * b;
        for (int64_t j = first; j < std::min(m, first + b); ++j) amax = std::max(amax, std::abs(exact[j] + before[at + j]));
        ASSERT_LE(std::abs(outer.error()[at + i]), 0.5f * gap * amax * (1 + 1e-6f)) << "element " << i;
      }
      for (int64_t i = 0; i < n; ++i) {
        if (i < at || i >= at + m) {
          ASSERT_EQ(outer.error()[i], 0.0f) << "outside the fragment";
        }
      }
      std::copy(outer.error(), outer.error() + n, before.begin());
    }
  }
}

}  // namespace
}  // namespace herd
