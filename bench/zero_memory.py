"""What each ZeRO stage keeps, measured: the same job in all-reduce mode at
zero_stage 0 (DDP), 1, 2 and 3 (and 3 with reshard_after_forward false),
W workers on one machine, each worker's peak RSS next to `herd plan`'s
figure for a worker. By default configs/llama20m.textproto's model (19M
parameters) at W=4, batch 1 x 64 tokens (small activations, so that the
weights, gradients and AdamW state show), 3 steps.

One JSON line per stage:
  {"bench": "zero_memory", "stage": "zero3", "workers": 4, "planned_bytes": ...,
   "peak_rss_bytes": [...], "max_vs_plan": ..., "min_vs_plan": ..., "plan": {weights, optimizer, gradients, ...}}

    python3 bench/zero_memory.py [--build build] [--workers 4] [--steps 3] [--stages 0,1,2,3,3keep] [--set path=value ...]

Use Debian's /usr/bin/python3.
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
model {{ vocab_size: 256 hidden_size: 512 intermediate_size: 1024 num_hidden_layers: 8
        num_attention_heads: 8 num_key_value_heads: 4 tie_word_embeddings: true }}
train {{ steps: {steps} batch_size: 1 seq_len: 64 seed: 7 threads: 1 }}
data {{ train: "{data}" }}
log {{ every: 1 sample_tokens: 0 summary_dir: "{summary}" }}
cluster {{ sync: ALLREDUCE workers: {workers} zero_stage: {stage} {more} }}
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--stages", default="0,1,2,3,3keep")
    ap.add_argument("--set", action="append", default=[])
    a = ap.parse_args()
    herd = os.path.join(a.build, "herd")
    work = tempfile.mkdtemp(prefix="herd_bench_zero_memory_")
    try:
        data = word_corpus(herd, work, 5000)
        sets = [x for s in a.set for x in ("--set", s)]
        for stage in a.stages.split(","):
            summary = os.path.join(work, "summary_" + stage)
            more = "reshard_after_forward: false" if stage.endswith("keep") else ""
            cfg = os.path.join(work, stage + ".textproto")
            with open(cfg, "w") as f:
                f.write(CONFIG.format(steps=a.steps, data=data, summary=summary, workers=a.workers,
                                      stage=stage[0], more=more))
            planned = plan(herd, cfg, a.set)["processes"][-1]
            p = subprocess.run([herd, "launch", cfg, *sets], capture_output=True, text=True)
            if p.returncode != 0:
                sys.stderr.write(p.stdout[-3000:] + p.stderr[-3000:])
                raise SystemExit(f"herd launch failed ({p.returncode})")
            peaks = []
            for w in range(a.workers):
                with open(os.path.join(summary, f"worker_{w:05d}.json")) as f:
                    peaks.append(json.load(f)["peak_rss_bytes"])
            print(json.dumps({"bench": "zero_memory", "stage": "zero" + stage, "workers": a.workers,
                              "planned_bytes": planned["total"], "peak_rss_bytes": peaks,
                              "max_vs_plan": round(max(peaks) / planned["total"], 4),
                              "min_vs_plan": round(min(peaks) / planned["total"], 4),
                              "plan": {k: planned[k] for k in ("weights", "optimizer", "gradients", "activations",
                                                                "buffers", "runtime")}}), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
