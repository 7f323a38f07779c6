// AdamW with PyTorch's semantics (torch.optim.AdamW, decoupled weight
// decay, bias correction), the learning-rate schedule and global-norm
// clipping. Everything works on a range [begin, end) of the flat parameter
// space so that a parameter server can step only its shard, a ZeRO worker
// only its slices, and a single process the whole space.
#pragma once

#include <cstdint>
#include <vector>

#include "model/optim/sum_of_squares_chunk.h"
#include "model/param_layout.h"

namespace herd {

// The defaults of AdamWOptions, LrSchedule (except total_steps) and
// OptimizerOptions are the job config's (proto/herd.proto; a job's come
// from sharding/job_options.h).
struct AdamWOptions {
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.0;
};

// Linear warm-up to `lr` over warmup_steps, then cosine decay to min_lr at
// the last of total_steps (LearningRate).
struct LrSchedule {
  double lr = 3e-4, min_lr = 0.0;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
};

// Everything an optimizer step reads from the job: AdamW's constants, the
// schedule and the clipping bound.
struct OptimizerOptions {
  AdamWOptions adamw;
  LrSchedule schedule;
  double clip_norm = 1.0;  // the global norm's bound; 0 disables clipping
  double skip_spikes_zscore = 0;  // model/optim/spike_guard.h; 0: off
  int skip_spikes_window = 128;
};

// Which elements of [begin, end) take weight decay (2-D tensors only).
struct DecaySegment {
  int64_t begin, end;  // absolute offsets in the flat space
  bool decay;
};
std::vector<DecaySegment> DecaySegments(const ParamLayout& layout, int64_t begin, int64_t end);

// The float scalars of one AdamW step, formed in double and rounded once
// (PyTorch's order): what AdamWStep and the GPU's AdamW kernel both use.
struct AdamWScalars {
  float beta1, one_minus_beta1, beta2, one_minus_beta2, step_size, bc2_sqrt, eps, grad_scale;
  float decay;  // the weight-decay factor of decayed tensors (the others': 1)
  float DecayFor(bool decay_segment) const { return decay_segment ? decay : 1.0f; }
};
AdamWScalars MakeAdamWScalars(const AdamWOptions& options, int64_t step, double lr, double grad_scale);

// One AdamW step over the range the segments cover. `params`, `grads`, `m`,
// `v` point at the element `range_begin` of the flat space; `step` counts
// steps including this one (1 on the first); gradients are multiplied by
// `grad_scale` (the clipping coefficient) as they are read.
void AdamWStep(const std::vector<DecaySegment>& segments, int64_t range_begin, float* params, const float* grads,
               float* m, float* v, int64_t step, double lr, double grad_scale, const AdamWOptions& options);

// What one AdamW pass reads the gradients from and writes beside the
// weights, all pointing at element range_begin of the flat space: fp32
// gradients, or bf16 ones (one parameter server's share on a bf16 wire,
// widened as they are read: the same values as widening them first); and,
// when set, the new weights rounded to bf16 (a bf16 wire's outgoing
// copy) in the same pass. Exactly one of grads and grads_bf16.
struct AdamWStreams {
  const float* grads = nullptr;
  const uint16_t* grads_bf16 = nullptr;
  uint16_t* weights_bf16 = nullptr;
};
// AdamWStep reading and writing `io`: one pass over the range, each
// element's arithmetic AdamWStep's, vectorised for the CPU it runs on
// (common/cpu_dispatch.h) and split over the OpenMP threads.
void AdamWStep(const std::vector<DecaySegment>& segments, int64_t range_begin, float* params,
               const AdamWStreams& io, float* m, float* v, int64_t step, double lr, double grad_scale,
               const AdamWOptions& options);

// Linear warm-up to `lr` over warmup_steps ((t+1)/warmup), then cosine decay
// to min_lr at the last step. `t` is the 0-based step index.
double LearningRate(const LrSchedule& schedule, int64_t t);

// Sum of squares in double, over fixed kSumOfSquaresChunk-element chunks
// summed in order (sum_of_squares_chunk.h, shared with the GPU's norm):
// the result does not depend on the thread count, and partial sums over
// chunk-aligned ranges add up to the same total.
double SumOfSquares(const float* x, int64_t n);
// One chunk's part of it (n <= kSumOfSquaresChunk): what SumOfSquares adds
// up, for passes that take each chunk's sum while it is in cache.
inline double ChunkSumOfSquares(const float* x, int64_t n) {
  double s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  return s;
}
// The same of bf16 values (widened exactly); its own order (bf16 wires
// are compared within bf16's tolerance, not bitwise, with fp32 ones).
double SumOfSquaresBf16(const uint16_t* x, int64_t n);

// PyTorch's clip_grad_norm_ coefficient: min(1, clip / (norm + 1e-6));
// 1 when clip_norm is 0 (disabled).
double ClipCoefficient(double global_norm, double clip_norm);

}  // namespace herd
