"""A model whose fp32 weights alone are more than one worker's memory,
trained by ZeRO-3 (cluster.zero_stage 3) among 4 workers: by default a
d1024 model of 48 layers (intermediate 2816, 16 heads, 4 kv heads, a
256-entry vocabulary: 0.53B parameters, 2.1 GB of fp32 weights), batch
1 x 64 tokens a worker, FULL recompute, no clipping (so that each slice
steps as soon as its gradients are reduced and lets them go), 3 steps.
Each worker holds its quarter of the master weights and AdamW state and
a window of gathered layers. Every worker's measured peak RSS is
reported next to `herd plan`'s figure and the fp32 weights' size, with
the losses.

One JSON line per worker, then one for the run:
  {"bench": "zero3_big", "process": "worker 0", "peak_rss_bytes": ..., "planned_bytes": ..., "vs_plan": ...,
   "vs_fp32_weights": ...}
  {"bench": "zero3_big", "parameters": ..., "weights_bytes": ..., "losses": [...], "step_s": [...]}

    python3 bench/zero3_big.py [--build build] [--layers 48] [--workers 4] [--steps 3] [--set path=value ...]

Needs about 8 GB of memory. Use Debian's /usr/bin/python3.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from ps_throughput import plan, word_corpus  # noqa: E402  (one way to ask herd plan; the corpus)

CONFIG = """
model {{ vocab_size: 256 hidden_size: 1024 intermediate_size: 2816 num_hidden_layers: {layers}
        num_attention_heads: 16 num_key_value_heads: 4 tie_word_embeddings: false }}
train {{ steps: {steps} batch_size: 1 seq_len: 64 seed: 7 recompute: FULL threads: 1 }}
optimizer {{ lr: 1e-4 warmup_steps: 3 clip_norm: 0 }}
data {{ train: "{data}" }}
log {{ every: 1 sample_tokens: 0 metrics: "{work}/metrics.jsonl" summary_dir: "{work}/summary" }}
cluster {{ sync: ALLREDUCE workers: {workers} zero_stage: 3 }}
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--set", action="append", default=[])
    a = ap.parse_args()
    herd = os.path.join(a.build, "herd")
    work = tempfile.mkdtemp(prefix="herd_bench_zero3_big_")
    try:
        data = word_corpus(herd, work, 5000)
        cfg = os.path.join(work, "job.textproto")
        with open(cfg, "w") as f:
            f.write(CONFIG.format(layers=a.layers, steps=a.steps, data=data, work=work, workers=a.workers))
        sets = [x for s in a.set for x in ("--set", s)]
        planned = plan(herd, cfg, a.set)
        worker = planned["processes"][-1]
        weights = planned["parameters"] * 4
        p = subprocess.run([herd, "launch", cfg, *sets], capture_output=True, text=True)
        if p.returncode != 0:
            sys.stderr.write(p.stdout[-3000:] + p.stderr[-3000:])
            raise SystemExit(f"herd launch failed ({p.returncode})")
        for w in range(a.workers):
            with open(os.path.join(work, "summary", f"worker_{w:05d}.json")) as f:
                peak = json.load(f)["peak_rss_bytes"]
            print(json.dumps({"bench": "zero3_big", "process": f"worker {w}", "peak_rss_bytes": peak,
                              "planned_bytes": worker["total"], "vs_plan": round(peak / worker["total"], 4),
                              "vs_fp32_weights": round(peak / weights, 4)}), flush=True)
        with open(os.path.join(work, "metrics.jsonl")) as f:
            rows = [json.loads(line) for line in f]
        print(json.dumps({"bench": "zero3_big", "parameters": planned["parameters"], "layers": a.layers,
                          "workers": a.workers, "weights_bytes": weights,
                          "plan": {k: worker[k] for k in ("weights", "optimizer", "gradients", "activations",
                                                          "buffers", "runtime", "total")},
                          "losses": [round(r["loss"], 4) for r in rows],
                          "step_s": [round(r["step_s"], 2) for r in rows if "step_s" in r]}), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
