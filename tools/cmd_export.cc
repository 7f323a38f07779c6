// herd export CHECKPOINT --out DIR [--tokenizer tokenizer.json]
// CHECKPOINT is a step directory or a checkpoint root (then its latest valid
// step). Writes a HuggingFace directory: config.json (LlamaForCausalLM,
// max_position_embeddings = the model's own when it has one, i.e. it was
// imported, else the checkpoint's train.seq_len) and
// model.safetensors (fp32); and, when the job had a tokenizer
// (data.tokenizer, or --tokenizer), tokenizer.json and the
// tokenizer_config.json that AutoTokenizer reads.
#include <cstdio>

#include <nlohmann/json.hpp>

#include "common/file_util.h"
#include "common/logging.h"
#include "data/tokenizer.h"
#include "model/checkpoint_load.h"
#include "model/hf_io.h"
#include "model/param_layout.h"
#include "tools/args.h"
#include "tools/commands.h"

namespace herd::tools {

int RunExport(int argc, char** argv) {
  Args args({"out", "tokenizer"}, {});
  Status st = args.Parse(argc, argv);
  if (!st.ok()) return ReportError(st.WithContext("export: "));
  if (args.positional().size() != 1 || !args.Has("out") || args.Get("out").empty()) {
    return ReportError(Status::InvalidArgument("usage: herd export CHECKPOINT --out DIR [--tokenizer tokenizer.json]"));
  }
  const std::string& path = args.positional()[0];
  const std::string out = args.Get("out");
  auto ckpt = LoadCheckpointModel(path);
  if (!ckpt.ok()) return ReportError(ckpt.status());
  const config::ModelConfig& model = ckpt->config.model();
  const int max_positions = model.max_position_embeddings() > 0 ? model.max_position_embeddings()
                                                                  : ckpt->config.train().seq_len();
  std::vector<std::pair<std::string, std::string>> tokenizer_files;
  const std::string tokenizer = args.Has("tokenizer") ? args.Get("tokenizer") : ckpt->config.data().tokenizer();
  if (!tokenizer.empty()) {
    const std::string where = args.Has("tokenizer") ? "--tokenizer " : "the job's data.tokenizer ";
    auto loaded = Tokenizer::Load(tokenizer);
    if (!loaded.ok()) return ReportError(loaded.status().WithContext("export: " + where));
    const Tokenizer& t = **loaded;
    if (t.vocab_size() > model.vocab_size()) {
      return ReportError(Status::InvalidArgument("export: " + where + tokenizer + " has " +
                                                 std::to_string(t.vocab_size()) + " tokens, more than the model's " +
                                                 std::to_string(model.vocab_size())));
    }
    auto bytes = ReadFile(tokenizer);
    if (!bytes.ok()) return ReportError(bytes.status());
    nlohmann::json config = {{"tokenizer_class", "PreTrainedTokenizerFast"},
                             {"model_max_length", max_positions},
                             {"model_input_names", {"input_ids", "attention_mask"}},
                             {"clean_up_tokenization_spaces", false}};
    if (t.bos_token() >= 0) config["bos_token"] = std::string(t.Bytes(t.bos_token()));
    if (t.eos_token() >= 0) config["eos_token"] = std::string(t.Bytes(t.eos_token()));
    tokenizer_files = {{"tokenizer.json", std::move(bytes).value()}, {"tokenizer_config.json", config.dump(2) + "\n"}};
  }
  st = WriteHfDirectory(out, model, ckpt->weights.data(), max_positions, tokenizer_files);
  if (!st.ok()) return ReportError(st);
  const ParamLayout layout(LlamaShape::FromConfig(model));
  std::printf("exported step %lld of %s (%lld parameters, %s embeddings) to %s: config.json, model.safetensors%s\n",
              static_cast<long long>(ckpt->step), path.c_str(), static_cast<long long>(layout.num_parameters()),
              model.tie_word_embeddings() ? "tied" : "untied", out.c_str(),
              tokenizer_files.empty() ? "" : ", tokenizer.json, tokenizer_config.json");
  return 0;
}

}  // namespace herd::tools
