"""herd and HuggingFace transformers agree on what a config.json means, in
both directions and for both of its forms: 4.x's (top-level rope_theta,
rope_scaling) and 5.x's (rope_parameters).

transformers 4.x and 5.x are installed from PyPI into venvs on top of
Debian's python3-torch 1.13 (BUILD/venv-transformers4 and
BUILD/venv-transformers5, made once); without network the test reports
itself skipped (exit 77). Neither version's modelling code runs on torch
1.13 (4.57 wants torch >= 2.1, 5.x >= 2.6), so transformers does what it
does without it: LlamaConfig(...).save_pretrained writes every config.json
and AutoConfig.from_pretrained reads herd's export; its own
_compute_llama3_parameters (given torch) computes the llama3 inverse
frequencies. The PyTorch forward is bench/torch_llama.py, whose inverse
frequencies are checked equal to transformers'. Weights are written with
the safetensors package.

For each version:
  (a, b) a 3-layer GQA model with rope_theta 500000 and one with Llama 3.1
    ("llama3") RoPE scaling, configs written by transformers: `herd eval`'s
    loss equals the PyTorch forward's within 1e-5 (relative); every
    model-changing key herd does not implement (head_dim != hidden/heads,
    biases, hidden_act, other rope types, partial rotary, dropout) gives
    one `herd: error:` line naming config.json and the key, and a non-zero
    exit.
  (c) `herd import` then `herd export` of both models: transformers reads
    the exported config.json as the same model (every field, rope_theta,
    the scaling, dtype, no warnings), and the PyTorch forward built from
    what transformers read gives herd's loss within 1e-5.
"""
import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "bench"))
import herdtest  # noqa: E402

VERSIONS = {"4": "transformers==4.57.6", "5": "transformers==5.23.0"}
SAFETENSORS = "safetensors==0.8.0"
TOL = 1e-5

SHAPE = dict(vocab_size=96, hidden_size=48, intermediate_size=64, num_hidden_layers=3, num_attention_heads=3,
             num_key_value_heads=1, rms_norm_eps=1e-5, tie_word_embeddings=False, max_position_embeddings=256)
THETA = 500000.0
# head_dim 16, theta 5e5: wavelengths 6.3, 32.6, 169, ... — one frequency
# kept (< 64/4), one interpolated, the rest divided by the factor.
LLAMA3 = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
              original_max_position_embeddings=64)
B, T, BATCHES = 2, 64, 2


# ---------------------------------------------------------------- venvs

def child(py, *args):
    """This script's transformers side, run in a venv; returns its JSON."""
    p = subprocess.run([py, __file__, "--child", *args], capture_output=True, text=True)
    if p.returncode != 0:
        raise AssertionError(f"{py} {' '.join(args)} failed:\n{p.stdout}{p.stderr}")
    return json.loads(p.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------- transformers side (in a venv)

def cases(major):
    """name -> (LlamaConfig kwargs, (needles of the error) or None)."""
    def rope(scaling, theta=THETA):
        # Each version's own spelling: 4.x top-level rope_theta + rope_scaling,
        # 5.x one rope_parameters dict.
        if major == "4":
            return dict(rope_theta=theta, rope_scaling=scaling)
        return dict(rope_parameters=dict(scaling or dict(rope_type="default"), rope_theta=theta))

    where = "rope_scaling" if major == "4" else "rope_parameters"
    out = {
        "theta500k": (rope(None), None),
        "llama3": (rope(dict(LLAMA3)), None),
        "head_dim": (dict(rope(None), head_dim=8), ["\"head_dim\"", "8", "16"]),
        "attention_bias": (dict(rope(None), attention_bias=True), ["\"attention_bias\""]),
        "mlp_bias": (dict(rope(None), mlp_bias=True), ["\"mlp_bias\""]),
        "hidden_act": (dict(rope(None), hidden_act="gelu"), ["\"hidden_act\"", "gelu"]),
        "attention_dropout": (dict(rope(None), attention_dropout=0.1), ["\"attention_dropout\"", "0.1"]),
        "linear": (rope(dict(rope_type="linear", factor=2.0)), [f"\"{where}.rope_type\"", "linear"]),
        "dynamic": (rope(dict(rope_type="dynamic", factor=2.0)), [f"\"{where}.rope_type\"", "dynamic"]),
        "yarn": (rope(dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=64)),
                 [f"\"{where}.rope_type\"", "yarn"]),
    }
    if major == "5":  # 4.x's Llama has no partial rotary embeddings
        out["partial_rotary"] = (dict(rope_parameters=dict(rope_type="default", rope_theta=THETA,
                                                           partial_rotary_factor=0.5)),
                                 ["\"rope_parameters.partial_rotary_factor\"", "0.5"])
    return out


def transformers_rope(config, major):
    """(rope_theta, scaling dict or None, llama3 inv_freq or None) as this
    transformers understands `config`."""
    import torch
    import transformers.modeling_rope_utils as ru
    ru.torch = torch  # disabled for torch < 2.1 / 2.6; its RoPE maths is plain torch
    if major == "4":
        theta, scaling = config.rope_theta, config.rope_scaling
    else:
        params = dict(config.rope_parameters)
        theta = params.pop("rope_theta")
        scaling = None if params.get("rope_type") == "default" else params
    inv_freq = None
    if scaling and scaling.get("rope_type") == "llama3":
        inv_freq = ru._compute_llama3_parameters(config, "cpu")[0].tolist()
    return theta, scaling, inv_freq


def child_main(args):
    import logging
    import warnings

    import torch
    import transformers
    from safetensors.torch import save_file
    from transformers import AutoConfig, LlamaConfig

    import torch_llama

    major = transformers.__version__.split(".")[0]
    messages = []

    class Collect(logging.Handler):
        def emit(self, record):
            messages.append(record.getMessage())

    logging.getLogger("transformers").addHandler(Collect(level=logging.WARNING))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")

        def said():  # what transformers warned about since the last call
            out = messages + [str(w.message) for w in caught]
            messages.clear()
            caught.clear()
            return out

        if args[0] == "write":
            out = args[1]
            shape = {k: v for k, v in SHAPE.items() if k != "max_position_embeddings"}
            params = torch_llama.init_params(torch_llama.Shape(**shape), seed=3, std=0.2)
            g = torch.Generator().manual_seed(4)
            for name, p in params.items():
                if p.dim() == 1:
                    params[name] = 1.0 + 0.1 * torch.randn(p.shape, generator=g)
            result = {"version": transformers.__version__, "cases": {}}
            for name, (kwargs, needles) in cases(major).items():
                d = os.path.join(out, name)
                config = LlamaConfig(**SHAPE, **kwargs)
                config.save_pretrained(d)
                save_file({k: v.contiguous() for k, v in params.items()}, os.path.join(d, "model.safetensors"),
                          metadata={"format": "pt"})
                theta, scaling, inv_freq = transformers_rope(config, major) if needles is None else (0, None, None)
                result["cases"][name] = dict(dir=d, needles=needles, theta=theta, scaling=scaling, inv_freq=inv_freq,
                                             messages=said())
        else:  # read DIR: herd's export as this transformers sees it
            config = AutoConfig.from_pretrained(args[1])
            theta, scaling, inv_freq = transformers_rope(config, major)
            keys = ["model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                    "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps", "tie_word_embeddings",
                    "hidden_act", "attention_bias", "mlp_bias", "max_position_embeddings"]
            result = {k: getattr(config, k) for k in keys}
            result.update(theta=theta, scaling=scaling, inv_freq=inv_freq, architectures=config.architectures,
                          dtype=str(config.dtype).replace("torch.", ""), messages=said())
    print(json.dumps(result))


# ---------------------------------------------------------------- herd side

def reference_loss(shape, params, tokens):
    """Mean cross-entropy of the PyTorch forward over herd eval's windows."""
    import torch
    import torch_llama
    windows = torch.stack([tokens[w * T:w * T + T + 1] for w in range(B * BATCHES)]).long()
    with torch.no_grad():
        return torch_llama.loss_fn(shape, params, windows[:, :-1], windows[:, 1:]).item()


def herd_loss(sb, model):
    p = sb.run("eval", model, "--data", "tokens.u16", "--seq-len", str(T), "--batch-size", str(B), "--batches",
               str(BATCHES), "--threads", "1")
    return json.loads(p.stdout)["loss"]


def expect_refused(sb, model, needles):
    p = sb.run("eval", model, "--data", "tokens.u16", "--seq-len", str(T), "--batch-size", str(B), check=False)
    errors = [l for l in p.stderr.splitlines() if l.startswith("herd: error:")]
    assert p.returncode != 0, f"{model}: exit code 0 (loss {p.stdout.strip()})"
    assert len(errors) == 1 and len(p.stderr.strip().splitlines()) == 1, f"{model}: expected one error line:\n{p.stderr}"
    for n in [os.path.join(model, "config.json")] + needles:
        assert n in errors[0], f"{model}: '{n}' not in: {errors[0]}"
    return errors[0]


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        return child_main(sys.argv[2:])
    a = herdtest.parse_args()
    pys = {v: herdtest.ensure_venv(a.build, f"venv-transformers{v}", VERSIONS[v], SAFETENSORS) for v in VERSIONS}

    import torch
    import torch_llama

    sb = herdtest.Sandbox(a.build)
    failures, figures = [], []

    def check_loss(what, ours, ref):
        r = abs(ours - ref) / abs(ref)
        figures.append(r)
        print(f"  {what}: herd {ours:.7f} torch {ref:.7f} rel {r:.1e}")
        if not r <= TOL:
            failures.append(f"{what}: herd loss {ours:.7f} vs PyTorch {ref:.7f}: {r:.2e} > {TOL:g}")

    g = torch.Generator().manual_seed(5)
    tokens = torch.randint(0, SHAPE["vocab_size"], (B * BATCHES * T + 1,), generator=g, dtype=torch.int32)
    tokens.to(torch.int16).numpy().tofile(sb.path("tokens.u16"))
    shape = {k: v for k, v in SHAPE.items() if k != "max_position_embeddings"}

    def check_model(v, name, case):
        """(b) herd eval against PyTorch, (c) import, export, read back by both versions."""
        d = case["dir"]
        assert not case["messages"], f"transformers {v} warned writing {name}: {case['messages']}"
        s = torch_llama.Shape(**shape, rope_theta=case["theta"], rope_scaling=case["scaling"])
        assert case["theta"] == THETA, case
        if name == "llama3":
            assert case["scaling"]["factor"] == LLAMA3["factor"], case
            ours = torch_llama.rope_inv_freq(s, torch.float32).tolist()
            assert ours == case["inv_freq"], f"inv_freq: torch_llama {ours} transformers {case['inv_freq']}"
        params = torch_llama.load_safetensors(os.path.join(d, "model.safetensors"))
        ref = reference_loss(s, params, tokens)
        # What the test guards: the loss moves far beyond the tolerance with
        # LlamaConfig's default theta, or without the scaling.
        for wrong in (dict(rope_theta=10000.0, rope_scaling=case["scaling"]),
                      dict(rope_theta=THETA, rope_scaling=None)):
            if wrong["rope_scaling"] == case["scaling"] and wrong["rope_theta"] == case["theta"]:
                continue
            off = abs(reference_loss(torch_llama.Shape(**shape, **wrong), params, tokens) - ref) / ref
            print(f"  ({name} read with rope_theta {wrong['rope_theta']:g}"
                  f"{'' if wrong['rope_scaling'] else ', no scaling'} would be off by {off:.1e})")
            assert off > 100 * TOL, f"{name}: {wrong} moves the loss by only {off:.1e}"
        check_loss(f"transformers {v} {name}", herd_loss(sb, d), ref)

        ckpt, exported = sb.path(f"ckpt{v}_{name}"), sb.path(f"export{v}_{name}")
        sb.run("import", d, "--out", os.path.join(ckpt, "step_00000000"))
        sb.run("export", ckpt, "--out", exported)
        ours = herd_loss(sb, ckpt)
        assert herd_loss(sb, exported) == ours
        for rv, rpy in pys.items():
            seen = child(rpy, "read", exported)
            assert not seen["messages"], f"transformers {rv} warned reading {exported}: {seen['messages']}"
            for k, want in dict(SHAPE, model_type="llama", head_dim=16, hidden_act="silu", attention_bias=False,
                                mlp_bias=False, dtype="float32", architectures=["LlamaForCausalLM"],
                                theta=THETA).items():
                assert seen[k] == want, f"transformers {rv} reads {exported}: {k} = {seen[k]!r}, not {want!r}"
            if case["scaling"] is None:
                assert seen["scaling"] is None, seen
            else:
                assert {k: seen["scaling"][k] for k in LLAMA3} == LLAMA3, seen
                assert seen["inv_freq"] == case["inv_freq"], seen
            s2 = torch_llama.Shape(**{k: seen[k] for k in shape}, rope_theta=seen["theta"],
                                   rope_scaling=seen["scaling"])
            params2 = torch_llama.load_safetensors(os.path.join(exported, "model.safetensors"))
            check_loss(f"herd export of transformers {v} {name}, read by transformers {rv}", ours,
                       reference_loss(s2, params2, tokens))

    try:
        for v, py in pys.items():
            out = child(py, "write", sb.path(f"v{v}"))
            print(f"transformers {out['version']} wrote {len(out['cases'])} configs")
            for name, case in out["cases"].items():
                try:
                    if case["needles"] is None:
                        check_model(v, name, case)
                    else:
                        print(f"  {name}: {expect_refused(sb, case['dir'], case['needles'])}")
                except AssertionError as e:
                    print(f"  {name}: FAILED")
                    failures.append(f"transformers {v} {name}: {e}")
    finally:
        shutil.rmtree(sb.dir, ignore_errors=True)
    if figures:
        print(f"hf_transformers: worst loss difference {max(figures):.1e} (tol {TOL:g}) over {len(figures)} "
              "comparisons")
    if failures:
        print("\n".join(failures))
        sys.exit(1)


if __name__ == "__main__":
    main()
