// The shape of a Llama model, derived from config::ModelConfig (HF names).
#pragma once

#include <algorithm>
#include <cstdint>

#include "model/rope_scaling.h"
#include "proto/herd.pb.h"

namespace herd {

struct LlamaShape {
  int vocab_size = 0;
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_layers = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;  // unset: plain RoPE
  double rms_norm_eps = 1e-5;
  bool tie_word_embeddings = true;

  int head_dim() const { return hidden_size / num_heads; }
  int q_dim() const { return num_heads * head_dim(); }
  int kv_dim() const { return num_kv_heads * head_dim(); }

  static LlamaShape FromConfig(const config::ModelConfig& m) {
    LlamaShape s;
    s.vocab_size = m.vocab_size();
    s.hidden_size = m.hidden_size();
    s.intermediate_size = m.intermediate_size();
    s.num_layers = m.num_hidden_layers();
    s.num_heads = m.num_attention_heads();
    s.num_kv_heads = m.num_key_value_heads();
    s.rope_theta = m.rope_theta();
    if (m.rope_scaling().rope_type() == config::RopeScaling::LLAMA3) {
      s.rope_scaling.factor = m.rope_scaling().factor();
      s.rope_scaling.low_freq_factor = m.rope_scaling().low_freq_factor();
      s.rope_scaling.high_freq_factor = m.rope_scaling().high_freq_factor();
      s.rope_scaling.original_max_position_embeddings = m.rope_scaling().original_max_position_embeddings();
    }
    s.rms_norm_eps = m.rms_norm_eps();
    s.tie_word_embeddings = m.tie_word_embeddings();
    return s;
  }
};

// What backward recomputes rather than keeps (train.recompute).
enum class Recompute { kNone, kAttention, kFull };

inline Recompute RecomputeFromConfig(const config::TrainConfig& t) {
  switch (t.recompute()) {
    case config::TrainConfig::ATTENTION:
      return Recompute::kAttention;
    case config::TrainConfig::FULL:
      return Recompute::kFull;
    default:
      return Recompute::kNone;
  }
}

// How many micro-batches a CPU worker's model keeps activations for at
// once: a step's all (train.grad_accum) when it streams its weights
// (cluster.stream_weights) and the embeddings are untied, so that one
// layer-major pass serves them all (LlamaModel::ForwardBackwardLayerMajor:
// each unit pulled once a pass, no gradient kept whole until the last
// micro-batch, the same bits); else 1, one micro-batch after the other.
inline int MicroBatchSlots(const config::JobConfig& c) {
  const bool layer_major = c.cluster().sync() == config::ClusterConfig::PARAMETER_SERVER &&
                           c.cluster().stream_weights() && !c.model().tie_word_embeddings() &&
                           c.device().kind() == config::DeviceConfig::CPU;
  return layer_major ? std::max(1, c.train().grad_accum()) : 1;
}

}  // namespace herd
