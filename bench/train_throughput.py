"""Training tokens/s of herd next to the same model in plain PyTorch, on the
same thread count, measured in the same run. One JSON line per figure.

    python3 bench/train_throughput.py [--build build] [--threads 2]

Configs: configs/tiny.textproto and configs/llama20m.textproto (herd's
shapes; PyTorch gets the identical shape, batch and sequence length). Use
Debian's /usr/bin/python3 (python3-torch lives there).
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# name, config, herd steps, torch steps; shapes mirror the configs.
CASES = [
    ("tiny", "configs/tiny.textproto", 30, 20,
     dict(vocab=256, hidden=128, ffn=384, layers=4, heads=4, kv_heads=2, batch=8, seq=128)),
    ("llama20m", "configs/llama20m.textproto", 6, 4,
     dict(vocab=256, hidden=512, ffn=1024, layers=8, heads=8, kv_heads=4, batch=8, seq=256)),
]


def run_json(cmd, env):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env, cwd=ROOT).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--only", default="")
    a = ap.parse_args()
    herd = os.path.join(a.build, "herd")
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    for name, config, herd_steps, torch_steps, shape in CASES:
        if a.only and name != a.only:
            continue
        ours = run_json([herd, "bench", "train", config, "--steps", str(herd_steps),
                         "--set", f"train.threads={a.threads}"], env)
        torch_cmd = ["/usr/bin/python3", os.path.join(HERE, "torch_train.py"), "--threads", str(a.threads),
                     "--steps", str(torch_steps)]
        for k, v in shape.items():
            torch_cmd += ["--" + k.replace("_", "-"), str(v)]
        theirs = run_json(torch_cmd, env)
        print(json.dumps({"bench": "train_tokens_per_s", "config": name, "threads": a.threads,
                          "herd_tokens_per_s": round(ours["tokens_per_s"], 1),
                          "pytorch_tokens_per_s": round(theirs["tokens_per_s"], 1),
                          "ratio": round(ours["tokens_per_s"] / theirs["tokens_per_s"], 2),
                          "pytorch": theirs["torch"], "parameters": ours["parameters"]}), flush=True)


if __name__ == "__main__":
    sys.exit(main())
