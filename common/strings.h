// Small string helpers shared across folders.
#pragma once

#include <string>
#include <vector>

namespace herd {

// "a,b,,c" split at `sep` → {"a", "b", "", "c"}; a trailing separator adds
// no empty part.
std::vector<std::string> Split(const std::string& s, char sep);

// `s` without leading and trailing whitespace.
std::string Trim(const std::string& s);

}  // namespace herd
