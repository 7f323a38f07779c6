"""Ring all-reduce bus bandwidth: herd's UCX ring next to PyTorch's gloo
all_reduce (Debian's python3-torch), same ranks, sizes and machine, in the
same run. One JSON line per (ranks, size) with both figures and their
ratio. busbw = algbw * 2(n-1)/n, as nccl-tests define it; GB = 1e9 bytes.

    /usr/bin/python3 bench/allreduce_bandwidth.py [--build build] [--ranks 2,4]
        [--sizes 1MiB,4MiB,16MiB,64MiB,256MiB] [--iters 10] [--chunk-kb 512]

herd's ranks meet at a `herd coordinator` on loopback; UCX picks the
transport (set UCX_TLS to choose). Each rank of both gets
cores/ranks threads' worth of the machine: nothing else runs.
"""
import argparse
import json
import os
import socket
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


def herd_ring(herd, ranks, sizes, iters, chunk_kb):
    tmp = tempfile.mkdtemp(prefix="herd_bench_ar_")
    env = dict(os.environ, HERD_JOB_TOKEN="bench-allreduce-token", OMP_NUM_THREADS="1")
    port_file = os.path.join(tmp, "port")
    coord = subprocess.Popen([herd, "coordinator", "--listen", "127.0.0.1:0", "--port-file", port_file], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while not os.path.exists(port_file):
        time.sleep(0.02)
    addr = "127.0.0.1:" + open(port_file).read().strip()
    procs = [subprocess.Popen([herd, "bench", "allreduce", "--rank", str(r), "--world", str(ranks), "--coordinator",
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


def gloo(ranks, sizes, iters):
    port = free_port()
    procs = [subprocess.Popen(["/usr/bin/python3", "-c", GLOO_RANK, str(r), str(ranks), str(port), str(iters),
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
    a = ap.parse_args()
    herd = os.path.join(a.build, "herd")
    sizes = [parse_size(s) for s in a.sizes.split(",")]
    for ranks in (int(r) for r in a.ranks.split(",")):
        ours = herd_ring(herd, ranks, sizes, a.iters, a.chunk_kb)
        theirs = gloo(ranks, sizes, a.iters)
        for b in sizes:
            factor = 2.0 * (ranks - 1) / ranks
            g_bus = b / theirs[b] / 1e9 * factor
            print(json.dumps({"bench": "allreduce_busbw", "ranks": ranks, "bytes": b,
                              "herd_busbw_GBps": round(ours[b]["busbw_GBps"], 3), "gloo_busbw_GBps": round(g_bus, 3),
                              "ratio": round(ours[b]["busbw_GBps"] / g_bus, 2),
                              "herd_time_s": ours[b]["time_s"], "gloo_time_s": round(theirs[b], 6),
                              "chunk_kb": a.chunk_kb, "ucx_tls": os.environ.get("UCX_TLS", "auto")}), flush=True)


if __name__ == "__main__":
    sys.exit(main())
