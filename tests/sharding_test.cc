// Shard plans (tiling, alignment, balance, per-tensor cuts, bucket order),
// initialisation of a range, reading a checkpoint range across shards
// written by another number of servers, and the parameter shard's
// synchronous step driven through its push/pull handler interface; the
// DiLoCo schedule of a job of regions (fragments, offsets, overlap).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>

#include "common/bf16.h"
#include "common/file_util.h"
#include "model/checkpoint_commit.h"
#include "model/checkpoint_format.h"
#include "model/checkpoint_load.h"
#include "model/optim/adamw.h"
#include "server/parameter_shard.h"
#include "sharding/diloco_plan.h"
#include "sharding/shard_plan.h"
#include "transport/ps_protocol.h"

namespace herd {
namespace {

LlamaShape SmallShape(bool tied = true) {
  config::ModelConfig m;
  m.set_vocab_size(97);
  m.set_hidden_size(32);
  m.set_intermediate_size(80);
  m.set_num_hidden_layers(3);
  m.set_num_attention_heads(4);
  m.set_num_key_value_heads(2);
  m.set_tie_word_embeddings(tied);
  return LlamaShape::FromConfig(m);
}

ShardPlan MakePlan(const ParamLayout& layout, int servers, int64_t bucket,
                   config::ClusterConfig::ShardStrategy strategy = config::ClusterConfig::BALANCED) {
  ShardPlanOptions o;
  o.servers = servers;
  o.bucket_elements = bucket;
  o.strategy = strategy;
  auto plan = ShardPlan::Create(layout, o);
  EXPECT_TRUE(plan.ok()) << plan.status().message();
  return std::move(plan).value();
}

void ExpectWellFormed(const ParamLayout& layout, const ShardPlan& plan, int64_t bucket) {
  int64_t at = 0;
  for (int s = 0; s < plan.num_servers(); ++s) {
    const ParamRange& r = plan.shard(s);
    EXPECT_EQ(r.begin, at);
    EXPECT_GT(r.size(), 0);
    EXPECT_EQ(r.begin % ParamLayout::kAlign, 0);
    at = r.end;
    for (int64_t x : {r.begin, r.end - 1}) EXPECT_EQ(plan.ServerOf(x), s);
  }
  EXPECT_EQ(at, layout.size());
  // Buckets: in descending order, tiling the space, inside one shard each.
  int64_t end = layout.size();
  for (const Bucket& b : plan.buckets()) {
    EXPECT_EQ(b.range.end, end);
    EXPECT_GT(b.range.size(), 0);
    EXPECT_LE(b.range.size(), bucket);
    EXPECT_EQ(b.range.begin % ParamLayout::kAlign, 0);
    EXPECT_GE(b.range.begin, plan.shard(b.server).begin);
    EXPECT_LE(b.range.end, plan.shard(b.server).end);
    end = b.range.begin;
  }
  EXPECT_EQ(end, 0);
}

TEST(ShardPlan, BalancedTilesAlignedAndEven) {
  const ParamLayout layout(SmallShape());
  for (int S : {1, 2, 3, 7}) {
    for (int64_t bucket : {64, 1000, 1 << 20}) {
      const ShardPlan plan = MakePlan(layout, S, bucket);
      ExpectWellFormed(layout, plan, std::max<int64_t>(64, bucket / 64 * 64));
      for (int s = 0; s < S; ++s) {
        EXPECT_LE(std::abs(plan.shard(s).size() - layout.size() / S), 64) << "S=" << S << " server " << s;
      }
    }
  }
}

TEST(ShardPlan, PerTensorCutsOnlyBetweenTensors) {
  const ParamLayout layout(SmallShape(/*tied=*/false));
  for (int S : {1, 2, 3, 5}) {
    const ShardPlan plan = MakePlan(layout, S, 256, config::ClusterConfig::PER_TENSOR);
    ExpectWellFormed(layout, plan, 256);
    for (const TensorSpec& t : layout.tensors()) {
      EXPECT_EQ(plan.ServerOf(t.offset), plan.ServerOf(t.offset + t.numel - 1)) << t.name << " is split";
    }
  }
  ShardPlanOptions o;
  o.servers = static_cast<int>(layout.tensors().size()) + 1;
  o.strategy = config::ClusterConfig::PER_TENSOR;
  EXPECT_FALSE(ShardPlan::Create(layout, o).ok());
  o.servers = static_cast<int>(layout.size() / 64) + 1;
  o.strategy = config::ClusterConfig::BALANCED;
  EXPECT_FALSE(ShardPlan::Create(layout, o).ok());
}

TEST(ShardPlan, InitialisingARangeEqualsTheSliceOfTheWhole) {
  const ParamLayout layout(SmallShape(false));
  std::vector<float> whole(layout.size());
  InitParameters(layout, 42, 0.02, whole.data());
  std::mt19937 rng(3);
  for (int trial = 0; trial < 20; ++trial) {
    int64_t a = rng() % layout.size(), b = rng() % layout.size();
    if (a > b) std::swap(a, b);
    ++b;
    std::vector<float> part(b - a);
    InitParameterRange(layout, 42, 0.02, a, b, part.data());
    ASSERT_EQ(0, std::memcmp(part.data(), whole.data() + a, part.size() * sizeof(float))) << a << ".." << b;
  }
}

TEST(ShardPlan, CheckpointRangesAssembleAcrossServerCounts) {
  const std::string dir = ::testing::TempDir() + "/herd_ckpt_range";
  ASSERT_TRUE(BeginCheckpointPart(dir).ok());
  const int64_t P = 3000;
  std::vector<std::string> parts;
  for (auto [b, e, i] : {std::tuple{0, 1000, 0}, {1000, 2600, 1}, {2600, 3000, 2}}) {
    ShardState s;
    s.begin = b;
    s.end = e;
    s.step = 7;
    for (int64_t x = b; x < e; ++x) {
      s.weights.push_back(x);
      s.m.push_back(-x);
      s.v.push_back(2 * x);
    }
    parts.push_back(ShardFileName(i));
    ASSERT_TRUE(WriteShard(JoinPath(dir, parts.back()), s.view()).ok());
  }
  ASSERT_TRUE(WriteManifest(dir, 7, parts).ok());
  auto manifest = VerifyCheckpoint(dir);
  ASSERT_TRUE(manifest.ok());
  auto r = ReadShardRange(dir, *manifest, 900, 2700, true);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->step, 7);
  for (int64_t x = 900; x < 2700; ++x) {
    ASSERT_EQ(r->weights[x - 900], x);
    ASSERT_EQ(r->m[x - 900], -x);
    ASSERT_EQ(r->v[x - 900], 2 * x);
  }
  auto beyond = ReadShardRange(dir, *manifest, 2000, P + 64, false);
  ASSERT_FALSE(beyond.ok());
  EXPECT_NE(beyond.status().message().find("do not cover"), std::string::npos) << beyond.status().message();
}

// A background checkpoint's snapshot writes the bytes the foreground
// writer does, of one range (version 2) and of several pieces (version 3).
TEST(ShardImage, WritesWhatWriteShardPiecesWrites) {
  const std::string dir = ::testing::TempDir() + "/herd_shard_image";
  ASSERT_TRUE(BeginCheckpointPart(dir).ok());
  std::vector<float> w(300), m(300), v(300);
  for (int i = 0; i < 300; ++i) {
    w[i] = i;
    m[i] = -i;
    v[i] = 0.5f * i;
  }
  SpikeStats spikes;
  spikes.count = 3;
  const ShardView one{0, 300, 9, w.data(), m.data(), v.data(), spikes};
  const std::vector<ShardView> pieces = {{10, 74, 9, w.data(), m.data(), v.data(), spikes},
                                         {128, 200, 9, w.data() + 64, m.data() + 64, v.data() + 64, spikes},
                                         {640, 700, 9, w.data() + 136, m.data() + 136, v.data() + 136, spikes}};
  for (const std::vector<ShardView>& shard : {std::vector<ShardView>{one}, pieces}) {
    ASSERT_TRUE(WriteShardPieces(JoinPath(dir, "written.bin"), shard).ok());
    ShardImage image;
    image.Capture(shard);
    ASSERT_TRUE(image.Write(JoinPath(dir, "captured.bin")).ok());
    auto written = ReadFile(JoinPath(dir, "written.bin"));
    auto captured = ReadFile(JoinPath(dir, "captured.bin"));
    ASSERT_TRUE(written.ok() && captured.ok());
    EXPECT_EQ(*captured, *written) << shard.size() << " pieces";
    auto read = ReadShardPieces(JoinPath(dir, "captured.bin"));
    ASSERT_TRUE(read.ok()) << read.status().message();
    ASSERT_EQ(read->size(), shard.size());
    EXPECT_EQ(read->back().v.back(), shard.back().v[shard.back().end - shard.back().begin - 1]);
  }
}

// A part in the shard format, whatever its name (a region's replica, an
// outer state), enters the manifest with the checksum its writer put in its
// header, not one of the bytes read back: damage between the write and the
// commit is caught when the checkpoint is loaded.
TEST(Manifest, ChecksumsEveryShardFormatPartFromItsHeader) {
  const std::string dir = ::testing::TempDir() + "/herd_ckpt_header_digest";
  ASSERT_TRUE(BeginCheckpointPart(dir).ok());
  std::vector<float> w(256, 1.0f), m(256, 2.0f), v(256, 3.0f);
  const ShardView shard{0, 256, 4, w.data(), m.data(), v.data(), {}};
  for (const std::string& part : {ShardFileName(0), RegionShardFileName(1, 0), OuterFileName(0, 0),
                                  OuterFileName(1, 0)}) {
    SCOPED_TRACE(part);
    ASSERT_TRUE(WriteShard(JoinPath(dir, part), shard).ok());
    std::FILE* f = std::fopen(JoinPath(dir, part).c_str(), "r+b");
    ASSERT_NE(f, nullptr);
    std::fseek(f, -5, SEEK_END);  // in v
    std::fputc(0x7f, f);
    std::fclose(f);
    ASSERT_TRUE(WriteManifest(dir, 4, {part}).ok());
    auto verified = VerifyCheckpoint(dir);
    ASSERT_FALSE(verified.ok());
    EXPECT_NE(verified.status().message().find(part + ": does not match the manifest"), std::string::npos)
        << verified.status().message();
  }
}

// A null v (an outer state whose wire keeps no rounding error) is written,
// in place and from a snapshot, as an array of zeros would be.
TEST(ShardImage, WritesANullArrayAsZeros) {
  const std::string dir = ::testing::TempDir() + "/herd_shard_null_v";
  ASSERT_TRUE(BeginCheckpointPart(dir).ok());
  const int64_t n = 70000;  // more than one block of zeros
  std::vector<float> w(n, 0.25f), m(n, -1.0f), zeros(n, 0.0f);
  const ShardView with_zeros{0, n, 5, w.data(), m.data(), zeros.data(), {}};
  const ShardView null_v{0, n, 5, w.data(), m.data(), nullptr, {}};
  ASSERT_TRUE(WriteShard(JoinPath(dir, "zeros.bin"), with_zeros).ok());
  ASSERT_TRUE(WriteShard(JoinPath(dir, "null.bin"), null_v).ok());
  ShardImage image;
  image.Capture(null_v);
  ASSERT_TRUE(image.Write(JoinPath(dir, "captured.bin")).ok());
  auto expected = ReadFile(JoinPath(dir, "zeros.bin"));
  ASSERT_TRUE(expected.ok());
  for (const char* name : {"null.bin", "captured.bin"}) {
    auto got = ReadFile(JoinPath(dir, name));
    ASSERT_TRUE(got.ok());
    EXPECT_TRUE(*got == *expected) << name;
  }
  auto read = ReadShard(JoinPath(dir, "null.bin"));
  ASSERT_TRUE(read.ok()) << read.status().message();
  EXPECT_EQ(read->v, zeros);
}

// A push of gradients of step `step`, of the share of rank `share` (by
// default the pushing worker's own).
transport::Request Gradients(transport::PeerId client, uint64_t step, uint64_t offset, uint64_t length,
                             int share = -1) {
  const int own = std::max(0, client - 2);  // workers' peers follow the two servers'
  return {client, transport::RequestKind::kGradients, transport::PushTag(step, share < 0 ? own : share), offset,
          length};
}
transport::Request Weights(transport::PeerId client, uint64_t version, uint64_t offset, uint64_t length) {
  return {client, transport::RequestKind::kWeights, version, offset, length};
}

// The server's step, driven through the handler interface as the push/pull
// service would: W=2 workers, server 1 of 2.
class ParameterShardTest : public ::testing::Test {
 protected:
  static constexpr int kServers = 2;
  int workers_ = 2;
  void Build(bool bf16, int workers = 2, bool elastic = false) {
    workers_ = workers;
    o_.elastic = elastic;
    o_.layout = &layout_;
    o_.plan = &plan_;
    o_.server = 1;
    o_.num_workers = workers_;
    o_.first_worker_peer = kServers;
    o_.bf16_wire = bf16;
    o_.collects_losses = false;
    const ParamRange& r = plan_.shard(1);
    initial_.begin = r.begin;
    initial_.end = r.end;
    initial_.weights.resize(r.size());
    initial_.m.assign(r.size(), 0);
    initial_.v.assign(r.size(), 0);
    InitParameterRange(layout_, 1, 0.02, r.begin, r.end, initial_.weights.data());
    OptimizerOptions options;  // the defaults: betas 0.9/0.95, eps 1e-8, no decay
    options.schedule.total_steps = 100;
    shard_ = std::make_unique<ParameterShard>(o_, std::make_unique<OptimizerShard>(layout_, options, initial_));
  }
  // Pushes share `share`'s gradient g (over the shard) bucket by bucket,
  // from worker w (by default the share's own).
  Status PushAll(int share, const std::vector<float>& g, uint64_t step, int w = -1) {
    if (w < 0) w = share;
    const ParamRange& r = plan_.shard(1);
    const int wire = o_.bf16_wire ? 2 : 4;
    for (const Bucket& b : plan_.buckets()) {
      if (b.server != 1) continue;
      const uint64_t off = (b.range.begin - r.begin) * wire, len = b.range.size() * wire;
      const transport::Request push = Gradients(kServers + w, step, off, len, share);
      auto target = shard_->PushTarget(push);
      if (!target.ok()) return target.status();
      const float* src = g.data() + (b.range.begin - r.begin);
      if (o_.bf16_wire) {
        FloatsToBf16(src, static_cast<uint16_t*>(*target), b.range.size());
      } else {
        std::memcpy(*target, src, len);
      }
      Status applied;
      shard_->OnPushed(push, *target, true, [&](const Status& s) { applied = s; });
      if (!applied.ok()) return applied;
    }
    return Status::OK();
  }
  std::vector<float> Gradient(int seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> n(0, 0.1f);
    std::vector<float> g(plan_.shard(1).size());
    for (float& x : g) x = n(rng);
    return g;
  }

  ParamLayout layout_{SmallShape()};
  ShardPlan plan_ = MakePlan(layout_, kServers, 1000);
  ParameterShardOptions o_;
  ShardState initial_;
  std::unique_ptr<ParameterShard> shard_;
};

TEST_F(ParameterShardTest, SumsInRankOrderThenStepsLikeAdamW) {
  Build(false);
  const auto g0 = Gradient(1), g1 = Gradient(2);
  // Worker 1 first: its contribution waits for worker 0's.
  ASSERT_TRUE(PushAll(1, g1, 0).ok());
  // A pull of the next version waits for the step.
  bool answered = false;
  std::vector<float> pulled(plan_.shard(1).size());
  shard_->OnPull(Weights(kServers, 1, 0, pulled.size() * 4), [&](const Status& s, const void* data) {
    ASSERT_TRUE(s.ok()) << s.message();
    std::memcpy(pulled.data(), data, pulled.size() * 4);
    answered = true;
  });
  ASSERT_TRUE(PushAll(0, g0, 0).ok());
  EXPECT_FALSE(answered);
  auto sumsq = shard_->WaitForGradients();
  ASSERT_TRUE(sumsq.ok());
  std::vector<float> sum(g0.size());
  for (size_t i = 0; i < sum.size(); ++i) sum[i] = g0[i] + g1[i];
  EXPECT_NEAR(*sumsq, SumOfSquares(sum.data(), sum.size()), 1e-12 * *sumsq);
  shard_->ApplyStep({/*step=*/1, /*lr=*/1e-3, /*grad_scale=*/ClipCoefficient(2.0, 1.0), /*global_norm=*/2.0, {}});
  ASSERT_TRUE(answered);
  // The reference: AdamW on the rank-ordered sum, clipped by 1/(2+1e-6).
  ShardState ref = initial_;
  const ParamRange& r = plan_.shard(1);
  AdamWStep(DecaySegments(layout_, r.begin, r.end), r.begin, ref.weights.data(), sum.data(), ref.m.data(), ref.v.data(),
            1, 1e-3, ClipCoefficient(2.0, 1.0), AdamWOptions{});
  EXPECT_EQ(0, std::memcmp(ref.weights.data(), shard_->optimizer().weights(), sum.size() * 4));
  EXPECT_EQ(0, std::memcmp(ref.weights.data(), pulled.data(), sum.size() * 4));
  EXPECT_EQ(shard_->optimizer().step(), 1);
}

TEST_F(ParameterShardTest, SumIsInWorkerRankOrderWhateverTheArrivalOrder) {
  Build(false, /*workers=*/3);
  // Values where float addition is visibly not associative.
  const size_t n = plan_.shard(1).size();
  std::vector<float> g0(n, 1.0f), g1(n, 1e8f), g2(n, -1e8f);
  ASSERT_TRUE(PushAll(2, g2, 0).ok());
  ASSERT_TRUE(PushAll(1, g1, 0).ok());
  ASSERT_TRUE(PushAll(0, g0, 0).ok());
  ASSERT_TRUE(shard_->WaitForGradients().ok());
  const float expected = (g0[0] + g1[0]) + g2[0];  // 0: the 1 is lost in 1e8
  ASSERT_NE(expected, g0[0] + (g1[0] + g2[0]));    // 1: arrival order would give this
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(shard_->gradients()[i], expected) << i;
}

TEST_F(ParameterShardTest, RefusesBadPushesAndPulls) {
  Build(false);
  const ParamRange& r = plan_.shard(1);
  const uint64_t first = 0, len = plan_.buckets().back().range.size() * 4;
  auto message = [](const StatusOr<void*>& s) { return s.ok() ? std::string("ok") : s.status().message(); };
  // From a server, not a worker.
  EXPECT_NE(message(shard_->PushTarget(Gradients(0, 0, first, 256))).find("not a worker"), std::string::npos);
  // For another step.
  EXPECT_NE(message(shard_->PushTarget(Gradients(kServers, 5, first, 256))).find("for step 5"), std::string::npos);
  // Not a bucket: a piece of one, and an offset inside one.
  EXPECT_NE(message(shard_->PushTarget(Gradients(kServers, 0, 4, 256))).find("not one of this server's buckets"),
            std::string::npos);
  // Losses go to server 0 only; a loss push is one ShareLoss.
  EXPECT_EQ(shard_->size_bytes(transport::RequestKind::kLoss), 0u);
  {
    ParameterShardOptions zero = o_;
    zero.server = 0;
    zero.collects_losses = true;
    const ParamRange& r0 = plan_.shard(0);
    ShardState s0{r0.begin, r0.end, 0, std::vector<float>(r0.size()), std::vector<float>(r0.size()),
                  std::vector<float>(r0.size()), {}};
    ParameterShard server0(zero, std::make_unique<OptimizerShard>(layout_, OptimizerOptions(), s0));
    EXPECT_EQ(server0.size_bytes(transport::RequestKind::kLoss), sizeof(ShareLoss));
    const transport::Request half{kServers, transport::RequestKind::kLoss, 0, 0, 4};
    EXPECT_NE(message(server0.PushTarget(half)).find("not one share's loss"), std::string::npos);
    const transport::Request loss{kServers, transport::RequestKind::kLoss, 0, 0, sizeof(ShareLoss)};
    ASSERT_TRUE(server0.PushTarget(loss).ok());
    EXPECT_NE(message(server0.PushTarget(loss)).find("loss twice"), std::string::npos);
  }
  // Twice the same bucket in one step.
  const Bucket* mine = nullptr;
  for (const Bucket& b : plan_.buckets()) {
    if (b.server == 1) mine = &b;
  }
  const uint64_t off = (mine->range.begin - r.begin) * 4, n = mine->range.size() * 4;
  auto t = shard_->PushTarget(Gradients(kServers + 1, 0, off, n));
  ASSERT_TRUE(t.ok());
  EXPECT_NE(message(shard_->PushTarget(Gradients(kServers + 1, 0, off, n))).find("twice"), std::string::npos);
  shard_->OnPushed(Gradients(kServers + 1, 0, off, n), *t, true, [](const Status&) {});
  // Pulls: a version the server does not hold, and a range that is not whole floats.
  std::string error;
  auto capture = [&](const Status& s, const void*) { error = s.message(); };
  shard_->OnPull(Weights(kServers, 7, first, len), capture);
  EXPECT_NE(error.find("version 7"), std::string::npos) << error;
  shard_->OnPull(Weights(kServers, 0, 2, 8), capture);
  EXPECT_NE(error.find("not whole parameters"), std::string::npos) << error;
  shard_->OnPull({kServers, transport::RequestKind::kReport, 0, 0, 8}, capture);
  EXPECT_NE(error.find("not the whole step report"), std::string::npos) << error;
  // After a failure everything is answered with it.
  shard_->Fail(Status::Aborted("worker rank 1 was lost"));
  EXPECT_FALSE(shard_->WaitForGradients().ok());
  EXPECT_NE(message(shard_->PushTarget(Gradients(kServers, 0, off, n))).find("was lost"), std::string::npos);
}

TEST_F(ParameterShardTest, Bf16WireRoundsPushesAndPulls) {
  Build(true);
  const auto g0 = Gradient(3), g1 = Gradient(4);
  ASSERT_TRUE(PushAll(0, g0, 0).ok());
  ASSERT_TRUE(PushAll(1, g1, 0).ok());
  ASSERT_TRUE(shard_->WaitForGradients().ok());
  shard_->ApplyStep({/*step=*/1, /*lr=*/1e-3, /*grad_scale=*/ClipCoefficient(0.5, 1.0), /*global_norm=*/0.5, {}});
  std::vector<uint16_t> pulled(plan_.shard(1).size());
  shard_->OnPull(Weights(kServers, 1, 0, pulled.size() * 2), [&](const Status& s, const void* data) {
    ASSERT_TRUE(s.ok());
    std::memcpy(pulled.data(), data, pulled.size() * 2);
  });
  std::vector<float> sum(g0.size());
  for (size_t i = 0; i < sum.size(); ++i) sum[i] = Bf16ToFloat(FloatToBf16(g0[i])) + Bf16ToFloat(FloatToBf16(g1[i]));
  ShardState ref = initial_;
  const ParamRange& r = plan_.shard(1);
  AdamWStep(DecaySegments(layout_, r.begin, r.end), r.begin, ref.weights.data(), sum.data(), ref.m.data(), ref.v.data(),
            1, 1e-3, 1.0, AdamWOptions{});
  for (size_t i = 0; i < sum.size(); ++i) {
    ASSERT_EQ(ref.weights[i], shard_->optimizer().weights()[i]) << i;  // fp32 master weights
    ASSERT_EQ(FloatToBf16(ref.weights[i]), pulled[i]) << i;
  }
}

// One worker on a bf16 wire: its pushes are the sum as they landed (no
// fp32 copy is kept), AdamW widens them as it reads them, and the bf16
// weights served are made in the same pass: the bits of widening first.
TEST_F(ParameterShardTest, Bf16WireOfOneWorkerStepsFromThePushesAsTheyLanded) {
  Build(true, /*workers=*/1);
  EXPECT_EQ(shard_->gradients(), nullptr);
  const auto g0 = Gradient(8);
  ASSERT_TRUE(PushAll(0, g0, 0).ok());
  auto squares = shard_->WaitForGradients();
  ASSERT_TRUE(squares.ok());
  std::vector<float> sum(g0.size());
  for (size_t i = 0; i < sum.size(); ++i) sum[i] = Bf16ToFloat(FloatToBf16(g0[i]));
  EXPECT_NEAR(*squares, SumOfSquares(sum.data(), sum.size()), 1e-12 * *squares);
  shard_->ApplyStep({/*step=*/1, /*lr=*/1e-3, /*grad_scale=*/0.5, /*global_norm=*/2.0, {}});
  std::vector<uint16_t> pulled(plan_.shard(1).size());
  shard_->OnPull(Weights(kServers, 1, 0, pulled.size() * 2), [&](const Status& s, const void* data) {
    ASSERT_TRUE(s.ok());
    std::memcpy(pulled.data(), data, pulled.size() * 2);
  });
  ShardState ref = initial_;
  const ParamRange& r = plan_.shard(1);
  AdamWStep(DecaySegments(layout_, r.begin, r.end), r.begin, ref.weights.data(), sum.data(), ref.m.data(), ref.v.data(),
            1, 1e-3, 0.5, AdamWOptions{});
  ASSERT_EQ(0, std::memcmp(ref.weights.data(), shard_->optimizer().weights(), sum.size() * 4));
  for (size_t i = 0; i < sum.size(); ++i) ASSERT_EQ(FloatToBf16(ref.weights[i]), pulled[i]) << i;
}

// Elastic: any worker may push any share; a share that is in already, or
// of a step that is over, is received and dropped; a copy that failed on
// the way may come again. The sum is the one the shares' own workers give.
TEST_F(ParameterShardTest, ElasticSharesMoveBetweenWorkersAndAreAddedOnce) {
  const size_t n = plan_.shard(1).size();
  const auto g0 = Gradient(5), g1 = Gradient(6), g2 = Gradient(7);
  Build(false, /*workers=*/3);
  ASSERT_TRUE(PushAll(0, g0, 0).ok());
  ASSERT_TRUE(PushAll(1, g1, 0).ok());
  ASSERT_TRUE(PushAll(2, g2, 0).ok());
  ASSERT_TRUE(shard_->WaitForGradients().ok());
  const std::vector<float> reference(shard_->gradients(), shard_->gradients() + n);
  auto message = [](const StatusOr<void*>& s) { return s.ok() ? std::string("ok") : s.status().message(); };
  // Not elastic: a worker pushes its own share only.
  Build(false, 3);
  const Bucket* mine = nullptr;
  for (const Bucket& b : plan_.buckets()) {
    if (b.server == 1) mine = &b;
  }
  const uint64_t off = (mine->range.begin - plan_.shard(1).begin) * 4, len = mine->range.size() * 4;
  EXPECT_NE(message(shard_->PushTarget(Gradients(kServers, 0, off, len, /*share=*/2))).find("not its own"),
            std::string::npos);

  Build(false, 3, /*elastic=*/true);
  EXPECT_NE(message(shard_->PushTarget(Gradients(kServers, 0, off, len, /*share=*/3))).find("beyond"),
            std::string::npos);
  // Share 2's copy of the last bucket fails on its way (its worker died).
  auto lost = shard_->PushTarget(Gradients(kServers + 2, 0, off, len, 2));
  ASSERT_TRUE(lost.ok());
  shard_->OnPushed(Gradients(kServers + 2, 0, off, len, 2), *lost, /*ok=*/false, [](const Status&) {});
  // Worker 0 computes shares 0 and 2; worker 1 pushes share 1 twice.
  ASSERT_TRUE(PushAll(2, g2, 0, /*w=*/0).ok());
  ASSERT_TRUE(PushAll(1, g1, 0).ok());
  ASSERT_TRUE(PushAll(1, std::vector<float>(n, 1e9f), 0).ok());  // dropped: the share is in
  ASSERT_TRUE(PushAll(0, g0, 0).ok());
  ASSERT_TRUE(shard_->WaitForGradients().ok());
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(shard_->gradients()[i], reference[i]) << i;
  shard_->ApplyStep({1, 1e-3, 1.0, 0.5, {}});
  // A share of step 0 after the step: dropped, not an error.
  ASSERT_TRUE(PushAll(2, g2, 0, 1).ok());
  EXPECT_EQ(shard_->optimizer().step(), 1);
  // The next step's sum starts afresh.
  ASSERT_TRUE(PushAll(1, g1, 1).ok());
  ASSERT_TRUE(PushAll(2, g2, 1).ok());
  ASSERT_TRUE(PushAll(0, g0, 1).ok());
  ASSERT_TRUE(shard_->WaitForGradients().ok());
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(shard_->gradients()[i], reference[i]) << i;
}

// Streaming DiLoCo's schedule: fragment f goes after the steps s with
// s mod H = ⌊H(f+1)/F⌋ mod H (torchft's offsets), lands `overlap` steps
// later (never past the last step), the last step sends the whole range;
// each server's fragments tile its range; the settings' bounds refused.
TEST(DilocoPlan, StaggersFragmentsOverTheOuterPeriod) {
  const ParamLayout layout(SmallShape());
  const ShardPlan plan = MakePlan(layout, 2, 2048);
  ASSERT_GE(plan.buckets().size(), 4u);
  config::DilocoConfig d;
  d.set_regions(2);
  d.set_every(10);
  d.set_fragments(4);
  d.set_overlap(1);
  auto made = DilocoPlan::Make(d, plan, /*last_step=*/37);
  ASSERT_TRUE(made.ok()) << made.status().message();
  const DilocoPlan& p = *made;
  std::map<int64_t, int> sent;
  for (int64_t s = 1; s <= 40; ++s) {
    if (auto e = p.SentAfter(s)) {
      sent[s] = e->fragment;
      EXPECT_EQ(e->sent, s);
      EXPECT_EQ(e->lands, s == 37 ? 37 : std::min<int64_t>(s + 1, 37)) << s;
    }
  }
  const std::map<int64_t, int> want = {{2, 0},  {5, 1},  {7, 2},  {10, 3}, {12, 0}, {15, 1}, {17, 2},
                                       {20, 3}, {22, 0}, {25, 1}, {27, 2}, {30, 3}, {32, 0}, {35, 1},
                                       {37, DilocoPlan::kWhole}};
  EXPECT_EQ(sent, want);
  EXPECT_FALSE(p.InFlightAfter(4).has_value());
  ASSERT_TRUE(p.InFlightAfter(5).has_value());
  EXPECT_EQ(p.InFlightAfter(5)->fragment, 1);
  EXPECT_EQ(p.InFlightAfter(5)->lands, 6);
  EXPECT_FALSE(p.InFlightAfter(6).has_value());
  EXPECT_FALSE(p.InFlightAfter(37).has_value()) << "the last step lands everything";
  for (int server = 0; server < 2; ++server) {
    std::vector<ParamRange> runs;
    for (int f = 0; f < 4; ++f) {
      if (p.RunOf(server, f).size() > 0) runs.push_back(p.RunOf(server, f));
    }
    std::sort(runs.begin(), runs.end(), [](const ParamRange& a, const ParamRange& b) { return a.begin < b.begin; });
    int64_t at = 0;
    for (const ParamRange& r : runs) {
      EXPECT_EQ(r.begin, at) << "server " << server;
      at = r.end;
    }
    EXPECT_EQ(at, plan.shard(server).size()) << "server " << server << "'s fragments tile its range";
    EXPECT_EQ(p.RunOf(server, DilocoPlan::kWhole).size(), plan.shard(server).size());
  }
  d.set_overlap(0);
  EXPECT_EQ(DilocoPlan::Make(d, plan, 37)->SentAfter(5)->lands, 5) << "no overlap: lands at once";

  auto refused = [&](int fragments, int every, int overlap, const std::string& says) {
    config::DilocoConfig bad = d;
    bad.set_fragments(fragments);
    bad.set_every(every);
    bad.set_overlap(overlap);
    auto r = DilocoPlan::Make(bad, plan, 37);
    ASSERT_FALSE(r.ok()) << fragments << " " << every << " " << overlap;
    EXPECT_NE(r.status().message().find(says), std::string::npos) << r.status().message();
  };
  refused(static_cast<int>(plan.buckets().size()) + 1, 1000, 0, "buckets");
  refused(4, 3, 0, "cluster.diloco.every");
  refused(4, 10, 2, "cluster.diloco.overlap");
  refused(0, 10, 0, "cluster.diloco.fragments");
}

}  // namespace
}  // namespace herd
