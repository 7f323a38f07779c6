#include "model/cuda/matmul.h"

#include "model/cuda/check.h"

namespace herd::cuda {

namespace {

template <typename T>
constexpr cudaDataType DataType();
template <>
constexpr cudaDataType DataType<float>() {
  return CUDA_R_32F;
}
template <>
constexpr cudaDataType DataType<__nv_bfloat16>() {
  return CUDA_R_16BF;
}

}  // namespace

// Descriptors and the chosen algorithm of one problem shape, made once.
struct Matmul::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo;
};

Matmul::Matmul() {
  HERD_CUBLAS_CHECK(cublasLtCreate(&handle_));
  HERD_CUDA_CHECK(cudaMalloc(&workspace_, kCublasWorkspaceBytes));
}

Matmul::~Matmul() {
  for (auto& [problem, plan] : plans_) {
    cublasLtMatrixLayoutDestroy(plan->a);
    cublasLtMatrixLayoutDestroy(plan->b);
    cublasLtMatrixLayoutDestroy(plan->c);
    cublasLtMatmulDescDestroy(plan->desc);
    delete plan;
  }
  cudaFree(workspace_);
  cublasLtDestroy(handle_);
}

const Matmul::Plan& Matmul::PlanFor(const Problem& p) {
  auto it = plans_.find(p);
  if (it != plans_.end()) return *it->second;
  auto* plan = new Plan;
  HERD_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t op_a = p.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = p.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  HERD_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
  HERD_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
  // Stored shapes: A is [m, k] or, transposed, [k, m]; B [k, n] or [n, k].
  HERD_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&plan->a, p.ab_type, p.trans_a ? p.k : p.m, p.trans_a ? p.m : p.k, p.lda));
  HERD_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&plan->b, p.ab_type, p.trans_b ? p.n : p.k, p.trans_b ? p.k : p.n, p.ldb));
  HERD_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->c, p.cd_type, p.m, p.n, p.ldc));
  cublasLtMatmulPreference_t pref;
  HERD_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t workspace = kCublasWorkspaceBytes;
  HERD_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                                         sizeof(workspace)));
  cublasLtMatmulHeuristicResult_t result;
  int found = 0;
  HERD_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(handle_, plan->desc, plan->a, plan->b, plan->c, plan->c, pref, 1,
                                                   &result, &found));
  cublasLtMatmulPreferenceDestroy(pref);
  CHECK(found > 0) << "cuBLASLt has no algorithm for a " << p.m << "x" << p.n << "x" << p.k << " matmul";
  plan->algo = result.algo;
  plans_[p] = plan;
  return *plan;
}

void Matmul::Run(const Problem& p, const void* A, const void* B, float beta, const void* C, void* D,
                 cudaStream_t stream) {
  if (p.m == 0 || p.n == 0) return;
  const Plan& plan = PlanFor(p);
  const float alpha = 1.0f;
  HERD_CUBLAS_CHECK(cublasLtMatmul(handle_, plan.desc, &alpha, A, plan.a, B, plan.b, &beta, C, plan.c, D, plan.c,
                                   &plan.algo, workspace_, kCublasWorkspaceBytes, stream));
}

// Row-major X[r, c] is column-major X^T[c, r] with ld c; every product below
// is the column-major transpose of the row-major one.

template <typename T>
void Matmul::Forward(T* out, const T* in, const T* weight, int64_t N, int64_t Cin, int64_t Cout, const T* residual,
                     cudaStream_t stream) {
  // out^T[Cout, N] = (weight^T)^T[Cout, Cin] @ in^T[Cin, N]
  const Problem p{true, false, Cout, N, Cin, Cin, Cin, Cout, DataType<T>(), DataType<T>()};
  Run(p, weight, in, residual != nullptr ? 1.0f : 0.0f, residual != nullptr ? residual : out, out, stream);
}

template <typename T>
void Matmul::BackwardInput(T* din, const T* dout, const T* weight, int64_t N, int64_t Cin, int64_t Cout,
                           bool accumulate, cudaStream_t stream) {
  // din^T[Cin, N] = weight^T[Cin, Cout] @ dout^T[Cout, N]
  const Problem p{false, false, Cin, N, Cout, Cin, Cout, Cin, DataType<T>(), DataType<T>()};
  Run(p, weight, dout, accumulate ? 1.0f : 0.0f, din, din, stream);
}

template <typename T>
void Matmul::BackwardWeight(float* dweight, const T* dout, const T* in, int64_t N, int64_t Cin, int64_t Cout,
                            cudaStream_t stream) {
  // dweight^T[Cin, Cout] += in^T[Cin, N] @ (dout^T[Cout, N])^T
  const Problem p{false, true, Cin, Cout, N, Cin, Cout, Cin, DataType<T>(), CUDA_R_32F};
  Run(p, in, dout, 1.0f, dweight, dweight, stream);
}

#define HERD_INSTANTIATE_MATMUL(T)                                                                               \
  template void Matmul::Forward<T>(T*, const T*, const T*, int64_t, int64_t, int64_t, const T*, cudaStream_t);   \
  template void Matmul::BackwardInput<T>(T*, const T*, const T*, int64_t, int64_t, int64_t, bool, cudaStream_t); \
  template void Matmul::BackwardWeight<T>(float*, const T*, const T*, int64_t, int64_t, int64_t, cudaStream_t);
HERD_INSTANTIATE_MATMUL(float)
HERD_INSTANTIATE_MATMUL(__nv_bfloat16)

}  // namespace herd::cuda
