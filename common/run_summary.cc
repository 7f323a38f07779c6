#include "common/run_summary.h"

#include <cstdio>

#include "common/file_util.h"

namespace herd {

Status WriteRunSummary(const std::string& dir, const RunSummary& s) {
  if (dir.empty()) return Status::OK();
  HERD_RETURN_IF_ERROR(MakeDirs(dir).WithContext("log.summary_dir: "));
  char name[48];
  std::snprintf(name, sizeof name, "%s_%05d.json", s.role.c_str(), s.rank);
  char json[512];
  std::snprintf(json, sizeof json,
                "{\"role\": \"%s\", \"rank\": %d, \"steps\": %lld, \"peak_rss_bytes\": %lld, \"plan_bytes\": %lld, "
                "\"bytes_sent_per_step\": %.17g}\n",
                s.role.c_str(), s.rank, static_cast<long long>(s.steps), static_cast<long long>(s.peak_rss_bytes),
                static_cast<long long>(s.plan_bytes), s.bytes_sent_per_step);
  return WriteFileAtomic(JoinPath(dir, name), json).WithContext("log.summary_dir: ");
}

}  // namespace herd
