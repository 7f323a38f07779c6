"""Llama in plain PyTorch ops: the reference that herd is checked and timed
against (tests/ and bench/ both import it). Written for PyTorch 1.13
(Debian's python3-torch) and later; HuggingFace conventions throughout:
tensor names, [out, in] linear weights, rotate-half RoPE, RMSNorm computed
in the working precision, SwiGLU MLP, tied or untied lm_head.
"""
import json
import math
import struct

import torch


class Shape:
    """rope_scaling: None, or HF's "llama3" dict (factor, low_freq_factor,
    high_freq_factor, original_max_position_embeddings)."""

    def __init__(self, vocab_size, hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
                 num_key_value_heads, rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=True,
                 rope_scaling=None, **_):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.rope_theta = rope_theta
        self.rope_scaling = rope_scaling
        self.rms_norm_eps = rms_norm_eps
        self.tie_word_embeddings = tie_word_embeddings
        self.head_dim = hidden_size // num_attention_heads


def tensor_shapes(s):
    """(name, shape) of every parameter, in herd's flat-space order."""
    d, f, v = s.hidden_size, s.intermediate_size, s.vocab_size
    q, kv = s.num_attention_heads * s.head_dim, s.num_key_value_heads * s.head_dim
    out = [("model.embed_tokens.weight", (v, d))]
    for l in range(s.num_hidden_layers):
        p = f"model.layers.{l}."
        out += [(p + "input_layernorm.weight", (d,)), (p + "self_attn.q_proj.weight", (q, d)),
                (p + "self_attn.k_proj.weight", (kv, d)), (p + "self_attn.v_proj.weight", (kv, d)),
                (p + "self_attn.o_proj.weight", (d, q)), (p + "post_attention_layernorm.weight", (d,)),
                (p + "mlp.gate_proj.weight", (f, d)), (p + "mlp.up_proj.weight", (f, d)),
                (p + "mlp.down_proj.weight", (d, f))]
    out.append(("model.norm.weight", (d,)))
    if not s.tie_word_embeddings:
        out.append(("lm_head.weight", (v, d)))
    return out


def init_params(s, seed=0, std=0.02, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    params = {}
    for name, shape in tensor_shapes(s):
        if len(shape) == 1:
            params[name] = torch.ones(shape, dtype=dtype)
        else:
            params[name] = (torch.randn(shape, generator=g, dtype=torch.float64) * std).to(dtype)
    return params


def llama3_inv_freq(inv_freq, rope_scaling):
    """transformers' _compute_llama3_parameters (Llama 3.1's RoPE scaling)."""
    factor = rope_scaling["factor"]
    low_freq_factor = rope_scaling["low_freq_factor"]
    high_freq_factor = rope_scaling["high_freq_factor"]
    old_context_len = rope_scaling["original_max_position_embeddings"]
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth_factor = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed_inv_freq = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
    is_medium_freq = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium_freq, smoothed_inv_freq, inv_freq_llama)


def rope_inv_freq(s, dtype, device=None):
    # HF LlamaRotaryEmbedding arithmetic, in the working precision.
    f = 1.0 / (s.rope_theta ** (torch.arange(0, s.head_dim, 2, dtype=torch.int64, device=device).to(dtype)
                                / s.head_dim))
    if s.rope_scaling is not None:
        assert s.rope_scaling.get("rope_type", s.rope_scaling.get("type")) == "llama3", s.rope_scaling
        f = llama3_inv_freq(f, s.rope_scaling)
    return f


def rope_tables(s, T, dtype, device=None):
    inv_freq = rope_inv_freq(s, dtype, device)
    t = torch.arange(T, dtype=dtype, device=device)
    freqs = torch.outer(t, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def rms_norm(x, w, eps):
    var = x.pow(2).mean(-1, keepdim=True)
    return w * (x * torch.rsqrt(var + eps))


def forward(s, params, tokens):
    """tokens [B, T] (long) -> logits [B, T, V]."""
    B, T = tokens.shape
    H, KV, hd = s.num_attention_heads, s.num_key_value_heads, s.head_dim
    dtype, device = params["model.embed_tokens.weight"].dtype, tokens.device
    cos, sin = rope_tables(s, T, dtype, device)
    # PyTorch >= 2.0 has fused (flash) attention; 1.13 (Debian's, the parity
    # tests') spells the same maths out with an explicit causal mask.
    fused_attention = hasattr(torch.nn.functional, "scaled_dot_product_attention")
    mask = None if fused_attention else torch.full((T, T), float("-inf"), dtype=dtype, device=device).triu(1)
    x = params["model.embed_tokens.weight"][tokens]
    for l in range(s.num_hidden_layers):
        p = f"model.layers.{l}."
        h = rms_norm(x, params[p + "input_layernorm.weight"], s.rms_norm_eps)
        q = (h @ params[p + "self_attn.q_proj.weight"].t()).view(B, T, H, hd).transpose(1, 2)
        k = (h @ params[p + "self_attn.k_proj.weight"].t()).view(B, T, KV, hd).transpose(1, 2)
        v = (h @ params[p + "self_attn.v_proj.weight"].t()).view(B, T, KV, hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if KV != H:
            k = k.repeat_interleave(H // KV, dim=1)
            v = v.repeat_interleave(H // KV, dim=1)
        if fused_attention:
            o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-1, -2)) / math.sqrt(hd) + mask
            o = torch.softmax(att, dim=-1) @ v
        o = o.transpose(1, 2).reshape(B, T, H * hd)
        x = x + o @ params[p + "self_attn.o_proj.weight"].t()
        h = rms_norm(x, params[p + "post_attention_layernorm.weight"], s.rms_norm_eps)
        a = torch.nn.functional.silu(h @ params[p + "mlp.gate_proj.weight"].t()) * (h @ params[p + "mlp.up_proj.weight"].t())
        x = x + a @ params[p + "mlp.down_proj.weight"].t()
    x = rms_norm(x, params["model.norm.weight"], s.rms_norm_eps)
    head = params["model.embed_tokens.weight" if s.tie_word_embeddings else "lm_head.weight"]
    return x @ head.t()


def loss_fn(s, params, inputs, targets):
    logits = forward(s, params, inputs)
    if logits.dtype in (torch.float16, torch.bfloat16):  # the loss in at least fp32
        logits = logits.float()
    return torch.nn.functional.cross_entropy(logits.reshape(-1, s.vocab_size), targets.reshape(-1))


def make_optimizer(params, lr, betas, eps, weight_decay, **options):
    """torch.optim.AdamW with weight decay on 2-D tensors only (herd's rule);
    `options` go to AdamW (e.g. fused=True on CUDA)."""
    decay = [p for p in params.values() if p.dim() == 2]
    no_decay = [p for p in params.values() if p.dim() != 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}], lr=lr, betas=betas, eps=eps, **options)


def lr_at(step, lr, min_lr, warmup, total):
    """herd's schedule: linear warm-up ((t+1)/warmup), cosine to min_lr at the last step."""
    if step < warmup:
        return lr * (step + 1) / warmup
    decay_steps = total - warmup
    if decay_steps <= 1:
        return lr
    ratio = min(max((step - warmup) / (decay_steps - 1), 0.0), 1.0)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - min_lr)


# ---------------------------------------------------------------- safetensors

_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64}
_NAMES = {v: k for k, v in _DTYPES.items()}


def load_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        buf = bytearray(data[8 + n + b:8 + n + e])
        t = torch.frombuffer(buf, dtype=_DTYPES[info["dtype"]]) if e > b else torch.empty(0, dtype=_DTYPES[info["dtype"]])
        out[name] = t.reshape(info["shape"]).clone()
    return out


def save_safetensors(path, tensors):
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, t in tensors.items():
        t = t.contiguous()
        raw = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": _NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for raw in blobs:
            f.write(raw)
