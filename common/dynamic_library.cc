#include "common/dynamic_library.h"

#include <dlfcn.h>

namespace herd {

DynamicLibrary::DynamicLibrary(std::string what, std::initializer_list<std::string> candidates)
    : what_(std::move(what)), candidates_(candidates) {}

void DynamicLibrary::Open() {
  std::call_once(once_, [this] {
    std::string tried;
    for (const std::string& c : candidates_) {
      handle_ = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (handle_ != nullptr) return;
      const char* e = dlerror();
      tried += (tried.empty() ? "" : "; ") + (e != nullptr ? std::string(e) : c);
    }
    error_ = what_ + " could not be loaded (tried: " + tried + ")";
  });
}

bool DynamicLibrary::Available(std::string* why) {
  Open();
  if (handle_ == nullptr && why != nullptr) *why = error_;
  return handle_ != nullptr;
}

void* DynamicLibrary::Symbol(const char* name) {
  if (!Available()) return nullptr;
  void* s = dlsym(handle_, name);
  if (s == nullptr) error_ = what_ + ": symbol " + name + " not found";
  return s;
}

const std::string& DynamicLibrary::error() {
  Open();
  return error_;
}

}  // namespace herd
