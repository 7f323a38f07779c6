#include "data/tokenizer.h"

#include <algorithm>
#include <deque>
#include <queue>
#include <utility>

#include <glog/logging.h>
#include <nlohmann/json.hpp>

#include "common/file_util.h"
#include "data/token_regex.h"
#include "data/unicode.h"

namespace herd {

using Json = nlohmann::json;

namespace {

// GPT-2's map of the 256 bytes onto printable code points, which
// byte-level vocabularies are spelled in.
struct ByteMap {
  char32_t to_char[256];
  std::unordered_map<char32_t, uint8_t> to_byte;
  ByteMap() {
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      to_char[b] = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + extra++);
      to_byte[to_char[b]] = static_cast<uint8_t>(b);
    }
  }
};
const ByteMap& TheByteMap() {
  static const ByteMap* map = new ByteMap();
  return *map;
}

// The bytes a byte-level vocabulary entry spells; false when a character
// of it is not one of the 256.
bool UnmapBytes(std::string_view spelled, std::string* bytes) {
  bytes->clear();
  for (size_t i = 0; i < spelled.size();) {
    int length;
    const char32_t cp = unicode::DecodeUtf8(spelled, i, &length);
    const auto it = TheByteMap().to_byte.find(cp);
    if (it == TheByteMap().to_byte.end()) return false;
    bytes->push_back(static_cast<char>(it->second));
    i += length;
  }
  return true;
}

uint64_t PairKey(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

// A piece of text on its way through the pre-tokenizers.
using Piece = std::string_view;

enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// Splits `piece` at the [begin, end) byte spans `found` (in order,
// non-overlapping) the way tokenizers' NormalizedString::split does.
void SplitBy(Piece piece, const std::vector<std::pair<size_t, size_t>>& found, Behavior behavior, bool invert,
             std::vector<Piece>* out) {
  struct Span {
    size_t begin, end;
    bool match;
  };
  std::vector<Span> spans;
  size_t prev = 0;
  for (const auto& [b, e] : found) {
    if (prev != b) spans.push_back({prev, b, false});
    spans.push_back({b, e, true});
    prev = e;
  }
  if (prev != piece.size()) spans.push_back({prev, piece.size(), false});
  if (invert) {
    for (Span& s : spans) s.match = !s.match;
  }
  std::vector<Span> kept;
  switch (behavior) {
    case Behavior::kIsolated:
      kept = spans;
      break;
    case Behavior::kRemoved:
      for (const Span& s : spans) {
        if (!s.match) kept.push_back(s);
      }
      break;
    case Behavior::kContiguous: {
      bool previous = false;
      for (const Span& s : spans) {
        if (s.match == previous && !kept.empty()) {
          kept.back().end = s.end;
        } else {
          kept.push_back(s);
        }
        previous = s.match;
      }
      break;
    }
    case Behavior::kMergedWithPrevious: {
      bool previous = false;
      for (const Span& s : spans) {
        if (s.match && !previous && !kept.empty()) {
          kept.back().end = s.end;
        } else {
          kept.push_back(s);
        }
        previous = s.match;
      }
      break;
    }
    case Behavior::kMergedWithNext: {
      bool previous = false;
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->match && !previous && !kept.empty()) {
          kept.back().begin = it->begin;
        } else {
          kept.push_back(*it);
        }
        previous = it->match;
      }
      std::reverse(kept.begin(), kept.end());
      break;
    }
  }
  for (const Span& s : kept) {
    if (s.end > s.begin) out->push_back(piece.substr(s.begin, s.end - s.begin));
  }
}

// Decodes a piece into code points, with each one's byte offset (and the
// end offset last).
void Decode(Piece piece, std::vector<char32_t>* cps, std::vector<uint32_t>* offsets) {
  cps->clear();
  offsets->clear();
  for (size_t i = 0; i < piece.size();) {
    int length;
    cps->push_back(unicode::DecodeUtf8(piece, i, &length));
    offsets->push_back(static_cast<uint32_t>(i));
    i += static_cast<size_t>(length);
  }
  offsets->push_back(static_cast<uint32_t>(piece.size()));
}

constexpr const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

}  // namespace

// One step of the pre-tokenizer (a Sequence is its steps in order).
struct Tokenizer::PreTokenizer {
  enum class Kind { kSplitRegex, kSplitString, kDigits, kPrefixSpace };
  explicit PreTokenizer(Kind k) : kind(k) {}
  Kind kind;
  std::unique_ptr<TokenRegex> regex;
  std::string literal;
  Behavior behavior = Behavior::kIsolated;
  bool invert = false;
  bool individual_digits = false;
  std::vector<PreTokenizer> more;  // the steps after this one

  // Scratch, per call: text the steps make (a prefixed space).
  struct Work {
    std::deque<std::string> made;
    std::vector<char32_t> cps;
    std::vector<uint32_t> offsets;
    std::vector<std::pair<uint32_t, uint32_t>> matches;
    std::vector<std::pair<size_t, size_t>> found;
  };
  void Apply(const std::vector<Piece>& in, Work* w, std::vector<Piece>* out) const {
    for (Piece piece : in) {
      w->found.clear();
      switch (kind) {
        case Kind::kPrefixSpace:
          if (!piece.starts_with(' ')) {
            std::string& prefixed = w->made.emplace_back(1, ' ');
            prefixed.append(piece);
            piece = w->made.back();
          }
          out->push_back(piece);
          continue;
        case Kind::kSplitRegex:
          Decode(piece, &w->cps, &w->offsets);
          w->matches.clear();
          regex->FindAll(w->cps.data(), w->cps.size(), &w->matches);
          for (const auto& [b, e] : w->matches) w->found.emplace_back(w->offsets[b], w->offsets[e]);
          break;
        case Kind::kSplitString:
          if (!literal.empty()) {
            for (size_t at = piece.find(literal); at != Piece::npos; at = piece.find(literal, at + literal.size())) {
              w->found.emplace_back(at, at + literal.size());
            }
          }
          break;
        case Kind::kDigits:
          // Rust's char::is_numeric: categories Nd, Nl and No.
          static const uint32_t kNumeric = unicode::CategoryMask("N");
          Decode(piece, &w->cps, &w->offsets);
          for (size_t i = 0; i < w->cps.size(); ++i) {
            if ((kNumeric >> unicode::GeneralCategory(w->cps[i])) & 1) {
              w->found.emplace_back(w->offsets[i], w->offsets[i + 1]);
            }
          }
          break;
      }
      SplitBy(piece, w->found, behavior, invert, out);
    }
  }
};

namespace {

using PreTokenizer = Tokenizer::PreTokenizer;

Status Refuse(const std::string& path, const std::string& what) {
  return Status::InvalidArgument(path + ": " + what +
                                 "; herd encodes byte-level BPE tokenizer.json files (GPT-2, Llama 3, Qwen, SmolLM, OLMo)");
}

const Json* Field(const Json& object, const char* name) {
  const auto it = object.find(name);
  return it == object.end() || it->is_null() ? nullptr : &*it;
}

// Appends the steps of one tokenizer.json pre_tokenizer to *steps; sets
// *byte_level when a ByteLevel step is among them.
Status ParsePreTokenizer(const std::string& path, const Json& j, std::vector<PreTokenizer>* steps, bool* byte_level) {
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string()) {
    return Status::InvalidArgument(path + ": pre_tokenizer: expected an object with a \"type\"");
  }
  const std::string type = j["type"];
  if (type == "Sequence") {
    const Json* list = Field(j, "pretokenizers");
    if (list == nullptr || !list->is_array()) {
      return Status::InvalidArgument(path + ": pre_tokenizer Sequence: no \"pretokenizers\" list");
    }
    for (const Json& step : *list) HERD_RETURN_IF_ERROR(ParsePreTokenizer(path, step, steps, byte_level));
    return Status::OK();
  }
  if (type == "ByteLevel") {
    *byte_level = true;
    if (j.value("add_prefix_space", false)) steps->emplace_back(PreTokenizer::Kind::kPrefixSpace);
    if (j.value("use_regex", true)) {
      PreTokenizer split(PreTokenizer::Kind::kSplitRegex);
      HERD_ASSIGN_OR_RETURN(TokenRegex re, TokenRegex::Compile(kGpt2Pattern));
      split.regex = std::make_unique<TokenRegex>(std::move(re));
      steps->push_back(std::move(split));
    }
    return Status::OK();
  }
  if (type == "Digits") {
    PreTokenizer d(PreTokenizer::Kind::kDigits);
    d.individual_digits = j.value("individual_digits", false);
    d.behavior = d.individual_digits ? Behavior::kIsolated : Behavior::kContiguous;
    steps->push_back(std::move(d));
    return Status::OK();
  }
  if (type == "Split") {
    PreTokenizer s(PreTokenizer::Kind::kSplitString);
    const Json* pattern = Field(j, "pattern");
    if (pattern == nullptr || !pattern->is_object()) return Refuse(path, "pre_tokenizer Split without a pattern");
    if (pattern->contains("Regex") && (*pattern)["Regex"].is_string()) {
      s.kind = PreTokenizer::Kind::kSplitRegex;
      auto re = TokenRegex::Compile((*pattern)["Regex"].get<std::string>());
      if (!re.ok()) return Refuse(path, "pre_tokenizer Split: " + re.status().message());
      s.regex = std::make_unique<TokenRegex>(std::move(re).value());
    } else if (pattern->contains("String") && (*pattern)["String"].is_string()) {
      s.literal = (*pattern)["String"].get<std::string>();
    } else {
      return Refuse(path, "pre_tokenizer Split: a pattern that is neither Regex nor String");
    }
    const std::string behavior = j.value("behavior", std::string("Isolated"));
    static const std::pair<const char*, Behavior> kBehaviors[] = {
        {"Removed", Behavior::kRemoved},
        {"Isolated", Behavior::kIsolated},
        {"MergedWithPrevious", Behavior::kMergedWithPrevious},
        {"MergedWithNext", Behavior::kMergedWithNext},
        {"Contiguous", Behavior::kContiguous}};
    bool known = false;
    for (const auto& [name, b] : kBehaviors) {
      if (behavior == name) s.behavior = b, known = true;
    }
    if (!known) return Refuse(path, "pre_tokenizer Split: behavior '" + behavior + "'");
    s.invert = j.value("invert", false);
    steps->push_back(std::move(s));
    return Status::OK();
  }
  return Refuse(path, "pre_tokenizer '" + type + "' is not supported");
}

// What people pass instead of a tokenizer.json: tiktoken rank files
// ("<base64> <rank>" lines; Meta ships Llama 3's as tokenizer.model) and
// SentencePiece models (a protobuf). The refusal says which it looks like.
Status RefuseNotJson(const std::string& path, const std::string& text) {
  const size_t eol = text.find('\n');
  const std::string line = text.substr(0, std::min<size_t>(eol, 200));
  const size_t space = line.find(' ');
  const bool tiktoken = space != std::string::npos && space > 0 &&
                        line.find_first_not_of("0123456789", space + 1) == std::string::npos &&
                        line.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=") ==
                            space;
  return Status::InvalidArgument(
      path + (tiktoken ? ": a tiktoken rank file, which lacks the split pattern and special tokens: pass the "
                         "model's tokenizer.json (published beside it)"
                       : ": not a tokenizer.json (a SentencePiece .model?): herd encodes byte-level BPE "
                         "tokenizer.json files (GPT-2, Llama 3, Qwen, SmolLM, OLMo); SentencePiece models (Llama 2, "
                         "Mistral, Gemma) are not byte-level and are not supported"));
}

// One entry of model.merges, "left right" or [left, right], as its two
// tokens' spellings.
Status ParseMerge(const std::string& path, const Json& m, int32_t rank, std::string* left, std::string* right) {
  if (m.is_string()) {
    const std::string s = m.get<std::string>();
    const size_t space = s.find(' ');
    if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
      return Status::InvalidArgument(path + ": model.merges[" + std::to_string(rank) + "]: '" + s +
                                     "' is not two tokens");
    }
    *left = s.substr(0, space), *right = s.substr(space + 1);
  } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
    *left = m[0].get<std::string>(), *right = m[1].get<std::string>();
  } else {
    return Status::InvalidArgument(path + ": model.merges[" + std::to_string(rank) + "]: not a pair of tokens");
  }
  return Status::OK();
}

}  // namespace

// Fills a Tokenizer from a parsed tokenizer.json, one section at a time.
// The sections are read in a fixed order, so that of several problems a
// file has, the same one is always the one reported.
class Tokenizer::Loader {
 public:
  Loader(const std::string& path, const Json& file, Tokenizer* t) : path_(path), file_(file), t_(t) {}

  Status Load() {
    HERD_RETURN_IF_ERROR(ReadModelType());
    HERD_RETURN_IF_ERROR(ReadNormalizer());
    HERD_RETURN_IF_ERROR(RefuseUnsupportedBpeOptions());
    t_->ignore_merges_ = model_->value("ignore_merges", false);
    HERD_RETURN_IF_ERROR(ReadPreTokenizer());
    HERD_RETURN_IF_ERROR(ReadVocab());
    MapSingleBytes();
    HERD_RETURN_IF_ERROR(ReadMerges());
    HERD_RETURN_IF_ERROR(ReadAddedTokens());
    t_->vocab_size_ = static_cast<int>(t_->bytes_.size());
    FindDocumentTokens();
    return Status::OK();
  }

 private:
  Status ReadModelType() {
    model_ = Field(file_, "model");
    if (model_ == nullptr || !model_->is_object()) return Status::InvalidArgument(path_ + ": no \"model\"");
    const std::string type = model_->value("type", std::string("BPE"));
    if (type != "BPE") return Refuse(path_, "model type '" + type + "'");
    return Status::OK();
  }

  // A normalizer, or a Sequence of them: only NFC is implemented.
  Status ReadNormalizer() {
    const Json* n = Field(file_, "normalizer");
    if (n == nullptr) return Status::OK();
    const bool sequence = n->value("type", std::string()) == "Sequence" && n->contains("normalizers") &&
                          (*n)["normalizers"].is_array();
    for (const Json& step : sequence ? (*n)["normalizers"] : Json::array({*n})) {
      const std::string type = step.is_object() ? step.value("type", std::string("?")) : "?";
      if (type != "NFC") return Refuse(path_, "normalizer '" + type + "' is not supported (NFC is)");
      t_->nfc_ = true;
    }
    return Status::OK();
  }

  Status RefuseUnsupportedBpeOptions() {
    if (const Json* d = Field(*model_, "dropout"); d != nullptr && d->is_number() && d->get<double>() > 0) {
      return Refuse(path_, "BPE dropout");
    }
    if (model_->value("byte_fallback", false)) return Refuse(path_, "byte_fallback (a SentencePiece-style BPE)");
    for (const char* affix : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      if (const Json* a = Field(*model_, affix); a != nullptr && a->is_string() && !a->get<std::string>().empty()) {
        return Refuse(path_, std::string(affix) + " '" + a->get<std::string>() + "'");
      }
    }
    return Status::OK();
  }

  Status ReadPreTokenizer() {
    const Json* pre = Field(file_, "pre_tokenizer");
    if (pre == nullptr) return Refuse(path_, "no pre_tokenizer (a byte-level tokenizer has a ByteLevel one)");
    std::vector<PreTokenizer> steps;
    bool byte_level = false;
    HERD_RETURN_IF_ERROR(ParsePreTokenizer(path_, *pre, &steps, &byte_level));
    if (!byte_level) return Refuse(path_, "no ByteLevel pre-tokenizer");
    // Chain the steps: each holds the rest.
    for (size_t i = steps.size(); i-- > 0;) {
      auto step = std::make_unique<PreTokenizer>(std::move(steps[i]));
      if (t_->pre_) step->more.push_back(std::move(*t_->pre_));
      t_->pre_ = std::move(step);
    }
    return Status::OK();
  }

  // The vocabulary, spelled in mapped bytes.
  Status ReadVocab() {
    const Json* vocab = Field(*model_, "vocab");
    if (vocab == nullptr || !vocab->is_object()) return Status::InvalidArgument(path_ + ": model: no \"vocab\" object");
    spelled_.reserve(vocab->size());
    int32_t max_id = -1;
    for (auto it = vocab->begin(); it != vocab->end(); ++it) {
      if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 || it.value().get<int64_t>() >= (1 << 30)) {
        return Status::InvalidArgument(path_ + ": model.vocab: token '" + it.key() + "' has no valid id");
      }
      const int32_t id = it.value().get<int32_t>();
      spelled_[it.key()] = id;
      max_id = std::max(max_id, id);
    }
    t_->bytes_.resize(static_cast<size_t>(max_id) + 1);
    std::string bytes;
    for (const auto& [word, id] : spelled_) {
      // An entry outside the byte alphabet can never be produced; it keeps
      // its spelling for Bytes().
      if (!UnmapBytes(word, &bytes)) bytes = word;
      t_->bytes_[id] = bytes;
      t_->by_bytes_.emplace(bytes, id);
    }
    return Status::OK();
  }

  // The token of each single byte: its vocabulary entry, else the unknown
  // token, else none.
  void MapSingleBytes() {
    int32_t unk = -1;
    if (const Json* u = Field(*model_, "unk_token"); u != nullptr && u->is_string()) {
      const auto it = spelled_.find(u->get<std::string>());
      if (it != spelled_.end()) unk = it->second;
    }
    int missing = 0;
    for (int b = 0; b < 256; ++b) {
      std::string one;
      unicode::AppendUtf8(TheByteMap().to_char[b], &one);
      const auto it = spelled_.find(one);
      t_->byte_id_[b] = it == spelled_.end() ? unk : it->second;
      missing += it == spelled_.end();
    }
    t_->fuse_unk_ = unk >= 0 && model_->value("fuse_unk", false);
    t_->byte_id_unk_ = unk;
    if (missing > 0) {
      // As tokenizers does: those bytes become the unknown token, or vanish.
      LOG(WARNING) << path_ << ": " << missing << " of the 256 bytes have no token in model.vocab; text holding them "
                   << (unk >= 0 ? "encodes them as the unknown token" : "loses them, as with tokenizers");
    }
  }

  // Merges, by rank.
  Status ReadMerges() {
    const Json* merges = Field(*model_, "merges");
    if (merges == nullptr || !merges->is_array()) return Status::InvalidArgument(path_ + ": model: no \"merges\" list");
    t_->merges_.reserve(merges->size() * 2);
    int32_t rank = 0;
    for (const Json& m : *merges) {
      std::string left, right;
      HERD_RETURN_IF_ERROR(ParseMerge(path_, m, rank, &left, &right));
      const auto l = spelled_.find(left), r = spelled_.find(right), both = spelled_.find(left + right);
      if (l == spelled_.end() || r == spelled_.end() || both == spelled_.end()) {
        return Status::InvalidArgument(path_ + ": model.merges[" + std::to_string(rank) + "]: '" + left + "' + '" +
                                       right + "' names a token not in model.vocab");
      }
      t_->merges_[PairKey(l->second, r->second)] = {rank++, both->second};
    }
    return Status::OK();
  }

  // Special added tokens are only remembered (text spelling them is text);
  // the others are recognised in text by Encode.
  Status ReadAddedTokens() {
    if (const Json* added = Field(file_, "added_tokens")) {
      if (!added->is_array()) return Status::InvalidArgument(path_ + ": added_tokens: not a list");
      for (const Json& a : *added) HERD_RETURN_IF_ERROR(ReadAddedToken(a));
    }
    t_->added_ids_.clear();
    for (const std::string& content : t_->added_) {
      for (int32_t id = 0; id < static_cast<int32_t>(t_->bytes_.size()); ++id) {
        if (t_->bytes_[id] == content) t_->added_ids_[content] = id;
      }
    }
    return Status::OK();
  }

  Status ReadAddedToken(const Json& a) {
    if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() || !a.contains("content") ||
        !a["content"].is_string() || a["id"].get<int64_t>() < 0 || a["id"].get<int64_t>() >= (1 << 30)) {
      return Status::InvalidArgument(path_ + ": added_tokens: an entry without a valid id and content");
    }
    const int32_t id = a["id"].get<int32_t>();
    const std::string content = a["content"].get<std::string>();
    if (static_cast<size_t>(id) >= t_->bytes_.size()) t_->bytes_.resize(static_cast<size_t>(id) + 1);
    t_->bytes_[id] = content;
    if (a.value("special", false)) {
      special_.emplace_back(content, id);
      return Status::OK();
    }
    for (const char* flag : {"single_word", "lstrip", "rstrip"}) {
      if (a.value(flag, false)) {
        return Refuse(path_, "added token '" + content + "' (id " + std::to_string(id) + ") sets " + flag);
      }
    }
    if (!content.empty()) t_->added_.push_back(content);
    return Status::OK();
  }

  // The post-processor's first special token (a beginning of text), and a
  // conventional end-of-text token.
  void FindDocumentTokens() {
    if (const Json* post = Field(file_, "post_processor")) {
      if (post->value("type", std::string()) == "Sequence" && post->contains("processors")) {
        for (const Json& p : (*post)["processors"]) t_->bos_token_ = std::max(t_->bos_token_, FirstSpecial(p));
      } else {
        t_->bos_token_ = FirstSpecial(*post);
      }
    }
    for (const char* name : {"<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>"}) {
      for (const auto& [content, id] : special_) {
        if (t_->eos_token_ < 0 && content == name) t_->eos_token_ = id;
      }
    }
  }

  // The special token a TemplateProcessing post-processor puts first, or -1.
  int32_t FirstSpecial(const Json& p) const {
    const Json* single = Field(p, "single");
    if (p.value("type", std::string()) != "TemplateProcessing" || single == nullptr || !single->is_array() ||
        single->empty() || !(*single)[0].contains("SpecialToken")) {
      return -1;
    }
    const std::string name = (*single)[0]["SpecialToken"].value("id", std::string());
    for (const auto& [content, id] : special_) {
      if (content == name) return id;
    }
    return -1;
  }

  const std::string& path_;
  const Json& file_;
  Tokenizer* const t_;
  const Json* model_ = nullptr;
  std::unordered_map<std::string, int32_t> spelled_;         // model.vocab: spelling -> id
  std::vector<std::pair<std::string, int32_t>> special_;  // special added tokens: content, id
};

Tokenizer::Tokenizer() = default;
Tokenizer::~Tokenizer() = default;

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::Load(const std::string& path) {
  HERD_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  const size_t first = text.find_first_not_of(" \t\r\n");
  if (first == std::string::npos || text[first] != '{') return RefuseNotJson(path, text);
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Status::InvalidArgument(path + ": not a JSON object");
  auto t = std::unique_ptr<Tokenizer>(new Tokenizer());
  HERD_RETURN_IF_ERROR(Loader(path, j, t.get()).Load());
  return t;
}

int32_t Tokenizer::Find(std::string_view content) const {
  for (int32_t id = static_cast<int32_t>(bytes_.size()); id-- > 0;) {
    if (bytes_[id] == content) return id;
  }
  return -1;
}

std::string_view Tokenizer::Bytes(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= bytes_.size()) return {};
  return bytes_[id];
}

void Tokenizer::Encode(std::string_view text, Cache* cache, std::vector<int32_t>* ids) const {
  // Non-special added tokens are cut out first, the leftmost (then the
  // longest) occurrence each time.
  while (!added_.empty() && !text.empty()) {
    size_t at = std::string_view::npos;
    const std::string* hit = nullptr;
    for (const std::string& a : added_) {
      const size_t p = text.find(a);
      if (p < at || (p == at && p != std::string_view::npos && a.size() > hit->size())) at = p, hit = &a;
    }
    if (hit == nullptr) break;
    EncodePlain(text.substr(0, at), cache, ids);
    ids->push_back(added_ids_.at(*hit));
    text.remove_prefix(at + hit->size());
  }
  EncodePlain(text, cache, ids);
}

void Tokenizer::EncodePlain(std::string_view text, Cache* cache, std::vector<int32_t>* ids) const {
  if (text.empty()) return;
  std::string normalized;
  if (nfc_) {
    normalized = unicode::ToNfc(text);
    text = normalized;
  }
  PreTokenizer::Work work;
  std::vector<Piece> pieces{text}, next;
  for (const PreTokenizer* step = pre_.get(); step != nullptr;
       step = step->more.empty() ? nullptr : &step->more.front()) {
    next.clear();
    step->Apply(pieces, &work, &next);
    pieces.swap(next);
  }
  for (Piece word : pieces) EncodeWord(word, cache, ids);
}

void Tokenizer::EncodeWord(std::string_view word, Cache* cache, std::vector<int32_t>* ids) const {
  constexpr size_t kCachedLength = 256;
  constexpr size_t kCacheEntries = 1 << 18;
  if (word.size() < kCachedLength) {
    const auto it = cache->words.find(std::string(word));
    if (it != cache->words.end()) {
      ids->insert(ids->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> out;
  if (ignore_merges_) {
    const auto it = by_bytes_.find(std::string(word));
    if (it != by_bytes_.end()) out.push_back(it->second);
  }
  if (out.empty()) {
    // Symbols linked both ways; merges applied lowest rank first, leftmost
    // first among equal ranks, as tokenizers' Word::merge_all does.
    struct Symbol {
      int32_t id;
      int32_t prev, next;
      bool gone;
    };
    std::vector<Symbol> s;
    s.reserve(word.size());
    for (const char byte : word) {
      const int32_t id = byte_id_[static_cast<unsigned char>(byte)];
      if (id < 0) continue;  // no token and no unknown token: dropped
      if (fuse_unk_ && id == byte_id_unk_ && !s.empty() && s.back().id == id) continue;
      s.push_back({id, static_cast<int32_t>(s.size()) - 1, -1, false});
      if (s.size() > 1) s[s.size() - 2].next = static_cast<int32_t>(s.size()) - 1;
    }
    struct Candidate {
      int32_t rank, pos, id;
      bool operator<(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
    };
    std::priority_queue<Candidate> queue;
    auto consider = [&](int32_t pos) {
      if (pos < 0 || s[pos].next < 0) return;
      const auto it = merges_.find(PairKey(s[pos].id, s[s[pos].next].id));
      if (it != merges_.end()) queue.push({it->second.rank, pos, it->second.id});
    };
    for (int32_t i = 0; i + 1 < static_cast<int32_t>(s.size()); ++i) consider(i);
    while (!queue.empty()) {
      const Candidate top = queue.top();
      queue.pop();
      Symbol& left = s[top.pos];
      if (left.gone || left.next < 0) continue;
      const auto it = merges_.find(PairKey(left.id, s[left.next].id));
      if (it == merges_.end() || it->second.id != top.id) continue;
      Symbol& right = s[left.next];
      left.id = top.id;
      right.gone = true;
      left.next = right.next;
      if (right.next >= 0) s[right.next].prev = top.pos;
      consider(left.prev);
      consider(top.pos);
    }
    for (int32_t i = 0; i >= 0 && i < static_cast<int32_t>(s.size()); i = s[i].next) out.push_back(s[i].id);
  }
  ids->insert(ids->end(), out.begin(), out.end());
  if (word.size() < kCachedLength) {
    if (cache->words.size() >= kCacheEntries) cache->words.clear();
    cache->words.emplace(std::string(word), std::move(out));
  }
}

}  // namespace herd
