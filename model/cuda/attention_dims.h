// The shape arguments every attention kernel takes (attention.cu and
// attention_tc.cu), passed by value to the device.
#pragma once

#include <cmath>
#include <cstdint>

namespace herd::cuda {

struct AttentionDims {
  int64_t T, H, KV, group;  // group = H / KV query heads per key/value head
  float scale;              // 1 / sqrt(head_dim)
  // Context parallelism (attention.cu's kernels only): the keys' rows a
  // sequence (T otherwise), and each query row's position among them
  // (increasing; null: row t is position t).
  int64_t Tk = 0;
  const int32_t* positions = nullptr;

  static AttentionDims Make(int64_t T_, int64_t H, int64_t KV, int64_t head_dim) {
    return {T_, H, KV, H / KV, static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim))), T_, nullptr};
  }
};

}  // namespace herd::cuda
