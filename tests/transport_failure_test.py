"""Control-plane failures with real processes and sockets:
- strangers sending an oversized frame, garbage, a frame without a message,
  a message before the hello, too much before authenticating: each is
  refused and closed, and the coordinator keeps serving;
- a wrong job token, a different config, a rank out of range and a
  launcher world size that disagrees with the config are refused with one
  line each;
- after all that, a proper job on the same coordinator runs to the end;
- kill -9 of a worker mid-transfer: every other process is told which rank
  died within 5 s and exits by itself (no hang, no core dump), and the
  coordinator exits non-zero naming the rank."""
import os
import socket
import struct
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

        for name, extra, env, needle in [
                ("intruder", [], {"HERD_JOB_TOKEN": "not-the-token"}, "wrong job token"),
                ("odd", ["--set", "train.seed=99"], None, "config hash"),
                ("far", ["--rank", "5"], None, "rank 5 is out of range"),
                ("torchrun", [], {"RANK": "0", "WORLD_SIZE": "3"}, "the job has 2 (cluster.workers)")]:
            job.start_node(name, "worker", *extra, env=env)
            rc = job.wait(name, 20)
            err = job.stderr(name)
            errors = [l for l in err.splitlines() if l.startswith("herd: error:")]
            assert rc != 0 and len(errors) == 1 and needle in errors[0], (name, rc, err)
            print(f"{name}: {errors[0]}")
        log = job.stderr("coordinator")
        assert "wrong job token" in log and "config hash" in log and "exceeds the bound" in log, log

        # The coordinator kept serving: the real workers complete the job.
        for r in range(2):
            job.start_node(f"worker{r}", "worker", "--total-bytes", str(4 << 20), "--pieces", str(1 << 20))
        for name in ["worker0", "worker1", "server0", "coordinator"]:
            rc = job.wait(name, 60)
            assert rc == 0, f"{name} exited {rc}:\n{job.stderr(name)}"
        print("refusals: ok; the job completed after them")
    finally:
        job.kill_all()


def kill_worker(sb):
    job = herdtest.Job(sb, config(2, 3))
    try:
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
        time.sleep(0.5)  # mid-transfer: 64 pieces at 40 ms each take about 2.6 s
        victim = job.procs["worker1"]
        victim.kill()
        killed_at = time.time()
        victim.wait()
        others = ["worker0", "worker2", "server0", "server1"]
        for name in others + ["coordinator"]:
            rc = job.wait(name, max(0.1, killed_at + 5 - time.time()))
            err = job.stderr(name)
            assert rc > 0, f"{name}: exit {rc} (a negative code is a signal: crash?)\n{err}"
            errors = [l for l in err.splitlines() if l.startswith("herd: error:")]
            assert len(errors) == 1 and "worker rank 1" in errors[0], f"{name}:\n{err}"
        took = time.time() - killed_at
        print("worker0 said: " + [l for l in job.stderr("worker0").splitlines() if l.startswith("herd: error:")][0])
        print("coordinator said: " + [l for l in job.stderr("coordinator").splitlines()
                                      if l.startswith("herd: error:")][0])
        assert not [f for f in os.listdir(sb.dir) if f.startswith("core")], "core dump left behind"
        print(f"kill -9 of worker rank 1: all 5 others exited with the rank named within {took:.2f} s")
    finally:
        job.kill_all()


def main():
    herdtest.run_scenarios("transport failures", refusals, kill_worker)


if __name__ == "__main__":
    sys.exit(main())
