"""Tensor and context parallelism against data parallelism on the same
processes: tokens/s of DDP (W workers), one tensor-parallel group of W
(T = W) and one context-parallel group of W (C = W), the same global batch
(the groups take it as W micro-batches), on loopback (`herd launch` on
this host) and on emulated links (bench/lab_compare.py's nodes:
scripts/netlab.py namespaces, tbf-capped links, UCX over TCP), with the
share of the step each collective took from the workers' step traces
(log.trace).

For each link and mode, one JSON line:

  {"bench": "parallel_compare", "link": "10gbit", "mode": "context", "workers": 2, "tokens_per_s": ..,
   "step_s": .., "vs_ddp": .., "blocking_share": {"context-parallel gather": .., ...},
   "in_flight_share": {"all-reduce": ..}}

`blocking_share`: the step's share spent in each collective span on a
worker's own thread (it waits: the tensor group's sums, the context
group's gathers, the norm exchange), the median over the workers and the
steps after --warmup; `in_flight_share`: the background collectives
(DDP's gradient all-reduce, overlapped with backward), the time from
issue to completion over the step (overlapping ones counted once). The DDP anchor runs in the same
invocation, on the same links, interleaved with the others.

    sudo /usr/bin/python3 bench/parallel_compare.py [--build build] [--workers 2]
        [--links loopback,10gbit] [--steps 8] [--warmup 3] [--set path=value ...]
"""
import argparse
import collections
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import lab_compare  # noqa: E402

MODES = ("allreduce", "tensor", "context")


def covered(items, begin, end):
    """Per name, how long in [begin, end) at least one of its (name, b, e)
    intervals was open (overlapping collectives in flight counted once)."""
    out = {}
    for name in {n for n, _, _ in items}:
        spans = sorted((max(b, begin), min(e, end)) for n, b, e in items if n == name and e > begin and b < end)
        total, reach = 0, begin
        for b, e in spans:
            if e > reach:
                total += e - max(b, reach)
                reach = e
        if total > 0:
            out[name] = total
    return out


def trace_shares(trace_dir, warmup):
    """Per worker and step after `warmup`: each collective's blocking time
    and in-flight time over the step's; the medians over them."""
    blocking, in_flight = collections.defaultdict(list), collections.defaultdict(list)
    for path in sorted(glob.glob(os.path.join(trace_dir, "worker_*.trace.json"))):
        events = lab_compare.trace_events(path)
        steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") == "step"
                       and e.get("name") == "step" and e.get("ph") == "X")[warmup:]
        spans = [(e["name"], e["ts"], e["ts"] + e["dur"]) for e in events
                 if e.get("cat") == "collective" and e.get("ph") == "X"]
        opened, pairs = {}, []
        for e in events:
            if e.get("cat") == "collective" and e.get("ph") in ("b", "e"):
                k = (e["name"], e.get("id"), e.get("tid"))
                if e["ph"] == "b":
                    opened[k] = e["ts"]
                elif k in opened:
                    pairs.append((e["name"], opened.pop(k), e["ts"]))
        for begin, end in steps:
            for out, items in ((blocking, spans), (in_flight, pairs)):
                for name, t in covered(items, begin, end).items():
                    out[name].append(t / (end - begin))
    return ({k: round(statistics.median(v), 3) for k, v in sorted(blocking.items())},
            {k: round(statistics.median(v), 3) for k, v in sorted(in_flight.items())})


def run_loopback(args, mode, scratch):
    workdir = os.path.join(scratch, f"{mode}_loopback")
    os.makedirs(workdir)
    sets = lab_compare.job_sets(args, mode, workdir, args.steps) + [f"log.trace={workdir}/trace"]
    sets = [s for s in sets if not s.startswith(("cluster.coordinator=", "cluster.heartbeat_timeout_s="))]
    p = subprocess.run(lab_compare.with_sets([os.path.join(args.build, "herd"), "launch", args.config], sets),
                       capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    if p.returncode != 0:
        raise SystemExit(f"{mode} on loopback: herd launch failed ({p.returncode})\n{p.stderr[-2000:]}")
    rows = lab_compare.metrics_rows(workdir)
    return workdir, {"step_s": round(statistics.median(lab_compare.step_times(rows, args.warmup)), 4),
                     "tokens_per_s": round(statistics.median(r["tokens_per_s"] for r in rows[args.warmup + 1:]), 1)}


def run_lab(args, mode, rate, scratch):
    workdir = os.path.join(scratch, f"{mode}_{rate}")
    saved = args.set
    args.set = saved + [f"log.trace={workdir}/trace"]
    try:
        r = lab_compare.run_mode(args, mode, rate, scratch)
    finally:
        args.set = saved
    return workdir, {"step_s": r["step_s"], "tokens_per_s": r["tokens_per_s"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--config", default=os.path.join(ROOT, "configs/llama20m.textproto"))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--links", default="loopback,10gbit")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--set", action="append", default=[])
    args = ap.parse_args()
    args.set = lab_compare.with_defaults(["train.batch_size=1", "train.seq_len=512", "optimizer.clip_norm=1"],
                                         args.set)
    args.config = os.path.abspath(args.config)
    scratch = tempfile.mkdtemp(prefix="herd_parallel_compare_")
    subprocess.run([os.path.join(args.build, "herd"), "prepare", os.path.join(ROOT, "README.md"),
                    os.path.join(ROOT, "docs", "modes.md"), "--out", os.path.join(scratch, "train.bin")],
                   check=True, capture_output=True)
    for link in args.links.split(","):
        ddp = None
        for mode in MODES:
            workdir, r = (run_loopback(args, mode, scratch) if link == "loopback"
                          else run_lab(args, mode, link, scratch))
            blocking, in_flight = trace_shares(os.path.join(workdir, "trace"), args.warmup)
            if mode == "allreduce":
                ddp = r["tokens_per_s"]
            print(json.dumps({"bench": "parallel_compare", "link": link, "mode": mode, "workers": args.workers,
                              "sets": args.set, **r, "vs_ddp": round(r["tokens_per_s"] / ddp, 3),
                              "blocking_share": blocking, "in_flight_share": in_flight}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
