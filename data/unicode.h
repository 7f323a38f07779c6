// The little of Unicode that tokenizers need: each code point's general
// category (Unicode 14.0, the version HuggingFace tokenizers' regular
// expressions use), White_Space, Normalization Form C, and a UTF-8 decoder
// that never fails.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace herd::unicode {

// General categories, in the order of data/unicode_tables.inc.
enum Category : uint8_t {
  kCn, kLu, kLl, kLt, kLm, kLo, kMn, kMc, kMe, kNd, kNl, kNo, kPc, kPd, kPs, kPe, kPi,
  kPf, kPo, kSm, kSc, kSk, kSo, kZs, kZl, kZp, kCc, kCf, kCs, kCo, kCategoryCount
};

// A byte that starts no valid UTF-8 sequence decodes to kInvalidBase + the
// byte: a code point of category Cn, so text with stray bytes still
// tokenizes (byte-level tokenizers can spell any byte).
constexpr char32_t kInvalidBase = 0x110000;

// One code point at text[pos] (pos < text.size()): sets *length to the
// bytes it takes (1..4). Overlong forms, surrogates and truncated
// sequences are invalid bytes, one at a time.
char32_t DecodeUtf8(std::string_view text, size_t pos, int* length);

// The offset of the first byte of `text` that is not part of a
// well-formed UTF-8 sequence (Unicode's Table 3-7: no overlong forms, no
// surrogates, nothing past U+10FFFF, nothing truncated), or npos.
size_t FirstInvalidUtf8(std::string_view text);

// `text` with each maximal subpart of an ill-formed sequence replaced by
// U+FFFD, as Python's bytes.decode("utf-8", errors="replace") does (one
// U+FFFD for a truncated sequence, one per byte that can start none).
std::string ReplaceInvalidUtf8(std::string_view text);

// Appends cp (<= U+10FFFF) as UTF-8.
void AppendUtf8(char32_t cp, std::string* out);

Category GeneralCategory(char32_t cp);

// Unicode's White_Space property (what \s matches).
bool IsWhiteSpace(char32_t cp);

// The category named by a one- or two-letter name ("L", "Lu", "N", ...):
// for a one-letter name, a mask of its categories. 0 for an unknown name.
uint32_t CategoryMask(std::string_view name);

// Normalization Form C (UAX #15: canonical decomposition, canonical
// ordering, canonical composition). Bytes that are not valid UTF-8 pass
// through unchanged and block composition across them. Text whose code
// points are all below U+0300 is returned as it is without decoding.
std::string ToNfc(std::string_view text);

}  // namespace herd::unicode
