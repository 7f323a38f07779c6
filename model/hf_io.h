// HuggingFace interop: a directory with config.json (LlamaForCausalLM keys)
// and model.safetensors, read into / written from the flat parameter space.
//
// Promises: Write leaves either the complete directory or nothing new
// (files written atomically); Read validates config.json and every tensor's
// name, dtype and shape before use, converting F32, BF16 and F16 to fp32,
// and names the file and tensor in every error.
#pragma once

#include <string>
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
// the training sequence length).
Status WriteHfDirectory(const std::string& dir, const config::ModelConfig& model, const float* params,
                        int max_position_embeddings);
StatusOr<HfModel> ReadHfDirectory(const std::string& dir);

// True when `dir` looks like a HuggingFace model directory (has config.json).
bool IsHfDirectory(const std::string& dir);

}  // namespace herd
