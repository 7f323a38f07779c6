"""What checkpoints cost a parameter-server job's training: the ~20M
config (configs/llama20m.textproto) in PS mode on this machine, run three
times in one invocation — without checkpoints (the anchor), with a
checkpoint every K steps written in place (checkpoint.background: false:
every process waits for it), and the same written in the background
(servers write a snapshot of their range while training goes on).

One JSON line per variant: the mean step time over the measured steps
(checkpoint steps included: the mean is what a run pays), its ratio to
the anchor, and how many checkpoints were written. The variants run in
turn --repeat times (A B C A B C ...), and the median of each is
reported, so that a machine whose speed drifts affects all alike.

    python3 bench/checkpoint_overhead.py [--build build] [--steps 40] [--warmup 4]
        [--every 5] [--layout 2x2] [--repeat 3] [--set path=value ...]

Use Debian's /usr/bin/python3.
"""
import glob
import json
import os
import shutil
import statistics
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from ps_throughput import alternate, ps_layout, timing_args  # noqa: E402  (one way to launch and time runs)


def main():
    ap = timing_args(steps=40, warmup=4, layout="2x2")
    ap.add_argument("--every", type=int, default=5)
    a = ap.parse_args()
    herd = os.path.join(a.build, "herd")
    base = ps_layout(a.layout, a.global_batch) + a.set
    workdir = tempfile.mkdtemp(prefix="herd_bench_ckpt_")
    ckpt = os.path.join(workdir, "ckpt")
    variants = [
        ("no_checkpoints", base + ["checkpoint.dir="]),
        ("in_place", base + [f"checkpoint.dir={ckpt}", f"checkpoint.every={a.every}", "checkpoint.background=false"]),
        ("background", base + [f"checkpoint.dir={ckpt}", f"checkpoint.every={a.every}", "checkpoint.background=true"]),
    ]
    measured = a.steps - a.warmup
    written = {}
    try:
        times = alternate(herd, a.config, variants, workdir, a.steps, a.warmup, a.repeat,
                          before=lambda name: shutil.rmtree(ckpt, ignore_errors=True),
                          after=lambda name: written.update({name: len(glob.glob(os.path.join(ckpt, "step_*")))}))
        anchor = statistics.median(times["no_checkpoints"])
        for name, _ in variants:
            step_s = statistics.median(times[name])
            print(json.dumps({"bench": "checkpoint_overhead", "variant": name, "layout": a.layout,
                              "every": a.every if name != "no_checkpoints" else 0, "checkpoints": written[name],
                              "measured_steps": measured, "runs": a.repeat, "step_s": round(step_s, 4),
                              "step_s_runs": [round(t, 4) for t in times[name]],
                              "vs_no_checkpoints": round(step_s / anchor, 4)}), flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
