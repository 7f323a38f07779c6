#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "common/bf16.h"
#include "common/file_util.h"

namespace herd {

// The format is little-endian and we read/write fp32 data by memcpy.
static_assert(std::endian::native == std::endian::little, "herd assumes a little-endian host");

namespace {

using json = nlohmann::json;

// The reference implementation refuses headers above 100 MB; so do we (a
// header is names and shapes, never that large for a real model).
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;
constexpr char kMetadataKey[] = "__metadata__";

// Element size of every dtype the format defines; 0 = unknown.
size_t DTypeSize(const std::string& dtype) {
  static const std::map<std::string, size_t, std::less<>> kSizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"I16", 2}, {"U16", 2},  {"F16", 2},
      {"BF16", 2}, {"I32", 4}, {"U32", 4}, {"F32", 4},     {"F64", 8},     {"I64", 8}, {"U64", 8},
  };
  auto it = kSizes.find(dtype);
  return it == kSizes.end() ? 0 : it->second;
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// A non-negative JSON integer (nlohmann parses those as unsigned).
bool GetUnsigned(const json& j, uint64_t* out) {
  if (!j.is_number_unsigned()) return false;
  *out = j.get<uint64_t>();
  return true;
}

// pread until `size` bytes are read; the error names the file.
Status PreadFully(int fd, const std::string& path, void* buf, size_t size, uint64_t offset) {
  auto* p = static_cast<char*>(buf);
  while (size > 0) {
    ssize_t n = ::pread(fd, p, size, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::IOError(path + ": read failed: " + std::strerror(errno));
    }
    if (n == 0) return Status::Corruption(path + ": unexpected end of file (was it truncated while being read?)");
    p += n;
    size -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return Status::OK();
}

// Parses one tensor entry of the header; `data_size` bounds its offsets.
Status ParseEntry(const std::string& path, const std::string& name, const json& e, uint64_t data_size,
                  SafetensorsTensor* t) {
  const std::string where = path + ": tensor '" + name + "': ";
  if (!e.is_object()) return Status::Corruption(where + "header entry is not a JSON object");
  auto dtype = e.find("dtype");
  auto shape = e.find("shape");
  auto offsets = e.find("data_offsets");
  if (dtype == e.end() || !dtype->is_string()) return Status::Corruption(where + "needs a string \"dtype\"");
  if (shape == e.end() || !shape->is_array()) return Status::Corruption(where + "needs an array \"shape\"");
  if (offsets == e.end() || !offsets->is_array() || offsets->size() != 2) {
    return Status::Corruption(where + "needs \"data_offsets\": [begin, end]");
  }
  t->name = name;
  t->dtype = dtype->get<std::string>();
  const size_t elem = DTypeSize(t->dtype);
  if (elem == 0) return Status::Corruption(where + "unknown dtype '" + t->dtype + "'");

  // numel and byte size, with overflow checks: the product is bounded by
  // the data region, so anything beyond it is corrupt anyway.
  uint64_t numel = 1;
  for (const json& d : *shape) {
    uint64_t dim;
    if (!GetUnsigned(d, &dim) || dim > static_cast<uint64_t>(INT64_MAX)) {
      return Status::Corruption(where + "shape " + shape->dump() + " must hold non-negative integers");
    }
    t->shape.push_back(static_cast<int64_t>(dim));
    if (__builtin_mul_overflow(numel, dim, &numel)) {
      return Status::Corruption(where + "shape " + shape->dump() + " overflows");
    }
  }
  uint64_t bytes;
  if (__builtin_mul_overflow(numel, static_cast<uint64_t>(elem), &bytes) || numel > static_cast<uint64_t>(INT64_MAX)) {
    return Status::Corruption(where + "shape " + shape->dump() + " overflows");
  }
  uint64_t begin, end;
  if (!GetUnsigned((*offsets)[0], &begin) || !GetUnsigned((*offsets)[1], &end) || begin > end) {
    return Status::Corruption(where + "data_offsets " + offsets->dump() + " must be integers 0 <= begin <= end");
  }
  if (end > data_size) {
    return Status::Corruption(where + "data_offsets " + offsets->dump() + " out of range: the data region has " +
                              std::to_string(data_size) + " bytes");
  }
  if (end - begin != bytes) {
    return Status::Corruption(where + "data_offsets " + offsets->dump() + " span " + std::to_string(end - begin) +
                              " bytes, but dtype " + t->dtype + " x shape " + ShapeText(t->shape) + " needs " +
                              std::to_string(bytes));
  }
  t->numel = static_cast<int64_t>(numel);
  t->file_offset = begin;  // made absolute by the caller
  t->num_bytes = bytes;
  return Status::OK();
}

}  // namespace

struct SafetensorsFile::Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

bool IsFloatConvertible(const std::string& dtype) { return dtype == "F32" || dtype == "BF16" || dtype == "F16"; }

float F16ToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);  // inf, or NaN keeping its payload
  } else if (exp != 0) {
    bits = sign | ((exp + (127 - 15)) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;  // +-0
  } else {
    // Subnormal mant * 2^-24: shift until the implicit bit (bit 10) is set;
    // after k shifts the value is 1.f * 2^(-14-k), a normal fp32.
    uint32_t k = 0;
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      ++k;
    }
    bits = sign | ((127 - 14 - k) << 23) | ((mant & 0x3ffu) << 13);
  }
  return std::bit_cast<float>(bits);
}

StatusOr<SafetensorsFile> SafetensorsFile::Open(const std::string& path) {
  SafetensorsFile f;
  f.path_ = path;
  f.fd_ = std::make_shared<Fd>();
  f.fd_->fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f.fd_->fd < 0) {
    if (errno == ENOENT) return Status::NotFound(path + ": no such file");
    return Status::IOError(path + ": cannot open: " + std::strerror(errno));
  }
  struct stat st;
  if (::fstat(f.fd_->fd, &st) != 0) return Status::IOError(path + ": cannot stat: " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return Status::InvalidArgument(path + ": not a regular file");
  f.file_size_ = static_cast<uint64_t>(st.st_size);

  if (f.file_size_ < 8) {
    return Status::Corruption(path + ": " + std::to_string(f.file_size_) +
                              " bytes is too short for a safetensors file (8-byte header length first)");
  }
  unsigned char len_bytes[8];
  HERD_RETURN_IF_ERROR(PreadFully(f.fd_->fd, path, len_bytes, 8, 0));
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];
  if (header_len > f.file_size_ - 8) {
    return Status::Corruption(path + ": header length " + std::to_string(header_len) + " exceeds the file size (" +
                              std::to_string(f.file_size_) + " bytes); not a safetensors file or truncated");
  }
  if (header_len > kMaxHeaderBytes) {
    return Status::Corruption(path + ": header length " + std::to_string(header_len) + " exceeds the 100 MB limit");
  }
  if (header_len < 2) return Status::Corruption(path + ": header of " + std::to_string(header_len) + " bytes is too short");
  std::string header(header_len, '\0');
  HERD_RETURN_IF_ERROR(PreadFully(f.fd_->fd, path, header.data(), header.size(), 8));
  if (header[0] != '{') return Status::Corruption(path + ": header does not start with '{' (not a safetensors file)");
  json h = json::parse(header, /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (h.is_discarded() || !h.is_object()) return Status::Corruption(path + ": header is not a valid JSON object");

  const uint64_t data_start = 8 + header_len;
  const uint64_t data_size = f.file_size_ - data_start;
  for (auto it = h.begin(); it != h.end(); ++it) {
    if (it.key() == kMetadataKey) {
      if (it->is_null()) continue;
      if (!it->is_object()) return Status::Corruption(path + ": \"__metadata__\" must be an object of strings");
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string()) {
          return Status::Corruption(path + ": \"__metadata__\" key '" + m.key() + "' must have a string value");
        }
        f.metadata_[m.key()] = m->get<std::string>();
      }
      continue;
    }
    SafetensorsTensor t;
    HERD_RETURN_IF_ERROR(ParseEntry(path, it.key(), it.value(), data_size, &t));
    f.tensors_.push_back(std::move(t));
  }

  // The tensors must tile the data region exactly: no holes, no overlaps,
  // nothing after the last one (the reference implementation's rule).
  std::stable_sort(f.tensors_.begin(), f.tensors_.end(), [](const SafetensorsTensor& a, const SafetensorsTensor& b) {
    return a.file_offset != b.file_offset ? a.file_offset < b.file_offset : a.num_bytes < b.num_bytes;
  });
  uint64_t covered = 0;
  const SafetensorsTensor* prev = nullptr;
  for (SafetensorsTensor& t : f.tensors_) {
    if (t.file_offset != covered) {
      return Status::Corruption(
          path + ": tensor '" + t.name + "' starts at data byte " + std::to_string(t.file_offset) +
          (prev ? ", but the previous tensor '" + prev->name + "' ends at " : ", expected ") + std::to_string(covered) +
          (t.file_offset < covered ? " (overlap)" : " (gap)"));
    }
    covered += t.num_bytes;
    t.file_offset += data_start;
    prev = &t;
  }
  if (covered != data_size) {
    return Status::Corruption(path + ": the tensors cover " + std::to_string(covered) + " bytes of data, but the file has " +
                              std::to_string(data_size) + " after the header");
  }
  for (size_t i = 0; i < f.tensors_.size(); ++i) f.index_[f.tensors_[i].name] = i;
  return f;
}

const SafetensorsTensor* SafetensorsFile::Find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

Status SafetensorsFile::ReadAsFloat(std::string_view name, float* out, int64_t count) const {
  const SafetensorsTensor* t = Find(name);
  if (t == nullptr) return Status::NotFound(path_ + ": no tensor '" + std::string(name) + "'");
  const std::string where = path_ + ": tensor '" + t->name + "': ";
  if (count != t->numel) {
    return Status::InvalidArgument(where + "has " + std::to_string(t->numel) + " elements, caller expected " +
                                   std::to_string(count));
  }
  if (t->dtype == "F32") return PreadFully(fd_->fd, path_, out, t->num_bytes, t->file_offset);
  if (t->dtype != "BF16" && t->dtype != "F16") {
    return Status::InvalidArgument(where + "dtype " + t->dtype + " is not supported (expected F32, BF16 or F16)");
  }
  const bool bf16 = t->dtype == "BF16";
  constexpr int64_t kChunk = 1 << 20;
  std::vector<uint16_t> buf(static_cast<size_t>(std::min<int64_t>(count, kChunk)));
  for (int64_t done = 0; done < count;) {
    const int64_t n = std::min<int64_t>(count - done, kChunk);
    HERD_RETURN_IF_ERROR(PreadFully(fd_->fd, path_, buf.data(), static_cast<size_t>(n) * 2,
                                    t->file_offset + static_cast<uint64_t>(done) * 2));
    float* dst = out + done;
    if (bf16) {
      for (int64_t i = 0; i < n; ++i) dst[i] = Bf16ToFloat(buf[i]);
    } else {
      for (int64_t i = 0; i < n; ++i) dst[i] = F16ToFloat(buf[i]);
    }
    done += n;
  }
  return Status::OK();
}

Status WriteSafetensors(const std::string& path, const std::vector<SafetensorsEntry>& tensors,
                        const std::map<std::string, std::string>& metadata) {
  // Header in the order given: metadata first, then the tensors.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header[kMetadataKey] = metadata;
  std::set<std::string> seen;
  uint64_t offset = 0;
  for (const SafetensorsEntry& t : tensors) {
    if (t.name.empty() || t.name == kMetadataKey || !seen.insert(t.name).second) {
      return Status::InvalidArgument(path + ": tensor name '" + t.name + "' is empty, reserved or repeated");
    }
    uint64_t numel = 1;
    for (int64_t d : t.shape) {
      if (d < 0) return Status::InvalidArgument(path + ": tensor '" + t.name + "': negative dimension");
      numel *= static_cast<uint64_t>(d);
    }
    if (numel > 0 && t.data == nullptr) {
      return Status::InvalidArgument(path + ": tensor '" + t.name + "': no data");
    }
    const uint64_t bytes = numel * sizeof(float);
    header[t.name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text;
  try {  // dump() throws on names that are not valid UTF-8
    text = header.dump();
  } catch (const nlohmann::json::exception&) {
    return Status::InvalidArgument(path + ": tensor names and metadata must be valid UTF-8");
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  unsigned char len_bytes[8];
  for (int i = 0; i < 8; ++i) len_bytes[i] = static_cast<unsigned char>(static_cast<uint64_t>(text.size()) >> (8 * i));

  AtomicFile file;
  HERD_RETURN_IF_ERROR(file.Open(path));
  HERD_RETURN_IF_ERROR(file.Append(len_bytes, sizeof(len_bytes)));
  HERD_RETURN_IF_ERROR(file.Append(text));
  for (const SafetensorsEntry& t : tensors) {
    uint64_t numel = 1;
    for (int64_t d : t.shape) numel *= static_cast<uint64_t>(d);
    if (numel > 0) HERD_RETURN_IF_ERROR(file.Append(t.data, numel * sizeof(float)));
  }
  return file.Commit();
}

}  // namespace herd
