// The outer steps' wire between regions over real UCX inside one process
// (one transport a region on loopback): every region sums every region's
// contribution in region order, its own included, whichever arrives first
// and whether its Sum waits for them or finds them held; a region one
// exchange ahead is held until its turn; and every message that does not
// fit fails the wire with one line naming the sender.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <future>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "transport/outer_wire.h"

namespace herd::transport {
namespace {

// Region r: PeerId r, its own transport and wire, connected to every other.
// `state_bytes` (not 0): the last region rejoins, awaiting that state.
class Regions {
 public:
  Regions(int n, std::vector<int64_t> fragment_bytes, OuterWire::Payload payload = OuterWire::Payload::kFloat32,
          int64_t state_bytes = 0) {
    std::vector<PeerId> peers;
    for (int r = 0; r < n; ++r) peers.push_back(r);
    for (int r = 0; r < n; ++r) {
      auto t = UcxTransport::Create(UcxOptions(r));
      EXPECT_TRUE(t.ok()) << t.status().ToString();
      transports_.push_back(std::move(*t));
    }
    for (int r = 0; r < n; ++r) {
      OuterWire::Options o{r, peers, payload, fragment_bytes};
      if (r == n - 1) o.state_bytes = state_bytes;
      wires_.push_back(std::make_unique<OuterWire>(transports_[r].get(), std::move(o)));
    }
    for (int r = 0; r < n; ++r) {
      for (int p = 0; p < n; ++p) {
        if (p == r) continue;
        EXPECT_TRUE(transports_[r]->Connect(p, transports_[p]->address(), "region " + std::to_string(p)).ok());
      }
    }
  }
  ~Regions() {
    wires_.clear();
    transports_.clear();
  }
  OuterWire& wire(int r) { return *wires_[r]; }
  UcxTransport& transport(int r) { return *transports_[r]; }

 private:
  std::vector<std::unique_ptr<UcxTransport>> transports_;
  std::vector<std::unique_ptr<OuterWire>> wires_;
};

std::vector<char> RandomBytes(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<char> v(n);
  for (char& c : v) c = static_cast<char>(rng());
  return v;
}

void WaitUntil(const std::function<bool()>& cond) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!cond()) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "timed out";
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

// What one region's Sum saw: the regions in the order `add` was called,
// and each one's bytes.
struct Seen {
  std::vector<int> order;
  std::vector<std::vector<char>> bytes;
};

// Await, then Sum of every region that is here (as if every server had
// voted so).
StatusOr<Seen> SumOf(OuterWire& wire, uint64_t step, int fragment, const std::vector<char>& mine) {
  StatusOr<std::vector<bool>> here = wire.Await(step, fragment);
  if (!here.ok()) return here.status();
  Seen seen;
  const Status st = wire.Sum(step, fragment, mine.data(), *here, [&](int region, const void* bytes) {
    seen.order.push_back(region);
    seen.bytes.emplace_back(static_cast<const char*>(bytes), static_cast<const char*>(bytes) + mine.size());
    return Status::OK();
  });
  if (!st.ok()) return st;
  return seen;
}

TEST(OuterWire, EveryRegionSumsEveryContributionInRegionOrderWhicheverArrivesFirst) {
  // Fragment 1 has no part here: nothing of it travels.
  const int R = 3;
  const std::vector<int64_t> bytes = {4 * 1000, 0, 4 * 70'000};
  Regions s(R, bytes);
  for (int fragment : {0, 2}) {
    std::vector<std::vector<char>> data;
    for (int r = 0; r < R; ++r) data.push_back(RandomBytes(bytes[fragment], 17 * r + fragment));
    // Region 2's Sum waits before anything was sent; the others find what
    // they need held. Regions send in reverse order.
    auto waiting = std::async(std::launch::async, [&] { return SumOf(s.wire(2), 5, fragment, data[2]); });
    for (int r = R - 1; r >= 0; --r) ASSERT_TRUE(s.wire(r).Send(5, fragment, data[r].data()).ok());
    WaitUntil([&] { return s.wire(0).stats().held == R - 1 && s.wire(1).stats().held == R - 1; });
    std::vector<StatusOr<Seen>> seen;
    for (int r = 0; r < 2; ++r) seen.push_back(SumOf(s.wire(r), 5, fragment, data[r]));
    seen.push_back(waiting.get());
    for (int r = 0; r < R; ++r) {
      ASSERT_TRUE(seen[r].ok()) << seen[r].status().ToString();
      EXPECT_EQ(seen[r]->order, (std::vector<int>{0, 1, 2})) << "region " << r;
      EXPECT_EQ(seen[r]->bytes, data) << "region " << r;
      EXPECT_EQ(s.wire(r).stats().held, 0);
    }
  }
  // Not the same exchange twice, nor an earlier one.
  EXPECT_EQ(s.wire(0).Await(5, 0).status().code(), Status::Code::kFailedPrecondition);
  EXPECT_EQ(s.wire(0).Sum(5, 0, nullptr, {true, true, true}, {}).code(), Status::Code::kFailedPrecondition);
  EXPECT_EQ(s.wire(0).Send(5, 1, nullptr).code(), Status::Code::kInvalidArgument);
}

TEST(OuterWire, ARegionOneExchangeAheadIsHeldUntilItsTurn) {
  const std::vector<int64_t> bytes = {64, 64};
  Regions s(2, bytes);
  const std::vector<char> a0 = RandomBytes(64, 1), b0 = RandomBytes(64, 2), a1 = RandomBytes(64, 3),
                          b1 = RandomBytes(64, 4);
  // Region 0 sends exchange (10, 0), sums it once region 1's is in, and
  // sends (20, 1) before region 1 has summed (10, 0).
  ASSERT_TRUE(s.wire(1).Send(10, 0, b0.data()).ok());
  ASSERT_TRUE(s.wire(0).Send(10, 0, a0.data()).ok());
  ASSERT_TRUE(SumOf(s.wire(0), 10, 0, a0).ok());
  ASSERT_TRUE(s.wire(0).Send(20, 1, a1.data()).ok());
  WaitUntil([&] { return s.wire(1).stats().held == 2; });
  StatusOr<Seen> first = SumOf(s.wire(1), 10, 0, b0);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(first->bytes, (std::vector<std::vector<char>>{a0, b0}));
  ASSERT_TRUE(s.wire(1).Send(20, 1, b1.data()).ok());
  StatusOr<Seen> second = SumOf(s.wire(1), 20, 1, b1);
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ(second->bytes, (std::vector<std::vector<char>>{a1, b1}));
  EXPECT_EQ(s.wire(1).stats().peak_held, 2);
}

TEST(OuterWire, AnErrorOfAddIsNamedWithTheRegionAndTheExchange) {
  Regions s(2, {16});
  const std::vector<char> data(16);
  ASSERT_TRUE(s.wire(0).Send(3, 0, data.data()).ok());
  ASSERT_TRUE(s.wire(1).Await(3, 0).ok());
  const Status st = s.wire(1).Sum(3, 0, data.data(), {true, true}, [](int region, const void*) {
    return region == 0 ? Status::Corruption("the value at flat offset 7 is nan") : Status::OK();
  });
  EXPECT_EQ(st.message(), "region 0's contribution to step 4 fragment 0: the value at flat offset 7 is nan");
}

void SendRaw(Regions& s, int from, int to, const std::string& header, const std::vector<char>& payload) {
  std::promise<Status> sent;
  s.transport(from).Send(to, kAmOuter, header, payload.data(), payload.size(),
                         [&sent](const Status& st) { sent.set_value(st); });
  sent.get_future().wait();
}
std::string Bytes(const OuterWireHeader& h) { return std::string(reinterpret_cast<const char*>(&h), sizeof h); }
OuterWireHeader Header(int region, uint64_t step, int fragment, int64_t bytes) {
  OuterWireHeader h;
  h.region = region;
  h.step = step;
  h.fragment = fragment;
  h.bytes = bytes;
  return h;
}

TEST(OuterWire, MessagesThatDoNotFitFailTheWireWithOneLineNamingTheSender) {
  // Three regions: fragment 0 of 64 bytes here, fragment 1 none.
  const std::vector<int64_t> bytes = {64, 0};
  const std::vector<char> b64(64);
  struct Case {
    const char* name;
    std::function<void(Regions&)> send;
    std::string says;
  };
  const std::vector<Case> cases = {
      {"header size", [&](Regions& s) { SendRaw(s, 1, 0, Bytes(Header(1, 0, 0, 64)).substr(0, 12), b64); },
       "outer wire: region 1's server (peer 1): a header of 12 bytes, expected 32"},
      {"magic",
       [&](Regions& s) {
         OuterWireHeader h = Header(1, 0, 0, 64);
         h.magic = 0x12345678;
         SendRaw(s, 1, 0, Bytes(h), b64);
       },
       "outer wire: region 1's server (peer 1): not an outer-step header (magic 0x12345678 version 1, expected "
       "0x4f445248 version 1)"},
      {"another region's name", [&](Regions& s) { SendRaw(s, 2, 0, Bytes(Header(1, 0, 0, 64)), b64); },
       "outer wire: region 2's server (peer 2): step 1 fragment 0 names region 1, of which it is not the server of "
       "this range"},
      {"payload kind",
       [&](Regions& s) {
         OuterWireHeader h = Header(1, 0, 0, 64);
         h.payload = static_cast<uint8_t>(OuterWire::Payload::kCodes);
         SendRaw(s, 1, 0, Bytes(h), b64);
       },
       "outer wire: region 1's server (peer 1): step 1 fragment 0 carries block codes, expected fp32 "
       "(cluster.diloco.wire_dtype must be the same in every region)"},
      {"no part", [&](Regions& s) { SendRaw(s, 1, 0, Bytes(Header(1, 0, 1, 64)), b64); },
       "outer wire: region 1's server (peer 1): step 1 fragment 1: this server has no part of that fragment"},
      {"size", [&](Regions& s) { SendRaw(s, 1, 0, Bytes(Header(1, 0, 0, 64)), std::vector<char>(60)); },
       "outer wire: region 1's server (peer 1): step 1 fragment 0 carries 60 bytes (its header says 64), expected "
       "64"},
      {"twice",
       [&](Regions& s) {
         SendRaw(s, 1, 0, Bytes(Header(1, 0, 0, 64)), b64);
         SendRaw(s, 1, 0, Bytes(Header(1, 0, 0, 64)), b64);
       },
       "outer wire: region 1's server (peer 1): step 1 fragment 0 arrived twice"},
      {"too far ahead",
       [&](Regions& s) {
         for (int step : {0, 10, 20}) SendRaw(s, 1, 0, Bytes(Header(1, step, 0, 64)), b64);
       },
       "outer wire: region 1's server (peer 1): step 21 fragment 0 arrived while 2 of its exchanges are held, the "
       "most a region may be ahead"},
      {"stale",
       [&](Regions& s) {
         SendRaw(s, 1, 0, Bytes(Header(1, 0, 0, 64)), b64);
         SendRaw(s, 2, 0, Bytes(Header(2, 0, 0, 64)), b64);
         WaitUntil([&] { return s.wire(0).stats().held == 2; });
         ASSERT_TRUE(SumOf(s.wire(0), 0, 0, b64).ok());
         SendRaw(s, 1, 0, Bytes(Header(1, 0, 0, 64)), b64);
       },
       "outer wire: region 1's server (peer 1): step 1 fragment 0 arrived after step 1 fragment 0 was summed"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Regions s(3, bytes);
    c.send(s);
    // The wire has failed: the next Await says why, in one line.
    EXPECT_EQ(s.wire(0).Await(99, 0).status().message(), c.says);
    EXPECT_EQ(s.wire(0).Send(99, 0, b64.data()).message(), c.says);
  }
}

TEST(OuterWire, ALostRegionIsWaitedForNoLongerAndWhatItStillSendsIsDropped) {
  Regions s(3, {64});
  const std::vector<char> a = RandomBytes(64, 1), c = RandomBytes(64, 3);
  ASSERT_TRUE(s.wire(2).Send(0, 0, c.data()).ok());
  WaitUntil([&] { return s.wire(0).stats().held == 1; });
  // Region 0 waits for region 1, which is let go: Await returns with
  // regions 0 and 2 here, and the vote counts them.
  auto waiting = std::async(std::launch::async, [&] { return s.wire(0).Await(0, 0); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  s.wire(0).Lose(1);
  StatusOr<std::vector<bool>> here = waiting.get();
  ASSERT_TRUE(here.ok()) << here.status().ToString();
  EXPECT_EQ(*here, (std::vector<bool>{true, false, true}));
  std::vector<int> added;
  ASSERT_TRUE(s.wire(0).Sum(0, 0, a.data(), *here, [&](int k, const void*) {
                added.push_back(k);
                return Status::OK();
              }).ok());
  EXPECT_EQ(added, (std::vector<int>{0, 2}));
  // What region 1 sends from now on is dropped, no failure; a send to it
  // is skipped.
  ASSERT_TRUE(s.wire(1).Send(10, 0, a.data()).ok());
  ASSERT_TRUE(s.wire(2).Send(10, 0, c.data()).ok());
  WaitUntil([&] { return s.wire(0).stats().held == 1; });
  here = s.wire(0).Await(10, 0);
  ASSERT_TRUE(here.ok()) << here.status().ToString();
  EXPECT_EQ(*here, (std::vector<bool>{true, false, true}));
  EXPECT_EQ(s.wire(0).stats().received, 2);
  // A vote that counts a region whose contribution is not here is an error.
  EXPECT_EQ(s.wire(0).Sum(10, 0, a.data(), {true, true, true}, {}).code(), Status::Code::kInternal);
}

TEST(OuterWire, ARegionUnreachableAndNotLostFailsTheWireAfterTheTimeout) {
  // Region 1's server cannot be reached (no endpoint: every send to it
  // fails), and no coordinator says it was lost.
  auto t0 = UcxTransport::Create(UcxOptions(0));
  ASSERT_TRUE(t0.ok());
  OuterWire wire((*t0).get(), OuterWire::Options{0, {0, 1}, OuterWire::Payload::kFloat32, {64}, 0.2});
  const std::vector<char> a(64);
  EXPECT_TRUE(wire.Send(0, 0, a.data()).ok());
  const Status st = wire.Await(0, 0).status();
  EXPECT_NE(st.message().find("outer wire: region 1's server (peer 1): unreachable for 0.2 s and not declared lost"),
            std::string::npos)
      << st.ToString();
}

TEST(OuterWire, FailWakesAWaitingSum) {
  Regions s(2, {64});
  const std::vector<char> b64(64);
  auto waiting = std::async(std::launch::async, [&] { return SumOf(s.wire(0), 0, 0, b64).status(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  s.wire(0).Fail(Status::Unavailable("region 1 was lost"));
  EXPECT_EQ(waiting.get().message(), "region 1 was lost");
}

// A region lost and rejoined: the others await its contributions again
// from the next exchange on, and one of them gives it the job's state, which
// it awaits (and nothing else: a state it does not await, of another size
// or a second one fails the wire with one line naming the sender).
TEST(OuterWire, ARegionRejoinedIsAwaitedAgainAndTakesUpTheStateGivenIt) {
  Regions s(3, {64}, OuterWire::Payload::kFloat32, /*state_bytes=*/100);
  const std::vector<char> a = RandomBytes(64, 1), b = RandomBytes(64, 2), c = RandomBytes(64, 3);
  s.wire(0).Lose(2);
  s.wire(1).Lose(2);
  EXPECT_EQ(s.wire(0).InJob(), (std::vector<bool>{true, true, false}));
  ASSERT_TRUE(s.wire(1).Send(4, 0, b.data()).ok());
  StatusOr<Seen> seen = SumOf(s.wire(0), 4, 0, a);
  ASSERT_TRUE(seen.ok()) << seen.status().ToString();
  EXPECT_EQ(seen->order, (std::vector<int>{0, 1}));

  s.wire(0).Rejoin(2);
  EXPECT_EQ(s.wire(0).InJob(), (std::vector<bool>{true, true, true}));
  const std::string state = std::string(RandomBytes(100, 4).data(), 100);
  ASSERT_TRUE(s.wire(0).SendState(2, state).ok());
  StatusOr<std::pair<int, std::string>> got = s.wire(2).AwaitState(10);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->first, 0);
  EXPECT_TRUE(got->second == state);
  // The next exchange waits for region 2's contribution.
  ASSERT_TRUE(s.wire(1).Send(9, 0, b.data()).ok());
  auto waiting = std::async(std::launch::async, [&] { return SumOf(s.wire(0), 9, 0, a); });
  EXPECT_EQ(waiting.wait_for(std::chrono::milliseconds(50)), std::future_status::timeout);
  ASSERT_TRUE(s.wire(2).Send(9, 0, c.data()).ok());
  seen = waiting.get();
  ASSERT_TRUE(seen.ok()) << seen.status().ToString();
  EXPECT_EQ(seen->order, (std::vector<int>{0, 1, 2}));

  // A second state fails region 2's wire.
  ASSERT_TRUE(s.wire(1).SendState(2, state).ok());
  WaitUntil([&] { return !s.wire(2).AwaitState(0).ok(); });
  EXPECT_NE(s.wire(2).AwaitState(0).status().message().find(
                "outer wire: region 1's server (peer 1): the job's state: a second one (the first came from region 0)"),
            std::string::npos)
      << s.wire(2).AwaitState(0).status().ToString();
}

TEST(OuterWire, AStateNotAwaitedOrOfAnotherSizeFailsTheWire) {
  Regions s(3, {64}, OuterWire::Payload::kFloat32, /*state_bytes=*/100);
  ASSERT_TRUE(s.wire(0).SendState(2, std::string(99, 'x')).ok());
  ASSERT_TRUE(s.wire(2).SendState(0, std::string(100, 'x')).ok());  // region 0 rejoins nothing
  const std::vector<char> a(64);
  const Status not_awaited = s.wire(0).Await(0, 0).status();
  EXPECT_NE(not_awaited.message().find("outer wire: region 2's server (peer 2): the job's state: this server is not "
                                       "rejoining the job"),
            std::string::npos)
      << not_awaited.ToString();
  const Status short_state = s.wire(2).AwaitState(10).status();
  EXPECT_NE(short_state.message().find("region 0's server (peer 0): the job's state: 99 bytes, expected 100"),
            std::string::npos)
      << short_state.ToString();
}

TEST(OuterWire, AStateThatDoesNotComeIsAnErrorAfterTheTimeout) {
  Regions s(2, {64}, OuterWire::Payload::kFloat32, /*state_bytes=*/100);
  const Status st = s.wire(1).AwaitState(0.05).status();
  EXPECT_NE(st.message().find("no region gave this one the job's state within 0.05 s (cluster.join_timeout_s)"),
            std::string::npos)
      << st.ToString();
}

}  // namespace
}  // namespace herd::transport
