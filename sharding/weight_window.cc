#include "sharding/weight_window.h"

#include <glog/logging.h>

#include <algorithm>
#include <utility>

namespace herd {

WeightWindow::WeightWindow(const ShardPlan& plan, const ParamLayout& layout, int prefetch, bool keep_after_forward,
                           const std::vector<ParamRange>& ranges)
    : buckets_(ranges.empty() ? BucketsWithin(plan, {{0, layout.size()}}) : BucketsWithin(plan, ranges)),
      units_(layout.UnitBoundaries()),
      prefetch_(std::max(prefetch, 0)),
      keep_after_forward_(keep_after_forward) {
  const LlamaShape& s = layout.shape();
  if (layout.lm_head() == layout.embed()) kept_end_ = s.num_layers > 0 ? layout.layer(0).input_norm : layout.final_norm();
  next_push_ = num_buckets() - 1;
  backward_begin_ = layout.size();
}

int64_t WeightWindow::UnitsAway(int64_t offset, int n) const {
  const int last = static_cast<int>(units_.size()) - 1;
  int i = static_cast<int>(std::lower_bound(units_.begin(), units_.end(), offset) - units_.begin());
  if (n < 0 && (i > last || units_[i] != offset)) --i;  // below: from the boundary under offset
  i = std::clamp(i + n, 0, last);
  return units_[i];
}

bool WeightWindow::Kept(int i) const { return buckets_[i].range.begin < kept_end_; }

void WeightWindow::Hold(int64_t lo, int64_t hi, bool wait, Actions& a) {
  // Buckets tile the space in order: from the one holding lo.
  int i = static_cast<int>(std::upper_bound(buckets_.begin(), buckets_.end(), lo,
                                            [](int64_t x, const Bucket& b) { return x < b.range.begin; }) -
                           buckets_.begin());
  for (i = std::max(i - 1, 0); i < num_buckets() && buckets_[i].range.begin < hi; ++i) {
    if (buckets_[i].range.end <= lo) continue;
    if (held_.insert(i).second) a.pull.push_back(i);
    if (wait) a.wait.push_back(i);
  }
}

template <typename Pred>
void WeightWindow::ReleaseIf(Pred pred, Actions& a) {
  for (auto it = held_.begin(); it != held_.end();) {
    if (pred(*it)) {
      a.release.push_back(*it);
      it = held_.erase(it);
    } else {
      ++it;
    }
  }
}

WeightWindow::Actions WeightWindow::Start() {
  Actions a;
  const int64_t first = buckets_.empty() ? 0 : buckets_.front().range.begin;
  Hold(first, UnitsAway(first, prefetch_ + 1), /*wait=*/false, a);
  return a;
}

WeightWindow::Actions WeightWindow::NeedUpTo(int64_t end) {
  Actions a;
  if (end <= forward_end_) {
    // A new pass: whatever an earlier pass left beyond what this one
    // starts with goes (a forward-only pass ends holding the head).
    const int64_t ahead = UnitsAway(end, prefetch_);
    ReleaseIf([&](int i) { return buckets_[i].range.begin >= ahead && !Kept(i); }, a);
    forward_end_ = UnitsAway(end, -1);  // the pass's first unit's begin
  }
  if (!keep_after_forward_) {
    ReleaseIf([&](int i) { return buckets_[i].range.end <= forward_end_ && !Kept(i); }, a);
  }
  Hold(forward_end_, end, /*wait=*/true, a);
  // The head reads a tied embedding (held already where the pass began
  // with it).
  if (end == units_.back() && kept_end_ > 0) Hold(0, kept_end_, /*wait=*/true, a);
  Hold(end, UnitsAway(end, prefetch_), /*wait=*/false, a);
  forward_end_ = end;
  return a;
}

WeightWindow::Actions WeightWindow::NeedFrom(int64_t begin) {
  Actions a;
  if (begin >= backward_begin_) backward_begin_ = UnitsAway(begin, 1);  // a new pass, from its first unit's end
  Hold(begin, backward_begin_, /*wait=*/true, a);
  Hold(UnitsAway(begin, -prefetch_), begin, /*wait=*/false, a);
  backward_begin_ = begin;
  return a;
}

WeightWindow::Actions WeightWindow::FinalFrom(int64_t offset) {
  Actions a;
  // Buckets are pushed in backward's order: highest offsets first, each
  // once a step.
  for (; next_push_ >= 0 && buckets_[next_push_].range.begin >= offset; --next_push_) {
    in_flight_.push_back(next_push_);
    a.push.push_back(next_push_);
  }
  const int64_t retire_from = UnitsAway(offset, prefetch_ + 1);
  while (!in_flight_.empty() && buckets_[in_flight_.front()].range.begin >= retire_from) {
    a.retire.push_back(in_flight_.front());
    in_flight_.pop_front();
  }
  return a;
}

WeightWindow::Actions WeightWindow::DoneFrom(int64_t offset) {
  Actions a;
  ReleaseIf([&](int i) { return buckets_[i].range.begin >= offset; }, a);
  return a;
}

WeightWindow::Actions WeightWindow::ReleaseAll() {
  Actions a;
  ReleaseIf([](int) { return true; }, a);
  forward_end_ = 0;
  backward_begin_ = units_.back();
  return a;
}

WeightWindow::Actions WeightWindow::RetireAll() {
  Actions a;
  a.retire.assign(in_flight_.begin(), in_flight_.end());
  in_flight_.clear();
  next_push_ = num_buckets() - 1;
  return a;
}

namespace {

// A window driven through a step's hooks without a model: what it holds
// of weights, gradients and staging as the hooks go, and the peak.
class Replayer {
 public:
  // `accumulated`: gradients of these ranges are written from the start
  // (micro-batches accumulate); the rest are counted as backward writes them.
  Replayer(WeightWindow window, const StreamedReplay& replay, const std::vector<ParamRange>& accumulated)
      : w_(std::move(window)),
        replay_(replay),
        staged_bytes_(replay.wire_bytes == sizeof(float) ? 0 : replay.wire_bytes),  // fp32 lands in place
        grads_(w_.num_buckets(), false),
        pulling_(w_.num_buckets(), false) {
    for (const ParamRange& r : accumulated) Written(r.begin, r.end);
  }

  WeightWindow& window() { return w_; }

  void Apply(const WeightWindow::Actions& a) {
    for (int i : a.release) now_.weights -= Size(i) * kF32;
    for (int i : a.pull) {
      pulled_ += Size(i);
      now_.weights += Size(i) * kF32;
      now_.staging += Size(i) * staged_bytes_;
      pulling_[i] = true;
    }
    Sample();
    for (int i : a.wait) {
      if (pulling_[i]) now_.staging -= Size(i) * staged_bytes_;
      pulling_[i] = false;
    }
    for (int i : a.push) now_.staging += Size(i) * staged_bytes_;
    Sample();
    for (int i : a.retire) {
      now_.staging -= Size(i) * staged_bytes_;
      // The slice a retire keeps stays counted (and is never written again).
      now_.gradients -= (Size(i) - (replay_.kept_on_retire.empty() ? 0 : replay_.kept_on_retire[i])) * kF32;
      grads_[i] = false;
    }
  }

  // Backward has written the gradients of [lo, hi).
  void Written(int64_t lo, int64_t hi) {
    for (int i = 0; i < w_.num_buckets(); ++i) {
      const ParamRange& r = w_.bucket(i).range;
      if (r.end > lo && r.begin < hi && !grads_[i]) {
        grads_[i] = true;
        now_.gradients += Size(i) * kF32;
      }
    }
  }

  StreamedPeak Finish() {
    Apply(w_.RetireAll());
    StreamedPeak p = peak_;
    p.pulled = pulled_;
    return p;
  }

 private:
  static constexpr int64_t kF32 = sizeof(float);
  int64_t Size(int i) const { return w_.bucket(i).range.size(); }
  void Sample() {
    if (now_.total() > peak_.total()) peak_ = now_;
  }

  WeightWindow w_;
  const StreamedReplay replay_;
  const int64_t staged_bytes_;
  std::vector<bool> grads_;    // gradients written and not let go
  std::vector<bool> pulling_;  // staged pulls not yet landed
  StreamedPeak now_, peak_;
  int64_t pulled_ = 0;
};

// The decoder layer l's end: the next unit's begin.
int64_t LayerEnd(const ParamLayout& layout, int l) {
  return l + 1 < layout.shape().num_layers ? layout.layer(l + 1).input_norm : layout.final_norm();
}

int64_t EmbeddingEnd(const ParamLayout& layout) {
  return layout.shape().num_layers > 0 ? layout.layer(0).input_norm : layout.final_norm();
}

}  // namespace

StreamedPeak ReplayStreamedStep(const ShardPlan& plan, const ParamLayout& layout, const StreamedReplay& replay) {
  const int final_lag = replay.final_lag;
  std::vector<ParamRange> accumulated;
  if (replay.accumulates) accumulated.push_back({0, layout.size()});
  Replayer r(WeightWindow(plan, layout, replay.prefetch, replay.keep_after_forward), replay, accumulated);
  WeightWindow& w = r.window();
  const LlamaShape& s = layout.shape();
  const bool tied = layout.lm_head() == layout.embed();
  // The hooks of LlamaModel's Forward and Backward (model/model.h), in order.
  const int64_t embed_end = EmbeddingEnd(layout);
  r.Apply(w.NeedUpTo(embed_end));
  for (int l = 0; l < s.num_layers; ++l) r.Apply(w.NeedUpTo(LayerEnd(layout, l)));
  r.Apply(w.NeedUpTo(layout.size()));
  // Units computed and not yet final, newest last: their [begin, end).
  std::deque<std::pair<int64_t, int64_t>> computed;
  auto finalize = [&] {
    const auto [begin, end] = computed.front();
    computed.pop_front();
    r.Written(begin, end);
    if (tied && end == layout.size()) r.Written(0, embed_end);  // tied head
    r.Apply(w.FinalFrom(begin));
    r.Apply(w.DoneFrom(begin));
  };
  int64_t above = layout.size();
  auto backward_unit = [&](int64_t begin, bool reads_weights) {
    if (reads_weights) r.Apply(w.NeedFrom(begin));
    computed.emplace_back(begin, above);
    above = begin;
    while (static_cast<int>(computed.size()) > final_lag) finalize();
  };
  backward_unit(layout.final_norm(), true);
  for (int l = s.num_layers - 1; l >= 0; --l) backward_unit(layout.layer(l).input_norm, true);
  backward_unit(0, false);
  while (!computed.empty()) finalize();
  return r.Finish();
}

StreamedPeak ReplayStreamedStage(const ShardPlan& plan, const ParamLayout& layout, const StreamedReplay& replay,
                                 const StageReplay& stage) {
  const PipelineSchedule& sched = *stage.schedule;
  const int M = sched.micro_batches;
  const bool split = sched.kind == PipelineScheduleKind::kZeroBubble;
  // Micro-batches accumulate in the stage's gradients until the last.
  Replayer r(WeightWindow(plan, layout, replay.prefetch, /*keep_after_forward=*/false, stage.ranges), replay,
             M > 1 ? stage.ranges : std::vector<ParamRange>{});
  WeightWindow& w = r.window();
  const int L = layout.shape().num_layers;
  const bool tied = layout.lm_head() == layout.embed();
  const int64_t embed_end = EmbeddingEnd(layout);
  // The hooks of LlamaModel's stage passes (model/llama.h), as a stage's
  // worker (worker/placements/pipeline_passes.cc) hands them over: `done` lets go of
  // the weights at >= x, `final` pushes the gradients there (on the last
  // micro-batch).
  auto done = [&](int64_t x) { r.Apply(w.DoneFrom(x)); };
  auto final = [&](int64_t x, int64_t end) {
    r.Written(x, end);
    r.Apply(w.FinalFrom(x));
  };
  for (const PipelineAction& a : sched.actions[stage.device]) {
    const LayerRange c = stage.chunk_layers[a.chunk];
    const bool embeds = c.first == 0, head = c.end == L, last = a.micro_batch == M - 1;
    if (a.kind == PipelineAction::kForward) {
      if (embeds) r.Apply(w.NeedUpTo(c.first < c.end ? layout.layer(c.first).input_norm : layout.final_norm()));
      for (int l = c.first; l < c.end; ++l) r.Apply(w.NeedUpTo(LayerEnd(layout, l)));
      if (head) {
        r.Apply(w.NeedUpTo(layout.size()));
        r.Written(layout.final_norm(), layout.size());  // the head's backward runs with its forward
        if (tied) r.Written(0, embed_end);
      }
      continue;
    }
    const bool input_part = a.kind == PipelineAction::kBackward;
    const bool reads_weights = input_part, finals = last && (a.kind == PipelineAction::kWeightGrad || !split);
    // A unit's backward: its weights read (the input part), its gradients
    // written and, on the last micro-batch, final (the weight part).
    auto unit = [&](int64_t begin, int64_t end, bool needs) {
      if (needs && reads_weights) r.Apply(w.NeedFrom(begin));
      if (finals) final(begin, end);
      if (!split || a.kind == PipelineAction::kWeightGrad) r.Written(begin, end);
      if (reads_weights) done(begin);
    };
    if (head) unit(layout.final_norm(), layout.size(), /*needs=*/false);
    for (int l = c.end - 1; l >= c.first; --l) unit(layout.layer(l).input_norm, LayerEnd(layout, l), true);
    if (embeds) unit(0, embed_end, /*needs=*/false);
  }
  // The step's end: every gradient of the stage final (a tied embedding's
  // head part on the last stage too).
  r.Apply(w.FinalFrom(0));
  return r.Finish();
}

StageReplay StageReplayOf(const PipelinePlan& pipeline, int device, const ParamLayout& layout) {
  const PipelineSchedule& s = pipeline.schedule;
  StageReplay stage;
  stage.schedule = &s;
  stage.device = device;
  for (int c = 0; c < s.chunks; ++c) stage.chunk_layers.push_back(pipeline.split.stage(s.VirtualStage(device, c)).layers);
  stage.ranges = pipeline.RangesOf(device, layout);
  return stage;
}

StreamedReplay ReplayOfJob(const config::JobConfig& config, int micro_batch_slots) {
  const config::ClusterConfig& cluster = config.cluster();
  const bool gpu = config.device().kind() == config::DeviceConfig::CUDA;
  StreamedReplay replay;
  replay.prefetch = cluster.stream_prefetch_layers();
  replay.wire_bytes = cluster.sync() == config::ClusterConfig::PARAMETER_SERVER &&
                              cluster.wire_dtype() == config::ClusterConfig::BF16
                          ? 2
                          : 4;
  replay.accumulates = !gpu && config.train().grad_accum() > micro_batch_slots;
  // A GPU model ships a unit's gradients while it computes the next.
  replay.final_lag = gpu ? 1 : 0;
  replay.keep_after_forward = cluster.zero_stage() == 3 && !cluster.reshard_after_forward();
  return replay;
}

}  // namespace herd
