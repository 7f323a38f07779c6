"""A model whose fp32 weights alone are several times a worker's memory,
trained with streamed weights (cluster.stream_weights): by default the
TinyLlama-1.1B shape cut to 20 layers (1.01B parameters: 4 GB of fp32
weights, 16 GB of weights and AdamW state over the servers), 2 servers and
1 worker, batch 1 x 256 tokens, FULL recompute, 4 steps (the learning
rate warmed up over them). Every process's measured peak RSS is reported
next to `herd plan`'s figure, with the losses.

One JSON line per process, then one for the run:
  {"bench": "stream_big", "process": "worker 0", "peak_rss_bytes": ..., "planned_bytes": ..., "vs_plan": ...}
  {"bench": "stream_big", "parameters": ..., "weights_bytes": ..., "losses": [...], "step_s": [...]}

    python3 bench/stream_big.py [--build build] [--layers 20] [--servers 2] [--steps 4] [--set path=value ...]

Needs about 18 GB of memory. Use Debian's /usr/bin/python3.
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
model {{ vocab_size: 32000 hidden_size: 2048 intermediate_size: 5632 num_hidden_layers: {layers}
        num_attention_heads: 32 num_key_value_heads: 4 tie_word_embeddings: false }}
train {{ steps: {steps} batch_size: 1 seq_len: 256 seed: 7 recompute: FULL }}
optimizer {{ lr: 1e-4 warmup_steps: 4 }}
data {{ train: "{data}" }}
log {{ every: 1 sample_tokens: 0 metrics: "{work}/metrics.jsonl" summary_dir: "{work}/summary" }}
cluster {{ sync: PARAMETER_SERVER servers: {servers} workers: 1 stream_weights: true }}
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--layers", type=int, default=20)
    ap.add_argument("--servers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--set", action="append", default=[])
    a = ap.parse_args()
    herd = os.path.join(a.build, "herd")
    work = tempfile.mkdtemp(prefix="herd_bench_stream_big_")
    try:
        # Token ids below the vocabulary: byte-level text is enough to learn from.
        data = word_corpus(herd, work, 20000)
        cfg = os.path.join(work, "job.textproto")
        with open(cfg, "w") as f:
            f.write(CONFIG.format(layers=a.layers, steps=a.steps, data=data, work=work, servers=a.servers))
        sets = [x for s in a.set for x in ("--set", s)]
        planned = plan(herd, cfg, a.set)
        p = subprocess.run([herd, "launch", cfg, *sets], capture_output=True, text=True)
        if p.returncode != 0:
            sys.stderr.write(p.stdout[-3000:] + p.stderr[-3000:])
            raise SystemExit(f"herd launch failed ({p.returncode})")
        for proc in planned["processes"]:
            name = f"{proc['role']}_{max(proc['rank'], 0):05d}.json"
            with open(os.path.join(work, "summary", name)) as f:
                peak = json.load(f)["peak_rss_bytes"]
            print(json.dumps({"bench": "stream_big", "process": f"{proc['role']} {max(proc['rank'], 0)}",
                              "peak_rss_bytes": peak, "planned_bytes": proc["total"],
                              "vs_plan": round(peak / proc["total"], 4)}), flush=True)
        with open(os.path.join(work, "metrics.jsonl")) as f:
            rows = [json.loads(line) for line in f]
        print(json.dumps({"bench": "stream_big", "parameters": planned["parameters"], "layers": a.layers,
                          "servers": a.servers, "weights_bytes": planned["parameters"] * 4,
                          "losses": [round(r["loss"], 4) for r in rows],
                          "step_s": [round(r["step_s"], 2) for r in rows if "step_s" in r]}), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
