// HuggingFace interop: a directory with config.json (LlamaForCausalLM keys)
// and model.safetensors, read into / written from the flat parameter space.
//
// Promises: Write leaves either the complete directory or nothing new
// (files written atomically); Read validates config.json and every tensor's
// name, dtype and shape before use, converting F32, BF16 and F16 to fp32,
// and names the file and tensor in every error.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "model/param_layout.h"
#include "proto/herd.pb.h"

namespace herd {

struct HfModel {
  config::ModelConfig model;  // shape fields filled from config.json
  std::vector<float> params;  // ParamLayout(model) order, padding zero
};

// `max_position_embeddings` goes to config.json (HF needs one; herd uses
// the training sequence length). extra_files (name, bytes), e.g. the
// tokenizer's, are written beside config.json and the weights.
Status WriteHfDirectory(const std::string& dir, const config::ModelConfig& model, const float* params,
                        int max_position_embeddings,
                        const std::vector<std::pair<std::string, std::string>>& extra_files = {});
StatusOr<HfModel> ReadHfDirectory(const std::string& dir);

// True when `dir` looks like a HuggingFace model directory (has config.json).
bool IsHfDirectory(const std::string& dir);

// The weights of a model given as a HuggingFace directory or a herd
// checkpoint (a step directory, or a root: its newest complete step), as
// `herd eval` and checkpoint.init_from accept it.
struct LoadedModel {
  config::ModelConfig model;
  std::vector<float> weights;  // the whole flat space
  int seq_len = 0;             // the checkpoint's train.seq_len; 0 for HF
};
StatusOr<LoadedModel> LoadModelWeights(const std::string& path);

// checkpoint.init_from's (`path`: empty, or what it names) model shape
// only (config.json, or the checkpoint's config.textproto), checked
// against `model`: what a launcher verifies once before starting every
// process.
Status CheckInitFrom(const std::string& path, const config::ModelConfig& model);

// checkpoint.init_from's weights (at `path`) for [begin, end) of a
// `model`-shaped space; an error naming the path when its model has
// another shape.
StatusOr<std::vector<float>> LoadInitialWeights(const std::string& path, const config::ModelConfig& model,
                                                int64_t begin, int64_t end);

}  // namespace herd
