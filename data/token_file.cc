#include "data/token_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/file_util.h"

namespace herd {
namespace {

bool EndsWith(const std::string& s, const char* suffix) { return s.ends_with(suffix); }

}  // namespace

StatusOr<TokenFile> TokenFile::Open(const std::string& path, int vocab_size) {
  TokenFile f;
  f.path_ = path;
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) {
    if (errno == ENOENT) return Status::NotFound(path + ": no such file");
    return Status::IOError(path + ": cannot open: " + std::strerror(errno));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return Status::InvalidArgument(path + ": not a regular file");
  }
  const int64_t bytes = st.st_size;
  if (bytes > 0) {
    f.map_ = ::mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
    if (f.map_ == MAP_FAILED) {
      f.map_ = nullptr;
      ::close(fd);
      return Status::IOError(path + ": cannot map: " + std::strerror(errno));
    }
    f.map_bytes_ = bytes;
  }
  ::close(fd);
  const auto* base = static_cast<const uint8_t*>(f.map_);

  const bool raw16 = EndsWith(path, ".u16"), raw32 = EndsWith(path, ".u32");
  if (raw16 || raw32) {
    f.width_ = raw16 ? 2 : 4;
    if (bytes == 0) return Status::InvalidArgument(path + ": empty token file");
    if (bytes % f.width_ != 0) {
      return Status::InvalidArgument(path + ": " + std::to_string(bytes) + " bytes is not a whole number of " +
                                     (raw16 ? "uint16" : "uint32") + " tokens (truncated?)");
    }
    f.tokens_ = base;
    f.size_ = bytes / f.width_;
  } else {
    if (bytes < kHeaderBytes) {
      return Status::InvalidArgument(path + ": " + std::to_string(bytes) +
                                     " bytes is shorter than the 1024-byte header of a token file");
    }
    int32_t header[3];
    std::memcpy(header, base, sizeof(header));
    if (header[0] == kMagicU16) {
      if (header[1] != kVersionU16) {
        return Status::InvalidArgument(path + ": magic 20240520 needs version 1, got " + std::to_string(header[1]));
      }
      f.width_ = 2;
    } else if (header[0] == kMagicU32) {
      if (header[1] != kVersionU32) {
        return Status::InvalidArgument(path + ": magic 20240801 needs version 7, got " + std::to_string(header[1]));
      }
      f.width_ = 4;
    } else {
      return Status::InvalidArgument(path + ": not a token file: magic " + std::to_string(header[0]) +
                                     " (expected 20240520 or 20240801; raw arrays must be named *.u16 or *.u32)");
    }
    const int64_t count = header[2];
    const int64_t expected = kHeaderBytes + count * f.width_;
    if (count <= 0 || expected != bytes) {
      return Status::InvalidArgument(path + ": header says " + std::to_string(count) + " tokens (" +
                                     std::to_string(expected) + " bytes) but the file has " + std::to_string(bytes) +
                                     " bytes");
    }
    f.tokens_ = base + kHeaderBytes;
    f.size_ = count;
  }
  // Ids must fit int32 (all of herd indexes with int32) and the vocabulary.
  const int64_t limit = vocab_size > 0 ? vocab_size : (f.width_ == 4 ? int64_t{1} << 31 : 0);
  if (limit > 0) {
    for (int64_t i = 0; i < f.size_; ++i) {
      const int64_t id = f.RawAt(i);
      if (id >= limit) {
        return Status::InvalidArgument(path + ": token " + std::to_string(id) + " at position " + std::to_string(i) +
                                       " is >= " + (vocab_size > 0 ? "vocab_size " + std::to_string(vocab_size)
                                                                    : std::string("2^31")));
      }
    }
  }
  return f;
}

TokenFile::TokenFile(TokenFile&& o) noexcept { *this = std::move(o); }

TokenFile& TokenFile::operator=(TokenFile&& o) noexcept {
  if (this != &o) {
    if (map_ != nullptr) ::munmap(map_, map_bytes_);
    path_ = std::move(o.path_);
    map_ = o.map_;
    map_bytes_ = o.map_bytes_;
    tokens_ = o.tokens_;
    size_ = o.size_;
    width_ = o.width_;
    o.map_ = nullptr;
    o.tokens_ = nullptr;
    o.size_ = 0;
  }
  return *this;
}

TokenFile::~TokenFile() {
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
}

uint32_t TokenFile::RawAt(int64_t i) const {
  if (width_ == 2) {
    uint16_t v;
    std::memcpy(&v, tokens_ + 2 * i, 2);
    return v;
  }
  uint32_t v;
  std::memcpy(&v, tokens_ + 4 * i, 4);
  return v;
}

int32_t TokenFile::operator[](int64_t i) const { return static_cast<int32_t>(RawAt(i)); }

void TokenFile::Read(int64_t begin, int64_t count, int32_t* out) const {
  for (int64_t i = 0; i < count; ++i) out[i] = (*this)[begin + i];
}

Status WriteTokenFile(const std::string& path, const std::vector<int32_t>& tokens) {
  int32_t max_id = 0;
  for (int32_t t : tokens) {
    if (t < 0) return Status::InvalidArgument(path + ": negative token id " + std::to_string(t));
    max_id = std::max(max_id, t);
  }
  const bool raw16 = path.ends_with(".u16"), raw32 = path.ends_with(".u32");
  const int width = raw16 ? 2 : raw32 ? 4 : (max_id < 65536 ? 2 : 4);
  if (raw16 && max_id >= 65536) return Status::InvalidArgument(path + ": token id " + std::to_string(max_id) + " does not fit uint16");
  std::string data;
  if (!raw16 && !raw32) {
    if (tokens.size() > 0x7fffffff) return Status::InvalidArgument(path + ": too many tokens for one llm.c file");
    int32_t header[256] = {};
    header[0] = width == 2 ? TokenFile::kMagicU16 : TokenFile::kMagicU32;
    header[1] = width == 2 ? TokenFile::kVersionU16 : TokenFile::kVersionU32;
    header[2] = static_cast<int32_t>(tokens.size());
    data.append(reinterpret_cast<const char*>(header), sizeof(header));
  }
  data.reserve(data.size() + tokens.size() * width);
  for (int32_t t : tokens) {
    if (width == 2) {
      uint16_t v = static_cast<uint16_t>(t);
      data.append(reinterpret_cast<const char*>(&v), 2);
    } else {
      uint32_t v = static_cast<uint32_t>(t);
      data.append(reinterpret_cast<const char*>(&v), 4);
    }
  }
  return WriteFileAtomic(path, data);
}

}  // namespace herd
