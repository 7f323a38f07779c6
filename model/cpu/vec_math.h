// Elementary functions that the compiler can vectorise. glibc's expf only
// vectorises under -ffast-math, which would also let the compiler reorder
// every sum in the project; this exp keeps IEEE semantics elsewhere.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace herd::cpu {

// exp(x) in float: range reduction x = n ln2 + r (|r| <= ln2/2, ln2 split in
// two for an exact n ln2), a degree-7 Taylor polynomial for e^r (truncation
// < 6e-9, below float epsilon), then the exponent bits. Relative error
// about 1 ulp; exp underflows to 0 below -87.3 and is clamped at 88.7.
inline float ExpFloat(float x) {
  x = x < -87.33654f ? -87.33654f : x;
  x = x > 88.72283f ? 88.72283f : x;
  // Round x/ln2 to the nearest integer with the 1.5 * 2^23 trick: adding it
  // leaves the integer in the low mantissa bits (no call to floor, so the
  // loop vectorises).
  const float shifted = x * 1.44269504088896341f + 12582912.0f;
  const float n = shifted - 12582912.0f;
  int32_t ni;
  std::memcpy(&ni, &shifted, sizeof(ni));
  ni -= 0x4B400000;                // the integer n, as int
  float r = x - n * 0.693359375f;  // ln2 high part, exact in n * hi
  r = r - n * -2.12194440e-4f;     // ln2 low part
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  // 2^n as two float factors (n in [-126, 128]; 2^128 alone would overflow).
  const int32_t half = ni >> 1;
  const int32_t b1 = (half + 127) << 23, b2 = (ni - half + 127) << 23;
  float s1, s2;
  std::memcpy(&s1, &b1, sizeof(float));
  std::memcpy(&s2, &b2, sizeof(float));
  return p * s1 * s2;
}

inline float Exp(float x) { return ExpFloat(x); }
inline double Exp(double x) { return std::exp(x); }

}  // namespace herd::cpu
