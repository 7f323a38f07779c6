// herd coordinator [CONFIG] --listen HOST:PORT [--token-file F] [--set ...] [--max-restarts N]
//   The rendezvous service alone (herd launch runs one inside itself). With
//   CONFIG the job's shape and timing come from it; without, from the first
//   process to join, whose config hash then binds everyone else. The job
//   token comes from --token-file, HERD_JOB_TOKEN or HERD_JOB_TOKEN_FILE.
//   Exits 0 when every process has left, 1 when one was lost (with
//   --max-restarts N, the first N losses instead restart the job: everyone
//   is let go and the job forms again from the processes that rejoin).
#include <atomic>
#include <cstdio>
#include <string>

#include "common/config.h"
#include "common/file_util.h"
#include "common/logging.h"
#include "common/signals.h"
#include "tools/args.h"
#include "tools/commands.h"
#include "transport/coordinator.h"
#include "transport/rendezvous.h"

namespace herd::tools {

int RunCoordinator(int argc, char** argv) {
  const char* usage =
      "usage: herd coordinator [CONFIG] --listen HOST:PORT [--token-file F] [--port-file F] [--set ...] "
      "[--max-restarts N]";
  Args args({"listen", "token-file", "port-file", "set", "max-restarts"}, {});
  Status st = args.Parse(argc, argv);
  if (!st.ok()) return ReportError(st.WithContext("coordinator: "));
  if (args.positional().size() > 1) return ReportError(Status::InvalidArgument(usage));
  transport::CoordinatorOptions options;
  if (args.positional().size() == 1) {
    auto config = LoadJobConfig(args.positional()[0], args.GetAll("set"));
    if (!config.ok()) return ReportError(config.status());
    options = transport::CoordinatorOptions::FromConfig(*config);
  } else if (!args.Has("listen")) {
    return ReportError(Status::InvalidArgument("coordinator: --listen HOST:PORT is needed without a CONFIG"));
  } else if (args.Has("set")) {
    return ReportError(Status::InvalidArgument("coordinator: --set needs a CONFIG"));
  }
  if (args.Has("listen")) options.listen = args.Get("listen");
  auto max_restarts = args.GetInt("max-restarts", 0, 0);
  if (!max_restarts.ok()) return ReportError(max_restarts.status().WithContext("coordinator: "));
  options.max_restarts = static_cast<int>(*max_restarts);
  auto token = transport::LoadJobToken(args.Get("token-file"), transport::ProcessEnv());
  if (!token.ok()) return ReportError(token.status().WithContext("coordinator: "));
  options.token = *token;

  // Blocks SIGINT/SIGTERM before the coordinator's threads exist; a signal
  // then shuts the job down in order (every process is told).
  std::atomic<transport::Coordinator*> running{nullptr};
  std::atomic<int> stopped_by{0};
  SignalWatcher signals([&running, &stopped_by](int signo) {
    stopped_by = signo;
    if (auto* c = running.load()) c->Stop(signo == SIGINT ? "interrupted (SIGINT)" : "terminated (SIGTERM)");
  });
  auto coordinator = transport::Coordinator::Start(options);
  if (!coordinator.ok()) return ReportError(coordinator.status());
  running = coordinator->get();
  if (stopped_by != 0) (*coordinator)->Stop("stopped by a signal while starting");
  if (args.Has("port-file")) {
    st = WriteFileAtomic(args.Get("port-file"), std::to_string((*coordinator)->port()) + "\n");
    if (!st.ok()) return ReportError(st);
  }
  st = (*coordinator)->Run();
  running = nullptr;
  if (!st.ok()) {
    const int code = ReportError(st);
    return stopped_by != 0 ? 128 + stopped_by : code;  // as shells expect of a signalled program
  }
  return 0;
}

}  // namespace herd::tools
