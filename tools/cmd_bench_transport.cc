// herd bench transport [--sizes B,...] [--concurrency C,...] [--seconds S] [--reps N]
//                      [--push store|accumulate|both] [--paths single-copy,ucx] [--disjoint] [--no-perftest]
//   Push+pull throughput between two processes on this machine, next to
//   UCX's own `ucx_perftest -t ucp_am_bw` run here on the same transport
//   (UCX_TLS as set, else UCX's choice) and sizes. One JSON line per
//   (size, concurrency):
//     {"bench": "transport", "bytes": ..., "concurrency": ..., "herd_MBps": ...,
//      "ucx_perftest_MBps": ..., "ratio": ..., "tls": ...}
//   `push` is "store" (pushes land in place, zero-copy: the transport's own
//   throughput) or "accumulate" (the skeleton's sum: received into scratch,
//   then added; the sum's memory traffic is part of the figure); --push
//   picks one, both by default.
//   Within the host each figure is taken on both paths, `path`
//   "single-copy" (the receiver reads large payloads out of the sender,
//   process_vm_readv: transport/ucx_transport.h) and "ucx" (UCX's
//   shared-memory rendezvous); --paths picks.
//   Figures are medians over --reps back-to-back pairs (herd, then
//   ucx_perftest); `ratio` is the median of the pairs' ratios.
//   MBps = 2^20 bytes per second, as ucx_perftest counts. herd's figure
//   counts the bytes of pushes and pulls together, with `concurrency`
//   requests in flight (alternating push and pull); ucx_perftest sends in
//   one direction with at most `concurrency` sends outstanding (-O), with
//   peer-failure handling on its endpoints (-e) as herd has. Like
//   ucx_perftest, which reuses one buffer, the requests all use one range
//   (same working set); --disjoint gives each in-flight request its own.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <deque>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/logging.h"
#include "common/strings.h"
#include "tools/args.h"
#include "tools/commands.h"
#include "transport/coordinator.h"
#include "transport/join.h"
#include "transport/push_pull.h"
#include "transport/rendezvous.h"

extern char** environ;

namespace herd::tools {
namespace {

using wire::Role;

StatusOr<std::vector<long long>> ParseList(const Args& args, const std::string& name, std::vector<long long> fallback) {
  if (!args.Has(name)) return fallback;
  const std::string text = args.Get(name);
  const Status bad =
      Status::InvalidArgument("--" + name + ": expected positive integers separated by commas, got '" + text + "'");
  if (text.empty() || text.back() == ',') return bad;
  std::vector<long long> values;
  for (const std::string& item : Split(text, ',')) {
    char* end = nullptr;
    long long v = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v <= 0) return bad;
    values.push_back(v);
  }
  return values;
}

transport::JoinOptions BenchJoin(const std::string& coordinator, const std::string& token, Role role) {
  transport::JoinOptions o;
  o.coordinator = coordinator;
  o.token = token;
  o.role = role;
  o.job = transport::JobShape{.servers = 1, .workers = 1, .join_timeout_s = 60};
  return o;
}

pid_t Spawn(const std::vector<std::string>& argv, bool quiet) {
  std::vector<char*> raw;
  for (const auto& a : argv) raw.push_back(const_cast<char*>(a.c_str()));
  raw.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (quiet) posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  pid_t pid = -1;
  if (posix_spawnp(&pid, raw[0], &actions, nullptr, raw.data(), environ) != 0) pid = -1;
  posix_spawn_file_actions_destroy(&actions);
  return pid;
}

int FreePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  ::close(fd);
  return port;
}

// ucx_perftest's "Final:" bandwidth (overall MB/s), or a negative number.
double RunPerftest(long long bytes, long long concurrency) {
  const long long iters = std::max(16LL, std::min(4000LL, (2LL << 30) / bytes));
  const std::string port = std::to_string(FreePort());
  const std::vector<std::string> common = {"-t", "ucp_am_bw", "-s", std::to_string(bytes), "-n", std::to_string(iters),
                                           "-w", std::to_string(std::max(2LL, iters / 10)), "-p", port, "-e"};
  std::vector<std::string> server = {"ucx_perftest"};
  server.insert(server.end(), common.begin(), common.end());
  pid_t pid = Spawn(server, /*quiet=*/true);
  if (pid < 0) return -1;
  double mbps = -1;
  for (int attempt = 0; attempt < 20 && mbps < 0; ++attempt) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    std::string cmd = "ucx_perftest 127.0.0.1";
    for (const auto& a : common) cmd += " " + a;
    cmd += " -O " + std::to_string(concurrency) + " 2>/dev/null";
    FILE* out = ::popen(cmd.c_str(), "r");
    if (out == nullptr) break;
    char line[512];
    while (std::fgets(line, sizeof line, out) != nullptr) {
      if (std::strncmp(line, "Final:", 6) != 0) continue;
      double v[8];
      if (std::sscanf(line + 6, "%lf %lf %lf %lf %lf %lf %lf %lf", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6],
                      &v[7]) == 8) {
        mbps = v[5];
      }
    }
    ::pclose(out);
  }
  ::kill(pid, SIGTERM);
  ::waitpid(pid, nullptr, 0);
  return mbps;
}

// A shard whose pushes overwrite their range in place (zero-copy straight
// into the shard): the transport's own throughput, without the sum.
class StoringShard : public transport::ShardHandler {
 public:
  explicit StoringShard(uint64_t bytes) : bytes_(bytes, 0) {}
  uint64_t size_bytes(transport::RequestKind kind) const override {
    const bool bytes = kind == transport::RequestKind::kGradients || kind == transport::RequestKind::kWeights;
    return bytes ? bytes_.size() : 0;
  }
  StatusOr<void*> PushTarget(const transport::Request& push) override { return bytes_.data() + push.offset; }
  void OnPushed(const transport::Request&, void*, bool, transport::Completion applied) override {
    applied(Status::OK());
  }
  void OnPull(const transport::Request& pull, PullReply reply) override {
    reply(Status::OK(), bytes_.data() + pull.offset);
  }
  char* data() { return bytes_.data(); }

 private:
  std::vector<char> bytes_;
};

// The server process: one shard (accumulating, or storing with --store),
// served until the client is done.
int Serve(const Args& args) {
  auto shard_bytes = args.GetInt("shard-bytes", 1 << 20, 4);
  if (!shard_bytes.ok()) return ReportError(shard_bytes.status());
  auto token = transport::LoadJobToken("", transport::ProcessEnv());
  if (!token.ok()) return ReportError(token.status());
  auto t = transport::UcxTransport::Create({});
  if (!t.ok()) return ReportError(t.status());
  transport::AccumulatingShard accumulating(args.Has("store") ? 4 : *shard_bytes);
  StoringShard storing(args.Has("store") ? *shard_bytes : 4);
  transport::ShardHandler* shard = args.Has("store") ? static_cast<transport::ShardHandler*>(&storing) : &accumulating;
  void* base = args.Has("store") ? static_cast<void*>(storing.data()) : accumulating.data();
  Status st = (*t)->RegisterMemory(base, *shard_bytes);
  if (!st.ok()) return ReportError(st);
  transport::PushPullServer server(t->get(), shard);
  auto coordinator =
      transport::JoinJob(BenchJoin(args.Get("coordinator"), *token, wire::SERVER), t->get(), {wire::WORKER});
  if (!coordinator.ok()) return ReportError(coordinator.status());
  st = (*coordinator)->Barrier("done");
  if (st.ok()) st = (*coordinator)->Leave();
  return st.ok() ? 0 : ReportError(st);
}

// `concurrency` requests in flight, alternating push and pull over
// `concurrency` disjoint ranges, for at least `seconds`.
StatusOr<double> Measure(transport::PushPullClient& client, transport::PeerId server, char* buffer, long long bytes,
                         long long concurrency, bool disjoint, double seconds) {
  std::deque<transport::PushPullClient::Ticket> in_flight;
  long long issued = 0;
  auto issue = [&] {
    const uint64_t offset = disjoint ? static_cast<uint64_t>((issued / 2) % concurrency) * bytes : 0;
    in_flight.push_back(
        issued % 2 == 0 ? client.Push(server, transport::RequestKind::kGradients, offset, buffer + offset, bytes)
                        : client.Pull(server, transport::RequestKind::kWeights, offset, buffer + offset, bytes));
    ++issued;
  };
  // Warm-up: registration caches, connection set-up.
  for (int i = 0; i < 4; ++i) issue();
  HERD_RETURN_IF_ERROR(client.WaitAll());
  in_flight.clear();
  issued = 0;
  Stopwatch clock;
  long long completed = 0;
  while (true) {
    while (static_cast<long long>(in_flight.size()) < concurrency) issue();
    HERD_RETURN_IF_ERROR(client.Wait(in_flight.front()));
    in_flight.pop_front();
    ++completed;
    if (clock.Seconds() >= seconds && completed >= 8 && completed % 2 == 0) break;
  }
  while (!in_flight.empty()) {
    HERD_RETURN_IF_ERROR(client.Wait(in_flight.front()));
    in_flight.pop_front();
    ++completed;
  }
  return static_cast<double>(completed) * bytes / (1 << 20) / clock.Seconds();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? -1 : v[v.size() / 2];
}

struct BenchPlan {
  std::vector<long long> sizes, concurrencies;
  int reps = 5;
  double seconds = 0.5;
  bool disjoint = false, perftest = true;
  std::string tls;
  // Within the host, large payloads read by the receiver in one copy
  // ("single-copy", HERD_CMA=1) or through UCX ("ucx", HERD_CMA=0).
  std::string path;
};

// One line of output: a (size, concurrency) and its repetitions.
struct Figure {
  Figure(long long b, long long c) : bytes(b), concurrency(c) {}
  long long bytes, concurrency;
  std::vector<double> ours, theirs, ratios;  // herd's MB/s, ucx_perftest's, each back-to-back pair's ratio
};

// Interleaved repetitions, medians: this machine's speed drifts, and both
// sides see the same drift. The ratio is the median of back-to-back pairs,
// which see the same machine state far more often than two medians do.
// Returns the exit code: non-zero when a measurement failed (reported).
int MeasureFigure(const BenchPlan& plan, transport::PushPullClient& client, transport::PeerId server, char* buffer,
                  Figure* f) {
  int rc = 0;
  for (int rep = 0; rep < plan.reps && rc == 0; ++rep) {
    auto mbps = Measure(client, server, buffer, f->bytes, f->concurrency, plan.disjoint, plan.seconds);
    if (!mbps.ok()) rc = ReportError(mbps.status());
    f->ours.push_back(mbps.ok() ? *mbps : 0);
    if (!plan.perftest) continue;
    f->theirs.push_back(RunPerftest(f->bytes, f->concurrency));
    if (f->theirs.back() > 0) f->ratios.push_back(f->ours.back() / f->theirs.back());
  }
  return rc;
}

void PrintFigure(const BenchPlan& plan, bool store, const Figure& f) {
  const double mbps = Median(f.ours);
  const double anchor = plan.perftest ? Median(f.theirs) : -1;
  char anchor_text[64] = "null", ratio_text[64] = "null";
  if (anchor > 0 && !f.ratios.empty()) {
    std::snprintf(anchor_text, sizeof anchor_text, "%.1f", anchor);
    std::snprintf(ratio_text, sizeof ratio_text, "%.3f", Median(f.ratios));
  }
  std::printf(
      "{\"bench\": \"transport\", \"bytes\": %lld, \"concurrency\": %lld, \"push\": \"%s\", "
      "\"herd_MBps\": %.1f, \"ucx_perftest_MBps\": %s, \"ratio\": %s, \"tls\": \"%s\", \"path\": \"%s\", "
      "\"ranges\": \"%s\", \"reps\": %d}\n",
      f.bytes, f.concurrency, store ? "store" : "accumulate", mbps, anchor_text, ratio_text, plan.tls.c_str(),
      plan.path.c_str(), plan.disjoint ? "disjoint" : "same", plan.reps);
  std::fflush(stdout);
}

// The worker side of the job, in this process: joins it, measures and
// prints every figure, then meets the server at the "done" barrier. A
// failure to set up is the returned status; after that, the exit code
// (failures reported).
StatusOr<int> RunClient(const BenchPlan& plan, bool store, const std::string& address, const std::string& token,
                        long long shard_bytes) {
  auto t = transport::UcxTransport::Create({});
  if (!t.ok()) return t.status();
  std::vector<char> buffer(static_cast<size_t>(shard_bytes), 1);
  Status st = (*t)->RegisterMemory(buffer.data(), buffer.size());
  if (!st.ok()) return st;
  auto client = std::make_unique<transport::PushPullClient>(t->get());
  auto joined = transport::JoinJob(BenchJoin(address, token, wire::WORKER), t->get(), {wire::SERVER});
  if (!joined.ok()) return joined.status();
  (*joined)->OnFailure([&client](const Status& failure) { client->Fail(-1, failure); });
  const transport::PeerId server = transport::MemberPeerId(**joined, wire::SERVER, 0);
  std::fprintf(stderr, "bench transport: UCX_TLS=%s; endpoint:\n%s", plan.tls.c_str(),
               (*t)->DescribeEndpoint(server).c_str());
  int rc = 0;
  for (long long bytes : plan.sizes) {
    for (long long c : plan.concurrencies) {
      Figure figure(bytes, c);
      rc = MeasureFigure(plan, *client, server, buffer.data(), &figure);
      if (rc != 0) break;
      PrintFigure(plan, store, figure);
    }
    if (rc != 0) break;
  }
  if (rc == 0) {
    st = (*joined)->Barrier("done");
    if (st.ok()) st = (*joined)->Leave();
    if (!st.ok()) rc = ReportError(st);
  }
  return rc;
}

// One private job (coordinator in this process, the server a child
// process) measuring every size and concurrency with one push mode.
int RunJob(const BenchPlan& plan, bool store) {
  const long long max_bytes = *std::max_element(plan.sizes.begin(), plan.sizes.end());
  const long long max_c = *std::max_element(plan.concurrencies.begin(), plan.concurrencies.end());
  const long long shard_bytes = max_bytes * max_c;
  // The token goes to the child through the environment, never argv.
  const std::string token = "bench-" + std::to_string(::getpid()) + "-" + std::to_string(FreePort());
  ::setenv("HERD_JOB_TOKEN", token.c_str(), 1);
  transport::CoordinatorOptions co;
  co.token = token;
  co.job = transport::JobShape{.servers = 1, .workers = 1};
  auto coordinator = transport::Coordinator::Start(co);
  if (!coordinator.ok()) return ReportError(coordinator.status());
  std::thread serve_coordinator([&] { (void)(*coordinator)->Run(); });
  const std::string address = "127.0.0.1:" + std::to_string((*coordinator)->port());
  std::vector<std::string> server_argv = {"/proc/self/exe", "bench",         "transport",
                                          "--serve",        "--coordinator", address,
                                          "--shard-bytes",  std::to_string(shard_bytes)};
  if (store) server_argv.push_back("--store");
  pid_t server_pid = Spawn(server_argv, /*quiet=*/false);
  if (server_pid < 0) {
    (*coordinator)->Stop("the server process could not start");
    serve_coordinator.join();
    return ReportError(Status::Internal("bench transport: cannot start the server process"));
  }
  const StatusOr<int> rc = RunClient(plan, store, address, token, shard_bytes);
  if (!rc.ok()) return ReportError(rc.status());
  ::waitpid(server_pid, nullptr, 0);
  serve_coordinator.join();
  return *rc;
}

int BenchTransport(int argc, char** argv) {
  Args args({"sizes", "concurrency", "seconds", "reps", "push", "paths", "coordinator", "shard-bytes"},
            {"no-perftest", "serve", "disjoint", "store"});
  Status st = args.Parse(argc, argv);
  if (!st.ok()) return ReportError(st.WithContext("bench transport: "));
  if (args.Has("serve")) return Serve(args);
  BenchPlan plan;
  auto sizes = ParseList(args, "sizes", {256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20});
  auto concurrencies = ParseList(args, "concurrency", {1, 4});
  if (!sizes.ok()) return ReportError(sizes.status());
  if (!concurrencies.ok()) return ReportError(concurrencies.status());
  plan.sizes = *sizes;
  plan.concurrencies = *concurrencies;
  plan.seconds = std::atof(args.Get("seconds", "0.5").c_str());
  auto reps = args.GetInt("reps", 5, 1);
  if (!reps.ok()) return ReportError(reps.status());
  plan.reps = static_cast<int>(*reps);
  if (!(plan.seconds > 0)) return ReportError(Status::InvalidArgument("--seconds: must be > 0"));
  plan.disjoint = args.Has("disjoint");
  plan.perftest = !args.Has("no-perftest");
  const std::string push = args.Get("push", "both");
  if (push != "store" && push != "accumulate" && push != "both") {
    return ReportError(Status::InvalidArgument("--push: expected store, accumulate or both, got '" + push + "'"));
  }
  const std::string paths = args.Get("paths", "single-copy,ucx");
  std::vector<std::string> path_list = Split(paths, ',');
  for (const std::string& p : path_list) {
    if (p != "single-copy" && p != "ucx") {
      return ReportError(Status::InvalidArgument("--paths: expected single-copy and/or ucx, got '" + paths + "'"));
    }
  }
  transport::PrepareUcxEnvironment();  // ucx_perftest then picks the transports herd gets
  const char* tls = std::getenv("UCX_TLS");
  plan.tls = tls != nullptr ? tls : "default";
  for (const std::string& path : path_list) {
    plan.path = path;
    ::setenv("HERD_CMA", path == "ucx" ? "0" : "1", 1);  // both processes' transports read it
    for (bool store : {true, false}) {
      if ((store && push == "accumulate") || (!store && push == "store")) continue;
      if (int rc = RunJob(plan, store); rc != 0) return rc;
    }
  }
  return 0;
}

}  // namespace

int RunBenchTransport(int argc, char** argv) { return BenchTransport(argc, argv); }

}  // namespace herd::tools
