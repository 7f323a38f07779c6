// A server's part in a job of regions (cluster.diloco): DiLoCo's outer
// steps of its range, fragment by fragment as the DilocoPlan schedules
// them, with the same range's servers of the other regions over the outer
// wire (transport/outer_wire.h).
//
// After an inner step that sends a fragment, its pseudo-gradient is taken
// from the region's weights at once (rounded or quantised, the error kept,
// per cluster.diloco.wire_dtype); the sum over the regions and the outer
// step run on a thread of their own while the inner steps go on (overlap
// > 0) or before the step's weights are served (overlap 0). After the
// step it lands on, the fragment's weights become the new outer weights.
// Every region sums the same contributions in region order, so every
// region lands the same bits. A contribution is checked before it is
// added: fp32 and bf16 values must be finite, block codes as
// AddDequantized checks them.
//
// A region the coordinator let go (Lose) is left out of every exchange
// from then on. Which regions an exchange counts, the servers agree on:
// once a server has the contributions of every region it knows live, it
// votes (a coordinator all-gather over the servers); a region counts when
// its server's vote is in the result, which the coordinator leaves empty
// for a server it has let go by then. A region that counts was live when
// every server voted, so every server has its contribution; every region
// still adds the same contributions, and lands the same bits.
//
// A region lost can rejoin (its processes started again with --join; the
// coordinator admits them, transport/coordinator.cc). Each server that has
// heard of it (Heard) names it in its votes; the exchange every counted
// voter names it in admits it. Once that exchange has landed (the same
// step everywhere: the first After that ends with no exchange in flight),
// every server awaits its contributions again (Admit), and the same
// range's server of the first region that exchange counted gives it the
// job's state (server/region_state.h): the new outer weights, which become
// its weights, the outer momentum and that server's inner AdamW state. It
// counts from the next exchange on. The votes name their voters (the
// servers of the regions in the job here: CoordinatorClient::AllGather),
// so that a rejoined region's servers are waited for exactly from then.
#pragma once

#include <cstdint>
#include <future>
#include <memory>
#include <optional>
#include <set>
#include <vector>

#include "common/config.h"
#include "common/mutex.h"
#include "common/status.h"
#include "model/optim/outer_optimizer.h"
#include "sharding/diloco_plan.h"
#include "transport/coordinator_client.h"
#include "transport/outer_wire.h"

namespace herd {

class OuterSteps {
 public:
  // `server`: this server's index in its region's plan. `landing`: an
  // exchange whose outer step the optimizer's state already holds (a
  // checkpoint taken while it was in flight), to land when it is due.
  // `wire`: made from WireOptions; `client`: the servers' votes go
  // through it (a region's servers are `region_servers` consecutive
  // ranks).
  OuterSteps(const config::DilocoConfig& diloco, DilocoPlan plan, int server, int region_servers,
             std::unique_ptr<OuterOptimizer> outer, transport::OuterWire* wire, transport::CoordinatorClient* client,
             std::optional<DilocoPlan::Exchange> landing);
  // Waits for the exchange in flight (Abandon first where the wire may
  // never finish it).
  ~OuterSteps();

  // The outer wire this server's contributions travel on: `peers[k]` is
  // region k's server of the same range.
  static transport::OuterWire::Options WireOptions(const config::DilocoConfig& diloco, const DilocoPlan& plan,
                                                   int server, int region, std::vector<transport::PeerId> peers);

  // Whether After(step) changes the weights served for the next step (a
  // fragment sent with no overlap, or one that lands).
  bool Replaces(int64_t step) const;
  // The step thread, after inner step `step`'s update and before its
  // weights are served: lands what is due, sends what the plan sends.
  // Errors: the wire's (a lost region), or a contribution that fails its
  // check.
  Status After(int64_t step, float* weights);
  // Waits until the exchange in flight has taken its outer step (not
  // landed): the optimizer's state is then a checkpoint's.
  Status Settle();
  // Fails the wire with `why`, so that an exchange in flight ends.
  void Abandon(const Status& why);
  // The coordinator let `region` go (any thread): it is left out, and no
  // longer heard rejoining.
  void Lose(int region) LOCKS_EXCLUDED(heard_mu_);
  // The coordinator admitted `region`, rejoining (any thread): this
  // server names it in its votes from now on.
  void Heard(int region) LOCKS_EXCLUDED(heard_mu_);
  // Step thread, after After(step): the regions the exchange that landed
  // by then admitted and that are not lost since; they are in the job
  // from now on (their contributions awaited from the next exchange on).
  std::vector<int> Admit() LOCKS_EXCLUDED(heard_mu_);
  // A region rejoining: the regions out of the job (state.in_job false),
  // and the last exchange's count.
  void StartFrom(const std::vector<bool>& in_job, const std::vector<bool>& counted);

  const OuterOptimizer& optimizer() const { return *outer_; }
  transport::OuterWire& wire() { return *wire_; }
  // [k]: whether the last exchange's vote counted region k (every region
  // before the first); read after Settle, when every server has voted as
  // often.
  const std::vector<bool>& live_regions() const { return live_; }

 private:
  // This server's run of the exchange's fragment(s).
  ParamRange RunOf(int fragment) const { return plan_.RunOf(server_, fragment); }
  // Step thread: the pseudo-gradient of `run` of `weights`, as the wire
  // carries it, into mine_.
  Status Take(const ParamRange& run, const float* weights);
  // Sends what Take left, sums the contributions to exchange (step,
  // fragment) of the regions the servers' vote counts, and takes the outer
  // step.
  Status SumAndStep(const ParamRange& run, int64_t step, int fragment);
  // The servers' vote on exchange (step, fragment): [k], whether region k
  // counts.
  StatusOr<std::vector<bool>> Vote(int64_t step, int fragment);
  // Adds one region's contribution to `run` to sum_, checked.
  Status Add(const void* bytes, const ParamRange& run);
  // The fragment's weights become the outer weights.
  void Land(const ParamRange& run, float* weights) const;

  // Constant after construction.
  const config::DilocoConfig::WireDtype wire_dtype_;
  const DilocoPlan plan_;
  const int server_;
  const int region_servers_;

  // Owned by the step thread, and by the exchange's thread while one is in
  // flight (exchange_ valid): the outer state, this server's contribution
  // as it travels (fp32, bf16 or codes, in words of 4 bytes) and the
  // regions' sum.
  std::unique_ptr<OuterOptimizer> outer_;
  transport::OuterWire* const wire_;
  transport::CoordinatorClient* const client_;
  std::vector<float> mine_;
  std::vector<float> sum_;
  std::optional<DilocoPlan::Exchange> in_flight_;
  std::vector<bool> live_;
  // The regions the votes since the last landing admitted (written by the
  // exchange's thread: read once nothing is in flight).
  std::vector<int> voted_in_;
  Status failed_;  // the last exchange's, once settled
  // Regions heard rejoining and not admitted yet (the coordinator's thread
  // adds, the exchange's reads).
  Mutex heard_mu_;
  std::set<int> heard_ GUARDED_BY(heard_mu_);
  // Last: its destructor waits for the thread that uses the above.
  std::future<Status> exchange_;
};

}  // namespace herd
