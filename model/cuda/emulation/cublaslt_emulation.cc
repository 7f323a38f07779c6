// The cuBLASLt calls herd makes, on the emulated device: column-major
// D = alpha * op(A) * op(B) + beta * C as the cuBLASLt documentation defines
// it, with the same shape checks (a layout that does not fit the operation
// is CUBLAS_STATUS_INVALID_VALUE, as on a GPU), accumulated in double. Only
// what herd uses is accepted: host-pointer fp32 scalars, the default
// epilogue, fp32 or bf16 matrices; anything else is NOT_SUPPORTED. The
// product itself is OpenBLAS's dgemm on double copies of the operands
// (exact for fp32 and bf16 inputs), so emulated training runs stay fast.
#include <cblas.h>
#include <cublasLt.h>
#include <cuda_bf16.h>

#include <cstring>
#include <vector>

namespace {

struct MatmulDesc {
  cublasComputeType_t compute;
  cudaDataType_t scale;
  cublasOperation_t transa = CUBLAS_OP_N, transb = CUBLAS_OP_N;
};
struct Layout {
  cudaDataType type;
  uint64_t rows, cols;
  int64_t ld;
};

bool Supported(cudaDataType t) { return t == CUDA_R_32F || t == CUDA_R_16BF; }

double Load(const void* base, cudaDataType t, int64_t i) {
  if (t == CUDA_R_32F) return static_cast<const float*>(base)[i];
  return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
}
void Store(void* base, cudaDataType t, int64_t i, double v) {
  if (t == CUDA_R_32F)
    static_cast<float*>(base)[i] = static_cast<float>(v);
  else
    static_cast<__nv_bfloat16*>(base)[i] = __float2bfloat16(static_cast<float>(v));
}

// Shapes of op(A) [m, k], op(B) [k, n], C and D [m, n], or false.
bool Shapes(const MatmulDesc& d, const Layout& a, const Layout& b, const Layout& c, const Layout& dd, uint64_t* m,
            uint64_t* n, uint64_t* k) {
  *m = dd.rows;
  *n = dd.cols;
  const uint64_t am = d.transa == CUBLAS_OP_N ? a.rows : a.cols, ak = d.transa == CUBLAS_OP_N ? a.cols : a.rows;
  const uint64_t bk = d.transb == CUBLAS_OP_N ? b.rows : b.cols, bn = d.transb == CUBLAS_OP_N ? b.cols : b.rows;
  *k = ak;
  for (const Layout* l : {&a, &b, &c, &dd})
    if (l->ld < static_cast<int64_t>(l->rows) || !Supported(l->type)) return false;
  return am == *m && bn == *n && bk == ak && c.rows == *m && c.cols == *n && c.type == dd.type && a.type == b.type;
}

}  // namespace

extern "C" {

cublasStatus_t cublasLtCreate(cublasLtHandle_t* lightHandle) {
  *lightHandle = reinterpret_cast<cublasLtHandle_t>(new char);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t lightHandle) {
  delete reinterpret_cast<char*>(lightHandle);
  return CUBLAS_STATUS_SUCCESS;
}
const char* cublasLtGetStatusString(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
    default:
      return "CUBLAS_STATUS (emulated device)";
  }
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* matmulDesc, cublasComputeType_t computeType,
                                        cudaDataType_t scaleType) {
  if (computeType != CUBLAS_COMPUTE_32F || scaleType != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
  *matmulDesc = reinterpret_cast<cublasLtMatmulDesc_t>(new MatmulDesc{computeType, scaleType});
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc) {
  delete reinterpret_cast<MatmulDesc*>(matmulDesc);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc, cublasLtMatmulDescAttributes_t attr,
                                              const void* buf, size_t sizeInBytes) {
  auto* d = reinterpret_cast<MatmulDesc*>(matmulDesc);
  if ((attr == CUBLASLT_MATMUL_DESC_TRANSA || attr == CUBLASLT_MATMUL_DESC_TRANSB) &&
      sizeInBytes == sizeof(cublasOperation_t)) {
    cublasOperation_t op;
    std::memcpy(&op, buf, sizeof(op));
    if (op != CUBLAS_OP_N && op != CUBLAS_OP_T) return CUBLAS_STATUS_NOT_SUPPORTED;
    (attr == CUBLASLT_MATMUL_DESC_TRANSA ? d->transa : d->transb) = op;
    return CUBLAS_STATUS_SUCCESS;
  }
  if (attr == CUBLASLT_MATMUL_DESC_EPILOGUE && sizeInBytes == sizeof(cublasLtEpilogue_t)) {
    cublasLtEpilogue_t e;
    std::memcpy(&e, buf, sizeof(e));
    return e == CUBLASLT_EPILOGUE_DEFAULT ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_SUPPORTED;
  }
  return CUBLAS_STATUS_NOT_SUPPORTED;
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* matLayout, cudaDataType type, uint64_t rows,
                                          uint64_t cols, int64_t ld) {
  if (!Supported(type)) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (ld < static_cast<int64_t>(rows)) return CUBLAS_STATUS_INVALID_VALUE;
  *matLayout = reinterpret_cast<cublasLtMatrixLayout_t>(new Layout{type, rows, cols, ld});
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout) {
  delete reinterpret_cast<Layout*>(matLayout);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  *pref = reinterpret_cast<cublasLtMatmulPreference_t>(new char);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  delete reinterpret_cast<char*>(pref);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void*, size_t) {
  return attr == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_SUPPORTED;
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t operationDesc,
                                              cublasLtMatrixLayout_t Adesc, cublasLtMatrixLayout_t Bdesc,
                                              cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
                                              cublasLtMatmulPreference_t, int requestedAlgoCount,
                                              cublasLtMatmulHeuristicResult_t heuristicResultsArray[],
                                              int* returnAlgoCount) {
  uint64_t m, n, k;
  if (requestedAlgoCount < 1 ||
      !Shapes(*reinterpret_cast<MatmulDesc*>(operationDesc), *reinterpret_cast<Layout*>(Adesc),
              *reinterpret_cast<Layout*>(Bdesc), *reinterpret_cast<Layout*>(Cdesc), *reinterpret_cast<Layout*>(Ddesc),
              &m, &n, &k)) {
    *returnAlgoCount = 0;
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  std::memset(&heuristicResultsArray[0], 0, sizeof(heuristicResultsArray[0]));
  heuristicResultsArray[0].state = CUBLAS_STATUS_SUCCESS;
  heuristicResultsArray[0].wavesCount = 1.0f;
  *returnAlgoCount = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t computeDesc, const void* alpha, const void* A,
                              cublasLtMatrixLayout_t Adesc, const void* B, cublasLtMatrixLayout_t Bdesc,
                              const void* beta, const void* C, cublasLtMatrixLayout_t Cdesc, void* D,
                              cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t*, void*, size_t, cudaStream_t) {
  const MatmulDesc& d = *reinterpret_cast<MatmulDesc*>(computeDesc);
  const Layout &a = *reinterpret_cast<Layout*>(Adesc), &b = *reinterpret_cast<Layout*>(Bdesc);
  const Layout &c = *reinterpret_cast<Layout*>(Cdesc), &dd = *reinterpret_cast<Layout*>(Ddesc);
  uint64_t m, n, k;
  if (!Shapes(d, a, b, c, dd, &m, &n, &k)) return CUBLAS_STATUS_INVALID_VALUE;
  const double al = *static_cast<const float*>(alpha), be = *static_cast<const float*>(beta);
  // op(A) [m, k] and op(B) [k, n] as dense column-major doubles.
  std::vector<double> a_op(m * k), b_op(k * n), d_out(m * n);
  for (uint64_t p = 0; p < k; ++p)
    for (uint64_t i = 0; i < m; ++i)
      a_op[i + p * m] = Load(A, a.type, d.transa == CUBLAS_OP_N ? i + p * a.ld : p + i * a.ld);
  for (uint64_t j = 0; j < n; ++j)
    for (uint64_t p = 0; p < k; ++p)
      b_op[p + j * k] = Load(B, b.type, d.transb == CUBLAS_OP_N ? p + j * b.ld : j + p * b.ld);
  if (k > 0) {
    cblas_dgemm(CblasColMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(m), static_cast<int>(n),
                static_cast<int>(k), al, a_op.data(), static_cast<int>(m), b_op.data(), static_cast<int>(k), 0.0,
                d_out.data(), static_cast<int>(m));
  }
  for (uint64_t j = 0; j < n; ++j)
    for (uint64_t i = 0; i < m; ++i) {
      // beta == 0 must not read C (it may be uninitialised, as on a GPU).
      const double prior = be == 0 ? 0.0 : be * Load(C, c.type, i + j * c.ld);
      Store(D, dd.type, i + j * dd.ld, d_out[i + j * m] + prior);
    }
  return CUBLAS_STATUS_SUCCESS;
}

}  // extern "C"
