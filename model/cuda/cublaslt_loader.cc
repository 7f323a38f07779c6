#include "model/cuda/cublaslt_loader.h"

#include <cublasLt.h>

#include "common/dynamic_library.h"

#define HERD_STR2(x) #x
#define HERD_STR(x) HERD_STR2(x)
#define HERD_CUBLASLT_SONAME "libcublasLt.so." HERD_STR(CUBLAS_VER_MAJOR)

namespace herd::cuda {
namespace {

DynamicLibrary& Library() {
  static DynamicLibrary lib("cuBLASLt", {HERD_CUBLASLT_SONAME, "/usr/local/cuda/lib64/" HERD_CUBLASLT_SONAME,
                                         HERD_CUDA_LIBRARY_DIR "/" HERD_CUBLASLT_SONAME});
  return lib;
}

}  // namespace

bool CublasLtAvailable(std::string* why) { return Library().Available(why); }

}  // namespace herd::cuda

// Each forwarder resolves its function once.
#define HERD_FORWARD(name, ...)                                                    \
  static const auto fn = ::herd::cuda::Library().Function<decltype(&name)>(#name); \
  return fn(__VA_ARGS__)

extern "C" {

cublasStatus_t cublasLtCreate(cublasLtHandle_t* h) { HERD_FORWARD(cublasLtCreate, h); }
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) { HERD_FORWARD(cublasLtDestroy, h); }
const char* cublasLtGetStatusString(cublasStatus_t s) { HERD_FORWARD(cublasLtGetStatusString, s); }
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* d, cublasComputeType_t c, cudaDataType_t s) {
  HERD_FORWARD(cublasLtMatmulDescCreate, d, c, s);
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) { HERD_FORWARD(cublasLtMatmulDescDestroy, d); }
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a, const void* b,
                                              size_t n) {
  HERD_FORWARD(cublasLtMatmulDescSetAttribute, d, a, b, n);
}
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* l, cudaDataType t, uint64_t r, uint64_t c,
                                          int64_t ld) {
  HERD_FORWARD(cublasLtMatrixLayoutCreate, l, t, r, c, ld);
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) { HERD_FORWARD(cublasLtMatrixLayoutDestroy, l); }
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* p) {
  HERD_FORWARD(cublasLtMatmulPreferenceCreate, p);
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
  HERD_FORWARD(cublasLtMatmulPreferenceDestroy, p);
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                    cublasLtMatmulPreferenceAttributes_t a, const void* b, size_t n) {
  HERD_FORWARD(cublasLtMatmulPreferenceSetAttribute, p, a, b, n);
}
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t a,
                                              cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                                              cublasLtMatrixLayout_t dd, cublasLtMatmulPreference_t p, int n,
                                              cublasLtMatmulHeuristicResult_t r[], int* found) {
  HERD_FORWARD(cublasLtMatmulAlgoGetHeuristic, h, d, a, b, c, dd, p, n, r, found);
}
cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t d, const void* alpha, const void* A,
                              cublasLtMatrixLayout_t Ad, const void* B, cublasLtMatrixLayout_t Bd, const void* beta,
                              const void* C, cublasLtMatrixLayout_t Cd, void* D, cublasLtMatrixLayout_t Dd,
                              const cublasLtMatmulAlgo_t* algo, void* ws, size_t wss, cudaStream_t s) {
  HERD_FORWARD(cublasLtMatmul, h, d, alpha, A, Ad, B, Bd, beta, C, Cd, D, Dd, algo, ws, wss, s);
}

}  // extern "C"
