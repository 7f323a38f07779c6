// The push/pull service over real UCX inside one process (two transports,
// two endpoints): requests with bad ranges are answered with errors that
// name the range, malformed messages are dropped without harm, and large
// requests split into pieces still sum exactly; messages without the job's
// key are dropped before any handler sees them. Multi-process behaviour is
// in tests/transport_*_test.py.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <future>
#include <thread>
#include <vector>

#include "transport/push_pull.h"

namespace herd::transport {
namespace {

constexpr RequestKind kGradients = RequestKind::kGradients;
constexpr RequestKind kWeights = RequestKind::kWeights;

constexpr PeerId kServer = 0, kClient = 1;

class PushPullTest : public testing::Test {
 protected:
  void SetUp() override {
    auto s = UcxTransport::Create(UcxOptions(kServer));
    auto c = UcxTransport::Create(UcxOptions(kClient));
    ASSERT_TRUE(s.ok() && c.ok());
    server_transport_ = std::move(*s);
    client_transport_ = std::move(*c);
    shard_ = std::make_unique<AccumulatingShard>(kShardBytes);
    server_ = std::make_unique<PushPullServer>(server_transport_.get(), shard_.get());
    // Small pieces so that one request spans several messages.
    client_ = std::make_unique<PushPullClient>(client_transport_.get(), 64 << 10);
    ASSERT_TRUE(server_transport_->Connect(kClient, client_transport_->address(), "client").ok());
    ASSERT_TRUE(client_transport_->Connect(kServer, server_transport_->address(), "server").ok());
  }
  void TearDown() override {
    client_.reset();
    server_.reset();
  }

  static constexpr uint64_t kShardBytes = 1 << 20;
  std::unique_ptr<UcxTransport> server_transport_, client_transport_;
  std::unique_ptr<AccumulatingShard> shard_;
  std::unique_ptr<PushPullServer> server_;
  std::unique_ptr<PushPullClient> client_;
};

TEST_F(PushPullTest, PiecesSumExactlyAndCompleteOutOfOrder) {
  std::vector<float> ones(kShardBytes / 4, 1.0f), twos(kShardBytes / 4, 2.0f), back(kShardBytes / 4, 0.0f);
  auto a = client_->Push(kServer, kGradients, 0, ones.data(), kShardBytes);
  auto b = client_->Push(kServer, kGradients, 0, twos.data(), kShardBytes);
  ASSERT_TRUE(client_->Wait(b).ok());
  ASSERT_TRUE(client_->Wait(a).ok());
  ASSERT_TRUE(client_->Wait(client_->Pull(kServer, kWeights, 0, back.data(), kShardBytes)).ok());
  for (float v : back) ASSERT_EQ(v, 3.0f);
}

TEST_F(PushPullTest, BadRangesAreAnsweredWithErrorsThatNameThem) {
  std::vector<float> data(1024, 1.0f);
  auto expect_error = [&](PushPullClient::Ticket t, const std::string& needle) {
    Status st = client_->Wait(t);
    ASSERT_FALSE(st.ok()) << needle;
    EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
  };
  expect_error(client_->Push(kServer, kGradients, kShardBytes - 8, data.data(), 16),
               "is outside this server's 1048576 bytes");
  expect_error(client_->Pull(kServer, kWeights, kShardBytes, data.data(), 4), "pull of [1048576, 1048580)");
  expect_error(client_->Push(kServer, kGradients, 2, data.data(), 8), "not a whole number of float32s");
  expect_error(client_->Push(kServer, kGradients, ~0ull - 3, data.data(), 8), "is outside");  // offset + length overflows
  // Kinds the handler does not take are refused by kind, whatever the range.
  expect_error(client_->Push(kServer, RequestKind::kLoss, 0, data.data(), 8),
               "push of loss [0, 8): this server takes no such requests");
  expect_error(client_->Pull(kServer, RequestKind::kReport, 0, data.data(), 32),
               "pull of report [0, 32): this server takes no such requests");
  // The server is unharmed: a good request still works.
  EXPECT_TRUE(client_->Wait(client_->Push(kServer, kGradients, 0, data.data(), 4096)).ok());
}

TEST_F(PushPullTest, MalformedMessagesAreDroppedAndServingGoesOn) {
  std::vector<float> data(256, 5.0f), back(256, 0.0f);
  std::atomic<int> sent{0};
  // Headers of the wrong size, to each of the service's message types.
  for (uint16_t am : {kAmPush, kAmPull, kAmReply}) {
    client_transport_->Send(kServer, am, std::string(5, 'x'), data.data(), 16, [&](const Status&) { ++sent; });
  }
  server_transport_->Send(kClient, kAmReply, std::string(3, 'y'), nullptr, 0, [&](const Status&) { ++sent; });
  // Whole headers of kinds that do not exist or travel the other way
  // (uint64 id, tag, offset, length; uint32 kind, reserved).
  for (uint32_t kind : {0u, 9u, static_cast<uint32_t>(RequestKind::kWeights)}) {
    std::string header(40, '\0');
    const uint64_t fields[4] = {~0ull, 0, 0, 16};
    std::memcpy(header.data(), fields, sizeof fields);
    std::memcpy(header.data() + 32, &kind, sizeof kind);
    client_transport_->Send(kServer, kAmPush, header, data.data(), 16, [&](const Status&) { ++sent; });
  }
  ASSERT_TRUE(client_->Wait(client_->Push(kServer, kGradients, 0, data.data(), 1024)).ok());
  ASSERT_TRUE(client_->Wait(client_->Pull(kServer, kWeights, 0, back.data(), 1024)).ok());
  EXPECT_EQ(back, data);
}

// Something that reaches the server's UCX worker without the job's key —
// here well-formed pushes and pulls from a transport keyed by another
// token, claiming to be the client — is dropped before any handler runs,
// and counted; the job's own traffic goes on.
TEST_F(PushPullTest, MessagesWithoutTheJobKeyAreDroppedAndCounted) {
  UcxOptions foreign(kClient);
  foreign.key = DataPlaneKey::FromToken("another job's token");
  auto intruder_transport = UcxTransport::Create(foreign);
  ASSERT_TRUE(intruder_transport.ok());
  std::vector<float> bad(kShardBytes / 4, 100.0f), back(kShardBytes / 4, -1.0f);
  {
    PushPullClient intruder(intruder_transport->get(), 64 << 10);
    ASSERT_TRUE((*intruder_transport)->Connect(kServer, server_transport_->address(), "server").ok());
    intruder.Push(kServer, kGradients, 0, bad.data(), 1024);           // eager
    intruder.Push(kServer, kGradients, 0, bad.data(), 256 << 10);      // rendezvous, in pieces
    intruder.Pull(kServer, kWeights, 0, back.data(), 1024);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (server_transport_->stats().unauthenticated_dropped < 6 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  const UcxStats stats = server_transport_->stats();
  EXPECT_EQ(stats.unauthenticated_dropped, 6u);  // 1 + 4 pieces + 1
  EXPECT_EQ(stats.malformed_dropped, 0u);
  ASSERT_TRUE(client_->Wait(client_->Pull(kServer, kWeights, 0, back.data(), kShardBytes)).ok());
  for (float v : back) ASSERT_EQ(v, 0.0f);
}

TEST(DataPlaneKey, DerivedFromTheTokenWithoutRevealingIt) {
  const DataPlaneKey a = DataPlaneKey::FromToken("token-a"), again = DataPlaneKey::FromToken("token-a");
  const DataPlaneKey b = DataPlaneKey::FromToken("token-b");
  EXPECT_EQ(a.bytes, again.bytes);
  EXPECT_NE(a.bytes, b.bytes);
  EXPECT_NE(a.bytes, DataPlaneKey().bytes);
  const std::string key(a.bytes.begin(), a.bytes.end());
  EXPECT_EQ(key.find("token"), std::string::npos);
}

// A send that reaches the progress thread only after Shutdown has closed
// the endpoints (a server answering queued pulls with its failure while
// it stops) is dropped: it must not run on a closed endpoint, and no
// completion runs after Shutdown.
TEST_F(PushPullTest, SendQueuedBehindShutdownIsDropped) {
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  client_transport_->Post([released] { released.wait(); });  // holds the progress thread
  std::thread stopper([&] { client_transport_->Shutdown(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // its close is now queued
  std::vector<float> data(4, 1.0f);
  bool completed = false;
  client_transport_->Send(kServer, kAmPush, std::string(40, '\0'), data.data(), 16,
                          [&](const Status&) { completed = true; });
  release.set_value();
  stopper.join();
  EXPECT_FALSE(completed);
}

}  // namespace
}  // namespace herd::transport
