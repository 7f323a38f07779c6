"""`herd plan` against measured memory with checkpoints on, for the four
kinds of job that write them differently: parameter servers (each server
its shard, in place: checkpoint.background false), regions (each
region's servers their replica and outer state, from background
snapshots, the first region's first server committing every part),
tensor parallelism and pipeline stages (each worker its own pieces). The
~20M shape (d512, 8 layers), two steps, a checkpoint after each (the
second step's work beside the first's snapshots): every process's peak
RSS within 3% of its line of the plan (a region's server: up to one
outer contribution below, see below). Parameter servers' buckets are
1 MB: what the push/pull path holds a bucket beyond the plan is no
checkpoint's. Prints the table: job, process, planned, measured, ratio."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import herdtest  # noqa: E402

JOBS = [
    ("ps", "cluster { sync: PARAMETER_SERVER servers: 2 workers: 1 bucket_mb: 1 }", "background: false"),
    ("regions", "cluster { sync: PARAMETER_SERVER servers: 2 workers: 2 bucket_mb: 1 diloco { regions: 2 every: 1 } }",
     "background: true"),
    ("tensor", "cluster { sync: ALLREDUCE workers: 2 tensor_parallel: 2 }", ""),
    ("pipeline", "cluster { sync: ALLREDUCE workers: 2 pipeline_stages: 2 }", ""),
]


def main():
    a = herdtest.parse_args()
    sb = herdtest.Sandbox(a.build)
    sb.training_data()
    rows, off = [], []
    for name, cluster, checkpoint in JOBS:
        cfg = sb.write(name + ".textproto", herdtest.LLAMA20M_MODEL + f"""
train {{ steps: 2 batch_size: 2 grad_accum: 2 seq_len: 128 seed: 7 }}
data {{ train: "train.bin" }}
checkpoint {{ dir: "{name}_ckpt" every: 1 {checkpoint} }}
log {{ every: 1 sample_tokens: 0 summary_dir: "{name}" }}
{cluster}
""")
        planned = {p["total"] for p in json.loads(sb.run("plan", cfg, "--json").stdout)["processes"]}
        sb.run("launch", cfg)
        assert os.path.exists(sb.path(f"{name}_ckpt", "step_00000002", "manifest.json")), f"{name}: no checkpoint"
        for file in sorted(os.listdir(sb.path(name))):  # every process's end-of-run JSON
            with open(sb.path(name, file)) as f:
                s = json.load(f)
            # What the process planned for itself is its line of `herd plan`.
            assert s["plan_bytes"] in planned, (name, s, planned)
            ratio = s["peak_rss_bytes"] / s["plan_bytes"]
            rows.append(f"{name:9s} {s['role']} {s['rank']:<3d} {s['plan_bytes'] / 2**20:8.1f} "
                        f"{s['peak_rss_bytes'] / 2**20:8.1f} {ratio:6.3f}")
            # A region's server plans for a contribution held whole by UCX
            # while it arrives from another host (an eager message); within
            # a host it lands in place (read in one copy, or UCX's
            # rendezvous) and that buffer is never made: up to one
            # contribution (6% here) under the plan.
            low = 0.90 if (name, s["role"]) == ("regions", "server") else 0.97
            if not low <= ratio <= 1.03:
                off.append(rows[-1])
    print("job       process    planned measured  ratio (MiB)\n" + "\n".join(rows))
    assert not off, "peaks off the plan by more than allowed:\n" + "\n".join(off)


if __name__ == "__main__":
    main()
