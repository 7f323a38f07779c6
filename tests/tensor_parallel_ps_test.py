"""Tensor parallelism (cluster.tensor_parallel) in parameter-server mode,
through `herd launch`, against one process (or DDP) on the same global
batch, on the tiny model (tied, clipped), 30 steps. The servers hold the
ranks' packed parts one after the other (sharding/tensor_slices.h's
TensorParallelSpace): each rank pushes and pulls its own part only.
"Within" is every step's loss within 1e-6 relative and its gradient norm
within 1e-3 (herdtest.steps_within: the row-parallel products and the
cross-entropy add their parts in another order, so not bitwise):

* T = 2 over 2 servers, and T = 4: within one process; a rerun bitwise
  the same;
* data x tensor 2 x 2 with sequence parallelism (the norms' gradients
  summed over the group before any bucket leaves) within DDP with two
  workers;
* T = 2 with per-tensor shards, small buckets and background checkpoints
  (each server's runs written as pieces of the flat space) within one
  process; stop at 15 and --resume bitwise the straight run; its
  checkpoint goes on as one process within the straight run, and one
  process's goes on at T = 2 within one process;
* bad inputs, one line each before any process starts: tensor parallelism
  in an elastic job;
* a rank killed mid-run stops the job in one line naming it and its
  place.

With --long (HERD_TEST_LONG=1), the ~20M shape (d512, 8 layers, 128
tokens a sequence, 30 steps) too: T = 2, T = 4 and data x tensor 2 x 2
with sequence parallelism on two servers, each within one process (or
DDP with two workers)."""
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

    def job(name, cluster="", every=0, kv=2, background=False):
        text = herdtest.tiny_config("train.bin", steps=STEPS, ckpt=name, every=every, metrics=name + ".jsonl",
                                    extra=cluster)
        text = text.replace("num_key_value_heads: 2", f"num_key_value_heads: {kv}")
        text = text.replace("batch_size: 4", "batch_size: 2 grad_accum: 2")
        if background:
            text = text.replace(f"every: {every}", f"every: {every} background: true")
        return sb.write(name + ".textproto", text)

    def ps(workers, T, sp=False, more=""):
        return (f"cluster {{ sync: PARAMETER_SERVER servers: 2 workers: {workers} tensor_parallel: {T} "
                f"sequence_parallel: {'true' if sp else 'false'} {more} }}")

    def steps(name):
        return metrics(sb.path(name + ".jsonl"))

    sb.run("launch", job("one"))
    sb.run("launch", job("t2", ps(2, 2)))
    w2 = herdtest.steps_within(steps("t2"), steps("one"), "T=2 on parameter servers")
    sb.run("launch", job("t2_again", ps(2, 2)))
    assert herdtest.trajectory(steps("t2_again")) == herdtest.trajectory(steps("t2")), \
        "T=2 on parameter servers, rerun"
    sb.run("launch", job("one_kv4", kv=4))
    sb.run("launch", job("t4", ps(4, 4), kv=4))
    w4 = herdtest.steps_within(steps("t4"), steps("one_kv4"), "T=4 on parameter servers")
    sb.run("launch", job("ddp2", "cluster { sync: ALLREDUCE workers: 2 }"))
    sb.run("launch", job("d2t2sp", ps(4, 2, sp=True)))
    w22 = herdtest.steps_within(steps("d2t2sp"), steps("ddp2"), "2 x 2 with sequence parallelism on parameter servers")
    print(f"on parameter servers, losses (gradient norms): T=2 within {w2:.2g} of one process over {STEPS} steps (a rerun bitwise), T=4 "
          f"within {w4:.2g}, data x tensor 2 x 2 with sequence parallelism within {w22:.2g} of DDP with 2 workers")

    small = ps(2, 2, more="shard_strategy: PER_TENSOR bucket_mb: 0.01")
    sb.run("launch", job("whole", small, every=15, background=True))
    ws = herdtest.steps_within(steps("whole"), steps("one"), "T=2 on per-tensor shards in small buckets")
    sb.run("launch", job("stop", small, every=15, background=True), "--stop-at", "15")
    sb.run("launch", job("stop", small, every=15, background=True), "--resume")
    assert herdtest.trajectory(steps("stop")) == herdtest.trajectory(steps("whole")), \
        "T=2 on parameter servers stopped at 15 and resumed"
    herdtest.resume_from(sb, "one_from", job("one_from"), "stop/step_00000015")
    wr1 = herdtest.steps_within(steps("one_from"), steps("whole")[15:], "T=2's servers' checkpoint as one process")
    sb.run("launch", job("one_stop", every=15), "--stop-at", "15")
    herdtest.resume_from(sb, "t2_from", job("t2_from", ps(2, 2)), "one_stop/step_00000015")
    wr2 = herdtest.steps_within(steps("t2_from"), steps("one")[15:], "one process's checkpoint at T=2 on servers")
    print(f"per-tensor shards in small buckets within {ws:.2g}; stopped at 15 and resumed bitwise; the servers' "
          f"checkpoint as one process within {wr1:.2g}, one process's at T=2 within {wr2:.2g}")

    bad = [("elastic", ps(2, 2, more="elastic: true"), "cluster.elastic")]
    herdtest.refused_before_start(sb, [(name, job(name, cluster), says) for name, cluster, says in bad])
    print("bad inputs: one line each, nothing started")

    stopped = kill_mid_run(sb, "worker", 1, tag="_tp_ps", place=" (tensor rank 1 of replica 0)",
                           cluster="cluster { sync: PARAMETER_SERVER servers: 1 workers: 2 tensor_parallel: 2 "
                                   "heartbeat_timeout_s: 5 }")
    print(f"a tensor-parallel rank killed with -9: the job stopped in {stopped:.2f} s, naming it")
    if herdtest.LONG:
        m20(sb)


def m20(sb):
    """The ~20M shape on parameter servers against one process (or DDP)."""
    def ps(workers, more):
        return f"cluster {{ sync: PARAMETER_SERVER servers: 2 workers: {workers} {more} }}"
    report = herdtest.m20_within(sb, STEPS, [
        ("T=2", ps(2, "tensor_parallel: 2"), "one"), ("T=4", ps(4, "tensor_parallel: 4"), "one"),
        ("data x tensor 2 x 2 + SP", ps(4, "tensor_parallel: 2 sequence_parallel: true"), "ddp2")])
    print(f"~20M shape on parameter servers, {STEPS} steps: " + ", ".join(report))

if __name__ == "__main__":
    main()
