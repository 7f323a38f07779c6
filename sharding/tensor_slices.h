// A tensor-parallel rank's part of the model (cluster.tensor_parallel: T
// ranks, Megatron's split) and how it maps onto the flat space.
//
// Rank r of T holds: the rows of q_proj, k_proj and v_proj of its heads
// (heads [r·H/T, (r+1)·H/T), KV heads likewise), of gate_proj and up_proj
// of its intermediate columns, and of the embedding and an untied lm_head
// of its vocabulary rows [r·V/T, (r+1)·V/T); the columns of o_proj and
// down_proj that multiply its heads' and its intermediate columns'
// outputs; and every norm whole. Those are the weights of a Llama of the
// rank's shape (its heads, intermediate size and vocabulary divided by T,
// the head size kept), laid out by ParamLayout as any model: the rank's
// packed space, in which LlamaModel computes (model/llama.h's
// TensorGroup) and in which the rank's gradients and optimizer state
// live. Pack and Unpack copy between it and the flat space, which stays
// the checkpoint's and the servers' currency.
//
// In the flat space (HF's [out, in] row-major matrices) a rank's rows of a
// column-parallel matrix are one contiguous range; its columns of o_proj
// and down_proj are a range in each of their d rows (strided). Ranges()
// lists them all, ascending.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "common/status.h"
#include "model/checkpoint_load.h"
#include "model/llama_config.h"
#include "model/optim/adamw.h"
#include "model/optim/optimizer_shard.h"
#include "model/param_layout.h"

namespace herd {

class TensorSlices {
 public:
  // Errors name cluster.tensor_parallel: T must divide the heads, the KV
  // heads, the intermediate size and the vocabulary.
  static StatusOr<TensorSlices> Make(const LlamaShape& shape, int ranks, int rank);

  int ranks() const { return ranks_; }
  int rank() const { return rank_; }
  // The rank's model: heads, KV heads, intermediate size and vocabulary
  // divided by ranks(), the head size the model's.
  const LlamaShape& shape() const { return local_.shape(); }
  const ParamLayout& layout() const { return local_; }
  // The first of the rank's vocabulary rows.
  int64_t vocab_first() const { return vocab_first_; }

  // The rank's part of the flat space as runs, ascending and disjoint:
  // `flat` of the flat space is [local, local + flat.size()) of the
  // rank's; `replicated`: a norm's, which every rank holds alike.
  struct Run {
    ParamRange flat;
    int64_t local = 0;
    bool replicated = false;
  };
  const std::vector<Run>& runs() const { return runs_; }
  // flat (the model's flat space) -> local (layout()'s), every element of
  // the rank's part.
  void Pack(const float* flat, float* local) const;
  // local -> flat, the rank's part of flat only.
  void Unpack(const float* local, float* flat) const;
  // The runs' flat ranges.
  std::vector<ParamRange> Ranges() const;
  // The runs that meet `local` (a range of the packed space), cut to it,
  // ascending.
  std::vector<Run> RunsWithin(ParamRange local) const;
  // `local`, the state of a range of the packed space, as pieces of the
  // flat space (what a shard file holds), ascending; the norms' runs left
  // out unless `with_norms` (every rank holds them alike: one writes them).
  std::vector<ShardView> FlatPieces(const ShardView& local, bool with_norms) const;
  // The same of several states (ascending, disjoint), one after the other.
  std::vector<ShardView> FlatPieces(const std::vector<ShardView>& locals, bool with_norms) const;

 private:
  TensorSlices(const LlamaShape& shape, int ranks, int rank);

  int ranks_, rank_;
  ParamLayout local_;
  int64_t vocab_first_ = 0;
  std::vector<Run> runs_;
};

// Where LoadPackedRange writes a range: arrays as long as it, zero there
// (m and v may be null: the weights alone).
struct PackedInto {
  float *weights = nullptr, *m = nullptr, *v = nullptr;
  int64_t* step = nullptr;
  SpikeStats* spikes = nullptr;
};
// [local.begin, local.end) of `slices`' packed space into `into`: the
// weights (the padding left zero) and AdamW state, fresh from `init`
// (tensor by tensor, no more than one tensor of the flat space `flat` held
// whole; zero moments) or the checkpoint's, whatever grid, mode or worker
// count wrote it (its files of `prefix`: the shards, or a region's or the
// outer step's parts); and the step and spike statistics.
Status LoadPackedRange(const TensorSlices& slices, ParamRange local, const WeightInit& init, const ParamLayout& flat,
                       const std::optional<VerifiedCheckpoint>& resume_from, const PackedInto& into,
                       std::string_view prefix = kShardPrefix);

// The weights alone of `ranges` of `slices`' packed space into the packed
// space `weights` (LoadPackedRange of each; the padding zero).
Status LoadPackedWeights(const TensorSlices& slices, const std::vector<ParamRange>& ranges, const WeightInit& init,
                         const ParamLayout& flat, const std::optional<VerifiedCheckpoint>& resume_from,
                         float* weights);

// The optimizer of `ranges` (ascending, disjoint) of `slices`' packed
// space, each loaded by LoadPackedRange: with `space` (the packed space)
// the weights are written there and attached; without, each range holds
// its own (a ZeRO-3 worker's master slices).
StatusOr<std::unique_ptr<OptimizerSlices>> PackedOptimizerSlices(const TensorSlices& slices,
                                                                 const OptimizerOptions& options,
                                                                 const WeightInit& init, const ParamLayout& flat,
                                                                 const std::vector<ParamRange>& ranges,
                                                                 const std::optional<VerifiedCheckpoint>& resume_from,
                                                                 float* space);

// The parameter servers' space in a tensor-parallel job: the ranks' packed
// spaces one after the other, rank r's at r·part(). A rank pushes its
// gradients and pulls its weights as they lie in its packed buffer, bucket
// by bucket (a bucket never crosses from one rank's part to the next:
// RankCuts), with no gather of the strided columns of o_proj and
// down_proj; and a server's shard holds whole runs of slices, balanced by
// bytes like any shard.
//
// The norms, which every rank holds whole, lie in every rank's part. Every
// rank's copy takes the same gradients (each rank computes them whole, or
// with sequence parallelism sums its rows' parts over the group before
// pushing) and so the same steps; only rank 0's is counted in the global
// norm and written to checkpoints (the others are copies: Copies()).
class TensorParallelSpace {
 public:
  static StatusOr<TensorParallelSpace> Make(const LlamaShape& shape, int ranks);

  int ranks() const { return static_cast<int>(slices_.size()); }
  // One rank's packed size (every rank's alike).
  int64_t part() const { return slices_.front().layout().size(); }
  int64_t size() const { return part() * ranks(); }
  const TensorSlices& slices(int rank) const { return slices_[rank]; }
  ParamRange RankRange(int rank) const { return {rank * part(), (rank + 1) * part()}; }
  // The offsets no bucket may straddle: each rank's part's end but the last.
  std::vector<int64_t> RankCuts() const;
  // Every tensor slice's first element, ascending (PER_TENSOR shards).
  std::vector<int64_t> TensorStarts() const;
  // The ranks > 0's norms: the same as rank 0's (see above).
  std::vector<ParamRange> Copies() const;
  // Weight decay over [range.begin, range.end) of this space.
  std::vector<DecaySegment> DecaySegmentsOf(ParamRange range) const;

  // A run of the space that is a run of the flat space: [at, at +
  // flat.size()) of this space holds `flat`; `copy`: a norm's copy.
  struct Run {
    ParamRange flat;
    int64_t at = 0;
    bool copy = false;
  };
  // The runs meeting `range` of this space, cut to it, ascending in it.
  std::vector<Run> RunsWithin(ParamRange range) const;

  // [range.begin, range.end) of this space: LoadPackedRange of each rank's
  // part of it, in place (from the checkpoint's files of `prefix`).
  StatusOr<ShardState> Load(ParamRange range, const WeightInit& init, const ParamLayout& flat,
                            const std::optional<VerifiedCheckpoint>& resume_from,
                            std::string_view prefix = kShardPrefix) const;
  // The state of `range` of this space (a server's optimizer view) as
  // pieces of the flat space, ascending, copies left out: what a shard
  // file of it holds.
  std::vector<ShardView> FlatPieces(const ShardView& range) const;

 private:
  explicit TensorParallelSpace(std::vector<TensorSlices> slices) : slices_(std::move(slices)) {}

  std::vector<TensorSlices> slices_;  // rank r's at r
};

}  // namespace herd
