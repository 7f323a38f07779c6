// Which shares of the global batch each worker of an elastic
// parameter-server job computes (cluster.elastic).
//
// The global batch of a step is cluster.workers shares, share r being the
// sequences rank r's sampler takes (data/sampler.h); the servers sum the
// shares in share order whoever computed them (server/parameter_shard.h).
// While every worker lives, each computes its own share. When workers are
// lost, their shares ("orphans", ascending) are dealt to the live workers
// (ascending ranks) in turn: orphan i goes to live worker i mod L. Every
// worker derives the same assignment from the same membership, so the
// global batch, the data order and the sums stay those of the
// uninterrupted run.
//
// A loss counts as soon as a worker hears of it (the shares it had are
// taken over mid-step; the servers drop what arrives twice). A join counts
// from a step boundary all agree on: the step after the one whose report
// (server 0's) carries the join's epoch or a later one. The servers stamp
// their reports with the newest epoch they have acted on, and the joiner
// is welcomed only after they have, so it starts from that step.
#pragma once

#include <functional>
#include <map>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "transport/coordinator_client.h"

namespace herd {

class ElasticShares {
 public:
  // `shares`: cluster.workers; `rank`: this worker's; `welcomed`: the
  // membership it was welcomed into (the coordinator client's).
  ElasticShares(int shares, int rank, const transport::WelcomedMembership& welcomed);

  // The shares `rank` computes when `live` (ascending ranks) are alive.
  static std::vector<int> Assign(int shares, const std::vector<int>& live, int rank);

  // On the coordinator client's thread: the membership changed.
  void Apply(const transport::MembershipChange& change);

  // cluster.workers: the shares of every step's global batch.
  int shares() const { return shares_; }
  // The newest membership epoch known here (0: no change).
  int epoch() const;
  // Blocks until the changes through `epoch` are known here; `health`
  // (checked every 50 ms) ends the wait with its error.
  Status AwaitEpoch(int epoch, const std::function<Status()>& health) const LOCKS_EXCLUDED(mu_);
  // The changes after epoch `epoch`, in order.
  std::vector<transport::MembershipChange> ChangesSince(int epoch) const;
  // The shares this worker computes, ascending, of a step dealt at
  // membership epoch `stamp` (the epoch the previous step's report
  // carries): every loss known here counts, joins of epochs up to `stamp`.
  std::vector<int> Mine(int stamp) const;
  // The epoch at which this worker joined (0: it has been there since the
  // job formed).
  int joined_at() const { return joined_at_self_; }
  // The worker that prints progress and evaluates: of the live ones, the
  // longest there (lowest join epoch), then the lowest rank.
  int leader() const;

 private:
  std::vector<int> LiveAt(int stamp) const REQUIRES(mu_);

  // Constant after construction.
  const int shares_, rank_;
  const transport::WelcomedMembership welcomed_;
  int joined_at_self_ = 0;

  mutable Mutex mu_;
  mutable CondVar cv_;  // a change applied
  std::vector<transport::MembershipChange> changes_ GUARDED_BY(mu_);
  std::map<int, int> joined_at_ GUARDED_BY(mu_);  // live rank -> join epoch
};

}  // namespace herd
