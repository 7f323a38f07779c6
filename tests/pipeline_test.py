"""Pipeline stages (cluster.pipeline_stages) in all-reduce and
parameter-server mode, through `herd launch`, against one process with
the same micro-batches (train.grad_accum) on a 4-layer tiny model.
"Bitwise" is every step's loss bitwise and its gradient norm within
1e-12 relative (the same squares, summed in double stage by stage: in
another order); "within" the loss within 1e-6 and the norm within 1e-3
(herdtest.steps_within):

* untied embeddings without clipping: every step's loss bitwise one
  process's, for P = 2 (GPipe, 1F1B), P = 4 (1F1B), P = 2 with two
  virtual stages each (interleaved 1F1B), ZB-H1 (backward split into its
  input and weight parts) at P = 2 and 4, and on 8 layers P = 3 (GPipe,
  1F1B, 1F1B with recompute FULL): each stage accumulates its
  layers' gradients in the same order as one model, and the update does
  not depend on the norm, which is summed stage by stage;
* data x pipeline 2 x 2 (four workers): bitwise DDP's steps with two
  (tied and clipped: within), with ZeRO-1 inside the stages too
  (each stage's AdamW state sharded over its replicas), stopped and
  resumed, and its checkpoint on without ZeRO;
* over parameter servers (S=2), each stage pushing and pulling its own
  buckets: P = 2 (1F1B, GPipe, ZB-H1) and 4 bitwise one process (with
  bf16 on the wire, bitwise PS with one worker), 2 x 2 bitwise PS with two
  workers, tied and clipped within, a stop and --resume bitwise, and
  the servers' checkpoint on as an all-reduce pipeline;
  with streamed weights inside the stages (a window over each stage's
  buckets): ZB-H1 bitwise one process, tied and clipped bitwise the same
  stages holding their weights whole (--long: P = 4, interleaved, 2 x 2);
* with clipping, and with tied embeddings (their two parts added head
  part first on the first and the last stage): within (with --long also
  the ~20M shape at P = 2 and 4);
* stop at step 10 and --resume: bitwise the straight run; the pipeline's
  checkpoint (one file of pieces per stage) resumes as one process, and a
  4-stage one at 2 stages, also bitwise;
* the held-out loss (log.eval_every) through the stages: bitwise one
  process's, and the sample drawn at the end (the last stage sends the
  last position's logits to the others) one process's text;
* bad inputs, each one line and a non-zero exit before any process
  starts: stages not dividing the workers, more stages than layers, a
  split that is not increasing, virtual stages without the interleaved
  schedule, fewer micro-batches than stages for 1F1B, recomputation with
  the zero-bubble schedule."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import herdtest  # noqa: E402
from ps_equivalence_test import metrics  # noqa: E402

STEPS = 20


def main():
    a = herdtest.parse_args()
    sb = herdtest.Sandbox(a.build)
    sb.training_data()

    def job(name, cluster="", tied=False, clip=0.0, accum=4, steps=STEPS, every=0, layers=4, ckpt=None, train="",
            eval_every=0, sample=0):
        text = herdtest.tiny_config("train.bin", val="val.bin" if eval_every else "", steps=steps, ckpt=ckpt or name,
                                    every=every, metrics=name + ".jsonl", extra=cluster, eval_every=eval_every)
        text = text.replace("sample_tokens: 0", f"sample_tokens: {sample} sample_temperature: 0.8")
        text = text.replace("num_hidden_layers: 2", f"num_hidden_layers: {layers}" +
                            ("" if tied else " tie_word_embeddings: false"))
        text = text.replace("batch_size: 4", f"batch_size: 2 grad_accum: {accum} {train}")
        text = text.replace("clip_norm: 1.0", f"clip_norm: {clip}")
        return sb.write(name + ".textproto", text)

    def pipeline(stages, schedule="ONE_F_ONE_B", more=""):
        return (f"cluster {{ sync: ALLREDUCE workers: {stages} pipeline_stages: {stages} "
                f"pipeline_schedule: {schedule} {more} }}")

    def steps(name):
        return metrics(sb.path(name + ".jsonl"))

    def same(name, expected, what):
        """`name` took `expected`'s steps (metrics rows): the losses bitwise,
        the gradient norm, whose squares the stages sum in another order,
        to rounding."""
        got = [r["loss"] for r in steps(name)]
        want = [r["loss"] for r in expected]
        assert got == want, f"{what}: losses {got[:3]} vs {want[:3]}"
        herdtest.steps_within(steps(name), expected, what, norm_tolerance=1e-12)

    def close(name, other, what):
        return herdtest.steps_within(steps(name), steps(other), what)

    # Untied, no clipping: bitwise.
    # Each run ends with a sample drawn through the stages: one process's text.
    reference_sample = herdtest.sample_text(sb.run("launch", job("one", sample=40)))
    reference = steps("one")
    sb.run("launch", job("one_tied_ref", tied=True, clip=1.0))
    runs = [("gpipe_p2", pipeline(2, "GPIPE")), ("ofob_p2", pipeline(2)), ("ofob_p4", pipeline(4)),
            ("interleaved_p2v2", pipeline(2, "INTERLEAVED_1F1B", "virtual_stages: 2")),
            ("zb_p2", pipeline(2, "ZERO_BUBBLE")), ("zb_p4", pipeline(4, "ZERO_BUBBLE"))]
    for name, cluster in runs:
        text = herdtest.sample_text(sb.run("launch", job(name, cluster, sample=40)))
        same(name, reference, name)
        assert text == reference_sample, f"{name}: sampled {text!r}, one process {reference_sample!r}"
    # Evaluation through the stages: the held-out loss is one process's.
    sb.run("prepare", "corpus.txt", "--out", "val.bin")
    sb.run("launch", job("one_eval", eval_every=5))
    for name, cluster in [("eval_p2", pipeline(2)), ("eval_p2v2", pipeline(2, "INTERLEAVED_1F1B", "virtual_stages: 2")),
                          ("eval_ps_p2", "cluster { sync: PARAMETER_SERVER servers: 2 workers: 2 pipeline_stages: 2 }")]:
        sb.run("launch", job(name, cluster, eval_every=5))
        vals = [m.get("val_loss") for m in metrics(sb.path(name + ".jsonl"))]
        expected = [m.get("val_loss") for m in metrics(sb.path("one_eval.jsonl"))]
        assert any(v is not None for v in vals) and vals == expected, f"{name}: {vals} vs {expected}"
    print("held-out loss through 2 stages (1F1B, interleaved, over parameter servers) bitwise one process's")

    # Eight layers in three stages (3, 3, 2), and recomputation inside the
    # stages: the same kernels on the same inputs, the same bits.
    sb.run("launch", job("one8", layers=8))
    for name, cluster, train in [("gpipe_p3", pipeline(3, "GPIPE"), ""), ("ofob_p3", pipeline(3), ""),
                                 ("ofob_p3_full", pipeline(3), "recompute: FULL")]:
        sb.run("launch", job(name, cluster, layers=8, train=train))
        same(name, steps("one8"), name)
    print(f"untied, no clipping: GPipe, 1F1B (P=2, 3, 4), interleaved (P=2, v=2) and zero bubble (P=2, 4) bitwise one "
          f"process over {STEPS} steps on 4 and 8 layers, with recompute FULL too; each one's sample through the "
          f"stages one process's text")

    # Over parameter servers: each stage pushes and pulls its own buckets,
    # a bucket's sum is its stage's workers', in rank order.
    ps = "cluster { sync: PARAMETER_SERVER servers: 2 workers: %d pipeline_stages: %d %s }"
    for name, cluster in [("ps_p2", ps % (2, 2, "")), ("ps_p4", ps % (4, 4, "")),
                          ("ps_p2_gpipe", ps % (2, 2, "pipeline_schedule: GPIPE")),
                          ("ps_p2_zb", ps % (2, 2, "pipeline_schedule: ZERO_BUBBLE"))]:
        sb.run("launch", job(name, cluster))
        same(name, reference, name)
    # bf16 on the servers' wire: each stage's staging is its own buckets'.
    sb.run("launch", job("ps_w1_bf16", "cluster { sync: PARAMETER_SERVER servers: 2 workers: 1 wire_dtype: BF16 }"))
    sb.run("launch", job("ps_p2_bf16", ps % (2, 2, "wire_dtype: BF16")))
    same("ps_p2_bf16", steps("ps_w1_bf16"), "PS P=2 with bf16 on the wire against PS with one worker")
    sb.run("launch", job("ps_dp2_pp2", ps % (4, 2, "")))
    sb.run("launch", job("ps_w2", "cluster { sync: PARAMETER_SERVER servers: 2 workers: 2 }"))
    same("ps_dp2_pp2", steps("ps_w2"), "PS 2 x 2 against PS with 2 workers")
    sb.run("launch", job("ps_p2_tied", ps % (2, 2, ""), tied=True, clip=1.0))
    wps = close("ps_p2_tied", "one_tied_ref", "PS, tied, clipped, P=2")
    sb.run("launch", job("ps_stop", ps % (2, 2, ""), every=10), "--stop-at", "10")
    sb.run("launch", job("ps_stop", ps % (2, 2, ""), every=10), "--resume")
    same("ps_stop", reference, "PS P=2 stopped at 10 and resumed")
    # The servers' checkpoint goes on as an all-reduce pipeline of 4 stages.
    herdtest.resume_from(sb, "ar_from_ps", job("ar_from_ps", pipeline(4), every=10), "ps_stop/step_00000010")
    same("ar_from_ps", reference[10:], "PS P=2's step-10 checkpoint resumed as all-reduce P=4")
    print(f"over parameter servers: P=2 (1F1B, GPipe, zero bubble) and 4 bitwise one process, 2 x 2 bitwise PS with 2 workers, "
          f"tied and clipped within {wps:.2g}; stop at 10 and --resume bitwise, and on as all-reduce P=4 bitwise")

    # Streamed weights inside the stages: each stage's window over its own
    # buckets (small ones, no prefetch), the same bytes when read.
    streamed = "stream_weights: true stream_prefetch_layers: 0 bucket_mb: 0.004"
    zb_streamed = ps % (2, 2, streamed + " pipeline_schedule: ZERO_BUBBLE")
    text = herdtest.sample_text(sb.run("launch", job("ps_p2_stream_zb", zb_streamed, sample=40)))
    same("ps_p2_stream_zb", reference, "PS P=2 zero bubble, streamed weights")
    assert text == reference_sample, f"PS P=2 zero bubble, streamed weights: sampled {text!r}"
    sb.run("launch", job("ps_p2_stream_tied", ps % (2, 2, streamed), tied=True, clip=1.0))
    same("ps_p2_stream_tied", steps("ps_p2_tied"), "PS P=2 tied, clipped: streamed against whole stages")
    more = [("ps_p4_stream", ps % (4, 4, streamed)),
            ("ps_p2v2_stream", ps % (2, 2, streamed + " pipeline_schedule: INTERLEAVED_1F1B virtual_stages: 2")),
            ("ps_dp2_pp2_stream", ps % (4, 2, streamed))] if herdtest.LONG else []
    for name, cluster in more:
        sb.run("launch", job(name, cluster))
        same(name, steps("ps_w2") if "dp2" in name else reference, name)
    print("streamed weights inside the stages: zero bubble P=2 bitwise one process, tied and clipped bitwise the same "
          "stages holding their weights" + (", P=4, interleaved and 2 x 2 bitwise too" if more else ""))

    # Data x pipeline, 2 x 2: each stage's gradients all-reduced between its
    # two replicas, as DDP with two workers sums them: bitwise DDP's steps.
    sb.run("launch", job("ddp2", "cluster { sync: ALLREDUCE workers: 2 }"))
    sb.run("launch", job("dp2_pp2", pipeline(2).replace("workers: 2", "workers: 4")))
    same("dp2_pp2", steps("ddp2"), "2 x 2 against DDP with 2 workers")
    sb.run("launch", job("ddp2_tied", "cluster { sync: ALLREDUCE workers: 2 }", tied=True, clip=1.0))
    sb.run("launch", job("dp2_pp2_tied", pipeline(2).replace("workers: 2", "workers: 4"), tied=True, clip=1.0))
    w0 = close("dp2_pp2_tied", "ddp2_tied", "2 x 2 tied, clipped")
    # ZeRO-1 inside the stages: each stage's AdamW state sharded over its
    # two replicas, stopped, resumed, and its checkpoint on without ZeRO.
    zero = pipeline(2, more="zero_stage: 1").replace("workers: 2", "workers: 4")
    sb.run("launch", job("zero_pp2", zero, every=10), "--stop-at", "10")
    sb.run("launch", job("zero_pp2", zero, every=10), "--resume")
    same("zero_pp2", steps("ddp2"), "2 x 2 with ZeRO-1 in the stages, stopped and resumed, against DDP")
    herdtest.resume_from(sb, "from_zero", job("from_zero", pipeline(2).replace("workers: 2", "workers: 4"), every=10),
                         "zero_pp2/step_00000010")
    same("from_zero", steps("ddp2")[10:], "ZeRO-1 stages' checkpoint resumed without ZeRO")
    print(f"data x pipeline 2 x 2: bitwise DDP's steps with 2 workers, with ZeRO-1 in the stages too (stopped, "
          f"resumed, and its checkpoint on without ZeRO); tied and clipped within {w0:.2g}")

    # Clipping, and tied embeddings: within rounding.
    sb.run("launch", job("one_tied", tied=True, clip=1.0))
    sb.run("launch", job("p2_tied", pipeline(2), tied=True, clip=1.0))
    w1 = close("p2_tied", "one_tied", "tied, clipped, P=2")
    sb.run("launch", job("one_clip", clip=1.0))
    sb.run("launch", job("p4_clip", pipeline(4), clip=1.0))
    w2 = close("p4_clip", "one_clip", "untied, clipped, P=4")
    print(f"tied P=2 within {w1:.2g}, clipped P=4 within {w2:.2g} of one process")

    # Resume: a stop at 10 and --resume is the straight run, bitwise; the
    # pipeline's checkpoint goes on as one process.
    sb.run("launch", job("stop", pipeline(2), every=10), "--stop-at", "10")
    sb.run("launch", job("stop", pipeline(2), every=10), "--resume")
    same("stop", reference, "P=2 stopped at 10 and resumed")
    one_from = job("one_from", every=10)
    herdtest.resume_from(sb, "one_from", one_from, "stop/step_00000010")
    same("one_from", reference[10:], "P=2's step-10 checkpoint resumed as one process")
    # A 4-stage checkpoint goes on as 2 stages.
    sb.run("launch", job("p4_stop", pipeline(4), every=10), "--stop-at", "10")
    sb.run("launch", job("p2_from_p4", pipeline(2), every=10, ckpt="p4_stop"), "--resume")
    same("p2_from_p4", reference[10:], "P=4's step-10 checkpoint resumed at P=2")
    print("P=2 resumed at step 10 bitwise; its checkpoint resumed as one process, and P=4's at P=2, bitwise")

    if herdtest.LONG:
        # The ~20M shape (d512, 8 layers, tied), 10 steps: within.
        def big(name, cluster=""):
            text = job(name, cluster, tied=True, clip=1.0, steps=10)
            with open(text) as f:
                body = f.read()
            body = body.replace(herdtest.TINY_MODEL.replace("num_hidden_layers: 2", "num_hidden_layers: 4"),
                                herdtest.LLAMA20M_MODEL)
            return sb.write(name + ".textproto", body)
        sb.run("launch", big("one20m"))
        for P in (2, 4):
            sb.run("launch", big(f"p{P}_20m", pipeline(P)))
            w = close(f"p{P}_20m", "one20m", f"~20M, P={P}")
            print(f"~20M shape, P={P}: within {w:.2g} of one process")

    # Bad inputs: one line, before anything starts.
    bad = [
        ("three_of_four", pipeline(2).replace("workers: 2", "workers: 3"), "does not divide cluster.workers"),
        ("too_many", pipeline(8, "GPIPE"), "model has 4 layers"),
        ("split", pipeline(2, more='pipeline_split: "0,0"'), "not increasing"),
        ("virtual", pipeline(2, more="virtual_stages: 2"), "INTERLEAVED_1F1B"),
    ]
    for name, cluster, says in bad:
        p = sb.run("launch", job(name, cluster), check=False)
        err = p.stderr.strip().splitlines()
        assert p.returncode != 0 and any(says in line for line in err), f"{name}: {p.returncode} {p.stderr}"
        assert not os.path.exists(sb.path(name + ".jsonl")), f"{name}: a process started"
    p = sb.run("launch", job("few_micro", pipeline(4), accum=2), check=False)
    assert p.returncode != 0 and "grad_accum" in p.stderr, p.stderr
    p = sb.run("launch", job("zb_recompute", pipeline(2, "ZERO_BUBBLE"), train="recompute: FULL"), check=False)
    assert p.returncode != 0 and "ZERO_BUBBLE" in p.stderr and "recomput" in p.stderr, p.stderr
    print("bad inputs: one line each, nothing started")


if __name__ == "__main__":
    main()
