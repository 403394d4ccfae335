"""The docs cannot rot: every ```python block of README.md and docs/*.md runs,
and every relative link points at a file that exists.

Each markdown file's python blocks run in order in one namespace (a later
block may use the names of an earlier one), under the suite's settings
(tests/conftest.py: float64, strict dtype promotion, rank promotion
"raise"; warnings are errors). A block states the values its comments name
with ``assert``; a few checks below are kept here as well, so that editing a
block cannot drop them. Blocks that are not meant to run (shell commands,
output, signatures) are fenced ```bash or ```text: every fence must name its
language, so that no Python escapes the test by an unlabelled fence."""
from __future__ import annotations

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
FILES = [ROOT / "README.md"] + sorted(DOCS.glob("*.md"))
# languages a fence may name; only "python" runs
LANGUAGES = {"python", "bash", "text", "markdown"}

_FENCE = re.compile(r"^(`{3,})(.*)$")


def _ids(paths: list[pathlib.Path]) -> list[str]:
    return [str(p.relative_to(ROOT)) for p in paths]


def fenced_blocks(text: str) -> list[tuple[str, int, str]]:
    """``(language, first line number, code)`` of every fenced block.

    A fence opens at a line starting with three or more backticks followed by
    the info string, and closes at a line of at least as many backticks and
    nothing else (CommonMark). Fences inside a block are its text. Raises
    ``ValueError`` on a fence that is never closed."""
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        ticks, info = match.group(1), match.group(2).strip()
        start = i + 1
        j = start
        while j < len(lines) and not re.fullmatch(rf"`{{{len(ticks)},}}\s*", lines[j]):
            j += 1
        if j == len(lines):
            raise ValueError(f"fence opened at line {i + 1} is never closed")
        blocks.append((info.split()[0] if info else "", start + 1, "\n".join(lines[start:j]) + "\n"))
        i = j + 1
    return blocks


def python_blocks(path: pathlib.Path) -> list[tuple[int, str]]:
    return [(line, code) for lang, line, code in fenced_blocks(path.read_text()) if lang == "python"]


def test_fence_parser():
    text = ("a\n```python\nx = 1\n```\n```bash\nls\n```\n````markdown\n```python\nno\n```\n````\n"
            "```python  \ny = x\n```\n")
    assert fenced_blocks(text) == [("python", 3, "x = 1\n"), ("bash", 6, "ls\n"),
                                   ("markdown", 9, "```python\nno\n```\n"), ("python", 14, "y = x\n")]
    with pytest.raises(ValueError, match="never closed"):
        fenced_blocks("```python\nx = 1\n")


def test_docs_exist():
    names = {p.name for p in DOCS.glob("*.md")}
    assert {"README.md", "solving-odes.md", "adjoints.md", "stiff.md", "roots-and-fixed-points.md",
            "special-and-custom-rules.md", "ensembles-and-devices.md", "jax-settings.md",
            "performance.md"} <= names


@pytest.mark.parametrize("path", FILES, ids=_ids(FILES))
def test_fences_name_their_language(path):
    text = path.read_text()
    bad = [(line, lang) for lang, line, _ in fenced_blocks(text) if lang not in LANGUAGES]
    assert not bad, (f"{path.name}: fences must be one of {sorted(LANGUAGES)} (```python runs in the "
                     f"tests; ```bash/```text do not); found (line, language) {bad}")
    indented = [i + 1 for i, line in enumerate(text.splitlines()) if re.match(r"^\s+```", line)]
    assert not indented, (f"{path.name}: indented fences at lines {indented} would not be run; "
                          "start code blocks at column 0")


# Checks kept outside the blocks: file -> [(text the block holds, check of the
# namespace right after that block)]. Each marker must be found.
def _falling_ball(ns):
    sol = ns["sol"]
    assert (int(sol.status), bool(sol.success), sol.message) == (1, True, "A termination event occurred.")
    assert abs(float(ns["dt_dg"]) - -0.0728) < 5e-5


def _fit(ns):
    assert abs(float(ns["fit"].x[0]) - 0.8) < 1e-4


CHECKS = {
    "docs/solving-odes.md": [("hit_ground.terminal", _falling_ball),
                             ("scipy.optimize.minimize", _fit)],
}


@pytest.mark.parametrize("path", FILES, ids=_ids(FILES))
def test_python_blocks_run(path):
    """Run the file's python blocks in order in one namespace."""
    name = str(path.relative_to(ROOT))
    checks = list(CHECKS.get(name, []))
    blocks = python_blocks(path)
    namespace = {"__name__": "__docs__"}
    for line, code in blocks:
        # Pad so that a traceback names the markdown file and its line.
        compiled = compile("\n" * (line - 1) + code, str(path), "exec")
        exec(compiled, namespace)  # noqa: S102 - the docs' own examples
        for marker, check in [c for c in checks if c[0] in code]:
            check(namespace)
            checks.remove((marker, check))
    assert not checks, f"{name}: no python block holds {[m for m, _ in checks]}"


_LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?([^\s>]+)>?", re.MULTILINE)  # [name]: target


def _prose(text: str) -> str:
    """``text`` without its fenced blocks and inline code spans."""
    out, inside, ticks = [], False, ""
    for line in text.splitlines():
        match = _FENCE.match(line)
        if not inside and match:
            inside, ticks = True, match.group(1)
        elif inside and re.fullmatch(rf"`{{{len(ticks)},}}\s*", line):
            inside = False
        elif not inside:
            out.append(re.sub(r"`[^`]*`", "", line))
    return "\n".join(out)


def _anchors(path: pathlib.Path) -> set[str]:
    """GitHub's anchors for the headings of a markdown file."""
    found = set()
    for line in _prose(path.read_text()).splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            found.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return found


def test_link_finder():
    assert _LINK.findall("see [a](docs/x.md#y), ![p](examples/out/p.png) and [b](https://e.org)"
                         " and `[c](no.md)`") == ["docs/x.md#y", "examples/out/p.png", "https://e.org",
                                                  "no.md"]
    assert _LINK.findall(_prose("x `[c](no.md)` y\n```text\n[d](no.md)\n```\n")) == []
    assert _REFERENCE.findall("[ref]: docs/x.md\n  [b]: <y.md>\n") == ["docs/x.md", "y.md"]


def broken_links(path: pathlib.Path) -> list[str]:
    """The relative links (and images) of ``path`` that point at no file, or
    at a heading that a markdown file does not have."""
    broken = []
    prose = _prose(path.read_text())
    for target in _LINK.findall(prose) + _REFERENCE.findall(prose):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):
            continue  # https:, mailto:
        file, _, anchor = target.partition("#")
        resolved = (path.parent / file).resolve() if file else path
        if not resolved.exists():
            broken.append(target)
        elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
            broken.append(target + " (no such heading)")
    return broken


def test_broken_links_are_found(tmp_path):
    (tmp_path / "b.md").write_text("# A heading: with_code\n")
    page = tmp_path / "a.md"
    page.write_text("[ok](b.md#a-heading-with_code) [gone](c.md) [bad](b.md#nope) [top](#here)\n"
                    "![img](pic.png) [web](https://example.org/x.md) `[code](d.md)`\n## Here\n")
    assert broken_links(page) == ["c.md", "b.md#nope (no such heading)", "pic.png"]


@pytest.mark.parametrize("path", FILES, ids=_ids(FILES))
def test_relative_links_resolve(path):
    """Every relative link (and image) points at an existing file, and a
    link to a heading of a markdown file names a heading that exists."""
    broken = broken_links(path)
    assert not broken, f"{path.name}: broken links {broken}"
