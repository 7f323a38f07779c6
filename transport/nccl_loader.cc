// NCCL is opened at run time (common/dynamic_library.h), like cuBLASLt
// (model/cuda/cublaslt_loader.h): the nccl* functions herd calls are
// defined here and forward to libnccl.so.<major>, looked for on the
// loader's path, then under /usr/local/cuda and the build machine's
// toolkit. NcclAvailable() lets NcclCollectives::Create refuse cleanly.
#include <nccl.h>

#include <string>

#include "common/dynamic_library.h"

#define HERD_STR2(x) #x
#define HERD_STR(x) HERD_STR2(x)
#define HERD_NCCL_SONAME "libnccl.so." HERD_STR(NCCL_MAJOR)

namespace herd::transport {
namespace {

DynamicLibrary& Library() {
  static DynamicLibrary lib("NCCL", {HERD_NCCL_SONAME, "/usr/local/cuda/lib64/" HERD_NCCL_SONAME,
                                     "/usr/local/cuda/lib/" HERD_NCCL_SONAME, HERD_NCCL_DIR "/" HERD_NCCL_SONAME});
  return lib;
}

}  // namespace

bool NcclAvailable(std::string* why) { return Library().Available(why); }

}  // namespace herd::transport

#define HERD_FORWARD(name, ...)                                                         \
  static const auto fn = ::herd::transport::Library().Function<decltype(&name)>(#name); \
  return fn(__VA_ARGS__)

extern "C" {

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) { HERD_FORWARD(ncclGetUniqueId, id); }
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  HERD_FORWARD(ncclCommInitRank, comm, nranks, id, rank);
}
ncclResult_t ncclCommDestroy(ncclComm_t comm) { HERD_FORWARD(ncclCommDestroy, comm); }
ncclResult_t ncclCommAbort(ncclComm_t comm) { HERD_FORWARD(ncclCommAbort, comm); }
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* error) {
  HERD_FORWARD(ncclCommGetAsyncError, comm, error);
}
const char* ncclGetErrorString(ncclResult_t result) { HERD_FORWARD(ncclGetErrorString, result); }
ncclResult_t ncclGroupStart() { HERD_FORWARD(ncclGroupStart); }
ncclResult_t ncclGroupEnd() { HERD_FORWARD(ncclGroupEnd); }
ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  HERD_FORWARD(ncclAllReduce, send, recv, count, type, op, comm, stream);
}
ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t type, int root, ncclComm_t comm,
                           cudaStream_t stream) {
  HERD_FORWARD(ncclBroadcast, send, recv, count, type, root, comm, stream);
}
ncclResult_t ncclReduce(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op, int root,
                        ncclComm_t comm, cudaStream_t stream) {
  HERD_FORWARD(ncclReduce, send, recv, count, type, op, root, comm, stream);
}

}  // extern "C"
