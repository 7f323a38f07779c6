"""scripts/gpu_kit.sh and scripts/gpu_check.py, the GPU node's check, run
here on the emulated device so they work the first time on a real one:

  - an emulated kit (a folder) holds herd, the gtest binary, a library
    bundle and the default job's token files; gpu_kit.sh refuses to write
    over something that is there;
  - gpu_check.py --small, phases env, bench, modes, axes, converge and
    sanitize: every phase reports, herd sees the (emulated) device, the
    benchmark prints herd's line and PyTorch's, all four modes train (PS
    streamed equal to PS bit for bit), DDP and ZeRO-1/2/3 over one-rank
    NCCL train with their losses and device peaks against one process's
    and the plan, tensor 2 + sequence, pipeline 2 and context 2 with 2
    processes on the device likewise, bf16 and fp32 runs of the default GPU job
    finish with their held-out losses, a tool that is not installed is
    reported as skipped, and the run ends ok with exit 0;
  - a deadline too short for a phase skips it with a line saying so."""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import herdtest  # noqa: E402


def results(out):
    with open(os.path.join(out, "results.jsonl")) as f:
        return [json.loads(line) for line in f]


def main():
    a = herdtest.parse_args()
    if not os.path.exists(os.path.join(a.build, "emulated", "herd")):
        print("skipped: no emulated-device build (libboost-context-dev)")
        sys.exit(77)
    sb = herdtest.Sandbox(a.build)
    kit_script = os.path.join(a.source, "scripts", "gpu_kit.sh")
    kit = sb.path("kit")
    p = subprocess.run([kit_script, "--emulated", a.build, kit], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    made = json.loads(p.stdout.splitlines()[-1])
    assert made["emulated"] is True and made["bytes"] > 0, made
    for f in ("bin/herd", "bin/herd-server", "bin/herd-worker", "bin/herd_tests", "data/train.bin", "data/val.bin",
              "share/herd/bench/torch_train.py"):
        assert os.path.exists(os.path.join(kit, f)), f
    again = subprocess.run([kit_script, "--emulated", a.build, kit], capture_output=True, text=True)
    assert again.returncode == 2 and "not overwriting" in again.stderr, again.stderr

    check = [sys.executable, os.path.join(a.source, "scripts", "gpu_check.py"), "--kit", kit, "--small",
             "--python", sys.executable]
    out = sb.path("out")
    p = subprocess.run(check + ["--out", out, "--phases", "env,bench,modes,axes,converge,sanitize"],
                       capture_output=True, text=True, timeout=600)
    rows = results(out)
    assert p.returncode == 0, p.stdout + p.stderr
    done = [r["phase"] for r in rows if r.get("what") == "phase done"]
    assert done == ["env", "bench", "modes", "axes", "converge", "sanitize"], done
    env = next(r for r in rows if r["phase"] == "env" and "herd" in r)
    assert env["herd"]["cuda_devices"] >= 1 and "emulated" in env["herd"]["version"], env
    impls = [r.get("impl") for r in rows if r["phase"] == "bench"]
    assert "herd" in impls and "pytorch_eager" in impls, impls
    modes = {r["what"]: r for r in rows if r["phase"] == "modes"}
    for name in ("one process", "PS S=2 W=1", "PS S=2 W=1 streamed"):
        assert modes[name]["ok"] and modes[name]["step_s"] > 0, modes[name]
    axes = {r["what"]: r for r in rows if r["phase"] == "axes"}
    for name in ("DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3"):
        against = axes[f"{name} W=1 (NCCL) against one process"]
        assert against["ok"] and against["ratio"] > 0 and against["loss_gap"] < 2e-2, against
    for name in ("tensor 2 + sequence", "pipeline 2", "context 2"):
        two = axes[f"{name}, 2 processes on the GPU against one process"]
        assert two["ok"] and two["ratio"] > 0 and two["loss_gap"] < 2e-2, two
    assert modes["PS S=2 W=1"]["device_peak_bytes"] > 0, modes["PS S=2 W=1"]
    assert modes["streamed PS equals PS bit for bit"]["ok"], modes
    converge = {r["what"]: r for r in rows if r["phase"] == "converge"}
    assert converge["BF16"]["val_loss"] > 0 and converge["FP32"]["val_loss"] > 0, converge
    assert "gap" in converge["bf16 final held-out loss within 2% of fp32's"], converge
    with open(os.path.join(out, "curves.jsonl")) as f:
        assert {json.loads(line)["dtype"] for line in f} == {"BF16", "FP32"}
    sanitize = [r for r in rows if r["phase"] == "sanitize" and "skipped" in r]
    assert sanitize, rows
    assert rows[-1]["phase"] == "all" and rows[-1]["ok"], rows[-1]

    late = sb.path("late")
    p = subprocess.run(check + ["--out", late, "--phases", "env,tests", "--deadline-s", "30"],
                       capture_output=True, text=True, timeout=120)
    rows = results(late)
    assert p.returncode == 0, p.stdout + p.stderr
    assert any(r["phase"] == "tests" and "needs" in r.get("skipped", "") for r in rows), rows
    print(f"ok  emulated kit {made['bytes'] / 2**20:.0f} MiB; gpu_check.py --small: "
          + ", ".join(f"{k} {v['step_s'] * 1e3:.0f} ms" for k, v in modes.items() if "step_s" in v))


if __name__ == "__main__":
    main()
