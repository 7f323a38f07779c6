#include "model/checkpoint_format.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string_view>

#include <glog/logging.h>

#include "common/config.h"
#include "common/file_util.h"

namespace herd {
namespace {

using json = nlohmann::json;

constexpr char kShardMagic[8] = {'H', 'E', 'R', 'D', 'S', 'H', 'R', 'D'};
constexpr uint32_t kShardVersion = 2;  // one range; 1 is read too
constexpr uint32_t kPiecesVersion = 3;  // several
// A bound on a version-3 file's pieces (a ZeRO owner has one per bucket).
constexpr int64_t kMaxPieces = int64_t{1} << 24;
constexpr char kManifest[] = "manifest.json";
constexpr char kConfigFile[] = "config.textproto";

// Fixed-size little-endian header in front of a shard's three arrays.
// Version 1 ended after `step` (kHeaderBytesV1).
struct ShardHeader {
  char magic[8];
  uint32_t version;
  uint32_t payload_crc;  // CRC-32 of weights, m, v
  int64_t begin, end, step;
  int64_t spike_count;
  double loss_mean, loss_var, norm_mean, norm_var;
};
static_assert(sizeof(ShardHeader) == 80);
constexpr size_t kHeaderBytesV1 = 40;

// The bytes the fixed header of this version takes.
size_t HeaderBytes(const ShardHeader& h) { return h.version == 1 ? kHeaderBytesV1 : sizeof(ShardHeader); }

// A shard file's head: its fixed header and its pieces (one, [begin, end),
// before version 3), validated; `bytes` is how long the head is on disk.
struct ShardHead {
  ShardHeader header;
  std::vector<std::pair<int64_t, int64_t>> pieces;
  size_t bytes = 0;
  int64_t elements = 0;  // over all pieces
};

// The fixed header of `data` (a whole shard file or its first bytes),
// validated; a version-1 header has no spike statistics (zero).
StatusOr<ShardHeader> ParseShardHeader(const std::string& path, std::string_view data) {
  if (data.size() < kHeaderBytesV1) {
    return Status::Corruption(path + ": " + std::to_string(data.size()) + " bytes is shorter than a shard header");
  }
  ShardHeader h{};
  std::memcpy(&h, data.data(), kHeaderBytesV1);
  if (std::memcmp(h.magic, kShardMagic, sizeof(kShardMagic)) != 0) {
    return Status::Corruption(path + ": not a herd shard (bad magic)");
  }
  if (h.version != 1 && h.version != kShardVersion && h.version != kPiecesVersion) {
    return Status::Corruption(path + ": shard version " + std::to_string(h.version) + ", expected 1 to " +
                              std::to_string(kPiecesVersion));
  }
  if (h.version != 1) {
    if (data.size() < sizeof(ShardHeader)) {
      return Status::Corruption(path + ": " + std::to_string(data.size()) + " bytes is shorter than a shard header");
    }
    std::memcpy(&h, data.data(), sizeof(ShardHeader));
    if (h.spike_count < 0 || !std::isfinite(h.loss_mean) || !std::isfinite(h.norm_mean) || !(h.loss_var >= 0) ||
        !(h.norm_var >= 0) || !std::isfinite(h.loss_var) || !std::isfinite(h.norm_var)) {
      return Status::Corruption(path + ": invalid spike-guard statistics in its header");
    }
  }
  if (h.begin < 0 || h.end < h.begin || h.step < 0 || (h.end - h.begin) > (int64_t{1} << 40)) {
    return Status::Corruption(path + ": invalid range [" + std::to_string(h.begin) + ", " + std::to_string(h.end) +
                              ") or step " + std::to_string(h.step));
  }
  return h;
}

// The head of `data` (a whole shard file, or at least its head): the fixed
// header, then for version 3 the pieces, each non-empty, ascending,
// disjoint and spanning [begin, end) of the header.
StatusOr<ShardHead> ParseShardHead(const std::string& path, std::string_view data) {
  ShardHead head;
  HERD_ASSIGN_OR_RETURN(head.header, ParseShardHeader(path, data));
  const ShardHeader& h = head.header;
  head.bytes = HeaderBytes(h);
  if (h.version != kPiecesVersion) {
    head.pieces = {{h.begin, h.end}};
    head.elements = h.end - h.begin;
    return head;
  }
  auto too_short = [&](size_t need) {
    return Status::Corruption(path + ": " + std::to_string(data.size()) + " bytes is shorter than its head (" +
                              std::to_string(need) + ")");
  };
  if (data.size() < head.bytes + sizeof(int64_t)) return too_short(head.bytes + sizeof(int64_t));
  int64_t count = 0;
  std::memcpy(&count, data.data() + head.bytes, sizeof count);
  if (count < 1 || count > kMaxPieces) {
    return Status::Corruption(path + ": " + std::to_string(count) + " pieces (expected 1 to " +
                              std::to_string(kMaxPieces) + ")");
  }
  head.bytes += sizeof(int64_t) + static_cast<size_t>(count) * 2 * sizeof(int64_t);
  if (data.size() < head.bytes) return too_short(head.bytes);
  std::vector<int64_t> table(static_cast<size_t>(count) * 2);
  std::memcpy(table.data(), data.data() + HeaderBytes(h) + sizeof(int64_t), table.size() * sizeof(int64_t));
  for (size_t i = 0; i < table.size(); i += 2) head.pieces.emplace_back(table[i], table[i + 1]);
  int64_t reached = h.begin;
  for (const auto& [b, e] : head.pieces) {
    if (b < reached || e <= b || e > h.end) {
      return Status::Corruption(path + ": piece [" + std::to_string(b) + ", " + std::to_string(e) +
                                ") is empty, out of order or outside [" + std::to_string(h.begin) + ", " +
                                std::to_string(h.end) + ")");
    }
    reached = e;
    head.elements += e - b;
  }
  if (head.pieces.front().first != h.begin || reached != h.end) {
    return Status::Corruption(path + ": its pieces do not start and end where its header says");
  }
  return head;
}

// The bytes after the head: the three arrays.
uint64_t PayloadBytes(const ShardHead& head) { return 3 * static_cast<uint64_t>(head.elements) * sizeof(float); }

}  // namespace

std::string StepDirName(const std::string& root, int64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "step_%08" PRId64, step);
  return JoinPath(root, name);
}

std::string ShardFileName(int shard_index) {
  char name[32];
  std::snprintf(name, sizeof(name), "shard_%05d.bin", shard_index);
  return name;
}

std::string RegionShardPrefix(int region) {
  char name[32];
  std::snprintf(name, sizeof(name), "region_%02d_shard_", region);
  return name;
}

std::string RegionShardFileName(int region, int shard_index) {
  char name[32];
  std::snprintf(name, sizeof(name), "%05d.bin", shard_index);
  return RegionShardPrefix(region) + name;
}

std::string OuterPrefix(int region) {
  if (region == 0) return "outer_";
  char name[32];
  std::snprintf(name, sizeof(name), "region_%02d_outer_", region);
  return name;
}

std::string OuterFileName(int region, int shard_index) {
  char name[32];
  std::snprintf(name, sizeof(name), "%05d.bin", shard_index);
  return OuterPrefix(region) + name;
}

std::string WorkerFileName(int worker_rank) {
  char name[32];
  std::snprintf(name, sizeof(name), "worker_%05d.state", worker_rank);
  return name;
}

namespace {

// The header of `shard`, without its payload CRC.
ShardHeader HeaderOf(const ShardView& shard) {
  ShardHeader h{};
  std::memcpy(h.magic, kShardMagic, sizeof(kShardMagic));
  h.version = kShardVersion;
  h.begin = shard.begin;
  h.end = shard.end;
  h.step = shard.step;
  h.spike_count = shard.spikes.count;
  h.loss_mean = shard.spikes.loss_mean;
  h.loss_var = shard.spikes.loss_var;
  h.norm_mean = shard.spikes.norm_mean;
  h.norm_var = shard.spikes.norm_var;
  return h;
}

// A null array of a ShardView reads as zeros (checkpoint_format.h): its
// checksum and its bytes come from a block of zeros, not an array of them.
constexpr size_t kZeroBlock = 1 << 16;
const char* ZeroBlock() {
  static const char* zeros = new char[kZeroBlock]();
  return zeros;
}

uint32_t ArrayCrc(const float* array, size_t bytes, uint32_t crc) {
  if (array != nullptr) return Crc32(array, bytes, crc);
  for (size_t at = 0; at < bytes; at += kZeroBlock) crc = Crc32(ZeroBlock(), std::min(kZeroBlock, bytes - at), crc);
  return crc;
}

Status AppendArray(AtomicFile& file, const float* array, size_t bytes) {
  if (array != nullptr) return file.Append(array, bytes);
  for (size_t at = 0; at < bytes; at += kZeroBlock) {
    HERD_RETURN_IF_ERROR(file.Append(ZeroBlock(), std::min(kZeroBlock, bytes - at)));
  }
  return Status::OK();
}

}  // namespace

void ShardImage::Capture(const ShardView& shard) { Capture(std::vector<ShardView>{shard}); }

void ShardImage::Capture(const std::vector<ShardView>& pieces) {
  CHECK(!pieces.empty()) << "a checkpoint snapshot of no pieces";
  ShardView hull = pieces.front();
  hull.end = pieces.back().end;
  ShardHeader h = HeaderOf(hull);
  std::vector<int64_t> table;
  if (pieces.size() > 1) {
    h.version = kPiecesVersion;
    table.push_back(static_cast<int64_t>(pieces.size()));
    for (const ShardView& p : pieces) {
      table.push_back(p.begin);
      table.push_back(p.end);
    }
  }
  size_t elements = 0;
  for (const ShardView& p : pieces) elements += static_cast<size_t>(p.end - p.begin);
  arrays_at_ = sizeof(ShardHeader) + table.size() * sizeof(int64_t);
  size_ = arrays_at_ + 3 * elements * sizeof(float);
  const size_t padded = (size_ + kDirectIoAlignment - 1) / kDirectIoAlignment * kDirectIoAlignment;
  if (padded != capacity_) {
    bytes_.reset(static_cast<char*>(std::aligned_alloc(kDirectIoAlignment, padded)));
    CHECK(bytes_ != nullptr) << "out of memory for a checkpoint snapshot of " << padded << " bytes";
    capacity_ = padded;
  }
  char* p = bytes_.get();
  std::memcpy(p, &h, sizeof h);
  std::memcpy(p + sizeof h, table.data(), table.size() * sizeof(int64_t));
  p += arrays_at_;
  for (auto array : {&ShardView::weights, &ShardView::m, &ShardView::v}) {
    for (const ShardView& piece : pieces) {
      const size_t bytes = static_cast<size_t>(piece.end - piece.begin) * sizeof(float);
      if (piece.*array != nullptr) {
        std::memcpy(p, piece.*array, bytes);
      } else {
        std::memset(p, 0, bytes);
      }
      p += bytes;
    }
  }
  std::memset(bytes_.get() + size_, 0, padded - size_);
}

Status ShardImage::Write(const std::string& path) {
  ShardHeader h;
  std::memcpy(&h, bytes_.get(), sizeof h);
  h.payload_crc = Crc32(bytes_.get() + arrays_at_, size_ - arrays_at_);
  std::memcpy(bytes_.get(), &h, sizeof h);
  return WriteAlignedFileAtomic(path, bytes_.get(), size_);
}

Status WriteShard(const std::string& path, const ShardView& shard) {
  const size_t n = static_cast<size_t>(shard.end - shard.begin);
  if (shard.end < shard.begin || (n > 0 && (shard.weights == nullptr || shard.m == nullptr))) {
    return Status::Internal(path + ": shard arrays do not match its range");
  }
  ShardHeader h = HeaderOf(shard);
  uint32_t crc = Crc32(shard.weights, n * sizeof(float));
  crc = Crc32(shard.m, n * sizeof(float), crc);
  h.payload_crc = ArrayCrc(shard.v, n * sizeof(float), crc);
  AtomicFile file;
  HERD_RETURN_IF_ERROR(file.Open(path));
  HERD_RETURN_IF_ERROR(file.Append(&h, sizeof(h)));
  HERD_RETURN_IF_ERROR(file.Append(shard.weights, n * sizeof(float)));
  HERD_RETURN_IF_ERROR(file.Append(shard.m, n * sizeof(float)));
  HERD_RETURN_IF_ERROR(AppendArray(file, shard.v, n * sizeof(float)));
  return file.Commit();
}

Status WriteShardPieces(const std::string& path, const std::vector<ShardView>& pieces) {
  if (pieces.size() == 1) return WriteShard(path, pieces[0]);
  if (pieces.empty()) return Status::Internal(path + ": a shard of no pieces");
  ShardView hull = pieces.front();
  hull.end = pieces.back().end;
  ShardHeader h = HeaderOf(hull);
  h.version = kPiecesVersion;
  std::vector<int64_t> table = {static_cast<int64_t>(pieces.size())};
  int64_t reached = hull.begin;
  for (const ShardView& p : pieces) {
    if (p.begin < reached || p.end <= p.begin || p.step != hull.step || p.weights == nullptr || p.m == nullptr) {
      return Status::Internal(path + ": shard pieces out of order, empty or of different steps");
    }
    reached = p.end;
    table.push_back(p.begin);
    table.push_back(p.end);
  }
  auto bytes = [](const ShardView& p) { return static_cast<size_t>(p.end - p.begin) * sizeof(float); };
  uint32_t crc = 0;
  for (auto array : {&ShardView::weights, &ShardView::m, &ShardView::v}) {
    for (const ShardView& p : pieces) crc = ArrayCrc(p.*array, bytes(p), crc);
  }
  h.payload_crc = crc;
  AtomicFile file;
  HERD_RETURN_IF_ERROR(file.Open(path));
  HERD_RETURN_IF_ERROR(file.Append(&h, sizeof(h)));
  HERD_RETURN_IF_ERROR(file.Append(table.data(), table.size() * sizeof(int64_t)));
  for (auto array : {&ShardView::weights, &ShardView::m, &ShardView::v}) {
    for (const ShardView& p : pieces) HERD_RETURN_IF_ERROR(AppendArray(file, p.*array, bytes(p)));
  }
  return file.Commit();
}

StatusOr<std::vector<ShardState>> ReadShardPieces(const std::string& path) {
  HERD_ASSIGN_OR_RETURN(std::string data, ReadFile(path));
  HERD_ASSIGN_OR_RETURN(ShardHead head, ParseShardHead(path, data));
  const ShardHeader& h = head.header;
  const size_t n = static_cast<size_t>(head.elements);
  const size_t expected = head.bytes + PayloadBytes(head);
  if (data.size() != expected) {
    return Status::Corruption(path + ": " + std::to_string(n) + " elements need " + std::to_string(expected) +
                              " bytes, file has " + std::to_string(data.size()));
  }
  const char* payload = data.data() + head.bytes;
  if (Crc32(payload, PayloadBytes(head)) != h.payload_crc) {
    return Status::Corruption(path + ": checksum mismatch (file is damaged)");
  }
  std::vector<ShardState> out;
  size_t at = 0;  // elements into each array
  for (const auto& [b, e] : head.pieces) {
    ShardState s;
    s.begin = b;
    s.end = e;
    s.step = h.step;
    s.spikes = {h.spike_count, h.loss_mean, h.loss_var, h.norm_mean, h.norm_var};
    const size_t count = static_cast<size_t>(e - b);
    for (auto [array, k] : {std::pair{&ShardState::weights, 0}, {&ShardState::m, 1}, {&ShardState::v, 2}}) {
      (s.*array).resize(count);
      std::memcpy((s.*array).data(), payload + (k * n + at) * sizeof(float), count * sizeof(float));
    }
    at += count;
    out.push_back(std::move(s));
  }
  return out;
}

StatusOr<ShardState> ReadShard(const std::string& path) {
  HERD_ASSIGN_OR_RETURN(std::vector<ShardState> pieces, ReadShardPieces(path));
  if (pieces.size() != 1) {
    return Status::Corruption(path + ": holds " + std::to_string(pieces.size()) + " ranges where one was expected");
  }
  return std::move(pieces[0]);
}

namespace {

// A shard file's validated head, its bytes, and the file's size.
struct ShardHeadOnDisk {
  ShardHead head;
  std::string bytes;
  uint64_t size = 0;
};
StatusOr<ShardHeadOnDisk> ReadShardHead(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return Status::NotFound(path + ": cannot open");
  ShardHeadOnDisk out;
  const bool sized = std::fseek(f, 0, SEEK_END) == 0;
  const long size = sized ? std::ftell(f) : -1;
  std::rewind(f);
  // The fixed header and, for version 3, the piece count; then the table.
  out.bytes.resize(std::min<size_t>(sizeof(ShardHeader) + sizeof(int64_t), size < 0 ? 0 : size));
  out.bytes.resize(std::fread(out.bytes.data(), 1, out.bytes.size(), f));
  StatusOr<ShardHeader> fixed = ParseShardHeader(path, out.bytes);
  if (fixed.ok() && fixed->version == kPiecesVersion && out.bytes.size() == sizeof(ShardHeader) + sizeof(int64_t)) {
    int64_t count = 0;
    std::memcpy(&count, out.bytes.data() + sizeof(ShardHeader), sizeof count);
    if (count >= 1 && count <= kMaxPieces) {
      const size_t had = out.bytes.size();
      out.bytes.resize(had + static_cast<size_t>(count) * 2 * sizeof(int64_t));
      out.bytes.resize(had + std::fread(out.bytes.data() + had, 1, out.bytes.size() - had, f));
    }
  }
  std::fclose(f);
  if (size < 0) return Status::IOError(path + ": cannot tell its size");
  HERD_ASSIGN_OR_RETURN(out.head, ParseShardHead(path, out.bytes));
  out.bytes.resize(out.head.bytes);
  out.size = static_cast<uint64_t>(size);
  return out;
}

// A file's size and CRC-32, read in pieces: a part is checked without
// holding it (a shard's arrays are 12 bytes a parameter of its range).
StatusOr<std::pair<uint64_t, uint32_t>> StreamedDigest(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    if (errno == ENOENT) return Status::NotFound(path + ": no such file");
    return Status::IOError(path + ": cannot open: " + std::strerror(errno));
  }
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> closer(f, &std::fclose);
  // A device or pipe (/dev/zero, a FIFO) would be read without end.
  struct stat st;
  if (::fstat(::fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
    return Status::InvalidArgument(path + ": not a regular file");
  }
  std::vector<char> buf(1 << 20);
  uint64_t size = 0;
  uint32_t crc = 0;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), f)) > 0) {
    crc = Crc32(buf.data(), n, crc);
    size += n;
  }
  if (std::ferror(f)) return Status::IOError(path + ": read failed: " + std::strerror(errno));
  return std::make_pair(size, crc);
}

// Every part in the shard file format: a shard, a region's replica, an
// outer optimizer state (checkpoint_format.h's names all end so).
bool InShardFormat(const std::string& path) { return BaseName(path).ends_with(".bin"); }

// A manifest entry's size and CRC-32. A part in the shard format has them
// from its header, whose payload CRC its writer computed from the arrays
// it wrote and fsynced before voting: its arrays need not be read back
// (hundreds of megabytes on the committer while training goes on). Other
// parts are small and streamed.
StatusOr<std::pair<uint64_t, uint32_t>> PartDigest(const std::string& path) {
  if (InShardFormat(path)) {
    HERD_ASSIGN_OR_RETURN(ShardHeadOnDisk disk, ReadShardHead(path));
    const uint64_t payload = PayloadBytes(disk.head);
    if (disk.size != disk.bytes.size() + payload) {
      return Status::Corruption(path + ": " + std::to_string(disk.size) + " bytes, its header says " +
                                std::to_string(disk.bytes.size() + payload));
    }
    return std::make_pair(disk.size, Crc32Combine(Crc32(disk.bytes.data(), disk.bytes.size()),
                                                  disk.head.header.payload_crc, payload));
  }
  return StreamedDigest(path);
}

}  // namespace

StatusOr<ShardExtent> ReadShardExtent(const std::string& path) {
  HERD_ASSIGN_OR_RETURN(ShardHeadOnDisk disk, ReadShardHead(path));
  const ShardHeader& h = disk.head.header;
  return ShardExtent{h.begin, h.end, h.step};
}

Status WriteConfigPart(const std::string& step_dir, const config::JobConfig& config) {
  return WriteFileAtomic(JoinPath(step_dir, kConfigFile), ConfigToText(config));
}

StatusOr<config::JobConfig> ReadCheckpointConfig(const std::string& step_dir) {
  const std::string path = JoinPath(step_dir, kConfigFile);
  HERD_ASSIGN_OR_RETURN(std::string text, ReadFile(path, kMaxConfigBytes));
  return ParseJobConfig(text, path);
}

std::vector<std::string> CheckpointParts(int shards, int workers) {
  std::vector<std::string> parts = {kConfigFile};
  for (int s = 0; s < shards; ++s) parts.push_back(ShardFileName(s));
  for (int w = 0; w < workers; ++w) parts.push_back(WorkerFileName(w));
  return parts;
}

Status WriteManifest(const std::string& step_dir, int64_t step, const std::vector<std::string>& parts) {
  json manifest;
  manifest["format"] = "herd-checkpoint";
  manifest["version"] = 1;
  manifest["step"] = step;
  json list = json::array();
  for (const std::string& part : parts) {
    HERD_ASSIGN_OR_RETURN(auto digest, PartDigest(JoinPath(step_dir, part)));
    list.push_back({{"file", part}, {"bytes", digest.first}, {"crc32", digest.second}});
  }
  manifest["parts"] = list;
  return WriteFileAtomic(JoinPath(step_dir, kManifest), manifest.dump(2) + "\n");
}

StatusOr<Manifest> VerifyCheckpoint(const std::string& step_dir) {
  const std::string path = JoinPath(step_dir, kManifest);
  auto text = ReadFile(path);
  if (!text.ok()) {
    if (text.status().code() == Status::Code::kNotFound) {
      return Status::NotFound(step_dir + ": no manifest.json: the checkpoint is incomplete and is not loaded");
    }
    return text.status();
  }
  json m = json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (m.is_discarded() || !m.is_object()) return Status::Corruption(path + ": not valid JSON");
  if (m.value("format", "") != "herd-checkpoint" || !m.contains("step") || !m["step"].is_number_integer() ||
      !m.contains("parts") || !m["parts"].is_array()) {
    return Status::Corruption(path + ": not a herd manifest (needs format, step, parts)");
  }
  Manifest out;
  out.step = m["step"].get<int64_t>();
  for (const json& part : m["parts"]) {
    if (!part.is_object() || !part.contains("file") || !part["file"].is_string() || !part.contains("bytes") ||
        !part["bytes"].is_number_unsigned() || !part.contains("crc32") || !part["crc32"].is_number_unsigned()) {
      return Status::Corruption(path + ": malformed part entry");
    }
    const std::string file = part["file"].get<std::string>();
    if (file.empty() || file.find('/') != std::string::npos || file.starts_with(".")) {
      return Status::Corruption(path + ": part name '" + file + "' is not a plain file name");
    }
    HERD_ASSIGN_OR_RETURN(const auto digest, StreamedDigest(JoinPath(step_dir, file)));
    if (digest.first != part["bytes"].get<uint64_t>() || digest.second != part["crc32"].get<uint32_t>()) {
      return Status::Corruption(JoinPath(step_dir, file) + ": does not match the manifest (size or checksum)");
    }
    out.parts.push_back(file);
  }
  return out;
}

bool HasManifest(const std::string& step_dir) { return PathExists(JoinPath(step_dir, kManifest)); }

Status RemoveManifest(const std::string& step_dir) {
  const std::string manifest_path = JoinPath(step_dir, kManifest);
  if (::unlink(manifest_path.c_str()) != 0 && errno != ENOENT) {
    return Status::IOError(manifest_path + ": cannot remove the old manifest");
  }
  return Status::OK();
}

}  // namespace herd
