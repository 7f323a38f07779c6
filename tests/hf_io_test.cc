// safetensors reading/writing and HuggingFace directory interop: round trips,
// 16-bit conversions, and that every bad input gives one line naming the
// file (and tensor/key) and leaves nothing behind.
#include <gmock/gmock.h>
#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <numbers>
#include <set>
#include <nlohmann/json.hpp>

#include "common/config.h"
#include "common/file_util.h"
#include "model/checkpoint_commit.h"
#include "model/checkpoint_format.h"
#include "model/checkpoint_load.h"
#include "model/cpu/ops.h"
#include "model/hf_io.h"
#include "model/param_layout.h"
#include "model/safetensors.h"

namespace herd {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using ::testing::HasSubstr;

// A fresh directory per test, removed at the end.
class TempDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "herd_hf_test.XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    fs::permissions(dir_, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(dir_, ec);
  }
  std::string Path(const std::string& name) const { return JoinPath(dir_, name); }
  std::set<std::string> Entries(const std::string& dir) const {
    std::set<std::string> out;
    for (const auto& e : fs::directory_iterator(dir)) out.insert(e.path().filename().string());
    return out;
  }
  std::string dir_;
};

// The error is one line that contains every `needles`.
void ExpectError(const Status& st, std::initializer_list<std::string> needles) {
  ASSERT_FALSE(st.ok()) << "expected an error mentioning " << *needles.begin();
  EXPECT_EQ(st.message().find('\n'), std::string::npos) << st.message();
  for (const std::string& n : needles) EXPECT_NE(st.message().find(n), std::string::npos) << st.message();
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string ReadBytes(const std::string& path) {
  auto data = ReadFile(path);
  EXPECT_TRUE(data.ok()) << data.status().message();
  return data.ok() ? *data : "";
}

// A safetensors file from a header text and raw data.
std::string RawFile(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(n >> (8 * i));
  return out + header + data;
}

template <typename T>
std::string Bytes(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

json Entry(const std::string& dtype, std::vector<int64_t> shape, uint64_t begin, uint64_t end) {
  return {{"dtype", dtype}, {"shape", shape}, {"data_offsets", {begin, end}}};
}

// fp32 -> f16 for values exactly representable as normal f16 (test data only).
uint16_t ExactF16(float f) {
  uint32_t b = std::bit_cast<uint32_t>(f);
  if ((b & 0x7fffffffu) == 0) return static_cast<uint16_t>(b >> 16);
  int exp = static_cast<int>((b >> 23) & 0xff) - 127 + 15;
  EXPECT_TRUE(exp > 0 && exp < 31 && (b & 0x1fffu) == 0) << f << " is not exact in f16";
  return static_cast<uint16_t>(((b >> 16) & 0x8000u) | (exp << 10) | ((b >> 13) & 0x3ffu));
}

// ------------------------------------------------------------------ safetensors

TEST_F(TempDirTest, SafetensorsRoundTrip) {
  std::vector<float> a = {1.5f, -2.25f, 3.0f, 1e-30f, -0.0f, 7.0f};
  std::vector<float> b = {std::nanf(""), INFINITY};
  float scalar = 42.0f;
  const std::string path = Path("x.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {{"b.weight", {2}, b.data()},
                                      {"a.weight", {2, 3}, a.data()},
                                      {"scalar", {}, &scalar},
                                      {"empty", {0, 4}, nullptr}})
                  .ok());
  const std::string raw = ReadBytes(path);
  uint64_t header_len;
  std::memcpy(&header_len, raw.data(), 8);
  EXPECT_EQ((8 + header_len) % 8, 0u);
  EXPECT_EQ(raw.size(), 8 + header_len + (a.size() + b.size() + 1) * 4);

  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(f->metadata().at("format"), "pt");
  ASSERT_EQ(f->tensors().size(), 4u);
  EXPECT_EQ(f->tensors()[0].name, "b.weight");  // data order = the order given
  const SafetensorsTensor* ta = f->Find("a.weight");
  ASSERT_NE(ta, nullptr);
  EXPECT_EQ(ta->dtype, "F32");
  EXPECT_EQ(ta->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(f->Find("empty")->numel, 0);
  EXPECT_EQ(f->Find("scalar")->numel, 1);
  std::vector<float> ra(6), rb(2);
  float rs = 0;
  ASSERT_TRUE(f->ReadAsFloat("a.weight", ra.data(), 6).ok());
  ASSERT_TRUE(f->ReadAsFloat("b.weight", rb.data(), 2).ok());
  ASSERT_TRUE(f->ReadAsFloat("scalar", &rs, 1).ok());
  ASSERT_TRUE(f->ReadAsFloat("empty", nullptr, 0).ok());
  EXPECT_EQ(std::memcmp(ra.data(), a.data(), 24), 0);
  EXPECT_EQ(std::memcmp(rb.data(), b.data(), 8), 0);
  EXPECT_EQ(rs, 42.0f);
  ExpectError(f->ReadAsFloat("a.weight", ra.data(), 5), {path, "a.weight", "6"});

  ExpectError(WriteSafetensors(Path("dup.safetensors"), {{"a", {1}, &rs}, {"a", {1}, &rs}}), {"dup.safetensors", "'a'"});
  EXPECT_FALSE(PathExists(Path("dup.safetensors")));
}

TEST(SafetensorsConvert, F16AllValuesMatchIeee) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const int sign = (h & 0x8000) ? -1 : 1, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    const float got = F16ToFloat(static_cast<uint16_t>(h));
    if (exp == 31) {
      if (mant == 0) {
        EXPECT_EQ(got, sign * INFINITY) << h;
      } else {
        EXPECT_TRUE(std::isnan(got)) << h;
      }
      continue;
    }
    const double want = sign * (exp == 0 ? std::ldexp(mant, -24) : std::ldexp(1024 + mant, exp - 25));
    ASSERT_EQ(got, static_cast<float>(want)) << "bits 0x" << std::hex << h;
    ASSERT_EQ(std::signbit(got), sign < 0) << h;
  }
}

TEST_F(TempDirTest, SafetensorsReadsBf16AndF16) {
  // bf16: 1, -2.5, +inf, -inf, NaN, the smallest subnormal, -0, 3.140625
  std::vector<uint16_t> bf = {0x3F80, 0xC020, 0x7F80, 0xFF80, 0x7FC0, 0x0001, 0x8000, 0x4049};
  // f16: 1, -2, 65504, 2^-24, 1023*2^-24, 2^-14, +inf, -inf, NaN, -0, 0x3555
  std::vector<uint16_t> hf = {0x3C00, 0xC000, 0x7BFF, 0x0001, 0x03FF, 0x0400, 0x7C00, 0xFC00, 0x7E00, 0x8000, 0x3555};
  json h = {{"__metadata__", {{"format", "pt"}}},
            {"bf", Entry("BF16", {2, 4}, 0, 16)},
            {"hf", Entry("F16", {11}, 16, 38)}};
  const std::string path = Path("half.safetensors");
  WriteBytes(path, RawFile(h.dump(), Bytes(bf) + Bytes(hf)));
  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status().message();

  std::vector<float> b(8);
  ASSERT_TRUE(f->ReadAsFloat("bf", b.data(), 8).ok());
  EXPECT_EQ(b[0], 1.0f);
  EXPECT_EQ(b[1], -2.5f);
  EXPECT_EQ(b[2], INFINITY);
  EXPECT_EQ(b[3], -INFINITY);
  EXPECT_TRUE(std::isnan(b[4]));
  EXPECT_EQ(b[5], std::ldexp(1.0f, -133));
  EXPECT_TRUE(b[6] == 0.0f && std::signbit(b[6]));
  EXPECT_EQ(b[7], 3.140625f);

  std::vector<float> x(11);
  ASSERT_TRUE(f->ReadAsFloat("hf", x.data(), 11).ok());
  EXPECT_EQ(x[0], 1.0f);
  EXPECT_EQ(x[1], -2.0f);
  EXPECT_EQ(x[2], 65504.0f);
  EXPECT_EQ(x[3], std::ldexp(1.0f, -24));
  EXPECT_EQ(x[4], std::ldexp(1023.0f, -24));
  EXPECT_EQ(x[5], std::ldexp(1.0f, -14));
  EXPECT_EQ(x[6], INFINITY);
  EXPECT_EQ(x[7], -INFINITY);
  EXPECT_TRUE(std::isnan(x[8]));
  EXPECT_TRUE(x[9] == 0.0f && std::signbit(x[9]));
  EXPECT_EQ(x[10], 0.333251953125f);
}

TEST_F(TempDirTest, SafetensorsBadFilesNameFileAndTensor) {
  const std::string data(16, '\0');
  auto open = [&](const std::string& name, const std::string& bytes) {
    WriteBytes(Path(name), bytes);
    return SafetensorsFile::Open(Path(name)).status();
  };
  // Header length beyond the end of the file.
  {
    std::string bytes = RawFile(json{{"w", Entry("F32", {4}, 0, 16)}}.dump(), data);
    bytes[0] = static_cast<char>(0xff);
    bytes[3] = 0x01;
    ExpectError(open("long.safetensors", bytes), {Path("long.safetensors"), "header length", "file size"});
  }
  ExpectError(open("short.safetensors", "abc"), {Path("short.safetensors"), "too short"});
  ExpectError(open("json.safetensors", RawFile("{\"w\": {\"dtype\": \"F32\",", data)),
              {Path("json.safetensors"), "JSON"});
  ExpectError(open("range.safetensors", RawFile(json{{"w", Entry("F32", {8}, 0, 32)}}.dump(), data)),
              {Path("range.safetensors"), "'w'", "out of range"});
  ExpectError(open("size.safetensors", RawFile(json{{"w", Entry("F32", {3}, 0, 16)}}.dump(), data)),
              {Path("size.safetensors"), "'w'", "F32", "[3]", "12"});
  ExpectError(open("dtype.safetensors", RawFile(json{{"w", Entry("Q4", {4}, 0, 16)}}.dump(), data)),
              {Path("dtype.safetensors"), "'w'", "unknown dtype 'Q4'"});
  ExpectError(open("shape.safetensors", RawFile(json{{"w", Entry("F32", {-4}, 0, 16)}}.dump(), data)),
              {Path("shape.safetensors"), "'w'", "shape"});
  ExpectError(open("overflow.safetensors",
                   RawFile(json{{"w", Entry("F32", {1ll << 40, 1ll << 40}, 0, 16)}}.dump(), data)),
              {Path("overflow.safetensors"), "'w'", "overflow"});
  ExpectError(open("overlap.safetensors",
                   RawFile(json{{"a", Entry("F32", {4}, 0, 16)}, {"b", Entry("F32", {2}, 8, 16)}}.dump(), data)),
              {Path("overlap.safetensors"), "overlap"});
  ExpectError(open("gap.safetensors", RawFile(json{{"a", Entry("F32", {2}, 8, 16)}}.dump(), data)),
              {Path("gap.safetensors"), "'a'", "gap"});
  ExpectError(open("trailing.safetensors", RawFile(json{{"a", Entry("F32", {2}, 0, 8)}}.dump(), data)),
              {Path("trailing.safetensors"), "cover 8 bytes"});
  ExpectError(open("offsets.safetensors", RawFile(R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [16, 0]}})", data)),
              {Path("offsets.safetensors"), "'w'", "data_offsets"});
  ExpectError(open("meta.safetensors", RawFile(R"({"__metadata__": {"format": 1}})", "")),
              {Path("meta.safetensors"), "__metadata__", "format"});
  ExpectError(SafetensorsFile::Open(Path("absent.safetensors")).status(), {Path("absent.safetensors")});

  // Valid files: a missing tensor and an unconvertible dtype.
  WriteBytes(Path("ok.safetensors"), RawFile(json{{"i", Entry("I32", {4}, 0, 16)}}.dump(), data));
  auto f = SafetensorsFile::Open(Path("ok.safetensors"));
  ASSERT_TRUE(f.ok()) << f.status().message();
  std::vector<float> out(4);
  ExpectError(f->ReadAsFloat("nope", out.data(), 4), {Path("ok.safetensors"), "'nope'"});
  ExpectError(f->ReadAsFloat("i", out.data(), 4), {Path("ok.safetensors"), "'i'", "I32"});
}

// ------------------------------------------------------------------ HF directories

config::ModelConfig SmallModel(bool tied) {
  config::ModelConfig m;
  m.set_vocab_size(32);
  m.set_hidden_size(16);
  m.set_intermediate_size(24);
  m.set_num_hidden_layers(2);
  m.set_num_attention_heads(4);
  m.set_num_key_value_heads(2);  // GQA
  m.set_rope_theta(500000.0);
  m.set_rms_norm_eps(1e-6);
  m.set_tie_word_embeddings(tied);
  m.set_initializer_range(0.03);
  return m;
}

// Weights whose values are exact in bf16 and f16 (k/64, |k| < 256), padding zero.
std::vector<float> ExactWeights(const ParamLayout& layout) {
  std::vector<float> p(layout.size(), 0.0f);
  for (const TensorSpec& t : layout.tensors()) {
    for (int64_t i = 0; i < t.numel; ++i) {
      p[t.offset + i] = static_cast<float>(static_cast<int>((t.offset * 7 + i * 13) % 255) - 127) / 64.0f;
    }
  }
  return p;
}

// Rewrites DIR/model.safetensors with each tensor in bf16 or f16 (alternating),
// plus `extra` tensors (F32, given values).
void RewriteAsHalf(const std::string& dir, const std::map<std::string, std::vector<int64_t>>& extra = {},
                   const std::set<std::string>& drop = {}) {
  const std::string path = JoinPath(dir, "model.safetensors");
  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status().message();
  json header = json::object();
  std::string data;
  int i = 0;
  for (const SafetensorsTensor& t : f->tensors()) {
    if (drop.count(t.name)) continue;
    std::vector<float> v(t.numel);
    ASSERT_TRUE(f->ReadAsFloat(t.name, v.data(), t.numel).ok());
    const bool bf16 = (i++ % 2) == 0;
    std::vector<uint16_t> h(v.size());
    for (size_t k = 0; k < v.size(); ++k) h[k] = bf16 ? std::bit_cast<uint32_t>(v[k]) >> 16 : ExactF16(v[k]);
    header[t.name] = Entry(bf16 ? "BF16" : "F16", t.shape, data.size(), data.size() + h.size() * 2);
    data += Bytes(h);
  }
  for (const auto& [name, shape] : extra) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<float> v(n, 0.5f);
    header[name] = Entry("F32", shape, data.size(), data.size() + n * 4);
    data += Bytes(v);
  }
  WriteBytes(path, RawFile(header.dump(), data));
}

void EditConfig(const std::string& dir, const std::function<void(json&)>& edit) {
  const std::string path = JoinPath(dir, "config.json");
  json j = json::parse(ReadBytes(path));
  edit(j);
  WriteBytes(path, j.dump(2));
}

class HfIoTest : public TempDirTest {
 protected:
  // Writes a small model to DIR/name and returns its weights.
  std::vector<float> WriteModel(const std::string& name, bool tied) {
    const ParamLayout layout(LlamaShape::FromConfig(SmallModel(tied)));
    std::vector<float> w = ExactWeights(layout);
    Status st = WriteHfDirectory(Path(name), SmallModel(tied), w.data(), 64);
    EXPECT_TRUE(st.ok()) << st.message();
    return w;
  }
};

TEST_F(HfIoTest, HfRoundTripTiedAndUntiedGqa) {
  for (bool tied : {true, false}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    const std::string dir = tied ? "tied" : "untied";
    const ParamLayout layout(LlamaShape::FromConfig(SmallModel(tied)));
    std::vector<float> w(layout.size(), 0.0f);
    InitParameters(layout, 7, 0.02, w.data());
    ASSERT_TRUE(WriteHfDirectory(Path(dir), SmallModel(tied), w.data(), 64).ok());
    EXPECT_TRUE(IsHfDirectory(Path(dir)));
    EXPECT_EQ(Entries(Path(dir)), (std::set<std::string>{"config.json", "model.safetensors"}));
    EXPECT_EQ(Entries(dir_).size(), 1u + !tied);  // no temporary sibling left

    json c = json::parse(ReadBytes(Path(dir + "/config.json")));
    EXPECT_EQ(c["architectures"], json::array({"LlamaForCausalLM"}));
    EXPECT_EQ(c["model_type"], "llama");
    EXPECT_EQ(c["num_key_value_heads"], 2);
    EXPECT_EQ(c["head_dim"], 4);
    EXPECT_EQ(c["max_position_embeddings"], 64);
    EXPECT_EQ(c["tie_word_embeddings"], tied);
    EXPECT_EQ(c["rope_theta"].get<double>(), 500000.0);
    EXPECT_EQ(c["hidden_act"], "silu");
    EXPECT_TRUE(c["rope_scaling"].is_null());
    EXPECT_EQ(c["rope_parameters"], json({{"rope_type", "default"}, {"rope_theta", 500000.0}}));
    EXPECT_EQ(c["dtype"], "float32");
    EXPECT_FALSE(c.contains("torch_dtype"));  // transformers 4.56+ warns that it is deprecated

    auto f = SafetensorsFile::Open(Path(dir + "/model.safetensors"));
    ASSERT_TRUE(f.ok());
    EXPECT_EQ(f->Find("lm_head.weight") != nullptr, !tied);
    EXPECT_EQ(f->tensors().size(), layout.tensors().size());

    auto hf = ReadHfDirectory(Path(dir));
    ASSERT_TRUE(hf.ok()) << hf.status().message();
    config::ModelConfig expected = SmallModel(tied);
    expected.set_max_position_embeddings(64);
    EXPECT_EQ(hf->model.SerializeAsString(), expected.SerializeAsString());
    ASSERT_EQ(hf->params.size(), w.size());
    EXPECT_EQ(std::memcmp(hf->params.data(), w.data(), w.size() * 4), 0);
  }
}

TEST_F(HfIoTest, HfOverwritesExistingDirectory) {
  WriteModel("m", true);
  const ParamLayout layout(LlamaShape::FromConfig(SmallModel(false)));
  std::vector<float> w(layout.size(), 0.0f);
  InitParameters(layout, 3, 0.02, w.data());
  ASSERT_TRUE(WriteHfDirectory(Path("m"), SmallModel(false), w.data(), 64).ok());
  EXPECT_EQ(Entries(Path("m")), (std::set<std::string>{"config.json", "model.safetensors"}));
  auto hf = ReadHfDirectory(Path("m"));
  ASSERT_TRUE(hf.ok()) << hf.status().message();
  EXPECT_FALSE(hf->model.tie_word_embeddings());
  EXPECT_EQ(hf->params, w);
}

TEST_F(HfIoTest, HfReadsBf16AndF16Tensors) {
  std::vector<float> w = WriteModel("m", false);
  RewriteAsHalf(Path("m"));
  auto f = SafetensorsFile::Open(Path("m/model.safetensors"));
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->tensors()[0].dtype, "BF16");
  EXPECT_EQ(f->tensors()[1].dtype, "F16");
  auto hf = ReadHfDirectory(Path("m"));
  ASSERT_TRUE(hf.ok()) << hf.status().message();
  EXPECT_EQ(hf->params, w);
}

TEST_F(HfIoTest, HfTensorSetRules) {
  // Tied: an lm_head.weight copy and rotary inv_freq buffers are ignored.
  std::vector<float> w = WriteModel("tied", true);
  RewriteAsHalf(Path("tied"), {{"lm_head.weight", {32, 16}}, {"model.layers.1.self_attn.rotary_emb.inv_freq", {2}}});
  auto hf = ReadHfDirectory(Path("tied"));
  ASSERT_TRUE(hf.ok()) << hf.status().message();
  EXPECT_EQ(hf->params, w);

  // Anything else unexpected is named.
  WriteModel("extra", true);
  RewriteAsHalf(Path("extra"), {{"model.layers.2.input_layernorm.weight", {16}}});
  ExpectError(ReadHfDirectory(Path("extra")).status(),
              {Path("extra/model.safetensors"), "unexpected tensor 'model.layers.2.input_layernorm.weight'"});

  // Untied: lm_head.weight is required.
  WriteModel("untied", false);
  RewriteAsHalf(Path("untied"), {}, {"lm_head.weight"});
  ExpectError(ReadHfDirectory(Path("untied")).status(),
              {Path("untied/model.safetensors"), "missing tensor 'lm_head.weight'", "[32, 16]"});

  // A missing layer tensor.
  WriteModel("missing", true);
  RewriteAsHalf(Path("missing"), {}, {"model.layers.1.mlp.up_proj.weight"});
  ExpectError(ReadHfDirectory(Path("missing")).status(),
              {Path("missing/model.safetensors"), "'model.layers.1.mlp.up_proj.weight'", "[24, 16]"});

  // Wrong shape: k_proj as if there were no GQA.
  WriteModel("shape", true);
  RewriteAsHalf(Path("shape"), {{"model.layers.0.self_attn.k_proj.weight", {16, 16}}},
                {"model.layers.0.self_attn.k_proj.weight"});
  ExpectError(ReadHfDirectory(Path("shape")).status(),
              {Path("shape/model.safetensors"), "'model.layers.0.self_attn.k_proj.weight'", "[16, 16]", "[8, 16]"});

  // Layer count in config.json far beyond the tensors present.
  WriteModel("layers", true);
  EditConfig(Path("layers"), [](json& j) { j["num_hidden_layers"] = 2000000000; });
  ExpectError(ReadHfDirectory(Path("layers")).status(), {Path("layers/config.json"), "num_hidden_layers"});

  // No weights at all.
  WriteModel("noweights", true);
  fs::remove(Path("noweights/model.safetensors"));
  ExpectError(ReadHfDirectory(Path("noweights")).status(), {Path("noweights"), "model.safetensors"});
}

TEST_F(HfIoTest, HfReadsShardedDirectory) {
  std::vector<float> w = WriteModel("m", false);
  auto f = SafetensorsFile::Open(Path("m/model.safetensors"));
  ASSERT_TRUE(f.ok());
  // Split into two shards by tensor position, with an index.
  std::vector<std::vector<float>> store;
  std::vector<SafetensorsEntry> shard[2];
  json map = json::object();
  store.reserve(f->tensors().size());
  for (size_t i = 0; i < f->tensors().size(); ++i) {
    const SafetensorsTensor& t = f->tensors()[i];
    store.emplace_back(t.numel);
    ASSERT_TRUE(f->ReadAsFloat(t.name, store.back().data(), t.numel).ok());
    const int s = i < 7 ? 0 : 1;
    shard[s].push_back({t.name, t.shape, store.back().data()});
    map[t.name] = s == 0 ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  ASSERT_TRUE(WriteSafetensors(Path("m/model-00001-of-00002.safetensors"), shard[0]).ok());
  ASSERT_TRUE(WriteSafetensors(Path("m/model-00002-of-00002.safetensors"), shard[1]).ok());
  WriteBytes(Path("m/model.safetensors.index.json"), json{{"metadata", json::object()}, {"weight_map", map}}.dump());
  fs::remove(Path("m/model.safetensors"));
  auto hf = ReadHfDirectory(Path("m"));
  ASSERT_TRUE(hf.ok()) << hf.status().message();
  EXPECT_EQ(hf->params, w);

  map["model.norm.weight"] = "../evil.safetensors";
  WriteBytes(Path("m/model.safetensors.index.json"), json{{"weight_map", map}}.dump());
  ExpectError(ReadHfDirectory(Path("m")).status(), {Path("m/model.safetensors.index.json"), "model.norm.weight"});
  map["model.norm.weight"] = "model-00001-of-00002.safetensors";  // it is in shard 2
  WriteBytes(Path("m/model.safetensors.index.json"), json{{"weight_map", map}}.dump());
  ExpectError(ReadHfDirectory(Path("m")).status(), {Path("m/model.safetensors.index.json"), "model.norm.weight"});
}

TEST_F(HfIoTest, HfConfigValidation) {
  WriteModel("m", true);
  const std::string original = ReadBytes(Path("m/config.json"));
  const std::string cfg = Path("m/config.json");
  struct Case {
    std::function<void(json&)> edit;
    std::vector<std::string> needles;
  };
  const std::vector<Case> cases = {
      {[](json& j) { j["model_type"] = "mistral"; j["architectures"] = {"MistralForCausalLM"}; },
       {"not a Llama model", "mistral"}},
      {[](json& j) { j.erase("hidden_size"); }, {"missing required key \"hidden_size\""}},
      {[](json& j) { j["hidden_size"] = "16"; }, {"\"hidden_size\"", "positive integer"}},
      {[](json& j) { j["vocab_size"] = 0; }, {"\"vocab_size\"", "positive integer"}},
      {[](json& j) { j["num_attention_heads"] = 2.5; }, {"\"num_attention_heads\"", "positive integer"}},
      {[](json& j) { j["rms_norm_eps"] = "tiny"; }, {"\"rms_norm_eps\"", "positive number"}},
      {[](json& j) { j["tie_word_embeddings"] = 1; }, {"\"tie_word_embeddings\"", "true or false"}},
      {[](json& j) { j["hidden_act"] = "gelu"; }, {"\"hidden_act\"", "gelu", "silu"}},
      {[](json& j) { j["rope_scaling"] = {{"type", "yarn"}, {"factor", 8.0}}; },
       {"\"rope_scaling.type\"", "yarn", "not supported"}},
      {[](json& j) { j["attention_bias"] = true; }, {"\"attention_bias\"", "not supported"}},
      {[](json& j) { j["mlp_bias"] = true; }, {"\"mlp_bias\"", "not supported"}},
      {[](json& j) { j["head_dim"] = 8; }, {"\"head_dim\"", "8", "4"}},
      {[](json& j) { j["num_key_value_heads"] = 3; }, {"num_key_value_heads", "divisible"}},
      {[](json& j) { j = json::array(); }, {"JSON object"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.needles[0]);
    WriteBytes(cfg, original);
    EditConfig(Path("m"), c.edit);
    Status st = ReadHfDirectory(Path("m")).status();
    ExpectError(st, {cfg});
    for (const std::string& n : c.needles) EXPECT_NE(st.message().find(n), std::string::npos) << st.message();
  }
  WriteBytes(cfg, "{\"model_type\": \"llama\",");
  ExpectError(ReadHfDirectory(Path("m")).status(), {cfg, "not valid JSON"});

  // HF defaults for absent optional keys; only architectures is enough.
  WriteBytes(cfg, original);
  EditConfig(Path("m"), [](json& j) {
    for (const char* k : {"model_type", "num_key_value_heads", "rope_theta", "rms_norm_eps", "head_dim",
                          "attention_bias", "mlp_bias", "rope_scaling", "rope_parameters", "hidden_act",
                          "initializer_range"}) {
      j.erase(k);
    }
  });
  // Without num_key_value_heads the model is MHA: k_proj has 16 rows, not 8.
  ExpectError(ReadHfDirectory(Path("m")).status(), {"k_proj", "[16, 16]"});
  EditConfig(Path("m"), [](json& j) { j["num_key_value_heads"] = 2; });
  auto hf = ReadHfDirectory(Path("m"));
  ASSERT_TRUE(hf.ok()) << hf.status().message();
  EXPECT_EQ(hf->model.rope_theta(), 10000.0);
  EXPECT_EQ(hf->model.rms_norm_eps(), 1e-6);
}

// ------------------------------------------------------------------ RoPE in config.json

config::RopeScaling Llama31Scaling() {
  config::RopeScaling rs;
  rs.set_rope_type(config::RopeScaling::LLAMA3);
  rs.set_factor(8.0);
  rs.set_low_freq_factor(1.0);
  rs.set_high_freq_factor(4.0);
  rs.set_original_max_position_embeddings(8192);
  return rs;
}

// Both forms of config.json (transformers 4.x: rope_theta + rope_scaling;
// 5.x: rope_parameters), as the two versions' save_pretrained write them,
// give one ModelConfig.
TEST_F(HfIoTest, HfConfigReadsBothRopeForms) {
  WriteModel("m", true);
  const std::string original = ReadBytes(Path("m/config.json"));
  const json llama3 = {{"rope_type", "llama3"},
                       {"factor", 8.0},
                       {"low_freq_factor", 1.0},
                       {"high_freq_factor", 4.0},
                       {"original_max_position_embeddings", 8192}};
  json llama3_5x = llama3;
  llama3_5x["rope_theta"] = 500000.0;
  json legacy = llama3;  // transformers < 4.43 spelt rope_type "type"
  legacy.erase("rope_type");
  legacy["type"] = "llama3";
  struct Case {
    const char* name;
    std::function<void(json&)> edit;
    double theta;
    bool scaled;
  };
  const std::vector<Case> cases = {
      {"5.x default", [](json& j) { j["rope_parameters"] = {{"rope_theta", 500000.0}, {"rope_type", "default"}}; },
       500000.0, false},
      {"5.x theta only", [](json& j) { j["rope_parameters"] = {{"rope_theta", 250000.0}}; }, 250000.0, false},
      {"5.x llama3", [&](json& j) { j["rope_parameters"] = llama3_5x; }, 500000.0, true},
      {"4.x default", [](json& j) { j["rope_theta"] = 500000.0; j["rope_scaling"] = nullptr; }, 500000.0, false},
      {"4.x llama3", [&](json& j) { j["rope_theta"] = 500000.0; j["rope_scaling"] = llama3; }, 500000.0, true},
      {"4.x legacy type", [&](json& j) { j["rope_theta"] = 500000.0; j["rope_scaling"] = legacy; }, 500000.0, true},
      {"4.x empty scaling", [](json& j) { j["rope_theta"] = 500000.0; j["rope_scaling"] = json::object(); },
       500000.0, false},
      {"both forms",
       [&](json& j) {
         j["rope_theta"] = 500000.0;
         j["rope_scaling"] = llama3;
         j["rope_parameters"] = llama3_5x;
       },
       500000.0, true},
      {"neither", [](json&) {}, 10000.0, false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    WriteBytes(Path("m/config.json"), original);
    EditConfig(Path("m"), [&](json& j) {
      for (const char* k : {"rope_theta", "rope_scaling", "rope_parameters"}) j.erase(k);
      c.edit(j);
    });
    auto hf = ReadHfDirectory(Path("m"));
    ASSERT_TRUE(hf.ok()) << hf.status().message();
    EXPECT_EQ(hf->model.rope_theta(), c.theta);
    EXPECT_EQ(hf->model.has_rope_scaling(), c.scaled);
    if (c.scaled) {
      EXPECT_EQ(hf->model.rope_scaling().SerializeAsString(), Llama31Scaling().SerializeAsString());
    }
  }
}

// Every key that changes the model in a way herd does not implement: one
// line naming config.json and the key.
TEST_F(HfIoTest, HfConfigRefusesWhatHerdDoesNotImplement) {
  WriteModel("m", true);
  const std::string original = ReadBytes(Path("m/config.json"));
  const std::string cfg = Path("m/config.json");
  const json llama3 = {{"rope_type", "llama3"},
                       {"factor", 8.0},
                       {"low_freq_factor", 1.0},
                       {"high_freq_factor", 4.0},
                       {"original_max_position_embeddings", 8192}};
  auto without = [&](const char* key) {
    json d = llama3;
    d.erase(key);
    return d;
  };
  auto with = [&](const char* key, const json& value) {
    json d = llama3;
    d[key] = value;
    return d;
  };
  struct Case {
    std::function<void(json&)> edit;
    std::vector<std::string> needles;
  };
  const std::vector<Case> cases = {
      {[](json& j) { j["rope_parameters"] = {{"rope_type", "linear"}, {"factor", 2.0}, {"rope_theta", 1e4}}; },
       {"\"rope_parameters.rope_type\"", "\"linear\" is not supported"}},
      {[](json& j) { j["rope_parameters"] = {{"rope_type", "dynamic"}, {"factor", 2.0}}; },
       {"\"rope_parameters.rope_type\"", "dynamic"}},
      {[](json& j) { j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}}; },
       {"\"rope_scaling.rope_type\"", "yarn"}},
      {[](json& j) { j["rope_scaling"] = {{"rope_type", "longrope"}}; }, {"\"rope_scaling.rope_type\"", "longrope"}},
      {[](json& j) { j["rope_scaling"] = {{"rope_type", 3}}; }, {"\"rope_scaling.rope_type\"", "string"}},
      {[](json& j) { j["rope_scaling"] = "llama3"; }, {"\"rope_scaling\"", "object"}},
      {[&](json& j) { j["rope_scaling"] = without("low_freq_factor"); },
       {"\"rope_scaling.low_freq_factor\"", "required", "llama3"}},
      {[&](json& j) { j["rope_parameters"] = without("original_max_position_embeddings"); },
       {"\"rope_parameters.original_max_position_embeddings\"", "required"}},
      {[&](json& j) { j["rope_parameters"] = with("attention_factor", 0.5); },
       {"\"rope_parameters.attention_factor\"", "not supported with rope_type \"llama3\""}},
      {[&](json& j) { j["rope_parameters"] = with("factor", -8.0); }, {"\"rope_parameters.factor\"", "positive"}},
      {[&](json& j) { j["rope_parameters"] = with("high_freq_factor", 1.0); },
       {"\"rope_parameters.high_freq_factor\"", "greater than low_freq_factor"}},
      {[&](json& j) { j["rope_parameters"] = with("original_max_position_embeddings", 8192.5); },
       {"\"rope_parameters.original_max_position_embeddings\"", "positive integer"}},
      {[](json& j) { j["rope_parameters"] = {{"rope_type", "default"}, {"factor", 8.0}}; },
       {"\"rope_parameters.factor\"", "not supported with rope_type \"default\""}},
      {[](json& j) { j["rope_parameters"] = {{"full_attention", {{"rope_type", "default"}}}}; },
       {"\"rope_parameters.full_attention\""}},
      {[](json& j) { j["rope_parameters"] = {{"rope_type", "default"}, {"partial_rotary_factor", 0.5}}; },
       {"\"rope_parameters.partial_rotary_factor\"", "0.5"}},
      {[](json& j) { j["partial_rotary_factor"] = 0.25; }, {"\"partial_rotary_factor\"", "0.25"}},
      // The two forms disagree: transformers 4.x and 5.x would read different models.
      {[](json& j) { j["rope_theta"] = 10000.0; j["rope_parameters"] = {{"rope_theta", 500000.0}}; },
       {"\"rope_theta\" 10000.0", "\"rope_parameters.rope_theta\" 500000.0", "disagree"}},
      {[&](json& j) { j["rope_scaling"] = llama3; j["rope_parameters"] = with("factor", 32.0); },
       {"\"rope_scaling\" and \"rope_parameters\"", "32.0"}},
      {[](json& j) { j["rope_scaling"] = {{"rope_theta", 1e4}}; j["rope_parameters"] = {{"rope_theta", 5e5}}; },
       {"\"rope_scaling.rope_theta\" 10000.0", "\"rope_parameters.rope_theta\" 500000.0"}},
      {[](json& j) { j["attention_dropout"] = 0.1; }, {"\"attention_dropout\"", "0.1", "dropout"}},
      {[](json& j) { j["quantization_config"] = {{"quant_method", "gptq"}}; }, {"\"quantization_config\"", "gptq"}},
      {[](json& j) { j["head_dim"] = 8; }, {"\"head_dim\"", "8", "4"}},
      {[](json& j) { j["attention_bias"] = true; }, {"\"attention_bias\""}},
      {[](json& j) { j["mlp_bias"] = true; }, {"\"mlp_bias\""}},
      {[](json& j) { j["hidden_act"] = "gelu_pytorch_tanh"; }, {"\"hidden_act\"", "gelu_pytorch_tanh"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.needles[0]);
    WriteBytes(cfg, original);
    EditConfig(Path("m"), [&](json& j) {
      for (const char* k : {"rope_theta", "rope_scaling", "rope_parameters"}) j.erase(k);
      c.edit(j);
    });
    Status st = ReadHfDirectory(Path("m")).status();
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.message().find('\n'), std::string::npos) << st.message();
    EXPECT_THAT(st.message(), HasSubstr(cfg + ": "));
    for (const std::string& n : c.needles) EXPECT_THAT(st.message(), HasSubstr(n));
  }
  // Keys that do not change the model pass.
  WriteBytes(cfg, original);
  EditConfig(Path("m"), [](json& j) {
    j["attention_dropout"] = 0.0;
    j["pretraining_tp"] = 1;
    j["use_cache"] = true;
    j["partial_rotary_factor"] = 1.0;
    j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 500000.0}, {"partial_rotary_factor", 1.0}};
    j["transformers_version"] = "5.23.0";
    j["bos_token_id"] = 1;
    j["pad_token_id"] = nullptr;
    j["dtype"] = "bfloat16";
  });
  auto hf = ReadHfDirectory(Path("m"));
  ASSERT_TRUE(hf.ok()) << hf.status().message();
}

// Export writes both forms; import reads the model back, scaling included.
TEST_F(HfIoTest, HfLlama3ScalingRoundTrip) {
  config::ModelConfig model = SmallModel(false);
  *model.mutable_rope_scaling() = Llama31Scaling();
  const ParamLayout layout(LlamaShape::FromConfig(model));
  std::vector<float> w = ExactWeights(layout);
  ASSERT_TRUE(WriteHfDirectory(Path("m"), model, w.data(), 64).ok());
  json c = json::parse(ReadBytes(Path("m/config.json")));
  const json llama3 = {{"rope_type", "llama3"},
                       {"factor", 8.0},
                       {"low_freq_factor", 1.0},
                       {"high_freq_factor", 4.0},
                       {"original_max_position_embeddings", 8192}};
  EXPECT_EQ(c["rope_theta"].get<double>(), 500000.0);
  EXPECT_EQ(c["rope_scaling"], llama3);
  json with_theta = llama3;
  with_theta["rope_theta"] = 500000.0;
  EXPECT_EQ(c["rope_parameters"], with_theta);
  auto hf = ReadHfDirectory(Path("m"));
  ASSERT_TRUE(hf.ok()) << hf.status().message();
  model.set_max_position_embeddings(64);  // kept from config.json
  EXPECT_EQ(hf->model.SerializeAsString(), model.SerializeAsString());
  EXPECT_EQ(hf->params, w);

  // Only the 5.x form, or only the 4.x one: the same model.
  for (const char* drop : {"rope_scaling", "rope_parameters"}) {
    SCOPED_TRACE(drop);
    ASSERT_TRUE(WriteHfDirectory(Path("m"), model, w.data(), 64).ok());
    EditConfig(Path("m"), [&](json& j) {
      j.erase(drop);
      if (std::string(drop) == "rope_scaling") j.erase("rope_theta");
    });
    hf = ReadHfDirectory(Path("m"));
    ASSERT_TRUE(hf.ok()) << hf.status().message();
    EXPECT_EQ(hf->model.SerializeAsString(), model.SerializeAsString());
  }
}

TEST(RopeScalingConfig, Validation) {
  config::JobConfig job;
  *job.mutable_model()->mutable_rope_scaling() = Llama31Scaling();
  EXPECT_TRUE(ValidateJobConfig(job).ok());
  struct Case {
    std::function<void(config::RopeScaling&)> edit;
    std::string needle;
  };
  const std::vector<Case> cases = {
      {[](config::RopeScaling& r) { r.set_factor(0); }, "model.rope_scaling.factor"},
      {[](config::RopeScaling& r) { r.set_low_freq_factor(-1); }, "model.rope_scaling.low_freq_factor"},
      {[](config::RopeScaling& r) { r.set_high_freq_factor(1); }, "model.rope_scaling.high_freq_factor"},
      {[](config::RopeScaling& r) { r.set_original_max_position_embeddings(0); },
       "model.rope_scaling.original_max_position_embeddings"},
      {[](config::RopeScaling& r) { r.set_rope_type(config::RopeScaling::DEFAULT); }, "model.rope_scaling.rope_type"},
  };
  for (const Case& c : cases) {
    config::JobConfig bad = job;
    c.edit(*bad.mutable_model()->mutable_rope_scaling());
    Status st = ValidateJobConfig(bad);
    ASSERT_FALSE(st.ok()) << c.needle;
    EXPECT_THAT(st.message(), HasSubstr(c.needle));
  }
  job.mutable_model()->mutable_rope_scaling()->Clear();  // DEFAULT, nothing else: plain RoPE
  EXPECT_TRUE(ValidateJobConfig(job).ok());
}

// The llama3 tables against transformers' formula evaluated in double
// precision: wavelen = 2π/inv_freq; inv_freq/factor above
// original_max/low_freq_factor, unchanged below original_max/high_freq_factor,
// smooth interpolation between.
template <typename T>
void CheckLlama3Tables(double tolerance) {
  const int64_t hd = 16, half = hd / 2, len = 300;
  const double theta = 500000.0;
  RopeScaling s;
  s.factor = 8.0;
  s.low_freq_factor = 1.0;
  s.high_freq_factor = 4.0;
  s.original_max_position_embeddings = 64;  // wavelengths 6.3, 32.6, 169, ...: all three bands
  std::vector<T> cos(len * half), sin(len * half), plain_cos(len * half), plain_sin(len * half);
  cpu::RopeTables(cos.data(), sin.data(), len, hd, theta, s);
  cpu::RopeTables(plain_cos.data(), plain_sin.data(), len, hd, theta);
  int bands[3] = {0, 0, 0};
  for (int64_t i = 0; i < half; ++i) {
    const double inv_freq = std::pow(theta, -2.0 * i / hd);
    const double wavelen = 2 * std::numbers::pi / inv_freq;
    const double low_wavelen = 64 / 1.0, high_wavelen = 64 / 4.0;
    double expected;
    if (wavelen < high_wavelen) {
      expected = inv_freq;
      ++bands[0];
    } else if (wavelen > low_wavelen) {
      expected = inv_freq / 8.0;
      ++bands[2];
    } else {
      const double smooth = (64 / wavelen - 1.0) / (4.0 - 1.0);
      expected = (1 - smooth) * inv_freq / 8.0 + smooth * inv_freq;
      ++bands[1];
    }
    for (int64_t t = 0; t < len; ++t) {
      ASSERT_NEAR(cos[t * half + i], std::cos(t * expected), tolerance) << "i=" << i << " t=" << t;
      ASSERT_NEAR(sin[t * half + i], std::sin(t * expected), tolerance) << "i=" << i << " t=" << t;
      if (wavelen < high_wavelen) {  // the kept band is the plain table, bit for bit
        ASSERT_EQ(cos[t * half + i], plain_cos[t * half + i]);
        ASSERT_EQ(sin[t * half + i], plain_sin[t * half + i]);
      }
    }
  }
  EXPECT_EQ(bands[0], 1);
  EXPECT_EQ(bands[1], 1);
  EXPECT_EQ(bands[2], 6);
}

TEST(RopeTables, Llama3ScalingMatchesTransformersFormula) {
  CheckLlama3Tables<double>(1e-12);
  // fp32: the angle t * inv_freq (t < 300) carries float32 rounding.
  CheckLlama3Tables<float>(5e-5);
}

// Runs `fn` with writes beyond `bytes` failing (EFBIG), as on a full disk.
void WithFileSizeLimit(rlim_t bytes, const std::function<void()>& fn) {
  struct rlimit old;
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
  struct rlimit limited = old;
  limited.rlim_cur = bytes;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &limited), 0);
  fn();
  ::setrlimit(RLIMIT_FSIZE, &old);
  ::signal(SIGXFSZ, old_handler);
}

TEST_F(HfIoTest, HfFailedWriteLeavesNothing) {
  const ParamLayout layout(LlamaShape::FromConfig(SmallModel(true)));
  std::vector<float> w(layout.size(), 0.25f);

  // The parent is a regular file.
  WriteBytes(Path("file"), "x");
  ExpectError(WriteHfDirectory(Path("file/out"), SmallModel(true), w.data(), 64), {Path("file")});
  EXPECT_EQ(Entries(dir_), (std::set<std::string>{"file"}));

  // An unwritable parent (meaningless as root, who may write anywhere).
  if (::geteuid() != 0) {
    fs::create_directory(Path("ro"));
    fs::permissions(Path("ro"), fs::perms::owner_read | fs::perms::owner_exec);
    ExpectError(WriteHfDirectory(Path("ro/out"), SmallModel(true), w.data(), 64), {Path("ro/out")});
    fs::permissions(Path("ro"), fs::perms::owner_all);
    EXPECT_TRUE(Entries(Path("ro")).empty());
  }

  // The disk fills up half-way through model.safetensors: a new directory
  // does not appear, and no temporary sibling stays.
  WithFileSizeLimit(1024, [&] {
    ExpectError(WriteHfDirectory(Path("new"), SmallModel(true), w.data(), 64), {Path("new/model.safetensors")});
  });
  EXPECT_EQ(Entries(dir_), (std::set<std::string>{"file"}));

  // An existing directory keeps its old, complete files.
  std::vector<float> old = WriteModel("old", true);
  const std::string old_config = ReadBytes(Path("old/config.json"));
  WithFileSizeLimit(1024, [&] { EXPECT_FALSE(WriteHfDirectory(Path("old"), SmallModel(true), w.data(), 64).ok()); });
  EXPECT_EQ(Entries(Path("old")), (std::set<std::string>{"config.json", "model.safetensors"}));
  EXPECT_EQ(ReadBytes(Path("old/config.json")), old_config);
  auto hf = ReadHfDirectory(Path("old"));
  ASSERT_TRUE(hf.ok()) << hf.status().message();
  EXPECT_EQ(hf->params, old);
}

// ------------------------------------------------------------------ herd export / import

struct RunResult {
  int code;
  std::string output;
};

RunResult RunHerd(const std::string& args) {
  const std::string cmd = std::string(HERD_BINARY_DIR) + "/herd " + args + " 2>&1";
  RunResult r{-1, ""};
  std::FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) r.output.append(buf, n);
  int status = ::pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

TEST_F(HfIoTest, HfCliExportImportRoundTrip) {
  if (!PathExists(std::string(HERD_BINARY_DIR) + "/herd")) GTEST_SKIP() << "herd binary not built";
  config::JobConfig job;
  *job.mutable_model() = SmallModel(false);
  job.mutable_train()->set_seq_len(48);
  const ParamLayout layout(LlamaShape::FromConfig(job.model()));
  ShardState shard;
  shard.end = layout.size();
  shard.step = 5;
  shard.weights.assign(layout.size(), 0.0f);
  InitParameters(layout, 11, 0.02, shard.weights.data());
  shard.m.assign(layout.size(), 0.1f);
  shard.v.assign(layout.size(), 0.2f);
  ASSERT_TRUE(WriteSingleShardCheckpoint(StepDirName(Path("ckpt"), 5), job, shard.view()).ok());

  // The root: its latest step is exported.
  RunResult r = RunHerd("export " + Path("ckpt") + " --out " + Path("hf"));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find(Path("hf")), std::string::npos) << r.output;
  json c = json::parse(ReadBytes(Path("hf/config.json")));
  EXPECT_EQ(c["max_position_embeddings"], 48);

  r = RunHerd("import " + Path("hf") + " --out " + Path("imported/step_00000000"));
  ASSERT_EQ(r.code, 0) << r.output;
  auto back = LoadCheckpointModel(Path("imported"));
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->step, 0);
  config::ModelConfig expected_model = SmallModel(false);
  expected_model.set_max_position_embeddings(48);  // kept from config.json
  // Equivalent: a checkpoint's config records every default (ConfigToText).
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equivalent(back->config.model(), expected_model))
      << back->config.model().DebugString() << " vs " << expected_model.DebugString();
  EXPECT_EQ(back->weights, shard.weights);
  // Exported again, the imported model keeps its max_position_embeddings
  // (not the imported job's default train.seq_len).
  r = RunHerd("export " + Path("imported") + " --out " + Path("hf_again"));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(json::parse(ReadBytes(Path("hf_again/config.json")))["max_position_embeddings"], 48);
  auto moments = ReadShard(Path("imported/step_00000000/shard_00000.bin"));
  ASSERT_TRUE(moments.ok()) << moments.status().message();
  EXPECT_EQ(moments->m, std::vector<float>(layout.size(), 0.0f));
  EXPECT_EQ(moments->v, std::vector<float>(layout.size(), 0.0f));

  // --step, and refusing an existing target.
  r = RunHerd("import " + Path("hf") + " --out " + Path("at7") + " --step 7");
  ASSERT_EQ(r.code, 0) << r.output;
  auto at7 = LoadCheckpointModel(Path("at7"));
  ASSERT_TRUE(at7.ok()) << at7.status().message();
  EXPECT_EQ(at7->step, 7);
  r = RunHerd("import " + Path("hf") + " --out " + Path("at7"));
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  EXPECT_NE(r.output.find(Path("at7") + ": already exists"), std::string::npos) << r.output;

  // A bad HF directory: one line, nothing written.
  EditConfig(Path("hf"), [](json& j) { j["hidden_act"] = "relu"; });
  r = RunHerd("import " + Path("hf") + " --out " + Path("bad"));
  EXPECT_NE(r.code, 0);
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  EXPECT_NE(r.output.find("hidden_act"), std::string::npos) << r.output;
  EXPECT_FALSE(PathExists(Path("bad")));

  r = RunHerd("export " + Path("nothing") + " --out " + Path("hf2"));
  EXPECT_NE(r.code, 0);
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  EXPECT_FALSE(PathExists(Path("hf2")));
}

}  // namespace
}  // namespace herd
