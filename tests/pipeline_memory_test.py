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
what the plan says it saves.

ZeRO-3 inside the stages (all-reduce, the same model, 4 replicas a
stage): each stage's window over its ranges gathered from its replicas,
beside a quarter of its master weights. Each worker's peak within the
same bounds of its stage's line, and what ZeRO-3 saves against ZeRO-1 on
each stage within 10% of what the plan says it saves."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import herdtest  # noqa: E402


def stage_peaks(sb, name, text):
    """Launches `text` (its summaries in NAME/); each worker's peak RSS, in
    rank order, after checking it is within 10% below and 5% above its
    stage's line of `herd plan` (the line its summary names too), and the
    stages' planned totals."""
    cfg = sb.write(name + ".textproto", text)
    planned = [p["total"] for p in json.loads(sb.run("plan", cfg, "--json").stdout)["processes"]
               if p["role"] == "stage"]
    sb.run("launch", cfg)
    workers = len([f for f in os.listdir(sb.path(name)) if f.startswith("worker_")])
    peaks = []
    for w in range(workers):
        with open(sb.path(name, f"worker_{w:05d}.json")) as f:
            summary = json.load(f)
        stage = w * len(planned) // workers  # a stage is a block of ranks
        assert summary["plan_bytes"] == planned[stage], (name, w, summary["plan_bytes"], planned[stage])
        ratio = summary["peak_rss_bytes"] / planned[stage]
        assert 0.90 <= ratio <= 1.05, f"{name} worker {w}: {summary['peak_rss_bytes']} against {planned[stage]} " \
                                      f"planned ({ratio:.3f})"
        peaks.append(summary["peak_rss_bytes"])
    return peaks, planned


def stage_means(peaks, stages):
    per = len(peaks) // stages
    return [sum(peaks[per * d:per * d + per]) / per for d in range(stages)]


def saved_as_planned(what, more, less, tolerance):
    """What the `less` job holds below the `more` one on each stage, measured
    against planned (each a (peaks, planned) of stage_peaks), within
    `tolerance` of the plan; the report's words."""
    report = []
    for d, (m, l) in enumerate(zip(stage_means(more[0], len(more[1])), stage_means(less[0], len(less[1])))):
        planned_saved = more[1][d] - less[1][d]
        assert planned_saved > 0, (what, more[1], less[1])
        off = (m - l) / planned_saved - 1
        assert abs(off) <= tolerance, f"stage {d}: {what} {m - l}, {planned_saved} planned"
        report.append(f"stage {d} {(m - l) / 2**20:.1f}/{planned_saved / 2**20:.1f} MiB ({100 * off:+.1f}%)")
    return ", ".join(report)


def big_model(name, cluster):
    """8 layers of d512 in tiny batches: weights dominate."""
    return f"""
model {{ vocab_size: 256 hidden_size: 512 intermediate_size: 1536 num_hidden_layers: 8
        num_attention_heads: 8 num_key_value_heads: 4 tie_word_embeddings: false }}
train {{ steps: 2 batch_size: 1 seq_len: 32 grad_accum: 4 seed: 7 }}
data {{ train: "train.bin" }}
log {{ every: 1 sample_tokens: 0 summary_dir: "{name}" }}
{cluster}
"""


def main():
    a = herdtest.parse_args()
    sb = herdtest.Sandbox(a.build)
    sb.training_data()
    jobs = {}
    for schedule in ("GPIPE", "ONE_F_ONE_B", "ZERO_BUBBLE"):
        name = schedule.lower()
        jobs[schedule] = stage_peaks(sb, name, f"""
model {{ vocab_size: 256 hidden_size: 64 intermediate_size: 160 num_hidden_layers: 4
        num_attention_heads: 4 num_key_value_heads: 2 tie_word_embeddings: false }}
train {{ steps: 2 batch_size: 4 seq_len: 256 grad_accum: 8 seed: 7 }}
data {{ train: "train.bin" }}
log {{ every: 1 sample_tokens: 0 summary_dir: "{name}" }}
cluster {{ sync: ALLREDUCE workers: 2 pipeline_stages: 2 pipeline_schedule: {schedule} }}
""")
    report = saved_as_planned("GPipe holds beyond 1F1B", jobs["GPIPE"], jobs["ONE_F_ONE_B"], 0.03)
    print("pipeline_memory: GPipe's activations beyond 1F1B's, measured/planned: " + report +
          "; peaks/plan: " + ", ".join(f"{s} {peaks[w] / planned[w]:.3f}" for s, (peaks, planned) in jobs.items()
                                         for w in range(2)))

    # Streamed weights inside the stages, against whole ones.
    streamed = {}
    for stream in ("false", "true"):
        name = "streamed" if stream == "true" else "whole"
        streamed[name] = stage_peaks(sb, name, big_model(name, f"""
cluster {{ sync: PARAMETER_SERVER servers: 2 workers: 2 pipeline_stages: 2 bucket_mb: 1
          stream_weights: {stream} stream_prefetch_layers: 0 }}"""))
    print("pipeline_memory: streamed weights inside the stages save, measured/planned: " +
          saved_as_planned("streaming saved", streamed["whole"], streamed["streamed"], 0.10))

    # ZeRO-3 inside the stages, against ZeRO-1.
    zero = {}
    for stage in (1, 3):
        name = f"zero{stage}"
        zero[stage] = stage_peaks(sb, name, big_model(name, f"""
cluster {{ sync: ALLREDUCE workers: 8 pipeline_stages: 2 bucket_mb: 1 zero_stage: {stage}
          stream_prefetch_layers: 0 }}"""))
    print("pipeline_memory: ZeRO-3 inside the stages saves against ZeRO-1, measured/planned: " +
          saved_as_planned("ZeRO-3 saved", zero[1], zero[3], 0.10))


if __name__ == "__main__":
    main()
