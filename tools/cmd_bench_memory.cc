// herd bench memory [--mb M] [--threads N] [--reps R]
//   This machine's memory bandwidth, STREAM's way: copy (a = b) and triad
//   (a = b + s * c) over arrays of M MiB each (default 256: far past any
//   cache), on N OpenMP threads (default: every core), each page first
//   touched by the thread that later streams it; the best of R passes
//   (STREAM reports the best). One JSON line:
//     {"bench": "memory", "mb": ..., "threads": ..., "copy_gbs": ..., "triad_gbs": ...}
//   GB/s = 1e9 bytes a second, counting what STREAM counts: copy reads one
//   array and writes one (2 arrays' bytes), triad reads two and writes one
//   (3). bench/ps_datapath.py applies them to the bytes a parameter
//   server's step must move: its floor.
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstdint>
#include <memory>
#include <thread>

#include "common/clock.h"
#include "common/logging.h"
#include "tools/args.h"
#include "tools/commands.h"

namespace herd::tools {
namespace {

struct Arrays {
  std::unique_ptr<float[]> a, b, c;
  int64_t n = 0;
};

// Each thread first-touches the part it streams later (static schedule),
// so that the pages lie near it.
Arrays Allocate(int64_t n) {
  Arrays x{std::unique_ptr<float[]>(new float[n]), std::unique_ptr<float[]>(new float[n]),
           std::unique_ptr<float[]>(new float[n]), n};
  float *a = x.a.get(), *b = x.b.get(), *c = x.c.get();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    a[i] = 0.0f;
    b[i] = 1.0f;
    c[i] = 2.0f;
  }
  return x;
}

double CopySeconds(Arrays& x) {
  float* a = x.a.get();
  const float* b = x.b.get();
  const int64_t n = x.n;
  Stopwatch clock;
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) a[i] = b[i];
  return clock.Seconds();
}

double TriadSeconds(Arrays& x, float s) {
  float* a = x.a.get();
  const float *b = x.b.get(), *c = x.c.get();
  const int64_t n = x.n;
  Stopwatch clock;
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) a[i] = b[i] + s * c[i];
  return clock.Seconds();
}

}  // namespace

int RunBenchMemory(int argc, char** argv) {
  Args args({"mb", "threads", "reps"}, {});
  Status st = args.Parse(argc, argv);
  if (!st.ok()) return ReportError(st.WithContext("bench memory: "));
  if (!args.positional().empty()) {
    return ReportError(Status::InvalidArgument("usage: herd bench memory [--mb M] [--threads N] [--reps R]"));
  }
  auto mb = args.GetInt("mb", 256, 1);
  auto threads = args.GetInt("threads", std::max(1u, std::thread::hardware_concurrency()), 1);
  auto reps = args.GetInt("reps", 5, 1);
  for (const auto* v : {&mb, &threads, &reps}) {
    if (!v->ok()) return ReportError(v->status().WithContext("bench memory: "));
  }
  omp_set_num_threads(static_cast<int>(*threads));
  const int64_t n = *mb * (int64_t{1} << 20) / static_cast<int64_t>(sizeof(float));
  Arrays x = Allocate(n);
  double copy = 1e30, triad = 1e30;
  for (long long r = 0; r < *reps; ++r) {
    copy = std::min(copy, CopySeconds(x));
    triad = std::min(triad, TriadSeconds(x, 3.0f));
  }
  const double bytes = static_cast<double>(n) * sizeof(float);
  std::printf("{\"bench\": \"memory\", \"mb\": %lld, \"threads\": %lld, \"copy_gbs\": %.2f, \"triad_gbs\": %.2f}\n",
              *mb, *threads, 2 * bytes / copy / 1e9, 3 * bytes / triad / 1e9);
  return 0;
}

}  // namespace herd::tools
