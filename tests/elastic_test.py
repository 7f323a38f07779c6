"""Elastic workers: trials of a parameter-server job (S=2 W=3,
cluster.elastic, fp32 on the wire) in which a random worker is killed
with SIGKILL at a random step.

Every trial finishes all its steps with the workers that are left, and
ends where the uninterrupted run ends, bit for bit: the final loss and the
whole final checkpoint (weights, AdamW state, data position). The global
batch is cluster.workers shares whoever computes them, and the servers
sum the shares in share order, so losing a worker changes who computes,
not what is summed or in which order.

Prints, per trial, the step-time hiccup: the longest step after the kill
against the median step of the uninterrupted run, and the median step
after the kill (fewer workers compute the same global batch)."""
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import herdtest  # noqa: E402

STEPS, EVERY, WORKERS = 400, 50, 3


def step_times(rows):
    """{step: seconds the step took}, from consecutive metrics lines."""
    by_step = {r["step"]: r["elapsed_s"] for r in rows}
    return {s: by_step[s] - by_step[s - 1] for s in by_step if s - 1 in by_step}


def workers(launch_pid):
    """{rank: pid} of the launch's live worker processes."""
    out = {}
    for pid, argv in herdtest.child_processes(launch_pid):
        if argv and argv[0].endswith("herd-worker"):
            out[int(argv[argv.index("--rank") + 1])] = pid
    return out


def kill_trial(sb, workdir, rng, name, kills):
    """Kills `kills` random workers, one after the other, at random steps."""
    out_path, err_path = os.path.join(workdir, "launch.out"), os.path.join(workdir, "launch.err")
    metrics = os.path.join(workdir, "metrics.jsonl")
    with open(out_path, "w") as out_file, open(err_path, "w") as err_file:
        p = subprocess.Popen([sb.herd, "launch", "job.textproto"], cwd=workdir, stdout=out_file, stderr=err_file,
                             env=dict(os.environ, OMP_NUM_THREADS="1"))
    killed = []
    try:
        at = 0
        for _ in range(kills):
            at = rng.randrange(at + 10, at + (STEPS - 50 - at) // 2)
            herdtest.wait_for_step(metrics, at, name)
            rank, pid = rng.choice(sorted(workers(p.pid).items()))
            os.kill(pid, signal.SIGKILL)
            killed.append((rank, at))
        assert p.wait(timeout=120) == 0, f"{name}: launch exited {p.returncode}:\n{open(err_path).read()[-3000:]}"
    finally:
        if p.poll() is None:
            p.kill()
    out = open(out_path).read()
    for rank, _ in killed:
        line = f"worker {rank} lost at step "
        assert line in out, f"{name}: no '{line}...' progress line:\n{out[-3000:]}"
        assert f"launch: worker {rank} exited (killed by SIGKILL); the job goes on without it" in out, out[-3000:]
    return killed


def main():
    a = herdtest.parse_args()
    sb = herdtest.Sandbox(a.build)
    sb.training_data()
    cluster = f"cluster {{ sync: PARAMETER_SERVER servers: 2 workers: {WORKERS} elastic: true }}"
    # Every run in a directory of its own with the same config text, so
    # that the checkpoints' copies of the config are identical too.
    text = herdtest.tiny_config(sb.path("train.bin"), steps=STEPS, ckpt="ckpt", every=EVERY, metrics="metrics.jsonl",
                                extra=cluster)

    def workdir(name):
        os.makedirs(sb.path(name))
        sb.write(os.path.join(name, "job.textproto"), text)
        return sb.path(name)

    def final(d):
        rows = herdtest.metrics_rows(os.path.join(d, "metrics.jsonl"))
        return rows, herdtest.snapshot(os.path.join(d, "ckpt", f"step_{STEPS:08d}"))

    straight = workdir("straight")
    subprocess.run([sb.herd, "launch", "job.textproto"], cwd=straight, check=True, capture_output=True,
                   env=dict(os.environ, OMP_NUM_THREADS="1"))
    want_rows, want_ckpt = final(straight)
    median = statistics.median(step_times(want_rows).values())
    print(f"uninterrupted: final loss {want_rows[-1]['loss']!r}, median step {1e3 * median:.1f} ms")

    rng = random.Random(2024)
    plan = [1] * 13 + [2] * 2  # workers killed per trial
    for i, kills in enumerate(plan):
        name = f"trial{i}"
        d = workdir(name)
        killed = kill_trial(sb, d, rng, name, kills)
        rows, ckpt = final(d)
        steps = [r["step"] for r in rows]
        assert steps == list(range(1, STEPS + 1)), f"{name}: metrics steps are not 1..{STEPS} once each: " + \
            str(sorted(set(range(1, STEPS + 1)) ^ set(steps))[:10])
        got, want = rows[-1]["loss"], want_rows[-1]["loss"]
        assert abs(got - want) <= 1e-5 * abs(want), f"{name}: final loss {got!r}, uninterrupted {want!r}"
        assert ckpt == want_ckpt, f"{name}: final checkpoint differs from the uninterrupted run's: " + \
            str(sorted(k for k in set(ckpt) | set(want_ckpt) if ckpt.get(k) != want_ckpt.get(k)))
        times = step_times(rows)
        after = [times[s] for s in times if s > killed[0][1]]
        hiccup, steady = max(after), statistics.median(after)
        what = ", ".join(f"worker {r} killed at step {s}" for r, s in killed)
        print(f"ok  {name}: {what}; final loss and step {STEPS} checkpoint identical to the uninterrupted run's; "
              f"longest step after the kill {1e3 * hiccup:.0f} ms ({hiccup / median:.1f}x the median step), "
              f"median after it {1e3 * steady:.1f} ms")
    shutil.rmtree(sb.dir)


if __name__ == "__main__":
    main()
