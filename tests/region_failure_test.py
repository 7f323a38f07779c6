"""A job of regions (cluster.diloco) that loses a region goes on without
it, and the region can rejoin: 3 regions of one server and one worker
each, H = 5, the tiny model, through `herd launch`; a process of region 1
or 2 (its server or its worker) is killed with SIGKILL at a random step.
2 trials of each kind (10 with scripts/test.sh --long), the killed
process and step drawn anew, and one rejoin of a region whose workers
stream their weights (cluster.stream_weights).

Without restarts (the region is lost for good):

* the job finishes every step and exits 0; the launcher says it went on
  without the killed process's region, and the region's other process is
  let go (the coordinator told it who was lost);
* the surviving regions end with the same weights, bit for bit (each
  server's CRC-32 of its final weights in its run summary): every outer
  step after the loss summed the same regions' contributions in the same
  order on both;
* it goes on learning: the last ten losses' mean is below the ten before
  the kill;
* checkpoints go on after the loss, written by the surviving regions
  (the first of them writes the shard files and commits); one that a
  lost process was to write part of is abandoned, no manifest: at most
  one is missing (the first after the loss, or one whose background
  commit was still under way when the loss came);
* --resume from the last checkpoint before the end, written without the
  lost region, starts all three regions again (the lost one from the
  first surviving region's replica and outer state) and finishes; the
  three regions end with the same weights, and a second resume from the
  same checkpoint ends bitwise where the first did.

With --max-restarts 1 (the region rejoins while the job runs):

* the launcher starts the region's two processes again with --join; its
  server takes up the job's state from another region's at the next
  outer step (it says from which step it computes), its worker starts
  there, and the job finishes every step, exit code 0;
* what the rejoined server held right after taking up the state (step,
  weights, AdamW m and v, outer weights and momentum, data position:
  CRC-32s in its run summary) is what the giving server held when it
  gave it (in its own); the first trial with outer lr 0.7 and momentum
  0.9, where a momentum or moments lost would show nowhere else (with
  the mean as outer step and the last step an outer step, the regions'
  final weights are equal whatever the rejoined one took up);
* all three regions end with the same weights, bit for bit; the
  rejoined server served exactly the steps from its start to the end;
* the loss goes on falling; at most one checkpoint is missing (the one
  the loss abandoned); the second trial loses region 0, whose worker 0
  records the metrics: the rejoined one continues the file, which has
  every step but those while the region was out, none twice;
* --resume from the last checkpoint, written by all three regions after
  the rejoin, ends bitwise where the rejoined run ended: the rejoin left
  the job in a state a checkpoint holds exactly.

Started by hand (`herd coordinator` and each process with --max-restarts
2; one trial): this test plays the supervisor that starts the killed
process again with --join --resume-if-any; its region's other process,
let go, starts itself again with --join. The region rejoins with the
state its giver held, every process exits 0, and the three regions end
bitwise alike."""
import glob
import json
import os
import random
import re
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


def job_dir(sb, name, lr=1, momentum=0, more=""):
    """A folder of its own holding the job's config (every run's the same
    text): REGIONS regions of one server and one worker, H = 5, the outer
    step given (the mean by default), `more` of the cluster's settings; run
    summaries in summary/."""
    workdir = sb.path(name)
    os.makedirs(workdir)
    text = herdtest.tiny_config(sb.path("train.bin"), steps=STEPS, metrics="metrics.jsonl", ckpt="ckpt", every=50,
                                extra=f"cluster {{ sync: PARAMETER_SERVER servers: {REGIONS} workers: {REGIONS} {more} "
                                      f"diloco {{ regions: {REGIONS} every: 5 outer_lr: {lr} outer_momentum: {momentum} }} }}")
    with open(os.path.join(workdir, "job.textproto"), "w") as f:
        f.write(text.replace("log {", 'log { summary_dir: "summary"'))
    return workdir


def handed_over(workdir, region):
    """The rejoined region's server (one a region) against the one that
    gave it the job's state, from their run summaries: what each held
    right then (the step, the CRC-32s of the weights, AdamW m and v, the
    outer weights and momentum, the data position) must be the same.
    Returns the giver's region and the step."""
    summaries = {}
    for path in glob.glob(os.path.join(workdir, "summary", "server_*.json")):
        with open(path) as f:
            s = json.load(f)
        summaries[s["rank"]] = s
    took = summaries[region]["took_up"]
    assert took is not None, f"{workdir}: server {region} took up no state: {summaries[region]}"
    gave = [g for g in summaries[took["region"]]["gave"] if g["region"] == region]
    assert len(gave) == 1, f"{workdir}: server {took['region']} gave region {region} the state {len(gave)} times"
    differ = {k: (took[k], gave[0][k]) for k in took if k != "region" and took[k] != gave[0][k]}
    assert not differ, f"{workdir}: region {region} took up another state than region {took['region']} held " \
                       f"(taken, held): {differ}"
    return took["region"], took["step"]


def trial(sb, name, rng, rejoin=False, region=None, lr=1, momentum=0, more=""):
    workdir = job_dir(sb, name, lr, momentum, more)
    out_path, err_path = os.path.join(workdir, "launch.out"), os.path.join(workdir, "launch.err")
    metrics = os.path.join(workdir, "metrics.jsonl")
    role, drawn = rng.choice(["server", "worker"]), rng.randrange(1, REGIONS)
    region = drawn if region is None else region
    # A region rejoins at an outer step: early enough that one is left.
    at = rng.randrange(20, STEPS // 3 if rejoin else STEPS // 2)
    with open(out_path, "w") as out_file, open(err_path, "w") as err_file:
        p = subprocess.Popen([sb.herd, "launch", "job.textproto", *(["--max-restarts", "1"] if rejoin else [])],
                             cwd=workdir, stdout=out_file, stderr=err_file, env=dict(os.environ, OMP_NUM_THREADS="1"))
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
    steps = [r["step"] for r in rows]
    summaries, served = {}, {}
    for path in glob.glob(os.path.join(workdir, "summary", "server_*.json")):
        s = json.load(open(path))
        summaries[s["rank"]], served[s["rank"]] = s["weights_crc32"], s["steps"]
    live = list(range(REGIONS)) if rejoin else [k for k in range(REGIONS) if k != region]
    assert sorted(summaries) == live, f"{name}: run summaries of servers {sorted(summaries)}, expected {live}"
    assert len({summaries[k] for k in live}) == 1, f"{name}: the regions' final weights differ: {summaries}"
    rejoined_at = None
    if rejoin:
        said = re.search(rf"server {region}: region {region} rejoined the job: from step (\d+) on", out)
        assert f"launch: region {region} starts again, its 2 processes with --join" in out and said, \
            f"{name}: no restart and rejoin of region {region}:\n{out[-3000:]}\n{err[-3000:]}"
        rejoined_at = int(said.group(1))
        assert f"worker {region}: worker {region} rejoined the job with region {region}: it computes from step " \
               f"{rejoined_at} on" in out, f"{name}: worker {region} did not start at step {rejoined_at}:\n{out[-3000:]}"
        assert at < rejoined_at <= STEPS and served[region] == STEPS - rejoined_at + 1, \
            f"{name}: region {region} rejoined at step {rejoined_at}, its server served {served[region]} steps"
        giver, taken_at = handed_over(workdir, region)
        assert taken_at == rejoined_at - 1, f"{name}: the state taken up is of step {taken_at}, not {rejoined_at - 1}"
        print(f"{name}: region {region} took up region {giver}'s state of step {taken_at} as region {giver} held it")
    if region == 0:
        # Region 0's worker 0 records the metrics: none while it is out, and
        # the rejoined one continues the file (nothing recorded twice or lost
        # from before).
        gap = sorted(set(range(1, STEPS + 1)) - set(steps))
        assert steps == sorted(set(steps)) and steps[0] == 1 and steps[-1] == STEPS and \
            all(at < s < rejoined_at for s in gap), f"{name}: steps {steps[:3]}..{steps[-3:]}, missing {gap}"
    else:
        assert steps == list(range(1, STEPS + 1)), f"{name}: steps {steps[0]}..{steps[-1]}"
    loss = {r["step"]: r["loss"] for r in rows}
    before, last = sum(loss[s] for s in range(at - 10, at)) / 10, sum(loss[s] for s in range(STEPS - 9, STEPS + 1)) / 10
    assert last < before, f"{name}: the loss went from {before:.3f} before the kill to {last:.3f}"
    committed = sorted(int(os.path.basename(os.path.dirname(m)).split("_")[-1])
                       for m in glob.glob(os.path.join(workdir, "ckpt", "step_*", "manifest.json")))
    due = list(range(50, STEPS + 1, 50))
    missing = [step for step in due if step not in committed]
    assert len(missing) <= 1 and all(step <= at + 50 for step in missing), \
        f"{name}: checkpoints {committed} of {due}, a loss at {at}"
    # What the loss cost the others: the longest step after the kill
    # against the median step.
    elapsed = {r["step"]: r["elapsed_s"] for r in rows}
    took = {s: elapsed[s] - elapsed[s - 1] for s in elapsed if s - 1 in elapsed}
    median = statistics.median(took.values())
    hiccup = max(took[s] for s in took if s > at)
    print(f"{name}: {role} {region} killed at step {at}"
          f"{f', the region rejoined from step {rejoined_at} on' if rejoin else ''}: "
          f"regions {live} finished all {STEPS} steps with the same weights (crc {summaries[live[0]]:08x}); "
          f"loss {before:.3f} -> {last:.3f}; checkpoints {committed}; "
          f"longest step after the kill {1e3 * hiccup:.0f} ms against a median of {1e3 * median:.1f} ms")
    return at, committed, summaries[live[0]]


def by_hand_trial(sb, name, rng):
    workdir = job_dir(sb, name)
    addr = f"127.0.0.1:{herdtest.free_port()}"
    env = dict(os.environ, HERD_JOB_TOKEN="region-rejoin-test-token-0123", OMP_NUM_THREADS="1")
    procs = {}

    def start(key, argv):
        out = open(os.path.join(workdir, key + ".out"), "a")
        procs[key] = subprocess.Popen(argv, cwd=workdir, stdout=out, stderr=subprocess.STDOUT, env=env)

    def node(role, rank, *extra):
        start(f"{role}{rank}", [os.path.join(sb.build, "herd-" + role), "job.textproto", "--rank", str(rank),
                                "--coordinator", addr, "--max-restarts", "2", *extra])

    start("coordinator", [sb.herd, "coordinator", "job.textproto", "--listen", addr, "--max-restarts", "2"])
    for r in range(REGIONS):
        node("server", r)
        node("worker", r)
    role, region = rng.choice(["server", "worker"]), rng.randrange(1, REGIONS)
    at = rng.randrange(20, STEPS // 3)
    try:
        herdtest.wait_for_step(os.path.join(workdir, "metrics.jsonl"), at, name)
        procs[f"{role}{region}"].kill()
        procs[f"{role}{region}"].wait()
        node(role, region, "--join", "--resume-if-any")  # the supervisor's part
        for k, p in procs.items():
            assert p.wait(timeout=120) == 0, f"{name}: {k} exited {p.returncode}:\n" + \
                open(os.path.join(workdir, k + ".out")).read()[-3000:]
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
    other = "worker" if role == "server" else "server"
    own = [l.strip() for l in open(os.path.join(workdir, f"{other}{region}.out")) if ": restart after: " in l]
    assert own, f"{name}: {other} {region}, let go, did not start itself again"
    said = re.search(rf"region {region} rejoined the job: from step (\d+) on",
                     open(os.path.join(workdir, f"server{region}.out")).read())
    assert said, f"{name}: region {region} did not rejoin"
    handed_over(workdir, region)
    rows = herdtest.metrics_rows(os.path.join(workdir, "metrics.jsonl"))
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1)), f"{name}: steps {rows[0]['step']}..{rows[-1]['step']}"
    crcs = {json.load(open(p))["weights_crc32"] for p in glob.glob(os.path.join(workdir, "summary", "server_*.json"))}
    assert len(glob.glob(os.path.join(workdir, "summary", "server_*.json"))) == REGIONS and len(crcs) == 1, \
        f"{name}: the regions' final weights: {crcs}"
    print(f"{name} (by hand): {role} {region} killed at step {at} and started again with --join --resume-if-any, "
          f"{other} {region} started itself again ('{own[0][:90]}...'); the region rejoined from step "
          f"{said.group(1)} on, every process exited 0, all {REGIONS} regions alike (crc {crcs.pop():08x})")


def resumed(sb, name, step, tag):
    """--resume from trial `name`'s checkpoint of `step`, in a new folder
    (`tag`): the servers' final weights' CRC-32 by rank."""
    workdir = sb.path(f"{name}_{tag}")
    os.makedirs(os.path.join(workdir, "ckpt"))
    step_dir = f"step_{step:08d}"
    os.symlink(sb.path(name, "ckpt", step_dir), os.path.join(workdir, "ckpt", step_dir))
    with open(sb.path(name, "job.textproto")) as f:
        text = f.read()
    with open(os.path.join(workdir, "job.textproto"), "w") as f:
        f.write(text)
    p = subprocess.run([sb.herd, "launch", "job.textproto", "--resume"], cwd=workdir, capture_output=True, text=True,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert p.returncode == 0, f"{name}: the resume from step {step} exited {p.returncode}:\n{p.stderr[-3000:]}"
    out = {}
    for path in glob.glob(os.path.join(workdir, "summary", "server_*.json")):
        s = json.load(open(path))
        out[s["rank"]] = s["weights_crc32"]
    return out


def main():
    a = herdtest.parse_args()
    sb = herdtest.Sandbox(a.build)
    sb.training_data()
    rng = random.Random(11)
    trials = 10 if herdtest.LONG else 2
    for t in range(trials):
        # The second loses region 0, whose worker 0 records the metrics.
        # The first with DiLoCo's outer step: a momentum that the
        # hand-over must carry, and regions that differ between outer steps.
        outer = {"lr": 0.7, "momentum": 0.9} if t == 0 else {}
        at, committed, crc = trial(sb, f"rejoin{t}", rng, rejoin=True, region=0 if t == 1 else None, **outer)
        if t == 0:
            resume = committed[-2] if committed[-1] == STEPS else committed[-1]
            again = resumed(sb, f"rejoin{t}", resume, "resumed")
            assert sorted(again) == list(range(REGIONS)) and set(again.values()) == {crc}, (crc, again)
            print(f"rejoin{t}: resumed from step {resume} (written by all {REGIONS} regions after the rejoin): ended "
                  f"bitwise where the rejoined run did (crc {crc:08x})")
    # A region of workers that stream their weights rejoins alike.
    trial(sb, "rejoin_streamed", rng, rejoin=True, more="stream_weights: true")
    print("rejoin_streamed: a region of streaming workers lost and rejoined as the others")
    by_hand_trial(sb, "by_hand", rng)
    for t in range(trials):
        at, committed, _ = trial(sb, f"trial{t}", rng)
        after = [step for step in committed if at < step < STEPS]
        if t == 0 and after:
            first = resumed(sb, f"trial{t}", after[-1], "resumed")
            again = resumed(sb, f"trial{t}", after[-1], "again")
            assert sorted(first) == list(range(REGIONS)) and len(set(first.values())) == 1, first
            assert again == first, (first, again)
            print(f"trial{t}: resumed from step {after[-1]} (written without the lost region): all {REGIONS} "
                  f"regions finished with the same weights, twice bitwise alike (crc {first[0]:08x})")


if __name__ == "__main__":
    main()
