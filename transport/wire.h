// Control-message framing: a 4-byte little-endian length, then one
// serialized wire::Envelope. This is the only code that turns bytes from the
// network into control messages; everything it returns has been bounded,
// parsed and validated (fields within their limits), so the coordinator and
// its clients never see a malformed message. Fuzzed by tests/fuzz/wire_fuzz.cc.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"
#include "proto/wire.pb.h"

namespace herd::transport {

inline constexpr size_t kFrameHeaderBytes = 4;
// Limits on single fields, whatever the message bound.
inline constexpr size_t kMaxTokenBytes = 4096;
inline constexpr size_t kMaxHostBytes = 255;
inline constexpr size_t kMaxNameBytes = 256;
inline constexpr size_t kMaxUcxAddressBytes = 64 * 1024;
inline constexpr size_t kMaxReasonBytes = 4096;
inline constexpr int32_t kMaxRank = 1 << 20;

// Length prefix + body for `message`.
std::string EncodeFrame(const wire::Envelope& message);

// The body length announced by a 4-byte header; Corruption when it exceeds
// `max_body_bytes` (the caller closes the connection without reading it).
StatusOr<uint32_t> DecodeFrameLength(const uint8_t header[kFrameHeaderBytes], size_t max_body_bytes);

// Parses and validates one body.
Status DecodeBody(std::string_view body, wire::Envelope* message);

// Checks every field of a parsed message against its limits: a body set,
// roles and scopes known, ranks and sizes in range, names non-empty.
Status ValidateMessage(const wire::Envelope& message);

// Incremental decoder for a byte stream (what a socket delivers): append
// bytes, then take complete messages. After an error it stays failed.
class FrameReader {
 public:
  explicit FrameReader(size_t max_body_bytes) : max_body_bytes_(max_body_bytes) {}
  // Appends bytes; returns an error when a header announces too much.
  Status Append(const void* data, size_t size);
  // True and fills `message` when a whole frame is buffered; on a bad body
  // returns the error through `status`.
  bool Next(wire::Envelope* message, Status* status);
  size_t buffered() const { return buffer_.size() - consumed_; }
  // Raises or lowers the bound for frames not yet taken (e.g. once a peer
  // has authenticated).
  void set_max_body_bytes(size_t n) { max_body_bytes_ = n; }

 private:
  size_t max_body_bytes_;
  std::string buffer_;
  size_t consumed_ = 0;
  Status failed_;
};

// "worker rank 2", "server rank 0", "worker (rank unassigned)".
std::string DescribeRole(wire::Role role, int32_t rank);

}  // namespace herd::transport
