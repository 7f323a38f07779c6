"""What log.trace costs a parameter-server job, and where one traced step's
time goes: the ~20M config (configs/llama20m.textproto) in PS mode (S=2
W=2 by default) run without a trace (the anchor) and with one, in turn
--repeat times (A B A B ...), the median of each reported.

Then the last traced run's files are merged (herd trace merge) and one
step in the middle of the run is taken apart: for each process's threads
that traced anything, the time of each kind of span within the step's
window (worker 0's step span, start to the next one's start), counted
exclusively (a layer's time is not also its forward's), and what no span
covers.

One JSON line per figure:
  {"bench": "trace_overhead", "variant": "off"|"on", "step_s": ..., "vs_off": ...}
  {"bench": "trace_step", "process": "worker 0", "thread": "step loop", "step": k, "window_ms": ...,
   "ms": {"layer forward": ..., ...}}

    python3 bench/trace_overhead.py [--build build] [--steps 12] [--warmup 2]
        [--layout 2x2] [--repeat 3] [--keep DIR] [--set path=value ...]

Use Debian's /usr/bin/python3.
"""
import collections
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from ps_throughput import alternate, ps_layout, timing_args  # noqa: E402  (one way to launch and time runs)


def exclusive_ms(spans, t0, t1):
    """Per span name, the time within [t0, t1) that the span covers and none
    of its children (spans of one thread nest); "(no span)" the rest."""
    out = collections.Counter()
    stack = []  # (end, name, children's clipped time)

    def clip(a, b):
        return max(0.0, min(b, t1) - max(a, t0))

    def pop():
        end, name, start, children = stack.pop()
        own = clip(start, end) - children
        out[name] += own
        if stack:
            stack[-1][3] += clip(start, end)

    for e in sorted(spans, key=lambda e: (e["ts"], -e["dur"])):
        while stack and (stack[-1][0] <= e["ts"] or stack[-1][0] < e["ts"] + e["dur"]):
            pop()
        stack.append([e["ts"] + e["dur"], e["name"], e["ts"], 0.0])
    while stack:
        pop()
    covered = sum(out.values())
    out["(no span)"] = (t1 - t0) - covered
    return {k: round(v / 1000, 2) for k, v in sorted(out.items(), key=lambda kv: -kv[1]) if v > 0.5}


def breakdown(merged, step):
    events = merged["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
               if e["ph"] == "M" and e["name"] == "thread_name"}
    worker0 = next(pid for pid, n in names.items() if n == "worker 0")
    starts = {e["args"]["step"]: e["ts"] for e in events
              if e["ph"] == "X" and e["name"] == "step" and e["pid"] == worker0}
    t0, t1 = starts[step], starts[step + 1]
    by_thread = collections.defaultdict(list)
    for e in events:
        if e["ph"] == "X" and e["ts"] < t1 and e["ts"] + e["dur"] > t0:
            by_thread[(e["pid"], e["tid"])].append(e)
    for (pid, tid), spans in sorted(by_thread.items()):
        print(json.dumps({"bench": "trace_step", "process": names[pid], "thread": threads.get((pid, tid), str(tid)),
                          "step": step, "window_ms": round((t1 - t0) / 1000, 2),
                          "ms": exclusive_ms(spans, t0, t1)}), flush=True)


def main():
    ap = timing_args(steps=12, warmup=2, layout="2x2")
    ap.add_argument("--keep", help="leave the last traced run's files and merged trace here")
    a = ap.parse_args()
    herd = os.path.join(a.build, "herd")
    base = ps_layout(a.layout, a.global_batch) + a.set
    workdir = tempfile.mkdtemp(prefix="herd_bench_trace_")
    trace_dir = os.path.join(workdir, "trace")
    variants = [("off", base + ["log.trace="]), ("on", base + [f"log.trace={trace_dir}"])]
    try:
        times = alternate(herd, a.config, variants, workdir, a.steps, a.warmup, a.repeat,
                          before=lambda name: shutil.rmtree(trace_dir, ignore_errors=True))
        anchor = statistics.median(times["off"])
        for name, _ in variants:
            step_s = statistics.median(times[name])
            print(json.dumps({"bench": "trace_overhead", "variant": name, "layout": a.layout,
                              "measured_steps": a.steps - a.warmup, "runs": a.repeat, "step_s": round(step_s, 4),
                              "step_s_runs": [round(t, 4) for t in times[name]],
                              "vs_off": round(step_s / anchor, 4)}), flush=True)
        merged_path = os.path.join(workdir, "merged.json")
        p = subprocess.run([herd, "trace", "merge", trace_dir, "--out", merged_path], capture_output=True, text=True)
        if p.returncode != 0:
            raise SystemExit(p.stderr)
        with open(merged_path) as f:
            breakdown(json.load(f), (a.warmup + a.steps) // 2)
        if a.keep:
            os.makedirs(a.keep, exist_ok=True)
            shutil.copytree(trace_dir, os.path.join(a.keep, "trace"), dirs_exist_ok=True)
            shutil.copy(merged_path, os.path.join(a.keep, "merged.json"))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
