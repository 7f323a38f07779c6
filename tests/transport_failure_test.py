"""Control-plane failures with real processes and sockets:
- strangers sending an oversized frame, garbage, a frame without a message,
  a message before the hello, too much before authenticating: each is
  refused and closed, and the coordinator keeps serving;
- a wrong job token is refused with one line, and after all that a proper
  job on the same coordinator runs to the end;
- a process of the job that it cannot take (a different config, a rank out
  of range, a launcher world size that disagrees with the config, a rank
  taken twice) is refused, and the job stops at once with that reason;
- kill -9 of a worker, and of a server, mid-transfer: every other process
  is told which rank died within 5 s and exits by itself (no hang, no core
  dump), and the coordinator exits non-zero naming the rank;
- a stopped (silent) worker is declared lost after heartbeat_timeout_s,
  and says so when it is continued;
- SIGTERM to the coordinator shuts every process down in order;
- a process that fails at once again and again waits longer before each
  restart."""
import os
import signal
import socket
import struct
import subprocess
import sys
import time

import herdtest

CONFIG = """
cluster { sync: PARAMETER_SERVER servers: {S} workers: {W}
          heartbeat_interval_s: 0.5 heartbeat_timeout_s: 5 join_timeout_s: 60 }
"""


def config(servers, workers):
    return CONFIG.replace("{S}", str(servers)).replace("{W}", str(workers))


def poke(addr, payload, needle):
    """Sends raw bytes to the coordinator; expects a refusal containing
    `needle` and the connection closed within 5 s."""
    host, port = addr.split(":")
    with socket.create_connection((host, int(port)), timeout=5) as s:
        try:
            s.sendall(payload)
        except (BrokenPipeError, ConnectionResetError):
            pass
        got = b""
        deadline = time.time() + 5
        while time.time() < deadline:
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            got += chunk
        else:
            raise AssertionError(f"connection not closed after {payload[:16]!r}...")
    assert needle.encode() in got, f"expected refusal with '{needle}', got {got!r}"


def envelope_field(number, body):
    """A length-delimited protobuf field (enough to build test messages)."""
    key = bytes([(number << 3) | 2])
    n, varint = len(body), b""
    while True:
        b = n & 0x7F
        n >>= 7
        varint += bytes([b | (0x80 if n else 0)])
        if not n:
            break
    return key + varint + body


def frame(body):
    return struct.pack("<I", len(body)) + body


def refusals(sb):
    job = herdtest.Job(sb, config(1, 2))
    try:
        addr = job.start_coordinator()
        # A member is already connected while strangers misbehave.
        job.start_node("server0", "server", "--shard-bytes", str(4 << 20))
        poke(addr, struct.pack("<I", 1 << 30) + b"x" * 64, "exceeds the bound")
        poke(addr, frame(b"\xff" * 12), "does not parse")
        poke(addr, frame(b"\x78\x01"), "no message body")
        poke(addr, frame(envelope_field(4, envelope_field(1, b"x"))), "expected a hello")
        poke(addr, struct.pack("<I", 200 << 10) + b"\0" * 1024, "exceeds the bound of 131072")
        assert job.procs["coordinator"].poll() is None, job.stderr("coordinator")

        job.start_node("intruder", "worker", env={"HERD_JOB_TOKEN": "not-the-token"})
        rc = job.wait("intruder", 20)
        errors = [l for l in job.stderr("intruder").splitlines() if l.startswith("herd: error:")]
        assert rc != 0 and len(errors) == 1 and "wrong job token" in errors[0], (rc, job.stderr("intruder"))
        print(f"intruder: {errors[0]}")
        log = job.stderr("coordinator")
        assert "wrong job token" in log and "exceeds the bound" in log, log
        # A flood of refused connections from one address: the log holds a
        # bounded number of lines, with counts, not one line each.
        for _ in range(150):
            poke(addr, frame(b"\xff" * 12), "does not parse")
        time.sleep(0.2)
        log = job.stderr("coordinator")
        refused = [l for l in log.splitlines() if "coordinator: refused" in l or "coordinator: closing" in l]
        assert len(refused) <= 25, f"{len(refused)} warning lines for 159 refused connections"
        print(f"159 refused connections from one address: {len(refused)} warning lines")

        # The coordinator kept serving: the real workers complete the job.
        for r in range(2):
            job.start_node(f"worker{r}", "worker", "--total-bytes", str(4 << 20), "--pieces", str(1 << 20))
        for name in ["worker0", "worker1", "server0", "coordinator"]:
            rc = job.wait(name, 60)
            assert rc == 0, f"{name} exited {rc}:\n{job.stderr(name)}"
        print("refusals: ok; the job completed after them")
    finally:
        job.kill_all()


def unmendable_refusals(sb):
    """A process of the job (it has the token) that the job cannot take — another
    config, a rank or a world size the job does not have, a rank taken twice —
    stops the job at once with that reason: the coordinator and the process
    already joined exit within seconds (the coordinator stays drain_timeout_s,
    10 s, to tell latecomers), not after join_timeout_s (60 s here). The four
    jobs run side by side."""
    cases = [("odd", ["--set", "train.seed=99"], None, "config hash"),
             ("far", ["--rank", "5"], None, "rank 5 is out of range"),
             ("torchrun", [], {"RANK": "0", "WORLD_SIZE": "3"}, "the job has 2 (cluster.workers)"),
             ("twin", ["--rank", "0"], None, "worker rank 0 is already taken")]
    jobs = {}
    try:
        for name, _, _, _ in cases:
            job = jobs[name] = herdtest.Job(sb, config(1, 2))
            job.start_coordinator(name=f"coordinator_{name}")
            job.start_node(f"server_{name}", "server", "--shard-bytes", str(4 << 20))
            if name == "twin":
                job.start_node("worker_first", "worker", "--rank", "0", "--total-bytes", str(4 << 20))
        time.sleep(0.5)
        t0 = time.time()
        for name, extra, env, _ in cases:
            jobs[name].start_node(name, "worker", *extra, env=env)
        for name, _, _, needle in cases:
            job = jobs[name]
            rc = job.wait(name, 20)
            errors = [l for l in job.stderr(name).splitlines() if l.startswith("herd: error:")]
            assert rc != 0 and len(errors) == 1 and needle in errors[0], (name, rc, job.stderr(name))
            for other in (f"coordinator_{name}", f"server_{name}"):
                rc = job.wait(other, 15)
                assert rc != 0 and needle in job.stderr(other), (other, rc, job.stderr(other)[-1500:])
            print(f"{name}: refused, and the job stopped within {time.time() - t0:.1f} s: {errors[0]}")
    finally:
        for job in jobs.values():
            job.kill_all()


def start_busy_job(sb, heartbeat_timeout=5):
    """2 servers + 3 workers (explicit ranks) pushing slowly: about 2.6 s of
    transfers per round, so that a failure lands mid-transfer."""
    job = herdtest.Job(sb, config(2, 3).replace("heartbeat_timeout_s: 5",
                                                f"heartbeat_timeout_s: {heartbeat_timeout}"))
    job.start_coordinator()
    for r in range(2):
        job.start_node(f"server{r}", "server", "--rank", str(r), "--shard-bytes", str(32 << 20))
    for r in range(3):
        job.start_node(f"worker{r}", "worker", "--rank", str(r), "--total-bytes", str(64 << 20),
                       "--pieces", str(1 << 20), "--slow-ms", "40")
    deadline = time.time() + 60
    while not all("joined a job" in job.stderr(f"worker{r}") for r in range(3)):
        assert time.time() < deadline, "workers did not join"
        time.sleep(0.05)
    time.sleep(0.5)
    return job


def expect_all_told(job, names, needle, since, within):
    """Every process in `names` exits by itself (positive code: no signal,
    no crash) within `within` s of `since`, with one error line naming the
    lost process."""
    for name in names:
        rc = job.wait(name, max(0.1, since + within - time.time()))
        err = job.stderr(name)
        assert rc > 0, f"{name}: exit {rc} (a negative code is a signal: crash?)\n{err}"
        errors = [l for l in err.splitlines() if l.startswith("herd: error:")]
        assert len(errors) == 1 and needle in errors[0], f"{name}:\n{err}"
    return time.time() - since


def first_error(job, name):
    return [l for l in job.stderr(name).splitlines() if l.startswith("herd: error:")][0]


def kill_member(victim, needle):
    def scenario(sb):
        job = start_busy_job(sb)
        try:
            others = [n for n in ["worker0", "worker1", "worker2", "server0", "server1"] if n != victim]
            job.procs[victim].kill()
            killed_at = time.time()
            job.procs[victim].wait()
            took = expect_all_told(job, others + ["coordinator"], needle, killed_at, 5)
            assert not [f for f in os.listdir(sb.dir) if f.startswith("core")], "core dump left behind"
            print(f"kill -9 of {needle}: the other 5 exited within {took:.2f} s; {others[0]} said: "
                  f"{first_error(job, others[0])}")
        finally:
            job.kill_all()
    return scenario


def silent_worker(sb):
    """A stopped process (SIGSTOP: alive, connected, silent) is declared
    lost after heartbeat_timeout_s."""
    job = start_busy_job(sb, heartbeat_timeout=2)
    try:
        job.procs["worker2"].send_signal(signal.SIGSTOP)
        stopped_at = time.time()
        took = expect_all_told(job, ["worker0", "worker1", "server0", "server1", "coordinator"],
                               "worker rank 2", stopped_at, 2 + 5)
        assert "silent for 2.0 s" in first_error(job, "coordinator"), job.stderr("coordinator")
        # Continued, it says it was declared lost (not that it lost the coordinator).
        job.procs["worker2"].send_signal(signal.SIGCONT)
        assert job.wait("worker2", 10) != 0
        said = first_error(job, "worker2")
        assert "worker rank 2" in said and "was declared lost: silent for 2.0 s" in said, job.stderr("worker2")
        print(f"SIGSTOP of worker rank 2: declared lost, others out after {took:.2f} s: "
              f"{first_error(job, 'coordinator')}; continued, it says: {said}")
    finally:
        job.procs["worker2"].send_signal(signal.SIGCONT)
        job.kill_all()


def terminate_coordinator(sb):
    """SIGTERM to the coordinator shuts the job down in order."""
    job = start_busy_job(sb)
    try:
        job.procs["coordinator"].terminate()
        at = time.time()
        took = expect_all_told(job, ["worker0", "worker1", "worker2", "server0", "server1"],
                               "shut the job down: terminated (SIGTERM)", at, 5)
        rc = job.wait("coordinator", 5)
        assert rc == 128 + signal.SIGTERM and "terminated (SIGTERM)" in first_error(job, "coordinator"), \
            job.stderr("coordinator")
        print(f"SIGTERM to the coordinator: all 5 out after {took:.2f} s: {first_error(job, 'worker0')}")
    finally:
        job.kill_all()


def restarts_wait(sb):
    """A process that keeps failing at once (here: no coordinator to join
    within join_timeout_s) waits before each restart, 0.5 s and doubling,
    so that a link down for seconds does not use its restarts up."""
    train = sb.training_data()
    cfg = sb.write("alone.textproto", herdtest.tiny_config(train, extra="cluster { sync: PARAMETER_SERVER servers: 1 "
                                                                        "workers: 1 join_timeout_s: 0.2 }"))
    at = time.time()
    p = subprocess.run([os.path.join(sb.build, "herd-server"), cfg, "--rank", "0", "--coordinator",
                        f"127.0.0.1:{herdtest.free_port()}", "--max-restarts", "3"], cwd=sb.dir, capture_output=True,
                       text=True, env=dict(os.environ, HERD_JOB_TOKEN="t" * 16))
    took = time.time() - at
    waits = [line.split("(in ")[1].split(" s")[0] for line in p.stdout.splitlines() if "restart after:" in line]
    assert p.returncode != 0 and waits == ["0.5", "1.0", "2.0"] and took >= 3.5, (p.returncode, waits, took, p.stdout)
    print(f"restarts of a process failing at once wait {', '.join(waits)} s; out after {took:.1f} s")


def main():
    herdtest.run_scenarios("transport failures", refusals, unmendable_refusals, kill_member("worker1", "worker rank 1"),
                           kill_member("server0", "server rank 0"), silent_worker, terminate_coordinator,
                           restarts_wait)


if __name__ == "__main__":
    sys.exit(main())
