#include "sharding/weight_window.h"

#include <glog/logging.h>

#include <algorithm>

namespace herd {

WeightWindow::WeightWindow(const ShardPlan& plan, const ParamLayout& layout, int prefetch, bool keep_after_forward)
    : buckets_(plan.buckets().rbegin(), plan.buckets().rend()),
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
  Hold(0, UnitsAway(0, prefetch_ + 1), /*wait=*/false, a);
  return a;
}

WeightWindow::Actions WeightWindow::NeedUpTo(int64_t end) {
  Actions a;
  if (end <= forward_end_) {
    // A new pass: whatever an earlier pass left beyond what this one
    // starts with goes (a forward-only pass ends holding the head).
    const int64_t ahead = UnitsAway(end, prefetch_);
    ReleaseIf([&](int i) { return buckets_[i].range.begin >= ahead && !Kept(i); }, a);
    forward_end_ = 0;
  }
  if (!keep_after_forward_) {
    ReleaseIf([&](int i) { return buckets_[i].range.end <= forward_end_ && !Kept(i); }, a);
  }
  Hold(forward_end_, end, /*wait=*/true, a);
  Hold(end, UnitsAway(end, prefetch_), /*wait=*/false, a);
  forward_end_ = end;
  return a;
}

WeightWindow::Actions WeightWindow::NeedFrom(int64_t begin) {
  Actions a;
  if (begin >= backward_begin_) backward_begin_ = units_.back();  // a new pass
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

StreamedPeak ReplayStreamedStep(const ShardPlan& plan, const ParamLayout& layout, const StreamedReplay& replay) {
  const int wire_bytes = replay.wire_bytes, final_lag = replay.final_lag;
  const bool accumulates = replay.accumulates;
  WeightWindow w(plan, layout, replay.prefetch, replay.keep_after_forward);
  const int64_t f32 = sizeof(float);
  const int64_t staged_bytes = wire_bytes == sizeof(float) ? 0 : wire_bytes;  // fp32 lands in place
  std::vector<bool> grads(w.num_buckets(), accumulates);  // gradients written and not let go
  std::vector<bool> pulling(w.num_buckets(), false);      // staged pulls not yet landed
  StreamedPeak now, peak;
  int64_t pulled = 0;
  auto size = [&](int i) { return w.bucket(i).range.size(); };
  auto sample = [&] {
    if (now.total() > peak.total()) peak = now;
  };
  auto apply = [&](const WeightWindow::Actions& a) {
    for (int i : a.release) now.weights -= size(i) * f32;
    for (int i : a.pull) {
      pulled += size(i);
      now.weights += size(i) * f32;
      now.staging += size(i) * staged_bytes;
      pulling[i] = true;
    }
    sample();
    for (int i : a.wait) {
      if (pulling[i]) now.staging -= size(i) * staged_bytes;
      pulling[i] = false;
    }
    for (int i : a.push) now.staging += size(i) * staged_bytes;
    sample();
    for (int i : a.retire) {
      now.staging -= size(i) * staged_bytes;
      // The slice a retire keeps stays counted (and is never written again).
      now.gradients -= (size(i) - (replay.kept_on_retire.empty() ? 0 : replay.kept_on_retire[i])) * f32;
      grads[i] = false;
    }
  };
  // Backward has written the gradients of [lo, hi).
  auto written = [&](int64_t lo, int64_t hi) {
    for (int i = 0; i < w.num_buckets(); ++i) {
      const ParamRange& r = w.bucket(i).range;
      if (r.end > lo && r.begin < hi && !grads[i]) {
        grads[i] = true;
        now.gradients += size(i) * f32;
      }
    }
  };
  if (accumulates) now.gradients = layout.size() * f32;
  const LlamaShape& s = layout.shape();
  // The hooks of LlamaModel's Forward and Backward (model/model.h), in order.
  const int64_t embed_end = s.num_layers > 0 ? layout.layer(0).input_norm : layout.final_norm();
  apply(w.NeedUpTo(embed_end));
  for (int l = 0; l < s.num_layers; ++l) {
    apply(w.NeedUpTo(l + 1 < s.num_layers ? layout.layer(l + 1).input_norm : layout.final_norm()));
  }
  apply(w.NeedUpTo(layout.size()));
  // Units computed and not yet final, newest last: their [begin, end).
  std::deque<std::pair<int64_t, int64_t>> computed;
  auto finalize = [&] {
    const auto [begin, end] = computed.front();
    computed.pop_front();
    written(begin, end);
    if (layout.lm_head() == layout.embed() && end == layout.size()) written(0, embed_end);  // tied head
    apply(w.FinalFrom(begin));
    apply(w.DoneFrom(begin));
  };
  int64_t above = layout.size();
  auto backward_unit = [&](int64_t begin, bool reads_weights) {
    if (reads_weights) apply(w.NeedFrom(begin));
    computed.emplace_back(begin, above);
    above = begin;
    while (static_cast<int>(computed.size()) > final_lag) finalize();
  };
  backward_unit(layout.final_norm(), true);
  for (int l = s.num_layers - 1; l >= 0; --l) backward_unit(layout.layer(l).input_norm, true);
  backward_unit(0, false);
  while (!computed.empty()) finalize();
  apply(w.RetireAll());
  peak.pulled = pulled;
  return peak;
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
