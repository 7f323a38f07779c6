// Collectives for CPU buffers over the UCX data plane: a ring, as in
// NCCL's and gloo's ring algorithms. All-reduce is a reduce-scatter then an
// all-gather; each of the W-1 ring steps moves one part of the buffer to
// the right-hand neighbour, cut into chunks that flow independently, so a
// chunk is forwarded as soon as it has been reduced while the next ones are
// still on the wire (several chunks of several operations in flight).
//
// Summation order: part k of the sum is accumulated along the ring starting
// at rank k+1 and ending at rank k, the same on every run; the all-gather
// then copies that one result everywhere, so every rank holds bitwise the
// same values. Received gather/broadcast chunks land in place (zero-copy
// for large chunks); reduce chunks land in a scratch buffer and are added.
// With a bf16 wire (Wire::kBf16) every chunk travels as bf16 through
// pooled buffers, and sums are added in fp32.
//
// Every incoming message is checked against the operation it names
// (sequence, phase, step, chunk, length) before use; one that does not fit
// fails the operations with a line saying why. Messages for an operation
// this rank has not started yet are kept until it starts, bounded: a rank
// tells its left-hand neighbour each operation it starts ("ready", in
// sequence order), and a rank sends at most kRingChunksAhead chunks
// (common/ring_memory.h) to a right-hand neighbour that has not said so,
// and kRingChunksInFlight at most at once. Eager chunks are added (or
// copied into place) straight from the transport's buffer. So a rank
// holds at most kRingChunkBuffers chunk buffers beside its callers'
// buffers, however late it issues.
#pragma once

#include <map>
#include <memory>
#include <vector>

#include "common/mutex.h"
#include "common/ring_memory.h"
#include "transport/collectives.h"
#include "transport/ucx_transport.h"

namespace herd::transport {

// A process may run several rings over one transport (the job's; hybrid
// sharding's shard group and replicas; a group along some of the grid's
// axes, any number of them), each on an AM id of its own: group ring g
// (0 <= g < kGroupRings) on kAmGroupRings + g.
inline constexpr uint16_t kAmRing = 10;
inline constexpr uint16_t kAmShardRing = 11;
inline constexpr uint16_t kAmReplicaRing = 12;
inline constexpr uint16_t kAmGroupRings = 20;
inline constexpr int kGroupRings = 32;
static_assert(kAmGroupRings + kGroupRings <= kAmIdLimit, "group rings beyond the transport's AM ids");

class RingCollectives : public Collectives {
 public:
  // `peers[r]` is rank r's PeerId on `transport` (connected both ways to
  // this rank's ring neighbours). Registers its handler for `am_id`:
  // construct before peers may send. `chunk_bytes`: the pipelining grain.
  RingCollectives(UcxTransport* transport, int rank, std::vector<PeerId> peers, int64_t chunk_bytes = kRingChunkBytes,
                  uint16_t am_id = kAmRing);
  ~RingCollectives() override;

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(peers_.size()); }
  Handle AllReduce(void* data, int64_t n, DType dtype, Wire wire = Wire::kFloat32) override;
  Handle ReduceScatter(float* data, const Partition& parts, Wire wire = Wire::kFloat32) override;
  Handle AllGather(float* data, const Partition& parts) override;
  Handle Broadcast(float* data, int64_t n, int root) override;
  Status Wait(Handle handle) override;
  void Fail(const Status& status) override;

  // The most chunk buffers this ring has held at once (for tests; at most
  // kRingChunkBuffers).
  int peak_chunk_buffers();

 public:
  struct Op;           // an operation in flight (ring_collectives.cc)
  struct ChunkHeader;  // a message's header

 private:
  struct Early;
  Handle Issue(std::unique_ptr<Op> op) LOCKS_EXCLUDED(mu_);
  // Progress thread. An Op's fields, once Issue has published it in ops_,
  // are read and written under mu_ too.
  void Start(Op& op) REQUIRES(mu_);
  void OnMessage(PeerId from, std::string_view header, IncomingPayload& payload) LOCKS_EXCLUDED(mu_);
  // A chunk of (phase, step) has arrived: `bytes` holds it for reduce
  // chunks and early arrivals, null when it landed in place.
  void OnChunk(Op& op, int phase, int step, int64_t chunk, const void* bytes) REQUIRES(mu_);
  // Sends a chunk as soon as it may: fewer than kRingChunksInFlight sends
  // in flight, and, if the right-hand neighbour has not started `op`,
  // fewer than kRingChunksAhead chunks ahead of it.
  void SendChunk(Op& op, int phase, int step, int64_t chunk) REQUIRES(mu_);
  // Whether a chunk of operation `seq` may go now.
  bool MayGo(uint64_t seq) const REQUIRES(mu_);
  // Sends a chunk that may go, counting it in flight (and ahead).
  void Dispatch(Op& op, int phase, int step, int64_t chunk) REQUIRES(mu_);
  // Sends the held chunks that may go now, in order.
  void SendHeld() REQUIRES(mu_);
  void Transmit(Op& op, int phase, int step, int64_t chunk) REQUIRES(mu_);
  // The right-hand neighbour has started operation `seq`: the chunks sent
  // ahead of it are its own now.
  void OnReady(uint64_t seq) REQUIRES(mu_);
  // The part a received chunk belongs to, or -1 when `op` expects no such
  // chunk (wrong phase, step, index or length).
  int ExpectedChunk(const Op& op, const ChunkHeader& h, size_t bytes) const REQUIRES(mu_);
  // Receives a chunk of an operation not started here yet (checked to be
  // one that can be expected, within the bound) to apply when it starts.
  void KeepEarly(const ChunkHeader& h, IncomingPayload& payload) REQUIRES(mu_);
  // Applies the chunks of `op` that arrived before it started.
  void TakeEarly(Op& op) REQUIRES(mu_);
  // Chunk-sized receive (and bf16 send) buffers, pooled.
  std::unique_ptr<char[]> TakeBuffer() REQUIRES(mu_);
  void ReturnBuffer(std::unique_ptr<char[]> buffer) REQUIRES(mu_);
  // Back to the pool: `buf`, one of `op`'s scratch buffers.
  void ReturnScratch(Op& op, char* buf) REQUIRES(mu_);
  void Settle(Op& op) REQUIRES(mu_);
  void FailLocked(const Status& status) REQUIRES(mu_);

  // Constant after construction.
  UcxTransport* const transport_;
  const int rank_;
  const std::vector<PeerId> peers_;
  const int64_t chunk_bytes_;
  const uint16_t am_id_;

  Mutex mu_;
  CondVar cv_;  // an operation done
  std::map<uint64_t, std::unique_ptr<Op>> ops_ GUARDED_BY(mu_);                    // issued, not yet waited for
  std::map<uint64_t, std::vector<std::shared_ptr<Early>>> early_ GUARDED_BY(mu_);  // messages ahead of their op
  int64_t early_bytes_ GUARDED_BY(mu_) = 0;
  std::vector<std::unique_ptr<char[]>> pool_ GUARDED_BY(mu_);
  int buffers_out_ GUARDED_BY(mu_) = 0;  // chunk buffers taken and not returned
  int peak_buffers_ GUARDED_BY(mu_) = 0;
  uint64_t next_seq_ GUARDED_BY(mu_) = 0;
  // Flow control towards the right-hand neighbour: the operations it has
  // started (seq < right_started_), the chunks sent to it ahead of that,
  // per operation, and the chunks held back (in order).
  struct HeldChunk {
    uint64_t seq;
    int phase, step;
    int64_t chunk;
  };
  uint64_t right_started_ GUARDED_BY(mu_) = 0;
  std::map<uint64_t, int> chunks_ahead_ GUARDED_BY(mu_);
  int total_ahead_ GUARDED_BY(mu_) = 0;
  int sends_in_flight_ GUARDED_BY(mu_) = 0;
  std::vector<HeldChunk> held_ GUARDED_BY(mu_);
  Status failed_ GUARDED_BY(mu_);
};

}  // namespace herd::transport
