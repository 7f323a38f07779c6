// One parameter server's state and its synchronous step: the fp32 master
// weights, AdamW moments and step count of one range of the flat parameter
// space (ZeRO-style: no process holds the whole optimizer state).
//
// Step t, as seen from here:
//   1. each of the W shares of the global batch (a worker's sequences;
//      transport::PushTag) arrives once per bucket, tagged with step t and
//      the share; the W contributions to a bucket are summed in share
//      order (a fixed order: reruns are bitwise identical, and so is a run
//      whose shares moved to other workers) as soon as that order allows;
//   2. the step thread (ServeSteps) gets the shard's partial squared norm,
//      combines the partials of all servers into the global norm, checks
//      it, and clips and applies AdamW bucket by bucket in ascending order
//      (with stream_updates, each bucket as soon as its sum is complete,
//      before the norm is known);
//   3. pulls tagged t+1 wait until their bucket has been stepped and are
//      answered while other buckets are still being stepped.
//
// Everything a worker sends is checked before use: who sent it, the step it
// belongs to, that it is exactly one of this server's buckets, that no
// share of a bucket is added twice, (unless elastic) that a worker pushes
// only its own share, and that every share of a step was drawn from the
// same data position. A bad push or pull is answered with an error naming
// it.
//
// Threads: the push/pull callbacks run on the transport's progress thread,
// ServeSteps (or WaitForGradients/ApplyStep) on the server's step thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

#include "model/optim/optimizer_shard.h"
#include "sharding/shard_plan.h"
#include "transport/push_pull.h"

namespace herd {

struct ParameterShardOptions {
  const ParamLayout* layout = nullptr;
  const ShardPlan* plan = nullptr;
  int server = 0;
  int num_workers = 1;                      // the shares of the global batch: cluster.workers
  transport::PeerId first_worker_peer = 0;  // worker rank r is this + r
  bool bf16_wire = false;
  bool collects_losses = false;  // server 0: the workers' losses
  // No clipping (optimizer.clip_norm 0): the global norm does not enter
  // the update, so each bucket is stepped as soon as its sum is complete
  // and the workers' pulls of it overlap their remaining pushes (BytePS's
  // pipelining). The arithmetic is the same as stepping after the norm.
  bool stream_updates = false;
  // cluster.elastic: any worker may push any share (num_workers shares, the
  // job's configured worker count), and a share that is in already, or of
  // a step that is over, is received and dropped (a worker that takes over
  // a lost one's share computes it again). Needs stream_updates false: no
  // bucket is stepped before every share of every bucket of every server
  // is in, so a worker redoing a share still finds the step's weights.
  bool elastic = false;
};

class ParameterShard : public transport::ShardHandler {
 public:
  // `optimizer` covers exactly the plan's range for this server.
  ParameterShard(const ParameterShardOptions& options, std::unique_ptr<OptimizerShard> optimizer);
  ~ParameterShard() override;

  // transport::ShardHandler, on the progress thread. Gradients and weights
  // address the shard's parameters in the wire dtype; a loss push (server
  // 0 only) is one ShareLoss; a report pull is one StepReport (its tag the
  // version, or kLatestReport for the newest).
  uint64_t size_bytes(transport::RequestKind kind) const override;
  StatusOr<void*> PushTarget(const transport::Request& push) override;
  void OnPushed(const transport::Request& push, void* target, bool ok, transport::Completion applied) override;
  void OnPull(const transport::Request& pull, PullReply reply) override;

  // What a server does around its steps.
  struct StepHooks {
    // The global norm and mean loss of step `step` (1-based) from this
    // shard's squared partial norm and what it knows of the loss (server 0
    // collects it; others pass NaN): every server's partials combined and
    // server 0's loss, the same values on every server.
    struct Global {
      double norm, loss;
    };
    std::function<StatusOr<Global>(int64_t step, double partial, double loss)> global_scalars;
    // After step `step` is applied (checkpoints); may be empty.
    std::function<Status(int64_t step)> after_step;
  };
  // Step thread: the server's half of every step until the version reaches
  // `last` — wait for the gradients, combine the norm, stop on divergence,
  // apply (items 1-3 above), then `after_step`. The workers' pushes drive
  // it; a failure ends it with that failure.
  Status ServeSteps(int64_t last, const StepHooks& hooks);

  // The parts of ServeSteps, for tests that drive one step by hand.
  // Step thread. Blocks until every bucket (and, on server 0, every loss)
  // of the current step is in, then returns the shard's squared gradient
  // norm; or the failure passed to Fail().
  StatusOr<double> WaitForGradients();
  // Applies the optimizer's step (`step`: its BeginStep with the global
  // norm) bucket by bucket in ascending order, serving the pulls of the
  // new version as buckets are done.
  void ApplyStep(const OptimizerShard::Scalars& step);
  // The step's mean loss over the workers' shares (NaN on a server that
  // does not collect them).
  double MeanLoss();
  double MeanLossLocked() const;  // REQUIRES: mu_ held
  // Wakes WaitForGradients with `status` and answers later requests with it.
  void Fail(const Status& status);
  // Any thread (elastic): the membership changes seen so far, stamped on
  // the reports of the steps finished from now on.
  void SetMembershipEpoch(int64_t epoch);

  // The report of the latest step (its data position: what the workers'
  // data files of a checkpoint hold).
  StepReport report() const;
  // Elastic: pushes dropped because their share of the step was in
  // already (or the step done): copies from a worker that took over.
  int64_t pushes_dropped() const;

  // Between steps (step thread): the shard's weights, moments and step.
  const OptimizerShard& optimizer() const { return *optimizer_; }
  // Buffers for UCX registration.
  float* weights() { return optimizer_->weights(); }
  float* gradients() { return acc_.data(); }

 private:
  struct LocalBucket;
  struct QueuedPull;
  using Replies = std::vector<std::pair<PullReply, const void*>>;

  int WorkerRank(transport::PeerId client) const;
  // Under mu_: whether every bucket overlapping the byte range is stepped
  // (`all`), or any of them.
  bool AppliedOver(uint64_t offset, uint64_t length, bool all) const;
  // Step thread: AdamW on one bucket, then the pulls it makes answerable.
  void ApplyBucket(LocalBucket& b, const OptimizerShard::Scalars& step);
  // Step thread: counts the step, publishes its report, readies the next.
  void FinishStep(const OptimizerShard::Scalars& step);
  // Step thread: a bucket whose sum is complete and that is not stepped
  // yet (streaming); or the failure.
  StatusOr<LocalBucket*> WaitForSummedBucket();
  // The bucket starting at byte `offset` of the space, or null.
  LocalBucket* FindBucket(uint64_t offset);
  // Under mu_: adds queued contributions to bucket b in rank order.
  void Drain(LocalBucket& b);
  // Under mu_: a scratch buffer for a push to land in; one whose bytes are
  // dropped when it has.
  void* TakeScratch(uint64_t bytes);
  void* Discard(uint64_t bytes);
  void ReleaseScratch(void* p);
  bool GradientsComplete() const;
  // Under mu_: where the pulled bytes may be read now, or null when the
  // pull must wait.
  const void* Readable(const transport::Request& pull) const;
  // Under mu_: takes the queued pulls that are now answerable.
  Replies TakeAnswerable();

  const ParameterShardOptions options_;
  const ParamRange range_;
  const int wire_bytes_;

  // Weights, m, v and step (= version); the step changes under mu_.
  const std::unique_ptr<OptimizerShard> optimizer_;
  std::vector<float> acc_;           // the step's summed gradients
  std::vector<uint16_t> wire_copy_;  // bf16 weights served to pulls (bf16 wire)
  std::vector<ShareLoss> losses_;    // per share (server 0)
  StepReport report_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<LocalBucket> buckets_;  // ascending offsets
  int buckets_done_ = 0;
  std::vector<bool> loss_in_;
  int losses_in_ = 0;
  bool stepping_ = false;  // a bucket of the step is stepped; the step is not finished
  std::vector<QueuedPull> queued_;
  std::vector<std::unique_ptr<std::vector<char>>> scratch_free_;
  std::vector<std::unique_ptr<std::vector<char>>> scratch_used_;
  std::set<void*> discards_;  // scratch buffers whose pushes are dropped
  int64_t discarded_ = 0;     // pushes dropped (elastic), on arrival or on landing
  Status failed_;
  int64_t membership_epoch_ = 0;
};

}  // namespace herd
