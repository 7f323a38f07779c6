"""Tensor parallelism on CUDA workers, on the emulated device (fp32) with
its multi-rank NCCL (transport/nccl_emulation.cc), against one CPU process
on the same global batch (tests/herdtest.py's tiny job, 20 steps): each
rank's CudaLlamaModel computes its slices (sharding/tensor_slices.h) and
its group's sums (o_proj's and down_proj's outputs, the embedding's
lookup, the norms' and the head's input gradients, the vocabulary-parallel
cross-entropy's statistics) run on the device through NCCL.

* tensor 2 in all-reduce mode: every step's loss within 1e-4 relative of
  one CPU process and the gradient norm within herdtest.NORM_TOLERANCE,
  its held-out loss too, and its sample (the last position's logits
  gathered over the group on the device) one process's text;
* tensor 4 (a model of 4 KV heads), with sequence parallelism too, within
  1e-4 of one process;
* in bf16, tensor 2 within 1e-3 of one CUDA process in bf16 (its norm
  within 5e-2: bf16 gradients summed in other orders; the group's
  sums of bf16 activations);
* the same with cluster.nccl false (the group's sums staged through the
  host's ring) bitwise equal to it: two ranks' sums are one addition
  either way;
* tensor 2 with sequence parallelism (the norms and residual stream cut
  over the group's rows, its reduce-scatters and gathers on the device)
  within 1e-4 of one process, and staged bitwise equal to it;
* tensor 2 x data 2 (the replicas' gradients reduced by NCCL on the
  device), and tensor 2 in parameter-server mode, within 1e-4 of one
  process;
* a rerun bitwise equal, `--stop-at` + `--resume` bitwise equal to the
  straight run, and the CUDA group's checkpoint resumed by one CPU process
  within 1e-4 of the run it continues;
* kill -9 of a tensor rank stops the job in one line naming it (its peer
  waits in an NCCL sum for it, and must not hang).

The emulated device is exact but slow; the real build skips (exit 77):
NCCL refuses two ranks on one GPU."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import herdtest  # noqa: E402
from ps_failure_test import kill_mid_run  # noqa: E402

STEPS = 20
CUDA = "device { kind: CUDA dtype: FP32 }"


def main():
    sb = herdtest.emulated_sandbox(herdtest.parse_args())

    def run(name, cluster, device=CUDA, ckpt="", extra=(), batch=4, edit=lambda text: text, watch=False):
        """The tiny job, train.batch_size `batch` a worker (herdtest.launch_watched)."""
        return herdtest.launch_watched(sb, name, device + "\n" + cluster, STEPS, ckpt, extra, watch=watch,
                                       edit=lambda text: edit(text.replace("batch_size: 4", f"batch_size: {batch}")))

    val_losses = herdtest.val_losses

    launched, one = run("one", "", device="", ckpt="one", watch=True)
    one_sample = herdtest.sample_text(launched)
    report = []
    tp2 = "cluster { sync: ALLREDUCE workers: 2 tensor_parallel: 2 }"
    p, rows = run("tp2", tp2, ckpt="tp2", watch=True)
    assert "tensor parallel: 2 ranks" in p.stdout and "cuda:0" in p.stdout, p.stdout
    report.append(f"tensor 2 {herdtest.steps_within(rows, one, 'tensor 2 on CUDA workers', tolerance=1e-4):.2g}")
    held_out = herdtest.within(val_losses(rows), val_losses(one), "tensor 2's held-out loss", 1e-4)
    report.append(f"held-out {held_out:.2g}")
    sample = herdtest.sample_text(p)
    assert len(sample.splitlines()) > 1 and sample == one_sample, \
        f"tensor 2 on CUDA workers sampled {sample!r}, one process {one_sample!r}"
    straight = herdtest.trajectory(rows)

    _, staged = run("tp2_staged", "cluster { sync: ALLREDUCE workers: 2 tensor_parallel: 2 nccl: false }",
                    watch=True)
    assert herdtest.trajectory(staged) == straight, "the staged group sums differ from NCCL's"

    # Sequence parallelism: the norms' and residual's rows cut over the
    # group, reduce-scatters and gathers on the device.
    sp = "cluster { sync: ALLREDUCE workers: 2 tensor_parallel: 2 sequence_parallel: true%s }"
    _, rows = run("tp2_sp", sp % "")
    report.append(f"+ sequence {herdtest.steps_within(rows, one, 'tensor 2 + sequence', tolerance=1e-4):.2g}")
    _, staged = run("tp2_sp_staged", sp % " nccl: false")
    assert herdtest.trajectory(staged) == herdtest.trajectory(rows), "staged sequence-parallel collectives differ"

    kv4 = lambda text: text.replace("num_key_value_heads: 2", "num_key_value_heads: 4")  # noqa: E731
    _, one4 = run("one_kv4", "", device="", edit=kv4)
    _, rows = run("tp4", "cluster { sync: ALLREDUCE workers: 4 tensor_parallel: 4 }", edit=kv4)
    report.append(f"tensor 4 {herdtest.steps_within(rows, one4, 'tensor 4 on CUDA workers', tolerance=1e-4):.2g}")
    _, rows = run("tp4_sp", "cluster { sync: ALLREDUCE workers: 4 tensor_parallel: 4 sequence_parallel: true }",
                  edit=kv4)
    report.append(f"tensor 4 + sequence {herdtest.steps_within(rows, one4, 'tensor 4 + sequence', tolerance=1e-4):.2g}")

    bf16 = "device { kind: CUDA dtype: BF16 }"
    _, one_bf16 = run("one_bf16", "", device=bf16)
    _, rows = run("tp2_bf16", tp2, device=bf16)
    gap = herdtest.steps_within(rows, one_bf16, "tensor 2 in bf16", tolerance=1e-3, norm_tolerance=5e-2)
    report.append(f"tensor 2 bf16 {gap:.2g}")

    for name, cluster, batch in (
            ("tp2x2", "cluster { sync: ALLREDUCE workers: 4 tensor_parallel: 2 }", 2),
            ("tp2_ps", "cluster { sync: PARAMETER_SERVER servers: 1 workers: 2 tensor_parallel: 2 }", 4)):
        _, rows = run(name, cluster, batch=batch)
        report.append(f"{name} {herdtest.steps_within(rows, one, name + ' on CUDA workers', tolerance=1e-4):.2g}")

    # Reruns and resumes, bitwise; the group's checkpoint on one CPU process.
    _, again = run("tp2_again", tp2)
    assert herdtest.trajectory(again) == straight, "a rerun of tensor 2 on CUDA workers differs"
    run("split", tp2, ckpt="split", extra=("--stop-at", "10"))
    p, resumed = run("split", tp2, ckpt="split", extra=("--resume",))
    assert "resumed from" in p.stdout, p.stdout
    assert herdtest.trajectory(resumed) == straight, "stop at 10 and --resume of tensor 2 differs"
    text = herdtest.tiny_config("train.bin", steps=STEPS, metrics="tp2_to_cpu.jsonl", ckpt="tp2_to_cpu", every=10)
    herdtest.resume_from(sb, "tp2_to_cpu", sb.write("tp2_to_cpu.textproto", text), "tp2/step_00000010")
    gap = herdtest.steps_within(herdtest.metrics_rows(sb.path("tp2_to_cpu.jsonl")), rows_of(sb, "tp2")[10:],
                                "the CUDA tensor group's checkpoint on one CPU process", tolerance=1e-4)
    report.append(f"tp2->cpu {gap:.2g}")

    stopped_in = kill_mid_run(sb, "worker", 1, "cluster { sync: ALLREDUCE workers: 2 tensor_parallel: 2 "
                                               "heartbeat_timeout_s: 5 } " + CUDA, tag="_tp", place=" (tensor rank 1 of replica 0)")
    report.append(f"kill -9 of a tensor rank stopped the job in {stopped_in:.1f} s")
    print("gpu_tensor: " + ", ".join(report))
    print("gpu_tensor: ok")


def rows_of(sb, name):
    return herdtest.metrics_rows(sb.path(name + ".jsonl"))


if __name__ == "__main__":
    main()
