// Pre-tokenised training data on disk, read through a read-only mmap.
//
// Formats: llm.c files (1024-byte header of 256 little-endian int32:
// magic 20240520 version 1 = uint16 tokens, magic 20240801 version 7 =
// uint32 tokens; header[2] = token count; the file is exactly header +
// tokens) and raw arrays named *.u16 / *.u32. Open() validates the header,
// the size and (when given a vocabulary size) every token id, so that
// nothing downstream ever sees an id the model cannot embed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace herd {

class TokenFile {
 public:
  static constexpr int32_t kMagicU16 = 20240520, kVersionU16 = 1;
  static constexpr int32_t kMagicU32 = 20240801, kVersionU32 = 7;
  static constexpr int64_t kHeaderBytes = 1024;

  // vocab_size > 0: reject the first token id >= vocab_size.
  static StatusOr<TokenFile> Open(const std::string& path, int vocab_size);

  TokenFile(TokenFile&& other) noexcept;
  TokenFile& operator=(TokenFile&& other) noexcept;
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;
  ~TokenFile();

  const std::string& path() const { return path_; }
  int64_t size() const { return size_; }  // number of tokens
  int width() const { return width_; }    // bytes per token: 2 or 4
  int32_t operator[](int64_t i) const;
  // Copies tokens [begin, begin + count) as int32; the range must be valid.
  void Read(int64_t begin, int64_t count, int32_t* out) const;

 private:
  TokenFile() = default;
  uint32_t RawAt(int64_t i) const;
  std::string path_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  const uint8_t* tokens_ = nullptr;
  int64_t size_ = 0;
  int width_ = 2;
};

// Writes tokens atomically: raw when the path ends in .u16 / .u32 (ids must
// fit), else llm.c format (uint16/version 1 when every id < 65536, else
// uint32/version 7).
Status WriteTokenFile(const std::string& path, const std::vector<int32_t>& tokens);

}  // namespace herd
