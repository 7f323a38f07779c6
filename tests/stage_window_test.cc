// Streamed weights inside pipeline stages, without the network: each
// stage's worker computes on weights held in a guarded PagedBuffer that a
// WeightWindow over the stage's ranges fills and empties from the stage
// passes' own hooks, the devices' actions taken from the schedule's
// tables in an order their dependencies allow, as a stage's worker over
// parameter servers does. Reading a weight outside the window would
// fault; the losses and the gradients pushed are bitwise the same as the
// stages' with every weight at hand (and, untied, as one whole model's);
// each stage pushes its own buckets once, highest first; the weights each
// window held at its fullest, and what it pulled, are what
// ReplayStreamedStage (the memory plan) counts, and less than the stage's
// whole range.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "common/paged_buffer.h"
#include "model/llama.h"
#include "model/param_layout.h"
#include "sharding/pipeline_plan.h"
#include "sharding/pipeline_schedule.h"
#include "sharding/pipeline_split.h"
#include "sharding/shard_plan.h"
#include "sharding/weight_window.h"

namespace herd {
namespace {

LlamaShape Shape(int layers, bool tied) {
  LlamaShape s;
  s.vocab_size = 97;
  s.hidden_size = 64;
  s.intermediate_size = 128;
  s.num_layers = layers;
  s.num_heads = 4;
  s.num_kv_heads = 2;
  s.tie_word_embeddings = tied;
  return s;
}

constexpr int B = 2, T = 12, M = 4;

std::vector<int32_t> Tokens(const LlamaShape& s, int micro, int salt) {
  std::vector<int32_t> t(B * T);
  for (int i = 0; i < B * T; ++i) t[i] = (i * 31 + micro * 7 + salt) % s.vocab_size;
  return t;
}

struct Case {
  PipelineScheduleKind kind;
  int devices, chunks, layers;
  bool tied;
};

struct Outcome {
  std::vector<double> losses;  // per micro-batch
  std::vector<float> grads;    // the step's, stage parts summed (a tied embedding's last stage first)
  std::vector<int64_t> peak_weights, pulled;  // [device]: bytes held at most, elements pulled
  std::vector<std::vector<int>> pushed;       // [device]: window bucket indices in push order
};

// One stage's worker: its chunks' models, and with `streamed` its window
// and paged spaces (else the whole weights and gradients).
struct StageWorker {
  std::vector<std::unique_ptr<LlamaModel<float>>> chunks;
  std::vector<ParamRange> ranges;
  std::unique_ptr<WeightWindow> window;
  PagedBuffer paged_weights, paged_grads;
  std::vector<float> weights, grads;  // not streamed
  std::vector<float> pushed;          // the flat space: what reached the "servers"
  std::vector<bool> in_flight;
  std::vector<int> push_order;
  int64_t held = 0, peak = 0, pulled = 0;

  float* w() { return window ? reinterpret_cast<float*>(paged_weights.data()) : weights.data(); }
  float* g() { return window ? reinterpret_cast<float*>(paged_grads.data()) : grads.data(); }
};

Outcome RunStages(const Case& c, int64_t bucket_elements, int prefetch, bool streamed) {
  const LlamaShape shape = Shape(c.layers, c.tied);
  const ParamLayout layout(shape);
  const int64_t P = layout.size();
  auto split = PipelineSplit::Make(shape, c.devices * c.chunks, "", T);
  auto schedule = MakePipelineSchedule(c.kind, c.devices, c.chunks, M);
  EXPECT_TRUE(split.ok() && schedule.ok());
  const PipelinePlan pipeline{*split, *schedule, Grid()};
  const PipelineSchedule& s = pipeline.schedule;
  ShardPlanOptions po;
  po.servers = 2;
  po.bucket_elements = bucket_elements;
  po.bucket_cuts = pipeline.BucketCuts(layout);
  auto plan = ShardPlan::Create(layout, po);
  EXPECT_TRUE(plan.ok());
  std::vector<float> servers(P);
  InitParameters(layout, 5, 0.05, servers.data());

  const bool split_backward = s.kind == PipelineScheduleKind::kZeroBubble;
  std::vector<StageWorker> dev(s.devices);
  for (int d = 0; d < s.devices; ++d) {
    StageWorker& k = dev[d];
    const std::vector<int> slots = ChunkSlots(s, d);
    for (int ch = 0; ch < s.chunks; ++ch) {
      k.chunks.push_back(std::make_unique<LlamaModel<float>>(shape, B, T, Recompute::kNone, slots[ch],
                                                             pipeline.split.stage(s.VirtualStage(d, ch)).layers,
                                                             split_backward));
    }
    k.ranges = pipeline.RangesOf(d, layout);
    k.pushed.assign(P, 0.0f);
    if (streamed) {
      k.window = std::make_unique<WeightWindow>(*plan, layout, prefetch, false, k.ranges);
      auto weights = PagedBuffer::Reserve(P * sizeof(float), /*guarded=*/true);
      auto grads = PagedBuffer::Reserve(P * sizeof(float), /*guarded=*/false);
      EXPECT_TRUE(weights.ok() && grads.ok());
      k.paged_weights = std::move(*weights);
      k.paged_grads = std::move(*grads);
      k.in_flight.assign(k.window->num_buckets(), false);
    } else {
      k.weights = servers;
      k.grads.assign(P, 0.0f);
    }
  }
  // The window's actions on device d: a pull copies from the "servers",
  // a push copies to them.
  auto apply = [&](int d, const WeightWindow::Actions& a) {
    StageWorker& k = dev[d];
    const WeightWindow& win = *k.window;
    for (int i : a.release) {
      const ParamRange& x = win.bucket(i).range;
      k.paged_weights.Release(x.begin * sizeof(float), x.size() * sizeof(float));
      k.held -= x.size() * sizeof(float);
    }
    for (int i : a.pull) {
      const ParamRange& x = win.bucket(i).range;
      k.paged_weights.Admit(x.begin * sizeof(float), x.size() * sizeof(float));
      std::memcpy(k.w() + x.begin, servers.data() + x.begin, x.size() * sizeof(float));
      k.held += x.size() * sizeof(float);
      k.pulled += x.size();
    }
    k.peak = std::max(k.peak, k.held);
    for (int i : a.wait) EXPECT_TRUE(win.held(i)) << "device " << d << " waits for bucket " << i << ", not held";
    for (int i : a.push) {
      const ParamRange& x = win.bucket(i).range;
      EXPECT_FALSE(k.in_flight[i]);
      k.in_flight[i] = true;
      std::memcpy(k.pushed.data() + x.begin, k.g() + x.begin, x.size() * sizeof(float));
      k.push_order.push_back(i);
    }
    for (int i : a.retire) {
      const ParamRange& x = win.bucket(i).range;
      EXPECT_TRUE(k.in_flight[i]);
      k.in_flight[i] = false;
      k.paged_grads.Release(x.begin * sizeof(float), x.size() * sizeof(float));
    }
  };

  std::vector<std::vector<int32_t>> x(M), y(M);
  for (int m = 0; m < M; ++m) x[m] = Tokens(shape, m, 0), y[m] = Tokens(shape, m, 5);
  const int V = s.virtual_stages();
  // [virtual stage][micro-batch]: what arrived for it (activations from
  // below, gradients from above), and whether its passes ran.
  std::vector<std::vector<std::vector<float>>> acts(V, std::vector<std::vector<float>>(M)), dgrads = acts;
  std::vector<std::vector<bool>> forward_done(V, std::vector<bool>(M)), backward_done = forward_done;
  Outcome out;
  out.losses.assign(M, 0.0);
  const double scale = 1.0 / (B * T * M);
  auto take = [&](int d, const PipelineAction& a) {
    StageWorker& k = dev[d];
    LlamaModel<float>& model = *k.chunks[a.chunk];
    const int vs = s.VirtualStage(d, a.chunk), m = a.micro_batch, slot = m % model.slots();
    const bool last = m == M - 1;
    const int64_t n = static_cast<int64_t>(B) * T * shape.hidden_size;
    LlamaModel<float>::NeedUpTo need;
    LlamaModel<float>::NeedFrom need_from;
    LlamaModel<float>::FinalFrom done, finals, done_and_finals;
    if (k.window) {
      need = [&, d](int64_t end) { apply(d, dev[d].window->NeedUpTo(end)); };
      need_from = [&, d](int64_t begin) { apply(d, dev[d].window->NeedFrom(begin)); };
      done = [&, d](int64_t o) { apply(d, dev[d].window->DoneFrom(o)); };
      finals = [&, d](int64_t o) { apply(d, dev[d].window->FinalFrom(o)); };
      done_and_finals = [&, d](int64_t o) {
        apply(d, dev[d].window->FinalFrom(o));
        apply(d, dev[d].window->DoneFrom(o));
      };
    }
    if (a.kind == PipelineAction::kForward) {
      const float* input = nullptr;
      if (vs > 0) {
        std::copy(acts[vs][m].begin(), acts[vs][m].end(), model.StageInput(slot));
        input = model.StageInput(slot);
      }
      const double loss = model.StageForward(slot, k.w(), x[m].data(), y[m].data(), input, B, T, k.g(), scale, need);
      if (vs == V - 1) out.losses[m] = loss;
      if (vs < V - 1) acts[vs + 1][m].assign(model.StageOutput(slot), model.StageOutput(slot) + n);
      forward_done[vs][m] = true;
    } else if (a.kind == PipelineAction::kBackward) {
      const float* output_grad = nullptr;
      if (vs < V - 1) {
        std::copy(dgrads[vs][m].begin(), dgrads[vs][m].end(), model.StageOutputGrad(slot));
        output_grad = model.StageOutputGrad(slot);
      }
      if (split_backward) {
        model.StageBackwardInput(slot, k.w(), k.g(), output_grad, done, need_from);
      } else {
        model.StageBackward(slot, k.w(), k.g(), output_grad, last ? done_and_finals : done, need_from);
      }
      if (vs > 0) dgrads[vs - 1][m].assign(model.StageInputGrad(slot), model.StageInputGrad(slot) + n);
      backward_done[vs][m] = true;
    } else {
      model.StageBackwardWeights(slot, k.g(), last ? finals : nullptr);
    }
  };
  // Each device's list in order, an action once what it waits for is done.
  std::vector<size_t> next(s.devices, 0);
  for (bool moved = true; moved;) {
    moved = false;
    for (int d = 0; d < s.devices; ++d) {
      if (next[d] == s.actions[d].size()) continue;
      const PipelineAction& a = s.actions[d][next[d]];
      const int vs = s.VirtualStage(d, a.chunk), m = a.micro_batch;
      const bool ready = a.kind == PipelineAction::kForward    ? vs == 0 || forward_done[vs - 1][m]
                         : a.kind == PipelineAction::kBackward ? vs == V - 1 || backward_done[vs + 1][m]
                                                                : true;
      if (!ready) continue;
      take(d, a);
      ++next[d];
      moved = true;
    }
  }
  for (int d = 0; d < s.devices; ++d) EXPECT_EQ(next[d], s.actions[d].size()) << "device " << d << " stuck";

  // The step's end: every gradient final, every push waited for.
  out.grads.assign(P, 0.0f);
  for (int d = s.devices - 1; d >= 0; --d) {
    StageWorker& k = dev[d];
    if (k.window) {
      apply(d, k.window->FinalFrom(0));
      apply(d, k.window->RetireAll());
      for (int i = 0; i < k.window->num_buckets(); ++i) EXPECT_FALSE(k.in_flight[i]);
      const float* g = k.g();
      EXPECT_EQ(std::count_if(g, g + P, [](float v) { return v != 0.0f; }), 0) << "device " << d << " kept gradients";
    } else {
      for (const ParamRange& r : k.ranges) std::copy(k.g() + r.begin, k.g() + r.end, k.pushed.begin() + r.begin);
    }
    for (const ParamRange& r : k.ranges) {
      for (int64_t i = r.begin; i < r.end; ++i) out.grads[i] += k.pushed[i];
    }
    out.peak_weights.push_back(k.peak);
    out.pulled.push_back(k.pulled);
    out.pushed.push_back(k.push_order);
  }
  std::reverse(out.peak_weights.begin(), out.peak_weights.end());
  std::reverse(out.pulled.begin(), out.pulled.end());
  std::reverse(out.pushed.begin(), out.pushed.end());
  return out;
}

// One whole model, micro-batch after micro-batch.
Outcome Whole(const LlamaShape& shape) {
  const ParamLayout layout(shape);
  std::vector<float> w(layout.size());
  InitParameters(layout, 5, 0.05, w.data());
  LlamaModel<float> model(shape, B, T);
  Outcome out;
  out.grads.assign(w.size(), 0.0f);
  for (int m = 0; m < M; ++m) {
    out.losses.push_back(model.Forward(w.data(), Tokens(shape, m, 0).data(), Tokens(shape, m, 5).data(), B, T));
    model.Backward(w.data(), out.grads.data(), 1.0 / (B * T * M));
  }
  return out;
}

const Case kCases[] = {
    {PipelineScheduleKind::kOneFOneB, 2, 1, 4, false},    {PipelineScheduleKind::kOneFOneB, 2, 1, 4, true},
    {PipelineScheduleKind::kGPipe, 3, 1, 8, true},        {PipelineScheduleKind::kOneFOneB, 4, 1, 4, false},
    {PipelineScheduleKind::kZeroBubble, 2, 1, 4, true},   {PipelineScheduleKind::kZeroBubble, 4, 1, 8, false},
    {PipelineScheduleKind::kInterleaved1F1B, 2, 2, 8, true},
};

TEST(StageWindow, StreamedStagesEqualWholeStagesBitForBit) {
  for (const Case& c : kCases) {
    const Outcome whole_stages = RunStages(c, 1 << 20, 1, /*streamed=*/false);
    if (!c.tied) {
      const Outcome one = Whole(Shape(c.layers, false));
      EXPECT_EQ(whole_stages.losses, one.losses);
      EXPECT_EQ(std::memcmp(whole_stages.grads.data(), one.grads.data(), one.grads.size() * sizeof(float)), 0);
    }
    for (int64_t bucket : {int64_t{64 * 10}, int64_t{64 * 37}, int64_t{1} << 20}) {
      for (int prefetch : {0, 1, 3}) {
        SCOPED_TRACE(testing::Message() << PipelineScheduleName(c.kind) << " P=" << c.devices << " v=" << c.chunks
                                        << " layers " << c.layers << (c.tied ? " tied" : " untied") << ", bucket "
                                        << bucket << ", prefetch " << prefetch);
        const Outcome streamed = RunStages(c, bucket, prefetch, /*streamed=*/true);
        EXPECT_EQ(streamed.losses, whole_stages.losses);
        ASSERT_EQ(
            std::memcmp(streamed.grads.data(), whole_stages.grads.data(), whole_stages.grads.size() * sizeof(float)),
            0);
        // Each of a stage's buckets once, highest offsets first.
        for (const std::vector<int>& order : streamed.pushed) {
          ASSERT_FALSE(order.empty());
          for (size_t i = 0; i < order.size(); ++i) EXPECT_EQ(order[i], static_cast<int>(order.size() - 1 - i));
        }
      }
    }
  }
}

TEST(StageWindow, PlanCountsWhatEachStagesWindowHolds) {
  for (const Case& c : kCases) {
    const LlamaShape shape = Shape(c.layers, c.tied);
    const ParamLayout layout(shape);
    const int64_t bucket = 64 * 37;
    auto split = PipelineSplit::Make(shape, c.devices * c.chunks, "", T);
    auto schedule = MakePipelineSchedule(c.kind, c.devices, c.chunks, M);
    ASSERT_TRUE(split.ok() && schedule.ok());
    const PipelinePlan pipeline{*split, *schedule, Grid()};
    ShardPlanOptions po;
    po.servers = 2;
    po.bucket_elements = bucket;
    po.bucket_cuts = pipeline.BucketCuts(layout);
    auto plan = ShardPlan::Create(layout, po);
    ASSERT_TRUE(plan.ok());
    for (int prefetch : {0, 1, 2}) {
      SCOPED_TRACE(testing::Message() << PipelineScheduleName(c.kind) << " P=" << c.devices << " v=" << c.chunks
                                      << (c.tied ? " tied" : " untied") << ", prefetch " << prefetch);
      const Outcome streamed = RunStages(c, bucket, prefetch, /*streamed=*/true);
      for (int d = 0; d < c.devices; ++d) {
        const StageReplay stage = StageReplayOf(pipeline, d, layout);
        StreamedReplay replay;
        replay.prefetch = prefetch;
        const StreamedPeak peak = ReplayStreamedStage(*plan, layout, replay, stage);
        EXPECT_EQ(peak.weights, streamed.peak_weights[d]) << "device " << d;
        EXPECT_EQ(peak.pulled, streamed.pulled[d]) << "device " << d;
        int64_t range = 0;
        for (const ParamRange& r : stage.ranges) range += r.size();
        EXPECT_EQ(peak.gradients, range * static_cast<int64_t>(sizeof(float))) << "device " << d;
        // Layers several buckets deep: the window holds less than the stage.
        if (prefetch == 0 && c.layers / c.devices / c.chunks >= 2) {
          EXPECT_LT(peak.weights, range * static_cast<int64_t>(sizeof(float))) << "device " << d;
        }
      }
    }
  }
}

}  // namespace
}  // namespace herd
