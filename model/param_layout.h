// The flat parameter space: every parameter of the model in one buffer, in a
// fixed order (forward order, HuggingFace names), each tensor starting at a
// 64-element aligned offset. Gradients, AdamW moments, shards, buckets and
// checkpoints all use this layout; a range [begin, end) of it is the unit
// everything else moves.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "model/llama_config.h"

namespace herd {

// A range [begin, end) of the flat parameter space: what shards, buckets,
// collective chunks and optimizer state are made of.
struct ParamRange {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
};

struct TensorSpec {
  std::string name;             // e.g. "model.layers.0.self_attn.q_proj.weight"
  std::vector<int64_t> shape;   // row-major, HF/PyTorch order ([out, in] for linears)
  int64_t offset = 0;           // first element in the flat space, multiple of 64
  int64_t numel = 0;
  // AdamW weight decay applies to matrices (2-D) only, never to norms.
  bool decay() const { return shape.size() == 2; }
};

// Offsets of one decoder layer's tensors.
struct LayerOffsets {
  int64_t input_norm, q_proj, k_proj, v_proj, o_proj, post_norm, gate_proj, up_proj, down_proj;
};

class ParamLayout {
 public:
  static constexpr int64_t kAlign = 64;

  explicit ParamLayout(const LlamaShape& shape);

  const LlamaShape& shape() const { return shape_; }
  const std::vector<TensorSpec>& tensors() const { return tensors_; }
  // Total elements, padding included; a multiple of kAlign.
  int64_t size() const { return size_; }
  // Sum of the tensors' elements (the model's parameter count).
  int64_t num_parameters() const { return num_parameters_; }
  const TensorSpec* Find(std::string_view name) const;

  int64_t embed() const { return embed_; }
  const LayerOffsets& layer(int l) const { return layers_[l]; }
  int64_t final_norm() const { return final_norm_; }
  // Equals embed() when the embeddings are tied.
  int64_t lm_head() const { return lm_head_; }
  // The offsets that cut the space into the units a pass moves through,
  // ascending: 0 (the embedding), each layer's begin, the final norm's
  // (the final norm with the head, or the final norm alone when tied),
  // size(). Unit i is [units[i], units[i + 1]).
  std::vector<int64_t> UnitBoundaries() const;

 private:
  int64_t Add(std::string name, std::vector<int64_t> shape);

  LlamaShape shape_;
  std::vector<TensorSpec> tensors_;
  std::vector<LayerOffsets> layers_;
  int64_t embed_ = 0, final_norm_ = 0, lm_head_ = 0;
  int64_t size_ = 0, num_parameters_ = 0;
};

// Deterministic initialisation from (seed, tensor name): matrices ~ N(0,
// std), norm weights = 1, padding = 0. The value of a tensor depends only on
// its name, so any partition of the flat space initialises identically.
void InitParameters(const ParamLayout& layout, uint64_t seed, double std, float* params);
// The same values for [begin, end) only (a server's shard): out[0] is
// element `begin`.
void InitParameterRange(const ParamLayout& layout, uint64_t seed, double std, int64_t begin, int64_t end, float* out);
void InitTensor(const TensorSpec& tensor, uint64_t seed, double std, float* data);

// The FLOPs of training on one token (forward and backward), the count
// MFU divides by: 6 per weight of every matrix product (the lm_head
// included, the embedding lookup of an untied model not: it is no
// product), plus 12 x layers x hidden x seq_len for the attention scores
// and their use (PaLM's and torchtitan's convention; causal masking not
// discounted).
double TrainingFlopsPerToken(const LlamaShape& shape, int seq_len);
// Its parts: one decoder layer's (its products and attention) and the
// head's; TrainingFlopsPerToken is num_layers of the first and the second.
double LayerTrainingFlopsPerToken(const LlamaShape& shape, int seq_len);
double HeadTrainingFlopsPerToken(const LlamaShape& shape);

}  // namespace herd
