#include "common/run_summary.h"

#include <algorithm>
#include <cstdio>

#include "common/file_util.h"
#include "common/memory.h"
#include "common/strings.h"

namespace herd {

namespace {

std::string HandOverJson(const RunSummary::HandOver& h) {
  char json[320];
  std::snprintf(json, sizeof json,
                "{\"region\": %d, \"step\": %lld, \"weights_crc32\": %u, \"m_crc32\": %u, \"v_crc32\": %u, "
                "\"outer_crc32\": %u, \"momentum_crc32\": %u, \"data_epoch\": %lld, \"data_taken\": %lld}",
                h.region, static_cast<long long>(h.step), static_cast<unsigned>(h.weights_crc32),
                static_cast<unsigned>(h.m_crc32), static_cast<unsigned>(h.v_crc32),
                static_cast<unsigned>(h.outer_crc32), static_cast<unsigned>(h.momentum_crc32),
                static_cast<long long>(h.data_epoch), static_cast<long long>(h.data_taken));
  return json;
}

Status WriteRunSummary(const std::string& dir, const RunSummary& s) {
  if (dir.empty()) return Status::OK();
  HERD_RETURN_IF_ERROR(MakeDirs(dir).WithContext("log.summary_dir: "));
  char name[48];
  std::snprintf(name, sizeof name, "%s_%05d.json", s.role.c_str(), s.rank);
  char json[704];
  std::snprintf(json, sizeof json,
                "{\"role\": \"%s\", \"rank\": %d, \"steps\": %lld, \"peak_rss_bytes\": %lld, \"plan_bytes\": %lld, "
                "\"bytes_sent_per_step\": %.17g, \"shares_computed\": %lld, \"pushes_dropped\": %lld, "
                "\"device_peak_bytes\": %lld, \"device_plan_bytes\": %lld, \"unauthenticated_dropped\": %lld, "
                "\"weights_crc32\": %u, ",
                s.role.c_str(), s.rank, static_cast<long long>(s.steps), static_cast<long long>(s.peak_rss_bytes),
                static_cast<long long>(s.plan_bytes), s.bytes_sent_per_step, static_cast<long long>(s.shares_computed),
                static_cast<long long>(s.pushes_dropped), static_cast<long long>(s.device_peak_bytes),
                static_cast<long long>(s.device_plan_bytes), static_cast<long long>(s.unauthenticated_dropped),
                static_cast<unsigned>(s.weights_crc32));
  std::string text = json;
  text += "\"took_up\": " + (s.took_up ? HandOverJson(*s.took_up) : std::string("null")) + ", \"gave\": [";
  for (size_t i = 0; i < s.gave.size(); ++i) text += (i > 0 ? ", " : "") + HandOverJson(s.gave[i]);
  text += "]}\n";
  return WriteFileAtomic(JoinPath(dir, name), text).WithContext("log.summary_dir: ");
}

}  // namespace

Status ReportRunSummary(const RunSummary& run, uint64_t bytes_sent, const std::string& dir) {
  RunSummary s = run;
  s.peak_rss_bytes = PeakRssBytes();
  s.bytes_sent_per_step = static_cast<double>(bytes_sent) / static_cast<double>(std::max<int64_t>(1, s.steps));
  const std::string& role = s.role;
  std::printf("peak memory: %s (herd plan: %s)", FormatBytes(s.peak_rss_bytes).c_str(),
              FormatBytes(s.plan_bytes).c_str());
  if (s.device_plan_bytes > 0) {
    std::printf("; device %s (herd plan: %s)", FormatBytes(s.device_peak_bytes).c_str(),
                FormatBytes(s.device_plan_bytes).c_str());
  }
  if (role == "worker") std::printf("; sent %.2f MiB per step", s.bytes_sent_per_step / (1 << 20));
  if (s.unauthenticated_dropped > 0) {
    std::printf("; dropped %lld data-plane messages without the job's key",
                static_cast<long long>(s.unauthenticated_dropped));
  }
  std::printf("\n");
  std::fflush(stdout);
  return WriteRunSummary(dir, s);
}

}  // namespace herd
