// A shared library opened on first use (dlopen), for the vendor libraries
// herd calls only on GPU machines (cuBLASLt, NCCL): the executables carry
// no load-time dependency on them, so the same build starts on machines
// without CUDA and finds the libraries where GPU machines keep them.
#pragma once

#include <glog/logging.h>

#include <initializer_list>
#include <mutex>
#include <string>
#include <vector>

namespace herd {

class DynamicLibrary {
 public:
  // `candidates`: names or paths tried in order (a bare name searches
  // LD_LIBRARY_PATH, the executable's RPATH and ld.so's cache).
  DynamicLibrary(std::string what, std::initializer_list<std::string> candidates);

  // True once the library is open; otherwise `why` says what was tried.
  bool Available(std::string* why = nullptr);
  // The symbol's address, or null (with Available() false, or the symbol
  // missing: see error()).
  void* Symbol(const char* name);
  const std::string& error();
  // The function `name` as type F; stops the process with error() when the
  // library or the symbol is missing (callers check Available() first where
  // that must be a clean error instead).
  template <typename F>
  F Function(const char* name) {
    void* symbol = Symbol(name);
    LOG_IF(FATAL, symbol == nullptr) << error();
    return reinterpret_cast<F>(symbol);
  }

 private:
  void Open();
  const std::string what_;
  const std::vector<std::string> candidates_;
  std::once_flag once_;
  void* handle_ = nullptr;
  std::string error_;
};

}  // namespace herd
