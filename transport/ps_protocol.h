// The parameter-server protocol's payloads: what the push/pull requests of
// kind kLoss and kReport carry (transport/push_pull.h), byte for byte on
// the wire. Each is a fixed-size POD; a receiver checks the size before it
// reads one, and the fields before it uses them (server/parameter_shard.cc
// for ShareLoss, worker/reducers/parameter_server_sync.cc for StepReport).
// StepReport is also how every other mode's SyncStrategy reports a step.
#pragma once

#include <cstdint>

#include "model/optim/spike_guard.h"

namespace herd {

// Where the training data stands after a step's draw (data/sampler.h's
// global position): the same for every share of the step, whoever drew it.
struct DataPosition {
  int64_t epoch = 0, taken = 0;
  int64_t tokens = 0;  // the size of the training file it is a position in
  bool operator==(const DataPosition& o) const {
    return epoch == o.epoch && taken == o.taken && tokens == o.tokens;
  }
};

// What a worker pushes to server 0 for each share it computed of a step (a
// loss push, transport/push_pull.h).
struct ShareLoss {
  double loss = 0;  // the share's mean loss
  DataPosition data;
};
static_assert(sizeof(ShareLoss) == 32);

// What a server reports about the step that produced weights `version`
// (pulled as a report request, transport/push_pull.h).
struct StepReport {
  uint64_t version = 0;  // optimizer steps applied
  double grad_norm = 0;  // global, before clipping
  double lr = 0;
  double mean_loss = 0;  // over workers, summed in rank order (server 0)
  DataPosition data;     // after the step's draw (server 0)
  // Server 0, in an elastic job: the membership changes it had seen when the
  // step was done. The next step's shares are dealt by the membership of
  // this epoch, so a worker that joined later starts a step later.
  int64_t membership_epoch = 0;
  // The spike guard (optimizer.skip_spikes_zscore) skipped this step's
  // update; the loss's and the norm's z-scores it judged.
  int32_t skipped = 0;
  float loss_z = 0, norm_z = 0;
};
static_assert(sizeof(StepReport) == 80);

// The report of step `step` taken with these scalars (the data position
// and membership epoch are the caller's to fill in).
StepReport ReportOf(int64_t step, double grad_norm, double lr, double mean_loss, const SpikeVerdict& spike);

}  // namespace herd
