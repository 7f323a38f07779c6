"""CUDA workers end to end through `herd launch`, against one CPU
process training the same job (the tiny config, 20 steps, global batch 8):

* configs/tiny.textproto (the default job: d128, 4 layers, batch 8 x 128;
  on the test's corpus, not the fortunes) for 20 steps on the GPU in fp32: every step's
  loss within 1e-4 relative of the CPU's;
* one process on the GPU in fp32: every step's loss within 1e-4 relative;
* the same run twice, and one stopped at step 10 and resumed: bitwise
  identical metrics;
* parameter-server mode, 2 CPU servers and 2 GPU workers (batch 4 each,
  sharing the device): within 1e-4 of the CPU run;
* all-reduce mode, 2 GPU workers over the UCX ring (cluster.nccl false):
  within 1e-4;
* all-reduce mode, 1 GPU worker with NCCL, DDP, ZeRO-1 and ZeRO-3 (the
  whole step on the device, weights and AdamW state resident; ZeRO-3's
  weights gathered unit by unit from the device's slices): within 1e-4,
  and bitwise alike;
* bf16 compute: within 2e-2 relative, and it learns;
* `herd bench gpu` on a tiny shape prints herd's line (tokens_per_s, mfu),
  PyTorch's (on the CPU for the emulated device) and the ratios.

With the real build it needs a CUDA device (`herd version` reports
cuda_devices) and exits 77, reported as skipped, without one. With
--emulated it runs build/emulated/'s binaries: the same CUDA sources on the
emulated device (model/cuda/emulation), which checks the arithmetic and the
host-side staging on every machine but not real concurrency or speed."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import herdtest  # noqa: E402

STEPS = 20


def losses(path, key="loss"):
    with open(path) as f:
        return [json.loads(line)[key] for line in f]


def norms(path):
    """Every step's gradient norm: a gradient-scale error (a dropped share)
    shows here, where under AdamW with clipping the losses barely move."""
    return losses(path, "grad_norm")


def worst_relative(a, b):
    assert len(a) == len(b) == STEPS, (len(a), len(b))
    return max(abs(x - y) / abs(y) for x, y in zip(a, b))


def main():
    emulated = "--emulated" in sys.argv
    if emulated:
        sys.argv.remove("--emulated")
    a = herdtest.parse_args()
    build = os.path.join(a.build, "emulated") if emulated else a.build
    sb = herdtest.Sandbox(build)
    version = json.loads(sb.run("version").stdout)
    if version["cuda"] is None:
        print("skipped: this herd was built without CUDA")
        sys.exit(77)
    if version["cuda_devices"] == 0:
        print("skipped: no CUDA device visible")
        sys.exit(77)
    sb.training_data()

    def job(name, batch=8, device="", cluster="", ckpt=""):
        text = herdtest.tiny_config("train.bin", steps=STEPS, metrics=name + ".jsonl", ckpt=ckpt, every=10 if ckpt else 0,
                                    extra=device + "\n" + cluster)
        return sb.write(name + ".textproto", text.replace("batch_size: 4", f"batch_size: {batch}"))

    # The default job, 20 steps, CPU and GPU.
    tiny = os.path.abspath(os.path.join(a.source, "configs", "tiny.textproto"))
    # The sandbox's corpus rather than the fortunes (a GPU node may not have them).
    short = ["--set", "data.train=train.bin", "--set", "data.val=", "--set", "train.steps=20", "--set", "log.every=1",
             "--set", "checkpoint.dir=", "--set", "log.eval_every=0", "--set", "log.sample_tokens=0"]
    sb.run("launch", tiny, *short, "--set", "log.metrics=tiny_cpu.jsonl")
    sb.run("launch", tiny, *short, "--set", "log.metrics=tiny_gpu.jsonl", "--set", "device.kind=CUDA")

    gpu = "device { kind: CUDA dtype: FP32 }"
    sb.run("launch", job("cpu"))
    sb.run("launch", job("gpu", device=gpu))
    sb.run("launch", job("gpu_again", device=gpu))
    sb.run("launch", job("gpu_split", device=gpu, ckpt="gpu_split"), "--stop-at", "10")
    p = sb.run("launch", job("gpu_split", device=gpu, ckpt="gpu_split"), "--resume")
    assert "resumed from" in p.stdout, p.stdout
    sb.run("launch", job("ps", 4, gpu, "cluster { sync: PARAMETER_SERVER servers: 2 workers: 2 }"))
    sb.run("launch", job("ring", 4, gpu, "cluster { sync: ALLREDUCE workers: 2 nccl: false }"))
    p = sb.run("launch", job("nccl", 8, gpu, "cluster { sync: ALLREDUCE workers: 1 }"))
    assert "gradients by NCCL" in p.stdout, p.stdout
    sb.run("launch", job("nccl_zero1", 8, gpu, "cluster { sync: ALLREDUCE workers: 1 zero_stage: 1 }"))
    p = sb.run("launch", job("nccl_zero3", 8, gpu, "cluster { sync: ALLREDUCE workers: 1 zero_stage: 3 }"))
    assert "gradients by NCCL" in p.stdout and "ZeRO-3 gathered" in p.stdout, p.stdout
    sb.run("launch", job("bf16", device="device { kind: CUDA dtype: BF16 }"))
    # Full activation recomputation: the same trajectories, bit for bit.
    full = ["--set", "train.recompute=FULL"]
    sb.run("launch", job("gpu_full", device=gpu), *full)
    sb.run("launch", job("ps_full", 4, gpu, "cluster { sync: PARAMETER_SERVER servers: 2 workers: 2 }"), *full)
    sb.run("launch", job("bf16_full", device="device { kind: CUDA dtype: BF16 }"), *full)

    figures = {"tiny": worst_relative(losses(sb.path("tiny_gpu.jsonl")), losses(sb.path("tiny_cpu.jsonl")))}
    assert figures["tiny"] < 1e-4, f"configs/tiny.textproto: GPU losses differ by {figures['tiny']:.3g} relative"
    cpu = losses(sb.path("cpu.jsonl"))
    for name in ("gpu", "ps", "ring", "nccl", "nccl_zero1", "nccl_zero3"):
        figures[name] = worst_relative(losses(sb.path(name + ".jsonl")), cpu)
        assert figures[name] < 1e-4, f"{name}: losses differ from the CPU run by {figures[name]:.3g} relative"
        norm = worst_relative(norms(sb.path(name + ".jsonl")), norms(sb.path("cpu.jsonl")))
        assert norm < 1e-4, f"{name}: gradient norms differ from the CPU run by {norm:.3g} relative"
    def trajectory(name):
        with open(sb.path(name + ".jsonl")) as f:
            return [{k: m[k] for k in ("step", "loss", "lr", "grad_norm")} for m in map(json.loads, f)]
    for name in ("nccl_zero1", "nccl_zero3"):
        assert trajectory(name) == trajectory("nccl"), f"{name} over NCCL differs from DDP over NCCL"
    assert trajectory("gpu") == trajectory("gpu_again"), "a rerun on the GPU differs"
    assert trajectory("gpu") == trajectory("gpu_split"), "stop at 10 and --resume on the GPU differs from the straight run"
    for name in ("gpu", "ps", "bf16"):
        assert trajectory(name + "_full") == trajectory(name), f"{name}: train.recompute FULL differs from NONE"
    bf16 = losses(sb.path("bf16.jsonl"))
    figures["bf16"] = worst_relative(bf16, cpu)
    assert figures["bf16"] < 2e-2, f"bf16: losses differ from the CPU run by {figures['bf16']:.3g} relative"
    assert bf16[-1] < bf16[0] - 1.0, "bf16: the model did not learn"
    # The GPU benchmark's plumbing on a tiny shape (its figures mean nothing here).
    shape = ["--set", "model.vocab_size=256", "--set", "model.hidden_size=64", "--set", "model.intermediate_size=160",
             "--set", "model.num_hidden_layers=2", "--set", "model.num_attention_heads=4",
             "--set", "model.num_key_value_heads=2", "--set", "train.batch_size=2", "--set", "train.seq_len=64"]
    on_cpu = emulated or "emulated" in version["version"]
    python, torch_device = ("/usr/bin/python3", "cpu") if on_cpu else ("python3", "cuda")
    p = sb.run("bench", "gpu", *shape, "--steps", "2", "--warmup", "1", "--python", python,
               "--torch-device", torch_device, "--torch-modes", "eager")
    lines = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    ours, theirs, summary = lines[0], lines[1], lines[-1]
    assert ours["impl"] == "herd" and ours["tokens_per_s"] > 0 and ours["mfu"] > 0, ours
    assert ours["parameters"] == theirs["parameters"] and ours["flops_per_token"] == theirs["flops_per_token"], lines
    assert theirs["impl"] == "pytorch_eager" and theirs["tokens_per_s"] > 0, theirs
    assert summary["vs_pytorch_eager"] > 0, summary
    print(("emulated device" if emulated else version.get("version")) + ": " +
          ", ".join(f"{k} {v:.2g}" for k, v in figures.items()))
    print("gpu_train: ok")


if __name__ == "__main__":
    main()
