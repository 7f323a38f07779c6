// libFuzzer target for the control-message decoder (transport/wire.h): the
// only code that turns bytes from the network into control messages.
// Feeds the input (1) as one frame body and (2) as a byte stream cut into
// chunks, and checks that whatever decodes is valid and survives a
// re-encode/decode round trip unchanged. Built with clang when available;
// tests/CMakeLists.txt runs it for 60 s.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "transport/wire.h"

namespace {

void CheckRoundTrip(const herd::wire::Envelope& message) {
  if (!herd::transport::ValidateMessage(message).ok()) std::abort();  // decoded ⇒ valid
  const std::string frame = herd::transport::EncodeFrame(message);
  herd::transport::FrameReader reader(1u << 20);
  if (!reader.Append(frame.data(), frame.size()).ok()) std::abort();
  herd::wire::Envelope again;
  herd::Status st;
  if (!reader.Next(&again, &st) || !st.ok()) std::abort();
  if (again.SerializeAsString() != message.SerializeAsString()) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  herd::wire::Envelope message;
  if (herd::transport::DecodeBody(std::string_view(reinterpret_cast<const char*>(data), size), &message).ok()) {
    CheckRoundTrip(message);
  }
  if (size == 0) return 0;
  // As a stream: chunk sizes from the first byte, a small bound so that
  // oversized headers are exercised too.
  const size_t chunk = data[0] % 61 + 1;
  herd::transport::FrameReader reader(4096);
  for (size_t at = 1; at < size; at += chunk) {
    const size_t n = std::min(chunk, size - at);
    if (!reader.Append(data + at, n).ok()) break;
    herd::Status st;
    while (reader.Next(&message, &st)) CheckRoundTrip(message);
    if (!st.ok()) break;
  }
  return 0;
}
