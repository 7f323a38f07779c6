#include "model/optim/block_quantizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

namespace herd {
namespace {

// e2m1's magnitudes by code (the sign is bit 3), and the midpoints
// between neighbours: a magnitude at or above kFp4Up[k] rounds to code
// k + 1 or beyond.
constexpr float kFp4[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
constexpr float kFp4Up[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};

float MaxCode(BlockCode code) { return code == BlockCode::kInt8 ? 127.0f : 6.0f; }

int64_t CodeBytes(BlockCode code, int64_t m) { return code == BlockCode::kInt8 ? m : (m + 1) / 2; }

uint8_t Fp4Code(float v) {  // v: a value over the scale, |v| <= 6 to rounding
  const float a = std::abs(v);
  uint8_t k = 0;
  while (k < 7 && a >= kFp4Up[k]) ++k;
  return static_cast<uint8_t>(k | (v < 0 ? 8 : 0));
}

float Fp4Value(uint8_t code) { return (code & 8) != 0 ? -kFp4[code & 7] : kFp4[code & 7]; }

}  // namespace

std::optional<BlockCode> BlockCodeOf(config::DilocoConfig::WireDtype wire) {
  if (wire == config::DilocoConfig::INT8) return BlockCode::kInt8;
  if (wire == config::DilocoConfig::FP4) return BlockCode::kFp4;
  return std::nullopt;
}

int64_t BlockValues(BlockCode code) { return code == BlockCode::kInt8 ? 256 : 64; }

int64_t ContributionBytes(config::DilocoConfig::WireDtype wire, int64_t n) {
  if (const std::optional<BlockCode> code = BlockCodeOf(wire)) return n > 0 ? QuantizedBytes(*code, n) : 0;
  return n * (wire == config::DilocoConfig::BF16 ? 2 : 4);
}

int64_t QuantizedBytes(BlockCode code, int64_t n) {
  const int64_t b = BlockValues(code), full = n / b, tail = n % b;
  return full * (4 + CodeBytes(code, b)) + (tail > 0 ? 4 + CodeBytes(code, tail) : 0);
}

Status QuantizeKeepingError(float* x, int64_t n, BlockCode code, uint8_t* out) {
  const int64_t b = BlockValues(code);
  for (int64_t first = 0; first < n; first += b) {
    const int64_t m = std::min(b, n - first);
    float* v = x + first;
    float amax = 0.0f;
    for (int64_t i = 0; i < m; ++i) amax = std::max(amax, std::abs(v[i]));
    if (!std::isfinite(amax)) {
      return Status::InvalidArgument("a pseudo-gradient value at " + std::to_string(first) +
                                     "..+" + std::to_string(m) + " is not finite");
    }
    const float scale = amax / MaxCode(code);
    std::memcpy(out, &scale, 4);
    uint8_t* codes = out + 4;
    std::memset(codes, 0, CodeBytes(code, m));
    if (scale > 0.0f) {
      for (int64_t i = 0; i < m; ++i) {
        float kept;
        if (code == BlockCode::kInt8) {
          const float q = std::clamp(std::round(v[i] / scale), -127.0f, 127.0f);
          codes[i] = static_cast<uint8_t>(static_cast<int8_t>(q));
          kept = q * scale;
        } else {
          const uint8_t c = Fp4Code(v[i] / scale);
          codes[i / 2] |= static_cast<uint8_t>(c << (4 * (i % 2)));
          kept = Fp4Value(c) * scale;
        }
        v[i] -= kept;
      }
    }
    out += 4 + CodeBytes(code, m);
  }
  return Status::OK();
}

Status AddDequantized(const uint8_t* in, int64_t n, BlockCode code, float* sum) {
  const int64_t b = BlockValues(code);
  for (int64_t first = 0; first < n; first += b) {
    const int64_t m = std::min(b, n - first);
    float scale;
    std::memcpy(&scale, in, 4);
    const uint8_t* codes = in + 4;
    const std::string at = "block " + std::to_string(first / b) + " (values " + std::to_string(first) + "..+" +
                           std::to_string(m) + ")";
    if (!std::isfinite(scale) || scale < 0.0f) {
      return Status::Corruption(at + " has the scale " + std::to_string(scale) + ": not a finite value >= 0");
    }
    if (code == BlockCode::kInt8) {
      for (int64_t i = 0; i < m; ++i) {
        if (codes[i] == 0x80) return Status::Corruption(at + " holds the int8 code -128, outside [-127, 127]");
      }
      for (int64_t i = 0; i < m; ++i) sum[first + i] += static_cast<float>(static_cast<int8_t>(codes[i])) * scale;
    } else {
      for (int64_t i = 0; i < m; ++i) sum[first + i] += Fp4Value((codes[i / 2] >> (4 * (i % 2))) & 15) * scale;
    }
    in += 4 + CodeBytes(code, m);
  }
  return Status::OK();
}

}  // namespace herd
