"""Push/pull on loopback with real processes: 1 coordinator + 2 servers + 3
workers; every worker pushes 64 MiB in 1 MiB pieces, then in 4 MiB pieces,
pulls everything back after each round and checks every float exactly
(sums of small integers are exact in fp32). Run over TCP and over the
shared-memory transports with UCX_RNDV_THRESH=auto (UCX's own protocol
choice, which herd keeps on hosts with RDMA ports): checks that UCX really
used them and that every large payload took the zero-copy rendezvous
path (on shared memory herd's own: the receiver reads it out of the
sender, process_vm_readv). Then over TCP with herd's default on a host without RDMA ports:
eager messages of every size, copied out of UCX's buffers, all exact."""
import json
import sys

import herdtest

CONFIG = """
cluster { sync: PARAMETER_SERVER servers: 2 workers: 3
          heartbeat_interval_s: 0.5 heartbeat_timeout_s: 10 join_timeout_s: 60 }
"""


def run(sb, tls, lane_needles, rendezvous=True):
    env = {"UCX_TLS": tls}
    if rendezvous:
        env["UCX_RNDV_THRESH"] = "auto"
    job = herdtest.Job(sb, CONFIG, env=env)
    try:
        job.start_coordinator()
        for r in range(2):
            job.start_node(f"server{r}", "server", "--shard-bytes", str(32 << 20))
        for r in range(3):
            job.start_node(f"worker{r}", "worker", "--total-bytes", str(64 << 20), "--pieces", str(1 << 20),
                           "--pieces", str(4 << 20), "--concurrency", "4", "--describe")
        for name in ["worker0", "worker1", "worker2", "server0", "server1", "coordinator"]:
            rc = job.wait(name, 120)
            if rc != 0:
                raise AssertionError(f"[{tls}] {name} exited {rc}:\n{job.stderr(name)}")
        for r in range(3):
            err = job.stderr(f"worker{r}")
            for rnd, piece in [(0, 1 << 20), (1, 4 << 20)]:
                needle = f"round {rnd} ({piece}-byte pieces): all {16 << 20} values exact"
                assert needle in err, f"[{tls}] worker{r}: missing '{needle}':\n{err}"
            lanes = [l for l in err.splitlines() if "lane[" in l]
            assert lanes, f"[{tls}] worker{r}: no endpoint description:\n{err}"
            assert any(any(n in l for n in lane_needles) for l in lanes), f"[{tls}] lanes: {lanes}"
            stats = json.loads(job.stdout(f"worker{r}").strip().splitlines()[-1])
            assert stats["malformed_dropped"] == 0, stats
            if rendezvous:
                # 64 + 16 pulls, every one placed zero-copy into the caller's buffer:
                # within the host read straight out of the server (one copy).
                assert stats["rendezvous_received"] == 80, stats
                assert stats["eager_bytes_copied"] == 0, stats
                if tls == "sm":
                    assert stats["cma_bytes_read"] == 2 * (64 << 20), stats
            else:
                # Every pull eager: 64 MiB copied, nothing by rendezvous.
                assert stats["rendezvous_received"] == 0, stats
                assert stats["eager_bytes_copied"] >= 64 << 20, stats
        for r in range(2):
            stats = json.loads(job.stdout(f"server{r}").strip().splitlines()[-1])
            # 3 workers x (32 + 8) pushes per server.
            assert stats["rendezvous_received"] == (120 if rendezvous else 0), stats
        print(f"[{tls}{'' if rendezvous else ', eager'}] ok: lanes {sorted(set(l.split()[2] for l in lanes))}")
    finally:
        job.kill_all()


def main():
    herdtest.run_scenarios("transport loopback", lambda sb: run(sb, "tcp", ["tcp/"]),
                           lambda sb: run(sb, "sm", ["sysv/", "posix/"]),
                           lambda sb: run(sb, "tcp", ["tcp/"], rendezvous=False))


if __name__ == "__main__":
    sys.exit(main())
