"""optimizer.skip_spikes_zscore: an injected loss spike is skipped, and
skipping is deterministic. The training file is pseudo-English with a few
stretches of random bytes spliced in; the steps whose batches draw them
have losses far above the running mean. For one process, a parameter-server
job (S=2 W=2) and DDP (W=2), at the same global batch:
  - some steps are skipped, each with a loss z-score above the threshold,
    and no step before the statistics' window is full;
  - a rerun gives the same losses and the same final checkpoint, bit for
    bit, and so does a run stopped at step 40 and resumed (the guard's
    statistics travel in the checkpoint: the skips after step 40 depend
    on them);
  - the three modes skip the same steps;
and the guarded run equals the unguarded one, bit for bit, up to its first
skipped step, and differs after it."""
import os
import random
import shutil
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import herdtest  # noqa: E402

STEPS, STOP, WINDOW, Z = 120, 40, 20, 4.0
MODES = {
    "one process": ("batch_size: 8", ""),
    "PS S=2 W=2": ("batch_size: 4", "cluster { sync: PARAMETER_SERVER servers: 2 workers: 2 }"),
    "DDP W=2": ("batch_size: 4", "cluster { sync: ALLREDUCE workers: 2 }"),
}


def spiky_tokens(sb):
    """The pseudo-English corpus's tokens with 0.4% random bytes in runs."""
    _, tokens = herdtest.read_token_file(sb.training_data())
    rng = random.Random(3)
    for _ in range(8):
        at = rng.randrange(len(tokens) - 200)
        tokens[at:at + 100] = [rng.randrange(256) for _ in range(100)]
    header = struct.pack("<3i", 20240520, 1, len(tokens)) + struct.pack("<i", 256) + bytes(1024 - 16)
    with open(sb.path("spiky.bin"), "wb") as f:
        f.write(header + struct.pack(f"<{len(tokens)}H", *tokens))
    return "spiky.bin"


def run(sb, name, mode, guard=True, stop=None):
    batch, cluster = MODES[mode]
    config = herdtest.tiny_config("spiky.bin", steps=STEPS, ckpt=f"{name}/ckpt", every=STOP,
                                  metrics=f"{name}/metrics.jsonl", extra=cluster).replace("batch_size: 4", batch)
    if guard:
        config = config.replace("clip_norm: 1.0 }",
                                f"clip_norm: 1.0 skip_spikes_zscore: {Z} skip_spikes_window: {WINDOW} }}")
    sb.write(f"{name}.textproto", config)
    if stop is not None:
        sb.run("launch", f"{name}.textproto", "--stop-at", str(stop))
        out = sb.run("launch", f"{name}.textproto", "--resume").stdout
    else:
        out = sb.run("launch", f"{name}.textproto").stdout
    rows = herdtest.metrics_rows(sb.path(name, "metrics.jsonl"))
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1)), f"{name}: steps {[r['step'] for r in rows]}"
    final = herdtest.training_state(sb.path(name, "ckpt", f"step_{STEPS:08d}"))
    return rows, final, out


def main():
    a = herdtest.parse_args()
    sb = herdtest.Sandbox(a.build)
    spiky_tokens(sb)
    skipped_by_mode = {}
    for i, mode in enumerate(MODES):
        rows, final, out = run(sb, f"m{i}", mode)
        skipped = [r["step"] for r in rows if r.get("skipped")]
        lines = [line for line in out.splitlines() if "update skipped" in line]
        assert skipped and len(lines) == len(skipped), f"{mode}: skipped {skipped}, lines {lines}"
        assert min(skipped) > WINDOW, f"{mode}: skipped {skipped} before the window of {WINDOW} steps was full"
        assert all(float(line.split("z-score ")[1].split(",")[0]) > Z or
                   float(line.split("z-score ")[2].split(" ")[0]) > Z for line in lines), lines
        again, again_final, _ = run(sb, f"m{i}_again", mode)
        assert [r["loss"] for r in again] == [r["loss"] for r in rows] and again_final == final, \
            f"{mode}: a rerun differs"
        resumed, resumed_final, _ = run(sb, f"m{i}_resumed", mode, stop=STOP)
        assert [r["loss"] for r in resumed] == [r["loss"] for r in rows] and resumed_final == final, \
            f"{mode}: stopped at {STOP} and resumed, the run differs"
        assert any(step > STOP for step in skipped), f"{mode}: no skip after the resume at {STOP} to check"
        skipped_by_mode[mode] = skipped
        print(f"ok  {mode}: {len(skipped)} of {STEPS} updates skipped (steps {skipped}); rerun and resume at "
              f"step {STOP} bit for bit")
    assert len({tuple(s) for s in skipped_by_mode.values()}) == 1, f"the modes skip differently: {skipped_by_mode}"
    guarded = herdtest.metrics_rows(sb.path("m0", "metrics.jsonl"))
    plain, _, _ = run(sb, "plain", "one process", guard=False)
    first = skipped_by_mode["one process"][0]
    assert [r["loss"] for r in plain[:first]] == [r["loss"] for r in guarded[:first]], \
        "the guard changed a step before its first skip"
    assert plain[first]["loss"] != guarded[first]["loss"], "the skipped update made no difference"
    print(f"ok  the three modes skip the same steps; unguarded, the run is the same up to step {first} and "
          f"differs from step {first + 1}")
    shutil.rmtree(sb.dir)


if __name__ == "__main__":
    main()
