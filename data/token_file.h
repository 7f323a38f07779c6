// Pre-tokenised training data on disk, read through a read-only mmap.
//
// Formats: llm.c files (1024-byte header of 256 little-endian int32:
// magic 20240520 version 1 = uint16 tokens, magic 20240801 version 7 =
// uint32 tokens; header[2] = token count; the file is exactly header +
// tokens) and raw little-endian arrays named *.u16 / *.u32. Open()
// validates the header, the size and (when given a vocabulary size) every
// token id, so that nothing downstream ever sees an id the model cannot
// embed. Every error is one line that starts with the file's path.
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

  // vocab_size > 0: reject the first token id >= vocab_size (one pass over
  // the file). vocab_size == 0 skips that check, but ids must still fit
  // int32.
  static StatusOr<TokenFile> Open(const std::string& path, int vocab_size);

  // Movable, not copyable; the mapping is released by the destructor.
  TokenFile(TokenFile&& other) noexcept;
  TokenFile& operator=(TokenFile&& other) noexcept;
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;
  ~TokenFile();

  const std::string& path() const { return path_; }
  int64_t size() const { return size_; }  // number of tokens (>= 1)
  int width() const { return width_; }    // bytes per token on disk: 2 or 4
  // Token i; 0 <= i < size() is the caller's promise.
  int32_t operator[](int64_t i) const;
  // Copies tokens [begin, begin + count) as int32; the caller guarantees
  // 0 <= begin and begin + count <= size().
  void Read(int64_t begin, int64_t count, int32_t* out) const;

 private:
  TokenFile() = default;
  void Release();

  std::string path_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  const uint8_t* tokens_ = nullptr;
  int64_t size_ = 0;
  int width_ = 2;
};

// The exact bytes of a token file for `path`: a raw array when the path
// ends in .u16 / .u32 (every id must fit the width), else llm.c format
// (uint16/version 1 when every id < 65536, else uint32/version 7). Fails,
// naming `path`, on no tokens, a negative id or an id that does not fit.
StatusOr<std::string> EncodeTokenFile(const std::string& path, const std::vector<int32_t>& tokens);

// EncodeTokenFile, written atomically (temp name, fsync, rename): on error
// `path` keeps its old content or stays absent.
Status WriteTokenFile(const std::string& path, const std::vector<int32_t>& tokens);

}  // namespace herd
