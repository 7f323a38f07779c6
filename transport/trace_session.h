// A process's step timeline (log.trace: DIR) for one run:
// DIR/ROLE_RRRRR.trace.json, recorded from Start until Finish (or the
// session's end), with this process's clock offset from the coordinator's
// measured when it starts and when it finishes, so that `herd trace merge`
// can align it with the other processes' (and correct a clock that drifts
// between the two). A process alone records offset 0.
#pragma once

#include <string>

#include "common/status.h"
#include "proto/wire.pb.h"
#include "transport/coordinator_client.h"

namespace herd::transport {

class TraceSession {
 public:
  TraceSession() = default;
  // A run cut short keeps what it recorded (no end marker).
  ~TraceSession();
  TraceSession(const TraceSession&) = delete;
  TraceSession& operator=(const TraceSession&) = delete;

  // Nothing when `dir` is empty. `client`: the job's, or null for one process.
  Status Start(const std::string& dir, wire::Role role, int rank, CoordinatorClient* client);
  // Measures the offset again, then writes what is left and closes the file.
  Status Finish(CoordinatorClient* client);

 private:
  Status RecordOffset(CoordinatorClient* client);

  bool recording_ = false;
};

}  // namespace herd::transport
