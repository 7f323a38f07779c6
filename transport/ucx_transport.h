// The data plane: one UCX context and worker per process, endpoints to the
// peers named in the membership, and active messages (AM) with completion
// callbacks.
//
// Threading: a progress thread owns the UCX worker (UCX runs single-threaded
// and lock-free). Every public method may be called from any thread; work is
// handed to the progress thread, which spins briefly after activity and
// otherwise sleeps on the worker's event fd. Handlers and completions run on
// the progress thread and must not block.
//
// Large payloads use UCX's rendezvous protocol: the receiving handler names
// the destination buffer and the bytes land there directly (zero-copy on the
// receive side); small ones arrive eagerly and are copied once.
//
// Transport choice stays with UCX (UCX_TLS and the rest of its environment):
// RDMA verbs on InfiniBand/RoCE, shared memory / CMA / TCP on one host; the
// network devices it may use are the caller's (UcxOptions::net_devices, see
// transport/network_devices.h).
//
// Every message carries the sender's PeerId and the job's data-plane key
// (UcxOptions::key); a message whose key is not ours is dropped before any
// handler sees it, counted (UcxStats::unauthenticated_dropped) and reported
// in one log line per claimed sender.
// Endpoints are created with peer-failure handling; because UCX 1.13 only
// offers its shared-memory transports to such endpoints when
// UCX_POSIX_ERROR_HANDLING / UCX_SYSV_ERROR_HANDLING are on, Create() turns
// them on unless the environment says otherwise.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace herd::transport {

// Chosen by the caller when connecting (herd uses the member index:
// servers by rank, then workers by rank), and carried in every message so
// the receiver knows who sent it.
using PeerId = int32_t;
using Completion = std::function<void(const Status&)>;

// What a message must carry to be taken: a job's processes share it, and a
// process of another job, or anything else that reaches our UCX worker,
// does not have it.
struct DataPlaneKey {
  std::array<uint8_t, 16> bytes{};
  // HMAC-SHA256 of a fixed label keyed by the job token, cut to 16 bytes:
  // the token itself never travels on the data plane, and a key seen on the
  // wire tells nothing of it.
  static DataPlaneKey FromToken(std::string_view token);
};

struct UcxOptions {
  UcxOptions() = default;
  explicit UcxOptions(PeerId self) : self(self) {}

  // This process's PeerId, stamped on every message (set_self may set it
  // later).
  PeerId self = -1;
  // All-zero for transports that serve no job (a process's own tests and
  // benchmarks).
  DataPlaneKey key;
  // UCX's NET_DEVICES: the network devices it may listen on and send
  // through ("lo", "eth1,mlx5_0:1"); empty leaves the choice to UCX and the
  // environment (every device unless UCX_NET_DEVICES says otherwise).
  std::string net_devices;
};

class UcxTransport;

// The lanes UCX chose for an endpoint (from ucp_ep_print_info): each as
// "tl/device (uses)", e.g. "sysv/memory (am am_bw)", "cma/memory (rma_bw)";
// and whether its active messages go through shared memory (a peer on
// this host), where large payloads are sent by rendezvous.
struct EndpointLanes {
  std::vector<std::string> transports;
  bool shared_memory = false;
  // Large payloads to it are read by it out of this process in one copy
  // (process_vm_readv: herd's own, for UCX 1.13 gives its CMA no lane on
  // endpoints that handle peer failure), unless it could not.
  bool single_copy = false;
};
EndpointLanes ParseEndpointLanes(const std::string& print_info);
// Payloads from this size go to a shared-memory peer by rendezvous.
inline constexpr size_t kSharedMemoryRendezvousBytes = 64 << 10;
// From this size a payload to a peer on this host is read by the peer out
// of the sender's memory (one copy) rather than sent through UCX (herd
// bench transport: 8.4 GB/s against UCX's 6.4 at 4 MiB).
inline constexpr size_t kSingleCopyMinBytes = 64 << 10;

// Sets UCX_POSIX_ERROR_HANDLING / UCX_SYSV_ERROR_HANDLING to y unless the
// environment sets them or UCX_TLS rules shared memory out, UCX_LOG_LEVEL
// to fatal unless set (herd reports UCX failures itself), and, on a host
// without RDMA ports, UCX_RNDV_THRESH to inf unless set (eager messages of
// every size: see the .cc).
// Create() calls it; benchmarks call it before starting UCX tools, so both
// pick the same transports.
void PrepareUcxEnvironment();

// UCX's posix shared-memory transport names a file /dev/shm/ucx_shm_posix_*
// between creating a segment and sharing it through /proc; a process killed
// in that window leaves the file (and its memory) behind. Removes such files
// of this user that no live process has open or mapped and that are older
// than `min_age_s`; returns how many went. Launchers call it at start.
int RemoveStaleUcxShmFiles(double min_age_s = 30);

// Which sender's request a single-copy read answers.
struct CmaReply {
  PeerId peer = -1;
  uint64_t op = 0;
};

// A message's payload as a handler sees it. Exactly one of ReceiveInto or
// Reject may be called, during the handler; otherwise the payload is dropped.
class IncomingPayload {
 public:
  size_t size() const { return size_; }
  // True when the bytes are still at the sender (rendezvous).
  bool rendezvous() const { return rendezvous_; }
  // Delivers the bytes to dst[0, size()): copied (eager) or placed by UCX
  // (rendezvous, zero-copy). `done` runs on the progress thread; dst must
  // stay valid until then.
  void ReceiveInto(void* dst, Completion done);
  // Refuses a rendezvous payload: the sender's send fails. Eager payloads
  // are simply dropped.
  void Reject();
  // An eager payload's bytes, to use while the handler runs instead of
  // receiving them (null for a rendezvous payload).
  const void* eager_data() const { return rendezvous_ ? nullptr : data_; }

 private:
  friend class UcxTransport;
  UcxTransport* transport_ = nullptr;
  void* data_ = nullptr;
  size_t size_ = 0;
  bool rendezvous_ = false;
  bool consumed_ = false, rejected_ = false;
  // A payload read out of its sender on this host (process_vm_readv):
  // the sender's pid and address, and how the read went.
  int32_t cma_pid_ = 0;
  uint64_t cma_addr_ = 0;
  CmaReply cma_reply_;  // whom to answer once read
};

struct UcxStats {
  uint64_t messages_received = 0;
  // Payloads placed into the handler's buffer straight from the sender:
  // by UCX's zero-copy rendezvous, or read out of a sender on this host
  // in one copy (those bytes counted in cma_bytes_read too).
  uint64_t rendezvous_received = 0;
  uint64_t eager_bytes_copied = 0;    // bytes of eager payloads copied out
  uint64_t malformed_dropped = 0;     // messages with an unknown sender or short header
  uint64_t unauthenticated_dropped = 0;  // messages without this job's data-plane key
  uint64_t bytes_sent = 0;            // payload bytes handed to UCX for sending
  uint64_t cma_bytes_read = 0;        // payload bytes read out of senders on this host
};

// Active-message ids services may use: [0, kAmIdLimit). Messages for ids
// without a service are dropped.
inline constexpr uint16_t kAmIdLimit = 64;

class UcxTransport {
 public:
  using Handler = std::function<void(PeerId from, std::string_view header, IncomingPayload& payload)>;
  using PeerFailureHandler = std::function<void(PeerId peer, const Status& status)>;

  static StatusOr<std::unique_ptr<UcxTransport>> Create(const UcxOptions& options);
  // Closes endpoints (forcibly after a failure), stops the progress thread.
  ~UcxTransport();
  UcxTransport(const UcxTransport&) = delete;
  UcxTransport& operator=(const UcxTransport&) = delete;

  // This worker's address, to publish through the coordinator.
  const std::string& address() const { return address_; }
  // Whether this UCX can move CUDA device memory itself (a build with its
  // cuda_copy/cuda_ipc transports). Debian's cannot; GPU workers then stage
  // through page-locked host memory.
  bool cuda_memory() const { return cuda_memory_; }
  // Our PeerId; may be set once the coordinator has assigned ranks, before
  // any message is sent.
  void set_self(PeerId self);

  // Handlers for AM ids; set before connecting.
  void SetHandler(uint16_t am_id, Handler handler);
  // Adds a handler called (on the progress thread) when a peer's endpoint
  // fails; every service over the transport may add its own.
  void OnPeerFailure(PeerFailureHandler handler);

  // Creates an endpoint to `address` (blocks until it exists). `name` is used
  // in error lines ("server rank 1 (host)"). A peer whose endpoint failed
  // or was disconnected may be connected anew (another process in its
  // place); connecting a live peer twice is an error.
  Status Connect(PeerId peer, const std::string& address, const std::string& name);

  // Sends `header` (copied) and payload[0, size) (must stay valid until
  // `done`) as AM `am_id`.
  void Send(PeerId to, uint16_t am_id, std::string header, const void* payload, size_t size, Completion done);

  // Registers [base, base+size) with UCX (pinned for RDMA); sends from and
  // receives into it then skip per-operation registration. Kept until the
  // transport is destroyed.
  Status RegisterMemory(void* base, size_t size);

  // Runs `fn` on the progress thread.
  void Post(std::function<void()> fn);

  // While the count is above zero the progress thread polls without
  // sleeping: a service (the collectives' ring) raises it for the duration
  // of an operation, whose chunks arrive at gaps longer than the idle spin,
  // so that each one is not delayed by a wake-up from epoll.
  void AddBusy(int delta);

  // Fails every later Send with `status`; in-flight operations complete
  // with errors as UCX cancels them at close.
  void Abort(const Status& status);

  // Forgets `peer`, which is known to be gone (an elastic job lost it):
  // its endpoint closes forcibly, operations towards it complete with
  // errors, and later sends to it fail with `why`.
  void Disconnect(PeerId peer, const Status& why);

  // Closes every endpoint (flushing when healthy, forcibly after a failure
  // or Abort) and stops the progress thread; afterwards no handler or
  // completion runs, so buffers lent to the transport may be freed. The
  // destructor calls it; services call it before freeing their buffers.
  void Shutdown();

  // Transports in use towards `peer` (UCX's own description), for logs and
  // tests; blocks briefly.
  std::string DescribeEndpoint(PeerId peer);
  // The same, parsed; empty for an unknown peer.
  EndpointLanes Lanes(PeerId peer);
  UcxStats stats();

 private:
  class Impl;
  friend class IncomingPayload;
  UcxTransport() = default;
  std::unique_ptr<Impl> impl_;
  std::string address_;
  bool cuda_memory_ = false;
};

}  // namespace herd::transport
