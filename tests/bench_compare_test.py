"""`herd bench compare` runs one job as PS, DDP and ZeRO-1 and reports each
mode from the processes' JSON end-of-run summaries (log.summary_dir): one
JSON line per mode with every worker counted, its peak memory and the
bytes it sent per step: the model's size M for a PS worker's pushes,
2(W-1)/W M for the ring (and ZeRO-1), checked against `herd plan`'s count."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import herdtest  # noqa: E402


def main():
    a = herdtest.parse_args()
    sb = herdtest.Sandbox(a.build)
    sb.corpus(n_bytes=50_000)
    sb.run("prepare", "corpus.txt", "--out", "train.bin")
    cfg = sb.write("job.textproto", herdtest.tiny_config("train.bin", steps=10,
                                                       extra="cluster { workers: 2 servers: 1 }"))
    steps = 6
    p = sb.run("bench", "compare", cfg, "--steps", str(steps), "--warmup", "1", "--json")
    rows = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]
    assert [r["mode"] for r in rows] == ["ps", "allreduce", "allreduce_zero1"], p.stdout
    # The bytes each mode must send, from the model's size M (fp32): a PS
    # worker pushes M a step; a ring all-reduce (and ZeRO-1's
    # reduce-scatter + all-gather) sends 2(W-1)/W M, here M, plus the start's
    # weight broadcast from rank 0 spread over the run's steps.
    ps_cfg = sb.write("plan.textproto", herdtest.tiny_config(
        "train.bin", extra="cluster { sync: PARAMETER_SERVER workers: 2 servers: 1 }"))
    M = 4 * json.loads(sb.run("plan", ps_cfg, "--json").stdout)["parameters"] / 2**20
    W = 2
    expected = {"ps": (M, M), "allreduce": (2 * (W - 1) / W * M, 2 * (W - 1) / W * M + M / steps)}
    expected["allreduce_zero1"] = expected["allreduce"]
    for r in rows:
        assert r["workers"] == 2, r
        assert r["worker_peak_MiB"] > 1, r
        low, high = expected[r["mode"]]
        sent = r["sent_MiB_per_worker_step"]  # printed to 0.01 MiB
        assert low - 0.01 <= sent <= 1.02 * high + 0.01, f"{r['mode']}: {sent} MiB a step, expected {low:.3f}..{high:.3f}"
        assert r["tokens_per_s"] > 0 and 0 <= r["comm_wait_share"] <= 1, r
    assert rows[0]["servers"] == 1 and rows[0]["server_peak_MiB"] > 1, rows[0]
    print("bench compare: " + "; ".join(f"{r['mode']} {r['tokens_per_s']:.0f} tok/s" for r in rows))


if __name__ == "__main__":
    main()
