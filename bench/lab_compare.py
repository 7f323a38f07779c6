"""Parameter server against ring all-reduce where the network sets the pace:
the same job on emulated nodes (scripts/netlab.py: one namespace per node,
links capped with tbf in both directions), in BytePS's layout — W worker
nodes and, for PS, S = W CPU-only server nodes — at several link rates.

For each rate and mode (ps, ps_streamed: parameter servers with
cluster.stream_weights, allreduce: DDP, allreduce_zero1/2/3, pipeline: one
pipeline of W stages in all-reduce mode, 1F1B, the global batch's W
micro-batches flowing through it; tensor: one tensor-parallel group of W
ranks, the global batch's W micro-batches through it; tensor_sp: the same
with sequence parallelism; context: one context-parallel group of W ranks,
likewise) it starts the job
by hand, the way a cluster does: a coordinator on its own node, then every
server and worker with --rank and --coordinator inside its node. It prints
one JSON line per rate and mode: step time, tokens/s, the share of the step
workers spent waiting on communication, bytes each node's link carried per
step in each direction (the kernel's counters, not herd's) with the packets
its rate limiters dropped, and peak memory per process; then the theory
check: bytes per worker link per step each way against `herd plan`'s
prediction (sharding/traffic_plan.h), with the textbook formula beside it
(PS: M, the gradient bytes, each way, and M more in when streamed weights
are pulled again for backward; a ring all-reduce, and ZeRO-1/2's
reduce-scatter + all-gather: 2(n-1)/n M; ZeRO-3's two all-gathers and a
reduce-scatter: 3(n-1)/n M; the plan counts what the weight window
actually fetches), the communication time per step (the step
time at the rate minus the same layout's step time on uncapped links,
measured in this run) against the busier direction's bytes at the rate,
and each mode's step against DDP's at the same rate.

    sudo /usr/bin/python3 bench/lab_compare.py [--build build] [--workers 2]
        [--rates 0.5gbit,1gbit,2.5gbit,10gbit] [--modes ps,allreduce,allreduce_zero1]
        [--steps 8] [--warmup 2] [--set path=value ...]
        (modes: ps,ps_streamed,allreduce,allreduce_zero1,allreduce_zero2,allreduce_zero3,pipeline,tensor,
         tensor_sp,context)

Needs root (network namespaces). The default job is configs/llama20m.textproto
at batch 1 x 64 tokens per worker, so that communication, not compute,
dominates at the lower rates; without clipping (optimizer.clip_norm 0), so
that parameter servers stream updates (each bucket stepped and pulled as
soon as its sum is complete, as BytePS does; with clipping every pull
waits for the global norm, i.e. for every push), and with 1 MiB buckets,
so that over TCP a pull's answer does not wait long behind pushes. Pass
--set optimizer.clip_norm=1 to see the clipped protocol.
"""
import argparse
import glob
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import netlab  # noqa: E402

PORT = 29400


def job_sets(args, mode, workdir, steps):
    sets = [f"train.steps={steps}", "log.every=1", f"log.metrics={workdir}/metrics.jsonl", "log.sample_tokens=0",
            "log.eval_every=0", "data.val=", "data.prepare_from=", f"data.train={workdir}/../train.bin",
            "checkpoint.dir=", f"log.summary_dir={workdir}/summaries", "train.threads=1",
            f"cluster.workers={args.workers}", "cluster.coordinator=", "cluster.heartbeat_timeout_s=60"]
    if mode.startswith("ps"):
        sets += ["cluster.sync=PARAMETER_SERVER", f"cluster.servers={args.workers}", "cluster.zero_stage=0",
                 f"cluster.stream_weights={'true' if mode == 'ps_streamed' else 'false'}"]
    elif mode == "pipeline":
        # One replica of W stages: the same global batch as W data-parallel
        # workers, as W micro-batches (train.grad_accum is per replica).
        sets += ["cluster.sync=ALLREDUCE", "cluster.servers=0", "cluster.zero_stage=0",
                 f"cluster.pipeline_stages={args.workers}", "cluster.pipeline_schedule=ONE_F_ONE_B"]
    elif mode in ("tensor", "tensor_sp"):
        # One group of W tensor-parallel ranks (tensor_sp: with sequence
        # parallelism): as pipeline, the global batch as W micro-batches.
        sets += ["cluster.sync=ALLREDUCE", "cluster.servers=0", "cluster.zero_stage=0",
                 f"cluster.tensor_parallel={args.workers}",
                 f"cluster.sequence_parallel={'true' if mode == 'tensor_sp' else 'false'}"]
    elif mode == "context":
        # One group of W context-parallel ranks: as tensor, the global
        # batch as W micro-batches.
        sets += ["cluster.sync=ALLREDUCE", "cluster.servers=0", "cluster.zero_stage=0",
                 f"cluster.context_parallel={args.workers}"]
    else:
        sets += ["cluster.sync=ALLREDUCE", "cluster.servers=0", f"cluster.zero_stage={zero_stage(mode)}"]
    sets += list(args.set)
    if mode in ("pipeline", "tensor", "tensor_sp", "context"):
        accum = next((int(s.split("=")[1]) for s in reversed(sets) if s.startswith("train.grad_accum=")), 1)
        sets.append(f"train.grad_accum={accum * args.workers}")
    return sets


def zero_stage(mode):
    """allreduce_zeroN's N (allreduce: 0)."""
    return int(mode[len("allreduce_zero"):]) if mode.startswith("allreduce_zero") else 0


def formula_bytes(mode, M, W):
    """Bytes a worker's link carries per step (sent, received), by the
    textbook: BytePS's PS figure (M each way; streamed weights are pulled
    again for backward), a ring's (n-1)/n M per reduce-scatter or
    all-gather: DDP's all-reduce and ZeRO-1/2's reduce-scatter +
    all-gather are two, ZeRO-3's gathers for forward and backward and its
    reduce-scatter three."""
    ring = (W - 1) / W * M
    if mode in ("pipeline", "tensor", "tensor_sp", "context"):
        return None  # activations, not weights: herd plan's figure (tensor: bench/tensor_traffic.py per layer)
    return {"ps": (M, M), "ps_streamed": (M, 2 * M), "allreduce": (2 * ring, 2 * ring),
            "allreduce_zero1": (2 * ring, 2 * ring), "allreduce_zero2": (2 * ring, 2 * ring),
            "allreduce_zero3": (3 * ring, 3 * ring)}.get(mode)


def planned_bytes(args, mode):
    """(sent, received) per step by `herd plan` (sharding/traffic_plan.h):
    the formula, but with what the weight window actually pulls or gathers
    (units held across the turn from forward to backward are not fetched
    again)."""
    sets = [s for s in job_sets(args, mode, "/nonexistent", args.steps)
            if s.startswith(("cluster.", "train.", "model.", "log.sample_tokens", "log.eval_every"))]
    p = subprocess.run(with_sets([os.path.join(args.build, "herd"), "plan", args.config, "--json"], sets),
                       capture_output=True, text=True, check=True)
    t = json.loads(p.stdout)["worker_traffic"]
    return t["sent"], t["received"]


def with_defaults(defaults, sets):
    """`defaults` for the fields `sets` does not give, then `sets` (herd
    refuses a field set twice)."""
    given = {s.split("=")[0] for s in sets}
    return [d for d in defaults if d.split("=")[0] not in given] + list(sets)


def with_sets(argv, sets):
    for s in sets:
        argv += ["--set", s]
    return argv


def run_mode(args, mode, rate, scratch):
    """One job on a fresh lab; returns its figures."""
    workdir = os.path.join(scratch, f"{mode}_{rate}")
    os.makedirs(workdir)
    sets = job_sets(args, mode, workdir, args.steps)
    W = args.workers
    S = W if mode.startswith("ps") else 0
    token = os.path.join(workdir, "job.token")
    with open(os.open(token, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
        f.write(secrets.token_hex(16))
    # node 0: coordinator; 1..W: workers; W+1..W+S: servers.
    with netlab.Lab(nodes=1 + W + S, rate=rate) as lab:
        procs, logs = start_job(lab, args.build, args.config, sets, workdir, token, PORT,
                                servers=[1 + W + r for r in range(S)], workers=[1 + r for r in range(W)])
        # Link counters when worker 0 has logged step `warmup + 1` and the
        # step before the last: a step's line is written once the next
        # step has begun (streamed and gathered weights: during its
        # forward), so both marks fall at the same point of a step.
        marks = {args.warmup + 1: None, args.steps - 1: None}
        metrics = os.path.join(workdir, "metrics.jsonl")
        deadline = time.time() + args.timeout
        while any(m is None for m in marks.values()):
            rows = count_lines(metrics)
            for step in marks:
                if marks[step] is None and rows >= step:
                    marks[step] = [lab.counters(i) for i in range(lab.nodes)]
            failed = [p for p in procs if p.poll() not in (None, 0)]
            if failed or time.time() > deadline:
                for log in logs:
                    log.flush()
                raise SystemExit(f"{mode} at {rate}: " + ("a process failed" if failed else "timed out") +
                                 "\n" + log_tails(workdir))
            time.sleep(0.002)
        for p in procs:
            if p.wait(timeout=60) != 0:
                raise SystemExit(f"{mode} at {rate}: a process exited {p.returncode}\n" + log_tails(workdir))
        for log in logs:
            log.close()
    n = args.steps - args.warmup - 2
    before, after = marks[args.warmup + 1], marks[args.steps - 1]
    per_step = [{k: (a[k] - b[k]) / n for k in ("tx_bytes", "rx_bytes", "tx_drops", "rx_drops")}
                for a, b in zip(after, before)]
    return figures(args, mode, rate, workdir, W, S, per_step)


def start_job(lab, build, config, sets, workdir, token, port, servers, workers):
    """Starts a job by hand, as a cluster does: a coordinator on node 0,
    then server rank r on node servers[r] and worker rank r on workers[r],
    each logging to WORKDIR/NAME.log. Returns (processes, open logs)."""
    herd = os.path.join(build, "herd")
    coord = lab.address(0)
    logs = []

    def start(node, argv, name):
        log = open(os.path.join(workdir, name + ".log"), "w")
        logs.append(log)
        # UCX takes the namespaces for one host (even with host names of
        # their own) and would move bytes through shared memory, around
        # the links: TCP between nodes.
        return lab.popen(node, argv, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                         env=dict(os.environ, OMP_NUM_THREADS="1", UCX_TLS="tcp"))

    procs = [start(0, with_sets([herd, "coordinator", config, "--listen", f"{coord}:{port}", "--token-file", token],
                                sets), "coordinator")]
    time.sleep(0.3)
    common = ["--coordinator", f"{coord}:{port}", "--token-file", token]
    for role, nodes in (("server", servers), ("worker", workers)):
        for r, node in enumerate(nodes):
            procs.append(start(node, with_sets([f"{herd}-{role}", config, "--rank", str(r)] + common, sets),
                               f"{role}{r}"))
    return procs, logs


def trace_events(path):
    """The events of one process's log.trace file (JSON, one event a line)."""
    events = []
    with open(path) as f:
        for line in f:
            line = line.strip().rstrip(",")
            if line.startswith("{"):
                events.append(json.loads(line))
    return events


def count_lines(path):
    try:
        with open(path, "rb") as f:
            return f.read().count(b"\n")
    except FileNotFoundError:
        return 0


def log_tails(workdir):
    out = ""
    for name in sorted(os.listdir(workdir)):
        if name.endswith(".log"):
            with open(os.path.join(workdir, name)) as f:
                out += f"--- {name}\n" + "".join(f.readlines()[-5:])
    return out


def metrics_rows(workdir):
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def step_times(rows, warmup):
    return [rows[i]["elapsed_s"] - rows[i - 1]["elapsed_s"] for i in range(warmup + 1, len(rows))]


def link(p):
    """A node's link per step: MB each way, packets the rate limiter dropped each way."""
    return {"tx": round(p["tx_bytes"] / 1e6, 2), "rx": round(p["rx_bytes"] / 1e6, 2),
            "tx_drops": round(p["tx_drops"], 1), "rx_drops": round(p["rx_drops"], 1)}


def figures(args, mode, rate, workdir, W, S, per_step):
    rows = metrics_rows(workdir)
    peaks = {}
    for name in sorted(os.listdir(os.path.join(workdir, "summaries"))):
        with open(os.path.join(workdir, "summaries", name)) as f:
            s = json.load(f)
        peaks[f"{s['role']}{s['rank']}"] = round(s["peak_rss_bytes"] / 2**20, 1)
    later = rows[args.warmup + 1:]
    return {
        "bench": "lab_compare", "config": os.path.basename(args.config), "mode": mode, "rate": rate,
        "servers": S, "workers": W, "sets": args.set,
        "step_s": round(statistics.median(step_times(rows, args.warmup)), 4),
        "tokens_per_s": round(statistics.median(r["tokens_per_s"] for r in later), 1),
        "comm_wait_share": round(statistics.median(r.get("network_wait", 0) for r in later), 3),
        # per node, per step (the whole run over its steps: the first pull included)
        "worker_link_MB": [link(p) for p in per_step[1:1 + W]],
        "server_link_MB": [link(p) for p in per_step[1 + W:1 + W + S]],
        "peak_MiB": peaks,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--config", default=os.path.join(ROOT, "configs/llama20m.textproto"))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rates", default="0.5gbit,1gbit,2.5gbit,10gbit")
    ap.add_argument("--modes", default="ps,ps_streamed,allreduce,allreduce_zero1,allreduce_zero2,allreduce_zero3")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=600, help="seconds one job may take")
    ap.add_argument("--set", action="append", default=[], help="config override for every run")
    args = ap.parse_args()
    if args.steps < args.warmup + 3:
        ap.error("--steps must be at least --warmup + 3 (the link counters span the steps between two marks)")
    args.set = with_defaults(["train.batch_size=1", "train.seq_len=64", "optimizer.clip_norm=0", "cluster.bucket_mb=1"],
                             args.set)
    args.config = os.path.abspath(args.config)
    scratch = tempfile.mkdtemp(prefix="herd_lab_compare_")
    # The fortunes that data.prepare_from names in the config; herd prepare
    # skips their binary index files.
    texts = sorted(glob.glob("/usr/share/games/fortunes/*"))
    if not texts:
        raise SystemExit("lab_compare: no text in /usr/share/games/fortunes (apt install fortunes)")
    subprocess.run([os.path.join(args.build, "herd"), "prepare", *texts, "--out", os.path.join(scratch, "train.bin")],
                   check=True, capture_output=True)

    plan = subprocess.run(with_sets([os.path.join(args.build, "herd"), "plan", args.config, "--json"], args.set),
                          capture_output=True, text=True, check=True)
    M = json.loads(plan.stdout)["parameters"] * 4  # fp32 gradient bytes
    W = args.workers
    modes = args.modes.split(",")
    # The same layout with uncapped links: its step is the compute, the
    # servers' work and the CPU the processes take from each other on this
    # machine; what a capped link adds to it is communication.
    uncapped = {}
    for mode in modes:
        r = run_mode(args, mode, None, scratch)
        r["rate"] = "uncapped"
        print(json.dumps(r), flush=True)
        uncapped[mode] = r["step_s"]
    planned = {mode: planned_bytes(args, mode) for mode in modes}
    for rate in args.rates.split(","):
        B = netlab.parse_rate(rate) / 8  # bytes/s per link and direction
        by_mode = {}
        for mode in modes:
            r = run_mode(args, mode, rate, scratch)
            r["uncapped_step_s"] = uncapped[mode]
            r["comm_s"] = round(max(0.0, r["step_s"] - uncapped[mode]), 4)
            print(json.dumps(r), flush=True)
            by_mode[mode] = r
        for mode, r in by_mode.items():
            if mode not in planned:
                continue
            formula, predicted = formula_bytes(mode, M, W), planned[mode]
            links = r["worker_link_MB"]
            tx = statistics.mean(l["tx"] for l in links) * 1e6
            rx = statistics.mean(l["rx"] for l in links) * 1e6
            busier = max(predicted)
            print(json.dumps({"bench": "lab_theory", "mode": mode, "rate": rate, "workers": W, "M_MB": round(M / 1e6, 2),
                              "worker_link_MB": {"tx": round(tx / 1e6, 2), "rx": round(rx / 1e6, 2)},
                              "predicted_MB": {"tx": round(predicted[0] / 1e6, 2), "rx": round(predicted[1] / 1e6, 2)},
                              "bytes_ratio": {"tx": round(tx / predicted[0], 3), "rx": round(rx / predicted[1], 3)},
                              "formula_MB": {"tx": round(formula[0] / 1e6, 2), "rx": round(formula[1] / 1e6, 2)}
                              if formula else None,
                              "comm_s": r["comm_s"], "predicted_comm_s": round(busier / B, 4),
                              "time_ratio": round(r["comm_s"] / (busier / B), 3),
                              "vs_allreduce_step": round(r["step_s"] / by_mode["allreduce"]["step_s"], 3)
                              if "allreduce" in by_mode else None}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
