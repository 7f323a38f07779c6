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

namespace herd::tools {

int RunVersion(int, char**) {
  std::string cuda = "null", nccl = "null";
#if defined(HERD_HAVE_CUDA)
  cuda = "\"" + std::to_string(CUDART_VERSION / 1000) + "." + std::to_string(CUDART_VERSION % 1000 / 10) + "\"";
  nccl = "\"" + std::to_string(NCCL_MAJOR) + "." + std::to_string(NCCL_MINOR) + "." + std::to_string(NCCL_PATCH) + "\"";
#endif
  // openblas_get_config() names the build (version, target, threading).
  std::printf("{\"version\": \"%s\", \"cuda\": %s, \"nccl\": %s, \"ucx\": \"%s\", \"blas\": \"%s\"}\n", HERD_VERSION,
              cuda.c_str(), nccl.c_str(), ucp_get_version_string(), openblas_get_config());
  return 0;
}

}  // namespace herd::tools
