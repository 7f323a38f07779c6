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

#include "common/file_util.h"
#include "common/status.h"

namespace herd {

class TokenFile {
 public:
  static constexpr int32_t kMagicU16 = 20240520, kVersionU16 = 1;
  static constexpr int32_t kMagicU32 = 20240801, kVersionU32 = 7;
  static constexpr int64_t kHeaderBytes = 1024;

  // vocab_size > 0: reject a file prepared for a larger vocabulary (its
  // header says so), and the first token id >= vocab_size (one pass over
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
  // The vocabulary the file was prepared for, from an llm.c header that
  // records it (TokenFileWriter); 0 when not known.
  int vocab_size() const { return vocab_size_; }
  // Token i; 0 <= i < size() is the caller's promise.
  int32_t operator[](int64_t i) const;
  // Copies tokens [begin, begin + count) as int32; the caller guarantees
  // 0 <= begin and begin + count <= size().
  void Read(int64_t begin, int64_t count, int32_t* out) const;

 private:
  TokenFile() = default;
  // Open's steps, each failing with the one-line error the header promises.
  Status Map();             // maps path_ whole (an empty file maps nothing)
  Status FindRawTokens();   // *.u16 / *.u32: the whole file is tokens
  Status FindLlmcTokens();  // checks the llm.c header against the file's size
  Status CheckIds(int vocab_size) const;
  void Release();

  std::string path_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  const uint8_t* tokens_ = nullptr;
  int64_t size_ = 0;
  int width_ = 2;
  int vocab_size_ = 0;
};

// Writes a token file as its tokens arrive, atomically (temporary name,
// fsync, rename on Commit; nothing is left behind otherwise). The format
// comes from the path: a raw array for *.u16 / *.u32, else an llm.c file,
// uint16 (version 1) when max_id < 65536 and uint32 (version 7) otherwise,
// whose header also records vocab_size (header[3], which llm.c does not
// read; 0: not known). Every error names the path.
class TokenFileWriter {
 public:
  // max_id: the largest id that will be appended.
  Status Open(const std::string& path, int32_t max_id, int vocab_size = 0);
  // Fails on an id outside [0, max_id].
  Status Append(const int32_t* ids, size_t count);
  // Fills in the header's count; fails on a file without tokens.
  Status Commit();
  int64_t tokens() const { return count_; }

 private:
  Status Flush();

  std::string path_;
  AtomicFile file_;
  bool raw_ = false;
  int width_ = 2;
  int32_t max_id_ = 0;
  int64_t count_ = 0;
  std::string buffer_;
};

// TokenFileWriter for tokens already in memory.
Status WriteTokenFile(const std::string& path, const std::vector<int32_t>& tokens);

}  // namespace herd
