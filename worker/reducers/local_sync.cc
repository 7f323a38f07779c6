#include "worker/reducers/local_sync.h"

#include <cmath>
#include <string>

#include "common/file_util.h"
#include "common/trace.h"
#include "model/checkpoint_format.h"

namespace herd {
namespace {

class LocalSync : public OneProcessSync {
 public:
  explicit LocalSync(std::unique_ptr<OptimizerShard> optimizer) : optimizer_(std::move(optimizer)) {
    report_.version = static_cast<uint64_t>(optimizer_->step());
  }

  void BeginStep(float* grads, const StepShare& share) override {
    grads_ = grads;
    step_ = share.step;
  }
  Status FinishStep(double loss) override {
    const double norm = std::sqrt(SumOfSquares(grads_, optimizer_->size()));
    HERD_RETURN_IF_ERROR(CheckNotDiverged("gradient norm", norm));
    trace::Span span("adamw", "compute", {"step", static_cast<int64_t>(step_ + 1)});
    const OptimizerShard::Scalars s = optimizer_->Step(grads_, norm, loss);
    report_ = ReportOf(s.step, norm, s.lr, loss, s.spike);
    return Status::OK();
  }
  const StepReport& report() const override { return report_; }
  Status WriteCheckpointParts(const std::string& step_dir) override {
    return optimizer_->Save(JoinPath(step_dir, ShardFileName(0)));
  }

 private:
  const std::unique_ptr<OptimizerShard> optimizer_;
  float* grads_ = nullptr;
  uint64_t step_ = 0;
  StepReport report_;
};

class DeviceResidentStep : public ShareCompute {
 public:
  explicit DeviceResidentStep(DeviceResidentSync& sync) : sync_(sync) {}

  StatusOr<double> Compute(int64_t t, int, const ShareBatches& batches, StepBoundary& previous) override {
    HERD_RETURN_IF_ERROR(previous.Settle());
    StatusOr<double> loss = sync_.ComputeStep(batches.inputs, batches.targets, static_cast<uint64_t>(t));
    if (!loss.ok()) return loss.status().WithContext("step " + std::to_string(t + 1) + ": ");
    return loss;
  }

 private:
  DeviceResidentSync& sync_;
};

}  // namespace

std::unique_ptr<SyncStrategy> CreateLocalSync(std::unique_ptr<OptimizerShard> optimizer, float* weights) {
  optimizer->AttachWeights(weights);
  return std::make_unique<LocalSync>(std::move(optimizer));
}

DeviceResidentSync::DeviceResidentSync(std::unique_ptr<cuda::DeviceTrainer> device,
                                       std::unique_ptr<OptimizerShard> optimizer, float* weights)
    : device_(std::move(device)), optimizer_(std::move(optimizer)) {
  optimizer_->AttachWeights(weights);
  report_.version = static_cast<uint64_t>(optimizer_->step());
  device_->SetState(optimizer_->weights(), optimizer_->m(), optimizer_->v());
}

StatusOr<double> DeviceResidentSync::ComputeStep(const std::vector<const int32_t*>& inputs,
                                                 const std::vector<const int32_t*>& targets, uint64_t /*step*/) {
  const cuda::DeviceTrainer::Gradients g = device_->ComputeGradients(inputs, targets);
  HERD_RETURN_IF_ERROR(CheckNotDiverged("gradient norm", g.global_norm));
  // The step's numbers are the host optimizer's, as every path's; the
  // device applies them (the host copy of the state stays behind until a
  // checkpoint asks for it).
  const OptimizerShard::Scalars s = optimizer_->BeginStep(g.global_norm, g.loss);
  device_->ApplyUpdate(s);
  optimizer_->EndStep();
  report_ = ReportOf(s.step, g.global_norm, s.lr, g.loss, s.spike);
  return g.loss;
}

Status DeviceResidentSync::WriteCheckpointParts(const std::string& step_dir) {
  device_->GetState(optimizer_->weights(), optimizer_->m(), optimizer_->v());
  return optimizer_->Save(JoinPath(step_dir, ShardFileName(0)));
}

std::unique_ptr<ShareCompute> DeviceResidentSteps(DeviceResidentSync& sync) {
  return std::make_unique<DeviceResidentStep>(sync);
}

}  // namespace herd
