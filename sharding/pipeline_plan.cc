#include "sharding/pipeline_plan.h"

#include <algorithm>

#include "common/config.h"
#include "sharding/diloco_plan.h"
#include "sharding/tensor_slices.h"

namespace herd {
namespace {

PipelineScheduleKind KindOf(config::ClusterConfig::PipelineSchedule schedule) {
  switch (schedule) {
    case config::ClusterConfig::GPIPE:
      return PipelineScheduleKind::kGPipe;
    case config::ClusterConfig::INTERLEAVED_1F1B:
      return PipelineScheduleKind::kInterleaved1F1B;
    case config::ClusterConfig::ZERO_BUBBLE:
      return PipelineScheduleKind::kZeroBubble;
    case config::ClusterConfig::ONE_F_ONE_B:
      break;
  }
  return PipelineScheduleKind::kOneFOneB;
}

}  // namespace

StatusOr<PipelinePlan> PipelinePlan::FromConfig(const config::JobConfig& config) {
  const config::ClusterConfig& cl = config.cluster();
  PipelinePlan plan;
  const int P = cl.pipeline_stages(), v = cl.virtual_stages();
  // Before a schedule of P x v stages is built: a layer each at least.
  if (P >= 1 && v >= 1 && int64_t{P} * v > config.model().num_hidden_layers()) {
    return Status::InvalidArgument("cluster.pipeline_stages x cluster.virtual_stages = " +
                                   std::to_string(int64_t{P} * v) + " stages, but the model has " +
                                   std::to_string(config.model().num_hidden_layers()) +
                                   " layers: every stage needs at least one");
  }
  HERD_ASSIGN_OR_RETURN(plan.schedule, MakePipelineSchedule(KindOf(cl.pipeline_schedule()), P, v,
                                                            config.train().grad_accum()));
  plan.grid = Grid::FromConfig(config);
  LlamaShape shape = LlamaShape::FromConfig(config.model());
  if (const int T = plan.grid.degree(Axis::kTensor); T > 1) {
    HERD_ASSIGN_OR_RETURN(const TensorSlices slices, TensorSlices::Make(shape, T, 0));
    shape = slices.shape();
  }
  HERD_ASSIGN_OR_RETURN(plan.split,
                        PipelineSplit::Make(shape, P * v, cl.pipeline_split(), config.train().seq_len()));
  return plan;
}

bool HasPipeline(const config::JobConfig& config) { return config.cluster().pipeline_stages() > 1; }

ParamRange PipelinePlan::TiedEmbedding(const ParamLayout& layout) const {
  if (!layout.shape().tie_word_embeddings || devices() < 2) return {};
  return {0, layout.layer(0).input_norm};
}

std::vector<ParamRange> PipelinePlan::RangesOf(int device, const ParamLayout& layout) const {
  std::vector<ParamRange> out;
  const ParamRange shared = TiedEmbedding(layout);
  if (device == devices() - 1 && shared.size() > 0) out.push_back(shared);
  for (int c = 0; c < schedule.chunks; ++c) out.push_back(split.stage(schedule.VirtualStage(device, c)).params);
  return out;
}

std::vector<int> PipelinePlan::ContributorsOf(ParamRange range, const ParamLayout& layout, int tensor_rank) const {
  std::vector<int> devices_of;
  const ParamRange shared = TiedEmbedding(layout);
  if (shared.size() > 0 && range.end <= shared.end) {
    devices_of = {0, devices() - 1};
  } else {
    for (int vs = 0; vs < split.size(); ++vs) {
      const ParamRange r = split.stage(vs).params;
      if (range.begin >= r.begin && range.end <= r.end) devices_of = {schedule.DeviceOf(vs)};
    }
  }
  std::vector<int> ranks;
  for (int d : devices_of) {
    // Stage d's replicas of the tensor rank.
    const int first = grid.Along(grid.Along(0, Axis::kTensor, tensor_rank), Axis::kPipeline, d);
    const std::vector<int> replicas = grid.GroupOf(first, {Axis::kContext, Axis::kShard, Axis::kReplicate});
    ranks.insert(ranks.end(), replicas.begin(), replicas.end());
  }
  return ranks;
}

std::vector<int64_t> PipelinePlan::BucketCuts(const ParamLayout& layout) const {
  std::vector<int64_t> cuts;
  for (int vs = 1; vs < split.size(); ++vs) cuts.push_back(split.stage(vs).params.begin);
  const ParamRange shared = TiedEmbedding(layout);
  if (shared.size() > 0) cuts.push_back(shared.end);
  return cuts;
}

namespace {

// The space a worker computes in, which a pipeline's split cuts: the
// model's flat one, or with tensor parallelism a rank's packed one (every
// rank's alike).
StatusOr<ParamLayout> PipelineLayout(const config::JobConfig& config) {
  const LlamaShape shape = LlamaShape::FromConfig(config.model());
  if (config.cluster().tensor_parallel() <= 1) return ParamLayout(shape);
  HERD_ASSIGN_OR_RETURN(const TensorSlices slices, TensorSlices::Make(shape, config.cluster().tensor_parallel(), 0));
  return slices.layout();
}

// The cluster's shard plan options, with a pipeline's bucket cuts.
StatusOr<ShardPlanOptions> ShardPlanOptionsOf(const config::JobConfig& config) {
  ShardPlanOptions o = ShardPlanOptions::FromConfig(config.cluster());
  if (!HasPipeline(config)) return o;
  HERD_ASSIGN_OR_RETURN(const PipelinePlan pipeline, PipelinePlan::FromConfig(config));
  HERD_ASSIGN_OR_RETURN(const ParamLayout layout, PipelineLayout(config));
  o.bucket_cuts = pipeline.BucketCuts(layout);
  return o;
}

}  // namespace

StatusOr<ShardPlan> ParameterServerPlan(const config::JobConfig& config) {
  HERD_ASSIGN_OR_RETURN(ShardPlanOptions o, ShardPlanOptionsOf(config));
  o.servers /= Regions(config);  // each region's servers hold the whole space
  const LlamaShape shape = LlamaShape::FromConfig(config.model());
  if (const int T = config.cluster().tensor_parallel(); T > 1) {
    HERD_ASSIGN_OR_RETURN(const TensorParallelSpace space, TensorParallelSpace::Make(shape, T));
    // Each rank's part, and inside it a pipeline's cuts of its packed space.
    const std::vector<int64_t> stage_cuts = o.bucket_cuts;
    o.bucket_cuts = space.RankCuts();
    for (int r = 0; r < T; ++r) {
      for (int64_t cut : stage_cuts) o.bucket_cuts.push_back(r * space.part() + cut);
    }
    std::sort(o.bucket_cuts.begin(), o.bucket_cuts.end());
    o.bucket_cuts.erase(std::unique(o.bucket_cuts.begin(), o.bucket_cuts.end()), o.bucket_cuts.end());
    return ShardPlan::Create(space.size(), space.TensorStarts(), o);
  }
  HERD_ASSIGN_OR_RETURN(ShardPlan plan, ShardPlan::Create(ParamLayout(shape), o));
  if (Regions(config) > 1) {
    // The fragments are runs of the plan's buckets.
    HERD_RETURN_IF_ERROR(DilocoPlan::Make(config.cluster().diloco(), plan, config.train().steps()).status());
  }
  return plan;
}

StatusOr<ShardPlan> AllReducePlan(const config::JobConfig& config) {
  if (!HasPipeline(config)) {
    HERD_ASSIGN_OR_RETURN(const ParamLayout layout, PipelineLayout(config));
    const Grid grid = Grid::FromConfig(config);
    return CollectivePlan(layout, config.cluster(), grid.degree(Axis::kShard) * grid.degree(Axis::kContext));
  }
  HERD_ASSIGN_OR_RETURN(ShardPlanOptions o, ShardPlanOptionsOf(config));
  o.servers = 1;
  o.strategy = config::ClusterConfig::BALANCED;
  HERD_ASSIGN_OR_RETURN(const ParamLayout layout, PipelineLayout(config));
  return ShardPlan::Create(layout, o);
}

}  // namespace herd
