// The shape of a Llama model, derived from config::ModelConfig (HF names).
#pragma once

#include <cstdint>
#include <functional>

#include "common/partition.h"
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
  // 0: hidden_size / num_heads. A tensor-parallel rank's shape
  // (sharding/tensor_slices.h), whose heads are a part of the model's,
  // keeps the model's head size here.
  int explicit_head_dim = 0;

  int head_dim() const { return explicit_head_dim > 0 ? explicit_head_dim : hidden_size / num_heads; }
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

// A tensor-parallel rank's part (cluster.tensor_parallel, Megatron's
// split): a LlamaModel (model/llama.h) made with the rank's shape (sharding/tensor_slices.h:
// its heads, intermediate columns and vocabulary rows, of `ranks`) computes
// its part of every product, and `all_reduce` sums over the ranks, in
// place and the same on every rank, what the layers need whole: o_proj's
// and down_proj's outputs forward, the norms' input gradients backward,
// the embedding's lookup (each rank's rows from `vocab_first`), the
// head's input gradient and the cross-entropy's statistics (no rank holds
// a whole row of logits). Every rank calls it in the same order with the
// same sizes.
//
// Sequence parallelism (cluster.sequence_parallel, Korthikanti et al.
// 2022): the norms and the residual stream hold this rank's rows of the
// B x T tokens alone (EvenPartition(B x T, ranks), rank order), so their
// activations are divided by `ranks`; where the layers would all-reduce a
// [tokens, hidden] sum, `reduce_scatter` leaves each rank its rows' sums,
// and `all_gather` makes the products' inputs whole from every rank's
// rows. Both take the elements of each rank's part (`parts`), work in
// place and are called by every rank in the same order. The norms'
// weight gradients are then each rank's rows' part: the caller sums them
// over the group.
template <typename T>
struct TensorGroup {
  int ranks = 1, rank = 0;
  int64_t vocab_first = 0;
  std::function<void(T* data, int64_t n)> all_reduce;
  bool sequence_parallel = false;
  std::function<void(T* data, const Partition& parts)> all_gather, reduce_scatter;
};

// TensorGroup for a model on a CUDA device (model/cuda/llama_cuda.h):
// the same part and the same sums, of device buffers, each ordered on the
// model's stream (a cudaStream_t, opaque here so that this header needs
// no CUDA): after the work issued there before it, before what follows.
// `element_bytes`: 4 (fp32) or 2 (bf16, a bf16 model's activations).
// With sequence parallelism, TensorGroup's gathers and reduce-scatters
// likewise (`parts` in elements).
struct DeviceTensorGroup {
  int ranks = 1, rank = 0;
  int64_t vocab_first = 0;
  std::function<void(void* data, int64_t n, int element_bytes, void* stream)> all_reduce;
  bool sequence_parallel = false;
  std::function<void(void* data, const Partition& parts, int element_bytes, void* stream)> all_gather,
      reduce_scatter;
};

// ContextGroup for a model on a CUDA device: the same cut, its gathers
// and reduce-scatters of device buffers ordered on the model's stream
// (DeviceTensorGroup's conventions).
struct DeviceContextGroup {
  int ranks = 1, rank = 0;
  std::function<void(void* data, const Partition& parts, int element_bytes, void* stream)> all_gather,
      reduce_scatter;
};

// A context-parallel rank's part (cluster.context_parallel: C ranks): each
// sequence of a micro-batch is cut into 2C chunks and rank r computes
// chunks r and 2C - 1 - r, an early one and a late one, so that every
// rank's causal attention costs alike (torchtitan's load balance). A
// model given the whole sequences computes its chunks' tokens alone: it
// gathers the group's keys and values for attention (`all_gather`, before
// its forward's and again before its backward's) and reduce-scatters
// their gradients' sums back (`reduce_scatter`; both as TensorGroup's). The
// loss it returns is its tokens' mean; the caller sums the gradients over
// the group, as over data-parallel replicas.
template <typename T>
struct ContextGroup {
  int ranks = 1, rank = 0;
  std::function<void(T* data, const Partition& parts)> all_gather, reduce_scatter;
};

// The one cut of context parallelism: row t of the 2 x `chunk` rows that
// `rank` of `ranks` computes is this position of its sequence ...
inline int64_t ContextPosition(int rank, int ranks, int64_t chunk, int64_t t) {
  return t < chunk ? rank * chunk + t : (2 * ranks - 1 - rank) * chunk + (t - chunk);
}
// ... and position p is row `row` of rank `rank`.
struct ContextRow {
  int rank;
  int64_t row;
};
inline ContextRow ContextRowOf(int ranks, int64_t chunk, int64_t position) {
  const int64_t k = position / chunk;  // the chunk it is in
  return k < ranks ? ContextRow{static_cast<int>(k), position % chunk}
                   : ContextRow{static_cast<int>(2 * ranks - 1 - k), chunk + position % chunk};
}

// How a model's tokens are split across ranks: sequence parallelism's
// rows of the norms and residual stream (TensorGroup), context
// parallelism's chunks of every sequence (ContextGroup).
struct TokenSplit {
  int sequence = 1, context = 1;
};

// The decoder layers [first, end) a model computes (end -1: through the
// last). The model that starts at layer 0 embeds the tokens; the one that
// ends at the last layer holds the final norm and the head. A pipeline
// stage (sharding/pipeline_split.h) is a model over its layers.
struct LayerRange {
  int first = 0, end = -1;
};

// What backward recomputes rather than keeps (train.recompute).
enum class Recompute { kNone, kAttention, kFull };

}  // namespace herd
