#include "worker/progress_log.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "common/file_util.h"

namespace herd {

ProgressLog::~ProgressLog() {
  if (metrics_ != nullptr) std::fclose(metrics_);
}

Status ProgressLog::Open(const std::string& metrics_path, const std::string& tensorboard_dir, bool append) {
  if (!tensorboard_dir.empty()) HERD_RETURN_IF_ERROR(tensorboard_.Open(tensorboard_dir));
  if (metrics_path.empty()) return Status::OK();
  path_ = metrics_path;
  HERD_RETURN_IF_ERROR(MakeDirs(DirName(metrics_path)).WithContext("log.metrics: "));
  // A fresh run starts the file anew, but only over an earlier run's
  // metrics: anything else there is not herd's to replace.
  if (std::FILE* existing = append ? nullptr : std::fopen(metrics_path.c_str(), "rb")) {
    char head[16] = {};
    const size_t n = std::fread(head, 1, sizeof head - 1, existing);
    std::fclose(existing);
    if (n > 0 && std::strncmp(head, "{\"step\": ", 9) != 0) {
      return Status::InvalidArgument("log.metrics: " + metrics_path +
                                     " exists and is not a herd metrics file; it is not overwritten");
    }
  }
  metrics_ = std::fopen(metrics_path.c_str(), append ? "a" : "w");
  if (metrics_ == nullptr) {
    return Status::IOError("log.metrics: " + metrics_path + ": cannot open for writing: " + std::strerror(errno));
  }
  return Status::OK();
}

Status ProgressLog::TakeOver(const std::string& metrics_path, const std::string& tensorboard_dir) {
  std::string text;
  if (!metrics_path.empty() && PathExists(metrics_path)) {
    HERD_ASSIGN_OR_RETURN(text, ReadFile(metrics_path));
  }
  HERD_RETURN_IF_ERROR(Open(metrics_path, tensorboard_dir, /*append=*/true));
  if (metrics_ == nullptr) return Status::OK();
  if (!text.empty() && text.back() != '\n') std::fputc('\n', metrics_);
  const size_t end = text.rfind('\n');
  if (end != std::string::npos) {
    const size_t begin = text.rfind('\n', end == 0 ? 0 : end - 1);
    const std::string last = text.substr(begin == std::string::npos ? 0 : begin + 1);
    static constexpr char kStep[] = "{\"step\": ";
    if (last.compare(0, sizeof kStep - 1, kStep) == 0) recorded_through_ = std::atoll(last.c_str() + sizeof kStep - 1);
  }
  return Status::OK();
}

Status ProgressLog::Write(const Entry& e) {
  if (e.step <= recorded_through_) return Status::OK();
  std::printf("step %6lld/%lld | loss %.4f | lr %.2e | norm %.3f | %8.0f tok/s | eta %s",
              static_cast<long long>(e.step), static_cast<long long>(e.total_steps), e.loss, e.lr, e.grad_norm,
              e.tokens_per_s, FormatDuration(e.eta_s).c_str());
  if (!std::isnan(e.mfu)) std::printf(" | mfu %4.1f%%", 100 * e.mfu);
  if (!std::isnan(e.network_wait)) std::printf(" | net %2.0f%%", 100 * e.network_wait);
  if (!std::isnan(e.val_loss)) std::printf(" | val %.4f", e.val_loss);
  std::printf("\n");
  std::fflush(stdout);
  if (tensorboard_.is_open()) {
    std::vector<std::pair<std::string, double>> scalars = {{"train/loss", e.loss},
                                                           {"train/lr", e.lr},
                                                           {"train/grad_norm", e.grad_norm},
                                                           {"perf/tokens_per_s", e.tokens_per_s},
                                                           {"perf/step_time_s", e.step_s}};
    if (!std::isnan(e.mfu)) scalars.emplace_back("perf/mfu", e.mfu);
    if (!std::isnan(e.network_wait)) scalars.emplace_back("perf/network_wait", e.network_wait);
    if (!std::isnan(e.val_loss)) scalars.emplace_back("val/loss", e.val_loss);
    HERD_RETURN_IF_ERROR(tensorboard_.Add(e.step, scalars));
  }
  if (metrics_ == nullptr) return Status::OK();
  std::fprintf(metrics_,
               "{\"step\": %lld, \"loss\": %.17g, \"lr\": %.17g, \"grad_norm\": %.17g, \"tokens_per_s\": %.6g, "
               "\"elapsed_s\": %.6g, \"step_s\": %.6g",
               static_cast<long long>(e.step), e.loss, e.lr, e.grad_norm, e.tokens_per_s, e.elapsed_s, e.step_s);
  if (!std::isnan(e.mfu)) std::fprintf(metrics_, ", \"mfu\": %.4g", e.mfu);
  if (!std::isnan(e.network_wait)) std::fprintf(metrics_, ", \"network_wait\": %.4f", e.network_wait);
  if (!std::isnan(e.val_loss)) std::fprintf(metrics_, ", \"val_loss\": %.17g", e.val_loss);
  if (e.skipped) std::fprintf(metrics_, ", \"skipped\": true");
  std::fprintf(metrics_, "}\n");
  if (std::fflush(metrics_) != 0 || std::ferror(metrics_)) {
    return Status::IOError("log.metrics: " + path_ + ": write failed: " + std::strerror(errno));
  }
  return Status::OK();
}

Status ProgressLog::Close() {
  HERD_RETURN_IF_ERROR(tensorboard_.Close());
  if (metrics_ == nullptr) return Status::OK();
  const bool failed = std::ferror(metrics_) != 0;
  const bool closed = std::fclose(metrics_) == 0;
  metrics_ = nullptr;
  if (failed || !closed) return Status::IOError("log.metrics: " + path_ + ": write failed: " + std::strerror(errno));
  return Status::OK();
}

}  // namespace herd
