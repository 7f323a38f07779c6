// The push/pull service, in the manner of ps-lite: a server answers
// push(range, bytes) and pull(range) on a buffer it owns; a client issues
// many concurrent requests for different ranges, which complete out of
// order. Ranges are byte offsets into the server's buffer; every request
// also carries a 64-bit tag that the handler interprets (the parameter
// server: the optimizer step a push belongs to, the weights version a pull
// wants). Nothing here
// knows about models: what a push does to the buffer and when a pull may be
// answered is the ShardHandler's business (server/parameter_shard
// aggregates and steps AdamW there; AccumulatingShard simply adds).
//
// Every request header and range that arrives is validated before use; a
// bad one is answered with an error that names it, never trusted.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "common/status.h"
#include "transport/ucx_transport.h"

namespace herd::transport {

// AM ids used by the service.
inline constexpr uint16_t kAmPush = 1;
inline constexpr uint16_t kAmPull = 2;
inline constexpr uint16_t kAmReply = 3;

// What a server does with pushes and pulls. Runs on the transport's
// progress thread: must not block (hand long work to another thread and
// call the completion from there via UcxTransport::Post).
class ShardHandler {
 public:
  // Sent after a pull's data, or an error instead.
  using PullReply = std::function<void(const Status& status, const void* data)>;
  virtual ~ShardHandler() = default;
  virtual uint64_t size_bytes() const = 0;
  // Where a push of [offset, offset+length) from `client` should land; the
  // range is already checked against size_bytes().
  virtual StatusOr<void*> PushTarget(PeerId client, uint64_t tag, uint64_t offset, uint64_t length) = 0;
  // The push's bytes are in `target`; call `applied` once they are applied.
  // Called exactly once for each target PushTarget handed out (with `ok`
  // false when the transfer failed: release the target, apply nothing).
  virtual void OnPushed(PeerId client, uint64_t tag, uint64_t offset, uint64_t length, void* target, bool ok,
                        Completion applied) = 0;
  // Call `reply` when [offset, offset+length) may be sent; `data` must stay
  // unchanged until the client has it.
  virtual void OnPull(PeerId client, uint64_t tag, uint64_t offset, uint64_t length, PullReply reply) = 0;
};

// Float32 sums: a push adds its values into the range; a pull returns the
// range. Pushes land in a scratch buffer first (they are sums, not copies).
class AccumulatingShard : public ShardHandler {
 public:
  explicit AccumulatingShard(uint64_t size_bytes);
  uint64_t size_bytes() const override { return values_.size() * sizeof(float); }
  StatusOr<void*> PushTarget(PeerId client, uint64_t tag, uint64_t offset, uint64_t length) override;
  void OnPushed(PeerId client, uint64_t tag, uint64_t offset, uint64_t length, void* target, bool ok,
                Completion applied) override;
  void OnPull(PeerId client, uint64_t tag, uint64_t offset, uint64_t length, PullReply reply) override;
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
  // message stays cache-sized and pieces pipeline.
  explicit PushPullClient(UcxTransport* transport, uint64_t max_piece_bytes = 4u << 20);
  // Shuts the transport down first (in-flight requests are cancelled).
  ~PushPullClient();

  // Adds data[0, length) into [offset, offset+length) of `server`'s buffer.
  // `data` must stay valid until the ticket completes.
  Ticket Push(PeerId server, uint64_t offset, const void* data, uint64_t length, uint64_t tag = 0);
  // Reads [offset, offset+length) of `server`'s buffer into dst.
  Ticket Pull(PeerId server, uint64_t offset, void* dst, uint64_t length, uint64_t tag = 0);
  // Waits for one ticket; its error names the server and range.
  Status Wait(Ticket ticket);
  // Waits for every outstanding ticket; returns the first error.
  Status WaitAll();
  // Fails the outstanding requests to `server` (or to everyone, peer -1):
  // the coordinator reported a death, or the transport an endpoint error.
  void Fail(PeerId server, const Status& status);

 private:
  // One message on the wire and its reply.
  struct Request {
    Ticket ticket;
    PeerId server;
    bool pull;
    void* dst;
    uint64_t offset, length;
    bool sent = false, reply_seen = false, replied = false;  // replied: data (if any) is in
  };
  struct TicketState {
    int remaining = 0;  // requests not yet finished
    Status status;      // the first error
  };
  Ticket Issue(PeerId server, bool pull, const void* payload, void* dst, uint64_t offset, uint64_t length,
               uint64_t tag);
  void OnReply(PeerId from, std::string_view header, IncomingPayload& payload);
  // Under mu_: a finished half of request `id` (or its error); a request
  // whose both halves are in, or that failed, is retired from its ticket.
  void Settle(uint64_t id, const Status& status);

  UcxTransport* transport_;
  const uint64_t max_piece_bytes_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, Request> requests_;
  std::map<Ticket, TicketState> tickets_;
  uint64_t next_request_ = 1;
  Ticket next_ticket_ = 1;
  Status failed_all_;
};

}  // namespace herd::transport
