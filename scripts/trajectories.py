#!/usr/bin/python3
"""Records what a set of reference jobs computed, so that a change meant to
leave the arithmetic alone (a refactor) can be checked bitwise: run it with
the build from before the change and with the build after, on the same
machine, then compare.

    scripts/trajectories.py record --build BUILD --out DIR [--only JOB,...]
    scripts/trajectories.py compare DIR_BEFORE DIR_AFTER

The jobs (the tiny test model on a synthetic corpus, 30 steps unless said):
  single         one process on the CPU, and again stopped at 10 + --resume
  ps22           parameter-server mode, 2 servers, 2 workers
  ddp2           all-reduce, 2 workers
  zero1_3        all-reduce with ZeRO-1, 3 workers
  gpu_single     one process on the emulated GPU (BUILD/emulated), 6 steps
  gpu_ps         2 CPU servers + 2 emulated GPU workers, 6 steps
  ps_streamed    parameter-server mode with cluster.stream_weights, 2 + 2
  ps_elastic     cluster.elastic, 2 servers, 3 workers; worker 2 is killed
                 with SIGKILL once step 12 is logged and the job goes on
                 with 2 (its checkpoints equal an undisturbed run's)
  pipeline2      all-reduce, 2 pipeline stages (1F1B), 2 micro-batches
  tensor2        all-reduce, tensor parallelism over 2 workers
  ps_tensor2     parameter-server mode, 2 servers, tensor parallelism 2
  context2       all-reduce, context parallelism over 2 workers
  grid222        all-reduce, data x pipeline x tensor 2 x 2 x 2 (8 workers),
                 2 micro-batches
  hsdp4          all-reduce, ZeRO-1 in shard groups of 2 (4 workers: HSDP)
  tensor_context all-reduce, data x tensor x context 2 x 2 x 2 (8 workers)
  regions2       2 regions of 1 server and 1 worker, an outer step every 5
                 inner steps (outer lr 0.7, momentum 0.9)
For each job DIR/JOB/ holds metrics.jsonl without its timing fields
(tokens_per_s, elapsed_s, step_s, eta_s, mfu, network_wait: they differ
from run to run) and every shard (a region's and the outer state's too), worker-state and
manifest file of its checkpoints. `compare`
prints one JSON line per job and file set, and exits 1 when any differs.
Jobs whose binaries are missing (no emulated build) are skipped, and said so.
"""
import argparse
import filecmp
import json
import os
import shutil
import signal
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
import herdtest  # noqa: E402

TIMING = ("tokens_per_s", "elapsed_s", "network_wait", "step_s", "eta_s", "mfu")


def jobs():
    ps = "cluster { sync: PARAMETER_SERVER servers: 2 workers: 2 }"
    ddp = "cluster { sync: ALLREDUCE workers: 2 }"
    zero1 = "cluster { sync: ALLREDUCE workers: 3 zero_stage: 1 }"
    gpu = "device { kind: CUDA dtype: FP32 }"
    streamed = "cluster { sync: PARAMETER_SERVER servers: 2 workers: 2 stream_weights: true }"
    elastic = "cluster { sync: PARAMETER_SERVER servers: 2 workers: 3 elastic: true }"
    pipeline = "cluster { sync: ALLREDUCE workers: 2 pipeline_stages: 2 }"
    tensor = "cluster { sync: ALLREDUCE workers: 2 tensor_parallel: 2 }"
    ps_tensor = "cluster { sync: PARAMETER_SERVER servers: 2 workers: 2 tensor_parallel: 2 }"
    context = "cluster { sync: ALLREDUCE workers: 2 context_parallel: 2 }"
    grid = "cluster { sync: ALLREDUCE workers: 8 pipeline_stages: 2 tensor_parallel: 2 }"
    hsdp = "cluster { sync: ALLREDUCE workers: 4 zero_stage: 1 shard_group_size: 2 }"
    tensor_context = "cluster { sync: ALLREDUCE workers: 8 tensor_parallel: 2 context_parallel: 2 }"
    regions = ("cluster { sync: PARAMETER_SERVER servers: 2 workers: 2 "
               "diloco { regions: 2 every: 5 outer_lr: 0.7 outer_momentum: 0.9 } }")
    # name: (binary dir under BUILD, steps, batch per worker, extra config, split resume, kill at step,
    #        micro-batches a step)
    return {
        "single": ("", 30, 8, "", True, None, 1),
        "ps22": ("", 30, 4, ps, False, None, 1),
        "ddp2": ("", 30, 4, ddp, False, None, 1),
        "zero1_3": ("", 30, 4, zero1, False, None, 1),
        "gpu_single": ("emulated", 6, 8, gpu, False, None, 1),
        "gpu_ps": ("emulated", 6, 4, gpu + "\n" + ps, False, None, 1),
        "ps_streamed": ("", 30, 4, streamed, False, None, 1),
        "ps_elastic": ("", 30, 4, elastic, False, 12, 1),
        "pipeline2": ("", 30, 4, pipeline, False, None, 2),
        "tensor2": ("", 30, 4, tensor, False, None, 1),
        "ps_tensor2": ("", 30, 4, ps_tensor, False, None, 1),
        "context2": ("", 30, 4, context, False, None, 1),
        "grid222": ("", 20, 2, grid, False, None, 2),
        "hsdp4": ("", 30, 2, hsdp, False, None, 1),
        "tensor_context": ("", 20, 2, tensor_context, False, None, 1),
        "regions2": ("", 30, 4, regions, False, None, 1),
    }


def launch_and_kill(sb, cfg, metrics, at):
    """`herd launch cfg`, killing worker rank 2 with SIGKILL once the
    metrics reach step `at`; the elastic job must finish without it."""
    p = subprocess.Popen([sb.herd, "launch", cfg], cwd=sb.dir, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    try:
        herdtest.wait_for_step(sb.path(metrics), at, "ps_elastic")
        pids = [pid for pid, argv in herdtest.child_processes(p.pid)
                if argv and argv[0].endswith("herd-worker") and argv[argv.index("--rank") + 1] == "2"]
        assert len(pids) == 1, f"ps_elastic: worker rank 2 not found among the launch's children"
        os.kill(pids[0], signal.SIGKILL)
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, f"ps_elastic: launch exited {p.returncode} after the kill:\n{err[-3000:]}"
    finally:
        if p.poll() is None:
            p.kill()


def record(build, out, only=None):
    os.makedirs(out, exist_ok=True)
    for name, (sub, steps, batch, extra, split, kill_at, micro) in jobs().items():
        if only and name not in only:
            continue
        sb = herdtest.Sandbox(os.path.join(build, sub) if sub else build)
        if not os.path.exists(sb.herd):
            print(json.dumps({"job": name, "skipped": f"{sb.herd} not built"}))
            continue
        try:
            sb.corpus()
            sb.run("prepare", "corpus.txt", "--out", "train.bin")
            runs = [("straight", [])] + ([("split", ["--stop-at", "10"]), ("split", ["--resume"])] if split else [])
            for run, args in runs:
                text = herdtest.tiny_config("train.bin", steps=steps, ckpt=run, every=10, metrics=run + ".jsonl",
                                            extra=extra)
                text = text.replace("batch_size: 4", f"batch_size: {batch} grad_accum: {micro}")
                cfg = sb.write(run + ".textproto", text)
                if kill_at is None:
                    sb.run("launch", cfg, *args)
                else:
                    launch_and_kill(sb, cfg, run + ".jsonl", kill_at)
            for run in sorted({r for r, _ in runs}):
                dest = os.path.join(out, name, run)
                os.makedirs(dest, exist_ok=True)
                with open(sb.path(run + ".jsonl")) as f, open(os.path.join(dest, "metrics.jsonl"), "w") as g:
                    for line in f:
                        m = json.loads(line)
                        for k in TIMING:
                            m.pop(k, None)
                        g.write(json.dumps(m, sort_keys=True) + "\n")
                for step in sorted(d for d in os.listdir(sb.path(run)) if d.startswith("step_")):
                    for part in sorted(os.listdir(sb.path(run, step))):
                        if part.startswith(("shard_", "worker_", "region_", "outer_")) or part == "manifest.json":
                            os.makedirs(os.path.join(dest, step), exist_ok=True)
                            shutil.copy(sb.path(run, step, part), os.path.join(dest, step, part))
            print(json.dumps({"job": name, "recorded": os.path.join(out, name)}))
        finally:
            shutil.rmtree(sb.dir, ignore_errors=True)


def compare(a, b):
    same = True
    for name in jobs():
        da, db = os.path.join(a, name), os.path.join(b, name)
        if not (os.path.isdir(da) and os.path.isdir(db)):
            print(json.dumps({"job": name, "compared": False, "why": "not recorded in both"}))
            continue
        files = sorted(os.path.relpath(os.path.join(d, f), da) for d, _, fs in os.walk(da) for f in fs)
        other = sorted(os.path.relpath(os.path.join(d, f), db) for d, _, fs in os.walk(db) for f in fs)
        differ = sorted(set(files) ^ set(other))
        differ += [f for f in set(files) & set(other)
                   if not filecmp.cmp(os.path.join(da, f), os.path.join(db, f), shallow=False)]
        print(json.dumps({"job": name, "files": len(files), "identical": not differ, "differ": sorted(differ)}))
        same &= not differ
    return same


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    r = sub.add_parser("record")
    r.add_argument("--build", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--only", default="", help="comma-separated jobs to record (default: all)")
    c = sub.add_parser("compare")
    c.add_argument("before")
    c.add_argument("after")
    a = ap.parse_args()
    if a.command == "record":
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        record(os.path.abspath(a.build), os.path.abspath(a.out), [j for j in a.only.split(",") if j])
        return 0
    return 0 if compare(a.before, a.after) else 1


if __name__ == "__main__":
    sys.exit(main())
