// NCCL for one rank on the emulated device (model/cuda/emulation): every
// collective of a single rank is a copy (or nothing, in place), so the
// all-reduce mode's device path (gradients reduced on the device before
// they are staged out) runs end to end without a GPU. More than one rank
// is refused: the emulation has no peers to talk to.
#include <nccl.h>

#include <cstring>
#include <string>

namespace herd::transport {
bool NcclAvailable(std::string*) { return true; }
}  // namespace herd::transport

namespace {

size_t Bytes(size_t count, ncclDataType_t type) {
  switch (type) {
    case ncclInt8:
    case ncclUint8:
      return count;
    case ncclFloat16:
    case ncclBfloat16:
      return 2 * count;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4 * count;
    default:
      return 8 * count;
  }
}

ncclResult_t Copy(const void* send, void* recv, size_t count, ncclDataType_t type) {
  if (send != recv && count > 0) std::memmove(recv, send, Bytes(count, type));
  return ncclSuccess;
}

struct EmulatedComm {};

}  // namespace

extern "C" {

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  std::memset(id, 0, sizeof(*id));
  std::strcpy(id->internal, "emulated");
  return ncclSuccess;
}
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId, int rank) {
  if (nranks != 1 || rank != 0) return ncclInvalidUsage;
  *comm = reinterpret_cast<ncclComm_t>(new EmulatedComm);
  return ncclSuccess;
}
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  delete reinterpret_cast<EmulatedComm*>(comm);
  return ncclSuccess;
}
ncclResult_t ncclCommAbort(ncclComm_t comm) { return ncclCommDestroy(comm); }
ncclResult_t ncclCommGetAsyncError(ncclComm_t, ncclResult_t* error) {
  *error = ncclSuccess;
  return ncclSuccess;
}
const char* ncclGetErrorString(ncclResult_t result) {
  return result == ncclSuccess ? "no error" : "error in the emulated NCCL (one rank only)";
}
ncclResult_t ncclGroupStart() { return ncclSuccess; }
ncclResult_t ncclGroupEnd() { return ncclSuccess; }
ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t, ncclComm_t,
                           cudaStream_t) {
  return Copy(send, recv, count, type);
}
ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t type, int, ncclComm_t,
                           cudaStream_t) {
  return Copy(send, recv, count, type);
}
ncclResult_t ncclReduce(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t, int, ncclComm_t,
                        cudaStream_t) {
  return Copy(send, recv, count, type);
}

}  // extern "C"
