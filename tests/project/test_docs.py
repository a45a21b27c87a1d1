"""The documentation is checked like code.

* Every ```python block of README.md and docs/*.md runs, each in a fresh temporary
  working folder with a fresh namespace, unless the line right before its fence is
  ``<!-- no-test: REASON -->`` (a block that needs a network, a model endpoint, an
  API key, PostgreSQL, or is a fragment); such a block must still compile.
* Every relative link between README.md, CONTRIBUTING.md and docs/*.md leads to a
  file that exists, and a ``#anchor`` to a heading of that file.
* README.md stays short (at most 300 lines), starts with its two commands, and
  links every page of docs/.
* docs/cli.md has a ``### `ragdb NAME``` section for every command of the CLI,
  and none for a command that does not exist.
"""

from __future__ import annotations

import contextlib
import re
import sqlite3
from pathlib import Path

import pytest

import ragdb

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
CLI_DOC = DOCS / "cli.md"
EXAMPLE_FILES = [README, *sorted(DOCS.glob("*.md"))]
LINKING_FILES = [*EXAMPLE_FILES, ROOT / "CONTRIBUTING.md"]
README_MAX_LINES = 300

# The README's first block: what people paste and what CI runs, byte for byte.
README_COMMANDS = """\
```bash
# 1. Set up and build a knowledge base from ragdb's own docs, then ask it something
python3 -m venv .venv && .venv/bin/pip install -q -e '.[loaders]' && .venv/bin/ragdb -d demo.db add README.md docs/ \
&& .venv/bin/ragdb -d demo.db search "how are deleted documents handled"

# 2. Set up and run the whole test suite (what CI runs: .ci/run)
python3 -m venv .venv && .venv/bin/pip install -q -e '.[test]' && .venv/bin/python -m pytest
```
"""

FENCE = re.compile(r"^(?P<indent>[ \t]*)(`{3,}|~{3,})\s*([\w+-]*)")  # indented: inside a list item
NO_TEST = re.compile(r"^\s*<!--\s*no-test:\s*(?P<reason>\S.*?)\s*-->\s*$")
HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")
LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(\s*<?(?P<target>[^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"", re.I)


# ----------------------------------------------------------------------------- reading Markdown


def closes(line: str, fence: str) -> bool:
    """Whether ``line`` closes a block opened by ``fence`` (same character, at least as long)."""
    bare = line.strip()
    return bare.startswith(fence) and bare.strip(fence[0]) == ""


def fenced_blocks(text: str) -> list[tuple[int, str, str, str]]:
    """(line of the opening fence, 1-based; language; code; the line before the fence)
    of every fenced code block."""
    lines = text.splitlines()
    blocks = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = len(m.group("indent")), m.group(2), m.group(3).lower()
        start = i
        i += 1
        body = []
        while i < len(lines) and not closes(lines[i], fence):
            line = lines[i]
            body.append(line[indent:] if line[:indent].strip() == "" else line)  # the list item's indent off
            i += 1
        blocks.append((start + 1, lang, "\n".join(body) + "\n", lines[start - 1] if start else ""))
        i += 1
    return blocks


def prose(text: str) -> str:
    """The text with fenced code blocks blanked (line numbers kept) and inline code
    spans removed: links and headings inside code are not links or headings."""
    out, fence = [], None
    for line in text.splitlines():
        m = FENCE.match(line)
        if fence is None and m:
            fence = m.group(2)
            out.append("")
        elif fence is not None:
            if closes(line, fence):
                fence = None
            out.append("")
        else:
            out.append(re.sub(r"(`+)(?:(?!\1).)+?\1", lambda c: "X" * len(c.group(0)), line))
    return "\n".join(out)


def front_matter_lines(text: str) -> int:
    """How many lines a leading YAML front matter block takes (0 when there is none)."""
    lines = text.splitlines()
    if lines and lines[0].strip() == "---":
        for i, line in enumerate(lines[1:], start=1):
            if line.strip() == "---":
                return i + 1
    return 0


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation but ``-`` and ``_``
    dropped, spaces as hyphens (letters of every script kept)."""
    text = re.sub(r"`", "", heading).strip().lower()
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def headings(text: str) -> list[tuple[int, str]]:
    """(level, text) of every ATX heading outside code blocks and front matter."""
    blanked = prose(text).splitlines()
    skip = front_matter_lines(text)
    found = []
    for n, line in enumerate(text.splitlines()):
        h = HEADING.match(line)
        if h and n >= skip and blanked[n]:
            found.append((len(h.group(1)), h.group(2)))
    return found


def anchors(path: Path) -> set[str]:
    """Every anchor a link may name in a Markdown file: its headings' (duplicates
    numbered as GitHub numbers them) and explicit ``<a id=...>`` ones."""
    text = path.read_text(encoding="utf-8")
    found = set(HTML_ANCHOR.findall(text))
    seen: dict[str, int] = {}
    for _level, heading in headings(text):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def python_examples() -> list:
    params = []
    for path in EXAMPLE_FILES:
        for line, lang, code, before in fenced_blocks(path.read_text(encoding="utf-8")):
            if lang not in ("python", "py", "python3"):
                continue
            skip = NO_TEST.match(before)
            name = f"{path.relative_to(ROOT).as_posix()}:{line}"
            params.append(pytest.param(path, line, code, skip.group("reason") if skip else None, id=name))
    return params


# ----------------------------------------------------------------------------- (a) examples run


@pytest.mark.parametrize(("path", "line", "code", "no_test"), python_examples())
def test_python_example_runs(path, line, code, no_test, tmp_path, monkeypatch):
    # Line numbers of a traceback are the Markdown file's.
    compiled = compile("\n" * line + code, f"{path.relative_to(ROOT).as_posix()}", "exec")
    if no_test:
        pytest.skip(f"{path.relative_to(ROOT).as_posix()}:{line}: no-test: {no_test}")
    for name in ("RAGDB_DATABASE", "RAGDB_COLLECTION", "RAGDB_READONLY", "RAGDB_LLM_BASE_URL",
                 "RAGDB_LLM_API_KEY", "OPENAI_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__docs_example__"}
    try:
        exec(compiled, namespace)
    finally:
        # Close what an example left open (``db = ragdb.open(...)`` without ``with``); a
        # handle a ``with`` block closed already refuses a second close.
        for value in list(namespace.values()):
            if isinstance(value, ragdb.Database):
                with contextlib.suppress(sqlite3.ProgrammingError):
                    value.close()


def test_examples_are_found():
    examples = python_examples()
    assert len(examples) >= 10
    run = [p for p in examples if p.values[3] is None]
    assert len(run) > len(examples) / 2, "most examples should run"


def test_no_test_marker_is_recognised():
    text = "intro\n\n<!-- no-test: needs PostgreSQL -->\n```python\nx = 1\n```\n\n```python\ny = 2\n```\n"
    blocks = fenced_blocks(text)
    assert [(b[0], b[1], b[2]) for b in blocks] == [(4, "python", "x = 1\n"), (8, "python", "y = 2\n")]
    assert NO_TEST.match(blocks[0][3]).group("reason") == "needs PostgreSQL"
    assert not NO_TEST.match(blocks[1][3])


def test_a_block_inside_a_list_item_is_found_and_dedented():
    """Every Python block runs (issue 30, item 11), those indented under a list item too."""
    text = "- a step:\n\n  ```python\n  x = 1\n  if x:\n      y = 2\n  ```\n\n- next\n"
    assert [(b[1], b[2]) for b in fenced_blocks(text)] == [("python", "x = 1\nif x:\n    y = 2\n")]
    assert "x = 1" not in prose(text)


# ----------------------------------------------------------------------------- (b) links


def links(path: Path) -> list[tuple[int, str]]:
    return [(text.count("\n", 0, m.start()) + 1, m.group("target"))
            for text in [prose(path.read_text(encoding="utf-8"))] for m in LINK.finditer(text)]


def broken_links(path: Path, root: Path = ROOT) -> list[str]:
    """Relative links of ``path`` (``root``: what names are relative to) that lead nowhere."""
    problems = []
    for line, target in links(path):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto: ...
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        where = f"{path.relative_to(root).as_posix()}:{line}: ({target})"
        if not dest.exists():
            problems.append(f"{where}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            problems.append(f"{where}: no heading #{anchor} in {dest.relative_to(root).as_posix()}")
    return problems


@pytest.mark.parametrize("path", LINKING_FILES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_internal_links_lead_somewhere(path):
    assert path.exists(), f"{path.relative_to(ROOT)} is missing"
    assert broken_links(path) == []


def test_link_checker_catches_broken_links(tmp_path):
    (tmp_path / "b.md").write_text("# Title\n\n## `ragdb add`\n\n## 中文简介\n", encoding="utf-8")
    (tmp_path / "a.md").write_text(
        "# A\n\n[ok](b.md) [ok](b.md#ragdb-add) [ok](b.md#中文简介) [ok](#a) [web](https://x.org/y.md)\n"
        "[bad](c.md) [bad](b.md#nowhere) `[code](c.md)`\n\n```md\n[in code](d.md)\n```\n", encoding="utf-8")
    problems = broken_links(tmp_path / "a.md", root=tmp_path)
    assert problems == ["a.md:4: (c.md): no such file", "a.md:4: (b.md#nowhere): no heading #nowhere in b.md"]


# ----------------------------------------------------------------------------- (c) the README


def test_readme_is_short_and_starts_with_the_two_commands():
    text = README.read_text(encoding="utf-8")
    lines = text.splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines, at most {README_MAX_LINES}"
    first = text.index("```")
    assert "\n## " not in text[:first], "the two commands come before the first section"
    assert text[first:].startswith(README_COMMANDS), "README's first block changed: it is what CI and people run"


def test_readme_links_every_docs_page():
    linked = {(README.parent / t.partition("#")[0]).resolve() for _, t in links(README)}
    missing = [p.name for p in sorted(DOCS.glob("*.md")) if p.resolve() not in linked]
    assert missing == [], f"docs pages the README does not link: {missing}"
    for name in ("BENCHMARKS.md", "RELIABILITY.md", "CONTRIBUTING.md", "docs/architecture.md"):
        assert (ROOT / name).resolve() in linked, name


# ----------------------------------------------------------------------------- (d) the CLI reference


def test_cli_reference_covers_every_command():
    from ragdb.cli import cli

    documented = {m.group(1) for level, heading in headings(CLI_DOC.read_text(encoding="utf-8")) if level == 3
                  for m in [re.fullmatch(r"`ragdb ([\w-]+)`", heading)] if m}
    import click

    commands = set(cli.list_commands(click.Context(cli)))
    assert commands, "the click group has no commands"
    assert commands - documented == set(), f"commands without a section in docs/cli.md: {sorted(commands - documented)}"
    assert documented - commands == set(), f"docs/cli.md documents commands that do not exist: {sorted(documented - commands)}"
