"""log.tensorboard: the event files herd writes are read by TensorBoard's
own reader (the `tensorboard` package from PyPI, in a venv: an outside
reader), and every scalar equals the metrics file's figure for the same
step (as float32). A parameter-server job (S=1 W=2) writes loss, lr, grad
norm, tokens/s, step time, network wait, MFU (log.peak_tflops) and val
loss; stopped at step 12 and resumed to 20, the directory holds two files
and TensorBoard shows every step once.

Where the package cannot be installed the test is skipped (exit 77)."""
import json
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import herdtest  # noqa: E402

TENSORBOARD = "tensorboard==2.21.0"
# The metrics file keeps these at full precision (float32 must match
# exactly); the rates and shares it rounds (%.6g, %.4g, %.4f).
EXACT = {"loss", "lr", "grad_norm", "val_loss"}
TAGS = {"train/loss": "loss", "train/lr": "lr", "train/grad_norm": "grad_norm", "perf/tokens_per_s": "tokens_per_s",
        "perf/step_time_s": "step_s", "perf/network_wait": "network_wait", "perf/mfu": "mfu", "val/loss": "val_loss"}


def main():
    a = herdtest.parse_args()
    herdtest.rerun_in_venv(a.build, "venv-tensorboard", TENSORBOARD)

    import numpy as np
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    sb = herdtest.Sandbox(a.build)
    train = sb.training_data()
    sb.run("prepare", sb.corpus("val.txt", 20_000, seed=1), "--out", "val.bin")
    config = herdtest.tiny_config(train, "val.bin", steps=20, ckpt="ckpt", every=4, metrics="metrics.jsonl",
                                  eval_every=5, extra="cluster { sync: PARAMETER_SERVER servers: 1 workers: 2 }")
    config = config.replace("sample_tokens: 0", 'sample_tokens: 0 tensorboard: "tb" peak_tflops: 0.5')
    sb.write("job.textproto", config)
    sb.run("launch", "job.textproto", "--stop-at", "12")
    sb.run("launch", "job.textproto", "--resume")

    files = sorted(os.listdir(sb.path("tb")))
    assert len(files) == 2 and all(f.startswith("events.out.tfevents.") for f in files), files
    rows = {}
    for line in open(sb.path("metrics.jsonl")):
        r = json.loads(line)
        rows[r["step"]] = r
    acc = EventAccumulator(sb.path("tb"))
    acc.Reload()
    assert set(acc.Tags()["scalars"]) == set(TAGS), acc.Tags()["scalars"]
    for tag, key in TAGS.items():
        events = acc.Scalars(tag)
        want = {s: r[key] for s, r in rows.items() if key in r}
        got = {e.step: e.value for e in events}
        assert len(events) == len(got) == len(want) and set(got) == set(want), \
            f"{tag}: steps {sorted(got)} in TensorBoard, {sorted(want)} in the metrics"
        for s in want:
            same = got[s] == np.float32(want[s]) if key in EXACT else abs(got[s] - want[s]) <= 1e-3 * abs(want[s]) + 1e-4
            assert same, f"{tag} at step {s}: TensorBoard {got[s]}, metrics {want[s]}"
    # MFU = tokens/s x FLOPs per token / (peak x workers), with the FLOPs
    # of tiny_config's shape counted here: 6 per weight of a matrix product
    # (tied embeddings: the table is the lm_head; norms scale, not
    # multiply) + 12 x layers x hidden x seq_len.
    d, f, layers, kv, vocab, seq = 64, 160, 2, 32, 256, 32
    weights = vocab * d + layers * (2 * d * d + 2 * d * kv + 3 * d * f)
    flops_per_token = 6 * weights + 12 * layers * d * seq
    mfu = [r["mfu"] for r in rows.values()]
    for r in rows.values():
        want = r["tokens_per_s"] * flops_per_token / (0.5e12 * 2)
        assert abs(r["mfu"] - want) <= 1e-3 * want, f"step {r['step']}: mfu {r['mfu']}, expected {want}"
    print(f"ok  {len(files)} event files; TensorBoard reads {len(TAGS)} scalars at {len(rows)} steps, each equal "
          f"to the metrics file's (val loss at {sorted(s for s, r in rows.items() if 'val_loss' in r)}); "
          f"MFU {min(mfu):.4f}-{max(mfu):.4f} of a 0.5 TFLOP/s peak, as counted")
    shutil.rmtree(sb.dir)


if __name__ == "__main__":
    main()
