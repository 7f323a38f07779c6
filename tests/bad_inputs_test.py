"""Every bad input gives one clear 'herd: error:' line naming what and where,
a non-zero exit code, and leaves nothing half-written behind. Real
processes, real files."""
import json
import os
import stat
import struct
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import herdtest  # noqa: E402


def expect_error(sb, args, *needles, files_before=None, unchanged=None, code=None):
    """One 'herd: error:' line holding every needle, a non-zero exit (`code`
    when given); with files_before/unchanged, the sandbox's file list (and
    every file's bytes) as before."""
    p = sb.run(*args, check=False)
    errors = [l for l in p.stderr.splitlines() if l.startswith("herd: error:")]
    assert p.returncode != 0, f"{args}: exit code 0\n{p.stdout}{p.stderr}"
    assert len(errors) == 1, f"{args}: expected one error line, got:\n{p.stderr}"
    for n in needles:
        assert n in errors[0], f"{args}: '{n}' not in: {errors[0]}"
    if code is not None:
        assert p.returncode == code, f"{args}: exit code {p.returncode}, expected {code}\n{p.stderr}"
    if files_before is not None:
        after = herdtest.listing(sb.dir)
        assert after == files_before, f"{args}: left files behind: {sorted(set(after) - set(files_before))}"
    if unchanged is not None:
        after = herdtest.snapshot(sb.dir)
        changed = sorted(k for k in set(after) | set(unchanged) if after.get(k) != unchanged.get(k))
        assert not changed, f"{args}: files written, changed or removed: {changed}"
    print(f"ok  {' '.join(args)[:60]:60s} -> {errors[0]}")


def counts_beyond_bounds(sb, cfg):
    """Counts and products that once overflowed, or sized a table before
    they were checked (a division by zero, or seconds then bad_alloc): each
    refused by `herd plan` and by `herd launch` with exit 2 in one line in
    under a second, nothing written."""
    snap = herdtest.snapshot(sb.dir)
    ar = ["--set", "cluster.sync=ALLREDUCE"]
    pipeline = ar + ["--set", "cluster.workers=2", "--set", "cluster.pipeline_stages=2"]
    cases = [
        # 65536 x 65536 is 0 in 32 bits.
        (ar + ["--set", "cluster.workers=16384", "--set", "cluster.pipeline_stages=65536",
               "--set", "cluster.tensor_parallel=65536"], ["cluster.pipeline_stages", "does not divide"]),
        (ar + ["--set", "cluster.workers=16384", "--set", "cluster.context_parallel=65536",
               "--set", "cluster.tensor_parallel=65536"], ["cluster.context_parallel", "does not divide"]),
        (pipeline + ["--set", "cluster.pipeline_schedule=INTERLEAVED_1F1B", "--set", "cluster.virtual_stages=400000000",
                     "--set", "train.grad_accum=2"], ["cluster.virtual_stages", "800000000 stages", "2 layers"]),
        (pipeline + ["--set", "train.grad_accum=1000000000"], ["train.grad_accum", "65536"]),
        (["--set", "train.grad_accum=1000000000"], ["train.grad_accum", "65536"]),
        (ar + ["--set", "cluster.workers=65536", "--set", "cluster.tensor_parallel=2"], ["cluster.workers", "16384"]),
        (["--set", "model.num_hidden_layers=2000000000"], ["model.num_hidden_layers", "4096"]),
        (["--set", "train.batch_size=2147483647", "--set", "train.seq_len=2147483647"],
         ["train.batch_size", "of activations"]),
        (["--set", "model.hidden_size=1073741824", "--set", "model.intermediate_size=1073741824",
          "--set", "model.vocab_size=1073741824"], ["model.hidden_size", "parameters"]),
    ]
    for sets, needles in cases:
        for command in ("plan", "launch"):
            start = time.monotonic()
            expect_error(sb, [command, cfg, *sets], *needles, unchanged=snap, code=2)
            took = time.monotonic() - start
            assert took < 1, f"herd {command} {' '.join(sets)}: refused after {took:.2f} s"


def main():
    a = herdtest.parse_args()
    sb = herdtest.Sandbox(a.build)
    sb.corpus(n_bytes=20_000)
    sb.run("prepare", "corpus.txt", "--out", "good.bin")
    good = open(sb.path("good.bin"), "rb").read()

    # Help: the command's usage line on stdout, exit 0, nothing run or
    # written; asking about a command that does not exist is an error.
    before = herdtest.listing(sb.dir)
    for args, command in ((["launch", "missing.textproto", "--help"], "launch"), (["help", "plan"], "plan"),
                          (["eval", "model", "-h"], "eval")):
        p = sb.run(*args)
        assert p.stdout.startswith("usage: herd " + command + " "), f"{args}: {p.stdout}{p.stderr}"
    for node in ("herd-server", "herd-worker"):
        p = subprocess.run([os.path.join(os.path.dirname(sb.herd), node), "missing.textproto", "--help"],
                           cwd=sb.dir, capture_output=True, text=True)
        assert p.returncode == 0 and p.stdout.startswith("usage: " + node + " CONFIG"), f"{node}: {p.stdout}{p.stderr}"
    assert herdtest.listing(sb.dir) == before, "asking for help wrote files"
    print("ok  --help, -h and `herd help COMMAND` print the command's usage and exit 0")
    expect_error(sb, ["help", "nosuch"], "unknown command 'nosuch'", code=2)

    # Token files: missing, truncated, wrong magic, token id >= vocab.
    with open(sb.path("truncated.bin"), "wb") as f:
        f.write(good[:-100])
    with open(sb.path("magic.bin"), "wb") as f:
        f.write(struct.pack("<i", 12345) + good[4:])
    with open(sb.path("bigtoken.u16"), "wb") as f:
        f.write(struct.pack("<5000H", *([65] * 4000 + [300] + [66] * 999)))

    def job(train, name="job.textproto", **kw):
        return sb.write(name, herdtest.tiny_config(train, steps=2, **kw))

    cases = [
        ("missing.bin", ["missing.bin"]),
        ("truncated.bin", ["truncated.bin"]),
        ("magic.bin", ["magic.bin", "magic"]),
        ("bigtoken.u16", ["bigtoken.u16", "300", "vocab"]),
    ]
    sb.run("launch", job("good.bin", name="model.textproto", ckpt="model"))
    for train, needles in cases:
        cfg = job(train)
        expect_error(sb, ["launch", cfg], *needles, files_before=herdtest.listing(sb.dir))
        expect_error(sb, ["eval", "model", "--data", train], *needles)
    expect_error(sb, ["eval", "nonexistent_model", "--data", "good.bin"], "nonexistent_model")
    expect_error(sb, ["eval", "model", "--data", "good.bin", "--batches", "100000"], "good.bin", "batches")

    # Config: a typo, a wrong type, heads not divisible by kv heads, an
    # unknown --set path.
    cfg = job("good.bin")
    before = herdtest.listing(sb.dir)
    typo = sb.write("typo.textproto", open(cfg).read().replace("batch_size", "batch_sise"))
    expect_error(sb, ["launch", typo], "typo.textproto:", "batch_sise")
    wrong_type = sb.write("type.textproto", open(cfg).read().replace("steps: 2", "steps: two"))
    expect_error(sb, ["launch", wrong_type], "type.textproto:", "two")
    heads = sb.write("heads.textproto", open(cfg).read().replace("num_key_value_heads: 2", "num_key_value_heads: 3"))
    expect_error(sb, ["launch", heads], "heads.textproto:", "num_key_value_heads", "divisible")
    expect_error(sb, ["launch", cfg, "--set", "optimizer.lrr=1"], "--set optimizer.lrr=1", "lr")
    expect_error(sb, ["launch", "nope.textproto"], "nope.textproto")
    # Refused rather than run some other way than asked: a missing data.train
    # (bad input: exit 2), --stop-at past the end, an enum by number, an
    # elastic job with nobody to take over, one field set twice.
    expect_error(sb, ["launch", job("missing.bin", name="missing.textproto")], "data.train", "missing.bin", code=2)
    expect_error(sb, ["launch", cfg, "--stop-at", "10"], "--stop-at", "<= 2", code=2)
    expect_error(sb, ["launch", cfg, "--set", "train.recompute=2"], "train.recompute", "NONE, ATTENTION, FULL",
                 code=2)
    expect_error(sb, ["launch", cfg, "--set", "cluster.sync=PARAMETER_SERVER", "--set", "cluster.servers=1",
                      "--set", "cluster.workers=1",
                      "--set", "cluster.elastic=true"], "cluster.elastic", "at least 2 workers", code=2)
    expect_error(sb, ["launch", cfg, "--set", "train.steps=3", "--set", "train.steps=4"], "train.steps",
                 "set twice", code=2)
    # ZeRO where it does not apply (parameter servers, an elastic job) or
    # with a stage herd does not have.
    expect_error(sb, ["launch", cfg, "--set", "cluster.sync=PARAMETER_SERVER", "--set", "cluster.servers=1",
                      "--set", "cluster.zero_stage=3"], "cluster.zero_stage", "sync ALLREDUCE only", code=2)
    expect_error(sb, ["launch", cfg, "--set", "cluster.sync=PARAMETER_SERVER", "--set", "cluster.servers=1",
                      "--set", "cluster.workers=2", "--set", "cluster.elastic=true", "--set", "cluster.zero_stage=2"],
                 "cluster.elastic", "not supported together with cluster.zero_stage 2", code=2)
    expect_error(sb, ["launch", cfg, "--set", "cluster.sync=ALLREDUCE", "--set", "cluster.workers=2",
                      "--set", "cluster.zero_stage=4"], "cluster.zero_stage", "must be 0, 1, 2 or 3", code=2)
    expect_error(sb, ["launch", cfg, "--set", "cluster.sync=ALLREDUCE", "--set", "cluster.workers=2",
                      "--set", "cluster.reshard_after_forward=false"], "cluster.reshard_after_forward",
                 "zero_stage 3 only", code=2)
    expect_error(sb, ["launch", cfg, "--set", "cluster.sync=ALLREDUCE", "--set", "cluster.workers=2",
                      "--set", "cluster.wire_dtype=BF16", "--set", "device.kind=CUDA"], "cluster.wire_dtype",
                 "UCX ring only", code=2)
    # Hybrid sharding: groups that do not divide the workers, without ZeRO.
    zero4 = ["--set", "cluster.sync=ALLREDUCE", "--set", "cluster.workers=4", "--set", "cluster.zero_stage=2"]
    expect_error(sb, ["launch", cfg, *zero4, "--set", "cluster.shard_group_size=3"], "cluster.shard_group_size",
                 "3 does not divide cluster.workers 4", code=2)
    expect_error(sb, ["launch", cfg, "--set", "cluster.sync=ALLREDUCE", "--set", "cluster.workers=4",
                      "--set", "cluster.shard_group_size=2"], "cluster.shard_group_size", "zero_stage 1, 2 or 3",
                 code=2)
    # A shard group is some of a stage's workers.
    expect_error(sb, ["launch", cfg, *zero4, "--set", "cluster.pipeline_stages=2", "--set", "cluster.shard_group_size=4"],
                 "cluster.shard_group_size", "4 does not divide a pipeline stage's 2 workers", code=2)
    # Tensor parallelism over every worker leaves no replica to shard over.
    expect_error(sb, ["launch", cfg, "--set", "cluster.sync=ALLREDUCE", "--set", "cluster.workers=2",
                      "--set", "cluster.zero_stage=1", "--set", "cluster.tensor_parallel=2"], "cluster.zero_stage",
                 "over all 2 workers there is one", code=2)
    # A shard group of part of a context group.
    expect_error(sb, ["launch", cfg, "--set", "cluster.sync=ALLREDUCE", "--set", "cluster.workers=8",
                      "--set", "cluster.zero_stage=2", "--set", "cluster.context_parallel=4",
                      "--set", "cluster.shard_group_size=2", "--set", "train.seq_len=32"], "cluster.shard_group_size",
                 "2 is not a multiple of cluster.tensor_parallel x cluster.context_parallel 4", code=2)
    # A data plane named on an interface this host lacks, or not as names.
    ps = ["--set", "cluster.sync=PARAMETER_SERVER", "--set", "cluster.servers=1"]
    expect_error(sb, ["launch", cfg, *ps, "--set", "cluster.data_interface=nosuch9"], "cluster.data_interface",
                 "no network interface or RDMA port 'nosuch9'", "it has lo", code=2)
    expect_error(sb, ["launch", cfg, *ps, "--set", "cluster.data_interface=lo, eth0"], "cluster.data_interface",
                 "without spaces", code=2)
    # A metrics file that cannot be opened: the reason, as every writer gives it.
    os.makedirs(sb.path("metrics_dir"))
    expect_error(sb, ["launch", cfg, "--set", "log.metrics=metrics_dir"], "log.metrics", "Is a directory")
    # Device: bf16 on the CPU; a GPU job where there is no GPU (or no CUDA).
    expect_error(sb, ["launch", cfg, "--set", "device.dtype=BF16"], "device.dtype", "CUDA")
    version = json.loads(sb.run("version").stdout)
    if version["cuda_devices"] == 0:
        expect_error(sb, ["launch", cfg, "--set", "device.kind=CUDA"], "device.kind CUDA",
                     "no CUDA device" if version["cuda"] else "without CUDA", files_before=herdtest.listing(sb.dir))

    # Unwritable checkpoint directory: refused before training starts.
    os.makedirs(sb.path("locked"))
    os.chmod(sb.path("locked"), stat.S_IRUSR | stat.S_IXUSR)
    if os.access(sb.path("locked"), os.W_OK):
        print("skip unwritable-dir case: running as root, permissions are not enforced")
        cfg = job("good.bin", name="ro.textproto", ckpt="/proc/herd_checkpoints")
    else:
        cfg = job("good.bin", name="ro.textproto", ckpt="locked/ckpt")
    before = herdtest.listing(sb.dir)
    expect_error(sb, ["launch", cfg], "checkpoint.dir", files_before=before)

    # Values that would train something else than meant, or nothing:
    # refused before any file is written.
    cfg = job("good.bin", name="values.textproto", ckpt="values_ckpt", metrics="values.jsonl")
    snap = herdtest.snapshot(sb.dir)
    expect_error(sb, ["launch", cfg, "--set", "train.steps=0"], "train.steps", "> 0", unchanged=snap, code=2)
    expect_error(sb, ["launch", cfg, "--set", "optimizer.lr=inf"], "optimizer.lr", "finite", unchanged=snap, code=2)
    expect_error(sb, ["launch", cfg, "--set", "optimizer.eps=nan"], "optimizer.eps", "finite", unchanged=snap)
    expect_error(sb, ["launch", cfg, "--set", "model.max_position_embeddings=16"], "train.seq_len",
                 "max_position_embeddings (16)", unchanged=snap, code=2)
    # A run that diverges stops in one line with the same advice in every
    # mode (the one check, model/optim's CheckNotDiverged).
    for mode in ("", "cluster { sync: PARAMETER_SERVER servers: 2 workers: 2 }",
                 "cluster { sync: ALLREDUCE workers: 2 zero_stage: 1 }"):
        text = herdtest.tiny_config("good.bin", steps=5, extra=mode)
        wild = sb.write("diverges.textproto", text.replace("lr: 3e-3", "lr: 1e30").replace("clip_norm: 1.0", ""))
        expect_error(sb, ["launch", wild], "step 2: the gradient norm is", "diverged; lower optimizer.lr")
    os.remove(wild)
    # Beyond what the machine can: refused in one line, not a crash.
    expect_error(sb, ["launch", cfg, "--set", "train.threads=100000"], "train.threads", "1024", unchanged=snap)
    expect_error(sb, ["eval", "model", "--data", "good.bin", "--threads", "100000"], "--threads", "1024")
    expect_error(sb, ["eval", "model", "--data", "good.bin", "--seq-len", "1000000", "--batch-size", "1000"],
                 "--seq-len 1000000", "memory", "available", code=2)
    expect_error(sb, ["launch", cfg, "--set", "model.num_hidden_layers=4000", "--set", "model.hidden_size=4096",
                      "--set", "model.intermediate_size=16384"], "memory", "available", unchanged=snap, code=2)
    counts_beyond_bounds(sb, cfg)
    expect_error(sb, ["launch", "/dev/zero"], "/dev/zero", "not a regular file", code=2)
    big = sb.write("big.textproto", "# " + "x" * (5 << 20) + "\n")
    expect_error(sb, ["launch", big], "big.textproto", "bytes", code=2)
    os.remove(big)

    # --resume continues only the run that wrote the checkpoint; a fresh run
    # does not mix its checkpoints with another run's.
    run = job("good.bin", name="run.textproto", ckpt="run_ckpt", metrics="run.jsonl")
    sb.run("launch", run)
    snap = herdtest.snapshot(sb.dir)
    expect_error(sb, ["launch", run, "--set", "optimizer.lr=1e-3", "--resume"], "--resume", "run_ckpt/step_00000002",
                 "optimizer.lr", unchanged=snap, code=2)
    expect_error(sb, ["launch", run, "--set", "train.seed=8", "--set", "train.batch_size=2", "--resume"], "train.seed",
                 "train.batch_size", unchanged=snap, code=2)
    expect_error(sb, ["launch", run], "run_ckpt", "already holds checkpoints", "--resume", "--overwrite",
                 unchanged=snap, code=2)
    expect_error(sb, ["launch", run, "--resume", "--overwrite"], "--resume", "--overwrite", unchanged=snap, code=2)
    # What a resume may change (docs/checkpoints.md lists it): the run's length, logging.
    p = sb.run("launch", run, "--set", "train.steps=3", "--set", "log.every=5", "--resume")
    assert "resumed from" in p.stdout, p.stdout
    p = sb.run("launch", run, "--overwrite")
    assert "removed 2 checkpoint(s)" in p.stdout, p.stdout
    assert sorted(os.listdir(sb.path("run_ckpt"))) == ["step_00000002"], os.listdir(sb.path("run_ckpt"))
    print("ok  resume of another run's checkpoint, fresh run into checkpoints: refused; --overwrite starts over")

    # A file that is not herd's is never replaced: a mistyped data.train
    # (with data.prepare_from set) must not re-prepare an existing data.val,
    # and log.metrics must not replace a file that holds something else.
    with open(sb.path("myval.u16"), "wb") as f:
        f.write(struct.pack("<100H", *range(100)))
    sb.write("notes.txt", "my notes\n")
    typo = job("typo.u16", name="typo_data.textproto")
    notes = job("good.bin", name="notes.textproto", metrics="notes.txt")
    snap = herdtest.snapshot(sb.dir)
    expect_error(sb, ["launch", typo, "--set", "data.val=myval.u16", "--set", "data.prepare_from=corpus.txt"],
                 "typo.u16", "myval.u16", "both", unchanged=snap)
    expect_error(sb, ["launch", notes], "log.metrics", "notes.txt", unchanged=snap)

    # A full disk: metrics, checkpoints and exports each fail in one line,
    # leaving no half-written file.
    with herdtest.small_tmpfs(sb.path("full"), "1m") as full:
        herdtest.fill(full)
        for what, kw in (("log.metrics", dict(metrics="full/m.jsonl")), ("checkpoint", dict(ckpt="full/ckpt"))):
            before = herdtest.listing(full)
            cfg = job("good.bin", name="full.textproto", **kw)
            expect_error(sb, ["launch", cfg], "No space left on device")
            left = [f for f in herdtest.listing(full) if f not in before and not f.endswith(".jsonl")]
            assert not any(".tmp." in f for f in left), f"{what}: half-written files left: {left}"
        expect_error(sb, ["export", "model", "--out", "full/hf"], "No space left on device")
        assert not os.path.exists(sb.path("full", "hf")), os.listdir(full)

    # prepare: missing input, unwritable output.
    before = herdtest.listing(sb.dir)
    expect_error(sb, ["prepare", "no_such.txt", "--out", "x.bin"], "no_such.txt", files_before=before)
    expect_error(sb, ["prepare", "corpus.txt", "--out", "/proc/herd/x.bin"], "/proc/herd", files_before=before)

    # --join: who may join a job under way, and how a region's processes
    # name themselves; refused before anything connects.
    regions = "cluster { sync: PARAMETER_SERVER servers: 2 workers: 2 diloco { regions: 2 every: 5 } }"
    sb.write("ps.textproto", herdtest.tiny_config("good.bin", extra="cluster { sync: PARAMETER_SERVER servers: 1 workers: 1 }"))
    sb.write("regions.textproto", herdtest.tiny_config("good.bin", extra=regions))
    for node, cfg, extra, said in (
            ("herd-server", "ps.textproto", ["--rank", "0"], "--join: only a worker can join a job under way (a server: "
                                                             "with its region, in a job of regions)"),
            ("herd-worker", "ps.textproto", ["--rank", "0"], "is neither an elastic job (cluster.elastic) nor one of "
                                                             "regions"),
            ("herd-server", "regions.textproto", [], "--join: a process rejoining a job of regions names its rank")):
        p = subprocess.run([os.path.join(os.path.dirname(sb.herd), node), cfg, "--join", "--coordinator",
                            "127.0.0.1:9", *extra], cwd=sb.dir, capture_output=True, text=True,
                           env=dict(os.environ, HERD_JOB_TOKEN="t"))
        errors = [l for l in p.stderr.splitlines() if l.startswith("herd: error:")]
        assert p.returncode == 2 and len(errors) == 1 and said in errors[0], f"{node} {cfg}: {p.returncode}\n{p.stderr}"
        print(f"ok  {node} {cfg} --join {' '.join(extra):24s} -> {errors[0]}")


if __name__ == "__main__":
    main()
