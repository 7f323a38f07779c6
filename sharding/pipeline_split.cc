#include "sharding/pipeline_split.h"

#include <algorithm>
#include <charconv>
#include <limits>

#include "common/strings.h"

namespace herd {
namespace {

// The first layer of each of `stages` contiguous runs of the layers that
// minimises the costliest run, the head's cost on the last; ties go to
// the cut that gives the earlier runs more layers (the last run holds the
// head, whose memory also grows with the batch).
std::vector<int> BalancedCuts(int layers, int stages, double layer, double head) {
  const double inf = std::numeric_limits<double>::infinity();
  // best[s][i]: the least max cost of cutting layers [0, i) into s runs.
  std::vector<std::vector<double>> best(stages + 1, std::vector<double>(layers + 1, inf));
  std::vector<std::vector<int>> from(stages + 1, std::vector<int>(layers + 1, 0));
  best[0][0] = 0;
  for (int s = 1; s <= stages; ++s) {
    for (int i = s; i <= layers; ++i) {
      for (int j = i - 1; j >= s - 1; --j) {
        const double run = (i - j) * layer + (s == stages && i == layers ? head : 0.0);
        const double cost = std::max(best[s - 1][j], run);
        if (cost < best[s][i]) {
          best[s][i] = cost;
          from[s][i] = j;
        }
      }
    }
  }
  std::vector<int> cuts(stages);
  for (int s = stages, i = layers; s >= 1; --s) {
    i = from[s][i];
    cuts[s - 1] = i;
  }
  return cuts;
}

StatusOr<std::vector<int>> ParseCuts(std::string_view text, int layers, int stages) {
  const std::string field = "cluster.pipeline_split \"" + std::string(text) + "\"";
  std::vector<int> cuts;
  for (const std::string& part : Split(std::string(text), ',')) {
    const std::string p = Trim(part);
    int v = 0;
    const auto [end, ec] = std::from_chars(p.data(), p.data() + p.size(), v);
    if (p.empty() || ec != std::errc() || end != p.data() + p.size()) {
      return Status::InvalidArgument(field + ": '" + p + "' is not a layer number");
    }
    cuts.push_back(v);
  }
  if (static_cast<int>(cuts.size()) != stages) {
    return Status::InvalidArgument(field + ": expected " + std::to_string(stages) +
                                   " first layers (one per stage), got " + std::to_string(cuts.size()));
  }
  if (cuts[0] != 0) return Status::InvalidArgument(field + ": the first stage must start at layer 0");
  for (int s = 1; s < stages; ++s) {
    if (cuts[s] <= cuts[s - 1]) {
      return Status::InvalidArgument(field + ": not increasing (" + std::to_string(cuts[s - 1]) + " then " +
                                     std::to_string(cuts[s]) + "): stage " + std::to_string(s - 1) +
                                     " would be empty");
    }
  }
  if (cuts.back() >= layers) {
    return Status::InvalidArgument(field + ": stage " + std::to_string(stages - 1) + " starts at layer " +
                                   std::to_string(cuts.back()) + ", but the model has " + std::to_string(layers) +
                                   " layers (0-" + std::to_string(layers - 1) + ")");
  }
  return cuts;
}

}  // namespace

StatusOr<PipelineSplit> PipelineSplit::Make(const LlamaShape& shape, int stages, std::string_view split, int seq_len) {
  const int L = shape.num_layers;
  if (stages < 1) return Status::InvalidArgument("cluster.pipeline_stages must be >= 1, got " + std::to_string(stages));
  if (stages > L) {
    return Status::InvalidArgument("cluster.pipeline_stages x cluster.virtual_stages = " + std::to_string(stages) +
                                   " stages, but the model has " + std::to_string(L) +
                                   " layers: every stage needs at least one");
  }
  const double layer = LayerTrainingFlopsPerToken(shape, seq_len), head = HeadTrainingFlopsPerToken(shape);
  std::vector<int> cuts;
  if (split.empty()) {
    cuts = BalancedCuts(L, stages, layer, head);
  } else {
    HERD_ASSIGN_OR_RETURN(cuts, ParseCuts(split, L, stages));
  }
  const ParamLayout layout(shape);
  PipelineSplit out;
  for (int s = 0; s < stages; ++s) {
    PipelineStage st;
    st.layers.first = cuts[s];
    st.layers.end = s + 1 < stages ? cuts[s + 1] : L;
    st.params.begin = s == 0 ? 0 : layout.layer(st.layers.first).input_norm;
    st.params.end = s + 1 < stages ? layout.layer(st.layers.end).input_norm : layout.size();
    st.reads_embedding = shape.tie_word_embeddings && s == stages - 1 && s > 0;
    st.flops_per_token = (st.layers.end - st.layers.first) * layer + (s == stages - 1 ? head : 0.0);
    out.stages_.push_back(st);
  }
  return out;
}

std::string PipelineSplit::Describe() const {
  std::string out;
  for (const PipelineStage& s : stages_) {
    if (!out.empty()) out += ',';
    out += std::to_string(s.layers.first);
  }
  return out;
}

}  // namespace herd
