"""Helpers for the script tests (tests/*_test.py): run the real herd binary
in a scratch directory, write configs and corpora. Not a test itself."""
import argparse
import atexit
import contextlib
import hashlib
import os
import random
import json
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time


# `scripts/test.sh --long`: the full matrices and trial counts. Without it
# each test proves its claim with the fewest steps and processes that show
# it, so that the suite stays under 25 minutes on 2 cores.
LONG = os.environ.get("HERD_TEST_LONG") == "1"


def parse_args():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--source", required=True)
    return ap.parse_args()


# Whether this test process is ending with an uncaught exception (a failed
# assertion): Python reports it through sys.excepthook before it runs the
# atexit functions that remove the scratch directories.
_failing = []
_report_exception = sys.excepthook


def _note_failure(kind, value, tb):
    _failing.append(kind)
    _report_exception(kind, value, tb)


sys.excepthook = _note_failure


class Sandbox:
    """A scratch directory and the herd binary; files and runs live there.
    The directory is removed when the test process exits, except after a
    failure (it is named on stderr, to look into) or with
    HERD_KEEP_TEST_DIRS set."""

    def __init__(self, build):
        self.build = os.path.abspath(build)
        self.herd = os.path.join(self.build, "herd")
        self.dir = tempfile.mkdtemp(prefix="herd_test_")
        atexit.register(self._remove)

    def _remove(self):
        if _failing or os.environ.get("HERD_KEEP_TEST_DIRS"):
            sys.stderr.write(f"kept the test's files: {self.dir}\n")
        else:
            shutil.rmtree(self.dir, ignore_errors=True)

    def path(self, *parts):
        return os.path.join(self.dir, *parts)

    def run(self, *args, check=True, env=None):
        e = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
        if env:
            e.update(env)
        p = subprocess.run([self.herd, *args], cwd=self.dir, capture_output=True, text=True, env=e)
        if check and p.returncode != 0:
            sys.stderr.write(p.stdout + p.stderr)
            raise AssertionError(f"herd {' '.join(args)} exited {p.returncode}")
        return p

    def write(self, name, text):
        # Whole or not at all: a process started a moment earlier may be
        # reading the file this one replaces.
        tmp = self.path(name + ".tmp")
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, self.path(name))
        return self.path(name)

    def training_data(self):
        """corpus.txt and its tokens, train.bin: what most jobs train on."""
        self.corpus()
        self.run("prepare", "corpus.txt", "--out", "train.bin")
        return self.path("train.bin")

    def corpus(self, name="corpus.txt", n_bytes=200_000, seed=0):
        """Pseudo-English text: enough structure for a model to learn."""
        rng = random.Random(seed)
        words = ("the quick brown fox jumps over a lazy dog while seven wizards quietly judge "
                 "boxing matches near old rivers and every cat knows why").split()
        out = []
        size = 0
        while size < n_bytes:
            s = " ".join(rng.choice(words) for _ in range(rng.randint(4, 12))).capitalize() + ".\n"
            out.append(s)
            size += len(s)
        return self.write(name, "".join(out))


def tiny_config(train, val="", steps=20, ckpt="", every=0, metrics="", extra="", eval_every=0):
    return f"""
model {{ vocab_size: 256 hidden_size: 64 intermediate_size: 160 num_hidden_layers: 2
        num_attention_heads: 4 num_key_value_heads: 2 }}
train {{ steps: {steps} batch_size: 4 seq_len: 32 seed: 7 }}
optimizer {{ lr: 3e-3 min_lr: 3e-4 warmup_steps: 5 weight_decay: 0.1 clip_norm: 1.0 }}
data {{ train: "{train}" val: "{val}" }}
checkpoint {{ dir: "{ckpt}" every: {every} }}
log {{ every: 1 metrics: "{metrics}" sample_tokens: 0 {f"eval_every: {eval_every} eval_batches: 2" if eval_every else ""} }}
{extra}
"""


def emulated_sandbox(a):
    """A Sandbox of the emulated-device build's binaries (build/emulated),
    with train.bin and val.bin; exits 77 (skipped) where there is none."""
    if not os.path.exists(os.path.join(a.build, "emulated", "herd")):
        print("skipped: no emulated-device build")
        sys.exit(77)
    sb = Sandbox(os.path.join(a.build, "emulated"))
    sb.training_data()
    sb.run("prepare", "corpus.txt", "--out", "val.bin")
    return sb


def launch_watched(sb, name, extra, steps=20, ckpt="", args=(), edit=lambda text: text, watch=False):
    """`herd launch` of the tiny job with `extra` (device and cluster
    blocks), its text through `edit`, checkpoints every 10 steps under
    `ckpt` (when given); `watch`: held-out losses (val.bin) every 10 steps
    and a sample of 40 tokens at the end. The run and its metrics rows."""
    text = tiny_config("train.bin", val="val.bin" if watch else "", steps=steps, metrics=name + ".jsonl", ckpt=ckpt,
                       every=10 if ckpt else 0, extra=extra, eval_every=10 if watch else 0)
    if watch:
        text = text.replace("sample_tokens: 0", "sample_tokens: 40")
    p = sb.run("launch", sb.write(name + ".textproto", edit(text)), *args)
    return p, metrics_rows(sb.path(name + ".jsonl"))


def val_losses(rows):
    """The held-out losses of metrics rows, in step order."""
    return [r["val_loss"] for r in rows if r.get("val_loss") is not None]


def m20_steps(sb, name, cluster, steps):
    """Every step's metrics row of `herd launch` on the ~20M shape
    (LLAMA20M_MODEL), 2 micro-batches of 2 x 128 tokens a step, `steps`
    steps, with `cluster` (a cluster block; "" for one process); its
    metrics in NAME.jsonl."""
    sb.run("launch", sb.write(f"{name}.textproto", LLAMA20M_MODEL + f"""
train {{ steps: {steps} batch_size: 2 grad_accum: 2 seq_len: 128 seed: 7 }}
data {{ train: "train.bin" }}
log {{ every: 1 metrics: "{name}.jsonl" sample_tokens: 0 }}
{cluster}
"""))
    return metrics_rows(sb.path(name + ".jsonl"))


def m20_within(sb, steps, cases):
    """Each (what, cluster, against) of `cases` on the ~20M shape
    (m20_steps), within one process (`against` "one") or DDP with two
    workers ("ddp2") on the same global batch (steps_within); "what 2.3e-08
    (norm 1e-06)" of each, the worst relative differences."""
    runs = {"one": m20_steps(sb, "m20_one", "", steps),
            "ddp2": m20_steps(sb, "m20_ddp2", "cluster { sync: ALLREDUCE workers: 2 }", steps)}
    report = []
    for what, cluster, against in cases:
        rows = m20_steps(sb, "m20_" + "".join(c for c in what if c.isalnum()), cluster, steps)
        report.append(f"{what} {steps_within(rows, runs[against], '~20M ' + what):.2g}")
    return report


def within(x, y, what, tolerance=1e-5):
    """The worst relative difference of series `x` from `y` (as long, not
    empty), which must be under `tolerance`."""
    assert len(x) == len(y) and x, f"{what}: {len(x)} against {len(y)} steps"
    worst = max(abs(p - q) / abs(q) for p, q in zip(x, y))
    assert worst < tolerance, f"{what}: {worst:.3g} relative"
    return worst


# What a model-parallel run may differ from one process by, per step: the
# loss within STEP_TOLERANCE (fp32 adding the parts in another order stays
# near 1e-8), the gradient norm within NORM_TOLERANCE. The norm is the
# more sensitive of the two (up to 7e-5 measured on the tiny model's steps
# whose gradients nearly cancel, 3e-4 on a step whose norm spikes to 96),
# yet a norm 1.5% high, which clipping and AdamW all but hide from the
# losses, is 15 times its bound.
STEP_TOLERANCE = 1e-6
NORM_TOLERANCE = 1e-3


class Gap(tuple):
    """The worst relative (loss, grad_norm) differences of steps_within;
    formatted "1.4e-08 (norm 4.1e-06)"."""

    def __format__(self, spec):
        return f"{format(self[0], spec)} (norm {format(self[1], spec)})"


def steps_within(x, y, what, tolerance=STEP_TOLERANCE, norm_tolerance=NORM_TOLERANCE):
    """The worst relative differences (a Gap) of the steps `x` from `y`
    (metrics rows, the same steps, some): the loss must be under
    `tolerance`, the gradient norm under `norm_tolerance`."""
    assert [r["step"] for r in x] == [r["step"] for r in y] and x, \
        f"{what}: steps {[r['step'] for r in x]} against {[r['step'] for r in y]}"
    return Gap((within([r["loss"] for r in x], [r["loss"] for r in y], f"{what}, loss", tolerance),
                within([r["grad_norm"] for r in x], [r["grad_norm"] for r in y], f"{what}, grad_norm",
                       norm_tolerance)))


def trajectory(rows):
    """Each step's (step, loss, grad_norm, lr) of metrics rows: what two
    runs that train bit for bit alike share (timings aside)."""
    return [(r["step"], r["loss"], r["grad_norm"], r["lr"]) for r in rows]


def resume_from(sb, name, config, step_dir):
    """`herd launch config --resume` (its checkpoint dir `name`) from another
    run's checkpoint `step_dir` (under sb), linked in as name's own."""
    os.makedirs(sb.path(name))
    os.symlink(sb.path(step_dir), sb.path(name, os.path.basename(step_dir)))
    sb.run("launch", config, "--resume")


def refused_before_start(sb, cases):
    """Each (name, config, says): `herd launch config` exits non-zero with a
    line of stderr that says `says`, and no process started (no NAME.jsonl)."""
    for name, config, says in cases:
        p = sb.run("launch", config, check=False)
        lines = p.stderr.strip().splitlines()
        assert p.returncode != 0 and any(says in line for line in lines), f"{name}: {p.returncode} {p.stderr}"
        assert not os.path.exists(sb.path(name + ".jsonl")), f"{name}: a process started"


def sample_text(launched):
    """The sample a `herd launch` printed at its end (worker 0's lines, their
    prefix taken off), from its "sample (temperature ...)" line on."""
    lines = [line.split(": ", 1)[1] if line.startswith("worker 0: ") else line
             for line in launched.stdout.splitlines()]
    start = next(i for i, line in enumerate(lines) if line.startswith("sample ("))
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("done:"))
    return "\n".join(lines[start:end])


# tiny_config's model block, for a test to swap in another shape.
TINY_MODEL = "\n".join(tiny_config("x").split("\n")[1:3])
# configs/llama20m.textproto's model (d512, 8 layers, ~20M parameters).
LLAMA20M_MODEL = ("model { vocab_size: 256 hidden_size: 512 intermediate_size: 1024 num_hidden_layers: 8 "
                  "num_attention_heads: 8 num_key_value_heads: 4 tie_word_embeddings: true }")


def listing(root):
    """Every file under root (relative paths), for nothing-half-written checks."""
    out = []
    for d, _, files in os.walk(root):
        for f in files:
            out.append(os.path.relpath(os.path.join(d, f), root))
    return sorted(out)


def ensure_venv(build, name, *packages):
    """BUILD/NAME, a venv on top of Debian's python3 (and its torch) with
    `packages` from PyPI, made once; exits 77 (skipped) where PyPI cannot be
    reached. Returns its python."""
    venv = os.path.join(build, name)
    py = os.path.join(venv, "bin", "python")
    ok = os.path.join(venv, ".herd_ok")
    if os.path.exists(ok):
        return py
    try:
        subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", venv], check=True,
                       capture_output=True)
        subprocess.run([py, "-m", "pip", "install", "-q", *packages], check=True, capture_output=True, timeout=900)
    except (subprocess.SubprocessError, OSError) as e:
        print(f"SKIPPED: cannot install {' '.join(packages)} into {venv}: {e}")
        sys.exit(77)
    open(ok, "w").close()
    return py


def rerun_in_venv(build, name, *packages):
    """Runs this script again with BUILD/NAME's python (ensure_venv) and
    exits with its code, unless this is that run: then returns."""
    if os.environ.get("HERD_IN_VENV") == name:
        return
    py = ensure_venv(build, name, *packages)
    env = dict(os.environ, HERD_IN_VENV=name)
    sys.exit(subprocess.run([py, os.path.abspath(sys.argv[0]), *sys.argv[1:]], env=env).returncode)


def read_token_file(path):
    """An llm.c token file: (its 256 header ints, its tokens)."""
    with open(path, "rb") as f:
        data = f.read()
    header = struct.unpack("<256i", data[:1024])
    fmt = "H" if header[0] == 20240520 else "I"
    return header, list(struct.unpack(f"<{header[2]}{fmt}", data[1024:]))


def snapshot(root):
    """Every file under root with its MD5: what must not change. A missing
    root is an error, not an empty snapshot (two runs that both failed to
    write a directory would otherwise compare equal)."""
    assert os.path.isdir(root), f"{root}: no such directory to snapshot"
    out = {}
    for rel in listing(root):
        with open(os.path.join(root, rel), "rb") as f:
            out[rel] = hashlib.md5(f.read()).hexdigest()
    return out


def training_state(step_dir):
    """A checkpoint step's optimizer shards and data positions, each with its
    MD5: what a run that trains bit for bit the same must write (the
    manifest and its timestamps aside). Asserts there are some."""
    state = {f: h for f, h in snapshot(step_dir).items() if f.startswith(("shard_", "worker_"))}
    assert state, f"{step_dir}: no checkpoint state"
    return state


@contextlib.contextmanager
def small_tmpfs(path, size):
    """A tmpfs of `size` at `path` (a full disk on demand), unmounted
    afterwards. The cases that need one run as root (CI does); where the
    mount fails the test fails, naming why, rather than passing without
    them."""
    os.makedirs(path, exist_ok=True)
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", path], capture_output=True, text=True)
    assert p.returncode == 0, (f"cannot mount a tmpfs of {size} at {path} for the full-disk cases (they need root): "
                               f"mount exited {p.returncode}: {p.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", path], capture_output=True)


def fill(path):
    """Fills the file system holding `path` with one file, until ENOSPC."""
    fd = os.open(os.path.join(path, "filler"), os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, b"\0" * 4096) > 0:
            pass
    except OSError:
        pass
    finally:
        os.close(fd)


def run_scenarios(title, *scenarios):
    """Runs each scenario(sandbox) in one scratch directory."""
    args = parse_args()
    sb = Sandbox(args.build)
    for scenario in scenarios:
        scenario(sb)
    print(f"{title}: ok")


class Job:
    """A multi-process job on loopback: `herd coordinator` plus nodes
    (tests/pushpull_node), each a real process with its output in files."""

    def __init__(self, sb, config_text, token="test-token-0123456789", env=None):
        self.sb = sb
        self.config = sb.write("job.textproto", config_text)
        self.node_bin = os.path.join(sb.build, "tests", "pushpull_node")
        self.env = dict(os.environ, HERD_JOB_TOKEN=token, OMP_NUM_THREADS="1")
        self.env.update(env or {})
        self.procs = {}
        self.addr = None

    def start_coordinator(self, *extra, name="coordinator"):
        port_file = self.sb.path(name + ".port")
        if os.path.exists(port_file):
            os.remove(port_file)
        self._spawn(name, [self.sb.herd, "coordinator", self.config, "--listen", "127.0.0.1:0",
                           "--port-file", port_file, *extra])
        deadline = time.time() + 20
        while not os.path.exists(port_file):
            if time.time() > deadline or self.procs[name].poll() is not None:
                raise AssertionError("coordinator did not start:\n" + self.stderr(name))
            time.sleep(0.05)
        with open(port_file) as f:
            self.addr = "127.0.0.1:" + f.read().strip()
        return self.addr

    def start_node(self, name, role, *extra, env=None):
        self._spawn(name, [self.node_bin, "--role", role, "--config", self.config,
                           "--coordinator", self.addr, *extra], env)

    def _spawn(self, name, argv, env=None):
        e = dict(self.env)
        e.update(env or {})
        out = open(self.sb.path(name + ".out"), "w")
        err = open(self.sb.path(name + ".err"), "w")
        self.procs[name] = subprocess.Popen(argv, cwd=self.sb.dir, stdout=out, stderr=err, env=e)

    def wait(self, name, timeout):
        """Exit code, or raises when the process outlives `timeout` seconds."""
        try:
            return self.procs[name].wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{name} still running after {timeout} s:\n" + self.stderr(name))

    def stdout(self, name):
        with open(self.sb.path(name + ".out")) as f:
            return f.read()

    def stderr(self, name):
        with open(self.sb.path(name + ".err")) as f:
            return f.read()

    def kill_all(self):
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_processes(ppid):
    """(pid, argv) of the live processes whose parent is `ppid`."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
        except OSError:
            continue
        if int(stat[stat.rindex(")") + 2:].split()[1]) == ppid:
            out.append((int(entry), [c.decode() for c in cmd if c]))
    return out


def metrics_rows(path):
    """The complete JSON lines of a metrics file (none while it is absent)."""
    rows = []
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                try:
                    rows.append(json.loads(line))
                except ValueError:
                    pass  # a line still being written
    return rows


def last_step(metrics):
    """The newest step in a metrics file (0 while it has none)."""
    return max((r["step"] for r in metrics_rows(metrics)), default=0)


def wait_for_text(path, text, timeout, name):
    """Returns once the file at `path` holds `text`."""
    deadline = time.time() + timeout
    while not (os.path.exists(path) and text in open(path, errors="replace").read()):
        assert time.time() < deadline, f"{name}: no '{text}' in {path} within {timeout} s"
        time.sleep(0.05)


def wait_for_step(metrics, at, name, timeout=60):
    """Returns once the metrics file `metrics` reaches step `at`."""
    deadline = time.time() + timeout
    while max((r["step"] for r in metrics_rows(metrics)), default=-1) < at:
        assert time.time() < deadline, f"{name}: no step {at} within {timeout} s"
        time.sleep(0.01)
