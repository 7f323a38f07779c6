"""`herd plan` against measured memory for pipeline stages: a 4-layer model
with large activations (batch 4 x 256 tokens, 8 micro-batches) cut into 2
stages, under GPipe (every stage keeps all 8 micro-batches' activations)
and 1F1B (stage 0 keeps 2, stage 1 one), and ZB-H1 (1F1B's, each held
until its deferred weight part, with the output gradients that part
reads). Each stage worker's peak RSS must be within 5% above and 10%
below its stage's line of the plan, and
what GPipe holds beyond 1F1B on each stage (activations alone: the rest
is the same) within 3% of what the plan says it holds beyond it."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import herdtest  # noqa: E402


def main():
    a = herdtest.parse_args()
    sb = herdtest.Sandbox(a.build)
    sb.training_data()
    planned, measured = {}, {}
    for schedule in ("GPIPE", "ONE_F_ONE_B", "ZERO_BUBBLE"):
        name = schedule.lower()
        text = f"""
model {{ vocab_size: 256 hidden_size: 64 intermediate_size: 160 num_hidden_layers: 4
        num_attention_heads: 4 num_key_value_heads: 2 tie_word_embeddings: false }}
train {{ steps: 2 batch_size: 4 seq_len: 256 grad_accum: 8 seed: 7 }}
data {{ train: "train.bin" }}
log {{ every: 1 sample_tokens: 0 summary_dir: "{name}" }}
cluster {{ sync: ALLREDUCE workers: 2 pipeline_stages: 2 pipeline_schedule: {schedule} }}
"""
        cfg = sb.write(name + ".textproto", text)
        plan = json.loads(sb.run("plan", cfg, "--json").stdout)["processes"]
        planned[schedule] = [p["total"] for p in plan]
        sb.run("launch", cfg)
        measured[schedule] = []
        for w in range(2):
            with open(sb.path(name, f"worker_{w:05d}.json")) as f:
                summary = json.load(f)
            assert summary["plan_bytes"] == planned[schedule][w], (summary["plan_bytes"], planned[schedule][w])
            measured[schedule].append(summary["peak_rss_bytes"])
        for w in range(2):
            ratio = measured[schedule][w] / planned[schedule][w]
            assert 0.90 <= ratio <= 1.05, f"{schedule} stage {w}: {measured[schedule][w]} against " \
                                          f"{planned[schedule][w]} planned ({ratio:.3f})"
    report = []
    for w in range(2):
        planned_more = planned["GPIPE"][w] - planned["ONE_F_ONE_B"][w]
        measured_more = measured["GPIPE"][w] - measured["ONE_F_ONE_B"][w]
        assert planned_more > 0, planned
        off = measured_more / planned_more - 1
        assert abs(off) <= 0.03, f"stage {w}: GPipe holds {measured_more} beyond 1F1B, {planned_more} planned"
        report.append(f"stage {w} {measured_more / 2**20:.1f}/{planned_more / 2**20:.1f} MiB ({100 * off:+.1f}%)")
    print("pipeline_memory: GPipe's activations beyond 1F1B's, measured/planned: " + ", ".join(report) +
          "; peaks/plan: " + ", ".join(f"{s} {measured[s][w] / planned[s][w]:.3f}" for s in measured
                                         for w in range(2)))


if __name__ == "__main__":
    main()
