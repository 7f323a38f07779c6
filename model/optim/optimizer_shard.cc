#include "model/optim/optimizer_shard.h"

#include <glog/logging.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "model/hf_io.h"

namespace herd {

OptimizerShard::OptimizerShard(const ParamLayout& layout, const OptimizerOptions& options, ShardState state)
    : OptimizerShard(DecaySegments(layout, state.begin, state.end), options, std::move(state)) {}

OptimizerShard::OptimizerShard(std::vector<DecaySegment> segments, const OptimizerOptions& options, ShardState state)
    : range_{state.begin, state.end},
      segments_(std::move(segments)),
      options_(options),
      own_weights_(std::move(state.weights)),
      weights_(own_weights_.data()),
      m_(std::move(state.m)),
      v_(std::move(state.v)),
      step_(state.step),
      spikes_(state.spikes) {
  const auto n = static_cast<size_t>(range_.size());
  CHECK(own_weights_.size() == n && m_.size() == n && v_.size() == n)
      << "optimizer state does not cover [" << range_.begin << ", " << range_.end << ")";
}

OptimizerShard::OptimizerShard(const ParamLayout& layout, const OptimizerOptions& options, ShardState state,
                               float* space)
    : range_{state.begin, state.end},
      segments_(DecaySegments(layout, state.begin, state.end)),
      options_(options),
      weights_(space + state.begin),
      m_(std::move(state.m)),
      v_(std::move(state.v)),
      step_(state.step),
      spikes_(state.spikes) {
  const auto n = static_cast<size_t>(range_.size());
  CHECK(state.weights.empty() && m_.size() == n && v_.size() == n)
      << "optimizer state does not cover [" << range_.begin << ", " << range_.end << ")";
}

StatusOr<std::unique_ptr<OptimizerShard>> OptimizerShard::InitOrResume(
    const OptimizerOptions& options, const WeightInit& init, const ParamLayout& layout, ParamRange range,
    const std::optional<VerifiedCheckpoint>& resume_from) {
  ShardState state;
  if (resume_from.has_value()) {
    HERD_ASSIGN_OR_RETURN(state, ReadShardRange(resume_from->dir, resume_from->manifest, range.begin, range.end,
                                                /*with_moments=*/true));
  } else {
    state.begin = range.begin;
    state.end = range.end;
    if (!init.init_from.empty()) {
      HERD_ASSIGN_OR_RETURN(state.weights, LoadInitialWeights(init.init_from, init.model, range.begin, range.end));
    } else {
      state.weights.resize(range.size());
      InitParameterRange(layout, init.seed, init.initializer_range, range.begin, range.end, state.weights.data());
    }
    state.m.assign(range.size(), 0.0f);
    state.v.assign(range.size(), 0.0f);
  }
  return std::make_unique<OptimizerShard>(layout, options, std::move(state));
}

void OptimizerShard::AttachWeights(float* space) {
  float* mine = space + range_.begin;
  if (mine != weights_) std::memcpy(mine, weights_, static_cast<size_t>(size()) * sizeof(float));
  weights_ = mine;
  own_weights_.clear();
  own_weights_.shrink_to_fit();
}

void OptimizerShard::ReleaseArrays() {
  weights_ = nullptr;
  for (std::vector<float>* a : {&own_weights_, &m_, &v_}) {
    a->clear();
    a->shrink_to_fit();
  }
}

Status LoadWeightRanges(const ParamLayout& layout, const WeightInit& init, const std::vector<ParamRange>& ranges,
                        const std::optional<VerifiedCheckpoint>& resume_from, float* weights) {
  if (resume_from) return ReadShardRanges(resume_from->dir, resume_from->manifest, ranges, false, weights).status();
  for (const ParamRange& r : ranges) {
    if (init.init_from.empty()) {
      InitParameterRange(layout, init.seed, init.initializer_range, r.begin, r.end, weights + r.begin);
      continue;
    }
    HERD_ASSIGN_OR_RETURN(std::vector<float> loaded, LoadInitialWeights(init.init_from, init.model, r.begin, r.end));
    std::copy(loaded.begin(), loaded.end(), weights + r.begin);
  }
  return Status::OK();
}

Status CheckNotDiverged(const char* what, double value) {
  if (std::isfinite(value)) return Status::OK();
  return Status::FailedPrecondition(std::string("the ") + what + " is " + std::to_string(value) +
                                    " (diverged; lower optimizer.lr or raise optimizer.warmup_steps)");
}

OptimizerShard::Scalars OptimizerShard::BeginStep(double global_norm, double loss) {
  Scalars s;
  s.step = step_ + 1;
  s.lr = LearningRate(options_.schedule, step_);
  s.grad_scale = ClipCoefficient(global_norm, options_.clip_norm);
  s.global_norm = global_norm;
  if (options_.skip_spikes_zscore > 0) {
    s.spike = JudgeAndUpdate(&spikes_, loss, global_norm, options_.skip_spikes_zscore, options_.skip_spikes_window);
  }
  return s;
}

void OptimizerShard::Apply(const Scalars& s, ParamRange sub, const float* grads) {
  Apply(s, sub, AdamWStreams{grads, nullptr, nullptr});
}

void OptimizerShard::Apply(const Scalars& s, ParamRange sub, const AdamWStreams& io) {
  if (s.spike.skip) return;
  // The decay segments of [sub.begin, sub.end): AdamW is elementwise, so
  // stepping a range in pieces gives the bits of stepping it at once.
  std::vector<DecaySegment> pieces;
  for (const DecaySegment& seg : segments_) {
    const int64_t lo = std::max(seg.begin, sub.begin), hi = std::min(seg.end, sub.end);
    if (lo < hi) pieces.push_back({lo, hi, seg.decay});
  }
  const int64_t at = sub.begin - range_.begin;
  AdamWStep(pieces, sub.begin, weights_ + at, io, m_.data() + at, v_.data() + at, s.step, s.lr, s.grad_scale,
            options_.adamw);
}

OptimizerShard::Scalars OptimizerShard::Step(const float* grads, double global_norm, double loss) {
  const Scalars s = BeginStep(global_norm, loss);
  Apply(s, range_, grads);
  EndStep();
  return s;
}

Status OptimizerShard::Save(const std::string& path) const {
  return WriteShard(path, view());
}

StatusOr<std::unique_ptr<OptimizerSlices>> OptimizerSlices::InitOrResume(
    const OptimizerOptions& options, const WeightInit& init, const ParamLayout& layout,
    const std::vector<ParamRange>& ranges, const std::optional<VerifiedCheckpoint>& resume_from, float* space) {
  auto out = std::make_unique<OptimizerSlices>();
  out->ranges_ = ranges;
  std::vector<ShardState> states;
  if (resume_from.has_value()) {
    HERD_ASSIGN_OR_RETURN(states, ReadShardRanges(resume_from->dir, resume_from->manifest, ranges,
                                                  /*with_moments=*/true, space));
  } else {
    std::vector<float> loaded;  // init_from's weights of [first begin, last end)
    if (!init.init_from.empty() && !ranges.empty()) {
      HERD_ASSIGN_OR_RETURN(loaded,
                            LoadInitialWeights(init.init_from, init.model, ranges.front().begin, ranges.back().end));
    }
    for (const ParamRange& r : ranges) {
      ShardState state;
      state.begin = r.begin;
      state.end = r.end;
      float* into = space + r.begin;
      if (space == nullptr) {
        state.weights.resize(r.size());
        into = state.weights.data();
      }
      if (!loaded.empty()) {
        std::copy_n(loaded.begin() + (r.begin - ranges.front().begin), r.size(), into);
      } else {
        InitParameterRange(layout, init.seed, init.initializer_range, r.begin, r.end, into);
      }
      state.m.assign(r.size(), 0.0f);
      state.v.assign(r.size(), 0.0f);
      states.push_back(std::move(state));
    }
  }
  for (ShardState& state : states) {
    out->slices_.push_back(space != nullptr ? std::make_unique<OptimizerShard>(layout, options, std::move(state), space)
                                            : std::make_unique<OptimizerShard>(layout, options, std::move(state)));
  }
  return out;
}

std::unique_ptr<OptimizerSlices> OptimizerSlices::Attached(const ParamLayout& layout, const OptimizerOptions& options,
                                                           std::vector<ShardState> states, float* space) {
  auto out = std::make_unique<OptimizerSlices>();
  for (ShardState& state : states) {
    out->ranges_.push_back({state.begin, state.end});
    out->slices_.push_back(space != nullptr
                               ? std::make_unique<OptimizerShard>(layout, options, std::move(state), space)
                               : std::make_unique<OptimizerShard>(layout, options, std::move(state)));
  }
  return out;
}

std::vector<ShardView> OptimizerSlices::views() const {
  std::vector<ShardView> views;
  for (const auto& slice : slices_) views.push_back(slice->view());
  return views;
}

int64_t OptimizerSlices::size() const {
  int64_t n = 0;
  for (const ParamRange& r : ranges_) n += r.size();
  return n;
}

void OptimizerSlices::AttachWeights(float* space) {
  for (auto& slice : slices_) slice->AttachWeights(space);
}

OptimizerShard::Scalars OptimizerSlices::Step(const float* grads, double global_norm, double loss) {
  OptimizerShard::Scalars s;
  for (auto& slice : slices_) s = slice->Step(grads + slice->range().begin, global_norm, loss);
  return s;
}

Status OptimizerSlices::Save(const std::string& path) const { return WriteShardPieces(path, views()); }

}  // namespace herd
