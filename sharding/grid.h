// A job's workers as one grid of parallel axes, held once (torchtitan's
// ParallelDims, Megatron-LM's RankGenerator): the degree of every axis,
// the one rank order, and each worker's group along any axes, by name.
//
// The rank order, innermost first: tensor, context, data (its shard
// groups innermost: dp_shard, then dp_replicate), pipeline, region —
//
//   rank = ((((region·P + stage)·R + replicate)·S + shard)·C + context)·T + tensor
//
// with P pipeline stages, R·S data-parallel replicas a region (S the
// ZeRO/HSDP shard group's replicas), C context and T tensor ranks. A tensor
// group is consecutive ranks (one node); a pipeline's stage, and a
// region, is a block of consecutive ranks (neighbours on a cluster), as
// Megatron's "tp-cp-dp-pp" order puts them. Every layout herd has ever
// used is this order with some degrees 1, so checkpoints, Slurm placement
// and the examples keep their meaning.
#pragma once

#include <array>
#include <initializer_list>
#include <string>
#include <vector>

#include "common/status.h"
#include "proto/herd.pb.h"

namespace herd {

// Innermost first: the order of the rank formula above.
enum class Axis : int { kTensor = 0, kContext, kShard, kReplicate, kPipeline, kRegion };
inline constexpr int kAxes = 6;
// "tp", "cp", "dp_shard", "dp_replicate", "pp", "region".
const char* AxisName(Axis axis);

// A worker's coordinate on every axis.
struct GridCoords {
  std::array<int, kAxes> at{};
  int operator[](Axis a) const { return at[static_cast<int>(a)]; }
  int& operator[](Axis a) { return at[static_cast<int>(a)]; }
};

class Grid {
 public:
  Grid() = default;  // one worker
  // The degrees, innermost first (Axis order); each >= 1, and their
  // product (the workers) at most kMaxWorkers, else InvalidArgument.
  static StatusOr<Grid> Make(const std::array<int, kAxes>& degrees);
  // A validated config's grid: tensor_parallel, context_parallel, the shard
  // groups (cluster.shard_group_size's replicas with ZeRO; every replica
  // of a region with ZeRO and no groups; one without ZeRO), the replicas,
  // pipeline_stages and diloco.regions; one worker for sync NONE.
  static Grid FromConfig(const config::JobConfig& config);

  int size() const { return size_; }
  int degree(Axis a) const { return degrees_[static_cast<int>(a)]; }
  // A region's data-parallel replicas (dp_shard x dp_replicate).
  int data() const { return degree(Axis::kShard) * degree(Axis::kReplicate); }

  GridCoords CoordsOf(int rank) const;
  int RankOf(const GridCoords& coords) const;
  // The rank at `rank`'s coordinates but `value` on `axis` (its stage
  // `value`'s worker of the same replica and tensor rank, say).
  int Along(int rank, Axis axis, int value) const;
  // The ranks that share every coordinate of `rank`'s but those of `axes`,
  // ascending: its group along them ({kTensor}: its tensor group; {kShard,
  // kReplicate}: its data-parallel group).
  std::vector<int> GroupOf(int rank, std::initializer_list<Axis> axes) const;
  // `rank`'s place in that group (its index in GroupOf's list).
  int IndexInGroup(int rank, std::initializer_list<Axis> axes) const;

  // The data-parallel replicas of the whole job (every region's), and the
  // one `rank` belongs to: the share of the global batch it computes, one
  // a pipeline's stages, a tensor group and a context group share.
  int replicas() const;
  int ReplicaOf(int rank) const;

  // " (pipeline stage 1, tensor rank 0 of replica 2)": the model axes the
  // job has, for lines that name a worker; empty without any.
  std::string PlaceName(int rank) const;
  // "region 1 x pipeline 2 x data 2 (replicate 2 x shard 1) x context 1 x
  // tensor 2": the degrees, outermost first, as `herd plan` prints them.
  std::string Describe() const;

 private:
  explicit Grid(const std::array<int, kAxes>& degrees);

  std::array<int, kAxes> degrees_{1, 1, 1, 1, 1, 1};
  std::array<int, kAxes> strides_{1, 1, 1, 1, 1, 1};  // a step along each axis, in ranks
  int size_ = 1;
};

}  // namespace herd
