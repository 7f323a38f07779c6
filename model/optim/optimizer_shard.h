// One range [begin, end) of the flat parameter space and everything the
// optimizer keeps for it: the fp32 master weights, AdamW's m and v, the
// number of steps taken, which elements take weight decay, and the
// learning-rate schedule. The same object serves one process (the whole
// space), a parameter server (its shard), each slice of a ZeRO owner
// (OptimizerSlices below) and a DDP worker (the whole space); the
// GPU-resident trainer keeps its working copy on the device and this one
// to load and checkpoint it.
//
// The weights are this object's own (ZeRO-3's slices too), or, where a
// worker's model computes on the master weights in place (DDP, ZeRO-1 and
// -2), [begin, end) of the caller's buffer of the whole space (attached).
//
// A step: BeginStep(global_norm, loss) fixes the step's learning rate and
// clipping coefficient; Apply(sub, grads) steps any sub-range (a server
// steps bucket by bucket and serves pulls in between); EndStep() counts
// the step. Step() does the three over the whole range.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "model/checkpoint_format.h"
#include "model/checkpoint_load.h"
#include "model/optim/adamw.h"
#include "model/optim/spike_guard.h"
#include "model/param_layout.h"
#include "proto/herd.pb.h"

namespace herd {

// The one divergence check: a step whose loss or gradient norm (`what`) is
// not finite stops training with one line that says what to change (the
// caller names the step); OK otherwise.
Status CheckNotDiverged(const char* what, double value);

// How a fresh run's weights start: checkpoint.init_from's (a HuggingFace
// directory or a herd checkpoint of the same `model` shape), else the
// deterministic initialisation (train.seed, model.initializer_range).
struct WeightInit {
  uint64_t seed = 0;
  double initializer_range = 0.02;
  std::string init_from;      // empty: initialise
  config::ModelConfig model;  // the shape init_from must have
};

// The weights of `ranges` of `layout`'s space into `weights` (the whole
// space) alone, without an optimizer: from the checkpoint when resuming,
// else as `init` starts them (where the optimizer holds slices of weights
// every worker needs whole).
Status LoadWeightRanges(const ParamLayout& layout, const WeightInit& init, const std::vector<ParamRange>& ranges,
                        const std::optional<VerifiedCheckpoint>& resume_from, float* weights);

class OptimizerShard {
 public:
  // Fresh: `init`'s weights (the initialisation is a function of seed and
  // tensor name only, so every partition starts from the same model), and
  // zero moments. Resumed: the range assembled from the checkpoint's
  // shards, whatever number of processes wrote them. The caller has
  // checked that the checkpoint continues this run (CheckSameRun).
  static StatusOr<std::unique_ptr<OptimizerShard>> InitOrResume(const OptimizerOptions& options,
                                                                const WeightInit& init, const ParamLayout& layout,
                                                                ParamRange range,
                                                                const std::optional<VerifiedCheckpoint>& resume_from);
  // From a given state (its range, weights, moments and step).
  OptimizerShard(const ParamLayout& layout, const OptimizerOptions& options, ShardState state);
  // The same over a space that is not a layout's (a tensor-parallel job's
  // servers'): `segments` say which of [state.begin, state.end) decays.
  OptimizerShard(std::vector<DecaySegment> segments, const OptimizerOptions& options, ShardState state);
  // From a given state whose weights are already [begin, end) of `space`
  // (attached, as AttachWeights leaves them; state.weights is empty).
  OptimizerShard(const ParamLayout& layout, const OptimizerOptions& options, ShardState state, float* space);

  OptimizerShard(const OptimizerShard&) = delete;
  OptimizerShard& operator=(const OptimizerShard&) = delete;

  ParamRange range() const { return range_; }
  int64_t size() const { return range_.size(); }
  // Steps taken; the next step is step() + 1.
  int64_t step() const { return step_; }
  // [begin, end) of the master weights (element 0 is element `begin` of the
  // flat space).
  float* weights() { return weights_; }
  const float* weights() const { return weights_; }
  float* m() { return m_.data(); }
  float* v() { return v_.data(); }

  // From now on the master weights are [begin, end) of `space` (the whole
  // flat space, which must outlive this object); they are copied there.
  void AttachWeights(float* space);

  // Lets go of the weights and moments, whose working copy lives
  // elsewhere (a GPU's: cuda::DeviceTrainer). From then on only the
  // step's scalars (BeginStep, EndStep), step() and the spike guard's
  // state in view() are for use.
  void ReleaseArrays();

  struct Scalars {
    int64_t step = 0;          // the step being taken (1-based)
    double lr = 0;             // the schedule's rate for it
    double grad_scale = 1;     // the clipping coefficient
    double global_norm = 0;    // before clipping
    SpikeVerdict spike;        // skip: the update is not applied
  };
  // The step's scalars from the global gradient norm and mean loss (the
  // loss feeds only the spike guard); counts them into the guard's
  // statistics, so call it once per step.
  Scalars BeginStep(double global_norm, double loss);
  // AdamW on [sub.begin, sub.end) ⊆ range(), unless the step is skipped;
  // `grads` points at element sub.begin of the flat space.
  void Apply(const Scalars& s, ParamRange sub, const float* grads);
  // The same reading and writing `io` (model/optim/adamw.h), whose
  // pointers address element sub.begin; a skipped step writes nothing
  // (a bf16 copy of the unchanged weights stays as it was).
  void Apply(const Scalars& s, ParamRange sub, const AdamWStreams& io);
  void EndStep() { ++step_; }
  // The whole range at once; returns the step's scalars.
  Scalars Step(const float* grads, double global_norm, double loss);

  // Weights, moments and step as one shard file
  // (model/checkpoint_format.h), written atomically.
  Status Save(const std::string& path) const;
  ShardView view() const { return {range_.begin, range_.end, step_, weights_, m_.data(), v_.data(), spikes_}; }

 private:
  const ParamRange range_;
  const std::vector<DecaySegment> segments_;  // over range_
  const OptimizerOptions options_;

  std::vector<float> own_weights_;  // empty once attached
  float* weights_ = nullptr;        // own_weights_, or the attached space + begin
  std::vector<float> m_, v_;
  int64_t step_ = 0;
  SpikeStats spikes_;
};

// The optimizer of several disjoint ranges stepped as one: a ZeRO owner's
// slice of every bucket (sharding/shard_plan.h's OwnedSlices), or one
// range (DDP: the whole space). One OptimizerShard per range; every range
// takes the same step's scalars, so stepping the slices gives the bits of
// stepping them as one range.
class OptimizerSlices {
 public:
  // OptimizerShard::InitOrResume of each range (ascending, disjoint), with
  // the checkpoint's shards (or init_from's file) read once for all. With
  // `space` (the whole flat space) the weights go straight there,
  // attached, and no copy of them is ever held.
  static StatusOr<std::unique_ptr<OptimizerSlices>> InitOrResume(
      const OptimizerOptions& options, const WeightInit& init, const ParamLayout& layout,
      const std::vector<ParamRange>& ranges, const std::optional<VerifiedCheckpoint>& resume_from,
      float* space = nullptr);

  // Of given states (ascending, disjoint ranges of `layout`'s space) whose
  // weights are already in `space` (state.weights empty), or with `space`
  // null each in its state.weights (held by its shard): a tensor-parallel
  // rank's, loaded through its slices.
  static std::unique_ptr<OptimizerSlices> Attached(const ParamLayout& layout, const OptimizerOptions& options,
                                                   std::vector<ShardState> states, float* space);

  const std::vector<ParamRange>& ranges() const { return ranges_; }
  // Each range's state.
  std::vector<ShardView> views() const;
  int64_t step() const { return slices_.empty() ? 0 : slices_.front()->step(); }
  // Elements over all ranges.
  int64_t size() const;
  OptimizerShard& slice(size_t i) { return *slices_[i]; }

  // OptimizerShard::AttachWeights of every range.
  void AttachWeights(float* space);
  // One step of every range; `grads` is the whole flat space's (element 0
  // is offset 0), read only in the ranges.
  OptimizerShard::Scalars Step(const float* grads, double global_norm, double loss);
  // Every range as one shard file (WriteShardPieces).
  Status Save(const std::string& path) const;

 private:
  std::vector<ParamRange> ranges_;
  std::vector<std::unique_ptr<OptimizerShard>> slices_;
};

}  // namespace herd
