// herd bench compare CONFIG [--set path=value ...] [--steps N] [--warmup K] [--servers S] [--json]
//
// Runs the same job three times through `herd launch`, on this machine:
// parameter-server mode (S servers, the config's workers), all-reduce mode
// (synchronous DDP) and all-reduce with ZeRO-1, and prints side by side
// what each costs: tokens/s, step time, the share of the step spent
// waiting on communication, bytes each worker sent per step, and the peak
// memory of the largest worker and server. Medians over the steps after
// the warm-up. --json: one JSON line per mode.
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/file_util.h"
#include "common/logging.h"
#include "common/strings.h"
#include "tools/args.h"
#include "tools/commands.h"

namespace herd::tools {
namespace {

struct ModeResult {
  std::string mode;
  int servers = 0, workers = 0;
  double step_s = 0, tokens_per_s = 0, comm_share = 0, sent_mib_per_step = 0;
  double worker_peak = 0, server_peak = 0;  // bytes
};

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

StatusOr<ModeResult> RunMode(const std::string& herd, const std::string& config_path,
                             const std::vector<std::string>& overrides, const std::string& mode, int servers,
                             int64_t steps, int64_t warmup, const std::string& dir) {
  ModeResult r;
  r.mode = mode;
  const std::string metrics = JoinPath(dir, mode + ".jsonl");
  std::vector<std::string> sets = overrides;
  sets.insert(sets.end(), {"train.steps=" + std::to_string(steps), "log.every=1", "log.metrics=" + metrics,
                           "log.sample_tokens=0", "log.eval_every=0", "data.val=", "checkpoint.dir="});
  if (mode == "ps") {
    sets.insert(sets.end(), {"cluster.sync=PARAMETER_SERVER", "cluster.servers=" + std::to_string(servers),
                             "cluster.zero_stage=0"});
  } else {
    sets.insert(sets.end(), {"cluster.sync=ALLREDUCE", "cluster.servers=0",
                             std::string("cluster.zero_stage=") + (mode == "allreduce_zero1" ? "1" : "0")});
  }
  const std::string summaries = JoinPath(dir, mode + "_summaries");
  sets.push_back("log.summary_dir=" + summaries);
  std::string cmd = ShellQuote(herd) + " launch " + ShellQuote(config_path);
  for (const std::string& s : sets) cmd += " --set " + ShellQuote(s);
  cmd += " 2>&1";
  std::FILE* out = ::popen(cmd.c_str(), "r");
  if (out == nullptr) return Status::IOError("cannot run " + herd);
  std::string output;
  char line[4096];
  while (std::fgets(line, sizeof line, out) != nullptr) output += line;
  const int rc = ::pclose(out);
  if (rc != 0) {
    const size_t tail = output.size() > 2000 ? output.size() - 2000 : 0;
    return Status::Internal(mode + ": herd launch failed (" + std::to_string(WEXITSTATUS(rc)) + "):\n" +
                            output.substr(tail));
  }
  // Every process's end-of-run summary (log.summary_dir).
  std::vector<double> sent;
  for (const std::string& path : Glob(JoinPath(summaries, "*.json"))) {
    HERD_ASSIGN_OR_RETURN(std::string text, ReadFile(path, 1 << 16));
    const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
    if (!j.is_object() || !j.contains("role") || !j.contains("peak_rss_bytes")) {
      return Status::Corruption(path + ": not a run summary");
    }
    const double peak = j.value("peak_rss_bytes", 0.0);
    if (j.value("role", "") == "server") {
      r.server_peak = std::max(r.server_peak, peak);
    } else {
      r.worker_peak = std::max(r.worker_peak, peak);
      ++r.workers;
      sent.push_back(j.value("bytes_sent_per_step", 0.0) / (1 << 20));
    }
  }
  r.servers = mode == "ps" ? servers : 0;
  r.sent_mib_per_step = Median(sent);
  std::ifstream in(metrics);
  std::vector<nlohmann::json> rows;
  for (std::string l; std::getline(in, l);) rows.push_back(nlohmann::json::parse(l, nullptr, false));
  std::vector<double> step_s, tps, wait;
  for (size_t i = static_cast<size_t>(warmup) + 1; i < rows.size(); ++i) {
    step_s.push_back(rows[i].value("elapsed_s", 0.0) - rows[i - 1].value("elapsed_s", 0.0));
    tps.push_back(rows[i].value("tokens_per_s", 0.0));
    wait.push_back(rows[i].value("network_wait", 0.0));
  }
  if (step_s.empty()) return Status::InvalidArgument("--steps must exceed --warmup + 1");
  r.step_s = Median(step_s);
  r.tokens_per_s = Median(tps);
  r.comm_share = Median(wait);
  return r;
}

}  // namespace

int RunBenchCompare(int argc, char** argv) {
  const char* usage =
      "usage: herd bench compare CONFIG [--set path=value ...] [--steps N] [--warmup K] [--servers S] [--json]";
  Args args({"set", "steps", "warmup", "servers"}, {"json"});
  Status st = args.Parse(argc, argv);
  if (!st.ok()) return ReportError(st.WithContext("bench compare: "));
  if (args.positional().size() != 1) return ReportError(Status::InvalidArgument(usage));
  // Validated as an all-reduce job: the config's own sync mode is replaced.
  std::vector<std::string> as_allreduce = args.GetAll("set");
  as_allreduce.insert(as_allreduce.end(), {"cluster.sync=ALLREDUCE", "cluster.servers=0"});
  auto config = LoadJobConfig(args.positional()[0], as_allreduce);
  if (!config.ok()) return ReportError(config.status());
  auto steps = args.GetInt("steps", 12, 3);
  auto warmup = args.GetInt("warmup", 2, 0);
  auto servers = args.GetInt("servers", std::max(1, config->cluster().servers()), 1);
  for (const auto* v : {&steps, &warmup, &servers}) {
    if (!v->ok()) return ReportError(v->status());
  }
  const std::string self = ThisExecutable();
  if (self.empty()) return ReportError(Status::IOError("cannot find the herd binary (/proc/self/exe)"));
  TempDir scratch;  // the runs' metrics files
  if (Status made = scratch.Create("herd-compare"); !made.ok()) return ReportError(made);
  std::vector<ModeResult> results;
  for (const char* mode : {"ps", "allreduce", "allreduce_zero1"}) {
    std::fprintf(stderr, "bench compare: running %s ...\n", mode);
    auto r = RunMode(self, args.positional()[0], args.GetAll("set"), mode, static_cast<int>(*servers), *steps,
                     *warmup, scratch.path());
    if (!r.ok()) return ReportError(r.status());
    results.push_back(*r);
  }
  if (args.Has("json")) {
    for (const ModeResult& r : results) {
      std::printf(
          "{\"bench\": \"compare\", \"config\": \"%s\", \"mode\": \"%s\", \"servers\": %d, \"workers\": %d, "
          "\"step_s\": %.4f, \"tokens_per_s\": %.1f, \"comm_wait_share\": %.3f, \"sent_MiB_per_worker_step\": %.2f, "
          "\"worker_peak_MiB\": %.1f, \"server_peak_MiB\": %.1f}\n",
          BaseName(args.positional()[0]).c_str(), r.mode.c_str(), r.servers, r.workers, r.step_s, r.tokens_per_s,
          r.comm_share, r.sent_mib_per_step, r.worker_peak / 1048576, r.server_peak / 1048576);
    }
    return 0;
  }
  std::printf("%-18s %8s %8s %10s %11s %12s %14s %14s\n", "mode", "servers", "workers", "step", "tokens/s", "comm wait",
              "sent/worker", "peak memory");
  for (const ModeResult& r : results) {
    std::string peak = "worker " + FormatBytes(static_cast<int64_t>(r.worker_peak));
    if (r.servers > 0) peak += ", server " + FormatBytes(static_cast<int64_t>(r.server_peak));
    std::printf("%-18s %8d %8d %9.3fs %11.0f %11.1f%% %10.2f MiB   %s\n", r.mode.c_str(), r.servers, r.workers,
                r.step_s, r.tokens_per_s, 100 * r.comm_share, r.sent_mib_per_step, peak.c_str());
  }
  return 0;
}

}  // namespace herd::tools
