"""The parameter-server data path alone, against the memory it crosses: a
real PS job of the SmolLM-135M shape (or about --params parameters) whose
worker computes nothing (device.compute false) — each step it pushes its
gradient buffer and pulls the weights through the real worker, transport
and servers (clipping, AdamW, fp32 or bf16 wire) — next to this machine's
memory bandwidth measured in the same run (herd bench memory: STREAM's
copy and triad on as many threads as the job's processes share, over
arrays of a server shard's size, right before each job).

The floor is what the step's bytes cost at that bandwidth: the gradients
in and the weights out, each a copy (its bytes read and written, at copy
bandwidth), and the servers' pass over their shards (the gradients read,
the weights and both moments read and written, the bf16 weights written
with a bf16 wire), at triad bandwidth. ratio = step_s / floor_s is the
figure to drive down.

Each wire (fp32, bf16) runs --repeat times, interleaved (fp32 bf16 fp32
...), and each figure is the median over those runs of the median over
the run's steps after --warmup. The phases come from the job's merged
trace (log.trace, herd trace merge): per step, `push_s` from the worker's
first push to its last push's completion, `server_s` from then to the
servers' last AdamW, `pull_s` from then to the worker's last pull
completion; `pull_overlap` is the share of the step's pull time (the
union of pulls in flight) before the last AdamW ends (pulls answered
bucket by bucket while the servers go on stepping). `server_gbs` is the
servers' pass's bytes over the time their AdamW and sums took (the sum
of those spans, per server, in parallel: the slowest), and
`server_vs_triad` that over triad.

One JSON line per wire:
  {"bench": "ps_datapath", "wire": "fp32", "parameters": ..., "step_s": ..., "floor_s": ..., "ratio": ...,
   "bandwidth_gbs": <triad>, "copy_gbs": ..., "push_s": ..., "server_s": ..., "pull_s": ..., ...}
and a last one: {"bench": "ps_datapath", "summary": ..., "bf16_vs_fp32": step_s(bf16) / step_s(fp32)}.

    python3 bench/ps_datapath.py [--build build] [--params N] [--servers 2] [--workers 1]
        [--wires fp32,bf16] [--bucket-mb 4] [--steps 8] [--warmup 2] [--repeat 3] [--set path=value ...]

Use Debian's /usr/bin/python3.
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
sys.path.insert(0, HERE)
from ps_throughput import word_corpus  # noqa: E402  (one way to make a corpus)

# SmolLM-135M's shape (as herd bench gpu and scripts/gpu_check.py train it).
SMOLLM_135M = {"vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
               "num_attention_heads": 9, "num_key_value_heads": 3, "tie_word_embeddings": "true",
               "rope_theta": 10000}


def model_sets(params):
    """--set lines of the SmolLM-135M shape, with as many layers as bring it
    nearest `params` parameters (None: its own 30)."""
    shape = dict(SMOLLM_135M)
    if params:
        d, f, kv = shape["hidden_size"], shape["intermediate_size"], shape["num_key_value_heads"]
        head = d // shape["num_attention_heads"]
        per_layer = 2 * d * d + 2 * d * kv * head + 3 * d * f + 2 * d
        embedding = shape["vocab_size"] * d + d
        shape["num_hidden_layers"] = max(1, round((params - embedding) / per_layer))
    return [f"model.{k}={v}" for k, v in shape.items()]


def plan(herd, config, sets):
    cmd = [herd, "plan", config, "--json"] + [x for s in sets for x in ("--set", s)]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"herd plan failed: {p.stderr.strip()}")
    return json.loads(p.stdout)


def memory(herd, mb, threads):
    p = subprocess.run([herd, "bench", "memory", "--mb", str(mb), "--threads", str(threads)], capture_output=True,
                       text=True, check=True)
    return json.loads(p.stdout)


def launch(herd, config, sets, workdir):
    """Runs the job with a trace; (metrics rows, merged trace events)."""
    trace_dir = os.path.join(workdir, "trace")
    shutil.rmtree(trace_dir, ignore_errors=True)
    metrics = os.path.join(workdir, "metrics.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    cmd = [herd, "launch", config]
    for s in sets + [f"log.metrics={metrics}", f"log.trace={trace_dir}"]:
        cmd += ["--set", s]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if p.returncode != 0:
        sys.stderr.write(p.stdout[-3000:] + p.stderr[-3000:])
        raise SystemExit(f"herd launch failed ({p.returncode}): {' '.join(cmd)}")
    merged = os.path.join(workdir, "merged.json")
    m = subprocess.run([herd, "trace", "merge", trace_dir, "--out", merged], capture_output=True, text=True)
    if m.returncode != 0:
        raise SystemExit(f"herd trace merge failed: {m.stderr.strip()}")
    with open(metrics) as f:
        rows = [json.loads(line) for line in f]
    with open(merged) as f:
        events = json.load(f)["traceEvents"]
    os.remove(merged)
    return rows, events


def union(intervals):
    total, end = 0.0, None
    for a, b in sorted(intervals):
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total


def phases(events, step):
    """The phases of step `step` (1-based) in seconds, from the merged trace."""
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    workers = {pid for pid, n in names.items() if n.startswith("worker")}
    servers = {pid for pid, n in names.items() if n.startswith("server")}
    begins = {}
    pushes, pulls = [], []
    for e in events:
        if e["ph"] == "b" and e["pid"] in workers:
            begins[(e["pid"], e["id"])] = e
        elif e["ph"] == "e" and e["pid"] in workers and (e["pid"], e["id"]) in begins:
            b = begins.pop((e["pid"], e["id"]))
            args = b.get("args", {})
            if b["name"] == "push gradients" and args.get("step") == step - 1:
                pushes.append((b["ts"], e["ts"]))
            elif b["name"] == "pull weights" and args.get("version") == step:
                pulls.append((b["ts"], e["ts"]))
    adamw = [(e["ts"], e["ts"] + e["dur"], e["pid"]) for e in events
             if e["ph"] == "X" and e["pid"] in servers and e["name"] in ("adamw", "sum", "sum of squares")
             and e.get("args", {}).get("step") == step]
    if not pushes or not pulls or not adamw:
        raise SystemExit(f"step {step}: the trace has {len(pushes)} pushes, {len(pulls)} pulls and "
                         f"{len(adamw)} server spans")
    pushed = max(b for _, b in pushes)
    stepped = max(b for _, b, _ in adamw)
    pulled = max(b for _, b in pulls)
    pull_time = union(pulls)
    busy = {}
    for a, b, pid in adamw:
        busy[pid] = busy.get(pid, 0.0) + (b - a)
    return {"push_s": (pushed - min(a for a, _ in pushes)) / 1e6, "server_s": (stepped - pushed) / 1e6,
            "pull_s": (pulled - stepped) / 1e6,
            "pull_overlap": union([(a, min(b, stepped)) for a, b in pulls if a < stepped]) / pull_time,
            "server_busy_s": max(busy.values()) / 1e6}


def floor_bytes(parameters, workers, wire_bytes):
    """(copied, streamed): the bytes the step copies (gradients in, weights
    out) and those the servers' pass reads and writes."""
    copied = 2 * workers * parameters * wire_bytes
    streamed = parameters * (workers * wire_bytes + 24 + (2 if wire_bytes == 2 else 0))
    return copied, streamed


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--config", default="configs/tiny_ps.textproto", help="the job around the model's shape")
    ap.add_argument("--params", type=float, help="about this many parameters (layers of SmolLM-135M's width)")
    ap.add_argument("--servers", type=int, default=2)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--wires", default="fp32,bf16")
    ap.add_argument("--bucket-mb", type=float, default=4.0, help="cluster.bucket_mb (the job default)")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="the memory benchmark's")
    ap.add_argument("--set", action="append", default=[])
    a = ap.parse_args()
    herd = os.path.join(a.build, "herd")
    workdir = tempfile.mkdtemp(prefix="herd_bench_psdata_")
    try:
        data = word_corpus(herd, workdir, 2000)
        base = model_sets(a.params) + [
            "cluster.sync=PARAMETER_SERVER", f"cluster.servers={a.servers}", f"cluster.workers={a.workers}",
            f"cluster.bucket_mb={a.bucket_mb}",
            "device.compute=false", "train.batch_size=1", "train.seq_len=64", f"train.steps={a.steps}",
            "log.every=1", "log.eval_every=0", "log.sample_tokens=0", "checkpoint.dir=", "data.val=",
            f"data.train={data}", "data.prepare_from="] + a.set
        parameters = plan(herd, a.config, base)["parameters"]
        shard_mb = max(1, round(parameters / a.servers * 4 / 2**20))
        results = {w: [] for w in a.wires.split(",")}
        for _ in range(a.repeat):
            for wire in results:
                mem = memory(herd, shard_mb, a.threads)
                rows, events = launch(herd, a.config, base + [f"cluster.wire_dtype={wire.upper()}"], workdir)
                by_step = {r["step"]: r["elapsed_s"] for r in rows}
                steps = range(a.warmup + 1, a.steps + 1)
                step_s = statistics.median(by_step[s] - by_step[s - 1] for s in steps)
                per_step = [phases(events, s) for s in steps]
                ph = {k: statistics.median(p[k] for p in per_step) for k in per_step[0]}
                copied, streamed = floor_bytes(parameters, a.workers, 2 if wire == "bf16" else 4)
                floor_s = copied / (mem["copy_gbs"] * 1e9) + streamed / (mem["triad_gbs"] * 1e9)
                server_gbs = streamed / ph["server_busy_s"] / 1e9
                results[wire].append(dict(step_s=step_s, floor_s=floor_s, bandwidth_gbs=mem["triad_gbs"],
                                          copy_gbs=mem["copy_gbs"], server_gbs=server_gbs,
                                          server_vs_triad=server_gbs / mem["triad_gbs"], **ph))
        medians = {}
        for wire, runs in results.items():
            m = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            m["ratio"] = statistics.median(r["step_s"] / r["floor_s"] for r in runs)
            medians[wire] = m
            line = {"bench": "ps_datapath", "wire": wire, "parameters": parameters, "servers": a.servers,
                    "workers": a.workers, "runs": a.repeat, "measured_steps": a.steps - a.warmup,
                    "ucx_tls": os.environ.get("UCX_TLS", "auto")}
            line.update({k: round(v, 4) for k, v in m.items()})
            line["step_s_runs"] = [round(r["step_s"], 4) for r in runs]
            print(json.dumps(line), flush=True)
        if "fp32" in medians and "bf16" in medians:
            print(json.dumps({"bench": "ps_datapath", "summary": "bf16 wire's step over fp32's",
                              "bf16_vs_fp32": round(medians["bf16"]["step_s"] / medians["fp32"]["step_s"], 4)}),
                  flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
