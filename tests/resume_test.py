"""Resume is bit-exact: 20 steps straight vs 10 steps, stop, --resume to 20
give bitwise-equal losses, gradient norms and final weights/moments; a rerun
of the same config is bitwise identical; a checkpoint without a manifest is
never loaded, and what failed checkpoint writes left (temporary files of
dead processes, uncommitted step directories after the resume point) is
removed at the next start."""
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import herdtest  # noqa: E402


def metrics(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def shard_bytes(ckpt_root, step):
    with open(os.path.join(ckpt_root, f"step_{step:08d}", "shard_00000.bin"), "rb") as f:
        return f.read()


def main():
    a = herdtest.parse_args()
    sb = herdtest.Sandbox(a.build)
    sb.training_data()

    def job(name, **kw):
        return sb.write(name + ".textproto", herdtest.tiny_config("train.bin", steps=20, ckpt=name, every=10,
                                                                  metrics=name + ".jsonl", **kw))

    sb.run("launch", job("straight"))
    sb.run("launch", job("again"))
    sb.run("launch", job("split"), "--stop-at", "10")
    assert not os.path.exists(sb.path("split", "step_00000020")), "stopped run went past step 10"
    sb.run("launch", job("split"), "--resume")

    straight, again, split = (metrics(sb.path(n + ".jsonl")) for n in ("straight", "again", "split"))
    key = lambda m: (m["step"], m["loss"], m["grad_norm"], m["lr"])  # noqa: E731
    assert [key(m) for m in straight] == [key(m) for m in again], "rerun is not bitwise identical"
    assert [m["step"] for m in split] == list(range(1, 21)), [m["step"] for m in split]
    for s, r in zip(straight, split):
        assert key(s) == key(r), f"step {s['step']}: straight {key(s)} vs resumed {key(r)}"
    assert shard_bytes(sb.path("straight"), 20) == shard_bytes(sb.path("split"), 20), "final weights/moments differ"
    assert shard_bytes(sb.path("straight"), 20) == shard_bytes(sb.path("again"), 20)
    assert straight[-1]["loss"] < straight[0]["loss"] - 1.0, "the model did not learn"

    # A step directory without manifest is skipped: resume picks step 10.
    # What failed writes left goes first: the temporary file of a process
    # that is gone, and step directories after step 10 without a manifest
    # (step 15's never finished; step 20's manifest is removed here).
    os.remove(sb.path("split", "step_00000020", "manifest.json"))
    dead = subprocess.Popen(["true"])
    dead.wait()
    stray = sb.path("split", "step_00000010", f"shard_00000.bin.tmp.{dead.pid}")
    sb.write(stray, "half a shard")
    os.makedirs(sb.path("split", "step_00000015"))
    sb.write(sb.path("split", "step_00000015", "shard_00000.bin"), "a shard of a checkpoint never committed")
    p = sb.run("launch", job("split"), "--resume", "--stop-at", "20")
    assert "resumed from" in p.stdout and "step_00000010" in p.stdout, p.stdout
    assert "removed what failed writes left: 1 temporary files, 2 step directories" in p.stdout, p.stdout
    assert not os.path.exists(stray) and not os.path.exists(sb.path("split", "step_00000015"))
    assert os.path.exists(sb.path("split", "step_00000020", "manifest.json")), "step 20 was not written again"
    # ... and with no complete checkpoint at all, --resume refuses.
    for d in ("step_00000010", "step_00000020"):
        m = sb.path("split", d, "manifest.json")
        if os.path.exists(m):
            os.remove(m)
    p = sb.run("launch", job("split"), "--resume", check=False)
    assert p.returncode != 0 and "no complete checkpoint" in p.stderr, p.stderr
    assert sum(l.startswith("herd: error:") for l in p.stderr.splitlines()) == 1, p.stderr
    # Export refuses an incomplete step directory too.
    p = sb.run("export", sb.path("split", "step_00000010"), "--out", "hf", check=False)
    assert p.returncode != 0 and "manifest" in p.stderr, p.stderr
    assert not os.path.exists(sb.path("hf"))
    print(f"resume: 20 straight vs 10+10 bitwise equal; final loss {straight[-1]['loss']:.4f}")
    shutil.rmtree(sb.dir)


if __name__ == "__main__":
    main()
