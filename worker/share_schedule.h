// Which shares of a step's global batch this worker computes, and what it
// does while it waits for the weights a step makes. The step loop asks,
// and never knows which schedule it has.
//
//   FixedShare: the same share every step (a worker's rank; a pipeline
//     stage's, its replica's); worker 0 leads (prints progress,
//     evaluates, samples).
//   ElasticSchedule (cluster.elastic, parameter-server mode): the shares
//     follow the job's membership (worker/elastic_shares.h), settled at
//     each step boundary once the weights are in; while it waits for a
//     step's weights it computes the shares of workers lost meanwhile; the
//     lead passes on when the leader is lost.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "common/status.h"
#include "data/sampler.h"
#include "transport/coordinator_client.h"
#include "worker/elastic_shares.h"
#include "worker/reducers/sync_strategy.h"
#include "worker/share_compute.h"

namespace herd {

class ShareSchedule {
 public:
  // Computes `shares` of step t again: draws them from `sampler` (a copy
  // at the step's data position) and computes each.
  using Redo = std::function<Status(int64_t t, const std::vector<int>& shares, DistributedSampler& sampler)>;

  virtual ~ShareSchedule() = default;

  // The most shares one step may give this worker.
  virtual int max_shares() const = 0;
  // Whether this worker prints progress, evaluates and samples. It may
  // become true during the run (never false again).
  virtual bool leads() const = 0;

  // The shares this worker computes of step t (0-based), ascending, drawn
  // from the sampler's current position; may settle `previous` first.
  virtual StatusOr<std::vector<int>> SharesOf(int64_t t, StepBoundary& previous) = 0;
  // Blocks until every weight of `version` is in. `made_here`: a step of
  // this run made it, so shares of that step may have to be redone.
  virtual Status AwaitWeights(int64_t version, bool made_here, const Redo& redo) = 0;
};

std::unique_ptr<ShareSchedule> FixedShare(SyncStrategy& sync, int share, bool leads);

struct ElasticScheduleParts {
  const ElasticShares* shares = nullptr;
  SyncStrategy* sync = nullptr;
  const DistributedSampler* sampler = nullptr;  // this worker's, as the loop draws from it
  const transport::CoordinatorClient* client = nullptr;
  int rank = 0;
};
std::unique_ptr<ShareSchedule> ElasticSchedule(const ElasticScheduleParts& parts);

}  // namespace herd
