"""Bytes a tensor-parallel layer puts on the wire, against Megatron's
formulas: one group of W ranks on emulated nodes (bench/lab_compare.py's
tensor and tensor_sp modes: scripts/netlab.py namespaces, UCX over TCP,
the kernel's link counters), run at two depths; a layer's bytes per step
are the difference over the layers added, so that the embedding, the
head, the cross-entropy's statistics and the norms' gradients, which do
not grow with depth, drop out.

Megatron's figures per layer and micro-batch of b x s tokens of h floats,
each way on a rank's link (a ring's (n-1)/n of the buffer per
reduce-scatter or all-gather, an all-reduce two of them):

  tensor:            4 all-reduces of b*s*h            = 8 (n-1)/n b*s*h*4 bytes
  sequence parallel: 4 all-gathers + 4 reduce-scatters = the same volume
                     (Korthikanti et al.), and Megatron-LM's backward
                     gathers the two norms' outputs again for the weight
                     gradients (it keeps their rows alone, as herd does):
                     10 (n-1)/n b*s*h*4 bytes

One JSON line per mode:

  {"bench": "tensor_traffic", "mode": "tensor_sp", "layers": [2, 6], "per_layer_MB": {"tx": .., "rx": ..},
   "megatron_MB": .., "megatron_as_built_MB": .., "ratio": {"tx": .., "rx": ..}, "plan_per_layer_MB": ..}

`ratio` is the measured per-layer bytes over the formula herd follows
(tensor: Megatron's; tensor_sp: Megatron-LM's as built), the mean of the
workers' links.

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


def hidden_size(config, sets):
    """model.hidden_size: the last --set of it, else the config's."""
    for x in reversed(sets):
        if x.startswith("model.hidden_size="):
            return int(x.split("=")[1])
    with open(config) as f:
        m = re.search(r"\bhidden_size:\s*(\d+)", f.read())
    return int(m.group(1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--config", default=os.path.join(ROOT, "configs/llama20m.textproto"))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--layers", default="2,6", help="the two depths")
    ap.add_argument("--rate", default="10gbit")
    ap.add_argument("--modes", default="tensor,tensor_sp")
    ap.add_argument("--steps", type=int, default=14)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--set", action="append", default=[])
    args = ap.parse_args()
    args.set = ["train.batch_size=1", "train.seq_len=256", "optimizer.clip_norm=0"] + args.set
    args.config = os.path.abspath(args.config)
    scratch = tempfile.mkdtemp(prefix="herd_tensor_traffic_")
    subprocess.run([os.path.join(args.build, "herd"), "prepare", os.path.join(ROOT, "README.md"), "--out",
                    os.path.join(scratch, "train.bin")], check=True, capture_output=True)
    low, high = (int(x) for x in args.layers.split(","))
    base_sets = list(args.set)
    W = args.workers
    for mode in args.modes.split(","):
        measured, planned = {}, {}
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
        per_layer = {k: (measured[high][k] - measured[low][k]) / (high - low) for k in ("tx", "rx")}
        b, s = (int(next(x.split("=")[1] for x in reversed(base_sets) if x.startswith(key)))
                for key in ("train.batch_size=", "train.seq_len="))
        h = hidden_size(args.config, base_sets)
        micro = W  # lab_compare's tensor modes: the global batch as W micro-batches
        half = (W - 1) / W * b * s * h * 4 * micro
        megatron = 8 * half
        as_built = 10 * half if mode == "tensor_sp" else megatron
        print(json.dumps({
            "bench": "tensor_traffic", "mode": mode, "workers": W, "rate": args.rate, "layers": [low, high],
            "tokens": [b, s], "hidden": h, "micro_batches": micro,
            "per_layer_MB": {k: round(v / 1e6, 4) for k, v in per_layer.items()},
            "megatron_MB": round(megatron / 1e6, 4), "megatron_as_built_MB": round(as_built / 1e6, 4),
            "ratio": {k: round(v / as_built, 4) for k, v in per_layer.items()},
            "plan_per_layer_MB": round((planned[high] - planned[low]) / (high - low) / 1e6, 4)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
