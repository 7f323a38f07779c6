// cuBLASLt is opened at run time (common/dynamic_library.h), so that herd
// built with CUDA still starts on machines without it; the cublasLt*
// functions herd calls are defined in cublaslt_loader.cc and forward to the
// library, which is looked for as libcublasLt.so.<major> on the loader's
// path, then under /usr/local/cuda and the build machine's toolkit.
#pragma once

#include <string>

namespace herd::cuda {

// True when cuBLASLt can be loaded; otherwise `why` names what was tried.
bool CublasLtAvailable(std::string* why);

}  // namespace herd::cuda
