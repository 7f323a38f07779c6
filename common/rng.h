// Deterministic random numbers: the same seed gives the same stream on every
// machine and compiler (no std:: distributions, whose output is
// implementation-defined).
#pragma once

#include <cmath>
#include <cstdint>
#include <string_view>

namespace herd {

// FNV-1a, 64-bit: stable hash of names for seeding.
inline uint64_t HashName(std::string_view s, uint64_t h = 1469598103934665603ull) {
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// SplitMix64 scrambling of a 64-bit value.
inline uint64_t Mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// xoshiro256** seeded through SplitMix64.
class Rng {
 public:
  explicit Rng(uint64_t seed) {
    for (uint64_t& s : s_) s = Mix64(seed += 0x9e3779b97f4a7c15ull);
  }
  uint64_t Next() {
    uint64_t result = Rotl(s_[1] * 5, 7) * 9;
    uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = Rotl(s_[3], 45);
    return result;
  }
  // Uniform in [0, 1) with 53 random bits.
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }
  // Uniform integer in [0, n), without modulo bias.
  uint64_t Below(uint64_t n) {
    uint64_t limit = -n % n;  // 2^64 mod n
    for (;;) {
      uint64_t x = Next();
      if (x >= limit) return x % n;
    }
  }
  // Standard normal (Box-Muller; one value per call, the pair's sine half dropped
  // so the stream position depends only on the call count).
  double Normal() {
    double u1 = 1.0 - Uniform();  // (0, 1]
    double u2 = Uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

 private:
  static uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

}  // namespace herd
