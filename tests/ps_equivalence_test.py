"""Parameter-server mode against the single process, through `herd launch`:

* S=2 servers with W=2 workers (batch 4 each) and S=3 with W=1 (batch 8)
  train 30 steps with losses within 1e-5 relative of one process on the
  same global batch (batch 8), and their exported HF directories match the
  single process's (same config.json, every tensor within 1e-5);
* their gradient norms match the single process's within what the
  arithmetic guarantees (derived at GRADIENT NORMS below: the rounding
  bound where both runs are in the same state, plus the weights' drift
  times the norm's sensitivity to it along the run);
* the same PS run twice is bitwise identical (metrics and shard files),
  the second one evaluating every 4 steps (evaluation, which runs while
  the next weights arrive, must not touch training);
* stop at step 10, --resume to 30: bitwise equal to the uninterrupted run;
* a step directory whose manifest is missing is never loaded;
* bf16 on the wire trains close to fp32;
* without clipping (clip_norm 0) the servers step each bucket as soon as
  its sum is complete and workers pull it while still pushing: S=3 W=1
  is then bitwise the single process (losses and exported weights), and
  S=2 W=2 within 1e-5 of it, rerun bitwise equal."""
import json
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import herdtest  # noqa: E402

STEPS = 30

# GRADIENT NORMS. With W=2 each step's N = 8 x 32 = 256 tokens are split
# over two workers: every gradient element is the same sum of per-token
# terms c_n as in one process, added in another order (one BLAS reduction
# over 256 tokens there; two over 128 and the server's add here; the
# RMSNorm weights and embedding rows likewise). With OpenBLAS's Haswell
# and Zen sgemm kernels (the AVX2 machines) a row's result also depends on
# how many rows the call has, so the c_n themselves differ by an ulp or so;
# its SkylakeX kernels (AVX-512) give the same rows whatever the split.
#
# Same state (step 1: same weights, zero moments, same batch). Rounding
# alone: |‖g_ps‖ - ‖g‖| <= ‖g_ps - g‖ <= 2 γ_N ‖Σ_n |c_n|‖ = 2 γ_N R ‖g‖,
# γ_N = N u / (1 - N u), u = 2^-24. R, how much the terms cancel, grows as
# the model learns: 1.8-9.0 over the 30 steps of this run (2.4 at step 1,
# 5.8 at the trained weights of the init_from runs; float64, PyTorch
# reference). R <= 10 gives SAME_STATE = 3.1e-4. The AVX2 kernels' per-row
# differences are outside that bound; measured, the same-state difference
# is no larger with them than with SkylakeX's (<= 1.1e-7 on both).
#
# Later steps compare norms taken at different weights. Each step's
# rounding differences, which Adam's m / sqrt(v) carries into the weights
# (most where v is small), add up to a drift ‖Δw‖ of 1.3e-6 after step 1
# and 2.6-2.8e-6 after step 30 (‖w‖ = 20), the same with either kernel set.
# To first order |Δ‖g_t‖| <= ‖∇_w ‖g_t‖‖ ‖Δw‖, and the sensitivity
# S_t = ‖∇_w ‖g_t‖‖ / ‖g_t‖ (float64 Hessian-vector products) is 0.8-13 at
# most steps but 61 at step 9 and 307 at step 29. There a capital letter
# opens a sequence (no newline before it) through an embedding row that
# has barely trained ('J': rms 0.022, so 1 / rms = 45 in the first
# RMSNorm's backward); that row's gradient is the batch's largest (0.26 of
# 0.60) and hangs on the first layer's MLP weights. So at every step the
# norms agree within SAME_STATE + S_MAX ‖Δw‖, with ‖Δw‖ measured on the
# exported weights (it grew at every step, with either kernel set): about
# 1.1e-3. Where a run lands inside that depends on the drift's direction,
# which the BLAS kernels decide: at step 29, 3.0e-5 with the Haswell/Zen
# kernels (over the 1e-5 this test used to ask at every step), 7.6e-7
# with SkylakeX's. The loss is better conditioned (its sensitivity is
# ‖g_t‖: |ΔL_t| / L_t <= ‖g_t‖ ‖Δw‖ / L_t <= 7.4e-7), hence 1e-5 at every
# step. S_MAX and R belong to this model, data and seed: change those and
# measure them again.
TOKENS = 8 * 32
GAMMA = TOKENS * 2.0 ** -24 / (1 - TOKENS * 2.0 ** -24)
SAME_STATE = 2 * GAMMA * 10  # R <= 10
S_MAX = 310.0


def metrics(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def read_safetensors(path):
    """{name: (dtype, shape, list of floats)} for F32 tensors."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        lo, hi = info["data_offsets"]
        raw = data[8 + n + lo:8 + n + hi]
        out[name] = (info["dtype"], info["shape"], struct.unpack(f"<{len(raw) // 4}f", raw))
    return out


def files_of(root, step):
    d = os.path.join(root, f"step_{step:08d}")
    return {f: open(os.path.join(d, f), "rb").read() for f in sorted(os.listdir(d))}


def main():
    a = herdtest.parse_args()
    sb = herdtest.Sandbox(a.build)
    sb.training_data()
    sb.run("prepare", "corpus.txt", "--out", "val.bin")

    def job(name, batch, cluster="", clip=True, **kw):
        text = herdtest.tiny_config("train.bin", steps=STEPS, ckpt=name, every=10, metrics=name + ".jsonl",
                                    extra=cluster, **kw)
        text = text.replace("batch_size: 4", f"batch_size: {batch}")
        return sb.write(name + ".textproto", text if clip else text.replace("clip_norm: 1.0", "clip_norm: 0"))

    ps = "cluster {{ sync: PARAMETER_SERVER servers: {} workers: {} {} }}"
    sb.run("launch", job("single", 8))
    sb.run("launch", job("ps22", 4, ps.format(2, 2, "")))
    sb.run("launch", job("ps22_again", 4, ps.format(2, 2, ""), val="val.bin", eval_every=4))
    sb.run("launch", job("ps31", 8, ps.format(3, 1, "")))
    p = sb.run("launch", job("ps22_split", 4, ps.format(2, 2, "")), "--stop-at", "10")
    assert "stopped at step 10" in p.stdout, p.stdout
    assert not os.path.exists(sb.path("ps22_split", "step_00000020"))
    p = sb.run("launch", job("ps22_split", 4, ps.format(2, 2, "")), "--resume")
    assert "resumed from" in p.stdout and "step_00000010" in p.stdout, p.stdout
    sb.run("launch", job("ps22_bf16", 4, ps.format(2, 2, "wire_dtype: BF16")))
    # Small buckets (about 20 per server), so that they complete, are
    # stepped and are pulled out of order.
    small = "bucket_mb: 0.02"
    for name, batch, cluster in (("single_nc", 8, ""), ("ps31_nc", 8, ps.format(3, 1, small)),
                                 ("ps22_nc", 4, ps.format(2, 2, small)),
                                 ("ps22_nc_again", 4, ps.format(2, 2, small))):
        sb.run("launch", job(name, batch, cluster, clip=False))

    single = metrics(sb.path("single.jsonl"))
    assert [m["step"] for m in single] == list(range(1, STEPS + 1))
    sb.run("export", sb.path("single"), "--out", "single_hf")
    worst = {}
    for name in ("ps22", "ps31"):
        run = metrics(sb.path(name + ".jsonl"))
        assert [m["step"] for m in run] == list(range(1, STEPS + 1)), name
        rel = max(abs(r["loss"] - s["loss"]) / abs(s["loss"]) for r, s in zip(run, single))
        assert rel < 1e-5, f"{name}: loss differs from the single process by {rel:.3g} relative"
        assert all(r["lr"] == s["lr"] for r, s in zip(run, single)), name
        # Export of the PS checkpoint = the single process's HF directory.
        sb.run("export", sb.path(name), "--out", name + "_hf")
        with open(sb.path(name + "_hf", "config.json")) as f, open(sb.path("single_hf", "config.json")) as g:
            assert json.load(f) == json.load(g), f"{name}: exported config.json differs"
        mine, ref = (read_safetensors(sb.path(d, "model.safetensors")) for d in (name + "_hf", "single_hf"))
        assert mine.keys() == ref.keys(), name
        diff = drift2 = 0.0
        for k in ref:
            assert mine[k][:2] == ref[k][:2], k
            diff = max(diff, max(abs(x - y) for x, y in zip(mine[k][2], ref[k][2])))
            drift2 += sum((x - y) ** 2 for x, y in zip(mine[k][2], ref[k][2]))
        assert diff < 1e-5, f"{name}: exported weights differ by up to {diff:.3g}"
        # Gradient norms: see GRADIENT NORMS at the top.
        norm = [abs(r["grad_norm"] - s["grad_norm"]) / s["grad_norm"] for r, s in zip(run, single)]
        t = max(range(STEPS), key=norm.__getitem__)
        if name == "ps31":
            # One worker with the whole batch computes the single process's
            # gradients bit for bit: the same run, but for the grouping of
            # the sum of squares (in double) over 3 servers.
            assert norm[t] < 1e-5, f"{name}: gradient norm differs by {norm[t]:.3g} relative at step {t + 1}"
        else:
            assert norm[0] < SAME_STATE, f"{name}: step 1 gradient norm differs by {norm[0]:.3g} relative"
            bound = SAME_STATE + S_MAX * drift2 ** 0.5
            assert norm[t] < bound, (f"{name}: gradient norm differs by {norm[t]:.3g} relative at step {t + 1}, "
                                     f"beyond {bound:.3g} for a weight drift of {drift2 ** 0.5:.3g}")
        worst[name] = (rel, diff, norm[t], t + 1)
        if name == "ps22":
            worst["bound"] = (drift2 ** 0.5, bound)

    # Reruns and resumes are bitwise identical.
    key = lambda m: (m["step"], m["loss"], m["grad_norm"], m["lr"])  # noqa: E731
    straight = metrics(sb.path("ps22.jsonl"))
    assert [key(m) for m in straight] == [key(m) for m in metrics(sb.path("ps22_again.jsonl"))], "rerun differs"
    split = metrics(sb.path("ps22_split.jsonl"))
    assert [key(m) for m in straight] == [key(m) for m in split], "resumed run differs from the straight one"
    for other in ("ps22_again", "ps22_split"):
        a_files, b_files = files_of(sb.path("ps22"), STEPS), files_of(sb.path(other), STEPS)
        for f in a_files:
            if f.startswith(("shard_", "worker_")):
                assert a_files[f] == b_files[f], f"{other}: {f} differs from the straight run's"

    # bf16 on the wire: rounding, not a different trajectory.
    bf16 = metrics(sb.path("ps22_bf16.jsonl"))
    bf16_rel = max(abs(r["loss"] - s["loss"]) / s["loss"] for r, s in zip(bf16, single))
    assert bf16_rel < 2e-2, f"bf16 wire: loss differs by {bf16_rel:.3g} relative"
    assert bf16[-1]["loss"] < bf16[0]["loss"] - 1.0, "bf16 wire: the model did not learn"

    # Streamed updates (no clipping): one worker with the whole batch is the
    # single process bit for bit, whatever order the buckets were stepped in.
    single_nc = metrics(sb.path("single_nc.jsonl"))
    assert [m["loss"] for m in metrics(sb.path("ps31_nc.jsonl"))] == [m["loss"] for m in single_nc], \
        "S=3 W=1 without clipping: losses differ from the single process"
    for name in ("single_nc", "ps31_nc"):
        sb.run("export", sb.path(name), "--out", name + "_hf")
    mine, ref = (read_safetensors(sb.path(d, "model.safetensors")) for d in ("ps31_nc_hf", "single_nc_hf"))
    assert mine == ref, "S=3 W=1 without clipping: exported weights differ from the single process"
    nc22 = metrics(sb.path("ps22_nc.jsonl"))
    nc_rel = max(abs(r["loss"] - s["loss"]) / s["loss"] for r, s in zip(nc22, single_nc))
    assert nc_rel < 1e-5, f"S=2 W=2 without clipping: loss differs by {nc_rel:.3g} relative"
    assert [key(m) for m in nc22] == [key(m) for m in metrics(sb.path("ps22_nc_again.jsonl"))], \
        "S=2 W=2 without clipping: rerun differs"

    # checkpoint.init_from: the single process's exported model starts a new
    # run, in one process and in PS mode alike (HF directory and herd
    # checkpoint both accepted); a model of another shape is refused.
    init = 'checkpoint {{ dir: "{}" init_from: "{}" }}'
    for name, batch, cluster, source in (("init_single", 8, "", "single_hf"),
                                         ("init_ps", 4, ps.format(2, 2, ""), "single_hf"),
                                         ("init_ps_ckpt", 4, ps.format(2, 2, ""), "single")):
        text = herdtest.tiny_config("train.bin", steps=5, metrics=name + ".jsonl", extra=cluster)
        text = text.replace("batch_size: 4", f"batch_size: {batch}").replace('checkpoint { dir: "" every: 0 }', "")
        sb.run("launch", sb.write(name + ".textproto", text + init.format(name, sb.path(source))))
    init_single, init_ps, init_ckpt = (metrics(sb.path(n + ".jsonl")) for n in ("init_single", "init_ps",
                                                                                "init_ps_ckpt"))
    assert init_single[0]["loss"] < single[0]["loss"] - 1.0, "init_from did not start from the trained model"
    for r, s in zip(init_ps, init_single):
        assert abs(r["loss"] - s["loss"]) / s["loss"] < 1e-5, (r, s)
    # Step 1 from the same trained weights: the same state, a norm within
    # rounding (GRADIENT NORMS).
    init_norm = abs(init_ps[0]["grad_norm"] - init_single[0]["grad_norm"]) / init_single[0]["grad_norm"]
    assert init_norm < SAME_STATE, f"init_from: step 1 gradient norm differs by {init_norm:.3g} relative"
    assert [m["loss"] for m in init_ps] == [m["loss"] for m in init_ckpt], "HF dir and checkpoint start differ"
    wrong = herdtest.tiny_config("train.bin", steps=5, extra=ps.format(2, 2, "")).replace("hidden_size: 64",
                                                                                          "hidden_size: 32")
    wrong = wrong.replace('checkpoint { dir: "" every: 0 }', init.format("", sb.path("single_hf")))
    p = sb.run("launch", sb.write("wrong.textproto", wrong), check=False)
    assert p.returncode != 0 and "init_from" in p.stderr and "hidden_size" in p.stderr, p.stderr[-2000:]

    # A missing manifest: that step is skipped, never loaded.
    os.remove(sb.path("ps22_split", "step_00000030", "manifest.json"))
    p = sb.run("launch", job("ps22_split", 4, ps.format(2, 2, "")), "--resume", "--stop-at", "20")
    assert "step_00000020" in p.stdout and "resumed from" in p.stdout, p.stdout
    for d in os.listdir(sb.path("ps22_split")):
        m = sb.path("ps22_split", d, "manifest.json")
        if os.path.exists(m):
            os.remove(m)
    p = sb.run("launch", job("ps22_split", 4, ps.format(2, 2, "")), "--resume", check=False)
    assert p.returncode != 0 and "no complete checkpoint" in p.stderr, p.stderr

    print("ps_equivalence: S=2 W=2 loss rel %.2g, weights %.2g, grad norm %.2g (step %d; drift %.2g, bound %.2g); "
          "S=3 W=1 loss rel %.2g, weights %.2g, grad norm %.2g (step %d); init_from grad norm %.2g; "
          "bf16 wire loss rel %.2g; rerun and 10+20 resume bitwise equal; without clipping S=3 W=1 bitwise, "
          "S=2 W=2 loss rel %.2g" % (worst["ps22"] + worst["bound"] + worst["ps31"] + (init_norm, bf16_rel, nc_rel)))


if __name__ == "__main__":
    main()
