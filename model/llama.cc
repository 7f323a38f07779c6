#include "model/llama.h"

#include <glog/logging.h>

#include <algorithm>
#include <cstring>

#include "common/trace.h"
#include "model/cpu/ops.h"

namespace herd {

using namespace cpu;  // NOLINT: the kernels are this file's vocabulary

// Every activation the backward pass needs, by name, sized for max_batch x
// max_seq_len tokens. Per-layer buffers are [layers][...] in one allocation,
// as many layers as the recompute mode keeps (the others are recomputed
// into one layer's room). A model with several slots (layer-major passes
// over micro-batches) has one of these per slot; slot 0 alone holds the
// buffers every slot shares (the table's `shared` ones: RoPE tables, the
// head's, backward's scratch), the others only their own.
template <typename T>
struct LlamaModel<T>::Activations {
  int64_t N = 0, d = 0, qd = 0, kvd = 0, f = 0, v = 0, tt = 0, L = 0, H = 0, KV = 0;
  int seq_ranks = 1;  // the sequence-parallel ranks
  int ctx_ranks = 1;  // the context-parallel ranks: N is max_batch x max_seq_len / ctx_ranks tokens
  int64_t Tk = 0;     // keys of the last Forward: its whole sequences' length
  int64_t R = 0;      // rows of the residual stream's and norms' buffers: N / seq_ranks, rounded up
  int64_t first = 0;  // the model's first layer: layer l's buffers are at l - first
  Recompute recompute = Recompute::kNone;
  bool split = false;  // the backward split in two (SplitBackward): the weight part's inputs kept

  std::vector<int32_t> tokens, targets;   // [N]
  std::vector<T> rope_cos, rope_sin;      // [max_seq_len, head_dim/2]
  // Sequence parallelism keeps R of the N rows of residual, ln1, residual_mid, ln2 and their rstds.
  std::vector<T> residual;                // [L+1, N, d]: input of layer l; [L] = final (L: the model's layers)
  // From here to act: [L, ...] (FULL: [1, ...]).
  std::vector<T> ln1, ln1_rstd;           // [L, N, d], [L, N]
  std::vector<T> q, k, v_;                // [L, N, qd], [L, N, kvd] x2 (after RoPE)
  std::vector<T> probs;                   // [L, B, H, T, T] (ATTENTION, FULL: [1, ...])
  std::vector<T> att;                     // [L, N, qd] attention output
  std::vector<T> residual_mid;            // [L, N, d] after the attention branch
  std::vector<T> ln2, ln2_rstd;           // [L, N, d], [L, N]
  std::vector<T> gate, up, act;           // [L, N, f]
  std::vector<T> lnf, lnf_rstd;           // [N, d], [R]
  std::vector<T> whole;                   // [N, d]: sequence parallelism's gathered rows and partial sums
  // Context parallelism (ctx_ranks C > 1; S = max_seq_len, N = B x S / C):
  std::vector<int32_t> positions;         // [S / C]: this rank's tokens' positions in their sequence
  std::vector<T> rope_local_cos, rope_local_sin;  // [S / C, head_dim/2]: the RoPE tables' rows at positions
  std::vector<T> kv_ranks;                // [C, 2, B, S / C, kvd]: the group's keys and values as gathered
  std::vector<T> k_all, v_all;            // [B, S, kvd]: in position order
  std::vector<T> dk_all, dv_all;          // [B, S, kvd]: their gradients from this rank's queries
  std::vector<T> logits;                  // [N, v] (dlogits in place in backward)
  std::vector<T> losses;                  // [N]
  std::vector<T> lse;                     // [N]: tensor-parallel, each row's log-sum-exp over the vocabulary
  // Backward: d(the current layer's output), carried down the layers; and
  // scratch reused by every layer.
  std::vector<T> dresidual;
  std::vector<T> dln, datt, dq, dk, dv, dact, dgate, dup, attn_scratch;
  // A split backward (zero-bubble pipelines): each layer's gradients of its
  // products' and norms' outputs, kept from the input-gradient part for
  // the weight-gradient part: [L, N, ...].
  std::vector<T> w_down, w_gate, w_up, w_post, w_o, w_q, w_k, w_v, w_in;

  int B = 0, Tcur = 0;  // shape of the last Forward
  bool has_targets = false;
  int64_t max_batch = 0;

  // Layer l's buffers. Layer l reads residual[l] and writes residual[l+1];
  // each per-layer buffer is strided by its maximum size so that every layer
  // has a fixed home whatever B and T the call uses.
  struct Layer {
    T *x, *x_out, *ln1, *ln1_rstd, *q, *k, *v, *probs, *att, *mid, *ln2, *ln2_rstd, *gate, *up, *act;
  };
  // Every floating-point buffer above with its element count for
  // max_batch x max_seq_len tokens: the one list that sizes the allocation
  // (the constructor; backward's scratch on the first Backward, grown when
  // the thread count grows) and the memory plan (ActivationBytes), as
  // llm.c's fill_in_activation_sizes. tokens and targets: N int32 each.
  struct Buffer {
    std::vector<T> Activations::*member;
    int64_t elements;
    bool backward_scratch;
    bool shared;  // one for every slot, in slot 0
  };
  static std::vector<Buffer> Table(const LlamaShape& s, int max_batch, int max_seq_len, Recompute recompute,
                                   int first, int end, bool split, TokenSplit ranks) {
    const int64_t C = ranks.context, S = max_seq_len, Sl = S / C;  // Sl: a rank's tokens of a sequence
    const int64_t N = max_batch * Sl, d = s.hidden_size;
    const int64_t R = (N + ranks.sequence - 1) / ranks.sequence;
    const int64_t all_kv = C > 1 ? max_batch * S * s.kv_dim() : 0;
    // Layers kept: L holds every layer's intermediates, the probabilities Lp.
    const int64_t layers = end - first;
    const int64_t L = recompute == Recompute::kFull ? 1 : layers;
    const int64_t Lp = recompute == Recompute::kNone ? layers : 1;
    const int64_t head = end == s.num_layers ? 1 : 0;  // the final norm's and the head's buffers
    const int64_t W = split ? layers : 0;               // layers whose weight part is kept for later
    const int64_t qd = s.q_dim(), kvd = s.kv_dim(), f = s.intermediate_size;
    const int64_t probs_elements = Lp * max_batch * s.num_heads * Sl * S;
    const int64_t rope_elements = static_cast<int64_t>(max_seq_len) * s.head_dim() / 2;
    using A = Activations;
    return {
        {&A::rope_cos, rope_elements, false, true},
        {&A::rope_sin, rope_elements, false, true},
        {&A::residual, (layers + 1) * R * d, false, false},
        {&A::ln1, L * R * d, false, false},
        {&A::ln1_rstd, L * R, false, false},
        {&A::q, L * N * qd, false, false},
        {&A::k, L * N * kvd, false, false},
        {&A::v_, L * N * kvd, false, false},
        {&A::probs, probs_elements, false, false},
        {&A::att, L * N * qd, false, false},
        {&A::residual_mid, L * R * d, false, false},
        {&A::ln2, L * R * d, false, false},
        {&A::ln2_rstd, L * R, false, false},
        {&A::gate, L * N * f, false, false},
        {&A::up, L * N * f, false, false},
        {&A::act, L * N * f, false, false},
        {&A::lnf, head * N * d, false, true},
        {&A::lnf_rstd, head * R, false, true},
        {&A::whole, ranks.sequence > 1 ? N * d : 0, false, true},
        {&A::rope_local_cos, C > 1 ? Sl * s.head_dim() / 2 : 0, false, true},
        {&A::rope_local_sin, C > 1 ? Sl * s.head_dim() / 2 : 0, false, true},
        {&A::kv_ranks, 2 * all_kv, false, true},
        {&A::k_all, all_kv, false, true},
        {&A::v_all, all_kv, false, true},
        {&A::dk_all, all_kv, true, true},
        {&A::dv_all, all_kv, true, true},
        {&A::logits, head * N * s.vocab_size, false, true},
        {&A::losses, head * N, false, true},
        {&A::lse, head * N, false, true},
        {&A::dresidual, R * d, true, false},
        {&A::dln, N * d, true, true},
        {&A::datt, N * qd, true, true},
        {&A::dq, N * qd, true, true},
        {&A::dk, N * kvd, true, true},
        {&A::dv, N * kvd, true, true},
        {&A::dact, N * f, true, true},
        {&A::dgate, N * f, true, true},
        {&A::dup, N * f, true, true},
        {&A::attn_scratch, AttentionScratchSize(Sl, s.num_heads, s.num_kv_heads, S), true, true},
        {&A::w_down, W * N * d, true, false},
        {&A::w_gate, W * N * f, true, false},
        {&A::w_up, W * N * f, true, false},
        {&A::w_post, W * N * d, true, false},
        {&A::w_o, W * N * d, true, false},
        {&A::w_q, W * N * qd, true, false},
        {&A::w_k, W * N * kvd, true, false},
        {&A::w_v, W * N * kvd, true, false},
        {&A::w_in, W * N * d, true, false},
    };
  }
  // Sizes every buffer of the table that `backward_scratch` selects, the
  // shared ones only in slot 0 (`owns_shared`); grows, never shrinks.
  void Allocate(const LlamaShape& s, int max_batch, int max_seq_len, int end, bool backward_scratch,
                bool owns_shared) {
    for (const Buffer& b :
         Table(s, max_batch, max_seq_len, recompute, static_cast<int>(first), end, split, {seq_ranks, ctx_ranks})) {
      std::vector<T>& v = this->*b.member;
      if (b.backward_scratch == backward_scratch && (owns_shared || !b.shared) &&
          static_cast<int64_t>(v.size()) < b.elements) {
        v.resize(b.elements);
      }
    }
  }

  Layer layer(int64_t global_l) {
    const int64_t l = global_l - first;
    const int64_t i = recompute == Recompute::kFull ? 0 : l;   // where layer l's intermediates live
    const int64_t p = recompute == Recompute::kNone ? l : 0;   // and its probabilities
    return {residual.data() + l * R * d,      residual.data() + (l + 1) * R * d, ln1.data() + i * R * d,
            ln1_rstd.data() + i * R,          q.data() + i * N * qd,             k.data() + i * N * kvd,
            v_.data() + i * N * kvd,          probs.data() + p * max_batch * H * tt,
            att.data() + i * N * qd,          residual_mid.data() + i * R * d,   ln2.data() + i * R * d,
            ln2_rstd.data() + i * R,          gate.data() + i * N * f,           up.data() + i * N * f,
            act.data() + i * N * f};
  }
};


template <typename T>
int64_t LlamaModel<T>::ActivationBytes(const LlamaShape& shape, int max_batch, int max_seq_len, Recompute recompute,
                                       int slots, LayerRange layers, bool split_backward, TokenSplit split) {
  const int end = layers.end < 0 ? shape.num_layers : layers.end;
  int64_t floats = 0;
  for (const auto& b :
       Activations::Table(shape, max_batch, max_seq_len, recompute, layers.first, end, split_backward, split)) {
    floats += b.shared ? b.elements : slots * b.elements;
  }
  const int64_t tokens = static_cast<int64_t>(max_batch) * (max_seq_len / split.context);
  return floats * static_cast<int64_t>(sizeof(T)) + slots * 2 * tokens * static_cast<int64_t>(sizeof(int32_t));
}

template <typename T>
LlamaModel<T>::LlamaModel(const LlamaShape& shape, int max_batch, int max_seq_len, Recompute recompute, int slots,
                          LayerRange layers, bool split_backward, TokenSplit split)
    : layout_(shape),
      max_batch_(max_batch),
      max_seq_len_(max_seq_len),
      first_layer_(layers.first),
      end_layer_(layers.end < 0 ? shape.num_layers : layers.end),
      seq_ranks_(split.sequence),
      ctx_ranks_(split.context) {
  CHECK_GE(slots, 1);
  CHECK(0 <= first_layer_ && first_layer_ <= end_layer_ && end_layer_ <= shape.num_layers &&
        (first_layer_ < end_layer_ || shape.num_layers == 0))
      << "layers [" << first_layer_ << ", " << end_layer_ << ") of " << shape.num_layers;
  CHECK(!split_backward || recompute == Recompute::kNone)
      << "a split backward keeps the activations its weight part reads: no recomputation";
  CHECK(split.context == 1 || (split.context > 1 && max_seq_len % (2 * split.context) == 0))
      << "context parallelism cuts each sequence into 2 x " << split.context << " chunks: " << max_seq_len;
  for (int i = 0; i < slots; ++i) {
    acts_.push_back(std::make_unique<Activations>());
    Activations& a = *acts_.back();
    a.recompute = recompute;
    a.split = split_backward;
    a.N = static_cast<int64_t>(max_batch) * (max_seq_len / ctx_ranks_);
    a.seq_ranks = seq_ranks_;
    a.ctx_ranks = ctx_ranks_;
    a.R = (a.N + seq_ranks_ - 1) / seq_ranks_;
    a.max_batch = max_batch;
    a.d = shape.hidden_size;
    a.qd = shape.q_dim();
    a.kvd = shape.kv_dim();
    a.f = shape.intermediate_size;
    a.v = shape.vocab_size;
    a.tt = static_cast<int64_t>(max_seq_len / ctx_ranks_) * max_seq_len;
    a.L = end_layer_ - first_layer_;
    a.first = first_layer_;
    a.H = shape.num_heads;
    a.KV = shape.num_kv_heads;
    a.tokens.resize(a.N);
    a.targets.resize(a.N);
    a.Allocate(shape, max_batch, max_seq_len, end_layer_, /*backward_scratch=*/false, /*owns_shared=*/i == 0);
  }
  Activations& s = *acts_[0];
  RopeTables(s.rope_cos.data(), s.rope_sin.data(), max_seq_len, shape.head_dim(), shape.rope_theta,
             shape.rope_scaling);
}

template <typename T>
LlamaModel<T>::~LlamaModel() = default;

template <typename T>
void LlamaModel<T>::SetTensorGroup(TensorGroup<T> group) {
  CHECK_EQ(group.sequence_parallel && group.ranks > 1 ? group.ranks : 1, seq_ranks_)
      << "a sequence-parallel group's model is made with its ranks (sequence_ranks)";
  tp_ = std::move(group);
}

template <typename T>
void LlamaModel<T>::SetContextGroup(ContextGroup<T> group) {
  CHECK_EQ(group.ranks, ctx_ranks_) << "a context-parallel group's model is made with its ranks (split.context)";
  cp_ = std::move(group);
}

// kv_ranks holds rank q's keys, then its values, each [B, Tl, kvd]; its
// rows sit at its chunks' positions (ContextPosition).
template <typename T>
template <typename F>
void LlamaModel<T>::ForEachKeyRow(const Activations& a, F fn) const {
  const int64_t Tl = a.Tcur, chunk = Tl / 2;
  for (int q = 0; q < ctx_ranks_; ++q) {
    for (int64_t b = 0; b < a.B; ++b) {
      for (int64_t t = 0; t < Tl; ++t) {
        fn(2 * q * a.B * Tl + b * Tl + t, b * a.Tk + ContextPosition(q, ctx_ranks_, chunk, t));
      }
    }
  }
}

template <typename T>
void LlamaModel<T>::GatherKeysValues(Activations& a, const T* k, const T* v) {
  Activations& sh = *acts_[0];
  const int64_t kvd = a.kvd, rows = a.B * a.Tcur, part = 2 * rows * kvd;
  T* mine = sh.kv_ranks.data() + cp_.rank * part;
  std::copy(k, k + rows * kvd, mine);
  std::copy(v, v + rows * kvd, mine + rows * kvd);
  cp_.all_gather(sh.kv_ranks.data(), Partition(ctx_ranks_, part));
  ForEachKeyRow(a, [&](int64_t from, int64_t to) {
    const T* key = sh.kv_ranks.data() + from * kvd;
    std::copy(key, key + kvd, sh.k_all.begin() + to * kvd);
    std::copy(key + rows * kvd, key + (rows + 1) * kvd, sh.v_all.begin() + to * kvd);
  });
}

template <typename T>
void LlamaModel<T>::ScatterKeyValueGrads(Activations& a, T* dk, T* dv) {
  Activations& sh = *acts_[0];
  const int64_t kvd = a.kvd, rows = a.B * a.Tcur, part = 2 * rows * kvd;
  ForEachKeyRow(a, [&](int64_t to, int64_t from) {
    T* key = sh.kv_ranks.data() + to * kvd;
    std::copy(sh.dk_all.begin() + from * kvd, sh.dk_all.begin() + (from + 1) * kvd, key);
    std::copy(sh.dv_all.begin() + from * kvd, sh.dv_all.begin() + (from + 1) * kvd, key + rows * kvd);
  });
  cp_.reduce_scatter(sh.kv_ranks.data(), Partition(ctx_ranks_, part));
  const T* mine = sh.kv_ranks.data() + cp_.rank * part;
  std::copy(mine, mine + rows * kvd, dk);
  std::copy(mine + rows * kvd, mine + part, dv);
}

template <typename T>
std::pair<const T*, const T*> LlamaModel<T>::RopeRows() const {
  const Activations& sh = *acts_[0];
  if (ctx_ranks_ > 1) return {sh.rope_local_cos.data(), sh.rope_local_sin.data()};
  return {sh.rope_cos.data(), sh.rope_sin.data()};
}

template <typename T>
Partition LlamaModel<T>::RowParts(int64_t N, int64_t width) const {
  Partition parts = EvenPartition(N, seq_ranks_);
  for (int64_t& p : parts) p *= width;
  return parts;
}

template <typename T>
int64_t LlamaModel<T>::FirstRow(int64_t N) const {
  const Partition rows = EvenPartition(N, seq_ranks_);
  int64_t first = 0;
  for (int r = 0; r < tp_.rank && seq_ranks_ > 1; ++r) first += rows[r];
  return first;
}

template <typename T>
int64_t LlamaModel<T>::HeldRows(int64_t N) const {
  return seq_ranks_ > 1 ? EvenPartition(N, seq_ranks_)[tp_.rank] : N;
}

template <typename T>
const T* LlamaModel<T>::Gathered(const T* mine, int64_t N, int64_t d) {
  if (seq_ranks_ == 1) return mine;
  T* whole = acts_[0]->whole.data();
  T* at = whole + FirstRow(N) * d;
  if (mine != at) std::copy(mine, mine + HeldRows(N) * d, at);
  tp_.all_gather(whole, RowParts(N, d));
  return whole;
}

template <typename T>
const T* LlamaModel<T>::Summed(T* part, int64_t N, int64_t d) {
  if (seq_ranks_ == 1) {
    AllReduce(part, N * d);
    return part;
  }
  tp_.reduce_scatter(part, RowParts(N, d));
  return part + FirstRow(N) * d;
}

template <typename T>
const T* LlamaModel<T>::logits() const {
  return acts_[0]->logits.data();
}

// Layer l's tensors end where the next layer's (or the final norm) begin.
template <typename T>
int64_t LlamaModel<T>::LayerEnd(int l) const {
  return l + 1 < shape().num_layers ? layout_.layer(l + 1).input_norm : layout_.final_norm();
}

template <typename T>
void LlamaModel<T>::TakeRows(Activations& a, const int32_t* tokens, const int32_t* targets, int B, int T_) {
  a.B = B;
  a.Tk = T_;
  a.has_targets = targets != nullptr;
  if (ctx_ranks_ == 1) {
    a.Tcur = T_;
    if (tokens != nullptr) std::copy(tokens, tokens + static_cast<int64_t>(B) * T_, a.tokens.begin());
    if (targets != nullptr) std::copy(targets, targets + static_cast<int64_t>(B) * T_, a.targets.begin());
    return;
  }
  // This rank's chunks of every sequence, and RoPE's rows at their positions.
  CHECK_EQ(T_ % (2 * ctx_ranks_), 0) << "context parallelism cuts each sequence into 2 x " << ctx_ranks_
                                     << " chunks: " << T_;
  Activations& sh = *acts_[0];
  const int64_t chunk = T_ / (2 * ctx_ranks_), Tl = 2 * chunk, half = layout_.shape().head_dim() / 2;
  a.Tcur = static_cast<int>(Tl);
  sh.positions.resize(Tl);
  for (int64_t t = 0; t < Tl; ++t) {
    sh.positions[t] = static_cast<int32_t>(ContextPosition(cp_.rank, ctx_ranks_, chunk, t));
    std::copy(sh.rope_cos.begin() + sh.positions[t] * half, sh.rope_cos.begin() + (sh.positions[t] + 1) * half,
              sh.rope_local_cos.begin() + t * half);
    std::copy(sh.rope_sin.begin() + sh.positions[t] * half, sh.rope_sin.begin() + (sh.positions[t] + 1) * half,
              sh.rope_local_sin.begin() + t * half);
  }
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < Tl; ++t) {
      if (tokens != nullptr) a.tokens[b * Tl + t] = tokens[b * T_ + sh.positions[t]];
      if (targets != nullptr) a.targets[b * Tl + t] = targets[b * T_ + sh.positions[t]];
    }
  }
}

template <typename T>
void LlamaModel<T>::EmbedForward(Activations& a, const T* params, const int32_t* tokens, const int32_t* targets, int B,
                                 int T_) {
  TakeRows(a, tokens, targets, B, T_);
  const int64_t N = static_cast<int64_t>(B) * a.Tcur;
  tokens = a.tokens.data();
  trace::Span span("embedding forward", "compute");
  if (tp_.ranks == 1) return EmbeddingForward(a.residual.data(), tokens, params + layout_.embed(), N, a.d);
  // This rank's rows of the vocabulary, the others' summed in.
  T* lookup = seq_ranks_ > 1 ? acts_[0]->whole.data() : a.residual.data();
  EmbeddingForward(lookup, tokens, params + layout_.embed(), N, a.d, tp_.vocab_first, a.v);
  const T* mine = Summed(lookup, N, a.d);
  if (mine != a.residual.data()) std::copy(mine, mine + HeldRows(N) * a.d, a.residual.begin());
}

template <typename T>
double LlamaModel<T>::HeadForward(Activations& a, const T* params) {
  Activations& sh = *acts_[0];
  const LlamaShape& s = layout_.shape();
  const int64_t N = static_cast<int64_t>(a.B) * a.Tcur, d = a.d;
  const T* x_final = a.residual.data() + a.L * a.R * d;
  trace::Span span("head forward", "compute");
  // The final norm of this rank's rows, where the gather puts them.
  T* lnf_mine = sh.lnf.data() + FirstRow(N) * d;
  RmsNormForward(lnf_mine, sh.lnf_rstd.data(), x_final, params + layout_.final_norm(), HeldRows(N), d,
                 s.rms_norm_eps);
  if (seq_ranks_ > 1) tp_.all_gather(sh.lnf.data(), RowParts(N, d));
  MatmulForward(sh.logits.data(), sh.lnf.data(), params + layout_.lm_head(), N, d, a.v);
  if (!a.has_targets) return 0.0;
  if (tp_.ranks == 1) return CrossEntropyForward(sh.losses.data(), sh.logits.data(), a.targets.data(), N, a.v);
  const int64_t n = N * VocabStatsWidth(tp_.ranks);
  if (static_cast<int64_t>(vocab_stats_.size()) < n) vocab_stats_.resize(n);
  VocabParallelStats(vocab_stats_.data(), sh.logits.data(), a.targets.data(), N, a.v, tp_.vocab_first, tp_.rank,
                     tp_.ranks);
  AllReduce(vocab_stats_.data(), n);
  return VocabParallelLoss(sh.lse.data(), sh.losses.data(), vocab_stats_.data(), N, tp_.ranks);
}

template <typename T>
double LlamaModel<T>::Forward(const T* params, const int32_t* tokens, const int32_t* targets, int B, int T_,
                              const NeedUpTo& need) {
  CHECK(embeds() && has_head()) << "Forward on a model of part of the layers: use StageForward";
  Activations& a = *acts_[0];
  const LlamaShape& s = layout_.shape();
  if (need) need(s.num_layers > 0 ? layout_.layer(0).input_norm : layout_.final_norm());
  EmbedForward(a, params, tokens, targets, B, T_);
  for (int l = 0; l < s.num_layers; ++l) {
    if (need) need(LayerEnd(l));
    trace::Span span("layer forward", "compute", {"layer", l});
    LayerForward(a, params, l, /*to_output=*/true);
  }
  if (need) need(layout_.size());
  return HeadForward(a, params);
}

template <typename T>
void LlamaModel<T>::LayerForward(Activations& a, const T* params, int l, bool to_output) {
  const Activations& sh = *acts_[0];
  const LlamaShape& s = layout_.shape();
  const int B = a.B, T_ = a.Tcur;
  const int64_t N = static_cast<int64_t>(B) * T_, d = a.d, qd = a.qd, kvd = a.kvd, f = a.f;
  const int64_t hd = s.head_dim();
  const LayerOffsets& w = layout_.layer(l);
  const auto [x, x_out, ln1, ln1_rstd, q, k, v, probs, att, mid, ln2, ln2_rstd, gate, up, act] = a.layer(l);

  // Tensor-parallel: o_proj's and down_proj's outputs are each rank's
  // heads' and columns' parts, summed over the group (Summed); with
  // sequence parallelism the norms and residual adds run on this rank's
  // n of the N rows, gathered whole for the products that read them.
  T* whole = acts_[0]->whole.data();
  const int64_t n = HeldRows(N);
  RmsNormForward(ln1, ln1_rstd, x, params + w.input_norm, n, d, s.rms_norm_eps);
  const T* ln1_all = Gathered(ln1, N, d);
  MatmulForward(q, ln1_all, params + w.q_proj, N, d, qd);
  MatmulForward(k, ln1_all, params + w.k_proj, N, d, kvd);
  MatmulForward(v, ln1_all, params + w.v_proj, N, d, kvd);
  const bool cp = ctx_ranks_ > 1;
  const auto [cos, sin] = RopeRows();
  RopeForward(q, cos, sin, B, T_, a.H, hd);
  RopeForward(k, cos, sin, B, T_, a.KV, hd);
  if (cp) {
    // This rank's queries against every rank's keys and values.
    GatherKeysValues(a, k, v);
    AttentionForward(att, probs, q, sh.k_all.data(), sh.v_all.data(), B, T_, a.H, a.KV, hd, a.Tk,
                     sh.positions.data());
  } else {
    AttentionForward(att, probs, q, k, v, B, T_, a.H, a.KV, hd);
  }
  T* o_out = seq_ranks_ > 1 ? whole : mid;
  MatmulForward(o_out, att, params + w.o_proj, N, qd, d);  // o_proj(att), then the residual
  AddForward(mid, Summed(o_out, N, d), x, n * d);
  RmsNormForward(ln2, ln2_rstd, mid, params + w.post_norm, n, d, s.rms_norm_eps);
  const T* ln2_all = Gathered(ln2, N, d);
  MatmulForward(gate, ln2_all, params + w.gate_proj, N, d, f);
  MatmulForward(up, ln2_all, params + w.up_proj, N, d, f);
  SwigluForward(act, gate, up, N * f);
  if (!to_output) return;
  T* down_out = seq_ranks_ > 1 ? whole : x_out;
  MatmulForward(down_out, act, params + w.down_proj, N, f, d);
  AddForward(x_out, Summed(down_out, N, d), mid, n * d);
}

template <typename T>
void LlamaModel<T>::HeadBackward(Activations& a, const T* params, T* grads, double loss_scale) {
  Activations& sh = *acts_[0];
  CHECK(a.has_targets) << "LlamaModel::Backward needs a Forward with targets first";
  const int64_t N = static_cast<int64_t>(a.B) * a.Tcur, d = a.d;
  BackwardScratch();
  T* dres = a.dresidual.data();
  T* dln = sh.dln.data();
  // Loss -> logits (in place) -> lm_head -> final norm.
  trace::Span span("head backward", "compute");
  T* dlogits = sh.logits.data();
  if (tp_.ranks == 1) {
    CrossEntropyBackward(dlogits, sh.logits.data(), a.targets.data(), N, a.v, loss_scale);
  } else {
    VocabParallelBackward(dlogits, sh.logits.data(), sh.lse.data(), a.targets.data(), N, a.v, tp_.vocab_first,
                          loss_scale);
  }
  MatmulBackward(dln, grads + layout_.lm_head(), dlogits, sh.lnf.data(), params + layout_.lm_head(), N, d, a.v);
  const T* dln_mine = Summed(dln, N, d);
  const int64_t n = HeldRows(N);
  std::fill(dres, dres + n * d, T(0));
  const T* x_final = a.residual.data() + a.L * a.R * d;
  RmsNormBackward(dres, grads + layout_.final_norm(), dln_mine, x_final, params + layout_.final_norm(),
                  sh.lnf_rstd.data(), n, d);
}

// Scratch on first use; the attention scratch is per thread and grows with
// this call's thread count.
template <typename T>
void LlamaModel<T>::BackwardScratch() {
  for (size_t i = 0; i < acts_.size(); ++i) {
    acts_[i]->Allocate(shape(), max_batch_, max_seq_len_, end_layer_, /*backward_scratch=*/true,
                       /*owns_shared=*/i == 0);
  }
}

// With `grads` null (a split backward's input part) the weight gradients
// are not computed; what they need besides the kept activations, each
// product's and norm's output gradient, is kept in the slot's w_* buffers
// for LayerBackwardWeights.
template <typename T>
void LlamaModel<T>::LayerBackward(Activations& a, const T* params, T* grads, int l) {
  Activations& sh = *acts_[0];
  const LlamaShape& s = layout_.shape();
  const int B = a.B, T_ = a.Tcur;
  const int64_t N = static_cast<int64_t>(B) * T_, d = a.d, qd = a.qd, kvd = a.kvd, f = a.f;
  const int64_t hd = s.head_dim();
  T* dres = a.dresidual.data();
  T* dln = sh.dln.data();
  const LayerOffsets& w = layout_.layer(l);
  const auto [x, x_out, ln1, ln1_rstd, q, k, v, probs, att, mid, ln2, ln2_rstd, gate, up, act] = a.layer(l);
  const bool split = grads == nullptr;
  CHECK(!split || a.split) << "a split backward on a model made without split_backward";
  auto gw = [&](int64_t offset) { return split ? static_cast<T*>(nullptr) : grads + offset; };
  auto keep = [&](std::vector<T>& into, const T* from, int64_t n) {
    if (split) std::copy(from, from + n, into.begin() + (l - a.first) * n);
  };
  if (a.recompute == Recompute::kFull) {
    trace::Span span("layer recompute", "compute", {"layer", l});
    LayerForward(a, params, l, /*to_output=*/false);
  }
  const bool cp = ctx_ranks_ > 1;
  // Context parallelism: the keys and values gathered again (FULL
  // recomputation has just done it).
  if (cp && a.recompute != Recompute::kFull) GatherKeysValues(a, k, v);
  const T* k_in = cp ? sh.k_all.data() : k;
  const T* v_in = cp ? sh.v_all.data() : v;
  const int32_t* positions = cp ? sh.positions.data() : nullptr;
  if (a.recompute == Recompute::kAttention) {
    trace::Span span("attention recompute", "compute", {"layer", l});
    AttentionForward(att, probs, q, k_in, v_in, B, T_, a.H, a.KV, hd, a.Tk, positions);
  }
  trace::Span span(split ? "layer backward (inputs)" : "layer backward", "compute", {"layer", l});

  // MLP branch: dres is d(layer output) = d(mid) through the skip.
  // Sequence parallelism: dres holds this rank's n rows, gathered whole
  // for the row-parallel product's backward; the norms' inputs are
  // gathered again (kept as rows alone) for the products' weight
  // gradients, and the input gradients' partial sums reduce-scattered.
  const int64_t n = HeldRows(N);
  const T* dres_all = Gathered(dres, N, d);
  keep(a.w_down, dres_all, N * d);
  MatmulBackward(sh.dact.data(), gw(w.down_proj), dres_all, act, params + w.down_proj, N, f, d);
  SwigluBackward(sh.dgate.data(), sh.dup.data(), sh.dact.data(), gate, up, N * f);
  const T* ln2_all = Gathered(ln2, N, d);
  MatmulBackward(dln, gw(w.gate_proj), sh.dgate.data(), ln2_all, params + w.gate_proj, N, d, f);
  MatmulBackward(dln, gw(w.up_proj), sh.dup.data(), ln2_all, params + w.up_proj, N, d, f, /*accumulate_din=*/true);
  const T* dln_mine = Summed(dln, N, d);  // tensor-parallel: each rank's columns' part
  keep(a.w_gate, sh.dgate.data(), N * f);
  keep(a.w_up, sh.dup.data(), N * f);
  keep(a.w_post, dln, N * d);
  RmsNormBackward(dres, gw(w.post_norm), dln_mine, mid, params + w.post_norm, ln2_rstd, n, d);

  // Attention branch: dres is now d(mid) = d(layer input) through the skip.
  const T* dmid_all = Gathered(dres, N, d);
  keep(a.w_o, dmid_all, N * d);
  MatmulBackward(sh.datt.data(), gw(w.o_proj), dmid_all, att, params + w.o_proj, N, qd, d);
  AttentionBackward(sh.dq.data(), cp ? sh.dk_all.data() : sh.dk.data(), cp ? sh.dv_all.data() : sh.dv.data(),
                    sh.datt.data(), probs, q, k_in, v_in, B, T_, a.H, a.KV, hd, sh.attn_scratch.data(), a.Tk,
                    positions);
  if (cp) ScatterKeyValueGrads(a, sh.dk.data(), sh.dv.data());
  const auto [cos, sin] = RopeRows();
  RopeBackward(sh.dq.data(), cos, sin, B, T_, a.H, hd);
  RopeBackward(sh.dk.data(), cos, sin, B, T_, a.KV, hd);
  keep(a.w_q, sh.dq.data(), N * qd);
  keep(a.w_k, sh.dk.data(), N * kvd);
  keep(a.w_v, sh.dv.data(), N * kvd);
  const T* ln1_all = Gathered(ln1, N, d);
  MatmulBackward(dln, gw(w.q_proj), sh.dq.data(), ln1_all, params + w.q_proj, N, d, qd);
  MatmulBackward(dln, gw(w.k_proj), sh.dk.data(), ln1_all, params + w.k_proj, N, d, kvd, true);
  MatmulBackward(dln, gw(w.v_proj), sh.dv.data(), ln1_all, params + w.v_proj, N, d, kvd, true);
  const T* dln_in = Summed(dln, N, d);
  keep(a.w_in, dln, N * d);
  RmsNormBackward(dres, gw(w.input_norm), dln_in, x, params + w.input_norm, ln1_rstd, n, d);
}

template <typename T>
void LlamaModel<T>::EmbedBackward(Activations& a, T* grads) {
  trace::Span span("embedding backward", "compute");
  const int64_t N = static_cast<int64_t>(a.B) * a.Tcur;
  EmbeddingBackward(grads + layout_.embed(), Gathered(a.dresidual.data(), N, a.d), a.tokens.data(), N, a.d,
                    tp_.vocab_first, tp_.ranks > 1 ? a.v : -1);
}

template <typename T>
void LlamaModel<T>::Backward(const T* params, T* grads, double loss_scale, const FinalFrom& final_from,
                             const NeedFrom& need_from) {
  CHECK(embeds() && has_head()) << "Backward on a model of part of the layers: use StageBackward";
  Activations& a = *acts_[0];
  if (need_from) need_from(layout_.final_norm());
  HeadBackward(a, params, grads, loss_scale);
  // lm_head (when untied) follows the final norm in the flat space.
  if (final_from) final_from(layout_.final_norm());
  for (int l = shape().num_layers - 1; l >= 0; --l) {
    if (need_from) need_from(layout_.layer(l).input_norm);
    LayerBackward(a, params, grads, l);
    if (final_from) final_from(layout_.layer(l).input_norm);  // the layer's first tensor
  }
  EmbedBackward(a, grads);
  if (final_from) final_from(0);
}

template <typename T>
double LlamaModel<T>::ForwardBackwardLayerMajor(const T* params, T* grads, const std::vector<const int32_t*>& tokens,
                                                const std::vector<const int32_t*>& targets, int B, int T_,
                                                double loss_scale, const NeedUpTo& need, const NeedFrom& need_from,
                                                const FinalFrom& final_from) {
  CHECK(embeds() && has_head()) << "a layer-major pass on a model of part of the layers";
  const LlamaShape& s = layout_.shape();
  const size_t M = tokens.size();
  CHECK(M >= 1 && M <= acts_.size() && targets.size() == M) << "layer-major pass over " << M << " micro-batches, "
                                                              << acts_.size() << " slots";
  if (need) need(s.num_layers > 0 ? layout_.layer(0).input_norm : layout_.final_norm());
  for (size_t m = 0; m < M; ++m) EmbedForward(*acts_[m], params, tokens[m], targets[m], B, T_);
  for (int l = 0; l < s.num_layers; ++l) {
    if (need) need(LayerEnd(l));
    trace::Span span("layer forward", "compute", {"layer", l}, {"micro_batches", static_cast<int64_t>(M)});
    for (size_t m = 0; m < M; ++m) LayerForward(*acts_[m], params, l, /*to_output=*/true);
  }
  if (need) need(layout_.size());
  if (need_from) need_from(layout_.final_norm());
  // The head's forward and backward for one micro-batch after the other:
  // its buffers (the logits above all) are shared.
  double loss = 0;
  for (size_t m = 0; m < M; ++m) {
    loss += HeadForward(*acts_[m], params);
    HeadBackward(*acts_[m], params, grads, loss_scale);
  }
  if (final_from) final_from(layout_.final_norm());
  for (int l = s.num_layers - 1; l >= 0; --l) {
    if (need_from) need_from(layout_.layer(l).input_norm);
    for (size_t m = 0; m < M; ++m) LayerBackward(*acts_[m], params, grads, l);
    if (final_from) final_from(layout_.layer(l).input_norm);
  }
  for (size_t m = 0; m < M; ++m) EmbedBackward(*acts_[m], grads);
  if (final_from) final_from(0);
  return loss;
}

template <typename T>
double LlamaModel<T>::StageForward(int slot, const T* params, const int32_t* tokens, const int32_t* targets,
                                   const T* input, int B, int T_, T* grads, double loss_scale, const NeedUpTo& need) {
  Activations& a = *acts_.at(slot);
  if (embeds()) {
    if (need) need(first_layer_ < end_layer_ ? layout_.layer(first_layer_).input_norm : layout_.final_norm());
    EmbedForward(a, params, tokens, targets, B, T_);
  } else {
    CHECK(input != nullptr) << "stage of layers " << first_layer_ << "+ needs the previous stage's output";
    TakeRows(a, nullptr, has_head() ? targets : nullptr, B, T_);
    a.has_targets = targets != nullptr;
    if (input != a.residual.data()) std::copy(input, input + StageElements(B, T_), a.residual.begin());
  }
  for (int l = first_layer_; l < end_layer_; ++l) {
    if (need) need(LayerEnd(l));
    trace::Span span("layer forward", "compute", {"layer", l});
    LayerForward(a, params, l, /*to_output=*/true);
  }
  if (!has_head()) return 0.0;
  if (need) need(layout_.size());
  const double loss = HeadForward(a, params);
  if (grads != nullptr) HeadBackward(a, params, grads, loss_scale);
  return loss;
}

template <typename T>
int64_t LlamaModel<T>::StageElements(int B, int T_) const {
  return HeldRows(static_cast<int64_t>(B) * (T_ / ctx_ranks_)) * layout_.shape().hidden_size;
}

template <typename T>
T* LlamaModel<T>::StageInput(int slot) {
  return acts_.at(slot)->residual.data();
}

template <typename T>
const T* LlamaModel<T>::StageOutput(int slot) const {
  const Activations& a = *acts_.at(slot);
  return a.residual.data() + a.L * a.R * a.d;
}

template <typename T>
T* LlamaModel<T>::StageOutputGrad(int slot) {
  BackwardScratch();
  return acts_.at(slot)->dresidual.data();
}

template <typename T>
void LlamaModel<T>::StageBackward(int slot, const T* params, T* grads, const T* output_grad,
                                  const FinalFrom& final_from, const NeedFrom& need_from) {
  Activations& a = *acts_.at(slot);
  BackwardScratch();
  if (has_head()) {
    CHECK(output_grad == nullptr) << "the head's stage starts backward from its own loss";
    if (final_from) final_from(layout_.final_norm());
  } else {
    CHECK(output_grad != nullptr) << "stage of layers " << first_layer_ << "+ needs the next stage's gradient";
    const int64_t n = HeldRows(static_cast<int64_t>(a.B) * a.Tcur) * a.d;
    if (output_grad != a.dresidual.data()) std::copy(output_grad, output_grad + n, a.dresidual.begin());
  }
  for (int l = end_layer_ - 1; l >= first_layer_; --l) {
    if (need_from) need_from(layout_.layer(l).input_norm);
    LayerBackward(a, params, grads, l);
    if (final_from) final_from(layout_.layer(l).input_norm);
  }
  if (!embeds()) return;
  EmbedBackward(a, grads);
  if (final_from) final_from(0);
}

template <typename T>
void LlamaModel<T>::LayerBackwardWeights(Activations& a, T* grads, int l) {
  const int64_t N = static_cast<int64_t>(a.B) * a.Tcur, d = a.d, qd = a.qd, kvd = a.kvd, f = a.f;
  const LayerOffsets& w = layout_.layer(l);
  const auto [x, x_out, ln1, ln1_rstd, q, k, v, probs, att, mid, ln2, ln2_rstd, gate, up, act] = a.layer(l);
  const int64_t i = l - a.first;
  trace::Span span("layer backward (weights)", "compute", {"layer", l});
  // The weights are not read: the input part used them. Sequence
  // parallelism: the products' kept output gradients are whole, their
  // inputs (the norms' outputs, kept as this rank's rows) gathered again,
  // and the norms' gradients come from this rank's rows of the summed
  // input gradients.
  const T* none = nullptr;
  const int64_t n = HeldRows(N), first = FirstRow(N);
  MatmulBackward(static_cast<T*>(nullptr), grads + w.down_proj, a.w_down.data() + i * N * d, act, none, N, f, d);
  const T* ln2_all = Gathered(ln2, N, d);
  MatmulBackward(static_cast<T*>(nullptr), grads + w.gate_proj, a.w_gate.data() + i * N * f, ln2_all, none, N, d, f);
  MatmulBackward(static_cast<T*>(nullptr), grads + w.up_proj, a.w_up.data() + i * N * f, ln2_all, none, N, d, f);
  RmsNormBackward(static_cast<T*>(nullptr), grads + w.post_norm, a.w_post.data() + (i * N + first) * d, mid, none,
                  ln2_rstd, n, d);
  MatmulBackward(static_cast<T*>(nullptr), grads + w.o_proj, a.w_o.data() + i * N * d, att, none, N, qd, d);
  const T* ln1_all = Gathered(ln1, N, d);
  MatmulBackward(static_cast<T*>(nullptr), grads + w.q_proj, a.w_q.data() + i * N * qd, ln1_all, none, N, d, qd);
  MatmulBackward(static_cast<T*>(nullptr), grads + w.k_proj, a.w_k.data() + i * N * kvd, ln1_all, none, N, d, kvd);
  MatmulBackward(static_cast<T*>(nullptr), grads + w.v_proj, a.w_v.data() + i * N * kvd, ln1_all, none, N, d, kvd);
  RmsNormBackward(static_cast<T*>(nullptr), grads + w.input_norm, a.w_in.data() + (i * N + first) * d, x, none,
                  ln1_rstd, n, d);
}

template <typename T>
void LlamaModel<T>::StageBackwardInput(int slot, const T* params, T* grads, const T* output_grad,
                                       const FinalFrom& done, const NeedFrom& need_from) {
  Activations& a = *acts_.at(slot);
  CHECK(a.split) << "StageBackwardInput on a model made without split_backward";
  BackwardScratch();
  if (has_head()) {
    CHECK(output_grad == nullptr) << "the head's stage starts backward from its own loss";
  } else {
    CHECK(output_grad != nullptr) << "stage of layers " << first_layer_ << "+ needs the next stage's gradient";
    const int64_t n = HeldRows(static_cast<int64_t>(a.B) * a.Tcur) * a.d;
    if (output_grad != a.dresidual.data()) std::copy(output_grad, output_grad + n, a.dresidual.begin());
  }
  if (has_head() && done) done(layout_.final_norm());  // the head's backward ran with its forward
  for (int l = end_layer_ - 1; l >= first_layer_; --l) {
    if (need_from) need_from(layout_.layer(l).input_norm);
    LayerBackward(a, params, /*grads=*/nullptr, l);
    if (done) done(layout_.layer(l).input_norm);
  }
  if (!embeds()) return;
  EmbedBackward(a, grads);
  if (done) done(0);
}

template <typename T>
void LlamaModel<T>::StageBackwardWeights(int slot, T* grads, const FinalFrom& final_from) {
  Activations& a = *acts_.at(slot);
  CHECK(a.split) << "StageBackwardWeights on a model made without split_backward";
  if (has_head() && final_from) final_from(layout_.final_norm());
  for (int l = end_layer_ - 1; l >= first_layer_; --l) {
    LayerBackwardWeights(a, grads, l);
    if (final_from) final_from(layout_.layer(l).input_norm);
  }
  if (embeds() && final_from) final_from(0);
}

template <typename T>
const T* LlamaModel<T>::StageInputGrad(int slot) const {
  return acts_.at(slot)->dresidual.data();
}

template class LlamaModel<float>;
template class LlamaModel<double>;

}  // namespace herd
