// The grid (sharding/grid.h): one rank order for every layout herd has
// used, every rank one place, and each axis's groups a partition of the
// workers.
#include "sharding/grid.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "common/config.h"

namespace herd {
namespace {

config::JobConfig Config(const std::string& cluster) {
  auto config = ParseJobConfig(
      "model { vocab_size: 256 hidden_size: 64 intermediate_size: 160 num_hidden_layers: 4 num_attention_heads: 4 "
      "num_key_value_heads: 2 } train { batch_size: 2 grad_accum: 2 seq_len: 32 } cluster { " +
          cluster + " }",
      "grid");
  EXPECT_TRUE(config.ok()) << config.status().message();
  return *config;
}

// Degrees, innermost first (Axis order), of grids with every axis > 1 in turn.
const std::vector<std::array<int, kAxes>> kShapes = {
    {1, 1, 1, 1, 1, 1}, {2, 1, 1, 3, 1, 1}, {2, 3, 1, 2, 1, 1}, {2, 1, 1, 2, 2, 1},
    {2, 2, 2, 2, 2, 2}, {3, 1, 2, 2, 1, 2}, {1, 1, 4, 1, 3, 1}, {4, 2, 1, 1, 2, 1}};

TEST(Grid, EveryRankHasOnePlaceAndIsTheRankOfItsPlace) {
  for (const auto& degrees : kShapes) {
    auto grid = Grid::Make(degrees);
    ASSERT_TRUE(grid.ok()) << grid.status().message();
    std::set<std::array<int, kAxes>> places;
    for (int rank = 0; rank < grid->size(); ++rank) {
      const GridCoords g = grid->CoordsOf(rank);
      for (int a = 0; a < kAxes; ++a) ASSERT_TRUE(g.at[a] >= 0 && g.at[a] < degrees[a]);
      EXPECT_EQ(grid->RankOf(g), rank);
      places.insert(g.at);
    }
    EXPECT_EQ(places.size(), static_cast<size_t>(grid->size()));
  }
}

// The order innermost first: a step along an axis moves the rank by the
// product of the degrees inside it.
TEST(Grid, RanksFollowTheOrderTensorContextDataPipelineRegion) {
  auto grid = Grid::Make({2, 3, 2, 2, 2, 2});
  ASSERT_TRUE(grid.ok());
  const int strides[kAxes] = {1, 2, 6, 12, 24, 48};
  for (int rank = 0; rank < grid->size(); ++rank) {
    for (int a = 0; a < kAxes; ++a) {
      const Axis axis = static_cast<Axis>(a);
      const GridCoords g = grid->CoordsOf(rank);
      if (g[axis] + 1 == grid->degree(axis)) continue;
      EXPECT_EQ(grid->Along(rank, axis, g[axis] + 1), rank + strides[a]) << AxisName(axis);
    }
  }
}

// Each axis set's groups: every worker in exactly one, each of the size the
// degrees say, ascending, the worker at its IndexInGroup.
TEST(Grid, GroupsPartitionTheWorkers) {
  const std::vector<std::vector<Axis>> sets = {{Axis::kTensor},
                                               {Axis::kContext},
                                               {Axis::kShard, Axis::kReplicate},
                                               {Axis::kPipeline},
                                               {Axis::kRegion},
                                               {Axis::kTensor, Axis::kContext},
                                               {Axis::kContext, Axis::kShard, Axis::kReplicate, Axis::kRegion}};
  auto grid = Grid::Make({2, 2, 2, 2, 2, 2});
  ASSERT_TRUE(grid.ok());
  auto group_of = [&](int rank, const std::vector<Axis>& axes) {
    switch (axes.size()) {
      case 1: return grid->GroupOf(rank, {axes[0]});
      case 2: return grid->GroupOf(rank, {axes[0], axes[1]});
      default: return grid->GroupOf(rank, {axes[0], axes[1], axes[2], axes[3]});
    }
  };
  auto index_of = [&](int rank, const std::vector<Axis>& axes) {
    switch (axes.size()) {
      case 1: return grid->IndexInGroup(rank, {axes[0]});
      case 2: return grid->IndexInGroup(rank, {axes[0], axes[1]});
      default: return grid->IndexInGroup(rank, {axes[0], axes[1], axes[2], axes[3]});
    }
  };
  for (const auto& axes : sets) {
    size_t expected = 1;
    for (Axis a : axes) expected *= grid->degree(a);
    std::vector<int> seen(grid->size(), 0);
    for (int rank = 0; rank < grid->size(); ++rank) {
      const std::vector<int> group = group_of(rank, axes);
      ASSERT_EQ(group.size(), expected);
      EXPECT_TRUE(std::is_sorted(group.begin(), group.end()));
      ASSERT_LT(index_of(rank, axes), static_cast<int>(group.size()));
      EXPECT_EQ(group[index_of(rank, axes)], rank);
      if (group.front() == rank) {
        for (int member : group) ++seen[member];
      }
    }
    for (int count : seen) EXPECT_EQ(count, 1) << "a worker in no group or in two";
  }
}

// The layouts every earlier version used, and that checkpoints, Slurm
// placement and the examples rely on: data x context x tensor, rank =
// (replica·C + context)·T + tensor; with pipeline stages stage-major,
// rank = (stage·R + replica)·T + tensor; regions as blocks of W/R ranks.
TEST(Grid, FromConfigKeepsEveryEarlierLayout) {
  {
    const Grid grid = Grid::FromConfig(Config("sync: ALLREDUCE workers: 12 tensor_parallel: 2 context_parallel: 2"));
    ASSERT_EQ(grid.size(), 12);
    for (int rank = 0; rank < 12; ++rank) {
      const GridCoords g = grid.CoordsOf(rank);
      EXPECT_EQ(g[Axis::kTensor], rank % 2);
      EXPECT_EQ(g[Axis::kContext], rank / 2 % 2);
      EXPECT_EQ(grid.ReplicaOf(rank), rank / 4);
      EXPECT_EQ(g[Axis::kPipeline], 0);
    }
    EXPECT_EQ(grid.replicas(), 3);
    EXPECT_EQ(grid.PlaceName(5), " (tensor rank 1, context rank 0 of replica 1)");
  }
  {
    const Grid grid = Grid::FromConfig(Config("sync: ALLREDUCE workers: 8 pipeline_stages: 2 tensor_parallel: 2"));
    for (int rank = 0; rank < 8; ++rank) {
      EXPECT_EQ(grid.CoordsOf(rank)[Axis::kTensor], rank % 2);
      EXPECT_EQ(grid.ReplicaOf(rank), rank / 2 % 2);
      EXPECT_EQ(grid.CoordsOf(rank)[Axis::kPipeline], rank / 2 / 2);
    }
    EXPECT_EQ(grid.PlaceName(6), " (pipeline stage 1, tensor rank 0 of replica 1)");
  }
  {
    const Grid grid =
        Grid::FromConfig(Config("sync: PARAMETER_SERVER servers: 2 workers: 6 diloco { regions: 2 every: 5 }"));
    for (int rank = 0; rank < 6; ++rank) {
      EXPECT_EQ(grid.CoordsOf(rank)[Axis::kRegion], RegionOfRank(rank, 6, 2));
      EXPECT_EQ(grid.ReplicaOf(rank), rank) << "each worker its own share of the global batch";
    }
    EXPECT_EQ(grid.data(), 3);
    EXPECT_EQ(grid.PlaceName(4), "");
  }
}

// ZeRO's shard groups are the data axis's inner part (HSDP's
// shard_group_size consecutive replicas); without ZeRO there are none.
TEST(Grid, ShardGroupsAreTheDataAxissInnerPart) {
  const Grid hsdp = Grid::FromConfig(Config("sync: ALLREDUCE workers: 8 zero_stage: 1 shard_group_size: 2"));
  EXPECT_EQ(hsdp.degree(Axis::kShard), 2);
  EXPECT_EQ(hsdp.degree(Axis::kReplicate), 4);
  EXPECT_EQ(hsdp.GroupOf(5, {Axis::kShard}), (std::vector<int>{4, 5}));
  EXPECT_EQ(hsdp.GroupOf(5, {Axis::kReplicate}), (std::vector<int>{1, 3, 5, 7}));
  const Grid zero = Grid::FromConfig(Config("sync: ALLREDUCE workers: 4 zero_stage: 3"));
  EXPECT_EQ(zero.degree(Axis::kShard), 4);
  const Grid ddp = Grid::FromConfig(Config("sync: ALLREDUCE workers: 4"));
  EXPECT_EQ(ddp.degree(Axis::kShard), 1);
  EXPECT_EQ(ddp.data(), 4);
}

TEST(Grid, RefusesDegreesBelowOneAndTooManyWorkers) {
  auto zero = Grid::Make({1, 0, 1, 1, 1, 1});
  ASSERT_FALSE(zero.ok());
  EXPECT_NE(zero.status().message().find("cp"), std::string::npos) << zero.status().message();
  auto huge = Grid::Make({1024, 1024, 1024, 1, 1, 1});
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().code(), Status::Code::kInvalidArgument);
}

}  // namespace
}  // namespace herd
