"""Parameter-server mode against one process on the ~20M config
(configs/llama20m.textproto), on this machine over loopback: step time,
global tokens/s and the share of step time the worker spent waiting on
pushes and pulls. One JSON line per layout; the single process (the
anchor) runs in the same invocation, on the same global batch and the
same cores.

    python3 bench/ps_throughput.py [--build build] [--steps 12] [--warmup 2]
        [--layouts single,1x2,2x2] [--set path=value ...]

Layout SxW = S servers, W workers; each worker gets global-batch/W
sequences and cores/W threads, one process all of both. UCX picks the transport; set
UCX_TLS (e.g. tcp or sm) to choose. Use Debian's /usr/bin/python3.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def run(herd, config, sets, workdir, steps):
    metrics = os.path.join(workdir, "metrics.jsonl")
    cmd = [herd, "launch", config, "--set", f"train.steps={steps}", "--set", "log.every=1",
           "--set", f"log.metrics={metrics}", "--set", "log.sample_tokens=0", "--set", "checkpoint.dir=",
           "--set", "log.eval_every=0", "--set", "data.val="]
    for s in sets:
        cmd += ["--set", s]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if p.returncode != 0:
        sys.stderr.write(p.stdout[-3000:] + p.stderr[-3000:])
        raise SystemExit(f"herd launch failed ({p.returncode}): {' '.join(cmd)}")
    with open(metrics) as f:
        return [json.loads(line) for line in f]


def word_corpus(herd, work, lines):
    """WORK/train.bin: `lines` lines of words, byte-level tokens (ids below
    any vocabulary of 256 or more), prepared by herd; its path."""
    corpus = os.path.join(work, "corpus.txt")
    with open(corpus, "w") as f:
        words = "the quick brown fox jumps over a lazy dog while seven wizards quietly judge".split()
        for i in range(lines):
            f.write(" ".join(words[(i * 7 + j * 3) % len(words)] for j in range(9)) + ".\n")
    data = os.path.join(work, "train.bin")
    subprocess.run([herd, "prepare", corpus, "--out", data], check=True, capture_output=True)
    return data


def ps_layout(layout, global_batch):
    """--set lines for a parameter-server job of layout "SxW" (S servers, W
    workers) at `global_batch` sequences a step."""
    servers, workers = (int(x) for x in layout.split("x"))
    return ["cluster.sync=PARAMETER_SERVER", f"cluster.servers={servers}", f"cluster.workers={workers}",
            f"train.batch_size={global_batch // workers}"]


def timing_args(steps, warmup, layout=None, global_batch=8):
    """The arguments every A/B timing benchmark takes: --build, --config,
    --steps, --warmup, --repeat, --set and, with a default `layout`, a
    parameter-server job's --layout and --global-batch (ps_layout)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--config", default="configs/llama20m.textproto")
    ap.add_argument("--steps", type=int, default=steps)
    ap.add_argument("--warmup", type=int, default=warmup)
    if layout:
        ap.add_argument("--layout", default=layout, help="SxW: servers x workers")
        ap.add_argument("--global-batch", type=int, default=global_batch, help="sequences per step over all workers")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--set", action="append", default=[])
    return ap


def plan(herd, config, sets):
    """`herd plan CONFIG --json` with `sets` (path=value): the plan."""
    cmd = [herd, "plan", config, "--json"] + [x for s in sets for x in ("--set", s)]
    return json.loads(subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True).stdout)


def alternate(herd, config, variants, workdir, steps, warmup, repeat, before=None, after=None):
    """Runs each (name, sets) of `variants` in turn, `repeat` times (A B C A B
    C ...), so that drift in the machine's speed touches every variant
    alike; returns each name's seconds per step after `warmup`, one per
    run. `before(name)` and `after(name)`, when given, run around each run."""
    times = {name: [] for name, _ in variants}
    for _ in range(repeat):
        for name, sets in variants:
            if before:
                before(name)
            rows = run(herd, config, sets, workdir, steps)
            if after:
                after(name)
            by_step = {r["step"]: r["elapsed_s"] for r in rows}
            times[name].append((by_step[steps] - by_step[warmup]) / (steps - warmup))
    return times


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--config", default="configs/llama20m.textproto")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--layouts", default="single,1x2,2x2")
    ap.add_argument("--global-batch", type=int, default=16, help="sequences per step over all workers")
    ap.add_argument("--set", action="append", default=[])
    a = ap.parse_args()
    herd = os.path.join(a.build, "herd")
    global_batch = a.global_batch
    workdir = tempfile.mkdtemp(prefix="herd_bench_ps_")
    try:
        for layout in a.layouts.split(","):
            if layout == "single":
                sets = [f"train.batch_size={global_batch}", "cluster.sync=NONE", "cluster.servers=0",
                        "cluster.workers=1"]
                servers, workers = 0, 1
            else:
                servers, workers = (int(x) for x in layout.split("x"))
                sets = ps_layout(layout, global_batch)
            m = run(herd, a.config, a.set + sets, workdir, a.steps)[a.warmup:]
            step_s = [b["elapsed_s"] - p["elapsed_s"] for p, b in zip(m, m[1:])]
            median = statistics.median(step_s)
            wait = [x["network_wait"] for x in m if "network_wait" in x]
            print(json.dumps({
                "bench": "ps_step", "config": os.path.basename(a.config), "layout": layout, "servers": servers,
                "workers": workers, "global_batch": global_batch, "steps_measured": len(step_s),
                "step_s_median": round(median, 4),
                "tokens_per_s": round(statistics.median(x["tokens_per_s"] for x in m), 1),
                "network_wait_share": round(statistics.median(wait), 3) if wait else 0.0,
                "ucx_tls": os.environ.get("UCX_TLS", "auto")}), flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
