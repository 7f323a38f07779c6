#include "data/token_regex.h"

#include <algorithm>
#include <cctype>
#include <tuple>
#include <utility>

#include "data/unicode.h"

namespace herd {
namespace {

using Inst = TokenRegex::Inst;
using Op = TokenRegex::Op;
using Program = std::vector<Inst>;
using ClassItem = TokenRegex::ClassItem;
using CharClass = TokenRegex::CharClass;

// A piece of program and whether it can match the empty string.
struct Fragment {
  Program code;
  bool nullable = true;
};

ClassItem Range(char32_t lo, char32_t hi) { return {ClassItem::kRange, false, lo, hi, 0}; }
ClassItem Categories(uint32_t mask, bool negated) { return {ClassItem::kCategories, negated, 0, 0, mask}; }
ClassItem Space(bool negated) { return {ClassItem::kSpace, negated, 0, 0, 0}; }

constexpr uint32_t Bit(unicode::Category c) { return 1u << c; }
const uint32_t kDigitMask = Bit(unicode::kNd);
const uint32_t kWordMask = unicode::CategoryMask("L") | unicode::CategoryMask("M") | Bit(unicode::kNd) |
                           Bit(unicode::kPc);

// Recursive descent over the pattern, emitting program fragments.
class Parser {
 public:
  Parser(std::string_view pattern, std::vector<CharClass>* classes) : p_(pattern), classes_(classes) {}

  StatusOr<Program> Parse() {
    Fragment f;
    HERD_RETURN_IF_ERROR(Alternation(false, &f));
    if (pos_ < p_.size()) return Error("unbalanced ')'");
    f.code.push_back({Op::kMatch});
    return std::move(f.code);
  }

 private:
  Status Error(const std::string& what) const {
    return Status::InvalidArgument("regular expression '" + std::string(p_) + "': " + what + " at offset " +
                                   std::to_string(pos_));
  }
  bool At(char c) const { return pos_ < p_.size() && p_[pos_] == c; }
  bool AtString(std::string_view s) const { return p_.substr(pos_, s.size()) == s; }

  // The next code point of the pattern (UTF-8).
  char32_t Next() {
    int length = 1;
    const char32_t cp = unicode::DecodeUtf8(p_, pos_, &length);
    pos_ += length;
    return cp;
  }

  Status Alternation(bool fold, Fragment* out) {
    std::vector<Fragment> branches(1);
    HERD_RETURN_IF_ERROR(Sequence(fold, &branches.back()));
    while (At('|')) {
      ++pos_;
      branches.emplace_back();
      HERD_RETURN_IF_ERROR(Sequence(fold, &branches.back()));
    }
    // Split(next, after this branch); branch; Jump(end) ... last branch.
    size_t total = 0;
    for (size_t i = 0; i < branches.size(); ++i) total += branches[i].code.size() + (i + 1 < branches.size() ? 2 : 0);
    out->nullable = false;
    size_t emitted = 0;
    for (size_t i = 0; i < branches.size(); ++i) {
      const Program& b = branches[i].code;
      out->nullable = out->nullable || branches[i].nullable;
      const bool last = i + 1 == branches.size();
      if (!last) out->code.push_back({Op::kSplit, 1, static_cast<int32_t>(b.size() + 2)});
      out->code.insert(out->code.end(), b.begin(), b.end());
      emitted += b.size() + (last ? 0 : 1);
      if (!last) {
        out->code.push_back({Op::kJump, static_cast<int32_t>(total - emitted)});
        ++emitted;
      }
    }
    return Status::OK();
  }

  Status Sequence(bool fold, Fragment* out) {
    while (pos_ < p_.size() && !At('|') && !At(')')) {
      Fragment atom;
      HERD_RETURN_IF_ERROR(Atom(fold, &atom));
      HERD_RETURN_IF_ERROR(Quantified(&atom));
      out->code.insert(out->code.end(), atom.code.begin(), atom.code.end());
      out->nullable = out->nullable && atom.nullable;
    }
    return Status::OK();
  }

  StatusOr<int> Number() {
    const size_t start = pos_;
    int v = 0;
    while (pos_ < p_.size() && p_[pos_] >= '0' && p_[pos_] <= '9' && v < 10000) v = v * 10 + (p_[pos_++] - '0');
    if (pos_ == start) return Error("expected a number");
    if (v >= 1000) return Error("a repetition count over 999");
    return v;
  }

  Status Quantified(Fragment* f) {
    if (pos_ >= p_.size()) return Status::OK();
    int min, max;  // max -1: unbounded
    const size_t start = pos_;
    switch (p_[pos_]) {
      case '?': min = 0, max = 1, ++pos_; break;
      case '*': min = 0, max = -1, ++pos_; break;
      case '+': min = 1, max = -1, ++pos_; break;
      case '{': {
        ++pos_;
        HERD_ASSIGN_OR_RETURN(min, Number());
        max = min;
        if (At(',')) {
          ++pos_;
          max = -1;
          if (!At('}')) {
            HERD_ASSIGN_OR_RETURN(max, Number());
          }
        }
        if (!At('}')) return Error("expected '}'");
        ++pos_;
        if (max >= 0 && max < min) return Error("a repetition {m,n} with n < m");
        break;
      }
      default:
        return Status::OK();
    }
    bool lazy = false;
    if (At('?')) lazy = true, ++pos_;
    if (At('+') || At('*') || At('?') || At('{')) return Error("a possessive or doubled quantifier");
    if (f->nullable && max != 1) {
      pos_ = start;
      return Error("a repetition of what can match the empty string");
    }
    const Program x = std::move(f->code);
    const int32_t len = static_cast<int32_t>(x.size());
    Program out;
    for (int i = 0; i < min; ++i) out.insert(out.end(), x.begin(), x.end());
    if (max < 0) {
      // Loop: Split(body, exit); body; Jump(back to the split).
      out.push_back(lazy ? Inst{Op::kSplit, len + 2, 1} : Inst{Op::kSplit, 1, len + 2});
      out.insert(out.end(), x.begin(), x.end());
      out.push_back({Op::kJump, -(len + 1)});
    } else {
      for (int i = min; i < max; ++i) {
        out.push_back(lazy ? Inst{Op::kSplit, len + 1, 1} : Inst{Op::kSplit, 1, len + 1});
        out.insert(out.end(), x.begin(), x.end());
      }
    }
    f->code = std::move(out);
    f->nullable = f->nullable || min == 0;
    return Status::OK();
  }

  void EmitClass(CharClass c, Fragment* f) {
    classes_->push_back(std::move(c));
    f->code.push_back({Op::kClass, static_cast<int32_t>(classes_->size() - 1)});
    f->nullable = false;
  }

  // The code points a letter matches case-insensitively.
  static void AddFolded(char32_t cp, bool fold, std::vector<ClassItem>* items) {
    items->push_back(Range(cp, cp));
    if (!fold) return;
    if (cp >= 'a' && cp <= 'z') items->push_back(Range(cp - 32, cp - 32));
    if (cp >= 'A' && cp <= 'Z') items->push_back(Range(cp + 32, cp + 32));
    if (cp == 's' || cp == 'S') items->push_back(Range(0x17F, 0x17F));
    if (cp == 0x17F) items->push_back(Range('s', 's')), items->push_back(Range('S', 'S'));
    if (cp == 'k' || cp == 'K') items->push_back(Range(0x212A, 0x212A));
    if (cp == 0x212A) items->push_back(Range('k', 'k')), items->push_back(Range('K', 'K'));
  }

  // After a backslash: an escape that stands for a class (true, item set)
  // or for one code point (false, *cp set).
  StatusOr<bool> Escape(ClassItem* item, char32_t* cp) {
    if (pos_ >= p_.size()) return Error("a trailing backslash");
    const char c = p_[pos_++];
    switch (c) {
      case 's': *item = Space(false); return true;
      case 'S': *item = Space(true); return true;
      case 'd': *item = Categories(kDigitMask, false); return true;
      case 'D': *item = Categories(kDigitMask, true); return true;
      case 'w': *item = Categories(kWordMask, false); return true;
      case 'W': *item = Categories(kWordMask, true); return true;
      case 'p':
      case 'P': {
        if (!At('{')) return Error("expected '{' after \\p");
        const size_t close = p_.find('}', pos_);
        if (close == std::string_view::npos) return Error("expected '}'");
        std::string_view name = p_.substr(pos_ + 1, close - pos_ - 1);
        bool negated = c == 'P';
        if (name.starts_with("^")) negated = !negated, name.remove_prefix(1);
        const uint32_t mask = unicode::CategoryMask(name);
        if (mask == 0) return Error("an unknown property \\p{" + std::string(name) + "}");
        pos_ = close + 1;
        *item = Categories(mask, negated);
        return true;
      }
      case 'r': *cp = '\r'; return false;
      case 'n': *cp = '\n'; return false;
      case 't': *cp = '\t'; return false;
      case 'f': *cp = '\f'; return false;
      case 'v': *cp = '\v'; return false;
      case 'x':
      case 'u': {
        const bool braces = c == 'x' && At('{');
        if (braces) ++pos_;
        const size_t digits = braces ? 8 : (c == 'x' ? 2 : 4);
        char32_t v = 0;
        size_t n = 0;
        for (; n < digits && pos_ < p_.size() && std::isxdigit(static_cast<unsigned char>(p_[pos_])); ++n, ++pos_) {
          const char h = p_[pos_];
          v = v * 16 + static_cast<char32_t>(h <= '9' ? h - '0' : (h | 0x20) - 'a' + 10);
        }
        if (n == 0 || (!braces && n != digits)) return Error("a malformed \\" + std::string(1, c) + " escape");
        if (braces) {
          if (!At('}')) return Error("expected '}'");
          ++pos_;
        }
        if (v > 0x10FFFF) return Error("a code point beyond U+10FFFF");
        *cp = v;
        return false;
      }
      default:
        if (std::isalnum(static_cast<unsigned char>(c))) {
          --pos_;
          return Error("an unsupported escape \\" + std::string(1, c));
        }
        --pos_;
        *cp = Next();  // escaped punctuation (or any non-ASCII) stands for itself
        return false;
    }
  }

  Status Bracket(bool fold, Fragment* f) {
    CharClass c;
    if (At('^')) c.negated = true, ++pos_;
    bool first = true;
    while (pos_ < p_.size() && (first || !At(']'))) {
      first = false;
      if (At('[')) return Error("a nested class");
      if (AtString("&&")) return Error("a class intersection");
      char32_t lo;
      if (At('\\')) {
        ++pos_;
        ClassItem item;
        HERD_ASSIGN_OR_RETURN(bool is_class, Escape(&item, &lo));
        if (is_class) {
          c.items.push_back(item);
          continue;
        }
      } else {
        lo = Next();
      }
      char32_t hi = lo;
      if (At('-') && pos_ + 1 < p_.size() && p_[pos_ + 1] != ']') {
        ++pos_;
        if (At('\\')) {
          ++pos_;
          ClassItem item;
          HERD_ASSIGN_OR_RETURN(bool is_class, Escape(&item, &hi));
          if (is_class) return Error("a range ending in a class escape");
        } else {
          hi = Next();
        }
        if (hi < lo) return Error("a range out of order");
      }
      if (lo == hi) {
        AddFolded(lo, fold, &c.items);
      } else {
        c.items.push_back(Range(lo, hi));
        if (fold) {
          for (char32_t x = std::max<char32_t>(lo, 'A'); x <= std::min<char32_t>(hi, 'z'); ++x) {
            if (std::isalpha(static_cast<int>(x))) AddFolded(x, true, &c.items);
          }
        }
      }
    }
    if (!At(']')) return Error("an unterminated class");
    ++pos_;
    EmitClass(std::move(c), f);
    return Status::OK();
  }

  Status Atom(bool fold, Fragment* f) {
    const char c = p_[pos_];
    if (c == '(') {
      ++pos_;
      bool group_fold = fold;
      int look = -1;  // 0: positive, 1: negative lookahead
      if (AtString("?:")) {
        pos_ += 2;
      } else if (AtString("?i:")) {
        pos_ += 3, group_fold = true;
      } else if (AtString("?=")) {
        pos_ += 2, look = 0;
      } else if (AtString("?!")) {
        pos_ += 2, look = 1;
      } else if (At('?')) {
        return Error("an unsupported group (only (...), (?:...), (?i:...), (?=...) and (?!...))");
      }
      Fragment inner;
      HERD_RETURN_IF_ERROR(Alternation(group_fold, &inner));
      if (!At(')')) return Error("an unterminated group");
      ++pos_;
      if (look < 0) {
        *f = std::move(inner);
        return Status::OK();
      }
      inner.code.push_back({Op::kMatch});
      f->code.push_back({Op::kLook, look, static_cast<int32_t>(inner.code.size() + 1)});
      f->code.insert(f->code.end(), inner.code.begin(), inner.code.end());
      f->nullable = true;
      return Status::OK();
    }
    if (c == '[') {
      ++pos_;
      return Bracket(fold, f);
    }
    CharClass one;
    if (c == '.') {
      ++pos_;
      one.negated = true;
      one.items.push_back(Range('\n', '\n'));
    } else if (c == '\\') {
      ++pos_;
      ClassItem item;
      char32_t cp;
      HERD_ASSIGN_OR_RETURN(bool is_class, Escape(&item, &cp));
      if (is_class) {
        one.items.push_back(item);
      } else {
        AddFolded(cp, fold, &one.items);
      }
    } else if (c == '^' || c == '$') {
      return Error("an anchor");
    } else if (c == '*' || c == '+' || c == '?' || c == '{') {
      return Error("a quantifier with nothing to repeat");
    } else {
      AddFolded(Next(), fold, &one.items);
    }
    EmitClass(std::move(one), f);
    return Status::OK();
  }

  std::string_view p_;
  size_t pos_ = 0;
  std::vector<CharClass>* classes_;
};

}  // namespace

bool TokenRegex::CharClass::Matches(char32_t cp) const {
  bool in = false;
  for (const ClassItem& item : items) {
    bool hit;
    switch (item.kind) {
      case ClassItem::kRange: hit = cp >= item.lo && cp <= item.hi; break;
      case ClassItem::kCategories: hit = ((item.mask >> unicode::GeneralCategory(cp)) & 1) != 0; break;
      default: hit = unicode::IsWhiteSpace(cp); break;
    }
    if (hit != item.negated) {
      in = true;
      break;
    }
  }
  return in != negated;
}

StatusOr<TokenRegex> TokenRegex::Compile(std::string_view pattern) {
  TokenRegex re;
  re.pattern_ = std::string(pattern);
  Parser parser(pattern, &re.classes_);
  HERD_ASSIGN_OR_RETURN(re.program_, parser.Parse());
  return re;
}

int64_t TokenRegex::Run(size_t start_pc, const char32_t* text, size_t n, size_t start) const {
  // Backtracking: alternatives still to try, newest first.
  std::vector<std::pair<size_t, size_t>> stack;
  size_t pc = start_pc, pos = start;
  for (;;) {
    const Inst& in = program_[pc];
    bool fail = false;
    switch (in.op) {
      case Op::kClass:
        if (pos < n && classes_[in.a].Matches(text[pos])) {
          ++pc, ++pos;
        } else {
          fail = true;
        }
        break;
      case Op::kSplit:
        stack.emplace_back(pc + in.b, pos);
        pc += in.a;
        break;
      case Op::kJump:
        pc += in.a;
        break;
      case Op::kLook: {
        const bool matched = Run(pc + 1, text, n, pos) >= 0;
        if (matched != (in.a == 1)) {
          pc += in.b;
        } else {
          fail = true;
        }
        break;
      }
      case Op::kMatch:
        return static_cast<int64_t>(pos);
    }
    if (fail) {
      if (stack.empty()) return -1;
      std::tie(pc, pos) = stack.back();
      stack.pop_back();
    }
  }
}

int64_t TokenRegex::MatchAt(const char32_t* text, size_t n, size_t pos) const { return Run(0, text, n, pos); }

void TokenRegex::FindAll(const char32_t* text, size_t n, std::vector<std::pair<uint32_t, uint32_t>>* out) const {
  size_t pos = 0;
  while (pos < n) {
    const int64_t end = Run(0, text, n, pos);
    if (end < 0) {
      ++pos;
      continue;
    }
    out->emplace_back(static_cast<uint32_t>(pos), static_cast<uint32_t>(end));
    pos = static_cast<size_t>(end) > pos ? static_cast<size_t>(end) : pos + 1;
  }
}

}  // namespace herd
