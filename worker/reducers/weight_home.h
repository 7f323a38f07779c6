// Where a worker's weights live, as the model reaches them: the hooks of
// model/model.h that a pass calls before it reads a unit's weights, once
// it no longer reads them, and once a unit's gradients are final. The step
// loop hands these hooks to the model and never asks which home it has.
//
//   WholeWeights: every weight of the flat space is held; a version arrives
//     bucket by bucket (the SyncStrategy's IssueWeights) and the step's
//     first forward waits layer by layer for what it reaches; the step's
//     last backward hands each final bucket to the SyncStrategy.
//   Windowed: only a window is held (sharding/weight_window.h); every
//     pass, evaluation's too, brings units in and lets them go. Filled
//     from the servers (cluster.stream_weights,
//     worker/reducers/parameter_server_sync.h) or gathered from the workers that
//     own its slices (ZeRO-3, worker/reducers/collective_sync.h).
//
// A pipeline stage's layers and a tensor-parallel rank's slices are whole
// weights of their own (packed) space; what else a new axis takes in the
// worker today is in docs/tour.md.
#pragma once

#include <cstdint>
#include <memory>

#include "common/paged_buffer.h"
#include "model/model.h"
#include "worker/reducers/sync_strategy.h"

namespace herd {

class WeightHome {
 public:
  virtual ~WeightHome() = default;

  // A training forward's hook. `arriving`: the weights of this version may
  // still be arriving (the step's first forward, before the step before it
  // has settled); once they are all in, a home that holds them whole needs
  // no hook.
  virtual Model::NeedUpTo ForwardNeed(bool arriving) = 0;
  // A training backward's hooks: before it reads weights at offsets >= x;
  // once it no longer reads them (`last_micro_batch`: and its gradients
  // there are final for the step).
  virtual Model::NeedFrom BackwardNeed() = 0;
  virtual Model::FinalFrom BackwardDone(bool last_micro_batch) = 0;
  // Before a share's first backward: its gradients start from zero.
  virtual void ClearGradients(float* grads, int64_t count) = 0;
  // A forward outside training (evaluation, the sample), on weights that
  // are all in: its hook, and Release() once such passes are done.
  virtual Model::NeedUpTo EvalNeed() = 0;
  virtual void Release() = 0;
};

// What a windowed home forwards the model's backward hooks to, besides the
// SyncStrategy's (WaitUpTo for forward, FinalFrom for final gradients):
// the strategy that fills the window.
class WindowHooks {
 public:
  virtual ~WindowHooks() = default;
  // Before backward reads weights at offsets >= begin.
  virtual void WaitFrom(int64_t begin) = 0;
  // Once a pass no longer reads weights at offsets >= offset.
  virtual void DoneFrom(int64_t offset) = 0;
  // Every weight let go (after passes outside training).
  virtual void ReleaseWeights() = 0;
};

// Only a window held, filled by `sync` through `window`; a share's
// gradients start from `paged_grads` released.
std::unique_ptr<WeightHome> WindowedWeights(SyncStrategy& sync, WindowHooks& window, PagedBuffer* paged_grads);

// Every weight held; versions come through `sync`. With `paged_grads`
// (ZeRO-2: the gradients' flat space, of which `sync` lets go outside this
// worker's slices) a share's gradients start from a released buffer
// rather than a filled one, so that no page is backed before backward
// writes it.
std::unique_ptr<WeightHome> WholeWeights(SyncStrategy& sync, PagedBuffer* paged_grads = nullptr);

}  // namespace herd
