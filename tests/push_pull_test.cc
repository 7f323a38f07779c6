// The push/pull service over real UCX inside one process (two transports,
// two endpoints): requests with bad ranges are answered with errors that
// name the range, malformed messages are dropped without harm, and large
// requests split into pieces still sum exactly; messages without the job's
// key are dropped before any handler sees them. Multi-process behaviour is
// in tests/transport_*_test.py.
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

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
    // Every piece is refused through UCX's rendezvous, and the intruder
    // sends the next; a single-copy request is dropped unanswered (an
    // answer would go to the peer the intruder claims to be), so only its
    // first window of two pieces leaves it.
    const uint64_t expected = (*intruder_transport)->Lanes(kServer).single_copy ? 1 + 2 + 1 : 1 + 4 + 1;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (server_transport_->stats().unauthenticated_dropped < expected &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // nothing more arrives
    EXPECT_EQ(server_transport_->stats().unauthenticated_dropped, expected);
  }
  const UcxStats stats = server_transport_->stats();
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

// Within a host, payloads from 64 KiB are read by the receiver straight
// out of the sender (one copy): pushes and pulls arrive whole, and the
// bytes are counted as read so.
TEST_F(PushPullTest, LargePayloadsWithinAHostAreReadInOneCopy) {
  if (!client_transport_->Lanes(kServer).single_copy) GTEST_SKIP() << "no shared-memory lane between the transports";
  PushPullClient whole(client_transport_.get(), kShardBytes);  // one piece a request
  std::vector<float> ones(kShardBytes / 4), back(kShardBytes / 4, 0.0f);
  for (size_t i = 0; i < ones.size(); ++i) ones[i] = static_cast<float>(i % 1000);
  ASSERT_TRUE(whole.Wait(whole.Push(kServer, kGradients, 0, ones.data(), kShardBytes)).ok());
  ASSERT_TRUE(whole.Wait(whole.Pull(kServer, kWeights, 0, back.data(), kShardBytes)).ok());
  ASSERT_EQ(ones, back);
  EXPECT_EQ(server_transport_->stats().cma_bytes_read, kShardBytes);  // the push
  EXPECT_EQ(client_transport_->stats().cma_bytes_read, kShardBytes);  // the pull's answer
}

// A sender whose pid names another process here (it runs in another pid
// namespace, as in a container) is found out by the probe it sent: its
// payloads come through UCX instead, whole, and nothing is read from the
// process its pid names.
TEST(UcxTransportCma, APidThatNamesAnotherProcessFallsBackToUcx) {
  if (::geteuid() != 0) GTEST_SKIP() << "a pid namespace needs root";
  ::setenv("UCX_TLS", "sysv,self", 1);  // shared memory that crosses pid namespaces
  int to_child[2], to_parent[2];
  ASSERT_EQ(::pipe(to_child), 0);
  ASSERT_EQ(::pipe(to_parent), 0);
  auto send_string = [](int fd, const std::string& s) {
    const uint32_t n = static_cast<uint32_t>(s.size());
    return ::write(fd, &n, 4) == 4 && ::write(fd, s.data(), n) == static_cast<ssize_t>(n);
  };
  auto read_string = [](int fd) {
    uint32_t n = 0;
    if (::read(fd, &n, 4) != 4) return std::string();
    std::string s(n, '\0');
    size_t got = 0;
    while (got < n) {
      const ssize_t r = ::read(fd, s.data() + got, n - got);
      if (r <= 0) return std::string();
      got += static_cast<size_t>(r);
    }
    return s;
  };
  constexpr uint64_t kBytes = 4 << 20;
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // The client, as pid 1 of a namespace of its own.
    if (::unshare(CLONE_NEWPID) != 0) ::_exit(3);
    const pid_t inner = ::fork();
    if (inner != 0) {
      int status = 0;
      ::waitpid(inner, &status, 0);
      ::_exit(WIFEXITED(status) ? WEXITSTATUS(status) : 4);
    }
    auto t = UcxTransport::Create(UcxOptions(kClient));
    if (!t.ok() || !send_string(to_parent[1], (*t)->address())) ::_exit(5);
    const std::string server = read_string(to_child[0]);
    if (server.empty() || !(*t)->Connect(kServer, server, "server").ok()) ::_exit(6);
    PushPullClient client(t->get(), 1 << 20);
    std::vector<float> ones(kBytes / 4, 1.0f), back(kBytes / 4, 0.0f);
    if (!client.Wait(client.Push(kServer, kGradients, 0, ones.data(), kBytes)).ok()) ::_exit(7);
    if (!client.Wait(client.Pull(kServer, kWeights, 0, back.data(), kBytes)).ok()) ::_exit(8);
    if (back != ones) ::_exit(9);
    ::_exit(send_string(to_parent[1], "pulled") ? 0 : 10);
  }
  auto t = UcxTransport::Create(UcxOptions(kServer));
  ASSERT_TRUE(t.ok()) << t.status().message();
  AccumulatingShard shard(kBytes);
  PushPullServer server(t->get(), &shard);
  const std::string client = read_string(to_parent[0]);
  ASSERT_FALSE(client.empty());
  ASSERT_TRUE((*t)->Connect(kClient, client, "client").ok());
  ASSERT_TRUE(send_string(to_child[1], (*t)->address()));
  EXPECT_EQ(read_string(to_parent[0]), "pulled");  // the server is served until then
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 0) << "the client's step that failed (see the test's exit codes)";
  for (uint64_t i = 0; i < kBytes / 4; ++i) ASSERT_EQ(shard.data()[i], 1.0f) << i;
  EXPECT_EQ((*t)->stats().cma_bytes_read, 0u);
  ::unsetenv("UCX_TLS");
}

}  // namespace
}  // namespace herd::transport
