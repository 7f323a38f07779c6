// Streamed weights without the network: the CPU model computes on weights
// held in a guarded PagedBuffer that a WeightWindow fills and empties from
// the model's own hooks, exactly as a streaming worker does. Reading a
// weight outside the window would fault; the losses and the gradients
// pushed are the same, bit for bit, as with every weight at hand; every
// bucket is pushed once, in backward's order, and retired; the weights the
// window held at its fullest, and the elements it pulled, are what
// ReplayStreamedStep (the memory and traffic plans) counts, and they do
// not grow with depth.
#include <glog/logging.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "common/paged_buffer.h"
#include "model/llama.h"
#include "model/param_layout.h"
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

ShardPlan Plan(const ParamLayout& layout, int64_t bucket_elements) {
  ShardPlanOptions o;
  o.servers = 2;
  o.bucket_elements = bucket_elements;
  auto plan = ShardPlan::Create(layout, o);
  CHECK(plan.ok()) << plan.status().message();
  return *std::move(plan);
}

constexpr int B = 2, T = 12, kMicro = 2;

std::vector<int32_t> Tokens(const LlamaShape& s, int micro, int salt) {
  std::vector<int32_t> t(B * T);
  for (int i = 0; i < B * T; ++i) t[i] = (i * 31 + micro * 7 + salt) % s.vocab_size;
  return t;
}

struct Outcome {
  std::vector<double> losses;
  double loss_sum = 0;
  std::vector<float> grads;       // what reached the "servers"
  std::vector<int> pushed;        // bucket indices (forward order), in push order
  int64_t peak_held_weights = 0;  // bytes
  int64_t pulled = 0;             // elements pulled over the step
};

// Every weight at hand, gradients accumulated over the micro-batches one
// after the other.
Outcome Whole(const LlamaShape& shape, Recompute recompute = Recompute::kNone) {
  const ParamLayout layout(shape);
  std::vector<float> params(layout.size());
  InitParameters(layout, 5, 0.05, params.data());
  LlamaModel<float> model(shape, B, T, recompute);
  Outcome r;
  r.grads.assign(layout.size(), 0.0f);
  double sum = 0;
  for (int m = 0; m < kMicro; ++m) {
    r.losses.push_back(model.Forward(params.data(), Tokens(shape, m, 0).data(), Tokens(shape, m, 5).data(), B, T));
    sum += r.losses.back();
    model.Backward(params.data(), r.grads.data(), 1.0 / (kMicro * B * T));
  }
  r.loss_sum = sum;
  return r;
}

// The micro-batches' tokens and targets, as a layer-major pass takes them.
struct MicroBatches {
  std::vector<std::vector<int32_t>> tokens, targets;
  std::vector<const int32_t*> token_ptrs, target_ptrs;
  explicit MicroBatches(const LlamaShape& shape) {
    for (int m = 0; m < kMicro; ++m) {
      tokens.push_back(Tokens(shape, m, 0));
      targets.push_back(Tokens(shape, m, 5));
    }
    for (int m = 0; m < kMicro; ++m) {
      token_ptrs.push_back(tokens[m].data());
      target_ptrs.push_back(targets[m].data());
    }
  }
};

// The window's policy carried out on paged buffers: a pull copies the
// bucket from the "servers'" weights, a push copies it to theirs.
// `layer_major`: every micro-batch in one pass (untied embeddings).
Outcome Streamed(const LlamaShape& shape, int64_t bucket_elements, int prefetch, bool layer_major = false) {
  const ParamLayout layout(shape);
  const ShardPlan plan = Plan(layout, bucket_elements);
  const int64_t P = layout.size();
  std::vector<float> servers(P);
  InitParameters(layout, 5, 0.05, servers.data());
  auto weights = PagedBuffer::Reserve(P * sizeof(float), /*guarded=*/true);
  auto grads = PagedBuffer::Reserve(P * sizeof(float), /*guarded=*/false);
  CHECK(weights.ok() && grads.ok());
  float* w = reinterpret_cast<float*>(weights->data());
  float* g = reinterpret_cast<float*>(grads->data());
  WeightWindow window(plan, layout, prefetch);
  Outcome r;
  r.grads.assign(P, 0.0f);
  std::vector<bool> in_flight(window.num_buckets(), false);
  int64_t held = 0;
  auto apply = [&](const WeightWindow::Actions& a) {
    for (int i : a.release) {
      const ParamRange& x = window.bucket(i).range;
      weights->Release(x.begin * sizeof(float), x.size() * sizeof(float));
      held -= x.size() * sizeof(float);
    }
    for (int i : a.pull) {
      const ParamRange& x = window.bucket(i).range;
      weights->Admit(x.begin * sizeof(float), x.size() * sizeof(float));
      std::memcpy(w + x.begin, servers.data() + x.begin, x.size() * sizeof(float));
      held += x.size() * sizeof(float);
      r.pulled += x.size();
    }
    r.peak_held_weights = std::max(r.peak_held_weights, held);
    for (int i : a.wait) EXPECT_TRUE(window.held(i)) << "waits for bucket " << i << ", which it does not hold";
    for (int i : a.push) {
      const ParamRange& x = window.bucket(i).range;
      EXPECT_FALSE(in_flight[i]);
      in_flight[i] = true;
      std::memcpy(r.grads.data() + x.begin, g + x.begin, x.size() * sizeof(float));
      r.pushed.push_back(i);
    }
    for (int i : a.retire) {
      const ParamRange& x = window.bucket(i).range;
      EXPECT_TRUE(in_flight[i]) << "retires bucket " << i << ", which is not in flight";
      in_flight[i] = false;
      grads->Release(x.begin * sizeof(float), x.size() * sizeof(float));
    }
  };
  LlamaModel<float> model(shape, B, T, Recompute::kNone, layer_major ? kMicro : 1);
  apply(window.Start());
  if (layer_major) {
    const MicroBatches mb(shape);
    r.loss_sum = model.ForwardBackwardLayerMajor(
        w, g, mb.token_ptrs, mb.target_ptrs, B, T, 1.0 / (kMicro * B * T),
        [&](int64_t end) { apply(window.NeedUpTo(end)); }, [&](int64_t begin) { apply(window.NeedFrom(begin)); },
        [&](int64_t x) {
          apply(window.FinalFrom(x));
          apply(window.DoneFrom(x));
        });
  }
  for (int m = 0; m < kMicro && !layer_major; ++m) {
    const bool last = m == kMicro - 1;
    r.losses.push_back(model.Forward(w, Tokens(shape, m, 0).data(), Tokens(shape, m, 5).data(), B, T,
                                     [&](int64_t end) { apply(window.NeedUpTo(end)); }));
    model.Backward(
        w, g, 1.0 / (kMicro * B * T),
        [&](int64_t x) {
          if (last) apply(window.FinalFrom(x));
          apply(window.DoneFrom(x));
        },
        [&](int64_t begin) { apply(window.NeedFrom(begin)); });
  }
  apply(window.RetireAll());
  for (int i = 0; i < window.num_buckets(); ++i) {
    EXPECT_FALSE(window.held(i)) << "bucket " << i << " still held after the step";
    EXPECT_FALSE(in_flight[i]) << "bucket " << i << " still in flight after the step";
  }
  // The gradients left behind are zero: the next step starts clean.
  EXPECT_EQ(std::count_if(g, g + P, [](float x) { return x != 0.0f; }), 0) << "gradients left behind";
  return r;
}

TEST(WeightWindow, StreamedTrainingEqualsWholeBitForBit) {
  for (bool tied : {true, false}) {
    for (int64_t bucket : {int64_t{64 * 10}, int64_t{64 * 37}, int64_t{1} << 20}) {  // straddling layers, and one per shard
      for (int prefetch : {0, 1, 3}) {
        SCOPED_TRACE(testing::Message() << "tied " << tied << ", bucket " << bucket << ", prefetch " << prefetch);
        const LlamaShape shape = Shape(4, tied);
        const Outcome whole = Whole(shape);
        const Outcome streamed = Streamed(shape, bucket, prefetch);
        EXPECT_EQ(streamed.losses, whole.losses);
        ASSERT_EQ(std::memcmp(streamed.grads.data(), whole.grads.data(), whole.grads.size() * sizeof(float)), 0);
        // Each bucket once, highest offsets first.
        const ShardPlan plan = Plan(ParamLayout(shape), bucket);
        std::vector<int> expected(plan.buckets().size());
        for (size_t i = 0; i < expected.size(); ++i) expected[i] = static_cast<int>(expected.size() - 1 - i);
        EXPECT_EQ(streamed.pushed, expected);
      }
    }
  }
}

// Untied: the same gradients bit for bit, in every recompute mode.
TEST(LayerMajor, EqualsMicroBatchesInTurnBitForBit) {
  for (Recompute recompute : {Recompute::kNone, Recompute::kAttention, Recompute::kFull}) {
    const LlamaShape shape = Shape(3, /*tied=*/false);
    const Outcome whole = Whole(shape, recompute);
    const ParamLayout layout(shape);
    std::vector<float> params(layout.size()), grads(layout.size(), 0.0f);
    InitParameters(layout, 5, 0.05, params.data());
    LlamaModel<float> model(shape, B, T, recompute, kMicro);
    const MicroBatches mb(shape);
    std::vector<int64_t> finals;
    const double loss = model.ForwardBackwardLayerMajor(params.data(), grads.data(), mb.token_ptrs, mb.target_ptrs, B,
                                                        T, 1.0 / (kMicro * B * T), nullptr, nullptr,
                                                        [&](int64_t x) { finals.push_back(x); });
    EXPECT_EQ(loss, whole.loss_sum);
    EXPECT_EQ(std::memcmp(grads.data(), whole.grads.data(), grads.size() * sizeof(float)), 0)
        << "recompute " << static_cast<int>(recompute);
    // final_from as one Backward calls it: the head, each layer down, 0.
    std::vector<int64_t> expected{layout.final_norm()};
    for (int l = shape.num_layers - 1; l >= 0; --l) expected.push_back(layout.layer(l).input_norm);
    expected.push_back(0);
    EXPECT_EQ(finals, expected);
  }
}

TEST(WeightWindow, LayerMajorStreamedEqualsWholeBitForBit) {
  for (int prefetch : {0, 1}) {
    const LlamaShape shape = Shape(4, /*tied=*/false);
    const Outcome whole = Whole(shape);
    const Outcome streamed = Streamed(shape, 64 * 37, prefetch, /*layer_major=*/true);
    EXPECT_EQ(streamed.loss_sum, whole.loss_sum);
    ASSERT_EQ(std::memcmp(streamed.grads.data(), whole.grads.data(), whole.grads.size() * sizeof(float)), 0);
  }
}

TEST(WeightWindow, PlanCountsWhatTheWindowHolds) {
  for (bool tied : {true, false}) {
    for (int prefetch : {0, 1, 2}) {
      const LlamaShape shape = Shape(4, tied);
      const ParamLayout layout(shape);
      const int64_t bucket = 64 * 37;
      const Outcome streamed = Streamed(shape, bucket, prefetch);
      StreamedReplay replay;
      replay.prefetch = prefetch;
      replay.accumulates = true;
      const StreamedPeak plan = ReplayStreamedStep(Plan(layout, bucket), layout, replay);
      EXPECT_EQ(plan.weights, streamed.peak_held_weights) << "tied " << tied << ", prefetch " << prefetch;
      // What it pulls (the traffic plan's count): each micro-batch in turn
      // pulls what one pass does.
      EXPECT_EQ(plan.pulled * kMicro, streamed.pulled) << "tied " << tied << ", prefetch " << prefetch;
      EXPECT_GT(plan.pulled, layout.size()) << "backward pulls again";
      if (!tied) {
        replay.accumulates = false;
        EXPECT_EQ(ReplayStreamedStep(Plan(layout, bucket), layout, replay).pulled,
                  Streamed(shape, bucket, prefetch, /*layer_major=*/true).pulled)
            << "one layer-major pass, prefetch " << prefetch;
      }
    }
  }
}

// Depth adds nothing but where bucket boundaries fall among the layers.
TEST(WeightWindow, PeakDoesNotGrowWithDepth) {
  for (int prefetch : {0, 1, 2}) {
    const int64_t bucket = 64 * 64;
    int64_t first = -1;
    for (int layers : {8, 16, 32, 64}) {
      const ParamLayout layout(Shape(layers, false));
      StreamedReplay replay;
      replay.prefetch = prefetch;
      replay.wire_bytes = 2;
      const StreamedPeak p = ReplayStreamedStep(Plan(layout, bucket), layout, replay);
      if (first < 0) first = p.total();
      // A bucket straddling two layers is held for both: up to one more
      // bucket of weights, gradients and staging per end of the window.
      EXPECT_NEAR(p.total(), first, 2 * bucket * (4 + 4 + 2)) << layers << " layers, prefetch " << prefetch;
      const int64_t whole = layout.size() * (4 + 4 + 2);  // weights, gradients, bf16 staging
      if (layers >= 32) {
        EXPECT_LT(p.total(), whole / 4) << layers << " layers, prefetch " << prefetch;
      }
    }
  }
}

// Whether the page holding `p` is backed.
bool Resident(const char* p) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  unsigned char v = 0;
  const auto base = reinterpret_cast<uintptr_t>(p) / page * page;
  EXPECT_EQ(::mincore(reinterpret_cast<void*>(base), page, &v), 0);
  return (v & 1) != 0;
}

TEST(PagedBuffer, ReleasedRangesReadZeroAndGiveTheirPagesBack) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  auto b = PagedBuffer::Reserve(64 * page, /*guarded=*/false);
  ASSERT_TRUE(b.ok());
  EXPECT_FALSE(Resident(b->data() + 10 * page));
  std::memset(b->data(), 7, 64 * page);
  EXPECT_TRUE(Resident(b->data() + 10 * page));
  // From mid-page 3 to mid-page 20: pages 4..19 go back; the ends are zeroed.
  const size_t from = 3 * page + 100, to = 20 * page + 50;
  b->Release(from, to - from);
  for (size_t p = 4; p < 20; ++p) EXPECT_FALSE(Resident(b->data() + p * page)) << "page " << p;
  EXPECT_TRUE(Resident(b->data() + 3 * page));
  for (size_t i = from - 2; i < to + 2; ++i) {
    ASSERT_EQ(b->data()[i], (i < from || i >= to) ? 7 : 0) << "byte " << i;
  }
}

// Zeroing keeps what is backed and leaves what was given back alone.
TEST(PagedBuffer, ZeroBackedZeroesEveryByteAndKeepsThePages) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  auto b = PagedBuffer::Reserve(64 * page, /*guarded=*/false);
  ASSERT_TRUE(b.ok());
  std::memset(b->data() + 5 * page + 17, 3, 30 * page);  // pages 5..35
  b->Release(10 * page, 10 * page);                       // pages 10..19 back
  b->ZeroBacked();
  for (size_t p : {5, 9, 20, 35}) EXPECT_TRUE(Resident(b->data() + p * page)) << "page " << p;
  for (size_t p : {0, 12, 19, 40}) EXPECT_FALSE(Resident(b->data() + p * page)) << "page " << p;
  for (size_t i = 0; i < 64 * page; ++i) ASSERT_EQ(b->data()[i], 0) << "byte " << i;  // (maps the zero page)
}

// A pool's pages go round: Release hands them back, Recycle backs a range
// with them zeroed (what they held elsewhere does not show), and a range
// the pool cannot back reads zero and is backed on first write.
TEST(PagedBuffer, RecycledRangesReuseThePoolsPagesZeroed) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  auto b = PagedBuffer::Reserve(64 * page, /*guarded=*/false);
  ASSERT_TRUE(b.ok());
  ASSERT_TRUE(b->KeepPool(8 * page).ok());
  EXPECT_EQ(b->pool_pages(), 8u);
  // Mid-page 2 to mid-page 9: pages 3..8 from the pool, the ends zeroed.
  std::memset(b->data(), 5, 16 * page);
  b->Recycle(2 * page + 10, 7 * page);
  EXPECT_EQ(b->free_pool_pages(), 2u);
  for (size_t p = 3; p < 9; ++p) EXPECT_TRUE(Resident(b->data() + p * page)) << "page " << p;
  for (size_t i = 0; i < 16 * page; ++i) {
    ASSERT_EQ(b->data()[i], (i < 2 * page + 10 || i >= 9 * page + 10) ? 5 : 0) << "byte " << i;
  }
  std::memset(b->data() + 3 * page, 9, 6 * page);
  b->Release(3 * page, 6 * page);  // back to the pool
  EXPECT_EQ(b->free_pool_pages(), 8u);
  for (size_t p = 3; p < 9; ++p) EXPECT_FALSE(Resident(b->data() + p * page)) << "page " << p;
  EXPECT_EQ(b->data()[4 * page], 0);
  // Twelve pages: eight from the pool (which held 9s), four given back.
  b->Recycle(40 * page, 12 * page);
  EXPECT_EQ(b->free_pool_pages(), 0u);
  for (size_t p = 40; p < 48; ++p) EXPECT_TRUE(Resident(b->data() + p * page)) << "page " << p;
  for (size_t p = 48; p < 52; ++p) EXPECT_FALSE(Resident(b->data() + p * page)) << "page " << p;
  for (size_t i = 40 * page; i < 52 * page; ++i) ASSERT_EQ(b->data()[i], 0) << "byte " << i;
  std::memset(b->data() + 40 * page, 1, 12 * page);
  // Recycling a range the pool backs zeroes it in place.
  b->Recycle(40 * page, 4 * page);
  EXPECT_EQ(b->free_pool_pages(), 0u);
  for (size_t i = 40 * page; i < 44 * page; ++i) ASSERT_EQ(b->data()[i], 0) << "byte " << i;
  EXPECT_EQ(b->data()[44 * page], 1);
  b->ZeroBacked();
  for (size_t i = 0; i < 64 * page; ++i) ASSERT_EQ(b->data()[i], 0) << "byte " << i;
  b->Release(0, 64 * page);
  EXPECT_EQ(b->free_pool_pages(), 8u);
  for (size_t p : {3, 40, 47, 50}) EXPECT_FALSE(Resident(b->data() + p * page)) << "page " << p;
}

TEST(PagedBufferDeathTest, AGuardedBufferFaultsOutsideWhatItAdmitted) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  auto b = PagedBuffer::Reserve(8 * page, /*guarded=*/true);
  ASSERT_TRUE(b.ok());
  b->Admit(page, 2 * page);
  b->data()[page + 5] = 1;
  EXPECT_DEATH(b->data()[4 * page] = 1, "");
  b->Release(page, 2 * page);
  EXPECT_DEATH(b->data()[page + 5] = 1, "");
}

}  // namespace
}  // namespace herd
