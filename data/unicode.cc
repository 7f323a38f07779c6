#include "data/unicode.h"

#include <algorithm>
#include <array>
#include <vector>

namespace herd::unicode {
namespace {

struct CategoryRun {
  char32_t first;
  uint8_t category;
};
struct CombiningRun {
  char32_t first, last;
  uint8_t combining_class;
};
struct Decomposition {
  char32_t cp, first, second;  // second 0: a singleton
};
struct Composition {
  char32_t first, second, composite;
};
#include "data/unicode_tables.inc"

static_assert(sizeof(kCategoryNames) / sizeof(kCategoryNames[0]) == kCategoryCount);

// Two-stage table: blocks of 256 code points, identical blocks shared.
class CategoryTable {
 public:
  CategoryTable() {
    constexpr size_t kRuns = sizeof(kCategoryRuns) / sizeof(kCategoryRuns[0]);
    std::array<uint8_t, 256> block;
    size_t run = 0;
    for (char32_t base = 0; base < 0x110000; base += 256) {
      for (char32_t i = 0; i < 256; ++i) {
        while (run + 1 < kRuns && kCategoryRuns[run + 1].first <= base + i) ++run;
        block[i] = kCategoryRuns[run].category;
      }
      size_t found = 0;
      while (found < blocks_.size() && blocks_[found] != block) ++found;
      if (found == blocks_.size()) blocks_.push_back(block);
      index_[base >> 8] = static_cast<uint16_t>(found);
    }
  }
  Category Get(char32_t cp) const {
    if (cp >= 0x110000) return kCn;
    return static_cast<Category>(blocks_[index_[cp >> 8]][cp & 0xFF]);
  }

 private:
  std::array<uint16_t, 0x1100> index_{};
  std::vector<std::array<uint8_t, 256>> blocks_;
};

// Hangul syllables decompose and compose by arithmetic.
constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr int kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

uint8_t CombiningClass(char32_t cp) {
  if (cp < 0x300) return 0;
  const auto* end = kCombiningRuns + sizeof(kCombiningRuns) / sizeof(kCombiningRuns[0]);
  const auto* it = std::upper_bound(kCombiningRuns, end, cp, [](char32_t c, const CombiningRun& r) { return c < r.first; });
  if (it == kCombiningRuns) return 0;
  --it;
  return cp <= it->last ? it->combining_class : 0;
}

void Decompose(char32_t cp, std::vector<char32_t>* out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const int s = static_cast<int>(cp - kSBase);
    out->push_back(kLBase + s / kNCount);
    out->push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount != 0) out->push_back(kTBase + s % kTCount);
    return;
  }
  const auto* end = kDecompositions + sizeof(kDecompositions) / sizeof(kDecompositions[0]);
  const auto* it = std::lower_bound(kDecompositions, end, cp, [](const Decomposition& d, char32_t c) { return d.cp < c; });
  if (it == end || it->cp != cp) {
    out->push_back(cp);
    return;
  }
  Decompose(it->first, out);
  if (it->second != 0) Decompose(it->second, out);
}

// The primary composite of (a, b), or 0.
char32_t Compose(char32_t a, char32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount) {
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  }
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase && b < kTBase + kTCount) {
    return a + (b - kTBase);
  }
  const auto* end = kCompositions + sizeof(kCompositions) / sizeof(kCompositions[0]);
  const auto* it = std::lower_bound(kCompositions, end, std::make_pair(a, b), [](const Composition& c, auto key) {
    return c.first != key.first ? c.first < key.first : c.second < key.second;
  });
  return it != end && it->first == a && it->second == b ? it->composite : 0;
}

}  // namespace

namespace {

// The length of the well-formed sequence at text[pos], or 0 with *bad set
// to the length of the maximal subpart to replace (at least 1).
int WellFormedLength(std::string_view text, size_t pos, int* bad) {
  const auto b0 = static_cast<uint8_t>(text[pos]);
  if (b0 < 0x80) return 1;
  int need;
  uint8_t lo = 0x80, hi = 0xBF;  // the second byte's range; later ones are 80..BF
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2;
    if (b0 == 0xE0) lo = 0xA0;  // no overlong forms
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;  // nothing past U+10FFFF
  } else {
    *bad = 1;
    return 0;
  }
  for (int i = 1; i <= need; ++i) {
    const size_t at = pos + static_cast<size_t>(i);
    const auto b = at < text.size() ? static_cast<uint8_t>(text[at]) : 0;
    if (at >= text.size() || b < lo || b > hi) {
      *bad = i;
      return 0;
    }
    lo = 0x80;
    hi = 0xBF;
  }
  return need + 1;
}

}  // namespace

size_t FirstInvalidUtf8(std::string_view text) {
  for (size_t pos = 0; pos < text.size();) {
    int bad = 0;
    const int n = WellFormedLength(text, pos, &bad);
    if (n == 0) return pos;
    pos += static_cast<size_t>(n);
  }
  return std::string_view::npos;
}

std::string ReplaceInvalidUtf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    int bad = 0;
    const int n = WellFormedLength(text, pos, &bad);
    if (n > 0) {
      out.append(text.substr(pos, static_cast<size_t>(n)));
      pos += static_cast<size_t>(n);
    } else {
      out.append("\xEF\xBF\xBD");  // U+FFFD
      pos += static_cast<size_t>(bad);
    }
  }
  return out;
}

char32_t DecodeUtf8(std::string_view text, size_t pos, int* length) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char b0 = byte(pos);
  *length = 1;
  if (b0 < 0x80) return b0;
  int n;
  char32_t cp, min;
  if ((b0 & 0xE0) == 0xC0) {
    n = 2, cp = b0 & 0x1F, min = 0x80;
  } else if ((b0 & 0xF0) == 0xE0) {
    n = 3, cp = b0 & 0x0F, min = 0x800;
  } else if ((b0 & 0xF8) == 0xF0) {
    n = 4, cp = b0 & 0x07, min = 0x10000;
  } else {
    return kInvalidBase + b0;
  }
  if (pos + n > text.size()) return kInvalidBase + b0;
  for (int i = 1; i < n; ++i) {
    const unsigned char b = byte(pos + i);
    if ((b & 0xC0) != 0x80) return kInvalidBase + b0;
    cp = (cp << 6) | (b & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return kInvalidBase + b0;
  *length = n;
  return cp;
}

Category GeneralCategory(char32_t cp) {
  static const CategoryTable* const table = new CategoryTable();
  return table->Get(cp);
}

bool IsWhiteSpace(char32_t cp) {
  if (cp < 0x80) return cp == ' ' || (cp >= '\t' && cp <= '\r');
  return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
         cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

uint32_t CategoryMask(std::string_view name) {
  uint32_t mask = 0;
  for (int c = 0; c < kCategoryCount; ++c) {
    const std::string_view full = kCategoryNames[c];
    if (full == name || (name.size() == 1 && full[0] == name[0])) mask |= 1u << c;
  }
  return mask;
}

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string ToNfc(std::string_view text) {
  if (std::none_of(text.begin(), text.end(), [](char c) { return static_cast<unsigned char>(c) >= 0xCC; })) {
    return std::string(text);
  }
  std::vector<char32_t> d;
  d.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    int length;
    const char32_t cp = DecodeUtf8(text, i, &length);
    if (cp >= kInvalidBase) {
      d.push_back(cp);
    } else {
      Decompose(cp, &d);
    }
    i += static_cast<size_t>(length);
  }
  // Canonical order: a stable sort of each run of non-starters by class.
  for (size_t i = 1; i < d.size(); ++i) {
    const uint8_t c = CombiningClass(d[i]);
    if (c == 0) continue;
    size_t j = i;
    while (j > 0 && CombiningClass(d[j - 1]) > c) {
      std::swap(d[j], d[j - 1]);
      --j;
    }
  }
  // Composition: each character joins the last starter unless something
  // between them blocks it (a starter, or a class at least its own).
  std::vector<char32_t> r;
  r.reserve(d.size());
  ptrdiff_t starter = -1;
  int last_class = -1;  // of the last character after the starter; -1: none
  for (const char32_t cp : d) {
    const int c = cp >= kInvalidBase ? 0 : CombiningClass(cp);
    if (starter >= 0 && r[starter] < kInvalidBase && cp < kInvalidBase && (last_class == -1 || (last_class != 0 && last_class < c))) {
      if (const char32_t composite = Compose(r[starter], cp)) {
        r[starter] = composite;
        continue;
      }
    }
    if (c == 0) {
      starter = static_cast<ptrdiff_t>(r.size());
      last_class = -1;
    } else {
      last_class = c;
    }
    r.push_back(cp);
  }
  std::string out;
  out.reserve(text.size());
  for (const char32_t cp : r) {
    if (cp >= kInvalidBase) {
      out.push_back(static_cast<char>(cp - kInvalidBase));
    } else {
      AppendUtf8(cp, &out);
    }
  }
  return out;
}

}  // namespace herd::unicode
