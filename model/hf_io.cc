#include "model/hf_io.h"

#include "model/checkpoint_load.h"
#include "model/checkpoint_run.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "common/config.h"
#include "common/file_util.h"
#include "model/llama_config.h"
#include "model/safetensors.h"

namespace herd {
namespace {

using json = nlohmann::json;

constexpr char kConfigJson[] = "config.json";
constexpr char kWeights[] = "model.safetensors";
constexpr char kIndex[] = "model.safetensors.index.json";

// The relations herd checks for any job's model (divisibility, even
// head_dim, RoPE scaling). A job's other settings are no part of a model
// directory: train.seq_len is kept within max_position_embeddings.
Status ValidateModel(const config::ModelConfig& model) {
  config::JobConfig job;
  *job.mutable_model() = model;
  job.mutable_train()->set_seq_len(1);
  return ValidateJobConfig(job);
}

// ---------------------------------------------------------------- writing

nlohmann::ordered_json ConfigJson(const config::ModelConfig& m, int max_position_embeddings) {
  const LlamaShape s = LlamaShape::FromConfig(m);
  nlohmann::ordered_json j;
  j["architectures"] = {"LlamaForCausalLM"};
  j["model_type"] = "llama";
  j["hidden_size"] = s.hidden_size;
  j["intermediate_size"] = s.intermediate_size;
  j["num_hidden_layers"] = s.num_layers;
  j["num_attention_heads"] = s.num_heads;
  j["num_key_value_heads"] = s.num_kv_heads;
  j["head_dim"] = s.head_dim();
  j["vocab_size"] = s.vocab_size;
  // RoPE in both forms: transformers 4.x reads rope_theta and rope_scaling,
  // 5.x rope_parameters.
  nlohmann::ordered_json scaling = nullptr;
  if (m.rope_scaling().rope_type() == config::RopeScaling::LLAMA3) {
    const config::RopeScaling& rs = m.rope_scaling();
    scaling = {{"rope_type", "llama3"},
               {"factor", rs.factor()},
               {"low_freq_factor", rs.low_freq_factor()},
               {"high_freq_factor", rs.high_freq_factor()},
               {"original_max_position_embeddings", rs.original_max_position_embeddings()}};
  }
  nlohmann::ordered_json rope = {{"rope_type", "default"}};
  if (!scaling.is_null()) rope = scaling;
  rope["rope_theta"] = s.rope_theta;
  j["rope_theta"] = s.rope_theta;
  j["rope_scaling"] = scaling;
  j["rope_parameters"] = rope;
  j["rms_norm_eps"] = s.rms_norm_eps;
  j["tie_word_embeddings"] = s.tie_word_embeddings;
  j["hidden_act"] = "silu";
  j["max_position_embeddings"] = max_position_embeddings;
  j["initializer_range"] = m.initializer_range();
  j["attention_bias"] = false;
  j["mlp_bias"] = false;
  j["dtype"] = "float32";
  return j;
}

// Writes model.safetensors, then config.json (each atomically) into `dir`.
Status WriteHfFiles(const std::string& dir, const config::ModelConfig& model, const float* params,
                    int max_position_embeddings, const std::vector<std::pair<std::string, std::string>>& extra_files) {
  for (const auto& [name, bytes] : extra_files) HERD_RETURN_IF_ERROR(WriteFileAtomic(JoinPath(dir, name), bytes));
  ParamLayout layout(LlamaShape::FromConfig(model));
  std::vector<SafetensorsEntry> entries;
  // Tied: the layout has no lm_head.weight, and HF omits it too.
  for (const TensorSpec& t : layout.tensors()) entries.push_back({t.name, t.shape, params + t.offset});
  HERD_RETURN_IF_ERROR(WriteSafetensors(JoinPath(dir, kWeights), entries));
  return WriteFileAtomic(JoinPath(dir, kConfigJson), ConfigJson(model, max_position_embeddings).dump(2) + "\n");
}

// ---------------------------------------------------------------- reading

// Reads config.json keys with type checks; every error names the file and key.
class ConfigReader {
 public:
  // `prefix` names the object `j` within the file ("rope_parameters.").
  ConfigReader(const std::string& path, const json& j, const std::string& prefix = "")
      : path_(path), j_(j), prefix_(prefix) {}

  // The value of `key`, or nullptr when absent or null.
  const json* Get(const std::string& key) const {
    auto it = j_.find(key);
    return it == j_.end() || it->is_null() ? nullptr : &*it;
  }
  Status Error(const std::string& key, const std::string& what) const {
    return Status::InvalidArgument(path_ + ": \"" + prefix_ + key + "\" " + what);
  }
  static std::string Shown(const json& v) {
    std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
    return s.size() > 80 ? s.substr(0, 77) + "..." : s;
  }

  // A positive int32; `fallback` < 0 means the key is required.
  Status PositiveInt(const std::string& key, int fallback, int* out) const {
    const json* v = Get(key);
    if (v == nullptr) {
      if (fallback < 0) return Status::InvalidArgument(path_ + ": missing required key \"" + prefix_ + key + "\"");
      *out = fallback;
      return Status::OK();
    }
    // nlohmann parses non-negative integers as unsigned.
    if (!v->is_number_unsigned() || v->get<uint64_t>() < 1 || v->get<uint64_t>() > INT32_MAX) {
      return Error(key, "must be a positive integer, got " + Shown(*v));
    }
    *out = v->get<int>();
    return Status::OK();
  }
  Status PositiveNumber(const std::string& key, double fallback, double* out) const {
    const json* v = Get(key);
    if (v == nullptr) {
      *out = fallback;
      return Status::OK();
    }
    if (!v->is_number() || !(v->get<double>() > 0) || !std::isfinite(v->get<double>())) {
      return Error(key, "must be a positive number, got " + Shown(*v));
    }
    *out = v->get<double>();
    return Status::OK();
  }
  Status Bool(const std::string& key, bool fallback, bool* out) const {
    const json* v = Get(key);
    if (v == nullptr) {
      *out = fallback;
      return Status::OK();
    }
    if (!v->is_boolean()) return Error(key, "must be true or false, got " + Shown(*v));
    *out = v->get<bool>();
    return Status::OK();
  }

  // Every key of the object, in file order.
  std::vector<std::string> Keys() const {
    std::vector<std::string> keys;
    for (auto it = j_.begin(); it != j_.end(); ++it) keys.push_back(it.key());
    return keys;
  }

 private:
  const std::string& path_;
  const json& j_;
  const std::string prefix_;
};

// A RoPE dict (4.x's "rope_scaling", 5.x's "rope_parameters").
struct RopeDict {
  std::optional<double> theta;  // its "rope_theta", when present
  config::RopeScaling scaling;  // rope_type DEFAULT: plain RoPE
};

StatusOr<RopeDict> ParseRopeDict(const ConfigReader& r) {
  RopeDict out;
  std::string type = "default", type_key = "rope_type";
  for (const char* key : {"type", "rope_type"}) {  // transformers prefers rope_type
    if (const json* t = r.Get(key)) {
      if (!t->is_string()) return r.Error(key, "must be a string, got " + r.Shown(*t));
      type = t->get<std::string>();
      type_key = key;
    }
  }
  std::set<std::string> known = {"type", "rope_type", "rope_theta", "partial_rotary_factor"};
  if (type == "llama3") {
    known.insert({"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"});
  } else if (type != "default") {
    return r.Error(type_key, "\"" + type + "\" is not supported (herd implements \"default\" and \"llama3\")");
  }
  for (const std::string& key : r.Keys()) {
    if (!known.count(key)) return r.Error(key, "is not supported with rope_type \"" + type + "\"");
  }
  if (r.Get("rope_theta") != nullptr) {
    double theta;
    HERD_RETURN_IF_ERROR(r.PositiveNumber("rope_theta", 0, &theta));
    out.theta = theta;
  }
  if (const json* p = r.Get("partial_rotary_factor"); p != nullptr && !(p->is_number() && p->get<double>() == 1.0)) {
    return r.Error("partial_rotary_factor", r.Shown(*p) + " is not supported (herd rotates the whole head)");
  }
  if (type == "llama3") {
    config::RopeScaling& rs = out.scaling;
    double factor, low, high;
    int original;
    for (const char* key : {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}) {
      if (r.Get(key) == nullptr) return r.Error(key, "is required with rope_type \"llama3\"");
    }
    HERD_RETURN_IF_ERROR(r.PositiveNumber("factor", 0, &factor));
    HERD_RETURN_IF_ERROR(r.PositiveNumber("low_freq_factor", 0, &low));
    HERD_RETURN_IF_ERROR(r.PositiveNumber("high_freq_factor", 0, &high));
    HERD_RETURN_IF_ERROR(r.PositiveInt("original_max_position_embeddings", -1, &original));
    if (!(high > low)) {
      return r.Error("high_freq_factor", "must be greater than low_freq_factor, got " + r.Shown(high) +
                                             " <= " + r.Shown(low));
    }
    rs.set_rope_type(config::RopeScaling::LLAMA3);
    rs.set_factor(factor);
    rs.set_low_freq_factor(low);
    rs.set_high_freq_factor(high);
    rs.set_original_max_position_embeddings(original);
  }
  return out;
}

// rope_theta and the RoPE scaling, from either form of config.json:
// transformers 4.x writes "rope_theta" and "rope_scaling" (null, or a dict
// with "rope_type"), 5.x "rope_parameters" ({"rope_theta", "rope_type",
// ...}). Where both forms are present they must agree, so that every
// version of transformers reads the model herd reads.
Status ParseRope(const std::string& path, const json& j, config::ModelConfig* m) {
  ConfigReader r(path, j);
  std::vector<std::pair<std::string, RopeDict>> dicts;
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    const json* d = r.Get(key);
    if (d == nullptr) continue;
    if (!d->is_object()) return r.Error(key, "must be an object or null, got " + r.Shown(*d));
    if (d->empty()) continue;  // transformers: {} is no scaling
    HERD_ASSIGN_OR_RETURN(RopeDict parsed, ParseRopeDict(ConfigReader(path, *d, std::string(key) + ".")));
    dicts.emplace_back(key, std::move(parsed));
  }
  if (dicts.size() == 2 &&
      dicts[0].second.scaling.SerializeAsString() != dicts[1].second.scaling.SerializeAsString()) {
    return r.Error("rope_scaling", "and \"rope_parameters\" describe different RoPE (" +
                                       r.Shown(*r.Get("rope_scaling")) + " vs " + r.Shown(*r.Get("rope_parameters")) +
                                       ")");
  }
  double theta = 10000.0;  // LlamaConfig's default
  std::string theta_from;
  if (r.Get("rope_theta") != nullptr) {
    HERD_RETURN_IF_ERROR(r.PositiveNumber("rope_theta", 0, &theta));
    theta_from = "rope_theta";
  }
  for (const auto& [key, dict] : dicts) {
    if (!dict.theta) continue;
    if (!theta_from.empty() && *dict.theta != theta) {
      return Status::InvalidArgument(path + ": \"" + theta_from + "\" " + r.Shown(theta) + " and \"" + key +
                                     ".rope_theta\" " + r.Shown(*dict.theta) + " disagree");
    }
    theta = *dict.theta;
    theta_from = key + ".rope_theta";
  }
  if (const json* p = r.Get("partial_rotary_factor"); p != nullptr && !(p->is_number() && p->get<double>() == 1.0)) {
    return r.Error("partial_rotary_factor", r.Shown(*p) + " is not supported (herd rotates the whole head)");
  }
  m->set_rope_theta(theta);
  if (!dicts.empty() && dicts[0].second.scaling.rope_type() != config::RopeScaling::DEFAULT) {
    *m->mutable_rope_scaling() = dicts[0].second.scaling;
  }
  return Status::OK();
}

// A Llama? model_type "llama" or architectures naming LlamaForCausalLM.
Status CheckIsLlama(const ConfigReader& r, const std::string& path) {
  const json* type = r.Get("model_type");
  const json* archs = r.Get("architectures");
  if (type != nullptr && !type->is_string()) return r.Error("model_type", "must be a string, got " + r.Shown(*type));
  bool llama = type != nullptr && type->get<std::string>() == "llama";
  if (archs != nullptr) {
    if (!archs->is_array()) return r.Error("architectures", "must be an array of strings, got " + r.Shown(*archs));
    for (const json& a : *archs) llama = llama || (a.is_string() && a.get<std::string>() == "LlamaForCausalLM");
  }
  if (llama) return Status::OK();
  return Status::InvalidArgument(path + ": not a Llama model (model_type " + (type ? r.Shown(*type) : "absent") +
                                 ", architectures " + (archs ? r.Shown(*archs) : "absent") +
                                 "); expected model_type \"llama\" or architectures [\"LlamaForCausalLM\"]");
}

// What LlamaConfig allows and herd's Llama does not compute: biases,
// another activation, dropout, quantized weights.
Status RefuseUnsupported(const ConfigReader& r) {
  bool attention_bias, mlp_bias;
  HERD_RETURN_IF_ERROR(r.Bool("attention_bias", false, &attention_bias));
  HERD_RETURN_IF_ERROR(r.Bool("mlp_bias", false, &mlp_bias));
  if (attention_bias) return r.Error("attention_bias", "true is not supported (herd's Llama has no biases)");
  if (mlp_bias) return r.Error("mlp_bias", "true is not supported (herd's Llama has no biases)");
  if (const json* act = r.Get("hidden_act")) {
    // transformers maps "swish" to the same SiLU.
    if (!act->is_string() || (act->get<std::string>() != "silu" && act->get<std::string>() != "swish")) {
      return r.Error("hidden_act", r.Shown(*act) + " is not supported (expected \"silu\")");
    }
  }
  if (const json* p = r.Get("attention_dropout"); p != nullptr && !(p->is_number() && p->get<double>() == 0.0)) {
    return r.Error("attention_dropout", r.Shown(*p) + " is not supported (herd's Llama has no dropout; expected 0)");
  }
  if (const json* q = r.Get("quantization_config")) {
    return r.Error("quantization_config", r.Shown(*q) + " is not supported (herd reads F32, BF16 or F16 weights)");
  }
  return Status::OK();
}

// config.json -> ModelConfig. Absent optional keys take HF LlamaConfig's
// defaults, so that a directory means to herd what it means to transformers.
StatusOr<config::ModelConfig> ParseConfigJson(const std::string& path) {
  HERD_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  json j = json::parse(text, /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::InvalidArgument(path + ": not valid JSON");
  if (!j.is_object()) return Status::InvalidArgument(path + ": expected a JSON object");
  ConfigReader r(path, j);
  HERD_RETURN_IF_ERROR(CheckIsLlama(r, path));

  config::ModelConfig m;
  int vocab, hidden, inter, layers, heads, kv_heads;
  HERD_RETURN_IF_ERROR(r.PositiveInt("vocab_size", -1, &vocab));
  HERD_RETURN_IF_ERROR(r.PositiveInt("hidden_size", -1, &hidden));
  HERD_RETURN_IF_ERROR(r.PositiveInt("intermediate_size", -1, &inter));
  HERD_RETURN_IF_ERROR(r.PositiveInt("num_hidden_layers", -1, &layers));
  HERD_RETURN_IF_ERROR(r.PositiveInt("num_attention_heads", -1, &heads));
  HERD_RETURN_IF_ERROR(r.PositiveInt("num_key_value_heads", heads, &kv_heads));
  double eps, init_range;
  HERD_RETURN_IF_ERROR(r.PositiveNumber("rms_norm_eps", 1e-6, &eps));
  HERD_RETURN_IF_ERROR(r.PositiveNumber("initializer_range", 0.02, &init_range));
  bool tied;
  HERD_RETURN_IF_ERROR(r.Bool("tie_word_embeddings", false, &tied));
  HERD_RETURN_IF_ERROR(RefuseUnsupported(r));
  HERD_RETURN_IF_ERROR(ParseRope(path, j, &m));
  m.set_vocab_size(vocab);
  m.set_hidden_size(hidden);
  m.set_intermediate_size(inter);
  m.set_num_hidden_layers(layers);
  m.set_num_attention_heads(heads);
  m.set_num_key_value_heads(kv_heads);
  m.set_rms_norm_eps(eps);
  m.set_tie_word_embeddings(tied);
  m.set_initializer_range(init_range);
  if (r.Get("max_position_embeddings") != nullptr) {
    int max_positions;
    HERD_RETURN_IF_ERROR(r.PositiveInt("max_position_embeddings", -1, &max_positions));
    m.set_max_position_embeddings(max_positions);
  }

  Status st = ValidateModel(m);
  if (!st.ok()) {
    std::string msg = st.message();
    if (msg.starts_with("model.")) msg = msg.substr(6);
    return Status::InvalidArgument(path + ": " + msg);
  }
  if (const json* hd = r.Get("head_dim")) {
    if (!hd->is_number_unsigned() || hd->get<uint64_t>() != static_cast<uint64_t>(hidden / heads)) {
      return r.Error("head_dim", r.Shown(*hd) + " is not supported: herd needs head_dim = hidden_size / " +
                                     "num_attention_heads = " + std::to_string(hidden / heads));
    }
  }
  return m;
}

// The tensors of a directory: one model.safetensors, or the shards listed in
// model.safetensors.index.json.
struct WeightFiles {
  std::string origin;  // the file that names the tensors, for errors
  std::vector<SafetensorsFile> files;
  std::map<std::string, std::pair<const SafetensorsFile*, const SafetensorsTensor*>> tensors;
};

StatusOr<WeightFiles> OpenWeights(const std::string& dir) {
  WeightFiles w;
  const std::string single = JoinPath(dir, kWeights), index = JoinPath(dir, kIndex);
  std::vector<std::string> names;  // file names inside dir
  std::map<std::string, std::string> weight_map;
  if (PathExists(single) || !PathExists(index)) {  // HF prefers the single file too
    w.origin = single;
    names.push_back(kWeights);
  } else {
    w.origin = index;
    HERD_ASSIGN_OR_RETURN(std::string text, ReadFile(index));
    json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) return Status::InvalidArgument(index + ": not a valid JSON object");
    auto wm = j.find("weight_map");
    if (wm == j.end() || !wm->is_object()) {
      return Status::InvalidArgument(index + ": needs \"weight_map\": {tensor: file}");
    }
    std::set<std::string> distinct;
    for (auto it = wm->begin(); it != wm->end(); ++it) {
      if (!it->is_string()) return Status::InvalidArgument(index + ": weight_map \"" + it.key() + "\" must name a file");
      const std::string file = it->get<std::string>();
      if (file.empty() || file == "." || file == ".." || file.find('/') != std::string::npos) {
        return Status::InvalidArgument(index + ": weight_map \"" + it.key() + "\": '" + file +
                                       "' is not a file name in the directory");
      }
      weight_map[it.key()] = file;
      distinct.insert(file);
    }
    names.assign(distinct.begin(), distinct.end());
  }
  // `tensors` points into `files`: reserve so that no push_back moves an
  // element; moving the vector itself (returning it) keeps its buffer.
  w.files.reserve(names.size());
  for (const std::string& name : names) {
    auto file = SafetensorsFile::Open(JoinPath(dir, name));
    if (!file.ok()) {
      if (file.status().code() == Status::Code::kNotFound && w.origin == single) {
        return Status::NotFound(dir + ": no " + std::string(kWeights) + " (nor " + kIndex + ")");
      }
      return file.status();
    }
    w.files.push_back(std::move(file).value());
    const SafetensorsFile& f = w.files.back();
    for (const SafetensorsTensor& t : f.tensors()) {
      auto [it, fresh] = w.tensors.try_emplace(t.name, &f, &t);
      if (!fresh) {
        return Status::InvalidArgument(f.path() + ": tensor '" + t.name + "' also appears in " +
                                       it->second.first->path());
      }
    }
  }
  for (const auto& [tensor, file] : weight_map) {
    auto it = w.tensors.find(tensor);
    if (it == w.tensors.end() || it->second.first->path() != JoinPath(dir, file)) {
      return Status::InvalidArgument(index + ": weight_map puts '" + tensor + "' in " + file +
                                     ", but that file does not hold it");
    }
  }
  return w;
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// Buffers HF keeps in some checkpoints and herd recomputes.
bool IsIgnoredBuffer(const std::string& name) {
  return name.starts_with("model.layers.") && name.ends_with(".self_attn.rotary_emb.inv_freq");
}

}  // namespace

Status WriteHfDirectory(const std::string& dir_in, const config::ModelConfig& model, const float* params,
                        int max_position_embeddings,
                        const std::vector<std::pair<std::string, std::string>>& extra_files) {
  std::string dir = dir_in;
  while (dir.size() > 1 && dir.ends_with('/')) dir.pop_back();
  if (dir.empty()) return Status::InvalidArgument("export: empty output directory name");
  if (max_position_embeddings <= 0) {
    return Status::InvalidArgument(dir + ": max_position_embeddings must be > 0, got " +
                                   std::to_string(max_position_embeddings));
  }
  HERD_RETURN_IF_ERROR(ValidateModel(model).WithContext(dir + ": cannot export an invalid model: "));

  struct stat st;
  if (::stat(dir.c_str(), &st) == 0) {
    // An existing directory: replace the two files, each atomically.
    if (!S_ISDIR(st.st_mode)) return Status::InvalidArgument(dir + ": exists and is not a directory");
    return WriteHfFiles(dir, model, params, max_position_embeddings, extra_files);
  }
  // A new directory appears whole or not at all.
  return WriteNewDirectory(
      dir, [&](const std::string& tmp) {
        return WriteHfFiles(tmp, model, params, max_position_embeddings, extra_files);
      });
}

StatusOr<HfModel> ReadHfDirectory(const std::string& dir) {
  HfModel out;
  HERD_ASSIGN_OR_RETURN(out.model, ParseConfigJson(JoinPath(dir, kConfigJson)));
  HERD_ASSIGN_OR_RETURN(WeightFiles weights, OpenWeights(dir));
  const LlamaShape shape = LlamaShape::FromConfig(out.model);

  // Bound the layout before building it: every layer has 9 tensors, so a
  // layer count above the number of tensors present is absurd (and would
  // only cost memory to discover tensor by tensor).
  if (static_cast<size_t>(shape.num_layers) > weights.tensors.size()) {
    return Status::InvalidArgument(JoinPath(dir, kConfigJson) + ": num_hidden_layers " +
                                   std::to_string(shape.num_layers) + " does not fit " + weights.origin +
                                   ", which holds only " + std::to_string(weights.tensors.size()) + " tensors");
  }
  const ParamLayout layout(shape);

  // Every expected tensor present with its exact shape and a readable dtype,
  // before anything is allocated or read.
  for (const TensorSpec& spec : layout.tensors()) {
    auto it = weights.tensors.find(spec.name);
    if (it == weights.tensors.end()) {
      return Status::InvalidArgument(weights.origin + ": missing tensor '" + spec.name + "' (expected shape " +
                                     ShapeText(spec.shape) + " from config.json)");
    }
    const auto [file, t] = it->second;
    if (t->shape != spec.shape) {
      return Status::InvalidArgument(file->path() + ": tensor '" + spec.name + "' has shape " + ShapeText(t->shape) +
                                     ", config.json implies " + ShapeText(spec.shape));
    }
    if (!IsFloatConvertible(t->dtype)) {
      return Status::InvalidArgument(file->path() + ": tensor '" + spec.name + "' has dtype " + t->dtype +
                                     ", expected F32, BF16 or F16");
    }
  }
  for (const auto& [name, where] : weights.tensors) {
    if (layout.Find(name) != nullptr || IsIgnoredBuffer(name)) continue;
    if (name == "lm_head.weight" && shape.tie_word_embeddings) continue;  // tied: the embedding is used
    return Status::InvalidArgument(where.first->path() + ": unexpected tensor '" + name +
                                   "' (not part of a LlamaForCausalLM with this config.json)");
  }

  out.params.assign(layout.size(), 0.0f);
  for (const TensorSpec& spec : layout.tensors()) {
    const SafetensorsFile* file = weights.tensors.at(spec.name).first;
    HERD_RETURN_IF_ERROR(file->ReadAsFloat(spec.name, out.params.data() + spec.offset, spec.numel));
  }
  return out;
}

bool IsHfDirectory(const std::string& dir) { return PathExists(JoinPath(dir, kConfigJson)); }

StatusOr<LoadedModel> LoadModelWeights(const std::string& path) {
  LoadedModel out;
  if (IsHfDirectory(path)) {
    HERD_ASSIGN_OR_RETURN(HfModel hf, ReadHfDirectory(path));
    out.model = std::move(hf.model);
    out.weights = std::move(hf.params);
    return out;
  }
  HERD_ASSIGN_OR_RETURN(CheckpointModel ckpt, LoadCheckpointModel(path));
  out.model = ckpt.config.model();
  out.seq_len = ckpt.config.train().seq_len();
  out.weights = std::move(ckpt.weights);
  return out;
}

Status CheckInitFrom(const std::string& path, const config::ModelConfig& model) {
  if (path.empty()) return Status::OK();
  const std::string what = "checkpoint.init_from " + path;
  if (IsHfDirectory(path)) {
    HERD_ASSIGN_OR_RETURN(config::ModelConfig found, ParseConfigJson(JoinPath(path, "config.json")));
    return CheckSameShape(found, model, what);
  }
  std::string step_dir = path;
  if (!PathExists(JoinPath(path, "manifest.json"))) {
    if (!PathExists(path)) return Status::NotFound(what + ": no such HuggingFace directory or checkpoint");
    HERD_ASSIGN_OR_RETURN(step_dir, LatestCheckpoint(path));
  }
  return CheckSameModel(step_dir, model).WithContext("checkpoint.init_from: ");
}

StatusOr<std::vector<float>> LoadInitialWeights(const std::string& path, const config::ModelConfig& model,
                                                int64_t begin, int64_t end) {
  HERD_ASSIGN_OR_RETURN(LoadedModel loaded, LoadModelWeights(path));
  HERD_RETURN_IF_ERROR(CheckSameShape(loaded.model, model, "checkpoint.init_from " + path));
  return std::vector<float>(loaded.weights.begin() + begin, loaded.weights.begin() + end);
}

}  // namespace herd
