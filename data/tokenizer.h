// A HuggingFace tokenizer.json of the byte-level BPE family (GPT-2, Llama 3,
// Qwen, SmolLM, OLMo, and whatever the `tokenizers` package trains with a
// ByteLevel pre-tokenizer), encoding text to the ids `tokenizers` gives
// with encode_special_tokens on: special added tokens written in the text
// are text (as llm.c's data scripts encode, with tiktoken's
// encode_ordinary), other added tokens are recognised.
//
// Read from the file: the BPE model (vocab, merges in either format,
// ignore_merges), the added tokens, an NFC normalizer (Qwen, OLMo), and
// the pre-tokenizer: ByteLevel (add_prefix_space, use_regex), Split (a
// regex or string pattern, any behavior, invert), Digits, and Sequences of
// them. Anything else (another model, another normalizer, byte fallback,
// BPE dropout, a pre-tokenizer not listed) is refused by Load in one line naming it: encoding it as if it
// were not there would give other ids than the tokenizer's own.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/status.h"

namespace herd {

class Tokenizer {
 public:
  static StatusOr<std::unique_ptr<Tokenizer>> Load(const std::string& path);
  ~Tokenizer();

  // One past the largest id of the vocabulary and the added tokens.
  int vocab_size() const { return vocab_size_; }

  // The id of an added or vocabulary token spelled `content`, or -1.
  int32_t Find(std::string_view content) const;
  // The token that starts every document in a prepared file, as llm.c's
  // scripts do: the one the post-processor puts first (Llama 3's
  // <|begin_of_text|>), else the special token among <|endoftext|>,
  // <|end_of_text|>, </s>, <eos>; -1 when there is none.
  int32_t document_token() const { return bos_token_ >= 0 ? bos_token_ : eos_token_; }
  // Those two, each -1 when there is none.
  int32_t bos_token() const { return bos_token_; }
  int32_t eos_token() const { return eos_token_; }

  // Word-to-ids memory, one per thread (Encode does not lock).
  class Cache {
   public:
    Cache() = default;

   private:
    friend class Tokenizer;
    std::unordered_map<std::string, std::vector<int32_t>> words;
  };
  // Appends the ids of `text` (any bytes; invalid UTF-8 is encoded byte by
  // byte) to *ids.
  void Encode(std::string_view text, Cache* cache, std::vector<int32_t>* ids) const;

  // The bytes a token stands for (an added token: its content). Empty for
  // an id no token has.
  std::string_view Bytes(int32_t id) const;

  struct PreTokenizer;

 private:
  class Loader;  // reads tokenizer.json into the fields below
  Tokenizer();

  // Encodes text in which no added token is recognised.
  void EncodePlain(std::string_view text, Cache* cache, std::vector<int32_t>* ids) const;
  void EncodeWord(std::string_view word, Cache* cache, std::vector<int32_t>* ids) const;

  struct Merge {
    int32_t rank, id;
  };
  int vocab_size_ = 0;
  int32_t bos_token_ = -1, eos_token_ = -1;
  bool ignore_merges_ = false;
  bool nfc_ = false;  // normalize text to NFC first
  std::unordered_map<std::string, int32_t> by_bytes_;  // token bytes -> id
  std::vector<std::string> bytes_;                     // id -> bytes
  int32_t byte_id_[256];                               // single bytes (-1: none)
  int32_t byte_id_unk_ = -1;                           // the unknown token, or -1
  bool fuse_unk_ = false;                              // consecutive unknowns are one
  std::unordered_map<uint64_t, Merge> merges_;         // (left id, right id) -> merge
  std::vector<std::string> added_;                     // non-special added tokens' contents
  std::unordered_map<std::string, int32_t> added_ids_;  // their ids
  std::unique_ptr<PreTokenizer> pre_;
};

}  // namespace herd
