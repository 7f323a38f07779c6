// What a CUDA worker allocates on its GPU, in bytes, computed without CUDA
// (this file is part of herd_model, so `herd plan` answers on any
// machine). model/cuda/ allocates from these same tables: the model's
// buffers (llama_cuda.cc), the kernels' scratch (rmsnorm.cu, attention.cu)
// and the staged model's state (staged_model.cc).
#pragma once

#include <cstdint>
#include <vector>

#include "model/llama_config.h"
#include "model/optim/sum_of_squares_chunk.h"

namespace herd::cuda {

// Row partitions of RMSNorm's weight gradient (rmsnorm.cu).
inline constexpr int kRmsNormPartitions = 128;
// cuBLASLt's workspace per Matmul (what it asks for on Hopper).
inline constexpr int64_t kCublasWorkspaceBytes = 32ll << 20;

// Scratch floats of RmsNormBackward for N rows of C channels.
int64_t RmsNormScratchFloats(int64_t N, int64_t C);
// Scratch floats of AttentionBackward (one per query row and head).
int64_t AttentionScratchFloats(int64_t B, int64_t T_, int64_t H);

// The part of the model a CudaLlamaModel computes: a tensor-parallel
// rank's slices (of `tensor_ranks`, its shape the slices'; with or without
// sequence parallelism) and a pipeline stage's layers (the embedding on the
// stage that starts at layer 0, the final norm and the head on the one that
// ends at the last).
struct CudaModelPart {
  int tensor_ranks = 1;
  bool sequence_parallel = false;
  LayerRange layers;
  // Context parallelism: the group's ranks, each computing its chunks'
  // tokens alone (N / context_ranks rows) against the whole sequences'
  // keys and values, gathered.
  int context_ranks = 1;
  // Zero bubble's split backward: each layer's products' output gradients
  // kept from the input part for the weights' (split_kept).
  bool split_backward = false;
};

// Element counts of every buffer of CudaLlamaModel for max_batch x
// max_seq_len tokens; the per_layer ones (and lse) for every layer of its
// part, or for one under Recompute::kFull. (Its attention keeps no
// probabilities, only their log-sum-exp per row, and recomputes them in
// backward, flash-style: kAttention keeps what kNone does.) A
// tensor-parallel rank's model adds the cross-entropy's statistics and a
// row of the whole vocabulary's logits (vocab_stats); with sequence
// parallelism the residual stream and the norms hold R = ceil(N /
// tensor_ranks) rows (every rank's alike), and `whole` [N, d] takes the
// gathers and the partial sums. Only the model with the head holds the
// head's buffers (the final norm's, the logits, the losses).
struct CudaActivationSizes {
  int64_t N, R, rope, residual, per_layer_d, per_layer_rows, per_layer_qd, per_layer_kvd, lse, per_layer_f, logits;
  int64_t rms_scratch, attn_scratch, vocab_stats = 0, whole = 0;
  // Context parallelism: the gathered keys and values and their gradients
  // ([B, T, kv] each) and the gathers' rank-major buffer; the rank's
  // positions and RoPE rows.
  int64_t context_kv = 0, positions = 0, rope_local = 0, split_kept = 0;
  bool head = true;
  CudaActivationSizes(const LlamaShape& s, int max_batch, int max_seq_len, Recompute recompute = Recompute::kNone,
                      const CudaModelPart& part = {});
  // Elements of the compute dtype, of fp32, of int32.
  int64_t ComputeElements(const LlamaShape& s) const;
  int64_t FloatElements() const;
  int64_t IntElements() const;
};

// CudaLlamaModel's device bytes (activations and backward scratch).
int64_t CudaActivationBytes(const LlamaShape& shape, int max_batch, int max_seq_len, bool bf16,
                            Recompute recompute = Recompute::kNone, const CudaModelPart& part = {});

// Everything a GPU worker's model holds on the device: activations,
// weights in the compute dtype, fp32 gradients, bf16 mode's fp32 landing
// buffer for weights, cuBLASLt's workspace (a tensor-parallel rank's:
// `part`'s slices).
int64_t GpuWorkerDeviceBytes(const LlamaShape& shape, int max_batch, int max_seq_len, bool bf16,
                             Recompute recompute = Recompute::kNone, const CudaModelPart& part = {});

// The units (indices of ParamLayout::UnitBoundaries' units, ascending) a
// model over `layers` reads: the embedding's on the first stage (and on
// the last when the embeddings are tied), its layers', the final norm's
// and the head's on the last; and their elements.
std::vector<int> StageUnits(const LlamaShape& shape, LayerRange layers);
int64_t StageHeldElements(const LlamaShape& shape, LayerRange layers);

// A pipeline stage's CUDA worker (model/cuda/stage_model.h): a model over
// `part`'s layers for each of `slots` micro-batches in flight (each its
// activations and cuBLASLt workspace), and the `held` elements of the
// flat space the stage holds (its units') as compute weights, fp32
// gradients and in bf16 the fp32 landing buffer.
int64_t StageWorkerDeviceBytes(const LlamaShape& shape, int max_batch, int max_seq_len, bool bf16, Recompute recompute,
                               const CudaModelPart& part, int slots, int64_t held);

// A streaming GPU worker's staging (model/cuda/streamed_model.h): a ring of
// page-locked host slots each way, and in bf16 mode device slots where the
// fp32 weights land before they are converted.
inline constexpr int kStagingSlots = 4;
inline constexpr int64_t kStagingSlotFloats = int64_t{1} << 20;  // 4 MiB a slot

// What a streaming GPU worker's model holds on the device at its peak:
// activations, cuBLASLt's workspace, the landing slots, the weights of two
// consecutive units (one computed, the next arriving) in the compute dtype
// and their fp32 gradients (one being shipped out, the next computed), plus
// the tied embedding's weights and gradients, held the whole step. With
// `accumulates` (grad_accum > 1) every unit's gradients stay until the
// step's last micro-batch ships them.
int64_t StreamedGpuWorkerDeviceBytes(const LlamaShape& shape, int max_batch, int max_seq_len, bool bf16,
                                     Recompute recompute, bool accumulates);

// Everything the device-resident trainer (worker/cuda/device_trainer.h)
// holds on the device: activations, the compute weights and the gradients
// whole, AdamW m and v (and in bf16 the fp32 master weights) of the
// `owned` elements (-1: all; a ZeRO owner's slices), the norm's partial
// sums, cuBLASLt's workspace.
int64_t DeviceTrainerDeviceBytes(const LlamaShape& shape, int max_batch, int max_seq_len, bool bf16,
                                 Recompute recompute = Recompute::kNone, int64_t owned = -1);

// The device-resident trainer under ZeRO-3 (gathered weights): the
// activations, a window of gathered units (as the streamed worker's) and
// their gradients (every unit's, when `accumulates`), the `owned` slices'
// fp32 master weights, reduced gradients and moments, cuBLASLt's
// workspace.
int64_t GatheredTrainerDeviceBytes(const LlamaShape& shape, int max_batch, int max_seq_len, bool bf16,
                                   Recompute recompute, bool accumulates, int64_t owned);

// Chunks of the gradient norm's partial sums over n elements
// (kSumOfSquaresChunk each, as model/optim's SumOfSquares).
int64_t SumOfSquaresChunks(int64_t n);

}  // namespace herd::cuda
