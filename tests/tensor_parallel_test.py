"""Tensor parallelism (cluster.tensor_parallel) in all-reduce mode,
through `herd launch`, against one process on the same global batch, on
the tiny model (tied, clipped), 30 steps. "Within" is every step's loss
within 1e-6 relative and its gradient norm within 1e-3
(herdtest.steps_within: the row-parallel products and the cross-entropy
add their parts in another order, so not bitwise):

* T = 2 (and T = 4 with as many key/value heads as heads): within one
  process; a rerun bitwise the same; the sample drawn through the ranks
  (each rank's columns of the last position's logits gathered) one
  process's text;
* T = 2 with sequence parallelism (the prompt's odd lengths split
  unevenly while sampling) within one process, its sample one process's
  text too;
* data x tensor 2 x 2, without and with sequence parallelism: within DDP
  with two workers;
* the held-out loss through the ranks within 1e-6 of one process's;
* stop at step 15 and --resume: bitwise the straight run; the checkpoint
  (each rank's slices as pieces of the flat space) goes on as one process
  within the straight tensor-parallel run, and one process's checkpoint
  goes on at T = 2 within one process;
* bad inputs, one line each before any process starts: T not dividing
  the workers, the heads or the vocabulary; sequence parallelism without
  tensor parallelism;
* a rank killed mid-run stops the job in one line naming it and its
  place ("worker 1 (tensor rank 1 of replica 0) failed")."""
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

    def job(name, cluster="", every=0, ckpt=None, eval_every=0, kv=2, vocab=256, sample=0):
        text = herdtest.tiny_config("train.bin", val="val.bin" if eval_every else "", steps=STEPS, ckpt=ckpt or name,
                                    every=every, metrics=name + ".jsonl", extra=cluster, eval_every=eval_every)
        text = text.replace("sample_tokens: 0", f"sample_tokens: {sample}")
        text = text.replace("num_key_value_heads: 2", f"num_key_value_heads: {kv}")
        text = text.replace("vocab_size: 256", f"vocab_size: {vocab}")
        text = text.replace("batch_size: 4", "batch_size: 2 grad_accum: 2")
        return sb.write(name + ".textproto", text)

    def tp(workers, T, sp=False):
        return (f"cluster {{ sync: ALLREDUCE workers: {workers} tensor_parallel: {T} "
                f"sequence_parallel: {'true' if sp else 'false'} }}")

    def losses(name, key="loss"):
        return [m.get(key) for m in metrics(sb.path(name + ".jsonl"))]

    def steps(name):
        return metrics(sb.path(name + ".jsonl"))

    one_sample = herdtest.sample_text(sb.run("launch", job("one", sample=40)))
    t2_sample = herdtest.sample_text(sb.run("launch", job("t2", tp(2, 2), sample=40)))
    w2 = herdtest.steps_within(steps("t2"), steps("one"), "T=2")
    again = herdtest.sample_text(sb.run("launch", job("t2_again", tp(2, 2), sample=40)))
    assert herdtest.trajectory(steps("t2_again")) == herdtest.trajectory(steps("t2")) and again == t2_sample, \
        "T=2 rerun"
    assert len(t2_sample.splitlines()) > 1, f"no sample through the ranks: {t2_sample!r}"
    assert t2_sample == one_sample, f"T=2 sampled {t2_sample!r}, one process {one_sample!r}"
    sp_sample = herdtest.sample_text(sb.run("launch", job("t2sp", tp(2, 2, sp=True), sample=40)))
    wsp = herdtest.steps_within(steps("t2sp"), steps("one"), "T=2 with sequence parallelism")
    assert sp_sample == one_sample, f"T=2 with sequence parallelism sampled {sp_sample!r}, one process {one_sample!r}"
    sb.run("launch", job("one_kv4", kv=4))
    sb.run("launch", job("t4", tp(4, 4), kv=4))
    w4 = herdtest.steps_within(steps("t4"), steps("one_kv4"), "T=4")
    sb.run("launch", job("ddp2", "cluster { sync: ALLREDUCE workers: 2 }"))
    sb.run("launch", job("d2t2", tp(4, 2)))
    w22 = herdtest.steps_within(steps("d2t2"), steps("ddp2"), "2 x 2")
    sb.run("launch", job("d2t2sp", tp(4, 2, sp=True)))
    w22sp = herdtest.steps_within(steps("d2t2sp"), steps("ddp2"), "2 x 2 with sequence parallelism")
    print(f"losses (gradient norms): T=2 within {w2:.2g} of one process over {STEPS} steps (a rerun bitwise; its "
          f"sample one process's text), T=4 within {w4:.2g}, data x tensor 2 x 2 within {w22:.2g} of DDP with 2 "
          f"workers ({w22sp:.2g} with sequence parallelism); T=2 with sequence parallelism within {wsp:.2g} (its "
          f"sample one process's text too)")

    sb.run("launch", job("one_eval", eval_every=10))
    sb.run("launch", job("t2_eval", tp(2, 2), eval_every=10))
    vals = [v for v in losses("t2_eval", "val_loss") if v is not None]
    expected = [v for v in losses("one_eval", "val_loss") if v is not None]
    we = herdtest.within(vals, expected, "held-out loss", herdtest.STEP_TOLERANCE)
    print(f"held-out loss through the ranks within {we:.2g} of one process's")

    sb.run("launch", job("stop", tp(2, 2), every=15), "--stop-at", "15")
    sb.run("launch", job("stop", tp(2, 2), every=15), "--resume")
    assert herdtest.trajectory(steps("stop")) == herdtest.trajectory(steps("t2")), "T=2 stopped at 15 and resumed"
    herdtest.resume_from(sb, "one_from", job("one_from", every=15), "stop/step_00000015")
    wr1 = herdtest.steps_within(steps("one_from"), steps("t2")[15:], "T=2's checkpoint as one process")
    sb.run("launch", job("one_stop", every=15), "--stop-at", "15")
    herdtest.resume_from(sb, "t2_from", job("t2_from", tp(2, 2), every=15), "one_stop/step_00000015")
    wr2 = herdtest.steps_within(steps("t2_from"), steps("one")[15:], "one process's checkpoint at T=2")
    print(f"T=2 resumed at step 15 bitwise; its checkpoint as one process within {wr1:.2g}, one process's at T=2 "
          f"within {wr2:.2g}")

    bad = [("three", tp(3, 2), {}, "does not divide cluster.workers"),
           ("sp_alone", "cluster { sync: ALLREDUCE workers: 2 sequence_parallel: true }", {},
            "cluster.sequence_parallel"),
           ("heads", tp(3, 3), {}, "model.num_attention_heads"),
           ("vocab", tp(2, 2), {"vocab": 257}, "model.vocab_size")]
    herdtest.refused_before_start(sb, [(name, job(name, cluster, **more), says) for name, cluster, more, says in bad])
    print("bad inputs: one line each, nothing started")

    # A rank killed mid-run: the job stops, naming it, with its exit code.
    stopped = kill_mid_run(sb, "worker", 1, tag="_tp", place=" (tensor rank 1 of replica 0)",
                           cluster="cluster { sync: ALLREDUCE workers: 2 tensor_parallel: 2 heartbeat_timeout_s: 5 }")
    print(f"a tensor-parallel rank killed with -9: the job stopped in {stopped:.2f} s, naming it")


if __name__ == "__main__":
    main()
