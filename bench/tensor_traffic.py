"""Bytes a tensor- or context-parallel layer puts on the wire, against
the formulas: one group of W ranks on emulated nodes (bench/lab_compare.py's
tensor, tensor_sp and context modes: scripts/netlab.py namespaces, UCX
over TCP, the kernel's link counters), run at two depths; a layer's bytes
per step are the difference over the layers added, so that the
embedding, the head, the cross-entropy's statistics and the norms'
gradients, which do not grow with depth, drop out.

Megatron's figures per layer and micro-batch of b x s tokens of h floats,
each way on a rank's link (a ring's (n-1)/n of the buffer per
reduce-scatter or all-gather, an all-reduce two of them):

  tensor:            4 all-reduces of b*s*h            = 8 (n-1)/n b*s*h*4 bytes
  sequence parallel: 4 all-gathers + 4 reduce-scatters = the same volume
                     (Korthikanti et al.), and Megatron-LM's backward
                     gathers the two norms' outputs again for the weight
                     gradients (it keeps their rows alone, as herd does):
                     10 (n-1)/n b*s*h*4 bytes
  context:           the keys and values (2 b*s*kv floats) gathered
                     forward, gathered again backward and their gradients
                     reduce-scattered (Transformer Engine's all-gather
                     context parallelism; ring attention passes the same
                     (n-1)/n of them): 3 (n-1)/n 2 b*s*kv*4 bytes; and, as
                     the ranks are data-parallel for the weights, the
                     layer's gradients all-reduced: 2 (n-1)/n of them

One JSON line per mode:

  {"bench": "tensor_traffic", "mode": "tensor_sp", "layers": [2, 6], "per_layer_MB": {"tx": .., "rx": ..},
   "megatron_MB": .., "megatron_as_built_MB": .., "ratio": {"tx": .., "rx": ..}, "plan_per_layer_MB": ..}

`ratio` is the measured per-layer bytes over the formula herd follows
(tensor: Megatron's; tensor_sp: Megatron-LM's as built; context: the
above), the mean of the workers' links; for context, "kv_ratio" is the
keys' and values' part alone: the measured bytes less those of DDP on the
same workers and depths (its gradients' all-reduce, measured alike).

    sudo /usr/bin/python3 bench/tensor_traffic.py [--build build] [--workers 2] [--layers 2,6]
        [--rate 10gbit] [--steps 14] [--warmup 2] [--set path=value ...]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import lab_compare  # noqa: E402


def model_field(config, sets, field):
    """model.FIELD: the last --set of it, else the config's."""
    for x in reversed(sets):
        if x.startswith(f"model.{field}="):
            return int(x.split("=")[1])
    with open(config) as f:
        m = re.search(rf"\b{field}:\s*(\d+)", f.read())
    return int(m.group(1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--config", default=os.path.join(ROOT, "configs/llama20m.textproto"))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--layers", default="2,6", help="the two depths")
    ap.add_argument("--rate", default="10gbit")
    ap.add_argument("--modes", default="tensor,tensor_sp,context")
    ap.add_argument("--steps", type=int, default=14)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--set", action="append", default=[])
    args = ap.parse_args()
    args.set = lab_compare.with_defaults(["train.batch_size=1", "train.seq_len=256", "optimizer.clip_norm=0"], args.set)
    args.config = os.path.abspath(args.config)
    scratch = tempfile.mkdtemp(prefix="herd_tensor_traffic_")
    subprocess.run([os.path.join(args.build, "herd"), "prepare", os.path.join(ROOT, "README.md"), "--out",
                    os.path.join(scratch, "train.bin")], check=True, capture_output=True)
    low, high = (int(x) for x in args.layers.split(","))
    base_sets = list(args.set)
    W = args.workers
    per_layer_of = {}
    modes = args.modes.split(",")
    if "context" in modes:
        modes.insert(modes.index("context"), "allreduce")  # its gradients' bytes, measured
    for mode in modes:
        measured, planned, parameters = {}, {}, {}
        for layers in (low, high):
            args.set = base_sets + [f"model.num_hidden_layers={layers}"]
            # lab_compare's jobs read ../train.bin from a directory per mode and rate.
            here = os.path.join(scratch, f"{mode}_{layers}_layers")
            os.makedirs(here)
            os.symlink(os.path.join(scratch, "train.bin"), os.path.join(here, "train.bin"))
            r = lab_compare.run_mode(args, mode, args.rate, here)
            links = r["worker_link_MB"]
            measured[layers] = {k: statistics.mean(l[k] for l in links) * 1e6 for k in ("tx", "rx")}
            planned[layers] = lab_compare.planned_bytes(args, mode)[0]
            parameters[layers] = json.loads(subprocess.run(
                lab_compare.with_sets([os.path.join(args.build, "herd"), "plan", args.config, "--json"], args.set),
                capture_output=True, text=True, check=True).stdout)["parameters"]
        per_layer = {k: (measured[high][k] - measured[low][k]) / (high - low) for k in ("tx", "rx")}
        per_layer_of[mode] = per_layer
        if mode == "allreduce":
            continue
        b, s = (int(next(x.split("=")[1] for x in reversed(base_sets) if x.startswith(key)))
                for key in ("train.batch_size=", "train.seq_len="))
        h = model_field(args.config, base_sets, "hidden_size")
        micro = W  # lab_compare's tensor and context modes: the global batch as W micro-batches
        ring = (W - 1) / W
        line = {"bench": "tensor_traffic", "mode": mode, "workers": W, "rate": args.rate, "layers": [low, high],
                "tokens": [b, s], "hidden": h, "micro_batches": micro,
                "per_layer_MB": {k: round(v / 1e6, 4) for k, v in per_layer.items()},
                "plan_per_layer_MB": round((planned[high] - planned[low]) / (high - low) / 1e6, 4)}
        if mode == "context":
            kv = h // model_field(args.config, base_sets, "num_attention_heads") * \
                model_field(args.config, base_sets, "num_key_value_heads")
            keys_values = 3 * ring * 2 * b * s * kv * 4 * micro
            grads = 2 * ring * (parameters[high] - parameters[low]) / (high - low) * 4
            line.update({"kv_dim": kv, "formula_MB": round((keys_values + grads) / 1e6, 4),
                         "keys_values_MB": round(keys_values / 1e6, 4), "gradients_MB": round(grads / 1e6, 4),
                         "ratio": {k: round(v / (keys_values + grads), 4) for k, v in per_layer.items()},
                         "ddp_per_layer_MB": {k: round(v / 1e6, 4) for k, v in per_layer_of["allreduce"].items()},
                         "kv_ratio": {k: round((v - per_layer_of["allreduce"][k]) / keys_values, 4)
                                      for k, v in per_layer.items()}})
        else:
            half = ring * b * s * h * 4 * micro
            megatron = 8 * half
            as_built = 10 * half if mode == "tensor_sp" else megatron
            line.update({"megatron_MB": round(megatron / 1e6, 4), "megatron_as_built_MB": round(as_built / 1e6, 4),
                         "ratio": {k: round(v / as_built, 4) for k, v in per_layer.items()}})
        print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
