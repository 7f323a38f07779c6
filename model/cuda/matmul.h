// The Llama linear layers through cuBLASLt: out = in @ weight^T with
// row-major [N, C] activations and [out, in] weights, as model/cpu's
// MatmulForward/MatmulBackward. fp32 accumulation always
// (CUBLAS_COMPUTE_32F, no TF32, so fp32 mode matches the CPU); the weight
// gradient is an fp32 buffer accumulated in place (beta = 1) whatever the
// compute dtype. The residual add of a block's output projection is fused
// into the matmul (C = residual, beta = 1).
#pragma once

#include <cublasLt.h>

#include <cstdint>
#include <map>
#include <tuple>

#include "model/cuda/device_compat.h"
#include "model/cuda/device_memory.h"

namespace herd::cuda {

class Matmul {
 public:
  Matmul();
  ~Matmul();
  Matmul(const Matmul&) = delete;
  Matmul& operator=(const Matmul&) = delete;

  // out[N, Cout] = in[N, Cin] @ weight[Cout, Cin]^T (+ residual[N, Cout]).
  template <typename T>
  void Forward(T* out, const T* in, const T* weight, int64_t N, int64_t Cin, int64_t Cout, const T* residual,
               cudaStream_t stream);
  // din[N, Cin] = dout[N, Cout] @ weight (overwritten, or added to).
  template <typename T>
  void BackwardInput(T* din, const T* dout, const T* weight, int64_t N, int64_t Cin, int64_t Cout, bool accumulate,
                     cudaStream_t stream);
  // dweight[Cout, Cin] += dout^T @ in (fp32).
  template <typename T>
  void BackwardWeight(float* dweight, const T* dout, const T* in, int64_t N, int64_t Cin, int64_t Cout,
                      cudaStream_t stream);

 private:
  // One cuBLASLt problem: column-major D[m, n] = op(A) op(B) + beta C.
  struct Problem {
    bool trans_a, trans_b;
    int64_t m, n, k, lda, ldb, ldc;
    cudaDataType ab_type, cd_type;
    bool operator<(const Problem& o) const {
      return std::tie(trans_a, trans_b, m, n, k, lda, ldb, ldc, ab_type, cd_type) <
             std::tie(o.trans_a, o.trans_b, o.m, o.n, o.k, o.lda, o.ldb, o.ldc, o.ab_type, o.cd_type);
    }
  };
  struct Plan;
  const Plan& PlanFor(const Problem& p);
  void Run(const Problem& p, const void* A, const void* B, float beta, const void* C, void* D, cudaStream_t stream);

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  std::map<Problem, Plan*> plans_;
};

}  // namespace herd::cuda
