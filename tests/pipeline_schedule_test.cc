// Pipeline schedules, as properties over many shapes: each device runs each
// of its passes once, the backward parts of a chunk in ascending
// micro-batch order; the tables run to the end whatever the passes take;
// activations stay within each schedule's bound; the simulated bubble is
// the one theory gives; bad shapes and broken tables are refused in one
// line that names what is wrong.
#include "sharding/pipeline_schedule.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "common/config.h"
#include "sharding/pipeline_plan.h"
#include "sharding/tensor_slices.h"

namespace herd {
namespace {

using Kind = PipelineScheduleKind;
using Action = PipelineAction;

struct Shape {
  Kind kind;
  int P, v, M;
  std::string Name() const {
    return std::string(PipelineScheduleName(kind)) + " P=" + std::to_string(P) + " v=" + std::to_string(v) +
           " M=" + std::to_string(M);
  }
};

// P in {1, 2, 3, 4, 8}; M from P to 16 (from 1 for GPipe), multiples of P for the interleaved schedule, with
// v in {2, 3}.
std::vector<Shape> Shapes() {
  std::vector<Shape> out;
  for (Kind kind : {Kind::kGPipe, Kind::kOneFOneB, Kind::kInterleaved1F1B, Kind::kZeroBubble}) {
    for (int P : {1, 2, 3, 4, 8}) {
      if (kind == Kind::kInterleaved1F1B) {
        if (P < 2) continue;
        for (int v : {2, 3}) {
          for (int M = P; M <= 16; M += P) out.push_back({kind, P, v, M});
        }
      } else {
        for (int M = kind == Kind::kGPipe ? 1 : P; M <= 16; ++M) out.push_back({kind, P, 1, M});
      }
    }
  }
  return out;
}

// The times each table is meant for: equal parts for ZB-H1, backward = 2 forward otherwise.
PipelineTimes UnitTimes(Kind kind) {
  return kind == Kind::kZeroBubble ? PipelineTimes{1, 1, 1} : PipelineTimes{1, 2, 0};
}

bool Split(Kind kind) { return kind == Kind::kZeroBubble; }

TEST(PipelineScheduleTest, EachDeviceRunsEachOfItsPassesOnce) {
  for (const Shape& shape : Shapes()) {
    SCOPED_TRACE(shape.Name());
    auto s = MakePipelineSchedule(shape.kind, shape.P, shape.v, shape.M);
    ASSERT_TRUE(s.ok()) << s.status().message();
    ASSERT_EQ(s->actions.size(), static_cast<size_t>(shape.P));
    EXPECT_EQ(s->virtual_stages(), shape.P * shape.v);
    for (int p = 0; p < shape.P; ++p) {
      std::map<std::tuple<int, int, int>, int> runs;
      for (const Action& a : s->actions[p]) ++runs[{a.kind, a.chunk, a.micro_batch}];
      const int parts = Split(shape.kind) ? 3 : 2;
      EXPECT_EQ(runs.size(), static_cast<size_t>(parts * shape.v * shape.M)) << "device " << p;
      for (int kind = 0; kind < parts; ++kind) {
        for (int c = 0; c < shape.v; ++c) {
          for (int m = 0; m < shape.M; ++m) {
            EXPECT_EQ((runs[{kind, c, m}]), 1) << "device " << p << " kind " << kind << " chunk " << c << " mb " << m;
          }
        }
      }
    }
  }
}

// Gradients accumulate per micro-batch: ascending order on each device is what makes them equal, bit for bit, to
// one process's.
TEST(PipelineScheduleTest, BackwardPartsOfAChunkRunInAscendingMicroBatchOrder) {
  for (const Shape& shape : Shapes()) {
    SCOPED_TRACE(shape.Name());
    auto s = MakePipelineSchedule(shape.kind, shape.P, shape.v, shape.M);
    ASSERT_TRUE(s.ok()) << s.status().message();
    for (int p = 0; p < shape.P; ++p) {
      std::map<std::pair<int, int>, int> last;  // (kind, chunk) -> micro-batch
      for (const Action& a : s->actions[p]) {
        if (a.kind == Action::kForward) continue;
        auto [it, first] = last.try_emplace({a.kind, a.chunk}, a.micro_batch);
        if (!first) {
          EXPECT_GT(a.micro_batch, it->second) << "device " << p << " kind " << int{a.kind} << " chunk " << a.chunk;
          it->second = a.micro_batch;
        }
      }
    }
  }
}

// A table is one run's order over a fixed dependency graph: no timing can make it deadlock.
TEST(PipelineScheduleTest, RunsToTheEndWhateverThePassesTake) {
  std::mt19937 rng(20240117);
  std::uniform_real_distribution<double> time(0.05, 5.0);
  for (const Shape& shape : Shapes()) {
    SCOPED_TRACE(shape.Name());
    auto s = MakePipelineSchedule(shape.kind, shape.P, shape.v, shape.M);
    ASSERT_TRUE(s.ok()) << s.status().message();
    std::vector<PipelineTimes> draws = {{1, 1, 1}};
    for (int i = 0; i < 4; ++i) draws.push_back({time(rng), time(rng), time(rng)});
    for (const PipelineTimes& t : draws) {
      auto sim = SimulatePipeline(*s, t);
      ASSERT_TRUE(sim.ok()) << sim.status().message() << " with times " << t.forward << ", " << t.backward << ", "
                            << t.weight_grad;
      const double work = shape.v * shape.M * (t.forward + t.backward + t.weight_grad);
      for (int p = 0; p < shape.P; ++p) {
        EXPECT_NEAR(sim->busy[p], work, 1e-9 * work);
        EXPECT_LE(sim->busy[p], sim->makespan * (1 + 1e-12));
      }
    }
  }
}

TEST(PipelineScheduleTest, ActivationsStayWithinEachSchedulesBound) {
  for (const Shape& shape : Shapes()) {
    SCOPED_TRACE(shape.Name());
    auto s = MakePipelineSchedule(shape.kind, shape.P, shape.v, shape.M);
    ASSERT_TRUE(s.ok()) << s.status().message();
    auto sim = SimulatePipeline(*s, UnitTimes(shape.kind));
    ASSERT_TRUE(sim.ok()) << sim.status().message();
    const int P = shape.P, v = shape.v, M = shape.M;
    for (int p = 0; p < P; ++p) {
      SCOPED_TRACE("device " + std::to_string(p));
      switch (shape.kind) {
        case Kind::kGPipe:
          EXPECT_EQ(sim->peak_activations[p], M);
          EXPECT_EQ(sim->peak_in_flight[p], M);
          break;
        case Kind::kOneFOneB:
          EXPECT_EQ(sim->peak_activations[p], std::min(P - p, M));
          EXPECT_EQ(sim->peak_in_flight[p], std::min(P - p, M));
          break;
        case Kind::kInterleaved1F1B: {
          // Megatron's: its warm-up forwards and the first steady-state one.
          const int bound = std::min((P - p - 1) * 2 + (v - 1) * P + 1, v * M);
          EXPECT_EQ(sim->peak_activations[p], bound);
          EXPECT_EQ(sim->peak_in_flight[p], bound);
          break;
        }
        case Kind::kZeroBubble:
          // 1F1B's whole activations; between B and W a micro-batch holds only what W reads, and no device holds
          // anything of more micro-batches than 1F1B's device 0.
          EXPECT_EQ(sim->peak_activations[p], std::min(P - p, M));
          EXPECT_EQ(sim->peak_in_flight[p], P);
          break;
      }
    }
  }
}

TEST(PipelineScheduleTest, IdleShareIsTheOneTheoryGives) {
  for (const Shape& shape : Shapes()) {
    SCOPED_TRACE(shape.Name());
    auto s = MakePipelineSchedule(shape.kind, shape.P, shape.v, shape.M);
    ASSERT_TRUE(s.ok()) << s.status().message();
    const PipelineTimes t = UnitTimes(shape.kind);
    auto sim = SimulatePipeline(*s, t);
    ASSERT_TRUE(sim.ok()) << sim.status().message();
    const double theory = TheoreticalBubble(shape.kind, shape.P, shape.v, shape.M, t);
    for (int p = 0; p < shape.P; ++p) EXPECT_NEAR(sim->idle_share[p], theory, 1e-9) << "device " << p;
    if (shape.P == 1) {
      EXPECT_EQ(theory, 0);
    }
  }
}

// The figures do not hang on the times the tables were drawn for; ZB-H1's holds while W is the lightest part.
TEST(PipelineScheduleTest, IdleShareIsTheOneTheoryGivesForOtherTimes) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> time(0.1, 4.0), share(0.0, 1.0);
  for (const Shape& shape : Shapes()) {
    SCOPED_TRACE(shape.Name());
    auto s = MakePipelineSchedule(shape.kind, shape.P, shape.v, shape.M);
    ASSERT_TRUE(s.ok()) << s.status().message();
    for (int i = 0; i < 3; ++i) {
      PipelineTimes t{time(rng), time(rng), time(rng)};
      if (shape.kind == Kind::kZeroBubble) t.weight_grad = share(rng) * std::min(t.forward, t.backward);
      auto sim = SimulatePipeline(*s, t);
      ASSERT_TRUE(sim.ok()) << sim.status().message();
      const double theory = TheoreticalBubble(shape.kind, shape.P, shape.v, shape.M, t);
      for (int p = 0; p < shape.P; ++p) {
        EXPECT_NEAR(sim->idle_share[p], theory, 1e-9)
            << "device " << p << " times " << t.forward << ", " << t.backward << ", " << t.weight_grad;
      }
    }
  }
}

// Same work, W split out of B: ZB-H1 idles a third of what 1F1B does when the three parts take alike.
TEST(PipelineScheduleTest, ZeroBubbleIdlesLessThanOneFOneB) {
  const PipelineTimes t{1, 1, 1};
  for (int P : {2, 3, 4, 8}) {
    for (int M = P; M <= 16; ++M) {
      SCOPED_TRACE("P=" + std::to_string(P) + " M=" + std::to_string(M));
      auto one_f_one_b = MakePipelineSchedule(Kind::kOneFOneB, P, 1, M);
      auto zero_bubble = MakePipelineSchedule(Kind::kZeroBubble, P, 1, M);
      ASSERT_TRUE(one_f_one_b.ok() && zero_bubble.ok());
      auto a = SimulatePipeline(*one_f_one_b, t);
      auto b = SimulatePipeline(*zero_bubble, t);
      ASSERT_TRUE(a.ok() && b.ok());
      EXPECT_DOUBLE_EQ(a->busy[0], b->busy[0]);
      EXPECT_LT(b->makespan, a->makespan);
      for (int p = 0; p < P; ++p) {
        EXPECT_LT(b->idle_share[p], a->idle_share[p]) << "device " << p;
        EXPECT_DOUBLE_EQ(3 * (b->makespan - b->busy[p]), a->makespan - a->busy[p]) << "device " << p;
      }
    }
  }
}

TEST(PipelineScheduleTest, OneDeviceRunsEachMicroBatchInTurn) {
  auto one_f_one_b = MakePipelineSchedule(Kind::kOneFOneB, 1, 1, 3);
  auto zero_bubble = MakePipelineSchedule(Kind::kZeroBubble, 1, 1, 3);
  auto gpipe = MakePipelineSchedule(Kind::kGPipe, 1, 1, 3);
  ASSERT_TRUE(one_f_one_b.ok() && zero_bubble.ok() && gpipe.ok());
  EXPECT_EQ(RenderPipelineSchedule(*one_f_one_b), "F0 B0 F1 B1 F2 B2\n");
  EXPECT_EQ(RenderPipelineSchedule(*zero_bubble), "F0 B0 W0 F1 B1 W1 F2 B2 W2\n");
  EXPECT_EQ(RenderPipelineSchedule(*gpipe), "F0 F1 F2 B0 B1 B2\n");
}

TEST(PipelineScheduleTest, RendersOneLinePerDevice) {
  auto gpipe = MakePipelineSchedule(Kind::kGPipe, 2, 1, 2);
  ASSERT_TRUE(gpipe.ok());
  EXPECT_EQ(RenderPipelineSchedule(*gpipe),
            "F0 F1 B0 B1\n"
            "F0 F1 B0 B1\n");
  // The chunk after the micro-batch; device 1 starts on chunk 1 after two warm-up forwards.
  auto interleaved = MakePipelineSchedule(Kind::kInterleaved1F1B, 2, 2, 2);
  ASSERT_TRUE(interleaved.ok());
  EXPECT_EQ(RenderPipelineSchedule(*interleaved),
            "F0.0 F1.0 F0.1 F1.1 B0.1 B1.1 B0.0 B1.0\n"
            "F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 B0.0 B1.0\n");
}

TEST(PipelineScheduleTest, RefusesShapesItCannotRun) {
  struct Bad {
    Kind kind;
    int P, v, M;
    std::string message;
  };
  const Bad bad[] = {
      {Kind::kOneFOneB, 4, 1, 2,
       "cluster.pipeline_schedule ONE_F_ONE_B needs train.grad_accum >= cluster.pipeline_stages (got 2 "
       "micro-batches for 4 stages)"},
      {Kind::kZeroBubble, 3, 1, 1,
       "cluster.pipeline_schedule ZERO_BUBBLE needs train.grad_accum >= cluster.pipeline_stages (got 1 micro-batch "
       "for 3 stages)"},
      {Kind::kInterleaved1F1B, 4, 2, 6,
       "cluster.pipeline_schedule INTERLEAVED_1F1B needs train.grad_accum to be a multiple of "
       "cluster.pipeline_stages (got 6 micro-batches for 4 stages)"},
      {Kind::kInterleaved1F1B, 4, 2, 2,
       "cluster.pipeline_schedule INTERLEAVED_1F1B needs train.grad_accum to be a multiple of "
       "cluster.pipeline_stages (got 2 micro-batches for 4 stages)"},
      {Kind::kInterleaved1F1B, 4, 1, 8,
       "cluster.pipeline_schedule INTERLEAVED_1F1B needs cluster.virtual_stages >= 2 (got 1)"},
      {Kind::kInterleaved1F1B, 1, 2, 4,
       "cluster.pipeline_schedule INTERLEAVED_1F1B needs cluster.pipeline_stages >= 2 (got 1)"},
      {Kind::kGPipe, 2, 2, 4, "cluster.virtual_stages 2 needs cluster.pipeline_schedule INTERLEAVED_1F1B (got GPIPE)"},
      {Kind::kOneFOneB, 2, 3, 4,
       "cluster.virtual_stages 3 needs cluster.pipeline_schedule INTERLEAVED_1F1B (got ONE_F_ONE_B)"},
      {Kind::kZeroBubble, 2, 2, 4,
       "cluster.virtual_stages 2 needs cluster.pipeline_schedule INTERLEAVED_1F1B (got ZERO_BUBBLE)"},
      {Kind::kGPipe, 0, 1, 4, "cluster.pipeline_stages must be >= 1 (got 0)"},
      {Kind::kOneFOneB, -2, 1, 4, "cluster.pipeline_stages must be >= 1 (got -2)"},
      {Kind::kGPipe, 2, 1, 0, "train.grad_accum must be >= 1 (got 0)"},
      {Kind::kInterleaved1F1B, 2, 2, 0, "train.grad_accum must be >= 1 (got 0)"},
      {Kind::kGPipe, 2, 0, 2, "cluster.virtual_stages must be >= 1 (got 0)"},
  };
  for (const Bad& b : bad) {
    auto s = MakePipelineSchedule(b.kind, b.P, b.v, b.M);
    ASSERT_FALSE(s.ok()) << b.message;
    EXPECT_EQ(s.status().code(), Status::Code::kInvalidArgument) << b.message;
    EXPECT_EQ(s.status().message(), b.message);
    EXPECT_EQ(s.status().message().find('\n'), std::string::npos);
  }
}

// A 1F1B table for P = 2, M = 2 to break: device 0 "F0 F1 B0 B1", device 1 "F0 B0 F1 B1".
PipelineSchedule TwoByTwo() {
  auto s = MakePipelineSchedule(Kind::kOneFOneB, 2, 1, 2);
  EXPECT_TRUE(s.ok());
  return *std::move(s);
}

TEST(PipelineScheduleTest, SimulatorRefusesBrokenTables) {
  auto refused = [](const PipelineSchedule& s) {
    auto sim = SimulatePipeline(s, {});
    EXPECT_FALSE(sim.ok());
    EXPECT_EQ(sim.status().code(), Status::Code::kFailedPrecondition);
    return sim.status().message();
  };
  ASSERT_TRUE(SimulatePipeline(TwoByTwo(), {}).ok());

  PipelineSchedule s = TwoByTwo();  // device 0 waits for B0, which device 1 runs after F1, which device 0 owes
  s.actions[0] = {Action{Action::kForward, 0, 0}, Action{Action::kBackward, 0, 0}, Action{Action::kForward, 0, 1},
                  Action{Action::kBackward, 0, 1}};
  s.actions[1] = {Action{Action::kForward, 0, 0}, Action{Action::kForward, 0, 1}, Action{Action::kBackward, 0, 0},
                  Action{Action::kBackward, 0, 1}};
  EXPECT_EQ(refused(s), "pipeline schedule ONE_F_ONE_B deadlocks: device 0 waits at B0, device 1 waits at F1");

  s = TwoByTwo();  // a backward before its own forward
  std::swap(s.actions[1][0], s.actions[1][1]);
  EXPECT_EQ(refused(s), "pipeline schedule ONE_F_ONE_B deadlocks: device 0 waits at B0, device 1 waits at B0");

  s = TwoByTwo();
  s.actions[0][1] = Action{Action::kForward, 0, 0};
  EXPECT_EQ(refused(s), "pipeline schedule ONE_F_ONE_B: device 0 F0 runs twice");

  s = TwoByTwo();
  s.actions[1].pop_back();
  EXPECT_EQ(refused(s), "pipeline schedule ONE_F_ONE_B: device 1 B1 never runs");

  s = TwoByTwo();
  s.actions[0].push_back(Action{Action::kWeightGrad, 0, 1});
  EXPECT_EQ(refused(s), "pipeline schedule ONE_F_ONE_B: device 0 W1 is not an action of this schedule");

  s = TwoByTwo();
  s.actions[1][3].micro_batch = 2;
  EXPECT_EQ(refused(s), "pipeline schedule ONE_F_ONE_B: device 1 B2 is not an action of this schedule");

  s = TwoByTwo();
  s.actions.pop_back();
  EXPECT_EQ(refused(s), "pipeline schedule ONE_F_ONE_B: 1 list for 2 devices");

  auto negative = SimulatePipeline(TwoByTwo(), {1, -1, 0});
  EXPECT_EQ(negative.status().code(), Status::Code::kInvalidArgument);
}

TEST(PipelineScheduleTest, VirtualStagesInterleaveAcrossDevices) {
  auto s = MakePipelineSchedule(Kind::kInterleaved1F1B, 4, 3, 8);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->VirtualStage(0, 0), 0);
  EXPECT_EQ(s->VirtualStage(3, 0), 3);
  EXPECT_EQ(s->VirtualStage(0, 1), 4);
  EXPECT_EQ(s->VirtualStage(1, 2), 9);
  for (int vs = 0; vs < s->virtual_stages(); ++vs) {
    EXPECT_EQ(s->VirtualStage(s->DeviceOf(vs), s->ChunkOf(vs)), vs);
  }
}

TEST(PipelineScheduleTest, NamesAreTheConfigs) {
  for (Kind kind : {Kind::kGPipe, Kind::kOneFOneB, Kind::kInterleaved1F1B, Kind::kZeroBubble}) {
    auto parsed = ParsePipelineScheduleKind(PipelineScheduleName(kind));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, kind);
  }
  EXPECT_STREQ(PipelineScheduleName(Kind::kOneFOneB), "ONE_F_ONE_B");
  auto bad = ParsePipelineScheduleKind("1F1B");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), Status::Code::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("cluster.pipeline_schedule"), std::string::npos);
}

// The grid data x pipeline x tensor: ranks are stage-major with the
// tensor group innermost, rank = (stage·R + replica)·T + tensor, the
// layout pipeline jobs have always had (sharding/grid.h holds it).
TEST(PipelinePlan, RanksAreStageMajorWithTheTensorGroupInnermost) {
  auto config = ParseJobConfig(
      "model { vocab_size: 256 hidden_size: 64 intermediate_size: 160 num_hidden_layers: 4 num_attention_heads: 4 "
      "num_key_value_heads: 2 } train { batch_size: 2 grad_accum: 2 seq_len: 32 } "
      "cluster { sync: ALLREDUCE workers: 12 pipeline_stages: 2 tensor_parallel: 2 }",
      "grid");
  ASSERT_TRUE(config.ok()) << config.status().message();
  auto plan = PipelinePlan::FromConfig(*config);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  const Grid& grid = plan->grid;
  EXPECT_EQ(grid.data(), 3);
  EXPECT_EQ(grid.degree(Axis::kTensor), 2);
  for (int rank = 0; rank < 12; ++rank) {
    const GridCoords g = grid.CoordsOf(rank);
    EXPECT_EQ(g[Axis::kTensor], rank % 2);
    EXPECT_EQ(grid.ReplicaOf(rank), rank / 2 % 3);
    EXPECT_EQ(g[Axis::kPipeline], rank / 2 / 3);
  }
  // The split is of a rank's packed model: its ranges tile that space.
  auto slices = TensorSlices::Make(LlamaShape::FromConfig(config->model()), 2, 0);
  ASSERT_TRUE(slices.ok());
  EXPECT_EQ(plan->split.stage(plan->split.size() - 1).params.end, slices->layout().size());
}

}  // namespace
}  // namespace herd
