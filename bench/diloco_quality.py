"""Regions' quality (cluster.diloco) against synchronous training at equal
tokens: the ~20M shape (configs/llama20m.textproto's model) on the
byte-level fortunes corpus, the same global batch for every job (W
workers x 1 x 128 tokens), the same steps and learning-rate schedule;
R regions x H inner steps between outer steps x each outer optimizer
setting (--outer LR/MOMENTUM: DiLoCo's Nesterov; 0.7/0.9 is DiLoCo's and
herd's default, 1/0 the plain mean of the regions' weights), against
synchronous parameter servers and DDP run in the same invocation (or,
--anchors-from, read from an earlier invocation's lines: every run is
bitwise the same on a rerun, so these are the same figures).

One JSON line per job:

  {"bench": "diloco_quality", "job": "diloco", "regions": 2, "every": 10, "outer_lr": 0.7, "outer_momentum": 0.9,
   "steps": 400, "tokens": ..,
   "held_out_loss": .., "vs_sync_ps": .., "vs_ddp": .., "curve": [[step, held_out_loss], ...], "wall_s": ..}

`held_out_loss`: the mean loss over --eval-batches batches of the held-out
split after the last step (every region's weights are the same there: the
last step takes every fragment's outer step); `curve`: the same every
--eval-every steps, of region 0's weights (between outer steps, the inner
weights of one region); `vs_*`: the ratio to the anchor's final held-out
loss (1.02: 2% above). A last line names the best DiLoCo job.

    /usr/bin/python3 bench/diloco_quality.py [--build build] [--steps 400] [--workers 4]
        [--regions 2,4] [--every 10,50,100] [--outer 0.7/0.9,1/0] [--eval-every 50] [--eval-batches 16]
        [--anchors-from FILE] [--set path=value ...]

Takes its time: each job is --steps steps of the ~20M shape on this host's
cores (about 1 s a step on 2 cores).
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def model_block():
    text = open(os.path.join(ROOT, "configs", "llama20m.textproto")).read()
    return re.search(r"^model \{.*?^\}", text, re.S | re.M).group(0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--servers", type=int, default=4)
    ap.add_argument("--regions", default="2,4")
    ap.add_argument("--every", default="10,50,100")
    ap.add_argument("--outer", default="0.7/0.9,1/0", help="outer LR/MOMENTUM settings, comma-separated")
    ap.add_argument("--anchors-from", help="this benchmark's earlier output: its sync_ps and ddp lines")
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--eval-batches", type=int, default=16)
    ap.add_argument("--set", action="append", default=[], help="path=value for every job (herd launch --set)")
    args = ap.parse_args()
    herd = os.path.join(args.build, "herd")
    scratch = tempfile.mkdtemp(prefix="diloco_quality_")
    corpus = sorted(os.path.join("/usr/share/games/fortunes", f) for f in os.listdir("/usr/share/games/fortunes"))
    subprocess.run([herd, "prepare", *corpus, "--out", os.path.join(scratch, "train.bin"), "--val-out",
                    os.path.join(scratch, "val.bin"), "--val-fraction", "0.05"], check=True, capture_output=True)

    def run(name, cluster):
        metrics = os.path.join(scratch, name + ".jsonl")
        config = os.path.join(scratch, name + ".textproto")
        with open(config, "w") as f:
            f.write(model_block() + f"""
train {{ steps: {args.steps} batch_size: 1 seq_len: 128 seed: 7 }}
optimizer {{ lr: 1e-3 min_lr: 1e-4 warmup_steps: 20 weight_decay: 0.1 clip_norm: 1.0 }}
data {{ train: "train.bin" val: "val.bin" }}
log {{ every: 10 metrics: "{name}.jsonl" sample_tokens: 0 eval_every: {args.eval_every}
      eval_batches: {args.eval_batches} }}
{cluster}
""")
        sets = [x for s in args.set for x in ("--set", s)]
        start = time.time()
        p = subprocess.run([herd, "launch", config, *sets], cwd=scratch, capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f"diloco_quality: {name}: herd launch exited {p.returncode}: {p.stderr.strip()[-2000:]}")
        lines = [json.loads(l) for l in open(metrics)]
        curve = [[m["step"], m["val_loss"]] for m in lines if "val_loss" in m]
        return {"steps": args.steps, "tokens": args.steps * args.workers * 128, "held_out_loss": curve[-1][1],
                "curve": curve, "wall_s": round(time.time() - start, 1)}

    W, S = args.workers, args.servers
    if args.anchors_from:
        lines = [json.loads(line) for line in open(args.anchors_from)]
        anchors = {d["job"]: {k: v for k, v in d.items() if k not in ("bench", "job")}
                   for d in lines if d.get("job") in ("sync_ps", "ddp") and d["steps"] == args.steps}
        if sorted(anchors) != ["ddp", "sync_ps"]:
            sys.exit(f"diloco_quality: {args.anchors_from} has no sync_ps and ddp lines of {args.steps} steps")
        for job, r in anchors.items():
            print(json.dumps({"bench": "diloco_quality", "job": job, "from": args.anchors_from, **r}), flush=True)
    else:
        anchors = {"sync_ps": run("sync_ps", f"cluster {{ sync: PARAMETER_SERVER servers: {S} workers: {W} }}"),
                   "ddp": run("ddp", f"cluster {{ sync: ALLREDUCE workers: {W} }}")}
        for job, r in anchors.items():
            print(json.dumps({"bench": "diloco_quality", "job": job, **r}), flush=True)
    best = None
    outers = [tuple(float(x) for x in o.split("/")) for o in args.outer.split(",")]
    for R in (int(x) for x in args.regions.split(",")):
        for H in (int(x) for x in args.every.split(",")):
            for lr, mu in outers:
                r = run(f"r{R}_h{H}_{lr}_{mu}", f"cluster {{ sync: PARAMETER_SERVER servers: {S} workers: {W} "
                                                f"diloco {{ regions: {R} every: {H} outer_lr: {lr} "
                                                f"outer_momentum: {mu} }} }}")
                r["vs_sync_ps"] = round(r["held_out_loss"] / anchors["sync_ps"]["held_out_loss"], 4)
                r["vs_ddp"] = round(r["held_out_loss"] / anchors["ddp"]["held_out_loss"], 4)
                setting = {"regions": R, "every": H, "outer_lr": lr, "outer_momentum": mu}
                print(json.dumps({"bench": "diloco_quality", "job": "diloco", **setting, **r}), flush=True)
                if best is None or r["held_out_loss"] < best[1]["held_out_loss"]:
                    best = (setting, r)
    print(json.dumps({"bench": "diloco_quality", "best": best[0],
                      "vs_sync_ps": best[1]["vs_sync_ps"], "vs_ddp": best[1]["vs_ddp"],
                      "within_2_percent": best[1]["vs_sync_ps"] <= 1.02 and best[1]["vs_ddp"] <= 1.02}), flush=True)


if __name__ == "__main__":
    main()
