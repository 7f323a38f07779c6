"""A model whose fp32 weights alone are more than a worker's memory, trained
with every worker holding only a window of it:

  --mode streamed (default): parameter servers with cluster.stream_weights,
    the TinyLlama-1.1B shape cut to 20 layers (1.01B parameters: 4 GB of
    fp32 weights, 16 GB of weights and AdamW state over the servers), 2
    servers and 1 worker, batch 1 x 256 tokens, FULL recompute, 4 steps.
    Needs about 18 GB of memory.
  --mode zero3: all-reduce mode with cluster.zero_stage 3 among 4 workers,
    a d1024 model of 48 layers (intermediate 2816, 16 heads, 4 kv heads, a
    256-entry vocabulary: 0.54B parameters, 2.2 GB of fp32 weights), batch
    1 x 64 tokens a worker, FULL recompute, no clipping (so that each
    slice steps as soon as its gradients are reduced and lets them go), 3
    steps. Each worker holds a quarter of the master weights and AdamW
    state and a window of gathered layers. Needs about 8 GB of memory.

The learning rate warms up over the steps. Every process's measured peak
RSS is reported next to `herd plan`'s figure and the fp32 weights' size,
with the losses.

One JSON line per process, then one for the run:
  {"bench": "stream_big", "mode": ..., "process": "worker 0", "peak_rss_bytes": ..., "planned_bytes": ...,
   "vs_plan": ..., "vs_fp32_weights": ...}
  {"bench": "stream_big", "mode": ..., "parameters": ..., "weights_bytes": ..., "losses": [...], "step_s": [...]}

    python3 bench/stream_big.py [--mode streamed|zero3] [--build build] [--layers N] [--processes N]
        [--steps N] [--set path=value ...]

(--processes: servers when streamed, workers under ZeRO-3.) Use Debian's /usr/bin/python3.
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

LOG = 'log {{ every: 1 sample_tokens: 0 metrics: "{work}/metrics.jsonl" summary_dir: "{work}/summary" }}\n'
MODES = {
    # (config, layers, processes, steps, corpus words)
    "streamed": ("""
model {{ vocab_size: 32000 hidden_size: 2048 intermediate_size: 5632 num_hidden_layers: {layers}
        num_attention_heads: 32 num_key_value_heads: 4 tie_word_embeddings: false }}
train {{ steps: {steps} batch_size: 1 seq_len: 256 seed: 7 recompute: FULL }}
optimizer {{ lr: 1e-4 warmup_steps: 4 }}
data {{ train: "{data}" }}
cluster {{ sync: PARAMETER_SERVER servers: {processes} workers: 1 stream_weights: true }}
""", 20, 2, 4, 20000),
    "zero3": ("""
model {{ vocab_size: 256 hidden_size: 1024 intermediate_size: 2816 num_hidden_layers: {layers}
        num_attention_heads: 16 num_key_value_heads: 4 tie_word_embeddings: false }}
train {{ steps: {steps} batch_size: 1 seq_len: 64 seed: 7 recompute: FULL threads: 1 }}
optimizer {{ lr: 1e-4 warmup_steps: 3 clip_norm: 0 }}
data {{ train: "{data}" }}
cluster {{ sync: ALLREDUCE workers: {processes} zero_stage: 3 }}
""", 48, 4, 3, 5000),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=sorted(MODES), default="streamed")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--layers", type=int)
    ap.add_argument("--processes", type=int)
    ap.add_argument("--steps", type=int)
    ap.add_argument("--set", action="append", default=[])
    a = ap.parse_args()
    template, layers, processes, steps, words = MODES[a.mode]
    layers, processes, steps = a.layers or layers, a.processes or processes, a.steps or steps
    herd = os.path.join(a.build, "herd")
    work = tempfile.mkdtemp(prefix="herd_bench_stream_big_")
    try:
        # Token ids below the vocabulary: byte-level text is enough to learn from.
        data = word_corpus(herd, work, words)
        cfg = os.path.join(work, "job.textproto")
        with open(cfg, "w") as f:
            f.write((template + LOG).format(layers=layers, steps=steps, data=data, work=work, processes=processes))
        sets = [x for s in a.set for x in ("--set", s)]
        planned = plan(herd, cfg, a.set)
        weights = planned["parameters"] * 4
        p = subprocess.run([herd, "launch", cfg, *sets], capture_output=True, text=True)
        if p.returncode != 0:
            sys.stderr.write(p.stdout[-3000:] + p.stderr[-3000:])
            raise SystemExit(f"herd launch failed ({p.returncode})")
        every_worker = a.mode == "zero3"  # the plan names one worker for all
        for proc in planned["processes"]:
            for rank in range(processes if every_worker else 1) if proc["role"] == "worker" else [proc["rank"]]:
                with open(os.path.join(work, "summary", f"{proc['role']}_{max(rank, 0):05d}.json")) as f:
                    peak = json.load(f)["peak_rss_bytes"]
                print(json.dumps({"bench": "stream_big", "mode": a.mode, "process": f"{proc['role']} {max(rank, 0)}",
                                  "peak_rss_bytes": peak, "planned_bytes": proc["total"],
                                  "vs_plan": round(peak / proc["total"], 4),
                                  "vs_fp32_weights": round(peak / weights, 4)}), flush=True)
        with open(os.path.join(work, "metrics.jsonl")) as f:
            rows = [json.loads(line) for line in f]
        print(json.dumps({"bench": "stream_big", "mode": a.mode, "parameters": planned["parameters"],
                          "layers": layers, "processes": processes, "weights_bytes": weights,
                          "losses": [round(r["loss"], 4) for r in rows],
                          "step_s": [round(r["step_s"], 2) for r in rows if "step_s" in r]}), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
