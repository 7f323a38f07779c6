// herd trace merge DIR --out trace.json
//
// Merges the step timelines a job's processes wrote with log.trace (DIR/
// ROLE_RRRRR.trace.json, common/trace.h) into one Chrome/Perfetto trace:
// each process's timestamps are moved onto the coordinator's clock by the
// offsets it measured (interpolated between its measurements, so a clock
// that drifted is followed), every process gets a lane of its own (servers
// first, then workers, by rank), and time starts at 0 at the first event.
// A file cut short (its process killed) is merged up to its last whole
// event. Prints one JSON object: what each process contributed and the
// offset it was moved by.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/file_util.h"
#include "common/logging.h"
#include "common/strings.h"
#include "tools/args.h"
#include "tools/commands.h"

namespace herd::tools {
namespace {

using json = nlohmann::json;

// The first bytes of a merged trace: what --out may replace.
constexpr char kMergedMagic[] = "{\"otherData\":{\"herd_merged\":1";

struct ClockSample {
  int64_t local_ns, offset_ns, rtt_ns;
};

struct ProcessTrace {
  std::string file, name, role;
  int rank = 0;
  int64_t pid = 0;
  std::vector<json> events;  // spans and thread names, as written
  std::vector<ClockSample> clock;
  bool complete = false;  // ended with the end marker

  // This process's clock → the coordinator's at local time t: linear
  // between the measurements, the nearest one outside them.
  int64_t Offset(int64_t t) const {
    if (t <= clock.front().local_ns) return clock.front().offset_ns;
    if (t >= clock.back().local_ns) return clock.back().offset_ns;
    auto hi = std::upper_bound(clock.begin(), clock.end(), t,
                               [](int64_t x, const ClockSample& c) { return x < c.local_ns; });
    auto lo = hi - 1;
    const double f = static_cast<double>(t - lo->local_ns) / static_cast<double>(hi->local_ns - lo->local_ns);
    return lo->offset_ns + static_cast<int64_t>(std::llround(f * static_cast<double>(hi->offset_ns - lo->offset_ns)));
  }
};

bool IsInt(const json& j) { return j.is_number_integer(); }

// Checks one event line's fields; "" when it is whole.
std::string Invalid(const json& e) {
  if (!e.is_object()) return "not a JSON object";
  if (!e.contains("name") || !e["name"].is_string()) return "no name";
  if (!e.contains("ph") || !e["ph"].is_string()) return "no phase (ph)";
  if (!e.contains("pid") || !IsInt(e["pid"])) return "no integer pid";
  const std::string ph = e["ph"];
  if (ph == "M") return "";
  if (ph != "X" && ph != "b" && ph != "e") return "phase '" + ph + "' is not one herd writes (X, b, e, M)";
  if (!e.contains("tid") || !IsInt(e["tid"])) return "no integer tid";
  if (!e.contains("ts") || !e["ts"].is_number() || e["ts"].get<double>() < 0) return "no timestamp (ts)";
  if (ph == "X" && (!e.contains("dur") || !e["dur"].is_number() || e["dur"].get<double>() < 0)) return "no duration";
  if (ph != "X" && (!e.contains("id") || !IsInt(e["id"]))) return "an async event without an integer id";
  if (e.contains("args") && !e["args"].is_object()) return "args is not an object";
  return "";
}

StatusOr<ProcessTrace> ReadProcessTrace(const std::string& path) {
  HERD_ASSIGN_OR_RETURN(const std::string text, ReadFile(path));
  ProcessTrace p;
  p.file = path;
  std::vector<std::string> lines = Split(text, '\n');
  if (lines.size() < 2 || lines[0] != "[") return Status::InvalidArgument(path + ": not a herd trace (log.trace)");
  // A process killed mid-write leaves a last line cut short.
  const bool ends_whole = !text.empty() && text.back() == '\n';
  for (size_t i = 1; i < lines.size(); ++i) {
    std::string line = Trim(lines[i]);
    if (line.empty() || line == "]") continue;
    if (line.back() == ',') line.pop_back();
    const std::string where = path + ":" + std::to_string(i + 1) + ": ";
    json e = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (e.is_discarded()) {
      if (i + 1 == lines.size() && !ends_whole) break;  // the cut-short last line
      return Status::InvalidArgument(where + "not a JSON trace event");
    }
    if (const std::string bad = Invalid(e); !bad.empty()) return Status::InvalidArgument(where + bad);
    const std::string name = e["name"];
    if (i == 1) {
      const json& a = e.value("args", json::object());
      if (name != "herd_trace" || a.value("version", 0) != 1 || !a.contains("role") || !a["role"].is_string() ||
          !a.contains("rank") || !IsInt(a["rank"])) {
        return Status::InvalidArgument(path + ": not a herd trace (version 1)");
      }
      if (a["rank"].get<int64_t>() < 0) return Status::InvalidArgument(where + "a negative rank");
      p.role = a["role"];
      p.rank = a["rank"];
      p.pid = e["pid"];
      continue;
    }
    if (e["pid"] != p.pid) return Status::InvalidArgument(where + "an event of another process (pid)");
    if (e["ph"] == "M") {
      const json& a = e.value("args", json::object());
      if (name == "herd_clock") {
        if (!IsInt(a.value("local_ns", json())) || !IsInt(a.value("offset_ns", json())) ||
            !IsInt(a.value("rtt_ns", json())) || a["rtt_ns"].get<int64_t>() < 0) {
          return Status::InvalidArgument(where + "a clock offset without local_ns, offset_ns and rtt_ns");
        }
        p.clock.push_back({a["local_ns"], a["offset_ns"], a["rtt_ns"]});
      } else if (name == "process_name") {
        if (!a.contains("name") || !a["name"].is_string()) return Status::InvalidArgument(where + "a nameless process");
        p.name = a["name"];
      } else if (name == "herd_trace_end") {
        p.complete = true;
      } else if (name == "thread_name") {
        p.events.push_back(std::move(e));
      }
      continue;
    }
    p.events.push_back(std::move(e));
  }
  if (p.clock.empty()) return Status::InvalidArgument(path + ": no clock offset (herd_clock) recorded");
  std::sort(p.clock.begin(), p.clock.end(),
            [](const ClockSample& a, const ClockSample& b) { return a.local_ns < b.local_ns; });
  for (size_t i = 1; i < p.clock.size(); ++i) {
    if (p.clock[i].local_ns == p.clock[i - 1].local_ns) p.clock[i].local_ns += 1;  // keep the interpolation defined
  }
  if (p.name.empty()) p.name = p.role + " " + std::to_string(p.rank);
  return p;
}

// Microseconds with nanosecond digits, as the trace files write them.
std::string Micros(int64_t ns) {
  char s[40];
  std::snprintf(s, sizeof s, "%s%lld.%03lld", ns < 0 ? "-" : "", std::llabs(ns) / 1000, std::llabs(ns) % 1000);
  return s;
}

int64_t Nanos(const json& micros) { return std::llround(micros.get<double>() * 1000.0); }

// --out is replaced only when it is a merged trace already (a rerun).
Status CheckOutReplaceable(const std::string& out_path) {
  if (!PathExists(out_path)) return Status::OK();
  std::string head(sizeof kMergedMagic - 1, '\0');
  if (std::FILE* f = std::fopen(out_path.c_str(), "rb")) {
    head.resize(std::fread(head.data(), 1, head.size(), f));
    std::fclose(f);
  }
  if (head != kMergedMagic) {
    return Status::InvalidArgument("--out " + out_path + " exists and is not a merged herd trace; it is not overwritten");
  }
  return Status::OK();
}

// Every file's process, in lane order: servers first, then workers, by rank.
StatusOr<std::vector<ProcessTrace>> ReadProcessTraces(const std::vector<std::string>& files) {
  std::vector<ProcessTrace> procs;
  for (const std::string& f : files) {
    HERD_ASSIGN_OR_RETURN(ProcessTrace p, ReadProcessTrace(f));
    procs.push_back(std::move(p));
  }
  std::sort(procs.begin(), procs.end(), [](const ProcessTrace& a, const ProcessTrace& b) {
    return a.role != b.role ? a.role == "server" : a.rank < b.rank;
  });
  for (size_t i = 1; i < procs.size(); ++i) {
    if (procs[i].role == procs[i - 1].role && procs[i].rank == procs[i - 1].rank) {
      return Status::InvalidArgument(procs[i].file + " and " + procs[i - 1].file + " are both " + procs[i].name);
    }
  }
  return procs;
}

// The merged trace's pid for procs[i].
int Lane(size_t i) { return static_cast<int>(i) + 1; }

// Every timed event on the coordinator's clock, from the first one on.
struct Timeline {
  struct Timed {
    int64_t ts;
    size_t proc;
    const json* event;
  };
  std::vector<Timed> events;  // by time; equal times in file order
  int64_t base = INT64_MAX;   // the first event's time
};

Timeline OnCoordinatorClock(const std::vector<ProcessTrace>& procs) {
  Timeline timeline;
  for (size_t i = 0; i < procs.size(); ++i) {
    for (const json& e : procs[i].events) {
      if (e["ph"] == "M") continue;
      const int64_t local = Nanos(e["ts"]);
      const int64_t ts = local + procs[i].Offset(local);
      timeline.events.push_back({ts, i, &e});
      timeline.base = std::min(timeline.base, ts);
    }
  }
  std::stable_sort(timeline.events.begin(), timeline.events.end(),
                   [](const Timeline::Timed& a, const Timeline::Timed& b) { return a.ts < b.ts; });
  return timeline;
}

// The metadata lines that name and place a process's lane, and its
// threads; each ends with the events' separator.
std::string LaneHeader(const ProcessTrace& p, int lane) {
  std::string lines;
  lines += json({{"name", "process_name"}, {"ph", "M"}, {"pid", lane}, {"tid", 0}, {"args", {{"name", p.name}}}})
               .dump() +
           ",\n";
  lines += json({{"name", "process_sort_index"}, {"ph", "M"}, {"pid", lane}, {"tid", 0}, {"args", {{"sort_index", lane}}}})
               .dump() +
           ",\n";
  for (const json& e : p.events) {
    if (e["ph"] != "M") continue;
    json m = e;
    m["pid"] = lane;
    lines += m.dump() + ",\n";
  }
  return lines;
}

// What the merge prints of a process: its spans and how its clock was moved.
nlohmann::ordered_json ProcessReport(const ProcessTrace& p) {
  int64_t spans = 0;
  for (const json& e : p.events) {
    if (e["ph"] != "M") spans += e["ph"] != "e";
  }
  return {{"name", p.name},
          {"file", p.file},
          {"spans", spans},
          {"offset_us", p.clock.front().offset_ns / 1e3},
          {"rtt_us", p.clock.front().rtt_ns / 1e3},
          {"drift_us", (p.clock.back().offset_ns - p.clock.front().offset_ns) / 1e3},
          {"complete", p.complete}};
}

// What the merged file records of a process in otherData: its clock samples.
nlohmann::ordered_json ClockRecord(const ProcessTrace& p) {
  nlohmann::ordered_json clock = nlohmann::ordered_json::array();
  for (const ClockSample& c : p.clock) {
    clock.push_back({{"local_ns", c.local_ns}, {"offset_ns", c.offset_ns}, {"rtt_ns", c.rtt_ns}});
  }
  return {{"name", p.name}, {"file", p.file}, {"clock", clock}};
}

// One timed event as the merged trace writes it: in its process's lane, at
// its time from the timeline's first event.
std::string EventLine(const Timeline::Timed& t, const ProcessTrace& p, int64_t base) {
  json e = *t.event;
  const int lane = Lane(t.proc);
  e["pid"] = lane;
  if (e["ph"] == "X") {
    // Both ends moved by the offset at their own time: the mapping is
    // monotonic, so spans of a thread still nest after it.
    const int64_t local_end = Nanos(e["ts"]) + Nanos(e["dur"]);
    const int64_t end = local_end + p.Offset(local_end);
    e["dur"] = json::parse(Micros(std::max<int64_t>(0, end - t.ts)));
  }
  // Async ids are a process's own: made unique across the merged trace.
  if (e.contains("id")) e["id"] = (static_cast<int64_t>(lane) << 40) + e["id"].get<int64_t>();
  e.erase("ts");
  std::string line = e.dump();
  line.insert(line.size() - 1, ",\"ts\":" + Micros(t.ts - base));
  return line;
}

Status Merge(const std::string& dir, const std::string& out_path) {
  std::vector<std::string> files = Glob(JoinPath(dir, "*.trace.json"));
  if (files.empty()) {
    return Status::InvalidArgument(dir + ": no *.trace.json files (a job with log.trace: DIR writes them)");
  }
  HERD_RETURN_IF_ERROR(CheckOutReplaceable(out_path));
  HERD_ASSIGN_OR_RETURN(const std::vector<ProcessTrace> procs, ReadProcessTraces(files));
  const Timeline timeline = OnCoordinatorClock(procs);

  nlohmann::ordered_json processes = nlohmann::ordered_json::array();  // what the merge prints of each
  nlohmann::ordered_json other = {{"herd_merged", 1},
                                  {"clock", "the coordinator's monotonic clock, from the first event"}};
  std::string body;
  for (size_t i = 0; i < procs.size(); ++i) {
    body += LaneHeader(procs[i], Lane(i));
    other["processes"].push_back(ClockRecord(procs[i]));
    processes.push_back(ProcessReport(procs[i]));
  }
  for (const Timeline::Timed& t : timeline.events) body += EventLine(t, procs[t.proc], timeline.base) + ",\n";
  if (!body.empty()) body.resize(body.size() - 2);  // the last separator
  const std::string out = std::string("{\"otherData\":") + other.dump() +
                          ",\n\"displayTimeUnit\":\"ms\",\n\"traceEvents\":[\n" + body + "\n]}\n";
  // --out's head must be the magic: otherData's first key is herd_merged.
  HERD_RETURN_IF_ERROR(WriteFileAtomic(out_path, out).WithContext("--out: "));
  const std::vector<Timeline::Timed>& timed = timeline.events;
  nlohmann::ordered_json result = {{"out", out_path},
                                   {"events", timed.size()},
                                   {"span_s", timed.empty() ? 0.0 : (timed.back().ts - timeline.base) / 1e9}};
  result["processes"] = std::move(processes);
  std::printf("%s\n", result.dump().c_str());
  return Status::OK();
}

}  // namespace

int RunTrace(int argc, char** argv) {
  Args args({"out"}, {});
  Status st = args.Parse(argc, argv);
  if (!st.ok()) return ReportError(st.WithContext("trace: "));
  const auto& pos = args.positional();
  if (pos.size() != 2 || pos[0] != "merge" || args.Get("out").empty()) {
    return ReportError(Status::InvalidArgument("usage: herd trace merge DIR --out trace.json"));
  }
  st = Merge(pos[1], args.Get("out"));
  if (!st.ok()) return ReportError(st.WithContext("trace merge: "));
  return 0;
}

}  // namespace herd::tools
