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
#pragma once

#include <mutex>
#include <vector>

#include "transport/coordinator_client.h"

namespace herd {

class ElasticShares {
 public:
  // `shares`: cluster.workers; `rank`: this worker's.
  ElasticShares(int shares, int rank);

  // The shares `rank` computes when `live` (ascending ranks) are alive.
  static std::vector<int> Assign(int shares, const std::vector<int>& live, int rank);

  // On the coordinator client's thread: the membership changed.
  void Apply(const transport::MembershipChange& change);

  // The number of changes seen so far (0: none).
  int epoch() const;
  // The changes after epoch `epoch`, in order.
  std::vector<transport::MembershipChange> ChangesSince(int epoch) const;
  // The shares this worker computes under the latest membership, ascending.
  std::vector<int> Mine() const;
  // The lowest live rank: the worker that prints progress and evaluates.
  int leader() const;

 private:
  const int shares_, rank_;
  mutable std::mutex mu_;
  std::vector<int> live_;               // GUARDED_BY(mu_)
  std::vector<transport::MembershipChange> changes_;  // GUARDED_BY(mu_)
};

}  // namespace herd
