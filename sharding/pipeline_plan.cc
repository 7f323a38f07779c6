#include "sharding/pipeline_plan.h"

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
  HERD_ASSIGN_OR_RETURN(plan.schedule, MakePipelineSchedule(KindOf(cl.pipeline_schedule()), P, v,
                                                            config.train().grad_accum()));
  HERD_ASSIGN_OR_RETURN(plan.split, PipelineSplit::Make(LlamaShape::FromConfig(config.model()), P * v,
                                                        cl.pipeline_split(), config.train().seq_len()));
  plan.replicas = config.cluster().workers() / P;
  return plan;
}

bool HasPipeline(const config::JobConfig& config) { return config.cluster().pipeline_stages() > 1; }

}  // namespace herd
