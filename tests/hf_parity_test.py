"""Parity with HuggingFace transformers' own LlamaForCausalLM — the model users
actually run — loaded with from_pretrained from the directory herd reads.
transformers is installed from PyPI into a venv on top of Debian's torch
(BUILD/pyenv, made once); when that is impossible (no network) the test
reports itself skipped (exit 77). Tolerances in tests/parity.py."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import herdtest  # noqa: E402

# The newest transformers that still supports torch 1.13 with Llama + GQA.
TRANSFORMERS = "transformers==4.44.2"


def main():
    a = herdtest.parse_args()
    herdtest.rerun_in_venv(a.build, "pyenv", TRANSFORMERS, "safetensors")

    import torch
    import transformers
    import parity
    from parity import B
    from transformers import LlamaForCausalLM

    report = parity.Report(f"transformers {transformers.__version__} on torch {torch.__version__}")
    dirs = []
    for case in parity.CASES:
        s, params, tokens, ours, hf_dir = parity.make_case(case, a.build)
        dirs.append(os.path.dirname(hf_dir))
        name = case["name"]
        model = LlamaForCausalLM.from_pretrained(hf_dir, attn_implementation="eager", torch_dtype=torch.float32)
        model.train()  # no dropout in Llama; train() keeps autograd semantics plain
        batch = tokens[:B]
        logits = model(batch[:, :-1], use_cache=False).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, s.vocab_size), batch[:, 1:].reshape(-1))
        loss.backward()
        report.check("logits", f"{name} logits", parity.rel(ours["logits"], logits.detach()))
        report.check_loss(f"{name} loss", ours["loss"].item(), loss.item())
        named = dict(model.named_parameters())
        for t in params:
            report.check("grad", f"{name} grad {t}", parity.rel(ours["grad/" + t], named[t].grad))

        # 5 AdamW steps on HF's module with torch's AdamW.
        model = LlamaForCausalLM.from_pretrained(hf_dir, attn_implementation="eager", torch_dtype=torch.float32)
        ps = dict(model.named_parameters())
        o = parity.OPT
        opt = torch.optim.AdamW([{"params": [p for p in ps.values() if p.dim() == 2], "weight_decay": o["wd"]},
                                 {"params": [p for p in ps.values() if p.dim() != 2], "weight_decay": 0.0}],
                                lr=o["lr"], betas=(o["beta1"], o["beta2"]), eps=o["eps"])
        for k in range(parity.STEPS):
            for group in opt.param_groups:
                group["lr"] = parity.torch_llama.lr_at(k, o["lr"], o["min_lr"], o["warmup"], parity.STEPS)
            b = tokens[k * B:(k + 1) * B]
            lg = model(b[:, :-1], use_cache=False).logits
            l = torch.nn.functional.cross_entropy(lg.reshape(-1, s.vocab_size), b[:, 1:].reshape(-1))
            opt.zero_grad()
            l.backward()
            torch.nn.utils.clip_grad_norm_(list(ps.values()), o["clip"])
            opt.step()
            report.check_loss(f"{name} step {k + 1} loss", ours["losses"][k].item(), l.item())
        for t in params:
            report.check("weights", f"{name} after 5 steps {t}", parity.rel(ours["final/" + t], ps[t].detach()))
    report.finish(cleanup=dirs)


if __name__ == "__main__":
    main()
