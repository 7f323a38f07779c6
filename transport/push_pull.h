// The push/pull service, in the manner of ps-lite: a server answers
// pushes and pulls of byte ranges; a client issues many concurrent
// requests, which complete out of order. Every request carries typed
// metadata in its header (ps-lite's request meta): its kind (gradients,
// weights, a loss, a step report), a 64-bit tag that the handler
// interprets (the parameter server: the optimizer step a push belongs to,
// the weights version a pull wants) and a byte range within what its kind
// addresses. Nothing here knows about models: what a push does and when a
// pull may be answered is the ShardHandler's business (server/
// parameter_shard aggregates and steps AdamW there; AccumulatingShard
// simply adds).
//
// Every request header and range that arrives is validated before use; a
// bad one is answered with an error that names it, never trusted.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "transport/ucx_transport.h"

namespace herd::transport {

// AM ids used by the service.
inline constexpr uint16_t kAmPush = 1;
inline constexpr uint16_t kAmPull = 2;
inline constexpr uint16_t kAmReply = 3;

// What a request is about. Each kind has its own byte space at the
// server: parameters only ever share theirs with parameters.
enum class RequestKind : uint32_t {
  kGradients = 1,  // push: gradients of the server's parameter range
  kWeights = 2,    // pull: weights of the server's parameter range
  kLoss = 3,       // push: a worker's loss of one share of the step and the data position (ShareLoss)
  kReport = 4,     // pull: the server's report on the step that produced `tag` (kLatestReport: the newest)
};
// "gradients", "weights", "loss", "report".
const char* RequestKindName(RequestKind kind);
// Whether `kind` travels as a push (else as a pull).
bool IsPush(RequestKind kind);

// The parameter server's tags. A push of gradients or a loss names the
// optimizer step it belongs to (low 48 bits) and the share of the global
// batch it was computed on (the bits above: the rank whose sequences they
// are; in an elastic job a worker may compute the shares of lost ones). A
// pull's tag is the weights version it wants.
inline constexpr int kTagStepBits = 48;
inline constexpr uint64_t PushTag(uint64_t step, int share) {
  return step | (static_cast<uint64_t>(share) << kTagStepBits);
}
inline constexpr uint64_t TagStep(uint64_t tag) { return tag & ((uint64_t{1} << kTagStepBits) - 1); }
inline constexpr int TagShare(uint64_t tag) { return static_cast<int>(tag >> kTagStepBits); }
// A report pull with this tag asks for the newest report, whatever its
// version (a worker joining an elastic job learns where the job stands).
inline constexpr uint64_t kLatestReport = ~uint64_t{0};

// One request as the handler sees it, validated: a known kind in the right
// direction, and a non-empty range within the handler's size_bytes(kind).
struct Request {
  PeerId client = 0;
  RequestKind kind = RequestKind::kGradients;
  uint64_t tag = 0;
  uint64_t offset = 0, length = 0;  // bytes within the kind's space
  // "push of gradients [0, 4096)".
  std::string Describe() const;
};

// What a server does with pushes and pulls. Runs on the transport's
// progress thread: must not block (hand long work to another thread and
// call the completion from there via UcxTransport::Post).
class ShardHandler {
 public:
  // Sent after a pull's data, or an error instead.
  using PullReply = std::function<void(const Status& status, const void* data)>;
  virtual ~ShardHandler() = default;
  // The bytes requests of `kind` address; 0 for a kind it does not take.
  virtual uint64_t size_bytes(RequestKind kind) const = 0;
  // Where a push's bytes should land.
  virtual StatusOr<void*> PushTarget(const Request& push) = 0;
  // The push's bytes are in `target`; call `applied` once they are applied.
  // Called exactly once for each target PushTarget handed out (with `ok`
  // false when the transfer failed: release the target, apply nothing).
  virtual void OnPushed(const Request& push, void* target, bool ok, Completion applied) = 0;
  // Call `reply` when the pulled bytes may be sent; `data` must stay
  // unchanged until the client has it.
  virtual void OnPull(const Request& pull, PullReply reply) = 0;
};

// Float32 sums: a push of gradients adds its values into the range; a pull
// of weights returns the range (no other kinds). Pushes land in a scratch
// buffer first (they are sums, not copies).
class AccumulatingShard : public ShardHandler {
 public:
  explicit AccumulatingShard(uint64_t size_bytes);
  uint64_t size_bytes(RequestKind kind) const override;
  StatusOr<void*> PushTarget(const Request& push) override;
  void OnPushed(const Request& push, void* target, bool ok, Completion applied) override;
  void OnPull(const Request& pull, PullReply reply) override;
  float* data() { return values_.data(); }

 private:
  std::vector<float> values_;
  // Scratch buffers receiving pushes, by address while in flight.
  std::map<void*, std::unique_ptr<std::vector<float>>> in_flight_;
  std::vector<std::unique_ptr<std::vector<float>>> free_scratch_;
};

class PushPullServer {
 public:
  // Registers the service's handlers on `transport` (before peers connect).
  PushPullServer(UcxTransport* transport, ShardHandler* shard);
  // Shuts the transport down first: no handler may run on a dead service.
  ~PushPullServer();

 private:
  void Reply(PeerId client, uint64_t id, const Status& status);
  UcxTransport* transport_;
  ShardHandler* shard_;
};

class PushPullClient {
 public:
  using Ticket = uint64_t;
  // Requests longer than `max_piece_bytes` travel as several messages of at
  // most that size (one ticket still covers them): the server's work per
  // message stays cache-sized and pieces pipeline. At most two pieces of
  // pushes are on their way to one server at a time; later pushes wait
  // their turn, in order. Over a byte stream (TCP) whatever this process
  // sends to a server queues behind the pushes already handed over,
  // including its part of a rendezvous that lets a pull's answer start;
  // the window keeps that queue short, so that pulls answered while
  // pushes go on flow back at once and the link carries both directions.
  explicit PushPullClient(UcxTransport* transport, uint64_t max_piece_bytes = 4u << 20);
  // Shuts the transport down first (in-flight requests are cancelled).
  ~PushPullClient();

  // Sends data[0, length) to [offset, offset+length) of `server`'s space
  // of `kind` (a push kind). `data` must stay valid until the ticket
  // completes.
  Ticket Push(PeerId server, RequestKind kind, uint64_t offset, const void* data, uint64_t length, uint64_t tag = 0);
  // Reads [offset, offset+length) of `server`'s space of `kind` (a pull
  // kind) into dst.
  Ticket Pull(PeerId server, RequestKind kind, uint64_t offset, void* dst, uint64_t length, uint64_t tag = 0);
  // Waits for one ticket; its error names the server and range.
  Status Wait(Ticket ticket);
  // Like Wait, but gives up (nullopt; the ticket stays valid) as soon as
  // `interrupted` returns true. It is checked when the wait begins, as
  // requests complete, and after each Wake().
  std::optional<Status> WaitUnless(Ticket ticket, const std::function<bool()>& interrupted);
  // Has the waiters in WaitUnless check their `interrupted` again: call it
  // after changing what it reads.
  void Wake();
  // Waits for every outstanding ticket; returns the first error.
  Status WaitAll();
  // Fails the outstanding requests to `server` (or to everyone, peer -1):
  // the coordinator reported a death, or the transport an endpoint error.
  void Fail(PeerId server, const Status& status);

 private:
  // One message on the wire and its reply.
  struct InFlight {
    Ticket ticket;
    PeerId server;
    RequestKind kind;
    void* dst;  // pulls
    uint64_t offset, length;
    bool sent = false, reply_seen = false, replied = false;  // replied: data (if any) is in
    bool pull() const { return !IsPush(kind); }
  };
  struct TicketState {
    int remaining = 0;  // requests not yet finished
    Status status;      // the first error
    // For the trace (log.trace): when it was issued (-1: not traced) and what.
    int64_t trace_start = -1;
    PeerId server = 0;
    RequestKind kind = RequestKind::kGradients;
    uint64_t offset = 0, tag = 0;
  };
  // A message ready to go: its header, payload and size.
  struct Outgoing {
    uint64_t id;
    PeerId server;
    uint16_t am_id;
    std::string header;
    const char* payload;
    uint64_t size;
  };
  // Pushes to one server: bytes handed to the transport and not yet sent,
  // and those waiting for room.
  struct PushWindow {
    uint64_t in_flight = 0;
    std::deque<Outgoing> waiting;
  };
  Ticket Issue(PeerId server, RequestKind kind, const void* payload, void* dst, uint64_t offset, uint64_t length,
               uint64_t tag) LOCKS_EXCLUDED(mu_);
  // The waiting pushes to `server` that now fit its window, counted as in
  // flight.
  std::vector<Outgoing> TakeSendable(PeerId server) REQUIRES(mu_);
  // Hands messages to the transport.
  void SendAll(std::vector<Outgoing> out) LOCKS_EXCLUDED(mu_);
  void OnReply(PeerId from, std::string_view header, IncomingPayload& payload) LOCKS_EXCLUDED(mu_);
  // A finished half of request `id` (or its error); a request whose both
  // halves are in, or that failed, is retired from its ticket.
  void Settle(uint64_t id, const Status& status) REQUIRES(mu_);

  // Constant after construction.
  UcxTransport* const transport_;
  const uint64_t max_piece_bytes_;
  const uint64_t push_window_bytes_;

  Mutex mu_;
  CondVar cv_;  // a request settled (or Wake)
  std::map<uint64_t, InFlight> requests_ GUARDED_BY(mu_);
  std::map<Ticket, TicketState> tickets_ GUARDED_BY(mu_);
  std::map<PeerId, PushWindow> windows_ GUARDED_BY(mu_);
  uint64_t next_request_ GUARDED_BY(mu_) = 1;
  Ticket next_ticket_ GUARDED_BY(mu_) = 1;
  Status failed_all_ GUARDED_BY(mu_);
};

}  // namespace herd::transport
