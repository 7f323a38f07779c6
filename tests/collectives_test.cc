// The UCX ring collectives inside one process: W = 1..5 ranks, each its
// own UCX worker and thread, buffer sizes of 0, 1, fewer elements than
// ranks, not divisible by W, and many chunks. Sums of small integers must
// be exact; sums of random floats bitwise identical on every rank and
// across reruns; uneven partitions (with empty parts) must work for
// reduce-scatter and all-gather; several operations may be in flight.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <thread>
#include <vector>

#include "common/strings.h"
#include "transport/ring_collectives.h"

namespace herd::transport {
namespace {

class Ring {
 public:
  explicit Ring(int W, int64_t chunk_bytes = 256) {
    std::vector<PeerId> peers;
    for (int r = 0; r < W; ++r) {
      auto t = UcxTransport::Create(UcxOptions(r));
      EXPECT_TRUE(t.ok());
      transports_.push_back(std::move(*t));
      peers.push_back(r);
    }
    for (int r = 0; r < W; ++r) {
      collectives_.push_back(std::make_unique<RingCollectives>(transports_[r].get(), r, peers, chunk_bytes));
    }
    for (int r = 0; r < W; ++r) {
      for (int p = 0; p < W; ++p) {
        if (p == r) continue;
        EXPECT_TRUE(transports_[r]->Connect(p, transports_[p]->address(), "rank " + std::to_string(p)).ok());
      }
    }
  }
  ~Ring() {
    collectives_.clear();
    transports_.clear();
  }
  int size() const { return static_cast<int>(collectives_.size()); }
  Collectives& at(int r) { return *collectives_[r]; }
  RingCollectives& ring(int r) { return *collectives_[r]; }
  // Runs fn(rank) on one thread per rank.
  void OnEveryRank(const std::function<void(int)>& fn) {
    std::vector<std::thread> threads;
    for (int r = 0; r < size(); ++r) threads.emplace_back(fn, r);
    for (auto& t : threads) t.join();
  }

 private:
  std::vector<std::unique_ptr<UcxTransport>> transports_;
  std::vector<std::unique_ptr<RingCollectives>> collectives_;
};

const int64_t kSizes[] = {0, 1, 3, 1000, 4099, 100003};

TEST(RingCollectives, EvenPartitionCoversAndAligns) {
  for (int64_t n : kSizes) {
    for (int W = 1; W <= 5; ++W) {
      for (int64_t align : {1, 16}) {
        Partition p = EvenPartition(n, W, align);
        int64_t total = 0;
        for (int r = 0; r < W; ++r) {
          if (r + 1 < W && p[r + 1] > 0) {
            EXPECT_EQ(p[r] % align, 0);
          }
          total += p[r];
        }
        EXPECT_EQ(total, n);
      }
    }
  }
}

TEST(RingCollectives, AllReduceSumsExactlyAndIdenticallyOnEveryRank) {
  for (int W = 1; W <= 5; ++W) {
    Ring ring(W);
    for (int64_t n : kSizes) {
      std::vector<std::vector<float>> ints(W, std::vector<float>(n)), randoms(W, std::vector<float>(n));
      std::mt19937 rng(n + W);
      std::normal_distribution<float> normal(0.0f, 1.0f);
      for (int r = 0; r < W; ++r) {
        for (int64_t i = 0; i < n; ++i) {
          ints[r][i] = static_cast<float>((i * 7 + r * 13) % 101);
          randoms[r][i] = normal(rng) * static_cast<float>(1 + i % 5);
        }
      }
      std::vector<std::vector<double>> doubles(W, std::vector<double>(n));
      for (int r = 0; r < W; ++r) {
        for (int64_t i = 0; i < n; ++i) doubles[r][i] = 1.0 / (1 + r + i);
      }
      ring.OnEveryRank([&](int r) {
        // Three operations in flight at once.
        auto a = ring.at(r).AllReduce(ints[r].data(), n, DType::kFloat32);
        auto b = ring.at(r).AllReduce(randoms[r].data(), n, DType::kFloat32);
        auto c = ring.at(r).AllReduce(doubles[r].data(), n, DType::kFloat64);
        EXPECT_TRUE(ring.at(r).Wait(b).ok());
        EXPECT_TRUE(ring.at(r).Wait(a).ok());
        EXPECT_TRUE(ring.at(r).Wait(c).ok());
      });
      for (int64_t i = 0; i < n; ++i) {
        float expect = 0;
        for (int r = 0; r < W; ++r) expect += static_cast<float>((i * 7 + r * 13) % 101);
        for (int r = 0; r < W; ++r) ASSERT_EQ(ints[r][i], expect) << "W=" << W << " n=" << n << " i=" << i;
        for (int r = 1; r < W; ++r) {
          ASSERT_EQ(std::memcmp(&randoms[r][i], &randoms[0][i], 4), 0) << "rank " << r << " differs at " << i;
          ASSERT_EQ(doubles[r][i], doubles[0][i]);
        }
        double sum = 0;
        for (int r = 0; r < W; ++r) sum += 1.0 / (1 + r + i);
        ASSERT_NEAR(doubles[0][i], sum, 1e-15 * sum);
      }
    }
  }
}

TEST(RingCollectives, ReduceScatterAllGatherAndBroadcastWithUnevenParts) {
  for (int W = 1; W <= 5; ++W) {
    Ring ring(W, 64);
    for (int64_t n : kSizes) {
      // Uneven parts: everything to the last rank but a few elements; some empty.
      Partition parts(W, 0);
      parts[W - 1] = n;
      if (W > 2 && n >= 5) {
        parts[1] = 5;
        parts[W - 1] = n - 5;
      }
      std::vector<int64_t> begin(W + 1, 0);
      for (int r = 0; r < W; ++r) begin[r + 1] = begin[r] + parts[r];
      std::vector<std::vector<float>> data(W, std::vector<float>(n));
      for (int r = 0; r < W; ++r) {
        for (int64_t i = 0; i < n; ++i) data[r][i] = static_cast<float>(r + 1) * (i % 17);
      }
      ring.OnEveryRank(
          [&](int r) { EXPECT_TRUE(ring.at(r).Wait(ring.at(r).ReduceScatter(data[r].data(), parts)).ok()); });
      const float ranks_sum = W * (W + 1) / 2.0f;
      for (int r = 0; r < W; ++r) {
        for (int64_t i = begin[r]; i < begin[r + 1]; ++i) ASSERT_EQ(data[r][i], ranks_sum * (i % 17)) << r << " " << i;
      }
      // All-gather the reduced parts back: every rank then holds the full sum.
      ring.OnEveryRank([&](int r) { EXPECT_TRUE(ring.at(r).Wait(ring.at(r).AllGather(data[r].data(), parts)).ok()); });
      for (int r = 0; r < W; ++r) {
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(data[r][i], ranks_sum * (i % 17)) << r << " " << i;
      }
      for (int root = 0; root < W; ++root) {
        for (int r = 0; r < W; ++r) {
          for (int64_t i = 0; i < n; ++i) data[r][i] = r == root ? static_cast<float>(i + root) : -1.0f;
        }
        ring.OnEveryRank(
            [&](int r) { EXPECT_TRUE(ring.at(r).Wait(ring.at(r).Broadcast(data[r].data(), n, root)).ok()); });
        for (int r = 0; r < W; ++r) {
          for (int64_t i = 0; i < n; ++i) ASSERT_EQ(data[r][i], static_cast<float>(i + root)) << root << " " << r;
        }
      }
    }
  }
}

// A bf16 wire: every rank holds bitwise the same sums (each rounded to
// bf16), a reduce-scatter's owner the same as the all-reduce gives it,
// within bf16 rounding of the exact sum for each hop; small integers stay
// exact.
TEST(RingCollectives, Bf16WireSumsIdenticallyAndOwnersMatchTheAllReduce) {
  for (int W = 1; W <= 4; ++W) {
    Ring ring(W, 256);
    for (int64_t n : kSizes) {
      std::vector<std::vector<float>> ints(W, std::vector<float>(n)), all(W, std::vector<float>(n));
      std::mt19937 rng(n + W);
      std::normal_distribution<float> normal(0.0f, 1.0f);
      for (int r = 0; r < W; ++r) {
        for (int64_t i = 0; i < n; ++i) {
          ints[r][i] = static_cast<float>((i * 7 + r * 13) % 31);
          all[r][i] = normal(rng);
        }
      }
      std::vector<std::vector<float>> scattered = all, inputs = all;
      const Partition parts = EvenPartition(n, W, kCollectiveAlign);
      ring.OnEveryRank([&](int r) {
        auto a = ring.at(r).AllReduce(all[r].data(), n, DType::kFloat32, Wire::kBf16);
        auto b = ring.at(r).ReduceScatter(scattered[r].data(), parts, Wire::kBf16);
        auto c = ring.at(r).AllReduce(ints[r].data(), n, DType::kFloat32, Wire::kBf16);
        EXPECT_TRUE(ring.at(r).Wait(a).ok());
        EXPECT_TRUE(ring.at(r).Wait(b).ok());
        EXPECT_TRUE(ring.at(r).Wait(c).ok());
      });
      int64_t at = 0;
      for (int owner = 0; owner < W; ++owner) {
        for (int64_t i = at; i < at + parts[owner]; ++i) {
          for (int r = 0; r < W; ++r) {
            ASSERT_EQ(std::memcmp(&all[r][i], &all[0][i], 4), 0) << "W=" << W << " rank " << r << " differs at " << i;
          }
          ASSERT_EQ(std::memcmp(&scattered[owner][i], &all[0][i], 4), 0) << "W=" << W << " owner " << owner << " at " << i;
          float exact = 0, magnitude = 0, expect = 0;
          for (int r = 0; r < W; ++r) {
            exact += inputs[r][i];
            magnitude += std::abs(inputs[r][i]);
            expect += static_cast<float>((i * 7 + r * 13) % 31);
          }
          // Each of W roundings errs by at most 2^-9 of what it rounds.
          if (W > 1) ASSERT_NEAR(all[0][i], exact, W * magnitude / 256) << "W=" << W << " at " << i;
          ASSERT_EQ(ints[0][i], expect);
        }
        at += parts[owner];
      }
    }
  }
}

// A rank that issues late (here 200 ms, three operations of 1024 chunks
// each) is sent kRingChunksAhead chunks ahead at most: no rank ever holds
// more than kRingChunkBuffers chunk buffers, and the sums are right.
TEST(RingCollectives, ALateRankHoldsBoundedChunks) {
  const int W = 4;
  Ring ring(W, 4096);
  const int64_t n = 1 << 20;
  std::vector<std::vector<std::vector<float>>> data(3, std::vector<std::vector<float>>(W, std::vector<float>(n)));
  for (int k = 0; k < 3; ++k) {
    for (int r = 0; r < W; ++r) {
      for (int64_t i = 0; i < n; ++i) data[k][r][i] = static_cast<float>((i + k + r) % 7);
    }
  }
  ring.OnEveryRank([&](int r) {
    if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    std::vector<Collectives::Handle> h;
    for (int k = 0; k < 3; ++k) h.push_back(ring.at(r).AllReduce(data[k][r].data(), n, DType::kFloat32));
    for (auto handle : h) EXPECT_TRUE(ring.at(r).Wait(handle).ok());
  });
  for (int k = 0; k < 3; ++k) {
    for (int64_t i = 0; i < n; i += 997) {
      float expect = 0;
      for (int r = 0; r < W; ++r) expect += static_cast<float>((i + k + r) % 7);
      for (int r = 0; r < W; ++r) ASSERT_EQ(data[k][r][i], expect) << k << " " << r << " " << i;
    }
  }
  for (int r = 0; r < W; ++r) {
    EXPECT_LE(ring.ring(r).peak_chunk_buffers(), kRingChunkBuffers) << "rank " << r;
  }
  EXPECT_GE(ring.ring(1).peak_chunk_buffers(), kRingChunksAhead) << "the late rank was sent chunks ahead";
}

// Ring messages are checked before use: a chunk from a peer that is not
// the left-hand neighbour, or one whose header or length does not fit the
// operation, fails the operation with a line saying so.
TEST(RingCollectives, MalformedMessagesFailTheOperation) {
  struct Case {
    PeerId from;        // 0 = rank 0 (rank 1's left neighbour); 2 = an outsider
    size_t header_bytes;
    uint64_t seq;
    uint32_t step;
    size_t payload_bytes;
    const char* expect;
  };
  const Case cases[] = {
      {2, 24, 0, 0, 64, "not the left-hand neighbour"},
      {0, 7, 0, 0, 64, "malformed header"},
      {0, 24, 0, 0, 12, "unexpected chunk"},           // wrong length for the op's chunk
      // No such step: refused either way, as a chunk of the running operation
      // or, when it comes before the operation has started on the progress
      // thread, as one that cannot be kept for it.
      {0, 24, 0, 5, 64, "unexpected chunk|cannot be expected"},
      {0, 24, 999999999, 0, 64, "cannot be expected"},  // an operation far in the future
  };
  for (const Case& c : cases) {
    // Two real ranks (0 and 1) and an outsider transport (PeerId 2) that
    // rank 1 also knows.
    std::vector<std::unique_ptr<UcxTransport>> t;
    for (PeerId p = 0; p < 3; ++p) t.push_back(std::move(UcxTransport::Create(UcxOptions(p)).value()));
    RingCollectives rank1(t[1].get(), 1, {0, 1}, 64);
    ASSERT_TRUE(t[1]->Connect(0, t[0]->address(), "rank 0").ok());
    ASSERT_TRUE(t[1]->Connect(2, t[2]->address(), "outsider").ok());
    ASSERT_TRUE(t[0]->Connect(1, t[1]->address(), "rank 1").ok());
    ASSERT_TRUE(t[2]->Connect(1, t[1]->address(), "rank 1").ok());
    std::vector<float> data(32, 1.0f);
    auto handle = rank1.AllReduce(data.data(), 32, DType::kFloat32);  // op 0: 16 floats per part
    std::string header(c.header_bytes, '\0');
    if (c.header_bytes == 24) {
      std::memcpy(header.data(), &c.seq, 8);
      std::memcpy(header.data() + 12, &c.step, 4);
    }
    std::vector<char> payload(c.payload_bytes, 0);
    t[c.from]->Send(1, kAmRing, header, payload.data(), payload.size(), [](const Status&) {});
    Status st = rank1.Wait(handle);
    ASSERT_FALSE(st.ok()) << c.expect;
    bool named = false;
    for (const std::string& alternative : Split(c.expect, '|')) named |= st.message().find(alternative) != std::string::npos;
    EXPECT_TRUE(named) << st.message() << " (expected " << c.expect << ")";
    t[0]->Shutdown();
    t[2]->Shutdown();
  }
}

TEST(RingCollectives, BadArgumentsAndFailuresAreReported) {
  Ring ring(3);
  std::vector<float> x(10);
  Status st = ring.at(0).Wait(ring.at(0).ReduceScatter(x.data(), {5, 5}));
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("one part per rank"), std::string::npos) << st.message();
  ring.at(1).Fail(Status::Unavailable("worker rank 2 was lost"));
  st = ring.at(1).Wait(ring.at(1).AllReduce(x.data(), 10, DType::kFloat32));
  EXPECT_NE(st.message().find("was lost"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace herd::transport
