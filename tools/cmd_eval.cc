// herd eval MODEL --data FILE [--seq-len T] [--batch-size B] [--batches N]
// MODEL is a herd checkpoint (step directory or root) or a HuggingFace
// directory. Prints {"loss": ..., "tokens": ...}.
#include <omp.h>

#include <cstdio>

#include "common/config.h"
#include "common/logging.h"
#include "common/memory.h"
#include "data/token_file.h"
#include "model/hf_io.h"
#include "model/llama.h"
#include "model/model.h"
#include "tools/args.h"
#include "tools/commands.h"
#include "worker/evaluate.h"

namespace herd::tools {

int RunEval(int argc, char** argv) {
  Args args({"data", "seq-len", "batch-size", "batches", "threads"}, {});
  Status st = args.Parse(argc, argv);
  if (!st.ok()) return ReportError(st.WithContext("eval: "));
  if (args.positional().size() != 1 || !args.Has("data")) {
    return ReportError(Status::InvalidArgument(
        "usage: herd eval MODEL --data FILE [--seq-len T] [--batch-size B] [--batches N]"));
  }
  const std::string& path = args.positional()[0];
  auto loaded = LoadModelWeights(path);
  if (!loaded.ok()) return ReportError(loaded.status());
  const config::ModelConfig& model_config = loaded->model;
  const std::vector<float>& weights = loaded->weights;
  const int default_seq_len = loaded->seq_len > 0 ? loaded->seq_len : 1024;
  auto T = args.GetInt("seq-len", default_seq_len, 1);
  auto B = args.GetInt("batch-size", 8, 1);
  auto N = args.GetInt("batches", 0, 0);
  auto threads = args.GetInt("threads", 0, 0, kMaxThreads);
  for (const auto* v : {&T, &B, &N, &threads}) {
    if (!v->ok()) return ReportError(v->status());
  }
  if (*threads > 0) omp_set_num_threads(static_cast<int>(*threads));
  auto file = TokenFile::Open(args.Get("data"), model_config.vocab_size());
  if (!file.ok()) return ReportError(file.status());
  const LlamaShape shape = LlamaShape::FromConfig(model_config);
  // The activations are the one allocation that grows with the options.
  st = CheckFitsInMemory(LlamaModel<float>::ActivationBytes(shape, static_cast<int>(*B), static_cast<int>(*T)),
                         "eval --batch-size " + std::to_string(*B) + " --seq-len " + std::to_string(*T));
  if (!st.ok()) return ReportError(st);
  auto model = NewCpuModel(shape, static_cast<int>(*B), static_cast<int>(*T));
  auto result = EvaluateLoss(*model, weights.data(), *file, static_cast<int>(*B), static_cast<int>(*T), *N);
  if (!result.ok()) return ReportError(result.status());
  std::printf("{\"loss\": %.9g, \"tokens\": %lld}\n", result->loss, static_cast<long long>(result->tokens));
  return 0;
}

}  // namespace herd::tools
