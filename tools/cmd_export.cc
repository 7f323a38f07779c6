// herd export CHECKPOINT --out DIR
// CHECKPOINT is a step directory or a checkpoint root (then its latest valid
// step). Writes a HuggingFace directory: config.json (LlamaForCausalLM,
// max_position_embeddings = the model's own when it has one, i.e. it was
// imported, else the checkpoint's train.seq_len) and
// model.safetensors (fp32).
#include <cstdio>

#include "common/logging.h"
#include "model/checkpoint_load.h"
#include "model/hf_io.h"
#include "model/param_layout.h"
#include "tools/args.h"
#include "tools/commands.h"

namespace herd::tools {

int RunExport(int argc, char** argv) {
  Args args({"out"}, {});
  Status st = args.Parse(argc, argv);
  if (!st.ok()) return ReportError(st.WithContext("export: "));
  if (args.positional().size() != 1 || !args.Has("out") || args.Get("out").empty()) {
    return ReportError(Status::InvalidArgument("usage: herd export CHECKPOINT --out DIR"));
  }
  const std::string& path = args.positional()[0];
  const std::string out = args.Get("out");
  auto ckpt = LoadCheckpointModel(path);
  if (!ckpt.ok()) return ReportError(ckpt.status());
  const config::ModelConfig& model = ckpt->config.model();
  const int max_positions = model.max_position_embeddings() > 0 ? model.max_position_embeddings()
                                                                  : ckpt->config.train().seq_len();
  st = WriteHfDirectory(out, model, ckpt->weights.data(), max_positions);
  if (!st.ok()) return ReportError(st);
  const ParamLayout layout(LlamaShape::FromConfig(model));
  std::printf("exported step %lld of %s (%lld parameters, %s embeddings) to %s: config.json, model.safetensors\n",
              static_cast<long long>(ckpt->step), path.c_str(), static_cast<long long>(layout.num_parameters()),
              model.tie_word_embeddings() ? "tied" : "untied", out.c_str());
  return 0;
}

}  // namespace herd::tools
