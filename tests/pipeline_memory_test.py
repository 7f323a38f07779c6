"""`herd plan` against measured memory for pipeline stages: a 4-layer model
with large activations (batch 4 x 256 tokens, 8 micro-batches) cut into 2
stages, under GPipe (every stage keeps all 8 micro-batches' activations)
and 1F1B (stage 0 keeps 2, stage 1 one), and ZB-H1 (1F1B's, each held
until its deferred weight part, with the output gradients that part
reads). Each stage worker's peak RSS must be within 5% above and 10%
below its stage's line of the plan, and
what GPipe holds beyond 1F1B on each stage (activations alone: the rest
is the same) within 3% of what the plan says it holds beyond it.

Streamed weights inside the stages (parameter servers, 8 layers of d512
in 2 stages, prefetch 0): each stage's window over its own ranges. Each
stage's peak within the same bounds of its line, and what streaming
saves against the same stages holding their weights whole within 10% of
what the plan says it saves."""
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

    # Streamed weights inside the stages: weights dominate.
    stage_planned, stage_measured = {}, {}
    for stream in ("false", "true"):
        name = "streamed" if stream == "true" else "whole"
        text = f"""
model {{ vocab_size: 256 hidden_size: 512 intermediate_size: 1536 num_hidden_layers: 8
        num_attention_heads: 8 num_key_value_heads: 4 tie_word_embeddings: false }}
train {{ steps: 2 batch_size: 1 seq_len: 32 grad_accum: 4 seed: 7 }}
data {{ train: "train.bin" }}
log {{ every: 1 sample_tokens: 0 summary_dir: "{name}" }}
cluster {{ sync: PARAMETER_SERVER servers: 2 workers: 2 pipeline_stages: 2 bucket_mb: 1
          stream_weights: {stream} stream_prefetch_layers: 0 }}
"""
        cfg = sb.write(name + ".textproto", text)
        plan = [p for p in json.loads(sb.run("plan", cfg, "--json").stdout)["processes"] if p["role"] == "stage"]
        stage_planned[name] = [p["total"] for p in plan]
        sb.run("launch", cfg)
        stage_measured[name] = []
        for w in range(2):
            with open(sb.path(name, f"worker_{w:05d}.json")) as f:
                peak = json.load(f)["peak_rss_bytes"]
            ratio = peak / stage_planned[name][w]
            assert 0.90 <= ratio <= 1.05, f"{name} stage {w}: {peak} against {stage_planned[name][w]} planned ({ratio:.3f})"
            stage_measured[name].append(peak)
    report = []
    for w in range(2):
        planned_saved = stage_planned["whole"][w] - stage_planned["streamed"][w]
        saved = stage_measured["whole"][w] - stage_measured["streamed"][w]
        assert planned_saved > 0, stage_planned
        off = saved / planned_saved - 1
        assert abs(off) <= 0.10, f"stage {w}: streaming saved {saved}, {planned_saved} planned"
        report.append(f"stage {w} {saved / 2**20:.1f}/{planned_saved / 2**20:.1f} MiB ({100 * off:+.1f}%)")
    print("pipeline_memory: streamed weights inside the stages save, measured/planned: " + ", ".join(report))


if __name__ == "__main__":
    main()
