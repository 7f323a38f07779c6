"""Network faults across emulated nodes (scripts/netlab.py): a PS job of 2
servers and 2 workers, each process on a node of its own and the
coordinator on another, started by hand as on a cluster, UCX over TCP
through links capped at 1 Gbit/s.

* a worker node's link goes down mid-run (a pulled cable: no connection
  closes, nothing is refused): every process stops by itself within
  heartbeat_timeout_s + 5 s, the survivors with one line naming the lost
  worker's rank and node; --resume on a healthy lab continues from the
  newest complete checkpoint;
* the coordinator node's link goes down: every process stops within the
  same bound, naming the coordinator;
* a server node's link drops to a tenth of its rate mid-run: the job
  carries on, slower, to its end.

Skipped (77) where namespaces cannot be made (not root, no iproute2)."""
import json
import os
import subprocess
import sys
import time

import herdtest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "scripts"))
import netlab  # noqa: E402

TIMEOUT_S = 3  # cluster.heartbeat_timeout_s of these jobs
PORT = 29400
# Node 0: coordinator; 1, 2: servers; 3, 4: workers.
NODES = {"coordinator": 0, "server0": 1, "server1": 2, "worker0": 3, "worker1": 4}


class LabJob:
    """One job on the lab; every process's output in a file."""

    def __init__(self, sb, lab, config, tag, *flags):
        self.sb, self.lab, self.tag = sb, lab, tag
        self.procs = {}
        token = sb.path("job.token")
        if not os.path.exists(token):
            with open(os.open(token, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
                f.write("netfault-token-0123456789")
        coord = f"{lab.address(0)}:{PORT}"
        env = dict(os.environ, OMP_NUM_THREADS="1", UCX_TLS="tcp")
        for name, node in NODES.items():
            if name == "coordinator":
                argv = [sb.herd, "coordinator", config, "--listen", coord, "--token-file", token]
            else:
                role, rank = name[:-1], name[-1]
                argv = [sb.herd + "-" + role, config, "--rank", rank, "--coordinator", coord, "--token-file",
                        token, *flags]
            out = open(sb.path(f"{tag}_{name}.log"), "w")
            self.procs[name] = lab.popen(node, argv, cwd=sb.dir, stdout=out, stderr=subprocess.STDOUT, env=env)
            if name == "coordinator":
                time.sleep(0.3)

    def output(self, name):
        with open(self.sb.path(f"{self.tag}_{name}.log")) as f:
            return f.read()

    def error_line(self, name):
        lines = [l for l in self.output(name).splitlines() if l.startswith("herd: error:")]
        return lines[0] if len(lines) == 1 else None

    def wait_all(self, timeout):
        deadline = time.time() + timeout
        for name, p in self.procs.items():
            try:
                p.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                raise AssertionError(f"{self.tag}: {name} still running {timeout} s on:\n" + self.output(name)[-2000:])
        return {name: p.returncode for name, p in self.procs.items()}


def config(sb, steps, every, name):
    text = herdtest.tiny_config(sb.path("train.bin"), steps=steps, ckpt=sb.path(name + "_ckpt"), every=every,
                                metrics=sb.path(name + ".jsonl"),
                                extra="cluster { sync: PARAMETER_SERVER servers: 2 workers: 2 "
                                      f"heartbeat_interval_s: 0.5 heartbeat_timeout_s: {TIMEOUT_S} }}")
    # Bigger than tiny, so that a step moves megabytes over the links.
    text = text.replace("hidden_size: 64 intermediate_size: 160", "hidden_size: 256 intermediate_size: 640")
    return sb.write(name + ".textproto", text)


def rows(sb, name):
    if not os.path.exists(sb.path(name + ".jsonl")):
        return []
    with open(sb.path(name + ".jsonl")) as f:
        return [json.loads(l) for l in f if l.strip()]


def wait_for_step(sb, name, job, step, timeout=120):
    deadline = time.time() + timeout
    while len(rows(sb, name)) < step:
        dead = {n: p.returncode for n, p in job.procs.items() if p.poll() is not None}
        assert not dead and time.time() < deadline, f"{name}: step {step} not reached ({dead})"
        time.sleep(0.05)


def link_down(sb, lab, victim, needle, cfg_name):
    """Takes `victim`'s node off the network mid-run; returns the seconds
    until every process had stopped."""
    cfg = config(sb, 100000, 10, cfg_name)
    job = LabJob(sb, lab, cfg, cfg_name)
    try:
        wait_for_step(sb, cfg_name, job, 25)
        lab.link(NODES[victim], up=False)
        t0 = time.time()
        codes = job.wait_all(TIMEOUT_S + 5)
        took = time.time() - t0
    finally:
        lab.link(NODES[victim], up=True)
    for name, rc in codes.items():
        assert rc > 0, f"{victim} down: {name} exited {rc} (a signal?)\n{job.output(name)[-2000:]}"
        if name != victim:
            line = job.error_line(name)
            assert line and needle in line, f"{victim} down: {name} said {line!r}\n{job.output(name)[-2000:]}"
    return took, job


def main():
    a = herdtest.parse_args()
    sb = herdtest.Sandbox(a.build)
    sb.training_data()
    try:
        lab = netlab.Lab(nodes=len(NODES), rate="1gbit")
        lab.create()
    except netlab.Unavailable as e:
        print(f"skipped: {e}")
        sys.exit(77)
    try:
        # A worker node off the network, then --resume on the healed lab.
        took, job = link_down(sb, lab, "worker1", "worker rank 1", "wdown")
        print(f"ok  worker node's link down: every process stopped within {took:.1f} s "
              f"(heartbeat_timeout_s {TIMEOUT_S}); worker0 said: {job.error_line('worker0')}")
        done = sorted(d for d in os.listdir(sb.path("wdown_ckpt"))
                      if os.path.exists(sb.path("wdown_ckpt", d, "manifest.json")))
        assert done, "no complete checkpoint before the fault"
        last = int(done[-1].split("_")[1])
        cfg = config(sb, last + 10, 10, "wdown")
        resumed = LabJob(sb, lab, cfg, "wdown_resume", "--resume")
        codes = resumed.wait_all(120)
        assert all(rc == 0 for rc in codes.values()), (codes, resumed.output("worker0")[-2000:])
        steps = [r["step"] for r in rows(sb, "wdown")]
        assert steps[-1] == last + 10, steps[-5:]
        said = resumed.output("worker0")
        assert "resumed from" in said and done[-1] in said, said[-2000:]
        print(f"ok  --resume continued from {done[-1]} to step {last + 10}")

        # The coordinator's node off the network.
        took, job = link_down(sb, lab, "coordinator", "coordinator", "cdown")
        print(f"ok  coordinator node's link down: every process stopped within {took:.1f} s; "
              f"worker0 said: {job.error_line('worker0')}")

        # A server node's link at a tenth of its rate: slower, not stopped
        # (heartbeats are marked low-delay and pass the congested queue).
        cfg = config(sb, 65, 0, "slow")
        job = LabJob(sb, lab, cfg, "slow")
        wait_for_step(sb, "slow", job, 40)
        lab.set_rate(NODES["server1"], "100mbit")
        codes = job.wait_all(300)
        assert all(rc == 0 for rc in codes.values()), (codes, job.output("worker0")[-2000:])
        r = rows(sb, "slow")
        step_s = [b["elapsed_s"] - a["elapsed_s"] for a, b in zip(r, r[1:])]
        before, after = sorted(step_s[10:35])[12], sorted(step_s[-15:])[7]
        assert after > 2 * before, f"a 10x slower server link: steps {before:.3f} s -> {after:.3f} s"
        print(f"ok  server node's link 1gbit -> 100mbit mid-run: the job went on, "
              f"step {1000 * before:.0f} -> {1000 * after:.0f} ms, to its end")
    finally:
        lab.close()


if __name__ == "__main__":
    main()
