#include "model/cuda/device_memory.h"

#include <algorithm>
#include <vector>

#include "model/param_layout.h"

namespace herd::cuda {

int64_t RmsNormScratchFloats(int64_t N, int64_t C) { return (N < kRmsNormPartitions ? N : kRmsNormPartitions) * C; }

int64_t AttentionScratchFloats(int64_t B, int64_t T_, int64_t H) { return B * H * T_; }

CudaActivationSizes::CudaActivationSizes(const LlamaShape& s, int max_batch, int max_seq_len, Recompute recompute,
                                         const CudaModelPart& part) {
  const int C = std::max(1, part.context_ranks);
  N = static_cast<int64_t>(max_batch) * max_seq_len / C;
  const int first = part.layers.first, end = part.layers.end < 0 ? s.num_layers : part.layers.end;
  const int64_t layers = end - first;
  const int64_t L = recompute == Recompute::kFull ? std::min<int64_t>(1, layers) : layers, d = s.hidden_size;
  const bool rows_split = part.sequence_parallel && part.tensor_ranks > 1;
  head = end == s.num_layers;
  R = rows_split ? (N + part.tensor_ranks - 1) / part.tensor_ranks : N;
  whole = rows_split ? N * d : 0;
  rope = static_cast<int64_t>(max_seq_len) * s.head_dim() / 2;
  residual = (layers + 1) * R * d;
  per_layer_d = L * R * d;
  per_layer_rows = L * R;
  per_layer_qd = L * N * s.q_dim();
  per_layer_kvd = L * N * s.kv_dim();
  lse = L * AttentionScratchFloats(max_batch, max_seq_len / C, s.num_heads);
  per_layer_f = L * N * s.intermediate_size;
  logits = head ? N * s.vocab_size : 0;
  rms_scratch = RmsNormScratchFloats(N, d);
  attn_scratch = AttentionScratchFloats(max_batch, max_seq_len / C, s.num_heads);
  if (part.split_backward) {
    split_kept = layers * N * (2 * d + 2 * s.intermediate_size + s.q_dim() + 2 * s.kv_dim());
  }
  if (C > 1) {
    context_kv = 5 * static_cast<int64_t>(max_batch) * max_seq_len * s.kv_dim();
    positions = max_seq_len / C;
    rope_local = 2 * positions * s.head_dim() / 2;
  }
  if (part.tensor_ranks > 1 && head) {
    vocab_stats = N * (2 * static_cast<int64_t>(part.tensor_ranks) + 1) +
                  static_cast<int64_t>(s.vocab_size) * part.tensor_ranks;
  }
}

int64_t CudaActivationSizes::ComputeElements(const LlamaShape& s) const {
  return residual + 3 * per_layer_d + 2 * per_layer_qd + 2 * per_layer_kvd + 3 * per_layer_f +
         (head ? N * s.hidden_size : 0) + logits + whole + context_kv + split_kept +
         // backward: dres (the rank's rows), dln, datt, dq, dk, dv, dact, dgate, dup
         R * s.hidden_size + N * s.hidden_size + 2 * N * s.q_dim() + 2 * N * s.kv_dim() + 3 * N * s.intermediate_size;
}

int64_t CudaActivationSizes::FloatElements() const {
  // lnf_rstd (the rank's rows), losses, ce_lse: the head's
  return 2 * rope + rope_local + 2 * per_layer_rows + lse + (head ? R + 2 * N : 0) + rms_scratch + attn_scratch +
         vocab_stats;
}

// tokens, targets, embedding groups; a context rank's positions
int64_t CudaActivationSizes::IntElements() const { return 5 * N + 1 + positions; }

int64_t CudaActivationBytes(const LlamaShape& shape, int max_batch, int max_seq_len, bool bf16, Recompute recompute,
                            const CudaModelPart& part) {
  const CudaActivationSizes z(shape, max_batch, max_seq_len, recompute, part);
  return z.ComputeElements(shape) * (bf16 ? 2 : 4) + z.FloatElements() * 4 + z.IntElements() * 4;
}

int64_t GpuWorkerDeviceBytes(const LlamaShape& shape, int max_batch, int max_seq_len, bool bf16, Recompute recompute,
                             const CudaModelPart& part) {
  const int64_t P = ParamLayout(shape).size();
  return CudaActivationBytes(shape, max_batch, max_seq_len, bf16, recompute, part) +
         P * ((bf16 ? 2 : 4) + 4 + (bf16 ? 4 : 0)) + kCublasWorkspaceBytes;
}

std::vector<int> StageUnits(const LlamaShape& shape, LayerRange layers) {
  const ParamLayout layout(shape);
  const int end = layers.end < 0 ? shape.num_layers : layers.end;
  const int units = static_cast<int>(layout.UnitBoundaries().size()) - 1;  // the embedding, the layers, the head's
  const bool head = end == shape.num_layers;
  std::vector<int> held;
  if (layers.first == 0 || (head && layout.lm_head() == layout.embed())) held.push_back(0);
  for (int l = layers.first; l < end; ++l) held.push_back(1 + l);
  if (head && units > shape.num_layers + 1) held.push_back(units - 1);
  return held;
}

int64_t StageHeldElements(const LlamaShape& shape, LayerRange layers) {
  const std::vector<int64_t> bounds = ParamLayout(shape).UnitBoundaries();
  int64_t n = 0;
  for (int u : StageUnits(shape, layers)) n += bounds[u + 1] - bounds[u];
  return n;
}

int64_t StageWorkerDeviceBytes(const LlamaShape& shape, int max_batch, int max_seq_len, bool bf16, Recompute recompute,
                               const CudaModelPart& part, int slots, int64_t held) {
  return slots * (CudaActivationBytes(shape, max_batch, max_seq_len, bf16, recompute, part) + kCublasWorkspaceBytes) +
         held * ((bf16 ? 2 : 4) + 4 + (bf16 ? 4 : 0));
}

namespace {

// The largest two consecutive units (ParamLayout::UnitBoundaries), the
// tied embedding aside, and the tied embedding (0 untied): a window's
// fullest.
struct WindowUnits {
  int64_t pair = 0, kept = 0;
};
WindowUnits WindowOf(const LlamaShape& shape) {
  const ParamLayout layout(shape);
  const std::vector<int64_t> units = layout.UnitBoundaries();
  const bool tied = layout.lm_head() == layout.embed();
  WindowUnits w;
  for (size_t u = 0; u + 1 < units.size(); ++u) {
    const int64_t here = tied && u == 0 ? 0 : units[u + 1] - units[u];
    const int64_t next = u + 2 < units.size() ? units[u + 2] - units[u + 1] : 0;
    w.pair = std::max(w.pair, here + next);
  }
  w.kept = tied ? units[1] : 0;
  return w;
}

}  // namespace

int64_t StreamedGpuWorkerDeviceBytes(const LlamaShape& shape, int max_batch, int max_seq_len, bool bf16,
                                     Recompute recompute, bool accumulates) {
  const WindowUnits w = WindowOf(shape);
  const int64_t weights = (w.pair + w.kept) * (bf16 ? 2 : 4);
  const int64_t grads = accumulates ? ParamLayout(shape).size() * 4 : (w.pair + w.kept) * 4;
  const int64_t landing = bf16 ? kStagingSlots * kStagingSlotFloats * 4 : 0;
  return CudaActivationBytes(shape, max_batch, max_seq_len, bf16, recompute) + weights + grads + landing +
         kCublasWorkspaceBytes;
}

int64_t GatheredTrainerDeviceBytes(const LlamaShape& shape, int max_batch, int max_seq_len, bool bf16,
                                   Recompute recompute, bool accumulates, int64_t owned) {
  const WindowUnits w = WindowOf(shape);
  const int64_t weights = (w.pair + w.kept) * (bf16 ? 2 : 4);
  const int64_t grads = accumulates ? ParamLayout(shape).size() * 4 : (w.pair + w.kept) * 4;
  // The owned slices' master weights, reduced gradients and moments.
  return CudaActivationBytes(shape, max_batch, max_seq_len, bf16, recompute) + weights + grads + owned * 16 +
         SumOfSquaresChunks(owned) * 8 + kCublasWorkspaceBytes;
}

int64_t SumOfSquaresChunks(int64_t n) { return (n + kSumOfSquaresChunk - 1) / kSumOfSquaresChunk; }

int64_t DeviceTrainerDeviceBytes(const LlamaShape& shape, int max_batch, int max_seq_len, bool bf16,
                                 Recompute recompute, int64_t owned) {
  const int64_t P = ParamLayout(shape).size();
  if (owned < 0) owned = P;
  // Compute weights and gradients whole; the owned ranges' moments (and
  // in bf16 their fp32 master weights); the squares' partials.
  return CudaActivationBytes(shape, max_batch, max_seq_len, bf16, recompute) + P * ((bf16 ? 2 : 4) + 4) +
         owned * (8 + (bf16 ? 4 : 0)) + SumOfSquaresChunks(P) * 8 + kCublasWorkspaceBytes;
}

}  // namespace herd::cuda
