// Test tool for the PyTorch parity tests: loads a HuggingFace directory,
// runs herd's forward/backward and K AdamW steps exactly as the trainer
// does, and writes everything to a safetensors file for comparison.
//
//   model_dump HF_DIR TOKENS.i32 B T K LR MIN_LR WARMUP CLIP WD BETA1 BETA2 EPS OUT
//
// TOKENS.i32: raw int32, K*B*(T+1) ids; step k uses rows [k*B, (k+1)*B).
// OUT: "logits" [B,T,V], "loss" [1], "grad/<name>", "losses" [K],
// "grad_norms" [K], "final/<name>".
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/file_util.h"
#include "model/hf_io.h"
#include "model/llama.h"
#include "model/optim/adamw.h"
#include "model/optim/optimizer_shard.h"
#include "model/safetensors.h"
#include "sharding/job_options.h"

using namespace herd;  // NOLINT

int main(int argc, char** argv) {
  if (argc != 15) {
    std::fprintf(stderr, "usage: model_dump HF_DIR TOKENS B T K LR MIN_LR WARMUP CLIP WD BETA1 BETA2 EPS OUT\n");
    return 2;
  }
  auto hf = ReadHfDirectory(argv[1]);
  auto raw = ReadFile(argv[2]);
  if (!hf.ok() || !raw.ok()) {
    std::fprintf(stderr, "%s\n", (!hf.ok() ? hf.status() : raw.status()).message().c_str());
    return 1;
  }
  const int B = std::atoi(argv[3]), T = std::atoi(argv[4]), K = std::atoi(argv[5]);
  config::OptimizerConfig opt;
  opt.set_lr(std::atof(argv[6]));
  opt.set_min_lr(std::atof(argv[7]));
  opt.set_warmup_steps(std::atoi(argv[8]));
  opt.set_clip_norm(std::atof(argv[9]));
  opt.set_weight_decay(std::atof(argv[10]));
  opt.set_beta1(std::atof(argv[11]));
  opt.set_beta2(std::atof(argv[12]));
  opt.set_eps(std::atof(argv[13]));
  const std::string out = argv[14];

  const std::vector<int32_t> tokens(reinterpret_cast<const int32_t*>(raw->data()),
                                    reinterpret_cast<const int32_t*>(raw->data() + raw->size()));
  if (tokens.size() != static_cast<size_t>(K) * B * (T + 1)) {
    std::fprintf(stderr, "tokens: expected %d ids\n", K * B * (T + 1));
    return 1;
  }
  LlamaModel<float> model(LlamaShape::FromConfig(hf->model), B, T);
  const ParamLayout& layout = model.layout();
  const int64_t P = layout.size(), V = hf->model.vocab_size();
  std::vector<float>& params = hf->params;
  std::vector<float> grads(P);
  std::vector<int32_t> inputs(B * T), targets(B * T);
  auto load_batch = [&](int k) {
    for (int b = 0; b < B; ++b) {
      const int32_t* row = tokens.data() + (static_cast<int64_t>(k) * B + b) * (T + 1);
      std::copy(row, row + T, inputs.begin() + b * T);
      std::copy(row + 1, row + T + 1, targets.begin() + b * T);
    }
  };

  std::vector<SafetensorsEntry> entries;
  std::vector<std::vector<float>> keep;  // storage behind the entries
  auto add = [&](const std::string& name, std::vector<int64_t> shape, std::vector<float> data) {
    keep.push_back(std::move(data));
    entries.push_back({name, std::move(shape), nullptr});
  };

  // Step-0 batch: logits, loss, gradients.
  load_batch(0);
  const double loss = model.Forward(params.data(), inputs.data(), targets.data(), B, T);
  add("logits", {B, T, V}, std::vector<float>(model.logits(), model.logits() + static_cast<int64_t>(B) * T * V));
  add("loss", {1}, {static_cast<float>(loss)});
  model.Backward(params.data(), grads.data(), 1.0 / (B * T));
  for (const TensorSpec& t : layout.tensors()) {
    add("grad/" + t.name, t.shape, std::vector<float>(grads.begin() + t.offset, grads.begin() + t.offset + t.numel));
  }

  // K steps, exactly the one-process trainer's optimizer step
  // (OptimizerShard::Step on the global norm, in place on params).
  ShardState state;
  state.end = P;
  state.weights = params;
  state.m.assign(P, 0.0f);
  state.v.assign(P, 0.0f);
  OptimizerShard optimizer(layout, OptimizerOptionsOf(opt, K), std::move(state));
  optimizer.AttachWeights(params.data());
  std::vector<float> losses, norms;
  for (int k = 0; k < K; ++k) {
    load_batch(k);
    std::fill(grads.begin(), grads.end(), 0.0f);
    const double step_loss = model.Forward(params.data(), inputs.data(), targets.data(), B, T);
    losses.push_back(static_cast<float>(step_loss));
    model.Backward(params.data(), grads.data(), 1.0 / (B * T));
    const double norm = std::sqrt(SumOfSquares(grads.data(), P));
    optimizer.Step(grads.data(), norm, step_loss);
    norms.push_back(static_cast<float>(norm));
  }
  add("losses", {K}, losses);
  add("grad_norms", {K}, norms);
  for (const TensorSpec& t : layout.tensors()) {
    add("final/" + t.name, t.shape,
        std::vector<float>(params.begin() + t.offset, params.begin() + t.offset + t.numel));
  }
  for (size_t i = 0; i < entries.size(); ++i) entries[i].data = keep[i].data();
  Status st = WriteSafetensors(out, entries);
  if (!st.ok()) {
    std::fprintf(stderr, "%s\n", st.message().c_str());
    return 1;
  }
  return 0;
}
