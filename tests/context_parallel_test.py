"""Context parallelism (cluster.context_parallel) in all-reduce mode,
through `herd launch`, against one process on the same global batch, on
the tiny model (tied, clipped, 32 tokens a sequence), 30 steps. "Within"
is every step's loss within 1e-6 relative and its gradient norm within
1e-3 (herdtest.steps_within: attention's rows and the gradients' sums add
their parts in another order, so not bitwise):

* C = 2 and C = 4: within one process; a rerun bitwise the same; the
  sample drawn through the ranks (the prompt padded to whole chunks, the
  last position's logits gathered from the rank that holds it) one
  process's text;
* data x context 2 x 2: within DDP with two workers, and with ZeRO-1 (the
  optimizer state sharded over all four) bitwise the same; the grids
  tensor x context 2 x 2 within one process, and data x tensor x context
  2 x 2 x 2 (eight workers) within DDP with two;
* the held-out loss through the ranks within 1e-6 of one process's, and
  through pipeline stages of context groups (pipeline x context 2 x 2),
  whose sample is one process's text too;
* stop at step 15 and --resume: bitwise the straight run; its checkpoint
  goes on as one process, and as tensor x context 2 x 2, within the
  straight run;
* bad inputs, one line each before any process starts: C not dividing the
  workers (or T x C not), 2C not dividing seq_len;
* a rank killed mid-run stops the job in one line naming it and its
  place ("worker 1 (context rank 1 of replica 0) failed").

With --long (HERD_TEST_LONG=1), the ~20M shape (d512, 8 layers, 128
tokens a sequence, 30 steps) too: T = 2, T = 2 with sequence parallelism,
T = 4, C = 2, C = 4 and data x tensor x context 2 x 2 x 2, each within
one process (or DDP with two workers)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import herdtest  # noqa: E402
from ps_equivalence_test import metrics  # noqa: E402
from ps_failure_test import kill_mid_run  # noqa: E402

STEPS = 30


def main():
    a = herdtest.parse_args()
    sb = herdtest.Sandbox(a.build)
    sb.training_data()
    sb.run("prepare", "corpus.txt", "--out", "val.bin")

    def job(name, cluster="", every=0, ckpt=None, eval_every=0, sample=0, seq=32):
        text = herdtest.tiny_config("train.bin", val="val.bin" if eval_every else "", steps=STEPS, ckpt=ckpt or name,
                                    every=every, metrics=name + ".jsonl", extra=cluster, eval_every=eval_every)
        text = text.replace("sample_tokens: 0", f"sample_tokens: {sample}")
        text = text.replace("batch_size: 4 seq_len: 32", f"batch_size: 2 grad_accum: 2 seq_len: {seq}")
        return sb.write(name + ".textproto", text)

    def cp(workers, C, more=""):
        return f"cluster {{ sync: ALLREDUCE workers: {workers} context_parallel: {C} {more} }}"

    def losses(name, key="loss"):
        return [m.get(key) for m in metrics(sb.path(name + ".jsonl"))]

    def steps(name):
        return metrics(sb.path(name + ".jsonl"))

    one_sample = herdtest.sample_text(sb.run("launch", job("one", sample=40)))
    c2_sample = herdtest.sample_text(sb.run("launch", job("c2", cp(2, 2), sample=40)))
    w2 = herdtest.steps_within(steps("c2"), steps("one"), "C=2")
    again = herdtest.sample_text(sb.run("launch", job("c2_again", cp(2, 2), sample=40)))
    assert herdtest.trajectory(steps("c2_again")) == herdtest.trajectory(steps("c2")) and again == c2_sample, \
        "C=2 rerun"
    assert len(c2_sample.splitlines()) > 1, f"no sample through the ranks: {c2_sample!r}"
    assert c2_sample == one_sample, f"C=2 sampled {c2_sample!r}, one process {one_sample!r}"
    sb.run("launch", job("c4", cp(4, 4)))
    w4 = herdtest.steps_within(steps("c4"), steps("one"), "C=4")
    sb.run("launch", job("ddp2", "cluster { sync: ALLREDUCE workers: 2 }"))
    sb.run("launch", job("d2c2", cp(4, 2)))
    w22 = herdtest.steps_within(steps("d2c2"), steps("ddp2"), "2 x 2")
    sb.run("launch", job("d2c2_zero1", cp(4, 2, "zero_stage: 1")))
    assert herdtest.trajectory(steps("d2c2_zero1")) == herdtest.trajectory(steps("d2c2")), \
        "data x context 2 x 2 with ZeRO-1 against without"
    sb.run("launch", job("t2c2", cp(4, 2, "tensor_parallel: 2")))
    wtc = herdtest.steps_within(steps("t2c2"), steps("one"), "tensor x context 2 x 2")
    sb.run("launch", job("d2t2c2", cp(8, 2, "tensor_parallel: 2")))
    wdtc = herdtest.steps_within(steps("d2t2c2"), steps("ddp2"), "data x tensor x context 2 x 2 x 2")
    print(f"losses (gradient norms): C=2 within {w2:.2g} of one process over {STEPS} steps (a rerun bitwise; its "
          f"sample one process's text), C=4 within {w4:.2g}, "
          f"data x context 2 x 2 within {w22:.2g} of DDP with 2 workers (with ZeRO-1 bitwise the same); "
          f"tensor x context 2 x 2 within {wtc:.2g} "
          f"of one process, data x tensor x context 2 x 2 x 2 within {wdtc:.2g} of DDP")

    sb.run("launch", job("one_eval", eval_every=10))
    sb.run("launch", job("c2_eval", cp(2, 2), eval_every=10))
    vals = [v for v in losses("c2_eval", "val_loss") if v is not None]
    expected = [v for v in losses("one_eval", "val_loss") if v is not None]
    we = herdtest.within(vals, expected, "held-out loss", herdtest.STEP_TOLERANCE)
    # Through pipeline stages of context groups: the last stage's group
    # averages the held-out loss and gathers a sampled row from the rank
    # that holds it; every stage has them.
    p2c2_sample = herdtest.sample_text(sb.run("launch", job("p2c2_eval", cp(4, 2, "pipeline_stages: 2"),
                                                            eval_every=10, sample=40)))
    assert p2c2_sample == one_sample, f"pipeline x context 2 x 2 sampled {p2c2_sample!r}, one process {one_sample!r}"
    vals = [v for v in losses("p2c2_eval", "val_loss") if v is not None]
    wpe = herdtest.within(vals, expected, "held-out loss through stages", herdtest.STEP_TOLERANCE)
    print(f"held-out loss through the ranks within {we:.2g} of one process's, through pipeline x context 2 x 2 "
          f"within {wpe:.2g} (its sample one process's text)")

    sb.run("launch", job("stop", cp(2, 2), every=15), "--stop-at", "15")
    sb.run("launch", job("stop", cp(2, 2), every=15), "--resume")
    assert herdtest.trajectory(steps("stop")) == herdtest.trajectory(steps("c2")), "C=2 stopped at 15 and resumed"
    herdtest.resume_from(sb, "one_from", job("one_from", every=15), "stop/step_00000015")
    wr = herdtest.steps_within(steps("one_from"), steps("c2")[15:], "C=2's checkpoint as one process")
    herdtest.resume_from(sb, "grid_from", job("grid_from", cp(4, 2, "tensor_parallel: 2"), every=15),
                         "stop/step_00000015")
    wg = herdtest.steps_within(steps("grid_from"), steps("c2")[15:], "C=2's checkpoint at tensor x context 2 x 2")
    print(f"C=2 resumed at step 15 bitwise; its checkpoint as one process within {wr:.2g}, at tensor x context "
          f"2 x 2 within {wg:.2g}")

    bad = [("three", cp(3, 2), {}, "does not divide cluster.workers"),
           ("chunks", cp(2, 2), {"seq": 30}, "train.seq_len"),
           ("grid", cp(6, 2, "tensor_parallel: 2"), {}, "2 x cluster.tensor_parallel 2 does not divide")]
    herdtest.refused_before_start(sb, [(name, job(name, cluster, **more), says) for name, cluster, more, says in bad])
    print("bad inputs: one line each, nothing started")

    stopped = kill_mid_run(sb, "worker", 1, tag="_cp", place=" (context rank 1 of replica 0)",
                           cluster="cluster { sync: ALLREDUCE workers: 2 context_parallel: 2 heartbeat_timeout_s: 5 }")
    print(f"a context-parallel rank killed with -9: the job stopped in {stopped:.2f} s, naming it")
    if herdtest.LONG:
        m20(sb)


def m20(sb):
    """The ~20M shape's grid against one process (or DDP with two workers)."""
    def ar(workers, more):
        return f"cluster {{ sync: ALLREDUCE workers: {workers} {more} }}"
    report = herdtest.m20_within(sb, STEPS, [
        ("T=2", ar(2, "tensor_parallel: 2"), "one"),
        ("T=2 + SP", ar(2, "tensor_parallel: 2 sequence_parallel: true"), "one"),
        ("T=4", ar(4, "tensor_parallel: 4"), "one"), ("C=2", ar(2, "context_parallel: 2"), "one"),
        ("C=4", ar(4, "context_parallel: 4"), "one"),
        ("data x tensor x context 2 x 2 x 2", ar(8, "tensor_parallel: 2 context_parallel: 2"), "ddp2")])
    print(f"~20M shape, {STEPS} steps: " + ", ".join(report))

if __name__ == "__main__":
    main()
