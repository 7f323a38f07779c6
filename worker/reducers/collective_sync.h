// The worker's side of all-reduce mode (see worker/reducers/sync_strategy.h): synchronous
// data parallelism among the workers alone, over Collectives.
//
//   zero_stage 0 (DDP): every gradient bucket is all-reduced as backward
//     finishes it; every worker then holds the same summed gradients and
//     applies the same AdamW to its full copy of the weights and moments.
//   zero_stage 1: each worker owns a slice of every bucket
//     (sharding/shard_plan.h's OwnedSlices: the part a ring all-reduce of
//     the bucket sums in the same order) and only those slices' AdamW
//     moments. Each bucket is reduce-scattered among the owners as backward
//     finishes it (every link busy, as the all-reduce's first half), the
//     owners' partial squared norms and the losses are all-reduced, each
//     owner steps its slices, and the new weights are all-gathered bucket by
//     bucket in forward order while the next forward starts.
//   zero_stage 2: as 1, and a bucket's gradients outside the owned slice are
//     let go as soon as its reduce-scatter is done (the gradients are a
//     PagedBuffer; a unit's reduce-scatters run beside the next unit's
//     backward and are waited for once it is done, so at most two units'
//     gradients are whole at once), so a worker keeps its slices'
//     gradients only. When one backward writes all of a step's gradients,
//     the pages let go of are kept in a pool and back the unit backward
//     writes next (before it starts, zeroed), so memory is reused rather
//     than faulted in afresh.
//   zero_stage 3: as 2, and the weights are sharded too: the model reaches
//     them through a window (the policy of sharding/weight_window.h, as a
//     streaming parameter-server worker's) that all-gathers each bucket
//     from its owners before the unit's forward and again before its
//     backward (prefetch_layers ahead; with reshard_after_forward false,
//     kept from forward to backward), and a pushed bucket is
//     reduce-scattered and let go but for this worker's slice. The master
//     weights of the slices are the optimizer's own memory. Without
//     clipping or the spike guard nothing global enters the update, so
//     each slice steps as soon as its reduce-scatter is done and its
//     gradients go too (as parameter servers stream updates): a worker
//     then holds 12 bytes a parameter over W, less than its share of the
//     fp32 weights' 16/W at W=4.
//
// CUDA workers with NCCL (device_reduction) receive their gradients
// reduce-scattered on the device (ZeRO-3: each unit as the device window
// ships it out); the ring then carries the norms, the losses and the
// weights.
//
// Every stage sums each gradient in the same ring order, computes on the
// same weights and takes the norm from the same per-owner partials, so DDP
// and ZeRO-1, -2 and -3 take bitwise the same steps.
//
// A placement that is not the whole model (ReducedPlacement): the same
// over its part of the space among its replicas, a tensor-parallel rank's
// packed space or a pipeline stage's ranges of it (either's group step,
// worker/placements/model_group_steps.h's ModelGroupSteps, goes around it), a
// tied embedding's exchange between the first and the last stage after
// the reductions. A stage's micro-batches add into its gradients whole;
// ZeRO-2 and -3 let them go but for the slices once the last one's
// backward has reduce-scattered them.
//
// Hybrid sharding (FSDP's HSDP, cluster.shard_group_size G): the stages
// above run inside each group of G workers; a slice's reduce-scattered
// gradients are then all-reduced with the same slice in the other groups
// (so every replica steps bitwise alike), and the first group alone writes
// the checkpoint's G shard files. A gradient is then summed inside the
// group first: within rounding of DDP, not bitwise, but bitwise the same
// across stages of the same G.
//
// At a fresh start worker 0's weights (seed or checkpoint.init_from) are
// broadcast (ZeRO-3: every worker initialises its slices alike); on resume
// every worker reads what it needs from the checkpoint. Checkpoints: DDP worker 0 writes the one shard; under ZeRO
// each worker writes its slices as one shard file of pieces
// (model/checkpoint_format.h), so `--resume` works with either, and with
// PS checkpoints, of any number of workers with the same global batch.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "common/paged_buffer.h"
#include "common/status.h"
#include "model/checkpoint_load.h"
#include "proto/herd.pb.h"
#include "sharding/job_options.h"
#include "sharding/shard_plan.h"
#include "sharding/tensor_slices.h"
#include "transport/collectives.h"
#include "worker/reducers/sync_strategy.h"
#include "worker/reducers/weight_home.h"

namespace herd {

// Gradients that reach host memory already reduced across the workers
// (CUDA workers: NCCL on the device, worker/reducers/nccl_gradients.h). The strategy
// then sends no gradient itself and only waits for the step's reductions.
class DeviceGradientReduction {
 public:
  virtual ~DeviceGradientReduction() = default;
  // Waits for every reduction of the step; the first failure, if any.
  virtual Status FinishStep() = 0;
};

// The part of the model a placement computes, as a reducer sees it: the
// ranges of its space it holds, what it adds to the global norm and the
// mean loss, and which shard files it writes. The default is the whole
// model, every worker one data-parallel replica.
struct ReducedPlacement {
  // A tensor-parallel rank's slices: the reducer's `layout` is their
  // packed layout, `flat` the model's flat space. Its state loads through
  // the slices, and its checkpoint parts are the slices' pieces of the flat
  // space, the norms (every rank's alike) counted and written by tensor
  // rank 0 alone.
  const TensorSlices* slices = nullptr;
  const ParamLayout* flat = nullptr;
  // A pipeline stage's ranges of `layout`'s space (sharding/
  // pipeline_plan.h's RangesOf, ascending; empty: all of it), at whose
  // ends the plan's buckets are cut: the reductions, the optimizer and
  // ZeRO-3's window cover the buckets inside them alone, and every
  // replica loads their weights alike (no broadcast). Under DDP the first
  // replica adds their squares to the norm, as one process sums them.
  std::vector<ParamRange> held;
  // Of `held`, a range another place of the grid holds too and counts
  // (the last stage's copy of a tied embedding; empty: none): reduced and
  // stepped here alike, neither counted in the norm nor written.
  ParamRange copy;
  // Between the gradients' reductions and the norm (the tied embedding's
  // exchange, worker/placements/tied_embedding.h; null: none); its time counts as
  // waiting, its failure ends the step.
  std::function<Status(float* grads, uint64_t step)> after_reduction;
  // Whether this worker's loss is one of those the step's mean averages
  // (a replica's loss, which each of `loss_holders` workers knows alike,
  // added once: by the last stage's tensor rank 0).
  bool adds_loss = true;
  int loss_holders = 1;
  // Its index among the placements of a replica, and their number (a
  // stage's tensor rank p·T + t of P·T): shard file index·G + g of shard
  // group rank g under ZeRO, file `index` under DDP.
  int index = 0, count = 1;
};

struct CollectiveSyncOptions {
  const JobOptions* job = nullptr;
  const ParamLayout* layout = nullptr;
  // The buckets, each owned slice by slice under ZeRO (OwnedSlices).
  const ShardPlan* plan = nullptr;
  int zero_stage = 0;  // cluster.zero_stage: 0 (DDP), 1, 2 or 3
  // The placement's replicas (all the workers without model axes): the
  // reductions, and a fresh start's broadcast.
  transport::Collectives* collectives = nullptr;
  // Hybrid sharding (cluster.shard_group_size): the ring of this worker's
  // shard group, which the slices are cut among (reduce-scatters and
  // gathers), and the ring of its replicas (the workers of the same place
  // in the other groups), over which each owned slice's reduced gradients
  // are all-reduced. Both null: one group of all the workers.
  transport::Collectives* shard_group = nullptr;
  transport::Collectives* replicas = nullptr;
  // How the gradients' reductions travel (cluster.wire_dtype); weights,
  // norms and losses always travel exactly.
  transport::Wire gradient_wire = transport::Wire::kFloat32;
  // Set when gradients arrive reduced (then `collectives` carries only the
  // norms, the losses and the weights).
  DeviceGradientReduction* device_reduction = nullptr;
  // ZeRO-2 and -3: the gradients' flat space, paged (its owner's memory is
  // let go outside the owned slices).
  PagedBuffer* paged_grads = nullptr;
  // ZeRO-2 on paged gradients, when the step's last backward is the only
  // one to write them (no micro-batch accumulates before it): a unit's
  // gradients are dead until its backward starts, so `paged_grads` keeps
  // a pool of the pages let go of to back them with (PagedBuffer::Recycle).
  bool recycle_gradient_pages = false;
  // ZeRO-3: the weights' flat space, paged and guarded (what the window
  // does not hold cannot be read), and the window's policy.
  PagedBuffer* paged_weights = nullptr;
  int prefetch_layers = 1;            // cluster.stream_prefetch_layers
  bool reshard_after_forward = true;  // cluster.reshard_after_forward
  // ZeRO-3 (StepsSlicesAsScattered): each slice steps as soon as its
  // gradients are reduced, and they are let go, so a worker never holds
  // its slices' gradients all at once.
  bool step_slices_as_scattered = false;
  // All the workers: the norm and the losses (null: `collectives`).
  transport::Collectives* everyone = nullptr;
  ReducedPlacement placement;
  // The placement's part of a step around this strategy (a model-parallel
  // rank's ModelGroupSteps, worker/placements/model_group_steps.h: the tensor and
  // context groups' collectives): what the worker drives and the home's
  // hooks reach (null: none).
  AroundReducer around;
};

// The strategy (`around` the collectives' own, if given) and where its
// weights live (whole, or ZeRO-3's window); the home refers to the
// strategy.
struct CollectiveSyncParts {
  std::unique_ptr<SyncStrategy> sync;
  std::unique_ptr<WeightHome> home;
};

// Loads or initialises this worker's state into `weights` (the full flat
// space; under ZeRO-3 the window, filled as the passes go) and its
// optimizer moments; `resume_from` continues this run (the caller has
// checked it with CheckSameRun).
StatusOr<CollectiveSyncParts> CreateCollectiveSync(const CollectiveSyncOptions& options, float* weights,
                                                   const std::optional<VerifiedCheckpoint>& resume_from);

}  // namespace herd
