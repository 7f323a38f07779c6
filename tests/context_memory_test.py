"""A sequence too long for one worker's memory trains with context
parallelism: the ~20M shape (d512, 8 layers) at 1 x 2048 tokens needs
1.8 GiB a worker by `herd plan` (the attention probabilities alone are 1
GiB), over a 1 GiB budget; with cluster.context_parallel 4 the plan says
704 MiB, and four workers train 2 steps with every worker's peak RSS under
the budget and within 3% of the plan (measured within 0.6%)."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import herdtest  # noqa: E402

BUDGET = 2**30


def main():
    a = herdtest.parse_args()
    sb = herdtest.Sandbox(a.build)
    sb.training_data()
    planned = {}
    for C in (1, 4):
        name = f"c{C}"
        text = herdtest.LLAMA20M_MODEL + f"""
train {{ steps: 2 batch_size: 1 seq_len: 2048 seed: 7 }}
data {{ train: "train.bin" }}
log {{ every: 1 sample_tokens: 0 summary_dir: "{name}" }}
cluster {{ sync: ALLREDUCE workers: {C} context_parallel: {C} }}
"""
        cfg = sb.write(name + ".textproto", text)
        planned[C] = json.loads(sb.run("plan", cfg, "--json").stdout)["processes"][-1]["total"]
    assert planned[1] > BUDGET >= planned[4], f"planned {planned} against a budget of {BUDGET}"
    sb.run("launch", sb.path("c4.textproto"))
    peaks = []
    for r in range(4):
        with open(sb.path("c4", f"worker_{r:05d}.json")) as f:
            peaks.append(json.load(f)["peak_rss_bytes"])
    worst = max(abs(p / planned[4] - 1) for p in peaks)
    assert max(peaks) <= BUDGET and worst <= 0.03, f"peaks {peaks} against {planned[4]} planned ({worst:.3f} off)"
    print(f"ok  1 x 2048 tokens: one worker plans {planned[1] / 2**20:.0f} MiB, over a {BUDGET / 2**20:.0f} MiB "
          f"budget; with C = 4 each plans {planned[4] / 2**20:.1f} and peaked at {min(peaks) / 2**20:.1f}-"
          f"{max(peaks) / 2**20:.1f} MiB ({worst:.2%} off) over 2 steps")


if __name__ == "__main__":
    main()
