#!/usr/bin/env python3
"""Emulated nodes on one machine: network namespaces on one bridge, each
with its own address and a full-duplex link capped by tbf on both veth
ends, for running herd processes "across nodes" (UCX over TCP between
nodes) where the network, not the loopback, sets the pace.

    netlab.py run --nodes 5 --rate 1gbit -- COMMAND [ARG...]
        makes the lab, runs COMMAND on the host with NETLAB_NODES set (a
        JSON list of {"node", "netns", "address"}; start a process on a node
        with `ip netns exec NETNS ...`), removes the lab when COMMAND ends;
        exits with COMMAND's status.
    netlab.py status     the labs that exist (JSON)
    netlab.py sweep      removes labs whose owner is gone (JSON)

As a library (bench/, tests/): `with Lab(nodes=3, rate="1gbit") as lab:
lab.popen(0, [...])`, `lab.set_rate(i, ...)`, `lab.link(i, up=False)`.
Sites joined by slower links: `Lab(nodes=6, rate="1gbit", sites=[0, 0, 0,
1, 1, 1], between="50mbit")` puts each site's nodes on a bridge of its own
and joins every site's bridge to a core bridge by an uplink capped at
`between` both ways (one L2 segment still: the addresses do not change);
`lab.uplink_counters(k)` is what crossed site k's uplink.

Nothing is left behind: the lab is removed when its owner returns, fails,
gets Ctrl-C or SIGTERM, and, when the owner is killed outright, by a
guardian process that outlives it (it waits for the owner's end of a pipe
to close). Removing a lab kills every process inside its namespaces,
deletes the namespaces (and with them the veth pairs) and the bridge.
Every object is named after the lab (hl<owner pid>...), so `sweep` can
tell a dead owner's leftovers from a live lab.

Needs root (CAP_NET_ADMIN) and iproute2; where namespaces cannot be made,
Lab() raises Unavailable with a one-line reason (tests skip on it).
"""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time

PREFIX = "hl"
SUBNET = "10.77.0"  # each lab is its own L2 segment: labs may share addresses


class Unavailable(Exception):
    """This machine cannot make a lab (not root, no iproute2, no netns)."""


def _ip(*args, check=True, netns=None):
    """`ip ARGS` (or `tc ARGS` when args start with "tc"), on the host or in netns."""
    tool = [] if args[0] == "tc" else ["ip"]
    cmd = (["ip", "netns", "exec", netns] if netns else []) + tool + list(args)
    p = subprocess.run(cmd, capture_output=True, text=True)
    if check and p.returncode != 0:
        raise RuntimeError(f"netlab: {' '.join(cmd)}: {p.stderr.strip() or 'exit ' + str(p.returncode)}")
    return p


def parse_rate(rate):
    """'1gbit', '500mbit', '2.5gbit', '10gbit' -> bits per second."""
    m = re.fullmatch(r"\s*([0-9.]+)\s*([kmg]?)bit\s*", str(rate).lower())
    if not m:
        raise ValueError(f"netlab: link rate {rate!r}: expected a number then kbit, mbit or gbit (e.g. 2.5gbit)")
    bits = float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]
    if bits <= 0:
        raise ValueError(f"netlab: link rate {rate!r} must be above zero")
    return bits


def _tbf(dev, rate, netns=None, change=False):
    bits = parse_rate(rate)
    # The bucket holds 4 ms at the rate, and at least 256 KiB: more than the
    # largest packet a veth queues (a 64 KiB GSO segment plus headers). A
    # packet larger than the bucket never leaves, and stalls the link for
    # good when a rate change shrinks the bucket under packets queued before.
    burst = max(256 << 10, int(bits / 8 * 0.004))
    # `change` alters the limiter in place: its queue and child stay.
    _ip("tc", "qdisc", "change" if change else "add", "dev", dev, "root", "handle", "1:", "tbf", "rate",
        f"{int(bits)}bit", "burst", str(burst), "latency", "100ms", netns=netns)
    if not change:
        # Behind the limiter, priority bands by the packets' TOS, as a NIC's
        # default queue has: low-delay traffic (herd's control messages)
        # goes first instead of waiting, and being dropped, behind bulk data.
        _ip("tc", "qdisc", "add", "dev", dev, "parent", "1:1", "handle", "10:", "pfifo_fast", netns=netns)


def _names(owner):
    return {"bridge": f"{PREFIX}{owner}br"}


def _site_names(owner, k):
    """Site k's bridge and its uplink's two ends (on the site's bridge, on the core's)."""
    return {"bridge": f"{PREFIX}{owner}g{k}", "site_end": f"{PREFIX}{owner}u{k}", "core_end": f"{PREFIX}{owner}w{k}"}


def _node_names(owner, i):
    return {"netns": f"{PREFIX}{owner}n{i}", "host_veth": f"{PREFIX}{owner}v{i}"}


def _labs():
    """{owner pid: [netns...]} of every lab on this machine, and bridges."""
    labs = {}
    p = _ip("netns", "list", check=False)
    for line in p.stdout.splitlines():
        m = re.match(rf"{PREFIX}(\d+)n(\d+)\b", line)
        if m:
            labs.setdefault(int(m.group(1)), {"netns": [], "bridge": None})["netns"].append(line.split()[0])
    p = _ip("-o", "link", "show", "type", "bridge", check=False)
    for line in p.stdout.splitlines():
        m = re.search(rf"\d+: ({PREFIX}(\d+)br)\b", line)
        if m:
            labs.setdefault(int(m.group(2)), {"netns": [], "bridge": None})["bridge"] = m.group(1)
    return labs


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_lab(owner):
    """Kills every process in the lab's namespaces, deletes them and the
    bridge. Idempotent; returns what it removed."""
    lab = _labs().get(owner, {"netns": [], "bridge": None})
    killed = 0
    for ns in lab["netns"]:
        for _ in range(50):
            pids = [int(x) for x in _ip("netns", "pids", ns, check=False).stdout.split()]
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed += 1
                except ProcessLookupError:
                    pass
            time.sleep(0.05)
        _ip("netns", "del", ns, check=False)
    if lab["bridge"]:
        _ip("link", "del", lab["bridge"], check=False)
    # Host ends of the pairs go with their namespaces; any left (a namespace
    # that was never made) are removed by name.
    # Sites' bridges and uplinks (deleting one end of a pair deletes both).
    for line in _ip("-o", "link", "show", check=False).stdout.splitlines():
        m = re.search(rf"\d+: ({PREFIX}{owner}[vguw]\d+)[@:]", line)
        if m:
            _ip("link", "del", m.group(1), check=False)
    return {"owner": owner, "netns": len(lab["netns"]), "processes_killed": killed}


def sweep():
    """Removes the labs of owners that no longer run."""
    return [remove_lab(owner) for owner in sorted(_labs()) if not _alive(owner)]


class Lab:
    """N nodes n0..n{N-1} at SUBNET.1..N on one bridge; `rate` caps each
    node's link in both directions (None: uncapped)."""

    def __init__(self, nodes, rate=None, sites=None, between=None):
        if nodes < 1 or nodes > 200:
            raise ValueError(f"netlab: --nodes {nodes}: between 1 and 200")
        if rate is not None:
            parse_rate(rate)
        if sites is not None and (len(sites) != nodes or sorted(set(sites)) != list(range(max(sites) + 1))):
            raise ValueError(f"netlab: sites {sites}: one site number a node, 0 .. K-1, each used")
        if between is not None:
            parse_rate(between)
        self.nodes = nodes
        self.rate = rate
        self.sites = sites
        self.between = between
        self.owner = os.getpid()
        self._procs = []
        self._guardian = None
        self._made = False

    # -- making and removing ------------------------------------------------
    def __enter__(self):
        self.create()
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def create(self):
        if os.geteuid() != 0:
            raise Unavailable("netlab: network namespaces need root (CAP_NET_ADMIN)")
        try:
            subprocess.run(["ip", "-V"], capture_output=True, check=True)
            subprocess.run(["tc", "-V"], capture_output=True, check=True)
        except (OSError, subprocess.CalledProcessError):
            raise Unavailable("netlab: ip and tc (iproute2) are not installed")
        sweep()
        if _labs().get(self.owner):
            raise RuntimeError(f"netlab: this process (pid {self.owner}) already has a lab")
        # The guardian removes the lab if this process dies without doing so.
        self._guardian = subprocess.Popen([sys.executable, os.path.abspath(__file__), "_guard", str(self.owner)],
                                          stdin=subprocess.PIPE, start_new_session=True)
        self._made = True
        try:
            bridge = _names(self.owner)["bridge"]
            p = _ip("link", "add", bridge, "type", "bridge", check=False)
            if p.returncode != 0:
                raise Unavailable(f"netlab: cannot make a bridge: {p.stderr.strip()}")
            _ip("link", "set", bridge, "up")
            site_bridges = []
            for k in range(max(self.sites) + 1 if self.sites else 0):
                n = _site_names(self.owner, k)
                _ip("link", "add", n["bridge"], "type", "bridge")
                _ip("link", "set", n["bridge"], "up")
                _ip("link", "add", n["site_end"], "type", "veth", "peer", "name", n["core_end"])
                _ip("link", "set", n["site_end"], "master", n["bridge"])
                _ip("link", "set", n["core_end"], "master", bridge)
                for end in ("site_end", "core_end"):
                    _ip("link", "set", n[end], "up")
                    if self.between is not None:
                        _tbf(n[end], self.between)
                site_bridges.append(n["bridge"])
            for i in range(self.nodes):
                self._make_node(i, site_bridges[self.sites[i]] if self.sites else bridge)
        except BaseException:
            self.close()
            raise

    def _make_node(self, i, bridge):
        n = _node_names(self.owner, i)
        p = _ip("netns", "add", n["netns"], check=False)
        if p.returncode != 0:
            raise Unavailable(f"netlab: cannot make a network namespace: {p.stderr.strip()}")
        _ip("link", "add", n["host_veth"], "type", "veth", "peer", "name", "eth0", "netns", n["netns"])
        _ip("link", "set", n["host_veth"], "master", bridge)
        _ip("link", "set", n["host_veth"], "up")
        _ip("link", "set", "lo", "up", netns=n["netns"])
        _ip("addr", "add", f"{self.address(i)}/24", "dev", "eth0", netns=n["netns"])
        _ip("link", "set", "eth0", "up", netns=n["netns"])
        if self.rate is not None:
            _tbf("eth0", self.rate, netns=n["netns"])  # the node's sending side
            _tbf(n["host_veth"], self.rate)  # its receiving side

    def close(self):
        """Stops this lab's processes and removes the lab; safe to repeat."""
        for p in self._procs:
            if p.poll() is None:
                p.kill()
        for p in self._procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self._procs = []
        if self._made:
            remove_lab(self.owner)
            self._made = False
        if self._guardian is not None:
            self._guardian.stdin.close()
            self._guardian.wait()
            self._guardian = None

    # -- using -------------------------------------------------------------
    def address(self, i):
        return f"{SUBNET}.{i + 1}"

    def netns(self, i):
        return _node_names(self.owner, i)["netns"]

    def describe(self):
        return [{"node": i, "netns": self.netns(i), "address": self.address(i), "hostname": self.hostname(i)}
                for i in range(self.nodes)]

    def hostname(self, i):
        return f"node{i}"

    def command(self, i, argv):
        """argv run on node i, under the node's own host name (a UTS
        namespace of its own), as on a machine of its own."""
        return (["ip", "netns", "exec", self.netns(i), "unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"',
                 self.hostname(i)] + list(argv))

    def popen(self, i, argv, **kwargs):
        """Starts argv on node i; the lab kills it when it closes."""
        p = subprocess.Popen(self.command(i, argv), **kwargs)
        self._procs.append(p)
        return p

    def set_rate(self, i, rate):
        """Changes node i's link rate (both directions) while it carries traffic."""
        n = _node_names(self.owner, i)
        _tbf("eth0", rate, netns=n["netns"], change=True)
        _tbf(n["host_veth"], rate, change=True)

    def link(self, i, up):
        """Takes node i's link down (or up again), as a pulled cable would."""
        _ip("link", "set", _node_names(self.owner, i)["host_veth"], "up" if up else "down")

    def counters(self, i):
        """Bytes node i has sent and received on its link, and packets its
        link's rate limiters dropped going out of and into the node."""
        out = _ip("-s", "-j", "link", "show", "eth0", netns=self.netns(i)).stdout
        stats = json.loads(out)[0]["stats64"]
        c = {"tx_bytes": stats["tx"]["bytes"], "rx_bytes": stats["rx"]["bytes"], "tx_drops": 0, "rx_drops": 0}
        if self.rate is not None:
            n = _node_names(self.owner, i)
            for key, dev, netns in (("tx_drops", "eth0", n["netns"]), ("rx_drops", n["host_veth"], None)):
                qdiscs = json.loads(_ip("tc", "-s", "-j", "qdisc", "show", "dev", dev, netns=netns).stdout)
                c[key] = sum(q.get("drops", 0) for q in qdiscs)
        return c


    def uplink_counters(self, k):
        """Bytes that left site k over its uplink (tx) and came in (rx),
        and packets the uplink's limiters dropped each way."""
        n = _site_names(self.owner, k)
        stats = json.loads(_ip("-s", "-j", "link", "show", n["site_end"]).stdout)[0]["stats64"]
        c = {"tx_bytes": stats["tx"]["bytes"], "rx_bytes": stats["rx"]["bytes"], "tx_drops": 0, "rx_drops": 0}
        if self.between is not None:
            for key, dev in (("tx_drops", n["site_end"]), ("rx_drops", n["core_end"])):
                qdiscs = json.loads(_ip("tc", "-s", "-j", "qdisc", "show", "dev", dev).stdout)
                c[key] = sum(q.get("drops", 0) for q in qdiscs)
        return c


def leftovers(owner=None):
    """What exists of `owner`'s lab (or of every lab): namespaces, links,
    processes inside the namespaces."""
    labs = {o: l for o, l in _labs().items() if owner is None or o == owner}
    netns = sum(len(l["netns"]) for l in labs.values())
    who = str(owner) if owner is not None else r"\d+"
    links = [l for l in _ip("-o", "link", "show", check=False).stdout.splitlines()
             if re.search(rf"\d+: {PREFIX}{who}(br|[vguw]\d+)[@:]", l)]
    procs = sum(len(_ip("netns", "pids", ns, check=False).stdout.split()) for l in labs.values() for ns in l["netns"])
    return {"netns": netns, "links": len(links), "processes": procs}


def _guard(owner):
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sys.stdin.buffer.read()  # EOF when the owner closes the lab or dies
    remove_lab(owner)


def main():
    ap = argparse.ArgumentParser(description="Emulated nodes on one machine (network namespaces, capped links).")
    sub = ap.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="make a lab, run a command with NETLAB_NODES set, remove the lab")
    run.add_argument("--nodes", type=int, required=True)
    run.add_argument("--rate", default=None, help="link rate per node and direction, e.g. 1gbit (default: uncapped)")
    run.add_argument("command", nargs=argparse.REMAINDER)
    sub.add_parser("status", help="the labs on this machine (JSON)")
    sub.add_parser("sweep", help="remove labs whose owner is gone (JSON)")
    g = sub.add_parser("_guard")
    g.add_argument("owner", type=int)
    args = ap.parse_args()

    if args.cmd == "_guard":
        _guard(args.owner)
        return 0
    if args.cmd == "status":
        print(json.dumps({"labs": [{"owner": o, "alive": _alive(o), **l} for o, l in sorted(_labs().items())],
                          "leftovers": leftovers()}))
        return 0
    if args.cmd == "sweep":
        print(json.dumps({"removed": sweep()}))
        return 0
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("run: no command after --")
    # SIGTERM unwinds like Ctrl-C, through the lab's close().
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    try:
        with Lab(args.nodes, args.rate) as lab:
            env = dict(os.environ, NETLAB_NODES=json.dumps(lab.describe()))
            print(json.dumps({"lab": lab.owner, "nodes": lab.describe(), "rate": args.rate}), flush=True)
            return subprocess.run(command, env=env).returncode
    except (Unavailable, ValueError, RuntimeError) as e:
        print(f"netlab: error: {e}".replace("netlab: error: netlab: ", "netlab: error: "), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 128 + signal.SIGINT


if __name__ == "__main__":
    sys.exit(main())
