"""A tokenizer's round trip through a job: herd prepare --tokenizer, a few
training steps, herd export, and then HuggingFace transformers loads the
directory (AutoTokenizer and LlamaForCausalLM): its tokenizer encodes the
held-out text to exactly the tokens herd prepared, its loss on them equals
`herd eval`'s within 1e-5 (relative), and it generates. Also: a model whose
vocabulary is smaller than the prepared files' is refused in one line,
and the end-of-run text sample is encoded and decoded by the tokenizer.

transformers comes from PyPI into the venv hf_parity_test uses (BUILD/pyenv);
where it cannot be installed the test is skipped (exit 77)."""
import json
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import herdtest  # noqa: E402
from hf_parity_test import TRANSFORMERS  # noqa: E402
from tokenizer_parity_test import FORTUNES, LLAMA3_SPLIT, fortunes  # noqa: E402

B, T, BATCHES = 4, 32, 4
VOCAB = 512


def train_tokenizer(docs, path):
    """Llama 3's layout: its split pattern, and <|begin_of_text|> put first."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(LLAMA3_SPLIT), "isolated"),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<|begin_of_text|>", "<|end_of_text|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(docs, trainer)
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                                       special_tokens=[("<|begin_of_text|>", bos)])
    tok.save(path)
    return bos


def main():
    a = herdtest.parse_args()
    if not os.path.isdir(FORTUNES):
        print(f"SKIPPED: {FORTUNES} missing (apt-get install fortunes)")
        sys.exit(77)
    herdtest.rerun_in_venv(a.build, "pyenv", TRANSFORMERS, "safetensors")

    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    sb = herdtest.Sandbox(a.build)
    docs = fortunes()
    train_docs, held_out = docs[:3000], docs[-300:]
    bos = train_tokenizer(train_docs, sb.path("tokenizer.json"))
    for name, part in (("train.jsonl", train_docs), ("val.jsonl", held_out)):
        sb.write(name, "".join(json.dumps({"text": d}, ensure_ascii=False) + "\n" for d in part))
        sb.run("prepare", name, "--tokenizer", "tokenizer.json", "--out", name.replace(".jsonl", ".bin"))
    header, val = herdtest.read_token_file(sb.path("val.bin"))
    assert header[3] == VOCAB and val[0] == bos, f"val.bin: vocabulary {header[3]}, first token {val[0]}"

    config = herdtest.tiny_config("train.bin", "val.bin", steps=30, ckpt="ckpt").replace(
        "vocab_size: 256", f"vocab_size: {VOCAB}").replace('val: "val.bin"', 'val: "val.bin" tokenizer: "tokenizer.json"')
    sb.write("job.textproto", config)
    sb.write("small.textproto", config.replace(f"vocab_size: {VOCAB}", "vocab_size: 256"))
    r = sb.run("launch", "small.textproto", check=False)
    lines = [line for line in r.stderr.splitlines() if line.startswith("herd: error")]
    assert r.returncode != 0 and len(lines) == 1 and "set model.vocab_size to at least 512" in lines[0], \
        f"a model with too small a vocabulary: exit {r.returncode}\n{r.stderr}"
    print(f"ok  refused: {lines[0]}")

    trained = sb.run("launch", "job.textproto", "--set", "log.sample_tokens=12", "--set", "log.sample_prompt=Why")
    sample = trained.stdout.split("sample (temperature", 1)[1].split("\n", 1)[1]
    assert sample.startswith("Why") and len(sample.strip()) > 3, f"the end-of-run sample: {sample!r}"
    out = sb.run("export", "ckpt", "--out", "hf").stdout
    assert "tokenizer.json, tokenizer_config.json" in out, out
    ours = json.loads(sb.run("eval", "hf", "--data", "val.bin", "--seq-len", str(T), "--batch-size", str(B),
                             "--batches", str(BATCHES)).stdout)

    tokenizer = AutoTokenizer.from_pretrained(sb.path("hf"))
    theirs_tokens = []
    for d in held_out:
        theirs_tokens += tokenizer(d, add_special_tokens=True, split_special_tokens=True)["input_ids"]
    assert theirs_tokens == val, "AutoTokenizer's ids of the held-out text differ from val.bin's"
    model = LlamaForCausalLM.from_pretrained(sb.path("hf"), torch_dtype=torch.float32)
    windows = torch.tensor([val[w * T:w * T + T + 1] for w in range(B * BATCHES)])
    with torch.no_grad():
        logits = model(windows[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB).double(), windows[:, 1:].reshape(-1))
    rel = abs(loss.item() - ours["loss"]) / abs(ours["loss"])
    assert ours["tokens"] == B * BATCHES * T and rel < 1e-5, \
        f"herd eval {ours} against transformers {loss.item()} (relative {rel:.2e})"
    prompt = tokenizer("Why", return_tensors="pt")
    generated = model.generate(**prompt, max_new_tokens=8, do_sample=False)
    text = tokenizer.decode(generated[0], skip_special_tokens=True)
    assert text.startswith("Why") and len(generated[0]) > len(prompt["input_ids"][0]), text
    print(f"ok  round trip: {len(held_out)} held-out documents tokenized alike ({len(val)} tokens); loss "
          f"herd eval {ours['loss']:.7f}, transformers {loss.item():.7f} (relative {rel:.1e}); "
          f"generates {text!r}")
    shutil.rmtree(sb.dir)


if __name__ == "__main__":
    main()
