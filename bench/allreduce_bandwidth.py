"""Ring all-reduce bus bandwidth: herd's UCX ring next to PyTorch's gloo
all_reduce (Debian's python3-torch), same ranks, sizes and machine, in the
same run. One JSON line per (ranks, size) with both figures and their
ratio. busbw = algbw * 2(n-1)/n, as nccl-tests define it; GB = 1e9 bytes.

    /usr/bin/python3 bench/allreduce_bandwidth.py [--build build] [--ranks 2,4]
        [--sizes 1MiB,4MiB,16MiB,64MiB,256MiB] [--iters 10] [--repeat 3] [--chunk-kb 512]

herd's ranks meet at a `herd coordinator` on loopback; UCX picks the
transport (set UCX_TLS to choose). Rank r of both is bound to core
r mod cores (taskset), as MPI and nccl-tests runs bind ranks: herd's
progress threads poll while an operation is in flight, and two of them
left on one core (the scheduler's choice at start-up, run by run) take
turns by the millisecond; --no-bind shows that.
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
UNITS = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def parse_size(s):
    for u, m in UNITS.items():
        if s.endswith(u):
            return int(float(s[:-len(u)]) * m)
    return int(s)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bind(rank, enabled):
    return ["taskset", "-c", str(rank % os.cpu_count())] if enabled else []


def herd_ring(herd, ranks, sizes, iters, chunk_kb, pin):
    tmp = tempfile.mkdtemp(prefix="herd_bench_ar_")
    env = dict(os.environ, HERD_JOB_TOKEN="bench-allreduce-token", OMP_NUM_THREADS="1")
    port_file = os.path.join(tmp, "port")
    coord = subprocess.Popen([herd, "coordinator", "--listen", "127.0.0.1:0", "--port-file", port_file], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while not os.path.exists(port_file):
        time.sleep(0.02)
    addr = "127.0.0.1:" + open(port_file).read().strip()
    procs = [subprocess.Popen(bind(r, pin) + [herd, "bench", "allreduce", "--rank", str(r), "--world", str(ranks), "--coordinator",
                               addr, "--sizes", ",".join(str(s) for s in sizes), "--iters", str(iters),
                               "--chunk-kb", str(chunk_kb)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True) for r in range(ranks)]
    out = procs[0].communicate()[0]
    for p in procs[1:]:
        p.wait()
    coord.wait(timeout=30)
    if any(p.returncode for p in procs):
        raise SystemExit("herd bench allreduce failed")
    return {r["bytes"]: r for r in (json.loads(line) for line in out.splitlines() if line.startswith("{"))}


GLOO_RANK = r"""
import sys, time, torch, torch.distributed as dist
rank, world, port, iters = (int(x) for x in sys.argv[1:5])
sizes = [int(x) for x in sys.argv[5].split(",")]
torch.set_num_threads(1)
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
for nbytes in sizes:
    t = torch.ones(nbytes // 4)
    for _ in range(2):
        dist.all_reduce(t)
    times = []
    for _ in range(iters):
        dist.barrier()
        s = time.perf_counter()
        dist.all_reduce(t)
        times.append(time.perf_counter() - s)
    times.sort()
    if rank == 0:
        print(nbytes, times[len(times) // 2], flush=True)
dist.destroy_process_group()
"""


def gloo(ranks, sizes, iters, pin):
    port = free_port()
    procs = [subprocess.Popen(bind(r, pin) + ["/usr/bin/python3", "-c", GLOO_RANK, str(r), str(ranks), str(port), str(iters),
                               ",".join(str(s) for s in sizes)], stdout=subprocess.PIPE, text=True)
             for r in range(ranks)]
    out = procs[0].communicate()[0]
    for p in procs[1:]:
        p.wait()
    res = {}
    for line in out.splitlines():
        b, t = line.split()
        res[int(b)] = float(t)
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--sizes", default="1MiB,4MiB,16MiB,64MiB,256MiB")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--chunk-kb", type=int, default=512)
    ap.add_argument("--no-bind", action="store_true", help="leave rank placement to the scheduler")
    ap.add_argument("--repeat", type=int, default=3, help="interleaved herd/gloo runs; medians are reported")
    a = ap.parse_args()
    herd = os.path.join(a.build, "herd")
    sizes = [parse_size(s) for s in a.sizes.split(",")]
    for ranks in (int(r) for r in a.ranks.split(",")):
        # Interleaved repetitions, medians: this VM's speed drifts run by run.
        ours_t, theirs_t = {b: [] for b in sizes}, {b: [] for b in sizes}
        for _ in range(a.repeat):
            ours = herd_ring(herd, ranks, sizes, a.iters, a.chunk_kb, not a.no_bind)
            theirs = gloo(ranks, sizes, a.iters, not a.no_bind)
            for b in sizes:
                ours_t[b].append(ours[b]["time_s"])
                theirs_t[b].append(theirs[b])
        for b in sizes:
            factor = 2.0 * (ranks - 1) / ranks
            t_ours, t_gloo = statistics.median(ours_t[b]), statistics.median(theirs_t[b])
            h_bus, g_bus = b / t_ours / 1e9 * factor, b / t_gloo / 1e9 * factor
            print(json.dumps({"bench": "allreduce_busbw", "ranks": ranks, "bytes": b,
                              "herd_busbw_GBps": round(h_bus, 3), "gloo_busbw_GBps": round(g_bus, 3),
                              "ratio": round(h_bus / g_bus, 2), "repeats": a.repeat,
                              "herd_time_s": round(t_ours, 6), "gloo_time_s": round(t_gloo, 6),
                              "chunk_kb": a.chunk_kb, "bound": not a.no_bind, "ucx_tls": os.environ.get("UCX_TLS", "auto")}), flush=True)


if __name__ == "__main__":
    sys.exit(main())
