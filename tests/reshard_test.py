"""Resume at any shape: a checkpoint written by any of {one process, PS
S=2 W=2, PS S=3 W=1, DDP W=2, ZeRO-1 W=3} resumes in each of the others,
with the same global batch (12 sequences per step, split as each shape
splits it). Stopped at step 10 and resumed to 30, every one of the 20
pairs has losses within 1e-5 relative of the target shape's uninterrupted
run: the optimizer state is reassembled from however many shards wrote
it, and the data position is global, so each step takes the same
sequences (tests/data_test.cc counts them). A resume that changes the
global batch is refused in one line that says what to set, and with
--allow-global-batch-change goes on with the new one (tests/data_test.cc
shows the data then continues right after the last sequence taken)."""
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import herdtest  # noqa: E402

STEPS, STOP = 30, 10
SHAPES = {  # name: (train.batch_size, cluster); 12 sequences per step each
    "single": (12, ""),
    "ps22": (6, "cluster { sync: PARAMETER_SERVER servers: 2 workers: 2 }"),
    "ps31": (12, "cluster { sync: PARAMETER_SERVER servers: 3 workers: 1 }"),
    "ddp2": (6, "cluster { sync: ALLREDUCE workers: 2 }"),
    "zero1_3": (4, "cluster { sync: ALLREDUCE workers: 3 zero_stage: 1 }"),
}


def losses(path):
    rows = {}
    with open(path) as f:
        for line in f:
            m = json.loads(line)
            rows[m["step"]] = m["loss"]
    return [rows[s] for s in sorted(rows)]


def main():
    a = herdtest.parse_args()
    sb = herdtest.Sandbox(a.build)
    sb.training_data()

    def config(shape, name):
        batch, cluster = SHAPES[shape]
        text = herdtest.tiny_config("train.bin", steps=STEPS, ckpt=name + "_ckpt", every=STOP,
                                    metrics=name + ".jsonl", extra=cluster)
        return sb.write(f"{name}_{shape}.textproto", text.replace("batch_size: 4", f"batch_size: {batch}"))

    straight = {}
    for shape in SHAPES:
        sb.run("launch", config(shape, "straight_" + shape))
        straight[shape] = losses(sb.path(f"straight_{shape}.jsonl"))
    worst = (0.0, "")
    for src in SHAPES:
        for dst in SHAPES:
            if src == dst:
                continue
            name = f"{src}_to_{dst}"
            sb.run("launch", config(src, name), "--stop-at", str(STOP))
            p = sb.run("launch", config(dst, name), "--resume")
            assert "resumed from" in p.stdout, p.stdout[-2000:]
            got = losses(sb.path(name + ".jsonl"))
            assert len(got) == STEPS, f"{name}: {len(got)} steps"
            rel = max(abs(g - w) / abs(w) for g, w in zip(got[STOP:], straight[dst][STOP:]))
            assert rel < 1e-5, f"{name}: losses after the resume differ from {dst}'s by {rel:.3g} relative"
            worst = max(worst, (rel, name))
    print(f"ok  20 shape changes at step {STOP}: losses to step {STEPS} within {worst[0]:.2g} relative of the "
          f"target shape's uninterrupted run (worst: {worst[1]})")

    # Another global batch: refused, in one line that says what to set.
    name = "ps22_to_single"
    cfg = config("single", name)
    p = sb.run("launch", cfg, "--set", "train.batch_size=8", "--resume", check=False)
    lines = [l for l in p.stderr.splitlines() if l.startswith("herd: error:")]
    assert p.returncode != 0 and len(lines) == 1, p.stderr[-2000:]
    for needle in ("global batch of 12 sequences per step", "8 sequences per step", "set train.batch_size=12"):
        assert needle in lines[0], lines[0]
    print(f"ok  another global batch on resume: {lines[0]}")
    p = sb.run("launch", cfg, "--set", "train.batch_size=8", "--set", f"train.steps={STEPS + 10}", "--resume",
               "--allow-global-batch-change")
    got = losses(sb.path(name + ".jsonl"))
    assert f"resumed from {name}_ckpt/step_{STEPS:08d}" in p.stdout and len(got) == STEPS + 10, p.stdout[-2000:]
    print(f"ok  with --allow-global-batch-change the run goes on at 8 sequences per step from step {STEPS} "
          f"to {STEPS + 10}")
    shutil.rmtree(sb.dir)


if __name__ == "__main__":
    main()
