#include "transport/ucx_transport.h"

#include <dirent.h>
#include <glog/logging.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <ucp/api/ucp.h>
#include <ucs/config/global_opts.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <ctime>
#include <fstream>
#include <future>
#include <map>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "common/sha256.h"
#include "common/trace.h"
#include "transport/network_devices.h"

namespace herd::transport {
namespace {

using Clock = std::chrono::steady_clock;

std::string UcxError(ucs_status_t status) { return ucs_status_string(status); }

// What precedes a service's header in every message: the sender's PeerId,
// then the job's data-plane key.
constexpr size_t kKeyBytes = sizeof(DataPlaneKey::bytes);
constexpr size_t kPrefixBytes = sizeof(PeerId) + kKeyBytes;

// Compares in time independent of where the keys differ, so that a key
// cannot be found byte by byte from how fast messages are dropped.
bool KeysEqual(const uint8_t* a, const uint8_t* b) {
  uint8_t diff = 0;
  for (size_t i = 0; i < kKeyBytes; ++i) diff |= a[i] ^ b[i];
  return diff == 0;
}

}  // namespace

DataPlaneKey DataPlaneKey::FromToken(std::string_view token) {
  const Sha256Digest mac = HmacSha256(token, "herd data-plane key v1");
  DataPlaneKey key;
  std::memcpy(key.bytes.data(), mac.data(), key.bytes.size());
  return key;
}

// UCX 1.13 hides posix/sysv shared memory from endpoints that want
// peer-failure handling unless these are on (openucx/ucx#10016). Only set
// when those transports may load (UCX warns about unused variables).
int RemoveStaleUcxShmFiles(double min_age_s) {
  constexpr char kDir[] = "/dev/shm";
  constexpr char kPrefix[] = "ucx_shm_posix_";
  struct Candidate {
    std::string path;
    ino_t inode;
  };
  std::vector<Candidate> candidates;
  const time_t now = ::time(nullptr);
  if (DIR* d = ::opendir(kDir)) {
    while (dirent* e = ::readdir(d)) {
      if (std::strncmp(e->d_name, kPrefix, sizeof kPrefix - 1) != 0) continue;
      const std::string path = std::string(kDir) + "/" + e->d_name;
      struct stat st;
      if (::lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != ::geteuid()) continue;
      if (static_cast<double>(now - st.st_mtime) < min_age_s) continue;
      candidates.push_back({path, st.st_ino});
    }
    ::closedir(d);
  }
  if (candidates.empty()) return 0;
  // What live processes hold: open descriptors (by inode) and mappings (by
  // name, for segments shared by path).
  std::set<ino_t> open_inodes;
  std::set<std::string> mapped;
  if (DIR* proc = ::opendir("/proc")) {
    while (dirent* p = ::readdir(proc)) {
      if (!std::isdigit(static_cast<unsigned char>(p->d_name[0]))) continue;
      const std::string fd_dir = std::string("/proc/") + p->d_name + "/fd";
      if (DIR* fds = ::opendir(fd_dir.c_str())) {
        while (dirent* f = ::readdir(fds)) {
          struct stat st;
          if (f->d_name[0] != '.' && ::stat((fd_dir + "/" + f->d_name).c_str(), &st) == 0) open_inodes.insert(st.st_ino);
        }
        ::closedir(fds);
      }
      std::ifstream maps(std::string("/proc/") + p->d_name + "/maps");
      for (std::string line; std::getline(maps, line);) {
        const size_t at = line.find("/dev/shm/ucx_shm_posix_");
        if (at != std::string::npos) mapped.insert(line.substr(at, line.find(' ', at) - at));
      }
    }
    ::closedir(proc);
  }
  int removed = 0;
  for (const Candidate& c : candidates) {
    if (open_inodes.count(c.inode) || mapped.count(c.path)) continue;
    if (::unlink(c.path.c_str()) == 0) ++removed;
  }
  return removed;
}

EndpointLanes ParseEndpointLanes(const std::string& info) {
  // Lines such as
  //   "#   lane[0]:  3:sysv/memory.0 md[2]  -> md[2]/sysv/sysdev[255] am am_bw#0 keepalive"
  EndpointLanes out;
  std::istringstream lines(info);
  for (std::string line; std::getline(lines, line);) {
    const size_t lane = line.find("lane[");
    if (lane == std::string::npos) continue;
    std::istringstream words(line.substr(line.find(':', lane) + 1));
    std::string resource;
    words >> resource;  // "3:sysv/memory.0"
    const size_t colon = resource.find(':'), slash = resource.find('/');
    if (colon == std::string::npos || slash == std::string::npos || slash < colon) continue;
    const std::string tl = resource.substr(colon + 1, slash - colon - 1);
    std::string device = resource.substr(slash + 1);
    if (const size_t dot = device.rfind('.'); dot != std::string::npos) device.resize(dot);
    std::vector<std::string> uses;  // "am", "am_bw", "rma_bw", ... (their #index dropped)
    for (std::string w; words >> w;) {
      if (const size_t hash = w.find('#'); hash != std::string::npos) w.resize(hash);
      const bool use = w == "am" || w == "am_bw" || w == "rma" || w == "rma_bw" || w == "amo";
      if (use && std::find(uses.begin(), uses.end(), w) == uses.end()) uses.push_back(w);
    }
    const bool am = std::find(uses.begin(), uses.end(), "am") != uses.end();
    if (am && (tl == "posix" || tl == "sysv" || tl == "self" || tl == "xpmem" || tl == "knem")) out.shared_memory = true;
    std::string text = tl + "/" + device;
    for (size_t i = 0; i < uses.size(); ++i) text += (i == 0 ? " (" : " ") + uses[i] + (i + 1 == uses.size() ? ")" : "");
    out.transports.push_back(text);
  }
  return out;
}

void PrepareUcxEnvironment() {
  // herd turns every UCX failure it meets into its own one-line error;
  // UCX's log lines (several per failed endpoint) only bury that line. UCX
  // read UCX_LOG_LEVEL when it was loaded, so the level is set directly.
  if (std::getenv("UCX_LOG_LEVEL") == nullptr) ucs_global_opts.log_component.log_level = UCS_LOG_LEVEL_FATAL;
  // Without an RDMA port every byte between hosts goes over TCP, where
  // UCX's rendezvous moves nothing without a copy and, with many large
  // messages in flight (a step's buckets), leaves the link idle while each
  // waits for its receiver's reply: collectives took up to 1.7x their
  // bytes' time at 0.5 Gbit/s, against 0.93x with eager messages, which
  // shared memory carries as fast (docs/performance.md). With RDMA the
  // rendezvous is the zero-copy path, and UCX's choice stands.
  if (RdmaPorts().empty()) ::setenv("UCX_RNDV_THRESH", "inf", 0);
  const char* tls = std::getenv("UCX_TLS");
  const std::string list = tls != nullptr ? tls : "all";
  bool shm = false;
  for (const char* name : {"all", "sm", "shm", "posix", "sysv", "^"}) shm |= list.find(name) != std::string::npos;
  if (!shm) return;
  for (const char* name : {"UCX_POSIX_ERROR_HANDLING", "UCX_SYSV_ERROR_HANDLING"}) ::setenv(name, "y", 0);
}

namespace {

// This transport's own AM ids, above the services'.
constexpr uint16_t kCmaRequestAm = kAmIdLimit, kCmaDoneAm = kAmIdLimit + 1;

// A payload's whereabouts, sent in place of the payload (CmaRequested).
struct CmaRequest {
  uint64_t op;
  int32_t pid;
  uint16_t am_id;
  uint16_t pad = 0;
  uint64_t addr, size, probe_addr;
  uint8_t token[16];
};
struct CmaDone {
  enum Code : uint8_t { kOk = 0, kRefused = 1, kFailed = 2 };
  uint64_t op;
  Code code;
  uint8_t pad[7] = {};
};

// n bytes at `addr` in process `pid` into dst, in as many reads as the
// kernel takes.
Status ReadPeerMemory(int32_t pid, uint64_t addr, void* dst, size_t n) {
  size_t done = 0;
  while (done < n) {
    iovec local{static_cast<char*>(dst) + done, n - done};
    iovec remote{reinterpret_cast<void*>(addr + done), n - done};
    const ssize_t got = ::process_vm_readv(pid, &local, 1, &remote, 1, 0);
    if (got <= 0) {
      return Status::Unavailable("reading " + std::to_string(n) + " bytes from process " + std::to_string(pid) +
                                 " failed: " + std::strerror(got < 0 ? errno : EFAULT));
    }
    done += static_cast<size_t>(got);
  }
  return Status::OK();
}

// Yama's ptrace_scope: 0 (classic), 1 (only declared or descendant
// readers), 2/3 (admin only, or none); 0 without Yama.
int PtraceScope() {
  std::ifstream f("/proc/sys/kernel/yama/ptrace_scope");
  int scope = 0;
  if (f >> scope) return scope;
  return 0;
}

// Whether this process tries single-copy sends: not with HERD_CMA=0, nor
// where Yama lets no peer read it. Under scope 1 every process of the job
// declares that any process of its user may read it (PR_SET_PTRACER: one
// pid or any, and a process has several peers), which is what scope 0
// allows anyway.
bool CmaAllowed() {
  const char* v = std::getenv("HERD_CMA");
  if (v != nullptr && std::string(v) == "0") return false;
  const int scope = PtraceScope();
  if (scope >= 2) return false;
  if (scope == 1) return ::prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0) == 0;
  return true;
}

std::array<uint8_t, 16> RandomProbe() {
  std::array<uint8_t, 16> probe{};
  std::random_device rd;
  for (size_t i = 0; i < probe.size(); i += 4) {
    const uint32_t r = rd();
    std::memcpy(probe.data() + i, &r, 4);
  }
  return probe;
}

double SpinSeconds() {
  const char* v = std::getenv("HERD_UCX_SPIN_US");
  return (v != nullptr ? std::atof(v) : 50.0) * 1e-6;
}

}  // namespace

// Threads that read payloads out of senders on this host, so that a
// receiver takes several at once (a worker's pulls from every server) and
// its progress thread goes on meanwhile. A read's completion is posted
// back to the progress thread. Stop() waits for the reads under way (their
// buffers are the services'); queued ones are dropped.
class CmaReaders {
 public:
  using Job = std::function<void()>;
  ~CmaReaders() { Stop(); }

  void Run(Job job) {
    {
      MutexLock lock(&mu_);
      if (stopped_) return;
      if (threads_.empty()) {
        const int n = std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 1, kMaxReaders);
        for (int i = 0; i < n; ++i) threads_.emplace_back([this] { Loop(); });
      }
      jobs_.push_back(std::move(job));
    }
    cv_.Signal();
  }

  void Stop() {
    std::vector<std::thread> threads;
    {
      MutexLock lock(&mu_);
      stopped_ = true;
      jobs_.clear();
      threads.swap(threads_);
    }
    cv_.SignalAll();
    for (std::thread& t : threads) t.join();
  }

 private:
  static constexpr int kMaxReaders = 4;

  void Loop() {
    trace::NameThread("cma reader");
    for (;;) {
      Job job;
      {
        MutexLock lock(&mu_);
        while (jobs_.empty() && !stopped_) cv_.Wait(&mu_);
        if (stopped_) return;
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      job();
    }
  }

  Mutex mu_;
  CondVar cv_;
  std::deque<Job> jobs_ GUARDED_BY(mu_);
  bool stopped_ GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_ GUARDED_BY(mu_);
};

class UcxTransport::Impl {
 public:
  struct Peer {
    Impl* impl = nullptr;
    PeerId id = 0;
    std::string name;
    ucp_ep_h ep = nullptr;
    Status failure;  // non-OK once the endpoint failed
    EndpointLanes lanes;  // what UCX chose for it
    // Single-copy sends to it (CmaRequest): not refused yet; and the pid
    // its requests were proven to come from (0: none yet).
    bool cma_refused = false;
    int32_t cma_verified_pid = 0;
  };
  // A send whose bytes the receiver reads from this process's memory
  // (process_vm_readv), waiting for its CmaDone.
  struct CmaOp {
    PeerId to;
    uint16_t am_id;
    std::string header;  // the service's, without the prefix
    const void* payload;
    size_t size;
    Completion done;
  };
  struct SendOp {
    Impl* impl;
    std::string header;
    Completion done;
    std::string peer_name;
  };
  struct RecvOp {
    Impl* impl;
    Completion done;
  };
  struct HandlerSlot {
    Impl* impl;
    UcxTransport* owner;
    uint16_t am_id;
    Handler handler;
  };

  explicit Impl(const UcxOptions& options)
      : self_(options.self), key_(options.key), net_devices_(options.net_devices), spin_s_(SpinSeconds()) {}

  Status Init(std::string* address, bool* cuda_memory) {
    PrepareUcxEnvironment();
    ucp_config_t* config = nullptr;
    ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
    if (st != UCS_OK) return Status::Unavailable("UCX: reading its configuration failed: " + UcxError(st));
    if (!net_devices_.empty() && (st = ucp_config_modify(config, "NET_DEVICES", net_devices_.c_str())) != UCS_OK) {
      ucp_config_release(config);
      return Status::InvalidArgument("UCX: cannot use the network devices '" + net_devices_ + "': " + UcxError(st));
    }
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
    st = ucp_init(&params, config, &context_);
    ucp_config_release(config);
    if (st != UCS_OK) return Status::Unavailable("UCX: ucp_init failed: " + UcxError(st) + " (check UCX_TLS)");
    ucp_context_attr_t attr{};
    attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
    *cuda_memory = ucp_context_query(context_, &attr) == UCS_OK &&
                   (attr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;  // only the progress thread calls in
    st = ucp_worker_create(context_, &wp, &worker_);
    if (st != UCS_OK) return Status::Unavailable("UCX: creating a worker failed: " + UcxError(st));
    ucp_address_t* addr = nullptr;
    size_t addr_len = 0;
    st = ucp_worker_get_address(worker_, &addr, &addr_len);
    if (st != UCS_OK) return Status::Unavailable("UCX: worker address: " + UcxError(st));
    address->assign(reinterpret_cast<const char*>(addr), addr_len);
    ucp_worker_release_address(worker_, addr);
    st = ucp_worker_get_efd(worker_, &worker_efd_);
    if (st != UCS_OK) return Status::Unavailable("UCX: worker event fd: " + UcxError(st));
    wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
    if (wake_fd_ < 0 || epoll_fd_ < 0) return Status::Internal("eventfd/epoll: " + std::string(std::strerror(errno)));
    for (int fd : {worker_efd_, wake_fd_}) {
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.fd = fd;
      if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
        return Status::Internal("epoll_ctl: " + std::string(std::strerror(errno)));
      }
    }
    thread_ = std::thread([this] { Loop(); });
    return Status::OK();
  }

  ~Impl() {
    Shutdown();
    for (int fd : {wake_fd_, epoll_fd_}) {
      if (fd >= 0) ::close(fd);
    }
    if (stuck_) return;
    for (auto& [base, region] : regions_) ucp_mem_unmap(context_, region.memh);
    if (worker_ != nullptr) ucp_worker_destroy(worker_);
    if (context_ != nullptr) ucp_cleanup(context_);
  }

  // Closes every endpoint (flushing towards healthy peers; after a failure
  // of the job, leaves them to the process's exit) and stops the progress
  // thread. No handler or completion runs afterwards.
  void Shutdown() {
    if (!thread_.joinable()) return;
    RunOnThread([this] {
      // After a failure of the job, endpoints may be anywhere in their
      // wire-up with peers that are gone or going; closing them then trips
      // UCX 1.13's assertions (ucp_ep_close_nbx on an endpoint that
      // receives a wire-up reply). Nothing is left to flush: the process
      // is about to exit, which releases them all.
      if (aborted_.ok()) {
        CloseEndpoints();
      } else {
        stuck_ = true;
      }
      // Completions of cancelled operations belong to a service being torn
      // down; so do sends posted before Shutdown that run after this.
      closed_ = true;
      completions_.clear();
      for (auto& slot : slots_) slot->handler = nullptr;
      on_peer_failure_.clear();
    });
    readers_.Stop();  // the reads under way land first: their buffers are the services'
    shut_down_ = true;
    stop_ = true;
    Wake();
    thread_.join();
  }

  // Closes every endpoint (flushing towards healthy peers) within 2 s;
  // progress thread.
  void CloseEndpoints() {
    std::vector<void*> closing;
    for (auto& [id, peer] : peers_) {
      if (peer->ep == nullptr) continue;
      ucp_request_param_t p{};
      p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      p.flags = !peer->failure.ok() ? UCP_EP_CLOSE_FLAG_FORCE : 0;
      ucs_status_ptr_t r = ucp_ep_close_nbx(peer->ep, &p);
      peer->ep = nullptr;
      if (UCS_PTR_IS_PTR(r)) closing.push_back(r);
    }
    const auto deadline = Clock::now() + std::chrono::seconds(2);
    for (void* r : closing) {
      while (ucp_request_check_status(r) == UCS_INPROGRESS && Clock::now() < deadline) ucp_worker_progress(worker_);
      if (ucp_request_check_status(r) == UCS_INPROGRESS) {
        // A flush towards a peer that died unnoticed never ends, and UCX
        // asserts when a worker is destroyed under it: leave the worker
        // to the process's exit instead.
        stuck_ = true;
        continue;
      }
      ucp_request_free(r);
    }
    if (stuck_) LOG(WARNING) << "UCX: endpoints did not close within 2 s; leaving them to process exit";
  }

  void SetHandler(UcxTransport* owner, uint16_t am_id, Handler handler) {
    RunOnThread([&] {
      auto slot = std::make_unique<HandlerSlot>(HandlerSlot{this, owner, am_id, std::move(handler)});
      ucp_am_handler_param_t p{};
      p.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG |
                     UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
      p.id = am_id;
      p.cb = &Impl::AmReceived;
      p.arg = slot.get();
      p.flags = UCP_AM_FLAG_WHOLE_MSG;
      ucs_status_t st = ucp_worker_set_am_recv_handler(worker_, &p);
      CHECK_EQ(st, UCS_OK) << "ucp_worker_set_am_recv_handler: " << UcxError(st);
      handlers_[am_id] = slot.get();
      slots_.push_back(std::move(slot));
    });
  }

  // This transport's own messages: a payload to read, and its answer.
  void SetCmaHandlers() {
    RunOnThread([&] {
      for (const auto& [id, cb] : {std::pair<uint16_t, ucp_am_recv_callback_t>{kCmaRequestAm, &Impl::CmaRequested},
                                   {kCmaDoneAm, &Impl::CmaAnswered}}) {
        ucp_am_handler_param_t p{};
        p.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG |
                       UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
        p.id = id;
        p.cb = cb;
        p.arg = this;
        p.flags = UCP_AM_FLAG_WHOLE_MSG;
        ucs_status_t st = ucp_worker_set_am_recv_handler(worker_, &p);
        CHECK_EQ(st, UCS_OK) << "ucp_worker_set_am_recv_handler: " << UcxError(st);
      }
    });
  }

  Status Connect(PeerId id, const std::string& address, const std::string& name) {
    if (address.empty() || address.size() > (64u << 10)) {
      return Status::Corruption(name + ": UCX worker address of " + std::to_string(address.size()) +
                                " bytes is not plausible");
    }
    Status result;
    RunOnThread([&] {
      if (auto it = peers_.find(id); it != peers_.end()) {
        if (it->second->ep != nullptr) {
          result = Status::Internal("UCX: peer " + std::to_string(id) + " connected twice");
          return;
        }
        // A peer that is gone, replaced by another process: its record
        // stays, for UCX may still call back with it.
        retired_peers_.push_back(std::move(it->second));
        peers_.erase(it);
      }
      auto peer = std::make_unique<Peer>();
      peer->impl = this;
      peer->id = id;
      peer->name = name;
      ucp_ep_params_t p{};
      p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                     UCP_EP_PARAM_FIELD_ERR_HANDLER;
      p.address = reinterpret_cast<const ucp_address_t*>(address.data());
      p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
      p.err_handler.cb = &Impl::EndpointFailed;
      p.err_handler.arg = peer.get();
      ucs_status_t st = ucp_ep_create(worker_, &p, &peer->ep);
      if (st != UCS_OK) {
        result = Status::Unavailable(name + ": UCX cannot create an endpoint: " + UcxError(st));
        return;
      }
      peer->lanes = ParseEndpointLanes(PrintInfo(peer->ep));
      peers_[id] = std::move(peer);
    });
    return result;
  }

  void Send(PeerId to, uint16_t am_id, std::string header, const void* payload, size_t size, Completion done) {
    if (shut_down_) {
      done(Status::Aborted("UCX transport is shut down"));
      return;
    }
    Post([this, to, am_id, header = std::move(header), payload, size, done = std::move(done)]() mutable {
      if (closed_) return;  // the endpoints are gone
      auto it = peers_.find(to);
      Status refuse = !aborted_.ok()             ? aborted_
                      : it == peers_.end()        ? Status::Internal("UCX: send to unknown peer " + std::to_string(to))
                      : !it->second->failure.ok() ? it->second->failure
                                                  : Status::OK();
      if (!refuse.ok()) {
        completions_.emplace_back(std::move(done), refuse);
        return;
      }
      stats_.bytes_sent += size;
      if (UseCma(*it->second, size)) {
        SendByCma(*it->second, am_id, std::move(header), payload, size, std::move(done));
        return;
      }
      SendByUcx(*it->second, am_id, std::move(header), payload, size, std::move(done));
    });
  }

  // Within a host, payloads from kSingleCopyMinBytes go by one copy: the receiver
  // reads them out of this process (CmaRequest), unless the peer refused.
  bool UseCma(const Peer& peer, size_t size) const {
    return cma_allowed_ && peer.lanes.shared_memory && !peer.cma_refused && size >= kSingleCopyMinBytes;
  }

  void SendByUcx(Peer& peer, uint16_t am_id, std::string header, const void* payload, size_t size, Completion done) {
    auto* op = new SendOp{this, std::string(kPrefixBytes, '\0') + header, std::move(done), peer.name};
    std::memcpy(op->header.data(), &self_, sizeof(PeerId));
    std::memcpy(op->header.data() + sizeof(PeerId), key_.bytes.data(), kKeyBytes);
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb.send = &Impl::SendCompleted;
    p.user_data = op;
    // Within a host a large payload goes by rendezvous whatever
    // UCX_RNDV_THRESH says (PrepareUcxEnvironment keeps TCP's eager):
    // shared memory's eager path copies it three times (into the FIFO,
    // out into a whole message, into its place) and its rendezvous
    // lands it in place.
    if (peer.lanes.shared_memory && size >= kSharedMemoryRendezvousBytes) {
      p.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
      p.flags = UCP_AM_SEND_FLAG_RNDV;
    }
    UseRegistration(payload, size, &p);
    ucs_status_ptr_t r = ucp_am_send_nbx(peer.ep, am_id, op->header.data(), op->header.size(), payload, size, &p);
    if (!UCS_PTR_IS_PTR(r)) Finish(op, UCS_PTR_STATUS(r));
  }

  // The request that tells the peer where the payload is; its CmaDone
  // completes the send (or, refused, sends it again through UCX).
  void SendByCma(Peer& peer, uint16_t am_id, std::string header, const void* payload, size_t size, Completion done) {
    const uint64_t id = ++last_cma_op_;
    CmaRequest request;
    request.op = id;
    request.pid = static_cast<int32_t>(::getpid());
    request.am_id = am_id;
    request.addr = reinterpret_cast<uint64_t>(payload);
    request.size = size;
    request.probe_addr = reinterpret_cast<uint64_t>(cma_probe_.data());
    std::memcpy(request.token, cma_probe_.data(), sizeof request.token);
    std::string wire(sizeof request, '\0');
    std::memcpy(wire.data(), &request, sizeof request);
    cma_ops_[id] = CmaOp{peer.id, am_id, std::move(header), payload, size, std::move(done)};
    SendControl(peer, kCmaRequestAm, wire + cma_ops_[id].header, [this, id](const Status& st) {
      if (!st.ok()) FinishCma(id, st);
    });
  }

  // A small message of this transport's own (no payload).
  void SendControl(Peer& peer, uint16_t am_id, const std::string& body, Completion done) {
    SendByUcx(peer, am_id, body, nullptr, 0, std::move(done));
  }

  void FinishCma(uint64_t id, const Status& st) {
    auto it = cma_ops_.find(id);
    if (it == cma_ops_.end()) return;
    completions_.emplace_back(std::move(it->second.done), st);
    cma_ops_.erase(it);
  }

  // Every single-copy send to `peer` (every one: -1) fails with `why`.
  void FailCma(PeerId peer, const Status& why) {
    for (auto it = cma_ops_.begin(); it != cma_ops_.end();) {
      if (peer >= 0 && it->second.to != peer) {
        ++it;
        continue;
      }
      completions_.emplace_back(std::move(it->second.done), why);
      it = cma_ops_.erase(it);
    }
  }

  void AddBusy(int delta) {
    if (busy_.fetch_add(delta) == 0 && delta > 0) Post([] {});  // wakes a sleeping thread
  }

  void Post(std::function<void()> fn) {
    {
      MutexLock lock(&mu_);
      posted_.push_back(std::move(fn));
    }
    if (sleeping_.load()) Wake();
  }

  void RunOnThread(const std::function<void()>& fn) {
    // After Shutdown nothing progresses the worker: run inline.
    if (!thread_.joinable() || std::this_thread::get_id() == thread_.get_id()) {
      fn();
      return;
    }
    std::promise<void> done;
    Post([&] {
      fn();
      done.set_value();
    });
    done.get_future().wait();
  }

  void Abort(const Status& status) {
    Post([this, status] {
      if (aborted_.ok()) aborted_ = status;
      FailCma(-1, status);
    });
  }

  void Disconnect(PeerId id, const Status& why) {
    Post([this, id, why] {
      auto it = peers_.find(id);
      if (closed_ || it == peers_.end() || it->second->ep == nullptr) return;
      it->second->failure = why;
      FailCma(id, why);
      // Forcibly: the peer is gone, so nothing towards it can be flushed;
      // UCX completes its pending operations with errors.
      failed_eps_.push_back(it->second->ep);
      it->second->ep = nullptr;
    });
  }

  std::string DescribeEndpoint(PeerId id) {
    std::string text;
    RunOnThread([&] {
      auto it = peers_.find(id);
      if (it == peers_.end() || it->second->ep == nullptr) return;
      text = PrintInfo(it->second->ep);
    });
    return text;
  }

  EndpointLanes Lanes(PeerId id) {
    EndpointLanes lanes;
    RunOnThread([&] {
      auto it = peers_.find(id);
      if (it == peers_.end()) return;
      lanes = it->second->lanes;
      lanes.single_copy = lanes.shared_memory && cma_allowed_ && !it->second->cma_refused;
    });
    return lanes;
  }

  static std::string PrintInfo(ucp_ep_h ep) {
    char* buf = nullptr;
    size_t len = 0;
    FILE* f = ::open_memstream(&buf, &len);
    ucp_ep_print_info(ep, f);
    std::fclose(f);
    std::string text(buf, len);
    std::free(buf);
    return text;
  }

  Status RegisterMemory(void* base, size_t size) {
    Status result;
    RunOnThread([&] {
      ucp_mem_map_params_t p{};
      p.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
      p.address = base;
      p.length = size;
      ucp_mem_h memh = nullptr;
      ucs_status_t st = ucp_mem_map(context_, &p, &memh);
      if (st != UCS_OK) {
        result = Status::Unavailable("UCX: registering " + std::to_string(size) + " bytes failed: " + UcxError(st));
        return;
      }
      regions_[reinterpret_cast<uintptr_t>(base)] = Region{size, memh};
    });
    return result;
  }

  UcxStats stats() {
    UcxStats s;
    RunOnThread([&] { s = stats_; });
    return s;
  }

  void set_self(PeerId self) {
    RunOnThread([&] { self_ = self; });
  }
  void OnPeerFailure(PeerFailureHandler handler) {
    RunOnThread([&] { on_peer_failure_.push_back(std::move(handler)); });
  }

  // Called from IncomingPayload during a handler (progress thread).
  void Receive(IncomingPayload& payload, void* dst, Completion done) {
    if (payload.cma_pid_ > 0) {
      // Read by a reader thread; its completion and the sender's answer
      // follow on this thread.
      readers_.Run([this, pid = payload.cma_pid_, addr = payload.cma_addr_, dst, size = payload.size_,
                    reply = payload.cma_reply_, done = std::move(done)]() mutable {
        Status read = ReadPeerMemory(pid, addr, dst, size);
        Post([this, size, reply, read = std::move(read), done = std::move(done)]() mutable {
          if (closed_) return;
          if (read.ok()) {
            ++stats_.rendezvous_received;
            stats_.cma_bytes_read += size;
          }
          AnswerCma(reply, read.ok() ? CmaDone::kOk : CmaDone::kFailed, read.ok() ? "" : read.message());
          completions_.emplace_back(std::move(done), std::move(read));
        });
      });
      return;
    }
    if (!payload.rendezvous_) {
      std::memcpy(dst, payload.data_, payload.size_);
      stats_.eager_bytes_copied += payload.size_;
      completions_.emplace_back(std::move(done), Status::OK());
      return;
    }
    ++stats_.rendezvous_received;
    auto* op = new RecvOp{this, std::move(done)};
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb.recv_am = &Impl::ReceiveCompleted;
    p.user_data = op;
    UseRegistration(dst, payload.size_, &p);
    ucs_status_ptr_t r = ucp_am_recv_data_nbx(worker_, payload.data_, dst, payload.size_, &p);
    if (!UCS_PTR_IS_PTR(r)) {
      ucs_status_t st = UCS_PTR_STATUS(r);
      completions_.emplace_back(std::move(op->done), st == UCS_OK ? Status::OK()
                                                                  : Status::Unavailable("UCX receive failed: " +
                                                                                        UcxError(st)));
      delete op;
    }
  }

 private:
  static ucs_status_t AmReceived(void* arg, const void* header, size_t header_length, void* data, size_t length,
                                 const ucp_am_recv_param_t* param) {
    auto* slot = static_cast<HandlerSlot*>(arg);
    Impl* impl = slot->impl;
    ++impl->stats_.messages_received;
    const bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
    const auto* prefix = static_cast<const uint8_t*>(header);
    PeerId from = -1;
    if (header_length >= sizeof(PeerId)) std::memcpy(&from, prefix, sizeof(PeerId));
    if (header_length >= kPrefixBytes && !KeysEqual(prefix + sizeof(PeerId), impl->key_.bytes.data())) {
      impl->DropUnauthenticated(from, slot->am_id);
      return rndv ? UCS_ERR_REJECTED : UCS_OK;
    }
    if (header_length < kPrefixBytes || impl->peers_.count(from) == 0 || !slot->handler) {
      ++impl->stats_.malformed_dropped;
      LOG_EVERY_N(WARNING, 100) << "UCX: dropped a message (AM id " << slot->am_id << ") with "
                                << (header_length < kPrefixBytes ? "a short header" : "an unknown sender");
      return rndv ? UCS_ERR_REJECTED : UCS_OK;
    }
    IncomingPayload payload;
    payload.transport_ = slot->owner;
    payload.data_ = data;
    payload.size_ = length;
    payload.rendezvous_ = rndv;
    slot->handler(from, std::string_view(static_cast<const char*>(header) + kPrefixBytes, header_length - kPrefixBytes),
                  payload);
    return (payload.rejected_ && rndv) ? UCS_ERR_REJECTED : UCS_OK;
  }

  // The prefix checks of AmReceived; the sender, or -1 when the message
  // is dropped.
  PeerId Authenticated(const void* header, size_t header_length, uint16_t am_id) {
    const auto* prefix = static_cast<const uint8_t*>(header);
    PeerId from = -1;
    if (header_length >= sizeof(PeerId)) std::memcpy(&from, prefix, sizeof(PeerId));
    if (header_length >= kPrefixBytes && !KeysEqual(prefix + sizeof(PeerId), key_.bytes.data())) {
      DropUnauthenticated(from, am_id);
      return -1;
    }
    if (header_length < kPrefixBytes || peers_.count(from) == 0) {
      ++stats_.malformed_dropped;
      return -1;
    }
    return from;
  }

  // One of this transport's own messages (a T after the prefix), counted:
  // its sender, or -1 when it is dropped.
  template <typename T>
  PeerId OwnMessage(const void* header, size_t header_length, uint16_t am_id, T* message) {
    ++stats_.messages_received;
    const PeerId from = Authenticated(header, header_length, am_id);
    if (from < 0) return -1;
    if (header_length < kPrefixBytes + sizeof(T)) {
      ++stats_.malformed_dropped;
      return -1;
    }
    std::memcpy(message, static_cast<const char*>(header) + kPrefixBytes, sizeof(T));
    return from;
  }

  // A peer's payload to read out of its memory: checked (that the process
  // it names holds the probe it sent: not another process of that pid, say
  // in another pid namespace), handed to the service's handler as a
  // rendezvous payload, and answered with a CmaDone.
  static ucs_status_t CmaRequested(void* arg, const void* header, size_t header_length, void*, size_t,
                                   const ucp_am_recv_param_t*) {
    Impl* impl = static_cast<Impl*>(arg);
    CmaRequest request;
    const PeerId from = impl->OwnMessage(header, header_length, kCmaRequestAm, &request);
    if (from < 0) return UCS_OK;
    Peer& peer = *impl->peers_[from];
    if (peer.ep == nullptr) return UCS_OK;
    const CmaReply to{from, request.op};
    auto reply = [impl, to](CmaDone::Code code, const std::string& message) { impl->AnswerCma(to, code, message); };
    if (request.pid != peer.cma_verified_pid) {
      uint8_t probe[sizeof request.token];
      const Status read = request.pid <= 0 ? Status::InvalidArgument("no pid")
                                           : ReadPeerMemory(request.pid, request.probe_addr, probe, sizeof probe);
      if (!read.ok() || std::memcmp(probe, request.token, sizeof probe) != 0) {
        LOG(INFO) << "UCX: " << peer.name << " cannot be read directly ("
                  << (read.ok() ? "its pid names another process here" : read.message())
                  << "); its payloads come through UCX";
        reply(CmaDone::kRefused, "");
        return UCS_OK;
      }
      peer.cma_verified_pid = request.pid;
    }
    auto slot = impl->handlers_.find(request.am_id);
    if (request.am_id >= kAmIdLimit || slot == impl->handlers_.end() || !slot->second->handler) {
      reply(CmaDone::kFailed, "no service for AM id " + std::to_string(request.am_id));
      return UCS_OK;
    }
    IncomingPayload payload;
    payload.transport_ = slot->second->owner;
    payload.size_ = request.size;
    payload.rendezvous_ = true;
    payload.cma_pid_ = request.pid;
    payload.cma_addr_ = request.addr;
    payload.cma_reply_ = to;
    const size_t fixed = kPrefixBytes + sizeof(CmaRequest);
    slot->second->handler(from, std::string_view(static_cast<const char*>(header) + fixed, header_length - fixed),
                          payload);
    if (!payload.consumed_) reply(CmaDone::kFailed, "the receiver refused it");  // else once read
    return UCS_OK;
  }

  // The sender's answer to its request `to`, if it is still connected.
  void AnswerCma(const CmaReply& to, CmaDone::Code code, const std::string& message) {
    auto it = peers_.find(to.peer);
    if (it == peers_.end() || it->second->ep == nullptr) return;
    CmaDone done;
    done.op = to.op;
    done.code = code;
    std::string body(sizeof done, '\0');
    std::memcpy(body.data(), &done, sizeof done);
    SendControl(*it->second, kCmaDoneAm, body + message, nullptr);
  }

  static ucs_status_t CmaAnswered(void* arg, const void* header, size_t header_length, void*, size_t,
                                  const ucp_am_recv_param_t*) {
    Impl* impl = static_cast<Impl*>(arg);
    CmaDone done;
    const PeerId from = impl->OwnMessage(header, header_length, kCmaDoneAm, &done);
    if (from < 0) return UCS_OK;
    auto it = impl->cma_ops_.find(done.op);
    if (it == impl->cma_ops_.end() || it->second.to != from) return UCS_OK;
    Peer& peer = *impl->peers_[from];
    if (done.code == CmaDone::kRefused) {
      // That peer cannot read this process: it and every later payload
      // to it go through UCX.
      peer.cma_refused = true;
      CmaOp op = std::move(it->second);
      impl->cma_ops_.erase(it);
      if (peer.ep == nullptr) {
        impl->completions_.emplace_back(std::move(op.done), peer.failure);
      } else {
        impl->SendByUcx(peer, op.am_id, std::move(op.header), op.payload, op.size, std::move(op.done));
      }
      return UCS_OK;
    }
    const size_t fixed = kPrefixBytes + sizeof(CmaDone);
    const std::string message(static_cast<const char*>(header) + fixed, header_length - fixed);
    impl->FinishCma(done.op, done.code == CmaDone::kOk
                                 ? Status::OK()
                                 : Status::Unavailable("send to " + peer.name + " failed: " + message));
    return UCS_OK;
  }

  // Counts a message without our key; the first from each claimed sender
  // is reported (by what it claims, for it proves nothing), the rest only
  // counted, so that a flood cannot fill the log.
  void DropUnauthenticated(PeerId claimed, uint16_t am_id) {
    ++stats_.unauthenticated_dropped;
    constexpr size_t kReportedLimit = 64;
    if (unauthenticated_senders_.size() >= kReportedLimit || !unauthenticated_senders_.insert(claimed).second) return;
    auto it = peers_.find(claimed);
    LOG(WARNING) << "UCX: dropped a message (AM id " << am_id << ") without this job's data-plane key, claiming to come from "
                 << (it != peers_.end() ? it->second->name : "peer " + std::to_string(claimed))
                 << "; later ones from that sender are only counted";
  }

  static void SendCompleted(void* request, ucs_status_t status, void* user_data) {
    auto* op = static_cast<SendOp*>(user_data);
    op->impl->Finish(op, status);
    ucp_request_free(request);
  }

  void Finish(SendOp* op, ucs_status_t status) {
    completions_.emplace_back(std::move(op->done), status == UCS_OK ? Status::OK()
                                                                    : Status::Unavailable("UCX send to " + op->peer_name +
                                                                                          " failed: " + UcxError(status)));
    delete op;
  }

  static void ReceiveCompleted(void* request, ucs_status_t status, size_t, void* user_data) {
    auto* op = static_cast<RecvOp*>(user_data);
    op->impl->completions_.emplace_back(
        std::move(op->done),
        status == UCS_OK ? Status::OK() : Status::Unavailable("UCX receive failed: " + UcxError(status)));
    delete op;
    ucp_request_free(request);
  }

  static void EndpointFailed(void* arg, ucp_ep_h ep, ucs_status_t status) {
    auto* peer = static_cast<Peer*>(arg);
    Impl* impl = peer->impl;
    peer->failure = Status::Unavailable(peer->name + " is unreachable: " + UcxError(status));
    impl->FailCma(peer->id, peer->failure);
    // The endpoint must be closed forcibly; not from inside UCX's callback.
    impl->failed_eps_.push_back(ep);
    peer->ep = nullptr;
    if (!impl->on_peer_failure_.empty()) {
      PeerId id = peer->id;
      Status failure = peer->failure;
      impl->completions_.emplace_back([impl, id](const Status& st) {
        for (const PeerFailureHandler& handler : impl->on_peer_failure_) handler(id, st);
      }, failure);
    }
  }

  void RunCompletions() {
    for (ucp_ep_h ep : failed_eps_) {
      ucp_request_param_t p{};
      p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      p.flags = UCP_EP_CLOSE_FLAG_FORCE;
      ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &p);
      if (UCS_PTR_IS_PTR(r)) ucp_request_free(r);
    }
    failed_eps_.clear();
    // Completions may queue more completions; take them in rounds.
    while (!completions_.empty()) {
      std::vector<std::pair<Completion, Status>> round;
      round.swap(completions_);
      for (auto& [fn, st] : round) {
        if (fn) fn(st);
      }
    }
  }

  // Passes the registration of [ptr, ptr+size) to UCX when there is one,
  // sparing it a registration-cache lookup.
  void UseRegistration(const void* ptr, size_t size, ucp_request_param_t* p) const {
    const auto addr = reinterpret_cast<uintptr_t>(ptr);
    auto it = regions_.upper_bound(addr);
    if (size == 0 || it == regions_.begin()) return;
    --it;
    if (addr + size <= it->first + it->second.size) {
      p->op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
      p->memh = it->second.memh;
    }
  }

  void Wake() {
    uint64_t one = 1;
    ssize_t ignored = ::write(wake_fd_, &one, sizeof one);
    (void)ignored;
  }

  bool HasPosted() {
    MutexLock lock(&mu_);
    return !posted_.empty();
  }

  // Spin while there is traffic, sleep on the worker's event fd when idle:
  // full speed during transfers, no CPU burnt between steps.
  void Loop() {
    trace::NameThread("ucx progress");
    auto last_active = Clock::now();
    std::vector<std::function<void()>> batch;
    while (!stop_) {
      {
        MutexLock lock(&mu_);
        batch.swap(posted_);
      }
      for (auto& fn : batch) fn();
      const bool had_work = !batch.empty();
      batch.clear();
      unsigned progressed = 0;
      while (ucp_worker_progress(worker_) != 0) ++progressed;
      RunCompletions();
      const auto now = Clock::now();
      if (had_work || progressed) {
        last_active = now;
        continue;
      }
      if (busy_.load(std::memory_order_relaxed) > 0) {
        // A service awaits traffic: keep polling, but let other threads
        // (other ranks on the same cores) run in between.
        std::this_thread::yield();
        continue;
      }
      if (std::chrono::duration<double>(now - last_active).count() < spin_s_) continue;
      sleeping_ = true;
      if (HasPosted() || stop_) {
        sleeping_ = false;
        continue;
      }
      ucs_status_t st = ucp_worker_arm(worker_);
      if (st == UCS_OK) {
        epoll_event events[2];
        ::epoll_wait(epoll_fd_, events, 2, 1000);
      }
      sleeping_ = false;
      uint64_t drained;
      while (::read(wake_fd_, &drained, sizeof drained) > 0) {
      }
    }
  }

  PeerId self_;  // the progress thread's (set_self runs there)
  // Constant after construction and Init (before the progress thread starts).
  const DataPlaneKey key_;
  const std::string net_devices_;
  double spin_s_;
  // Single-copy sends within a host (CmaRequest) are tried; the probe a
  // reader checks this process by (random, its address sent with each
  // request).
  const bool cma_allowed_ = CmaAllowed();
  const std::array<uint8_t, 16> cma_probe_ = RandomProbe();
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int worker_efd_ = -1, wake_fd_ = -1, epoll_fd_ = -1;
  std::thread thread_;
  // Any thread.
  std::atomic<bool> stop_{false}, sleeping_{false}, shut_down_{false};
  std::atomic<int> busy_{0};  // services awaiting traffic (AddBusy)

  Mutex mu_;
  std::vector<std::function<void()>> posted_ GUARDED_BY(mu_);  // to run on the progress thread

  // Progress-thread state.
  std::map<PeerId, std::unique_ptr<Peer>> peers_;
  std::vector<std::unique_ptr<Peer>> retired_peers_;  // gone and replaced (Connect)
  std::vector<std::unique_ptr<HandlerSlot>> slots_;
  std::vector<std::pair<Completion, Status>> completions_;
  std::vector<ucp_ep_h> failed_eps_;
  std::vector<PeerFailureHandler> on_peer_failure_;
  struct Region {
    size_t size;
    ucp_mem_h memh;
  };
  std::map<uintptr_t, Region> regions_;
  Status aborted_;
  std::set<PeerId> unauthenticated_senders_;  // reported once each (DropUnauthenticated)
  std::map<uint16_t, HandlerSlot*> handlers_;  // each AM id's current slot
  std::map<uint64_t, CmaOp> cma_ops_;
  uint64_t last_cma_op_ = 0;
  CmaReaders readers_;  // last: stopped (in Shutdown) before the rest goes
  // The job failed, or an endpoint would not close: endpoints and the
  // worker are left to the process's exit.
  bool stuck_ = false;
  bool closed_ = false;  // Shutdown has closed the endpoints
  UcxStats stats_;
};

void IncomingPayload::ReceiveInto(void* dst, Completion done) {
  CHECK(!consumed_ && !rejected_) << "IncomingPayload consumed twice";
  consumed_ = true;
  transport_->impl_->Receive(*this, dst, std::move(done));
}

void IncomingPayload::Reject() {
  CHECK(!consumed_) << "IncomingPayload rejected after ReceiveInto";
  rejected_ = true;
}

StatusOr<std::unique_ptr<UcxTransport>> UcxTransport::Create(const UcxOptions& options) {
  std::unique_ptr<UcxTransport> t(new UcxTransport());
  t->impl_ = std::make_unique<Impl>(options);
  HERD_RETURN_IF_ERROR(t->impl_->Init(&t->address_, &t->cuda_memory_));
  // Every id a peer might use gets a handler that drops the message until a
  // service claims it: UCX 1.13 crashes on a message for an id it has no
  // callback for, and nothing a peer sends may crash us.
  for (uint16_t id = 0; id < kAmIdLimit; ++id) {
    t->SetHandler(id, [](PeerId, std::string_view, IncomingPayload& payload) { payload.Reject(); });
  }
  t->impl_->SetCmaHandlers();
  return t;
}

UcxTransport::~UcxTransport() = default;
void UcxTransport::set_self(PeerId self) { impl_->set_self(self); }
void UcxTransport::SetHandler(uint16_t am_id, Handler handler) { impl_->SetHandler(this, am_id, std::move(handler)); }
void UcxTransport::OnPeerFailure(PeerFailureHandler handler) { impl_->OnPeerFailure(std::move(handler)); }
Status UcxTransport::Connect(PeerId peer, const std::string& address, const std::string& name) {
  return impl_->Connect(peer, address, name);
}
void UcxTransport::Send(PeerId to, uint16_t am_id, std::string header, const void* payload, size_t size,
                        Completion done) {
  impl_->Send(to, am_id, std::move(header), payload, size, std::move(done));
}
void UcxTransport::Post(std::function<void()> fn) { impl_->Post(std::move(fn)); }
void UcxTransport::AddBusy(int delta) { impl_->AddBusy(delta); }
void UcxTransport::Abort(const Status& status) { impl_->Abort(status); }
void UcxTransport::Disconnect(PeerId peer, const Status& why) { impl_->Disconnect(peer, why); }
void UcxTransport::Shutdown() { impl_->Shutdown(); }
Status UcxTransport::RegisterMemory(void* base, size_t size) { return impl_->RegisterMemory(base, size); }
std::string UcxTransport::DescribeEndpoint(PeerId peer) { return impl_->DescribeEndpoint(peer); }
EndpointLanes UcxTransport::Lanes(PeerId peer) { return impl_->Lanes(peer); }
UcxStats UcxTransport::stats() { return impl_->stats(); }

}  // namespace herd::transport
