// Command-line parsing shared by the subcommands: positionals plus
// "--name value" / "--name=value" options and "--flag" switches. Unknown
// options are errors that name the option.
#pragma once

#include <cerrno>
#include <cstdlib>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "common/status.h"

namespace herd::tools {

// Whether a command line asks for help: --help or -h after the command's
// name (argv[0]), wherever it stands, as git's and torchrun's do.
inline bool AsksForHelp(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") return true;
  }
  return false;
}

class Args {
 public:
  // `with_value`: options that take a value (repeatable ones collect all);
  // `switches`: options without a value.
  Args(std::set<std::string> with_value, std::set<std::string> switches)
      : with_value_(std::move(with_value)), switches_(std::move(switches)) {}

  // argv[0] is the subcommand name.
  Status Parse(int argc, char** argv) {
    for (int i = 1; i < argc; ++i) {
      std::string a = argv[i];
      if (a.size() < 3 || a.rfind("--", 0) != 0) {
        positional_.push_back(a);
        continue;
      }
      std::string name = a.substr(2), value;
      bool has_value = false;
      if (size_t eq = name.find('='); eq != std::string::npos) {
        value = name.substr(eq + 1);
        name = name.substr(0, eq);
        has_value = true;
      }
      if (switches_.count(name)) {
        if (has_value) return Status::InvalidArgument("option --" + name + " takes no value");
        values_[name].push_back("1");
      } else if (with_value_.count(name)) {
        if (!has_value) {
          if (i + 1 >= argc) return Status::InvalidArgument("option --" + name + " needs a value");
          value = argv[++i];
        }
        values_[name].push_back(value);
      } else {
        return Status::InvalidArgument("unknown option --" + name + " (see herd --help)");
      }
    }
    return Status::OK();
  }

  const std::vector<std::string>& positional() const { return positional_; }
  bool Has(const std::string& name) const { return values_.count(name) > 0; }
  // The last value given, or `fallback`.
  std::string Get(const std::string& name, const std::string& fallback = "") const {
    auto it = values_.find(name);
    return it == values_.end() ? fallback : it->second.back();
  }
  std::vector<std::string> GetAll(const std::string& name) const {
    auto it = values_.find(name);
    return it == values_.end() ? std::vector<std::string>{} : it->second;
  }
  // Integer option with a range check; the error names the option.
  StatusOr<long long> GetInt(const std::string& name, long long fallback, long long min_value,
                             long long max_value = std::numeric_limits<long long>::max()) const {
    if (!Has(name)) return fallback;
    std::string s = Get(name);
    char* end = nullptr;
    errno = 0;
    long long v = std::strtoll(s.c_str(), &end, 10);
    if (s.empty() || *end != '\0') return Status::InvalidArgument("--" + name + ": expected an integer, got '" + s + "'");
    if (v < min_value) {
      return Status::InvalidArgument("--" + name + ": must be >= " + std::to_string(min_value) + ", got " + s);
    }
    if (v > max_value || errno == ERANGE) {
      return Status::InvalidArgument("--" + name + ": must be <= " + std::to_string(max_value) + ", got " + s);
    }
    return v;
  }

 private:
  std::set<std::string> with_value_, switches_;
  std::vector<std::string> positional_;
  std::map<std::string, std::vector<std::string>> values_;
};

}  // namespace herd::tools
