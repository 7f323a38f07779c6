#include "transport/ring_collectives.h"

#include <glog/logging.h>

#include <algorithm>
#include <bit>
#include <cstring>

#include "common/bf16.h"
#include "common/trace.h"

namespace herd::transport {
namespace {

static_assert(std::endian::native == std::endian::little, "headers are sent in host order: little-endian only");

// kReady travels the other way: "I have started operation seq".
enum Phase : uint8_t { kReduce = 0, kGather = 1, kBroadcast = 2, kReady = 3 };
enum class Kind { kAllReduce, kReduceScatter, kAllGather, kBroadcast };

// An operation, and a chunk in flight, as the trace names them.
const char* TraceName(Kind kind) {
  switch (kind) {
    case Kind::kAllReduce:
      return "all-reduce";
    case Kind::kReduceScatter:
      return "reduce-scatter";
    case Kind::kAllGather:
      return "all-gather";
    case Kind::kBroadcast:
      return "broadcast";
  }
  return "collective";
}
const char* ChunkTraceName(int phase) {
  return phase == kReduce ? "ring reduce chunk" : phase == kGather ? "ring gather chunk" : "ring broadcast chunk";
}

constexpr uint64_t kMaxSeqAhead = 1 << 20;

int Mod(int64_t a, int w) { return static_cast<int>(((a % w) + w) % w); }

}  // namespace

// One chunk on the wire: which operation, which ring step, which chunk of
// that step's part.
struct RingCollectives::ChunkHeader {
  uint64_t seq;
  uint8_t phase;
  uint8_t reserved[3];
  uint32_t step;
  int64_t chunk;
};

namespace {

// A message's header as it travels.
std::string EncodeHeader(const RingCollectives::ChunkHeader& h) {
  std::string header(sizeof h, '\0');
  std::memcpy(header.data(), &h, sizeof h);
  return header;
}

}  // namespace

struct RingCollectives::Op {
  uint64_t seq = 0;
  Kind kind = Kind::kAllReduce;
  char* data = nullptr;
  DType dtype = DType::kFloat32;
  int elem = 4;
  bool bf16 = false;  // float32 data, bf16 on the wire
  std::vector<int64_t> begin;  // part boundaries in elements, size W+1 (broadcast: 2)
  int root = 0;
  int64_t chunk_elems = 0;
  int64_t recvs_left = 0, sends_left = 0;
  bool started = false, done = false;
  Status status;
  std::vector<std::unique_ptr<char[]>> scratch;  // reduce chunks being received
  int64_t trace_start = -1;  // when it was issued (log.trace)

  int parts() const { return static_cast<int>(begin.size()) - 1; }
  int wire_elem() const { return bf16 ? 2 : elem; }
  int64_t Chunks(int part) const {
    const int64_t len = begin[part + 1] - begin[part];
    return (len + chunk_elems - 1) / chunk_elems;
  }
  // Elements [first, first+count) of the buffer for chunk c of `part`.
  std::pair<int64_t, int64_t> ChunkRange(int part, int64_t c) const {
    const int64_t first = begin[part] + c * chunk_elems;
    return {first, std::min(chunk_elems, begin[part + 1] - first)};
  }
};

struct RingCollectives::Early {
  ChunkHeader header;
  std::unique_ptr<char[]> bytes;  // from the pool
  size_t size = 0;
  bool arrived = false;
  Status status;
};

RingCollectives::RingCollectives(UcxTransport* transport, int rank, std::vector<PeerId> peers, int64_t chunk_bytes,
                                 uint16_t am_id)
    : transport_(transport),
      rank_(rank),
      peers_(std::move(peers)),
      chunk_bytes_(std::max<int64_t>(chunk_bytes, 64)),
      am_id_(am_id) {
  transport_->SetHandler(am_id_, [this](PeerId from, std::string_view header, IncomingPayload& payload) {
    OnMessage(from, header, payload);
  });
  transport_->OnPeerFailure([this](PeerId peer, const Status& status) {
    if (peer == peers_[Mod(rank_ - 1, size())] || peer == peers_[Mod(rank_ + 1, size())]) Fail(status);
  });
}

RingCollectives::~RingCollectives() { transport_->Shutdown(); }

// ---- issuing ----------------------------------------------------------------

namespace {

// An operation over `data` cut into `parts` (one per rank).
std::unique_ptr<RingCollectives::Op> NewOp(Kind kind, void* data, const Partition& parts, int elem = 4) {
  auto op = std::make_unique<RingCollectives::Op>();
  op->kind = kind;
  op->data = static_cast<char*>(data);
  op->elem = elem;
  op->dtype = elem == 8 ? DType::kFloat64 : DType::kFloat32;
  op->begin = {0};
  for (int64_t c : parts) op->begin.push_back(op->begin.back() + c);
  return op;
}

}  // namespace

Collectives::Handle RingCollectives::AllReduce(void* data, int64_t n, DType dtype, Wire wire) {
  auto op = NewOp(Kind::kAllReduce, data, EvenPartition(n, size(), kCollectiveAlign), dtype == DType::kFloat64 ? 8 : 4);
  op->bf16 = wire == Wire::kBf16 && dtype == DType::kFloat32;
  return Issue(std::move(op));
}

Collectives::Handle RingCollectives::ReduceScatter(float* data, const Partition& parts, Wire wire) {
  auto op = NewOp(Kind::kReduceScatter, data, parts);
  op->bf16 = wire == Wire::kBf16;
  return Issue(std::move(op));
}

Collectives::Handle RingCollectives::AllGather(float* data, const Partition& parts) {
  return Issue(NewOp(Kind::kAllGather, data, parts));
}

Collectives::Handle RingCollectives::Broadcast(float* data, int64_t n, int root) {
  auto op = NewOp(Kind::kBroadcast, data, {n});
  op->root = root;
  return Issue(std::move(op));
}

Collectives::Handle RingCollectives::Issue(std::unique_ptr<Op> op) {
  op->chunk_elems = std::max<int64_t>(1, chunk_bytes_ / op->elem);
  op->trace_start = trace::StartTime();
  Handle seq;
  MutexLock lock(&mu_);
  seq = op->seq = next_seq_++;
  Op* raw = op.get();
  const bool bad_parts = op->kind != Kind::kBroadcast && op->parts() != size();
  const bool bad_root = op->kind == Kind::kBroadcast && (op->root < 0 || op->root >= size());
  ops_[seq] = std::move(op);
  if (!failed_.ok() || bad_parts || bad_root) {
    raw->status = !failed_.ok() ? failed_
                                : Status::InvalidArgument(bad_parts ? "collective: a partition needs one part per rank"
                                                                    : "collective: broadcast root out of range");
    raw->done = true;
    return seq;
  }
  if (size() == 1) {
    raw->done = true;
    return seq;
  }
  transport_->AddBusy(1);  // until Settle finishes it
  transport_->Post([this, seq] {
    MutexLock lock(&mu_);
    auto it = ops_.find(seq);
    if (it != ops_.end() && !it->second->done) Start(*it->second);
  });
  return seq;
}

// ---- the ring (progress thread, under mu_) ------------------------------------

void RingCollectives::Start(Op& op) {
  const int W = size();
  // Ready, to the left-hand neighbour (which sends to this rank).
  ChunkHeader ready{};
  ready.seq = op.seq;
  ready.phase = kReady;
  transport_->Send(peers_[Mod(rank_ - 1, W)], am_id_, EncodeHeader(ready), nullptr, 0, [](const Status&) {});
  auto count = [&](int phase, bool sending) {
    int64_t total = 0;
    for (int s = 0; s < W - 1; ++s) {
      const int part = phase == kReduce ? Mod(rank_ - s - (sending ? 1 : 2), W) : Mod(rank_ - s - (sending ? 0 : 1), W);
      total += op.Chunks(part);
    }
    return total;
  };
  if (op.kind == Kind::kBroadcast) {
    const int d = Mod(rank_ - op.root, W);
    op.recvs_left = d > 0 ? op.Chunks(0) : 0;
    op.sends_left = d < W - 1 ? op.Chunks(0) : 0;
    if (d == 0) {
      for (int64_t c = 0; c < op.Chunks(0); ++c) SendChunk(op, kBroadcast, 0, c);
    }
  } else {
    const bool reduce = op.kind != Kind::kAllGather, gather = op.kind != Kind::kReduceScatter;
    op.recvs_left = (reduce ? count(kReduce, false) : 0) + (gather ? count(kGather, false) : 0);
    op.sends_left = (reduce ? count(kReduce, true) : 0) + (gather ? count(kGather, true) : 0);
    const int first = reduce ? Mod(rank_ - 1, W) : rank_;
    for (int64_t c = 0; c < op.Chunks(first); ++c) SendChunk(op, reduce ? kReduce : kGather, 0, c);
  }
  op.started = true;
  TakeEarly(op);
  Settle(op);
}

void RingCollectives::TakeEarly(Op& op) {
  auto it = early_.find(op.seq);
  if (it == early_.end()) return;
  auto& list = it->second;
  for (size_t i = 0; i < list.size();) {
    std::shared_ptr<Early> e = list[i];
    if (!e->arrived) {
      ++i;
      continue;
    }
    list.erase(list.begin() + i);
    early_bytes_ -= static_cast<int64_t>(e->size);
    bool unexpected = false;
    if (op.done) {
      // over already: dropped
    } else if (!e->status.ok()) {
      if (op.status.ok()) op.status = e->status.WithContext("collective: ");
    } else if (ExpectedChunk(op, e->header, e->size) < 0) {
      FailLocked(Status::Corruption(
          "collective: operation " + std::to_string(op.seq) + ": an unexpected chunk arrived ahead of it (phase " +
          std::to_string(e->header.phase) + ", step " + std::to_string(e->header.step) + ", chunk " +
          std::to_string(e->header.chunk) + ", " + std::to_string(e->size) + " bytes)"));
      unexpected = true;
    } else {
      OnChunk(op, e->header.phase, static_cast<int>(e->header.step), e->header.chunk, e->bytes.get());
    }
    ReturnBuffer(std::move(e->bytes));  // back to the pool once applied (or dropped)
    if (unexpected) return;
  }
  if (list.empty()) early_.erase(it);
}

// Buffers are kept for reuse (allocating one per chunk costs page faults
// and, above malloc's mmap threshold, an mmap/munmap pair); the flow
// control bounds how many are ever out at once.
std::unique_ptr<char[]> RingCollectives::TakeBuffer() {
  peak_buffers_ = std::max(peak_buffers_, ++buffers_out_);
  if (pool_.empty()) return std::unique_ptr<char[]>(new char[chunk_bytes_]);  // uninitialised: overwritten
  std::unique_ptr<char[]> b = std::move(pool_.back());
  pool_.pop_back();
  return b;
}

void RingCollectives::ReturnBuffer(std::unique_ptr<char[]> buffer) {
  if (buffer == nullptr) return;
  --buffers_out_;
  if (pool_.size() < static_cast<size_t>(kRingChunkBuffers)) pool_.push_back(std::move(buffer));
}

int RingCollectives::peak_chunk_buffers() {
  MutexLock lock(&mu_);
  return peak_buffers_;
}

void RingCollectives::ReturnScratch(Op& op, char* buf) {
  auto& s = op.scratch;
  auto used = std::find_if(s.begin(), s.end(), [buf](const auto& p) { return p.get() == buf; });
  ReturnBuffer(std::move(*used));
  s.erase(used);
}

bool RingCollectives::MayGo(uint64_t seq) const {
  return sends_in_flight_ < kRingChunksInFlight && (seq < right_started_ || total_ahead_ < kRingChunksAhead);
}

void RingCollectives::Dispatch(Op& op, int phase, int step, int64_t chunk) {
  if (op.seq >= right_started_) {
    ++chunks_ahead_[op.seq];
    ++total_ahead_;
  }
  ++sends_in_flight_;
  Transmit(op, phase, step, chunk);
}

void RingCollectives::SendChunk(Op& op, int phase, int step, int64_t chunk) {
  // The order among chunks does not matter to the receiver: one that may
  // go need not wait behind held ones.
  if (MayGo(op.seq)) return Dispatch(op, phase, step, chunk);
  held_.push_back({op.seq, phase, step, chunk});
}

void RingCollectives::SendHeld() {
  // In order, each chunk that may go; a started operation's chunks are not
  // held up behind a later one's. (An operation holding chunks has sends
  // left, so it is still in ops_; a failed one's are dropped.)
  size_t kept = 0, i = 0;
  for (; i < held_.size() && sends_in_flight_ < kRingChunksInFlight; ++i) {
    const HeldChunk c = held_[i];
    if (!MayGo(c.seq)) {
      held_[kept++] = c;
      continue;
    }
    auto it = ops_.find(c.seq);
    if (it != ops_.end() && !it->second->done) Dispatch(*it->second, c.phase, c.step, c.chunk);
  }
  held_.erase(std::move(held_.begin() + static_cast<std::ptrdiff_t>(i), held_.end(),
                        held_.begin() + static_cast<std::ptrdiff_t>(kept)),
              held_.end());
}

void RingCollectives::OnReady(uint64_t seq) {
  right_started_ = seq + 1;
  auto ahead = chunks_ahead_.find(seq);
  if (ahead != chunks_ahead_.end()) {
    total_ahead_ -= ahead->second;
    chunks_ahead_.erase(ahead);
  }
  SendHeld();
}

void RingCollectives::Transmit(Op& op, int phase, int step, int64_t chunk) {
  const int W = size();
  const int part = phase == kBroadcast ? 0 : phase == kReduce ? Mod(rank_ - step - 1, W) : Mod(rank_ - step, W);
  const auto [first, count] = op.ChunkRange(part, chunk);
  ChunkHeader h{};
  h.seq = op.seq;
  h.phase = static_cast<uint8_t>(phase);
  h.step = static_cast<uint32_t>(step);
  h.chunk = chunk;
  const uint64_t seq = op.seq;
  // A bf16 wire sends a rounded copy, from a pooled buffer.
  const char* payload = op.data + first * op.elem;
  char* staged = nullptr;
  if (op.bf16) {
    op.scratch.push_back(TakeBuffer());
    staged = op.scratch.back().get();
    FloatsToBf16(reinterpret_cast<const float*>(payload), reinterpret_cast<uint16_t*>(staged), count);
    payload = staged;
  }
  transport_->Send(peers_[Mod(rank_ + 1, W)], am_id_, EncodeHeader(h), payload, count * op.wire_elem(),
                   [this, seq, phase, step, chunk, staged, sent_at = trace::StartTime()](const Status& sent) {
                     trace::Async(ChunkTraceName(phase), "network", sent_at, {"op", static_cast<int64_t>(seq)},
                                  {"ring_step", step}, {"chunk", chunk});
                     MutexLock lock(&mu_);
                     --sends_in_flight_;
                     auto it = ops_.find(seq);
                     if (it != ops_.end()) {
                       Op& o = *it->second;
                       if (staged != nullptr) ReturnScratch(o, staged);
                       --o.sends_left;
                       if (!sent.ok() && o.status.ok()) o.status = sent.WithContext("collective: ");
                       Settle(o);
                     }
                     SendHeld();
                   });
}

void RingCollectives::OnChunk(Op& op, int phase, int step, int64_t chunk, const void* bytes) {
  const int W = size();
  if (phase == kBroadcast) {
    const auto [first, count] = op.ChunkRange(0, chunk);
    if (bytes != nullptr) std::memcpy(op.data + first * op.elem, bytes, count * op.elem);
    --op.recvs_left;
    if (Mod(rank_ - op.root, W) < W - 1) SendChunk(op, kBroadcast, step + 1, chunk);
    return;
  }
  const int part = phase == kReduce ? Mod(rank_ - step - 2, W) : Mod(rank_ - step - 1, W);
  const auto [first, count] = op.ChunkRange(part, chunk);
  --op.recvs_left;
  if (phase == kGather) {
    if (op.bf16) {
      Bf16ToFloats(static_cast<const uint16_t*>(bytes), reinterpret_cast<float*>(op.data) + first, count);
    } else if (bytes != nullptr) {
      std::memcpy(op.data + first * op.elem, bytes, count * op.elem);
    }
    if (step < W - 2) SendChunk(op, kGather, step + 1, chunk);
    return;
  }
  // Reduce: mine += incoming, always in this order (see the header).
  trace::Span span("ring reduce", "collective", {"op", static_cast<int64_t>(op.seq)}, {"ring_step", step},
                   {"chunk", chunk});
  if (op.dtype == DType::kFloat64) {
    double* mine = reinterpret_cast<double*>(op.data) + first;
    const double* in = static_cast<const double*>(bytes);
    for (int64_t i = 0; i < count; ++i) mine[i] += in[i];
  } else if (op.bf16) {
    float* mine = reinterpret_cast<float*>(op.data) + first;
    const uint16_t* in = static_cast<const uint16_t*>(bytes);
    for (int64_t i = 0; i < count; ++i) mine[i] += Bf16ToFloat(in[i]);
    // This rank's part is final: rounded as every other rank receives it.
    if (step == W - 2) {
      for (int64_t i = 0; i < count; ++i) mine[i] = Bf16ToFloat(FloatToBf16(mine[i]));
    }
  } else {
    float* mine = reinterpret_cast<float*>(op.data) + first;
    const float* in = static_cast<const float*>(bytes);
    for (int64_t i = 0; i < count; ++i) mine[i] += in[i];
  }
  if (step < W - 2) {
    SendChunk(op, kReduce, step + 1, chunk);
  } else if (op.kind == Kind::kAllReduce) {
    SendChunk(op, kGather, 0, chunk);  // this rank's part is final: gather starts
  }
}

int RingCollectives::ExpectedChunk(const Op& op, const ChunkHeader& h, size_t bytes) const {
  const int W = size();
  const bool reduce = op.kind == Kind::kAllReduce || op.kind == Kind::kReduceScatter;
  const bool gather = op.kind == Kind::kAllReduce || op.kind == Kind::kAllGather;
  const int step = static_cast<int>(h.step);
  int part = -1;
  if (h.phase == kBroadcast && op.kind == Kind::kBroadcast && Mod(rank_ - op.root, W) > 0) {
    part = 0;
  } else if (step < W - 1 && ((h.phase == kReduce && reduce) || (h.phase == kGather && gather))) {
    part = h.phase == kReduce ? Mod(rank_ - step - 2, W) : Mod(rank_ - step - 1, W);
  }
  if (part < 0 || h.chunk < 0 || h.chunk >= op.Chunks(part) ||
      bytes != static_cast<size_t>(op.ChunkRange(part, h.chunk).second * op.wire_elem())) {
    return -1;
  }
  return part;
}

void RingCollectives::OnMessage(PeerId from, std::string_view header, IncomingPayload& payload) {
  MutexLock lock(&mu_);
  const int W = size();
  auto refuse = [&](const std::string& why) REQUIRES(mu_) {
    payload.Reject();
    FailLocked(Status::Corruption("collective: " + why));
  };
  if (header.size() != sizeof(ChunkHeader)) return refuse("a ring message with a malformed header");
  ChunkHeader h;
  std::memcpy(&h, header.data(), sizeof h);
  if (W >= 2 && h.phase == kReady && from == peers_[Mod(rank_ + 1, W)]) {
    // Operations start in sequence order on every rank.
    if (payload.size() != 0 || h.seq != right_started_) {
      return refuse("a ready message for operation " + std::to_string(h.seq) + " (expected " +
                    std::to_string(right_started_) + ", " + std::to_string(payload.size()) + " bytes)");
    }
    payload.Reject();
    if (failed_.ok()) OnReady(h.seq);
    return;
  }
  if (W < 2 || from != peers_[Mod(rank_ - 1, W)])
    return refuse("a ring message from peer " + std::to_string(from) + ", not the left-hand neighbour");
  if (!failed_.ok()) return payload.Reject();
  auto it = ops_.find(h.seq);
  if (it == ops_.end() || !it->second->started) {
    // Not started here yet: keep it (bounded) until it is.
    // The neighbour sends kRingChunksAhead at most before this rank says
    // it has started (twice that while an earlier one's still arrive).
    if ((it == ops_.end() && (h.seq < next_seq_ || h.seq > next_seq_ + kMaxSeqAhead)) || h.phase > kBroadcast ||
        h.chunk < 0 || static_cast<int>(h.step) >= W || payload.size() > static_cast<size_t>(chunk_bytes_) ||
        early_bytes_ + static_cast<int64_t>(payload.size()) > 2 * kRingChunksAhead * chunk_bytes_) {
      return refuse("a ring message for operation " + std::to_string(h.seq) + " that cannot be expected");
    }
    return KeepEarly(h, payload);
  }
  Op& op = *it->second;
  if (op.done) return payload.Reject();
  const int part = ExpectedChunk(op, h, payload.size());
  const int step = static_cast<int>(h.step);
  if (part < 0) {
    return refuse("operation " + std::to_string(h.seq) + ": an unexpected chunk (phase " + std::to_string(h.phase) +
                  ", step " + std::to_string(step) + ", chunk " + std::to_string(h.chunk) + ", " +
                  std::to_string(payload.size()) + " bytes)");
  }
  const uint64_t seq = op.seq;
  const int phase = h.phase;
  const int64_t chunk = h.chunk;
  if (const void* bytes = payload.eager_data(); bytes != nullptr) {
    OnChunk(op, phase, step, chunk, bytes);
    Settle(op);
    return;
  }
  // A rendezvous chunk: reduce chunks land in a pooled buffer and are
  // added; gather and broadcast chunks land in place, but for bf16 ones
  // (converted).
  char* buf = nullptr;
  void* dst;
  if (phase == kReduce || op.bf16) {
    op.scratch.push_back(TakeBuffer());
    dst = buf = op.scratch.back().get();
  } else {
    dst = op.data + op.ChunkRange(part, chunk).first * op.elem;
  }
  payload.ReceiveInto(dst, [this, seq, phase, step, chunk, buf](const Status& received) {
    MutexLock lock(&mu_);
    auto it = ops_.find(seq);
    if (it == ops_.end()) return;
    Op& o = *it->second;
    if (!received.ok()) {
      if (o.status.ok()) o.status = received.WithContext("collective: ");
      --o.recvs_left;
    } else if (!o.done) {
      OnChunk(o, phase, step, chunk, buf);
    }
    if (buf != nullptr) ReturnScratch(o, buf);
    Settle(o);
  });
}

void RingCollectives::KeepEarly(const ChunkHeader& h, IncomingPayload& payload) {
  auto e = std::make_shared<Early>();
  e->header = h;
  e->bytes = TakeBuffer();
  e->size = payload.size();
  early_bytes_ += static_cast<int64_t>(payload.size());
  early_[h.seq].push_back(e);
  payload.ReceiveInto(e->bytes.get(), [this, e](const Status& received) {
    MutexLock lock(&mu_);
    e->arrived = true;
    e->status = received;
    auto op = ops_.find(e->header.seq);
    if (op != ops_.end() && op->second->started) {
      TakeEarly(*op->second);
      Settle(*op->second);
    }
  });
}

void RingCollectives::Settle(Op& op) {
  if (op.done) return;
  if ((op.recvs_left == 0 && op.sends_left == 0) || !op.status.ok()) {
    trace::Async(TraceName(op.kind), "collective", op.trace_start, {"op", static_cast<int64_t>(op.seq)},
                 {"elements", op.begin.back()});
    op.done = true;
    transport_->AddBusy(-1);
    cv_.SignalAll();
  }
}

// ---- waiting and failing ------------------------------------------------------

Status RingCollectives::Wait(Handle handle) {
  MutexLock lock(&mu_);
  auto it = ops_.find(handle);
  if (it == ops_.end()) return Status::Internal("collective: unknown handle " + std::to_string(handle));
  while (!it->second->done) cv_.Wait(&mu_);
  Status st = it->second->status;
  // In-flight sends and receives may still name this operation; it goes
  // once they have completed (or the transport has shut down).
  if (it->second->recvs_left == 0 && it->second->sends_left == 0) ops_.erase(it);
  return st;
}

void RingCollectives::Fail(const Status& status) {
  MutexLock lock(&mu_);
  FailLocked(status);
}

void RingCollectives::FailLocked(const Status& status) {
  if (failed_.ok()) {
    failed_ = status;
    LOG(WARNING) << status.message();
  }
  for (auto& [seq, op] : ops_) {
    if (op->status.ok()) op->status = status;
    if (!op->done && size() > 1) transport_->AddBusy(-1);
    op->done = true;
  }
  cv_.SignalAll();
}

}  // namespace herd::transport
