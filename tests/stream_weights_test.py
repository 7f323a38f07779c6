"""cluster.stream_weights: a parameter-server worker that holds only a
window of layers trains exactly as one that holds the whole model, and
holds what `herd plan` says.

  - PS jobs of 20 steps with and without streamed weights: the same losses
    and gradient norms in the metrics and the same final checkpoint
    (optimizer shards and data positions), bit for bit. Tiny config, S=2
    W=2 (fp32 wire, with evaluation every 5 steps), and its variants: bf16
    on the wire, grad_accum 2, clip_norm 0 (the servers step each bucket
    as its sum completes while other workers still pull the old weights),
    untied embeddings, and with grad_accum 3 (every micro-batch through
    each layer in one pass), no prefetch and two layers of it, small buckets
    that straddle layers; the ~20M shape (configs/llama20m: d512, 8 layers)
    S=2 W=2, FULL recompute (grad_accum 2, untied alone and no prefetch
    with --long only: the other cases cover them);
  - memory: the ~20M shape at batch 8 x 256, one worker, streamed, under
    FULL recompute (and untied with grad_accum 2): every process's
    measured peak RSS within 10% of its plan, the worker's weights a
    fraction of the unstreamed worker's, and no gradient kept whole while
    accumulating unless the embeddings are tied;
  - a model whose fp32 weights alone are more than three times a worker's
    measured peak trains 3 steps with its loss falling, every process
    within 10% of its plan;
  - the refusals: elastic jobs, all-reduce."""
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import herdtest  # noqa: E402

M20 = herdtest.LLAMA20M_MODEL
TINY_MODEL = herdtest.TINY_MODEL


def train(sb, name, cluster, model=None, train_extra="", optimizer=None, batch=2, seq_len=32, eval_every=0, device="",
          steps=20):
    config = herdtest.tiny_config("train.bin", val="val.bin" if eval_every else "", steps=steps, ckpt=f"{name}/ckpt",
                                  every=steps, metrics=f"{name}/metrics.jsonl",
                                  extra=f"cluster {{ {cluster} }}\n{device}", eval_every=eval_every)
    config = config.replace("seed: 7 }", f"seed: 7 {train_extra} }}").replace(
        "batch_size: 4 seq_len: 32", f"batch_size: {batch} seq_len: {seq_len}")
    if model:
        config = config.replace(TINY_MODEL, model)
    if optimizer:
        config = config.replace("clip_norm: 1.0", optimizer)
    sb.write(f"{name}.textproto", config)
    sb.run("launch", f"{name}.textproto")
    rows = herdtest.metrics_rows(sb.path(name, "metrics.jsonl"))
    state = herdtest.training_state(sb.path(name, "ckpt", f"step_{steps:08d}"))
    return [(r["step"], r["loss"], r["grad_norm"], r.get("val_loss")) for r in rows], state


PS = "sync: PARAMETER_SERVER servers: 2 workers: 2"
M20_STEPS = 20 if herdtest.LONG else 4  # the ~20M cases
UNTIED = TINY_MODEL.replace("num_key_value_heads: 2 }", "num_key_value_heads: 2 tie_word_embeddings: false }")


def compare_streamed(sb, cases, prefix, where="", **defaults):
    """Each case (train()'s arguments over `defaults`; `cluster` defaults
    to PS, `stream` is added to it) with and without stream_weights: the
    same metrics and final checkpoint. A case marked long=True runs with
    --long only (another case covers what it adds in CI)."""
    for i, (case, kw) in enumerate(cases.items()):
        kw = {**defaults, **kw}
        if kw.pop("long", False) and not herdtest.LONG:
            continue
        cluster = kw.pop("cluster", PS)
        stream = kw.pop("stream", "")
        whole = train(sb, f"{prefix}{i}_whole", cluster, **kw)
        streamed = train(sb, f"{prefix}{i}_streamed", cluster + " stream_weights: true" + stream, **kw)
        rows, state = whole
        assert len(rows) == kw.get("steps", 20)
        assert streamed[0] == rows, f"{case}: streamed differs:\n{streamed[0]}\n{rows}"
        assert streamed[1] == state, f"{case}: the streamed run's final checkpoint differs"
        print(f"ok  {case}: {len(rows)} steps streamed{where} equal the unstreamed run bit for bit "
              f"(loss {rows[0][1]:.4f} -> {rows[-1][1]:.4f})", flush=True)


def equivalence(sb):
    compare_streamed(sb, {
        "tiny, fp32 wire, evaluation": dict(eval_every=5),
        "tiny, bf16 wire": dict(cluster=PS + " wire_dtype: BF16"),
        "tiny, grad_accum 2": dict(train_extra="grad_accum: 2", long=True),
        "tiny, clip_norm 0 (servers step buckets as they complete)": dict(optimizer="clip_norm: 0"),
        "tiny, untied embeddings": dict(model=UNTIED, long=True),
        "tiny, untied, grad_accum 3 (one layer-major pass)": dict(model=UNTIED, train_extra="grad_accum: 3"),
        "tiny, no prefetch": dict(stream=" stream_prefetch_layers: 0", long=True),
        "tiny, prefetch 2, buckets of 16 KiB": dict(cluster=PS + " bucket_mb: 0.015625",
                                                    stream=" stream_prefetch_layers: 2"),
        # Every step streams the same way: a few show it at this size.
        "~20M, FULL recompute": dict(model=M20, train_extra="recompute: FULL", seq_len=64, steps=M20_STEPS),
    }, "c")


def measure(sb, name, model, train_line, cluster, device=""):
    """Runs the job; its plan, {(role, rank): (peak RSS, planned process,
    run summary)} and its metrics."""
    config = f"""
{model}
train {{ {train_line} }}
optimizer {{ lr: 1e-3 warmup_steps: 0 }}
data {{ train: "train.bin" }}
log {{ every: 1 sample_tokens: 0 summary_dir: "{name}" metrics: "{name}/metrics.jsonl" }}
cluster {{ {cluster} }}
{device}
"""
    cfg = sb.write(f"{name}.textproto", config)
    plan = json.loads(sb.run("plan", cfg, "--json").stdout)
    sb.run("launch", cfg)
    measured = {}
    for proc in plan["processes"]:
        name_ = f"{proc['role']}_{max(proc['rank'], 0):05d}.json"  # the plan's worker is every worker (-1)
        with open(sb.path(name, name_)) as f:
            summary = json.load(f)
            measured[(proc["role"], proc["rank"])] = (summary["peak_rss_bytes"], proc, summary)
    return plan, measured, herdtest.metrics_rows(sb.path(name, "metrics.jsonl"))


def memory(sb):
    train_line = "steps: 2 batch_size: 8 seq_len: 256 seed: 7 recompute: FULL"
    ps = "sync: PARAMETER_SERVER servers: 1 workers: 1"
    whole = json.loads(sb.run("plan", sb.write("whole.textproto", f"{M20}\ntrain {{ {train_line} }}\n"
                                               f"data {{ train: \"train.bin\" }}\ncluster {{ {ps} }}\n"),
                              "--json").stdout)
    plan, measured, _ = measure(sb, "mem", M20, train_line, ps + " stream_weights: true")
    report = []
    for (role, _), (peak, proc, _) in measured.items():
        report.append(f"{role} {peak / 2**20:.0f}/{proc['total'] / 2**20:.0f} MiB")
        assert 0.9 <= peak / proc["total"] <= 1.1, f"{role}: measured {peak}, planned {proc['total']}"
    # Two micro-batches in one layer-major pass (untied): two slots of
    # activations, the window as with one.
    _, accum, _ = measure(sb, "mem_accum", M20.replace("true", "false"), train_line + " grad_accum: 2",
                          ps + " stream_weights: true")
    for (role, _), (peak, proc, _) in accum.items():
        report.append(f"{role} (grad_accum 2, untied) {peak / 2**20:.0f}/{proc['total'] / 2**20:.0f} MiB")
        assert 0.9 <= peak / proc["total"] <= 1.1, f"grad_accum 2: {role}: measured {peak}, planned {proc['total']}"
    worker = [p for p in plan["processes"] if p["role"] == "worker"][0]
    unstreamed = [p for p in whole["processes"] if p["role"] == "worker"][0]
    assert worker["weights"] < unstreamed["weights"] / 2, (worker, unstreamed)
    # Accumulating micro-batches: one layer-major pass (untied) keeps no
    # gradient whole; tied embeddings take the micro-batches in turn.
    for tied, whole_grads in (("false", False), ("true", True)):
        p = json.loads(sb.run("plan", sb.write("accum.textproto", f"{M20.replace('true', tied)}\ntrain {{ {train_line} "
                                               f"grad_accum: 4 }}\ndata {{ train: \"train.bin\" }}\n"
                                               f"cluster {{ {ps} stream_weights: true }}\n"), "--json").stdout)
        w = [x for x in p["processes"] if x["role"] == "worker"][0]
        assert (w["gradients"] >= unstreamed["gradients"]) == whole_grads, (tied, w, unstreamed)
    print(f"ok  ~20M streamed, FULL: measured/planned {', '.join(report)}; the worker's weights "
          f"{worker['weights'] / 2**20:.1f} MiB of {unstreamed['weights'] / 2**20:.1f}", flush=True)


def bigger_than_a_worker(sb):
    # ~180M parameters (720 MB of fp32 weights, 2.9 GB of server state over
    # two servers); the worker holds one layer at a time.
    model = ("model { vocab_size: 256 hidden_size: 1024 intermediate_size: 2816 num_hidden_layers: 16 "
             "num_attention_heads: 16 num_key_value_heads: 4 }")
    plan, measured, rows = measure(sb, "big", model, "steps: 3 batch_size: 1 seq_len: 64 seed: 7 recompute: FULL",
                                   "sync: PARAMETER_SERVER servers: 2 workers: 1 stream_weights: true "
                                   "stream_prefetch_layers: 0")
    weights = plan["parameters"] * 4
    peak, proc, _ = measured[("worker", -1)]
    assert weights > 3 * peak, f"fp32 weights {weights}, worker peak {peak}"
    for (role, _), (p, pr, _) in measured.items():
        assert 0.9 <= p / pr["total"] <= 1.1, f"{role}: measured {p}, planned {pr['total']}"
    losses = [r["loss"] for r in rows]
    assert len(losses) == 3 and losses[-1] < losses[0], losses
    print(f"ok  {plan['parameters'] / 1e6:.0f}M parameters ({weights / 2**20:.0f} MiB of fp32 weights) trained by a "
          f"worker peaking at {peak / 2**20:.0f} MiB (planned {proc['total'] / 2**20:.0f}); loss "
          + " -> ".join(f"{x:.3f}" for x in losses), flush=True)


def refusals(sb):
    for name, cluster, device, field in [
        ("elastic", "sync: PARAMETER_SERVER servers: 1 workers: 2 elastic: true stream_weights: true", "",
         "cluster.elastic"),
        ("ddp", "sync: ALLREDUCE workers: 2 stream_weights: true", "", "PARAMETER_SERVER"),
    ]:
        cfg = sb.write(f"refuse_{name}.textproto", herdtest.tiny_config("train.bin", extra=f"cluster {{ {cluster} }}\n{device}"))
        r = sb.run("launch", cfg, check=False)
        assert r.returncode != 0 and "cluster.stream_weights" in r.stderr and field in r.stderr, (name, r.stderr)
    print("ok  refused: elastic jobs, all-reduce", flush=True)


def main():
    a = herdtest.parse_args()
    sb = herdtest.Sandbox(a.build)
    sb.training_data()
    sb.run("prepare", "corpus.txt", "--out", "val.bin")
    refusals(sb)
    equivalence(sb)
    memory(sb)
    bigger_than_a_worker(sb)
    shutil.rmtree(sb.dir)


if __name__ == "__main__":
    main()
