// Small string helpers shared across folders.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace herd {

// "a,b,,c" split at `sep` → {"a", "b", "", "c"}; a trailing separator adds
// no empty part.
std::vector<std::string> Split(const std::string& s, char sep);

// `s` without leading and trailing whitespace.
std::string Trim(const std::string& s);

// "24GiB", "512MiB", "1.5GB", "4096", "8G" → bytes. Binary suffixes (KiB,
// MiB, GiB, TiB; K, M, G, T alone mean the same) and decimal ones (KB, MB,
// GB, TB); a bare number is bytes. -1 when the text is not a size.
int64_t ParseByteSize(const std::string& text);

// "[begin, end)" for a range in logs and errors.
std::string FormatRange(uint64_t begin, uint64_t end);

// 1536 → "1.5 KiB", 25165824 → "24.0 MiB".
std::string FormatBytes(int64_t bytes);

// `s` as one word for /bin/sh (single-quoted), for commands run by popen.
std::string ShellQuote(const std::string& s);

// Bytes (a byte-level model's text) as valid UTF-8 that is safe to print:
// well-formed sequences (RFC 3629: no overlong forms, surrogates or code
// points above U+10FFFF) are kept, and every other byte, and every control
// character but tab, newline and carriage return, becomes U+FFFD.
std::string PrintableUtf8(const std::string& bytes);

}  // namespace herd
