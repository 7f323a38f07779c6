"""Regions over a slow link: what crosses it, and what it costs the job.
Emulated nodes (scripts/netlab.py), one process a node on 1 Gbit/s links,
the nodes in R sites whose bridges are joined by uplinks capped at 50
Mbit/s; the ~20M shape (configs/llama20m.textproto's model), W workers x
1 x 128 tokens a step, started by hand as a cluster does (a coordinator
node in site 0, then every server and worker with --rank).

Jobs, each on a fresh lab:
  sync_ps   one synchronous PS job over every site (servers and workers
            spread evenly: half of each worker's pushes and pulls cross);
  ddp       DDP over every site (the ring crosses the uplinks);
  diloco    cluster.diloco with R regions = the sites, H inner steps, for
            each --wires dtype, 2H steps (two outer steps, the last one
            at the end);
  uncapped  the last --wires job again with the uplinks uncapped: the
            anchor of its tokens/s.

One JSON line per job:

  {"bench": "diloco_traffic", "job": "diloco", "wire": "INT8", "every": 100, "uplink_MB_per_1000_steps": ..,
   "vs_sync_ps": .., "vs_ddp": .., "tokens_per_s": .., "vs_uncapped": .., "longest_stall_s": ..,
   "step_s_median": .., "uplink_drops": ..}

`planned_MB_per_1000_steps`: `herd plan`'s payload bytes between regions
(the kernel's count adds TCP/IP headers and control messages);
`uplink_MB_per_1000_steps`: bytes that left every site over its uplink
(the kernel's counters), per 1000 inner steps (sync_ps and ddp: measured
over the steps after --warmup and scaled; diloco: the whole run's, whose
steps hold whole outer periods); `vs_*`: how many times fewer than that
job's; `tokens_per_s`: the whole run's tokens over the leader's time from
the end of step --warmup to the last; `longest_stall_s`: the most time
any worker spent blocked (trace spans of category "wait") within one
step.

    sudo /usr/bin/python3 bench/diloco_traffic.py [--build build] [--workers 4] [--servers 4]
        [--regions 2] [--every 100] [--wires FP32,INT8] [--rate 1gbit] [--between 50mbit]
        [--sync-steps 5] [--warmup 2] [--set path=value ...]

Needs root (network namespaces).
"""
import argparse
import collections
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
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import lab_compare  # noqa: E402
import netlab  # noqa: E402

PORT = 29500


def stalls(trace_dir, warmup):
    """Per worker and step after `warmup`: the time in "wait" spans; the
    largest, and the steps' durations."""
    longest, steps_s = 0.0, []
    for path in sorted(glob.glob(os.path.join(trace_dir, "worker_*.trace.json"))):
        events = lab_compare.trace_events(path)
        steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") == "step"
                       and e.get("name") == "step" and e.get("ph") == "X")[warmup:]
        waits = [(e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") == "wait" and e.get("ph") == "X"]
        for begin, end in steps:
            steps_s.append((end - begin) / 1e6)
            inside = sum(min(e, end) - max(b, begin) for b, e in waits if e > begin and b < end)
            longest = max(longest, inside / 1e6)
    return longest, steps_s


def run_job(args, name, cluster_sets, steps, between, scratch):
    workdir = os.path.join(scratch, name)
    os.makedirs(workdir)
    W, R = args.workers, args.regions
    S = next((int(s.split("=")[1]) for s in cluster_sets if s.startswith("cluster.servers=")), 0)
    sets = [f"train.steps={steps}", "train.batch_size=1", "train.seq_len=128", "log.every=1",
            f"log.metrics={workdir}/metrics.jsonl", "log.sample_tokens=0", "log.eval_every=0", "data.val=",
            "data.prepare_from=", f"data.train={scratch}/train.bin", "checkpoint.dir=",
            f"log.trace={workdir}/trace", "train.threads=1", f"cluster.workers={W}", "cluster.coordinator=",
            "cluster.heartbeat_timeout_s=120"] + cluster_sets + list(args.set)
    token = os.path.join(workdir, "job.token")
    with open(os.open(token, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
        f.write(secrets.token_hex(16))
    config = os.path.join(ROOT, "configs", "llama20m.textproto")
    # node 0: the coordinator (site 0); then servers, then workers, each
    # rank range cut evenly over the sites in order (a region's ranks).
    sites = [0] + [r * R // S for r in range(S)] + [r * R // W for r in range(W)]
    with netlab.Lab(nodes=len(sites), rate=args.rate, sites=sites, between=between) as lab:
        procs, logs = lab_compare.start_job(lab, args.build, config, sets, workdir, token, PORT,
                                            servers=[1 + r for r in range(S)], workers=[1 + S + r for r in range(W)])
        uplinks = lambda: [lab.uplink_counters(k) for k in range(R)]  # noqa: E731
        first = uplinks()
        marks = {args.warmup + 1: None, steps - 1: None}
        metrics = os.path.join(workdir, "metrics.jsonl")
        deadline = time.time() + args.timeout
        while any(p.poll() is None for p in procs[1:]):
            rows = lab_compare.count_lines(metrics)
            for step in marks:
                if marks[step] is None and rows >= step:
                    marks[step] = uplinks()
            if any(p.poll() not in (None, 0) for p in procs) or time.time() > deadline:
                for log in logs:
                    log.flush()
                raise SystemExit(f"{name}: " + ("timed out" if time.time() > deadline else "a process failed") +
                                 "\n" + lab_compare.log_tails(workdir))
            time.sleep(0.005)
        last = uplinks()
        for p in procs:
            if p.wait(timeout=60) != 0:
                raise SystemExit(f"{name}: a process exited {p.returncode}\n" + lab_compare.log_tails(workdir))
        for log in logs:
            log.close()
    rows = lab_compare.metrics_rows(workdir)
    tx = lambda cs: sum(c["tx_bytes"] for c in cs)  # noqa: E731
    if cluster_sets_diloco(cluster_sets):
        per_step = (tx(last) - tx(first)) / steps
    else:
        per_step = (tx(marks[steps - 1]) - tx(marks[args.warmup + 1])) / (steps - args.warmup - 2)
    timed = rows[args.warmup - 1:]  # from the end of step --warmup
    span_s = timed[-1]["elapsed_s"] - timed[0]["elapsed_s"]
    longest, steps_s = stalls(os.path.join(workdir, "trace"), args.warmup)
    return {"uplink_MB_per_1000_steps": round(per_step * 1000 / 1e6, 1),
            "tokens_per_s": round((len(timed) - 1) * W * 128 / span_s, 1),
            "longest_stall_s": round(longest, 3), "step_s_median": round(statistics.median(steps_s), 3),
            "uplink_drops": sum(c["tx_drops"] + c["rx_drops"] for c in last), "steps": steps}


def planned(args, cluster_sets):
    """`herd plan`'s bytes between regions per 1000 inner steps (sharding/traffic_plan.h)."""
    sets = [f"cluster.workers={args.workers}", "train.steps=1000"] + cluster_sets + [
        s for s in args.set if s.startswith(("model.", "cluster."))]
    p = subprocess.run(lab_compare.with_sets([os.path.join(args.build, "herd"), "plan",
                                              os.path.join(ROOT, "configs", "llama20m.textproto"), "--json"], sets),
                       capture_output=True, text=True, check=True)
    t = json.loads(p.stdout)["region_traffic"]
    return round(t["per_outer_period"] * 1000 / t["every"] / 1e6, 1)


def cluster_sets_diloco(cluster_sets):
    return any(s.startswith("cluster.diloco.regions=") for s in cluster_sets)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--servers", type=int, default=4)
    ap.add_argument("--regions", type=int, default=2)
    ap.add_argument("--every", type=int, default=100)
    ap.add_argument("--wires", default="FP32,INT8")
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--between", default="50mbit")
    ap.add_argument("--sync-steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--set", action="append", default=[], help="path=value for every job")
    args = ap.parse_args()
    if args.sync_steps < args.warmup + 3:
        ap.error(f"--sync-steps {args.sync_steps}: at least --warmup + 3 (steps measured between two marks)")
    scratch = tempfile.mkdtemp(prefix="diloco_traffic_")
    herd = os.path.join(args.build, "herd")
    corpus = sorted(glob.glob("/usr/share/games/fortunes/*"))
    subprocess.run([herd, "prepare", *corpus, "--out", os.path.join(scratch, "train.bin")], check=True,
                   capture_output=True)
    W, S, H = args.workers, args.servers, args.every
    ps = ["cluster.sync=PARAMETER_SERVER", f"cluster.servers={S}"]
    out = collections.OrderedDict()

    def report(job, r, between=args.between, **keys):
        out[job] = r
        line = {"bench": "diloco_traffic", "job": job, **keys, "workers": W, "regions": args.regions,
                "rate": args.rate, "between": between or "uncapped", **r}
        for anchor in ("sync_ps", "ddp"):
            if job not in ("sync_ps", "ddp") and anchor in out:
                line["vs_" + anchor] = round(out[anchor]["uplink_MB_per_1000_steps"] /
                                             max(r["uplink_MB_per_1000_steps"], 1e-9), 1)
        print(json.dumps(line), flush=True)

    report("sync_ps", run_job(args, "sync_ps", ps, args.sync_steps, args.between, scratch))
    report("ddp", run_job(args, "ddp", ["cluster.sync=ALLREDUCE", "cluster.servers=0"], args.sync_steps,
                          args.between, scratch))
    wires = args.wires.split(",")
    for wire in wires:
        diloco = ps + [f"cluster.diloco.regions={args.regions}", f"cluster.diloco.every={H}",
                       f"cluster.diloco.wire_dtype={wire}"]
        r = run_job(args, f"diloco_{wire}", diloco, 2 * H, args.between, scratch)
        r["planned_MB_per_1000_steps"] = planned(args, diloco)
        if wire == wires[-1]:
            anchor = run_job(args, f"uncapped_{wire}", diloco, 2 * H, None, scratch)
            r["vs_uncapped"] = round(r["tokens_per_s"] / anchor["tokens_per_s"], 3)
            report("diloco", r, wire=wire, every=H)
            report("uncapped", anchor, between=None, wire=wire, every=H)
        else:
            report("diloco", r, wire=wire, every=H)


if __name__ == "__main__":
    main()
