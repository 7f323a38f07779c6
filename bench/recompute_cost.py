"""What activation recomputation (train.recompute) costs and saves: the
~20M config (configs/llama20m.textproto: d512, 8 layers, batch 8 x 256
tokens) in one process under NONE, ATTENTION and FULL, in turn --repeat
times (A B C A B C ...), the median of each reported next to the memory
`herd plan` gives the process (its activations are what differs).

One JSON line per setting:
  {"bench": "recompute", "recompute": "FULL", "step_s": ..., "vs_none": ..., "planned_bytes": ...,
   "planned_vs_none": ...}

    python3 bench/recompute_cost.py [--build build] [--steps 8] [--warmup 2] [--repeat 3] [--set path=value ...]

Use Debian's /usr/bin/python3.
"""
import json
import os
import statistics
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from ps_throughput import alternate, plan, timing_args  # noqa: E402  (one way to launch and time runs)

SETTINGS = ("NONE", "ATTENTION", "FULL")


def main():
    a = timing_args(steps=8, warmup=2).parse_args()
    herd = os.path.join(a.build, "herd")
    workdir = tempfile.mkdtemp(prefix="herd_bench_recompute_")
    planned = {}
    for s in SETTINGS:
        planned[s] = plan(herd, a.config, [f"train.recompute={s}", *a.set])["processes"][0]["total"]
    times = alternate(herd, a.config, [(s, [*a.set, f"train.recompute={s}"]) for s in SETTINGS], workdir, a.steps,
                      a.warmup, a.repeat)
    anchor = statistics.median(times["NONE"])
    for s in SETTINGS:
        step_s = statistics.median(times[s])
        print(json.dumps({"bench": "recompute", "config": os.path.basename(a.config), "recompute": s,
                          "measured_steps": a.steps - a.warmup, "runs": a.repeat, "step_s": round(step_s, 4),
                          "step_s_runs": [round(t, 4) for t in times[s]], "vs_none": round(step_s / anchor, 4),
                          "planned_bytes": planned[s], "planned_vs_none": round(planned[s] / planned["NONE"], 4)}),
              flush=True)


if __name__ == "__main__":
    main()
