// Control plane units: frame codec and validation, placement from flags and
// launcher environments, tokens, config hashes; and the coordinator with
// in-process clients for rank assignment, barriers and all-gathers (the
// multi-process behaviour is in tests/transport_*_test.py).
#include <gmock/gmock.h>
#include <glog/logging.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <map>
#include <mutex>
#include <thread>

#include "common/config.h"
#include "common/file_util.h"
#include "transport/coordinator.h"
#include "transport/coordinator_client.h"
#include "transport/exchanges.h"
#include "transport/rendezvous.h"
#include "transport/wire.h"

namespace herd::transport {
namespace {

using ::testing::HasSubstr;

wire::Envelope ValidHello() {
  wire::Envelope m;
  auto* h = m.mutable_hello();
  h->set_token("t");
  h->set_role(wire::WORKER);
  h->set_servers(1);
  h->set_workers(2);
  h->set_heartbeat_interval_ms(100);
  h->set_heartbeat_timeout_ms(1000);
  h->set_join_timeout_ms(10000);
  return m;
}

TEST(Wire, FrameRoundTripAcrossArbitraryChunks) {
  wire::Envelope a = ValidHello(), b;
  b.mutable_barrier()->set_name("step/3");
  const std::string stream = EncodeFrame(a) + EncodeFrame(b);
  for (size_t chunk : {size_t{1}, size_t{3}, size_t{7}, stream.size()}) {
    FrameReader reader(1 << 16);
    std::vector<wire::Envelope> got;
    for (size_t at = 0; at < stream.size(); at += chunk) {
      ASSERT_TRUE(reader.Append(stream.data() + at, std::min(chunk, stream.size() - at)).ok());
      wire::Envelope m;
      Status st;
      while (reader.Next(&m, &st)) got.push_back(m);
      ASSERT_TRUE(st.ok()) << st.message();
    }
    ASSERT_EQ(got.size(), 2u);
    EXPECT_EQ(got[0].hello().token(), "t");
    EXPECT_EQ(got[1].barrier().name(), "step/3");
  }
}

TEST(Wire, OversizedFrameRefusedFromItsHeader) {
  FrameReader reader(1024);
  const uint8_t header[4] = {0x01, 0x04, 0x00, 0x00};  // 1025 bytes announced
  Status st = reader.Append(header, 4);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("exceeds the bound of 1024"), std::string::npos) << st.message();
}

TEST(Wire, GarbageAndInvalidMessagesRefused) {
  wire::Envelope m;
  EXPECT_NE(DecodeBody("\xff\xff\xff", &m).message().find("does not parse"), std::string::npos);
  EXPECT_NE(DecodeBody("", &m).message().find("no message body"), std::string::npos);
  auto expect_bad = [](wire::Envelope e, const std::string& needle) {
    Status st = ValidateMessage(e);
    EXPECT_FALSE(st.ok()) << needle;
    EXPECT_NE(st.message().find(needle), std::string::npos) << st.message();
  };
  wire::Envelope h = ValidHello();
  h.mutable_hello()->set_role(wire::ROLE_UNSET);
  expect_bad(h, "role");
  h = ValidHello();
  h.mutable_hello()->set_rank(-5);
  expect_bad(h, "rank -5");
  h = ValidHello();
  h.mutable_hello()->set_world_size(2);
  h.mutable_hello()->set_rank(2);
  expect_bad(h, "not below world_size");
  h = ValidHello();
  h.mutable_hello()->set_ucx_address(std::string(kMaxUcxAddressBytes + 1, 'a'));
  expect_bad(h, "UCX address");
  h = ValidHello();
  h.mutable_hello()->set_heartbeat_timeout_ms(50);
  expect_bad(h, "heartbeat");
  wire::Envelope b;
  b.mutable_barrier()->set_name("");
  expect_bad(b, "name is empty");
  b.mutable_barrier()->set_name(std::string(300, 'x'));
  expect_bad(b, "longer than 256");
  wire::Envelope w;
  w.mutable_welcome()->set_role(wire::WORKER);
  w.mutable_welcome()->set_rank(0);
  w.mutable_welcome()->add_members()->set_role(wire::SERVER);
  expect_bad(w, "does not include the receiver");
  wire::Envelope c;
  auto* change = c.mutable_membership_changed();
  change->set_epoch(2);
  change->mutable_joined()->set_role(wire::WORKER);
  change->mutable_joined()->set_rank(1);
  change->mutable_joined()->set_ucx_address("addr");
  change->add_live_workers(0);
  expect_bad(c, "the joined worker is not listed as live");
  change->add_live_workers(1);
  EXPECT_TRUE(ValidateMessage(c).ok()) << ValidateMessage(c).message();
  *change->mutable_lost() = change->joined();
  expect_bad(c, "neither or both");
  change->clear_lost();
  // A region rejoining: the members joining with the first, each with an
  // address; a loss names none.
  wire::Member* with = change->add_joined_with();
  with->set_role(wire::SERVER);
  with->set_rank(1);
  expect_bad(c, "a joining member has no UCX address");
  with->set_ucx_address("addr2");
  EXPECT_TRUE(ValidateMessage(c).ok()) << ValidateMessage(c).message();
  *change->mutable_lost() = change->joined();
  change->clear_joined();
  change->mutable_lost()->clear_ucx_address();
  change->clear_live_workers();
  change->add_live_workers(0);
  expect_bad(c, "a loss has members join");
  change->clear_joined_with();
  change->clear_lost();
  change->mutable_joined()->set_role(wire::WORKER);
  change->mutable_joined()->set_rank(1);
  change->add_live_workers(1);
  expect_bad(c, "no UCX address");
  wire::Envelope g;
  g.mutable_all_gather()->set_name("vote");
  g.mutable_all_gather()->add_members(-1);
  expect_bad(g, "a member index below 0");
  g.mutable_all_gather()->set_members(0, 0);
  g.mutable_all_gather()->set_members_epoch(-1);
  expect_bad(g, "a membership epoch below 0");
  g.mutable_all_gather()->set_members_epoch(0);
  g.mutable_all_gather()->set_scope(wire::REGION);
  expect_bad(g, "a region's scope is for barriers");
  wire::Envelope ack;
  ack.mutable_membership_ack()->set_epoch(0);
  expect_bad(ack, "epoch must be >= 1");
}

using Env = std::map<std::string, std::string>;
EnvLookup FakeEnv(Env env) {
  return [env](const std::string& k) -> std::optional<std::string> {
    auto it = env.find(k);
    if (it == env.end()) return std::nullopt;
    return it->second;
  };
}

TEST(Rendezvous, PlacementPrecedence) {
  auto p = ResolvePlacement("", "", "10.0.0.1:29400", FakeEnv({}));
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->rank, -1);
  EXPECT_EQ(p->coordinator, "10.0.0.1:29400");

  p = ResolvePlacement("", "", "x:1", FakeEnv({{"RANK", "2"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "node0"},
                                                {"MASTER_PORT", "1234"}}));
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_EQ(p->rank, 2);
  EXPECT_EQ(p->world_size, 4);
  EXPECT_EQ(p->coordinator, "node0:1234");
  EXPECT_EQ(p->rank_source, "RANK");

  // Slurm beats torchrun variables; flags beat both.
  p = ResolvePlacement("", "", "x:1", FakeEnv({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"}, {"RANK", "1"}}));
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->rank, 5);
  EXPECT_EQ(p->world_size, 8);
  p = ResolvePlacement("3", "h:9", "x:1", FakeEnv({{"SLURM_PROCID", "5"}, {"MASTER_ADDR", "m"}, {"MASTER_PORT", "2"}}));
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->rank, 3);
  EXPECT_EQ(p->coordinator, "h:9");
}

TEST(Rendezvous, BadPlacementsNameTheirSource) {
  auto expect_bad = [](StatusOr<Placement> p, const std::string& needle) {
    ASSERT_FALSE(p.ok()) << needle;
    EXPECT_NE(p.status().message().find(needle), std::string::npos) << p.status().message();
  };
  expect_bad(ResolvePlacement("x", "", "h:1", FakeEnv({})), "--rank");
  expect_bad(ResolvePlacement("", "", "h:1", FakeEnv({{"RANK", "4"}, {"WORLD_SIZE", "4"}})), "not below world size");
  expect_bad(ResolvePlacement("", "", "h:1", FakeEnv({{"MASTER_ADDR", "m"}})), "MASTER_PORT");
  expect_bad(ResolvePlacement("", "nohost", "h:1", FakeEnv({})), "--coordinator");
  expect_bad(ResolvePlacement("", "h:0", "h:1", FakeEnv({})), "cannot be 0");
  expect_bad(ResolvePlacement("", "h:70000", "h:1", FakeEnv({})), "0..65535");
}

TEST(Rendezvous, TokenFromFileOrEnvironmentNeverEmpty) {
  const std::string dir = testing::TempDir() + "herd_token_test";
  ASSERT_TRUE(MakeDirs(dir).ok());
  const std::string path = JoinPath(dir, "job.token");
  auto token = CreateJobToken(path);
  ASSERT_TRUE(token.ok());
  EXPECT_EQ(token->size(), 64u);
  struct stat st;
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(*LoadJobToken(path, FakeEnv({})), *token);
  EXPECT_EQ(*LoadJobToken("", FakeEnv({{"HERD_JOB_TOKEN_FILE", path}})), *token);
  EXPECT_EQ(*LoadJobToken("", FakeEnv({{"HERD_JOB_TOKEN", " abc \n"}})), "abc");
  EXPECT_FALSE(LoadJobToken("", FakeEnv({})).ok());
  EXPECT_FALSE(LoadJobToken("", FakeEnv({{"HERD_JOB_TOKEN", ""}})).ok());
  EXPECT_FALSE(LoadJobToken(dir + "/missing", FakeEnv({})).ok());
}

TEST(Rendezvous, ConfigHashIgnoresSpelledOutDefaults) {
  auto a = ParseJobConfig("train { steps: 5 }", "a");
  auto c = ParseJobConfig("train { steps: 6 }", "c");
  ASSERT_TRUE(a.ok() && c.ok());
  EXPECT_NE(ConfigHash(*a), ConfigHash(*c));
  JobConfig d = *a;
  d.mutable_train()->set_seed(d.train().seed());  // spelled out, same value
  EXPECT_EQ(ConfigHash(*a), ConfigHash(d));
}

// The coordinator in a thread and clients in threads of this process.
// A coordinator for `shape` (token "secret") serving on a thread of its
// own; Join makes an in-process client of it. Finish waits for Run()'s end.
class TestCoordinator {
 public:
  explicit TestCoordinator(const JobShape& shape) : shape_(shape) {
    CoordinatorOptions options;
    options.token = "secret";
    options.job = shape;
    auto started = Coordinator::Start(options);
    CHECK(started.ok()) << started.status().message();
    coordinator_ = std::move(*started);
    serve_ = std::thread([this] { result_ = coordinator_->Run(); });
  }
  ~TestCoordinator() {
    if (serve_.joinable()) serve_.join();
  }
  // `shape`: what the client believes the job is (default: the coordinator's).
  StatusOr<std::unique_ptr<CoordinatorClient>> Join(wire::Role role, int rank = -1,
                                                    const std::string& ucx_address = "addr",
                                                    const JobShape* shape = nullptr) {
    JoinOptions o;
    o.coordinator = "127.0.0.1:" + std::to_string(coordinator_->port());
    o.token = "secret";
    o.role = role;
    o.rank = rank;
    o.job = shape != nullptr ? *shape : shape_;
    o.ucx_address = ucx_address;
    return CoordinatorClient::Join(o);
  }
  // A worker joining the job under way (--join); a job of regions: a
  // region's process, rejoining.
  StatusOr<std::unique_ptr<CoordinatorClient>> JoinRunning(int rank = -1, const std::string& ucx_address = "addr",
                                                           wire::Role role = wire::WORKER) {
    JoinOptions o;
    o.coordinator = "127.0.0.1:" + std::to_string(coordinator_->port());
    o.token = "secret";
    o.role = role;
    o.rank = rank;
    o.job = shape_;
    o.ucx_address = ucx_address;
    o.join = true;
    return CoordinatorClient::Join(o);
  }
  Status Finish() {
    serve_.join();
    return result_;
  }

 private:
  const JobShape shape_;
  std::unique_ptr<Coordinator> coordinator_;
  Status result_;
  std::thread serve_;
};

TEST(Coordinator, RanksBarriersAndAllGather) {
  TestCoordinator coordinator(JobShape{.servers = 1, .workers = 3, .heartbeat_interval_s = 0.2,
                                       .heartbeat_timeout_s = 5, .join_timeout_s = 20});
  auto join = [&](wire::Role role, int rank) {
    return coordinator.Join(role, rank, "addr-" + std::to_string(role) + "-" + std::to_string(rank));
  };
  std::vector<std::thread> threads;
  std::vector<std::string> failures(4);
  std::vector<int> ranks(4, -1);
  std::vector<std::vector<std::string>> gathered(4);
  // Worker 2 asks for its rank; the others are assigned the remaining ones.
  const std::vector<std::pair<wire::Role, int>> who = {{wire::SERVER, -1}, {wire::WORKER, 2}, {wire::WORKER, -1},
                                                       {wire::WORKER, -1}};
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      auto c = join(who[i].first, who[i].second);
      if (!c.ok()) {
        failures[i] = c.status().message();
        return;
      }
      ranks[i] = (*c)->rank();
      Status st = (*c)->Barrier("b1");
      if (st.ok() && (*c)->role() == wire::WORKER) st = (*c)->Barrier("w", wire::WORKERS);
      auto g = (*c)->AllGather("g", "from-" + std::to_string((*c)->role()) + "-" + std::to_string((*c)->rank()));
      if (!st.ok() || !g.ok()) {
        failures[i] = st.ok() ? g.status().message() : st.message();
        return;
      }
      gathered[i] = *g;
      EXPECT_EQ((*c)->members().size(), 4u);
      EXPECT_EQ((*c)->member(wire::WORKER, 2).ucx_address(), "addr-2-2");
      failures[i] = (*c)->Leave().ToString();
    });
  }
  for (auto& t : threads) t.join();
  const Status result = coordinator.Finish();
  for (int i = 0; i < 4; ++i) EXPECT_EQ(failures[i], "ok") << i;
  EXPECT_TRUE(result.ok()) << result.message();
  EXPECT_EQ(ranks[0], 0);
  EXPECT_EQ(ranks[1], 2);
  std::vector<int> assigned = {ranks[2], ranks[3]};
  std::sort(assigned.begin(), assigned.end());
  EXPECT_EQ(assigned, (std::vector<int>{0, 1}));
  const std::vector<std::string> expected = {"from-1-0", "from-2-0", "from-2-1", "from-2-2"};
  for (int i = 0; i < 4; ++i) EXPECT_EQ(gathered[i], expected) << i;
}

// Typed exchanges: each contribution arrives as its message, in scope
// order; one that does not parse is an error that names who sent it.
TEST(Coordinator, TypedExchangesParseEachContributionAndNameAMalformedOne) {
  TestCoordinator coordinator(JobShape{.servers = 2, .workers = 1, .heartbeat_interval_s = 0.2,
                                       .heartbeat_timeout_s = 5, .join_timeout_s = 20});
  std::vector<std::thread> threads;
  std::string worker = "not joined";
  threads.emplace_back([&] {
    auto c = coordinator.Join(wire::WORKER, 0);
    worker = c.ok() ? (*c)->Leave().ToString() : c.status().message();
  });
  std::vector<std::vector<double>> sums(2);
  std::vector<std::string> malformed(2), failures(2);
  for (int s = 0; s < 2; ++s) {
    threads.emplace_back([&, s] {
      auto c = coordinator.Join(wire::SERVER, s);
      if (!c.ok()) {
        failures[s] = c.status().message();
        return;
      }
      wire::NormShare mine;
      mine.set_sum_of_squares(10.0 + s);
      mine.set_loss(s);
      auto all = Gather(**c, NormExchange(1), mine);
      if (all.ok()) {
        for (const wire::NormShare& n : *all) sums[s].push_back(n.sum_of_squares());
      }
      // Server 1 sends bytes that are no NormShare (a length past the end).
      if (s == 1) {
        auto raw = (*c)->AllGather(NormExchange(2).key, std::string("\x0a\x7f", 2), wire::SERVERS);
        malformed[s] = raw.ok() ? "sent" : raw.status().message();
      } else {
        auto bad = Gather(**c, NormExchange(2), mine);
        malformed[s] = bad.ok() ? "accepted" : bad.status().message();
      }
      failures[s] = (*c)->Leave().ToString();
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_TRUE(coordinator.Finish().ok());
  EXPECT_EQ(worker, "ok");
  for (int s = 0; s < 2; ++s) {
    EXPECT_EQ(failures[s], "ok") << s;
    EXPECT_EQ(sums[s], (std::vector<double>{10.0, 11.0})) << s;
  }
  EXPECT_EQ(malformed[1], "sent");
  EXPECT_NE(malformed[0].find("herd/norm/2: server rank 1"), std::string::npos) << malformed[0];
  EXPECT_NE(malformed[0].find("malformed NormShare"), std::string::npos) << malformed[0];
}

// A data-plane error is reported as the coordinator's word on the job when
// that word comes (another process's end is the cause), as itself when it
// does not, and any other error at once.
TEST(Coordinator, ExplainPrefersTheJobsFailureToAnEchoOfIt) {
  TestCoordinator coordinator(JobShape{.servers = 1, .workers = 1, .heartbeat_interval_s = 0.2,
                                       .heartbeat_timeout_s = 5, .join_timeout_s = 20});
  StatusOr<std::unique_ptr<CoordinatorClient>> server = Status::Internal("not joined");
  std::thread joining([&] { server = coordinator.Join(wire::SERVER); });
  auto worker = coordinator.Join(wire::WORKER);
  joining.join();
  ASSERT_TRUE(server.ok() && worker.ok());

  const Status bad_input = Status::InvalidArgument("step 3: bad input");
  EXPECT_EQ((*worker)->Explain(bad_input, 30).message(), bad_input.message());  // at once
  const Status echo = Status::Unavailable("UCX send to server rank 0: rejected by remote peer");
  EXPECT_EQ((*worker)->Explain(echo, 0.1).message(), echo.message());  // the job is healthy
  server->reset();  // the server dies without a goodbye
  EXPECT_THAT((*worker)->Explain(echo, 10).message(), HasSubstr("server rank 0"));
  EXPECT_THAT((*worker)->Explain(echo, 10).message(), HasSubstr("was lost"));
  worker->reset();
}

// Not everyone arrives: after join_timeout the ones waiting are refused
// with the count of who came, and Run() reports it.
TEST(Coordinator, JoinTimeoutRefusesTheWaitingWithWhoIsMissing) {
  TestCoordinator coordinator(JobShape{.servers = 1, .workers = 2, .join_timeout_s = 0.5});
  const JobShape patient{.servers = 1, .workers = 2, .join_timeout_s = 20};
  auto client = coordinator.Join(wire::WORKER, -1, "addr", &patient);
  const Status result = coordinator.Finish();
  ASSERT_FALSE(client.ok());
  EXPECT_NE(client.status().message().find("joined: 0/1 servers, 1/2 workers"), std::string::npos)
      << client.status().message();
  EXPECT_NE(result.message().find("timed out after 0.5 s"), std::string::npos) << result.message();
}

// The members of a job, joined at once (servers then workers).
std::vector<std::unique_ptr<CoordinatorClient>> FormJob(TestCoordinator& coordinator, int servers, int workers) {
  std::vector<StatusOr<std::unique_ptr<CoordinatorClient>>> joined;
  for (int i = 0; i < servers + workers; ++i) joined.emplace_back(Status::Internal("not joined"));
  std::vector<std::thread> threads;
  for (int i = 0; i < servers + workers; ++i) {
    threads.emplace_back([&, i] {
      const bool server = i < servers;
      const int rank = server ? i : i - servers;
      joined[i] = coordinator.Join(server ? wire::SERVER : wire::WORKER, rank,
                                   std::string(server ? "server-" : "worker-") + std::to_string(rank));
    });
  }
  for (auto& t : threads) t.join();
  std::vector<std::unique_ptr<CoordinatorClient>> out;
  for (auto& j : joined) {
    CHECK(j.ok()) << j.status().message();
    out.push_back(std::move(*j));
  }
  return out;
}

// An elastic job: a worker joins only in place of a lost one, takes its
// rank, and is welcomed once every member has heard of it (and has acted:
// the members' handlers ran before the welcome); it then takes part in
// barriers like any member.
TEST(Coordinator, AWorkerJoinsAnElasticJobInPlaceOfALostOne) {
  TestCoordinator coordinator(JobShape{.servers = 1, .workers = 2, .heartbeat_interval_s = 0.2,
                                       .heartbeat_timeout_s = 5, .join_timeout_s = 20, .elastic = true});
  auto members = FormJob(coordinator, 1, 2);
  std::mutex mu;
  std::vector<MembershipChange> seen;  // by the server
  members[0]->OnMembershipChange([&](const MembershipChange& c) {
    std::lock_guard<std::mutex> lock(mu);
    seen.push_back(c);
  });
  auto refused = coordinator.JoinRunning();
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), HasSubstr("has all its 2 workers"));

  members[2].reset();  // worker 1 dies
  for (int i = 0; i < 500; ++i) {
    std::lock_guard<std::mutex> lock(mu);
    if (!seen.empty()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  auto late = coordinator.Join(wire::WORKER);
  ASSERT_FALSE(late.ok());
  EXPECT_THAT(late.status().message(), HasSubstr("with --join"));
  auto taken = coordinator.JoinRunning(0);
  ASSERT_FALSE(taken.ok());
  EXPECT_THAT(taken.status().message(), HasSubstr("worker rank 0 is not a lost one; a worker joins in place of a lost one (lost ranks: 1)"));

  auto joiner = coordinator.JoinRunning(-1, "new-worker-1");
  ASSERT_TRUE(joiner.ok()) << joiner.status().message();
  EXPECT_EQ((*joiner)->rank(), 1);
  const WelcomedMembership w = (*joiner)->welcomed_membership();
  EXPECT_EQ(w.epoch, 2);
  EXPECT_EQ(w.live_workers, (std::vector<int>{0, 1}));
  EXPECT_EQ(w.joined_at, (std::vector<int>{0, 2}));
  {
    std::lock_guard<std::mutex> lock(mu);  // acknowledged before the welcome
    ASSERT_EQ(seen.size(), 2u);
    EXPECT_FALSE(seen[0].joined);
    EXPECT_EQ(seen[0].member.rank(), 1);
    EXPECT_TRUE(seen[1].joined);
    EXPECT_EQ(seen[1].epoch, 2);
    EXPECT_EQ(seen[1].member.ucx_address(), "new-worker-1");
    EXPECT_EQ(seen[1].live_workers, (std::vector<int>{0, 1}));
  }
  members[2] = std::move(*joiner);
  std::vector<std::thread> threads;
  std::vector<std::string> results(3);
  for (int i = 0; i < 3; ++i) {
    threads.emplace_back([&, i] {
      Status st = members[i]->Barrier("after-join");
      results[i] = (st.ok() ? members[i]->Leave() : st).ToString();
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < 3; ++i) EXPECT_EQ(results[i], "ok") << i;
  EXPECT_TRUE(coordinator.Finish().ok());
}

TEST(Coordinator, JoiningAJobThatIsNotElasticIsRefused) {
  TestCoordinator coordinator(JobShape{.servers = 1, .workers = 1, .heartbeat_interval_s = 0.2,
                                       .heartbeat_timeout_s = 5, .join_timeout_s = 20});
  auto members = FormJob(coordinator, 1, 1);
  auto refused = coordinator.JoinRunning();
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), HasSubstr("the job is not elastic (cluster.elastic)"));
  for (auto& m : members) EXPECT_TRUE(m->Leave().ok());
  EXPECT_TRUE(coordinator.Finish().ok());
}

// A job of regions: a lost region's processes rejoin in its place, each
// naming its rank; they are welcomed once all of the region's have come,
// connect (a REGION barrier among them alone), and only then is every
// member told (one change naming them all). The servers' votes name their
// voters: a region lost is not waited for, a region rejoined is from then on.
TEST(Coordinator, ALostRegionRejoinsWholeOnceItsProcessesHaveConnected) {
  TestCoordinator coordinator(JobShape{.servers = 2, .workers = 2, .heartbeat_interval_s = 0.2,
                                       .heartbeat_timeout_s = 5, .join_timeout_s = 20, .regions = 2});
  auto members = FormJob(coordinator, 2, 2);  // server 0, server 1, worker 0, worker 1
  std::mutex mu;
  std::vector<MembershipChange> seen;  // by server 0
  members[0]->OnMembershipChange([&](const MembershipChange& c) {
    std::lock_guard<std::mutex> lock(mu);
    seen.push_back(c);
  });
  auto heard = [&](size_t n) {
    for (int i = 0; i < 500; ++i) {
      {
        std::lock_guard<std::mutex> lock(mu);
        if (seen.size() >= n) return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  };
  members[1].reset();  // server 1 dies: region 1 (with worker 1) is let go
  ASSERT_TRUE(heard(1));
  EXPECT_FALSE(members[3]->health().ok());
  // Server 0's vote names the servers of the regions in the job.
  auto alone = members[0]->AllGather("vote/1", "a", wire::SERVERS, Voters{{0}, 1});
  ASSERT_TRUE(alone.ok()) << alone.status().message();
  EXPECT_EQ(*alone, (std::vector<std::string>{"a", ""}));

  auto refused = coordinator.JoinRunning(0, "x", wire::SERVER);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), HasSubstr("server rank 0 of region 0 is not lost"));
  refused = coordinator.JoinRunning(-1, "x", wire::WORKER);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), HasSubstr("names its rank (--rank)"));

  // Region 1's processes come back; welcomed together, they connect.
  StatusOr<std::unique_ptr<CoordinatorClient>> server1 = Status::Internal("not joined");
  StatusOr<std::unique_ptr<CoordinatorClient>> worker1 = Status::Internal("not joined");
  std::thread s1([&] { server1 = coordinator.JoinRunning(1, "new-server-1", wire::SERVER); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(seen.size(), 1u) << "a region is not admitted before all its processes have come";
  }
  std::thread w1([&] { worker1 = coordinator.JoinRunning(1, "new-worker-1", wire::WORKER); });
  s1.join();
  w1.join();
  ASSERT_TRUE(server1.ok()) << server1.status().message();
  ASSERT_TRUE(worker1.ok()) << worker1.status().message();
  EXPECT_EQ((*server1)->joining_region(), 1);
  EXPECT_TRUE((*worker1)->joined_under_way());
  EXPECT_EQ((*server1)->members()[0].ucx_address(), "server-0") << "they connect to the live members";
  EXPECT_EQ((*server1)->members()[2].ucx_address(), "worker-0");
  EXPECT_EQ((*server1)->members()[3].ucx_address(), "new-worker-1");
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(seen.size(), 1u) << "the job hears of the region once its processes have connected";
  }
  std::vector<std::thread> threads;
  std::vector<std::string> results(2);
  CoordinatorClient* region[2] = {server1->get(), worker1->get()};
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&, i] { results[i] = region[i]->Barrier("herd/ucx-connected", wire::REGION).ToString(); });
  }
  for (auto& t : threads) t.join();
  threads.clear();
  EXPECT_EQ(results, (std::vector<std::string>{"ok", "ok"}));
  ASSERT_TRUE(heard(2));
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_TRUE(seen[1].joined);
    EXPECT_EQ(seen[1].epoch, 2);
    EXPECT_EQ(seen[1].member.role(), wire::SERVER);
    EXPECT_EQ(seen[1].member.rank(), 1);
    EXPECT_EQ(seen[1].member.ucx_address(), "new-server-1");
    ASSERT_EQ(seen[1].joined_with.size(), 1u);
    EXPECT_EQ(seen[1].joined_with[0].ucx_address(), "new-worker-1");
    EXPECT_EQ(seen[1].live_workers, (std::vector<int>{0, 1}));
  }
  // A vote whose voters were named before the loss (a checkpoint's, its
  // commit late) names the process lost, not the one in its place: it is
  // not waited for.
  auto old = members[0]->AllGather("vote/0", "a", wire::SERVERS, Voters{{0, 1}, 0});
  ASSERT_TRUE(old.ok()) << old.status().message();
  EXPECT_EQ(*old, (std::vector<std::string>{"a", ""}));
  // From now on the servers' votes name both; each waits for the other.
  members[1] = std::move(*server1);
  members[3] = std::move(*worker1);
  EXPECT_EQ(members[0]->membership_epoch(), 2);
  EXPECT_EQ(members[1]->membership_epoch(), 2);
  std::vector<std::string> gathered(2);
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&, i] {
      auto all = members[i]->AllGather("vote/2", std::string(1, static_cast<char>('a' + i)), wire::SERVERS,
                                       Voters{{0, 1}, 2});
      gathered[i] = all.ok() ? (*all)[0] + (*all)[1] : all.status().message();
    });
  }
  for (auto& t : threads) t.join();
  threads.clear();
  EXPECT_EQ(gathered, (std::vector<std::string>{"ab", "ab"}));
  // Its servers serve (they have the job's state): the job's end waits
  // for the region from now on.
  for (int i : {1, 3}) {
    threads.emplace_back([&, i] { results[i / 2] = members[i]->Barrier("herd/region-serves", wire::REGION).ToString(); });
  }
  for (auto& t : threads) t.join();
  threads.clear();
  EXPECT_EQ(results, (std::vector<std::string>{"ok", "ok"}));
  std::vector<std::string> done(4);
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      Status st = members[i]->Barrier("herd/done");
      done[i] = (st.ok() ? members[i]->Leave() : st).ToString();
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < 4; ++i) EXPECT_EQ(done[i], "ok") << i;
  EXPECT_TRUE(coordinator.Finish().ok());
}

}  // namespace
}  // namespace herd::transport
