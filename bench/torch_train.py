"""Training throughput of the plain-PyTorch Llama (bench/torch_llama.py): the
anchor that bench/train_throughput.py (CPU) and `herd bench gpu` (CUDA)
measure next to herd in the same run. A step is forward, backward,
clip_grad_norm_(1.0) and AdamW, herd's step. One JSON line per mode:
{"impl": "pytorch_eager", "tokens_per_s": ..., "step_s": ..., ...}.

    python3 bench/torch_train.py --threads 2                      # CPU, tiny shape
    python3 bench/torch_train.py --device cuda --dtype bf16 --modes eager,compile \\
        --vocab 49152 --hidden 576 --ffn 1536 --layers 30 --heads 9 --kv-heads 3 \\
        --batch 8 --seq 1024 --peak-tflops 989                      # SmolLM-135M shape

bf16 is PyTorch's usual mixed precision: fp32 master weights and AdamW,
torch.autocast(bfloat16) around forward and loss. MFU uses PaLM's FLOPs
per token, 6N + 12*L*d*T, with N the weights of every matrix product (the
lm_head included, an untied embedding table and the norms' scales not),
as herd does. A mode PyTorch cannot run (torch.compile before 2.0) prints
{"impl": ..., "skipped": "why"}.
"""
import argparse
import contextlib
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_llama  # noqa: E402


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def run_mode(a, mode, device):
    torch.manual_seed(0)
    s = torch_llama.Shape(a.vocab, a.hidden, a.ffn, a.layers, a.heads, a.kv_heads, tie_word_embeddings=bool(a.tied))
    params = {k: p.to(device).requires_grad_(True) for k, p in torch_llama.init_params(s).items()}
    options = {}
    if device.type == "cuda":
        options["fused"] = True  # PyTorch's fastest AdamW on GPUs
    try:
        opt = torch_llama.make_optimizer(params, 3e-4, (0.9, 0.95), 1e-8, 0.1, **options)
    except (TypeError, RuntimeError):
        opt = torch_llama.make_optimizer(params, 3e-4, (0.9, 0.95), 1e-8, 0.1)
    loss_fn = lambda p, x, y: torch_llama.loss_fn(s, p, x, y)  # noqa: E731
    if mode == "compile":
        if not hasattr(torch, "compile"):
            return {"impl": "pytorch_compile", "skipped": f"torch {torch.__version__} has no torch.compile"}
        loss_fn = torch.compile(loss_fn)
    autocast = (torch.autocast(device_type=device.type, dtype=torch.bfloat16) if a.dtype == "bf16"
                else contextlib.nullcontext())
    data = torch.randint(0, a.vocab, (a.steps + a.warmup, a.batch, a.seq + 1), device=device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times, losses = [], []
    for i in range(a.steps + a.warmup):
        x, y = data[i, :, :-1], data[i, :, 1:]
        sync()
        t0 = time.perf_counter()
        with autocast:
            loss = loss_fn(params, x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(params.values()), 1.0)
        opt.step()
        sync()
        dt = time.perf_counter() - t0
        losses.append(float(loss))
        if i >= a.warmup:
            times.append(dt)
        log(f"[pytorch_{mode}] step {i + 1}/{a.steps + a.warmup}: {dt * 1e3:.1f} ms, loss {losses[-1]:.4f}")
    step_s = statistics.median(times)
    n = sum(p.numel() for p in params.values())
    # The weights of matrix products: not the norms' scales, nor an untied
    # embedding table (a lookup); tied, the table is the lm_head.
    products = sum(p.numel() for k, p in params.items()
                   if p.dim() == 2 and not (k == "model.embed_tokens.weight" and not a.tied))
    flops_per_token = 6 * products + 12 * a.layers * a.hidden * a.seq
    out = {"impl": "pytorch_" + mode, "torch": torch.__version__, "device": str(device), "dtype": a.dtype,
           "threads": a.threads, "parameters": n, "batch": a.batch, "seq": a.seq, "steps": a.steps,
           "tokens_per_s": a.batch * a.seq / step_s, "step_s": step_s, "flops_per_token": flops_per_token,
           "loss_first": losses[0], "loss_last": losses[-1]}
    if device.type == "cuda":
        out["device"] = torch.cuda.get_device_name(device)
        out["peak_memory_bytes"] = torch.cuda.max_memory_allocated()
    if a.peak_tflops > 0:
        out["mfu"] = out["tokens_per_s"] * flops_per_token / (a.peak_tflops * 1e12)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for k, v in [("vocab", 256), ("hidden", 128), ("ffn", 384), ("layers", 4), ("heads", 4), ("kv_heads", 2),
                 ("batch", 8), ("seq", 128), ("threads", 2), ("steps", 20), ("warmup", 3)]:
        ap.add_argument("--" + k.replace("_", "-"), type=int, default=v)
    ap.add_argument("--tied", type=int, default=1)
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--modes", default="eager", help="comma list of eager, compile")
    ap.add_argument("--peak-tflops", type=float, default=0.0, help="for MFU (989: H100/H200 bf16 dense)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    device = torch.device(a.device)
    for mode in a.modes.split(","):
        print(json.dumps(run_mode(a, mode.strip(), device)), flush=True)


if __name__ == "__main__":
    main()
