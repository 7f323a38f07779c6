"""What streamed weights (cluster.stream_weights) cost a parameter-server
job, and how much of their pull traffic hides behind compute: the ~20M
config (configs/llama20m.textproto) in PS mode (S=2 W=2 by default) with
every weight held (the anchor) and streamed with 0, 1 and 2 layers of
prefetch, in turn --repeat times (A B C D A B C D ...), the median of each
reported next to the worker's planned memory.

Then one traced run of each variant: in a step in the middle of the run,
for worker 0, how many bucket pulls there were, the time pulls were in
flight (the union of their spans), the part of it the step loop spent
waiting for weights, and so the share of pull time overlapped with
compute.

One JSON line per figure:
  {"bench": "stream_weights", "variant": "whole"|"prefetch 1"|..., "step_s": ..., "vs_whole": ...,
   "worker_planned_bytes": ...}
  {"bench": "stream_overlap", "variant": "prefetch 1", "pulls": ..., "pull_ms": ..., "waited_ms": ...,
   "overlapped": ...}

    python3 bench/stream_cost.py [--build build] [--steps 10] [--warmup 2]
        [--layout 2x2] [--repeat 3] [--set path=value ...]

Use Debian's /usr/bin/python3.
"""
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
from ps_throughput import alternate, plan, ps_layout, run, timing_args  # noqa: E402  (one way to launch and time runs)


def union_ms(intervals, t0, t1):
    """Milliseconds of [t0, t1) that the (start, end) intervals cover."""
    total, reach = 0.0, t0
    for a, b in sorted(intervals):
        a, b = max(a, reach), min(b, t1)
        if b > a:
            total += b - a
            reach = b
    return total / 1000


def overlap(merged, step):
    events = merged["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    worker0 = next(pid for pid, n in names.items() if n == "worker 0")
    mine = [e for e in events if e.get("pid") == worker0]
    starts = {e["args"]["step"]: e["ts"] for e in mine if e["ph"] == "X" and e["name"] == "step"}
    t0, t1 = starts[step], starts[step + 1]
    begins = {e["id"]: e for e in mine if e["ph"] == "b" and e["name"] == "pull weights"}
    pulls = [(begins[e["id"]]["ts"], e["ts"]) for e in mine
             if e["ph"] == "e" and e["name"] == "pull weights" and e["id"] in begins]
    pulls = [(a, b) for a, b in pulls if b > t0 and a < t1]
    waits = [(e["ts"], e["ts"] + e["dur"]) for e in mine if e["ph"] == "X" and e["name"] == "wait for weights"]
    pull_ms = union_ms(pulls, t0, t1)
    # Time pulls were in flight while the step loop waited for them.
    waited_ms = union_ms([(max(a, c), min(b, d)) for a, b in pulls for c, d in waits if min(b, d) > max(a, c)], t0, t1)
    return {"step": step, "window_ms": round((t1 - t0) / 1000, 2), "pulls": len(pulls),
            "pull_ms": round(pull_ms, 2), "waited_ms": round(waited_ms, 2),
            "overlapped": round(1 - waited_ms / pull_ms, 4) if pull_ms > 0 else None}


def main():
    a = timing_args(steps=10, warmup=2, layout="2x2").parse_args()
    herd = os.path.join(a.build, "herd")
    base = ps_layout(a.layout, a.global_batch) + a.set
    variants = [("whole", base + ["cluster.stream_weights=false"])] + [
        (f"prefetch {k}", base + ["cluster.stream_weights=true", f"cluster.stream_prefetch_layers={k}"])
        for k in (0, 1, 2)]
    workdir = tempfile.mkdtemp(prefix="herd_bench_stream_")
    try:
        planned = {}
        for name, sets in variants:
            planned[name] = next(x["total"] for x in plan(herd, a.config, sets)["processes"] if x["role"] == "worker")
        times = alternate(herd, a.config, variants, workdir, a.steps, a.warmup, a.repeat)
        anchor = statistics.median(times["whole"])
        for name, _ in variants:
            step_s = statistics.median(times[name])
            print(json.dumps({"bench": "stream_weights", "variant": name, "layout": a.layout,
                              "measured_steps": a.steps - a.warmup, "runs": a.repeat, "step_s": round(step_s, 4),
                              "step_s_runs": [round(t, 4) for t in times[name]],
                              "vs_whole": round(step_s / anchor, 4), "worker_planned_bytes": planned[name],
                              "planned_vs_whole": round(planned[name] / planned["whole"], 4)}), flush=True)
        trace_dir = os.path.join(workdir, "trace")
        for name, sets in variants:
            shutil.rmtree(trace_dir, ignore_errors=True)
            run(herd, a.config, sets + [f"log.trace={trace_dir}"], workdir, a.steps)
            merged_path = os.path.join(workdir, "merged.json")
            p = subprocess.run([herd, "trace", "merge", trace_dir, "--out", merged_path], capture_output=True,
                               text=True)
            if p.returncode != 0:
                raise SystemExit(p.stderr)
            with open(merged_path) as f:
                o = overlap(json.load(f), (a.warmup + a.steps) // 2)
            print(json.dumps({"bench": "stream_overlap", "variant": name, "layout": a.layout, **o}), flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
