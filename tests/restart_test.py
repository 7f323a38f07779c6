"""Restarts by themselves: 10 trials of a parameter-server job (S=2 W=2,
fp32 on the wire, a checkpoint every 25 steps) in which a process is
killed with SIGKILL at a random step. Every trial finishes all its steps
through --max-restarts, and its final checkpoint is byte for byte the
uninterrupted run's: a restart resumes from the newest complete
checkpoint, and resume is bit-exact.

* `herd launch --max-restarts 2` (6 trials): a random server or worker is
  killed; the launcher stops the job and starts it again.
* A job started by hand (5 trials): `herd coordinator --max-restarts 2`
  and herd-server/herd-worker processes with --max-restarts 2. The
  coordinator itself is killed (2 trials) or a server (2 trials); this
  test plays the part of the supervisor (systemd, a Slurm script) that
  starts the killed process again, with --resume-if-any. The survivors
  start themselves again and rejoin. In the fifth a worker is stopped
  (SIGSTOP) until the coordinator declares it lost, then continued: told
  so, it starts itself again as the others do, and nobody restarts it."""
import os
import random
import shutil
import signal
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import herdtest  # noqa: E402

STEPS, EVERY = 600, 25
TOKEN = "restart-test-token-0123456789"


def final_checkpoint(workdir):
    return herdtest.snapshot(os.path.join(workdir, "ckpt", f"step_{STEPS:08d}"))


def launch_trial(sb, workdir, rng, name):
    victim = rng.choice(["herd-server", "herd-worker"])
    rank = rng.randrange(2)
    at = rng.randrange(30, 400)
    out_path, err_path = os.path.join(workdir, "launch.out"), os.path.join(workdir, "launch.err")
    with open(out_path, "w") as out_file, open(err_path, "w") as err_file:
        p = subprocess.Popen([sb.herd, "launch", "job.textproto", "--max-restarts", "2"], cwd=workdir,
                             stdout=out_file, stderr=err_file, env=dict(os.environ, OMP_NUM_THREADS="1"))
    herdtest.wait_for_step(os.path.join(workdir, "metrics.jsonl"), at, name)
    killed = False
    for pid, cmd in herdtest.child_processes(p.pid):
        if cmd and cmd[0].endswith(victim) and cmd[cmd.index("--rank") + 1] == str(rank):
            os.kill(pid, signal.SIGKILL)
            killed = True
    assert p.wait(timeout=120) == 0, f"{name}: launch exited {p.returncode}:\n{open(err_path).read()[-3000:]}"
    out = open(out_path).readlines()
    restarts = [l for l in out if l.startswith("launch: restart 1 of 2 after ")]
    assert killed and len(restarts) == 1, f"{name}: killed={killed}, restart lines {restarts}\n{''.join(out)[-3000:]}"
    return f"{victim} {rank} killed at step {at}: " + restarts[0].strip()


def by_hand_trial(sb, workdir, rng, name, victim):
    port = herdtest.free_port()
    addr = f"127.0.0.1:{port}"
    env = dict(os.environ, HERD_JOB_TOKEN=TOKEN, OMP_NUM_THREADS="1")
    procs = {}

    def start(key, argv):
        out = open(os.path.join(workdir, key + ".out"), "a")
        procs[key] = subprocess.Popen(argv, cwd=workdir, stdout=out, stderr=subprocess.STDOUT, env=env)

    def coordinator():
        start("coordinator", [sb.herd, "coordinator", "job.textproto", "--listen", addr, "--max-restarts", "2"])

    def node(role, rank, *extra):
        binary = os.path.join(sb.build, "herd-" + role)
        start(f"{role}{rank}", [binary, "job.textproto", "--rank", str(rank), "--coordinator", addr, "--max-restarts", "2",
                                *extra])

    coordinator()
    for r in range(2):
        node("server", r)
        node("worker", r)
    at = rng.randrange(30, 400)
    herdtest.wait_for_step(os.path.join(workdir, "metrics.jsonl"), at, name)
    if victim == "stopped-worker":
        key = f"worker{rng.randrange(2)}"
        procs[key].send_signal(signal.SIGSTOP)
        # Silent past cluster.heartbeat_timeout_s: declared lost, and the
        # job restarts without it; continued, it must start itself again.
        herdtest.wait_for_text(os.path.join(workdir, "coordinator.out"), "restart 1 of 2", 60, name)
        procs[key].send_signal(signal.SIGCONT)
    else:
        key = "coordinator" if victim == "coordinator" else f"server{rng.randrange(2)}"
        procs[key].kill()
        procs[key].wait()
        # The supervisor's part: start the killed process again.
        if key == "coordinator":
            coordinator()
        else:
            node("server", int(key[-1]), "--resume-if-any")
    for k, p in procs.items():
        assert p.wait(timeout=120) == 0, f"{name}: {k} exited {p.returncode}:\n" + \
            open(os.path.join(workdir, k + ".out")).read()[-3000:]
    lines = [l.strip() for k in procs for l in open(os.path.join(workdir, k + ".out")) if ": restart after: " in l]
    assert lines, f"{name}: no process restarted"
    if victim == "stopped-worker":
        own = [l.strip() for l in open(os.path.join(workdir, key + ".out")) if ": restart after: " in l]
        assert own and "was declared lost" in own[0], f"{name}: {key} did not start itself again: {own}"
        return f"{key} stopped at step {at} until declared lost, then continued: '{own[0]}'"
    return f"{key} killed at step {at}: {len(lines)} process restarts, e.g. '{lines[0]}'"


def main():
    a = herdtest.parse_args()
    sb = herdtest.Sandbox(a.build)
    sb.training_data()
    cluster = "cluster { sync: PARAMETER_SERVER servers: 2 workers: 2 }"

    # Every run in a directory of its own with the same config text, so
    # that the checkpoints' copies of the config are identical too.
    text = herdtest.tiny_config(sb.path("train.bin"), steps=STEPS, ckpt="ckpt", every=EVERY, metrics="metrics.jsonl",
                                extra=cluster)

    def workdir(name):
        os.makedirs(sb.path(name))
        sb.write(os.path.join(name, "job.textproto"), text)
        return sb.path(name)

    straight = workdir("straight")
    subprocess.run([sb.herd, "launch", "job.textproto"], cwd=straight, check=True, capture_output=True,
                   env=dict(os.environ, OMP_NUM_THREADS="1"))
    want = final_checkpoint(straight)
    rng = random.Random(1234)
    plan = ["launch"] * 6 + ["coordinator", "server", "coordinator", "server", "stopped-worker"]
    for i, kind in enumerate(plan):
        name = f"trial{i}"
        d = workdir(name)
        if kind == "launch":
            what = launch_trial(sb, d, rng, name)
        else:
            what = by_hand_trial(sb, d, rng, name, kind)
        got = final_checkpoint(d)
        assert got == want, f"{name}: final checkpoint differs from the uninterrupted run's: " + \
            str({k: (got.get(k), want.get(k)) for k in set(got) | set(want) if got.get(k) != want.get(k)})
        print(f"ok  {name}: {what}; step {STEPS} checkpoint ({len(got)} files) identical to the uninterrupted run's")
    shutil.rmtree(sb.dir)


if __name__ == "__main__":
    main()
