"""Context parallelism on CUDA workers, on the emulated device (fp32) with
its multi-rank NCCL, against one CPU process on the same global batch
(tests/herdtest.py's tiny job, 32 tokens a sequence, 20 steps): each rank's
CudaLlamaModel computes its two chunks of every sequence (torchtitan's
load balance), its attention against the group's keys and values gathered
on the device (their gradients' sums reduce-scattered back), its queries
at their positions (model/cuda/kernels.h).

* context 2 in all-reduce mode: every step's loss within 1e-4 relative of
  one CPU process and the gradient norm within herdtest.NORM_TOLERANCE,
  its held-out loss too, and its sample (the prompt padded to whole
  chunks, the last row gathered from the rank that holds it) one
  process's text;
* the same with cluster.nccl false (the gathers staged through the host's
  ring) bitwise equal to it;
* context 4, and data x context 2 x 2, within 1e-4 of one process;
* a rerun bitwise equal, `--stop-at` + `--resume` bitwise equal to the
  straight run, and its checkpoint resumed by one CPU process within 1e-4
  of the run it continues;
* kill -9 of a context rank stops the job in one line naming it.

The emulated device is exact but slow; the real build skips (exit 77)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import herdtest  # noqa: E402
from ps_failure_test import kill_mid_run  # noqa: E402

STEPS = 20
CUDA = "device { kind: CUDA dtype: FP32 }"


def main():
    sb = herdtest.emulated_sandbox(herdtest.parse_args())

    def run(name, cluster, device=CUDA, ckpt="", extra=(), batch=4, watch=False):
        """The tiny job, train.batch_size `batch` a worker (herdtest.launch_watched)."""
        return herdtest.launch_watched(sb, name, device + "\n" + cluster, STEPS, ckpt, extra, watch=watch,
                                       edit=lambda text: text.replace("batch_size: 4", f"batch_size: {batch}"))

    launched, one = run("one", "", device="", ckpt="one", watch=True)
    one_sample = herdtest.sample_text(launched)
    report = []
    cp2 = "cluster { sync: ALLREDUCE workers: 2 context_parallel: 2 }"
    p, rows = run("cp2", cp2, ckpt="cp2", watch=True)
    assert "cuda:0" in p.stdout, p.stdout
    report.append(f"context 2 {herdtest.steps_within(rows, one, 'context 2 on CUDA workers', tolerance=1e-4):.2g}")
    held_out = herdtest.within(herdtest.val_losses(rows), herdtest.val_losses(one), "context 2's held-out loss", 1e-4)
    report.append(f"held-out {held_out:.2g}")
    sample = herdtest.sample_text(p)
    assert len(sample.splitlines()) > 1 and sample == one_sample, \
        f"context 2 on CUDA workers sampled {sample!r}, one process {one_sample!r}"
    straight = herdtest.trajectory(rows)

    _, staged = run("cp2_staged", "cluster { sync: ALLREDUCE workers: 2 context_parallel: 2 nccl: false }",
                    watch=True)
    assert herdtest.trajectory(staged) == straight, "the staged gathers differ from NCCL's"
    for name, cluster, batch in (("cp4", "cluster { sync: ALLREDUCE workers: 4 context_parallel: 4 }", 4),
                                 ("cp2x2", "cluster { sync: ALLREDUCE workers: 4 context_parallel: 2 }", 2)):
        _, rows = run(name, cluster, batch=batch)
        report.append(f"{name} {herdtest.steps_within(rows, one, name + ' on CUDA workers', tolerance=1e-4):.2g}")

    _, again = run("cp2_again", cp2, watch=True)
    assert herdtest.trajectory(again) == straight, "a rerun of context 2 on CUDA workers differs"
    run("split", cp2, ckpt="split", extra=("--stop-at", "10"), watch=True)
    p, resumed = run("split", cp2, ckpt="split", extra=("--resume",), watch=True)
    assert "resumed from" in p.stdout, p.stdout
    assert herdtest.trajectory(resumed) == straight, "stop at 10 and --resume of context 2 differs"
    text = herdtest.tiny_config("train.bin", steps=STEPS, metrics="cp2_to_cpu.jsonl", ckpt="cp2_to_cpu", every=10)
    herdtest.resume_from(sb, "cp2_to_cpu", sb.write("cp2_to_cpu.textproto", text), "cp2/step_00000010")
    gap = herdtest.steps_within(herdtest.metrics_rows(sb.path("cp2_to_cpu.jsonl")),
                                herdtest.metrics_rows(sb.path("cp2.jsonl"))[10:],
                                "the CUDA context group's checkpoint on one CPU process", tolerance=1e-4)
    report.append(f"cp2->cpu {gap:.2g}")

    stopped_in = kill_mid_run(sb, "worker", 1, "cluster { sync: ALLREDUCE workers: 2 context_parallel: 2 "
                                               "heartbeat_timeout_s: 5 } " + CUDA, tag="_cp",
                              place=" (context rank 1 of replica 0)")
    report.append(f"kill -9 of a context rank stopped the job in {stopped_in:.1f} s")
    print("gpu_context: " + ", ".join(report))
    print("gpu_context: ok")


if __name__ == "__main__":
    main()
