"""Parameter-server jobs when something goes wrong, through `herd launch`:

* kill -9 of a server (then of a worker, then of a server while the workers
  stream their weights) mid-training: the job stops within
  seconds, every other process names the lost rank, the launcher exits
  with the killed process's code, and no checkpoint step without a
  manifest is left looking complete;
* a plan no process could follow (more PER_TENSOR servers than tensors) is
  refused once, before anything starts;
* the processes started by hand with --coordinator form the same job as
  `herd launch` (bitwise-equal metrics)."""
import json
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import herdtest  # noqa: E402


def children(pid, name):
    out = subprocess.run(["pgrep", "-P", str(pid), "-f", name], capture_output=True, text=True).stdout
    return [int(x) for x in out.split()]


def kill_mid_run(sb, role, rank,
                 cluster="cluster { sync: PARAMETER_SERVER servers: 2 workers: 2 heartbeat_timeout_s: 5 }", tag="",
                 place="", edit=lambda text: text):
    """Kills `role` `rank` with -9 at step 20; the job must stop in one line
    naming it (with `place`, where it sits: " (tensor rank 1 of replica 0)").
    `edit`: what the tiny model's config becomes before the run."""
    name = f"kill_{role}{tag}"
    cfg = sb.write(f"{name}.textproto", edit(herdtest.tiny_config(
        "train.bin", steps=100000, ckpt=name, every=5, extra=cluster)))
    out, err = open(sb.path(f"{name}.out"), "w"), open(sb.path(f"{name}.err"), "w")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.Popen([sb.herd, "launch", cfg], cwd=sb.dir, stdout=out, stderr=err, env=env)
    deadline = time.time() + 60
    while "step     20/" not in open(sb.path(f"{name}.out")).read():
        assert p.poll() is None and time.time() < deadline, open(sb.path(f"{name}.err")).read()
        time.sleep(0.05)
    # Children in rank order: servers then workers, each its own binary.
    pids = sorted(children(p.pid, "herd-" + role))
    assert len(pids) > rank, pids
    os.kill(pids[rank], signal.SIGKILL)
    killed_at = time.time()
    try:
        rc = p.wait(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
        raise AssertionError(f"the job did not stop after {role} {rank} was killed")
    stopped_in = time.time() - killed_at
    stderr = open(sb.path(f"{name}.err")).read()
    assert rc == 128 + signal.SIGKILL, (rc, stderr[-2000:])
    assert f"{role} rank {rank}" in stderr and "was lost" in stderr, stderr[-2000:]
    assert f"herd: error: {role} {rank}{place} failed (exit code 137)" in stderr, stderr[-2000:]
    assert stopped_in < 15, f"stopping took {stopped_in:.1f} s"
    # Every step directory that has a manifest verifies; others are ignored.
    root = sb.path(name)
    for d in os.listdir(root):
        if os.path.exists(os.path.join(root, d, "manifest.json")):
            sb.run("export", os.path.join(root, d), "--out", f"hf_{name}_{d}")
    return stopped_in


def main():
    a = herdtest.parse_args()
    sb = herdtest.Sandbox(a.build)
    sb.training_data()
    try:
        t_server = kill_mid_run(sb, "server", 1)
        t_worker = kill_mid_run(sb, "worker", 0)
        # A worker streaming its weights waits on pulls and pushes all
        # through the step: it stops as promptly.
        t_streamed = kill_mid_run(sb, "server", 0, "cluster { sync: PARAMETER_SERVER servers: 2 workers: 2 "
                                  "heartbeat_timeout_s: 5 stream_weights: true }", tag="_streamed")

        # A plan nobody could follow: one line, exit 2, nothing started.
        cfg = sb.write("bad.textproto", herdtest.tiny_config(
            "train.bin", extra="cluster { sync: PARAMETER_SERVER servers: 40 workers: 1 shard_strategy: PER_TENSOR }"))
        p = sb.run("launch", cfg, check=False)
        assert p.returncode == 2 and "PER_TENSOR" in p.stderr and "launch:" not in p.stdout, (p.stdout, p.stderr)
        assert sum(l.startswith("herd: error:") for l in p.stderr.splitlines()) == 1, p.stderr

        # By hand: herd coordinator + herd-server/herd-worker = herd launch.
        job = herdtest.Job(sb, herdtest.tiny_config(
            "train.bin", steps=8, metrics="byhand.jsonl",
            extra="cluster { sync: PARAMETER_SERVER servers: 2 workers: 2 }"))
        try:
            job.start_coordinator()
            for role in ("server", "worker"):
                for r in (1, 0):
                    job._spawn(f"{role}{r}", [os.path.join(sb.build, "herd-" + role), job.config, "--rank", str(r),
                                              "--coordinator", job.addr])
            for name in ("server0", "server1", "worker0", "worker1", "coordinator"):
                assert job.wait(name, 60) == 0, job.stderr(name)
        finally:
            job.kill_all()
        sb.write("launched.textproto", open(job.config).read().replace("byhand.jsonl", "launched.jsonl"))
        sb.run("launch", "launched.textproto")
        key = lambda m: (m["step"], m["loss"], m["grad_norm"])  # noqa: E731
        by_hand = [key(json.loads(l)) for l in open(sb.path("byhand.jsonl"))]
        launched = [key(json.loads(l)) for l in open(sb.path("launched.jsonl"))]
        assert by_hand == launched and len(by_hand) == 8, (by_hand, launched)
    finally:
        subprocess.run(["pkill", "-9", "-f", sb.dir], capture_output=True)
    print(f"ps_failure: server kill stopped the job in {t_server:.1f} s, worker kill in {t_worker:.1f} s, "
          f"server kill with streamed weights in {t_streamed:.1f} s; "
          "bad plan refused once; by-hand job = launched job")


if __name__ == "__main__":
    main()
