// How a model's decoder layers are cut into pipeline stages
// (cluster.pipeline_stages, docs/design.md "Parallel axes"): each virtual stage
// is a contiguous run of at least one layer; the first also embeds the
// tokens, the last also holds the final norm and the head. Because the
// flat space is laid out in forward order (embedding, layers, final norm,
// head), each stage's weights are one contiguous range of it, and the
// stages' ranges tile the space in order: the unit that a stage's weights,
// gradients, optimizer state and checkpoint parts are made of. With tied
// embeddings the last stage reads the embedding as its head too, and
// computes a part of the embedding's gradient that is added to the first
// stage's.
//
// Without an explicit split the layers are balanced by training FLOPs: a
// layer's matrix products and attention, the head's product on the last
// stage (on SmolLM-135M's shape the head costs as much as six layers), so
// that no stage holds the pipeline back more than it must.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "model/llama.h"
#include "model/llama_config.h"
#include "model/param_layout.h"

namespace herd {

struct PipelineStage {
  LayerRange layers;          // [first, end), at least one layer
  ParamRange params;          // the weights it reads and the gradients it computes
  bool reads_embedding = false;  // tied embeddings, the last stage (not also the first)
  double flops_per_token = 0;    // training FLOPs of its layers (and head), for balance and plans
};

class PipelineSplit {
 public:
  // `stages` virtual stages (pipeline_stages x virtual_stages), cut at
  // `split` (cluster.pipeline_split: each stage's first layer, "0,6,12,18")
  // or, when it is empty, balanced by FLOPs at `seq_len`. Errors, one line
  // naming the config fields: more stages than layers; a split of the
  // wrong length, not starting at 0, not increasing, or past the last
  // layer.
  static StatusOr<PipelineSplit> Make(const LlamaShape& shape, int stages, std::string_view split, int seq_len);

  const std::vector<PipelineStage>& stages() const { return stages_; }
  int size() const { return static_cast<int>(stages_.size()); }
  const PipelineStage& stage(int s) const { return stages_[s]; }
  // "0,9,18,26": the first layer of each stage, as cluster.pipeline_split takes it.
  std::string Describe() const;

 private:
  std::vector<PipelineStage> stages_;
};

}  // namespace herd
