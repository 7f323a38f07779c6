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
// into one layer's room).
template <typename T>
struct LlamaModel<T>::Activations {
  int64_t N = 0, d = 0, qd = 0, kvd = 0, f = 0, v = 0, tt = 0, L = 0, H = 0, KV = 0;
  Recompute recompute = Recompute::kNone;

  std::vector<int32_t> tokens, targets;   // [N]
  std::vector<T> rope_cos, rope_sin;      // [max_seq_len, head_dim/2]
  std::vector<T> residual;                // [L+1, N, d]: input of layer l; [L] = final
  // From here to act: [L, ...] (FULL: [1, ...]).
  std::vector<T> ln1, ln1_rstd;           // [L, N, d], [L, N]
  std::vector<T> q, k, v_;                // [L, N, qd], [L, N, kvd] x2 (after RoPE)
  std::vector<T> probs;                   // [L, B, H, T, T] (ATTENTION, FULL: [1, ...])
  std::vector<T> att;                     // [L, N, qd] attention output
  std::vector<T> residual_mid;            // [L, N, d] after the attention branch
  std::vector<T> ln2, ln2_rstd;           // [L, N, d], [L, N]
  std::vector<T> gate, up, act;           // [L, N, f]
  std::vector<T> lnf, lnf_rstd;           // [N, d], [N]
  std::vector<T> logits;                  // [N, v] (dlogits in place in backward)
  std::vector<T> losses;                  // [N]
  // Backward scratch, reused by every layer.
  std::vector<T> dresidual, dln, datt, dq, dk, dv, dact, dgate, dup, attn_scratch;

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
  };
  static std::vector<Buffer> Table(const LlamaShape& s, int max_batch, int max_seq_len, Recompute recompute) {
    const int64_t N = static_cast<int64_t>(max_batch) * max_seq_len, d = s.hidden_size;
    // Layers kept: L holds every layer's intermediates, the probabilities Lp.
    const int64_t L = recompute == Recompute::kFull ? 1 : s.num_layers;
    const int64_t Lp = recompute == Recompute::kNone ? s.num_layers : 1;
    const int64_t qd = s.q_dim(), kvd = s.kv_dim(), f = s.intermediate_size;
    const int64_t probs_elements = Lp * max_batch * s.num_heads * static_cast<int64_t>(max_seq_len) * max_seq_len;
    const int64_t rope_elements = static_cast<int64_t>(max_seq_len) * s.head_dim() / 2;
    using A = Activations;
    return {
        {&A::rope_cos, rope_elements, false},
        {&A::rope_sin, rope_elements, false},
        {&A::residual, (s.num_layers + 1) * N * d, false},
        {&A::ln1, L * N * d, false},
        {&A::ln1_rstd, L * N, false},
        {&A::q, L * N * qd, false},
        {&A::k, L * N * kvd, false},
        {&A::v_, L * N * kvd, false},
        {&A::probs, probs_elements, false},
        {&A::att, L * N * qd, false},
        {&A::residual_mid, L * N * d, false},
        {&A::ln2, L * N * d, false},
        {&A::ln2_rstd, L * N, false},
        {&A::gate, L * N * f, false},
        {&A::up, L * N * f, false},
        {&A::act, L * N * f, false},
        {&A::lnf, N * d, false},
        {&A::lnf_rstd, N, false},
        {&A::logits, N * s.vocab_size, false},
        {&A::losses, N, false},
        {&A::dresidual, N * d, true},
        {&A::dln, N * d, true},
        {&A::datt, N * qd, true},
        {&A::dq, N * qd, true},
        {&A::dk, N * kvd, true},
        {&A::dv, N * kvd, true},
        {&A::dact, N * f, true},
        {&A::dgate, N * f, true},
        {&A::dup, N * f, true},
        {&A::attn_scratch, AttentionScratchSize(max_seq_len, s.num_heads, s.num_kv_heads), true},
    };
  }
  // Sizes every buffer of the table that `backward_scratch` selects (grows,
  // never shrinks).
  void Allocate(const LlamaShape& s, int max_batch, int max_seq_len, bool backward_scratch) {
    for (const Buffer& b : Table(s, max_batch, max_seq_len, recompute)) {
      std::vector<T>& v = this->*b.member;
      if (b.backward_scratch == backward_scratch && static_cast<int64_t>(v.size()) < b.elements) v.resize(b.elements);
    }
  }

  Layer layer(int64_t l) {
    const int64_t i = recompute == Recompute::kFull ? 0 : l;   // where layer l's intermediates live
    const int64_t p = recompute == Recompute::kNone ? l : 0;   // and its probabilities
    return {residual.data() + l * N * d,      residual.data() + (l + 1) * N * d, ln1.data() + i * N * d,
            ln1_rstd.data() + i * N,          q.data() + i * N * qd,             k.data() + i * N * kvd,
            v_.data() + i * N * kvd,          probs.data() + p * max_batch * H * tt,
            att.data() + i * N * qd,          residual_mid.data() + i * N * d,   ln2.data() + i * N * d,
            ln2_rstd.data() + i * N,          gate.data() + i * N * f,           up.data() + i * N * f,
            act.data() + i * N * f};
  }
};


template <typename T>
int64_t LlamaModel<T>::ActivationBytes(const LlamaShape& shape, int max_batch, int max_seq_len, Recompute recompute) {
  int64_t floats = 0;
  for (const auto& b : Activations::Table(shape, max_batch, max_seq_len, recompute)) floats += b.elements;
  const int64_t tokens = static_cast<int64_t>(max_batch) * max_seq_len;
  return floats * static_cast<int64_t>(sizeof(T)) + 2 * tokens * static_cast<int64_t>(sizeof(int32_t));
}

template <typename T>
LlamaModel<T>::LlamaModel(const LlamaShape& shape, int max_batch, int max_seq_len, Recompute recompute)
    : layout_(shape), max_batch_(max_batch), max_seq_len_(max_seq_len), acts_(new Activations) {
  Activations& a = *acts_;
  a.recompute = recompute;
  a.N = static_cast<int64_t>(max_batch) * max_seq_len;
  a.max_batch = max_batch;
  a.d = shape.hidden_size;
  a.qd = shape.q_dim();
  a.kvd = shape.kv_dim();
  a.f = shape.intermediate_size;
  a.v = shape.vocab_size;
  a.tt = static_cast<int64_t>(max_seq_len) * max_seq_len;
  a.L = shape.num_layers;
  a.H = shape.num_heads;
  a.KV = shape.num_kv_heads;
  a.tokens.resize(a.N);
  a.targets.resize(a.N);
  a.Allocate(shape, max_batch, max_seq_len, /*backward_scratch=*/false);
  RopeTables(a.rope_cos.data(), a.rope_sin.data(), max_seq_len, shape.head_dim(), shape.rope_theta,
             shape.rope_scaling);
}

template <typename T>
LlamaModel<T>::~LlamaModel() = default;

template <typename T>
const T* LlamaModel<T>::logits() const {
  return acts_->logits.data();
}

template <typename T>
double LlamaModel<T>::Forward(const T* params, const int32_t* tokens, const int32_t* targets, int B, int T_,
                              const NeedUpTo& need) {
  Activations& a = *acts_;
  const LlamaShape& s = layout_.shape();
  const int64_t N = static_cast<int64_t>(B) * T_, d = a.d;
  a.B = B;
  a.Tcur = T_;
  a.has_targets = targets != nullptr;
  std::copy(tokens, tokens + N, a.tokens.begin());
  if (targets != nullptr) std::copy(targets, targets + N, a.targets.begin());

  // Layer l's tensors end where the next layer's (or the final norm) begin.
  auto layer_end = [&](int l) { return l + 1 < s.num_layers ? layout_.layer(l + 1).input_norm : layout_.final_norm(); };
  if (need) need(s.num_layers > 0 ? layout_.layer(0).input_norm : layout_.final_norm());
  {
    trace::Span span("embedding forward", "compute");
    EmbeddingForward(a.residual.data(), tokens, params + layout_.embed(), N, d);
  }
  for (int l = 0; l < s.num_layers; ++l) {
    if (need) need(layer_end(l));
    trace::Span span("layer forward", "compute", {"layer", l});
    LayerForward(params, l, /*to_output=*/true);
  }
  const T* x_final = a.residual.data() + s.num_layers * a.N * d;
  if (need) need(layout_.size());
  trace::Span span("head forward", "compute");
  RmsNormForward(a.lnf.data(), a.lnf_rstd.data(), x_final, params + layout_.final_norm(), N, d, s.rms_norm_eps);
  MatmulForward(a.logits.data(), a.lnf.data(), params + layout_.lm_head(), N, d, a.v);
  if (targets == nullptr) return 0.0;
  return CrossEntropyForward(a.losses.data(), a.logits.data(), targets, N, a.v);
}

template <typename T>
void LlamaModel<T>::LayerForward(const T* params, int l, bool to_output) {
  Activations& a = *acts_;
  const LlamaShape& s = layout_.shape();
  const int B = a.B, T_ = a.Tcur;
  const int64_t N = static_cast<int64_t>(B) * T_, d = a.d, qd = a.qd, kvd = a.kvd, f = a.f;
  const int64_t hd = s.head_dim();
  const LayerOffsets& w = layout_.layer(l);
  const auto [x, x_out, ln1, ln1_rstd, q, k, v, probs, att, mid, ln2, ln2_rstd, gate, up, act] = a.layer(l);

  RmsNormForward(ln1, ln1_rstd, x, params + w.input_norm, N, d, s.rms_norm_eps);
  MatmulForward(q, ln1, params + w.q_proj, N, d, qd);
  MatmulForward(k, ln1, params + w.k_proj, N, d, kvd);
  MatmulForward(v, ln1, params + w.v_proj, N, d, kvd);
  RopeForward(q, a.rope_cos.data(), a.rope_sin.data(), B, T_, a.H, hd);
  RopeForward(k, a.rope_cos.data(), a.rope_sin.data(), B, T_, a.KV, hd);
  AttentionForward(att, probs, q, k, v, B, T_, a.H, a.KV, hd);
  MatmulForward(mid, att, params + w.o_proj, N, qd, d);  // o_proj(att), then the residual
  AddForward(mid, mid, x, N * d);
  RmsNormForward(ln2, ln2_rstd, mid, params + w.post_norm, N, d, s.rms_norm_eps);
  MatmulForward(gate, ln2, params + w.gate_proj, N, d, f);
  MatmulForward(up, ln2, params + w.up_proj, N, d, f);
  SwigluForward(act, gate, up, N * f);
  if (!to_output) return;
  MatmulForward(x_out, act, params + w.down_proj, N, f, d);
  AddForward(x_out, x_out, mid, N * d);
}

template <typename T>
void LlamaModel<T>::Backward(const T* params, T* grads, double loss_scale, const FinalFrom& final_from,
                             const NeedFrom& need_from) {
  Activations& a = *acts_;
  const LlamaShape& s = layout_.shape();
  CHECK(a.has_targets) << "LlamaModel::Backward needs a Forward with targets first";
  const int B = a.B, T_ = a.Tcur;
  const int64_t N = static_cast<int64_t>(B) * T_, d = a.d, qd = a.qd, kvd = a.kvd, f = a.f;
  const int64_t hd = s.head_dim();
  // Scratch on first use; the attention scratch is per thread and grows
  // with this call's thread count.
  a.Allocate(s, max_batch_, max_seq_len_, /*backward_scratch=*/true);
  T* dres = a.dresidual.data();
  T* dln = a.dln.data();

  // Loss -> logits (in place) -> lm_head -> final norm.
  if (need_from) need_from(layout_.final_norm());
  {
    trace::Span span("head backward", "compute");
    T* dlogits = a.logits.data();
    CrossEntropyBackward(dlogits, a.logits.data(), a.targets.data(), N, a.v, loss_scale);
    MatmulBackward(dln, grads + layout_.lm_head(), dlogits, a.lnf.data(), params + layout_.lm_head(), N, d, a.v);
    std::fill(dres, dres + N * d, T(0));
    const T* x_final = a.residual.data() + s.num_layers * a.N * d;
    RmsNormBackward(dres, grads + layout_.final_norm(), dln, x_final, params + layout_.final_norm(),
                    a.lnf_rstd.data(), N, d);
  }
  // lm_head (when untied) follows the final norm in the flat space.
  if (final_from) final_from(layout_.final_norm());

  for (int l = s.num_layers - 1; l >= 0; --l) {
    const LayerOffsets& w = layout_.layer(l);
    const auto [x, x_out, ln1, ln1_rstd, q, k, v, probs, att, mid, ln2, ln2_rstd, gate, up, act] = a.layer(l);
    if (need_from) need_from(w.input_norm);
    if (a.recompute == Recompute::kFull) {
      trace::Span span("layer recompute", "compute", {"layer", l});
      LayerForward(params, l, /*to_output=*/false);
    } else if (a.recompute == Recompute::kAttention) {
      trace::Span span("attention recompute", "compute", {"layer", l});
      AttentionForward(att, probs, q, k, v, B, T_, a.H, a.KV, hd);
    }
    trace::Span span("layer backward", "compute", {"layer", l});

    // MLP branch: dres is d(layer output) = d(mid) through the skip.
    MatmulBackward(a.dact.data(), grads + w.down_proj, dres, act, params + w.down_proj, N, f, d);
    SwigluBackward(a.dgate.data(), a.dup.data(), a.dact.data(), gate, up, N * f);
    MatmulBackward(dln, grads + w.gate_proj, a.dgate.data(), ln2, params + w.gate_proj, N, d, f);
    MatmulBackward(dln, grads + w.up_proj, a.dup.data(), ln2, params + w.up_proj, N, d, f, /*accumulate_din=*/true);
    RmsNormBackward(dres, grads + w.post_norm, dln, mid, params + w.post_norm, ln2_rstd, N, d);

    // Attention branch: dres is now d(mid) = d(layer input) through the skip.
    MatmulBackward(a.datt.data(), grads + w.o_proj, dres, att, params + w.o_proj, N, qd, d);
    AttentionBackward(a.dq.data(), a.dk.data(), a.dv.data(), a.datt.data(), probs, q, k, v, B, T_, a.H, a.KV, hd,
                      a.attn_scratch.data());
    RopeBackward(a.dq.data(), a.rope_cos.data(), a.rope_sin.data(), B, T_, a.H, hd);
    RopeBackward(a.dk.data(), a.rope_cos.data(), a.rope_sin.data(), B, T_, a.KV, hd);
    MatmulBackward(dln, grads + w.q_proj, a.dq.data(), ln1, params + w.q_proj, N, d, qd);
    MatmulBackward(dln, grads + w.k_proj, a.dk.data(), ln1, params + w.k_proj, N, d, kvd, true);
    MatmulBackward(dln, grads + w.v_proj, a.dv.data(), ln1, params + w.v_proj, N, d, kvd, true);
    RmsNormBackward(dres, grads + w.input_norm, dln, x, params + w.input_norm, ln1_rstd, N, d);
    if (final_from) final_from(w.input_norm);  // the layer's first tensor
  }
  {
    trace::Span span("embedding backward", "compute");
    EmbeddingBackward(grads + layout_.embed(), dres, a.tokens.data(), N, d);
  }
  if (final_from) final_from(0);
}

template class LlamaModel<float>;
template class LlamaModel<double>;

}  // namespace herd
