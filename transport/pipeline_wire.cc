#include "transport/pipeline_wire.h"

#include <glog/logging.h>

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstring>
#include <utility>

#include "common/bf16.h"

namespace herd::transport {
namespace {

static_assert(std::endian::native == std::endian::little, "headers are sent in host order: little-endian only");

bool KnownKind(uint8_t kind) {
  return kind == StageMessage::kActivation || kind == StageMessage::kGradient ||
         kind == StageMessage::kEmbeddingGradient || kind == StageMessage::kLogits;
}

// "activation for step 8 micro-batch 2 virtual stage 1" (steps from 1).
std::string Describe(uint8_t kind, uint64_t step, int32_t micro_batch, int32_t virtual_stage) {
  return StageMessageKindName(kind) + " for step " + std::to_string(step + 1) + " micro-batch " +
         std::to_string(micro_batch) + " virtual stage " + std::to_string(virtual_stage);
}

const char* DTypeName(uint8_t dtype) {
  return dtype == StageWireHeader::kFloat32 ? "fp32" : dtype == StageWireHeader::kBf16 ? "bf16" : "an unknown dtype";
}

std::string Hex(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

std::string From(PeerId peer) { return "pipeline message from peer " + std::to_string(peer) + ": "; }

}  // namespace

std::string StageMessageKindName(int kind) {
  switch (kind) {
    case StageMessage::kActivation:
      return "activation";
    case StageMessage::kGradient:
      return "gradient";
    case StageMessage::kEmbeddingGradient:
      return "embedding gradient";
    case StageMessage::kLogits:
      return "logits";
  }
  return "kind " + std::to_string(kind);
}

// A posted Receive. Shared with the landing's completion, which may
// outlive the Receive after a failure.
struct PipelineWire::Waiter {
  float* dst = nullptr;
  int64_t elements = 0;
  bool matched = false;  // its message arrived and is landing
  bool landed = false;
  double loss = 0;
  Buffer staging;  // bf16 rendezvous: the payload, to convert into dst
};

// A message that arrived before its Receive.
struct PipelineWire::Early {
  int64_t elements = 0;
  double loss = 0;
  bool bf16 = false;
  Buffer bytes;          // counted in held_ while set
  bool arrived = false;  // landed (or failed to)
  bool dropped = false;  // forgotten while landing: the completion returns the buffer
  Status status;
};

struct PipelineWire::SendOp {
  bool done = false;
  bool waited = false;  // WaitSent returned before the completion ran: it erases the op
  Status status;
  Buffer staging;  // bf16: the converted payload
};

PipelineWire::PipelineWire(UcxTransport* transport, bool bf16, int64_t max_elements, int max_early)
    : transport_(transport),
      bf16_(bf16),
      max_elements_(std::max<int64_t>(max_elements, 1)),
      max_early_(std::max(max_early, 0)),
      buffer_bytes_(static_cast<size_t>(max_elements_) * (bf16 ? 2 : 4)) {
  transport_->SetHandler(kAmPipeline, [this](PeerId from, std::string_view header, IncomingPayload& payload) {
    OnMessage(from, header, payload);
  });
  transport_->OnPeerFailure([this](PeerId peer, const Status& status) {
    MutexLock lock(&mu_);
    if (peers_.count(peer) != 0) FailLocked(status.WithContext("pipeline wire: "));
  });
}

PipelineWire::~PipelineWire() { transport_->Shutdown(); }

std::string PipelineWire::CheckLocal(const StageMessage& m) const {
  if (!KnownKind(m.kind)) return "unknown kind " + std::to_string(static_cast<int>(m.kind));
  if (m.micro_batch < 0 || m.virtual_stage < 0) return "a negative micro-batch or virtual stage";
  if (m.elements <= 0 || m.elements > max_elements_) {
    return std::to_string(m.elements) + " elements, outside [1, " + std::to_string(max_elements_) + "]";
  }
  return "";
}

// ---- buffers ------------------------------------------------------------------

PipelineWire::Buffer PipelineWire::TakeBuffer(size_t bytes) {
  // A tied embedding's gradient travels as fp32 on a bf16 wire: larger
  // than a pooled buffer, it gets one of its own.
  if (bytes > buffer_bytes_) return Buffer{std::unique_ptr<char[]>(new char[bytes]), bytes};
  if (pool_.empty()) return Buffer{std::unique_ptr<char[]>(new char[buffer_bytes_]), buffer_bytes_};  // overwritten
  Buffer b = std::move(pool_.back());
  pool_.pop_back();
  return b;
}

void PipelineWire::ReturnBuffer(Buffer buffer) {
  if (buffer.data == nullptr || buffer.size != buffer_bytes_ || !failed_.ok()) return;
  if (pool_.size() < static_cast<size_t>(max_early_) + 2) pool_.push_back(std::move(buffer));
}

// ---- sending ------------------------------------------------------------------

PipelineWire::Handle PipelineWire::Send(PeerId to, const StageMessage& m, const float* data) {
  const std::string bad = CheckLocal(m);
  const bool bf16 = WireBf16(m.kind);
  const std::string what = Describe(m.kind, m.step, m.micro_batch, m.virtual_stage);
  Handle handle;
  char* staged = nullptr;
  {
    MutexLock lock(&mu_);
    handle = next_handle_++;
    auto op = std::make_unique<SendOp>();
    SendOp& o = *op;
    sends_[handle] = std::move(op);
    if (!bad.empty() || !failed_.ok()) {
      o.done = true;
      o.status = !bad.empty() ? Status::InvalidArgument("pipeline wire: sending " + what + " to peer " +
                                                        std::to_string(to) + ": " + bad)
                              : failed_;
      return handle;
    }
    peers_.insert(to);
    if (bf16) {
      o.staging = TakeBuffer(static_cast<size_t>(m.elements) * 2);
      staged = o.staging.data.get();  // the op's until its completion: stays put
    }
  }
  const void* payload = data;
  if (bf16) {
    FloatsToBf16(data, reinterpret_cast<uint16_t*>(staged), m.elements);
    payload = staged;
  }
  StageWireHeader h;
  h.kind = m.kind;
  h.dtype = bf16 ? StageWireHeader::kBf16 : StageWireHeader::kFloat32;
  h.micro_batch = m.micro_batch;
  h.virtual_stage = m.virtual_stage;
  h.step = m.step;
  h.elements = m.elements;
  h.loss = m.loss;
  std::string header(sizeof h, '\0');
  std::memcpy(header.data(), &h, sizeof h);
  transport_->AddBusy(1);  // until it completes
  // Not under mu_: a shut-down transport completes at once, on this thread.
  transport_->Send(to, kAmPipeline, std::move(header), payload, static_cast<size_t>(m.elements) * (bf16 ? 2 : 4),
                   [this, handle, to, what](const Status& sent) {
                     transport_->AddBusy(-1);
                     MutexLock lock(&mu_);
                     auto it = sends_.find(handle);
                     if (it == sends_.end()) return;
                     SendOp& o = *it->second;
                     o.done = true;
                     ReturnBuffer(std::move(o.staging));
                     if (!sent.ok()) {
                       o.status = sent.WithContext("pipeline wire: sending " + what + " to peer " +
                                                   std::to_string(to) + ": ");
                       FailLocked(o.status);
                     }
                     if (o.waited) sends_.erase(it);
                     cv_.SignalAll();
                   });
  return handle;
}

Status PipelineWire::WaitSent(Handle handle) {
  MutexLock lock(&mu_);
  auto it = sends_.find(handle);
  if (it == sends_.end()) return Status::Internal("pipeline wire: unknown send handle " + std::to_string(handle));
  SendOp& o = *it->second;
  while (!o.done && failed_.ok()) cv_.Wait(&mu_);
  const Status st = !o.status.ok() ? o.status : failed_;
  // A send still in flight after a failure names the op: it goes when
  // the send completes.
  if (o.done) {
    sends_.erase(it);
  } else {
    o.waited = true;
  }
  return st;
}

// ---- receiving ----------------------------------------------------------------

StatusOr<double> PipelineWire::Receive(PeerId from, const StageMessage& expected, float* dst) {
  const std::string what = Describe(expected.kind, expected.step, expected.micro_batch, expected.virtual_stage);
  if (const std::string bad = CheckLocal(expected); !bad.empty()) {
    return Status::InvalidArgument("pipeline wire: receiving " + what + " from peer " + std::to_string(from) + ": " +
                                   bad);
  }
  const Key key{from, expected.kind, expected.step, expected.micro_batch, expected.virtual_stage};
  Buffer bytes;  // to copy out of, without the lock
  bool bf16 = false, early = false;
  double loss = 0;
  {
    MutexLock lock(&mu_);
    if (!failed_.ok()) return failed_;
    if (expected.step != step_) {
      return Status::FailedPrecondition("pipeline wire: receiving " + what + " from peer " + std::to_string(from) +
                                        " while this stage is at step " + std::to_string(step_ + 1));
    }
    if (delivered_.count(key) != 0 || waiters_.count(key) != 0) {
      return Status::FailedPrecondition("pipeline wire: receiving " + what + " from peer " + std::to_string(from) +
                                        " twice");
    }
    peers_.insert(from);
    if (auto it = early_.find(key); it != early_.end()) {
      const std::shared_ptr<Early> e = it->second;
      if (e->elements != expected.elements) {
        FailLocked(Status::Corruption(From(from) + what + " has " + std::to_string(e->elements) +
                                      " elements, expected " + std::to_string(expected.elements)));
        return failed_;
      }
      if (!e->arrived) transport_->AddBusy(1);
      const bool waited = !e->arrived;
      while (!e->arrived && !e->dropped && failed_.ok()) cv_.Wait(&mu_);
      if (waited) transport_->AddBusy(-1);
      if (!failed_.ok()) return failed_;
      if (e->dropped) {
        return Status::FailedPrecondition("pipeline wire: " + what + " from peer " + std::to_string(from) +
                                          " was dropped: the step moved on");
      }
      early_.erase(key);
      delivered_.insert(key);
      bytes = std::move(e->bytes);
      bf16 = e->bf16;
      loss = e->loss;
      early = true;
    } else {
      auto w = std::make_shared<Waiter>();
      w->dst = dst;
      w->elements = expected.elements;
      waiters_[key] = w;
      ++stats_.waiting;
      transport_->AddBusy(1);
      while (!w->landed && failed_.ok()) cv_.Wait(&mu_);
      transport_->AddBusy(-1);
      --stats_.waiting;
      waiters_.erase(key);
      if (!failed_.ok()) return failed_;
      delivered_.insert(key);
      if (w->staging.data == nullptr) return w->loss;
      bytes = std::move(w->staging);
      bf16 = true;
      loss = w->loss;
    }
  }
  if (bf16) {
    Bf16ToFloats(reinterpret_cast<const uint16_t*>(bytes.data.get()), dst, expected.elements);
  } else {
    std::memcpy(dst, bytes.data.get(), static_cast<size_t>(expected.elements) * 4);
  }
  MutexLock lock(&mu_);
  if (early) --held_;
  ReturnBuffer(std::move(bytes));
  return loss;
}

uint64_t PipelineWire::step() {
  MutexLock lock(&mu_);
  return step_;
}

void PipelineWire::SetStep(uint64_t step) {
  MutexLock lock(&mu_);
  step_ = step;
  auto stale = [step](const Key& k) { return k.step != step && k.step != step + 1; };
  int dropped = 0;
  std::string first;
  for (auto it = early_.begin(); it != early_.end();) {
    if (!stale(it->first)) {
      ++it;
      continue;
    }
    if (dropped++ == 0) {
      first = Describe(it->first.kind, it->first.step, it->first.micro_batch, it->first.virtual_stage) +
              " from peer " + std::to_string(it->first.from);
    }
    DropEarly(*it->second);
    it = early_.erase(it);
  }
  if (dropped > 0) {
    LOG(WARNING) << "pipeline wire: at step " << step + 1 << " dropped " << dropped
                 << " held message(s) that no Receive took (" << first << (dropped > 1 ? ", ..." : "") << ")";
  }
  std::erase_if(delivered_, stale);
  cv_.SignalAll();  // a Receive waiting on a dropped message
}

void PipelineWire::DropEarly(Early& e) {
  e.dropped = true;
  if (!e.arrived) return;  // the landing's completion returns the buffer
  if (e.bytes.data != nullptr) --held_;
  ReturnBuffer(std::move(e.bytes));
}

// ---- the handler (progress thread) ---------------------------------------------

std::string PipelineWire::Check(const StageWireHeader& h, size_t bytes) const {
  if (h.micro_batch < 0 || h.virtual_stage < 0) return "has a negative micro-batch or virtual stage";
  if (h.elements <= 0) return "has " + std::to_string(h.elements) + " elements";
  if (h.elements > max_elements_) {
    return "has " + std::to_string(h.elements) + " elements, more than the largest payload (" +
           std::to_string(max_elements_) + ")";
  }
  const bool bf16 = WireBf16(h.kind);
  const uint8_t dtype = bf16 ? StageWireHeader::kBf16 : StageWireHeader::kFloat32;
  if (h.dtype != dtype) {
    return std::string("travels as ") + DTypeName(h.dtype) + ", expected " + DTypeName(dtype) +
           " (cluster.pipeline_wire_dtype must be the same on every stage)";
  }
  const uint64_t want = static_cast<uint64_t>(h.elements) * (bf16 ? 2 : 4);
  if (bytes != want) {
    return "carries " + std::to_string(bytes) + " bytes, expected " + std::to_string(h.elements) + " elements of " +
           (bf16 ? "2" : "4") + " bytes (" + std::to_string(want) + ")";
  }
  if (h.step < step_) return "is older than this stage's step " + std::to_string(step_ + 1);
  if (h.step > step_ + 1) return "is more than one step ahead of this stage's step " + std::to_string(step_ + 1);
  return "";
}

void PipelineWire::OnMessage(PeerId from, std::string_view header, IncomingPayload& payload) {
  MutexLock lock(&mu_);
  auto refuse = [&](const std::string& why) REQUIRES(mu_) {
    payload.Reject();
    FailLocked(Status::Corruption(From(from) + why));
  };
  if (!failed_.ok()) return payload.Reject();
  if (header.size() != sizeof(StageWireHeader)) {
    return refuse("a header of " + std::to_string(header.size()) + " bytes, expected " +
                  std::to_string(sizeof(StageWireHeader)));
  }
  StageWireHeader h;
  std::memcpy(&h, header.data(), sizeof h);
  if (h.magic != StageWireHeader::kMagic || h.version != StageWireHeader::kVersion) {
    return refuse("not a pipeline header (magic " + Hex(h.magic) + " version " + std::to_string(h.version) +
                  ", expected " + Hex(StageWireHeader::kMagic) + " version " +
                  std::to_string(StageWireHeader::kVersion) + ")");
  }
  if (!KnownKind(h.kind)) return refuse("unknown kind " + std::to_string(h.kind));
  peers_.insert(from);
  const std::string what = Describe(h.kind, h.step, h.micro_batch, h.virtual_stage);
  if (const std::string bad = Check(h, payload.size()); !bad.empty()) return refuse(what + " " + bad);
  const Key key{from, h.kind, h.step, h.micro_batch, h.virtual_stage};
  auto w = waiters_.find(key);
  if (delivered_.count(key) != 0 || early_.count(key) != 0 || (w != waiters_.end() && w->second->matched)) {
    return refuse(what + " arrived twice");
  }
  if (w != waiters_.end()) {
    if (w->second->elements != h.elements) {
      return refuse(what + " has " + std::to_string(h.elements) + " elements, expected " +
                    std::to_string(w->second->elements));
    }
    w->second->matched = true;
    w->second->loss = h.loss;
    return Land(w->second, WireBf16(h.kind), From(from) + what, payload);
  }
  if (held_ >= max_early_) {
    return refuse(what + " arrived before its Receive while " + std::to_string(held_) +
                  " early messages are held, the most this wire keeps (max_early " + std::to_string(max_early_) +
                  ")");
  }
  KeepEarly(key, h, From(from) + what, payload);
}

void PipelineWire::Land(const std::shared_ptr<Waiter>& w, bool bf16, const std::string& where,
                        IncomingPayload& payload) {
  if (const void* eager = payload.eager_data(); eager != nullptr) {
    // The Receive is waiting: copied (converted) here, once.
    if (bf16) {
      Bf16ToFloats(static_cast<const uint16_t*>(eager), w->dst, w->elements);
    } else {
      std::memcpy(w->dst, eager, payload.size());
    }
    w->landed = true;
    cv_.SignalAll();
    return;
  }
  void* dst = w->dst;
  if (bf16) {
    w->staging = TakeBuffer(payload.size());
    dst = w->staging.data.get();
  } else {
    ++stats_.zero_copy;
  }
  payload.ReceiveInto(dst, [this, w, where](const Status& received) {
    MutexLock lock(&mu_);
    w->landed = true;
    if (!received.ok()) FailLocked(received.WithContext(where + ": "));
    cv_.SignalAll();
  });
}

void PipelineWire::KeepEarly(const Key& key, const StageWireHeader& h, const std::string& where,
                             IncomingPayload& payload) {
  auto e = std::make_shared<Early>();
  e->elements = h.elements;
  e->loss = h.loss;
  e->bf16 = WireBf16(h.kind);
  e->bytes = TakeBuffer(payload.size());
  ++held_;
  ++stats_.early;
  stats_.peak_held = std::max(stats_.peak_held, held_);
  early_[key] = e;
  if (const void* eager = payload.eager_data(); eager != nullptr) {
    std::memcpy(e->bytes.data.get(), eager, payload.size());
    e->arrived = true;
    cv_.SignalAll();
    return;
  }
  payload.ReceiveInto(e->bytes.data.get(), [this, e, where](const Status& received) {
    MutexLock lock(&mu_);
    e->arrived = true;
    e->status = received;
    if (e->dropped) {
      --held_;
      ReturnBuffer(std::move(e->bytes));
    } else if (!received.ok()) {
      FailLocked(received.WithContext(where + ": "));
    }
    cv_.SignalAll();
  });
}

// ---- failing --------------------------------------------------------------------

void PipelineWire::Fail(const Status& status) {
  MutexLock lock(&mu_);
  FailLocked(status);
}

void PipelineWire::FailLocked(const Status& status) {
  if (failed_.ok()) {
    failed_ = status.ok() ? Status::Aborted("pipeline wire: failed") : status;
    LOG(WARNING) << failed_.message();
  }
  // Held messages are no use now; ones still landing are freed by their
  // completion (or with the wire).
  for (auto& [key, e] : early_) DropEarly(*e);
  early_.clear();
  pool_.clear();
  cv_.SignalAll();
}

PipelineWire::Stats PipelineWire::stats() {
  MutexLock lock(&mu_);
  Stats s = stats_;
  s.held = held_;
  return s;
}

}  // namespace herd::transport
