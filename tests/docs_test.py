"""The manual says "not built yet" only of what herd refuses.

Every paragraph of README.md and docs/*.md (every row of a table) that
says something is not built yet, or runs somewhere "only yet", carries
configs of what it says is not built, each in an HTML comment
`<!-- refused: CONFIG -->` (a textproto fragment, added to a tiny job),
and `herd plan` refuses each of them in one line (exit 2) that names one
of the fragment's settings. A claim without such a config, or a config
that herd now accepts, fails: the doc has gone stale.
"""
import glob
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
    for path in [os.path.join(source, "README.md")] + sorted(glob.glob(os.path.join(source, "docs", "*.md"))):
        for block in blocks(open(path).read()):
            prose = MARKER.sub("", block)
            if CLAIM.search(prose):
                start = max(0, CLAIM.search(prose).start() - 60)
                out.append((os.path.relpath(path, source), " ".join(prose[start:].split())[:120],
                            MARKER.findall(block)))
    return out


def main():
    a = herdtest.parse_args()
    sb = herdtest.Sandbox(a.build)
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
    print(f"docs: ok ({len(found)} claims of what is not built, {checked} configs refused by herd plan)")


if __name__ == "__main__":
    main()
