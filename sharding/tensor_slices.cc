#include "sharding/tensor_slices.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <string_view>

#include "model/hf_io.h"

namespace herd {
namespace {

LlamaShape RankShape(const LlamaShape& s, int ranks) {
  LlamaShape r = s;
  r.explicit_head_dim = s.head_dim();
  r.num_heads /= ranks;
  r.num_kv_heads /= ranks;
  r.intermediate_size /= ranks;
  r.vocab_size /= ranks;
  return r;
}

// Row-parallel matrices: a rank holds some of their input columns.
bool SplitsColumns(std::string_view name) {
  return name.ends_with("self_attn.o_proj.weight") || name.ends_with("mlp.down_proj.weight");
}

}  // namespace

StatusOr<TensorSlices> TensorSlices::Make(const LlamaShape& shape, int ranks, int rank) {
  const std::string T = std::to_string(ranks);
  if (ranks < 1 || rank < 0 || rank >= ranks) {
    return Status::InvalidArgument("cluster.tensor_parallel: rank " + std::to_string(rank) + " of " + T);
  }
  auto divides = [&](int n, const char* what) -> Status {
    if (n % ranks == 0) return Status::OK();
    return Status::InvalidArgument("cluster.tensor_parallel: " + T + " does not divide the model's " +
                                   std::to_string(n) + " " + what);
  };
  HERD_RETURN_IF_ERROR(divides(shape.num_heads, "attention heads (model.num_attention_heads)"));
  HERD_RETURN_IF_ERROR(divides(shape.num_kv_heads, "key/value heads (model.num_key_value_heads)"));
  HERD_RETURN_IF_ERROR(divides(shape.intermediate_size, "intermediate columns (model.intermediate_size)"));
  HERD_RETURN_IF_ERROR(divides(shape.vocab_size, "vocabulary rows (model.vocab_size)"));
  return TensorSlices(shape, ranks, rank);
}

TensorSlices::TensorSlices(const LlamaShape& shape, int ranks, int rank)
    : ranks_(ranks), rank_(rank), local_(RankShape(shape, ranks)) {
  vocab_first_ = static_cast<int64_t>(rank) * (shape.vocab_size / ranks);
  const ParamLayout flat(shape);
  // The two layouts add the same tensors in the same order.
  for (size_t i = 0; i < flat.tensors().size(); ++i) {
    const TensorSpec& g = flat.tensors()[i];
    const TensorSpec& l = local_.tensors()[i];
    if (g.shape.size() == 1) {
      runs_.push_back({{g.offset, g.offset + g.numel}, l.offset, /*replicated=*/true});
    } else if (SplitsColumns(g.name)) {
      // Each row's columns [rank * mine, (rank + 1) * mine).
      const int64_t rows = g.shape[0], cols = g.shape[1], mine = cols / ranks;
      for (int64_t row = 0; row < rows; ++row) {
        const int64_t begin = g.offset + row * cols + rank * mine;
        runs_.push_back({{begin, begin + mine}, l.offset + row * mine});
      }
    } else {
      const int64_t mine = l.numel;  // rows [rank * r, (rank + 1) * r) whole
      runs_.push_back({{g.offset + rank * mine, g.offset + (rank + 1) * mine}, l.offset});
    }
  }
}

void TensorSlices::Pack(const float* flat, float* local) const {
  for (const Run& r : runs_) std::memcpy(local + r.local, flat + r.flat.begin, r.flat.size() * sizeof(float));
}

void TensorSlices::Unpack(const float* local, float* flat) const {
  for (const Run& r : runs_) std::memcpy(flat + r.flat.begin, local + r.local, r.flat.size() * sizeof(float));
}

std::vector<ParamRange> TensorSlices::Ranges() const {
  std::vector<ParamRange> out;
  for (const Run& r : runs_) out.push_back(r.flat);
  return out;
}

std::vector<TensorSlices::Run> TensorSlices::RunsWithin(ParamRange local) const {
  std::vector<Run> out;
  for (const Run& r : runs_) {
    const int64_t lo = std::max(local.begin, r.local), hi = std::min(local.end, r.local + r.flat.size());
    if (lo < hi) out.push_back({{r.flat.begin + (lo - r.local), r.flat.begin + (hi - r.local)}, lo, r.replicated});
  }
  return out;
}

namespace {

// Element `at` of an array a view may leave null (zeros: an outer step's
// kept error where none is kept).
const float* At(const float* array, int64_t at) { return array != nullptr ? array + at : nullptr; }

}  // namespace

std::vector<ShardView> TensorSlices::FlatPieces(const std::vector<ShardView>& locals, bool with_norms) const {
  std::vector<ShardView> pieces;
  for (const ShardView& local : locals) {
    for (const ShardView& p : FlatPieces(local, with_norms)) pieces.push_back(p);
  }
  return pieces;
}

std::vector<ShardView> TensorSlices::FlatPieces(const ShardView& local, bool with_norms) const {
  std::vector<ShardView> pieces;
  for (const Run& run : RunsWithin({local.begin, local.end})) {
    if (run.replicated && !with_norms) continue;
    const int64_t at = run.local - local.begin;
    pieces.push_back({run.flat.begin, run.flat.end, local.step, At(local.weights, at), At(local.m, at),
                      At(local.v, at), local.spikes});
  }
  return pieces;
}

Status LoadPackedRange(const TensorSlices& slices, ParamRange local, const WeightInit& init, const ParamLayout& flat,
                       const std::optional<VerifiedCheckpoint>& resume_from, const PackedInto& into,
                       std::string_view prefix) {
  const std::vector<TensorSlices::Run> runs = slices.RunsWithin(local);
  // A run's first element in `into`'s arrays.
  auto to = [&](const TensorSlices::Run& r) { return r.local - local.begin; };
  if (resume_from) {
    // Each run from whatever shards wrote it.
    std::vector<ParamRange> ranges;
    for (const TensorSlices::Run& r : runs) ranges.push_back(r.flat);
    HERD_ASSIGN_OR_RETURN(std::vector<ShardState> read, ReadShardRanges(resume_from->dir, resume_from->manifest, ranges,
                                                                        /*with_moments=*/true, nullptr, prefix));
    for (size_t i = 0; i < read.size(); ++i) {
      std::copy(read[i].weights.begin(), read[i].weights.end(), into.weights + to(runs[i]));
      if (into.m != nullptr) std::copy(read[i].m.begin(), read[i].m.end(), into.m + to(runs[i]));
      if (into.v != nullptr) std::copy(read[i].v.begin(), read[i].v.end(), into.v + to(runs[i]));
    }
    *into.step = resume_from->manifest.step;
    if (!read.empty()) *into.spikes = read.front().spikes;
    return Status::OK();
  }
  // Tensor by tensor (a function of the seed and the tensor, or
  // init_from's file), the runs of it kept.
  size_t next = 0;
  std::vector<float> tensor;
  for (const TensorSpec& t : flat.tensors()) {
    if (next == runs.size()) break;
    if (runs[next].flat.begin >= t.offset + t.numel) continue;
    if (init.init_from.empty()) {
      tensor.resize(t.numel);
      InitTensor(t, init.seed, init.initializer_range, tensor.data());
    } else {
      HERD_ASSIGN_OR_RETURN(tensor, LoadInitialWeights(init.init_from, init.model, t.offset, t.offset + t.numel));
    }
    for (; next < runs.size() && runs[next].flat.begin < t.offset + t.numel; ++next) {
      const TensorSlices::Run& r = runs[next];
      std::copy(tensor.begin() + (r.flat.begin - t.offset), tensor.begin() + (r.flat.end - t.offset),
                into.weights + to(r));
    }
  }
  return Status::OK();
}

Status LoadPackedWeights(const TensorSlices& slices, const std::vector<ParamRange>& ranges, const WeightInit& init,
                         const ParamLayout& flat, const std::optional<VerifiedCheckpoint>& resume_from,
                         float* weights) {
  for (const ParamRange& r : ranges) {
    int64_t step = 0;  // the optimizer's, not these weights'
    SpikeStats spikes;
    std::fill(weights + r.begin, weights + r.end, 0.0f);
    HERD_RETURN_IF_ERROR(
        LoadPackedRange(slices, r, init, flat, resume_from, {weights + r.begin, nullptr, nullptr, &step, &spikes}));
  }
  return Status::OK();
}

StatusOr<std::unique_ptr<OptimizerSlices>> PackedOptimizerSlices(const TensorSlices& slices,
                                                                 const OptimizerOptions& options,
                                                                 const WeightInit& init, const ParamLayout& flat,
                                                                 const std::vector<ParamRange>& ranges,
                                                                 const std::optional<VerifiedCheckpoint>& resume_from,
                                                                 float* space) {
  std::vector<ShardState> states;
  for (const ParamRange& r : ranges) {
    ShardState& state = states.emplace_back();
    state.begin = r.begin;
    state.end = r.end;
    state.m.assign(r.size(), 0.0f);
    state.v.assign(r.size(), 0.0f);
    float* weights = space + r.begin;
    if (space == nullptr) {
      state.weights.assign(r.size(), 0.0f);
      weights = state.weights.data();
    } else {
      std::fill(weights, weights + r.size(), 0.0f);
    }
    HERD_RETURN_IF_ERROR(LoadPackedRange(slices, r, init, flat, resume_from,
                                         {weights, state.m.data(), state.v.data(), &state.step, &state.spikes}));
  }
  return OptimizerSlices::Attached(slices.layout(), options, std::move(states), space);
}

StatusOr<TensorParallelSpace> TensorParallelSpace::Make(const LlamaShape& shape, int ranks) {
  std::vector<TensorSlices> slices;
  for (int r = 0; r < ranks; ++r) {
    HERD_ASSIGN_OR_RETURN(TensorSlices s, TensorSlices::Make(shape, ranks, r));
    slices.push_back(std::move(s));
  }
  if (slices.empty()) return Status::InvalidArgument("cluster.tensor_parallel: no ranks");
  return TensorParallelSpace(std::move(slices));
}

std::vector<int64_t> TensorParallelSpace::RankCuts() const {
  std::vector<int64_t> cuts;
  for (int r = 1; r < ranks(); ++r) cuts.push_back(r * part());
  return cuts;
}

std::vector<int64_t> TensorParallelSpace::TensorStarts() const {
  std::vector<int64_t> starts;
  for (int r = 0; r < ranks(); ++r) {
    for (const TensorSpec& t : slices_[r].layout().tensors()) starts.push_back(r * part() + t.offset);
  }
  return starts;
}

std::vector<ParamRange> TensorParallelSpace::Copies() const {
  std::vector<ParamRange> out;
  for (int r = 1; r < ranks(); ++r) {
    for (const TensorSlices::Run& run : slices_[r].runs()) {
      if (run.replicated) out.push_back({r * part() + run.local, r * part() + run.local + run.flat.size()});
    }
  }
  return out;
}

std::vector<DecaySegment> TensorParallelSpace::DecaySegmentsOf(ParamRange range) const {
  std::vector<DecaySegment> out;
  for (int r = 0; r < ranks(); ++r) {
    const int64_t base = r * part();
    const int64_t lo = std::max(range.begin, base), hi = std::min(range.end, base + part());
    if (lo >= hi) continue;
    for (DecaySegment d : DecaySegments(slices_[r].layout(), lo - base, hi - base)) {
      out.push_back({d.begin + base, d.end + base, d.decay});
    }
  }
  return out;
}

std::vector<TensorParallelSpace::Run> TensorParallelSpace::RunsWithin(ParamRange range) const {
  std::vector<Run> out;
  for (int r = 0; r < ranks(); ++r) {
    const int64_t base = r * part();
    const int64_t lo = std::max(range.begin, base), hi = std::min(range.end, base + part());
    if (lo >= hi) continue;
    for (const TensorSlices::Run& run : slices_[r].RunsWithin({lo - base, hi - base})) {
      out.push_back({run.flat, base + run.local, run.replicated && r > 0});
    }
  }
  return out;
}

StatusOr<ShardState> TensorParallelSpace::Load(ParamRange range, const WeightInit& init, const ParamLayout& flat,
                                               const std::optional<VerifiedCheckpoint>& resume_from,
                                               std::string_view prefix) const {
  ShardState state;
  state.begin = range.begin;
  state.end = range.end;
  state.weights.assign(range.size(), 0.0f);
  state.m.assign(range.size(), 0.0f);
  state.v.assign(range.size(), 0.0f);
  for (int r = 0; r < ranks(); ++r) {
    const int64_t base = r * part();
    const int64_t lo = std::max(range.begin, base), hi = std::min(range.end, base + part());
    if (lo >= hi) continue;
    const int64_t at = lo - range.begin;
    HERD_RETURN_IF_ERROR(LoadPackedRange(
        slices_[r], {lo - base, hi - base}, init, flat, resume_from,
        {state.weights.data() + at, state.m.data() + at, state.v.data() + at, &state.step, &state.spikes}, prefix));
  }
  return state;
}

std::vector<ShardView> TensorParallelSpace::FlatPieces(const ShardView& range) const {
  std::vector<ShardView> pieces;
  for (int r = 0; r < ranks(); ++r) {
    const int64_t base = r * part();
    const int64_t lo = std::max(range.begin, base), hi = std::min(range.end, base + part());
    if (lo >= hi) continue;
    const int64_t at = lo - range.begin;
    const ShardView mine{lo - base, hi - base, range.step, At(range.weights, at), At(range.m, at), At(range.v, at),
                         range.spikes};
    for (const ShardView& p : slices_[r].FlatPieces(mine, /*with_norms=*/r == 0)) pieces.push_back(p);
  }
  std::sort(pieces.begin(), pieces.end(), [](const ShardView& a, const ShardView& b) { return a.begin < b.begin; });
  return pieces;
}

}  // namespace herd
