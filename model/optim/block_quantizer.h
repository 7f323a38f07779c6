// Block-scaled quantisation of pseudo-gradients for the wire between
// regions (cluster.diloco.wire_dtype INT8 and FP4). A run of n floats is
// cut into blocks (256 values for INT8, 64 for FP4; the last may be
// short); each block travels as its fp32 scale, amax/127 or amax/6,
// followed by its codes: int8 in [−127, 127], or e2m1 (±{0, 0.5, 1, 1.5,
// 2, 3, 4, 6}) two a byte, the lower nibble first. Rounding is to the
// nearest code, ties away from zero, so a block's bytes are a pure
// function of its values.
#pragma once

#include <cstdint>

#include <optional>

#include "common/config.h"
#include "common/status.h"

namespace herd {

enum class BlockCode { kInt8, kFp4 };

// The code of a wire dtype between regions; none for FP32 and BF16.
std::optional<BlockCode> BlockCodeOf(config::DilocoConfig::WireDtype wire);

// Values a block holds, and the bytes n values take.
int64_t BlockValues(BlockCode code);
int64_t QuantizedBytes(BlockCode code, int64_t n);
// The bytes n values of a pseudo-gradient take on `wire`: 4 or 2 a value
// for FP32 and BF16, the block codes' QuantizedBytes for the others.
int64_t ContributionBytes(config::DilocoConfig::WireDtype wire, int64_t n);

// Quantises x[0, n) into out[0, QuantizedBytes) and leaves in x what the
// codes lose (x − dequantised): error feedback's kept remainder. Fails on
// a value that is not finite, leaving x and out unspecified.
Status QuantizeKeepingError(float* x, int64_t n, BlockCode code, uint8_t* out);

// sum[i] += the dequantised value i of `in`, bytes that came from another
// process: a scale that is negative or not finite, or an int8 code of
// −128, fails with the block it is in, and adds nothing of that block or
// any later one.
Status AddDequantized(const uint8_t* in, int64_t n, BlockCode code, float* sum);

}  // namespace herd
