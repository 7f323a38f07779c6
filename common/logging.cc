#include "common/logging.h"

#include <glog/logging.h>

#include <cstdio>
#include <mutex>
#include <string>
#include <utility>

#include "common/clock.h"

namespace herd {

void InitLogging(const char* argv0) {
  static bool initialised = false;
  if (initialised) return;
  initialised = true;
  FLAGS_logtostderr = true;
  FLAGS_colorlogtostderr = false;
  google::InitGoogleLogging(argv0);
}

namespace {

// glog's lines, as it would write them to stderr, appended to a file.
class FileLogSink : public google::LogSink {
 public:
  explicit FileLogSink(std::string path) : path_(std::move(path)) {}

  void send(google::LogSeverity severity, const char* /*full_filename*/, const char* base_filename, int line,
            const google::LogMessageTime& time, const char* message, size_t message_len) override {
    Write(ToString(severity, base_filename, line, time, message, message_len) + "\n");
  }

  void Write(const std::string& text) {
    std::lock_guard<std::mutex> lock(mu_);
    if (file_ == nullptr && !failed_) {
      file_ = std::fopen(path_.c_str(), "a");
      failed_ = file_ == nullptr;
    }
    if (file_ == nullptr) {
      std::fwrite(text.data(), 1, text.size(), stderr);  // a log that cannot be kept still reaches someone
      return;
    }
    std::fwrite(text.data(), 1, text.size(), file_);
    std::fflush(file_);
  }

  std::string written() {
    std::lock_guard<std::mutex> lock(mu_);
    return file_ != nullptr ? path_ : std::string();
  }

 private:
  const std::string path_;
  std::mutex mu_;
  std::FILE* file_ = nullptr;  // guarded by mu_; open until the process ends
  bool failed_ = false;
};

FileLogSink* file_sink = nullptr;  // set once, never freed: glog may log until exit

}  // namespace

void LogToFile(const std::string& path) {
  if (file_sink != nullptr) return;
  file_sink = new FileLogSink(path);
  for (google::LogSeverity s : {google::GLOG_INFO, google::GLOG_WARNING, google::GLOG_ERROR, google::GLOG_FATAL}) {
    google::SetLogDestination(s, "");  // no glog files of its own
  }
  FLAGS_logtostderr = false;
  FLAGS_alsologtostderr = false;
  FLAGS_stderrthreshold = google::GLOG_FATAL;
  google::AddLogSink(file_sink);
}

std::string LogFileWritten() { return file_sink != nullptr ? file_sink->written() : std::string(); }

void LogLine(std::string_view line) {
  std::string text(line);
  text += '\n';
  if (file_sink != nullptr) return file_sink->Write(text);
  std::fwrite(text.data(), 1, text.size(), stderr);
  std::fflush(stderr);
}

int ReportError(const Status& status) {
  std::fprintf(stderr, "herd: error: %s\n", status.message().c_str());
  std::fflush(stderr);
  return ExitCode(status);
}

int ExitCode(const Status& status) {
  switch (status.code()) {
    case Status::Code::kInvalidArgument: return kExitBadInput;
    case Status::Code::kAborted:
    case Status::Code::kCancelled: return kExitStoppedByJob;
    default: return kExitFailure;
  }
}

std::string FormatDuration(double seconds) {
  if (!(seconds >= 0) || seconds > 1e9) return "?";
  long s = static_cast<long>(seconds + 0.5);
  char buf[32];
  if (s >= 3600) {
    std::snprintf(buf, sizeof(buf), "%ldh%02ldm", s / 3600, (s / 60) % 60);
  } else if (s >= 60) {
    std::snprintf(buf, sizeof(buf), "%ldm%02lds", s / 60, s % 60);
  } else {
    std::snprintf(buf, sizeof(buf), "%lds", s);
  }
  return buf;
}

}  // namespace herd
