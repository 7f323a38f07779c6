#include "sharding/tensor_slices.h"

#include <cstring>
#include <string>
#include <string_view>

namespace herd {
namespace {

LlamaShape RankShape(const LlamaShape& s, int ranks) {
  LlamaShape r = s;
  r.explicit_head_dim = s.head_dim();
  r.num_heads /= ranks;
  r.num_kv_heads /= ranks;
  r.intermediate_size /= ranks;
  r.vocab_size /= ranks;
  return r;
}

// Row-parallel matrices: a rank holds some of their input columns.
bool SplitsColumns(std::string_view name) {
  return name.ends_with("self_attn.o_proj.weight") || name.ends_with("mlp.down_proj.weight");
}

}  // namespace

StatusOr<TensorSlices> TensorSlices::Make(const LlamaShape& shape, int ranks, int rank) {
  const std::string T = std::to_string(ranks);
  if (ranks < 1 || rank < 0 || rank >= ranks) {
    return Status::InvalidArgument("cluster.tensor_parallel: rank " + std::to_string(rank) + " of " + T);
  }
  auto divides = [&](int n, const char* what) -> Status {
    if (n % ranks == 0) return Status::OK();
    return Status::InvalidArgument("cluster.tensor_parallel: " + T + " does not divide the model's " +
                                   std::to_string(n) + " " + what);
  };
  HERD_RETURN_IF_ERROR(divides(shape.num_heads, "attention heads (model.num_attention_heads)"));
  HERD_RETURN_IF_ERROR(divides(shape.num_kv_heads, "key/value heads (model.num_key_value_heads)"));
  HERD_RETURN_IF_ERROR(divides(shape.intermediate_size, "intermediate columns (model.intermediate_size)"));
  HERD_RETURN_IF_ERROR(divides(shape.vocab_size, "vocabulary rows (model.vocab_size)"));
  return TensorSlices(shape, ranks, rank);
}

TensorSlices::TensorSlices(const LlamaShape& shape, int ranks, int rank)
    : ranks_(ranks), rank_(rank), local_(RankShape(shape, ranks)) {
  vocab_first_ = static_cast<int64_t>(rank) * (shape.vocab_size / ranks);
  const ParamLayout flat(shape);
  // The two layouts add the same tensors in the same order.
  for (size_t i = 0; i < flat.tensors().size(); ++i) {
    const TensorSpec& g = flat.tensors()[i];
    const TensorSpec& l = local_.tensors()[i];
    if (g.shape.size() == 1) {
      runs_.push_back({{g.offset, g.offset + g.numel}, l.offset, /*replicated=*/true});
    } else if (SplitsColumns(g.name)) {
      // Each row's columns [rank * mine, (rank + 1) * mine).
      const int64_t rows = g.shape[0], cols = g.shape[1], mine = cols / ranks;
      for (int64_t row = 0; row < rows; ++row) {
        const int64_t begin = g.offset + row * cols + rank * mine;
        runs_.push_back({{begin, begin + mine}, l.offset + row * mine});
      }
    } else {
      const int64_t mine = l.numel;  // rows [rank * r, (rank + 1) * r) whole
      runs_.push_back({{g.offset + rank * mine, g.offset + (rank + 1) * mine}, l.offset});
    }
  }
}

void TensorSlices::Pack(const float* flat, float* local) const {
  for (const Run& r : runs_) std::memcpy(local + r.local, flat + r.flat.begin, r.flat.size() * sizeof(float));
}

void TensorSlices::Unpack(const float* local, float* flat) const {
  for (const Run& r : runs_) std::memcpy(flat + r.flat.begin, local + r.local, r.flat.size() * sizeof(float));
}

std::vector<ParamRange> TensorSlices::Ranges() const {
  std::vector<ParamRange> out;
  for (const Run& r : runs_) out.push_back(r.flat);
  return out;
}

}  // namespace herd
