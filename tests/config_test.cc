#include <gtest/gtest.h>

#include <dirent.h>

#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "common/config.h"
#include "common/strings.h"
#include "model/param_layout.h"
#include "sharding/memory_plan.h"
#include "sharding/traffic_plan.h"

namespace herd {
namespace {

// What a byte-level model samples is printed as valid UTF-8, whatever the
// bytes: well-formed text unchanged, everything else one U+FFFD per byte.
TEST(StringsTest, PrintableUtf8KeepsTextAndReplacesTheRest) {
  const std::string ok = "plain, tab\tnewline\n, caf\xC3\xA9, \xE2\x82\xAC, \xF0\x9F\x98\x80";
  EXPECT_EQ(PrintableUtf8(ok), ok);
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(PrintableUtf8(std::string("a\0b", 3)), "a" + r + "b");          // NUL
  EXPECT_EQ(PrintableUtf8("\x1B[31m"), r + "[31m");                         // ESC
  EXPECT_EQ(PrintableUtf8("\xC3"), r);                                      // cut short
  EXPECT_EQ(PrintableUtf8("\xC0\xAF"), r + r);                              // overlong
  EXPECT_EQ(PrintableUtf8("\xED\xA0\x80"), r + r + r);                      // surrogate
  EXPECT_EQ(PrintableUtf8("\xF4\x90\x80\x80"), r + r + r + r);              // above U+10FFFF
  EXPECT_EQ(PrintableUtf8("\xFFok\x80"), r + "ok" + r);
  // Every byte string comes out as UTF-8 that Python, say, decodes.
  std::string all;
  for (int i = 0; i < 256; ++i) all.push_back(static_cast<char>(i));
  const std::string out = PrintableUtf8(all + all);
  EXPECT_EQ(PrintableUtf8(out), out) << "the output is not itself well-formed";
}

TEST(ConfigTest, DefaultsAreValid) {
  auto c = ParseJobConfig("", "empty");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->model().vocab_size(), 256);
}

TEST(ConfigTest, UnknownFieldNamesFileLineColumn) {
  auto c = ParseJobConfig("train {\n  stpes: 3\n}\n", "job.textproto");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("job.textproto:2:"), std::string::npos) << c.status().message();
  EXPECT_NE(c.status().message().find("stpes"), std::string::npos) << c.status().message();
}

TEST(ConfigTest, WrongTypeNamesFileLineColumn) {
  auto c = ParseJobConfig("train { steps: \"many\" }\n", "job.textproto");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("job.textproto:1:"), std::string::npos) << c.status().message();
}

TEST(ConfigTest, HeadsNotDivisibleByKvHeadsPointsAtField) {
  auto c = ParseJobConfig("model {\n  hidden_size: 96\n  num_attention_heads: 6\n  num_key_value_heads: 4\n}\n",
                          "job.textproto");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("job.textproto:4:3"), std::string::npos) << c.status().message();
  EXPECT_NE(c.status().message().find("divisible"), std::string::npos) << c.status().message();
}

TEST(ConfigTest, OverrideSetsNestedFields) {
  auto c = ParseJobConfig("", "empty", {"train.steps=42", "cluster.sync=ALLREDUCE", "cluster.workers=2",
                                        "data.train=x.bin", "optimizer.lr=0.01", "model.tie_word_embeddings=false"});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->train().steps(), 42);
  EXPECT_EQ(c->cluster().sync(), config::ClusterConfig::ALLREDUCE);
  EXPECT_EQ(c->data().train(), "x.bin");
  EXPECT_DOUBLE_EQ(c->optimizer().lr(), 0.01);
  EXPECT_FALSE(c->model().tie_word_embeddings());
}

TEST(ConfigTest, OverrideErrorsNameTheAssignment) {
  auto typo = ParseJobConfig("", "empty", {"train.stpes=3"});
  ASSERT_FALSE(typo.ok());
  EXPECT_NE(typo.status().message().find("--set train.stpes=3"), std::string::npos);
  EXPECT_NE(typo.status().message().find("did you mean 'steps'"), std::string::npos) << typo.status().message();
  auto type = ParseJobConfig("", "empty", {"train.steps=abc"});
  ASSERT_FALSE(type.ok());
  EXPECT_NE(type.status().message().find("expected int64"), std::string::npos) << type.status().message();
  auto value = ParseJobConfig("", "empty", {"model.num_key_value_heads=3"});
  ASSERT_FALSE(value.ok());
  EXPECT_NE(value.status().message().find("--set model.num_key_value_heads=3"), std::string::npos)
      << value.status().message();
}

TEST(ConfigTest, EveryShippedConfigLoadsAndPlans) {
  const std::string dir = std::string(HERD_SOURCE_DIR) + "/configs";
  DIR* d = ::opendir(dir.c_str());
  ASSERT_NE(d, nullptr) << dir;
  int n = 0;
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (!name.ends_with(".textproto")) continue;
    auto c = LoadJobConfig(dir + "/" + name, {});
    ASSERT_TRUE(c.ok()) << c.status().message();
    auto plan = PlanMemory(*c);
    ASSERT_TRUE(plan.ok()) << name << ": " << plan.status().message();
    ++n;
  }
  ::closedir(d);
  EXPECT_GE(n, 4);
}

// A setting that has no effect in the mode it is given in is refused in one
// line naming it; the same value where it acts is taken.
TEST(ConfigTest, SettingsWithoutEffectInTheirModeAreRefused) {
  using Sets = std::vector<std::string>;
  const Sets ar2 = {"cluster.sync=ALLREDUCE", "cluster.workers=2"};
  auto with = [](Sets a, const Sets& b) { return a.insert(a.end(), b.begin(), b.end()), a; };
  const Sets pipeline = with(ar2, {"cluster.pipeline_stages=2"});
  const Sets regions = {"cluster.sync=PARAMETER_SERVER", "cluster.servers=2", "cluster.workers=2",
                        "cluster.diloco.regions=2"};
  const struct {
    std::string setting;
    Sets where_it_acts;
  } cases[] = {
      {"cluster.virtual_stages=2", with(pipeline, {"cluster.pipeline_schedule=INTERLEAVED_1F1B", "train.grad_accum=2"})},
      {"cluster.pipeline_schedule=GPIPE", pipeline},
      {"cluster.pipeline_split=0,2", pipeline},
      {"cluster.pipeline_wire_dtype=BF16", pipeline},
      {"cluster.sequence_parallel=true", with(ar2, {"cluster.tensor_parallel=2"})},
      {"cluster.shard_group_size=2", with(ar2, {"cluster.zero_stage=1"})},
      {"cluster.reshard_after_forward=false", with(ar2, {"cluster.zero_stage=3"})},
      {"cluster.wire_dtype=BF16", {"cluster.sync=PARAMETER_SERVER", "cluster.servers=1"}},
      {"cluster.shard_strategy=PER_TENSOR", {"cluster.sync=PARAMETER_SERVER", "cluster.servers=1"}},
      {"cluster.nccl=false", with(ar2, {"device.kind=CUDA"})},
      {"optimizer.skip_spikes_window=16", {"optimizer.skip_spikes_zscore=3"}},
      {"cluster.diloco.every=10", regions},
      {"cluster.diloco.outer_lr=1", regions},
      {"cluster.diloco.outer_momentum=0.5", regions},
      {"cluster.diloco.wire_dtype=BF16", regions},
      {"cluster.diloco.fragments=2", regions},
      {"cluster.diloco.overlap=1", regions},
  };
  for (const auto& c : cases) {
    const std::string field = c.setting.substr(0, c.setting.find('='));
    auto idle = ParseJobConfig("", "job.textproto", {c.setting});
    ASSERT_FALSE(idle.ok()) << c.setting << " was taken where it does nothing";
    const std::string& said = idle.status().message();
    EXPECT_EQ(said.find('\n'), std::string::npos) << said;
    EXPECT_EQ(said.rfind("--set " + c.setting + ": " + field + ": ", 0), 0u) << said;
    auto acting = ParseJobConfig("", "job.textproto", with(c.where_it_acts, {c.setting}));
    EXPECT_TRUE(acting.ok()) << c.setting << ": " << acting.status().message();
  }
}

// The one table of what is not built yet: each row's example job is
// refused in one line naming the row's setting with its reason (and no
// other line first: the example has nothing else wrong), and no two rows
// name the same pair.
TEST(ConfigTest, EveryRowOfWhatIsNotBuiltIsRefusedInOneLine) {
  const std::string tiny =
      "model { vocab_size: 256 hidden_size: 64 intermediate_size: 160 num_hidden_layers: 4 num_attention_heads: 4 "
      "num_key_value_heads: 2 } train { batch_size: 2 grad_accum: 2 seq_len: 32 } ";
  std::set<std::pair<std::string, std::string>> pairs;
  ASSERT_FALSE(NotBuiltTable().empty());
  for (const NotBuilt& row : NotBuiltTable()) {
    EXPECT_TRUE(pairs.insert({row.setting, row.with}).second) << row.setting << " with " << row.with << " twice";
    auto c = ParseJobConfig(tiny + row.example, "job.textproto");
    ASSERT_FALSE(c.ok()) << row.example << " was taken, yet the table says it is not built";
    const std::string& said = c.status().message();
    EXPECT_EQ(said.find('\n'), std::string::npos) << said;
    EXPECT_NE(said.find(std::string(row.setting) + ": " + row.reason), std::string::npos)
        << row.example << " was refused for something else: " << said;
  }
}

// Unset, DiLoCo's outer step fits the period: DiLoCo's lr 0.7 and momentum
// 0.9 from H = 100 (where it was tuned), the mean (lr 1, momentum 0) below;
// set, it is kept as given. The checkpoint's record and the run header say
// the same.
TEST(ConfigTest, OuterStepDefaultFitsThePeriod) {
  auto outer = [](const std::vector<std::string>& more) {
    std::vector<std::string> sets = {"cluster.sync=PARAMETER_SERVER", "cluster.servers=2", "cluster.workers=2",
                                     "cluster.diloco.regions=2"};
    sets.insert(sets.end(), more.begin(), more.end());
    auto c = ParseJobConfig("", "t", sets);
    if (!c.ok()) ADD_FAILURE() << c.status().message();
    if (!c.ok()) return std::tuple(0.0, 0.0, std::string(), std::string());
    const OuterStep step = OuterStepOf(c->cluster().diloco());
    return std::tuple(step.lr, step.momentum, step.Describe(c->cluster().diloco().every()), ConfigToText(*c));
  };
  auto [lr, momentum, said, text] = outer({"cluster.diloco.every=10"});
  EXPECT_EQ(lr, 1.0);
  EXPECT_EQ(momentum, 0.0);
  EXPECT_EQ(said, "lr 1, momentum 0 (the default for every 10 < 100)");
  EXPECT_NE(text.find("outer_lr: 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("outer_momentum: 0\n"), std::string::npos) << text;
  std::tie(lr, momentum, said, text) = outer({"cluster.diloco.every=500"});
  EXPECT_EQ(lr, 0.7);
  EXPECT_EQ(momentum, 0.9);
  EXPECT_EQ(said, "lr 0.7, momentum 0.9 (the default for every 500 >= 100)");
  EXPECT_NE(text.find("outer_lr: 0.7\n"), std::string::npos) << text;
  std::tie(lr, momentum, said, text) =
      outer({"cluster.diloco.every=10", "cluster.diloco.outer_lr=0.7", "cluster.diloco.outer_momentum=0.9"});
  EXPECT_EQ(lr, 0.7);
  EXPECT_EQ(momentum, 0.9);
  EXPECT_EQ(said, "lr 0.7, momentum 0.9 (as given)");
  std::tie(lr, momentum, said, text) =
      outer({"cluster.diloco.every=500", "cluster.diloco.outer_lr=1", "cluster.diloco.outer_momentum=0"});
  EXPECT_EQ(lr, 1.0);
  EXPECT_EQ(momentum, 0.0);
  std::tie(lr, momentum, said, text) = outer({"cluster.diloco.every=10", "cluster.diloco.outer_lr=0.5"});
  EXPECT_EQ(lr, 0.5);
  EXPECT_EQ(momentum, 0.0);
  EXPECT_EQ(said, "lr 0.5, momentum 0 (lr as given, momentum the default for every 10 < 100)");
  // A checkpoint's record, read back, is taken as it was written.
  auto reread = ParseJobConfig(std::get<3>(outer({"cluster.diloco.every=10"})), "config.textproto");
  ASSERT_TRUE(reread.ok()) << reread.status().message();
  EXPECT_EQ(OuterStepOf(reread->cluster().diloco()).lr, 1.0);
  auto plain = ParseJobConfig(ConfigToText(*ParseJobConfig("", "t")), "config.textproto");
  EXPECT_TRUE(plain.ok()) << plain.status().message();
}

// Counts and products are checked against their bounds before anything is
// built from them: a pipeline's stages x virtual stages against the layers,
// its passes against the schedule's bound.
TEST(ConfigTest, CountsAreBoundedBeforeUse) {
  const std::vector<std::string> pipeline = {"cluster.sync=ALLREDUCE", "cluster.workers=2", "cluster.pipeline_stages=2"};
  auto refused = [&](std::vector<std::string> more, const std::string& needle) {
    more.insert(more.begin(), pipeline.begin(), pipeline.end());
    auto c = ParseJobConfig("", "t", more);
    ASSERT_FALSE(c.ok()) << needle;
    EXPECT_NE(c.status().message().find(needle), std::string::npos) << c.status().message();
  };
  refused({"cluster.pipeline_schedule=INTERLEAVED_1F1B", "cluster.virtual_stages=2147483647", "train.grad_accum=2"},
          "cluster.virtual_stages: cluster.pipeline_stages 2 x cluster.virtual_stages 2147483647 = 4294967294 stages");
  refused({"cluster.pipeline_schedule=INTERLEAVED_1F1B", "cluster.virtual_stages=4", "train.grad_accum=65536",
           "model.num_hidden_layers=8"},
          "train.grad_accum: 8 pipeline stages (virtual ones included) x 65536 micro-batches is more than the 262144");
  auto c = ParseJobConfig("", "t", {"cluster.sync=ALLREDUCE", "cluster.workers=16384", "cluster.pipeline_stages=65536",
                                    "cluster.tensor_parallel=65536"});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("cluster.pipeline_stages: 65536 does not divide"), std::string::npos)
      << c.status().message();
}

// What a worker's link carries per step, by mode: the ring's (n-1)/n a
// pass, ZeRO-3's gathers as the window makes them (one a step when units
// stay from forward to backward), hybrid sharding's group and replica
// rings, parameter servers' pushes and pulls.
TEST(TrafficPlan, EachModeMovesWhatItsPolicySays) {
  auto traffic = [](const std::string& cluster) {
    auto c = ParseJobConfig("model { num_hidden_layers: 4 } cluster { bucket_mb: 0.05 " + cluster + " }", "t");
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    auto t = PlanWorkerTraffic(*c);
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    return std::pair<double, double>(t->sent, t->received);
  };
  auto c = ParseJobConfig("model { num_hidden_layers: 4 }", "t");
  ASSERT_TRUE(c.ok());
  const double M = ParamLayout(LlamaShape::FromConfig(c->model())).size() * 4.0;
  auto near = [&](double got, double want) { EXPECT_NEAR(got, want, 2.0) << "of " << want; };
  near(traffic("sync: ALLREDUCE workers: 4").first, 2 * 0.75 * M);
  near(traffic("sync: ALLREDUCE workers: 4 wire_dtype: BF16").first, 0.75 * M);
  near(traffic("sync: ALLREDUCE workers: 4 zero_stage: 2").second, 2 * 0.75 * M);
  near(traffic("sync: ALLREDUCE workers: 4 zero_stage: 2 wire_dtype: BF16").second, 0.75 * M * 1.5);
  near(traffic("sync: ALLREDUCE workers: 4 zero_stage: 3 reshard_after_forward: false").first, 2 * 0.75 * M);
  const double z3 = traffic("sync: ALLREDUCE workers: 4 zero_stage: 3").first;
  EXPECT_GT(z3, 2.5 * 0.75 * M);  // gathered again for backward but what is held at the turn
  EXPECT_LT(z3, 3 * 0.75 * M);
  // Groups of 2: a pass in the group, then the slices (M/2) all-reduced
  // between the 2 replicas.
  near(traffic("sync: ALLREDUCE workers: 4 zero_stage: 1 shard_group_size: 2").first, 0.5 * M * 2 + 2 * 0.5 * M / 2);
  near(traffic("sync: PARAMETER_SERVER servers: 2 workers: 4").second, M);
  const auto streamed = traffic("sync: PARAMETER_SERVER servers: 2 workers: 4 stream_weights: true");
  near(streamed.first, M);
  EXPECT_GT(streamed.second, 1.5 * M);
  EXPECT_LT(streamed.second, 2 * M);
  EXPECT_EQ(traffic("sync: ALLREDUCE workers: 1").first, 0);
}

}  // namespace
}  // namespace herd
