// CUDA kernels of the Llama layers, each forward next to its backward, with
// the conventions of model/cpu/ops.h: activations row-major [N, C] with
// N = B*T tokens, linear weights [out, in], parameter-gradient backwards
// *accumulate* (+=), input-gradient backwards overwrite unless stated.
//
// T is the compute dtype: float (for parity with the CPU) or __nv_bfloat16
// (the GPU default). Arithmetic is fp32 whatever T is; norms' rstd, the
// attention's log-sum-exp and the losses are kept in fp32; parameter
// gradients are fp32 buffers. Every kernel is deterministic: fixed launch
// shapes for a given problem, reductions in a fixed order, no float atomics.
// All calls are asynchronous on `stream`; pointers are device pointers
// unless named host_.
#pragma once

#include <cstdint>
#include <vector>

#include "model/cuda/device_compat.h"
#include "model/cuda/device_memory.h"
#include "model/optim/adamw.h"

namespace herd::cuda {

using bf16 = __nv_bfloat16;

// ---- embedding
// With `rows` >= 0 the table holds the vocabulary's rows [first, first +
// rows) alone (a tensor-parallel rank's): a token outside them looks up
// zeros, which the group's sum fills in.
template <typename T>
void EmbeddingForward(T* out, const int32_t* tokens, const T* table, int64_t N, int64_t C, cudaStream_t stream,
                      int64_t first = 0, int64_t rows = -1);

// The deterministic backward groups positions by token on the host (tokens
// come from the host anyway): `tokens` are the distinct ids, positions
// [starts[u], starts[u+1]) of `positions` hold token u, in increasing order.
// With `rows` >= 0 only the tokens in [first, first + rows) are grouped,
// each as its row of that part of the table (id - first).
struct EmbeddingGroups {
  std::vector<int32_t> tokens, starts, positions;
  static EmbeddingGroups Build(const int32_t* host_tokens, int64_t N, int64_t first = 0, int64_t rows = -1);
};
// dtable[tokens[u]] += sum over the group's positions of dout[position], in
// position order. The three arrays are EmbeddingGroups' on the device.
template <typename T>
void EmbeddingBackward(float* dtable, const T* dout, const int32_t* group_tokens, const int32_t* group_starts,
                       const int32_t* group_positions, int64_t groups, int64_t C, cudaStream_t stream);

// ---- RMSNorm
template <typename T>
void RmsNormForward(T* out, float* rstd, const T* in, const T* weight, int64_t N, int64_t C, float eps,
                    cudaStream_t stream);
// din += (the residual stream sums its branches); dweight += over rows.
// `scratch` holds RmsNormScratchFloats(N, C) floats (device_memory.h).
template <typename T>
void RmsNormBackward(T* din, float* dweight, const T* dout, const T* in, const T* weight, const float* rstd, int64_t N,
                     int64_t C, float* scratch, cudaStream_t stream);

// ---- RoPE, in place on x[B, T, heads, hd] (HF rotate-half); tables are
// fp32 [T, hd/2] as cpu::RopeTables makes them. Backward rotates by -angle.
template <typename T>
void RopeForward(T* x, const float* cos, const float* sin, int64_t B, int64_t T_, int64_t heads, int64_t head_dim,
                 cudaStream_t stream);
template <typename T>
void RopeBackward(T* dx, const float* cos, const float* sin, int64_t B, int64_t T_, int64_t heads, int64_t head_dim,
                  cudaStream_t stream);

// ---- causal grouped-query attention, flash style: memory O(B*H*T), the
// [T, T] scores are never stored. q[B, T, H, hd], k/v[B, T, KV, hd],
// out[B, T, H, hd], lse[B, H, T] (fp32 log-sum-exp of the scaled scores,
// kept for backward). head_dim must be one of AttentionHeadDimSupported.
bool AttentionHeadDimSupported(int64_t head_dim);
//
// Context parallelism: `positions` (device, [T_], increasing) gives each
// query row's position in sequences of `Tk` keys (k/v [B, Tk, KV, hd], dk
// and dv likewise); row t attends the keys at positions <= positions[t]
// (the FMA kernels, whatever the dtype).
template <typename T>
void AttentionForward(T* out, float* lse, const T* q, const T* k, const T* v, int64_t B, int64_t T_, int64_t H,
                      int64_t KV, int64_t head_dim, cudaStream_t stream, int64_t Tk = 0,
                      const int32_t* positions = nullptr);
// dq, dk, dv overwritten; `scratch` holds AttentionScratchFloats floats
// (device_memory.h).
// dk/dv sum the H/KV query heads of a group in head order.
template <typename T>
void AttentionBackward(T* dq, T* dk, T* dv, const T* dout, const T* out, const float* lse, const T* q, const T* k,
                       const T* v, int64_t B, int64_t T_, int64_t H, int64_t KV, int64_t head_dim, float* scratch,
                       cudaStream_t stream, int64_t Tk = 0, const int32_t* positions = nullptr);

// ---- SwiGLU and the residual add, elementwise over n.
template <typename T>
void SwigluForward(T* out, const T* gate, const T* up, int64_t n, cudaStream_t stream);
template <typename T>
void SwigluBackward(T* dgate, T* dup, const T* dout, const T* gate, const T* up, int64_t n, cudaStream_t stream);
template <typename T>
void AddForward(T* out, const T* a, const T* b, int64_t n, cudaStream_t stream);

// ---- fused cross-entropy over the vocabulary. Forward: losses[i] (fp32) =
// logsumexp(logits[i]) - logits[i, targets[i]], lse kept. Backward:
// logits[i] is overwritten in place by scale * (softmax - onehot), so no
// probability tensor is ever held beside the logits.
template <typename T>
void CrossEntropyForward(float* losses, float* lse, const T* logits, const int32_t* targets, int64_t N, int64_t V,
                         cudaStream_t stream);
// `first`: the vocabulary id of column 0 (a tensor-parallel rank's
// columns: a target outside them adds no onehot).
template <typename T>
void CrossEntropyBackward(T* logits, const float* lse, const int32_t* targets, int64_t N, int64_t V, float scale,
                          cudaStream_t stream, int64_t first = 0);

// ---- the vocabulary-parallel cross-entropy (model/cpu/ops.h's scheme):
// each rank's columns [first, first + V) of every row give fp32 stats
// [N, 2 x ranks + 1] (its slot: the columns' max and sum of exp(x - max),
// and the target's logit where the target is its; zeros elsewhere), one
// sum over the ranks gathers them, and VocabParallelLoss makes each row's
// log-sum-exp over the whole vocabulary (ranks in order) and loss.
// CrossEntropyBackward with `first` then takes the lse.
template <typename T>
void VocabParallelStats(float* stats, const T* logits, const int32_t* targets, int64_t N, int64_t V, int64_t first,
                        int rank, int ranks, cudaStream_t stream);
void VocabParallelLoss(float* losses, float* lse, const float* stats, int64_t N, int ranks, cudaStream_t stream);

// ---- dtype conversion (weights to the compute dtype, gradients out).
template <typename From, typename To>
void Convert(To* out, const From* in, int64_t n, cudaStream_t stream);

// ---- optimizer: AdamW on [0, n) with model/optim's scalars and element
// math (torch.optim.AdamW), the weight-decay factor `decay` for the whole
// range (call per DecaySegment), gradients scaled by grad_scale as read.
void AdamW(float* params, const float* grads, float* m, float* v, int64_t n, const AdamWScalars& s, float decay,
           cudaStream_t stream);
// Partial sums of squares in double over fixed kSumOfSquaresChunk-element
// chunks of x: partial[c] for c < SumOfSquaresChunks(n); the caller adds
// them in order.
void SumOfSquaresPartials(double* partial, const float* x, int64_t n, cudaStream_t stream);

}  // namespace herd::cuda
