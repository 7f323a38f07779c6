#include "data/unicode.h"

#include <array>
#include <vector>

namespace herd::unicode {
namespace {

struct CategoryRun {
  char32_t first;
  uint8_t category;
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

}  // namespace

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

}  // namespace herd::unicode
