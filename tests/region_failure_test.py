"""A job of regions (cluster.diloco) that loses a region goes on without
it: 3 regions of one server and one worker each, H = 5, the tiny model,
through `herd launch`; a process of region 1 or 2 (its server or its
worker) is killed with SIGKILL at a random step, 2 trials (10 with
scripts/test.sh --long, the killed process and step drawn anew):

* the job finishes every step and exits 0; the launcher says it went on
  without the killed process's region, and the region's other process is
  let go (the coordinator told it who was lost);
* the surviving regions end with the same weights, bit for bit (each
  server's CRC-32 of its final weights in its run summary): every outer
  step after the loss summed the same regions' contributions in the same
  order on both;
* it goes on learning: the last ten losses' mean is below the ten before
  the kill;
* the checkpoints after the loss are abandoned, none written half: every
  step directory with a manifest is from before the loss."""
import glob
import json
import os
import random
import signal
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import herdtest  # noqa: E402

STEPS, REGIONS = 300, 3


def processes(launch_pid):
    """{(role, rank): pid} of the launch's live server and worker processes."""
    out = {}
    for pid, argv in herdtest.child_processes(launch_pid):
        if argv and argv[0].endswith(("herd-server", "herd-worker")):
            role = "server" if argv[0].endswith("herd-server") else "worker"
            out[(role, int(argv[argv.index("--rank") + 1]))] = pid
    return out


def trial(sb, name, rng):
    workdir = sb.path(name)
    os.makedirs(workdir)
    text = herdtest.tiny_config(sb.path("train.bin"), steps=STEPS, metrics="metrics.jsonl", ckpt="ckpt", every=50,
                                extra=f"cluster {{ sync: PARAMETER_SERVER servers: {REGIONS} workers: {REGIONS} "
                                      f"diloco {{ regions: {REGIONS} every: 5 outer_lr: 1 outer_momentum: 0 }} }}")
    with open(os.path.join(workdir, "job.textproto"), "w") as f:
        f.write(text.replace("log {", 'log { summary_dir: "summary"'))
    out_path, err_path = os.path.join(workdir, "launch.out"), os.path.join(workdir, "launch.err")
    metrics = os.path.join(workdir, "metrics.jsonl")
    role, region = rng.choice(["server", "worker"]), rng.randrange(1, REGIONS)
    at = rng.randrange(20, STEPS // 2)
    with open(out_path, "w") as out_file, open(err_path, "w") as err_file:
        p = subprocess.Popen([sb.herd, "launch", "job.textproto"], cwd=workdir, stdout=out_file, stderr=err_file,
                             env=dict(os.environ, OMP_NUM_THREADS="1"))
    try:
        herdtest.wait_for_step(metrics, at, name)
        os.kill(processes(p.pid)[(role, region)], signal.SIGKILL)
        assert p.wait(timeout=120) == 0, f"{name}: launch exited {p.returncode}:\n{open(err_path).read()[-3000:]}"
    finally:
        if p.poll() is None:
            p.kill()
    out, err = open(out_path).read(), open(err_path).read()
    other = "worker" if role == "server" else "server"
    for who in (role, other):
        said = f"launch: {who} {region} exited"
        assert said in out and f"the job goes on without its region {region} (cluster.diloco)" in out, \
            f"{name}: no '{said} ...; the job goes on without its region {region}':\n{out[-3000:]}\n{err[-3000:]}"
    rows = herdtest.metrics_rows(metrics)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1)), f"{name}: steps {rows[0]['step']}..{rows[-1]['step']}"
    summaries = {}
    for path in glob.glob(os.path.join(workdir, "summary", "server_*.json")):
        s = json.load(open(path))
        summaries[s["rank"]] = s["weights_crc32"]
    live = [k for k in range(REGIONS) if k != region]
    assert sorted(summaries) == live, f"{name}: run summaries of servers {sorted(summaries)}, expected {live}"
    assert len({summaries[k] for k in live}) == 1, f"{name}: the surviving regions' final weights differ: {summaries}"
    losses = [r["loss"] for r in rows]
    before, last = sum(losses[at - 10:at]) / 10, sum(losses[-10:]) / 10
    assert last < before, f"{name}: the loss went from {before:.3f} before the kill to {last:.3f}"
    committed = sorted(int(os.path.basename(os.path.dirname(m)).split("_")[-1])
                       for m in glob.glob(os.path.join(workdir, "ckpt", "step_*", "manifest.json")))
    assert all(step <= at + 50 for step in committed), f"{name}: checkpoints {committed} after a loss at {at}"
    # What the loss cost the others: the longest step after the kill
    # against the median step.
    elapsed = {r["step"]: r["elapsed_s"] for r in rows}
    took = {s: elapsed[s] - elapsed[s - 1] for s in elapsed if s - 1 in elapsed}
    median = statistics.median(took.values())
    hiccup = max(took[s] for s in took if s > at)
    print(f"{name}: {role} {region} killed at step {at}: the other regions finished all {STEPS} steps with the "
          f"same weights (crc {summaries[live[0]]:08x}); loss {before:.3f} -> {last:.3f}; checkpoints {committed}; "
          f"longest step after the kill {1e3 * hiccup:.0f} ms against a median of {1e3 * median:.1f} ms")


def main():
    a = herdtest.parse_args()
    sb = herdtest.Sandbox(a.build)
    sb.training_data()
    rng = random.Random(11)
    for t in range(10 if herdtest.LONG else 2):
        trial(sb, f"trial{t}", rng)


if __name__ == "__main__":
    main()
