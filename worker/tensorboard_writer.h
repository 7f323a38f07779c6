// TensorBoard event files, as tf.summary and torch.utils.tensorboard write
// them: DIR/events.out.tfevents.SECONDS.HOST.PID, one per run (TensorBoard
// reads every file of the directory), holding records of an Event protobuf
// (proto/tensorboard.proto) each: its length as a little-endian uint64, the
// masked CRC-32C of those 8 bytes, the bytes, and their masked CRC-32C.
// The first event names the format; each call to Add is one event, flushed
// at once, so that a TensorBoard watching the directory sees every step.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace herd {

class TensorBoardWriter {
 public:
  TensorBoardWriter() = default;
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // Creates `dir` when missing and a new event file in it.
  Status Open(const std::string& dir);
  bool is_open() const { return file_ != nullptr; }
  // One event at `step` with a scalar per (tag, value).
  Status Add(int64_t step, const std::vector<std::pair<std::string, double>>& scalars);
  Status Close();

  // TFRecord's checksum: CRC-32C, rotated and offset.
  static uint32_t MaskedCrc32c(const void* data, size_t size);

 private:
  Status Record(const std::string& bytes);

  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace herd
