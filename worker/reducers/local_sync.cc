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

}  // namespace

std::unique_ptr<SyncStrategy> CreateLocalSync(std::unique_ptr<OptimizerShard> optimizer, float* weights) {
  optimizer->AttachWeights(weights);
  return std::make_unique<LocalSync>(std::move(optimizer));
}

}  // namespace herd
