// Training on one GPU with everything resident there, as llm.c, PyTorch
// DDP, FSDP2 and DeepSpeed's ZeRO keep it: fp32 master weights, AdamW moments
// and gradients in device memory, the compute copy in the compute dtype.
// A step is two calls: ComputeGradients (forward/backward over the
// micro-batches, the gradients reduced across workers through a
// DeviceExchange as backward finishes them, and their squared norm) and
// ApplyUpdate (AdamW on the device with the numbers OptimizerShard::
// BeginStep made of the global norm: the learning rate, the clipping
// coefficient, the spike guard's verdict), so the step's numbers are made
// in one place for every path. One process (DeviceResidentSync,
// worker/reducers/device_resident_sync.h) and all-reduce mode over NCCL use it for
// device.kind CUDA; `herd bench gpu` times it.
//
// A ZeRO owner keeps the master weights and moments of its slices only
// (Options::owned); in fp32 its master weights are the compute weights'
// own elements, stepped in place, in bf16 a packed fp32 copy of the
// slices. Under ZeRO-3 (Options::gathered) the compute weights and the
// gradients are units gathered and let go as the passes go, the slices'
// master weights and reduced gradients packed. No CUDA
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
#include "model/param_layout.h"
#include "sharding/job_options.h"

namespace herd::cuda {

// How a device's gradients and weights meet the other workers' (NCCL:
// worker/reducers/nccl_gradients.h). Each call is ordered on the device
// after the work the trainer issued before it, and the trainer's work
// issued after it follows it. `stream` is the trainer's cudaStream_t,
// opaque here so that this header needs no CUDA.
class DeviceExchange {
 public:
  virtual ~DeviceExchange() = default;
  // The step's summed gradients at [begin, end) are final (the last
  // micro-batch's backward, in descending ranges): all-reduce them, or
  // reduce-scatter them to their owners. `grads + x` is the device address
  // of flat offset x (for x in the range: a unit's buffer may stand for
  // the space).
  virtual void ReduceGradients(float* grads, int64_t begin, int64_t end, void* stream) = 0;
  // Before the trainer reads the reduced gradients (the norm, the update).
  virtual void AwaitGradients(void* stream) = 0;
  // The compute weights of [begin, end) (`element_bytes` 4 or 2 each,
  // addressed as ReduceGradients' gradients), each owner's slices from it
  // (nothing under DDP, where every worker stepped everything): after the
  // update, or as ZeRO-3's passes reach each unit.
  virtual void GatherWeights(void* weights, int64_t begin, int64_t end, int element_bytes, void* stream) = 0;
  // Whether what was issued since the last call went well (a peer gone,
  // an NCCL error); waits for it.
  virtual Status Finish() = 0;
};

class DeviceTrainer {
 public:
  struct Options {
    LlamaShape shape;
    int batch = 8, seq_len = 1024;
    bool bf16 = true;
    AdamWOptions adamw;  // the schedule and clipping are OptimizerShard's
    int device = 0;
    Recompute recompute = Recompute::kNone;
    // The ranges of the flat space whose master weights and AdamW moments
    // this device keeps and steps (ascending, disjoint; empty: all of it):
    // a ZeRO owner's slices. The compute weights and the gradients are
    // whole.
    std::vector<ParamRange> owned;
    // The ranges whose squared gradients ComputeGradients adds (ascending;
    // empty: all of it).
    std::vector<ParamRange> counted;
    // The data-parallel replicas whose gradients the exchange adds: each
    // takes 1/replicas of the global batch's mean.
    int replicas = 1;
    // ZeRO-3 (FSDP2's layout): the compute weights too are only the owned
    // slices between passes, each unit gathered through the exchange as
    // the passes reach it; `counted` must then be `owned`. `accumulates`:
    // more than one micro-batch a step (every unit's gradients stay until
    // the last), for the memory check.
    bool gathered = false;
    bool accumulates = false;

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

  // The elements of the owned ranges (of the whole space when all).
  virtual int64_t owned_size() const = 0;
  // The state: `weights` the whole flat space (the compute weights, and
  // the owned ranges' master weights); `m` and `v` the owned ranges',
  // packed one after another (owned_size() floats each).
  virtual void SetState(const float* weights, const float* m, const float* v) = 0;
  // The owned ranges' master weights, m and v, packed as SetState's m (m
  // and v may be null).
  virtual void GetState(float* weights, float* m, float* v) = 0;

  // From now on the step's gradients are reduced, and the weights
  // gathered, through `exchange` (which must outlive the trainer).
  virtual void SetExchange(DeviceExchange* exchange) = 0;

  struct Gradients {
    double loss = 0;     // the mean over the micro-batches
    double squares = 0;  // of the summed (and reduced) gradients in `counted`, before clipping
  };
  // Forward and backward over micro-batches of host tokens (inputs[a],
  // targets[a]: batch x seq_len each), the gradients summed on the device
  // (and reduced, with an exchange); returns once their squares are on the
  // host.
  virtual Gradients ComputeGradients(const std::vector<const int32_t*>& inputs,
                                     const std::vector<const int32_t*>& targets) = 0;
  // AdamW over the owned ranges with the step's numbers (step, lr,
  // clipping coefficient), then the compute weights (gathered, with an
  // exchange); nothing when the spike guard skips the step. Returns while
  // the device still runs it.
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
