"""The documentation's shape: README.md stays a short user guide, every relative link in README.md
and docs/ resolves, and every committed benchmark result is cited by the docs (and every cited
one exists)."""

from __future__ import annotations

import glob
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
README_MAX_LINES = 300

# [text](target) and ![alt](target); the target ends at whitespace or the closing parenthesis.
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
CITED_RESULT = re.compile(r"benchmarks/results/[A-Za-z0-9_.\-/*]*")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def doc_pages() -> list[pathlib.Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(page: pathlib.Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    return {_anchor(line.lstrip("#")) for line in text.splitlines() if line.startswith("#")}


def relative_links(page: pathlib.Path) -> list[str]:
    text = FENCE.sub("", page.read_text())
    return [t for t in LINK.findall(text) if not re.match(r"^[a-z][a-z0-9+.\-]*:", t)]


def broken_links(page: pathlib.Path) -> list[str]:
    broken = []
    for target in relative_links(page):
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
            broken.append(f"{target} (no heading with that anchor)")
    return broken


def cited_results() -> set[str]:
    """Every `benchmarks/results/...` path the README and docs/ mention, trailing punctuation off."""
    cited = set()
    for page in doc_pages():
        for match in CITED_RESULT.findall(page.read_text()):
            path = match.rstrip(".").rstrip("/")
            if path != "benchmarks/results":  # the folder itself, e.g. `benchmarks/results/<name>`
                cited.add(path)
    return cited


def test_readme_is_at_most_300_lines():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; at most {README_MAX_LINES}"


def test_readme_gives_the_two_setup_commands_first():
    text = (ROOT / "README.md").read_text()
    first_block = FENCE.search(text).group(0)
    assert "make demo" in first_block and "make test" in first_block


def test_every_relative_link_resolves():
    broken = {str(page.relative_to(ROOT)): broken_links(page) for page in doc_pages()}
    broken = {page: links for page, links in broken.items() if links}
    assert not broken, f"links that point nowhere: {broken}"


def test_every_cited_result_exists():
    missing = sorted(
        path for path in cited_results()
        if not (glob.glob(str(ROOT / path)) if "*" in path else (ROOT / path).exists())
    )
    assert not missing, f"cited in README.md or docs/ but not under benchmarks/results/: {missing}"


def test_every_result_is_cited():
    """A file is cited when it, or a folder it is in below benchmarks/results/, is named."""
    cited = {path for path in cited_results() if "*" not in path}
    uncited = []
    for path in sorted(RESULTS.rglob("*")):
        if path.is_dir() or "tensorboard" in path.parts:  # the runner's logs are not committed
            continue
        relative = path.relative_to(ROOT)
        named = {relative.as_posix(), *(parent.as_posix() for parent in relative.parents)}
        if not named & cited:
            uncited.append(relative.as_posix())
    assert not uncited, f"results that README.md and docs/ do not cite: {uncited}"


def test_the_checks_see_a_broken_link_and_an_uncited_result(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n[ok](page.md#title) [gone](missing.md) [anchor](page.md#nope) [web](https://x.org)\n")
    assert broken_links(page) == ["missing.md (no such file)", "page.md#nope (no heading with that anchor)"]
    assert CITED_RESULT.findall("see `benchmarks/results/chains/`.") == ["benchmarks/results/chains/"]
