"""log.trace and `herd trace merge`: every process's step timeline, merged
onto one clock.

A parameter-server job (S=2 W=2) started by hand, each process in a Linux
time namespace of its own whose monotonic clock runs seconds ahead of or
behind the coordinator's (unshare --time --monotonic): the clocks truly
disagree, as they would across machines. Then:
  - every process wrote its trace, with the spans it must have (forward and
    backward per layer and each bucket's push, pull and wait on workers;
    the sums, norm exchange, AdamW per bucket and the checkpoint on
    servers);
  - the merge moved each process by the offset its namespace gave it, to
    within 1 ms, and causality holds on the merged clock: a server sums a
    worker's share of a bucket only after that worker's backward of the
    step began, and a worker's wait for a bucket's weights ends only after
    the server's AdamW on that bucket ended;
  - the merged file is one JSON trace with every process's lane.
And: DDP (W=2) traces its ring chunks; one process traces alone; a file in
the trace directory that herd did not write is refused and left alone, a
trace cut short is merged up to its last whole event, a damaged one is
refused naming its line, --out over a foreign file is refused; no
log.trace, no files."""
import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import herdtest  # noqa: E402

# Seconds each process's monotonic clock is moved by (the coordinator: 0).
SHIFT = {"server0": 7, "server1": -3, "worker0": 2, "worker1": 0}
TOLERANCE_US = 1000
LAYERS = 2
PS = "cluster { sync: PARAMETER_SERVER servers: 2 workers: 2 }"


def spans(events, name, pid=None):
    return [e for e in events if e.get("name") == name and e["ph"] in ("X", "b")
            and (pid is None or e["pid"] == pid)]


def lanes(merged):
    return {e["args"]["name"]: e["pid"] for e in merged["traceEvents"]
            if e["ph"] == "M" and e["name"] == "process_name"}


def merge(sb, trace_dir, out, check=True):
    p = sb.run("trace", "merge", trace_dir, "--out", out, check=check)
    return p if not check else json.loads(p.stdout)


def ps_job_in_time_namespaces(sb):
    steps = 4
    job = herdtest.Job(sb, herdtest.tiny_config("train.bin", steps=steps, ckpt="ps/ckpt", every=2, extra=PS)
                       .replace("log { every: 1", 'log { every: 1 trace: "ps/trace"'))
    try:
        job.start_coordinator()
        for name, shift in SHIFT.items():
            role, rank = name[:-1], name[-1]
            job._spawn(name, ["unshare", "--time", f"--monotonic={shift}",
                              os.path.join(sb.build, "herd-" + role), job.config, "--rank", rank,
                              "--coordinator", job.addr])
        for name in [*SHIFT, "coordinator"]:
            assert job.wait(name, 120) == 0, f"{name}:\n{job.stderr(name)}"
    finally:
        job.kill_all()
    files = sorted(os.listdir(sb.path("ps", "trace")))
    assert files == ["server_00000.trace.json", "server_00001.trace.json", "worker_00000.trace.json",
                     "worker_00001.trace.json"], files
    summary = merge(sb, "ps/trace", "ps/merged.json")
    merged = json.load(open(sb.path("ps", "merged.json")))
    events = merged["traceEvents"]
    lane = lanes(merged)
    assert sorted(lane) == ["server 0", "server 1", "worker 0", "worker 1"], lane

    # Offsets: the coordinator's clock minus the process's = -shift.
    for p in summary["processes"]:
        name = p["name"].replace(" ", "")
        err = abs(p["offset_us"] + SHIFT[name] * 1e6)
        assert err < TOLERANCE_US and p["complete"], f"{p['name']}: offset {p['offset_us']} us, shifted {SHIFT[name]} s"
        print(f"ok  {p['name']}: clock {SHIFT[name]:+d} s, measured offset {p['offset_us'] / 1e6:+.6f} s "
              f"(error {err:.0f} us, round trip {p['rtt_us']:.0f} us), {p['spans']} spans")

    # What each process must have traced.
    for w in (0, 1):
        pid = lane[f"worker {w}"]
        for kind in ("layer forward", "layer backward"):
            layers = {e["args"]["layer"] for e in spans(events, kind, pid)}
            assert layers == set(range(LAYERS)), f"worker {w}: {kind} of layers {layers}"
        for name in ("push gradients", "pull weights", "wait for weights", "wait for pushes", "push loss",
                     "head forward", "embedding backward", "draw batches", "step"):
            assert spans(events, name, pid), f"worker {w} traced no '{name}'"
        assert len({e["args"]["step"] for e in spans(events, "step", pid)}) == steps
    buckets_of = {}
    for s in (0, 1):
        pid = lane[f"server {s}"]
        for name in ("sum", "adamw", "norm exchange", "wait for gradients", "checkpoint write", "server step"):
            assert spans(events, name, pid), f"server {s} traced no '{name}'"
        buckets_of[s] = {e["args"]["bucket"] for e in spans(events, "adamw", pid)}
        for step in range(1, steps + 1):
            stepped = {e["args"]["bucket"] for e in spans(events, "adamw", pid) if e["args"]["step"] == step}
            assert stepped == buckets_of[s], f"server {s}, step {step}: AdamW on buckets {stepped}"
    assert not buckets_of[0] & buckets_of[1], buckets_of

    # Causality on the merged clock (a misaligned process breaks it by seconds).
    backward_start = {}
    for w in (0, 1):
        for e in spans(events, "backward", lane[f"worker {w}"]):
            backward_start.setdefault((w, e["args"]["step"]), e["ts"])
    adamw_end = {}
    checked = waits = 0
    for s in (0, 1):
        pid = lane[f"server {s}"]
        for e in spans(events, "sum", pid):
            a = e["args"]
            assert e["ts"] + TOLERANCE_US >= backward_start[(a["share"], a["step"])], \
                f"server {s} summed worker {a['share']}'s bucket {a['bucket']} of step {a['step']} before its backward"
            checked += 1
        for e in spans(events, "adamw", pid):
            adamw_end[(e["args"]["bucket"], e["args"]["step"])] = e["ts"] + e["dur"]
    for w in (0, 1):
        for e in spans(events, "wait for weights", lane[f"worker {w}"]):
            key = (e["args"]["bucket"], e["args"]["version"])
            if key in adamw_end:
                assert e["ts"] + e["dur"] + TOLERANCE_US >= adamw_end[key], \
                    f"worker {w} had bucket {key[0]} of version {key[1]} before the server stepped it"
                waits += 1
    # Orders were checked, not skipped: both servers' sums in every step,
    # and workers' waits for weights the servers stepped.
    assert checked >= 2 * steps and waits > 0, (checked, waits)
    checked += waits
    print(f"ok  PS S=2 W=2 in four clock namespaces: merged {summary['events']} events; "
          f"{checked} causal orders hold on the merged clock")


def ddp_and_one_process(sb):
    sb.write("ddp.textproto", herdtest.tiny_config(
        "train.bin", steps=3, extra="cluster { sync: ALLREDUCE workers: 2 }").replace(
        "log { every: 1", 'log { every: 1 trace: "ddp/trace"'))
    sb.run("launch", "ddp.textproto")
    merge(sb, "ddp/trace", "ddp/merged.json")
    events = json.load(open(sb.path("ddp", "merged.json")))["traceEvents"]
    for name in ("ring reduce chunk", "ring gather chunk", "ring reduce", "all-reduce", "adamw", "norm exchange",
                 "wait for gradients", "layer backward"):
        for w in (1, 2):
            assert spans(events, name, w), f"DDP worker {w - 1} traced no '{name}'"
    print("ok  DDP W=2: ring chunks, all-reduces, AdamW and the norm exchange traced on both workers")

    sb.write("one.textproto", herdtest.tiny_config("train.bin", steps=2).replace(
        "log { every: 1", 'log { every: 1 trace: "one/trace"'))
    sb.run("launch", "one.textproto")
    summary = merge(sb, "one/trace", "one/merged.json")
    assert [p["name"] for p in summary["processes"]] == ["worker 0"] and summary["processes"][0]["offset_us"] == 0
    events = json.load(open(sb.path("one", "merged.json")))["traceEvents"]
    assert spans(events, "adamw") and spans(events, "layer forward"), "one process traced no steps"
    print("ok  one process: its trace merges alone")

    # No log.trace: nothing written.
    sb.write("off.textproto", herdtest.tiny_config("train.bin", steps=2))
    before = set(os.listdir(sb.dir))
    sb.run("launch", "off.textproto")
    assert not any(f.endswith(".trace.json") for f in os.listdir(sb.dir)), set(os.listdir(sb.dir)) - before


def bad_inputs(sb):
    # A file herd did not write where the trace would go: refused, untouched.
    os.makedirs(sb.path("foreign"))
    with open(sb.path("foreign", "worker_00000.trace.json"), "w") as f:
        f.write("my notes\n")
    sb.write("foreign.textproto", herdtest.tiny_config("train.bin", steps=2).replace(
        "log { every: 1", 'log { every: 1 trace: "foreign"'))
    p = sb.run("launch", "foreign.textproto", check=False)
    assert p.returncode != 0 and "not a herd trace; it is not overwritten" in p.stderr, p.stderr
    assert open(sb.path("foreign", "worker_00000.trace.json")).read() == "my notes\n"

    src = sb.path("one", "trace", "worker_00000.trace.json")
    lines = open(src).read().splitlines(keepends=True)
    # Cut short mid-line, as a killed process leaves it: merged up to there.
    os.makedirs(sb.path("cut"))
    with open(sb.path("cut", "worker_00000.trace.json"), "w") as f:
        f.write("".join(lines[:len(lines) // 2]) + lines[len(lines) // 2][:17])
    summary = merge(sb, "cut", "cut.json")
    assert not summary["processes"][0]["complete"] and 0 < summary["processes"][0]["spans"]
    # Damaged in the middle: refused, naming the line.
    os.makedirs(sb.path("damaged"))
    bad = list(lines)
    bad[10] = '{"name":"layer forward","ph":"X","ts":12,\n'
    with open(sb.path("damaged", "worker_00000.trace.json"), "w") as f:
        f.write("".join(bad))
    p = merge(sb, "damaged", "damaged.json", check=False)
    assert p.returncode == 2 and "worker_00000.trace.json:11: not a JSON trace event" in p.stderr, p.stderr
    assert not os.path.exists(sb.path("damaged.json"))
    bad[10] = '{"name":"layer forward","ph":"X","ts":12,"pid":1,"tid":1},\n'
    with open(sb.path("damaged", "worker_00000.trace.json"), "w") as f:
        f.write("".join(bad))
    p = merge(sb, "damaged", "damaged.json", check=False)
    assert p.returncode == 2 and ":11: " in p.stderr and ("no duration" in p.stderr or "pid" in p.stderr), p.stderr
    # A negative duration, a negative rank: refused, naming the line.
    span = next(i for i, line in enumerate(lines) if i > 1 and '"ph":"X"' in line.replace(" ", ""))
    for i, change in ((span, lambda e: e.update(dur=-5)), (1, lambda e: e["args"].update(rank=-1))):
        event = json.loads(lines[i].rstrip().rstrip(","))
        change(event)
        bad = list(lines)
        bad[i] = json.dumps(event) + ",\n"
        with open(sb.path("damaged", "worker_00000.trace.json"), "w") as f:
            f.write("".join(bad))
        p = merge(sb, "damaged", "damaged.json", check=False)
        want = f":{i + 1}: " + ("no duration" if i == span else "a negative rank")
        assert p.returncode == 2 and want in p.stderr, (want, p.stderr)
    # --out over a file herd did not write: refused, untouched.
    sb.write("notes.json", "{}\n")
    p = merge(sb, "one/trace", "notes.json", check=False)
    assert p.returncode == 2 and "not a merged herd trace" in p.stderr and open(sb.path("notes.json")).read() == "{}\n"
    p = merge(sb, "nowhere", "x.json", check=False)
    assert p.returncode == 2 and "no *.trace.json files" in p.stderr, p.stderr
    for p in (sb.run("trace", "merge", "damaged", "--out", "y.json", check=False), p):
        assert sum(line.startswith("herd: error:") for line in p.stderr.splitlines()) == 1, p.stderr
    print("ok  a foreign file is refused and left alone; a cut trace merges, a damaged one is refused at its line")


def main():
    a = herdtest.parse_args()
    sb = herdtest.Sandbox(a.build)
    sb.training_data()
    try:
        ps_job_in_time_namespaces(sb)
        ddp_and_one_process(sb)
        bad_inputs(sb)
    finally:
        subprocess.run(["pkill", "-9", "-f", sb.dir], capture_output=True)
    shutil.rmtree(sb.dir)


if __name__ == "__main__":
    main()
