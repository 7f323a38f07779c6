#include "common/strings.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

namespace herd {

std::vector<std::string> Split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  std::stringstream in(s);
  std::string part;
  while (std::getline(in, part, sep)) parts.push_back(part);
  return parts;
}

std::string Trim(const std::string& s) {
  size_t begin = 0, end = s.size();
  while (begin < end && std::isspace(static_cast<unsigned char>(s[begin]))) ++begin;
  while (end > begin && std::isspace(static_cast<unsigned char>(s[end - 1]))) --end;
  return s.substr(begin, end - begin);
}

int64_t ParseByteSize(const std::string& text) {
  const std::string t = Trim(text);
  char* end = nullptr;
  const double value = std::strtod(t.c_str(), &end);
  if (end == t.c_str() || !(value >= 0)) return -1;
  std::string unit = Trim(end);
  for (char& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  double scale = 1;
  if (!unit.empty() && unit != "B") {
    const size_t k = std::string("KMGT").find(unit[0]);
    const std::string rest = unit.substr(1);
    if (k == std::string::npos) return -1;
    if (rest.empty() || rest == "I" || rest == "IB") {
      scale = std::pow(1024.0, k + 1);  // 8G, 8Gi, 8GiB
    } else if (rest == "B") {
      scale = std::pow(1000.0, k + 1);  // 8GB
    } else {
      return -1;
    }
  }
  const double bytes = value * scale;
  if (bytes > 9e18) return -1;
  return static_cast<int64_t>(std::llround(bytes));
}

std::string FormatRange(uint64_t begin, uint64_t end) {
  char text[64];
  std::snprintf(text, sizeof text, "[%llu, %llu)", static_cast<unsigned long long>(begin),
                static_cast<unsigned long long>(end));
  return text;
}

std::string FormatBytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  if (u == 0) {
    std::snprintf(buf, sizeof buf, "%lld B", static_cast<long long>(bytes));
  } else {
    std::snprintf(buf, sizeof buf, "%.1f %s", v, units[u]);
  }
  return buf;
}

std::string ShellQuote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string PrintableUtf8(const std::string& bytes) {
  static constexpr char kReplacement[] = "\xEF\xBF\xBD";
  std::string out;
  out.reserve(bytes.size());
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t n = bytes.size();
  auto continuation = [&](size_t i, unsigned char lo = 0x80, unsigned char hi = 0xBF) {
    return i < n && p[i] >= lo && p[i] <= hi;
  };
  for (size_t i = 0; i < n;) {
    const unsigned char c = p[i];
    size_t len = 0;  // of a well-formed sequence starting here; 0: none
    if (c < 0x80) {
      len = (c >= 0x20 && c != 0x7F) || c == '\t' || c == '\n' || c == '\r' ? 1 : 0;
    } else if (c >= 0xC2 && c <= 0xDF) {
      len = continuation(i + 1) ? 2 : 0;
    } else if (c >= 0xE0 && c <= 0xEF) {
      const unsigned char lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
      len = continuation(i + 1, lo, hi) && continuation(i + 2) ? 3 : 0;
    } else if (c >= 0xF0 && c <= 0xF4) {
      const unsigned char lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
      len = continuation(i + 1, lo, hi) && continuation(i + 2) && continuation(i + 3) ? 4 : 0;
    }
    if (len == 0) {
      out += kReplacement;
      ++i;
    } else {
      out.append(bytes, i, len);
      i += len;
    }
  }
  return out;
}

}  // namespace herd
