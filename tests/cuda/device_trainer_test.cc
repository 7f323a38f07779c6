// The single-process GPU trainer takes its step's numbers from the host's
// OptimizerShard, as every other path does: the learning rate of the
// schedule, and the spike guard's verdict — a skipped step leaves the
// device's weights and AdamW moments as they were, bit for bit, while the
// step count and the schedule go on.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "model/optim/optimizer_shard.h"
#include "model/param_layout.h"
#include "sharding/job_options.h"
#include "tests/cuda/device_test_util.h"
#include "worker/cuda/device_trainer.h"
#include "worker/reducers/device_resident_sync.h"

namespace herd::cuda {
namespace {

struct DeviceState {
  std::vector<float> weights, m, v;
  bool operator==(const DeviceState& o) const { return weights == o.weights && m == o.m && v == o.v; }
};

DeviceState Read(DeviceTrainer& device, int64_t P) {
  DeviceState s{std::vector<float>(P), std::vector<float>(P), std::vector<float>(P)};
  device.GetState(s.weights.data(), s.m.data(), s.v.data());
  return s;
}

TEST(DeviceResidentSync, TheSpikeGuardSkipsTheUpdateOnTheDevice) {
  HERD_REQUIRE_DEVICE();
  constexpr int kWindow = 4, kSteps = 8, kSpikeStep = 7;  // 1-based
  LlamaShape shape;
  shape.vocab_size = 96;
  shape.hidden_size = 64;
  shape.intermediate_size = 160;
  shape.num_layers = 2;
  shape.num_heads = 2;
  shape.num_kv_heads = 1;
  const int B = 2, T = 16, N = B * T;
  const ParamLayout layout(shape);
  const int64_t P = layout.size();

  config::OptimizerConfig opt;
  opt.set_lr(1e-3);
  opt.set_warmup_steps(2);
  opt.set_clip_norm(1.0);
  opt.set_skip_spikes_zscore(3.0);
  opt.set_skip_spikes_window(kWindow);
  const OptimizerOptions options = OptimizerOptionsOf(opt, /*total_steps=*/100);  // lr > 0 throughout
  ShardState state;
  state.end = P;
  state.weights.resize(P);
  InitParameters(layout, 3, 0.02, state.weights.data());
  state.m.assign(P, 0.0f);
  state.v.assign(P, 0.0f);

  DeviceTrainer::Options o;
  o.shape = shape;
  o.batch = B;
  o.seq_len = T;
  o.bf16 = false;
  o.adamw = options.adamw;
  auto created = DeviceTrainer::Create(o);
  ASSERT_TRUE(created.ok()) << created.status().message();
  DeviceTrainer* device = created->get();
  std::vector<float> weights(P);
  std::vector<ShardState> states;
  states.push_back(std::move(state));
  auto optimizer = OptimizerSlices::Attached(layout, options, std::move(states), nullptr);
  std::copy_n(optimizer->slice(0).weights(), P, weights.data());
  DeviceResidentSync sync(nullptr, std::move(*created), std::move(optimizer), weights.data(), {});

  // A pattern the model learns at once (the loss falls step by step), then
  // random targets: a loss far above the running mean.
  std::vector<int32_t> inputs(N), targets(N);
  for (int i = 0; i < N; ++i) inputs[i] = targets[i] = (i * 7) % 12;
  for (int step = 1; step <= kSteps; ++step) {
    if (step == kSpikeStep) {
      for (int i = 0; i < N; ++i) targets[i] = (i * 53 + 29) % shape.vocab_size;
    }
    const DeviceState before = Read(*device, P);
    auto loss = sync.ComputeStep({inputs.data()}, {targets.data()});
    ASSERT_TRUE(loss.ok()) << loss.status().message();
    const StepReport& r = sync.report();
    EXPECT_EQ(r.version, static_cast<uint64_t>(step));
    EXPECT_EQ(r.lr, LearningRate(options.schedule, step - 1)) << "step " << step;
    EXPECT_EQ(r.mean_loss, *loss);
    const DeviceState after = Read(*device, P);
    if (step == kSpikeStep) {
      EXPECT_EQ(r.skipped, 1) << "the spike at step " << step << " (loss " << *loss << ", z " << r.loss_z
                              << ") was not skipped";
      EXPECT_GT(r.loss_z, 3.0);
    }
    if (step <= kWindow) {
      EXPECT_EQ(r.skipped, 0) << "step " << step << " skipped before the window was full";
    }
    if (r.skipped != 0) {
      EXPECT_TRUE(after == before) << "step " << step << " was skipped but the device's state changed";
    } else {
      EXPECT_FALSE(after.weights == before.weights) << "step " << step << " changed no weight";
    }
  }
}

}  // namespace
}  // namespace herd::cuda
