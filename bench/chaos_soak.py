"""A chaos soak: an elastic parameter-server job (S=2 W=4, cluster.elastic,
every process and the coordinator given --max-restarts 1000) on the ~20M
shape (configs/llama20m.textproto) trained once undisturbed (the anchor,
measured in the same invocation) and once while a driver injects faults,
both to the same final step, and the two final checkpoints compared byte
for byte.

The job is started by hand, as on a cluster: `herd coordinator`, then
herd-server and herd-worker processes with --rank and --coordinator. This
script plays the supervisor (systemd's Restart=, a batch script's loop)
that starts a process again when it exits with a failure: the coordinator
with its own command line; a server with --resume-if-any (continue from
the newest complete checkpoint); a lost worker's replacement with --join
--resume-if-any (it takes the lost rank's place and the job's state from
the servers, or, should the job be forming again after a restart, takes
part in that from the newest checkpoint). The survivors of a server's or
the coordinator's loss start themselves again (--max-restarts; workers
with --join --resume-if-any too) and the job continues from its newest
complete checkpoint; a worker's loss costs no restart (cluster.elastic:
the others take over its share).

The job: the config's model and optimizer, --batch-size 2 sequences per
worker (a global batch of 8 x seq_len tokens), fp32 on the wire, a
checkpoint every --checkpoint-every 2 steps (written in the background:
at this fault rate a restart every ~3 min rolls back to the newest
checkpoint, and 10 steps of redone work cost more than the writes),
heartbeats every 0.5 s, a process silent for --heartbeat-timeout-s 3 s
declared lost; every process with OMP_NUM_THREADS=1.

Faults, each at a uniformly random interval, from the first step until
the last:
  * a random worker every --worker-fault-s (10-30 s): kill -9, or, with
    probability --stop-share, SIGSTOP until --stop-extra-s past
    cluster.heartbeat_timeout_s (the job declares it lost), then SIGCONT
    (it learns it was let go and exits; a replacement joins);
  * a random server or the coordinator every --big-fault-s (2-4 min): kill -9;
  * with --netlab (emulated nodes, scripts/netlab.py: each process on a
    node of its own, UCX over TCP between them), a random node's link cut
    for --link-cut-s (5 s) every --link-fault-s (60-120 s).

train.steps is chosen so that the undisturbed job takes about
--undisturbed-share (0.9) of --minutes (from a short calibration run of
the same job), so that the disturbed one lasts about --minutes when its
goodput is about that share, and takes the faults of the whole budget;
--steps sets it instead. Old checkpoints are pruned
while a run goes on (the newest --keep-checkpoints complete ones stay).

One JSON line per run on stdout ("undisturbed", "disturbed": wall time,
steps, tokens/s, longest stall, restarts, faults by kind), then the
summary: faults injected (total and by kind), restarts observed, goodput
(tokens of the final trajectory per second of wall time, against the same
job undisturbed: the same tokens, so undisturbed wall / disturbed wall),
the longest stall (the longest wall interval without a new step in the
metrics), the final step, final_bytes_equal, and the targets (>= 100
faults, goodput >= 0.8, final bytes equal). Every fault, exit and restart
is logged to stderr with a timestamp (and to events.jsonl in the work
directory). Exits 1 when a job fails to finish (hangs past --stall-limit-s
without a new step, or past its deadline) or when the final checkpoints
differ in any byte, 0 otherwise (the other targets, faults and goodput,
are reported, not enforced).

    /usr/bin/python3 bench/chaos_soak.py [--minutes 30] [--seed 1] [--workdir DIR]
        [--netlab] [--steps N] [--worker-fault-s 10,30] [--big-fault-s 120,240]
        [--link-fault-s 60,120] [--link-cut-s 5] [--checkpoint-every 2]
        [--batch-size 2] [--heartbeat-timeout-s 3] [--set path=value ...]
    /usr/bin/python3 bench/chaos_soak.py --quick     # smoke run: a 3-minute budget, denser faults

A full run takes about --minutes x (1 + --undisturbed-share) plus a
minute of calibration: an hour at the default 30.

The work directory holds each run's processes' logs, metrics, the final
checkpoint and events.jsonl: by default a fresh one under the system's
temporary directory, removed after a run whose jobs finished with equal
final bytes (unless --keep; otherwise its path is the last line on
stderr); a --workdir must be new or empty, and is kept. The binaries are
copied there first, so that a rebuild meanwhile cannot swap them under
the processes that execute themselves anew. --netlab needs root.
Use Debian's /usr/bin/python3.
"""
import argparse
import ctypes
import glob
import hashlib
import json
import os
import random
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SERVERS, WORKERS = 2, 4
LAB_PORT = 29400
T0 = time.time()


# ---- logging ---------------------------------------------------------------

class EventLog:
    """Timestamped lines for people (stderr) and JSON lines for programs
    (events.jsonl in the work directory)."""

    def __init__(self):
        self.file = None
        self.run = ""
        self.run_t0 = time.time()

    def open(self, path):
        self.file = open(path, "a")

    def __call__(self, kind, text, **fields):
        now = time.time()
        stamp = time.strftime("%H:%M:%S", time.localtime(now)) + f".{int(now * 1000) % 1000:03d}"
        rel = now - self.run_t0
        sys.stderr.write(f"[{stamp} {self.run or '-'} +{rel:7.1f}s] {kind}: {text}\n")
        sys.stderr.flush()
        if self.file:
            self.file.write(json.dumps(dict(t=round(now, 3), run=self.run, at_s=round(rel, 2), kind=kind,
                                            text=text, **fields)) + "\n")
            self.file.flush()

    def record(self, kind, **fields):
        """A line for programs only (events.jsonl)."""
        if self.file:
            now = time.time()
            self.file.write(json.dumps(dict(t=round(now, 3), run=self.run, at_s=round(now - self.run_t0, 2),
                                            kind=kind, **fields)) + "\n")
            self.file.flush()


log = EventLog()


# ---- processes -------------------------------------------------------------

_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)


def _child_setup():
    # The kernel kills the child should this script die outright (kill -9);
    # kept across the child's own execve (herd's restarts) and ip netns exec.
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


LIVE = {}  # pid -> Popen, every process this script started and has not reaped


def kill_everything():
    """SIGKILL to the process group of everything started (each has its own)."""
    for pid, p in list(LIVE.items()):
        if p.poll() is None:
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.killpg(pid, sig)
                except OSError:
                    pass
    for pid, p in list(LIVE.items()):
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        LIVE.pop(pid, None)


def _on_signal(signo, frame):
    raise SystemExit(128 + signo)


class Proc:
    """One slot of the job (the coordinator, server r, worker r or a
    replacement worker) and its current process."""

    def __init__(self, key, role, rank, node, logpath):
        self.key, self.role, self.rank, self.node, self.logpath = key, role, rank, node, logpath
        self.popen = None
        self.argv = None
        self.started = 0.0
        self.stopped_until = None  # SIGSTOPped: when to SIGCONT
        self.exited = None
        self.read_to = 0  # how far scan_logs has read the log
        self.continued_at = None  # when a SIGSTOPped process got SIGCONT

    def alive(self):
        return self.popen is not None and self.popen.poll() is None

    def tail(self, n=6000):
        try:
            with open(self.logpath, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - n))
                return f.read().decode(errors="replace")
        except OSError:
            return ""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def exit_text(code):
    return f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"


# ---- a job -----------------------------------------------------------------

class Job:
    """One run of the job, started by hand, with this script as its
    supervisor; with `faults`, the chaos driver too."""

    def __init__(self, args, name, rundir, bins, sets, steps, lab, rng, faults):
        self.args, self.name, self.rundir, self.bins, self.steps = args, name, rundir, bins, steps
        self.lab, self.rng, self.faults_on = lab, rng, faults
        os.makedirs(rundir)
        self.token = os.path.join(rundir, "job.token")
        with open(os.open(self.token, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
            f.write(secrets.token_hex(16) + "\n")
        self.addr = f"{lab.address(0)}:{LAB_PORT}" if lab else f"127.0.0.1:{free_port()}"
        self.config = [os.path.abspath(args.config)] + [x for s in sets for x in ("--set", s)]
        self.env = dict(os.environ, OMP_NUM_THREADS="1")
        if lab:
            # UCX takes the namespaces for one host and would move bytes
            # through shared memory, around the links.
            self.env["UCX_TLS"] = "tcp"
        self.metrics = os.path.join(rundir, "metrics.jsonl")
        self.ckpt = os.path.join(rundir, "ckpt")
        self.slots = []
        self.replacements = 0
        self.faults = {k: 0 for k in ("worker_kill", "worker_stop", "server_kill", "coordinator_kill", "link_cut")}
        self.restarted = {"coordinator": 0, "server": 0, "worker_join": 0}
        self.other_exits = []  # failures the driver did not cause
        self.faulted = set()  # slots killed or stopped by the driver, until they exit
        self.max_step = 0
        self.step_times = []  # (wall, step) when the newest step went up
        self.finished = False
        self.links_down = {}  # node -> when to bring it up
        self.loads = []  # the machine's 1-minute load average, sampled
        # Nodes: 0 coordinator, 1..S servers, S+1..S+W workers.
        self.nodes = 1 + SERVERS + WORKERS

    # -- starting ------------------------------------------------------------
    def spawn(self, slot, argv):
        out = open(slot.logpath, "a")
        out.write(f"=== chaos_soak: {time.strftime('%H:%M:%S')} started: {' '.join(argv)}\n")
        out.flush()
        kw = dict(cwd=self.rundir, stdout=out, stderr=subprocess.STDOUT, env=self.env, start_new_session=True,
                  preexec_fn=_child_setup)
        slot.popen = self.lab.popen(slot.node, argv, **kw) if self.lab else subprocess.Popen(argv, **kw)
        out.close()
        LIVE[slot.popen.pid] = slot.popen
        slot.argv = argv
        slot.started = time.time()
        slot.stopped_until = None
        slot.continued_at = None
        slot.exited = None
        return slot.popen.pid

    def coordinator_argv(self):
        return [self.bins["herd"], "coordinator", *self.config, "--listen", self.addr, "--token-file", self.token,
                "--max-restarts", str(self.args.max_restarts)]

    def node_argv(self, role, rank, *extra):
        argv = [self.bins["herd-" + role], *self.config]
        if rank is not None:
            argv += ["--rank", str(rank)]
        return argv + ["--coordinator", self.addr, "--token-file", self.token,
                       "--max-restarts", str(self.args.max_restarts), *extra]

    def start(self):
        self.t0 = time.time()
        log.run_t0 = self.t0
        log.run = self.name
        c = Proc("coordinator", "coordinator", None, 0, os.path.join(self.rundir, "coordinator.log"))
        self.slots.append(c)
        self.spawn(c, self.coordinator_argv())
        for r in range(SERVERS):
            s = Proc(f"server{r}", "server", r, 1 + r, os.path.join(self.rundir, f"server{r}.log"))
            self.slots.append(s)
            self.spawn(s, self.node_argv("server", r))
        for r in range(WORKERS):
            w = Proc(f"worker{r}", "worker", r, 1 + SERVERS + r, os.path.join(self.rundir, f"worker{r}.log"))
            self.slots.append(w)
            self.spawn(w, self.node_argv("worker", r))
        log("start", f"coordinator on {self.addr}, {SERVERS} servers, {WORKERS} workers, {self.steps} steps"
            + (" on emulated nodes" if self.lab else ""))

    # -- the supervisor's part -----------------------------------------------
    def on_exit(self, slot, code):
        slot.exited = code
        LIVE.pop(slot.popen.pid, None)
        lived = time.time() - slot.started
        if code == 0:
            log("exit", f"{slot.key} (pid {slot.popen.pid}) finished (exit code 0)")
            if slot.role == "coordinator":
                self.finished = True
            return
        last = [l for l in slot.tail().splitlines() if l.strip()]
        why = next((l for l in reversed(last) if "error" in l or "refused" in l), last[-1] if last else "")
        log("exit", f"{slot.key} (pid {slot.popen.pid}) {exit_text(code)} after {lived:.1f} s: {why.strip()[-300:]}",
            slot=slot.key, code=code)
        if self.finished:
            return
        if slot.key in self.faulted:
            self.faulted.discard(slot.key)
        elif not (slot.role == "worker" and "has not started yet" in why):
            # Neither a fault's victim nor a joiner sent back while the job
            # forms again: worth a look.
            self.other_exits.append(f"{slot.key}: {exit_text(code)}: {why.strip()[-200:]}")
        if lived < 1.0:
            time.sleep(0.5)  # a process that cannot start at all is not restarted in a tight loop
        if slot.role == "coordinator":
            self.spawn(slot, self.coordinator_argv())
            self.restarted["coordinator"] += 1
            log("restart", f"coordinator started again (pid {slot.popen.pid})")
        elif slot.role == "server":
            self.spawn(slot, self.node_argv("server", slot.rank, "--resume-if-any"))
            self.restarted["server"] += 1
            log("restart", f"server {slot.rank} started again with --resume-if-any (pid {slot.popen.pid})")
        else:
            self.replace_worker(slot, why)

    def replace_worker(self, gone, why):
        """A worker exited: one takes its place, as the job can take it now."""
        if "is finishing" in why or "have already joined" in why or "has all its" in why:
            log("restart", f"no replacement for {gone.key}: the job does not need one ({why.strip()[-120:]})")
            return
        self.replacements += 1
        slot = Proc(f"worker+{self.replacements}", "worker", None, gone.node,
                    os.path.join(self.rundir, f"worker+{self.replacements:03d}.log"))
        self.slots.append(slot)
        # Joins the job under way, or takes part in its formation.
        self.spawn(slot, self.node_argv("worker", None, "--join", "--resume-if-any"))
        self.restarted["worker_join"] += 1
        how = "with --join --resume-if-any"
        log("restart", f"{slot.key} started in place of {gone.key} {how} (pid {slot.popen.pid})")

    # -- the chaos driver ----------------------------------------------------
    def member_workers(self):
        """Live, running workers that are in the job now: their log says they
        joined since they last started (or started themselves again)."""
        out = []
        now = time.time()
        for s in self.slots:
            # A stopped worker, once continued, exits when told it was
            # lost, or (the coordinator gone meanwhile) starts itself again.
            settling = s.key in self.faulted and (s.continued_at is None or now - s.continued_at < 30)
            if s.role == "worker" and s.alive() and s.stopped_until is None and not settling:
                text = s.tail(20000)
                since = max(text.rfind(": restart after: "), text.rfind("=== chaos_soak: "))
                if text.find("joined a job of", since) >= 0 or text.find(" joined the job: ", since) >= 0:
                    out.append(s)
        return out

    def next_at(self, spec):
        lo, hi = spec
        return time.time() + self.rng.uniform(lo, hi)

    def inject(self, now):
        a = self.args
        if now >= self.worker_fault_at:
            victims = self.member_workers()
            # While the job forms again no worker is in it: a moment later.
            self.worker_fault_at = self.next_at(a.worker_fault_s) if victims else now + 1
            if victims:
                v = self.rng.choice(victims)
                if self.rng.random() < a.stop_share:
                    self.faulted.add(v.key)
                    os.kill(v.popen.pid, signal.SIGSTOP)
                    v.stopped_until = now + a.heartbeat_timeout_s + a.stop_extra_s
                    self.faults["worker_stop"] += 1
                    log("fault", f"worker SIGSTOP: {v.key} (pid {v.popen.pid}) for "
                        f"{a.heartbeat_timeout_s + a.stop_extra_s:.1f} s", fault="worker_stop", slot=v.key)
                else:
                    self.faulted.add(v.key)
                    os.kill(v.popen.pid, signal.SIGKILL)
                    self.faults["worker_kill"] += 1
                    log("fault", f"worker kill -9: {v.key} (pid {v.popen.pid})", fault="worker_kill", slot=v.key)
        if now >= self.big_fault_at:
            self.big_fault_at = self.next_at(a.big_fault_s)
            key = self.rng.choice([f"server{r}" for r in range(SERVERS)] + ["coordinator"])
            v = next(s for s in self.slots if s.key == key)
            if v.alive():
                self.faulted.add(v.key)
                os.kill(v.popen.pid, signal.SIGKILL)
                kind = "coordinator_kill" if key == "coordinator" else "server_kill"
                self.faults[kind] += 1
                log("fault", f"{v.role} kill -9: {v.key} (pid {v.popen.pid})", fault=kind, slot=v.key)
        if self.lab and now >= self.link_fault_at:
            self.link_fault_at = self.next_at(a.link_fault_s)
            node = self.rng.choice([n for n in range(self.nodes) if n not in self.links_down])
            self.lab.link(node, up=False)
            self.links_down[node] = now + a.link_cut_s
            self.faults["link_cut"] += 1
            on = ", ".join(s.key for s in self.slots if s.node == node and s.alive()) or "nothing"
            log("fault", f"link cut: node {node} ({on}) for {a.link_cut_s:.1f} s", fault="link_cut", node=node)

    def timers(self, now):
        for s in self.slots:
            if s.stopped_until is not None and now >= s.stopped_until:
                s.stopped_until = None
                if s.alive():
                    s.continued_at = now
                    os.kill(s.popen.pid, signal.SIGCONT)
                    log("fault", f"SIGCONT: {s.key} (pid {s.popen.pid})")
        for node, at in list(self.links_down.items()):
            if now >= at:
                self.lab.link(node, up=True)
                del self.links_down[node]
                log("fault", f"link of node {node} up again")

    # -- watching --------------------------------------------------------------
    def read_metrics(self, now):
        try:
            with open(self.metrics) as f:
                lines = f.readlines()
        except OSError:
            return
        for line in lines:
            try:
                step = json.loads(line)["step"]
            except (ValueError, KeyError):
                continue  # a line being written
            if step > self.max_step:
                self.max_step = step
                self.step_times.append((now, step))
                log.record("step", step=step)

    def scan_logs(self):
        """Logs what the processes say about restarts, losses and joins as
        they say it (a process that starts itself again does not exit)."""
        for s in self.slots:
            try:
                with open(s.logpath, "rb") as f:
                    f.seek(s.read_to)
                    data = f.read()
            except OSError:
                continue
            end = data.rfind(b"\n") + 1
            s.read_to += end
            for line in data[:end].decode(errors="replace").splitlines():
                if ": restart after: " in line:
                    log("self-restart", f"{s.key}: {line.split(': restart after: ', 1)[1][:240]}")
                elif s.role == "coordinator" and "waiting for the job's processes to join again" in line:
                    log("job-restart", line.split("coordinator: ", 1)[-1][:240])
                elif s.role == "coordinator" and "(cluster.elastic)" in line and " was lost: " in line:
                    log("worker-lost", line.split("coordinator: ", 1)[-1][:240])
                elif " joined the job: it computes from step " in line:
                    log("joined", f"{s.key}: {line.strip()[:200]}")

    def prune(self):
        """Removes complete checkpoints older than the newest few (and
        abandoned ones older than those): a soak writes hundreds."""
        dirs = sorted(glob.glob(os.path.join(self.ckpt, "step_*")))
        complete = [d for d in dirs if os.path.exists(os.path.join(d, "manifest.json"))]
        if len(complete) <= self.args.keep_checkpoints:
            return
        oldest_kept = complete[-self.args.keep_checkpoints]
        for d in dirs:
            if d < oldest_kept and not d.endswith(f"step_{self.steps:08d}"):
                shutil.rmtree(d, ignore_errors=True)

    def run(self, deadline_s):
        """Runs the job to its end; returns whether it finished."""
        self.start()
        a = self.args
        started_faults = False
        last_prune = last_metrics = 0.0
        last_progress = time.time()
        failure = None
        while True:
            now = time.time()
            for s in list(self.slots):
                if s.popen is not None and s.exited is None and s.popen.poll() is not None:
                    self.on_exit(s, s.popen.returncode)
            if now - last_metrics >= 0.25:
                last_metrics = now
                self.read_metrics(now)
                self.scan_logs()
            if now - last_progress >= 60:
                last_progress = now
                log("progress", f"step {self.max_step}/{self.steps}" + (
                    f"; faults so far {sum(self.faults.values())}: " +
                    ", ".join(f"{k} {v}" for k, v in self.faults.items() if v) if self.faults_on else ""))
            if now - last_prune >= 5:
                last_prune = now
                self.prune()
                self.loads.append(os.getloadavg()[0])
            if self.faults_on and not self.finished:
                self.timers(now)
                if not started_faults and self.max_step >= 1:
                    started_faults = True
                    self.worker_fault_at = self.next_at(a.worker_fault_s)
                    self.big_fault_at = self.next_at(a.big_fault_s)
                    self.link_fault_at = self.next_at(a.link_fault_s)
                    log("chaos", "first step reached: faults begin")
                if started_faults and self.max_step < self.steps - 1:
                    self.inject(now)
            if self.finished:
                break
            since = now - (self.step_times[-1][0] if self.step_times else self.t0)
            if since > a.stall_limit_s:
                failure = f"no new step for {since:.0f} s (--stall-limit-s); newest step {self.max_step}"
                break
            if now - self.t0 > deadline_s:
                failure = f"not finished after {deadline_s:.0f} s; newest step {self.max_step}"
                break
            time.sleep(0.05)
        self.end = time.time()
        self.read_metrics(self.end)
        # The coordinator has seen everyone leave: the rest exit by themselves.
        for s in self.slots:
            if s.alive():
                if s.stopped_until is not None:
                    os.kill(s.popen.pid, signal.SIGCONT)
                try:
                    s.popen.wait(timeout=30 if failure is None else 0.1)
                except subprocess.TimeoutExpired:
                    if failure is None:
                        log("exit", f"{s.key} (pid {s.popen.pid}) still running 30 s after the job ended: killed")
                if s.alive():
                    os.killpg(s.popen.pid, signal.SIGKILL)
                s.popen.wait()
            if s.popen is not None:
                LIVE.pop(s.popen.pid, None)
        for node in list(self.links_down):
            self.lab.link(node, up=True)
        self.links_down.clear()
        final = os.path.join(self.ckpt, f"step_{self.steps:08d}")
        if failure is None and not os.path.exists(os.path.join(final, "manifest.json")):
            failure = f"the job ended without its final checkpoint ({final}/manifest.json); newest step {self.max_step}"
        self.scan_logs()
        if failure:
            log("failed", failure)
        else:
            log("done", f"step {self.max_step} in {self.end - self.t0:.1f} s")
            for d in glob.glob(os.path.join(self.ckpt, "step_*")):
                if d != final:
                    shutil.rmtree(d, ignore_errors=True)  # only the final one is compared
        self.failure = failure
        return failure is None

    # -- figures ---------------------------------------------------------------
    def count(self, needle, roles=None):
        n = 0
        for s in self.slots:
            if roles and s.role not in roles:
                continue
            try:
                with open(s.logpath, errors="replace") as f:
                    n += sum(needle in line for line in f)
            except OSError:
                pass
        return n

    def self_restart_causes(self):
        """Why processes started themselves again: {cause: count}, causes
        told apart by their words (numbers, addresses and names left out)."""
        causes = {}
        for s in self.slots:
            try:
                with open(s.logpath, errors="replace") as f:
                    lines = [l for l in f if ": restart after: " in l]
            except OSError:
                continue
            for line in lines:
                cause = line.split(": restart after: ", 1)[1].rsplit("; ", 1)[0]
                cause = re.sub(r"\(([^()]*)\)", "", cause)  # who: host, pid
                cause = re.sub(r"\s+", " ", re.sub(r"[0-9][0-9.:]*", "N", cause)).strip()
                causes[cause] = causes.get(cause, 0) + 1
        return dict(sorted(causes.items(), key=lambda kv: -kv[1])[:8])

    def longest_stall(self):
        """The longest wall interval without a new step, from the first step
        to the last (the start, the same in both runs, is reported apart)."""
        gaps = [(b[0] - a[0], a[1]) for a, b in zip(self.step_times, self.step_times[1:])]
        return max(gaps, default=(0.0, 0))

    def figures(self, global_tokens):
        wall = self.end - self.t0
        stall, after = self.longest_stall()
        coordinator_restarts = self.count("waiting for the job's processes to join again", ("coordinator",))
        return {
            "wall_s": round(wall, 1),
            "final_step": self.max_step,
            "tokens": self.max_step * global_tokens,
            "tokens_per_s": round(self.max_step * global_tokens / wall, 1) if wall > 0 else 0.0,
            "first_step_s": round(self.step_times[0][0] - self.t0, 1) if self.step_times else None,
            "longest_stall_s": round(stall, 1),
            "longest_stall_after_step": after,
            "faults": dict(self.faults, total=sum(self.faults.values())),
            "restarts": {
                # The coordinator's own restarts of the job (after a server's
                # loss), and its being started again (after its own).
                "job_restarts": coordinator_restarts + self.restarted["coordinator"],
                "process_self_restarts": self.count(": restart after: "),
                "self_restart_causes": self.self_restart_causes(),
                # Should be 0: a worker with --join --resume-if-any is never
                # refused for finding the job forming.
                "joiners_refused_while_forming": self.count("--join: the job has not started yet", ("worker",)),
                "started_again_by_supervisor": dict(self.restarted),
                "workers_joined": self.count(" joined the job: it computes from step ", ("worker",)),
                "workers_lost_elastic": self.count("the job goes on with", ("coordinator",))
                - self.count(" joined; the job goes on with", ("coordinator",)),
            },
            "exits_not_caused_by_faults": self.other_exits,
            # The job's 6 processes share the cores with whatever else runs:
            # a load well above theirs makes the two runs' times incomparable.
            "load_avg_1min": {"mean": round(sum(self.loads) / len(self.loads), 2) if self.loads else None,
                              "max": round(max(self.loads), 2) if self.loads else None},
            "finished": self.failure is None,
        }


# ---- the run as a whole -------------------------------------------------------

def snapshot(root):
    """Every file under root with its SHA-256 (None when root is missing)."""
    if not os.path.isdir(root):
        return None
    out = {}
    for d, _, files in os.walk(root):
        for name in files:
            path = os.path.join(d, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, root)] = hashlib.sha256(f.read()).hexdigest()
    return out


def interval(text):
    lo, _, hi = text.partition(",")
    lo, hi = float(lo), float(hi or lo)
    if not 0 < lo <= hi:
        raise argparse.ArgumentTypeError(f"{text!r}: expected LO,HI seconds with 0 < LO <= HI")
    return lo, hi


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--config", default=os.path.join(ROOT, "configs", "llama20m.textproto"))
    ap.add_argument("--minutes", type=float, default=30.0, help="budget for the disturbed run (default 30)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--workdir", help="new or empty directory for the runs (default: a fresh temporary one)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory after a run that finished")
    ap.add_argument("--netlab", action="store_true", help="each process on an emulated node; link cuts too (root)")
    ap.add_argument("--quick", action="store_true",
                    help="a smoke run: --minutes 3, a worker fault every 5-10 s, a server or the coordinator "
                         "every 45-75 s, a link cut every 40-60 s, a checkpoint every 5 steps")
    ap.add_argument("--steps", type=int, help="train.steps (default: from a calibration run and --minutes)")
    ap.add_argument("--undisturbed-share", type=float, default=0.9,
                    help="share of --minutes the undisturbed run should take (default 0.9)")
    ap.add_argument("--worker-fault-s", type=interval, help="LO,HI seconds between worker faults (10,30)")
    ap.add_argument("--big-fault-s", type=interval, help="LO,HI seconds between server/coordinator kills (120,240)")
    ap.add_argument("--link-fault-s", type=interval, help="LO,HI seconds between link cuts, --netlab (60,120)")
    ap.add_argument("--link-cut-s", type=float, default=5.0)
    ap.add_argument("--stop-share", type=float, default=0.5, help="share of worker faults that are SIGSTOP")
    ap.add_argument("--stop-extra-s", type=float, default=1.0, help="SIGSTOP lasts heartbeat timeout + this")
    ap.add_argument("--checkpoint-every", type=int)
    ap.add_argument("--keep-checkpoints", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=2, help="sequences per worker per step")
    ap.add_argument("--heartbeat-timeout-s", type=float, default=3.0)
    ap.add_argument("--heartbeat-interval-s", type=float, default=0.5)
    ap.add_argument("--max-restarts", type=int, default=1000)
    ap.add_argument("--stall-limit-s", type=float, default=300.0, help="a run without a new step this long failed")
    ap.add_argument("--set", action="append", default=[], help="config override for every run")
    a = ap.parse_args()
    # The spec's intervals; --quick's are shorter, though not by the
    # budget's ratio: a restart's cost (stop, start, load the checkpoint,
    # redo the steps since it) does not shrink with the budget.
    defaults = {"worker_fault_s": (10, 30), "big_fault_s": (120, 240), "link_fault_s": (60, 120),
                "checkpoint_every": 2}
    if a.quick:
        defaults = {"worker_fault_s": (5, 10), "big_fault_s": (45, 75), "link_fault_s": (40, 60),
                    "checkpoint_every": 5}
        if a.minutes == 30.0:
            a.minutes = 3.0
    for name, default in defaults.items():
        if getattr(a, name) is None:
            setattr(a, name, default)
    return a


def make_workdir(a):
    """The work directory, and whether it may be removed afterwards (a fresh
    temporary one); a --workdir is never overwritten, and is kept."""
    if a.workdir is None:
        return tempfile.mkdtemp(prefix="herd_chaos_soak_"), not a.keep
    d = os.path.abspath(a.workdir)
    if os.path.exists(d) and (not os.path.isdir(d) or os.listdir(d)):
        raise SystemExit(f"chaos_soak: --workdir {d}: exists and is not empty; name a new or empty directory")
    os.makedirs(d, exist_ok=True)
    return d, False


def job_sets(a, workdir, steps):
    return [
        f"train.steps={steps}", f"train.batch_size={a.batch_size}",
        f"data.train={os.path.join(workdir, 'train.bin')}", "data.val=", "data.prepare_from=",
        "checkpoint.dir=ckpt", f"checkpoint.every={a.checkpoint_every}",
        "log.every=1", "log.metrics=metrics.jsonl", "log.sample_tokens=0", "log.eval_every=0",
        "cluster.sync=PARAMETER_SERVER", f"cluster.servers={SERVERS}", f"cluster.workers={WORKERS}",
        "cluster.elastic=true", "cluster.coordinator=", f"cluster.heartbeat_interval_s={a.heartbeat_interval_s}",
        f"cluster.heartbeat_timeout_s={a.heartbeat_timeout_s}",
    ] + list(a.set)


def copy_binaries(a, workdir):
    bindir = os.path.join(workdir, "bin")
    os.makedirs(bindir)
    bins = {}
    for name in ("herd", "herd-server", "herd-worker"):
        src = os.path.join(a.build, name)
        if not os.access(src, os.X_OK):
            raise SystemExit(f"chaos_soak: {src}: not built (ninja -C {a.build})")
        bins[name] = os.path.join(bindir, name)
        shutil.copy2(src, bins[name])
    subprocess.run([bins["herd"], "version"], check=True, capture_output=True)
    return bins


def step_tokens(step_dir):
    """Tokens of one step over all workers, from the config a checkpoint
    saved (every override applied): workers x batch_size x grad_accum x
    seq_len (a PS worker's batch_size is its share)."""
    with open(os.path.join(step_dir, "config.textproto")) as f:
        text = f.read()

    def field(name, default):
        m = re.search(rf"\b{name}:\s*(\d+)", text)
        return int(m.group(1)) if m else default

    return field("workers", WORKERS) * field("batch_size", 1) * field("grad_accum", 1) * field("seq_len", 1)


def calibrate(a, workdir, bins, lab):
    """A short run of the same job: seconds to the first step and per step
    (checkpoints included), to size train.steps."""
    n = max(12, 2 * a.checkpoint_every + 2)
    job = Job(a, "calibration", os.path.join(workdir, "calibration"), bins, job_sets(a, workdir, n), n, lab,
              random.Random(0), faults=False)
    if not job.run(deadline_s=600):
        raise SystemExit(f"chaos_soak: the calibration run failed: {job.failure} (logs in {job.rundir})")
    by = dict((s, t) for t, s in job.step_times)
    first = min(by)
    step_s = (by[n] - by[first + 1]) / (n - first - 1) if n - first - 1 > 0 else 1.0
    startup = by[first] - job.t0
    shutil.rmtree(os.path.join(job.rundir, "ckpt"), ignore_errors=True)
    return startup, step_s


def main():
    a = parse_args()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _on_signal)
    workdir, removable = make_workdir(a)
    log.open(os.path.join(workdir, "events.jsonl"))
    cuts = f", link cuts of {a.link_cut_s:g} s every {a.link_fault_s[0]:g}-{a.link_fault_s[1]:g} s"
    log("setup", f"work directory {workdir}; seed {a.seed}; budget {a.minutes:g} min; worker faults every "
        f"{a.worker_fault_s[0]:g}-{a.worker_fault_s[1]:g} s, server/coordinator every "
        f"{a.big_fault_s[0]:g}-{a.big_fault_s[1]:g} s" + (cuts if a.netlab else ""))
    lab = None
    ok = False
    try:
        bins = copy_binaries(a, workdir)
        texts = sorted(glob.glob("/usr/share/games/fortunes/*"))
        if not texts:
            raise SystemExit("chaos_soak: no text in /usr/share/games/fortunes (apt install fortunes)")
        subprocess.run([bins["herd"], "prepare", *texts, "--out", os.path.join(workdir, "train.bin")], check=True,
                       capture_output=True)
        if a.netlab:
            sys.path.insert(0, os.path.join(ROOT, "scripts"))
            import netlab
            try:
                lab = netlab.Lab(nodes=1 + SERVERS + WORKERS)
                lab.create()
            except netlab.Unavailable as e:
                raise SystemExit(f"chaos_soak: --netlab: {e}")
        budget = a.minutes * 60
        steps = a.steps
        calibration = None
        if steps is None:
            startup, step_s = calibrate(a, workdir, bins, lab)
            steps = max(a.checkpoint_every + 2, int((a.undisturbed_share * budget - startup) / step_s))
            calibration = {"first_step_s": round(startup, 1), "step_s": round(step_s, 3)}
            log("setup", f"calibration: first step after {startup:.1f} s, then {step_s:.2f} s a step: "
                f"train.steps={steps} (undisturbed ~{startup + steps * step_s:.0f} s)")
        sets = job_sets(a, workdir, steps)
        rng = random.Random(a.seed)

        ref = Job(a, "undisturbed", os.path.join(workdir, "undisturbed"), bins, sets, steps, lab, rng, faults=False)
        ref_ok = ref.run(deadline_s=max(3 * budget, budget + 1200))
        last = f"step_{steps:08d}"
        global_tokens = step_tokens(os.path.join(ref.ckpt, last)) if ref_ok else 0
        ref_fig = ref.figures(global_tokens)
        print(json.dumps({"bench": "chaos_soak", "run": "undisturbed", "steps": steps, **ref_fig}), flush=True)
        if not ref_ok:
            raise SystemExit(1)

        dis = Job(a, "disturbed", os.path.join(workdir, "disturbed"), bins, sets, steps, lab, rng, faults=True)
        dis_ok = dis.run(deadline_s=max(3 * budget, budget + 1200))
        dis_fig = dis.figures(global_tokens)
        print(json.dumps({"bench": "chaos_soak", "run": "disturbed", "steps": steps, **dis_fig}), flush=True)

        want = snapshot(os.path.join(ref.ckpt, last))
        got = snapshot(os.path.join(dis.ckpt, last)) if dis_ok else None
        equal = bool(want) and got == want
        differ = sorted(k for k in set(want or {}) | set(got or {}) if (want or {}).get(k) != (got or {}).get(k))
        goodput = round(ref_fig["wall_s"] / dis_fig["wall_s"], 4) if dis_ok else 0.0
        faults = dis_fig["faults"]["total"]
        summary = {
            "bench": "chaos_soak", "run": "summary", "config": os.path.basename(a.config), "servers": SERVERS,
            "workers": WORKERS, "netlab": a.netlab, "seed": a.seed, "minutes": a.minutes, "steps": steps,
            "global_batch_tokens": global_tokens, "checkpoint_every": a.checkpoint_every, "calibration": calibration,
            "heartbeat_timeout_s": a.heartbeat_timeout_s,
            "faults_injected": faults, "faults_by_kind": {k: v for k, v in dis_fig["faults"].items() if k != "total"},
            "restarts": dis_fig["restarts"],
            "goodput": goodput,
            "longest_stall_s": dis_fig["longest_stall_s"], "undisturbed_longest_stall_s": ref_fig["longest_stall_s"],
            "wall_s_disturbed": dis_fig["wall_s"], "wall_s_undisturbed": ref_fig["wall_s"],
            "final_step": dis_fig["final_step"], "final_bytes_equal": equal,
            "final_files_differing": differ[:20],
            "job_finished": dis_ok,
            "targets": {"faults": 100, "goodput": 0.8, "final_bytes_equal": True},
            "targets_met": {"faults": faults >= 100, "goodput": goodput >= 0.8, "final_bytes_equal": equal},
        }
        if not a.netlab:
            summary["link_cuts"] = "not injected: needs --netlab (emulated nodes)"
        print(json.dumps(summary), flush=True)
        if not dis_ok:
            raise SystemExit(1)
        if not equal:
            # The work directory is kept (below), for the differing files to be compared.
            log("verdict", f"the final checkpoints differ: {len(differ)} files, {', '.join(differ[:3])}"
                f"{' ...' if len(differ) > 3 else ''} (step {steps}: {ref.ckpt} and {dis.ckpt})")
            raise SystemExit(1)
        ok = True
    finally:
        kill_everything()
        if lab is not None:
            lab.close()
        if removable and ok:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            sys.stderr.write(f"chaos_soak: kept the work directory {workdir}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
