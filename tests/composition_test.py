"""Combinations of the parallel axes that the table of what is not built
(common/config.h's NotBuiltTable) no longer refuses, each through `herd
launch` on the tiny model (tied, clipped, 32 tokens a sequence, 2
micro-batches of 2 sequences a replica), 20 steps:

* within one process on the same global batch (batch 2 x the job's
  data-parallel replicas, 2 micro-batches): every step's loss within 1e-5
  relative, its gradient norm within herdtest.NORM_TOLERANCE (the parts
  are added in another order, so not bitwise);
* a rerun bitwise the same (every step's loss, norm and lr, and the last
  checkpoint's files);
* stopped at step 10 and --resume'd: bitwise the straight run;
* that checkpoint resumed by one process: within the straight run (the
  loss to 1e-5), as every checkpoint is the flat space (not for the cases
  held to another job: one process would go on in fp32).

A case's "against" names another job of the same global batch when one
process cannot be its reference (bf16 gradients: DDP with bf16 on the wire
and as many replicas). CI runs the cases marked so; --long
(HERD_TEST_LONG=1) runs every one, HERD_CASES=text those whose name holds
the text."""
import filecmp
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import herdtest  # noqa: E402

STEPS = 20
LOSS_TOLERANCE = 1e-5


# DiLoCo's outer steps every 5 inner steps between 2 regions.
REGIONS = "diloco { regions: 2 every: 5 outer_lr: 0.7 outer_momentum: 0.9 }"


def ar(workers, more):
    return f"cluster {{ sync: ALLREDUCE workers: {workers} {more} }}"


# (name, cluster block, data-parallel replicas, reference job: None for one
# process, else (name, cluster block) of the same global batch), whether CI
# runs it, and the model's layers if not 2.
CASES = [
    ("context x zero2", ar(4, "context_parallel: 2 zero_stage: 2"), 2, None, False),
    ("context x zero3", ar(4, "context_parallel: 2 zero_stage: 3"), 2, None, True),
    ("context x hsdp", ar(8, "context_parallel: 2 zero_stage: 1 shard_group_size: 4"), 4, None, True),
    ("context x zero3 x hsdp", ar(8, "context_parallel: 2 zero_stage: 3 shard_group_size: 4"), 4, None, False),
    ("context x zero2, 4 ranks", ar(4, "context_parallel: 4 zero_stage: 2"), 1, None, False),
    ("tensor x zero1", ar(4, "tensor_parallel: 2 zero_stage: 1"), 2, None, True),
    ("tensor x zero2", ar(4, "tensor_parallel: 2 zero_stage: 2"), 2, None, False),
    ("tensor x zero3", ar(4, "tensor_parallel: 2 zero_stage: 3"), 2, None, False),
    ("tensor x sequence x zero2", ar(4, "tensor_parallel: 2 sequence_parallel: true zero_stage: 2"), 2, None, False),
    ("tensor x sequence x zero3", ar(4, "tensor_parallel: 2 sequence_parallel: true zero_stage: 3"), 2, None, True),
    ("tensor x hsdp", ar(8, "tensor_parallel: 2 zero_stage: 1 shard_group_size: 4"), 4, None, False),
    ("tensor x context x zero2", ar(8, "tensor_parallel: 2 context_parallel: 2 zero_stage: 2"), 2, None, False),
    ("tensor x context x zero3 x hsdp",
     ar(16, "tensor_parallel: 2 context_parallel: 2 zero_stage: 3 shard_group_size: 8"), 4, None, False),
    ("tensor x zero1 x bf16", ar(4, "tensor_parallel: 2 zero_stage: 1 wire_dtype: BF16"), 2,
     ("ddp2_bf16", ar(2, "wire_dtype: BF16")), False),
    ("context on servers", "cluster { sync: PARAMETER_SERVER servers: 2 workers: 4 context_parallel: 2 }", 2, None, True),
    ("context x tensor on servers",
     "cluster { sync: PARAMETER_SERVER servers: 2 workers: 8 context_parallel: 2 tensor_parallel: 2 }", 2, None, False),
    ("context on streaming servers",
     "cluster { sync: PARAMETER_SERVER servers: 1 workers: 2 context_parallel: 2 stream_weights: true }", 1, None, False),
    ("data x tensor on streaming servers", "cluster { sync: PARAMETER_SERVER servers: 2 workers: 4 tensor_parallel: 2 "
     "stream_weights: true }", 2, None, True),
    ("tensor x sequence x context on streaming servers", "cluster { sync: PARAMETER_SERVER servers: 2 workers: 4 "
     "tensor_parallel: 2 sequence_parallel: true context_parallel: 2 stream_weights: true }", 1, None, False),
    ("pipeline x tensor on streaming servers", "cluster { sync: PARAMETER_SERVER servers: 2 workers: 4 "
     "pipeline_stages: 2 tensor_parallel: 2 stream_weights: true }", 1, None, False),
    ("pipeline x tensor on servers",
     "cluster { sync: PARAMETER_SERVER servers: 2 workers: 4 pipeline_stages: 2 tensor_parallel: 2 }", 1, None, True),
    ("data x pipeline x tensor on servers, interleaved", "cluster { sync: PARAMETER_SERVER servers: 3 workers: 8 "
     "pipeline_stages: 2 virtual_stages: 2 pipeline_schedule: INTERLEAVED_1F1B tensor_parallel: 2 }", 2, None, False, 4),
    ("pipeline x context", ar(4, "pipeline_stages: 2 context_parallel: 2"), 1, None, True),
    ("data x pipeline x context, interleaved", ar(8, "pipeline_stages: 2 virtual_stages: 2 "
     "pipeline_schedule: INTERLEAVED_1F1B context_parallel: 2"), 2, None, False, 4),
    ("pipeline x context, zero bubble", ar(4, "pipeline_stages: 2 context_parallel: 2 pipeline_schedule: ZERO_BUBBLE"),
     1, None, False),
    ("pipeline x tensor x context", ar(8, "pipeline_stages: 2 tensor_parallel: 2 context_parallel: 2"), 1, None, False),
    ("pipeline x context on servers",
     "cluster { sync: PARAMETER_SERVER servers: 2 workers: 4 pipeline_stages: 2 context_parallel: 2 }", 1, None, False),
    ("pipeline x context x zero1", ar(8, "pipeline_stages: 2 context_parallel: 2 zero_stage: 1"), 2, None, False),
    ("data x pipeline x tensor x zero1", ar(8, "pipeline_stages: 2 tensor_parallel: 2 zero_stage: 1"), 2, None, True),
    ("data x pipeline x zero2", ar(4, "pipeline_stages: 2 zero_stage: 2"), 2, None, False),
    ("data x pipeline x zero3", ar(4, "pipeline_stages: 2 zero_stage: 3"), 2, None, True),
    ("pipeline x hsdp", ar(8, "pipeline_stages: 2 zero_stage: 1 shard_group_size: 2"), 4, None, False),
    ("pipeline x zero3 x hsdp, interleaved", ar(8, "pipeline_stages: 2 virtual_stages: 2 zero_stage: 3 "
                                              "pipeline_schedule: INTERLEAVED_1F1B shard_group_size: 2"), 4, None,
     False, 4),
    ("data x pipeline x tensor x zero3", ar(8, "pipeline_stages: 2 tensor_parallel: 2 zero_stage: 3"), 2, None, False),
    ("data x pipeline x context x zero2, zero bubble", ar(8, "pipeline_stages: 2 context_parallel: 2 zero_stage: 2 "
                                                        "pipeline_schedule: ZERO_BUBBLE"), 2, None, False),
    ("data x pipeline x tensor x sequence, zero bubble", ar(8, "pipeline_stages: 2 tensor_parallel: 2 "
                                                          "sequence_parallel: true pipeline_schedule: ZERO_BUBBLE"), 2,
     None, True),
    ("pipeline x tensor x sequence", ar(4, "pipeline_stages: 2 tensor_parallel: 2 sequence_parallel: true"), 1, None,
     True),
    ("data x pipeline x tensor x sequence, interleaved, on servers", "cluster { sync: PARAMETER_SERVER servers: 2 "
     "workers: 8 pipeline_stages: 2 virtual_stages: 2 pipeline_schedule: INTERLEAVED_1F1B tensor_parallel: 2 "
     "sequence_parallel: true }", 2, None, False, 4),
    ("pipeline x tensor x sequence x context, GPipe", ar(8, "pipeline_stages: 2 pipeline_schedule: GPIPE "
     "tensor_parallel: 2 sequence_parallel: true context_parallel: 2"), 1, None, False),
    ("regions of context groups", "cluster { sync: PARAMETER_SERVER servers: 2 workers: 4 context_parallel: 2 "
     f"{REGIONS} }}", 2, ("regions2", f"cluster {{ sync: PARAMETER_SERVER servers: 2 workers: 2 {REGIONS} }}"), True),
    ("regions of streaming workers", "cluster { sync: PARAMETER_SERVER servers: 2 workers: 2 stream_weights: true "
     f"{REGIONS} }}", 1, ("regions2", f"cluster {{ sync: PARAMETER_SERVER servers: 2 workers: 2 {REGIONS} }}"), False),
    ("regions of tensor groups", "cluster { sync: PARAMETER_SERVER servers: 2 workers: 4 tensor_parallel: 2 "
     f"{REGIONS} }}", 2, ("regions2", f"cluster {{ sync: PARAMETER_SERVER servers: 2 workers: 2 {REGIONS} }}"), False),
    ("regions of pipelines", "cluster { sync: PARAMETER_SERVER servers: 2 workers: 4 pipeline_stages: 2 "
     f"{REGIONS} }}", 2, ("regions2", f"cluster {{ sync: PARAMETER_SERVER servers: 2 workers: 2 {REGIONS} }}"), False),
    ("regions of data x pipeline", "cluster { sync: PARAMETER_SERVER servers: 4 workers: 8 "
     f"pipeline_stages: 2 {REGIONS} }}", 4,
     ("regions4", f"cluster {{ sync: PARAMETER_SERVER servers: 4 workers: 4 {REGIONS} }}"), False),
    ("tensor x bf16", ar(4, "tensor_parallel: 2 wire_dtype: BF16"), 2, ("ddp2_bf16", ar(2, "wire_dtype: BF16")), True),
    ("tensor x bf16 on servers", "cluster { sync: PARAMETER_SERVER servers: 2 workers: 4 tensor_parallel: 2 "
     "wire_dtype: BF16 }", 2, ("ps2_bf16", "cluster { sync: PARAMETER_SERVER servers: 2 workers: 2 wire_dtype: BF16 }"),
     False),
]


def main():
    a = herdtest.parse_args()
    sb = herdtest.Sandbox(a.build)
    sb.training_data()

    def job(name, cluster, replicas, layers=2, every=10):
        text = herdtest.tiny_config("train.bin", steps=STEPS, ckpt=name, every=every, metrics=name + ".jsonl",
                                    extra=cluster)
        text = text.replace("batch_size: 4 seq_len: 32", f"batch_size: {2 * replicas} grad_accum: 2 seq_len: 32")
        text = text.replace("num_hidden_layers: 2", f"num_hidden_layers: {layers}")
        return sb.write(name + ".textproto", text)

    def run(name, cluster, replicas, *args, layers=2):
        sb.run("launch", job(name, cluster, replicas, layers), *args)
        return herdtest.metrics_rows(sb.path(name + ".jsonl"))

    def last_checkpoint(name):
        return sb.path(name, f"step_{STEPS:08d}")

    references = {}

    def reference(replicas, against, layers):
        # Another job is its own batch: one reference whatever the case's.
        key = (replicas if against is None else 0, against, layers)
        if key not in references:
            if against is None:
                references[key] = run(f"one_{replicas}_{layers}", "", replicas, layers=layers)
            else:
                references[key] = run(against[0], against[1], 1, layers=layers)
        return references[key]

    report = []
    for name, cluster, replicas, against, in_ci, *more in CASES:
        layers = more[0] if more else 2
        if not (in_ci or herdtest.LONG) or os.environ.get("HERD_CASES", name) not in name:
            continue
        tag = "".join(c if c.isalnum() else "_" for c in name)
        # The job's batch is a replica's: 2 sequences a micro-batch.
        rows = run(tag, cluster, 1, layers=layers)
        gap = herdtest.steps_within(rows, reference(replicas, against, layers), name, tolerance=LOSS_TOLERANCE)
        if against is not None:
            # The reference's own setting shows: the job is nearer to it
            # than it is to one process (a job that ignored the setting
            # would be one process's).
            own = herdtest.steps_within(reference(replicas, against, layers), reference(replicas, None, layers),
                                        f"{against[0]} against one process", tolerance=float("inf"),
                                        norm_tolerance=float("inf"))
            assert gap[0] < own[0] / 3, f"{name}: {gap[0]:.3g} from {against[0]}, which is {own[0]:.3g} from one process"
        again = run(tag + "_again", cluster, 1, layers=layers)
        assert herdtest.trajectory(again) == herdtest.trajectory(rows), f"{name}: a rerun differs"
        # The state (the config and manifest name each run's own paths).
        parts = sorted(p for p in os.listdir(last_checkpoint(tag)) if p.startswith(("shard_", "worker_")))
        assert parts, f"{name}: no shard in {last_checkpoint(tag)}"
        match, mismatch, errors = filecmp.cmpfiles(last_checkpoint(tag), last_checkpoint(tag + "_again"), parts,
                                                   shallow=False)
        assert not mismatch and not errors, f"{name}: a rerun's checkpoint differs: {mismatch + errors}"
        run(tag + "_split", cluster, 1, "--stop-at", "10", layers=layers)
        resumed = run(tag + "_split", cluster, 1, "--resume", layers=layers)
        assert herdtest.trajectory(resumed) == herdtest.trajectory(rows), f"{name}: stopped at 10 and resumed differs"
        went_on = ""
        if against is None:
            # The checkpoint is the flat space: one process goes on from it.
            herdtest.resume_from(sb, tag + "_one", job(tag + "_one", "", replicas, layers), tag + "_split/step_00000010")
            gone = herdtest.steps_within(herdtest.metrics_rows(sb.path(tag + "_one.jsonl")), rows[10:],
                                         f"{name}'s checkpoint as one process", tolerance=LOSS_TOLERANCE)
            went_on = f"; its checkpoint as one process within {gone:.2g}"
        report.append(f"{name} within {gap:.2g}" + (f" of {against[0]} (itself {own:.2g} from one process)"
                                                     if against else "") +
                      f" (rerun and resume bitwise{went_on})")
    print(f"{STEPS} steps against one process on the same global batch: " + "; ".join(report))


if __name__ == "__main__":
    main()
