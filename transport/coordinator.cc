#include "transport/coordinator.h"

#include <glog/logging.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <deque>
#include <map>
#include <set>
#include <vector>

#include "common/trace.h"
#include "transport/exchanges.h"
#include "transport/framed_connection.h"
#include "transport/rendezvous.h"
#include "transport/wire.h"

namespace herd::transport {
namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

// Before a process has presented the token it may send one Hello of at most
// this size: strangers cannot make the coordinator buffer megabytes.
constexpr size_t kPreAuthMaxBytes = 128 * 1024;

bool TokensEqual(const std::string& a, const std::string& b) {
  // Constant time in the contents, so the token cannot be guessed byte by byte.
  if (a.size() != b.size()) return false;
  unsigned diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

std::string Hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string Seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", s);
  return buf;
}

int ScopeSize(wire::Scope scope, int servers, int workers) {
  return scope == wire::SERVERS ? servers : scope == wire::WORKERS ? workers : servers + workers;
}

bool InScope(wire::Scope scope, wire::Role role) {
  return scope == wire::EVERYONE || (scope == wire::SERVERS && role == wire::SERVER) ||
         (scope == wire::WORKERS && role == wire::WORKER);
}

struct Session {
  std::shared_ptr<FramedConnection> conn;
  uint64_t id = 0;
  Clock::time_point last_heard;
  // Set once admitted.
  bool admitted = false, left = false;
  wire::Hello hello;
  int rank = -1;  // final rank once the membership is formed

  wire::Role role() const { return hello.role(); }
  // "worker rank 2 (host, pid 7)", with " from IP:PORT" after the rank when
  // asked; "connection from IP:PORT" before a hello.
  std::string Describe(bool with_address = false) const {
    if (!hello.has_role()) return "connection from " + conn->peer();
    return DescribeRole(role(), rank >= 0 ? rank : hello.rank()) + (with_address ? " from " + conn->peer() : "") +
           " (" + hello.host() + ", pid " + std::to_string(hello.pid()) + ")";
  }
};
using SessionPtr = std::shared_ptr<Session>;

// Warnings about connections that are refused or closed before they joined:
// per peer address, the first kBurst of each kWindow are logged and the
// rest only counted (reported with the next line logged), so that a flood
// of bad connections cannot flood the log.
class WarningLimiter {
 public:
  static constexpr int kBurst = 20;
  static constexpr std::chrono::seconds kWindow{10};

  void Warn(const std::string& peer, const std::string& message) {
    const std::string address = peer.substr(0, peer.rfind(':'));
    const auto now = Clock::now();
    if (entries_.size() > 4096) entries_.clear();  // bounded, whatever the flood
    auto [it, fresh] = entries_.try_emplace(address);
    Entry& e = it->second;
    if (fresh || now - e.window_start >= kWindow) {
      e.window_start = now;
      e.logged = 0;
    }
    if (e.logged >= kBurst) {
      ++e.held_back;
      return;
    }
    ++e.logged;
    if (e.held_back > 0) {
      LOG(WARNING) << message << " (and " << e.held_back << " more from " << address << " not logged)";
      e.held_back = 0;
    } else {
      LOG(WARNING) << message;
    }
  }

 private:
  struct Entry {
    Clock::time_point window_start;
    int logged = 0;
    int64_t held_back = 0;
  };
  std::map<std::string, Entry> entries_;
};

}  // namespace

class Coordinator::Impl {
  struct PendingBarrier;
  struct PendingGather;

 public:
  explicit Impl(const CoordinatorOptions& options)
      : options_(options),
        shape_(options.job.value_or(JobShape{})),
        acceptor_(io_),
        heartbeat_timer_(io_),
        join_timer_(io_),
        drain_timer_(io_) {
    servers_ = options.job ? shape_.servers : -1;
    workers_ = options.job ? shape_.workers : -1;
  }

  Status Listen() {
    std::string host;
    uint16_t port = 0;
    HERD_RETURN_IF_ERROR(ParseHostPort(options_.listen, "--listen", &host, &port));
    boost::system::error_code ec;
    auto address = asio::ip::make_address(host == "localhost" ? "127.0.0.1" : host, ec);
    if (ec) return Status::InvalidArgument("--listen " + options_.listen + ": not an IP address: " + ec.message());
    tcp::endpoint endpoint(address, port);
    acceptor_.open(endpoint.protocol(), ec);
    if (!ec) acceptor_.set_option(tcp::acceptor::reuse_address(true), ec);
    if (!ec) acceptor_.bind(endpoint, ec);
    if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) return Status::Unavailable("coordinator: cannot listen on " + options_.listen + ": " + ec.message());
    return Status::OK();
  }

  uint16_t port() const { return acceptor_.local_endpoint().port(); }

  Status Run() {
    LOG(INFO) << "coordinator listening on " << acceptor_.local_endpoint().address().to_string() << ":" << port();
    Accept();
    ArmHeartbeat();
    if (options_.job) ArmJoinTimer(shape_.join_timeout_s);
    io_.run();
    // Finish() stopped the loop, maybe with messages still queued (the
    // Shutdown that Stop sends everyone): they get a moment to be written,
    // or a process that joined just then hears nothing and waits.
    io_.restart();
    io_.run_for(std::chrono::milliseconds(500));
    return failure_;
  }

  void Stop(const std::string& reason) {
    asio::post(io_, [this, reason] {
      if (finished_) return;
      Fail(Status::Aborted("coordinator stopped: " + reason), /*lost=*/nullptr);
      wire::Envelope m;
      m.mutable_shutdown()->set_reason(reason);
      for (const auto& s : Snapshot()) SendAndClose(s, m);
    });
  }

 private:
  // ---- connections -------------------------------------------------------
  void Accept() {
    acceptor_.async_accept([this](boost::system::error_code ec, tcp::socket socket) {
      if (finished_) return;
      if (!ec) {
        auto s = std::make_shared<Session>();
        s->conn = std::make_shared<FramedConnection>(std::move(socket), kPreAuthMaxBytes);
        s->id = next_session_id_++;
        s->last_heard = Clock::now();
        sessions_[s->id] = s;
        s->conn->Start(
            [this, s](const wire::Envelope& m) {
              s->last_heard = Clock::now();
              Handle(s, m);
            },
            [this, s](const Status& st) {
              if (st.code() == Status::Code::kCorruption) {
                ProtocolError(s, st);
              } else {
                Disconnected(s, st.message());
              }
            });
      } else {
        LOG(WARNING) << "coordinator: accept failed: " << ec.message();
      }
      Accept();
    });
  }

  void Send(const SessionPtr& s, const wire::Envelope& m) { s->conn->Send(m); }

  // The open sessions, for loops that may close some of them.
  std::vector<SessionPtr> Snapshot() const {
    std::vector<SessionPtr> all;
    for (const auto& [id, s] : sessions_) all.push_back(s);
    return all;
  }

  void Close(const SessionPtr& s) {
    s->conn->Close();
    if (sessions_.erase(s->id)) MaybeFinish();
  }

  // Sends `m` last and closes; the session is forgotten now.
  void SendAndClose(const SessionPtr& s, const wire::Envelope& m) {
    s->conn->Send(m);
    s->conn->CloseAfterFlush();
    if (sessions_.erase(s->id)) MaybeFinish();
  }

  // Refusal: one line to the process, one line in our log, then close.
  void Refuse(const SessionPtr& s, const std::string& reason) {
    warnings_.Warn(s->conn->peer(), "coordinator: refused " + s->Describe(/*with_address=*/true) + ": " + reason);
    wire::Envelope m;
    m.mutable_refused()->set_reason(reason);
    SendAndClose(s, m);
  }

  // A process of this job (it presented the token) refused for a reason
  // that starting it again cannot mend — another config, a rank or a world
  // size the job does not have: the job cannot form, so it stops now with
  // that reason rather than waiting out cluster.join_timeout_s.
  void RefuseAndStop(const SessionPtr& s, const std::string& reason) {
    const std::string who = s->Describe(/*with_address=*/true);
    Refuse(s, reason);
    if (formed_) return;
    // The job's other processes may not have connected yet: stay to tell
    // them (Hello answers with the failure) for drain_timeout_s, rather
    // than leave them retrying a closed port.
    linger_ = true;
    StopForming(Status::InvalidArgument(who + " was refused: " + reason));
  }

  // The job will not form: its first failure, and every process waiting to
  // join is told why and let go.
  void StopForming(const Status& failure) {
    Fail(failure, nullptr);
    wire::Envelope m;
    m.mutable_refused()->set_reason(failure_.message());
    for (const auto& s : Snapshot()) SendAndClose(s, m);
  }

  void ProtocolError(const SessionPtr& s, const Status& st) {
    if (s->admitted && !s->left) {
      Lost(s, "protocol violation: " + st.message());
      return;
    }
    warnings_.Warn(s->conn->peer(), "coordinator: closing " + s->Describe() + ": " + st.message());
    wire::Envelope m;
    m.mutable_refused()->set_reason(st.message());
    SendAndClose(s, m);
  }

  void Disconnected(const SessionPtr& s, const std::string& reason) {
    if (s->admitted && !s->left) {
      Lost(s, reason);
    } else {
      Close(s);
    }
  }

  // ---- messages ----------------------------------------------------------
  void Handle(const SessionPtr& s, const wire::Envelope& m) {
    if (!s->admitted) {
      // A worker waiting its turn to join keeps its connection alive.
      if (m.body_case() == wire::Envelope::kHeartbeat && s->hello.join()) return;
      if (m.body_case() != wire::Envelope::kHello) {
        ProtocolError(s, Status::Corruption("expected a hello before anything else"));
        return;
      }
      Hello(s, m.hello());
      return;
    }
    switch (m.body_case()) {
      case wire::Envelope::kHeartbeat:
        return;
      case wire::Envelope::kLeave:
        s->left = true;
        LOG(INFO) << "coordinator: " << s->Describe() << " left";
        // Barriers do not wait for members that have left; a worker that
        // joined late may be the last to arrive at the job's end.
        return RecheckCollectives();
      case wire::Envelope::kMembershipAck:
        return MembershipAck(s, m.membership_ack());
      case wire::Envelope::kClockProbe: {
        wire::Envelope reading;
        reading.mutable_clock_reading()->set_id(m.clock_probe().id());
        reading.mutable_clock_reading()->set_coordinator_ns(trace::Now());
        return Send(s, reading);
      }
      case wire::Envelope::kBarrier:
        if (!formed_) return ProtocolError(s, Status::Corruption("barrier before the membership was sent"));
        return Barrier(s, m.barrier());
      case wire::Envelope::kAllGather:
        if (!formed_) return ProtocolError(s, Status::Corruption("all-gather before the membership was sent"));
        return AllGather(s, m.all_gather());
      default:
        return ProtocolError(s, Status::Corruption("unexpected message from a process (type " +
                                                   std::to_string(m.body_case()) + ")"));
    }
  }

  void Hello(const SessionPtr& s, const wire::Hello& h) {
    s->hello = h;
    if (!failure_.ok()) {
      // Too late to join: told like every member, so it stops as one.
      wire::Envelope m;
      m.mutable_shutdown()->set_reason(failure_.message());
      return SendAndClose(s, m);
    }
    if (!TokensEqual(h.token(), options_.token)) {
      return Refuse(s, "wrong job token (the token comes from --token-file, HERD_JOB_TOKEN or HERD_JOB_TOKEN_FILE)");
    }
    s->hello.clear_token();
    if (!reference_hash_set_) {
      reference_hash_set_ = true;
      reference_hash_ = h.config_hash();
      reference_desc_ = s->Describe(/*with_address=*/true);
      if (servers_ < 0) {
        servers_ = h.servers();
        workers_ = h.workers();
        shape_.heartbeat_interval_s = h.heartbeat_interval_ms() / 1000.0;
        shape_.heartbeat_timeout_s = h.heartbeat_timeout_ms() / 1000.0;
        shape_.join_timeout_s = h.join_timeout_ms() / 1000.0;
        shape_.elastic = h.elastic();
        shape_.regions = std::max(1, h.regions());
        ArmJoinTimer(shape_.join_timeout_s);
      }
      LOG(INFO) << "coordinator: job of " << servers_ << " servers and " << workers_ << " workers, config hash "
                << Hex64(reference_hash_);
    } else if (h.config_hash() != reference_hash_) {
      return RefuseAndStop(s, "config hash " + Hex64(h.config_hash()) + " differs from " + Hex64(reference_hash_) +
                           " of the first process to join (" + reference_desc_ +
                           "): start every process with the same config file and --set overrides");
    }
    if (h.join() && (formed_ || !h.resume_if_forming())) {
      if (!formed_) return Refuse(s, "--join: the job has not started yet; start this worker without --join");
      return QueueJoin(s);
    }
    if (formed_) {
      return Refuse(s, "the job has already started with its " + std::to_string(servers_) + " servers and " +
                           std::to_string(workers_) + " workers" +
                           (shape_.elastic ? " (a worker joins an elastic job in place of a lost one with --join)" : ""));
    }
    const bool is_server = h.role() == wire::SERVER;
    const int count = is_server ? servers_ : workers_;
    const std::string plural = is_server ? "servers" : "workers";
    const std::string field = is_server ? "cluster.servers" : "cluster.workers";
    if (count == 0) return RefuseAndStop(s, "the job has no " + plural + " (" + field + " = 0)");
    if (h.world_size() != -1 && h.world_size() != count) {
      return RefuseAndStop(s, "the launcher says there are " + std::to_string(h.world_size()) + " " + plural +
                           " (WORLD_SIZE / SLURM_NTASKS) but the job has " + std::to_string(count) + " (" + field +
                           ")");
    }
    if (h.rank() >= count) {
      return RefuseAndStop(s, "rank " + std::to_string(h.rank()) + " is out of range: the job has " + std::to_string(count) +
                           " " + plural + " (" + field + ")");
    }
    auto& pending = pending_[h.role()];
    for (const auto& other : pending) {
      if (h.rank() >= 0 && other->hello.rank() == h.rank()) {
        // At the first formation two processes of one rank are a launch
        // that cannot form (Slurm ranks duplicated); after a restart it
        // may be a process declared lost that came back.
        const std::string reason = DescribeRole(h.role(), h.rank()) + " is already taken by " + other->Describe();
        return restarts_ == 0 ? RefuseAndStop(s, reason) : Refuse(s, reason);
      }
    }
    if (static_cast<int>(pending.size()) == count) {
      return Refuse(s, "all " + std::to_string(count) + " " + plural + " have already joined");
    }
    s->admitted = true;
    s->conn->set_max_body_bytes(shape_.max_message_bytes);
    pending.push_back(s);
    const int joined = static_cast<int>(pending_[wire::SERVER].size() + pending_[wire::WORKER].size());
    LOG(INFO) << "coordinator: " << s->Describe() << " joined from " << s->conn->peer() << " [" << joined << "/"
              << servers_ + workers_ << "]";
    if (joined == servers_ + workers_) Form();
  }

  // Everyone is here: settle ranks (given ones kept, the others fill the
  // gaps in arrival order) and send each process the membership.
  void Form() {
    members_.clear();
    wire::Welcome welcome;
    for (wire::Role role : {wire::SERVER, wire::WORKER}) {
      const int count = role == wire::SERVER ? servers_ : workers_;
      std::vector<SessionPtr> slots(count);
      for (const auto& s : pending_[role]) {
        if (s->hello.rank() >= 0) slots[s->hello.rank()] = s;
      }
      size_t next = 0;
      for (const auto& s : pending_[role]) {
        if (s->hello.rank() >= 0) continue;
        while (slots[next]) ++next;
        slots[next] = s;
      }
      for (int r = 0; r < count; ++r) {
        slots[r]->rank = r;
        members_.push_back(slots[r]);
      }
    }
    FillMembers(&welcome);
    formed_ = true;
    join_timer_.cancel();
    if (options_.on_formed) options_.on_formed();
    LOG(INFO) << "coordinator: all " << members_.size() << " processes joined; membership sent";
    for (const auto& s : members_) {
      wire::Envelope m;
      *m.mutable_welcome() = welcome;
      m.mutable_welcome()->set_role(s->role());
      m.mutable_welcome()->set_rank(s->rank);
      Send(s, m);
    }
  }

  int MemberIndex(const SessionPtr& s) const { return s->role() == wire::SERVER ? s->rank : servers_ + s->rank; }

  void Barrier(const SessionPtr& s, const wire::Barrier& b) {
    const int index = MemberIndex(s);
    const bool region_scope = b.scope() == wire::REGION;
    if (region_scope ? shape_.regions <= 1 : !InScope(b.scope(), s->role()) || joining_members_.count(index)) {
      return ProtocolError(s, Status::Corruption("barrier '" + b.name() + "' of scope " +
                                                 wire::Scope_Name(b.scope()) + " entered by a non-member"));
    }
    const int region = region_scope ? RegionOf(index) : -1;
    const std::string key =
        wire::Scope_Name(b.scope()) + (region_scope ? std::to_string(region) : "") + "/" + b.name();
    auto& pending = barriers_[key];
    pending.barrier = b;
    pending.region = region;
    pending.arrived.insert(index);
    MaybeCompleteBarrier(key);
  }

  // Whether member `index` takes part in barriers and all-gathers: not one
  // an elastic job lost, nor a worker still joining.
  bool Takes(int index) const {
    return !lost_members_.count(index) && !(joining_ != nullptr && members_[index] == joining_);
  }

  // The members of `scope` that take part.
  int LiveInScope(wire::Scope scope) const {
    int n = 0;
    for (size_t i = 0; i < members_.size(); ++i) n += InScope(scope, members_[i]->role()) && Takes(static_cast<int>(i));
    return n;
  }

  void SendToLiveInScope(wire::Scope scope, const wire::Envelope& m) {
    for (size_t i = 0; i < members_.size(); ++i) {
      if (InScope(scope, members_[i]->role()) && Takes(static_cast<int>(i))) Send(members_[i], m);
    }
  }

  // Whether member `index` is waited for in a barrier of `scope` (a
  // REGION barrier: of `region`): a member that takes part, or (a region's
  // barrier) a member of the region joining now.
  bool InBarrier(int index, wire::Scope scope, int region) const {
    if (scope == wire::REGION) {
      return RegionOf(index) == region && (Takes(index) || joining_members_.count(index));
    }
    return InScope(scope, members_[index]->role()) && Takes(index) && !unserved_members_.count(index);
  }

  void MaybeCompleteBarrier(const std::string& key) {
    auto it = barriers_.find(key);
    const wire::Scope scope = it->second.barrier.scope();
    const int region = it->second.region;
    int arrived = 0, waived = 0, expected = 0;
    for (size_t i = 0; i < members_.size(); ++i) {
      if (!InBarrier(static_cast<int>(i), scope, region)) continue;
      ++expected;
      if (it->second.arrived.count(static_cast<int>(i))) {
        ++arrived;
      } else if (members_[i]->left) {
        ++waived;  // gone for good: it will not arrive
      }
    }
    if (arrived + waived < expected) return;
    wire::Envelope m;
    *m.mutable_barrier() = it->second.barrier;
    barriers_.erase(it);
    for (size_t i = 0; i < members_.size(); ++i) {
      if (InBarrier(static_cast<int>(i), scope, region)) Send(members_[i], m);
    }
    // A region joining under way is connected: the job takes it in; it
    // serves once its servers have the job's state.
    if (scope == wire::REGION && region == JoiningRegion() && m.barrier().name() == kUcxConnectedBarrier) {
      AdmitRegion();
    }
    if (scope == wire::REGION && m.barrier().name() == kRegionServesBarrier) {
      for (auto u = unserved_members_.begin(); u != unserved_members_.end();) {
        u = RegionOf(*u) == region ? unserved_members_.erase(u) : std::next(u);
      }
    }
    // The job is done before a region admitted took up its state (it was
    // admitted after the last outer step): it stops.
    if (scope == wire::EVERYONE && m.barrier().name() == kDoneBarrier) {
      wire::Envelope stop;
      stop.mutable_shutdown()->set_reason("the job finished before this process's region took up its state");
      for (int index : unserved_members_) {
        const SessionPtr& s = members_[index];
        if (s->left) continue;
        s->left = true;
        SendAndClose(s, stop);
      }
      unserved_members_.clear();
    }
  }

  void AllGather(const SessionPtr& s, const wire::AllGather& g) {
    const int n = ScopeSize(g.scope(), servers_, workers_);
    if (!InScope(g.scope(), s->role())) {
      return ProtocolError(s, Status::Corruption("all-gather '" + g.name() + "' entered by a non-member"));
    }
    // The result must fit in one message: each share gets 1/n of the bound.
    const size_t share = (shape_.max_message_bytes - 1024) / n;
    if (g.data().size() > share) {
      return ProtocolError(s, Status::Corruption("all-gather '" + g.name() + "' contribution of " +
                                                 std::to_string(g.data().size()) + " bytes exceeds " +
                                                 std::to_string(share) + " bytes (the message bound / " +
                                                 std::to_string(n) + ")"));
    }
    const int self = MemberIndex(s);
    bool named_self = g.members().empty();
    for (int32_t index : g.members()) {
      if (index >= static_cast<int>(members_.size()) || !InScope(g.scope(), members_[index]->role())) {
        return ProtocolError(s, Status::Corruption("all-gather '" + g.name() + "' names member " +
                                                   std::to_string(index) + ", not one of its scope"));
      }
      named_self |= index == self;
    }
    if (!named_self || joining_members_.count(self)) {
      return ProtocolError(s, Status::Corruption("all-gather '" + g.name() + "' entered by a member not taking part"));
    }
    const std::string key = wire::Scope_Name(g.scope()) + "/" + g.name();
    auto [it, opened] = gathers_.try_emplace(key);
    auto& pending = it->second;
    if (g.members_size() > 0) {
      pending.named_epoch = opened || pending.named.empty() ? g.members_epoch()
                                                            : std::min(pending.named_epoch, g.members_epoch());
    }
    pending.name = g.name();
    pending.scope = g.scope();
    pending.named.insert(g.members().begin(), g.members().end());
    pending.parts[self] = g.data();
    MaybeCompleteGather(key);
  }

  // Whether member `index` is waited for in `pending`: the members its
  // contributors named, or every member of its scope that takes part;
  // either way not one lost, nor one whose process joined after the
  // epoch the names were chosen at (its index named the process it
  // replaced, which was lost).
  bool InGather(int index, const PendingGather& pending) const {
    if (!InScope(pending.scope, members_[index]->role())) return false;
    if (pending.named.empty()) return Takes(index);
    const auto since = joined_at_.find(index);
    const bool later = since != joined_at_.end() && since->second > pending.named_epoch;
    return pending.named.count(index) && !lost_members_.count(index) && !later;
  }

  // Complete once every member it waits for has contributed; a share not
  // waited for (a lost member's) is empty (scope order is kept).
  void MaybeCompleteGather(const std::string& key) {
    auto it = gathers_.find(key);
    PendingGather& pending = it->second;
    for (size_t i = 0; i < members_.size(); ++i) {
      if (InGather(static_cast<int>(i), pending) && !pending.parts.count(static_cast<int>(i))) return;
    }
    wire::Envelope m;
    m.mutable_all_gather_result()->set_name(pending.name);
    for (size_t i = 0; i < members_.size(); ++i) {
      if (!InScope(pending.scope, members_[i]->role())) continue;
      auto part = pending.parts.find(static_cast<int>(i));
      const bool counted = part != pending.parts.end() && InGather(static_cast<int>(i), pending);
      m.mutable_all_gather_result()->add_data(counted ? std::move(part->second) : std::string());
    }
    const wire::Scope scope = pending.scope;
    gathers_.erase(it);
    SendToLiveInScope(scope, m);
  }

  // ---- liveness ------------------------------------------------------------
  void Lost(const SessionPtr& s, const std::string& reason) {
    const std::string who = s->Describe();
    if (!formed_) {
      // Before the start a process may come and go (and come back).
      LOG(WARNING) << "coordinator: " << who << " went away before the job started: " << reason;
      auto& pending = pending_[s->role()];
      pending.erase(std::remove(pending.begin(), pending.end(), s), pending.end());
      s->admitted = false;
      Close(s);
      return;
    }
    s->left = true;  // it cannot be lost twice
    if (joining_members_.count(MemberIndex(s))) return RegionJoinFailed(s, reason);
    const Status failure = Status::Unavailable(who + " was lost: " + reason);
    // A worker lost while it was joining leaves the job as it was.
    if (shape_.elastic && failure_.ok() && s->role() == wire::WORKER &&
        (s == joining_ || LiveInScope(wire::WORKERS) > 1)) {
      WorkerLost(s, reason);
      return TellLost(s, who, reason);
    }
    if (shape_.regions > 1 && failure_.ok() && LiveRegions() > 1) {
      RegionLost(s, reason);
      return TellLost(s, who, reason);
    }
    if (restarts_ < options_.max_restarts && failure_.ok()) {
      Restart(failure, s);
    } else {
      Fail(failure, s);
    }
    TellLost(s, who, reason);
  }

  // The lost process itself, should it be alive after all (stopped, then
  // continued), finds why it was let go rather than a dropped connection.
  void TellLost(const SessionPtr& s, const std::string& who, const std::string& reason) {
    wire::Envelope m;
    m.mutable_shutdown()->set_reason(who + " was declared lost: " + reason);
    m.mutable_shutdown()->set_declared_lost(true);
    SendAndClose(s, m);
  }

  // Tells every member who was lost, lets them go and waits for the job to
  // form again: the same shape and config hash, ranks assigned afresh.
  void Restart(const Status& failure, const SessionPtr& lost) {
    ++restarts_;
    LOG(WARNING) << "coordinator: " << failure.message() << "; restart " << restarts_ << " of "
                 << options_.max_restarts << ": waiting for the job's processes to join again";
    if (first_lost_pid_ == 0) first_lost_pid_ = lost->hello.pid();
    formed_ = false;  // first: the members closed below do not finish the job
    const wire::Envelope m = PeerLostMessage(failure, lost);
    for (const auto& s : Snapshot()) {
      if (s == lost || !s->admitted) continue;
      s->left = true;  // its going is expected now
      SendAndClose(s, m);
    }
    pending_.clear();
    members_.clear();
    lost_members_.clear();
    membership_epoch_ = 0;
    joining_ = nullptr;
    join_queue_.clear();
    awaiting_ack_.clear();
    joined_at_.clear();
    for (const auto& [region, arrived] : region_arrivals_) {
      for (const auto& [index, s] : arrived) Refuse(s, "--join: the job is starting again (--max-restarts)");
    }
    region_arrivals_.clear();
    joining_members_.clear();
    unserved_members_.clear();
    barriers_.clear();
    gathers_.clear();
    ArmJoinTimer(shape_.join_timeout_s);
  }

  // A member as a membership change names it (no UCX address: it is gone).
  static void MemberOf(const SessionPtr& s, wire::Member* who) {
    who->set_role(s->role());
    who->set_rank(s->rank);
    who->set_host(s->hello.host());
    who->set_pid(s->hello.pid());
  }

  // An elastic job goes on without a lost worker: the others are told,
  // and barriers and all-gathers that waited only for it complete.
  void WorkerLost(const SessionPtr& lost, const std::string& reason) {
    lost_members_.insert(MemberIndex(lost));
    ++membership_epoch_;
    wire::Envelope m;
    auto* c = m.mutable_membership_changed();
    c->set_epoch(membership_epoch_);
    MemberOf(lost, c->mutable_lost());
    c->set_reason(reason.substr(0, kMaxReasonBytes));
    for (int r = 0; r < workers_; ++r) {
      if (!lost_members_.count(servers_ + r)) c->add_live_workers(r);
    }
    LOG(WARNING) << "coordinator: " << lost->Describe() << " was lost: " << reason << "; the job goes on with "
                 << c->live_workers_size() << " workers (cluster.elastic)";
    if (lost == joining_) {
      joining_ = nullptr;  // lost before it was welcomed: the others heard of it
    } else {
      awaiting_ack_.erase(MemberIndex(lost));
    }
    SendToLiveInScope(wire::EVERYONE, m);
    if (options_.on_member_dropped) options_.on_member_dropped(lost->hello.pid());
    RecheckCollectives();
    MaybeWelcomeJoiner();
  }

  // A job of regions: the region of member `index` (servers by rank, then
  // workers), its members a block of consecutive ranks of each role.
  int RegionOf(int index) const {
    return index < servers_ ? RegionOfRank(index, servers_, shape_.regions)
                            : RegionOfRank(index - servers_, workers_, shape_.regions);
  }
  int LiveRegions() const {
    std::set<int> live;
    for (size_t i = 0; i < members_.size(); ++i) {
      if (!lost_members_.count(static_cast<int>(i))) live.insert(RegionOf(static_cast<int>(i)));
    }
    return static_cast<int>(live.size());
  }

  // A job of regions goes on without a lost member's region: its other
  // members are let go (told who was lost, their connections closed), the
  // others told (MembershipChanged naming them all), and barriers and
  // all-gathers that waited only for the region complete.
  void RegionLost(const SessionPtr& lost, const std::string& reason) {
    const int region = RegionOf(MemberIndex(lost));
    ++membership_epoch_;
    wire::Envelope m;
    auto* c = m.mutable_membership_changed();
    c->set_epoch(membership_epoch_);
    MemberOf(lost, c->mutable_lost());
    const std::string why = lost->Describe() + " was lost: " + reason + "; region " + std::to_string(region) +
                            " is let go, the other regions go on";
    c->set_reason(why.substr(0, kMaxReasonBytes));
    const wire::Envelope let_go = PeerLostMessage(Status::Unavailable(why), lost);
    for (size_t i = 0; i < members_.size(); ++i) {
      const SessionPtr& s = members_[i];
      if (RegionOf(static_cast<int>(i)) != region || lost_members_.count(static_cast<int>(i))) continue;
      lost_members_.insert(static_cast<int>(i));
      if (s == lost) continue;
      MemberOf(s, c->add_let_go());
      if (s->left) continue;
      s->left = true;  // its going is expected now
      SendAndClose(s, let_go);
    }
    for (int r = 0; r < workers_; ++r) {
      if (!lost_members_.count(servers_ + r)) c->add_live_workers(r);
    }
    LOG(WARNING) << "coordinator: " << why << " (" << LiveRegions() << " regions left)";
    SendToLiveInScope(wire::EVERYONE, m);
    if (options_.on_member_dropped) {
      for (size_t i = 0; i < members_.size(); ++i) {
        if (RegionOf(static_cast<int>(i)) == region) options_.on_member_dropped(members_[i]->hello.pid());
      }
    }
    RecheckCollectives();
  }

  // Barriers and all-gathers that may have been waiting only for members
  // that are gone now.
  void RecheckCollectives() {
    std::vector<std::string> keys;
    for (const auto& [key, pending] : barriers_) keys.push_back(key);
    for (const auto& key : keys) MaybeCompleteBarrier(key);
    keys.clear();
    for (const auto& [key, pending] : gathers_) keys.push_back(key);
    for (const auto& key : keys) MaybeCompleteGather(key);
  }

  // ---- joining an elastic job under way --------------------------------------
  // Joins go one at a time, in arrival order: a worker is admitted in
  // place of a lost one, every member is told (MembershipChanged with
  // `joined`) and acknowledges once it has acted on it (the servers have
  // connected to the newcomer and stamp their next step reports with the
  // new epoch), and only then is the newcomer welcomed. It takes no part in
  // barriers and all-gathers before that.
  void QueueJoin(const SessionPtr& s) {
    if (shape_.regions > 1) return ArriveForRegion(s);
    if (!shape_.elastic) {
      return Refuse(s, "--join: the job is not elastic (cluster.elastic) nor one of regions (cluster.diloco); a "
                       "worker can join only an elastic job");
    }
    if (s->role() != wire::WORKER) return Refuse(s, "--join: only a worker can join a job under way");
    join_queue_.push_back(s);
    NextJoin();
  }

  void NextJoin() {
    while (joining_ == nullptr && !join_queue_.empty()) {
      SessionPtr s = join_queue_.front();
      join_queue_.pop_front();
      if (!sessions_.count(s->id)) continue;  // went away while it waited
      Admit(s);
    }
  }

  void Admit(const SessionPtr& s) {
    const wire::Hello& h = s->hello;
    std::vector<int> lost;
    for (int index : lost_members_) lost.push_back(index - servers_);
    for (size_t i = 0; i < members_.size(); ++i) {
      if (Takes(static_cast<int>(i)) && members_[i]->left) {
        return Refuse(s, "--join: the job is finishing (its processes are leaving)");
      }
    }
    if (lost.empty()) {
      return Refuse(s, "--join: the job has all its " + std::to_string(workers_) +
                           " workers (cluster.workers); a worker joins in place of a lost one");
    }
    if (h.world_size() != -1 && h.world_size() != workers_) {
      return Refuse(s, "the launcher says there are " + std::to_string(h.world_size()) +
                           " workers (WORLD_SIZE / SLURM_NTASKS) but the job has " + std::to_string(workers_) +
                           " (cluster.workers)");
    }
    int rank = lost.front();
    if (h.rank() >= 0) {
      if (std::find(lost.begin(), lost.end(), h.rank()) == lost.end()) {
        std::string names;
        for (int r : lost) names += (names.empty() ? "" : ", ") + std::to_string(r);
        return Refuse(s, "--join: worker rank " + std::to_string(h.rank()) +
                             " is not a lost one; a worker joins in place of a lost one (lost ranks: " + names + ")");
      }
      rank = h.rank();
    }
    const int index = servers_ + rank;
    s->admitted = true;
    s->rank = rank;
    s->conn->set_max_body_bytes(shape_.max_message_bytes);
    members_[index] = s;
    lost_members_.erase(index);
    joining_ = s;
    join_epoch_ = ++membership_epoch_;
    joined_at_[index] = join_epoch_;
    wire::Envelope m;
    auto* c = m.mutable_membership_changed();
    c->set_epoch(join_epoch_);
    auto* who = c->mutable_joined();
    who->set_role(wire::WORKER);
    who->set_rank(rank);
    who->set_host(h.host());
    who->set_pid(h.pid());
    who->set_ucx_address(h.ucx_address());
    c->set_reason("joined");
    for (int r = 0; r < workers_; ++r) {
      if (!lost_members_.count(servers_ + r)) c->add_live_workers(r);
    }
    LOG(INFO) << "coordinator: " << s->Describe() << " joins from " << s->conn->peer() << " in place of a lost worker; "
              << c->live_workers_size() << " workers once every member has heard (membership epoch " << join_epoch_
              << ")";
    awaiting_ack_.clear();
    for (size_t i = 0; i < members_.size(); ++i) {
      if (Takes(static_cast<int>(i))) awaiting_ack_.insert(static_cast<int>(i));
    }
    SendToLiveInScope(wire::EVERYONE, m);
    MaybeWelcomeJoiner();
  }

  void MembershipAck(const SessionPtr& s, const wire::MembershipAck& ack) {
    if (!formed_ || ack.epoch() > membership_epoch_) {
      return ProtocolError(s, Status::Corruption("acknowledged membership epoch " + std::to_string(ack.epoch()) +
                                                 ", which was never sent"));
    }
    if (joining_ != nullptr && ack.epoch() >= join_epoch_) awaiting_ack_.erase(MemberIndex(s));
    MaybeWelcomeJoiner();
  }

  void MaybeWelcomeJoiner() {
    if (joining_ != nullptr && awaiting_ack_.empty()) {
      SessionPtr s = joining_;
      joining_ = nullptr;
      wire::Envelope m;
      wire::Welcome* w = m.mutable_welcome();
      FillMembers(w);
      w->set_role(wire::WORKER);
      w->set_rank(s->rank);
      w->set_membership_epoch(membership_epoch_);
      for (int r = 0; r < workers_; ++r) {
        if (lost_members_.count(servers_ + r)) continue;
        w->add_live_workers(r);
        auto at = joined_at_.find(servers_ + r);
        w->add_joined_at(at == joined_at_.end() ? 0 : at->second);
      }
      LOG(INFO) << "coordinator: " << s->Describe() << " joined; the job goes on with " << w->live_workers_size()
                << " workers";
      Send(s, m);
    }
    NextJoin();
  }

  // Every member; a lost one (not one joining now) without its UCX
  // address: nobody is to connect to it.
  void FillMembers(wire::Welcome* welcome) const {
    for (size_t i = 0; i < members_.size(); ++i) {
      const SessionPtr& s = members_[i];
      wire::Member* m = welcome->add_members();
      m->set_role(s->role());
      m->set_rank(s->rank);
      m->set_host(s->hello.host());
      m->set_pid(s->hello.pid());
      const int index = static_cast<int>(i);
      if (!lost_members_.count(index) || joining_members_.count(index)) m->set_ucx_address(s->hello.ucx_address());
    }
  }

  // ---- a region rejoining a job of regions under way ------------------------
  // A lost region's processes start again with --join, each naming its
  // rank. Once all of a region's have arrived they are welcomed (one
  // region at a time) and connect to the job's members and each other,
  // the others not knowing them yet; when all of them have (a REGION
  // barrier) the region is admitted: every member is told
  // (MembershipChanged with `joined` and `joined_with`) and it takes part
  // from then on. Its servers take up the job's state from the other
  // regions' at the next outer step's exchange (server/outer_steps.h).
  int RegionSize() const { return servers_ / shape_.regions + workers_ / shape_.regions; }
  // The region joining now, or -1.
  int JoiningRegion() const { return joining_members_.empty() ? -1 : RegionOf(*joining_members_.begin()); }

  void ArriveForRegion(const SessionPtr& s) {
    const wire::Hello& h = s->hello;
    const bool server = h.role() == wire::SERVER;
    const int count = server ? servers_ : workers_;
    if (h.rank() < 0 || h.rank() >= count) {
      return Refuse(s, "--join: a process rejoining a job of regions names its rank (--rank), one of the job's " +
                           std::to_string(count) + (server ? " servers" : " workers"));
    }
    const int index = server ? h.rank() : servers_ + h.rank();
    const int region = RegionOf(index);
    if (!lost_members_.count(index) || joining_members_.count(index)) {
      return Refuse(s, "--join: " + DescribeRole(h.role(), h.rank()) + " of region " + std::to_string(region) +
                           " is not lost; a lost region's processes rejoin in its place");
    }
    for (size_t i = 0; i < members_.size(); ++i) {
      if (Takes(static_cast<int>(i)) && members_[i]->left) {
        return Refuse(s, "--join: the job is finishing (its processes are leaving)");
      }
    }
    auto& arrived = region_arrivals_[region];
    if (auto other = arrived.find(index); other != arrived.end() && sessions_.count(other->second->id)) {
      return Refuse(s, DescribeRole(h.role(), h.rank()) + " is already taken by " + other->second->Describe());
    }
    arrived[index] = s;
    LOG(INFO) << "coordinator: " << s->Describe() << " arrived from " << s->conn->peer() << " to rejoin region "
              << region << " [" << arrived.size() << "/" << RegionSize() << "]";
    NextRegionJoin();
  }

  // Welcomes the next region whose processes have all arrived, unless one
  // is joining now.
  void NextRegionJoin() {
    if (!joining_members_.empty()) return;
    for (auto& [region, arrived] : region_arrivals_) {
      for (auto it = arrived.begin(); it != arrived.end();) {
        it = sessions_.count(it->second->id) ? std::next(it) : arrived.erase(it);  // went away while it waited
      }
      if (static_cast<int>(arrived.size()) < RegionSize()) continue;
      std::map<int, SessionPtr> joiners = std::move(arrived);
      region_arrivals_.erase(region);
      for (const auto& [index, s] : joiners) {
        s->admitted = true;
        s->rank = index < servers_ ? index : index - servers_;
        s->conn->set_max_body_bytes(shape_.max_message_bytes);
        members_[index] = s;
        joining_members_.insert(index);
      }
      wire::Welcome w;
      FillMembers(&w);
      w.set_membership_epoch(membership_epoch_);
      w.set_joining_region(region);
      for (int r = 0; r < workers_; ++r) {
        if (lost_members_.count(servers_ + r)) continue;
        w.add_live_workers(r);
        w.add_joined_at(0);
      }
      LOG(INFO) << "coordinator: region " << region << "'s " << joiners.size()
                << " processes rejoin the job; welcomed, they connect";
      for (const auto& [index, s] : joiners) {
        wire::Envelope m;
        *m.mutable_welcome() = w;
        m.mutable_welcome()->set_role(s->role());
        m.mutable_welcome()->set_rank(s->rank);
        Send(s, m);
      }
      return;
    }
  }

  // The joining region's processes have connected: it takes part, and
  // every member is told.
  void AdmitRegion() {
    const int region = JoiningRegion();
    ++membership_epoch_;
    wire::Envelope m;
    auto* c = m.mutable_membership_changed();
    c->set_epoch(membership_epoch_);
    for (int index : joining_members_) {
      lost_members_.erase(index);
      unserved_members_.insert(index);
      joined_at_[index] = membership_epoch_;
      const SessionPtr& s = members_[index];
      wire::Member* who = c->has_joined() ? c->add_joined_with() : c->mutable_joined();
      MemberOf(s, who);
      who->set_ucx_address(s->hello.ucx_address());
    }
    c->set_reason("region " + std::to_string(region) + " rejoined");
    for (int r = 0; r < workers_; ++r) {
      if (!lost_members_.count(servers_ + r)) c->add_live_workers(r);
    }
    joining_members_.clear();
    LOG(INFO) << "coordinator: region " << region << " rejoined the job (membership epoch " << membership_epoch_
              << ", " << LiveRegions() << " regions)";
    SendToLiveInScope(wire::EVERYONE, m);
    NextRegionJoin();
  }

  // A process of the region joining now was lost before the region was
  // admitted: the others never heard of it, and its other processes are let
  // go (the region is lost as it was).
  void RegionJoinFailed(const SessionPtr& lost, const std::string& reason) {
    const int region = JoiningRegion();
    const std::string why = lost->Describe() + " was lost while region " + std::to_string(region) +
                            " rejoined: " + reason + "; the region stays lost";
    LOG(WARNING) << "coordinator: " << why;
    wire::Envelope m;
    m.mutable_shutdown()->set_reason(why.substr(0, kMaxReasonBytes));
    m.mutable_shutdown()->set_declared_lost(true);
    for (int index : joining_members_) {
      const SessionPtr& s = members_[index];
      if (options_.on_member_dropped) options_.on_member_dropped(s->hello.pid());
      if (s->left && s != lost) continue;
      s->left = true;
      SendAndClose(s, m);
    }
    joining_members_.clear();
    for (auto it = barriers_.begin(); it != barriers_.end();) {
      it = it->second.region == region ? barriers_.erase(it) : std::next(it);
    }
    NextRegionJoin();
  }

  static wire::Envelope PeerLostMessage(const Status& failure, const SessionPtr& lost) {
    wire::Envelope m;
    auto* p = m.mutable_peer_lost();
    p->set_role(lost->role());
    p->set_rank(lost->rank);
    p->set_host(lost->hello.host());
    p->set_pid(lost->hello.pid());
    p->set_reason(failure.message().substr(0, kMaxReasonBytes));
    return m;
  }

  // Records the job's first failure, tells every live member who was lost,
  // and gives them drain_timeout to go before Run() returns anyway.
  void Fail(const Status& failure, const SessionPtr& lost) {
    if (!failure_.ok()) {
      LOG(WARNING) << "coordinator: also: " << failure.message();
      return;
    }
    failure_ = failure;
    LOG(ERROR) << "coordinator: " << failure.message() << "; stopping the job";
    if (lost != nullptr) {
      if (first_lost_pid_ == 0) first_lost_pid_ = lost->hello.pid();
      const wire::Envelope m = PeerLostMessage(failure, lost);
      for (auto& [id, other] : sessions_) {
        if (other != lost && other->admitted && !other->left) Send(other, m);
      }
    }
    drain_timer_.expires_after(ToDuration(options_.drain_timeout_s));
    drain_timer_.async_wait([this](boost::system::error_code ec) {
      if (ec) return;
      if (sessions_.empty()) return Finish();  // lingered to tell latecomers
      LOG(WARNING) << "coordinator: " << sessions_.size() << " connections still open after "
                   << Seconds(options_.drain_timeout_s) << "; exiting anyway";
      Finish();
    });
    MaybeFinish();
  }

  void ArmHeartbeat() {
    heartbeat_timer_.expires_after(ToDuration(shape_.heartbeat_interval_s));
    heartbeat_timer_.async_wait([this](boost::system::error_code ec) {
      if (ec || finished_) return;
      const auto now = Clock::now();
      std::vector<SessionPtr> silent;
      for (auto& [id, s] : sessions_) {
        const double quiet = std::chrono::duration<double>(now - s->last_heard).count();
        if (quiet > shape_.heartbeat_timeout_s) silent.push_back(s);
      }
      for (const auto& s : silent) {
        if (s->admitted && !s->left) {
          if (options_.on_silent) options_.on_silent(s->hello.pid());
          Lost(s, "silent for " + Seconds(shape_.heartbeat_timeout_s) + " (cluster.heartbeat_timeout_s)");
        } else {
          warnings_.Warn(s->conn->peer(), "coordinator: closing " + s->Describe() + ": nothing received for " +
                                              Seconds(shape_.heartbeat_timeout_s));
          Close(s);
        }
      }
      wire::Envelope beat;
      beat.mutable_heartbeat();
      for (auto& [id, s] : sessions_) {
        if (s->admitted && !s->left) Send(s, beat);
      }
      ArmHeartbeat();
    });
  }

  // Everyone must have joined `seconds` after the job's shape became known.
  void ArmJoinTimer(double seconds) {
    join_timer_.expires_after(ToDuration(seconds));
    join_timer_.async_wait([this, seconds](boost::system::error_code ec) {
      if (ec || formed_ || finished_) return;
      std::string missing;
      for (wire::Role role : {wire::SERVER, wire::WORKER}) {
        const int count = role == wire::SERVER ? servers_ : workers_;
        missing += (missing.empty() ? "" : ", ") + std::to_string(pending_[role].size()) + "/" +
                   std::to_string(count) + (role == wire::SERVER ? " servers" : " workers");
      }
      StopForming(Status::Unavailable("timed out after " + Seconds(seconds) +
                                      " waiting for the job's processes to join (joined: " + missing + ")"));
    });
  }

  void MaybeFinish() {
    if (finished_) return;
    bool members_open = false;
    for (auto& [id, s] : sessions_) members_open |= s->admitted;
    if (!failure_.ok() && sessions_.empty() && !linger_) return Finish();
    if (formed_ && failure_.ok() && !members_open) {
      LOG(INFO) << "coordinator: all " << members_.size() << " processes left; job finished";
      Finish();
    }
  }

  void Finish() {
    finished_ = true;
    boost::system::error_code ignored;
    acceptor_.close(ignored);
    heartbeat_timer_.cancel();
    join_timer_.cancel();
    drain_timer_.cancel();
    for (auto& [id, s] : sessions_) s->conn->Close();
    sessions_.clear();
    io_.stop();
  }

  CoordinatorOptions options_;
  JobShape shape_;  // the options' or, without one, the first Hello's timing
  asio::io_context io_;
  tcp::acceptor acceptor_;
  asio::steady_timer heartbeat_timer_, join_timer_, drain_timer_;
  int servers_, workers_;  // -1 until the first Hello when the shape is not fixed
  std::map<uint64_t, SessionPtr> sessions_;
  uint64_t next_session_id_ = 1;
  bool reference_hash_set_ = false;
  uint64_t reference_hash_ = 0;
  std::string reference_desc_;
  std::map<int, std::vector<SessionPtr>> pending_;  // by role, in arrival order
  bool formed_ = false;
  std::vector<SessionPtr> members_;  // by member index: servers then workers
  std::set<int> lost_members_;       // member indices an elastic job (its workers) or a job of regions lost
  int membership_epoch_ = 0;         // changes so far (MembershipChanged)
  // Joining (elastic): the worker admitted and not yet welcomed, the
  // members whose acknowledgement it waits for, the workers waiting their
  // turn, and by rank the epoch at which each joined worker did.
  SessionPtr joining_;
  int join_epoch_ = 0;
  std::set<int> awaiting_ack_;  // member indices
  std::deque<SessionPtr> join_queue_;
  // By member index, the membership epoch at which its process joined the
  // job under way (an elastic job's worker, a region's member; none: there
  // since the job formed).
  std::map<int, int> joined_at_;
  // A job of regions: the processes arrived to rejoin a lost region, by
  // region and member index; the members of the region joining now,
  // welcomed and not yet admitted (they stay in lost_members_).
  std::map<int, std::map<int, SessionPtr>> region_arrivals_;
  std::set<int> joining_members_;
  // Members of a region admitted whose servers have not yet taken up the
  // job's state (kRegionServesBarrier): the job's done barrier does not
  // wait for them.
  std::set<int> unserved_members_;
  struct PendingBarrier {
    wire::Barrier barrier;
    int region = -1;        // a REGION barrier's
    std::set<int> arrived;  // member indices
  };
  struct PendingGather {
    std::string name;
    wire::Scope scope = wire::EVERYONE;
    int named_epoch = 0;               // the membership epoch its members were named as of (the least)
    std::set<int> named;               // member indices its contributors named (none: the scope's)
    std::map<int, std::string> parts;  // by member index
  };
  std::map<std::string, PendingBarrier> barriers_;  // by scope/name
  std::map<std::string, PendingGather> gathers_;
  Status failure_;
  bool linger_ = false;  // after a refusal stopped the job: stay drain_timeout_s to tell latecomers
  int64_t first_lost_pid_ = 0;  // read only after Run() has returned
  int restarts_ = 0;
  WarningLimiter warnings_;

 public:
  int64_t first_lost_pid() const { return first_lost_pid_; }

 private:
  bool finished_ = false;
};

CoordinatorOptions CoordinatorOptions::FromConfig(const JobConfig& config) {
  CoordinatorOptions o;
  o.listen = config.cluster().coordinator();
  o.job = JobShape::FromConfig(config);
  return o;
}

StatusOr<std::unique_ptr<Coordinator>> Coordinator::Start(const CoordinatorOptions& options) {
  if (options.token.empty()) return Status::InvalidArgument("coordinator: the job token is empty");
  auto impl = std::make_unique<Impl>(options);
  HERD_RETURN_IF_ERROR(impl->Listen());
  return std::unique_ptr<Coordinator>(new Coordinator(std::move(impl)));
}

Coordinator::Coordinator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Coordinator::~Coordinator() = default;
int64_t Coordinator::first_lost_pid() const { return impl_->first_lost_pid(); }

uint16_t Coordinator::port() const { return impl_->port(); }
Status Coordinator::Run() { return impl_->Run(); }
void Coordinator::Stop(const std::string& reason) { impl_->Stop(reason); }

}  // namespace herd::transport
