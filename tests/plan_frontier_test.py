"""`herd plan --frontier`: the deepest model of a width that fits each mode
within a per-process budget, and which standard shapes fit, as the ZeRO
paper tabulates it — and its predictions hold when run.

  - the ~20M width (d512) at 8 x 256 tokens, 2 servers and 1 worker,
    1 GiB a process: every mode fits some depth; what a worker no longer
    holds only helps (ZeRO-1 >= DDP, ZeRO-2 >= ZeRO-1, PS >= ZeRO-1, PS + recompute >= PS,
    strictly more for recompute here, where activations bind; streaming
    more than PS, and streaming + recompute the most); a shape
    said to fit has its largest process within the budget, one said not
    to, beyond it (less the 2% the planner leaves for rounding);
  - the deepest model it names for each PS mode trains a step here,
    every process's measured peak RSS within the budget and within 10% of
    its plan;
  - at W=4 a hybrid row (ZeRO-3 in 2 groups) needs at least ZeRO-3's memory,
    the pipeline rows (a stage a worker) fit at least DDP's depth and
    deeper than PS, and the tensor-parallel row (one group of four) deeper
    than DDP, marking the shapes whose heads four does not split, and the
    context-parallel row (one group of four) deeper than DDP too;
  - --frontier without a budget is refused in one line."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import herdtest  # noqa: E402

BUDGET = 1 << 30
CONFIG = herdtest.LLAMA20M_MODEL + """
train { steps: 1 batch_size: 8 seq_len: 256 seed: 7 }
data { train: "train.bin" }
log { every: 1 sample_tokens: 0 }
cluster { sync: PARAMETER_SERVER servers: 2 workers: 1 }
"""


def main():
    a = herdtest.parse_args()
    sb = herdtest.Sandbox(a.build)
    sb.training_data()
    cfg = sb.write("job.textproto", CONFIG)
    frontier = json.loads(sb.run("plan", cfg, "--mem", str(BUDGET), "--frontier", "--json").stdout)["frontier"]
    modes = {f["mode"]: f for f in frontier}
    assert list(modes) == ["DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3", "PS", "PS + recompute", "PS + streaming",
                           "PS + streaming + recompute"], list(modes)
    layers = {m: f["layers"] for m, f in modes.items()}
    assert min(layers.values()) >= 1, layers
    assert layers["ZeRO-1"] >= layers["DDP"] and layers["PS"] >= layers["ZeRO-1"], layers
    assert layers["ZeRO-2"] >= layers["ZeRO-1"], layers
    assert layers["PS + recompute"] > layers["PS"], layers
    assert layers["PS + streaming"] > layers["PS"], layers
    assert layers["PS + streaming + recompute"] > max(layers["PS + recompute"], layers["PS + streaming"]), layers
    for m, f in modes.items():
        for shape, s in f["shapes"].items():
            assert s["fits"] == (s["largest_process"] <= 0.98 * BUDGET), (m, shape, s)  # 2% headroom
    print("ok  deepest at d512 within 1 GiB a process: " + ", ".join(f"{m} {n} layers" for m, n in layers.items()))

    # Four workers add hybrid sharding (ZeRO-3 in 2 groups of 2): each
    # worker holds twice ZeRO-3's slices, never less than ZeRO-3 does.
    four = json.loads(sb.run("plan", cfg, "--mem", str(BUDGET), "--frontier", "--json", "--set",
                             "cluster.workers=4").stdout)["frontier"]
    four = {f["mode"]: f for f in four}
    hsdp, z3 = four["HSDP (ZeRO-3, 2 groups)"], four["ZeRO-3"]
    assert list(four).index("HSDP (ZeRO-3, 2 groups)") == 4 and 1 <= hsdp["layers"] <= z3["layers"], four
    assert all(s["largest_process"] >= z3["shapes"][k]["largest_process"] for k, s in hsdp["shapes"].items()), four
    print(f"ok  at W=4, HSDP (ZeRO-3, 2 groups) {hsdp['layers']} layers, ZeRO-3 {z3['layers']}")
    # And pipeline rows: a stage a worker holds a quarter of the weights,
    # gradients and (all-reduce) AdamW state, and its layers' activations
    # for the micro-batches in flight (1F1B's first stage: four, a whole
    # model's worth of one micro-batch, as DDP holds; here, where
    # activations bind, no deeper than DDP, but deeper than PS).
    pp, ps_pp = four["pipeline stages"], four["PS + pipeline stages"]
    assert pp["layers"] >= four["DDP"]["layers"] and ps_pp["layers"] > four["PS"]["layers"], four
    for f in (pp, ps_pp):
        for shape, sh in f["shapes"].items():
            assert sh["fits"] == (sh["largest_process"] <= 0.98 * BUDGET), (f["mode"], shape, sh)
    print(f"ok  at W=4, pipeline {pp['layers']} layers (DDP {four['DDP']['layers']}), "
          f"PS pipeline {ps_pp['layers']} (PS {four['PS']['layers']})")
    # And a tensor-parallel row: each of the four holds a quarter of the
    # weights, gradients and AdamW state and of the heads' and MLP's
    # activations: deeper than DDP; shapes whose heads four does not split
    # are marked so.
    tp = four["tensor parallel"]
    assert tp["layers"] > four["DDP"]["layers"], four
    assert not tp["shapes"]["SmolLM-135M"]["splits"], tp  # 9 heads
    for shape, sh in tp["shapes"].items():
        if sh.get("splits", True):
            assert sh["fits"] == (sh["largest_process"] <= 0.98 * BUDGET), ("tensor parallel", shape, sh)
    print(f"ok  at W=4, tensor parallel {tp['layers']} layers (DDP {four['DDP']['layers']})")
    # The same group on parameter servers, and two stages of a group of
    # two: each holds a part of every layer it computes, deeper than DDP.
    ps_tp, pp_tp = four["PS + tensor parallel"], four["pipeline 2 x tensor"]
    assert ps_tp["layers"] > four["DDP"]["layers"] and pp_tp["layers"] > four["DDP"]["layers"], four
    for f in (ps_tp, pp_tp):
        for shape, sh in f["shapes"].items():
            if sh.get("splits", True):
                assert sh["fits"] == (sh["largest_process"] <= 0.98 * BUDGET), (f["mode"], shape, sh)
    print(f"ok  at W=4, PS + tensor parallel {ps_tp['layers']} layers, pipeline 2 x tensor 2 {pp_tp['layers']}")
    # And a context-parallel row: each of the four holds every weight but a
    # quarter of each sequence's activations, where they bind: deeper
    # than DDP.
    cp = four["context parallel"]
    assert cp["layers"] > four["DDP"]["layers"], four
    for shape, sh in cp["shapes"].items():
        assert sh["fits"] == (sh["largest_process"] <= 0.98 * BUDGET), ("context parallel", shape, sh)
    print(f"ok  at W=4, context parallel {cp['layers']} layers (DDP {four['DDP']['layers']})")

    for mode, recompute, stream in (("PS", "NONE", False), ("PS + recompute", "FULL", False),
                                    ("PS + streaming", "NONE", True), ("PS + streaming + recompute", "FULL", True)):
        name = "deep_" + recompute.lower() + ("_streamed" if stream else "")
        text = CONFIG.replace("num_hidden_layers: 8", f"num_hidden_layers: {layers[mode]}").replace(
            "seed: 7 }", f"seed: 7 recompute: {recompute} }}").replace(
            "sample_tokens: 0 }", f'sample_tokens: 0 summary_dir: "{name}" }}').replace(
            "workers: 1 }", f"workers: 1 stream_weights: {'true' if stream else 'false'} }}")
        deep = sb.write(name + ".textproto", text)
        plan = json.loads(sb.run("plan", deep, "--json").stdout)
        sb.run("launch", deep)
        report = []
        for proc in plan["processes"]:
            with open(sb.path(name, f"{proc['role']}_{max(proc['rank'], 0):05d}.json")) as f:
                peak = json.load(f)["peak_rss_bytes"]
            who = f"{proc['role']} {max(proc['rank'], 0)}"
            assert peak <= BUDGET, f"{mode}, {layers[mode]} layers: {who} peaked at {peak} bytes, over the budget"
            assert 0.9 <= peak / proc["total"] <= 1.1, f"{mode}: {who} measured {peak}, planned {proc['total']}"
            report.append(f"{who} {peak / 2**20:.0f}/{proc['total'] / 2**20:.0f} MiB")
        print(f"ok  {mode}: {layers[mode]} layers ({plan['parameters'] / 1e6:.0f}M) trained a step; "
              "measured/planned " + ", ".join(report))

    p = sb.run("plan", cfg, "--frontier", check=False)
    assert p.returncode == 2 and "--frontier needs a budget" in p.stderr, p.stderr
    assert sum(line.startswith("herd: error:") for line in p.stderr.splitlines()) == 1, p.stderr


if __name__ == "__main__":
    main()
