// SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104): what derives the data
// plane's per-job key from the job token, so that the token itself never
// travels on the data plane and the key reveals nothing of it.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace herd {

using Sha256Digest = std::array<uint8_t, 32>;

Sha256Digest Sha256(std::string_view data);
Sha256Digest HmacSha256(std::string_view key, std::string_view message);

}  // namespace herd
