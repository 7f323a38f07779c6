// Something that is not a process of the job yet reaches the job's UCX
// workers, for tests/foreign_endpoint_test.py: it sends well-formed pushes
// and pulls that claim to come from worker 0, with the data-plane key of
// another token (--token, not the job's).
//
// It learns the workers' addresses as an observer of the control plane
// would: the job's processes reach the coordinator through it (a TCP relay
// from 127.0.0.1:--listen to --coordinator), and it reads the membership
// from the coordinator's welcome. Once a welcome lists --members members it
// connects to each and sends, every 20 ms until every relayed connection
// has closed (or --seconds pass), to each member: a push of gradients small
// enough to travel eagerly, one large enough for rendezvous, and a pull of
// weights, tagged with the next step. Prints one JSON line: the members it
// reached and the requests it sent.
//
//   foreign_node --listen PORT --coordinator HOST:PORT --members N --token T [--seconds S]
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <thread>
#include <vector>

#include "common/logging.h"
#include "tools/args.h"
#include "transport/push_pull.h"
#include "transport/rendezvous.h"
#include "transport/wire.h"

namespace herd {
namespace {

using transport::PeerId;
using Clock = std::chrono::steady_clock;

// What the relay has seen: the newest membership and the connections open.
struct Observed {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<wire::Member> members;
  int open = 0, opened = 0;
};

bool WriteAll(int fd, const char* data, size_t size) {
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n <= 0) return false;
    data += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

// Copies bytes from `from` to `to` until either side closes; with
// `observed`, reads the coordinator's messages on the way.
void Pump(int from, int to, Observed* observed) {
  transport::FrameReader reader(size_t{1} << 30);
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(from, buf, sizeof buf);
    if (n <= 0 || !WriteAll(to, buf, static_cast<size_t>(n))) break;
    if (observed == nullptr || !reader.Append(buf, static_cast<size_t>(n)).ok()) continue;
    wire::Envelope message;
    Status st;
    while (reader.Next(&message, &st)) {
      if (!message.has_welcome()) continue;
      std::lock_guard<std::mutex> lock(observed->mu);
      observed->members.assign(message.welcome().members().begin(), message.welcome().members().end());
      observed->cv.notify_all();
    }
  }
  ::shutdown(from, SHUT_RDWR);
  ::shutdown(to, SHUT_RDWR);
}

StatusOr<int> Connect(const std::string& address) {
  std::string host;
  uint16_t port = 0;
  HERD_RETURN_IF_ERROR(transport::ParseHostPort(address, "--coordinator", &host, &port));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  if (::inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1) return Status::InvalidArgument("--coordinator: not IPv4");
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    if (fd >= 0) ::close(fd);
    return Status::Unavailable("cannot reach the coordinator at " + address);
  }
  return fd;
}

void Relay(int listener, const std::string& coordinator, Observed* observed) {
  for (;;) {
    const int client = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    if (client < 0) return;
    auto upstream = Connect(coordinator);
    if (!upstream.ok()) {
      ::close(client);
      continue;
    }
    {
      std::lock_guard<std::mutex> lock(observed->mu);
      ++observed->open;
      ++observed->opened;
    }
    std::thread([client, server = *upstream, observed] {
      std::thread up([&] { Pump(client, server, nullptr); });
      Pump(server, client, observed);
      up.join();
      ::close(client);
      ::close(server);
      std::lock_guard<std::mutex> lock(observed->mu);
      --observed->open;
      observed->cv.notify_all();
    }).detach();
  }
}

Status Run(const tools::Args& args) {
  HERD_ASSIGN_OR_RETURN(const long long port, args.GetInt("listen", 0, 1, 65535));
  HERD_ASSIGN_OR_RETURN(const long long members, args.GetInt("members", 0, 1));
  HERD_ASSIGN_OR_RETURN(const long long seconds, args.GetInt("seconds", 300, 1));
  const std::string coordinator = args.Get("coordinator"), token = args.Get("token");
  if (coordinator.empty() || token.empty()) return Status::InvalidArgument("--coordinator and --token are required");

  const int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int one = 1;
  ::setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(listener, 64) != 0) {
    return Status::Unavailable("cannot listen on 127.0.0.1:" + std::to_string(port));
  }
  Observed observed;
  std::thread(Relay, listener, coordinator, &observed).detach();

  const auto deadline = Clock::now() + std::chrono::seconds(seconds);
  std::vector<wire::Member> membership;
  {
    std::unique_lock<std::mutex> lock(observed.mu);
    observed.cv.wait_until(lock, deadline, [&] { return static_cast<long long>(observed.members.size()) >= members; });
    membership = observed.members;
  }
  if (static_cast<long long>(membership.size()) < members) return Status::Unavailable("no welcome listed every member within --seconds");
  PeerId worker0 = -1;
  for (size_t i = 0; i < membership.size() && worker0 < 0; ++i) {
    if (membership[i].role() == wire::WORKER) worker0 = static_cast<PeerId>(i);
  }
  transport::UcxOptions options(worker0);
  options.key = transport::DataPlaneKey::FromToken(token);
  // Buffers before the transport and the client, which end first.
  std::vector<float> gradients((256 << 10) / sizeof(float), 1000.0f), pulled(256, 0.0f);
  HERD_ASSIGN_OR_RETURN(auto ucx, transport::UcxTransport::Create(options));
  auto client = std::make_unique<transport::PushPullClient>(ucx.get(), 64 << 10);
  int reached = 0;
  for (size_t i = 0; i < membership.size(); ++i) {
    if (static_cast<PeerId>(i) == worker0) continue;
    reached += ucx->Connect(static_cast<PeerId>(i), membership[i].ucx_address(), "member " + std::to_string(i)).ok();
  }
  long long requests = 0, rounds = 0;
  auto job_over = [&] {
    std::lock_guard<std::mutex> lock(observed.mu);
    return observed.opened > 0 && observed.open == 0;
  };
  while (!job_over() && Clock::now() < deadline) {
    ++rounds;
    for (size_t i = 0; i < membership.size(); ++i) {
      const PeerId to = static_cast<PeerId>(i);
      if (to == worker0) continue;
      const uint64_t tag = transport::PushTag(static_cast<uint64_t>(rounds), 0);
      client->Push(to, transport::RequestKind::kGradients, 0, gradients.data(), 1024, tag);
      client->Push(to, transport::RequestKind::kGradients, 0, gradients.data(), gradients.size() * sizeof(float), tag);
      client->Pull(to, transport::RequestKind::kWeights, 0, pulled.data(), 1024, static_cast<uint64_t>(rounds));
      requests += 3;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::printf("{\"members\": %zu, \"reached\": %d, \"rounds\": %lld, \"requests\": %lld}\n", membership.size(), reached,
              rounds, requests);
  std::fflush(stdout);
  // The job's processes are gone: nothing is left to flush towards them.
  ucx->Abort(Status::Aborted("the job ended"));
  client.reset();
  return Status::OK();
}

}  // namespace
}  // namespace herd

int main(int argc, char** argv) {
  using namespace herd;
  InitLogging(argv[0]);
  tools::Args args({"listen", "coordinator", "members", "token", "seconds"}, {});
  Status st = args.Parse(argc, argv);
  if (st.ok()) st = Run(args);
  if (!st.ok()) {
    std::fprintf(stderr, "foreign_node: %s\n", st.message().c_str());
    return 1;
  }
  return 0;
}
