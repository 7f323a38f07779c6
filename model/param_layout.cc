#include "model/param_layout.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "common/rng.h"

namespace herd {

ParamLayout::ParamLayout(const LlamaShape& s) : shape_(s) {
  const int64_t d = s.hidden_size, f = s.intermediate_size, v = s.vocab_size;
  embed_ = Add("model.embed_tokens.weight", {v, d});
  for (int l = 0; l < s.num_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    LayerOffsets o;
    o.input_norm = Add(p + "input_layernorm.weight", {d});
    o.q_proj = Add(p + "self_attn.q_proj.weight", {s.q_dim(), d});
    o.k_proj = Add(p + "self_attn.k_proj.weight", {s.kv_dim(), d});
    o.v_proj = Add(p + "self_attn.v_proj.weight", {s.kv_dim(), d});
    o.o_proj = Add(p + "self_attn.o_proj.weight", {d, s.q_dim()});
    o.post_norm = Add(p + "post_attention_layernorm.weight", {d});
    o.gate_proj = Add(p + "mlp.gate_proj.weight", {f, d});
    o.up_proj = Add(p + "mlp.up_proj.weight", {f, d});
    o.down_proj = Add(p + "mlp.down_proj.weight", {d, f});
    layers_.push_back(o);
  }
  final_norm_ = Add("model.norm.weight", {d});
  lm_head_ = s.tie_word_embeddings ? embed_ : Add("lm_head.weight", {v, d});
}

int64_t ParamLayout::Add(std::string name, std::vector<int64_t> shape) {
  TensorSpec t;
  t.name = std::move(name);
  t.shape = std::move(shape);
  t.numel = 1;
  for (int64_t n : t.shape) t.numel *= n;
  t.offset = size_;
  size_ += (t.numel + kAlign - 1) / kAlign * kAlign;
  num_parameters_ += t.numel;
  tensors_.push_back(std::move(t));
  return tensors_.back().offset;
}

const TensorSpec* ParamLayout::Find(std::string_view name) const {
  for (const TensorSpec& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

void InitTensor(const TensorSpec& tensor, uint64_t seed, double std, float* data) {
  if (tensor.shape.size() == 1) {
    std::fill(data, data + tensor.numel, 1.0f);
    return;
  }
  Rng rng(Mix64(seed) ^ HashName(tensor.name));
  for (int64_t i = 0; i < tensor.numel; ++i) data[i] = static_cast<float>(std * rng.Normal());
}

std::vector<int64_t> ParamLayout::UnitBoundaries() const {
  std::vector<int64_t> units{0};
  for (const LayerOffsets& l : layers_) units.push_back(l.input_norm);
  units.push_back(final_norm_);
  units.push_back(size_);
  units.erase(std::unique(units.begin(), units.end()), units.end());
  return units;
}

void InitParameters(const ParamLayout& layout, uint64_t seed, double std, float* params) {
  InitParameterRange(layout, seed, std, 0, layout.size(), params);
}

void InitParameterRange(const ParamLayout& layout, uint64_t seed, double std, int64_t begin, int64_t end,
                        float* out) {
  std::memset(out, 0, sizeof(float) * (end - begin));
  std::vector<float> whole;
  for (const TensorSpec& t : layout.tensors()) {
    const int64_t lo = std::max(begin, t.offset), hi = std::min(end, t.offset + t.numel);
    if (lo >= hi) continue;
    if (lo == t.offset && hi == t.offset + t.numel) {
      InitTensor(t, seed, std, out + (t.offset - begin));
      continue;
    }
    // A tensor cut by the range: its values depend on the whole stream.
    whole.resize(t.numel);
    InitTensor(t, seed, std, whole.data());
    std::copy(whole.begin() + (lo - t.offset), whole.begin() + (hi - t.offset), out + (lo - begin));
  }
}

double LayerTrainingFlopsPerToken(const LlamaShape& s, int seq_len) {
  const double d = s.hidden_size;
  const double matrices = d * s.q_dim() * 2 + d * s.kv_dim() * 2 + d * s.intermediate_size * 3.0;
  return 6.0 * matrices + 12.0 * d * seq_len;
}

double HeadTrainingFlopsPerToken(const LlamaShape& s) { return 6.0 * s.hidden_size * static_cast<double>(s.vocab_size); }

double TrainingFlopsPerToken(const LlamaShape& shape, int seq_len) {
  return shape.num_layers * LayerTrainingFlopsPerToken(shape, seq_len) + HeadTrainingFlopsPerToken(shape);
}

}  // namespace herd
