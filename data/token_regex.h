// The regular expressions of HuggingFace tokenizer.json files (Split
// pre-tokenizers, and the pattern ByteLevel applies by itself), in the
// Oniguruma syntax and with the Oniguruma semantics those files are written
// for: the leftmost match, alternatives tried in order, greedy (or lazy)
// quantifiers backtracking.
//
// Supported: alternation; groups (...), (?:...), (?i:...) (case-insensitive
// letters: ASCII, and the long s and Kelvin sign that Unicode folds to s and
// k); lookahead (?=...) and (?!...); classes [...] and [^...] with ranges
// and escapes; \s \S (White_Space), \d \D (Nd), \w \W (letters, marks, Nd,
// Pc), \p{..} \P{..} \p{^..} (general categories, one or two letters), \r
// \n \t \f \v \xHH \x{H..} \uHHHH and escaped punctuation; '.' (anything
// but \n); quantifiers ? * + {m} {m,} {m,n}, each optionally lazy (?).
// Anything else (anchors, back-references, possessive quantifiers, a
// repetition of what can match nothing) is refused by Compile with the
// offset where it stands.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace herd {

class TokenRegex {
 public:
  static StatusOr<TokenRegex> Compile(std::string_view pattern);

  // The end of the match that starts at text[pos], or -1 when none does
  // (pos <= n). A match may be empty (end == pos).
  int64_t MatchAt(const char32_t* text, size_t n, size_t pos) const;

  // The non-overlapping matches in text, leftmost first, as [begin, end)
  // pairs appended to *out; after an empty match the search moves on by
  // one code point (as Oniguruma's find_iter does).
  void FindAll(const char32_t* text, size_t n, std::vector<std::pair<uint32_t, uint32_t>>* out) const;

  const std::string& pattern() const { return pattern_; }

  struct ClassItem {
    enum Kind : uint8_t { kRange, kCategories, kSpace } kind;
    bool negated;
    char32_t lo, hi;  // kRange
    uint32_t mask;    // kCategories: bit per unicode::Category
  };
  struct CharClass {
    bool negated = false;
    std::vector<ClassItem> items;
    bool Matches(char32_t cp) const;
  };
  enum class Op : uint8_t { kClass, kSplit, kJump, kLook, kMatch };
  // Jumps are relative to the instruction, so pieces of program concatenate
  // unchanged. kClass: a = class index. kSplit: try pc + a first, then
  // pc + b. kJump: pc + a. kLook: a = 1 for negative; the sub-program runs
  // from pc + 1 to its kMatch, and matching goes on at pc + b.
  struct Inst {
    Op op;
    int32_t a = 0, b = 0;
  };

 private:
  TokenRegex() = default;
  int64_t Run(size_t pc, const char32_t* text, size_t n, size_t pos) const;

  std::string pattern_;
  std::vector<CharClass> classes_;
  std::vector<Inst> program_;
};

}  // namespace herd
