// herd version: one JSON line with the versions herd was built against.
#include <cblas.h>
#include <ucp/api/ucp.h>

#include <cstdio>
#include <string>

#if defined(HERD_HAVE_CUDA)
#include <cuda_runtime_api.h>
#include <nccl.h>
#endif

#include "tools/commands.h"
#include "worker/model_factory.h"

namespace herd::tools {

int RunVersion(int, char**) {
  // Versions herd was compiled against (null when built without CUDA).
  char cuda[32] = "null", nccl[32] = "null";
#if defined(HERD_HAVE_CUDA)
  std::snprintf(cuda, sizeof(cuda), "\"%d.%d\"", CUDART_VERSION / 1000, CUDART_VERSION % 1000 / 10);
  std::snprintf(nccl, sizeof(nccl), "\"%d.%d.%d\"", NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);
#endif
  // openblas_get_config() names the build (version, target, threading).
  // cuda_devices: what this process sees now (0 without CUDA, a driver or
  // a device); the tests that need a GPU read it.
  std::printf(
      "{\"version\": \"%s\", \"cuda\": %s, \"nccl\": %s, \"cuda_devices\": %d, \"ucx\": \"%s\", \"blas\": "
      "\"%s\"}\n",
      HERD_VERSION, cuda, nccl, CudaDeviceCount(), ucp_get_version_string(), openblas_get_config());
  return 0;
}

}  // namespace herd::tools
