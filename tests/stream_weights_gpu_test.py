"""cluster.stream_weights with CUDA workers, on the emulated device
(build/emulated: herd's CUDA sources on a CPU stand-in whose stream-ordered
allocations are pages of their own, unmapped when freed, so a kernel that
reads a unit the window let go faults): a GPU worker that holds a window of
units trains exactly as one that holds the whole model.

  - PS S=2 W=2 jobs of 20 steps (the ~20M shape: 4, 20 with
    scripts/test.sh --long) with and without streamed weights, both on
    the emulated device: the same losses, gradient norms and validation
    losses in the metrics and the same final checkpoint (optimizer shards
    and data positions), bit for bit. Tiny config in fp32 with evaluation,
    and its variants: bf16 compute, untied embeddings, grad_accum 2 (the
    micro-batches' sum kept on the device), FULL recompute, bf16 on the
    wire without prefetch; the ~20M shape (d512, 8 layers) with FULL
    recompute (untied alone with --long only);
  - memory: the ~20M shape's streamed GPU worker (bf16, FULL recompute,
    S=1 W=1): the device memory its model held at its peak (the run
    summary's device_peak_bytes) within 10% of `herd plan`'s device row,
    its RSS (host window plus the emulated device's memory, which is the
    process's own) within 10% of the plan's total plus that, and the
    device plan's weights and gradients a fraction of the unstreamed
    worker's;
  - ZeRO-3 on CUDA workers (the same window, gathered from the other
    workers over the UCX ring, cluster.nccl false): W=2 takes DDP's steps
    over the ring bit for bit (metrics and exported weights), tied and
    untied with grad_accum 2, and a shard group of 2 of W=4 (HSDP) is
    within 1e-5 of DDP."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import herdtest  # noqa: E402
from stream_weights_test import M20, M20_STEPS, PS, UNTIED, compare_streamed, measure, train  # noqa: E402

FP32 = "device { kind: CUDA dtype: FP32 }"
BF16 = "device { kind: CUDA dtype: BF16 }"


def equivalence(sb):
    compare_streamed(sb, {
        "tiny, fp32, evaluation": dict(eval_every=5),
        "tiny, bf16 compute": dict(device=BF16),
        "tiny, untied embeddings": dict(model=UNTIED, long=True),
        "tiny, grad_accum 2": dict(train_extra="grad_accum: 2"),
        "tiny, untied, FULL recompute": dict(model=UNTIED, train_extra="recompute: FULL"),
        "tiny, bf16 wire, no prefetch": dict(cluster=PS + " wire_dtype: BF16", stream=" stream_prefetch_layers: 0"),
        "~20M, bf16 compute, FULL recompute": dict(model=M20, device=BF16, train_extra="recompute: FULL", batch=1,
                                                   seq_len=16, steps=M20_STEPS),
    }, "g", " on the emulated device", device=FP32)


def memory(sb):
    train_line = "steps: 2 batch_size: 2 seq_len: 64 seed: 7 recompute: FULL"
    ps = "sync: PARAMETER_SERVER servers: 1 workers: 1"
    plan, measured, _ = measure(sb, "mem", M20, train_line, ps + " stream_weights: true", device=BF16)
    peak, proc, summary = measured[("worker", -1)]
    device, planned = summary["device_peak_bytes"], summary["device_plan_bytes"]
    assert planned == proc["device"] and device > 0, summary
    assert 0.9 <= device / planned <= 1.1, f"device: held {device}, planned {planned}"
    assert 0.9 <= peak / (proc["total"] + device) <= 1.1, f"RSS {peak}, planned {proc['total']} + device {device}"
    whole = json.loads(sb.run("plan", sb.write("whole.textproto", f"{M20}\ntrain {{ {train_line} }}\n"
                                               f"data {{ train: \"train.bin\" }}\ncluster {{ {ps} }}\n{BF16}\n"),
                              "--json").stdout)
    unstreamed = [p for p in whole["processes"] if p["role"] == "worker"][0]["device"]
    assert planned < unstreamed / 2, (planned, unstreamed)
    print(f"ok  ~20M streamed on the emulated device, bf16, FULL: device held {device / 2**20:.1f} MiB, planned "
          f"{planned / 2**20:.1f} (unstreamed {unstreamed / 2**20:.1f}); RSS {peak / 2**20:.0f} MiB, planned "
          f"{proc['total'] / 2**20:.0f} + device", flush=True)


def zero3(sb):
    ring = "sync: ALLREDUCE nccl: false bucket_mb: 0.05 workers: "

    def exported(name):
        sb.run("export", sb.path(name, "ckpt"), "--out", name + "_hf")
        with open(sb.path(name + "_hf", "model.safetensors"), "rb") as f:
            return f.read()
    for case, kw in {"tiny, fp32": {}, "tiny, untied, grad_accum 2": dict(model=UNTIED, train_extra="grad_accum: 2")
                     }.items():
        name = "z" + str(len(case))
        ddp, _ = train(sb, name + "_ddp", ring + "2", device=FP32, steps=10, **kw)
        z3, _ = train(sb, name + "_z3", ring + "2 zero_stage: 3", device=FP32, steps=10, **kw)
        assert z3 == ddp, f"{case}: ZeRO-3 on CUDA workers differs from DDP:\n{z3}\n{ddp}"
        assert exported(name + "_z3") == exported(name + "_ddp"), f"{case}: ZeRO-3's final weights differ from DDP's"
        print(f"ok  {case}: ZeRO-3 on the emulated device, gathered over the ring, takes DDP's steps bit for bit "
              f"(loss {ddp[0][1]:.4f} -> {ddp[-1][1]:.4f})", flush=True)
    ddp4, _ = train(sb, "h_ddp", ring + "4", device=FP32, batch=1, steps=6)
    hsdp, _ = train(sb, "h_z2", ring + "4 zero_stage: 2 shard_group_size: 2", device=FP32, batch=1, steps=6)
    rel = max(abs(a[1] - b[1]) / b[1] for a, b in zip(hsdp, ddp4))
    assert len(hsdp) == 6 and rel < 1e-5, f"HSDP on CUDA workers: loss differs from DDP's by {rel:.3g}"
    print(f"ok  HSDP (ZeRO-2, 2 groups of 2) on the emulated device: loss within {rel:.2g} of DDP", flush=True)


def main():
    a = herdtest.parse_args()
    sb = herdtest.Sandbox(os.path.join(a.build, "emulated"))
    if not os.path.exists(sb.herd):
        print("skipped: no emulated-device build (libboost-context-dev)")
        sys.exit(77)
    sb.training_data()
    sb.run("prepare", "corpus.txt", "--out", "val.bin")
    memory(sb)
    equivalence(sb)
    zero3(sb)


if __name__ == "__main__":
    main()
