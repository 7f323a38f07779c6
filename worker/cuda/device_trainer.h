// One process training on one GPU with everything resident there, as llm.c
// and a PyTorch training loop do: fp32 master weights, AdamW moments and
// gradients in device memory, the compute copy in the compute dtype. A
// step is two calls: ComputeGradients (forward/backward over the
// micro-batches and the global gradient norm) and ApplyUpdate (AdamW on the
// device with the numbers OptimizerShard::BeginStep made of that norm: the
// learning rate, the clipping coefficient, the spike guard's verdict), so
// the step's numbers are made in one place for every path. The
// single-process trainer (DeviceResidentSync, worker/reducers/local_sync.h) uses it
// for device.kind CUDA, and `herd bench gpu` times that trainer. No CUDA
// type appears here, so callers need no CUDA headers, and builds without
// CUDA include this header without compiling device_trainer.cc.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "common/status.h"
#include "model/llama_config.h"
#include "model/model.h"
#include "model/optim/adamw.h"
#include "model/optim/optimizer_shard.h"
#include "sharding/job_options.h"

namespace herd::cuda {

class DeviceTrainer {
 public:
  struct Options {
    LlamaShape shape;
    int batch = 8, seq_len = 1024;
    bool bf16 = true;
    AdamWOptions adamw;  // the schedule and clipping are OptimizerShard's
    int device = 0;
    Recompute recompute = Recompute::kNone;

    // A job's model, train.batch_size x seq_len and AdamW options, in
    // bf16 or fp32 (device.dtype), on `device`.
    static Options ForJob(const JobOptions& job, bool bf16, int device) {
      Options o;
      o.shape = job.shape;
      o.batch = job.batch;
      o.seq_len = job.seq_len;
      o.bf16 = bf16;
      o.adamw = job.optimizer.adamw;
      o.device = device;
      o.recompute = job.recompute;
      return o;
    }
  };
  // Errors: no device, cuBLASLt missing, a shape without kernels, or not
  // enough device memory (one line each, before anything is allocated).
  static StatusOr<std::unique_ptr<DeviceTrainer>> Create(const Options& options);
  virtual ~DeviceTrainer() = default;

  // The optimizer state over the whole flat space (host arrays of
  // layout().size() floats); GetState's m and v may be null.
  virtual void SetState(const float* weights, const float* m, const float* v) = 0;
  virtual void GetState(float* weights, float* m, float* v) = 0;

  struct Gradients {
    double loss = 0;         // the mean over the micro-batches
    double global_norm = 0;  // of the summed gradients, before clipping
  };
  // Forward and backward over micro-batches of host tokens (inputs[a],
  // targets[a]: batch x seq_len each), the gradients summed on the device;
  // returns once their norm is on the host.
  virtual Gradients ComputeGradients(const std::vector<const int32_t*>& inputs,
                                     const std::vector<const int32_t*>& targets) = 0;
  // AdamW over the whole space with the step's numbers (step, lr, clipping
  // coefficient); nothing when the spike guard skips the step. Returns
  // while the device still runs it.
  virtual void ApplyUpdate(const OptimizerShard::Scalars& step) = 0;

  // Waits until the device has done everything issued so far.
  virtual void Synchronize() = 0;

  // The current weights as a Model for evaluation and sampling: its
  // Forward ignores `params` (the weights live on the device) and it has
  // no Backward.
  virtual Model& evaluator() = 0;
  virtual std::string Describe() const = 0;
};

}  // namespace herd::cuda
