#include "server/parameter_shard.h"

#include <glog/logging.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "common/bf16.h"
#include "common/strings.h"
#include "common/trace.h"
#include "server/share_sums.h"

namespace herd {

// Under the shard's mu_, except index, begin and end: constant after
// construction (the step thread reads them without it).
struct ParameterShard::LocalBucket {
  int index = 0;               // in the plan's list of buckets
  int64_t begin = 0, end = 0;  // relative to the shard's range
  std::vector<int> shares;     // those that push it, ascending (every share but in a pipeline)
  int next_share = 0;          // the contributions of shares[0..next_share-1] are summed
  std::vector<void*> pending;  // per share: landed, not yet summed
  std::vector<bool> arrived;   // per share: landed this step
  std::vector<int> landing;    // per share: transfers under way this step
  std::vector<ParamRange> counted;  // relative to the bucket's begin: in the global norm
  // Its one contribution, bf16, is its sum as it landed (in grad16_):
  // AdamW widens it as it reads it.
  bool sum_in_bf16 = false;
  double sum_of_squares = 0;
  bool done = false;     // every contribution summed
  bool applied = false;  // stepped: pulls of the next version may read it
};

struct ParameterShard::QueuedPull {
  transport::Request pull;
  PullReply reply;
  int64_t trace_start = -1;  // when it was queued (log.trace)
};

ParameterShard::ParameterShard(const ParameterShardOptions& options, std::unique_ptr<OptimizerShard> optimizer)
    : options_(options),
      range_(options.plan->shard(options.server)),
      wire_bytes_(options.bf16_wire ? 2 : 4),
      optimizer_(std::move(optimizer)),
      losses_(options.num_workers),
      loss_in_(options.num_workers, false) {
  CHECK(optimizer_->range().begin == range_.begin && optimizer_->range().end == range_.end)
      << "the optimizer state does not cover the shard";
  if (options_.bf16_wire) {
    wire_copy_.resize(range_.size());
    FloatsToBf16(optimizer_->weights(), wire_copy_.data(), range_.size());
  }
  report_.version = static_cast<uint64_t>(optimizer_->step());
  report_.data = options_.data;
  const std::vector<Bucket>& plan_buckets = options_.plan->buckets();
  for (size_t i = 0; i < plan_buckets.size(); ++i) {
    const Bucket& b = plan_buckets[i];
    if (b.server != options_.server) continue;
    LocalBucket lb;
    lb.index = static_cast<int>(i);
    lb.begin = b.range.begin - range_.begin;
    lb.end = b.range.end - range_.begin;
    if (i < options_.contributors.size()) {
      lb.shares = options_.contributors[i];
    } else {
      for (int w = 0; w < options_.num_workers; ++w) lb.shares.push_back(w);
    }
    // The bucket less the uncounted ranges (ascending), in pieces.
    int64_t from = lb.begin;
    for (const ParamRange& u : options_.uncounted) {
      const int64_t lo = std::max(lb.begin, u.begin - range_.begin), hi = std::min(lb.end, u.end - range_.begin);
      if (lo >= hi) continue;
      if (from < lo) lb.counted.push_back({from, lo});
      from = hi;
    }
    if (from < lb.end) lb.counted.push_back({from, lb.end});
    for (ParamRange& c : lb.counted) c = {c.begin - lb.begin, c.end - lb.begin};
    lb.sum_in_bf16 = options_.bf16_wire && !options_.elastic && lb.shares.size() == 1;
    lb.pending.assign(options_.num_workers, nullptr);
    lb.arrived.assign(options_.num_workers, false);
    lb.landing.assign(options_.num_workers, 0);
    buckets_.push_back(std::move(lb));
  }
  std::sort(buckets_.begin(), buckets_.end(),
            [](const LocalBucket& a, const LocalBucket& b) { return a.begin < b.begin; });
  // The fp32 sum is needed unless every bucket's sum is its one bf16
  // contribution; a bf16 first contribution lands where it stays.
  bool fp32_sum = false;
  for (const LocalBucket& b : buckets_) fp32_sum |= !b.sum_in_bf16;
  if (fp32_sum) acc_.assign(range_.size(), 0.0f);
  if (options_.bf16_wire && !options_.elastic) grad16_.assign(range_.size(), 0);
}

ParameterShard::~ParameterShard() = default;

std::vector<std::pair<void*, size_t>> ParameterShard::transfer_buffers() {
  std::vector<std::pair<void*, size_t>> out = {{weights(), range_.size() * sizeof(float)}};
  if (!acc_.empty()) out.emplace_back(acc_.data(), acc_.size() * sizeof(float));
  if (!grad16_.empty()) out.emplace_back(grad16_.data(), grad16_.size() * sizeof(uint16_t));
  if (!wire_copy_.empty()) out.emplace_back(wire_copy_.data(), wire_copy_.size() * sizeof(uint16_t));
  return out;
}

int ParameterShard::WorkerRank(transport::PeerId client) const {
  const int r = client - options_.first_worker_peer;
  return r >= 0 && r < options_.num_workers ? r : -1;
}

uint64_t ParameterShard::size_bytes(transport::RequestKind kind) const {
  switch (kind) {
    case transport::RequestKind::kGradients:
    case transport::RequestKind::kWeights:
      return static_cast<uint64_t>(range_.size()) * wire_bytes_;
    case transport::RequestKind::kLoss:
      return options_.collects_losses ? sizeof(ShareLoss) : 0;
    case transport::RequestKind::kReport:
      return sizeof(StepReport);
  }
  return 0;
}

StatusOr<void*> ParameterShard::PushTarget(const transport::Request& push) {
  MutexLock lock(&mu_);
  if (!failed_.ok()) return failed_;
  const int r = WorkerRank(push.client);
  const std::string what = push.Describe();
  if (r < 0) return Status::InvalidArgument(what + " from peer " + std::to_string(push.client) + ", not a worker");
  const std::string from = " from worker " + std::to_string(r);
  const uint64_t step = transport::TagStep(push.tag);
  const int share = transport::TagShare(push.tag);
  if (share >= options_.num_workers || (!options_.elastic && share != r)) {
    return Status::InvalidArgument(what + from + " is for the share of rank " + std::to_string(share) +
                                   (options_.elastic ? ", beyond the job's " + std::to_string(options_.num_workers)
                                                     : ", not its own"));
  }
  const uint64_t current = static_cast<uint64_t>(optimizer_->step());
  // Elastic: a worker that takes over a lost one's share computes it again,
  // and the share may be in already (every share of a step being stepped
  // is); such bytes are received and dropped, never added twice.
  if (options_.elastic && (step < current || (step == current && stepping_))) return Discard(push.length);
  // Streaming, pushes of a step go on arriving while its first buckets are
  // stepped; otherwise every push of the step is in before stepping.
  if ((stepping_ && !options_.stream_updates) || step != current) {
    return Status::FailedPrecondition(what + from + " is for step " + std::to_string(step) + ", but this server is " +
                                      (stepping_ ? "stepping " : "at step ") + std::to_string(current));
  }
  if (push.kind == transport::RequestKind::kLoss) {
    if (push.offset != 0 || push.length != sizeof(ShareLoss)) {
      return Status::InvalidArgument(what + from + " is not one share's loss and data position");
    }
    if (loss_in_[share]) {
      if (options_.elastic) return Discard(push.length);
      return Status::InvalidArgument("worker " + std::to_string(r) + " pushed its loss twice");
    }
    loss_in_[share] = true;
    return static_cast<void*>(&losses_[share]);
  }
  LocalBucket* found = FindBucket(push.offset);
  if (found == nullptr || static_cast<uint64_t>((found->end - found->begin) * wire_bytes_) != push.length) {
    return Status::InvalidArgument(what + " is not one of this server's buckets");
  }
  LocalBucket& b = *found;
  if (!std::binary_search(b.shares.begin(), b.shares.end(), share)) {
    return Status::InvalidArgument(what + from + ": share " + std::to_string(share) +
                                   " does not compute this bucket (another pipeline stage does)");
  }
  if (b.arrived[share] || b.landing[share] > 0) {
    if (!options_.elastic) {
      return Status::InvalidArgument(what + from + " pushed this bucket twice in step " + std::to_string(step));
    }
    // Elastic: another copy of the share may still be lost on the way (its
    // sender gone); this one lands too, and the first in counts.
    if (b.arrived[share]) return Discard(push.length);
  }
  ++b.landing[share];
  // The first share's gradients start the sum: they land in place (not in
  // an elastic job, where a copy that fails half-way must not touch the
  // sum).
  if (share == b.shares.front()) {
    if (void* in_place = InPlaceTarget(b)) return in_place;
  }
  return TakeScratch(push.length);
}

void* ParameterShard::InPlaceTarget(const LocalBucket& b) {
  if (options_.elastic) return nullptr;
  if (options_.bf16_wire) return grad16_.data() + b.begin;
  return acc_.data() + b.begin;
}

void* ParameterShard::TakeScratch(uint64_t bytes) {
  std::unique_ptr<std::vector<char>> scratch;
  if (!scratch_free_.empty()) {
    scratch = std::move(scratch_free_.back());
    scratch_free_.pop_back();
  } else {
    scratch = std::make_unique<std::vector<char>>();
  }
  scratch->resize(bytes);
  void* target = scratch->data();
  scratch_used_.push_back(std::move(scratch));
  return target;
}

void* ParameterShard::Discard(uint64_t bytes) {
  void* target = TakeScratch(bytes);
  discards_.insert(target);
  ++discarded_;
  return target;
}

ParameterShard::LocalBucket* ParameterShard::FindBucket(uint64_t offset) {
  auto it = std::lower_bound(buckets_.begin(), buckets_.end(), offset, [this](const LocalBucket& b, uint64_t off) {
    return static_cast<uint64_t>(b.begin * wire_bytes_) < off;
  });
  if (it == buckets_.end() || static_cast<uint64_t>(it->begin * wire_bytes_) != offset) return nullptr;
  return &*it;
}

void ParameterShard::ReleaseScratch(void* p) {
  for (size_t i = 0; i < scratch_used_.size(); ++i) {
    if (scratch_used_[i]->data() == p) {
      scratch_free_.push_back(std::move(scratch_used_[i]));
      scratch_used_.erase(scratch_used_.begin() + i);
      return;
    }
  }
}

void ParameterShard::Drain(LocalBucket& b) {
  const int64_t n = b.end - b.begin;
  float* sum = acc_.empty() ? nullptr : acc_.data() + b.begin;
  const int shares = static_cast<int>(b.shares.size());
  // Whether the sum's squares are taken: by the pass that adds the last
  // contribution, or (one contribution, landed in place) on their own.
  bool squared = false;
  while (b.next_share < shares && b.pending[b.shares[b.next_share]] != nullptr) {
    const int share = b.shares[b.next_share];
    const bool last = b.next_share + 1 == shares;
    trace::Span span("sum", "server", {"bucket", b.index}, {"share", share}, {"step", optimizer_->step() + 1});
    void* in = b.pending[share];
    ShareInput input;
    input.data = in;
    input.bf16 = options_.bf16_wire;
    input.first = b.next_share == 0;  // landed in scratch (elastic): it starts the sum
    // The first contribution landed in place: bf16, it is widened in now.
    if (b.next_share == 1 && !grad16_.empty()) input.first_bf16 = grad16_.data() + b.begin;
    const double squares = AddShare(sum, input, n, last ? &b.counted : nullptr);
    if (last) {
      b.sum_of_squares = squares;
      squared = true;
    }
    ReleaseScratch(in);
    b.pending[share] = nullptr;
    ++b.next_share;
  }
  if (b.next_share == shares && !b.done) {
    b.done = true;
    if (!squared) {
      trace::Span span("sum of squares", "server", {"bucket", b.index}, {"step", optimizer_->step() + 1});
      if (b.sum_in_bf16) {
        b.sum_of_squares = SumOfSquaresOverBf16(grad16_.data() + b.begin, b.counted);
      } else {
        b.sum_of_squares = 0;
        for (const ParamRange& c : b.counted) b.sum_of_squares += SumOfSquares(sum + c.begin, c.size());
      }
    }
    ++buckets_done_;
  }
}

void ParameterShard::OnPushed(const transport::Request& push, void* target, bool ok,
                              transport::Completion applied) {
  {
    MutexLock lock(&mu_);
    const int share = transport::TagShare(push.tag);
    if (discards_.erase(target) > 0) {
      ReleaseScratch(target);
    } else if (push.kind == transport::RequestKind::kLoss) {
      if (ok) {
        ++losses_in_;
      } else {
        loss_in_[share] = false;  // it may come again
      }
    } else {
      LocalBucket& b = *FindBucket(push.offset);  // PushTarget checked it
      const bool in_place = target == InPlaceTarget(b);
      if (transport::TagStep(push.tag) != static_cast<uint64_t>(optimizer_->step())) {
        ReleaseScratch(target);  // a second copy of a share, landing after its step
        ++discarded_;
      } else {
        --b.landing[share];
        if (!ok || b.arrived[share]) {
          if (!in_place) ReleaseScratch(target);  // failed (nothing to sum), or a second copy
          if (ok) ++discarded_;
        } else {
          b.arrived[share] = true;
          if (in_place) {
            b.next_share = 1;
          } else {
            b.pending[share] = target;
          }
          Drain(b);
        }
      }
    }
    // Streaming, the step thread takes each bucket as its sum completes.
    if (options_.stream_updates || GradientsComplete()) cv_.SignalAll();
  }
  applied(Status::OK());
}

bool ParameterShard::GradientsComplete() const {
  return buckets_done_ == static_cast<int>(buckets_.size()) &&
         (!options_.collects_losses || losses_in_ == options_.num_workers);
}

StatusOr<double> ParameterShard::WaitForGradients() {
  const int64_t waited = trace::StartTime();
  MutexLock lock(&mu_);
  while (!GradientsComplete() && failed_.ok()) cv_.Wait(&mu_);
  trace::Complete("wait for gradients", "wait", waited, {"step", optimizer_->step() + 1});
  if (!failed_.ok()) return failed_;
  for (int share = 1; options_.collects_losses && share < options_.num_workers; ++share) {
    const DataPosition& a = losses_[0].data;
    const DataPosition& b = losses_[share].data;
    if (!(a == b)) {
      auto where = [](const DataPosition& p) {
        return "epoch " + std::to_string(p.epoch) + " taken " + std::to_string(p.taken) + " of " +
               std::to_string(p.tokens) + " tokens";
      };
      return Status::Corruption("step " + std::to_string(optimizer_->step() + 1) + ": share " +
                                std::to_string(share) + " was drawn up to " + where(b) + ", share 0 up to " +
                                where(a) + ": the workers do not agree on the data order");
    }
  }
  double total = 0;
  for (const LocalBucket& b : buckets_) total += b.sum_of_squares;  // ascending: a fixed order
  return total;
}

const void* ParameterShard::Readable(const transport::Request& pull) const {
  const uint64_t version = static_cast<uint64_t>(optimizer_->step());
  if (pull.kind == transport::RequestKind::kReport) {
    return (pull.tag == version || pull.tag == transport::kLatestReport) && !stepping_ ? &report_ : nullptr;
  }
  // A bucket not yet stepped still holds `version` while others are (a
  // worker that streams its weights pulls them again in backward).
  const bool current = (pull.tag == version && !(stepping_ && AppliedOver(pull.offset, pull.length, /*all=*/false))) ||
                       (pull.tag == version + 1 && stepping_ && AppliedOver(pull.offset, pull.length, /*all=*/true));
  if (!current) return nullptr;
  const char* base = options_.bf16_wire ? reinterpret_cast<const char*>(wire_copy_.data())
                                        : reinterpret_cast<const char*>(optimizer_->weights());
  return base + pull.offset;
}

void ParameterShard::OnPull(const transport::Request& pull, PullReply reply) {
  const std::string what = pull.Describe();
  Status error;
  const void* data = nullptr;
  {
    MutexLock lock(&mu_);
    const uint64_t version = static_cast<uint64_t>(optimizer_->step());
    const bool report = pull.kind == transport::RequestKind::kReport;
    // The newest report is answered now, or when the step under way ends.
    const bool latest = report && pull.tag == transport::kLatestReport;
    if (!failed_.ok()) {
      error = failed_;
    } else if (WorkerRank(pull.client) < 0) {
      error = Status::InvalidArgument(what + " from peer " + std::to_string(pull.client) + ", not a worker");
    } else if (report ? pull.offset != 0 || pull.length != sizeof(StepReport)
                      : pull.offset % wire_bytes_ != 0 || pull.length % wire_bytes_ != 0) {
      error = Status::InvalidArgument(what + (report ? " is not the whole step report" : " is not whole parameters"));
    } else if (!latest && pull.tag != version && pull.tag != version + 1) {
      error = Status::FailedPrecondition(what + " asks for version " + std::to_string(pull.tag) +
                                         ", this server holds " + std::to_string(version));
    } else if (!latest && pull.tag == version && stepping_ &&
               (report || AppliedOver(pull.offset, pull.length, /*all=*/false))) {
      error = Status::FailedPrecondition(what + " asks for version " + std::to_string(pull.tag) +
                                         " while it is being replaced");
    } else {
      data = Readable(pull);
      if (data == nullptr) {
        queued_.push_back({pull, std::move(reply), trace::StartTime()});
        return;
      }
    }
  }
  reply(error, data);
}

ParameterShard::Replies ParameterShard::TakeAnswerable() {
  Replies out;
  for (size_t i = 0; i < queued_.size();) {
    const void* data = Readable(queued_[i].pull);
    if (data == nullptr) {
      ++i;
      continue;
    }
    const transport::Request& pull = queued_[i].pull;
    trace::Async(pull.kind == transport::RequestKind::kReport ? "report held" : "pull held", "server",
                 queued_[i].trace_start, {"offset", static_cast<int64_t>(pull.offset)},
                 {"version", static_cast<int64_t>(pull.tag)}, {"worker", WorkerRank(pull.client)});
    out.emplace_back(std::move(queued_[i].reply), data);
    queued_.erase(queued_.begin() + i);
  }
  return out;
}

// The buckets overlapping [offset, offset + length) hold `all` applied
// (every one) or any applied (`all` false).
bool ParameterShard::AppliedOver(uint64_t offset, uint64_t length, bool all) const {
  // From the last one that starts at or before offset.
  auto it = std::upper_bound(buckets_.begin(), buckets_.end(), offset, [this](uint64_t off, const LocalBucket& b) {
    return off < static_cast<uint64_t>(b.begin * wire_bytes_);
  });
  if (it != buckets_.begin()) --it;
  for (; it != buckets_.end() && static_cast<uint64_t>(it->begin * wire_bytes_) < offset + length; ++it) {
    if (it->applied != all) return !all;
  }
  return all;
}

void ParameterShard::CheckStepProtocol(const LocalBucket& b) {
#ifndef NDEBUG
  MutexLock lock(&mu_);
  if (step_thread_ == std::thread::id()) step_thread_ = std::this_thread::get_id();
  DCHECK(step_thread_ == std::this_thread::get_id()) << "two threads step the shard";
  DCHECK(b.done) << "bucket " << b.index << " stepped before every share of it is summed";
  DCHECK(!b.applied) << "bucket " << b.index << " stepped twice in one step";
#else
  (void)b;
#endif
}

void ParameterShard::ApplyBucket(LocalBucket& b, const OptimizerShard::Scalars& step) {
  StepBucket(b, step, /*wire_copy=*/true);
  PublishBucket(b, /*wire_copy=*/false);
}

void ParameterShard::StepBucket(LocalBucket& b, const OptimizerShard::Scalars& step, bool wire_copy) {
  CheckStepProtocol(b);
  trace::Span span("adamw", "server", {"bucket", b.index}, {"step", step.step});
  AdamWStreams io;
  if (b.sum_in_bf16) {
    io.grads_bf16 = grad16_.data() + b.begin;
  } else {
    io.grads = acc_.data() + b.begin;
  }
  if (wire_copy && options_.bf16_wire) io.weights_bf16 = wire_copy_.data() + b.begin;
  optimizer_->Apply(step, {range_.begin + b.begin, range_.begin + b.end}, io);
}

void ParameterShard::PublishBucket(LocalBucket& b, bool wire_copy) {
  if (wire_copy && options_.bf16_wire) {
    FloatsToBf16(optimizer_->weights() + b.begin, wire_copy_.data() + b.begin, b.end - b.begin);
  }
  Replies replies;
  {
    MutexLock lock(&mu_);
    stepping_ = true;
    b.applied = true;
    if (!queued_.empty()) replies = TakeAnswerable();
  }
  for (auto& [reply, data] : replies) reply(Status::OK(), data);
}

double ParameterShard::MeanLoss() {
  MutexLock lock(&mu_);
  return MeanLossLocked();
}

double ParameterShard::MeanLossLocked() const {
  if (!options_.collects_losses) return std::nan("");
  double loss_sum = 0;
  for (const ShareLoss& l : losses_) loss_sum += l.loss;  // share order
  return loss_sum / options_.num_workers;
}

void ParameterShard::ApplyStep(const OptimizerShard::Scalars& step) {
  std::vector<LocalBucket*> ascending;  // the buckets never move (buckets_)
  {
    MutexLock lock(&mu_);
    for (LocalBucket& b : buckets_) ascending.push_back(&b);
  }
  for (LocalBucket* b : ascending) ApplyBucket(*b, step);
  FinishStep(step);
}

Status ParameterShard::ApplyStepReplacing(const OptimizerShard::Scalars& step,
                                          const std::function<Status(float*)>& replace) {
  std::vector<LocalBucket*> ascending;  // the buckets never move (buckets_)
  {
    MutexLock lock(&mu_);
    for (LocalBucket& b : buckets_) ascending.push_back(&b);
  }
  for (LocalBucket* b : ascending) StepBucket(*b, step, /*wire_copy=*/false);
  HERD_RETURN_IF_ERROR(replace(optimizer_->weights()));
  for (LocalBucket* b : ascending) PublishBucket(*b, /*wire_copy=*/true);
  FinishStep(step);
  return Status::OK();
}

void ParameterShard::FinishStep(const OptimizerShard::Scalars& step) {
  Replies replies;
  {
    MutexLock lock(&mu_);
    report_ = ReportOf(step.step, step.global_norm, step.lr, options_.collects_losses ? MeanLossLocked() : 0.0,
                       step.spike);
    report_.data = losses_[0].data;
    report_.membership_epoch = membership_epoch_;
    optimizer_->EndStep();
    stepping_ = false;
    for (LocalBucket& b : buckets_) {
      b.next_share = 0;
      b.done = false;
      b.applied = false;
      b.sum_of_squares = 0;
      std::fill(b.arrived.begin(), b.arrived.end(), false);
      std::fill(b.landing.begin(), b.landing.end(), 0);
    }
    buckets_done_ = 0;
    losses_in_ = 0;
    std::fill(loss_in_.begin(), loss_in_.end(), false);
    replies = TakeAnswerable();
  }
  for (auto& [reply, data] : replies) reply(Status::OK(), data);
}

StatusOr<ParameterShard::LocalBucket*> ParameterShard::WaitForSummedBucket() {
  const int64_t waited = trace::StartTime();
  MutexLock lock(&mu_);
  LocalBucket* found = nullptr;
  for (;;) {
    for (LocalBucket& b : buckets_) {
      if (b.done && !b.applied) found = &b;
    }
    if (found != nullptr || !failed_.ok()) break;
    cv_.Wait(&mu_);
  }
  trace::Complete("wait for gradients", "wait", waited, {"step", optimizer_->step() + 1});
  if (!failed_.ok()) return failed_;
  return found;
}

Status ParameterShard::ServeSteps(int64_t last, const StepHooks& hooks) {
  size_t num_buckets;
  {
    MutexLock lock(&mu_);
    num_buckets = buckets_.size();  // never changes (buckets_)
  }
  while (optimizer_->step() < last) {
    const int64_t step = optimizer_->step() + 1;
    trace::Span span("server step", "step", {"step", step});
    const std::string at = "step " + std::to_string(step) + ": ";
    OptimizerShard::Scalars scalars;
    // A step whose weights are replaced is served whole, once replaced.
    const bool replaced = hooks.replaces && hooks.replaces(step);
    const bool stream = options_.stream_updates && !replaced;
    if (stream) {
      // Without clipping the norm does not enter the update: each bucket
      // is stepped as soon as its sum is complete, and its pulls answered,
      // while the workers are still pushing the others.
      scalars = optimizer_->BeginStep(/*global_norm=*/0, /*loss=*/0);
      for (size_t n = 0; n < num_buckets; ++n) {
        HERD_ASSIGN_OR_RETURN(LocalBucket * b, WaitForSummedBucket());
        ApplyBucket(*b, scalars);
      }
    }
    HERD_ASSIGN_OR_RETURN(const double partial, WaitForGradients());
    HERD_ASSIGN_OR_RETURN(const StepHooks::Global global, hooks.global_scalars(step, partial, MeanLoss()));
    HERD_RETURN_IF_ERROR(CheckNotDiverged("gradient norm", global.norm).WithContext(at));
    if (stream) {
      scalars.global_norm = global.norm;  // for the step's report
      FinishStep(scalars);
    } else if (replaced) {
      HERD_RETURN_IF_ERROR(ApplyStepReplacing(optimizer_->BeginStep(global.norm, global.loss),
                                              [&](float* weights) { return hooks.replace(step, weights); })
                               .WithContext(at));
    } else {
      ApplyStep(optimizer_->BeginStep(global.norm, global.loss));
    }
    if (hooks.after_step) HERD_RETURN_IF_ERROR(hooks.after_step(step));
  }
  return Status::OK();
}

void ParameterShard::SetMembershipEpoch(int64_t epoch) {
  MutexLock lock(&mu_);
  membership_epoch_ = std::max(membership_epoch_, epoch);
}

int64_t ParameterShard::pushes_dropped() const {
  MutexLock lock(&mu_);
  return discarded_;
}

StepReport ParameterShard::report() const {
  MutexLock lock(&mu_);
  return report_;
}

void ParameterShard::Fail(const Status& status) {
  std::vector<QueuedPull> queued;
  {
    MutexLock lock(&mu_);
    if (failed_.ok()) failed_ = status;
    queued.swap(queued_);
    cv_.SignalAll();
  }
  for (QueuedPull& q : queued) q.reply(status, nullptr);
}

}  // namespace herd
