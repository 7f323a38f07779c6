"""Every CUDA path of herd on one GPU node, in one bounded run: the CUDA
tests, the compute sanitizers, `herd bench gpu` against PyTorch eager and
torch.compile, a per-kernel profile, one-GPU jobs in every mode, the
collective modes on the device against one process (axes), and bf16
against fp32 on the default GPU job; and, on the node's CPU cores, the
idle share of pipeline stages against theory (bubble, not by default). It runs herd from a kit made by
scripts/gpu_kit.sh (so the node needs only the driver, CUDA, NCCL and
Python with PyTorch), from the source tree's root:

    python3 scripts/gpu_check.py --kit herd-gpu-kit.tar.xz --out DIR \\
        [--phases env,tests,bench,modes,axes,converge,sanitize,profile,bubble] [--deadline-s 540]

Each phase prints and appends JSON lines to DIR/results.jsonl (one per
figure, each with its "phase"), and the output of every command to
DIR/log.txt; converge writes DIR/curves.jsonl (both runs' metrics) and
profile DIR/profile.csv (Nsight Compute's rows). Phases run in the order
given and are skipped, with a line saying so, once less time is left
before the deadline than they need; a command that outlives its share is
stopped and recorded as timed out. The exit status is 0 when every check
that ran passed."""
import argparse
import array
import csv
import glob
import json
import os
import random
import re
import shutil
import site
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time

SOURCE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PHASES = ("env", "tests", "bench", "modes", "axes", "converge", "sanitize", "profile", "bubble")
# The least time each phase needs to say anything useful, in seconds.
NEEDS = {"env": 5, "tests": 90, "bench": 150, "modes": 120, "axes": 200, "converge": 60, "sanitize": 120,
         "profile": 60, "bubble": 150}

# SmolLM-135M's shape, as `herd bench gpu` measures it.
SMOLLM_135M = ("model { vocab_size: 49152 hidden_size: 576 intermediate_size: 1536 num_hidden_layers: 30 "
               "num_attention_heads: 9 num_key_value_heads: 3 tie_word_embeddings: true rope_theta: 10000 }")
# A shape small enough for the emulated device (a dry run of this script).
SMALL = ("model { vocab_size: 256 hidden_size: 64 intermediate_size: 160 num_hidden_layers: 2 "
         "num_attention_heads: 4 num_key_value_heads: 2 tie_word_embeddings: true }")


class Check:
    """The run's state: where results go, the deadline, the environments."""

    def __init__(self, a, kit):
        self.a = a
        self.kit = kit
        self.bin = os.path.join(kit, "bin")
        self.herd = os.path.join(self.bin, "herd")
        self.out = os.path.abspath(a.out)
        self.work = tempfile.mkdtemp(prefix="herd_gpu_check_")
        self.deadline = time.monotonic() + a.deadline_s
        self.failed = []
        self.log = open(os.path.join(self.out, "log.txt"), "a")
        self.results = open(os.path.join(self.out, "results.jsonl"), "a")
        # herd opens cuBLASLt and NCCL by soname; on a node where they come
        # with PyTorch's wheels rather than /usr/local/cuda, say where.
        self.vendor_dirs = library_dirs(["libcublasLt.so.13", "libnccl.so.2"])
        self.env = with_library_path(os.environ, self.vendor_dirs)
        # The gtest binary is a build-tree program: the kit's lib/ too. Not
        # for herd itself (its RPATH finds lib/) nor for Python, which must
        # keep the system's newer C++ library.
        self.test_env = with_library_path(os.environ, [os.path.join(kit, "lib")] + self.vendor_dirs)

    def left(self):
        return self.deadline - time.monotonic()

    def record(self, phase, **fields):
        line = json.dumps({"phase": phase, **fields})
        print(line, flush=True)
        self.results.write(line + "\n")
        self.results.flush()
        if fields.get("ok") is False:
            self.failed.append(phase + ": " + fields.get("what", ""))

    def run(self, what, cmd, cap_s, env=None, cwd=None):
        """Runs `cmd` for at most cap_s (and never past the deadline less a
        margin); its output goes to the log. Returns (returncode or None
        when stopped, 127 when there is no such program; stdout, stderr)."""
        limit = max(1.0, min(cap_s, self.a.cap_s or cap_s, self.left() - 10))
        self.log.write(f"\n=== {what}: {' '.join(cmd)} (limit {limit:.0f} s)\n")
        self.log.flush()
        started = time.monotonic()
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=limit, env=env or self.env,
                               cwd=cwd or self.work, errors="replace")
            code, out, err = p.returncode, p.stdout, p.stderr
        except FileNotFoundError as e:
            code, out, err = 127, "", str(e)
        except subprocess.TimeoutExpired as e:
            code = None
            out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
            err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        self.log.write(out[-200_000:] + "\n--- stderr\n" + err[-200_000:] + "\n")
        self.log.write(f"=== {what}: {'timed out' if code is None else 'exit ' + str(code)} "
                       f"after {time.monotonic() - started:.1f} s\n")
        self.log.flush()
        return code, out, err


def library_dirs(sonames):
    """The folders the loader must be told of to find each of `sonames`:
    none for those in its cache; else CUDA's folders or this Python's
    site-packages (PyTorch's nvidia-* wheels). A library found nowhere is
    left for herd to name when it needs it."""
    cache = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout
    places = ["/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib", "/usr/lib/x86_64-linux-gnu"]
    wheels = [os.path.join(root, "nvidia") for root in site.getsitepackages()]
    dirs = []
    for soname in sonames:
        if re.search(r"\s" + re.escape(soname) + r"\s", cache):
            continue
        hits = [os.path.join(place, soname) for place in places if os.path.exists(os.path.join(place, soname))]
        for root in wheels:
            hits += glob.glob(os.path.join(root, "**", soname), recursive=True)
        if hits and os.path.dirname(hits[0]) not in dirs:
            dirs.append(os.path.dirname(hits[0]))
    return dirs


def tool_path(name):
    """A CUDA tool on PATH or where CUDA and Nsight install it; None if none."""
    found = shutil.which(name)
    if found:
        return found
    for pattern in ("/usr/local/cuda*/bin/", "/usr/local/cuda*/compute-sanitizer/", "/opt/nvidia/nsight-compute/*/"):
        hits = sorted(glob.glob(pattern + name))
        if hits:
            return hits[-1]
    return None


def with_library_path(env, dirs):
    e = dict(env)
    e["LD_LIBRARY_PATH"] = ":".join(dirs + [p for p in [env.get("LD_LIBRARY_PATH", "")] if p])
    return e


def unpack(kit, into):
    if os.path.isdir(kit):
        return os.path.abspath(kit)
    with tarfile.open(kit) as t:
        t.extractall(into)
    return os.path.join(into, "herd-gpu-kit")


def json_lines(text):
    rows = []
    for line in text.splitlines():
        if line.startswith("{"):
            try:
                rows.append(json.loads(line))
            except ValueError:
                pass
    return rows


def metrics(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


# ---- phases ----------------------------------------------------------------

def phase_env(c):
    code, out, _ = c.run("nvidia-smi", ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                                        "--format=csv,noheader"], 30)
    gpu = out.strip() if code == 0 else None
    code, out, err = c.run("herd version", [c.herd, "version"], 30)
    version = json.loads(out) if code == 0 else {"error": err.strip()[-300:]}
    code, out, _ = c.run("torch", [c.a.python, "-c", "import torch; print(torch.__version__, torch.version.cuda)"], 60)
    c.record("env", gpu=gpu, herd=version, torch=out.strip() if code == 0 else None, vendor_dirs=c.vendor_dirs,
             tools={t: tool_path(t) for t in ("compute-sanitizer", "ncu")},
             ok=code == 0 and "error" not in version and version.get("cuda_devices", 0) > 0,
             what="herd sees no CUDA device" if version.get("cuda_devices", 0) == 0 else "")


def cuda_test_filter():
    """The gtest suites that need a device: those in tests/cuda/ and NCCL's."""
    suites = set()
    for path in glob.glob(os.path.join(SOURCE, "tests", "cuda", "*_test.cc")) + \
            [os.path.join(SOURCE, "tests", "nccl_test.cc")]:
        with open(path) as f:
            suites.update(re.findall(r"^(?:TYPED_)?TEST(?:_F)?\((\w+),", f.read(), re.M))
    # A typed suite's instances are SUITE/0, SUITE/1, ...
    return ":".join(sorted(f"{s}.*:{s}/*.*" for s in suites))


def phase_tests(c):
    report = os.path.join(c.work, "gtests.json")
    code, out, _ = c.run("CUDA gtests", [os.path.join(c.bin, "herd_tests"), "--gtest_filter=" + cuda_test_filter(),
                                         "--gtest_output=json:" + report], 300, env=c.test_env)
    ran = failed = skipped = 0
    failures = []
    if os.path.exists(report):
        with open(report) as f:
            for suite in json.load(f).get("testsuites", []):
                for t in suite.get("testsuite", []):
                    ran += 1
                    if t.get("result") == "SKIPPED" or t.get("status") == "NOTRUN":
                        skipped += 1
                    if t.get("failures"):
                        failed += 1
                        failures.append(f"{suite['name']}.{t['name']}: " +
                                        t["failures"][0].get("failure", "")[:300])
    c.record("tests", what="CUDA gtests", ran=ran, failed=failed, skipped=skipped, failures=failures,
             exit=code, ok=code == 0 and ran > 0 and failed == 0 and skipped == 0)
    started = time.monotonic()
    code, out, err = c.run("gpu_train_test", [c.a.python, os.path.join(SOURCE, "tests", "gpu_train_test.py"),
                                              "--build", c.bin, "--source", SOURCE], 420)
    c.record("tests", what="tests/gpu_train_test.py", exit=code, seconds=round(time.monotonic() - started, 1),
             said=(out + err).strip().splitlines()[-3:], ok=code == 0)


def phase_bench(c):
    how = (small_shape_sets() + ["--steps", "2", "--warmup", "1", "--torch-modes", "eager", "--torch-device", "cpu"]
           if c.a.small else ["--steps", "20", "--warmup", "5"])
    code, out, err = c.run("herd bench gpu", [c.herd, "bench", "gpu", "--python", c.a.python, *how], 420)
    rows = json_lines(out)
    for row in rows:
        c.record("bench", **row)
    c.record("bench", what="herd bench gpu", exit=code, lines=len(rows), ok=code == 0 and len(rows) >= 2,
             said=err.strip().splitlines()[-2:] if code != 0 else [])


def small_shape_sets():
    """SMALL as `--set` flags, at batch 2 x 64."""
    sets = [f"model.{k}={v}" for k, v in re.findall(r"(\w+): (\w+)", SMALL)]
    sets += ["train.batch_size=2", "train.seq_len=64"]
    return [x for s in sets for x in ("--set", s)]


def random_tokens(path, vocab, count, seed=1):
    """A raw uint16 token file of uniformly drawn ids (timing, not learning)."""
    rng = random.Random(seed)
    with open(path, "wb") as f:
        array.array("H", (rng.randrange(vocab) for _ in range(count))).tofile(f)


def phase_modes(c):
    """The SmolLM-135M shape (bf16, 8 x 1024) in one process and in
    parameter-server mode on the one GPU: step time (median after the
    first steps), the share of it waiting on the network, device memory
    against `herd plan`; PS streamed against PS bit for bit (both fp32 on
    the wire). All-reduce mode is the axes phase's."""
    model, batch, seq, steps = (SMALL, 2, 64, 6) if c.a.small else (SMOLLM_135M, 8, 1024, 12)
    vocab = int(re.search(r"vocab_size: (\d+)", model).group(1))
    data = os.path.join(c.work, "random.u16")
    random_tokens(data, vocab, (steps + 2) * batch * (seq + 1))
    modes = [
        ("one process", "cluster { sync: NONE }"),
        ("PS S=2 W=1", "cluster { sync: PARAMETER_SERVER servers: 2 workers: 1 }"),
        ("PS S=2 W=1 streamed", "cluster { sync: PARAMETER_SERVER servers: 2 workers: 1 stream_weights: true }"),
        ("PS S=2 W=1 bf16 wire", "cluster { sync: PARAMETER_SERVER servers: 2 workers: 1 wire_dtype: BF16 }"),
    ]
    figures = {}
    for i, (name, cluster) in enumerate(modes):
        if not re.search(c.a.modes, name):
            continue
        ran = launch_job(c, "modes", name, f"mode{i}", model, cluster, batch, seq, steps, data)
        if ran is not None:
            figures[name] = ran
    if "one process" in figures and "PS S=2 W=1" in figures:
        ratio = figures["PS S=2 W=1"]["step_s"] / figures["one process"]["step_s"]
        c.record("modes", what="PS step over the one-process step (target <= 1.3)", ratio=ratio)
    if "PS S=2 W=1" in figures and "PS S=2 W=1 streamed" in figures:
        def trajectory(name):
            return [(r["loss"], r["grad_norm"]) for r in figures[name]["rows"]]
        same = trajectory("PS S=2 W=1") == trajectory("PS S=2 W=1 streamed")
        c.record("modes", what="streamed PS equals PS bit for bit", ok=same,
                 ratio=figures["PS S=2 W=1 streamed"]["step_s"] / figures["PS S=2 W=1"]["step_s"])


def launch_job(c, phase, name, tag, model, cluster, batch, seq, steps, data, train=""):
    """`herd launch` of `model` with `cluster` (and `train`'s fields beside
    the batch) in bf16 on the GPU; records
    its step time (median after the first steps), the share of it waiting
    on the network, and its memory against `herd plan`. Returns its
    figures (step_s, rows, the worker's summary), or None if it failed or
    there was no time left."""
    if c.left() < 40:
        c.record(phase, what=name, skipped="out of time")
        return None
    config = os.path.join(c.work, tag + ".textproto")
    with open(config, "w") as f:
        f.write(f"{model}\ntrain {{ steps: {steps} batch_size: {batch} seq_len: {seq} seed: 3 {train} }}\n"
                "optimizer { lr: 3e-4 min_lr: 3e-5 warmup_steps: 2 weight_decay: 0.1 clip_norm: 1.0 }\n"
                f"data {{ train: \"{data}\" }}\n{cluster}\ndevice {{ kind: CUDA dtype: BF16 }}\n"
                f"log {{ every: 1 metrics: \"{tag}.jsonl\" summary_dir: \"{tag}\" eval_every: 0 "
                f"sample_tokens: 0 {trace_field(c, tag)} }}\n")
    code, out, err = c.run(f"{phase} {name}", [c.herd, "launch", config], 240)
    if code != 0 or not os.path.exists(os.path.join(c.work, tag + ".jsonl")):
        c.record(phase, what=name, exit=code, said=err.strip().splitlines()[-3:], ok=False)
        return None
    rows = metrics(os.path.join(c.work, tag + ".jsonl"))
    timed = [r["step_s"] for r in rows[2:]] or [r["step_s"] for r in rows]
    wait = [r.get("network_wait", 0.0) for r in rows[2:]]
    worker = {}
    summary = os.path.join(c.work, tag, "worker_00000.json")
    if os.path.exists(summary):
        with open(summary) as f:
            worker = json.load(f)
    step_s = statistics.median(timed)
    if c.a.trace:
        c.record(phase, what=name + ": where a step's time goes", **trace_summary(c, tag))
    c.record(phase, what=name, step_s=step_s, tokens_per_s=batch * seq / step_s,
             network_wait=statistics.mean(wait) if wait else None, loss_first=rows[0]["loss"],
             loss_last=rows[-1]["loss"], device_peak_bytes=worker.get("device_peak_bytes"),
             device_plan_bytes=worker.get("device_plan_bytes"), peak_rss_bytes=worker.get("peak_rss_bytes"),
             plan_bytes=worker.get("plan_bytes"), ok=True)
    return {"step_s": step_s, "rows": rows, "worker": worker}


def phase_axes(c):
    """The collective modes on the device against one process, on the one
    GPU (the SmolLM-135M shape, bf16, 8 x 1024): DDP and ZeRO-1, -2 and -3
    over one-rank NCCL, each step time over the one-process step (targets:
    1.05 for DDP and ZeRO-1/2, 1.3 for ZeRO-3), its device peak against
    `herd plan` (within 2%), its losses against one process's (bf16's
    tolerance, 2e-2 relative). Tensor 2 with sequence parallelism, 2
    processes sharing the GPU (its group's collectives staged through the
    UCX ring: NCCL refuses two ranks on one device), on a shape of as many
    layers whose heads 2 divides, against one process of that shape
    (target 2.2x, the same checks), pipeline 2 likewise against one
    process of the same 2 micro-batches, and context 2 against one process
    (its gathers staged too)."""
    model, batch, seq, steps = (SMALL, 2, 64, 6) if c.a.small else (SMOLLM_135M, 8, 1024, 12)
    # SmolLM's 9 heads and 3 KV heads are not cut in 2: heads of 64.
    even = SMALL if c.a.small else SMOLLM_135M.replace("hidden_size: 576", "hidden_size: 512").replace(
        "num_attention_heads: 9 num_key_value_heads: 3", "num_attention_heads: 8 num_key_value_heads: 4")
    vocab = int(re.search(r"vocab_size: (\d+)", model).group(1))
    data = os.path.join(c.work, "random_axes.u16")
    random_tokens(data, vocab, (steps + 2) * batch * (seq + 1))
    half, two = max(1, batch // 2), "grad_accum: 2"  # 2 micro-batches, the same global batch
    jobs = [("one process", "cluster { sync: NONE }", None, model, None, batch, ""),
            ("DDP W=1 (NCCL)", "cluster { sync: ALLREDUCE workers: 1 }", 1.05, model, "one process", batch, ""),
            ("ZeRO-1 W=1 (NCCL)", "cluster { sync: ALLREDUCE workers: 1 zero_stage: 1 }", 1.05, model, "one process",
             batch, ""),
            ("ZeRO-2 W=1 (NCCL)", "cluster { sync: ALLREDUCE workers: 1 zero_stage: 2 }", 1.05, model, "one process",
             batch, ""),
            ("ZeRO-3 W=1 (NCCL)", "cluster { sync: ALLREDUCE workers: 1 zero_stage: 3 }", 1.3, model, "one process",
             batch, ""),
            ("one process, heads cut in 2", "cluster { sync: NONE }", None, even, None, batch, ""),
            ("tensor 2 + sequence, 2 processes on the GPU",
             "cluster { sync: ALLREDUCE workers: 2 tensor_parallel: 2 sequence_parallel: true nccl: false }", 2.2,
             even, "one process, heads cut in 2", batch, ""),
            ("one process, 2 micro-batches", "cluster { sync: NONE }", None, model, None, half, two),
            ("pipeline 2, 2 processes on the GPU",
             "cluster { sync: ALLREDUCE workers: 2 pipeline_stages: 2 nccl: false }", 2.2, model,
             "one process, 2 micro-batches", half, two),
            ("context 2, 2 processes on the GPU",
             "cluster { sync: ALLREDUCE workers: 2 context_parallel: 2 nccl: false }", 2.2, model, "one process",
             batch, "")]
    ran = {}
    for i, (name, cluster, _, shape, _, b, train) in enumerate(jobs):
        got = launch_job(c, "axes", name, f"axes{i}", shape, cluster, b, seq, steps, data, train)
        if got is not None:
            ran[name] = got
    for name, _, target, _, against, _, _ in jobs:
        one = ran.get(against)
        if name not in ran or one is None:
            continue
        mine, worker = ran[name], ran[name]["worker"]
        losses = [(r["loss"], o["loss"]) for r, o in zip(mine["rows"], one["rows"])]
        loss_gap = max(abs(a - b) / abs(b) for a, b in losses)
        peak, plan = worker.get("device_peak_bytes") or 0, worker.get("device_plan_bytes") or 0
        c.record("axes", what=f"{name} against one process", ratio=mine["step_s"] / one["step_s"], target=target,
                 loss_gap=loss_gap, device_peak_over_plan=peak / plan if plan else None,
                 ok=loss_gap < 2e-2 and plan > 0 and abs(peak / plan - 1) < 0.02)


def trace_field(c, tag):
    return f'trace: "{tag}_trace"' if c.a.trace else ""


def trace_summary(c, tag):
    """Milliseconds a step in each named span of each process's timeline
    (log.trace), over the steps after the first two: where the time goes."""
    by_process = {}
    for path in sorted(glob.glob(os.path.join(c.work, tag + "_trace", "*.trace.json"))):
        with open(path) as f:
            events = json.load(f)
        events = events["traceEvents"] if isinstance(events, dict) else events
        spans = [e for e in events if e.get("ph") == "X"]
        steps = sorted(e["ts"] for e in spans if e["name"] in ("step", "server step"))
        if len(steps) < 4:
            steps = [min((e["ts"] for e in spans), default=0), max((e["ts"] for e in spans), default=0) + 1]
            first, n = steps[0], 1
        else:
            first, n = steps[2], len(steps) - 3
        last = steps[-1]
        total = {}
        for e in spans:
            if first <= e["ts"] < last:
                total[e["name"]] = total.get(e["name"], 0.0) + e.get("dur", 0) / 1e3 / n
        top = sorted(total.items(), key=lambda kv: -kv[1])[:12]
        by_process[os.path.basename(path).split(".")[0]] = {k: round(v, 2) for k, v in top}
    return {"ms_per_step": by_process}


def phase_converge(c):
    """configs/tiny_gpu.textproto (the default GPU job) in bf16 and in fp32,
    the same steps and data: final held-out losses within 2%."""
    steps, eval_batches = (4, 1) if c.a.small else (500, 16)
    final = {}
    with open(os.path.join(c.out, "curves.jsonl"), "w") as curves:
        for dtype in ("BF16", "FP32"):
            tag = "converge_" + dtype.lower()
            code, out, err = c.run("converge " + dtype, [
                c.herd, "launch", os.path.join(SOURCE, "configs", "tiny_gpu.textproto"),
                "--set", f"train.steps={steps}", "--set", f"device.dtype={dtype}",
                "--set", "data.train=" + os.path.join(c.kit, "data", "train.bin"),
                "--set", "data.val=" + os.path.join(c.kit, "data", "val.bin"), "--set", "checkpoint.dir=",
                "--set", f"log.every={max(1, steps // 50)}", "--set", f"log.eval_every={steps // 4}",
                "--set", f"log.eval_batches={eval_batches}", "--set", "log.sample_tokens=0",
                "--set", f"log.metrics={tag}.jsonl"], 240)
            if code != 0:
                c.record("converge", what=dtype, exit=code, said=err.strip().splitlines()[-3:], ok=False)
                continue
            rows = metrics(os.path.join(c.work, tag + ".jsonl"))
            for r in rows:
                curves.write(json.dumps({"dtype": dtype, **r}) + "\n")
            vals = [r["val_loss"] for r in rows if "val_loss" in r]
            final[dtype] = vals[-1]
            c.record("converge", what=dtype, steps=rows[-1]["step"], val_loss=vals[-1],
                     step_s=statistics.median(r["step_s"] for r in rows), ok=True)
    if len(final) == 2:
        gap = abs(final["BF16"] - final["FP32"]) / final["FP32"]
        c.record("converge", what="bf16 final held-out loss within 2% of fp32's", gap=gap, ok=gap <= 0.02)


# Each sanitizer over the tests where its verdict means something:
#  memcheck and synccheck over every CUDA test. memcheck's API-error
#  reports are off: herd stops on any CUDA error of its own calls
#  (HERD_CUDA_CHECK), and NCCL's init probes kernels built for other
#  devices with cudaFuncGetAttributes, which reports an error it expects.
#  racecheck and initcheck over the kernel tests, which take every kernel
#  (the tensor-core attention included). The model tests add no kernel but
#  run them for tens of seconds under racecheck; and initcheck does not see
#  cuBLASLt's bf16 products (Hopper's bulk tensor stores) write their
#  outputs, so a kernel reading one is reported as reading uninitialised
#  memory. The kernel tests start every buffer as NaN instead.
SANITIZERS = (("memcheck", "all", ["--report-api-errors", "no"]), ("synccheck", "all", []),
              ("racecheck", "kernels", []), ("initcheck", "kernels", []))


def phase_sanitize(c):
    sanitizer = tool_path("compute-sanitizer")
    if sanitizer is None:
        c.record("sanitize", skipped="no compute-sanitizer found")
        return
    filters = {"all": c.a.sanitize_filter or cuda_test_filter(), "kernels": c.a.sanitize_kernel_filter}
    for i, (tool, tests, flags) in enumerate(SANITIZERS):
        share = c.left() / (len(SANITIZERS) - i) - 5
        if share < 30:
            c.record("sanitize", what=tool, skipped="out of time")
            continue
        code, out, err = c.run("compute-sanitizer " + tool, [
            sanitizer, "--tool", tool, *flags, "--error-exitcode", "9", "--print-limit", "20",
            os.path.join(c.bin, "herd_tests"), "--gtest_filter=" + filters[tests]], share, env=c.test_env)
        summary = re.findall(r"========= (ERROR SUMMARY: .*|RACECHECK SUMMARY: .*)", out + err)
        ran = re.findall(r"\[  PASSED  \] (\d+) test", out)
        c.record("sanitize", what=tool, tests=tests, passed=int(ran[-1]) if ran else 0, exit=code,
                 summary=summary[-1:] if summary else None, ok=code == 0, timed_out=code is None)


def kernel_times(lines):
    """{kernel name: (launches, microseconds)} from Nsight Compute's CSV
    rows (--csv --print-units base: one row per kernel launch and metric;
    lines not starting with a quote are its own messages)."""
    by_kernel = {}
    for row in csv.DictReader(line for line in lines if line.startswith('"')):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3, "s": 1e6,
                 "second": 1e6}[row["Metric Unit"]]
        name = row.get("Kernel Name", "?")[:80]
        n, t = by_kernel.get(name, (0, 0.0))
        by_kernel[name] = (n + 1, t + float(row["Metric Value"].replace(",", "")) * scale)
    return by_kernel


def phase_profile(c):
    """One step of `herd bench gpu` under Nsight Compute, one metric (the
    kernel's duration), summed by kernel name: where the step's time goes."""
    ncu = tool_path("ncu")
    if ncu is None:
        c.record("profile", skipped="no ncu found")
        return
    raw = os.path.join(c.out, "profile.csv")
    shape = small_shape_sets() if c.a.small else []
    ncu = [ncu, "--metrics", "gpu__time_duration.sum", "--csv", "--print-units", "base", "--log-file", raw,
           "--clock-control", "none"]
    code, out, err = c.run("ncu", ncu + [c.herd, "bench", "gpu", *shape, "--steps", "1", "--warmup", "1",
                                         "--torch-modes", "none"], 420)
    by_kernel = {}
    if os.path.exists(raw):
        with open(raw) as f:
            by_kernel = kernel_times(f)
    total = sum(t for _, t in by_kernel.values())
    top = sorted(by_kernel.items(), key=lambda kv: -kv[1][1])[:15]
    c.record("profile", what="kernel time of warm-up + one step, by kernel", exit=code, total_us=total,
             kernels=[{"name": k, "launches": n, "us": round(t, 1), "share": round(t / total, 3) if total else 0}
                      for k, (n, t) in top], ok=code == 0 and total > 0)


def phase_bubble(c):
    """Pipeline stages' idle share of a step against the schedules' theory
    (bench/pipeline_bubble.py: CPU stage workers, one thread each) for
    p = 2 and 4 stages and m = 4, 8 and 16 micro-batches, on the node's CPU
    cores, which a 2-core machine lacks for p = 4. Each row says whether
    the stage's idle share is within 20% of theory."""
    bench = os.path.join(SOURCE, "bench", "pipeline_bubble.py")
    cores = os.cpu_count() or 1
    for stages in (2, 4):
        if stages + 1 > cores:
            c.record("bubble", stages=stages, skipped=f"{cores} cores: {stages} stages need {stages + 1}")
            continue
        how = ["--micro", "4,8", "--steps", "3", "--warmup", "1", "--schedules", "ONE_F_ONE_B"] if c.a.small else \
            ["--micro", "4,8,16", "--steps", "5", "--warmup", "2",
             "--schedules", "GPIPE,ONE_F_ONE_B,INTERLEAVED_1F1B,ZERO_BUBBLE"]
        sets = ["--set", "model.num_hidden_layers=8"] if c.a.small else []
        code, out, err = c.run(f"pipeline bubble, {stages} stages",
                               [sys.executable, bench, "--build", c.bin, "--stages", str(stages), *how, *sets], 300)
        rows = json_lines(out)
        for row in rows:
            row.pop("bench", None)
            c.record("bubble", within_20pct=row["ratio"] <= 1.2, **row)
        c.record("bubble", what=f"pipeline bubble, {stages} stages", exit=code, lines=len(rows),
                 ok=code == 0 and len(rows) > 0, said=err.strip().splitlines()[-2:] if code != 0 else [])


RUN = {"env": phase_env, "tests": phase_tests, "bench": phase_bench, "modes": phase_modes, "axes": phase_axes,
       "converge": phase_converge, "sanitize": phase_sanitize, "profile": phase_profile,
       "bubble": phase_bubble}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kit", required=True, help="scripts/gpu_kit.sh's tarball, or the folder it unpacks to")
    ap.add_argument("--out", required=True, help="where results.jsonl, log.txt, curves.jsonl, profile.csv go")
    ap.add_argument("--phases", default=",".join(PHASES[:6]), help="comma-separated, from " + ",".join(PHASES))
    ap.add_argument("--deadline-s", type=float, default=540, help="stop starting work after this many seconds")
    ap.add_argument("--cap-s", type=float, default=0,
                    help="stop any one command after this many seconds (0: each phase's own limits), so that "
                         "one hung command cannot take a short lease's whole time")
    ap.add_argument("--python", default="python3", help="the Python with PyTorch (CUDA) for the anchors")
    ap.add_argument("--sanitize-filter", default="",
                    help="the gtests memcheck and synccheck run (default: every CUDA test)")
    ap.add_argument("--sanitize-kernel-filter", default="KernelTest/*.*:OptimizerKernels.*",
                    help="the gtests racecheck and initcheck run")
    ap.add_argument("--small", action="store_true", help="tiny shapes throughout (a dry run on the emulated device)")
    ap.add_argument("--modes", default="", help="modes: only those whose name this regular expression finds")
    ap.add_argument("--trace", action="store_true", help="modes: trace each job (log.trace) and say where its steps go")
    ap.add_argument("--keep-work", action="store_true", help="keep the jobs' files (their folder is named at the end)")
    a = ap.parse_args()
    phases = a.phases.split(",")
    unknown = [p for p in phases if p not in PHASES]
    if unknown:
        ap.error(f"--phases: unknown {unknown}; known: {', '.join(PHASES)}")
    os.makedirs(a.out, exist_ok=True)
    unpacked = tempfile.mkdtemp(prefix="herd_gpu_kit_")
    c = Check(a, unpack(a.kit, unpacked))
    started = time.monotonic()
    try:
        for phase in phases:
            if c.left() < NEEDS[phase]:
                c.record(phase, skipped=f"{c.left():.0f} s left, needs {NEEDS[phase]}")
                continue
            t = time.monotonic()
            RUN[phase](c)
            c.record(phase, what="phase done", seconds=round(time.monotonic() - t, 1))
    finally:
        shutil.rmtree(unpacked, ignore_errors=True)
        if a.keep_work:
            print(f"kept the jobs' files in {c.work}", file=sys.stderr)
        else:
            shutil.rmtree(c.work, ignore_errors=True)
    c.record("all", seconds=round(time.monotonic() - started, 1), failed=c.failed, ok=not c.failed)
    sys.exit(1 if c.failed else 0)


if __name__ == "__main__":
    main()
