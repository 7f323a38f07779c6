#!/usr/bin/env python3
"""clang's thread-safety analysis over the product (what scripts/test.sh runs).

The gcc build stays the build; this only parses: every product translation
unit of the build's compile_commands.json (not the tests, not generated
code, not CUDA device code) that includes an annotated header
(common/mutex.h or common/thread_annotations.h, directly or through other
project headers: only those can produce the analysis's warnings) is run
through `clang++-14 -fsyntax-only -Wthread-safety -Werror=thread-safety`
with its own flags (its -W flags, gcc's, left out). Any diagnostic fails
the check; the clang output says where. The last line is one JSON object:

  {"thread_safety": "clean", "translation_units": N, "annotated_members": M, "seconds": S}

("failed" and the failing units' count instead of "clean" on failure).
annotated_members counts the product's GUARDED_BY/PT_GUARDED_BY members.

usage: scripts/thread_safety_check.py [BUILD_DIR] [--all]
  BUILD_DIR  default: $HERD_BUILD_DIR or build (configured and built first:
             the generated protobuf headers must exist)
  --all      every product translation unit, annotated headers or not
"""
import concurrent.futures
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ANNOTATED = {"common/mutex.h", "common/thread_annotations.h"}
INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)
MEMBER = re.compile(r"\b(PT_)?GUARDED_BY\(")
CLANG_FLAGS = ["-fsyntax-only", "-Wthread-safety", "-Werror=thread-safety"]


def clang():
    for name in ("clang++-14", "clang++"):
        path = shutil.which(name)
        if path:
            return path
    sys.exit("thread_safety_check: clang++-14 not found (scripts/setup.sh installs it)")


def product_units(build):
    """(source, arguments) for each product .cc, first entry of each file."""
    with open(os.path.join(build, "compile_commands.json")) as f:
        entries = json.load(f)
    build = os.path.realpath(build)
    seen, units = set(), []
    for e in entries:
        src = os.path.realpath(os.path.join(e["directory"], e["file"]))
        rel = os.path.relpath(src, ROOT)
        if (rel.startswith("..") or src.startswith(build + os.sep) or rel.startswith("tests" + os.sep)
                or not rel.endswith(".cc") or rel in seen):
            continue
        args = e["arguments"] if "arguments" in e else shlex.split(e["command"])
        if "nvcc" in os.path.basename(args[0]):
            continue
        seen.add(rel)
        units.append((rel, e["directory"], args))
    return units


def includes_annotated(rel, memo):
    """Whether `rel` (a path under ROOT) includes an annotated header,
    through project headers (quoted includes, from ROOT or its folder)."""
    if rel in ANNOTATED:
        return True
    if rel in memo:
        return memo[rel]
    memo[rel] = False  # include cycles
    try:
        with open(os.path.join(ROOT, rel), encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return False
    found = False
    for inc in INCLUDE.findall(text):
        for cand in (inc, os.path.normpath(os.path.join(os.path.dirname(rel), inc))):
            if os.path.isfile(os.path.join(ROOT, cand)):
                found = includes_annotated(cand, memo)
                break
        if found:
            break
    memo[rel] = found
    return found


def clang_args(compiler, args):
    """The unit's own command for clang: no output, and its warning flags
    (gcc's choice) replaced by the analysis's."""
    out, skip = [compiler], False
    for a in args[1:]:
        if skip:
            skip = False
        elif a == "-o":
            skip = True
        elif a != "-c" and not a.startswith("-W"):
            out.append(a)
    return out + CLANG_FLAGS


def annotated_members():
    n = 0
    for folder, dirs, files in os.walk(ROOT):
        rel = os.path.relpath(folder, ROOT)
        top = rel.split(os.sep)[0]
        if rel != "." and (top in ("tests", "docs") or top.startswith((".", "build"))):
            dirs[:] = []
            continue
        for name in files:
            path = os.path.join(rel, name)
            if not name.endswith((".h", ".cc")) or os.path.normpath(path) in ANNOTATED:
                continue
            with open(os.path.join(ROOT, path), encoding="utf-8", errors="replace") as f:
                code = "\n".join(line.split("//")[0] for line in f)
            n += len(MEMBER.findall(code))
    return n


def main():
    argv = sys.argv[1:]
    everything = "--all" in argv
    argv = [a for a in argv if a != "--all"]
    if len(argv) > 1 or any(a.startswith("-") for a in argv):
        sys.exit(__doc__)
    build = argv[0] if argv else os.environ.get("HERD_BUILD_DIR", "build")
    if not os.path.isabs(build):
        build = os.path.join(ROOT, build)
    if not os.path.isfile(os.path.join(build, "compile_commands.json")):
        sys.exit("thread_safety_check: no compile_commands.json in " + build + " (configure and build it first)")
    start = time.monotonic()
    compiler = clang()
    memo = {}
    units = [u for u in product_units(build) if everything or includes_annotated(u[0], memo)]

    def check(unit):
        rel, directory, args = unit
        r = subprocess.run(clang_args(compiler, args), cwd=directory, capture_output=True, text=True)
        return rel, r.returncode, r.stdout + r.stderr

    failed = 0
    jobs = int(os.environ.get("HERD_TEST_JOBS", os.cpu_count() or 1))
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for rel, code, output in pool.map(check, units):
            if code != 0 or output.strip():
                failed += 1
                sys.stdout.write("thread_safety_check: " + rel + ":\n" + output)
    result = {
        "thread_safety": "clean" if failed == 0 else "failed",
        "translation_units": len(units),
    }
    if failed:
        result["failing_units"] = failed
    result["annotated_members"] = annotated_members()
    result["seconds"] = round(time.monotonic() - start, 1)
    print(json.dumps(result), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
