// The wire between pipeline stages: for each micro-batch, stage s sends its
// output activations ([B*T, hidden] floats) to stage s+1, and in the
// backward pass s+1 sends the gradient with respect to them back to s,
// together with the micro-batch's loss from the last stage. The first and
// the last stage also swap their parts of a tied embedding's gradient.
// Each message is one UCX active message on kAmPipeline: a fixed-size
// header (StageWireHeader) and the payload, fp32 or, with a bf16 wire
// (cluster.pipeline_wire_dtype BF16), bf16 converted on both ends.
//
// Every message is checked before use: its header (size, magic, version,
// kind, dtype), its payload's size against its element count, its step
// against the receiver's (SetStep: the current one, or the next, which is
// kept until SetStep moves on), and that it is not a second copy of one
// delivered or held. One that does not fit fails the wire with one line
// naming the sender and what was wrong ("pipeline message from peer 3:
// activation for step 8 micro-batch 2 virtual stage 1 has 4096 elements,
// expected 8192"; steps counted from 1 there, as herd's logs count them).
// A failed wire fails every waiter and every later call with that status.
//
// A Receive posted before its message arrives lets the payload land in the
// caller's buffer directly (zero-copy by rendezvous in fp32; bf16 lands in
// a buffer of the wire's and is converted). A message that arrives first is
// kept ("early") in a buffer of the wire's and copied out by its Receive:
// at most max_early such buffers of max_elements floats, allocated when
// first needed and reused; one more arriving fails the wire.
//
// Threading: the handler and completions run on the transport's progress
// thread; Send, WaitSent, Receive, SetStep and Fail may be called from any
// thread (the training thread, in practice). Copies out of early buffers
// and bf16 conversions run on the caller's thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "transport/ucx_transport.h"

namespace herd::transport {

// Free of the push/pull (1-3) and ring (10-12) ids.
inline constexpr uint16_t kAmPipeline = 13;

// What a message between stages is: its header, validated on arrival
// against what the receiver expects.
struct StageMessage {
  enum Kind : uint8_t {
    kActivation = 1,  // forward: stage output, to the next virtual stage
    kGradient = 2,    // backward: gradient w.r.t. that output, back to the stage that sent it; carries the loss
    // A tied embedding's gradient part, between the first and the last
    // stage: always fp32 on the wire (both ends must add bitwise the same
    // values), whatever the wire's dtype.
    kEmbeddingGradient = 3,
    // The last stage's logits at a sampled sequence's last position, to
    // every other stage: fp32 too, so that every stage draws the same
    // token as one process.
    kLogits = 4,
  };
  Kind kind = kActivation;
  uint64_t step = 0;          // 0-based training step
  int32_t micro_batch = 0;
  int32_t virtual_stage = 0;  // the virtual stage that receives it
  int64_t elements = 0;       // floats of the payload (before any bf16 conversion)
  double loss = 0;            // gradients carry the micro-batch's loss back from the last stage
};

// "activation", "gradient", "embedding gradient", "logits"; "kind N" for others.
std::string StageMessageKindName(int kind);

// A message's header as it travels: little-endian, 40 bytes, no padding.
struct StageWireHeader {
  static constexpr uint32_t kMagic = 0x57504448;  // "HDPW" in memory
  static constexpr uint8_t kVersion = 1;
  enum DType : uint8_t { kFloat32 = 0, kBf16 = 1 };

  uint32_t magic = kMagic;
  uint8_t version = kVersion;
  uint8_t kind = 0;   // StageMessage::Kind
  uint8_t dtype = 0;  // DType of the payload
  uint8_t reserved = 0;
  int32_t micro_batch = 0;
  int32_t virtual_stage = 0;
  uint64_t step = 0;
  int64_t elements = 0;
  double loss = 0;
};
static_assert(sizeof(StageWireHeader) == 40, "StageWireHeader travels as is");

class PipelineWire {
 public:
  // Registers its handler for kAmPipeline on `transport` (construct before
  // peers may send) and fails itself when a peer it exchanges with fails.
  // `bf16`: activations and gradients travel as bf16, converted on both
  // ends; `max_elements`: the largest payload in floats (B*T*hidden, or a
  // tied embedding's gradient where larger): anything larger is refused;
  // `max_early`: messages it may hold that arrived before their Receive
  // (beyond that the wire fails with a line naming the sender).
  PipelineWire(UcxTransport* transport, bool bf16, int64_t max_elements, int max_early);
  // Shuts the transport down (as every service over it does): afterwards no
  // handler or completion runs, so the wire's buffers may go.
  ~PipelineWire();
  PipelineWire(const PipelineWire&) = delete;
  PipelineWire& operator=(const PipelineWire&) = delete;

  // Never 0 (callers may use 0 for "none").
  using Handle = uint64_t;

  // Sends `data` (header.elements floats) to `to`; `data` must stay valid
  // until WaitSent(handle) returns (bf16: the wire converts into a buffer of
  // its own and `data` may be reused at once). A bad header (kind,
  // elements, negative micro-batch or stage) shows in WaitSent. A send that
  // fails fails the wire.
  Handle Send(PeerId to, const StageMessage& header, const float* data) LOCKS_EXCLUDED(mu_);
  // Every handle must be waited for once. After a failure it returns at
  // once with the failure, while UCX may still read `data` until the send
  // completes or the transport shuts down.
  Status WaitSent(Handle handle) LOCKS_EXCLUDED(mu_);

  // Blocks until the message (kind, step, micro_batch, virtual_stage) from
  // `from` has landed in `dst` (header.elements floats); returns its loss.
  // expected.step must be the current step (SetStep). A message with a
  // different element count fails the wire (the line names both counts).
  // After a failure it returns at once with the failure, while a payload
  // already landing may still be written to `dst` until it completes or the
  // transport shuts down.
  StatusOr<double> Receive(PeerId from, const StageMessage& expected, float* dst) LOCKS_EXCLUDED(mu_);

  // The receiver's current step: messages for it and for the next are
  // taken, older ones fail the wire. Held messages and the memory of
  // delivered ones outside [step, step+1] are dropped (the former with a
  // warning: no Receive took them). Starts at 0.
  void SetStep(uint64_t step) LOCKS_EXCLUDED(mu_);
  uint64_t step() LOCKS_EXCLUDED(mu_);

  // Fails every waiter and every later call with `status` (a peer died,
  // the job stops). The first failure stays.
  void Fail(const Status& status) LOCKS_EXCLUDED(mu_);

  // For tests and logs.
  struct Stats {
    int waiting = 0;       // Receives blocked for a message that has not arrived
    int held = 0;          // early messages held now (buffers counted against max_early)
    int peak_held = 0;     // the most held at once
    int64_t zero_copy = 0; // payloads placed by UCX straight into a Receive's buffer
    int64_t early = 0;     // messages that arrived before their Receive
  };
  Stats stats() LOCKS_EXCLUDED(mu_);

 private:
  // A message's identity: who sent it, and what it is.
  struct Key {
    PeerId from;
    uint8_t kind;
    uint64_t step;
    int32_t micro_batch, virtual_stage;
    bool operator<(const Key& o) const {
      return std::tie(step, from, kind, micro_batch, virtual_stage) <
             std::tie(o.step, o.from, o.kind, o.micro_batch, o.virtual_stage);
    }
  };
  struct Buffer {
    std::unique_ptr<char[]> data;
    size_t size = 0;
  };
  struct Waiter;
  struct Early;
  struct SendOp;

  // Progress thread.
  void OnMessage(PeerId from, std::string_view header, IncomingPayload& payload) LOCKS_EXCLUDED(mu_);
  // What is wrong with a message's header and payload size, or "".
  std::string Check(const StageWireHeader& h, size_t bytes) const REQUIRES(mu_);
  // A message for a posted Receive: lands in its buffer (or, bf16
  // rendezvous, in a staging buffer).
  // `where`: the sender and the message, for error lines.
  void Land(const std::shared_ptr<Waiter>& w, bool bf16, const std::string& where, IncomingPayload& payload)
      REQUIRES(mu_);
  // A message ahead of its Receive: kept in a buffer of the wire's.
  void KeepEarly(const Key& key, const StageWireHeader& h, const std::string& where, IncomingPayload& payload)
      REQUIRES(mu_);
  // Forgets a held message; its buffer goes back once no landing writes it.
  void DropEarly(Early& e) REQUIRES(mu_);

  // Whether messages of `kind` travel as bf16 here.
  bool WireBf16(uint8_t kind) const {
    return bf16_ && kind != StageMessage::kEmbeddingGradient && kind != StageMessage::kLogits;
  }
  // What is wrong with a caller's header, or "".
  std::string CheckLocal(const StageMessage& m) const;
  Buffer TakeBuffer(size_t bytes) REQUIRES(mu_);
  void ReturnBuffer(Buffer buffer) REQUIRES(mu_);
  void FailLocked(const Status& status) REQUIRES(mu_);

  // Constant after construction.
  UcxTransport* const transport_;
  const bool bf16_;
  const int64_t max_elements_;
  const int max_early_;
  const size_t buffer_bytes_;  // of a pooled buffer: max_elements at the wire's dtype

  Mutex mu_;
  CondVar cv_;  // a message landed or arrived, a send completed, the wire failed
  uint64_t step_ GUARDED_BY(mu_) = 0;
  std::map<Key, std::shared_ptr<Waiter>> waiters_ GUARDED_BY(mu_);  // posted Receives
  std::map<Key, std::shared_ptr<Early>> early_ GUARDED_BY(mu_);     // held messages
  std::set<Key> delivered_ GUARDED_BY(mu_);  // received, of steps step_ and step_+1
  int held_ GUARDED_BY(mu_) = 0;             // early buffers out (held or still landing)
  std::vector<Buffer> pool_ GUARDED_BY(mu_); // idle pooled buffers
  std::map<Handle, std::unique_ptr<SendOp>> sends_ GUARDED_BY(mu_);
  Handle next_handle_ GUARDED_BY(mu_) = 1;
  std::set<PeerId> peers_ GUARDED_BY(mu_);   // sent to or received from: their failure fails the wire
  Stats stats_ GUARDED_BY(mu_);
  Status failed_ GUARDED_BY(mu_);
};

}  // namespace herd::transport
