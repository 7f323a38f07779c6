// The outer steps' wire between regions (cluster.diloco): for each
// exchange — the inner step after which it was sent and its fragment —
// every server sends its contribution (its run of the fragment's
// pseudo-gradient: fp32 or bf16 values, or block codes) to the same
// range's server of every other region, and sums the regions'
// contributions in region order, its own included. Point to point rather
// than a ring: the sum is the same bits in every region whichever order
// the contributions arrive in, and no region's contribution passes
// through another's server.
//
// Each contribution is one UCX active message on kAmOuter: a fixed-size
// header (OuterWireHeader) and the payload. Every message is checked
// before it is kept: its header (size, magic, version), that its sender is
// the server of the region it names, its payload kind (the wire's), its
// fragment (one this server has a part of) and its payload's size (that
// fragment's here), that its exchange was not summed already, that it is
// not a second copy of one held, and that its sender has at most
// kHeldPerRegion exchanges held (a region runs at most one exchange ahead
// of another: it cannot land the one in flight without this server's
// contribution). One that does not fit fails the wire with one line naming
// the sender and what was wrong ("outer wire: region 1's server (peer 3):
// step 10 fragment 0 carries 4096 bytes, expected 8192"; steps counted
// from 1, as herd's logs count them). A failed wire fails every waiter and
// every later call with that status.
//
// A region can be lost (Lose: the coordinator let it go): the wire waits
// for none of its contributions from then on, drops what it still sends,
// and a send to it that fails is no error. A region's server whose
// endpoint fails or whose send fails is only unreachable until the
// coordinator says whether it was lost; one still unreachable and not lost
// after unreachable_timeout_s fails the wire. Which regions an exchange
// counts is the caller's to agree with the others (Await, then a vote, then
// Sum): every region has the contributions of the regions that no server
// knew lost when it was ready.
//
// Threading: the handler and completions run on the transport's progress
// thread; Send, Sum and Fail may be called from any thread (the exchange's,
// in practice), one exchange at a time.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "common/mutex.h"
#include "common/ring_memory.h"
#include "common/status.h"
#include "transport/ucx_transport.h"

namespace herd::transport {

// Free of the push/pull (1-3), ring (10-12, 14) and pipeline (13) ids.
inline constexpr uint16_t kAmOuter = 15;
inline constexpr uint16_t kAmOuterState = 16;

// A contribution's header as it travels: little-endian, 32 bytes.
struct OuterWireHeader {
  static constexpr uint32_t kMagic = 0x4f445248;  // "HRDO" in memory
  static constexpr uint8_t kVersion = 1;

  uint32_t magic = kMagic;
  uint8_t version = kVersion;
  uint8_t payload = 0;  // OuterWire::Payload
  uint16_t reserved = 0;
  int32_t region = 0;    // the sender's
  int32_t fragment = 0;
  uint64_t step = 0;     // 0-based: the inner step after which it was sent
  int64_t bytes = 0;     // of the payload
};
static_assert(sizeof(OuterWireHeader) == 32, "OuterWireHeader travels as is");

// A rejoining region's state's header (SendState): little-endian, 16 bytes.
struct OuterStateHeader {
  static constexpr uint32_t kMagic = 0x53445248;  // "HRDS" in memory
  static constexpr uint8_t kVersion = 1;

  uint32_t magic = kMagic;
  uint8_t version = kVersion;
  uint8_t reserved[3] = {0, 0, 0};
  int32_t region = 0;  // the sender's
  int32_t to = 0;      // the region it is for
};
static_assert(sizeof(OuterStateHeader) == 16, "OuterStateHeader travels as is");

class OuterWire {
 public:
  enum class Payload : uint8_t { kFloat32 = 0, kBf16 = 1, kCodes = 2 };
  // Exchanges a region's sender may have held here at once.
  static constexpr int kHeldPerRegion = kOuterHeldPerRegion;

  struct Options {
    int region = 0;             // this server's
    std::vector<PeerId> peers;  // [k]: region k's server of this range (this region's entry unused)
    Payload payload = Payload::kFloat32;
    // [f]: the bytes of fragment f's contribution here; 0 where this
    // server has no part of f (no contribution is sent or expected).
    std::vector<int64_t> fragment_bytes;
    // How long a region's server may be unreachable without the
    // coordinator declaring it lost.
    double unreachable_timeout_s = 30;
    // A server of a region rejoining the job: the bytes of the state it
    // awaits (AwaitState; exactly these); 0: it awaits none, and one that
    // arrives fails the wire.
    int64_t state_bytes = 0;
  };

  // Registers its handler for kAmOuter on `transport` (construct before
  // peers may send) and watches `peers`' endpoints.
  OuterWire(UcxTransport* transport, Options options);
  // Shuts the transport down (as every service over it does): afterwards no
  // handler or completion runs, so the wire's buffers may go.
  ~OuterWire();
  OuterWire(const OuterWire&) = delete;
  OuterWire& operator=(const OuterWire&) = delete;

  int regions() const { return static_cast<int>(options_.peers.size()); }
  int region() const { return options_.region; }

  // Sends `data` (fragment_bytes[fragment] bytes, copied: the caller may
  // reuse it at once) to every other region's server not lost, and returns
  // once every send completed (or the wire failed).
  Status Send(uint64_t step, int fragment, const void* data) LOCKS_EXCLUDED(mu_);

  // Blocks until every region not lost has its contribution to (step,
  // fragment) here; returns which regions have (this one's included).
  StatusOr<std::vector<bool>> Await(uint64_t step, int fragment) LOCKS_EXCLUDED(mu_);
  // Calls add(k, bytes) for the regions `counted` names (this one's, if
  // named, with `mine`), in region order; stops at the first error `add`
  // returns (named with the region). Every contribution to the exchange
  // goes back afterwards, and later messages for it, or an earlier one,
  // fail the wire. A counted region whose contribution is not here is an
  // error: the vote that counted it was wrong.
  Status Sum(uint64_t step, int fragment, const void* mine, const std::vector<bool>& counted,
             const std::function<Status(int region, const void* bytes)>& add) LOCKS_EXCLUDED(mu_);

  // The coordinator let `region` go.
  void Lose(int region) LOCKS_EXCLUDED(mu_);
  // `region`, lost, rejoined the job (with another process as its server):
  // its contributions to the exchanges after the last summed are awaited
  // again.
  void Rejoin(int region) LOCKS_EXCLUDED(mu_);
  // [k]: whether region k is in the job here (not lost; this one's true).
  std::vector<bool> InJob() LOCKS_EXCLUDED(mu_);

  // A region rejoining takes up the job's state from the same range's
  // server of a region that goes on: sends `bytes` to region
  // `to`'s, and returns once the send completed (its error, if it
  // failed).
  Status SendState(int to, const std::string& bytes) LOCKS_EXCLUDED(mu_);
  // Blocks until the state (state_bytes of it) has arrived from another
  // region's server, for at most `timeout_s`; returns the sender's region
  // and the bytes. The caller checks what the bytes say.
  StatusOr<std::pair<int, std::string>> AwaitState(double timeout_s) LOCKS_EXCLUDED(mu_);
  // Fails every waiter and every later call with `status` (the job
  // stops). The first failure stays.
  void Fail(const Status& status) LOCKS_EXCLUDED(mu_);

  // For tests.
  struct Stats {
    int held = 0;          // contributions held now (landed or landing)
    int peak_held = 0;
    int64_t received = 0;  // contributions taken
  };
  Stats stats() LOCKS_EXCLUDED(mu_);

 private:
  // An exchange: in the order exchanges happen.
  using Exchange = std::tuple<uint64_t, int32_t>;  // step, fragment
  struct Held {
    std::unique_ptr<char[]> bytes;
    bool landed = false;
  };

  // Progress thread.
  void OnMessage(PeerId from, std::string_view header, IncomingPayload& payload) LOCKS_EXCLUDED(mu_);
  void OnState(PeerId from, std::string_view header, IncomingPayload& payload) LOCKS_EXCLUDED(mu_);
  // What is wrong with a message's header and payload size, or "".
  std::string Check(PeerId from, const OuterWireHeader& h, size_t bytes) const REQUIRES(mu_);
  // "region 1's server (peer 3): " or "peer 3: ".
  std::string Sender(PeerId from) const;
  void FailLocked(const Status& status) REQUIRES(mu_);
  // Region k's server could not be reached: a failure once it has been so
  // for unreachable_timeout_s without being lost.
  void UnreachableLocked(int k, const Status& why) REQUIRES(mu_);

  // Constant after construction.
  UcxTransport* const transport_;
  const Options options_;

  Mutex mu_;
  CondVar cv_;  // a contribution landed, a send completed, the wire failed
  // [region]: its contributions held, by exchange.
  std::vector<std::map<Exchange, Held>> held_ GUARDED_BY(mu_);
  // [region]: the coordinator let it go; its endpoint or a send to it
  // failed (and since when, and why) and it was not let go yet.
  std::vector<bool> lost_ GUARDED_BY(mu_);
  std::vector<std::optional<std::chrono::steady_clock::time_point>> unreachable_since_ GUARDED_BY(mu_);
  std::vector<Status> unreachable_why_ GUARDED_BY(mu_);
  // The last exchange summed: anything at or before it is stale.
  bool summed_any_ GUARDED_BY(mu_) = false;
  Exchange last_summed_ GUARDED_BY(mu_){0, 0};
  // Send's copy of the contribution, which UCX reads until the sends
  // complete or the transport shuts down; sends not yet completed.
  std::unique_ptr<char[]> outgoing_ GUARDED_BY(mu_);
  int sending_ GUARDED_BY(mu_) = 0;
  Stats stats_ GUARDED_BY(mu_);
  // A rejoining region's server: the state, once it started arriving
  // (its sender's region), and whether it has landed.
  std::string state_ GUARDED_BY(mu_);
  int state_from_ GUARDED_BY(mu_) = -1;
  bool state_landed_ GUARDED_BY(mu_) = false;
  Status failed_ GUARDED_BY(mu_);
};

}  // namespace herd::transport
