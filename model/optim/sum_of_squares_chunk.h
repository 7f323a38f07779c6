// The gradient norm's fixed summation: partial sums of squares (in double)
// over chunks of kSumOfSquaresChunk consecutive elements, added in order.
// The CPU (model/optim's SumOfSquares) and the GPU (the norm kernel) cut the
// same chunks, so the norm depends neither on thread counts nor on the
// device, and chunk-aligned ranges' partial sums add up to the same total.
// CUDA-free and dependency-free: the kernels include it.
#pragma once

#include <cstdint>

namespace herd {

inline constexpr int64_t kSumOfSquaresChunk = 4096;

}  // namespace herd
