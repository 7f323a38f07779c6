#include "worker/reducers/parameter_server_sync.h"

#include <glog/logging.h>

#include <optional>
#include <utility>

#include "common/bf16.h"
#include "common/clock.h"
#include "common/trace.h"
#include "sharding/weight_window.h"
#include "worker/reducers/window_runner.h"

namespace herd {
namespace {

// Parameter-server mode, the worker's side, what every variant shares:
// gradient buckets pushed to the servers that own them (fp32, or bf16
// through a staging buffer), the share's loss to server 0, every server's
// report of the step that produced a version. The time blocked on the
// network is counted.
class PushPullSync : public SyncStrategy {
 public:
  PushPullSync(const ParameterServerSyncOptions& o, transport::PushPullClient* client)
      : plan_(*o.plan),
        ranged_(!o.ranges.empty()),
        tag_with_rank_(!o.elastic),
        origin_(o.origin),
        wire_end_(o.ranges.empty() ? o.plan->shard(o.plan->num_servers() - 1).end : o.ranges.back().end),
        bf16_(o.bf16),
        wire_bytes_(o.bf16 ? 2 : 4),
        client_(client),
        first_server_(o.first_server),
        reports_(plan_.num_servers()),
        share_(o.rank) {
    for (const Bucket& b : plan_.buckets()) {
      bool inside = o.ranges.empty();
      for (const ParamRange& r : o.ranges) inside |= b.range.begin >= r.begin && b.range.end <= r.end;
      if (inside) mine_.push_back(&b);
    }
  }

  // The bf16 staging memory to register whole with the transport.
  virtual std::vector<std::pair<void*, size_t>> wire_buffers() { return {}; }

  // Starts a share's pushes: buckets go out as backward finishes them.
  void BeginStep(float* grads, const StepShare& share) override {
    grads_ = grads;
    step_ = share.step;
    if (!tag_with_rank_) share_ = share.share;
    loss_.data = share.drawn_to;
    next_bucket_ = 0;
  }
  void Wake() override { client_->Wake(); }
  const StepReport& report() const override { return reports_[0]; }
  Status WriteCheckpointParts(const std::string&) override { return Status::OK(); }
  int shard_files() const override { return 0; }
  // Seconds blocked on pushes and pulls since the last call.
  double TakeWaitSeconds() override { return wait_.Take(); }

 protected:
  // This worker's loss to server 0, then waits for every push of the step.
  Status PushLossAndWait(double loss) {
    loss_.loss = loss;
    push_tickets_.push_back(client_->Push(first_server_, transport::RequestKind::kLoss, 0, &loss_, sizeof(loss_),
                                          transport::PushTag(step_, share_)));
    trace::Span span("wait for pushes", "wait", {"step", static_cast<int64_t>(step_ + 1)});
    return wait_.Timed([&] {
      Status first;
      for (auto ticket : push_tickets_) {
        Status st = client_->Wait(ticket);
        if (!st.ok() && first.ok()) first = st;
      }
      push_tickets_.clear();
      return first;
    });
  }

  // A new version: its weights go to `weights`.
  void StartVersion(float* weights, uint64_t version) {
    weights_ = weights;
    version_ = version;
    pull_status_ = Status::OK();
  }
  // Every server's report of the step that produced the version.
  void PullReports() {
    report_tickets_.clear();
    next_report_ = 0;
    for (int s = 0; s < plan_.num_servers(); ++s) {
      report_tickets_.push_back(
          client_->Pull(first_server_ + s, transport::RequestKind::kReport, 0, &reports_[s], sizeof(StepReport), version_));
    }
  }
  // Waits for the reports and checks them (and the pulls' first failure);
  // false when interrupted first.
  StatusOr<bool> FinishReports(const std::function<bool()>& interrupted) {
    while (next_report_ < report_tickets_.size()) {
      trace::Span span("wait for report", "wait", {"server", static_cast<int64_t>(next_report_)});
      const std::optional<Status> st = Wait(report_tickets_[next_report_], interrupted);
      if (!st) return false;
      ++next_report_;
      KeepPullFailure(*st);
    }
    HERD_RETURN_IF_ERROR(pull_status_);
    for (int s = 0; s < plan_.num_servers(); ++s) {
      if (reports_[s].version != version_) {
        return Status::Corruption("server " + std::to_string(s) + " reported version " +
                                  std::to_string(reports_[s].version) + ", expected " + std::to_string(version_));
      }
    }
    return true;
  }

  // One ticket, its time counted as waiting; nullopt when interrupted.
  std::optional<Status> Wait(transport::PushPullClient::Ticket ticket, const std::function<bool()>& interrupted) {
    std::optional<Status> st;
    wait_.Timed([&] {
      st = interrupted ? client_->WaitUnless(ticket, interrupted) : client_->Wait(ticket);
      return Status::OK();
    });
    return st;
  }
  void KeepPullFailure(const Status& st) {
    if (!st.ok() && pull_status_.ok()) pull_status_ = st;
  }

  // Bucket b's gradients of the step to its server (through `wire`, the
  // bf16 staging buffer, with bf16 on the wire; `staged`: cast there
  // already).
  transport::PushPullClient::Ticket PushBucket(const Bucket& b, uint16_t* wire, bool staged = false) {
    const int64_t at = b.range.begin - origin_;
    const void* data = grads_ + at;
    if (bf16_) {
      if (!staged) FloatsToBf16(grads_ + at, wire + at, b.range.size());
      data = wire + at;
    }
    return client_->Push(first_server_ + b.server, transport::RequestKind::kGradients, ByteOffset(b), data,
                         b.range.size() * wire_bytes_, transport::PushTag(step_, share_));
  }
  // Bucket b's weights of `version`, into the weights (or `wire` with bf16).
  transport::PushPullClient::Ticket PullBucket(const Bucket& b, uint64_t version, uint16_t* wire) {
    const int64_t at = b.range.begin - origin_;
    void* dst = bf16_ ? static_cast<void*>(wire + at) : weights_ + at;
    return client_->Pull(first_server_ + b.server, transport::RequestKind::kWeights, ByteOffset(b), dst,
                         b.range.size() * wire_bytes_, version);
  }
  // bf16: bucket b's pulled weights from `wire` into the weights.
  void Unstage(const Bucket& b, const uint16_t* wire) {
    Bf16ToFloats(wire + (b.range.begin - origin_), weights_ + (b.range.begin - origin_), b.range.size());
  }
  uint64_t ByteOffset(const Bucket& b) const {
    return static_cast<uint64_t>(b.range.begin - plan_.shard(b.server).begin) * wire_bytes_;
  }
  // The bf16 staging span: from the origin up to the end of the last
  // bucket this worker moves.
  int64_t wire_elements() const { return wire_end_ - origin_; }

  const ShardPlan& plan_;
  // The buckets this worker pushes and pulls (all, but a pipeline stage's),
  // in the plan's (backward) order.
  std::vector<const Bucket*> mine_;
  const bool ranged_;  // a pipeline stage's or tensor-parallel rank's buckets alone
  // Pushes carry the worker's rank among its servers' workers whatever
  // share of the data it computes (not elastic: there they carry the share).
  const bool tag_with_rank_;
  const int64_t origin_;      // the servers' space's element at the worker's element 0
  const int64_t wire_end_;    // the end of the last bucket this worker moves
  const bool bf16_;
  const int wire_bytes_;
  transport::PushPullClient* const client_;
  const transport::PeerId first_server_;

  float* grads_ = nullptr;
  uint64_t step_ = 0;
  size_t next_bucket_ = 0;  // the first bucket (backward order) not yet final
  std::vector<transport::PushPullClient::Ticket> push_tickets_;
  float* weights_ = nullptr;
  uint64_t version_ = 0;
  Status pull_status_;  // the version's first failed pull
  WaitClock wait_;

 private:
  std::vector<StepReport> reports_;
  std::vector<transport::PushPullClient::Ticket> report_tickets_;
  size_t next_report_ = 0;
  ShareLoss loss_;  // pushed to server 0: the share's loss and the step's data position
  int share_;       // whose the step's gradients are, to the servers
};

// Every weight held: the next version pulled bucket by bucket in forward
// order. With `stream` (the servers step each bucket as soon as its sum is
// complete), each bucket's pull is issued right after its push.
class WholeWeightsSync : public PushPullSync {
 public:
  WholeWeightsSync(const ParameterServerSyncOptions& o, transport::PushPullClient* client)
      : PushPullSync(o, client), stream_(o.stream), elastic_(o.elastic) {
    early_pulls_.resize(mine_.size());
  }

  // bf16: the staging spans the flat space; a pipeline stage's is paged,
  // backed only where its own buckets go (and, so, not registered whole).
  Status ReserveStaging() {
    if (!bf16_) return Status::OK();
    if (ranged_) {
      HERD_ASSIGN_OR_RETURN(paged_wire_,
                            PagedBuffer::Reserve(wire_elements() * sizeof(uint16_t), /*guarded=*/false));
      return Status::OK();
    }
    wire_.resize(wire_elements());
    // Elastic: a worker redoing a lost one's share pushes while the
    // weights it waits for may be landing; they must not share a buffer.
    if (elastic_) push_wire_.resize(wire_.size());
    return Status::OK();
  }

  std::vector<std::pair<void*, size_t>> wire_buffers() override {
    std::vector<std::pair<void*, size_t>> out;
    for (auto* v : {&wire_, &push_wire_}) {
      if (!v->empty()) out.emplace_back(v->data(), v->size() * sizeof(uint16_t));
    }
    return out;
  }

  // Backward has finished every gradient at offsets >= `offset`.
  void FinalFrom(int64_t offset) override {
    size_t last = next_bucket_;
    while (last < mine_.size() && mine_[last]->range.begin - origin_ >= offset) ++last;
    // bf16: the buckets final now are cast in one pass (split over the
    // threads) when they lie side by side, as a whole space's do.
    const bool staged = bf16_ && StageTogether(next_bucket_, last, push_wire());
    while (next_bucket_ < last) {
      const Bucket& b = *mine_[next_bucket_++];
      push_tickets_.push_back(PushBucket(b, push_wire(), staged));
      // bf16: the pull lands where the push left from; its answer needs
      // every worker's push of this bucket, ours included, to have landed.
      if (stream_) {
        early_pulls_[next_bucket_ - 1] = PullBucket(b, step_ + 1, wire());
        early_version_ = static_cast<int64_t>(step_ + 1);
      }
    }
  }
  Status FinishStep(double loss) override {
    CHECK_EQ(next_bucket_, mine_.size()) << "backward did not finish every bucket";
    return PushLossAndWait(loss);
  }

  // Starts pulling the weights of `version` (forward order, into `weights`)
  // and every server's report of the step that produced it.
  void IssueWeights(float* weights, uint64_t version) override {
    StartVersion(weights, version);
    pulls_.clear();
    next_pull_ = 0;
    // Buckets are listed in backward order; forward waits in reverse.
    const bool issued = early_version_ == static_cast<int64_t>(version);
    early_version_ = -1;
    for (size_t i = mine_.size(); i-- > 0;) {
      pulls_.emplace_back(mine_[i], issued ? early_pulls_[i] : PullBucket(*mine_[i], version, wire()));
    }
    PullReports();
  }
  // Blocks until every weight below flat offset `end` has arrived (forward
  // calls this layer by layer). A failure is kept for FinishWeights.
  void WaitUpTo(int64_t end) override { WaitPulls(end, nullptr); }
  // Waits for the rest of the weights and for the reports; checks them.
  Status FinishWeights() override { return FinishWeightsUnless(nullptr).status(); }
  StatusOr<bool> FinishWeightsUnless(const std::function<bool()>& interrupted) override {
    if (!WaitPulls(wire_elements(), interrupted)) return false;
    return FinishReports(interrupted);
  }

 private:
  uint16_t* wire() { return paged_wire_.data() ? reinterpret_cast<uint16_t*>(paged_wire_.data()) : wire_.data(); }

  // Casts the gradients of mine_[first, last) into `wire` at once if they
  // are one range of the space (backward order: descending); false
  // otherwise (each is cast as it is pushed).
  bool StageTogether(size_t first, size_t last, uint16_t* wire) {
    if (first >= last) return false;
    const int64_t lo = mine_[last - 1]->range.begin, hi = mine_[first]->range.end;
    for (size_t i = first + 1; i < last; ++i) {
      if (mine_[i]->range.end != mine_[i - 1]->range.begin) return false;
    }
    FloatsToBf16(grads_ + (lo - origin_), wire + (lo - origin_), hi - lo);
    return true;
  }
  uint16_t* push_wire() { return push_wire_.empty() ? wire() : push_wire_.data(); }

  // The pulls of weights below flat offset `end`, in forward order; false
  // when interrupted first (what is in stays in). Failures are kept for
  // FinishWeights.
  bool WaitPulls(int64_t end, const std::function<bool()>& interrupted) {
    while (next_pull_ < pulls_.size() && pulls_[next_pull_].first->range.begin - origin_ < end) {
      const auto [bucket, ticket] = pulls_[next_pull_];
      trace::Span span("wait for weights", "wait", {"bucket", bucket - plan_.buckets().data()},
                       {"version", static_cast<int64_t>(version_)});
      const std::optional<Status> st = Wait(ticket, interrupted);
      if (!st) return false;
      ++next_pull_;
      KeepPullFailure(*st);
      if (bf16_ && st->ok()) Unstage(*bucket, wire());
    }
    return true;
  }

  const bool stream_, elastic_;
  std::vector<uint16_t> wire_;       // bf16 staging for pulls (and pushes, unless push_wire_)
  PagedBuffer paged_wire_;           // a pipeline stage's, in wire_'s place
  std::vector<uint16_t> push_wire_;  // bf16 staging for pushes in an elastic job
  // Pulls in flight: bucket tickets in forward order, the next to wait for.
  std::vector<std::pair<const Bucket*, transport::PushPullClient::Ticket>> pulls_;
  size_t next_pull_ = 0;
  // `stream`: per bucket (backward order), its pull of early_version_.
  std::vector<transport::PushPullClient::Ticket> early_pulls_;
  int64_t early_version_ = -1;  // none issued
};

// Streamed weights (cluster.stream_weights): the worker's weights and
// gradients are PagedBuffers of which only a window is backed; the
// sharding/weight_window.h policy says which buckets are pulled (again in
// backward), waited for and let go, and when pushed gradients are waited
// for and let go. Every pass reaches the weights through the window's
// hooks (worker/reducers/weight_home.h's WindowedWeights), evaluation's too.
class StreamedWeightsSync : public PushPullSync, public WindowHooks, private BucketMoves {
 public:
  StreamedWeightsSync(const ParameterServerSyncOptions& o, transport::PushPullClient* client)
      : PushPullSync(o, client),
        paged_grads_(o.streamed_grads),
        local_plan_(plan_.Part({o.origin, o.origin + o.layout->size()})),
        runner_(WeightWindow(local_plan_, *o.layout, o.prefetch_layers, /*keep_after_forward=*/false,
                             LocalRanges(o)),
                o.streamed_weights, this),
        window_(runner_.window()),
        pulls_of_(window_.num_buckets()),
        pushes_of_(window_.num_buckets()) {}

  // bf16: the staging buffer is paged like the weights (a bucket is staged
  // from its pull until it lands, or from its push until it is retired; a
  // bucket is never pulled while its push is in flight).
  Status ReserveStaging() {
    if (!bf16_) return Status::OK();
    HERD_ASSIGN_OR_RETURN(paged_wire_, PagedBuffer::Reserve(wire_elements() * sizeof(uint16_t), /*guarded=*/false));
    return Status::OK();
  }

  void FinalFrom(int64_t offset) override {
    // Gradients computed from weights that did not arrive stay here.
    if (pull_status_.ok()) Execute(window_.FinalFrom(offset));
  }
  Status FinishStep(double loss) override {
    Execute(window_.RetireAll());
    HERD_RETURN_IF_ERROR(pull_status_);
    HERD_RETURN_IF_ERROR(std::exchange(push_status_, Status::OK()));
    return PushLossAndWait(loss);
  }
  void IssueWeights(float* weights, uint64_t version) override {
    StartVersion(weights, version);
    Execute(window_.ReleaseAll());
    Execute(window_.Start());
    PullReports();
  }
  void WaitUpTo(int64_t end) override { Execute(window_.NeedUpTo(end)); }
  // The weights come as the passes ask for them: only the reports here.
  Status FinishWeights() override { return FinishReports(nullptr).status(); }

  // The window's other hooks (worker/reducers/weight_home.h).
  void WaitFrom(int64_t begin) override { Execute(window_.NeedFrom(begin)); }
  void DoneFrom(int64_t offset) override { Execute(window_.DoneFrom(offset)); }
  void ReleaseWeights() override { Execute(window_.ReleaseAll()); }

 private:
  uint16_t* wire() { return reinterpret_cast<uint16_t*>(paged_wire_.data()); }

  void Execute(const WeightWindow::Actions& a) { runner_.Execute(a); }

  // The ranges the window covers as the worker's space names them.
  static std::vector<ParamRange> LocalRanges(const ParameterServerSyncOptions& o) {
    std::vector<ParamRange> local;
    for (const ParamRange& r : o.ranges) local.push_back({r.begin - o.origin, r.end - o.origin});
    return local;
  }
  // Window bucket i as the servers' space names it.
  Bucket Real(int i) const {
    const Bucket& b = window_.bucket(i);
    return {b.server, {b.range.begin + origin_, b.range.end + origin_}};
  }

  // The moves of the window's buckets: pulls and pushes (bf16: through
  // the staging buffer, paged like the weights).
  void Fill(int i) override { pulls_of_[i] = PullBucket(Real(i), version_, wire()); }
  // The pull has landed and, bf16, is in the weights; a failure is kept
  // for FinishStep and FinishWeights.
  void Land(int i) override {
    const Bucket& b = window_.bucket(i);
    trace::Span span("wait for weights", "wait", {"bucket", i}, {"version", static_cast<int64_t>(version_)});
    const std::optional<Status> st = Wait(pulls_of_[i], nullptr);
    KeepPullFailure(*st);
    if (!bf16_) return;
    if (st->ok()) Unstage(Real(i), wire());
    paged_wire_.Release(b.range.begin * sizeof(uint16_t), b.range.size() * sizeof(uint16_t));
  }
  void Send(int i) override { pushes_of_[i] = PushBucket(Real(i), wire()); }
  void Retire(int i) override {
    const Bucket& b = window_.bucket(i);
    trace::Span span("wait for push", "wait", {"bucket", i});
    Status st = wait_.Timed([&] { return client_->Wait(pushes_of_[i]); });
    if (!st.ok() && push_status_.ok()) push_status_ = st;
    paged_grads_->Release(b.range.begin * sizeof(float), b.range.size() * sizeof(float));
    if (bf16_) paged_wire_.Release(b.range.begin * sizeof(uint16_t), b.range.size() * sizeof(uint16_t));
  }

  // The gradients the window pages (the caller's), the bf16 staging, the
  // policy and its runner (which pages the weights), each bucket's latest
  // pull and push (forward index), the step's first failed push.
  PagedBuffer* const paged_grads_;
  PagedBuffer paged_wire_;
  const ShardPlan local_plan_;  // the plan as the worker's space names it
  WindowRunner runner_;
  WeightWindow& window_;  // runner_'s
  std::vector<transport::PushPullClient::Ticket> pulls_of_, pushes_of_;
  Status push_status_;
};

}  // namespace

StatusOr<StepReport> FindJoinPoint(transport::PushPullClient* client, transport::PeerId server, int epoch,
                                   int64_t last_step) {
  StepReport report;
  uint64_t tag = transport::kLatestReport;
  for (;;) {
    HERD_RETURN_IF_ERROR(
        client->Wait(client->Pull(server, transport::RequestKind::kReport, 0, &report, sizeof report, tag)));
    if ((tag != transport::kLatestReport && report.version != tag) ||
        report.version > static_cast<uint64_t>(last_step) || report.membership_epoch < 0) {
      return Status::Corruption("server 0 answered the report of step " +
                                (tag == transport::kLatestReport ? std::string("the newest") : std::to_string(tag)) +
                                " with one of step " + std::to_string(report.version) + ", membership epoch " +
                                std::to_string(report.membership_epoch) + " (the run ends at step " +
                                std::to_string(last_step) + ")");
    }
    if (report.membership_epoch >= epoch || static_cast<int64_t>(report.version) >= last_step) return report;
    tag = report.version + 1;
  }
}

uint64_t LargestBucketBytes(const ShardPlan& plan, int wire_bytes) {
  int64_t largest = 0;
  for (const Bucket& b : plan.buckets()) largest = std::max(largest, b.range.size());
  return static_cast<uint64_t>(largest) * wire_bytes;
}

StatusOr<ParameterServerSyncParts> CreateParameterServerSync(const ParameterServerSyncOptions& options,
                                                                    transport::UcxTransport* transport,
                                                                    transport::PushPullClient* client) {
  if (options.streamed_weights != nullptr && (options.layout == nullptr || options.streamed_grads == nullptr ||
                                              options.elastic)) {
    return Status::InvalidArgument("streamed weights need the layout and a paged gradient buffer, and no elastic job");
  }
  ParameterServerSyncParts parts;
  std::unique_ptr<PushPullSync> strategy;
  WindowHooks* window = nullptr;
  if (options.streamed_weights != nullptr) {
    auto streamed = std::make_unique<StreamedWeightsSync>(options, client);
    HERD_RETURN_IF_ERROR(streamed->ReserveStaging());
    window = streamed.get();
    strategy = std::move(streamed);
  } else {
    auto whole = std::make_unique<WholeWeightsSync>(options, client);
    HERD_RETURN_IF_ERROR(whole->ReserveStaging());
    strategy = std::move(whole);
  }
  for (auto [base, bytes] : strategy->wire_buffers()) HERD_RETURN_IF_ERROR(transport->RegisterMemory(base, bytes));
  parts.sync = Around(options.around, std::move(strategy));
  parts.home = window != nullptr ? WindowedWeights(*parts.sync, *window, options.streamed_grads)
                                 : WholeWeights(*parts.sync);
  return parts;
}

}  // namespace herd
