#include "transport/push_pull.h"

#include <glog/logging.h>

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstring>

#include "common/strings.h"
#include "common/trace.h"

namespace herd::transport {
namespace {

static_assert(std::endian::native == std::endian::little, "headers are sent in host order: little-endian only");

// A request in flight, as the trace names it.
const char* TraceName(RequestKind kind) {
  switch (kind) {
    case RequestKind::kGradients:
      return "push gradients";
    case RequestKind::kWeights:
      return "pull weights";
    case RequestKind::kLoss:
      return "push loss";
    case RequestKind::kReport:
      return "pull report";
  }
  return "request";
}

// Push and pull requests: the client's request id, the handler's tag, the
// byte range and the request's kind.
struct RequestHeader {
  uint64_t id;
  uint64_t tag;
  uint64_t offset;
  uint64_t length;
  uint32_t kind;  // a RequestKind
  uint32_t reserved;
};
static_assert(sizeof(RequestHeader) == 40);

// Replies: the request id and a status; an error's text follows the fixed
// part (bounded), a pull's data is the payload.
struct ReplyHeader {
  uint64_t id;
  int32_t code;  // 0 = OK
  uint32_t reserved;
};
constexpr size_t kMaxErrorText = 1024;

template <typename T>
std::string Pack(const T& header, std::string_view tail = {}) {
  const size_t tail_size = std::min(tail.size(), kMaxErrorText);
  std::string bytes(sizeof(T) + tail_size, '\0');
  std::memcpy(bytes.data(), &header, sizeof(T));
  if (tail_size > 0) std::memcpy(bytes.data() + sizeof(T), tail.data(), tail_size);
  return bytes;
}

}  // namespace

const char* RequestKindName(RequestKind kind) {
  switch (kind) {
    case RequestKind::kGradients:
      return "gradients";
    case RequestKind::kWeights:
      return "weights";
    case RequestKind::kLoss:
      return "loss";
    case RequestKind::kReport:
      return "report";
  }
  return "unknown";
}

bool IsPush(RequestKind kind) { return kind == RequestKind::kGradients || kind == RequestKind::kLoss; }

std::string Request::Describe() const {
  return std::string(IsPush(kind) ? "push of " : "pull of ") + RequestKindName(kind) + " " +
         FormatRange(offset, offset + length);
}

// ---- AccumulatingShard ------------------------------------------------------

AccumulatingShard::AccumulatingShard(uint64_t size_bytes) : values_(size_bytes / sizeof(float), 0.0f) {}

uint64_t AccumulatingShard::size_bytes(RequestKind kind) const {
  const bool floats = kind == RequestKind::kGradients || kind == RequestKind::kWeights;
  return floats ? values_.size() * sizeof(float) : 0;
}

StatusOr<void*> AccumulatingShard::PushTarget(const Request& push) {
  if (push.offset % sizeof(float) != 0 || push.length % sizeof(float) != 0) {
    return Status::InvalidArgument("push range " + FormatRange(push.offset, push.offset + push.length) +
                                   " is not a whole number of float32s");
  }
  std::unique_ptr<std::vector<float>> scratch;
  if (!free_scratch_.empty()) {
    scratch = std::move(free_scratch_.back());
    free_scratch_.pop_back();
  } else {
    scratch = std::make_unique<std::vector<float>>();
  }
  scratch->resize(push.length / sizeof(float));
  void* target = scratch->data();
  in_flight_[target] = std::move(scratch);
  return target;
}

void AccumulatingShard::OnPushed(const Request& push, void* target, bool ok, Completion applied) {
  if (ok) {
    const float* in = static_cast<const float*>(target);
    float* out = values_.data() + push.offset / sizeof(float);
    const size_t n = push.length / sizeof(float);
    for (size_t i = 0; i < n; ++i) out[i] += in[i];
  }
  auto it = in_flight_.find(target);
  free_scratch_.push_back(std::move(it->second));
  in_flight_.erase(it);
  applied(Status::OK());
}

void AccumulatingShard::OnPull(const Request& pull, PullReply reply) {
  reply(Status::OK(), reinterpret_cast<const char*>(values_.data()) + pull.offset);
}

// ---- PushPullServer ---------------------------------------------------------

PushPullServer::PushPullServer(UcxTransport* transport, ShardHandler* shard) : transport_(transport), shard_(shard) {
  // The header's request, checked: a known kind that travels this way, and
  // a non-empty range inside the handler's space for that kind.
  auto parse = [this](PeerId from, std::string_view header, bool push, RequestHeader* h, Request* r) -> Status {
    const char* what = push ? "push" : "pull";
    if (header.size() != sizeof(RequestHeader)) {
      return Status::Corruption(std::string(what) + " request header of " + std::to_string(header.size()) +
                                " bytes (expected " + std::to_string(sizeof(RequestHeader)) + ")");
    }
    std::memcpy(h, header.data(), sizeof(RequestHeader));
    const auto kind = static_cast<RequestKind>(h->kind);
    const bool known = h->kind >= static_cast<uint32_t>(RequestKind::kGradients) &&
                       h->kind <= static_cast<uint32_t>(RequestKind::kReport);
    if (!known || IsPush(kind) != push) {
      return Status::InvalidArgument(std::string(what) + " request of kind " + std::to_string(h->kind) +
                                     ", which is not a " + what + " kind");
    }
    *r = Request{from, kind, h->tag, h->offset, h->length};
    const uint64_t size = shard_->size_bytes(kind);
    if (size == 0) return Status::InvalidArgument(r->Describe() + ": this server takes no such requests");
    if (h->length == 0 || h->offset > size || h->length > size - h->offset) {
      return Status::InvalidArgument(std::string(what) + " of " + FormatRange(h->offset, h->offset + h->length) +
                                     " is outside this server's " + std::to_string(size) + " bytes of " +
                                     RequestKindName(kind));
    }
    return Status::OK();
  };

  transport_->SetHandler(kAmPush, [this, parse](PeerId from, std::string_view header, IncomingPayload& payload) {
    RequestHeader h{};
    Request r;
    Status st = parse(from, header, /*push=*/true, &h, &r);
    if (st.ok() && payload.size() != h.length) {
      st = Status::Corruption(r.Describe() + " carries " + std::to_string(payload.size()) + " bytes");
    }
    StatusOr<void*> target = st;
    if (st.ok()) target = shard_->PushTarget(r);
    if (!target.ok()) {
      payload.Reject();
      if (header.size() == sizeof(RequestHeader)) Reply(from, h.id, target.status());
      return;
    }
    void* dst = *target;
    payload.ReceiveInto(dst, [this, from, r, id = h.id, dst](const Status& received) {
      shard_->OnPushed(r, dst, received.ok(), [this, from, id, received](const Status& applied) {
        Reply(from, id, received.ok() ? applied : received);
      });
    });
  });

  transport_->SetHandler(kAmPull, [this, parse](PeerId from, std::string_view header, IncomingPayload& payload) {
    RequestHeader h{};
    Request r;
    Status st = parse(from, header, /*push=*/false, &h, &r);
    if (st.ok() && payload.size() != 0) st = Status::Corruption("pull request carries a payload");
    if (!st.ok()) {
      payload.Reject();
      if (header.size() == sizeof(RequestHeader)) Reply(from, h.id, st);
      return;
    }
    shard_->OnPull(r, [this, from, h](const Status& ready, const void* data) {
      if (!ready.ok()) return Reply(from, h.id, ready);
      transport_->Send(from, kAmReply, Pack(ReplyHeader{h.id, 0, 0}), data, h.length, [](const Status& sent) {
        if (!sent.ok()) LOG(WARNING) << "pull reply: " << sent.message();
      });
    });
  });
}

PushPullServer::~PushPullServer() { transport_->Shutdown(); }

void PushPullServer::Reply(PeerId client, uint64_t id, const Status& status) {
  const int32_t code = status.ok() ? 0 : static_cast<int32_t>(status.code());
  transport_->Send(client, kAmReply, Pack(ReplyHeader{id, code, 0}, status.message()), nullptr, 0,
                   [](const Status& sent) {
                     if (!sent.ok()) LOG(WARNING) << "push/pull reply: " << sent.message();
                   });
}

// ---- PushPullClient ---------------------------------------------------------

PushPullClient::PushPullClient(UcxTransport* transport, uint64_t max_piece_bytes)
    : transport_(transport),
      max_piece_bytes_(std::max<uint64_t>(max_piece_bytes, 4096) / 4 * 4),
      push_window_bytes_(2 * max_piece_bytes_) {
  transport_->SetHandler(kAmReply, [this](PeerId from, std::string_view header, IncomingPayload& payload) {
    OnReply(from, header, payload);
  });
  transport_->OnPeerFailure([this](PeerId peer, const Status& status) { Fail(peer, status); });
}

PushPullClient::~PushPullClient() { transport_->Shutdown(); }

PushPullClient::Ticket PushPullClient::Push(PeerId server, RequestKind kind, uint64_t offset, const void* data,
                                            uint64_t length, uint64_t tag) {
  CHECK(IsPush(kind)) << RequestKindName(kind) << " is not pushed";
  return Issue(server, kind, data, nullptr, offset, length, tag);
}

PushPullClient::Ticket PushPullClient::Pull(PeerId server, RequestKind kind, uint64_t offset, void* dst,
                                            uint64_t length, uint64_t tag) {
  CHECK(!IsPush(kind)) << RequestKindName(kind) << " is not pulled";
  return Issue(server, kind, nullptr, dst, offset, length, tag);
}

PushPullClient::Ticket PushPullClient::Issue(PeerId server, RequestKind kind, const void* payload, void* dst,
                                             uint64_t offset, uint64_t length, uint64_t tag) {
  const bool pull = !IsPush(kind);
  std::vector<Outgoing> out;
  Ticket ticket;
  {
    MutexLock lock(&mu_);
    ticket = next_ticket_++;
    TicketState& t = tickets_[ticket];
    t.trace_start = trace::StartTime();
    t.server = server;
    t.kind = kind;
    t.offset = offset;
    t.tag = tag;
    if (!failed_all_.ok()) {
      t.status = failed_all_;  // remaining 0: Wait returns it at once
      return ticket;
    }
    uint64_t at = 0;
    do {
      const uint64_t n = std::min(max_piece_bytes_, length - at);
      const uint64_t id = next_request_++;
      requests_[id] = InFlight{ticket, server, kind, pull ? static_cast<char*>(dst) + at : nullptr, offset + at, n};
      const RequestHeader header{id, tag, offset + at, n, static_cast<uint32_t>(kind), 0};
      Outgoing o{id, server, pull ? kAmPull : kAmPush, Pack(header),
                 pull ? nullptr : static_cast<const char*>(payload) + at, pull ? 0 : n};
      if (pull) {
        out.push_back(std::move(o));
      } else {
        windows_[server].waiting.push_back(std::move(o));
      }
      ++t.remaining;
      at += n;
    } while (at < length);
    if (!pull) out = TakeSendable(server);
  }
  SendAll(std::move(out));
  return ticket;
}

std::vector<PushPullClient::Outgoing> PushPullClient::TakeSendable(PeerId server) {
  std::vector<Outgoing> out;
  PushWindow& w = windows_[server];
  // One piece always goes, whatever its size: the window never stalls.
  while (!w.waiting.empty() && (w.in_flight == 0 || w.in_flight + w.waiting.front().size <= push_window_bytes_)) {
    if (requests_.count(w.waiting.front().id)) {  // not failed meanwhile
      w.in_flight += w.waiting.front().size;
      out.push_back(std::move(w.waiting.front()));
    }
    w.waiting.pop_front();
  }
  return out;
}

void PushPullClient::SendAll(std::vector<Outgoing> out) {
  for (Outgoing& o : out) {
    const bool push = o.am_id == kAmPush;
    transport_->Send(o.server, o.am_id, std::move(o.header), o.payload, o.size,
                     [this, id = o.id, server = o.server, size = o.size, push](const Status& sent) {
                       std::vector<Outgoing> next;
                       {
                         MutexLock lock(&mu_);
                         if (push) {
                           windows_[server].in_flight -= size;
                           next = TakeSendable(server);
                         }
                         auto it = requests_.find(id);
                         if (it != requests_.end()) {
                           it->second.sent = true;
                           Settle(id, sent);
                         }
                       }
                       SendAll(std::move(next));
                     });
  }
}

void PushPullClient::OnReply(PeerId from, std::string_view header, IncomingPayload& payload) {
  if (header.size() < sizeof(ReplyHeader) || header.size() > sizeof(ReplyHeader) + kMaxErrorText) {
    LOG(WARNING) << "push/pull: dropped a reply with a " << header.size() << "-byte header";
    payload.Reject();
    return;
  }
  ReplyHeader h;
  std::memcpy(&h, header.data(), sizeof h);
  mu_.Lock();
  auto it = requests_.find(h.id);
  if (it == requests_.end() || it->second.server != from || it->second.reply_seen) {
    mu_.Unlock();
    LOG(WARNING) << "push/pull: dropped a reply to unknown request " << h.id << " from peer " << from;
    payload.Reject();
    return;
  }
  InFlight& r = it->second;
  const std::string what = Request{from, r.kind, 0, r.offset, r.length}.Describe();
  r.reply_seen = true;
  if (h.code != 0) {
    std::string text(header.substr(sizeof(ReplyHeader)));
    Settle(h.id, Status::Unavailable(what + " failed at the server: " + text));
    payload.Reject();
    mu_.Unlock();
    return;
  }
  const uint64_t expected = r.pull() ? r.length : 0;
  if (payload.size() != expected) {
    Settle(h.id, Status::Corruption(what + ": reply carries " + std::to_string(payload.size()) +
                                    " bytes, expected " + std::to_string(expected)));
    payload.Reject();
    mu_.Unlock();
    return;
  }
  if (!r.pull()) {
    r.replied = true;
    Settle(h.id, Status::OK());
    mu_.Unlock();
    return;
  }
  void* dst = r.dst;
  const uint64_t id = h.id;
  mu_.Unlock();
  // Large pulls land straight in the caller's buffer (rendezvous).
  payload.ReceiveInto(dst, [this, id, what](const Status& received) {
    MutexLock lock(&mu_);
    auto it = requests_.find(id);
    if (it == requests_.end()) return;
    it->second.replied = true;
    Settle(id, received.WithContext(what + ": "));
  });
}

void PushPullClient::Settle(uint64_t id, const Status& status) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  const InFlight& r = it->second;
  if (status.ok() && !(r.sent && r.replied)) return;
  auto t = tickets_.find(r.ticket);
  if (t != tickets_.end()) {
    TicketState& ts = t->second;
    if (!status.ok() && ts.status.ok()) ts.status = status;
    if (--ts.remaining == 0 && ts.trace_start >= 0) {
      const bool push = IsPush(ts.kind);
      const trace::Arg offset{"offset", static_cast<int64_t>(ts.offset)}, peer{"peer", ts.server};
      trace::Async(TraceName(ts.kind), "network", ts.trace_start, peer, offset,
                   push ? trace::Arg{"step", static_cast<int64_t>(TagStep(ts.tag))}
                        : trace::Arg{"version", static_cast<int64_t>(ts.tag)});
    }
  }
  requests_.erase(it);
  cv_.SignalAll();
}

Status PushPullClient::Wait(Ticket ticket) {
  MutexLock lock(&mu_);
  auto it = tickets_.find(ticket);
  if (it == tickets_.end()) return Status::Internal("push/pull: unknown ticket " + std::to_string(ticket));
  while (it->second.remaining != 0) cv_.Wait(&mu_);
  Status st = it->second.status;
  tickets_.erase(it);
  return st;
}

std::optional<Status> PushPullClient::WaitUnless(Ticket ticket, const std::function<bool()>& interrupted) {
  MutexLock lock(&mu_);
  auto it = tickets_.find(ticket);
  if (it == tickets_.end()) return Status::Internal("push/pull: unknown ticket " + std::to_string(ticket));
  while (it->second.remaining != 0 && !interrupted()) cv_.Wait(&mu_);
  if (it->second.remaining != 0) return std::nullopt;
  Status st = it->second.status;
  tickets_.erase(it);
  return st;
}

void PushPullClient::Wake() {
  // Under the lock: a waiter is either before its check (and sees what
  // changed) or asleep (and is woken), never in between.
  MutexLock lock(&mu_);
  cv_.SignalAll();
}

Status PushPullClient::WaitAll() {
  MutexLock lock(&mu_);
  while (!requests_.empty()) cv_.Wait(&mu_);
  Status first;
  for (const auto& [ticket, t] : tickets_) {
    if (!t.status.ok() && first.ok()) first = t.status;
  }
  tickets_.clear();
  return first;
}

void PushPullClient::Fail(PeerId server, const Status& status) {
  MutexLock lock(&mu_);
  if (server < 0 && failed_all_.ok()) failed_all_ = status;
  std::vector<uint64_t> doomed;
  for (const auto& [id, r] : requests_) {
    if (server < 0 || r.server == server) doomed.push_back(id);
  }
  for (uint64_t id : doomed) Settle(id, status);
  for (auto& [peer, window] : windows_) {
    if (server < 0 || peer == server) window.waiting.clear();  // their requests just failed
  }
  if (server < 0) transport_->Abort(status);
}

}  // namespace herd::transport
