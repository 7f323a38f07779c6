#include "data/token_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstring>

#include "common/file_util.h"

namespace herd {
namespace {

// The formats are little-endian and tokens are read with memcpy.
static_assert(std::endian::native == std::endian::little, "token files are read as little-endian");

bool IsRaw16(const std::string& path) { return path.ends_with(".u16"); }
bool IsRaw32(const std::string& path) { return path.ends_with(".u32"); }

// A text file handed over as a token file is the likeliest mistake; say so.
std::string TextHint(const uint8_t* base, int64_t bytes) {
  if (bytes < 4) return "";
  for (int i = 0; i < 4; ++i) {
    const uint8_t c = base[i];
    if (!(c == '\n' || c == '\t' || c == '\r' || (c >= 0x20 && c < 0x7f))) return "";
  }
  return "; it looks like text: make a token file with `herd prepare`";
}

// Index of the first id >= limit, or -1.
template <typename T>
int64_t FirstAtOrAbove(const uint8_t* data, int64_t n, uint64_t limit) {
  for (int64_t i = 0; i < n; ++i) {
    T v;
    std::memcpy(&v, data + i * sizeof(T), sizeof(T));
    if (v >= limit) return i;
  }
  return -1;
}

template <typename T>
void Widen(const uint8_t* data, int64_t count, int32_t* out) {
  for (int64_t i = 0; i < count; ++i) {
    T v;
    std::memcpy(&v, data + i * sizeof(T), sizeof(T));
    out[i] = static_cast<int32_t>(v);
  }
}

}  // namespace

StatusOr<TokenFile> TokenFile::Open(const std::string& path, int vocab_size) {
  TokenFile f;
  f.path_ = path;
  HERD_RETURN_IF_ERROR(f.Map());
  HERD_RETURN_IF_ERROR(IsRaw16(path) || IsRaw32(path) ? f.FindRawTokens() : f.FindLlmcTokens());
  HERD_RETURN_IF_ERROR(f.CheckIds(vocab_size));
  return f;
}

Status TokenFile::Map() {
  const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return Status::NotFound(path_ + ": no such file");
    return Status::IOError(path_ + ": cannot open: " + std::strerror(errno));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return Status::InvalidArgument(path_ + ": not a regular file (expected a token file)");
  }
  const int64_t bytes = st.st_size;
  if (bytes > 0) {
    void* map = ::mmap(nullptr, static_cast<size_t>(bytes), PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return Status::IOError(path_ + ": cannot map: " + std::strerror(err));
    }
    map_ = map;
    map_bytes_ = static_cast<size_t>(bytes);
  }
  ::close(fd);
  return Status::OK();
}

Status TokenFile::FindRawTokens() {
  const int64_t bytes = static_cast<int64_t>(map_bytes_);
  width_ = IsRaw16(path_) ? 2 : 4;
  const char* type = width_ == 2 ? "uint16" : "uint32";
  if (bytes == 0) return Status::InvalidArgument(path_ + ": empty token file (expected " + type + " tokens)");
  if (bytes % width_ != 0) {
    return Status::InvalidArgument(path_ + ": " + std::to_string(bytes) + " bytes is not a whole number of " + type +
                                   " tokens (truncated?)");
  }
  tokens_ = static_cast<const uint8_t*>(map_);
  size_ = bytes / width_;
  return Status::OK();
}

Status TokenFile::FindLlmcTokens() {
  const int64_t bytes = static_cast<int64_t>(map_bytes_);
  const auto* base = static_cast<const uint8_t*>(map_);
  if (bytes < kHeaderBytes) {
    return Status::InvalidArgument(path_ + ": " + std::to_string(bytes) +
                                   " bytes is shorter than the 1024-byte header of a token file" +
                                   TextHint(base, bytes));
  }
  int32_t header[4];
  std::memcpy(header, base, sizeof(header));
  vocab_size_ = std::max(header[3], 0);
  if (header[0] == kMagicU16) {
    if (header[1] != kVersionU16) {
      return Status::InvalidArgument(path_ + ": magic 20240520 (uint16 tokens) needs version 1, got version " +
                                     std::to_string(header[1]));
    }
    width_ = 2;
  } else if (header[0] == kMagicU32) {
    if (header[1] != kVersionU32) {
      return Status::InvalidArgument(path_ + ": magic 20240801 (uint32 tokens) needs version 7, got version " +
                                     std::to_string(header[1]));
    }
    width_ = 4;
  } else {
    return Status::InvalidArgument(path_ + ": not a token file: magic " + std::to_string(header[0]) +
                                   ", expected 20240520 or 20240801 (raw arrays must be named *.u16 or *.u32)" +
                                   TextHint(base, bytes));
  }
  const int64_t count = header[2];
  if (count <= 0) {
    return Status::InvalidArgument(path_ + ": header says " + std::to_string(count) +
                                   " tokens; a token file holds at least one");
  }
  const int64_t expected = kHeaderBytes + count * width_;
  if (expected != bytes) {
    return Status::InvalidArgument(path_ + ": header says " + std::to_string(count) + " tokens (" +
                                   std::to_string(expected) + " bytes) but the file has " + std::to_string(bytes) +
                                   " bytes");
  }
  tokens_ = base + kHeaderBytes;
  size_ = count;
  return Status::OK();
}

Status TokenFile::CheckIds(int vocab_size) const {
  if (vocab_size > 0 && vocab_size_ > vocab_size) {
    return Status::InvalidArgument(path_ + ": prepared for a vocabulary of " + std::to_string(vocab_size_) +
                                   " tokens (its header says), more than vocab_size " + std::to_string(vocab_size) +
                                   ": set model.vocab_size to at least " + std::to_string(vocab_size_));
  }
  // Every id must fit int32 (herd indexes with int32) and the vocabulary.
  const uint64_t limit = vocab_size > 0 ? static_cast<uint64_t>(vocab_size) : uint64_t{1} << 31;
  const int64_t bad = width_ == 2 ? (limit >= 65536 ? -1 : FirstAtOrAbove<uint16_t>(tokens_, size_, limit))
                                  : FirstAtOrAbove<uint32_t>(tokens_, size_, limit);
  if (bad >= 0) {
    uint32_t id = 0;
    std::memcpy(&id, tokens_ + bad * width_, width_);  // little-endian: the low bytes
    return Status::InvalidArgument(
        path_ + ": token " + std::to_string(id) + " at position " + std::to_string(bad) + " is >= " +
        (vocab_size > 0 ? "vocab_size " + std::to_string(vocab_size) : std::string("2^31 (does not fit int32)")));
  }
  return Status::OK();
}

TokenFile::TokenFile(TokenFile&& o) noexcept { *this = std::move(o); }

TokenFile& TokenFile::operator=(TokenFile&& o) noexcept {
  if (this != &o) {
    Release();
    path_ = std::move(o.path_);
    map_ = o.map_;
    map_bytes_ = o.map_bytes_;
    tokens_ = o.tokens_;
    size_ = o.size_;
    width_ = o.width_;
    vocab_size_ = o.vocab_size_;
    o.map_ = nullptr;
    o.map_bytes_ = 0;
    o.tokens_ = nullptr;
    o.size_ = 0;
  }
  return *this;
}

TokenFile::~TokenFile() { Release(); }

void TokenFile::Release() {
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
  map_ = nullptr;
  map_bytes_ = 0;
}

int32_t TokenFile::operator[](int64_t i) const {
  if (width_ == 2) {
    uint16_t v;
    std::memcpy(&v, tokens_ + 2 * i, 2);
    return v;
  }
  uint32_t v;
  std::memcpy(&v, tokens_ + 4 * i, 4);
  return static_cast<int32_t>(v);
}

void TokenFile::Read(int64_t begin, int64_t count, int32_t* out) const {
  if (width_ == 2) {
    Widen<uint16_t>(tokens_ + 2 * begin, count, out);
  } else {
    Widen<uint32_t>(tokens_ + 4 * begin, count, out);
  }
}

Status TokenFileWriter::Open(const std::string& path, int32_t max_id, int vocab_size) {
  path_ = path;
  max_id_ = max_id;
  count_ = 0;
  buffer_.clear();
  raw_ = IsRaw16(path) || IsRaw32(path);
  width_ = IsRaw16(path) ? 2 : IsRaw32(path) ? 4 : (max_id < 65536 ? 2 : 4);
  if (width_ == 2 && max_id >= 65536) {
    return Status::InvalidArgument(path + ": token id " + std::to_string(max_id) +
                                   " does not fit uint16 (name the file *.u32 or *.bin)");
  }
  HERD_RETURN_IF_ERROR(file_.Open(path));
  if (!raw_) {
    int32_t header[TokenFile::kHeaderBytes / 4] = {};
    header[0] = width_ == 2 ? TokenFile::kMagicU16 : TokenFile::kMagicU32;
    header[1] = width_ == 2 ? TokenFile::kVersionU16 : TokenFile::kVersionU32;
    header[3] = vocab_size;
    HERD_RETURN_IF_ERROR(file_.Append(header, sizeof(header)));
  }
  return Status::OK();
}

Status TokenFileWriter::Append(const int32_t* ids, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    const int32_t t = ids[i];
    if (t < 0 || t > max_id_) {
      file_.Abandon();
      return Status::InvalidArgument(path_ + ": " + (t < 0 ? "negative token id " : "token id ") + std::to_string(t) +
                                     " at position " + std::to_string(count_ + static_cast<int64_t>(i)) +
                                     (t < 0 ? "" : " is beyond the largest expected, " + std::to_string(max_id_)));
    }
    if (width_ == 2) {
      const uint16_t v = static_cast<uint16_t>(t);
      buffer_.append(reinterpret_cast<const char*>(&v), 2);
    } else {
      const uint32_t v = static_cast<uint32_t>(t);
      buffer_.append(reinterpret_cast<const char*>(&v), 4);
    }
  }
  count_ += static_cast<int64_t>(count);
  if (!raw_ && count_ > INT32_MAX) {
    file_.Abandon();
    return Status::InvalidArgument(path_ + ": more than 2^31 - 1 tokens, the most one llm.c file can count");
  }
  return buffer_.size() >= (1 << 20) ? Flush() : Status::OK();
}

Status TokenFileWriter::Flush() {
  Status st = file_.Append(buffer_);
  buffer_.clear();
  return st;
}

Status TokenFileWriter::Commit() {
  HERD_RETURN_IF_ERROR(Flush());
  if (count_ == 0) {
    file_.Abandon();
    return Status::InvalidArgument(path_ + ": no tokens to write");
  }
  if (!raw_) {
    const int32_t count = static_cast<int32_t>(count_);
    HERD_RETURN_IF_ERROR(file_.WriteAt(2 * sizeof(int32_t), &count, sizeof(count)));
  }
  return file_.Commit();
}

Status WriteTokenFile(const std::string& path, const std::vector<int32_t>& tokens) {
  if (tokens.empty()) return Status::InvalidArgument(path + ": no tokens to write");
  int32_t max_id = 0;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0) {
      return Status::InvalidArgument(path + ": negative token id " + std::to_string(tokens[i]) + " at position " +
                                     std::to_string(i));
    }
    max_id = std::max(max_id, tokens[i]);
  }
  TokenFileWriter writer;
  HERD_RETURN_IF_ERROR(writer.Open(path, max_id));
  HERD_RETURN_IF_ERROR(writer.Append(tokens.data(), tokens.size()));
  return writer.Commit();
}

}  // namespace herd
