// Helpers of the CUDA tests: device buffers filled from host vectors, the
// comparison metric, and the skip when there is no device.
//
// The same tests run on a GPU (herd_tests; skipped, and reported as
// skipped, without one) and on the emulated device (herd_cuda_emu_tests,
// always), so the kernels' arithmetic is checked on every machine and
// their behaviour on real hardware wherever a GPU is present.
// HERD_PRINT_ERRORS=1 prints every error EXPECT_CLOSE measures (to set or
// confirm a bound on new hardware).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "model/cuda/check.h"
#include "model/cuda/device_compat.h"

namespace herd::cuda::testing {

inline bool HaveDevice() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

#define HERD_REQUIRE_DEVICE() \
  if (!::herd::cuda::testing::HaveDevice()) GTEST_SKIP() << "no CUDA device"

inline float ToHost(float x) { return x; }
inline float ToHost(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T>
T FromHost(float x);
template <>
inline float FromHost<float>(float x) {
  return x;
}
template <>
inline __nv_bfloat16 FromHost<__nv_bfloat16>(float x) {
  return __float2bfloat16(x);
}

// A device array of T, filled from and read back as float (or as its own
// type for exact copies).
template <typename T>
class DeviceArray {
 public:
  // Filled with 0xff bytes (NaN as floats and bf16), as the emulated
  // device fills its memory: an output element no kernel wrote fails the
  // comparison, and no read of it is uninitialized for initcheck.
  explicit DeviceArray(int64_t n) : n_(n) {
    const size_t bytes = static_cast<size_t>(std::max<int64_t>(n, 1)) * sizeof(T);
    HERD_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&ptr_), bytes));
    HERD_CUDA_CHECK(cudaMemset(ptr_, 0xff, bytes));
  }
  explicit DeviceArray(const std::vector<float>& values) : DeviceArray(static_cast<int64_t>(values.size())) {
    Upload(values);
  }
  ~DeviceArray() { cudaFree(ptr_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  T* get() { return ptr_; }
  const T* get() const { return ptr_; }
  void Upload(const std::vector<float>& values) {
    std::vector<T> staged(values.size());
    for (size_t i = 0; i < values.size(); ++i) staged[i] = FromHost<T>(values[i]);
    HERD_CUDA_CHECK(cudaMemcpy(ptr_, staged.data(), staged.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<float> Download() const {
    std::vector<T> staged(n_);
    HERD_CUDA_CHECK(cudaDeviceSynchronize());
    HERD_CUDA_CHECK(cudaMemcpy(staged.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    std::vector<float> out(n_);
    for (int64_t i = 0; i < n_; ++i) out[i] = ToHost(staged[i]);
    return out;
  }
  std::vector<T> Raw() const {
    std::vector<T> out(n_);
    HERD_CUDA_CHECK(cudaDeviceSynchronize());
    HERD_CUDA_CHECK(cudaMemcpy(out.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return out;
  }

 private:
  T* ptr_ = nullptr;
  int64_t n_;
};

inline std::vector<float> Random(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// Values as the compute dtype stores them (so that a reference fed with
// them sees the device's inputs exactly).
template <typename T>
std::vector<float> Rounded(std::vector<float> v) {
  for (float& x : v) x = ToHost(FromHost<T>(x));
  return v;
}

template <typename From>
std::vector<double> ToDouble(const std::vector<From>& v) {
  return std::vector<double>(v.begin(), v.end());
}

// How close a result must be to its reference: max |got - want| over max
// |want|, taken row by row for rows of `row` elements (0: the whole tensor
// at once). Whole-tensor bounds, llm.c's and PyTorch's habit, are what
// bf16's per-tensor bounds use; fp32 checks rows, so that a row a hundred
// times smaller than the largest cannot hide its errors behind it (within
// a row, an element near zero is the small difference of larger terms and
// carries their rounding: the row's largest is its scale).
struct Tolerance {
  Tolerance(double relative, int64_t row = 0) : relative(relative), row(row) {}  // NOLINT: a bare bound
  double relative;
  int64_t row;
};

inline double RelativeError(const std::vector<float>& got, const std::vector<double>& want, int64_t row) {
  EXPECT_EQ(got.size(), want.size());
  const size_t n = std::min(got.size(), want.size());
  const size_t width = row > 0 ? static_cast<size_t>(row) : std::max<size_t>(n, 1);
  double worst = 0;
  for (size_t begin = 0; begin < n; begin += width) {
    const size_t end = std::min(n, begin + width);
    double diff = 0, scale = 0;
    for (size_t i = begin; i < end; ++i) {
      if (!std::isfinite(got[i])) return INFINITY;
      diff = std::max(diff, std::fabs(got[i] - want[i]));
      scale = std::max(scale, std::fabs(want[i]));
    }
    worst = std::max(worst, scale > 0 ? diff / scale : diff);
  }
  return worst;
}

#define EXPECT_CLOSE(got, want, tol, what)                                                                   \
  do {                                                                                                       \
    const ::herd::cuda::testing::Tolerance herd_tol = (tol);                                                 \
    const double herd_rel = ::herd::cuda::testing::RelativeError((got), (want), herd_tol.row);             \
    EXPECT_LE(herd_rel, herd_tol.relative)                                                                   \
        << what << ": relative error " << herd_rel << " above " << herd_tol.relative;                        \
    if (std::getenv("HERD_PRINT_ERRORS")) std::printf("error %-50s %.3g\n", std::string(what).c_str(), herd_rel); \
  } while (0)

}  // namespace herd::cuda::testing
