#include "transport/trace_session.h"

#include "common/trace.h"
#include "transport/wire.h"

namespace herd::transport {

TraceSession::~TraceSession() {
  if (recording_) (void)trace::Stop();  // the run failed: its error is the one to tell
}

Status TraceSession::Start(const std::string& dir, wire::Role role, int rank, CoordinatorClient* client) {
  if (dir.empty()) return Status::OK();
  trace::Options o;
  o.role = role == wire::SERVER ? "server" : "worker";
  o.rank = rank;
  o.process = o.role + " " + std::to_string(rank);
  o.path = trace::TraceFileName(dir, o.role, rank);
  HERD_RETURN_IF_ERROR(trace::Start(o));
  recording_ = true;
  trace::NameThread(role == wire::SERVER ? "step thread" : "step loop");
  return RecordOffset(client);
}

Status TraceSession::Finish(CoordinatorClient* client) {
  if (!recording_) return Status::OK();
  Status measured = RecordOffset(client);
  recording_ = false;
  Status stopped = trace::Stop();
  return measured.ok() ? stopped : measured;
}

Status TraceSession::RecordOffset(CoordinatorClient* client) {
  if (client == nullptr) {
    trace::RecordClockOffset(trace::Now(), 0, 0);
    return Status::OK();
  }
  HERD_ASSIGN_OR_RETURN(const ClockOffset offset, client->MeasureClockOffset());
  trace::RecordClockOffset(offset.local_ns, offset.offset_ns, offset.rtt_ns);
  return Status::OK();
}

}  // namespace herd::transport
