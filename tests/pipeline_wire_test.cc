// The wire between pipeline stages over real UCX inside one process (2-3
// transports on loopback): activations and gradients arrive bit-exactly
// (fp32) or rounded as FloatsToBf16 rounds them (bf16), whether the Receive
// is posted before the message arrives or after, by eager messages and by
// rendezvous; messages out of order and one step ahead are kept until
// asked for; and every message that does not fit fails the wire with one
// line naming its sender.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <future>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/bf16.h"
#include "transport/pipeline_wire.h"

namespace herd::transport {
namespace {

// Sets an environment variable for its lifetime (UCX reads its
// environment when a transport is created); null leaves it alone.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (value == nullptr) return;
    if (const char* old = std::getenv(name)) old_ = old;
    set_ = true;
    ::setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (!set_) return;
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
  bool set_ = false;
};

struct WireOptions {
  bool bf16 = false;
  int64_t max_elements = 1 << 20;
  int max_early = 4;
  // UCX_RNDV_THRESH while the transports are created: "8192" makes large
  // payloads go by rendezvous; null keeps herd's choice (on a host without
  // RDMA ports: eager messages of every size).
  const char* rndv_thresh = nullptr;
};

// Stage r: PeerId r, its own transport and wire, connected to every other.
class Stages {
 public:
  Stages(int n, const WireOptions& o) {
    ScopedEnv env("UCX_RNDV_THRESH", o.rndv_thresh);
    for (int r = 0; r < n; ++r) {
      auto t = UcxTransport::Create(UcxOptions(r));
      EXPECT_TRUE(t.ok()) << t.status().ToString();
      transports_.push_back(std::move(*t));
    }
    for (int r = 0; r < n; ++r) {
      wires_.push_back(std::make_unique<PipelineWire>(transports_[r].get(), o.bf16, o.max_elements, o.max_early));
    }
    for (int r = 0; r < n; ++r) {
      for (int p = 0; p < n; ++p) {
        if (p == r) continue;
        EXPECT_TRUE(transports_[r]->Connect(p, transports_[p]->address(), "stage " + std::to_string(p)).ok());
      }
    }
  }
  ~Stages() {
    wires_.clear();
    transports_.clear();
  }
  PipelineWire& wire(int r) { return *wires_[r]; }
  UcxTransport& transport(int r) { return *transports_[r]; }

 private:
  std::vector<std::unique_ptr<UcxTransport>> transports_;
  std::vector<std::unique_ptr<PipelineWire>> wires_;
};

// Random bit patterns: NaNs, infinities and subnormals among them.
std::vector<float> RandomFloats(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> v(n);
  for (float& x : v) {
    const uint32_t bits = rng();
    std::memcpy(&x, &bits, 4);
  }
  return v;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

void WaitUntil(const std::function<bool()>& cond) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!cond()) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "timed out";
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

StageMessage Activation(uint64_t step, int micro_batch, int virtual_stage, int64_t elements) {
  return StageMessage{StageMessage::kActivation, step, micro_batch, virtual_stage, elements};
}
StageMessage Gradient(uint64_t step, int micro_batch, int virtual_stage, int64_t elements, double loss) {
  StageMessage m{StageMessage::kGradient, step, micro_batch, virtual_stage, elements};
  m.loss = loss;
  return m;
}

// Sends `m` from `from` to `to` and receives it there, the Receive posted
// first (`posted`: it waits until the wire counts it) or after the message
// has arrived; returns what landed and the loss.
std::pair<std::vector<float>, double> RoundTrip(Stages& s, int from, int to, const StageMessage& m,
                                                const std::vector<float>& data, bool posted) {
  std::vector<float> got(m.elements, 0.0f);
  double loss = -1;
  PipelineWire& rx = s.wire(to);
  if (posted) {
    auto receive = std::async(std::launch::async, [&] { return rx.Receive(from, m, got.data()); });
    WaitUntil([&] { return rx.stats().waiting == 1; });
    EXPECT_TRUE(s.wire(from).WaitSent(s.wire(from).Send(to, m, data.data())).ok());
    StatusOr<double> r = receive.get();
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    if (r.ok()) loss = *r;
  } else {
    const int held = rx.stats().held;
    EXPECT_TRUE(s.wire(from).WaitSent(s.wire(from).Send(to, m, data.data())).ok());
    WaitUntil([&] { return rx.stats().held == held + 1; });
    StatusOr<double> r = rx.Receive(from, m, got.data());
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    if (r.ok()) loss = *r;
    EXPECT_EQ(rx.stats().held, held);
  }
  return {got, loss};
}

void ExpectOneLine(const Status& st, const std::vector<std::string>& needles) {
  EXPECT_FALSE(st.ok());
  for (const std::string& n : needles) EXPECT_NE(st.message().find(n), std::string::npos) << st.message();
  EXPECT_EQ(st.message().find('\n'), std::string::npos) << st.message();
}

TEST(PipelineWire, Fp32RoundTripsBitExactlyEagerAndByRendezvous) {
  for (const char* thresh : {static_cast<const char*>(nullptr), "8192"}) {
    Stages s(2, {.rndv_thresh = thresh});
    int micro = 0;
    for (int64_t n : {int64_t{64}, int64_t{1} << 20}) {
      for (bool posted : {true, false}) {
        const std::vector<float> act = RandomFloats(n, micro + 1), grad = RandomFloats(n, micro + 100);
        auto [a, a_loss] = RoundTrip(s, 0, 1, Activation(0, micro, 1, n), act, posted);
        EXPECT_TRUE(SameBits(a, act)) << "n=" << n << " posted=" << posted;
        EXPECT_EQ(a_loss, 0.0);
        auto [g, g_loss] = RoundTrip(s, 1, 0, Gradient(0, micro, 0, n, 2.5 + micro), grad, posted);
        EXPECT_TRUE(SameBits(g, grad)) << "n=" << n << " posted=" << posted;
        EXPECT_EQ(g_loss, 2.5 + micro);
        ++micro;
      }
    }
    if (thresh != nullptr) {
      // The 1 M payloads went by rendezvous (2 each way); posted fp32 ones
      // landed straight in the Receive's buffer.
      EXPECT_EQ(s.transport(0).stats().rendezvous_received, 2u);
      EXPECT_EQ(s.transport(1).stats().rendezvous_received, 2u);
      EXPECT_EQ(s.wire(0).stats().zero_copy, 1);
      EXPECT_EQ(s.wire(1).stats().zero_copy, 1);
    }
    EXPECT_EQ(s.wire(1).stats().early, 2);
    EXPECT_EQ(s.wire(1).stats().peak_held, 1);
  }
}

TEST(PipelineWire, Bf16ArrivesRoundedAsFloatsToBf16AndTheSourceMayBeReusedAtOnce) {
  Stages s(2, {.bf16 = true, .rndv_thresh = "8192"});
  int micro = 0;
  for (int64_t n : {int64_t{64}, int64_t{1} << 20}) {
    for (bool posted : {true, false}) {
      const std::vector<float> data = RandomFloats(n, 7 + micro);
      std::vector<uint16_t> bf(n);
      FloatsToBf16(data.data(), bf.data(), n);
      std::vector<float> want(n);
      Bf16ToFloats(bf.data(), want.data(), n);
      // The source is overwritten as soon as Send returns.
      std::vector<float> src = data;
      std::vector<float> got(n, 0.0f);
      const StageMessage m = Gradient(0, micro, 0, n, 1.25);
      std::future<StatusOr<double>> receive;
      if (posted) {
        receive = std::async(std::launch::async, [&] { return s.wire(0).Receive(1, m, got.data()); });
        WaitUntil([&] { return s.wire(0).stats().waiting == 1; });
      }
      const auto h = s.wire(1).Send(0, m, src.data());
      std::fill(src.begin(), src.end(), 0.0f);
      ASSERT_TRUE(s.wire(1).WaitSent(h).ok());
      StatusOr<double> r = posted ? receive.get() : s.wire(0).Receive(1, m, got.data());
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      EXPECT_EQ(*r, 1.25);
      EXPECT_TRUE(SameBits(got, want)) << "n=" << n << " posted=" << posted;
      ++micro;
    }
  }
  EXPECT_EQ(s.transport(0).stats().rendezvous_received, 2u);
  // A tied embedding's gradient, and a sample's logits, stay fp32 on a
  // bf16 wire.
  for (StageMessage::Kind kind : {StageMessage::kEmbeddingGradient, StageMessage::kLogits}) {
    const std::vector<float> exact = RandomFloats(5000, 3);
    std::vector<float> got(exact.size());
    const StageMessage m{kind, 0, 0, 0, static_cast<int64_t>(exact.size())};
    ASSERT_TRUE(s.wire(1).WaitSent(s.wire(1).Send(0, m, exact.data())).ok());
    ASSERT_TRUE(s.wire(0).Receive(1, m, got.data()).ok());
    EXPECT_TRUE(SameBits(got, exact)) << StageMessageKindName(kind);
  }
}

TEST(PipelineWire, MicroBatchesArrivingOutOfOrderAreReceivedInOrder) {
  Stages s(2, {});
  const int64_t n = 256;
  const std::vector<float> zero = RandomFloats(n, 10), one = RandomFloats(n, 11);
  std::vector<float> got(n);
  // Both early: 1 then 0 sent, 0 then 1 received.
  auto h1 = s.wire(0).Send(1, Activation(0, 1, 1, n), one.data());
  auto h0 = s.wire(0).Send(1, Activation(0, 0, 1, n), zero.data());
  ASSERT_TRUE(s.wire(0).WaitSent(h1).ok());
  ASSERT_TRUE(s.wire(0).WaitSent(h0).ok());
  ASSERT_TRUE(s.wire(1).Receive(0, Activation(0, 0, 1, n), got.data()).ok());
  EXPECT_TRUE(SameBits(got, zero));
  ASSERT_TRUE(s.wire(1).Receive(0, Activation(0, 1, 1, n), got.data()).ok());
  EXPECT_TRUE(SameBits(got, one));
  // Micro-batch 2 awaited while 3 arrives first (kept) and then 2 (lands).
  std::vector<float> got2(n);
  auto receive = std::async(std::launch::async, [&] { return s.wire(1).Receive(0, Activation(0, 2, 1, n), got2.data()); });
  WaitUntil([&] { return s.wire(1).stats().waiting == 1; });
  ASSERT_TRUE(s.wire(0).WaitSent(s.wire(0).Send(1, Activation(0, 3, 1, n), one.data())).ok());
  WaitUntil([&] { return s.wire(1).stats().held == 1; });
  ASSERT_TRUE(s.wire(0).WaitSent(s.wire(0).Send(1, Activation(0, 2, 1, n), zero.data())).ok());
  ASSERT_TRUE(receive.get().ok());
  EXPECT_TRUE(SameBits(got2, zero));
  ASSERT_TRUE(s.wire(1).Receive(0, Activation(0, 3, 1, n), got.data()).ok());
  EXPECT_TRUE(SameBits(got, one));
  // Receiving one twice is the caller's mistake, not the wire's failure.
  EXPECT_FALSE(s.wire(1).Receive(0, Activation(0, 3, 1, n), got.data()).ok());
  EXPECT_TRUE(s.wire(0).WaitSent(s.wire(0).Send(1, Activation(0, 4, 1, n), one.data())).ok());
  EXPECT_TRUE(s.wire(1).Receive(0, Activation(0, 4, 1, n), got.data()).ok());
}

TEST(PipelineWire, AMessageOneStepAheadIsHeldAndOneForAnOlderStepFailsTheWire) {
  Stages s(3, {});
  const int64_t n = 128;
  const std::vector<float> data = RandomFloats(n, 5);
  std::vector<float> got(n);
  s.wire(1).SetStep(4);
  // Step 5's activation arrives while stage 1 is at step 4: held.
  ASSERT_TRUE(s.wire(0).WaitSent(s.wire(0).Send(1, Activation(5, 0, 1, n), data.data())).ok());
  WaitUntil([&] { return s.wire(1).stats().held == 1; });
  Status early = s.wire(1).Receive(0, Activation(5, 0, 1, n), got.data()).status();
  EXPECT_EQ(early.code(), Status::Code::kFailedPrecondition) << early.ToString();
  // Step 4 goes on meanwhile.
  ASSERT_TRUE(s.wire(0).WaitSent(s.wire(0).Send(1, Activation(4, 1, 1, n), data.data())).ok());
  ASSERT_TRUE(s.wire(1).Receive(0, Activation(4, 1, 1, n), got.data()).ok());
  s.wire(1).SetStep(5);
  ASSERT_TRUE(s.wire(1).Receive(0, Activation(5, 0, 1, n), got.data()).ok());
  EXPECT_TRUE(SameBits(got, data));
  // Stage 2 sends a gradient of step 4 (1-based: 5): refused, naming peer 2.
  auto blocked = std::async(std::launch::async, [&] { return s.wire(1).Receive(2, Gradient(5, 0, 1, n, 0), got.data()); });
  ASSERT_TRUE(s.wire(2).WaitSent(s.wire(2).Send(1, Gradient(4, 0, 1, n, 0), data.data())).ok());
  const Status st = blocked.get().status();
  ExpectOneLine(st, {"pipeline message from peer 2: ", "gradient for step 5 micro-batch 0 virtual stage 1",
                     "older than this stage's step 6"});
  // Every later call fails with it.
  EXPECT_EQ(s.wire(1).Receive(0, Activation(5, 1, 1, n), got.data()).status().message(), st.message());
  EXPECT_EQ(s.wire(1).WaitSent(s.wire(1).Send(0, Gradient(5, 0, 0, n, 0), data.data())).message(), st.message());
}

// A message sent by hand: a header and a payload through the transport.
void SendRaw(Stages& s, int from, int to, const std::string& header, const std::vector<char>& payload) {
  std::promise<Status> sent;
  s.transport(from).Send(to, kAmPipeline, header, payload.data(), payload.size(),
                         [&sent](const Status& st) { sent.set_value(st); });
  sent.get_future().wait();
}
std::string Bytes(const StageWireHeader& h) { return std::string(reinterpret_cast<const char*>(&h), sizeof h); }
StageWireHeader Header(uint8_t kind, uint64_t step, int micro_batch, int64_t elements) {
  StageWireHeader h;
  h.kind = kind;
  h.step = step;
  h.micro_batch = micro_batch;
  h.virtual_stage = 1;
  h.elements = elements;
  return h;
}

// Stage 1 fails once `send` has run on a pair of stages (0 sends to 1):
// the failure as a Receive of another message, blocked meanwhile, sees it.
Status FailureAfter(const WireOptions& o, const std::function<void(Stages&)>& send) {
  Stages s(2, o);
  std::vector<float> got(o.max_elements);
  auto blocked = std::async(std::launch::async, [&] { return s.wire(1).Receive(0, Activation(0, 99, 1, 8), got.data()); });
  WaitUntil([&] { return s.wire(1).stats().waiting == 1; });
  send(s);
  return blocked.get().status();
}

TEST(PipelineWire, MessagesThatDoNotFitFailTheWireWithOneLineNamingTheSender) {
  const WireOptions o{.max_elements = 1024, .max_early = 2};
  const std::vector<float> data(1024, 1.0f);
  // Elements other than the Receive's: posted before (the handler refuses) and after (the Receive does).
  {
    Stages s(2, o);
    std::vector<float> got(512);
    auto receive = std::async(std::launch::async, [&] { return s.wire(1).Receive(0, Activation(0, 2, 1, 512), got.data()); });
    WaitUntil([&] { return s.wire(1).stats().waiting == 1; });
    s.wire(0).WaitSent(s.wire(0).Send(1, Activation(0, 2, 1, 256), data.data()));
    ExpectOneLine(receive.get().status(), {"pipeline message from peer 0: activation for step 1 micro-batch 2 "
                                           "virtual stage 1 has 256 elements, expected 512"});
  }
  {
    Stages s(2, o);
    std::vector<float> got(512);
    ASSERT_TRUE(s.wire(0).WaitSent(s.wire(0).Send(1, Activation(0, 2, 1, 256), data.data())).ok());
    WaitUntil([&] { return s.wire(1).stats().held == 1; });
    ExpectOneLine(s.wire(1).Receive(0, Activation(0, 2, 1, 512), got.data()).status(),
                  {"pipeline message from peer 0: ", "has 256 elements, expected 512"});
  }
  struct Case {
    const char* name;
    std::function<void(Stages&)> send;
    std::vector<std::string> needles;
  };
  const std::vector<char> bytes64(64 * 4);
  const std::vector<Case> cases = {
      {"unknown kind",
       [&](Stages& s) { SendRaw(s, 0, 1, Bytes(Header(9, 0, 0, 64)), bytes64); },
       {"pipeline message from peer 0: unknown kind 9"}},
      {"too many early",
       [&](Stages& s) {
         for (int m = 0; m < 3; ++m) s.wire(0).WaitSent(s.wire(0).Send(1, Activation(0, m, 1, 64), data.data()));
       },
       {"pipeline message from peer 0: activation for step 1 micro-batch 2 virtual stage 1 arrived before its "
        "Receive while 2 early messages are held", "max_early 2"}},
      {"too many elements",
       [&](Stages& s) { SendRaw(s, 0, 1, Bytes(Header(1, 0, 0, 2048)), std::vector<char>(2048 * 4)); },
       {"pipeline message from peer 0: activation for step 1 micro-batch 0 virtual stage 1 has 2048 elements, more "
        "than the largest payload (1024)"}},
      {"no elements",
       [&](Stages& s) { SendRaw(s, 0, 1, Bytes(Header(2, 0, 0, 0)), {}); },
       {"pipeline message from peer 0: gradient for step 1 micro-batch 0 virtual stage 1 has 0 elements"}},
      {"payload size",
       [&](Stages& s) { SendRaw(s, 0, 1, Bytes(Header(1, 0, 0, 64)), std::vector<char>(60)); },
       {"pipeline message from peer 0: ", "carries 60 bytes, expected 64 elements of 4 bytes (256)"}},
      {"header size",
       [&](Stages& s) { SendRaw(s, 0, 1, Bytes(Header(1, 0, 0, 64)).substr(0, 12), bytes64); },
       {"pipeline message from peer 0: a header of 12 bytes, expected 40"}},
      {"magic",
       [&](Stages& s) {
         StageWireHeader h = Header(1, 0, 0, 64);
         h.magic = 0x12345678;
         SendRaw(s, 0, 1, Bytes(h), bytes64);
       },
       {"pipeline message from peer 0: not a pipeline header (magic 0x12345678 version 1, expected 0x57504448"}},
      {"dtype",
       [&](Stages& s) {
         StageWireHeader h = Header(1, 0, 0, 64);
         h.dtype = StageWireHeader::kBf16;
         SendRaw(s, 0, 1, Bytes(h), std::vector<char>(128));
       },
       {"pipeline message from peer 0: ", "travels as bf16, expected fp32"}},
      {"negative micro-batch",
       [&](Stages& s) { SendRaw(s, 0, 1, Bytes(Header(1, 0, -1, 64)), bytes64); },
       {"pipeline message from peer 0: ", "micro-batch -1 virtual stage 1 has a negative micro-batch"}},
      {"two steps ahead",
       [&](Stages& s) { SendRaw(s, 0, 1, Bytes(Header(1, 2, 0, 64)), bytes64); },
       {"pipeline message from peer 0: activation for step 3 ", "more than one step ahead of this stage's step 1"}},
      {"duplicate",
       [&](Stages& s) {
         SendRaw(s, 0, 1, Bytes(Header(1, 1, 0, 64)), bytes64);
         SendRaw(s, 0, 1, Bytes(Header(1, 1, 0, 64)), bytes64);
       },
       {"pipeline message from peer 0: activation for step 2 micro-batch 0 virtual stage 1 arrived twice"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    ExpectOneLine(FailureAfter(o, c.send), c.needles);
  }
}

TEST(PipelineWire, ARefusedRendezvousFailsTheSenderToo) {
  Stages s(2, {.rndv_thresh = "8192"});
  const int64_t n = 1 << 16;
  const std::vector<float> data(n, 1.0f);
  std::vector<float> got(2 * n);
  auto receive = std::async(std::launch::async, [&] { return s.wire(1).Receive(0, Activation(0, 0, 1, 2 * n), got.data()); });
  WaitUntil([&] { return s.wire(1).stats().waiting == 1; });
  const Status sent = s.wire(0).WaitSent(s.wire(0).Send(1, Activation(0, 0, 1, n), data.data()));
  ExpectOneLine(receive.get().status(), {"pipeline message from peer 0: ", "has 65536 elements, expected 131072"});
  ExpectOneLine(sent, {"pipeline wire: sending activation for step 1 micro-batch 0 virtual stage 1 to peer 1: "});
}

TEST(PipelineWire, FailWakesABlockedReceiveAndFailsLaterCalls) {
  Stages s(2, {});
  std::vector<float> buf(64, 1.0f);
  auto receive = std::async(std::launch::async, [&] { return s.wire(1).Receive(0, Activation(0, 0, 1, 64), buf.data()); });
  WaitUntil([&] { return s.wire(1).stats().waiting == 1; });
  s.wire(1).Fail(Status::Aborted("stage 0 is gone"));
  EXPECT_EQ(receive.get().status().message(), "stage 0 is gone");
  EXPECT_EQ(s.wire(1).Receive(0, Activation(0, 1, 1, 64), buf.data()).status().message(), "stage 0 is gone");
  EXPECT_EQ(s.wire(1).WaitSent(s.wire(1).Send(0, Gradient(0, 0, 0, 64, 1), buf.data())).message(), "stage 0 is gone");
  // Bad arguments are the caller's: refused without failing a healthy wire.
  EXPECT_EQ(s.wire(0).WaitSent(s.wire(0).Send(1, Activation(0, 0, 1, 0), buf.data())).code(),
            Status::Code::kInvalidArgument);
  EXPECT_EQ(s.wire(0).WaitSent(s.wire(0).Send(1, Activation(0, 0, 1, 1 << 21), buf.data())).code(),
            Status::Code::kInvalidArgument);
  EXPECT_EQ(s.wire(0).WaitSent(12345).code(), Status::Code::kInternal);
}

}  // namespace
}  // namespace herd::transport
