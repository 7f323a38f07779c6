"""Shared set-up of the parity tests (torch_parity_test.py, hf_parity_test.py):
random Llama weights written as a HuggingFace directory, token batches,
herd's results from tests/tools/model_dump, and the comparisons with their
stated tolerances. Not a test itself."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "bench"))
import torch_llama  # noqa: E402

B, T, STEPS = 2, 9, 5
# lr 1e-3: large enough that a wrong AdamW term moves weights by ~1e-3
# (100x the tolerance), small enough that Adam's normalisation of
# near-zero gradient elements (m / sqrt(v) ~ sign(g)) does not amplify
# float32 rounding noise past the tolerance over 5 steps.
OPT = dict(lr=1e-3, min_lr=1e-4, warmup=2, clip=0.5, wd=0.1, beta1=0.9, beta2=0.95, eps=1e-8)
# Tolerances: logits, gradients and weights after 5 steps
# relative to the tensor's largest magnitude; loss relative to its value.
TOL = dict(logits=1e-5, loss=1e-6, grad=1e-5, weights=1e-5)

CASES = [
    dict(name="tied_gqa", vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
         num_attention_heads=4, num_key_value_heads=2, rope_theta=10000.0, rms_norm_eps=1e-5,
         tie_word_embeddings=True),
    dict(name="untied_gqa", vocab_size=61, hidden_size=48, intermediate_size=40, num_hidden_layers=3,
         num_attention_heads=6, num_key_value_heads=2, rope_theta=500000.0, rms_norm_eps=1e-6,
         tie_word_embeddings=False),
    dict(name="untied_mha", vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
         num_attention_heads=4, num_key_value_heads=4, rope_theta=10000.0, rms_norm_eps=1e-5,
         tie_word_embeddings=False),
]


def make_case(case, build, seed=0):
    """Writes the HF directory and tokens; runs model_dump. Returns
    (shape, params, tokens [STEPS*B, T+1], herd results, hf dir)."""
    d = tempfile.mkdtemp(prefix="herd_parity_")
    shape_args = {k: v for k, v in case.items() if k != "name"}
    s = torch_llama.Shape(**shape_args)
    params = torch_llama.init_params(s, seed=seed, std=0.2)
    g = torch.Generator().manual_seed(seed + 1)
    for name, p in params.items():
        if p.dim() == 1:  # norms away from 1 so that their gradients matter
            params[name] = 1.0 + 0.1 * torch.randn(p.shape, generator=g)
    hf = os.path.join(d, "hf")
    os.makedirs(hf)
    cfg = dict(shape_args, architectures=["LlamaForCausalLM"], model_type="llama", hidden_act="silu",
               max_position_embeddings=64, attention_bias=False, mlp_bias=False, torch_dtype="float32",
               initializer_range=0.02, rope_scaling=None)
    with open(os.path.join(hf, "config.json"), "w") as f:
        json.dump(cfg, f)
    torch_llama.save_safetensors(os.path.join(hf, "model.safetensors"), params)
    tokens = torch.randint(0, s.vocab_size, (STEPS * B, T + 1), generator=g, dtype=torch.int64)
    tokens.to(torch.int32).numpy().tofile(os.path.join(d, "tokens.i32"))
    out = os.path.join(d, "herd.safetensors")
    o = OPT
    subprocess.run([os.path.join(build, "tests", "model_dump"), hf, os.path.join(d, "tokens.i32"), str(B), str(T),
                    str(STEPS), str(o["lr"]), str(o["min_lr"]), str(o["warmup"]), str(o["clip"]), str(o["wd"]),
                    str(o["beta1"]), str(o["beta2"]), str(o["eps"]), out], check=True)
    return s, params, tokens, torch_llama.load_safetensors(out), hf


def rel(a, b):
    return ((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-30)).item()


class Report:
    """Collects worst figures per category and failures."""

    def __init__(self, label):
        self.label, self.worst, self.failures = label, {}, []

    def check_loss(self, what, ours, ref):
        self.check("loss", what, abs(ours - ref) / abs(ref))

    def check(self, category, what, value):
        self.worst[category] = max(self.worst.get(category, 0.0), value)
        if not value <= TOL[category]:
            self.failures.append(f"{what}: {value:.3g} > tolerance {TOL[category]:g} ({category})")

    def finish(self, cleanup=()):
        for d in cleanup:
            shutil.rmtree(d, ignore_errors=True)
        figures = ", ".join(f"{k} {v:.2e} (tol {TOL[k]:g})" for k, v in self.worst.items())
        print(f"{self.label}: worst {figures}")
        if self.failures:
            print("\n".join(self.failures))
            sys.exit(1)


def train_reference(s, params, tokens, forward_loss):
    """5 AdamW steps in torch: herd's schedule, clipping, decay on 2-D only."""
    ps = {k: v.clone().requires_grad_(True) for k, v in params.items()}
    o = OPT
    opt = torch_llama.make_optimizer(ps, o["lr"], (o["beta1"], o["beta2"]), o["eps"], o["wd"])
    losses = []
    for k in range(STEPS):
        for group in opt.param_groups:
            group["lr"] = torch_llama.lr_at(k, o["lr"], o["min_lr"], o["warmup"], STEPS)
        batch = tokens[k * B:(k + 1) * B]
        loss = forward_loss(ps, batch[:, :-1], batch[:, 1:])
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(ps.values()), o["clip"])
        opt.step()
        losses.append(loss.item())
    return ps, losses
