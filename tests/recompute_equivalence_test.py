"""train.recompute: ATTENTION and FULL train exactly as NONE does, and keep
the memory `herd plan` says.

  - 20 steps of the tiny config in one process and in a parameter-server
    job (S=2 W=2), and 20 steps of the ~20M shape (configs/llama20m: d512,
    8 layers) in one process, under NONE, ATTENTION and FULL: the same
    losses and gradient norms in the metrics, and the same final
    checkpoint (optimizer shards and data positions), bit for bit;
  - the ~20M shape at batch 8 x 256 tokens, one PS worker under each
    setting: `herd plan` gives less to a worker that keeps less, and
    every process's measured peak RSS is within 10% of its plan.
GPU workers (real or emulated): tests/gpu_train_test.py, and
CudaLlamaModel.FullRecomputeGivesTheSameGradientsBitForBit."""
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import herdtest  # noqa: E402

SETTINGS = ("NONE", "ATTENTION", "FULL")
M20 = herdtest.LLAMA20M_MODEL


def train(sb, name, setting, model=None, cluster="", batch=4, seq_len=32):
    config = herdtest.tiny_config("train.bin", steps=20, ckpt=f"{name}/ckpt", every=20,
                                  metrics=f"{name}/metrics.jsonl", extra=cluster)
    config = config.replace("seed: 7 }", f"seed: 7 recompute: {setting} }}").replace(
        "batch_size: 4 seq_len: 32", f"batch_size: {batch} seq_len: {seq_len}")
    if model:
        config = config.replace(herdtest.TINY_MODEL, model)
    sb.write(f"{name}.textproto", config)
    sb.run("launch", f"{name}.textproto")
    rows = herdtest.metrics_rows(sb.path(name, "metrics.jsonl"))
    state = herdtest.training_state(sb.path(name, "ckpt", "step_00000020"))
    return [(r["step"], r["loss"], r["grad_norm"]) for r in rows], state


def equivalence(sb):
    cases = {
        "tiny, one process": dict(),
        "tiny, PS S=2 W=2": dict(cluster="cluster { sync: PARAMETER_SERVER servers: 2 workers: 2 }", batch=2),
        "~20M, one process": dict(model=M20, batch=2, seq_len=64),
    }
    for i, (case, kw) in enumerate(cases.items()):
        runs = {s: train(sb, f"c{i}_{s.lower()}", s, **kw) for s in SETTINGS}
        rows, state = runs["NONE"]
        assert len(rows) == 20
        for s in SETTINGS[1:]:
            assert runs[s][0] == rows, f"{case}: {s} differs from NONE:\n{runs[s][0]}\n{rows}"
            assert runs[s][1] == state, f"{case}: {s}'s final checkpoint differs from NONE's"
        print(f"ok  {case}: 20 steps under ATTENTION and FULL equal NONE's bit for bit "
              f"(loss {rows[0][1]:.4f} -> {rows[-1][1]:.4f})")


def memory(sb):
    worker_plan = {}
    for s in SETTINGS:
        config = f"""
{M20}
train {{ steps: 2 batch_size: 8 seq_len: 256 seed: 7 recompute: {s} }}
data {{ train: "train.bin" }}
log {{ every: 1 sample_tokens: 0 summary_dir: "mem_{s}" }}
cluster {{ sync: PARAMETER_SERVER servers: 1 workers: 1 }}
"""
        cfg = sb.write(f"mem_{s}.textproto", config)
        plan = json.loads(sb.run("plan", cfg, "--json").stdout)
        sb.run("launch", cfg)
        report = []
        for proc in plan["processes"]:
            name = f"{proc['role']}_{max(proc['rank'], 0):05d}.json"  # the plan's worker is every worker (-1)
            with open(sb.path(f"mem_{s}", name)) as f:
                peak = json.load(f)["peak_rss_bytes"]
            ratio = peak / proc["total"]
            report.append(f"{proc['role']} {peak / 2**20:.0f}/{proc['total'] / 2**20:.0f} MiB")
            assert 0.9 <= ratio <= 1.1, f"{s}: {proc['role']} measured {peak}, planned {proc['total']}"
            if proc["role"] == "worker":
                worker_plan[s] = proc["total"]
        print(f"ok  recompute {s}: measured/planned " + ", ".join(report))
    assert worker_plan["NONE"] > worker_plan["ATTENTION"] > worker_plan["FULL"], worker_plan


def main():
    a = herdtest.parse_args()
    sb = herdtest.Sandbox(a.build)
    sb.training_data()
    equivalence(sb)
    memory(sb)
    shutil.rmtree(sb.dir)


if __name__ == "__main__":
    main()
