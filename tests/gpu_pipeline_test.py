"""Pipeline stages on CUDA workers, on the emulated device (fp32), against
one CPU process with the same micro-batches (train.grad_accum 4 of 2
sequences) on a 4-layer tiny model, 20 steps: each stage's CUDA model
holds its units of the flat space on the device (model/cuda/
stage_model.h), its activations and their gradients staged through host
memory over the pipeline's wire.

* pipeline 2 under GPipe, 1F1B, interleaved 1F1B (two virtual stages
  each) and zero bubble (ZB-H1: each backward split into its input and
  weight parts), tied embeddings and clipping: every step's loss within 1e-4
  relative of one CPU process, the gradient norm within
  herdtest.NORM_TOLERANCE, the held-out loss too and the sample one
  process's text (the last stage's logits sent to the others); GPipe and
  zero bubble bitwise 1F1B (every chunk takes its micro-batches'
  backwards in ascending order);
* the grid data x pipeline x tensor 2 x 2 x 2 on CUDA workers (8 processes;
  the tensor groups' sums on the device through NCCL) within 1e-4 of one
  CPU process, and pipeline 2 on parameter servers;
* a rerun bitwise equal, `--stop-at` + `--resume` bitwise equal to the
  straight run, and checkpoints across devices: the CUDA stages' resumed
  by one CPU process, one CPU process's by the CUDA stages, each within
  1e-4 of the run it continues;
* kill -9 of a stage's worker stops the job in one line naming it.

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

    def four_layers(text):
        return text.replace("num_hidden_layers: 2", "num_hidden_layers: 4")

    def run(name, cluster, device=CUDA, ckpt="", extra=(), batch=2, watch=False):
        """The tiny job on 4 layers, 4 micro-batches of `batch` sequences a
        replica (herdtest.launch_watched)."""
        return herdtest.launch_watched(
            sb, name, device + "\n" + cluster, STEPS, ckpt, extra, watch=watch,
            edit=lambda text: four_layers(text.replace("batch_size: 4", f"batch_size: {batch} grad_accum: 4")))

    val_losses = herdtest.val_losses

    launched, one = run("one", "", device="", ckpt="one", watch=True)
    one_sample = herdtest.sample_text(launched)
    report = []

    def pipeline(schedule, more=""):
        return f"cluster {{ sync: ALLREDUCE workers: 2 pipeline_stages: 2 pipeline_schedule: {schedule} {more} }}"

    p, rows = run("pp2", pipeline("ONE_F_ONE_B"), ckpt="pp2", watch=True)
    assert "cuda:0" in p.stdout and "pipeline stage" in p.stdout, p.stdout
    report.append(f"1F1B {herdtest.steps_within(rows, one, 'pipeline 2 (1F1B) on CUDA', tolerance=1e-4):.2g}")
    held_out = herdtest.within(val_losses(rows), val_losses(one), "pipeline 2's held-out loss", 1e-4)
    report.append(f"held-out {held_out:.2g}")
    sample = herdtest.sample_text(p)
    assert len(sample.splitlines()) > 1 and sample == one_sample, \
        f"pipeline 2 on CUDA workers sampled {sample!r}, one process {one_sample!r}"
    straight = herdtest.trajectory(rows)
    for name, cluster in (("gpipe", pipeline("GPIPE")), ("zero_bubble", pipeline("ZERO_BUBBLE")),
                          ("interleaved", pipeline("INTERLEAVED_1F1B", "virtual_stages: 2")),
                          ("pp2_ps", "cluster { sync: PARAMETER_SERVER servers: 1 workers: 2 pipeline_stages: 2 }")):
        _, rows = run(name, cluster)
        report.append(f"{name} {herdtest.steps_within(rows, one, name + ' on CUDA', tolerance=1e-4):.2g}")
        if name in ("gpipe", "zero_bubble"):
            # Each chunk takes its micro-batches' backwards in ascending
            # order under every schedule: the same sums, bit for bit.
            assert herdtest.trajectory(rows) == straight, f"{name} on CUDA stages differs from 1F1B"

    # The grid: 2 replicas of 2 stages of 2 tensor ranks, one sequence a
    # replica's micro-batch.
    _, rows = run("grid", "cluster { sync: ALLREDUCE workers: 8 pipeline_stages: 2 tensor_parallel: 2 }", batch=1)
    report.append(f"data x pipeline x tensor 2x2x2 {herdtest.steps_within(rows, one, 'the grid', tolerance=1e-4):.2g}")

    # Reruns and resumes, bitwise; the stages' checkpoint on one CPU process.
    _, again = run("pp2_again", pipeline("ONE_F_ONE_B"), watch=True)
    assert herdtest.trajectory(again) == straight, "a rerun of pipeline 2 on CUDA workers differs"
    run("split", pipeline("ONE_F_ONE_B"), ckpt="split", extra=("--stop-at", "10"), watch=True)
    p, resumed = run("split", pipeline("ONE_F_ONE_B"), ckpt="split", extra=("--resume",), watch=True)
    assert "resumed from" in p.stdout, p.stdout
    assert herdtest.trajectory(resumed) == straight, "stop at 10 and --resume of pipeline 2 differs"
    text = four_layers(herdtest.tiny_config("train.bin", steps=STEPS, metrics="pp2_to_cpu.jsonl", ckpt="pp2_to_cpu",
                                            every=10).replace("batch_size: 4", "batch_size: 2 grad_accum: 4"))
    herdtest.resume_from(sb, "pp2_to_cpu", sb.write("pp2_to_cpu.textproto", text), "pp2/step_00000010")
    gap = herdtest.steps_within(herdtest.metrics_rows(sb.path("pp2_to_cpu.jsonl")),
                                herdtest.metrics_rows(sb.path("pp2.jsonl"))[10:],
                                "the CUDA stages' checkpoint on one CPU process", tolerance=1e-4)
    report.append(f"pp2->cpu {gap:.2g}")
    # And one CPU process's checkpoint on the CUDA stages.
    text = four_layers(herdtest.tiny_config("train.bin", steps=STEPS, metrics="cpu_to_pp2.jsonl", ckpt="cpu_to_pp2",
                                            every=10, extra=CUDA + "\n" + pipeline("ONE_F_ONE_B"))
                       .replace("batch_size: 4", "batch_size: 2 grad_accum: 4"))
    herdtest.resume_from(sb, "cpu_to_pp2", sb.write("cpu_to_pp2.textproto", text), "one/step_00000010")
    gap = herdtest.steps_within(herdtest.metrics_rows(sb.path("cpu_to_pp2.jsonl")), one[10:],
                                "one CPU process's checkpoint on the CUDA stages", tolerance=1e-4)
    report.append(f"cpu->pp2 {gap:.2g}")

    stopped_in = kill_mid_run(sb, "worker", 1, "cluster { sync: ALLREDUCE workers: 2 pipeline_stages: 2 "
                                               "heartbeat_timeout_s: 5 } " + CUDA, tag="_pp",
                              place=" (pipeline stage 1 of replica 0)",
                              edit=lambda text: four_layers(text.replace("batch_size: 4", "batch_size: 2 grad_accum: 4")))
    report.append(f"kill -9 of a stage stopped the job in {stopped_in:.1f} s")
    print("gpu_pipeline: " + ", ".join(report))
    print("gpu_pipeline: ok")


if __name__ == "__main__":
    main()
