#include "sharding/grid.h"

#include <algorithm>

#include "common/config.h"

namespace herd {

const char* AxisName(Axis axis) {
  switch (axis) {
    case Axis::kTensor: return "tp";
    case Axis::kContext: return "cp";
    case Axis::kShard: return "dp_shard";
    case Axis::kReplicate: return "dp_replicate";
    case Axis::kPipeline: return "pp";
    case Axis::kRegion: return "region";
  }
  return "?";
}

Grid::Grid(const std::array<int, kAxes>& degrees) : degrees_(degrees) {
  size_ = 1;
  for (int a = 0; a < kAxes; ++a) {
    strides_[a] = size_;
    size_ *= degrees_[a];
  }
}

StatusOr<Grid> Grid::Make(const std::array<int, kAxes>& degrees) {
  int64_t product = 1;
  for (int a = 0; a < kAxes; ++a) {
    if (degrees[a] < 1) {
      return Status::InvalidArgument(std::string("grid: the ") + AxisName(static_cast<Axis>(a)) + " degree is " +
                                     std::to_string(degrees[a]) + "; each must be >= 1");
    }
    product *= degrees[a];
    if (product > kMaxWorkers) {
      return Status::InvalidArgument("grid: more than " + std::to_string(kMaxWorkers) + " workers");
    }
  }
  return Grid(degrees);
}

Grid Grid::FromConfig(const config::JobConfig& config) {
  const config::ClusterConfig& c = config.cluster();
  const int T = std::max(1, c.tensor_parallel()), C = std::max(1, c.context_parallel());
  const int P = std::max(1, c.pipeline_stages()), regions = Regions(config);
  // A region's data-parallel replicas; with ZeRO, shard groups of them.
  const int replicas = NumWorkers(config) / (T * C * P * regions);
  int shard = 1;
  if (c.sync() == config::ClusterConfig::ALLREDUCE && c.zero_stage() > 0) {
    shard = c.shard_group_size() > 0 ? std::max(1, c.shard_group_size() / (T * C)) : replicas;
  }
  return Grid({T, C, shard, replicas / shard, P, regions});
}

GridCoords Grid::CoordsOf(int rank) const {
  GridCoords g;
  for (int a = 0; a < kAxes; ++a) g.at[a] = rank / strides_[a] % degrees_[a];
  return g;
}

int Grid::RankOf(const GridCoords& coords) const {
  int rank = 0;
  for (int a = 0; a < kAxes; ++a) rank += coords.at[a] * strides_[a];
  return rank;
}

int Grid::Along(int rank, Axis axis, int value) const {
  GridCoords g = CoordsOf(rank);
  g[axis] = value;
  return RankOf(g);
}

std::vector<int> Grid::GroupOf(int rank, std::initializer_list<Axis> axes) const {
  // Odometer over the group's axes, innermost fastest: ascending ranks.
  GridCoords g = CoordsOf(rank);
  for (Axis a : axes) g[a] = 0;
  std::vector<int> ranks;
  for (;;) {
    ranks.push_back(RankOf(g));
    bool carried = true;
    for (int a = 0; a < kAxes && carried; ++a) {
      if (std::find(axes.begin(), axes.end(), static_cast<Axis>(a)) == axes.end()) continue;
      carried = ++g.at[a] == degrees_[a];
      if (carried) g.at[a] = 0;
    }
    if (carried) break;
  }
  return ranks;
}

int Grid::IndexInGroup(int rank, std::initializer_list<Axis> axes) const {
  const GridCoords g = CoordsOf(rank);
  int index = 0, scale = 1;
  for (int a = 0; a < kAxes; ++a) {
    if (std::find(axes.begin(), axes.end(), static_cast<Axis>(a)) == axes.end()) continue;
    index += g.at[a] * scale;
    scale *= degrees_[a];
  }
  return index;
}

int Grid::replicas() const { return degree(Axis::kShard) * degree(Axis::kReplicate) * degree(Axis::kRegion); }

int Grid::ReplicaOf(int rank) const { return IndexInGroup(rank, {Axis::kShard, Axis::kReplicate, Axis::kRegion}); }

std::string Grid::PlaceName(int rank) const {
  const GridCoords g = CoordsOf(rank);
  std::vector<std::string> axes;
  if (degree(Axis::kPipeline) > 1) axes.push_back("pipeline stage " + std::to_string(g[Axis::kPipeline]));
  if (degree(Axis::kTensor) > 1) axes.push_back("tensor rank " + std::to_string(g[Axis::kTensor]));
  if (degree(Axis::kContext) > 1) axes.push_back("context rank " + std::to_string(g[Axis::kContext]));
  if (axes.empty()) return "";
  std::string out = " (";
  for (size_t i = 0; i < axes.size(); ++i) out += (i ? ", " : "") + axes[i];
  return out + " of replica " + std::to_string(ReplicaOf(rank)) + ")";
}

std::string Grid::Describe() const {
  auto d = [this](Axis a) { return std::to_string(degree(a)); };
  const int data = degree(Axis::kShard) * degree(Axis::kReplicate);
  std::string s = "region " + d(Axis::kRegion) + " x pipeline " + d(Axis::kPipeline) + " x data " +
                  std::to_string(data);
  if (degree(Axis::kShard) > 1) s += " (replicate " + d(Axis::kReplicate) + " x shard " + d(Axis::kShard) + ")";
  return s + " x context " + d(Axis::kContext) + " x tensor " + d(Axis::kTensor);
}

}  // namespace herd
