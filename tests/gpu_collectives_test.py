"""All-reduce mode over NCCL with several CUDA workers, on the emulated
device's multi-rank NCCL (transport/nccl_emulation.cc: the ranks are the
worker processes, meeting in shared memory), against DDP of CPU workers on
the same global batch (tests/herdtest.py's tiny job, fp32, 20 steps):

* DDP, ZeRO-1, -2 and -3 with 2 CUDA workers, the whole step on the
  device (ZeRO-3's weights gathered unit by unit from the owners' device
  slices), and hybrid sharding (ZeRO-1 in 2 groups of 2) with 4: every step's loss within 1e-4 relative of the
  CPU's and the gradient norm within 1e-3 (herdtest.NORM_TOLERANCE);
* DDP, ZeRO-1, -2 and -3 of the same W bitwise alike: the emulated NCCL
  adds the ranks in rank order in its all-reduce and its rooted reduces
  alike (real NCCL's ring and tree orders differ, so on a GPU they are
  within rounding instead);
* a rerun bitwise equal, and `--stop-at` + `--resume` bitwise equal to the
  straight run;
* cluster.offload_optimizer (the optimizer on the host, NCCL reducing on
  the device; ZeRO-3's window filled through host memory): DDP and ZeRO-3
  within 1e-4 of CPU DDP and bitwise alike;
* checkpoints across devices: the CUDA grid's (ZeRO-1, W=2) resumed by one
  CPU process, and one CPU process's by the CUDA grid, within 1e-4 of the
  run each continues;
* kill -9 of a worker mid-run stops the job in one line naming it (its
  peer waits in NCCL for it, and must not hang);
* --long: DDP, ZeRO-1, -2 and -3 with 4 workers as well.

The emulated device is exact but slow; the real build skips (exit 77):
NCCL refuses two ranks on one GPU."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import herdtest  # noqa: E402
from ps_failure_test import kill_mid_run  # noqa: E402

STEPS = 20


def main():
    sb = herdtest.emulated_sandbox(herdtest.parse_args())

    def run(name, cluster, device="device { kind: CUDA dtype: FP32 }", ckpt="", extra=()):
        """`herd launch` of the tiny job; train.batch_size is each worker's,
        so 4 workers take 2 sequences each: every job's global batch is 8."""
        text = herdtest.tiny_config("train.bin", steps=STEPS, metrics=name + ".jsonl", ckpt=ckpt,
                                    every=10 if ckpt else 0, extra=device + "\n" + cluster)
        if "workers: 4" in cluster:
            text = text.replace("batch_size: 4", "batch_size: 2")
        p = sb.run("launch", sb.write(name + ".textproto", text), *extra)
        return p, herdtest.metrics_rows(sb.path(name + ".jsonl"))

    _, cpu = run("cpu", "cluster { sync: ALLREDUCE workers: 2 }", device="")
    cases = [("ddp2", "workers: 2"), ("zero1_2", "workers: 2 zero_stage: 1"),
             ("zero2_2", "workers: 2 zero_stage: 2"), ("zero3_2", "workers: 2 zero_stage: 3"),
             ("hsdp4", "workers: 4 zero_stage: 1 shard_group_size: 2"),
             ("ddp_offload2", "workers: 2 offload_optimizer: true"),
             ("zero3_offload2", "workers: 2 zero_stage: 3 offload_optimizer: true")]
    if herdtest.LONG:
        cases += [("ddp4", "workers: 4"), ("zero1_4", "workers: 4 zero_stage: 1"),
                  ("zero2_4", "workers: 4 zero_stage: 2"), ("zero3_4", "workers: 4 zero_stage: 3")]
    rows, report = {}, []
    for name, cluster in cases:
        p, rows[name] = run(name, f"cluster {{ sync: ALLREDUCE {cluster} }}")
        offload = "offload_optimizer" in cluster
        assert ("the optimizer on the host" if offload else "weights and AdamW state on the device") in p.stdout, \
            p.stdout
        assert ("ZeRO-3 gathered" in p.stdout) == ("zero_stage: 3" in cluster and not offload), p.stdout
        assert ("streamed" in p.stdout) == ("zero_stage: 3" in cluster and offload), p.stdout
        gap = herdtest.steps_within(rows[name], cpu, name, tolerance=1e-4)
        report.append(f"{name} {gap:.2g}")
    trajectory = {name: herdtest.trajectory(r) for name, r in rows.items()}
    for w in ("2", "4") if herdtest.LONG else ("2",):
        for stage in ("zero1_", "zero2_", "zero3_"):
            assert trajectory[stage + w] == trajectory["ddp" + w], f"{stage}{w} differs from ddp{w} over NCCL"

    assert trajectory["zero3_offload2"] == trajectory["ddp_offload2"], "ZeRO-3 offloaded differs from DDP offloaded"

    # Reruns and resumes, bitwise.
    _, again = run("zero1_2_again", "cluster { sync: ALLREDUCE workers: 2 zero_stage: 1 }")
    assert herdtest.trajectory(again) == trajectory["zero1_2"], "a rerun over NCCL differs"
    split = "cluster { sync: ALLREDUCE workers: 2 zero_stage: 1 }"
    run("split", split, ckpt="split", extra=("--stop-at", "10"))
    p, resumed = run("split", split, ckpt="split", extra=("--resume",))
    assert "resumed from" in p.stdout, p.stdout
    assert herdtest.trajectory(resumed) == trajectory["zero1_2"], "stop at 10 and --resume over NCCL differs"
    # Checkpoints resume across devices: the CUDA grid's step 10 on one
    # CPU process, and one CPU process's step 10 on the CUDA grid, each
    # within the tolerance of the run it continues.
    one = ""
    _, cpu_one = run("cpu_one", one, device="", ckpt="cpu_one", extra=("--set", "train.batch_size=8"))
    herdtest.steps_within(cpu_one, cpu, "one CPU process against CPU DDP", tolerance=1e-4)
    text = herdtest.tiny_config("train.bin", steps=STEPS, metrics="grid_to_cpu.jsonl", ckpt="grid_to_cpu", every=10,
                                extra=one).replace("batch_size: 4", "batch_size: 8")
    herdtest.resume_from(sb, "grid_to_cpu", sb.write("grid_to_cpu.textproto", text), "split/step_00000010")
    gap = herdtest.steps_within(herdtest.metrics_rows(sb.path("grid_to_cpu.jsonl")), rows["zero1_2"][10:],
                                "the CUDA grid's checkpoint on one CPU process", tolerance=1e-4)
    report.append(f"grid->cpu {gap:.2g}")
    text = herdtest.tiny_config("train.bin", steps=STEPS, metrics="cpu_to_grid.jsonl", ckpt="cpu_to_grid", every=10,
                                extra="device { kind: CUDA dtype: FP32 }\n" + split)
    herdtest.resume_from(sb, "cpu_to_grid", sb.write("cpu_to_grid.textproto", text), "cpu_one/step_00000010")
    gap = herdtest.steps_within(herdtest.metrics_rows(sb.path("cpu_to_grid.jsonl")), cpu_one[10:],
                                "one CPU process's checkpoint on the CUDA grid", tolerance=1e-4)
    report.append(f"cpu->grid {gap:.2g}")
    # A worker killed mid-run: its peer, waiting in an NCCL collective for
    # it, must not hang; the job stops naming it.
    stopped_in = kill_mid_run(sb, "worker", 1, "cluster { sync: ALLREDUCE workers: 2 zero_stage: 1 "
                                               "heartbeat_timeout_s: 5 } device { kind: CUDA dtype: FP32 }")
    report.append(f"kill -9 of a worker stopped the job in {stopped_in:.1f} s")
    print("gpu_collectives: " + ", ".join(report))
    print("gpu_collectives: ok")


if __name__ == "__main__":
    main()
