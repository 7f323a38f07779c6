"""Training throughput of the plain-PyTorch Llama (bench/torch_llama.py): the
anchor that bench/train_throughput.py measures next to herd in the same run.
Prints one JSON line: {"tokens_per_s": ..., "step_s": ..., ...}.
"""
import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_llama  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    for k, v in [("vocab", 256), ("hidden", 128), ("ffn", 384), ("layers", 4), ("heads", 4), ("kv_heads", 2),
                 ("batch", 8), ("seq", 128), ("threads", 2), ("steps", 20), ("warmup", 3)]:
        ap.add_argument("--" + k.replace("_", "-"), type=int, default=v)
    ap.add_argument("--tied", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    s = torch_llama.Shape(a.vocab, a.hidden, a.ffn, a.layers, a.heads, a.kv_heads, tie_word_embeddings=bool(a.tied))
    params = torch_llama.init_params(s)
    for p in params.values():
        p.requires_grad_(True)
    opt = torch_llama.make_optimizer(params, 3e-4, (0.9, 0.95), 1e-8, 0.1)
    data = torch.randint(0, a.vocab, (a.steps + a.warmup, a.batch, a.seq + 1))
    t0 = None
    for i in range(a.steps + a.warmup):
        if i == a.warmup:
            t0 = time.perf_counter()
        x, y = data[i, :, :-1], data[i, :, 1:]
        loss = torch_llama.loss_fn(s, params, x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(params.values()), 1.0)
        opt.step()
    dt = time.perf_counter() - t0
    print(json.dumps({"impl": "pytorch", "torch": torch.__version__, "threads": a.threads,
                      "tokens_per_s": a.steps * a.batch * a.seq / dt, "step_s": dt / a.steps}))


if __name__ == "__main__":
    main()
