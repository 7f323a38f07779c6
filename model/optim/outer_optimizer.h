// DiLoCo's outer optimizer (Douillard et al. 2023) over one range of the
// flat space: a server's shard in a job of regions (cluster.diloco). It
// keeps the weights of the last outer step and the momentum buffer. Every
// H inner steps each region's copy of the range gives its pseudo-gradient,
// the weights of the last outer step minus the region's weights now; the
// regions' pseudo-gradients are summed (in the same order for all, so that
// every region computes the same bits) and the mean Δ takes one step of
// SGD with Nesterov momentum, in PyTorch's SGD(nesterov=True) order:
//   b = μ·b + Δ;  θ_outer = θ_outer − lr·(Δ + μ·b);
// every region goes on from θ_outer. With lr 1 and μ 0 that is θ_outer −
// mean_k(θ_outer − θ_k): the mean of the regions' weights, to rounding.
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "model/optim/block_quantizer.h"

namespace herd {

struct OuterOptions {
  double lr = 0.7;        // cluster.diloco.outer_lr
  double momentum = 0.9;  // cluster.diloco.outer_momentum (Nesterov's)
};

class OuterOptimizer {
 public:
  // Starts from `weights` (n floats): the first outer step's reference;
  // the momentum and the kept rounding error from `momentum` and `error`
  // (a checkpoint's), or zero.
  OuterOptimizer(const OuterOptions& options, const float* weights, int64_t n, const float* momentum = nullptr,
                 const float* error = nullptr);

  int64_t size() const { return static_cast<int64_t>(outer_.size()); }

  // Each call below works on the run [at, at + n) of the range (a
  // fragment, or the whole); its `weights`, `delta` and `summed` hold that
  // run alone, from its first element.

  // This region's pseudo-gradient of `weights` into `delta`: θ_outer − θ.
  void PseudoGradient(int64_t at, int64_t n, const float* weights, float* delta) const;
  // The same rounded to bf16 (exactly representable in `delta`'s floats)
  // with error feedback: the rounding's error is kept and added to the
  // next outer step's pseudo-gradient before it is rounded, so that no
  // part of a region's movement is lost for good.
  void RoundedPseudoGradient(int64_t at, int64_t n, const float* weights, float* delta);
  // The same quantised to `code`'s blocks (block_quantizer.h) into `out`,
  // QuantizedBytes(code, n) bytes, the error kept alike. Fails on a
  // pseudo-gradient that is not finite.
  Status QuantizedPseudoGradient(int64_t at, int64_t n, const float* weights, BlockCode code, uint8_t* out);
  // The outer step from `summed`, the sum of `regions` regions'
  // pseudo-gradients; every region goes on from outer() + at.
  void Step(int64_t at, int64_t n, const float* summed, int regions);
  // The weights of the last outer step, and the momentum.
  const float* outer() const { return outer_.data(); }
  const float* momentum() const { return momentum_.data(); }
  // The rounding or quantising error kept (null while there is none).
  const float* error() const { return error_.empty() ? nullptr : error_.data(); }

 private:
  const OuterOptions options_;
  std::vector<float> outer_, momentum_;
  std::vector<float> error_;  // the kept rounding or quantising error (empty until used)
};

}  // namespace herd
