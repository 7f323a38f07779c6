"""Pipeline stages' idle time against the schedules' theory, from the
merged step trace: a pipeline of p stages (all-reduce mode, one worker a
stage, one OpenMP thread each) trains --steps steps with log.trace on;
the traces are merged (herd trace merge) and, for every step after
--warmup, the step's pipeline window is taken from the first forward
span of any stage to the last backward span's end. A stage's idle share
is the part of the window its forward and backward spans do not cover;
theory's is the schedule's (`herd plan`'s figure: (p-1)/(m+p-1) for GPipe
and 1F1B, (p-1)/(v*m+p-1) interleaved with v = 2, ZB-H1's with its three
parts alike), which assumes every stage takes as long; for GPipe and 1F1B
"theory_these_stages" is the same schedule's with each stage's measured
pass times (the slowest stage sets the pace), which is what is left to
the schedule and the messages once the stages are uneven (the last
stage's head); for ZB-H1 its figure with the measured forward, input and
weight parts. The model has 16 equal layers and a head of a twelfth of
a layer's FLOPs, so that 2 and 4 stages are alike to within 1-2%: an
uneven stage idles the others m times its excess a step, which at m = 16
weighs as much as the bubble itself. One JSON line per stage and
configuration, the median over the steps:

  {"bench": "pipeline_bubble", "schedule": "ONE_F_ONE_B", "stages": 2, "micro_batches": 8, "stage": 0,
   "idle_share": ..., "theory": ..., "ratio": ...}

and one per configuration with the stages' mean ("stage": "mean").

    python3 bench/pipeline_bubble.py [--build build] [--stages 2] [--micro 4,8,16]
        [--schedules GPIPE,ONE_F_ONE_B] [--steps 6] [--warmup 2] [--set path=value ...]

Each stage must have a core of its own for the figures to mean anything:
p stages need p free cores (scripts/gpu_check.py's bubble phase runs it
on a GPU node's CPU cores). Use Debian's /usr/bin/python3 here.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# Layers of equal cost and a small head, so that the stages are alike.
MODEL = ("model { vocab_size: 256 hidden_size: 256 intermediate_size: 688 num_hidden_layers: 16 "
         "num_attention_heads: 8 num_key_value_heads: 4 tie_word_embeddings: false }")


def config_text(train, stages, schedule, micro, steps, trace_dir, metrics):
    return f"""{MODEL}
train {{ steps: {steps} batch_size: 2 seq_len: 128 grad_accum: {micro} seed: 7 threads: 1 }}
optimizer {{ lr: 1e-3 }}
data {{ train: "{train}" }}
log {{ every: 1 metrics: "{metrics}" sample_tokens: 0 eval_every: 0 trace: "{trace_dir}" }}
cluster {{ sync: ALLREDUCE workers: {stages} pipeline_stages: {stages} pipeline_schedule: {schedule}
           {"virtual_stages: 2" if schedule == "INTERLEAVED_1F1B" else ""} }}
"""


def theory(herd, config, sets):
    p = subprocess.run([herd, "plan", config, *sets], capture_output=True, text=True, check=True)
    for line in p.stdout.splitlines():
        if line.startswith("pipeline:") and "idle" in line:
            return float(line.split("idle ")[1].split("%")[0]) / 100
    raise SystemExit("herd plan printed no pipeline line:\n" + p.stdout)


def idle_shares(merged, warmup):
    """[stage] -> (idle share, forward us, backward us, weight-gradient us):
    medians over the steps after `warmup` of the stage's idle share of the
    step's pipeline window and of its mean forward pass, backward (ZB-H1:
    its input part) and ZB-H1's weight part (0 otherwise)."""
    events = merged["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    spans = [e for e in events if e["ph"] == "X" and e["name"] in ("forward", "backward", "weight gradients")]
    steps = sorted({e["args"]["step"] for e in spans})[warmup:]
    out = {}
    for pid, name in names.items():
        if not name.startswith("worker "):
            continue
        stage = int(name.split()[1])
        shares, forward, backward, weights = [], [], [], []
        for step in steps:
            of_step = [e for e in spans if e["args"]["step"] == step]
            t0 = min(e["ts"] for e in of_step)
            t1 = max(e["ts"] + e["dur"] for e in of_step)
            mine = [e for e in of_step if e["pid"] == pid]
            shares.append(1 - sum(e["dur"] for e in mine) / (t1 - t0))
            forward.append(statistics.mean(e["dur"] for e in mine if e["name"] == "forward"))
            backward.append(statistics.mean(e["dur"] for e in mine if e["name"] == "backward"))
            weights.append(statistics.mean([e["dur"] for e in mine if e["name"] == "weight gradients"] or [0]))
        out[stage] = (statistics.median(shares), statistics.median(forward), statistics.median(backward),
                      statistics.median(weights))
    return out


def uneven_theory(schedule, micro, passes):
    """[stage] -> the idle share the schedule leaves when stage s's passes
    take passes[s] = (forward, backward) and messages take no time: the
    slowest stage sets the pace of the m-1 micro-batches after the first.
    GPipe: sum(f) + (m-1) max(f), then the same for the backwards; 1F1B:
    sum(f+b) + (m-1) max(f+b). Equal stages give (p-1)/(m+p-1)."""
    f = [passes[s][0] for s in sorted(passes)]
    b = [passes[s][1] for s in sorted(passes)]
    if schedule == "GPIPE":
        makespan = sum(f) + (micro - 1) * max(f) + sum(b) + (micro - 1) * max(b)
    else:
        fb = [x + y for x, y in zip(f, b)]
        makespan = sum(fb) + (micro - 1) * max(fb)
    return {s: 1 - micro * (f[i] + b[i]) / makespan for i, s in enumerate(sorted(passes))}


def zero_bubble_theory(stages, micro, passes):
    """ZB-H1's idle share (sharding/pipeline_schedule.h's TheoreticalBubble)
    with the stages' mean measured forward, input and weight parts."""
    f, b, w = (statistics.mean(v[i] for v in passes.values()) for i in range(3))
    lost = (stages - 1) * (f + b - w)
    return lost / (micro * (f + b + w) + lost)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--stages", type=int, default=2)
    ap.add_argument("--micro", default="4,8,16")
    ap.add_argument("--schedules", default="GPIPE,ONE_F_ONE_B")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--set", action="append", default=[])
    a = ap.parse_args()
    herd = os.path.join(os.path.abspath(a.build), "herd")
    work = tempfile.mkdtemp(prefix="herd_bubble_")
    train = os.path.join(work, "train.bin")
    corpus = os.path.join(work, "corpus.txt")
    with open(corpus, "w") as f:
        f.write(" ".join(f"w{(i * 7919) % 1013}" for i in range(400000)))
    subprocess.run([herd, "prepare", corpus, "--out", train], check=True, capture_output=True)
    sets = [x for s in a.set for x in ("--set", s)]
    for schedule in a.schedules.split(","):
        for micro in (int(m) for m in a.micro.split(",")):
            tag = f"{schedule.lower()}_p{a.stages}_m{micro}"
            trace_dir = os.path.join(work, tag)
            config = os.path.join(work, tag + ".textproto")
            with open(config, "w") as f:
                f.write(config_text(train, a.stages, schedule, micro, a.steps, trace_dir,
                                    os.path.join(work, tag + ".jsonl")))
            p = subprocess.run([herd, "launch", config, *sets], capture_output=True, text=True)
            if p.returncode != 0:
                sys.stderr.write(p.stdout[-2000:] + p.stderr[-2000:])
                raise SystemExit(f"{tag}: herd launch failed ({p.returncode})")
            merged_path = os.path.join(work, tag + ".json")
            subprocess.run([herd, "trace", "merge", trace_dir, "--out", merged_path], check=True, capture_output=True)
            with open(merged_path) as f:
                shares = idle_shares(json.load(f), a.warmup)
            expected = theory(herd, config, sets)
            # GPipe's and 1F1B's with each stage's times; ZB-H1's with the
            # measured parts (the same for every stage); none interleaved.
            uneven = {}
            if schedule in ("GPIPE", "ONE_F_ONE_B"):
                uneven = uneven_theory(schedule, micro, {s: (v[1], v[2] + v[3]) for s, v in shares.items()})
            elif schedule == "ZERO_BUBBLE":
                zb = zero_bubble_theory(a.stages, micro, {s: v[1:] for s, v in shares.items()})
                uneven = {s: zb for s in shares}

            def against_these(share, theory_here):
                if theory_here is None:
                    return {}
                return {"theory_these_stages": round(theory_here, 4), "ratio_these_stages": round(share / theory_here, 3)}

            for stage, (share, forward, backward, weight) in sorted(shares.items()):
                print(json.dumps({"bench": "pipeline_bubble", "schedule": schedule, "stages": a.stages,
                                  "micro_batches": micro, "stage": stage, "idle_share": round(share, 4),
                                  "theory": round(expected, 4), "ratio": round(share / expected, 3),
                                  "forward_ms": round(forward / 1e3, 2), "backward_ms": round(backward / 1e3, 2),
                                  **({"weight_ms": round(weight / 1e3, 2)} if weight else {}),
                                  **against_these(share, uneven.get(stage))}), flush=True)
            mean = statistics.mean(v[0] for v in shares.values())
            print(json.dumps({"bench": "pipeline_bubble", "schedule": schedule, "stages": a.stages,
                              "micro_batches": micro, "stage": "mean", "idle_share": round(mean, 4),
                              "theory": round(expected, 4), "ratio": round(mean / expected, 3),
                              **against_these(mean, statistics.mean(uneven.values()) if uneven else None)}),
                  flush=True)


if __name__ == "__main__":
    main()
