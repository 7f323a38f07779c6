// How the workers' contributions to one bucket become its sum, and the
// sum's part of the gradient norm, each in one pass over the bucket's
// memory: a contribution is added in (fp32, or bf16 widened as it is
// read) chunk by chunk, and when it is the last, each chunk's sum of
// squares is taken while the chunk is still in cache.
//
// The sums are the server's fixed order (contributions added one after
// the other in share order, each element in float), and the sum of
// squares over a range has SumOfSquares' bits (model/optim/adamw.h: the
// same chunks, the same in-chunk order), so a fused pass changes no bit of
// a run. Vectorised per CPU (common/cpu_dispatch.h) and split over the
// OpenMP threads.
#pragma once

#include <cstdint>
#include <vector>

#include "model/param_layout.h"

namespace herd {

// One contribution and where the sum stands.
struct ShareInput {
  const void* data = nullptr;  // n values: floats, or bf16 with `bf16`
  bool bf16 = false;
  // bf16: the sum so far is `first_bf16` (the bucket's first
  // contribution, landed where it stays) rather than `sum`; null: it is
  // `sum`, or nothing with `first`.
  const uint16_t* first_bf16 = nullptr;
  bool first = false;  // the bucket's first contribution: it starts the sum
};

// sum[0, n) = (the sum so far) + in, in place. With `counted` (ranges
// relative to `sum`, ascending, within [0, n)) it returns the new sum's
// squared norm over them: per range SumOfSquares' value, the ranges'
// values added in order; 0 without.
double AddShare(float* sum, const ShareInput& in, int64_t n, const std::vector<ParamRange>* counted);

// The squared norm over `counted` (relative to x, as above) of a sum that
// is one bf16 contribution as it landed.
double SumOfSquaresOverBf16(const uint16_t* x, const std::vector<ParamRange>& counted);

}  // namespace herd
