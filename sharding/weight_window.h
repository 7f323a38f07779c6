// What a worker that streams its weights (cluster.stream_weights, PS mode)
// holds of the flat space as the model moves through a step: which weight
// buckets it pulls and when, which it waits for, when it lets them go, and
// how long its pushed gradients stay. The one policy the worker runs
// (worker/reducers/parameter_server_sync.cc) and the memory plan replays
// (ReplayStreamedStep), so that the plan counts what the worker does.
//
// The model's hooks drive it, in the order model/model.h promises. Forward:
// NeedUpTo(end) with rising ends, unit by unit (the embedding's end first,
// the whole space last, for the head); a fall starts a new pass. Backward:
// NeedFrom(begin) with falling begins before a unit's weights are read
// (the head's first); FinalFrom(x) once the gradients at offsets >= x are
// final, on the step's last micro-batch; DoneFrom(x) once weights at
// offsets >= x are no longer read. Units are the embedding, each decoder
// layer, and the final norm with the head; buckets (sharding/shard_plan.h)
// are what moves, so a bucket is held while any unit in it is in use.
//
// A window may cover part of the space (a pipeline stage's ranges, whose
// buckets are cut at their ends): its buckets are those alone, and a pass
// may start at any unit (a stage's first): a pass that starts below where
// the last one got to holds from its own first unit on, not from the
// space's start. Tied embeddings on a stage that has the head but not the
// embedding: the head's need holds the embedding too, until the version
// is let go (such a stage never reaches DoneFrom(0)).
//
// Weights: the units a pass needs now are waited for, the next `prefetch`
// ones are pulled meanwhile; forward lets a bucket go once the pass is past
// its end, backward once it is done with its start. Tied embeddings are
// both the first unit and the head: held from forward until DoneFrom(0).
// Gradients: each bucket is pushed as soon as it is final; a push is waited
// for (and its gradients let go) once backward is `prefetch` + 1 units
// below it, so pushes in flight are bounded too.
#pragma once

#include <cstdint>
#include <deque>
#include <set>
#include <vector>

#include "model/llama.h"
#include "model/param_layout.h"
#include "sharding/pipeline_plan.h"
#include "sharding/pipeline_schedule.h"
#include "sharding/shard_plan.h"

namespace herd {

class WeightWindow {
 public:
  // Buckets by index in forward order (ascending offsets).
  struct Actions {
    std::vector<int> release;  // weights to let go (first, to make room)
    std::vector<int> pull;     // weights to start pulling
    std::vector<int> wait;     // weights that must have landed before going on
    std::vector<int> push;     // gradients to push now
    std::vector<int> retire;   // pushes to wait for; their gradients are let go
  };

  // `prefetch` >= 0 units ahead of the one in use. `keep_after_forward`:
  // forward lets nothing go; each bucket stays until backward is done
  // with it (ZeRO-3 with cluster.reshard_after_forward false).
  // `ranges` (empty: the whole space): the part the window covers, each
  // of the plan's buckets inside one of them or outside all.
  WeightWindow(const ShardPlan& plan, const ParamLayout& layout, int prefetch, bool keep_after_forward = false,
               const std::vector<ParamRange>& ranges = {});

  int num_buckets() const { return static_cast<int>(buckets_.size()); }
  const Bucket& bucket(int i) const { return buckets_[i]; }
  bool held(int i) const { return held_.count(i) > 0; }

  // A new version's first units (from the window's first bucket), pulled
  // before a forward asks for them.
  Actions Start();
  Actions NeedUpTo(int64_t end);
  Actions NeedFrom(int64_t begin);
  Actions FinalFrom(int64_t offset);
  Actions DoneFrom(int64_t offset);
  // Every weight let go (after a forward-only pass), every push retired
  // (the end of the step).
  Actions ReleaseAll();
  Actions RetireAll();

 private:
  // The offset `n` units beyond the unit boundary at or after `offset`
  // (clamped to the space), or before it (n < 0; clamped to 0).
  int64_t UnitsAway(int64_t offset, int n) const;
  bool Kept(int i) const;  // held until DoneFrom(0): the tied embedding's buckets
  // Pulls (into `a`) the buckets overlapping [lo, hi) that are not held;
  // with `wait`, lists all of them to wait for.
  void Hold(int64_t lo, int64_t hi, bool wait, Actions& a);
  // Lets go (into `a`) of the held buckets `pred` picks.
  template <typename Pred>
  void ReleaseIf(Pred pred, Actions& a);

  std::vector<Bucket> buckets_;   // ascending
  std::vector<int64_t> units_;    // unit boundaries, ascending: 0, layer begins, final norm, size
  const int prefetch_;
  const bool keep_after_forward_;
  int64_t kept_end_ = 0;          // tied: the embedding's end; else 0
  std::set<int> held_;            // buckets whose weights are pulled or present
  int next_push_ = 0;             // the next bucket whose gradients go (descending; -1: all went)
  std::deque<int> in_flight_;     // pushed and not yet retired, in push order
  int64_t forward_end_ = 0;       // the current forward pass's last end
  int64_t backward_begin_ = 0;    // the current backward pass's last begin
};

// The bytes a streaming worker holds at its peak over one step, by kind,
// from replaying the model's hooks through a WeightWindow: fp32 weights
// and gradients, and bf16 staging for pulls and pushes in flight.
struct StreamedPeak {
  int64_t weights = 0, gradients = 0, staging = 0;
  int64_t total() const { return weights + gradients + staging; }
  // Not a peak: the elements pulled (gathered) over the whole step.
  int64_t pulled = 0;
};
struct StreamedReplay {
  int prefetch = 1;
  int wire_bytes = 4;  // 2: bf16 staging
  // grad_accum > 1: gradients are kept whole until the last micro-batch
  // pushes them.
  bool accumulates = false;
  // How many units later than their need_from the model declares a unit's
  // gradients final (0: the CPU model, at once; 1: a GPU model, which ships
  // a unit's gradients while it computes the next,
  // model/cuda/streamed_model.h).
  int final_lag = 0;
  bool keep_after_forward = false;  // as the WeightWindow's
  // Per bucket in forward order, the elements whose gradients a retire
  // keeps (a ZeRO-3 owner's slice); empty: none.
  std::vector<int64_t> kept_on_retire;
};
StreamedPeak ReplayStreamedStep(const ShardPlan& plan, const ParamLayout& layout, const StreamedReplay& replay);
// A pipeline stage's worker streaming its weights (cluster.stream_weights
// with cluster.pipeline_stages): `device`'s actions of `schedule`, each
// pass through its chunk's layers calling the hooks LlamaModel's stage
// passes call, through a window over `ranges` (the stage's,
// PipelinePlan::RangesOf). Its gradients accumulate whole over the
// micro-batches (more than one), as the stage's worker keeps them, and
// are pushed on the last. `replay` gives the prefetch and the wire.
struct StageReplay {
  const PipelineSchedule* schedule = nullptr;
  int device = 0;
  std::vector<LayerRange> chunk_layers;  // [chunk]
  std::vector<ParamRange> ranges;
};
StreamedPeak ReplayStreamedStage(const ShardPlan& plan, const ParamLayout& layout, const StreamedReplay& replay,
                                 const StageReplay& stage);
// `device`'s of `pipeline`: its schedule, its chunks' layers, its ranges.
StageReplay StageReplayOf(const PipelinePlan& pipeline, int device, const ParamLayout& layout);
// The replay of the window a worker of `config` runs (parameter servers
// with stream_weights, or ZeRO-3): its prefetch, its staging's wire
// bytes, whether its gradients accumulate whole (a CPU worker's
// micro-batches in turn, more than `micro_batch_slots`), when its model
// declares a unit final, and whether units stay from forward to backward.
// kept_on_retire is the caller's.
StreamedReplay ReplayOfJob(const config::JobConfig& config, int micro_batch_slots);

}  // namespace herd
