"""Parity with a Llama written in plain PyTorch ops (bench/torch_llama.py, on
Debian's python3-torch): same weights give the same logits, loss, every
gradient, and the same weights after 5 AdamW steps with warm-up and
clipping. Tolerances in tests/parity.py."""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import herdtest  # noqa: E402
import parity  # noqa: E402
from parity import B, torch_llama  # noqa: E402


def main():
    a = herdtest.parse_args()
    torch.manual_seed(0)
    report = parity.Report("plain torch")
    exact = parity.Report("herd vs float64 torch (information)")
    dirs = []
    for case in parity.CASES:
        s, params, tokens, ours, hf = parity.make_case(case, a.build)
        dirs.append(os.path.dirname(hf))
        name = case["name"]
        ps = {k: v.clone().requires_grad_(True) for k, v in params.items()}
        batch = tokens[:B]
        logits = torch_llama.forward(s, ps, batch[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, s.vocab_size), batch[:, 1:].reshape(-1))
        loss.backward()
        report.check("logits", f"{name} logits", parity.rel(ours["logits"], logits.detach()))
        report.check_loss(f"{name} loss", ours["loss"].item(), loss.item())
        for t, p in ps.items():
            report.check("grad", f"{name} grad {t}", parity.rel(ours["grad/" + t], p.grad))
        trained, losses = parity.train_reference(s, params, tokens, lambda p, x, y: torch_llama.loss_fn(s, p, x, y))
        for k, (ours_loss, ref_loss) in enumerate(zip(ours["losses"].tolist(), losses)):
            report.check_loss(f"{name} step {k + 1} loss", ours_loss, ref_loss)
        for t, p in trained.items():
            report.check("weights", f"{name} after 5 steps {t}", parity.rel(ours["final/" + t], p.detach()))
        # The same 5 steps in float64: how far each float32 implementation
        # is from the exact trajectory (herd should not be the farther one).
        exact64, _ = parity.train_reference(s, {k: v.double() for k, v in params.items()}, tokens,
                                            lambda p, x, y: torch_llama.loss_fn(s, p, x, y))
        for t in params:
            exact.check("weights", f"{name} {t}", parity.rel(ours["final/" + t], exact64[t].detach()))
    exact.finish()
    report.finish(cleanup=dirs)


if __name__ == "__main__":
    main()
