"""scripts/netlab.py leaves nothing behind: a 5-node lab with a process on
every node is made and removed 20 times in a row, its owner ending in turn
normally, by Ctrl-C (SIGINT to its process group), by SIGTERM and by
SIGKILL; after each, no namespace, link or process of any lab is left.
Also: each node has its own address and reaches the others, and a link
capped at a rate carries about that rate in both directions at once; with
sites, a transfer between two sites crosses their uplinks at about the
uplinks' rate and is counted there, one within a site is not, and the
sites' bridges and uplinks go with the lab.
Skipped (77) where namespaces cannot be made (not root, no iproute2)."""
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

import herdtest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "scripts"))
import netlab  # noqa: E402

# Each node: a process that stays until it is killed, and says it started.
NODE_PROC = "import time; print('up', flush=True); time.sleep(600)"

OWNER = r"""
import faulthandler, json, os, signal, subprocess, sys, time
faulthandler.register(signal.SIGUSR1, file=open(os.environ["NETLAB_TEST_STACKS"], "w"), all_threads=True)
sys.path.insert(0, {scripts!r})
import netlab
with netlab.Lab(nodes=5, rate="1gbit") as lab:
    procs = [lab.popen(i, [sys.executable, "-c", {node_proc!r}], stdout=subprocess.PIPE,
                       stderr=subprocess.DEVNULL, text=True)
             for i in range(5)]
    for p in procs:
        assert p.stdout.readline().strip() == "up"
    print(json.dumps({{"ready": lab.owner}}), flush=True)
    if sys.argv[1] == "return":
        sys.exit(0)
    time.sleep(600)
"""


def wait_clean(owner, timeout=15):
    deadline = time.time() + timeout
    while True:
        left = netlab.leftovers(owner)
        if not any(left.values()) or time.time() > deadline:
            return left
        time.sleep(0.1)


def stuck(p, stacks):
    """What a lab owner that has not ended is doing: its Python stack, and
    the processes of its session, its guardian and any `ip`/`tc`, each with
    the kernel function it sleeps in."""
    os.kill(p.pid, signal.SIGUSR1)
    time.sleep(1)
    ps = subprocess.run(["ps", "-eo", "pid,ppid,pgid,sid,stat,wchan:32,etime,args"], capture_output=True,
                        text=True).stdout.splitlines()
    mine = [line[:200] for line in ps[1:]
            if line.split()[3] == str(p.pid) or f"_guard {p.pid}" in line or re.search(r" (ip|tc) ", line)]
    with open(stacks) as f:
        return "\n".join([ps[0]] + mine) + "\nowner's stack:\n" + f.read()


def one_cycle(how, stacks):
    script = OWNER.format(scripts=os.path.join(HERE, "..", "scripts"), node_proc=NODE_PROC)
    # Its traceback on Ctrl-C is expected; the checks are what is left.
    p = subprocess.Popen([sys.executable, "-c", script, how], stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL if how == "sigint" else None, text=True, start_new_session=True,
                         env=dict(os.environ, NETLAB_TEST_STACKS=stacks))
    line = p.stdout.readline()
    assert json.loads(line)["ready"] == p.pid, line
    t0 = time.time()
    if how == "sigint":
        os.killpg(p.pid, signal.SIGINT)  # what Ctrl-C at a terminal does
    elif how == "sigterm":
        p.send_signal(signal.SIGTERM)
    elif how == "sigkill":
        p.kill()
    # Generous: beside a heavy test on two cores, tearing five namespaces
    # down has taken over 30 s; what matters is that nothing is left.
    try:
        p.wait(timeout=120)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"{how}: the lab's owner has not ended in 120 s:\n{stuck(p, stacks)}")
    left = wait_clean(p.pid)
    assert not any(left.values()), f"{how}: left behind {left}"
    return time.time() - t0


def main():
    herdtest.parse_args()
    try:
        with netlab.Lab(nodes=2, rate="1gbit") as lab:
            # Its own address per node, reachable from the others; the link
            # carries about its rate both ways at once.
            rate = measure_duplex(lab)
    except netlab.Unavailable as e:
        print(f"skipped: {e}")
        sys.exit(77)
    for r in rate:
        assert 90e6 < r < 135e6, f"a 1gbit link carried {r / 1e6:.0f} MB/s (expected about 120)"
    print(f"ok  a 1gbit link carries {rate[0] / 1e6:.0f} and {rate[1] / 1e6:.0f} MB/s in its two directions at once")

    with netlab.Lab(nodes=3, rate="1gbit", sites=[0, 0, 1], between="50mbit") as lab:
        crossed = {}
        for to in (2, 1):
            before = lab.uplink_counters(0)["tx_bytes"]
            rate = transfer(lab, 0, to, megabytes=4)
            crossed[to] = (lab.uplink_counters(0)["tx_bytes"] - before, rate)
    assert netlab.leftovers(os.getpid()) == {"netns": 0, "links": 0, "processes": 0}, netlab.leftovers(os.getpid())
    across, rate = crossed[2]
    assert 5e6 < rate < 7.5e6, f"between sites over a 50mbit uplink: {rate / 1e6:.1f} MB/s (expected about 6.25)"
    assert across >= 4 << 20, f"4 MiB sent to the other site, {across} bytes counted on the uplink"
    assert crossed[1][0] < 1 << 20, f"4 MiB sent within a site, {crossed[1][0]} bytes counted on the uplink"
    print(f"ok  between sites over a 50mbit uplink: {rate / 1e6:.2f} MB/s, {across / 2**20:.2f} MiB counted for "
          f"4 MiB; within a site {crossed[1][0]} bytes")

    # A lab made later sweeps a dead owner's leftovers: each cycle is
    # checked before the next lab is made, so the sweep cannot hide them.
    times = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(20):
            how = ("return", "sigint", "sigterm", "sigkill")[i % 4]
            times.setdefault(how, []).append(one_cycle(how, os.path.join(tmp, "stacks")))
    for how, ts in times.items():
        print(f"ok  5 nodes made and removed {len(ts)}x, owner ending by {how}: nothing left "
              f"(removed within {max(ts):.1f} s)")


RECV = r"""
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 5000)); s.listen(1); print("listening", flush=True)
c, _ = s.accept(); got = 0; t0 = None
while True:
    b = c.recv(1 << 20)
    if not b: break
    if t0 is None: t0 = time.time()
    got += len(b)
print(got / (time.time() - t0), flush=True)
"""
SEND = r"""
import socket, sys
c = socket.create_connection((sys.argv[1], 5000)); buf = b"x" * (1 << 20)
for _ in range(int(sys.argv[2]) if len(sys.argv) > 2 else 120): c.sendall(buf)
c.close()
"""


def measure_duplex(lab):
    receivers = [lab.popen(i, [sys.executable, "-c", RECV, lab.address(i)], stdout=subprocess.PIPE, text=True)
                 for i in range(2)]
    for r in receivers:
        assert r.stdout.readline().strip() == "listening"
    senders = [lab.popen(i, [sys.executable, "-c", SEND, lab.address(1 - i)]) for i in range(2)]
    for s in senders:
        assert s.wait(timeout=60) == 0
    return [float(r.stdout.readline()) for r in receivers]


def transfer(lab, src, dst, megabytes):
    """MiB from node src to node dst; the rate the receiver saw (bytes/s)."""
    receiver = lab.popen(dst, [sys.executable, "-c", RECV, lab.address(dst)], stdout=subprocess.PIPE, text=True)
    assert receiver.stdout.readline().strip() == "listening"
    sender = lab.popen(src, [sys.executable, "-c", SEND, lab.address(dst), str(megabytes)])
    assert sender.wait(timeout=60) == 0
    return float(receiver.stdout.readline())


if __name__ == "__main__":
    main()
