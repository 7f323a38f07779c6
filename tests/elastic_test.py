"""Elastic workers: 20 trials (9 without scripts/test.sh --long) of a
parameter-server job (S=2 W=3,
cluster.elastic, fp32 on the wire) in which a random worker is killed
with SIGKILL at a random step (two, in some) and, in 5 of them, a new
worker joins in its place: started by the launcher (--max-restarts) at
once, or by hand (herd-worker --join) a random number of steps later (in
one, two join at once; in one, the worker that joined is killed in
turn and another joins).

Every trial finishes all its steps, and ends where the uninterrupted run
ends, bit for bit: the final loss and the whole final checkpoint
(weights, AdamW state, data position). The global batch is
cluster.workers shares whoever computes them, and the servers sum the
shares in share order, so losing or gaining a worker changes who
computes, not what is summed or in which order.

Prints, per trial, the step-time hiccup: the longest step after the kill
(or the join) against the median step of the uninterrupted run, and the
median step after it."""
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time

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


def kill_trial(sb, workdir, rng, name, kills, restarts=0):
    """Kills `kills` random workers, one after the other, at random steps;
    with `restarts`, the launcher starts a worker to join in place of each."""
    out_path, err_path = os.path.join(workdir, "launch.out"), os.path.join(workdir, "launch.err")
    metrics = os.path.join(workdir, "metrics.jsonl")
    with open(out_path, "w") as out_file, open(err_path, "w") as err_file:
        p = subprocess.Popen([sb.herd, "launch", "job.textproto", "--max-restarts", str(restarts)], cwd=workdir,
                             stdout=out_file, stderr=err_file, env=dict(os.environ, OMP_NUM_THREADS="1"))
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
    if restarts:
        joins = [l for l in out.splitlines() if l.startswith("launch: a new worker ")]
        assert len(joins) == kills and out.count(" joined the job: it computes from step ") == kills, \
            f"{name}: {kills} workers killed, {len(joins)} started to join:\n{out[-3000:]}"
    return killed


def join_trial(sb, workdir, rng, name, plan):
    """A job started by hand: `plan` is a list of ("kill", None) and
    ("join", n) events, taken in order a random number of steps apart;
    "kill" kills a random live worker (or, with plan's "kill-joined", the
    latest to join), "join" starts n workers with --join at once.
    "kill-server" kills server 1 and starts it again with --resume-if-any,
    as a supervisor would; every process of such a plan has
    --max-restarts 2, so the job starts again from its newest checkpoint,
    the workers that joined with it (they restart with --join
    --resume-if-any and find the job forming)."""
    restarts = ["--max-restarts", "2"] if ("kill-server", None) in plan else []
    addr = f"127.0.0.1:{herdtest.free_port()}"
    env = dict(os.environ, HERD_JOB_TOKEN="elastic-join-token-0123456789", OMP_NUM_THREADS="1")
    metrics = os.path.join(workdir, "metrics.jsonl")
    procs, live, outputs = {}, {}, []

    def start(key, argv):
        path = os.path.join(workdir, key + ".out")
        outputs.append(path)
        procs[key] = subprocess.Popen(argv, cwd=workdir, stdout=open(path, "w"), stderr=subprocess.STDOUT, env=env)
        return procs[key]

    def output():
        return "".join(open(p).read() for p in outputs)

    def await_output(done, what):
        """Waits (60 s at most) until done(output()) holds; the processes'
        last lines if it does not."""
        deadline = time.time() + 60
        while not done(output()):
            if time.time() > deadline:
                tails = "".join(f"--- {os.path.basename(p)}:\n" + "".join(open(p).readlines()[-8:]) for p in outputs)
                raise AssertionError(f"{name}: {what}\n{tails}")
            time.sleep(0.01)

    start("coordinator", [sb.herd, "coordinator", "job.textproto", "--listen", addr, *restarts])
    for r in range(2):
        start(f"server{r}", [os.path.join(sb.build, "herd-server"), "job.textproto", "--rank", str(r),
                             "--coordinator", addr, *restarts])
    for r in range(WORKERS):
        live[f"worker{r}"] = start(f"worker{r}", [os.path.join(sb.build, "herd-worker"), "job.textproto",
                                                   "--rank", str(r), "--coordinator", addr, *restarts])
    events, at, joined, join_steps = [], 0, [], []
    rank_of = {f"worker{r}": r for r in range(WORKERS)}
    lost, last_ranks = set(), []
    try:
        for kind, n in plan:
            at = max(at, herdtest.last_step(metrics)) + rng.randrange(5, 40)
            herdtest.wait_for_step(metrics, at, name)
            if kind == "kill-server":
                procs["server1"].kill()
                procs["server1"].wait()
                start("server1-again", [os.path.join(sb.build, "herd-server"), "job.textproto", "--rank", "1",
                                        "--coordinator", addr, "--resume-if-any", *restarts])
                events.append(f"server 1 killed at step {at} and started again")
            elif kind in ("kill", "kill-joined"):
                key = joined[-1] if kind == "kill-joined" else rng.choice(sorted(live))
                lost.add(rank_of[key])
                lost_before = output().count(" lost at step ")
                live.pop(key).kill()
                procs[key].wait()
                events.append(f"{key} killed at step {at}")
                # A worker joins in place of a lost one: once the job knows.
                await_output(lambda out: out.count(" lost at step ") > lost_before,
                             f"no 'lost at step' line after killing {key}")
            else:
                # The coordinator gives each the lowest lost rank, in turn.
                last_ranks = sorted(lost)[:n]
                lost -= set(last_ranks)
                joins_before = output().count(" joined at step ")
                for i in range(n):
                    key = f"joiner{len(joined)}"
                    joined.append(key)
                    rank_of[key] = last_ranks[0] if n == 1 else None
                    live[key] = start(key, [os.path.join(sb.build, "herd-worker"), "job.textproto", "--join",
                                            "--coordinator", addr, *restarts])
                events.append(f"{n} worker{'s' if n > 1 else ''} started to join at step {at}")
                join_steps.append(at)
                # The next event once they are in (the job said so, and
                # they did): a server lost before would find them joining.
                await_output(lambda out: out.count(" joined at step ") >= joins_before + n and all(
                    " joined the job: " in open(os.path.join(workdir, k + ".out")).read() for k in joined[-n:]),
                    f"{n} started to join at step {at} and are not in")
        for key, p in procs.items():
            if key in live or not key.startswith(("worker", "joiner", "server1")) or key == "server1-again":
                assert p.wait(timeout=120) == 0, f"{name}: {key} exited {p.returncode}:\n" + \
                    open(os.path.join(workdir, key + ".out")).read()[-3000:]
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
    out = output()
    for key in joined:
        text = open(os.path.join(workdir, key + ".out")).read()
        assert " joined the job: " in text, f"{name}: {key} did not say where it joined:\n{text[-2000:]}"
    assert out.count(" joined at step ") >= len(joined), f"{name}: the leader did not report every join:\n{out[-3000:]}"
    # The worker that joined last (every plan ends with a join) computed
    # exactly its own share of each step from where it joined: the others
    # dealt it in on that very step. One that joined just before it may
    # have had a missing worker's share too for a few steps.
    summary = {f: json.load(open(os.path.join(workdir, "summary", f))) for f in os.listdir(os.path.join(workdir, "summary"))}
    counts = sorted((summary[f"worker_{r:05d}.json"]["steps"], summary[f"worker_{r:05d}.json"]["shares_computed"], r)
                    for r in last_ranks)
    assert counts[0][0] > 0 and counts[0][1] == counts[0][0] and all(c >= s for s, c, _ in counts), \
        f"{name}: the workers that joined last computed (steps, shares, rank) {counts}"
    dropped = sum(v["pushes_dropped"] for f, v in summary.items() if f.startswith("server"))
    events.append(f"{dropped} pushes dropped as copies")
    return events, join_steps


def main():
    a = herdtest.parse_args()
    sb = herdtest.Sandbox(a.build)
    sb.training_data()
    cluster = f"cluster {{ sync: PARAMETER_SERVER servers: 2 workers: {WORKERS} elastic: true }}"
    # Every run in a directory of its own with the same config text, so
    # that the checkpoints' copies of the config are identical too.
    text = herdtest.tiny_config(sb.path("train.bin"), steps=STEPS, ckpt="ckpt", every=EVERY, metrics="metrics.jsonl",
                                extra=cluster).replace("sample_tokens: 0", 'sample_tokens: 0 summary_dir: "summary"')

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
    # The reference is elastic too: it must itself train as the same job
    # without cluster.elastic does (losses, norms, weights, moments, data
    # positions; the checkpoint's copy of the config differs by that flag).
    fixed = workdir("not_elastic")
    sb.write(os.path.join("not_elastic", "job.textproto"), text.replace(" elastic: true", ""))
    subprocess.run([sb.herd, "launch", "job.textproto"], cwd=fixed, check=True, capture_output=True,
                   env=dict(os.environ, OMP_NUM_THREADS="1"))
    fixed_rows, _ = final(fixed)
    key = lambda rows: [(r["step"], r["loss"], r["grad_norm"]) for r in rows]  # noqa: E731
    assert key(fixed_rows) == key(want_rows), "the elastic job without faults trains differently from a fixed one"
    last = f"step_{STEPS:08d}"
    assert herdtest.training_state(os.path.join(fixed, "ckpt", last)) == \
        herdtest.training_state(os.path.join(straight, "ckpt", last)), \
        "the elastic job's final checkpoint differs from the fixed job's"
    print("ok  without faults the elastic job trains bit for bit as the same job without cluster.elastic")
    median = statistics.median(step_times(want_rows).values())
    print(f"uninterrupted: final loss {want_rows[-1]['loss']!r}, median step {1e3 * median:.1f} ms")

    rng = random.Random(2024)
    plan = [1] * 13 + [2] * 2 if herdtest.LONG else [1] * 3 + [2]  # workers killed per trial
    # Workers that join: started by the launcher (--max-restarts) in place
    # of each one killed, or by hand (herd-worker --join).
    launched = [(1, 1), (2, 2)]  # (workers killed, restarts)
    by_hand = [
        [("kill", None), ("join", 1)],
        [("kill", None), ("kill", None), ("join", 2)],
        [("kill", None), ("join", 1), ("kill-joined", None), ("join", 1)],
        # The job starts again with the worker that joined.
        [("kill", None), ("join", 1), ("kill-server", None)],
    ]
    for i, kills in enumerate(plan + launched + by_hand):
        name = f"trial{i}"
        d = workdir(name)
        if not isinstance(kills, list):
            count, restarts = (kills, 0) if isinstance(kills, int) else kills
            killed = kill_trial(sb, d, rng, name, count, restarts)
            what = ", ".join(f"worker {r} killed at step {s}" for r, s in killed)
            what += f"; {count} joined in their place (launcher)" if restarts else ""
            first = killed[0][1]
        else:
            events, join_steps = join_trial(sb, d, rng, name, kills)
            what = "; ".join(events)
            first = int(events[0].rsplit(" ", 1)[1])
        rows, ckpt = final(d)
        steps = [r["step"] for r in rows]
        if "started again" in what:  # steps after the resume point are trained (and logged) twice
            steps = sorted(set(steps))
        assert steps == list(range(1, STEPS + 1)), f"{name}: metrics steps are not 1..{STEPS} once each: " + \
            str(sorted(set(range(1, STEPS + 1)) ^ set(steps))[:10])
        got, want = rows[-1]["loss"], want_rows[-1]["loss"]
        assert abs(got - want) <= 1e-5 * abs(want), f"{name}: final loss {got!r}, uninterrupted {want!r}"
        assert ckpt == want_ckpt, f"{name}: final checkpoint differs from the uninterrupted run's: " + \
            str(sorted(k for k in set(ckpt) | set(want_ckpt) if ckpt.get(k) != want_ckpt.get(k)))
        times = step_times(rows)
        after = [times[s] for s in times if s > first]
        hiccup, steady = max(after), statistics.median(after)
        joining = ""
        if isinstance(kills, list):
            # The joiners start up while the others go on; the steps until
            # they are in take the join's cost.
            around = [times[s] for s in times if join_steps[-1] < s <= join_steps[-1] + 30]
            joining = f", longest of the 30 steps after the last join began {1e3 * max(around):.0f} ms " \
                      f"({max(around) / median:.1f}x)"
        print(f"ok  {name}: {what}; final loss and step {STEPS} checkpoint identical to the uninterrupted run's; "
              f"longest step after the kill {1e3 * hiccup:.0f} ms ({hiccup / median:.1f}x the median step), "
              f"median after it {1e3 * steady:.1f} ms{joining}")


if __name__ == "__main__":
    main()
