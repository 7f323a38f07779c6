#include "worker/tensorboard_writer.h"

#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>

#include "common/file_util.h"
#include "proto/tensorboard.pb.h"

namespace herd {
namespace {

uint32_t Crc32c(const uint8_t* p, size_t n) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  uint32_t crc = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) crc = table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFu;
}

double WallTime() {
  struct timespec ts;
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
}

}  // namespace

uint32_t TensorBoardWriter::MaskedCrc32c(const void* data, size_t size) {
  const uint32_t crc = Crc32c(static_cast<const uint8_t*>(data), size);
  return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u;
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

Status TensorBoardWriter::Open(const std::string& dir) {
  HERD_RETURN_IF_ERROR(MakeDirs(dir).WithContext("log.tensorboard: "));
  const std::string host = HostName();
  const double now = WallTime();
  path_ = JoinPath(dir, "events.out.tfevents." + std::to_string(static_cast<int64_t>(now)) + "." + host + "." +
                            std::to_string(::getpid()));
  // O_EXCL: never append to (or replace) a file herd did not just create.
  const int fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return Status::IOError("log.tensorboard: " + path_ + ": cannot create: " + std::strerror(errno));
  file_ = ::fdopen(fd, "wb");
  tensorboard::Event first;
  first.set_wall_time(now);
  first.set_file_version("brain.Event:2");
  return Record(first.SerializeAsString());
}

Status TensorBoardWriter::Add(int64_t step, const std::vector<std::pair<std::string, double>>& scalars) {
  if (file_ == nullptr) return Status::OK();
  tensorboard::Event e;
  e.set_wall_time(WallTime());
  e.set_step(step);
  for (const auto& [tag, value] : scalars) {
    tensorboard::SummaryValue* v = e.mutable_summary()->add_value();
    v->set_tag(tag);
    v->set_simple_value(static_cast<float>(value));
  }
  return Record(e.SerializeAsString());
}

Status TensorBoardWriter::Record(const std::string& bytes) {
  uint8_t header[12];
  const uint64_t length = bytes.size();
  std::memcpy(header, &length, 8);  // little-endian hosts only (as the token files)
  const uint32_t length_crc = MaskedCrc32c(header, 8);
  std::memcpy(header + 8, &length_crc, 4);
  const uint32_t data_crc = MaskedCrc32c(bytes.data(), bytes.size());
  if (std::fwrite(header, 1, sizeof header, file_) != sizeof header ||
      std::fwrite(bytes.data(), 1, bytes.size(), file_) != bytes.size() ||
      std::fwrite(&data_crc, 1, 4, file_) != 4 || std::fflush(file_) != 0) {
    return Status::IOError("log.tensorboard: " + path_ + ": write failed: " + std::strerror(errno));
  }
  return Status::OK();
}

Status TensorBoardWriter::Close() {
  if (file_ == nullptr) return Status::OK();
  const bool ok = std::fclose(file_) == 0;
  file_ = nullptr;
  if (!ok) return Status::IOError("log.tensorboard: " + path_ + ": write failed: " + std::strerror(errno));
  return Status::OK();
}

}  // namespace herd
