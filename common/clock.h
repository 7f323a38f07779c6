// Wall-clock timing for progress lines and benchmarks.
#pragma once

#include <chrono>
#include <string>

namespace herd {

class Stopwatch {
 public:
  Stopwatch() : start_(std::chrono::steady_clock::now()) {}
  void Reset() { start_ = std::chrono::steady_clock::now(); }
  double Seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  std::chrono::steady_clock::time_point start_;
};

// "1h02m", "3m07s", "12s".
std::string FormatDuration(double seconds);

}  // namespace herd
