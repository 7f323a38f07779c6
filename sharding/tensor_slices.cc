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
      copies_.push_back({g.offset, 0, l.offset, g.numel, 1});
    } else if (SplitsColumns(g.name)) {
      const int64_t rows = g.shape[0], cols = g.shape[1], mine = cols / ranks;
      copies_.push_back({g.offset + rank * mine, cols, l.offset, mine, rows});
    } else {
      const int64_t mine = l.numel;  // rows [rank * r, (rank + 1) * r) whole
      copies_.push_back({g.offset + rank * mine, 0, l.offset, mine, 1});
    }
  }
}

void TensorSlices::Pack(const float* flat, float* local) const {
  for (const Copy& c : copies_) {
    for (int64_t i = 0; i < c.rows; ++i) {
      std::memcpy(local + c.local_begin + i * c.length, flat + c.flat_begin + i * c.flat_stride,
                  c.length * sizeof(float));
    }
  }
}

void TensorSlices::Unpack(const float* local, float* flat) const {
  for (const Copy& c : copies_) {
    for (int64_t i = 0; i < c.rows; ++i) {
      std::memcpy(flat + c.flat_begin + i * c.flat_stride, local + c.local_begin + i * c.length,
                  c.length * sizeof(float));
    }
  }
}

std::vector<ParamRange> TensorSlices::Ranges() const {
  std::vector<ParamRange> out;
  for (const Copy& c : copies_) {
    for (int64_t i = 0; i < c.rows; ++i) {
      const int64_t begin = c.flat_begin + i * c.flat_stride;
      out.push_back({begin, begin + c.length});
    }
  }
  return out;
}

}  // namespace herd
