"""`herd bench compare` runs one job as PS, DDP and ZeRO-1 and reports each
mode from the processes' JSON end-of-run summaries (log.summary_dir): one
JSON line per mode with every worker counted, its peak memory and the
bytes it sent per step."""
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
    p = sb.run("bench", "compare", cfg, "--steps", "6", "--warmup", "1", "--json")
    rows = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]
    assert [r["mode"] for r in rows] == ["ps", "allreduce", "allreduce_zero1"], p.stdout
    for r in rows:
        assert r["workers"] == 2, r
        assert r["worker_peak_MiB"] > 1 and r["sent_MiB_per_worker_step"] > 0, r
        assert r["tokens_per_s"] > 0 and 0 <= r["comm_wait_share"] <= 1, r
    assert rows[0]["servers"] == 1 and rows[0]["server_peak_MiB"] > 1, rows[0]
    print("bench compare: " + "; ".join(f"{r['mode']} {r['tokens_per_s']:.0f} tok/s" for r in rows))


if __name__ == "__main__":
    main()
