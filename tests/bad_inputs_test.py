"""Every bad input gives one clear 'herd: error:' line naming what and where,
a non-zero exit code, and leaves nothing half-written behind. Real
processes, real files."""
import json
import os
import stat
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import herdtest  # noqa: E402


def expect_error(sb, args, *needles, files_before=None):
    p = sb.run(*args, check=False)
    errors = [l for l in p.stderr.splitlines() if l.startswith("herd: error:")]
    assert p.returncode != 0, f"{args}: exit code 0\n{p.stdout}{p.stderr}"
    assert len(errors) == 1, f"{args}: expected one error line, got:\n{p.stderr}"
    for n in needles:
        assert n in errors[0], f"{args}: '{n}' not in: {errors[0]}"
    if files_before is not None:
        after = herdtest.listing(sb.dir)
        assert after == files_before, f"{args}: left files behind: {sorted(set(after) - set(files_before))}"
    print(f"ok  {' '.join(args)[:60]:60s} -> {errors[0]}")


def main():
    a = herdtest.parse_args()
    sb = herdtest.Sandbox(a.build)
    sb.corpus(n_bytes=20_000)
    sb.run("prepare", "corpus.txt", "--out", "good.bin")
    good = open(sb.path("good.bin"), "rb").read()

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

    # prepare: missing input, unwritable output.
    before = herdtest.listing(sb.dir)
    expect_error(sb, ["prepare", "no_such.txt", "--out", "x.bin"], "no_such.txt", files_before=before)
    expect_error(sb, ["prepare", "corpus.txt", "--out", "/proc/herd/x.bin"], "/proc/herd", files_before=before)


if __name__ == "__main__":
    main()
