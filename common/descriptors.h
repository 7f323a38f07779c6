// Descriptors across exec: a program herd starts (the launcher's servers
// and workers, a node that executes itself anew) inherits stdin, stdout and
// stderr and nothing else, whatever herd or its libraries (Asio, UCX,
// glog) opened without O_CLOEXEC.
#pragma once

namespace herd {

// Marks every descriptor from 3 up close-on-exec. Async-signal-safe, so a
// threaded process may call it between fork and exec.
void CloseOnExecAboveStdio();

}  // namespace herd
