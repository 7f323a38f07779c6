// One parameter server's state and its synchronous step: the fp32 master
// weights, AdamW moments and step count of one range of the flat parameter
// space (ZeRO-style: no process holds the whole optimizer state).
//
// Step t, as seen from here:
//   1. each of the W shares of the global batch (a worker's sequences;
//      transport::PushTag) arrives once per bucket, tagged with step t and
//      the share (a pipeline's bucket: the shares of the workers that
//      compute it, options.contributors); the contributions to a bucket
//      are summed in share order (a fixed order: reruns are bitwise identical, and so is a run
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
// The bookkeeping is guarded by one mutex; the weights and the summed
// gradients are not (the step thread writes them outside it): what keeps
// those safe is the protocol stated at the members below.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "model/optim/optimizer_shard.h"
#include "sharding/shard_plan.h"
#include "transport/ps_protocol.h"
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
  // The data position its first report carries (the optimizer's step's):
  // a rejoining region's first server's, which its workers start from.
  DataPosition data;
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
  // A pipeline (cluster.pipeline_stages): [plan bucket index] -> the shares
  // (worker ranks) that push it, ascending: the workers of the stage that
  // computes it (a tied embedding's: the first and the last stage's). A
  // bucket's sum is theirs, in share order. Empty: every share, every
  // bucket.
  std::vector<std::vector<int>> contributors;
  // Ranges of the space whose gradients are copies of others' (the norms
  // every tensor-parallel rank holds: sharding/tensor_slices.h's
  // TensorParallelSpace): stepped like the rest, left out of the global
  // norm.
  std::vector<ParamRange> uncounted;
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
    // Steps whose weights are replaced before they are served (a job of
    // regions: DiLoCo's outer step every H steps): `replaces(step)` says
    // which; `replace(step, weights)` rewrites the shard's weights (its
    // whole range) once the step's AdamW is applied and before any pull of
    // the new version is answered. Both empty: none.
    std::function<bool(int64_t step)> replaces;
    std::function<Status(int64_t step, float* weights)> replace;
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
  double MeanLossLocked() const REQUIRES(mu_);
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
  // The shard's buffers that pushes land in and pulls read (the weights,
  // the sums, the bf16 copies), for UCX registration.
  float* weights() { return optimizer_->weights(); }
  std::vector<std::pair<void*, size_t>> transfer_buffers();
  // The step's fp32 sums (null when every bucket's sum is its one bf16
  // contribution).
  float* gradients() { return acc_.empty() ? nullptr : acc_.data(); }

 private:
  struct LocalBucket;
  struct QueuedPull;
  using Replies = std::vector<std::pair<PullReply, const void*>>;

  int WorkerRank(transport::PeerId client) const;
  // Whether every bucket overlapping the byte range is stepped (`all`), or
  // any of them.
  bool AppliedOver(uint64_t offset, uint64_t length, bool all) const REQUIRES(mu_);
  // Step thread: AdamW on one bucket (and, bf16 wire, its outgoing bf16
  // weights in the same pass), then the pulls it makes answerable
  // (StepBucket, then PublishBucket). `wire_copy`: the bf16 weights are
  // made by that call (PublishBucket's: of weights replaced in between).
  void ApplyBucket(LocalBucket& b, const OptimizerShard::Scalars& step) LOCKS_EXCLUDED(mu_);
  void StepBucket(LocalBucket& b, const OptimizerShard::Scalars& step, bool wire_copy) LOCKS_EXCLUDED(mu_);
  void PublishBucket(LocalBucket& b, bool wire_copy) LOCKS_EXCLUDED(mu_);
  // Step thread: ApplyStep whose weights `replace` rewrites after every
  // bucket's AdamW and before any of them is served.
  Status ApplyStepReplacing(const OptimizerShard::Scalars& step, const std::function<Status(float*)>& replace)
      LOCKS_EXCLUDED(mu_);
  // Debug builds: checks the protocol that lets ApplyBucket write bucket
  // b's weights and read its gradients outside mu_ (see optimizer_).
  void CheckStepProtocol(const LocalBucket& b) LOCKS_EXCLUDED(mu_);
  // Step thread: counts the step, publishes its report, readies the next.
  void FinishStep(const OptimizerShard::Scalars& step) LOCKS_EXCLUDED(mu_);
  // Step thread: a bucket whose sum is complete and that is not stepped
  // yet (streaming); or the failure.
  StatusOr<LocalBucket*> WaitForSummedBucket() LOCKS_EXCLUDED(mu_);
  // The bucket starting at byte `offset` of the space, or null.
  LocalBucket* FindBucket(uint64_t offset) REQUIRES(mu_);
  // Adds queued contributions to bucket b in rank order.
  void Drain(LocalBucket& b) REQUIRES(mu_);
  // Where bucket b's first share lands in place (its sum's start), or null
  // (elastic: in scratch).
  void* InPlaceTarget(const LocalBucket& b);
  // A scratch buffer for a push to land in; one whose bytes are dropped
  // when it has.
  void* TakeScratch(uint64_t bytes) REQUIRES(mu_);
  void* Discard(uint64_t bytes) REQUIRES(mu_);
  void ReleaseScratch(void* p) REQUIRES(mu_);
  bool GradientsComplete() const REQUIRES(mu_);
  // Where the pulled bytes may be read now, or null when the pull must
  // wait.
  const void* Readable(const transport::Request& pull) const REQUIRES(mu_);
  // Takes the queued pulls that are now answerable.
  Replies TakeAnswerable() REQUIRES(mu_);

  // Constant after construction.
  const ParameterShardOptions options_;
  const ParamRange range_;
  const int wire_bytes_;

  // Safe by protocol, not by mu_. The step thread reads and writes these
  // outside mu_, and the transport uses pointers into them (handed out
  // under mu_ by PushTarget and OnPull) after mu_ is released.
  //
  // The optimizer's weights, m and v, and wire_copy_ (the bf16 weights
  // served to pulls, bf16 wire): ApplyBucket writes a bucket's only once
  // every share of it is summed (done) and before it is marked stepped
  // (applied), on the one step thread; the step (= the version) changes
  // only under mu_ (FinishStep). Readable serves a bucket at version v
  // only while it is not stepped, and the bytes must stay unchanged until
  // the worker has them (ShardHandler::OnPull): what makes that hold is the
  // workers' order — each worker of step v+1 has its pull of a bucket's
  // version v before it pushes that bucket's gradients, and ApplyBucket
  // starts on a bucket only once every share of it is in. (A pull from
  // outside the step, such as an elastic worker joining while it is under
  // way, is not covered by that argument.) Debug builds check the server's
  // half (CheckStepProtocol).
  const std::unique_ptr<OptimizerShard> optimizer_;
  std::vector<uint16_t> wire_copy_;
  // The step's summed gradients (fp32; empty when every bucket's sum is
  // its one bf16 contribution) and, bf16 wire, the first share's
  // contribution as it landed (empty when elastic). Bucket b's part is
  // written by its first share's push landing in place (not elastic;
  // between PushTarget and OnPushed, outside mu_) and by Drain under mu_,
  // until b is done; then only the step thread reads it (ApplyBucket,
  // outside mu_) until FinishStep readies the next step.
  std::vector<float> acc_;
  std::vector<uint16_t> grad16_;

  mutable Mutex mu_;
  CondVar cv_;  // gradients complete (streaming: a bucket summed), or a failure
  // Ascending offsets. The vector is filled in the constructor and never
  // resized, and a bucket's index, begin and end never change; the rest of
  // a LocalBucket changes under mu_.
  std::vector<LocalBucket> buckets_ GUARDED_BY(mu_);
  int buckets_done_ GUARDED_BY(mu_) = 0;
  // Per share (server 0). The transport lands a share's loss in its slot
  // between PushTarget and OnPushed, outside mu_; nothing reads a slot
  // before OnPushed has counted it.
  std::vector<ShareLoss> losses_ GUARDED_BY(mu_);
  std::vector<bool> loss_in_ GUARDED_BY(mu_);
  int losses_in_ GUARDED_BY(mu_) = 0;
  bool stepping_ GUARDED_BY(mu_) = false;  // a bucket of the step is stepped; the step is not finished
  StepReport report_ GUARDED_BY(mu_);      // served to report pulls by pointer, as the weights are
  std::vector<QueuedPull> queued_ GUARDED_BY(mu_);
  // Receive buffers for pushes: the lists under mu_; a buffer's bytes are
  // the transport's between PushTarget and OnPushed.
  std::vector<std::unique_ptr<std::vector<char>>> scratch_free_ GUARDED_BY(mu_);
  std::vector<std::unique_ptr<std::vector<char>>> scratch_used_ GUARDED_BY(mu_);
  std::set<void*> discards_ GUARDED_BY(mu_);  // scratch buffers whose pushes are dropped
  int64_t discarded_ GUARDED_BY(mu_) = 0;     // pushes dropped (elastic), on arrival or on landing
  Status failed_ GUARDED_BY(mu_);
  int64_t membership_epoch_ GUARDED_BY(mu_) = 0;
  [[maybe_unused]] std::thread::id step_thread_ GUARDED_BY(mu_);  // debug builds: the thread that steps
};

}  // namespace herd
