// common/trace.h: what threads record is what the file holds, whole and
// well-formed; nothing is recorded while no trace is on; a file herd did
// not write is never replaced.
#include "common/trace.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/file_util.h"

namespace herd {
namespace {

using json = nlohmann::json;

std::string TempPath(const std::string& name) {
  return JoinPath(::testing::TempDir(), name + "." + std::to_string(::getpid()) + ".trace.json");
}

std::vector<json> ReadEvents(const std::string& path, bool* ended) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line, "[");
  std::vector<json> events;
  *ended = false;
  while (std::getline(in, line)) {
    if (line == "]") {
      *ended = true;
      continue;
    }
    EXPECT_FALSE(*ended) << "a line after the end: " << line;
    if (line.back() == ',') line.pop_back();
    events.push_back(json::parse(line));
  }
  return events;
}

TEST(TraceRecorder, EverySpanOfEveryThreadIsWrittenWholeAndNested) {
  const std::string path = TempPath("threads");
  std::remove(path.c_str());
  trace::Span before("before", "test");  // begun while off: never recorded
  ASSERT_TRUE(trace::Start({path, "worker 3", "worker", 3}).ok());
  constexpr int kThreads = 8, kSpans = 3000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t] {
      trace::NameThread("test thread");
      for (int i = 0; i < kSpans; ++i) {
        const int64_t issued = trace::StartTime();
        trace::Span outer("outer", "test", {"thread", t}, {"i", i});
        { trace::Span inner("inner", "test", {"i", i}); }
        trace::Async("in flight", "test", issued, {"i", i});
      }
    });
  }
  for (auto& th : threads) th.join();
  trace::RecordClockOffset(trace::Now(), -5, 10);
  ASSERT_TRUE(trace::Stop().ok());
  { trace::Span after("after", "test"); }  // stopped: not recorded

  bool ended = false;
  const std::vector<json> events = ReadEvents(path, &ended);
  EXPECT_TRUE(ended);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events[0]["name"], "herd_trace");
  EXPECT_EQ(events[0]["args"]["rank"], 3);
  EXPECT_EQ(events.back()["name"], "herd_trace_end");
  std::map<std::string, int> count;
  std::map<int64_t, std::vector<json>> outer_by_tid;
  std::map<int64_t, std::string> thread_names;
  for (const json& e : events) {
    EXPECT_EQ(e["pid"], ::getpid());
    if (e["name"] == "thread_name") thread_names[e["tid"]] = e["args"]["name"];
    count[e["name"].get<std::string>() + "/" + e["ph"].get<std::string>()]++;
    if (e["name"] == "outer") outer_by_tid[e["tid"]].push_back(e);
  }
  EXPECT_EQ(count["outer/X"], kThreads * kSpans);
  EXPECT_EQ(count["inner/X"], kThreads * kSpans);
  EXPECT_EQ(count["in flight/b"], kThreads * kSpans);
  EXPECT_EQ(count["in flight/e"], kThreads * kSpans);
  EXPECT_EQ(count["herd_clock/M"], 1);
  EXPECT_EQ(count["before/X"] + count["after/X"], 0);
  EXPECT_EQ(outer_by_tid.size(), static_cast<size_t>(kThreads));
  for (const auto& [tid, spans] : outer_by_tid) EXPECT_EQ(thread_names[tid], "test thread");
  // Each inner span lies within its thread's outer span of the same i.
  std::map<std::pair<int64_t, int64_t>, std::pair<double, double>> outer;
  for (const json& e : events) {
    if (e["name"] == "outer") outer[{e["tid"], e["args"]["i"]}] = {e["ts"], e["ts"].get<double>() + e["dur"].get<double>()};
  }
  for (const json& e : events) {
    if (e["name"] != "inner") continue;
    const auto [begin, end] = outer.at({e["tid"], e["args"]["i"]});
    EXPECT_GE(e["ts"].get<double>(), begin);
    EXPECT_LE(e["ts"].get<double>() + e["dur"].get<double>(), end);
  }

  // A second trace replaces the first (a herd trace) and starts empty.
  ASSERT_TRUE(trace::Start({path, "worker 3", "worker", 3}).ok());
  { trace::Span once("once", "test"); }
  ASSERT_TRUE(trace::Stop().ok());
  const std::vector<json> again = ReadEvents(path, &ended);
  int spans = 0;
  for (const json& e : again) spans += e["ph"] == "X";
  EXPECT_EQ(spans, 1);
  std::remove(path.c_str());
}

TEST(TraceRecorder, AFileHerdDidNotWriteIsRefusedAndKept) {
  const std::string path = TempPath("foreign");
  ASSERT_TRUE(WriteFileAtomic(path, "[\n{\"name\":\"someone else's\"}\n]\n").ok());
  const Status st = trace::Start({path, "server 0", "server", 0});
  EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(st.message().find("not a herd trace; it is not overwritten"), std::string::npos) << st.message();
  EXPECT_FALSE(trace::On());
  auto kept = ReadFile(path);
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ(*kept, "[\n{\"name\":\"someone else's\"}\n]\n");
  std::remove(path.c_str());
}

}  // namespace
}  // namespace herd
