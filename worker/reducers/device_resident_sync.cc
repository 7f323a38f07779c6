#include "worker/reducers/device_resident_sync.h"

#include <glog/logging.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "common/file_util.h"
#include "common/trace.h"
#include "model/checkpoint_format.h"

namespace herd {
namespace {

class DeviceResidentStep : public ShareCompute {
 public:
  explicit DeviceResidentStep(DeviceResidentSync& sync) : sync_(sync) {}

  StatusOr<double> Compute(int64_t t, int, const ShareBatches& batches, StepBoundary& previous) override {
    HERD_RETURN_IF_ERROR(previous.Settle());
    StatusOr<double> loss = sync_.ComputeStep(batches.inputs, batches.targets);
    if (!loss.ok()) return loss.status().WithContext("step " + std::to_string(t + 1) + ": ");
    return loss;
  }

 private:
  DeviceResidentSync& sync_;
};

}  // namespace

DeviceResidentSync::DeviceResidentSync(std::unique_ptr<cuda::DeviceExchange> exchange,
                                       std::unique_ptr<cuda::DeviceTrainer> device,
                                       std::unique_ptr<OptimizerSlices> optimizer, const float* weights,
                                       const DeviceResidentOptions& options)
    : exchange_(std::move(exchange)), device_(std::move(device)), optimizer_(std::move(optimizer)), options_(options) {
  CHECK_EQ(optimizer_->size(), device_->owned_size()) << "the optimizer's slices are the device's owned ranges";
  report_.version = static_cast<uint64_t>(optimizer_->step());
  std::vector<float> m, v;
  m.reserve(optimizer_->size());
  v.reserve(optimizer_->size());
  for (size_t i = 0; i < optimizer_->ranges().size(); ++i) {
    OptimizerShard& slice = optimizer_->slice(i);
    m.insert(m.end(), slice.m(), slice.m() + slice.size());
    v.insert(v.end(), slice.v(), slice.v() + slice.size());
    // The slice's master weights are `weights`' elements (attached) or its
    // own; the device takes them from `weights`.
    CHECK(slice.weights() == weights + slice.range().begin ||
          std::equal(slice.weights(), slice.weights() + slice.size(), weights + slice.range().begin))
        << "the slices' weights are the space's";
  }
  device_->SetState(weights, m.data(), v.data());
  for (size_t i = 0; i < optimizer_->ranges().size(); ++i) optimizer_->slice(i).ReleaseArrays();
  device_->SetExchange(exchange_.get());
}

DeviceResidentSync::~DeviceResidentSync() {
  // Nothing of the device's may still be ordered against the exchange.
  device_->Synchronize();
}

StatusOr<double> DeviceResidentSync::ComputeStep(const std::vector<const int32_t*>& inputs,
                                                 const std::vector<const int32_t*>& targets) {
  const cuda::DeviceTrainer::Gradients g = device_->ComputeGradients(inputs, targets);
  double squares = g.squares, mean_loss = g.loss;
  if (exchange_ != nullptr) {
    Status reduced = wait_.Timed([&] { return exchange_->Finish(); });
    HERD_RETURN_IF_ERROR(reduced.WithContext("NCCL: "));
  }
  if (options_.everyone != nullptr) {
    double sums[2] = {options_.counts_in_norm ? squares : 0.0, g.loss};
    trace::Span span("norm exchange", "collective");
    Status added = wait_.Timed([&] {
      return options_.everyone->Wait(options_.everyone->AllReduce(sums, 2, transport::DType::kFloat64));
    });
    HERD_RETURN_IF_ERROR(added.WithContext("all-reduce of the norm and the loss: "));
    squares = sums[0];
    mean_loss = sums[1] / options_.everyone->size();
  }
  const double norm = std::sqrt(squares);
  HERD_RETURN_IF_ERROR(CheckNotDiverged("gradient norm", norm));
  // The step's numbers are the host optimizer's, as every path's (every
  // slice counts the step alike); the device applies them.
  OptimizerShard::Scalars s;
  for (size_t i = 0; i < optimizer_->ranges().size(); ++i) s = optimizer_->slice(i).BeginStep(norm, mean_loss);
  device_->ApplyUpdate(s);
  for (size_t i = 0; i < optimizer_->ranges().size(); ++i) optimizer_->slice(i).EndStep();
  report_ = ReportOf(s.step, norm, s.lr, mean_loss, s.spike);
  return g.loss;
}

Status DeviceResidentSync::WriteCheckpointParts(const std::string& step_dir) {
  if (options_.shard_file < 0) return Status::OK();
  const int64_t n = device_->owned_size();
  std::vector<float> weights(n), m(n), v(n);
  device_->GetState(weights.data(), m.data(), v.data());
  std::vector<ShardView> views;
  int64_t at = 0;
  for (size_t i = 0; i < optimizer_->ranges().size(); ++i) {
    ShardView view = optimizer_->slice(i).view();
    const int64_t size = view.end - view.begin;
    view.weights = weights.data() + at;
    view.m = m.data() + at;
    view.v = v.data() + at;
    views.push_back(view);
    at += size;
  }
  return WriteShardPieces(JoinPath(step_dir, ShardFileName(options_.shard_file)), views);
}

std::unique_ptr<ShareCompute> DeviceResidentSteps(DeviceResidentSync& sync) {
  return std::make_unique<DeviceResidentStep>(sync);
}

}  // namespace herd
