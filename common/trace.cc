#include "common/trace.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "common/file_util.h"
#include "common/mutex.h"

namespace herd::trace {

std::atomic<bool> internal::g_on{false};

namespace {

// The first bytes of every herd trace file: what makes one replaceable.
constexpr char kMagic[] = "[\n{\"name\":\"herd_trace\"";

struct Event {
  char phase;  // 'X' (on the thread) or 'b' (in flight; written as a b/e pair)
  const char* name;
  const char* category;
  int64_t start_ns, end_ns;
  Arg args[3];
};

// One thread's events since the last write. Its thread appends; the writer
// swaps the vector out.
struct ThreadBuffer {
  ThreadBuffer(int64_t thread_id, const char* thread_name) : tid(thread_id), name(thread_name) {}

  const int64_t tid;

  Mutex mu;
  const char* name GUARDED_BY(mu);
  std::vector<Event> events GUARDED_BY(mu);

  bool name_written = false;  // the writer thread's
};

class Recorder {
 public:
  Status Start(const Options& options) {
    MutexLock lock(&mu_);
    if (file_ != nullptr) return Status::FailedPrecondition("log.trace: a trace is recording already");
    if (FILE* old = std::fopen(options.path.c_str(), "rb")) {
      char head[sizeof kMagic] = {};
      const size_t n = std::fread(head, 1, sizeof kMagic - 1, old);
      std::fclose(old);
      if (n != sizeof kMagic - 1 || std::memcmp(head, kMagic, sizeof kMagic - 1) != 0) {
        return Status::InvalidArgument("log.trace: " + options.path +
                                       " exists and is not a herd trace; it is not overwritten");
      }
    }
    HERD_RETURN_IF_ERROR(MakeDirs(DirName(options.path)).WithContext("log.trace: "));
    file_ = std::fopen(options.path.c_str(), "wb");
    if (file_ == nullptr) {
      return Status::IOError("log.trace: " + options.path + ": cannot open for writing: " + std::strerror(errno));
    }
    path_ = options.path;
    pid_ = ::getpid();
    buffers_.clear();  // any left from before: their threads register afresh
    error_ = Status::OK();
    char line[512];
    std::snprintf(line, sizeof line,
                  "%s,\"ph\":\"M\",\"pid\":%lld,\"tid\":0,\"args\":{\"version\":1,\"role\":\"%s\",\"rank\":%d}},\n",
                  kMagic, static_cast<long long>(pid_), options.role.c_str(), options.rank);
    std::string head = line;
    std::snprintf(line, sizeof line,
                  "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%lld,\"tid\":0,\"args\":{\"name\":\"%s\"}},\n",
                  static_cast<long long>(pid_), options.process.c_str());
    head += line;
    Write(head);
    ++generation_;
    stop_ = false;
    writer_ = std::thread([this] { WriteLoop(); });
    internal::g_on.store(true, std::memory_order_relaxed);
    return Status::OK();
  }

  Status Stop() {
    std::thread writer;
    {
      MutexLock lock(&mu_);
      if (file_ == nullptr) return Status::OK();
      internal::g_on.store(false, std::memory_order_relaxed);
      stop_ = true;
      writer.swap(writer_);
    }
    cv_.SignalAll();
    writer.join();
    MutexLock lock(&mu_);
    WriteBuffers();
    char line[160];
    std::snprintf(line, sizeof line, "{\"name\":\"herd_trace_end\",\"ph\":\"M\",\"pid\":%lld,\"tid\":0}\n]\n",
                  static_cast<long long>(pid_));
    Write(line);
    if (std::fclose(file_) != 0 && error_.ok()) {
      error_ = Status::IOError("log.trace: " + path_ + ": write failed: " + std::strerror(errno));
    }
    file_ = nullptr;
    buffers_.clear();
    return error_;
  }

  void RecordClockOffset(int64_t local_ns, int64_t offset_ns, int64_t rtt_ns) {
    MutexLock lock(&mu_);
    if (file_ == nullptr) return;
    char line[256];
    std::snprintf(line, sizeof line,
                  "{\"name\":\"herd_clock\",\"ph\":\"M\",\"pid\":%lld,\"tid\":0,\"args\":{\"local_ns\":%lld,"
                  "\"offset_ns\":%lld,\"rtt_ns\":%lld}},\n",
                  static_cast<long long>(pid_), static_cast<long long>(local_ns), static_cast<long long>(offset_ns),
                  static_cast<long long>(rtt_ns));
    Write(line);
  }

  // The calling thread's buffer for the trace recording now.
  ThreadBuffer* ThisThread() {
    thread_local std::shared_ptr<ThreadBuffer> mine;
    thread_local uint64_t generation = 0;
    const uint64_t current = generation_.load(std::memory_order_acquire);
    if (mine == nullptr || generation != current) {
      const char* name = nullptr;
      if (mine != nullptr) {
        MutexLock lock(&mine->mu);
        name = mine->name;  // a thread keeps its name from trace to trace
      }
      auto fresh = std::make_shared<ThreadBuffer>(static_cast<int64_t>(::syscall(SYS_gettid)), name);
      MutexLock lock(&mu_);
      buffers_.push_back(fresh);
      mine = std::move(fresh);
      generation = current;
    }
    return mine.get();
  }

 private:
  void WriteLoop() LOCKS_EXCLUDED(mu_) {
    MutexLock lock(&mu_);
    while (!stop_) {
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(250);
      while (!stop_ && cv_.WaitUntil(&mu_, deadline)) {
      }
      if (!stop_) WriteBuffers();
    }
  }

  void WriteBuffers() REQUIRES(mu_) {
    std::string out;
    std::vector<Event> events;
    char line[512];
    for (const auto& buffer : buffers_) {
      const char* name;
      {
        MutexLock lock(&buffer->mu);
        events.swap(buffer->events);
        name = buffer->name;
      }
      const long long pid = static_cast<long long>(pid_), tid = static_cast<long long>(buffer->tid);
      if (name != nullptr && !buffer->name_written) {
        buffer->name_written = true;
        std::snprintf(line, sizeof line,
                      "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%lld,\"tid\":%lld,\"args\":{\"name\":\"%s\"}},\n",
                      pid, tid, name);
        out += line;
      }
      for (const Event& e : events) {
        char args[256] = "";
        size_t used = 0;
        for (const Arg& a : e.args) {
          if (a.key == nullptr || used >= sizeof args) continue;
          used += std::snprintf(args + used, sizeof args - used, "%s\"%s\":%lld", used == 0 ? ",\"args\":{" : ",",
                                a.key, static_cast<long long>(a.value));
        }
        if (used > 0 && used + 1 < sizeof args) std::strcat(args, "}");
        const long long start = e.start_ns, end = std::max(e.end_ns, e.start_ns);
        if (e.phase == 'X') {
          std::snprintf(line, sizeof line,
                        "{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"ts\":%lld.%03lld,\"dur\":%lld.%03lld,"
                        "\"pid\":%lld,\"tid\":%lld%s},\n",
                        e.name, e.category, start / 1000, start % 1000, (end - start) / 1000, (end - start) % 1000,
                        pid, tid, args);
          out += line;
        } else {
          const long long id = ++async_ids_;
          for (const auto& [phase, ts] : {std::pair<char, long long>{'b', start}, {'e', end}}) {
            std::snprintf(line, sizeof line,
                          "{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"%c\",\"id\":%lld,\"ts\":%lld.%03lld,"
                          "\"pid\":%lld,\"tid\":%lld%s},\n",
                          e.name, e.category, phase, id, ts / 1000, ts % 1000, pid, tid,
                          phase == 'b' ? args : "");
            out += line;
          }
        }
      }
      events.clear();
    }
    Write(out);
    if (std::fflush(file_) != 0 && error_.ok()) {
      error_ = Status::IOError("log.trace: " + path_ + ": write failed: " + std::strerror(errno));
    }
  }

  void Write(const std::string& text) REQUIRES(mu_) {
    if (text.empty()) return;
    if (std::fwrite(text.data(), 1, text.size(), file_) != text.size() && error_.ok()) {
      error_ = Status::IOError("log.trace: " + path_ + ": write failed: " + std::strerror(errno));
    }
  }

  std::atomic<uint64_t> generation_{0};  // one per trace started: thread buffers belong to one

  Mutex mu_;
  CondVar cv_;  // stop_ set
  FILE* file_ GUARDED_BY(mu_) = nullptr;
  std::string path_ GUARDED_BY(mu_);
  int64_t pid_ GUARDED_BY(mu_) = 0;
  std::vector<std::shared_ptr<ThreadBuffer>> buffers_ GUARDED_BY(mu_);
  bool stop_ GUARDED_BY(mu_) = false;
  int64_t async_ids_ GUARDED_BY(mu_) = 0;
  Status error_ GUARDED_BY(mu_);  // the first write error
  std::thread writer_ GUARDED_BY(mu_);
};

Recorder& TheRecorder() {
  static Recorder* recorder = new Recorder;  // never destroyed: threads may record until the process ends
  return *recorder;
}

}  // namespace

int64_t Now() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void internal::Add(char phase, const char* name, const char* category, int64_t start_ns, int64_t end_ns,
                   const Arg& a, const Arg& b, const Arg& c) {
  ThreadBuffer* buffer = TheRecorder().ThisThread();
  MutexLock lock(&buffer->mu);
  buffer->events.push_back({phase, name, category, start_ns, end_ns, {a, b, c}});
}

void NameThread(const char* name) {
  ThreadBuffer* buffer = TheRecorder().ThisThread();
  MutexLock lock(&buffer->mu);
  buffer->name = name;
}

Status Start(const Options& options) { return TheRecorder().Start(options); }
void RecordClockOffset(int64_t local_ns, int64_t offset_ns, int64_t rtt_ns) {
  TheRecorder().RecordClockOffset(local_ns, offset_ns, rtt_ns);
}
Status Stop() { return TheRecorder().Stop(); }

std::string TraceFileName(const std::string& dir, const std::string& role, int rank) {
  char name[48];
  std::snprintf(name, sizeof name, "%s_%05d.trace.json", role.c_str(), rank);
  return JoinPath(dir, name);
}

}  // namespace herd::trace
