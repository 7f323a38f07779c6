#include "transport/coordinator_client.h"

#include <glog/logging.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <future>
#include <set>
#include <thread>

#include "common/file_util.h"
#include "common/mutex.h"
#include "common/trace.h"
#include "transport/framed_connection.h"
#include "transport/rendezvous.h"
#include "transport/wire.h"

namespace herd::transport {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

JoinOptions JoinOptions::FromConfig(const JobConfig& config) {
  JoinOptions o;
  o.job = JobShape::FromConfig(config);
  o.config_hash = ConfigHash(config);
  o.data_interface = config.cluster().data_interface();
  return o;
}

StatusOr<JoinOptions> JoinOptions::ForProcess(const JobConfig& config, wire::Role role, const std::string& flag_rank,
                                              const std::string& flag_coordinator, const std::string& token_file) {
  const auto env = ProcessEnv();
  HERD_ASSIGN_OR_RETURN(Placement placement,
                        ResolvePlacement(flag_rank, flag_coordinator, config.cluster().coordinator(), env));
  JoinOptions o = FromConfig(config);
  HERD_ASSIGN_OR_RETURN(o.token, LoadJobToken(token_file, env));
  o.role = role;
  o.coordinator = placement.coordinator;
  o.rank = placement.rank;
  o.world_size = placement.world_size;
  return o;
}

class CoordinatorClient::Impl {
 public:
  explicit Impl(const JoinOptions& options)
      : options_(options), work_(asio::make_work_guard(io_)), heartbeat_timer_(io_) {
    if (options_.host.empty()) options_.host = HostName();
  }

  ~Impl() {
    asio::post(io_, [this] {
      heartbeat_timer_.cancel();
      if (conn_) conn_->Close();
    });
    work_.reset();
    if (thread_.joinable()) thread_.join();
  }

  Status Join() {
    HERD_RETURN_IF_ERROR(Connect());
    thread_ = std::thread([this] { io_.run(); });
    asio::post(io_, [this] { Begin(); });
    MutexLock lock(&mu_);
    const auto deadline = Clock::now() + ToDuration(options_.job.join_timeout_s +
                                                                        options_.job.heartbeat_timeout_s);
    while (!welcomed_ && failure_.ok() && cv_.WaitUntil(&mu_, deadline)) {
    }
    if (!welcomed_ && failure_.ok()) {
      return Status::Unavailable("timed out waiting for the membership from the coordinator at " +
                                 options_.coordinator);
    }
    return failure_;
  }

  Status Barrier(const std::string& name, wire::Scope scope) {
    const std::string key = wire::Scope_Name(scope) + "/" + name;
    wire::Envelope m;
    m.mutable_barrier()->set_name(name);
    m.mutable_barrier()->set_scope(scope);
    HERD_RETURN_IF_ERROR(ValidateMessage(m));
    Post(m);
    MutexLock lock(&mu_);
    while (barriers_done_.count(key) == 0 && failure_.ok()) cv_.Wait(&mu_);
    if (barriers_done_.erase(key)) return Status::OK();
    return failure_.WithContext("barrier '" + name + "': ");
  }

  StatusOr<std::vector<std::string>> AllGather(const std::string& name, const std::string& data, wire::Scope scope,
                                               const Voters& voters) {
    wire::Envelope m;
    m.mutable_all_gather()->set_name(name);
    m.mutable_all_gather()->set_scope(scope);
    m.mutable_all_gather()->set_data(data);
    for (int index : voters.members) m.mutable_all_gather()->add_members(index);
    if (!voters.members.empty()) m.mutable_all_gather()->set_members_epoch(voters.epoch);
    HERD_RETURN_IF_ERROR(ValidateMessage(m));
    Post(m);
    MutexLock lock(&mu_);
    while (gathered_.count(name) == 0 && failure_.ok()) cv_.Wait(&mu_);
    auto it = gathered_.find(name);
    if (it == gathered_.end()) return failure_.WithContext("all-gather '" + name + "': ");
    std::vector<std::string> result = std::move(it->second);
    gathered_.erase(it);
    return result;
  }

  void OnFailure(std::function<void(const Status&)> handler) {
    mu_.Lock();
    if (failure_.ok()) {
      on_failure_.push_back(std::move(handler));
      mu_.Unlock();
      return;
    }
    Status failure = failure_;
    mu_.Unlock();
    handler(failure);
  }

  Status health() const {
    MutexLock lock(&mu_);
    return failure_;
  }

  Status Leave() {
    {
      MutexLock lock(&mu_);
      if (left_) return Status::OK();
      left_ = true;
    }
    asio::post(io_, [this] {
      if (conn_->closed()) return;
      wire::Envelope m;
      m.mutable_leave();
      conn_->Send(m);
      conn_->ShutdownSendAfterFlush();
    });
    // The coordinator closes its side once it has read our goodbye.
    MutexLock lock(&mu_);
    const auto deadline = Clock::now() + std::chrono::seconds(5);
    while (!ended_ && cv_.WaitUntil(&mu_, deadline)) {
    }
    return Status::OK();
  }

  StatusOr<ClockOffset> MeasureClockOffset(int probes) {
    ClockOffset best;
    best.rtt_ns = -1;
    for (int i = 0; i < probes; ++i) {
      uint64_t id;
      {
        MutexLock lock(&mu_);
        id = ++probe_.id;
      }
      // Timed on the io thread, next to the send and the receipt, so that
      // neither direction's reading includes a hop between threads.
      asio::post(io_, [this, id] {
        wire::Envelope m;
        m.mutable_clock_probe()->set_id(id);
        {
          MutexLock lock(&mu_);
          probe_.sent_ns = trace::Now();
        }
        conn_->Send(m);
      });
      MutexLock lock(&mu_);
      const auto deadline = Clock::now() + ToDuration(options_.job.heartbeat_timeout_s);
      while (probe_.answered != id && failure_.ok() && cv_.WaitUntil(&mu_, deadline)) {
      }
      if (probe_.answered != id && failure_.ok()) {
        return Status::Unavailable("the coordinator at " + options_.coordinator + " did not answer a clock probe");
      }
      if (!failure_.ok()) return failure_.WithContext("clock probe: ");
      const int64_t rtt = probe_.received_ns - probe_.sent_ns;
      const int64_t middle = probe_.sent_ns + rtt / 2;
      if (best.rtt_ns < 0 || rtt < best.rtt_ns) best = {middle, probe_.coordinator_ns - middle, rtt};
    }
    return best;
  }

  // On the io thread, so that the changes before come first and no later
  // one can overtake them.
  void OnMembershipChange(std::function<void(const MembershipChange&)> handler) {
    auto add = [this, &handler] {
      std::vector<MembershipChange> before;
      {
        MutexLock lock(&mu_);
        on_membership_change_.push_back(handler);
        before = changes_;
      }
      for (const auto& change : before) handler(change);
    };
    if (std::this_thread::get_id() == thread_.get_id()) return add();
    std::promise<void> added;
    asio::post(io_, [&] {
      add();
      added.set_value();
    });
    added.get_future().wait();
  }

  int membership_epoch() const {
    MutexLock lock(&mu_);
    return latest_epoch_;
  }

  int joining_region() const {
    MutexLock lock(&mu_);
    return joining_region_;
  }

  bool joined_under_way() const {
    MutexLock lock(&mu_);
    return joined_under_way_;
  }

  WelcomedMembership welcomed_membership() const {
    MutexLock lock(&mu_);
    WelcomedMembership w;
    w.epoch = welcome_.membership_epoch();
    if (welcome_.live_workers_size() > 0) {
      w.live_workers.assign(welcome_.live_workers().begin(), welcome_.live_workers().end());
      w.joined_at.assign(welcome_.joined_at().begin(), welcome_.joined_at().end());
    } else {
      for (const auto& m : members_) {
        if (m.role() != wire::WORKER) continue;
        w.live_workers.push_back(m.rank());
        w.joined_at.push_back(0);
      }
    }
    return w;
  }

  // After Join() has returned OK: constant from then on (see welcome_).
  const wire::Welcome& welcome() const NO_THREAD_SAFETY_ANALYSIS { return welcome_; }
  const std::vector<wire::Member>& members() const NO_THREAD_SAFETY_ANALYSIS { return members_; }

 private:
  // Connects, retrying while the coordinator is not up yet (as torchrun's
  // rendezvous does), until join_timeout.
  Status Connect() {
    std::string host;
    uint16_t port = 0;
    HERD_RETURN_IF_ERROR(ParseHostPort(options_.coordinator, "coordinator", &host, &port));
    const auto deadline = Clock::now() + ToDuration(options_.job.join_timeout_s);
    tcp::resolver resolver(io_);
    bool told = false;
    std::string last_error;
    while (true) {
      boost::system::error_code ec;
      auto endpoints = resolver.resolve(host, std::to_string(port), ec);
      if (!ec) {
        tcp::socket socket(io_);
        asio::connect(socket, endpoints, ec);
        if (!ec) {
          conn_ = std::make_shared<FramedConnection>(std::move(socket), options_.job.max_message_bytes);
          return Status::OK();
        }
      }
      last_error = ec.message();
      if (Clock::now() >= deadline) break;
      if (!told) {
        LOG(INFO) << "waiting for the coordinator at " << options_.coordinator << " (" << last_error << ")";
        told = true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    return Status::Unavailable("cannot reach the coordinator at " + options_.coordinator + " within " +
                               std::to_string(static_cast<int>(options_.job.join_timeout_s)) +
                               " s (cluster.join_timeout_s): " + last_error);
  }

  void Begin() {
    last_heard_ = Clock::now();
    conn_->Start([this](const wire::Envelope& m) { OnMessage(m); },
                 [this](const Status& st) {
                   {
                     MutexLock lock(&mu_);
                     ended_ = true;
                   }
                   cv_.SignalAll();
                   Fail(st.code() == Status::Code::kCorruption
                            ? Status::Corruption("the coordinator at " + options_.coordinator + " sent " + st.message())
                            : Status::Unavailable("lost the coordinator at " + options_.coordinator + ": " +
                                                  st.message()));
                 });
    wire::Envelope m;
    wire::Hello* h = m.mutable_hello();
    h->set_token(options_.token);
    h->set_role(options_.role);
    h->set_rank(options_.rank);
    h->set_world_size(options_.world_size);
    h->set_host(options_.host.substr(0, kMaxHostBytes));
    h->set_pid(static_cast<int32_t>(::getpid()));
    h->set_ucx_address(options_.ucx_address);
    h->set_config_hash(options_.config_hash);
    h->set_servers(options_.job.servers);
    h->set_workers(options_.job.workers);
    h->set_heartbeat_interval_ms(static_cast<int32_t>(options_.job.heartbeat_interval_s * 1000));
    h->set_heartbeat_timeout_ms(static_cast<int32_t>(options_.job.heartbeat_timeout_s * 1000));
    h->set_join_timeout_ms(static_cast<int32_t>(options_.job.join_timeout_s * 1000));
    h->set_elastic(options_.job.elastic);
    h->set_regions(options_.job.regions);
    h->set_join(options_.join);
    h->set_resume_if_forming(options_.join && options_.resume_if_forming);
    conn_->Send(m);
    Heartbeat();
  }

  void Post(const wire::Envelope& m) {
    asio::post(io_, [this, m] { conn_->Send(m); });
  }

  void Heartbeat() {
    heartbeat_timer_.expires_after(ToDuration(options_.job.heartbeat_interval_s));
    heartbeat_timer_.async_wait([this](boost::system::error_code ec) {
      if (ec || conn_->closed()) return;
      const double quiet = std::chrono::duration<double>(Clock::now() - last_heard_).count();
      if (quiet > options_.job.heartbeat_timeout_s) {
        Fail(Status::Unavailable("the coordinator at " + options_.coordinator + " has been silent for " +
                                 std::to_string(static_cast<int>(quiet)) + " s"));
        return;
      }
      wire::Envelope m;
      m.mutable_heartbeat();
      conn_->Send(m);
      Heartbeat();
    });
  }

  void OnMessage(const wire::Envelope& m) {
    last_heard_ = Clock::now();
    const std::string from = "the coordinator at " + options_.coordinator;
    switch (m.body_case()) {
      case wire::Envelope::kHeartbeat:
        return;
      case wire::Envelope::kWelcome:
        return Welcomed(m.welcome(), from);
      case wire::Envelope::kRefused:
        return Fail(Status::InvalidArgument(from + " refused this " + DescribeRole(options_.role, options_.rank) +
                                            ": " + m.refused().reason()));
      case wire::Envelope::kBarrier: {
        MutexLock lock(&mu_);
        barriers_done_.insert(wire::Scope_Name(m.barrier().scope()) + "/" + m.barrier().name());
        cv_.SignalAll();
        return;
      }
      case wire::Envelope::kAllGatherResult: {
        MutexLock lock(&mu_);
        const auto& r = m.all_gather_result();
        gathered_[r.name()].assign(r.data().begin(), r.data().end());
        cv_.SignalAll();
        return;
      }
      case wire::Envelope::kClockReading: {
        const int64_t received = trace::Now();
        {
          MutexLock lock(&mu_);
          if (m.clock_reading().id() == probe_.id && probe_.answered != probe_.id) {
            probe_.received_ns = received;
            probe_.coordinator_ns = m.clock_reading().coordinator_ns();
            probe_.answered = probe_.id;
            cv_.SignalAll();
            return;
          }
        }
        return Fail(Status::Corruption(from + " sent a clock reading that answers no probe"));
      }
      case wire::Envelope::kPeerLost: {
        const auto& p = m.peer_lost();
        return Fail(Status::Aborted(
            !p.reason().empty() ? p.reason()
                                : DescribeRole(p.role(), p.rank()) + " (" + p.host() + ", pid " +
                                      std::to_string(p.pid()) + ") was lost"));
      }
      case wire::Envelope::kShutdown:
        // Declared lost: this process failed (it was silent), and may start
        // again; any other shutdown was meant.
        if (m.shutdown().declared_lost()) return Fail(Status::Unavailable(from + ": " + m.shutdown().reason()));
        return Fail(Status::Cancelled(from + " shut the job down: " + m.shutdown().reason()));
      case wire::Envelope::kMembershipChanged:
        return MembershipChanged(m.membership_changed(), from);
      default:
        return Fail(Status::Corruption(from + " sent an unexpected message (type " + std::to_string(m.body_case()) +
                                       ")"));
    }
  }

  // Runs on the io thread: the coordinator's welcome, checked against what
  // this process asked for.
  void Welcomed(const wire::Welcome& w, const std::string& from) {
    // A joiner's welcome lists it among the live workers of a job that
    // has changed; a founding member's has no changes.
    const bool joined = std::find(w.live_workers().begin(), w.live_workers().end(), w.rank()) !=
                        w.live_workers().end();
    // A job of regions' lost region rejoining: its processes' welcome names
    // the region, theirs.
    const bool region = w.joining_region() >= 0;
    const bool rejoins = region && options_.job.regions > 1 && w.membership_epoch() >= 1 &&
                         w.joining_region() < options_.job.regions && w.rank() >= 0 &&
                         RegionOfRank(w.rank(), w.role() == wire::SERVER ? options_.job.servers : options_.job.workers,
                                      options_.job.regions) == w.joining_region();
    const bool under_way = w.membership_epoch() >= 1 && (joined || rejoins) && (!region || rejoins);
    const bool founding = w.membership_epoch() == 0 && w.live_workers_size() == 0 && !region;
    const bool consistent = options_.join ? under_way || (options_.resume_if_forming && founding) : founding;
    bool accepted = false;
    {
      MutexLock lock(&mu_);
      if (!welcomed_ && consistent && w.role() == options_.role &&
          (options_.rank < 0 || w.rank() == options_.rank)) {
        welcome_ = w;
        joined_under_way_ = options_.join && under_way;
        joining_region_ = options_.join && rejoins ? w.joining_region() : -1;
        members_.assign(w.members().begin(), w.members().end());
        latest_epoch_ = w.membership_epoch();
        welcomed_ = true;
        accepted = true;
      }
    }
    if (!accepted) return Fail(Status::Corruption(from + " sent an inconsistent membership"));
    cv_.SignalAll();
  }

  // Runs on the io thread: checks the change against what this process
  // knows (the next epoch, workers of the job), tells the handlers, then
  // the coordinator that this process has acted on it.
  void MembershipChanged(const wire::MembershipChanged& c, const std::string& from) {
    MembershipChange change;
    std::vector<std::function<void(const MembershipChange&)>> handlers;
    bool invalid = false;
    {
      MutexLock lock(&mu_);
      int workers = 0, servers = 0;
      for (const auto& member : members_) {
        workers += member.role() == wire::WORKER;
        servers += member.role() == wire::SERVER;
      }
      // A member of the job: a worker, or (a job of regions) a server.
      auto known = [&](const wire::Member& m) {
        return m.rank() >= 0 && ((m.role() == wire::WORKER && m.rank() < workers) ||
                                 (m.role() == wire::SERVER && m.rank() < servers && options_.job.regions > 1));
      };
      change.joined = c.has_joined();
      change.member = change.joined ? c.joined() : c.lost();
      bool valid = welcomed_ && c.epoch() == latest_epoch_ + 1 && known(change.member) &&
                   (!change.joined || change.member.role() == wire::WORKER || options_.job.regions > 1);
      for (int r : c.live_workers()) valid = valid && r >= 0 && r < workers;
      for (const wire::Member& m : c.let_go()) valid = valid && known(m) && options_.job.regions > 1;
      for (const wire::Member& m : c.joined_with()) valid = valid && known(m) && options_.job.regions > 1;
      if (!valid) {
        invalid = true;
      } else {
        change.epoch = c.epoch();
        change.reason = c.reason();
        change.live_workers.assign(c.live_workers().begin(), c.live_workers().end());
        change.let_go.assign(c.let_go().begin(), c.let_go().end());
        change.joined_with.assign(c.joined_with().begin(), c.joined_with().end());
        latest_epoch_ = change.epoch;
        changes_.push_back(change);
        handlers = on_membership_change_;
      }
    }
    if (invalid) {
      return Fail(Status::Corruption(from + " sent a membership change (epoch " + std::to_string(c.epoch()) +
                                     ") that does not follow the job's membership"));
    }
    for (auto& handler : handlers) handler(change);
    wire::Envelope ack;
    ack.mutable_membership_ack()->set_epoch(change.epoch);
    conn_->Send(ack);
  }

  // Runs on the io thread. The first failure wins; after Leave() nothing
  // counts as one.
  void Fail(const Status& failure) {
    std::vector<std::function<void(const Status&)>> handlers;
    {
      MutexLock lock(&mu_);
      if (failing_ || left_) return;
      failing_ = true;
      handlers.swap(on_failure_);
    }
    heartbeat_timer_.cancel();
    conn_->Close();
    // Handlers first (they abort transports), then the waiters: a caller
    // that sees the failure may start tearing down at once.
    for (auto& handler : handlers) handler(failure);
    {
      MutexLock lock(&mu_);
      failure_ = failure;
    }
    cv_.SignalAll();
  }

  // Constant after construction (the constructor fills in the host).
  JoinOptions options_;

  // Started and stopped by the owner's thread (Join, the destructor); from
  // Join on, conn_, heartbeat_timer_ and last_heard_ are the io thread's.
  // io_ first: what uses it is destroyed before it.
  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_;
  std::shared_ptr<FramedConnection> conn_;
  asio::steady_timer heartbeat_timer_;
  std::thread thread_;
  Clock::time_point last_heard_;

  mutable Mutex mu_;
  CondVar cv_;  // any of the below changed
  bool welcomed_ GUARDED_BY(mu_) = false;
  bool left_ GUARDED_BY(mu_) = false;
  bool ended_ GUARDED_BY(mu_) = false;
  bool failing_ GUARDED_BY(mu_) = false;
  bool joined_under_way_ GUARDED_BY(mu_) = false;  // welcomed in place of a lost worker (JoinOptions::join)
  int joining_region_ GUARDED_BY(mu_) = -1;       // welcomed as a lost region's process rejoining
  // Written once, with welcomed_, before Join() returns; from then on
  // constant, and welcome()/members() hand out references without mu_.
  wire::Welcome welcome_ GUARDED_BY(mu_);
  std::vector<wire::Member> members_ GUARDED_BY(mu_);
  std::set<std::string> barriers_done_ GUARDED_BY(mu_);
  std::map<std::string, std::vector<std::string>> gathered_ GUARDED_BY(mu_);
  Status failure_ GUARDED_BY(mu_);
  std::vector<std::function<void(const Status&)>> on_failure_ GUARDED_BY(mu_);
  int latest_epoch_ GUARDED_BY(mu_) = 0;  // the membership changes seen (a joiner: from its welcome on)
  std::vector<MembershipChange> changes_ GUARDED_BY(mu_);  // those after the welcome, in order
  std::vector<std::function<void(const MembershipChange&)>> on_membership_change_ GUARDED_BY(mu_);
  struct {
    uint64_t id = 0, answered = 0;  // the latest probe sent, and answered
    int64_t sent_ns = 0, received_ns = 0, coordinator_ns = 0;
  } probe_ GUARDED_BY(mu_);
};

StatusOr<std::unique_ptr<CoordinatorClient>> CoordinatorClient::Join(const JoinOptions& options) {
  auto impl = std::make_unique<Impl>(options);
  HERD_RETURN_IF_ERROR(impl->Join());
  return std::unique_ptr<CoordinatorClient>(new CoordinatorClient(std::move(impl)));
}

CoordinatorClient::CoordinatorClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CoordinatorClient::~CoordinatorClient() = default;

wire::Role CoordinatorClient::role() const { return impl_->welcome().role(); }
int CoordinatorClient::rank() const { return impl_->welcome().rank(); }
const std::vector<wire::Member>& CoordinatorClient::members() const { return impl_->members(); }
int CoordinatorClient::num_servers() const {
  int n = 0;
  for (const auto& m : members()) n += m.role() == wire::SERVER;
  return n;
}
int CoordinatorClient::num_workers() const { return static_cast<int>(members().size()) - num_servers(); }
const wire::Member& CoordinatorClient::member(wire::Role role, int rank) const {
  return members()[role == wire::SERVER ? rank : num_servers() + rank];
}
Status CoordinatorClient::Barrier(const std::string& name, wire::Scope scope) { return impl_->Barrier(name, scope); }
StatusOr<std::vector<std::string>> CoordinatorClient::AllGather(const std::string& name, const std::string& data,
                                                                wire::Scope scope, const Voters& voters) {
  return impl_->AllGather(name, data, scope, voters);
}
void CoordinatorClient::OnFailure(std::function<void(const Status&)> handler) { impl_->OnFailure(std::move(handler)); }
Status CoordinatorClient::health() const { return impl_->health(); }
void CoordinatorClient::OnMembershipChange(std::function<void(const MembershipChange&)> handler) {
  impl_->OnMembershipChange(std::move(handler));
}
WelcomedMembership CoordinatorClient::welcomed_membership() const { return impl_->welcomed_membership(); }
bool CoordinatorClient::joined_under_way() const { return impl_->joined_under_way(); }
int CoordinatorClient::joining_region() const { return impl_->joining_region(); }
int CoordinatorClient::membership_epoch() const { return impl_->membership_epoch(); }

Status CoordinatorClient::Explain(const Status& local, double wait_s) const {
  if (local.code() != Status::Code::kUnavailable) return local;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(wait_s);
  for (;;) {
    Status job = health();
    if (!job.ok()) return job;
    if (std::chrono::steady_clock::now() >= deadline) return local;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}
StatusOr<ClockOffset> CoordinatorClient::MeasureClockOffset(int probes) { return impl_->MeasureClockOffset(probes); }
Status CoordinatorClient::Leave() { return impl_->Leave(); }

}  // namespace herd::transport
