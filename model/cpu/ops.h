// CPU kernels of the Llama layers, each forward next to its backward, in the
// order the model calls them. Templated on the scalar type: float for
// training, double for finite-difference gradient checks.
//
// Conventions: activations are row-major [N, C] with N = B*T tokens;
// linear weights are [out, in] (PyTorch/HF order). Every backward
// *accumulates* (+=) into parameter gradients (so micro-batches add up) and
// *overwrites* the input gradient unless stated otherwise. All kernels are
// deterministic for a given thread count (no atomics, fixed reduction
// order); the hand-written reductions into parameter gradients (norms,
// embedding) do not depend on the thread count at all.
#pragma once

#include <cstdint>

#include "model/rope_scaling.h"

namespace herd::cpu {

// out[i, :] = table[tokens[i], :] for i < N; table is [vocab, C]. With
// `rows` (a vocabulary-parallel rank's part): table holds the rows
// [first, first + rows) of the vocabulary, and a token outside them looks
// up zeros.
template <typename T>
void EmbeddingForward(T* out, const int32_t* tokens, const T* table, int64_t N, int64_t C, int64_t first = 0,
                      int64_t rows = -1);
// dtable[tokens[i]] += dout[i]  (no atomics: split over channels); with
// `rows`, only for the tokens in [first, first + rows).
template <typename T>
void EmbeddingBackward(T* dtable, const T* dout, const int32_t* tokens, int64_t N, int64_t C, int64_t first = 0,
                       int64_t rows = -1);

// out = in * rstd * weight, rstd[i] = 1/sqrt(mean(in[i]^2) + eps)
template <typename T>
void RmsNormForward(T* out, T* rstd, const T* in, const T* weight, int64_t N, int64_t C, double eps);
// din += (the residual stream sums its branches), dweight += ...; either
// may be null (that part not computed: a pipeline's split backward takes
// them apart, the same arithmetic each).
template <typename T>
void RmsNormBackward(T* din, T* dweight, const T* dout, const T* in, const T* weight, const T* rstd,
                     int64_t N, int64_t C);

// out[N, Cout] = in[N, Cin] @ weight[Cout, Cin]^T
template <typename T>
void MatmulForward(T* out, const T* in, const T* weight, int64_t N, int64_t Cin, int64_t Cout);
// din = dout @ weight (overwritten, or added when accumulate_din);
// dweight += dout^T @ in. Either may be null (not needed).
template <typename T>
void MatmulBackward(T* din, T* dweight, const T* dout, const T* in, const T* weight, int64_t N, int64_t Cin,
                    int64_t Cout, bool accumulate_din = false);

// Rotary tables for positions [0, T): cos/sin[t, hd/2], HF's inv_freq =
// theta^(-2i/hd), rescaled as transformers' "llama3" rope type does when
// `scaling` is set.
template <typename T>
void RopeTables(T* cos, T* sin, int64_t T_, int64_t head_dim, double theta, const RopeScaling& scaling = {});
// In place on x[B, T, heads, hd], HF rotate-half convention:
// x1 = x[..., :hd/2], x2 = x[..., hd/2:]; out = (x1 c - x2 s, x2 c + x1 s).
template <typename T>
void RopeForward(T* x, const T* cos, const T* sin, int64_t B, int64_t T_, int64_t heads, int64_t head_dim);
// In place on dx: the transpose of the rotation (rotation by -angle).
template <typename T>
void RopeBackward(T* dx, const T* cos, const T* sin, int64_t B, int64_t T_, int64_t heads, int64_t head_dim);

// Causal grouped-query attention. q[B, T, H, hd], k/v[B, T, KV, hd]; head h
// reads kv head h / (H / KV). probs[B, H, T, T] keeps the softmax (lower
// triangle) for backward. out[B, T, H, hd].
//
// Context parallelism: `Tk` keys (k/v[B, Tk, KV, hd], probs[B, H, T, Tk])
// and the queries' positions among them (`positions[T]`, the same for
// every sequence): query t attends to keys 0..positions[t]. Defaults: Tk
// = T, positions t.
template <typename T>
void AttentionForward(T* out, T* probs, const T* q, const T* k, const T* v, int64_t B, int64_t T_, int64_t H,
                      int64_t KV, int64_t head_dim, int64_t Tk = 0, const int32_t* positions = nullptr);
// dq, dk, dv overwritten (dk, dv: [B, Tk, KV, hd]). `scratch` holds T*Tk
// elements per thread of the current OpenMP thread count
// (AttentionScratchSize).
template <typename T>
void AttentionBackward(T* dq, T* dk, T* dv, const T* dout, const T* probs, const T* q, const T* k, const T* v,
                       int64_t B, int64_t T_, int64_t H, int64_t KV, int64_t head_dim, T* scratch, int64_t Tk = 0,
                       const int32_t* positions = nullptr);
int64_t AttentionScratchSize(int64_t T_, int64_t H, int64_t KV, int64_t Tk = 0);

// out = silu(gate) * up, elementwise over n.
template <typename T>
void SwigluForward(T* out, const T* gate, const T* up, int64_t n);
// dgate, dup overwritten.
template <typename T>
void SwigluBackward(T* dgate, T* dup, const T* dout, const T* gate, const T* up, int64_t n);

// out = a + b (residual stream), elementwise.
template <typename T>
void AddForward(T* out, const T* a, const T* b, int64_t n);

// losses[i] = logsumexp(logits[i]) - logits[i, targets[i]]; returns the mean.
template <typename T>
double CrossEntropyForward(T* losses, const T* logits, const int32_t* targets, int64_t N, int64_t V);
// dlogits = scale * (softmax(logits) - onehot(targets)); may alias logits.
template <typename T>
void CrossEntropyBackward(T* dlogits, const T* logits, const int32_t* targets, int64_t N, int64_t V, double scale);

// The cross-entropy over a vocabulary split among `ranks` (Megatron's
// vocabulary-parallel one): each rank holds the logits of the vocabulary's
// columns [first, first + V) and none materialises the whole row. Around
// one sum over the ranks of [N, VocabStatsWidth(ranks)] values:
//  - VocabParallelStats writes, in this rank's slot of each row, its
//    columns' max and sum of exp(x - max), and the target's logit where
//    the target is this rank's; zeros elsewhere (so the sum gathers);
//  - VocabParallelLoss turns the summed stats into each row's log-sum-exp
//    over the whole vocabulary (ranks in order, the same on every rank)
//    and loss, and returns the mean;
//  - VocabParallelBackward: dlogits = scale * (exp(logits - lse) -
//    onehot(targets - first)); may alias logits.
inline int64_t VocabStatsWidth(int ranks) { return 2 * static_cast<int64_t>(ranks) + 1; }
template <typename T>
void VocabParallelStats(T* stats, const T* logits, const int32_t* targets, int64_t N, int64_t V, int64_t first,
                        int rank, int ranks);
template <typename T>
double VocabParallelLoss(T* lse, T* losses, const T* stats, int64_t N, int ranks);
template <typename T>
void VocabParallelBackward(T* dlogits, const T* logits, const T* lse, const int32_t* targets, int64_t N, int64_t V,
                           int64_t first, double scale);

}  // namespace herd::cpu
