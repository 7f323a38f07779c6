// The safetensors file format (HuggingFace's weight files), read and write.
//
// A file is: an 8-byte little-endian header length N, N bytes of JSON
//   {"__metadata__": {str: str}, NAME: {"dtype": "F32", "shape": [..],
//    "data_offsets": [begin, end]}, ...}
// (offsets relative to the first byte after the header), then the data.
//
// Promises of the reader: Open() validates the whole header before anything
// is used — the header length against the file size, the JSON, every
// entry's dtype, shape and offsets (inside the data, end - begin equal to
// numel x dtype size, no overflow, tensors tiling the data region without
// holes or overlaps, as the reference implementation demands). Every error
// is one line naming the file and, where there is one, the tensor.
// The reader keeps the file open and reads tensor data on demand (pread), so
// a model is never held twice in memory.
//
// Promise of the writer: the file is written atomically (AtomicFile): the
// destination keeps its old content or gets the complete new one.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace herd {

// One tensor entry of a safetensors header, validated.
struct SafetensorsTensor {
  std::string name;
  std::string dtype;           // as in the file: "F32", "BF16", "F16", "I64", ...
  std::vector<int64_t> shape;  // row-major
  int64_t numel = 0;
  uint64_t file_offset = 0;    // absolute byte offset of the data in the file
  uint64_t num_bytes = 0;
};

class SafetensorsFile {
 public:
  static StatusOr<SafetensorsFile> Open(const std::string& path);

  const std::string& path() const { return path_; }
  // In data order (ascending offset).
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  // nullptr when absent.
  const SafetensorsTensor* Find(std::string_view name) const;
  // The optional "__metadata__" map (string values only, as the format says).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // Reads tensor `name` into out[0, count), converting F32, BF16 or F16 to
  // fp32 exactly (F16 subnormals, infinities and NaNs included). `count`
  // must equal the tensor's numel; other dtypes are an error.
  Status ReadAsFloat(std::string_view name, float* out, int64_t count) const;

 private:
  struct Fd;  // owns the open file descriptor

  std::string path_;
  std::shared_ptr<Fd> fd_;
  uint64_t file_size_ = 0;
  std::vector<SafetensorsTensor> tensors_;
  std::map<std::string, size_t, std::less<>> index_;  // name -> position in tensors_
  std::map<std::string, std::string> metadata_;
};

// True for the dtypes ReadAsFloat converts (F32, BF16, F16).
bool IsFloatConvertible(const std::string& dtype);

// One tensor to write: fp32 data in host (little-endian) order.
struct SafetensorsEntry {
  std::string name;
  std::vector<int64_t> shape;
  const float* data = nullptr;  // numel(shape) floats
};

// Writes F32 tensors in the given order (data and header alike) with
// "__metadata__" = `metadata` (HF expects {"format": "pt"}); the header is
// padded with spaces to a multiple of 8 bytes, as the reference does. Names
// must be unique, non-empty and not "__metadata__".
Status WriteSafetensors(const std::string& path, const std::vector<SafetensorsEntry>& tensors,
                        const std::map<std::string, std::string>& metadata = {{"format", "pt"}});

// Exact conversions of one 16-bit value to fp32.
float F16ToFloat(uint16_t bits);   // IEEE 754 binary16

}  // namespace herd
