// OptimizerShard: one range of the flat space with its AdamW state, the same
// object for one process, a server, a ZeRO owner's slice and a DDP worker;
// OptimizerSlices: a ZeRO owner's slices of every bucket, saved as one file
// of pieces. The properties the modes rely on, asserted bitwise.
#include "model/optim/optimizer_shard.h"
#include "sharding/job_options.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "common/file_util.h"
#include "model/checkpoint_commit.h"
#include "model/checkpoint_format.h"
#include "model/checkpoint_load.h"
#include "model/llama_config.h"
#include "sharding/shard_plan.h"

namespace herd {
namespace {

config::JobConfig SmallJob() {
  config::JobConfig c;
  auto* m = c.mutable_model();
  m->set_vocab_size(97);
  m->set_hidden_size(32);
  m->set_intermediate_size(80);
  m->set_num_hidden_layers(2);
  m->set_num_attention_heads(4);
  m->set_num_key_value_heads(2);
  c.mutable_train()->set_steps(50);
  c.mutable_train()->set_seed(5);
  auto* o = c.mutable_optimizer();
  o->set_lr(1e-2);
  o->set_min_lr(1e-3);
  o->set_warmup_steps(3);
  o->set_weight_decay(0.1);  // decayed and undecayed tensors differ
  o->set_clip_norm(1.0);
  return c;
}

std::vector<float> Gradients(int64_t n, int seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0, 0.3f);
  std::vector<float> g(n);
  for (float& x : g) x = d(rng);
  return g;
}

bool Same(const float* a, const float* b, int64_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; }

class OptimizerShardTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(dir_.Create("herd-optimizer-test").ok()); }
  std::unique_ptr<OptimizerShard> Fresh(ParamRange r) {
    auto s = JobOptions::FromConfig(job_).MakeOptimizer(layout_, r, std::nullopt);
    EXPECT_TRUE(s.ok()) << s.status().message();
    return std::move(s).value();
  }

  config::JobConfig job_ = SmallJob();
  ParamLayout layout_{LlamaShape::FromConfig(job_.model())};
  int64_t P_ = layout_.size();
  TempDir dir_;
};

TEST_F(OptimizerShardTest, FreshStartIsTheDeterministicInitialisationWhateverTheRange) {
  std::vector<float> all(P_);
  InitParameters(layout_, 5, job_.model().initializer_range(), all.data());
  auto whole = Fresh({0, P_});
  EXPECT_TRUE(Same(whole->weights(), all.data(), P_));
  auto part = Fresh({64, 640});
  EXPECT_TRUE(Same(part->weights(), all.data() + 64, 576));
  EXPECT_EQ(part->step(), 0);
  for (int64_t i = 0; i < part->size(); ++i) ASSERT_EQ(part->m()[i], 0.0f);
}

TEST_F(OptimizerShardTest, StepIsClipAndAdamWAndFollowsTheSchedule) {
  auto s = Fresh({0, P_});
  std::vector<float> w(s->weights(), s->weights() + P_), m(P_, 0), v(P_, 0);
  const auto segments = DecaySegments(layout_, 0, P_);
  const OptimizerOptions options = OptimizerOptionsOf(job_.optimizer(), 50);
  for (int t = 0; t < 5; ++t) {
    const auto g = Gradients(P_, t);
    const double norm = std::sqrt(SumOfSquares(g.data(), P_));
    const OptimizerShard::Scalars k = s->Step(g.data(), norm, /*loss=*/0);
    const double lr = LearningRate(options.schedule, t);
    EXPECT_EQ(k.lr, lr);
    EXPECT_EQ(k.step, t + 1);
    AdamWStep(segments, 0, w.data(), g.data(), m.data(), v.data(), t + 1, lr, ClipCoefficient(norm, options.clip_norm),
              options.adamw);
    ASSERT_TRUE(Same(s->weights(), w.data(), P_)) << "step " << t + 1;
    ASSERT_TRUE(Same(s->m(), m.data(), P_) && Same(s->v(), v.data(), P_)) << "step " << t + 1;
  }
  EXPECT_EQ(s->step(), 5);
}

// A server steps bucket by bucket, a ZeRO-1 owner its range, a process the
// whole space: the pieces give the bits of the whole.
TEST_F(OptimizerShardTest, SteppingInPiecesEqualsSteppingAtOnce) {
  auto whole = Fresh({0, P_});
  auto left = Fresh({0, 1024}), right = Fresh({1024, P_});
  auto pieces = Fresh({0, P_});
  for (int t = 0; t < 3; ++t) {
    const auto g = Gradients(P_, 10 + t);
    const double norm = 2.5;  // clipping on
    whole->Step(g.data(), norm, /*loss=*/0);
    left->Step(g.data(), norm, /*loss=*/0);
    right->Step(g.data() + 1024, norm, /*loss=*/0);
    const OptimizerShard::Scalars k = pieces->BeginStep(norm, /*loss=*/0);
    for (int64_t b = P_; b > 0; b -= 333) {  // buckets in backward order, odd sizes
      const int64_t lo = std::max<int64_t>(0, b - 333);
      pieces->Apply(k, {lo, b}, g.data() + lo);
    }
    pieces->EndStep();
  }
  EXPECT_TRUE(Same(whole->weights(), left->weights(), 1024));
  EXPECT_TRUE(Same(whole->weights() + 1024, right->weights(), P_ - 1024));
  EXPECT_TRUE(Same(whole->weights(), pieces->weights(), P_));
  EXPECT_TRUE(Same(whole->v(), pieces->v(), P_));
}

// A DDP or ZeRO-1 worker's master weights are its model's buffer.
TEST_F(OptimizerShardTest, AttachedWeightsAreSteppedInThePlace) {
  auto own = Fresh({128, 512});
  auto attached = Fresh({128, 512});
  std::vector<float> space(P_, -1.0f);
  attached->AttachWeights(space.data());
  EXPECT_TRUE(Same(space.data() + 128, own->weights(), 384));
  EXPECT_EQ(space[127], -1.0f);
  EXPECT_EQ(space[512], -1.0f);
  const auto g = Gradients(384, 3);
  own->Step(g.data(), 0.5, /*loss=*/0);
  attached->Step(g.data(), 0.5, /*loss=*/0);
  EXPECT_EQ(attached->weights(), space.data() + 128);
  EXPECT_TRUE(Same(space.data() + 128, own->weights(), 384));
}

TEST(SpikeGuard, SkipsOnlyWhatLiesZAboveTheMeanOnceTheWindowIsFull) {
  SpikeStats stats;
  // A noisy plateau: nothing is skipped, and nothing before `window` steps.
  for (int i = 0; i < 40; ++i) {
    const double wobble = 0.01 * ((i * 7) % 5 - 2);
    const SpikeVerdict v = JudgeAndUpdate(&stats, 2.0 + wobble, 1.0 + wobble, 4.0, 16);
    EXPECT_FALSE(v.skip) << "step " << i;
  }
  EXPECT_EQ(stats.count, 40);
  SpikeStats copy = stats;
  const SpikeVerdict loss_spike = JudgeAndUpdate(&stats, 3.0, 1.0, 4.0, 16);
  EXPECT_TRUE(loss_spike.skip);
  EXPECT_GT(loss_spike.loss_z, 4.0);
  const SpikeVerdict norm_spike = JudgeAndUpdate(&copy, 2.0, 5.0, 4.0, 16);
  EXPECT_TRUE(norm_spike.skip);
  EXPECT_GT(norm_spike.norm_z, 4.0);
  // Below the mean is never a spike; zscore 0 never skips.
  SpikeStats low = copy;
  EXPECT_FALSE(JudgeAndUpdate(&low, 0.5, 0.1, 4.0, 16).skip);
  SpikeStats off = copy;
  EXPECT_FALSE(JudgeAndUpdate(&off, 30.0, 50.0, 0.0, 16).skip);
  // Young statistics do not skip.
  SpikeStats young;
  for (int i = 0; i < 5; ++i) JudgeAndUpdate(&young, 2.0 + 0.01 * i, 1.0, 4.0, 16);
  EXPECT_FALSE(JudgeAndUpdate(&young, 30.0, 1.0, 4.0, 16).skip);
}

TEST_F(OptimizerShardTest, ASkippedStepLeavesTheStateAndTheStatisticsTravelWithTheShard) {
  job_.mutable_optimizer()->set_skip_spikes_zscore(3.0);
  job_.mutable_optimizer()->set_skip_spikes_window(4);
  auto s = Fresh({0, P_});
  const auto g = Gradients(P_, 9);
  for (int i = 0; i < 8; ++i) EXPECT_FALSE(s->Step(g.data(), 1.0 + 0.01 * (i % 3), 2.0 - 0.01 * (i % 2)).spike.skip);
  const std::vector<float> w(s->weights(), s->weights() + P_), m(s->m(), s->m() + P_), v(s->v(), s->v() + P_);
  const OptimizerShard::Scalars spike = s->Step(g.data(), 1.0, 9.0);
  EXPECT_TRUE(spike.spike.skip);
  EXPECT_EQ(s->step(), 9);  // the step is taken, its update is not
  EXPECT_TRUE(Same(w.data(), s->weights(), P_) && Same(m.data(), s->m(), P_) && Same(v.data(), s->v(), P_));

  // Saved and read back, in this version and as a version-1 file.
  const std::string path = dir_.path() + "/shard.bin";
  ASSERT_TRUE(s->Save(path).ok());
  auto read = ReadShard(path);
  ASSERT_TRUE(read.ok()) << read.status().message();
  EXPECT_EQ(read->spikes.count, 9);
  const SpikeStats saved = s->view().spikes;
  EXPECT_EQ(std::memcmp(&read->spikes, &saved, sizeof(SpikeStats)), 0);
  std::string bytes = *ReadFile(path);
  const uint32_t v1 = 1;
  std::memcpy(bytes.data() + 8, &v1, 4);
  bytes.erase(40, 40);
  ASSERT_TRUE(WriteFileAtomic(path, bytes).ok());
  auto old = ReadShard(path);
  ASSERT_TRUE(old.ok()) << old.status().message();
  EXPECT_EQ(old->spikes.count, 0);
  EXPECT_TRUE(Same(old->weights.data(), s->weights(), P_));
}

// Saved by any number of shards, resumed on any other partition.
TEST_F(OptimizerShardTest, SavedShardsResumeOnAnyPartition) {
  const int64_t cut = 704;  // 64-aligned
  auto a = Fresh({0, cut}), b = Fresh({cut, P_});
  for (int t = 0; t < 4; ++t) {
    const auto g = Gradients(P_, 20 + t);
    a->Step(g.data(), 1.5, /*loss=*/0);
    b->Step(g.data() + cut, 1.5, /*loss=*/0);
  }
  config::JobConfig job = job_;
  const std::string step_dir = StepDirName(dir_.path(), 4);
  ASSERT_TRUE(BeginCheckpointPart(step_dir).ok());
  ASSERT_TRUE(WriteConfigPart(step_dir, job).ok());
  ASSERT_TRUE(a->Save(JoinPath(step_dir, ShardFileName(0))).ok());
  ASSERT_TRUE(b->Save(JoinPath(step_dir, ShardFileName(1))).ok());
  ASSERT_TRUE(WriteManifest(step_dir, 4, CheckpointParts(2, 0)).ok());
  auto ckpt = LatestVerifiedCheckpoint(dir_.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().message();
  auto whole = JobOptions::FromConfig(job).MakeOptimizer(layout_, {0, P_}, *ckpt);
  ASSERT_TRUE(whole.ok()) << whole.status().message();
  EXPECT_EQ((*whole)->step(), 4);
  EXPECT_TRUE(Same((*whole)->weights(), a->weights(), cut));
  EXPECT_TRUE(Same((*whole)->weights() + cut, b->weights(), P_ - cut));
  EXPECT_TRUE(Same((*whole)->m() + cut, b->m(), P_ - cut));
  // And the next step continues where the pieces would have.
  const auto g = Gradients(P_, 99);
  (*whole)->Step(g.data(), 1.5, /*loss=*/0);
  b->Step(g.data() + cut, 1.5, /*loss=*/0);
  EXPECT_TRUE(Same((*whole)->weights() + cut, b->weights(), P_ - cut));
}

// ZeRO owners' slices of every bucket step as one range does, save as one
// file of pieces each, and resume as one range or as another cut; a pieces
// table that does not hold together is refused, naming the file.
TEST_F(OptimizerShardTest, SlicesStepAsOneRangeAndResumeFromTheirPiecesOnAnyCut) {
  config::ClusterConfig cluster;
  cluster.set_bucket_mb(0.002);  // ~500 floats: several buckets
  cluster.set_zero_stage(1);
  auto plan = CollectivePlan(layout_, cluster, ShardGroupSize(cluster, 2));
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  ASSERT_GT(plan->buckets().size(), 3u);
  const OptimizerOptions options = OptimizerOptionsOf(job_.optimizer(), 50);
  auto slices = [&](const std::vector<ParamRange>& ranges, const std::optional<VerifiedCheckpoint>& from) {
    auto made = OptimizerSlices::InitOrResume(options, JobOptions::FromConfig(job_).init, layout_, ranges, from);
    EXPECT_TRUE(made.ok()) << made.status().message();
    return std::move(made).value();
  };
  auto whole = Fresh({0, P_});
  std::vector<std::unique_ptr<OptimizerSlices>> owners;
  for (int r = 0; r < 2; ++r) owners.push_back(slices(OwnedSlices(*plan, 2, r), std::nullopt));
  EXPECT_EQ(owners[0]->size() + owners[1]->size(), P_);
  std::vector<float> space(P_, 0.0f);
  for (auto& o : owners) o->AttachWeights(space.data());
  EXPECT_TRUE(Same(space.data(), whole->weights(), P_));
  for (int t = 0; t < 3; ++t) {
    const auto g = Gradients(P_, 40 + t);
    whole->Step(g.data(), 1.25, /*loss=*/0);
    for (auto& o : owners) o->Step(g.data(), 1.25, /*loss=*/0);
  }
  EXPECT_TRUE(Same(space.data(), whole->weights(), P_));

  const std::string step_dir = StepDirName(dir_.path(), 3);
  ASSERT_TRUE(BeginCheckpointPart(step_dir).ok());
  ASSERT_TRUE(WriteConfigPart(step_dir, job_).ok());
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(owners[r]->Save(JoinPath(step_dir, ShardFileName(r))).ok());
  ASSERT_TRUE(WriteManifest(step_dir, 3, CheckpointParts(2, 0)).ok());
  auto ckpt = LatestVerifiedCheckpoint(dir_.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().message();
  auto resumed = JobOptions::FromConfig(job_).MakeOptimizer(layout_, {0, P_}, *ckpt);
  ASSERT_TRUE(resumed.ok()) << resumed.status().message();
  EXPECT_EQ((*resumed)->step(), 3);
  EXPECT_TRUE(Same((*resumed)->weights(), whole->weights(), P_));
  EXPECT_TRUE(Same((*resumed)->m(), whole->m(), P_));
  EXPECT_TRUE(Same((*resumed)->v(), whole->v(), P_));
  auto third = slices(OwnedSlices(*plan, 3, 1), *ckpt);  // another cut
  EXPECT_EQ(third->step(), 3);
  for (size_t i = 0; i < third->ranges().size(); ++i) {
    const ParamRange r = third->ranges()[i];
    EXPECT_TRUE(Same(third->slice(i).v(), whole->v() + r.begin, r.size())) << "slice " << i;
  }

  // A pieces table out of order, and a count beyond the bound.
  const std::string path = JoinPath(step_dir, ShardFileName(0));
  const std::string good = *ReadFile(path);
  std::string bad = good;
  int64_t first_end;
  std::memcpy(&first_end, bad.data() + 80 + 8 + 8, 8);
  const int64_t past = first_end + (int64_t{1} << 30);
  std::memcpy(bad.data() + 80 + 8 + 8, &past, 8);
  ASSERT_TRUE(WriteFileAtomic(path, bad).ok());
  EXPECT_NE(ReadShardPieces(path).status().message().find(path + ": piece ["), std::string::npos)
      << ReadShardPieces(path).status().message();
  bad = good;
  const int64_t count = int64_t{1} << 40;
  std::memcpy(bad.data() + 80, &count, 8);
  ASSERT_TRUE(WriteFileAtomic(path, bad).ok());
  EXPECT_NE(ReadShardExtent(path).status().message().find("pieces (expected 1 to"), std::string::npos)
      << ReadShardExtent(path).status().message();
  EXPECT_FALSE(VerifyCheckpoint(step_dir).ok());
}

}  // namespace
}  // namespace herd
