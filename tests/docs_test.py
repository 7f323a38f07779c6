"""The manual says "not built yet" only of what herd refuses.

docs/modes.md's table "What is not built yet" is the code's
(`herd plan --not-built`, common/config.h's NotBuiltTable) row for row,
and `herd plan` refuses each row's example job in one line naming the
row's setting.

Every other paragraph of README.md and docs/**/*.md (every row of a table)
that says something is not built yet, or runs somewhere "only yet",
carries configs of what it says is not built, each in an HTML comment
`<!-- refused: CONFIG -->` (a textproto fragment, added to a tiny job),
and `herd plan` refuses each of them in one line (exit 2) that names one
of the fragment's settings. A claim without such a config, or a config
that herd now accepts, fails: the doc has gone stale.
"""
import glob
import json
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import herdtest  # noqa: E402

CLAIM = re.compile(r"not (built )?yet|only yet", re.IGNORECASE)
MARKER = re.compile(r"<!--\s*refused:\s*(.*?)\s*-->", re.DOTALL)
# Settings every fragment has; the refusal must name another of its own.
SHAPE = {"sync", "workers", "servers"}


TABLE = "## What is not built yet"


def table_rows(source):
    """(setting, with, reason) of each row of docs/modes.md's table."""
    text = open(os.path.join(source, "docs", "modes.md")).read()
    assert TABLE in text, f"docs/modes.md has no section '{TABLE}'"
    section = text[text.index(TABLE):].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) == 3 and cells[0] not in ("setting", "---"):
            rows.append(tuple(cells))
    return rows, section


def blocks(text):
    """Paragraphs, with each table row a block of its own."""
    out = []
    for para in re.split(r"\n\s*\n", text):
        lines = para.splitlines()
        rows = [line for line in lines if line.lstrip().startswith("|")]
        out.extend(rows)
        rest = "\n".join(line for line in lines if not line.lstrip().startswith("|"))
        if rest.strip():
            out.append(rest)
    return out


def claims(source):
    """(file, first words, [fragments]) of every claim."""
    out = []
    docs = sorted(glob.glob(os.path.join(source, "docs", "**", "*.md"), recursive=True))
    for path in [os.path.join(source, "README.md")] + docs:
        text = open(path).read()
        if TABLE in text:  # held to the code's table (main), not by markers
            start = text.index(TABLE)
            end = text.find("\n## ", start + len(TABLE))
            text = text[:start] + (text[end:] if end >= 0 else "")
        for block in blocks(text):
            prose = MARKER.sub("", block)
            if CLAIM.search(prose):
                start = max(0, CLAIM.search(prose).start() - 60)
                out.append((os.path.relpath(path, source), " ".join(prose[start:].split())[:120],
                            MARKER.findall(block)))
    return out


def main():
    a = herdtest.parse_args()
    sb = herdtest.Sandbox(a.build)
    # The table: the code's, row for row, each row's example refused.
    p = sb.run("plan", "--not-built")
    code = [json.loads(line) for line in p.stdout.splitlines()]
    assert code, "herd plan --not-built printed no row"
    documented, _ = table_rows(a.source)
    want = sorted((r["setting"], r["with"], r["reason"]) for r in code)
    assert sorted(documented) == want, (
        "docs/modes.md's table of what is not built differs from herd plan --not-built:\n"
        f"  only in the docs: {sorted(set(documented) - set(want))}\n"
        f"  only in the code: {sorted(set(want) - set(documented))}")
    for i, row in enumerate(code):
        cfg = sb.write(f"row{i}.textproto", herdtest.tiny_config("train.bin", extra=row["example"]))
        r = sb.run("plan", cfg, check=False)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and f"{row['setting']}: {row['reason']}" in lines[0], \
            (row, r.returncode, r.stderr)

    found = claims(a.source)
    assert found, "no claim found: the pattern no longer matches the docs"
    checked = 0
    for path, words, fragments in found:
        assert fragments, (f"{path}: '{words}...' says something is not built, but names no config of it "
                           "(<!-- refused: CONFIG -->) for this test to hold it to")
        for fragment in fragments:
            cfg = sb.write(f"claim{checked}.textproto", herdtest.tiny_config("train.bin", extra=fragment))
            p = sb.run("plan", cfg, check=False)
            lines = p.stderr.strip().splitlines()
            settings = set(re.findall(r"(\w+)\s*:", fragment)) - SHAPE
            assert p.returncode == 2 and len(lines) == 1 and lines[0].startswith("herd: error:"), \
                (f"{path}: '{words}...' says this is not built, but herd plan accepts it (exit {p.returncode}):\n"
                 f"  {fragment}\n{p.stderr[-1000:]}")
            assert any(re.search(r"\b" + s + r"\b", lines[0]) for s in settings), \
                f"{path}: {fragment}\n  refused for another reason than the claim's: {lines[0]}"
            checked += 1
    print(f"docs: ok (the table of what is not built: {len(code)} rows, each example refused; "
          f"{len(found)} other claims, {checked} configs refused by herd plan)")


if __name__ == "__main__":
    main()
