"""Ingesting a folder (issue 14): ignore files, default skips with reasons, include/exclude,
one source per file from add and sync, JSON Lines record sources, access labels.

Real files in tmp_path; the CLI through CliRunner and as real subprocesses.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

import ragdb
from cli_helpers import out_json, run
from ragdb.files import sync
from ragdb.files import walk
from ragdb.errors import InvalidInput
from ragdb.files.loaders import SUPPORTED_SUFFIXES, iter_files

BINARY = bytes(range(256)) * 8 + b"\x00\x01\x02\xff" * 64
PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 64


def write(path: Path, data: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
    return path


def ragdb_proc(*args, cwd=None, input=None):
    env = {**os.environ, "RAGDB_DATABASE": "", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    return subprocess.run([sys.executable, "-m", "ragdb.cli", *map(str, args)], capture_output=True, cwd=cwd,
                          env=env, input=input, timeout=120)


def skips(report, root: Path) -> set[tuple[str, str]]:
    """(path relative to root, reason) of each skipped path."""
    out = set()
    for k in report.skipped:
        rel = Path(k.path.rstrip("/")).relative_to(root).as_posix()
        out.add((rel + "/" if k.path.endswith("/") else rel, k.reason))
    return out


def sources(db) -> list[str]:
    return sorted(d.source for d in db.documents(principals=ragdb.ALL))


# ----------------------------------------------------------------------------- a whole repository


def make_repo(root: Path) -> Path:
    """A repository as people have them: code and docs, plus everything that is not to be indexed."""
    write(root / ".git" / "HEAD", "ref: refs/heads/main\n")
    write(root / ".git" / "config", "[core]\n\tbare = false\n")
    write(root / ".git" / "info" / "exclude", "secret-notes.md\n")
    write(root / ".gitignore", "out/\n*.log\n!keep.log\n/local.txt\nlogs/\nkeep.*\n!keep.txt\n")
    write(root / "README.md", "# Pumpkin\n\nPumpkin indexes the harvest records.\n")
    write(root / "docs" / "guide.md", "# Guide\n\nThe harvest starts in October.\n")
    write(root / "docs" / "api.rst", "API\n===\n\nThe harvest endpoint returns JSON.\n")
    write(root / "docs" / "logo.png", PNG)
    write(root / "docs" / "diagram.svg", "<svg xmlns='http://www.w3.org/2000/svg'></svg>")
    write(root / "docs" / ".gitignore", "drafts/\n/generated.md\n")
    write(root / "docs" / "drafts" / "wip.md", "# Not yet\n\nharvest draft\n")
    write(root / "docs" / "generated.md", "# Generated\n\nharvest generated\n")
    write(root / "docs" / "sub" / "generated.md", "# Kept\n\nOnly the top-level generated.md is ignored.\n")
    write(root / "src" / "pumpkin" / "__init__.py", '"""Pumpkin: harvest records."""\n\nVERSION = "1.0"\n')
    write(root / "src" / "pumpkin" / "core.py", "def harvest(field):\n    return field.pumpkins\n")
    write(root / "src" / "pumpkin" / "__pycache__" / "core.cpython-311.pyc", BINARY)
    write(root / "src" / "pumpkin.egg-info" / "PKG-INFO", "Name: pumpkin\n")
    write(root / "src" / "app.js", "export function harvest() { return 1; }\n")
    write(root / "src" / "app.min.js", "function a(){return 1}")
    write(root / "src" / "vendor.js", "var a=1;" * 3000)  # one 24 kB line: a bundle
    write(root / "src" / "app.js.map", '{"version":3}')
    write(root / "src" / "data.bin", BINARY)
    write(root / "src" / "notes.txt", BINARY)  # a text name holding binary content
    write(root / "pyproject.toml", '[project]\nname = "pumpkin"\n')
    write(root / "Makefile", "test:\n\tpytest\n")
    write(root / "package.json", '{"name": "pumpkin"}\n')
    write(root / "package-lock.json", '{"lockfileVersion": 3}\n')
    write(root / "uv.lock", "version = 1\n")
    write(root / "data.csv", "a,b\n1,2\n")
    write(root / "local.txt", "ignored at the top only\n")
    write(root / "keep.log", "a .gitignore negation does not turn ragdb's default rules off\n")
    write(root / "keep.md", "ignored by keep.*\n")
    write(root / "keep.txt", "ignored by keep.*, then kept by the negation !keep.txt\n")
    write(root / "debug.log", "ignored by *.log\n")
    write(root / "logs", "a file named logs: the folder-only pattern logs/ does not match it\n")
    write(root / "secret-notes.md", "# Secret\n\nignored by .git/info/exclude\n")
    write(root / ".env", "TOKEN=x\n")
    write(root / ".github" / "workflows" / "ci.yml", "on: push\n")
    write(root / ".venv" / "pyvenv.cfg", "home = /usr/bin\n")
    write(root / ".venv" / "lib" / "site.py", "print('venv')\n")
    write(root / "env2" / "pyvenv.cfg", "home = /usr/bin\n")  # any folder holding pyvenv.cfg
    write(root / "env2" / "lib" / "x.py", "x = 1\n")
    write(root / "node_modules" / "left-pad" / "index.js", "module.exports = 1;\n")
    write(root / "build" / "lib" / "pumpkin.py", "copy\n")
    write(root / "out" / "site" / "index.html", "<p>built site</p>")
    write(root / "target" / "debug" / "x.rs", "fn main() {}\n")
    write(root / ".ragdbignore", "!.github/\n")
    return root


REPO_SOURCES = [
    ".github/workflows/ci.yml", "Makefile", "README.md", "docs/api.rst", "docs/guide.md", "docs/sub/generated.md",
    "keep.txt",
    "logs", "package.json", "pyproject.toml", "src/app.js", "src/pumpkin/__init__.py",
    "src/pumpkin/core.py",
]
REPO_SKIPS = {
    (".git/", "vcs"), (".gitignore", "hidden"), (".ragdbignore", "hidden"), (".env", "hidden"),
    (".venv/", "virtualenv"), ("env2/", "virtualenv"), ("node_modules/", "node_modules"),
    ("build/", "build"), ("target/", "build"), ("src/pumpkin.egg-info/", "build"),
    ("src/pumpkin/__pycache__/", "cache"), ("out/", "ignored"), ("docs/drafts/", "ignored"),
    ("docs/generated.md", "ignored"), ("local.txt", "ignored"), ("debug.log", "unsupported"),
    ("keep.log", "unsupported"), ("keep.md", "ignored"),
    ("secret-notes.md", "ignored"), ("docs/.gitignore", "hidden"), ("package-lock.json", "lockfile"),
    ("uv.lock", "lockfile"), ("src/app.min.js", "minified"), ("src/app.js.map", "minified"),
    ("src/vendor.js", "minified"), ("docs/logo.png", "image"), ("docs/diagram.svg", "image"),
    ("src/data.bin", "binary"), ("src/notes.txt", "binary"), ("data.csv", "unsupported"),
}


def test_sync_of_a_repository_indexes_only_its_docs_and_code(tmp_path, monkeypatch):
    repo = make_repo(tmp_path / "repo")
    monkeypatch.chdir(repo)
    with ragdb.open(tmp_path / "kb.db") as db:
        report = sync.sync_folder(db, repo)
        assert sources(db) == REPO_SOURCES
        assert report.added == tuple(REPO_SOURCES) and report.failed == ()
        assert skips(report, repo) == REPO_SKIPS
        assert len(report.skipped) == len(REPO_SKIPS)  # each once
        assert report.skip_counts["ignored"] == 6 and report.skip_counts["hidden"] == 4
        assert list(report.skip_counts.values()) == sorted(report.skip_counts.values(), reverse=True)
        ignored = {Path(k.path.rstrip("/")).name: k.detail for k in report.skipped if k.reason == "ignored"}
        assert ignored["out"].endswith(".gitignore: out/")
        assert ignored["wip.md" if "wip.md" in ignored else "drafts"].endswith("docs/.gitignore: drafts/")
        assert ignored["secret-notes.md"].endswith("exclude: secret-notes.md")
        assert db.get(source="docs/api.rst").metadata["loader"] == "rst"
        # a second sync reads nothing and changes nothing
        again = sync.sync_folder(db, repo)
        assert again.added == again.changed == again.deleted == () and len(again.unchanged) == len(REPO_SOURCES)


def test_cli_sync_of_a_repository_in_a_subprocess(tmp_path):
    repo = make_repo(tmp_path / "repo")
    db = tmp_path / "kb.db"
    p = ragdb_proc("-d", db, "sync", ".", "--json", cwd=repo)
    assert p.returncode == 0, p.stderr
    data = orjson.loads(p.stdout)
    assert sorted(data["added"]) == REPO_SOURCES
    assert {(k["path"], k["reason"]) for k in data["skipped"]} == REPO_SKIPS
    p = ragdb_proc("-d", db, "sync", ".", cwd=repo)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.decode().splitlines()
    assert lines[0] == f"add 0, replace 0, delete 0, unchanged {len(REPO_SOURCES)}, failed 0"
    assert lines[1].startswith(f"skipped 10 folders and {len(REPO_SKIPS) - 10} files: 6 ignored, 4 hidden, ")
    assert "2 virtualenv" in lines[1] and "1 node_modules" in lines[1] and "2 lockfile" in lines[1]
    p = ragdb_proc("-d", db, "sync", ".", "-v", cwd=repo)
    out = p.stdout.decode()
    assert "skip node_modules/ (node_modules)" in out and "skip uv.lock (lockfile)" in out
    assert "skip out/ (ignored: .gitignore: out/)" in out
    assert "skip docs/drafts/ (ignored: docs/.gitignore: drafts/)" in out
    assert "skip secret-notes.md (ignored: .git/info/exclude: secret-notes.md)" in out


# ----------------------------------------------------------------------------- ignore rules


def test_gitignore_semantics(tmp_path):
    root = tmp_path / "r"
    write(root / ".gitignore", "*.ini\n!important.ini\ncache/\n/top-only.md\n# a comment\n\ndoc/*.txt\n")
    for name in ("a.ini", "important.ini", "top-only.md", "sub/top-only.md", "cache/x.md", "sub/cache/y.md",
                 "doc/a.txt", "doc/deeper/b.txt", "cache.md"):
        write(root / name, "text " + name)
    write(root / "sub" / ".gitignore", "!*.ini\nlocal.md\n")
    write(root / "sub" / "b.ini", "re-included below sub/")
    write(root / "sub" / "local.md", "ignored by sub/.gitignore")
    write(root / "other" / "local.md", "not below sub/: kept")
    found = walk.walk(root)
    picked = sorted(rel for _, rel in found.files)
    assert picked == ["cache.md", "doc/deeper/b.txt", "important.ini", "other/local.md", "sub/b.ini",
                      "sub/top-only.md"]
    assert {(Path(k.path).relative_to(root).as_posix(), k.reason) for k in found.skipped
            if k.reason == "ignored"} == {("a.ini", "ignored"), ("top-only.md", "ignored"),
                                           ("cache", "ignored"), ("sub/cache", "ignored"),
                                           ("doc/a.txt", "ignored"), ("sub/local.md", "ignored")}


@pytest.mark.parametrize("stars", [20, 200])
def test_a_backtracking_ignore_line_does_not_stall_a_walk(tmp_path, stars):
    """Issue 32, item 4: ``a*`` x 20 + ``b`` against a 30-letter name backtracked for 9 s in
    Python's re (x 200: never ended). The walk runs in a subprocess so that a regression
    fails the test (after a minute) instead of hanging the suite; semantics are git's."""
    root = tmp_path / "r"
    write(root / ".gitignore", "a*" * stars + "b\n" + "x*" * stars + "\n")
    name = "a" * (stars + 10)  # 30 letters for 20 wildcards, as in the issue
    write(root / name, "kept: no b")
    write(root / (name + "b"), "ignored: ends with b")
    write(root / ("x" * 250 + ".md"), "ignored: x* repeated")
    code = ("import sys; from ragdb.files import walk; "
            "print(sorted(rel for _, rel in walk.walk(sys.argv[1]).files))")
    try:
        done = subprocess.run([sys.executable, "-c", code, str(root)], capture_output=True, text=True, timeout=60,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    except subprocess.TimeoutExpired:
        pytest.fail(f"a walk with a .gitignore line of {stars} wildcards did not end within a minute")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == repr([name])
    inc = walk.Patterns(["a*" * stars + "b"], "include")  # --include/--exclude match the same way
    assert inc.match(name + "b") and not inc.test(name)


def test_ragdbignore_wins_over_gitignore_and_turns_default_rules_off(tmp_path):
    root = tmp_path / "r"
    write(root / ".gitignore", "notes/\n")
    write(root / ".ragdbignore", "!notes/\n!build/\n!*.csv\n*.md\n!keep.md\n")
    write(root / "notes" / "n.txt", "notes are back")
    write(root / "build" / "manual.txt", "a hand-written manual in build/")
    write(root / "dist" / "x.txt", "still a default skip")
    write(root / "table.csv", "a,b")
    write(root / "drop.md", "ignored by .ragdbignore")
    write(root / "keep.md", "kept")
    write(root / "logo.png", PNG)
    write(root / ".ragdbignore2", "")  # hidden
    picked = sorted(rel for _, rel in walk.walk(root).files)
    assert picked == ["build/manual.txt", "keep.md", "notes/n.txt", "table.csv"]


def test_an_ignore_file_saved_with_a_byte_order_mark_ignores_its_first_pattern(tmp_path):
    """git skips a UTF-8 byte order mark at the start of a .gitignore; ragdb read the first
    pattern as U+FEFF + "secret.md", which matched nothing: the files were indexed."""
    root = tmp_path / "r"
    write(root / ".gitignore", b"\xef\xbb\xbfsecret.md\n")
    write(root / "sub" / ".ragdbignore", b"\xef\xbb\xbf*.log\n")
    for name in ("secret.md", "kept.md", "sub/run.log", "sub/notes.md"):
        write(root / name, "text " + name)
    assert sorted(rel for _, rel in walk.walk(root).files) == ["kept.md", "sub/notes.md"]


def test_gitignore_above_the_synced_folder_counts_inside_a_work_tree(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    write(repo / ".git" / "HEAD", "ref: x\n")
    write(repo / ".gitignore", "docs/private/\n*.bak.md\n")
    write(repo / "docs" / "a.md", "public doc")
    write(repo / "docs" / "a.bak.md", "backup")
    write(repo / "docs" / "private" / "p.md", "private")
    monkeypatch.chdir(repo)
    with ragdb.open(":memory:") as db:
        report = sync.sync_folder(db, repo / "docs")
        assert report.added == ("docs/a.md",)
        assert skips(report, repo) == {("docs/a.bak.md", "ignored"), ("docs/private/", "ignored")}
    # outside a work tree, a parent's .gitignore means nothing
    (repo / ".git" / "HEAD").unlink()
    (repo / ".git").rmdir()
    assert sorted(rel for _, rel in walk.walk(repo / "docs").files) == ["a.bak.md", "a.md", "private/p.md"]


def test_a_named_file_is_never_skipped_by_default_rules(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / ".gitignore", "*.md\n")
    write(tmp_path / "node_modules" / "pkg" / "README.md", "# Pkg\n\nThe left pad package.\n")
    write(tmp_path / "package-lock.json", '{"lockfileVersion": 3}\n')
    write(tmp_path / ".notes.md", "hidden notes about pads\n")
    write(tmp_path / "blob.bin", BINARY)
    with ragdb.open(":memory:") as db:
        report = sync.add_paths(db, ["node_modules/pkg/README.md", "package-lock.json", ".notes.md", "blob.bin"])
        assert sorted(report.added) == [".notes.md", "node_modules/pkg/README.md", "package-lock.json"]
        assert [f.source for f in report.failed] == ["blob.bin"] and "binary" in report.failed[0].error
        assert report.skipped == ()


# ----------------------------------------------------------------------------- include / exclude


def test_expand_braces():
    assert walk.expand_braces("*.{md,rst}") == ["*.md", "*.rst"]
    assert walk.expand_braces("{docs,guides}/**/*.{md,txt}") == ["docs/**/*.md", "docs/**/*.txt",
                                                                 "guides/**/*.md", "guides/**/*.txt"]
    assert walk.expand_braces("a{b,c{d,e}}f") == ["abf", "acdf", "acef"]
    assert walk.expand_braces("{single}") == ["{single}"]  # no comma: literal, as in a shell
    assert walk.expand_braces("unbalanced{a,b") == ["unbalanced{a,b"]
    assert walk.expand_braces(r"esc\{a,b}") == [r"esc\{a,b}"]


def test_include_exclude_and_glob(tmp_path):
    root = tmp_path / "r"
    for name in ("a.md", "b.rst", "c.txt", "docs/d.md", "docs/old/e.md", "sub/docs/f.md"):
        write(root / name, "text")
    files = lambda **kw: sorted(p.relative_to(root).as_posix() for p in iter_files(root, **kw))  # noqa: E731
    assert files(include=["*.{md,rst}"]) == ["a.md", "b.rst", "docs/d.md", "docs/old/e.md", "sub/docs/f.md"]
    assert files(include=["*.md", "*.rst"], exclude=["docs/old/"]) == ["a.md", "b.rst", "docs/d.md",
                                                                       "sub/docs/f.md"]
    assert files(include=["/docs/"]) == ["docs/d.md", "docs/old/e.md"]  # anchored: not sub/docs
    assert files(include=["docs/*.md"]) == ["docs/d.md"]
    assert files(include=["**/docs/*.md"]) == ["docs/d.md", "sub/docs/f.md"]
    assert files(glob="*.txt") == ["c.txt"]  # the deprecated single include
    assert files(include=["*.md", "!docs/**"]) == ["a.md", "sub/docs/f.md"]
    found = walk.walk(root, include=["*.md", "*.mdx"], exclude=["nothing-here/"])
    assert found.unmatched == ("*.mdx", "nothing-here/")
    with pytest.raises(InvalidInput, match="include"):
        walk.walk(root, include=[""])
    with pytest.raises(InvalidInput, match="not a valid"):
        walk.walk(root, include=["[z-a]"])


def test_cli_repeated_glob_include_and_unmatched_patterns(tmp_path, runner, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("docs/a.md", "docs/b.rst", "docs/c.txt"):
        write(tmp_path / name, "text about " + name)
    data = out_json(run(runner, "-d", "kb.db", "add", "docs", "--glob", "*.md", "--glob", "*.rst", "--json"))
    assert sorted(data["added"]) == ["docs/a.md", "docs/b.rst"]  # both globs count, not the last one
    assert data["skip_counts"] == {"not included": 1}
    braces = run(runner, "-d", "b.db", "add", "docs", "--include", "*.{md,rst}")
    assert "added 2 documents" in braces.stdout
    none = run(runner, "-d", "c.db", "add", "docs", "--include", "*.mdx", ok=False)
    assert none.exit_code == 1  # nothing added: an error, not a silent success
    assert "--include '*.mdx' matched no file" in none.stderr and "nothing to add" in none.stderr
    some = run(runner, "-d", "d.db", "add", "docs", "--include", "*.md", "--include", "*.mdx")
    assert "added 1 document" in some.stdout and "--include '*.mdx' matched no file" in some.stderr
    synced = run(runner, "-d", "e.db", "sync", "docs", "--include", "*.pdf")
    assert synced.exit_code == 0 and "--include '*.pdf' matched no file" in synced.stderr


def test_sync_scope_follows_include_and_exclude(tmp_path, monkeypatch):
    root = tmp_path / "r"
    for name in ("a.md", "b.txt", "drafts/c.md"):
        write(root / name, "text " + name)
    monkeypatch.chdir(root)
    with ragdb.open(":memory:") as db:
        sync.sync_folder(db, root)
        assert sources(db) == ["a.md", "b.txt", "drafts/c.md"]
        report = sync.sync_folder(db, root, exclude=["drafts/"])
        assert report.deleted == () and report.unchanged == ("a.md", "b.txt")  # drafts: out of scope, kept
        report = sync.sync_folder(db, root, include=["*.md"], exclude=["drafts/"])
        assert report.deleted == () and report.unchanged == ("a.md",)
        write(root / ".gitignore", "b.txt\n")
        report = sync.sync_folder(db, root)  # newly ignored: in scope, so it goes
        assert report.deleted == ("b.txt",)
        report = sync.sync_folder(db, root, recursive=False)
        assert report.deleted == () and report.unchanged == ("a.md",)  # sub-folders out of scope


# ----------------------------------------------------------------------------- one source per file


def test_one_source_per_file_however_it_is_named(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "docs" / "a.md", "# A\n\nAlpha text about valves.\n")
    with ragdb.open(":memory:") as db:
        first = sync.add_paths(db, ["docs/a.md"])
        assert first.added == ("docs/a.md",)
        for name in ("./docs/a.md", "docs//a.md", str(tmp_path / "docs" / "a.md"), "docs/../docs/a.md", "docs"):
            again = sync.add_paths(db, [name])
            assert again.added == () and again.unchanged == ("docs/a.md",), name
        assert sync.source_name(tmp_path / "docs" / "a.md") == "docs/a.md"
        assert sync.source_name(tmp_path) == ""
        outside = tmp_path.parent / "elsewhere.md"
        assert sync.source_name(outside) == outside.as_posix()
        assert sync.source_name(tmp_path / "docs" / "a.md", relative_to=tmp_path / "docs") == "a.md"
        # add then sync: the same sources, nothing added twice
        report = sync.sync_folder(db, "docs")
        assert report.prefix == "docs/" and report.unchanged == ("docs/a.md",) and report.added == ()
        report = sync.sync_folder(db, ".")
        assert report.unchanged == ("docs/a.md",) and report.added == report.deleted == ()
        assert sources(db) == ["docs/a.md"]


def test_cli_add_then_sync_agree_in_subprocesses(tmp_path):
    work = tmp_path / "work"
    write(work / "docs" / "guide.md", "# Guide\n\nOpen the valve slowly.\n")
    write(work / "docs" / "sub" / "notes.txt", "Close the valve after use.\n")
    write(work / "other.md", "Not in docs.\n")
    db = tmp_path / "kb.db"
    assert ragdb_proc("-d", db, "add", "./docs/guide.md", cwd=work).returncode == 0
    p = ragdb_proc("-d", db, "add", work / "docs", "other.md", "--json", cwd=work)
    assert p.returncode == 0, p.stderr
    data = orjson.loads(p.stdout)
    assert data["unchanged"] == ["docs/guide.md"] and sorted(data["added"]) == ["docs/sub/notes.txt", "other.md"]
    p = ragdb_proc("-d", db, "sync", "docs", "--json", cwd=work)
    data = orjson.loads(p.stdout)
    assert data["prefix"] == "docs/" and data["added"] == data["deleted"] == [] and data["unchanged"] == 2
    (work / "docs" / "sub" / "notes.txt").unlink()
    data = orjson.loads(ragdb_proc("-d", db, "sync", "docs/", "--json", cwd=work).stdout)
    assert data["deleted"] == ["docs/sub/notes.txt"]
    with ragdb.open(db) as d:
        assert sources(d) == ["docs/guide.md", "other.md"]  # the sync of docs/ leaves other.md alone
    # from another folder: names relative to it, or absolute outside it; --relative-to gives the same names again
    p = ragdb_proc("-d", db, "sync", work / "docs", "--relative-to", work, "--json", cwd=tmp_path)
    data = orjson.loads(p.stdout)
    assert data["unchanged"] == 1 and data["added"] == [] and data["deleted"] == []
    p = ragdb_proc("-d", db, "sync", work / "docs", "--source-prefix", "kb/", "--dry-run", cwd=tmp_path)
    assert "A kb/work/docs/guide.md" in p.stdout.decode()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    p = ragdb_proc("-d", db, "sync", work / "docs", "--dry-run", cwd=elsewhere)
    assert f"A {(work / 'docs' / 'guide.md').as_posix()}" in p.stdout.decode()


def test_jsonl_records_get_the_same_sources_from_add_and_sync(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = write(tmp_path / "jl" / "recs.jsonl", '{"id": "j1", "text": "first record about kaons"}\n'
                                                 '{"text": "a record without an id, about pions"}\n')
    expected = ["jl/recs.jsonl#2", "jl/recs.jsonl#j1"]
    with ragdb.open(":memory:") as db:
        added = sync.add_paths(db, ["jl/recs.jsonl"])
        assert sorted(added.added) == expected and sources(db) == expected
        for _ in range(2):  # sync after add, and again: idempotent, no nested '#'
            report = sync.sync_folder(db, "jl")
            assert report.unchanged == ("jl/recs.jsonl",) and report.added == report.deleted == ()
            assert sources(db) == expected
        write(path, '{"id": "j1", "text": "first record, now about muons"}\n'
                    '{"id": "j3", "text": "third record about taus"}\n')
        report = sync.sync_folder(db, "jl")
        assert report.changed == ("jl/recs.jsonl",) and sources(db) == ["jl/recs.jsonl#j1", "jl/recs.jsonl#j3"]
        write(path, '{"id": "j3", "text": "third record about taus"}\n')
        again = sync.add_paths(db, ["./jl/recs.jsonl"])  # add replaces the file's records as a whole
        assert again.removed == 1 and sources(db) == ["jl/recs.jsonl#j3"]
        assert db.get(source="jl/recs.jsonl#j3", principals=ragdb.ALL).metadata["sync_file"] == "jl/recs.jsonl"
        assert not any(s.count("#") > 1 for s in sources(db))


# ----------------------------------------------------------------------------- access labels


def test_front_matter_and_jsonl_labels_become_acl(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "kb" / "hr.md", "---\ntitle: Salaries\nacl: [hr, finance]\n---\n# Salaries\n\nPay bands.\n")
    write(tmp_path / "kb" / "one.md", "---\nlabels: legal\n---\nContract templates.\n")
    write(tmp_path / "kb" / "open.md", "Cafeteria menu.\n")
    write(tmp_path / "kb" / "r.jsonl", '{"id": "x", "text": "Board minutes.", "acl": ["board"]}\n')
    with ragdb.open(tmp_path / "kb.db") as db:
        sync.sync_folder(db, "kb")
        docs = {d.source: d for d in db.documents(principals=ragdb.ALL)}
        assert docs["kb/hr.md"].acl == ("finance", "hr") and "acl" not in docs["kb/hr.md"].metadata
        assert docs["kb/one.md"].acl == ("legal",) and "labels" not in docs["kb/one.md"].metadata
        assert docs["kb/open.md"].acl == ()
        assert docs["kb/r.jsonl#x"].acl == ("board",)
        assert [h.source for h in db.search("pay bands", principals=["hr"])] == ["kb/hr.md"]
        assert db.search("pay bands", principals=["legal"]) == []
        assert db.search("pay bands") == []  # anonymous
        # acl= overrides the files' own labels; PUBLIC makes them visible to everyone
        write(tmp_path / "kb" / "hr.md", "---\nacl: [hr]\n---\n# Salaries\n\nPay bands, revised.\n")
        sync.sync_folder(db, "kb", acl=[ragdb.PUBLIC])
        assert db.get(source="kb/hr.md").acl == (ragdb.PUBLIC,)
        assert [h.source for h in db.search("pay bands revised")] == ["kb/hr.md"]
        report = sync.add_paths(db, ["kb/one.md"], acl=["team:x"], version="2")
        assert report.added == ("kb/one.md",)
        assert db.get(source="kb/one.md", principals=["team:x"]).acl == ("team:x",)
        with pytest.raises(InvalidInput, match="acl"):
            sync.add_paths(db, ["kb/one.md"], acl="team:x")


def test_cli_acl_and_public(tmp_path, runner, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "d" / "a.md", "---\nacl: [ops]\n---\nThe pump manual.\n")
    write(tmp_path / "d" / "b.md", "The valve manual.\n")
    run(runner, "-d", "kb.db", "init", "--no-public-unlabeled")
    run(runner, "-d", "kb.db", "add", "d")
    with ragdb.open(tmp_path / "kb.db") as db:
        assert {d.source: d.acl for d in db.documents(principals=ragdb.ALL)} == {"d/a.md": ("ops",), "d/b.md": ()}
        assert db.search("manual") == []
    run(runner, "-d", "kb.db", "sync", "d", "--acl", "eng", "--acl", "ops", "-v")
    run(runner, "-d", "kb.db", "add", "d/b.md", "--public")
    with ragdb.open(tmp_path / "kb.db") as db:
        acl = {d.source: d.acl for d in db.documents(principals=ragdb.ALL)}
        # --acl relabels unchanged files too (as add --acl does); --public then opened b.md
        assert acl == {"d/a.md": ("eng", "ops"), "d/b.md": (ragdb.PUBLIC,)}
        assert [h.source for h in db.search("manual")] == ["d/b.md"]
    write(tmp_path / "d" / "a.md", "---\nacl: [ops]\n---\nThe pump manual, second edition.\n")
    run(runner, "-d", "kb.db", "sync", "d", "--acl", "eng", "--acl", "ops")
    with ragdb.open(tmp_path / "kb.db") as db:
        assert db.get(source="d/a.md", principals=ragdb.ALL).acl == ("eng", "ops")
    both = run(runner, "-d", "kb.db", "add", "d", "--acl", "x", "--public", ok=False)
    assert both.exit_code == 2 and "exclude each other" in both.output


# ----------------------------------------------------------------------------- pieces


def test_every_loader_suffix_is_picked_by_a_walk():
    assert SUPPORTED_SUFFIXES <= walk.TEXT_SUFFIXES


def test_content_reason():
    assert walk.content_reason(BINARY, "x.txt") == "binary"
    assert walk.content_reason("UTF-16 text".encode("utf-16"), "x.txt") is None  # a BOM: text with NULs
    assert walk.content_reason(b"%PDF-1.7 \x00\x01", "x.pdf") is None
    assert walk.content_reason(b"x" * 20_000, "bundle.js") == "minified"
    assert walk.content_reason(b"x" * 20_000, "one-paragraph.md") is None  # prose may have long lines
    assert walk.content_reason(b"def f():\n    return 1\n" * 500, "code.py") is None


def test_skip_counts_and_reasons():
    items = [walk.Skipped("a/", "vcs"), walk.Skipped("b", "binary"), walk.Skipped("c", "binary")]
    assert walk.skip_counts(items) == {"binary": 2, "vcs": 1}
    assert walk.reason_summary({"node_modules": 1100, "binary": 80}) == "1,100 node_modules, 80 binary"
    assert all(walk.file_reason(n) == r for n, r in [("x.PNG", "image"), ("Cargo.lock", "lockfile"),
                                                      ("x.min.css", "minified"), ("README", None),
                                                      ("Dockerfile", None), ("x.weird", "unsupported"),
                                                      (".bashrc", "hidden"), ("x.py", None)])


def test_cli_sync_warns_about_names_from_before(tmp_path, runner, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path / "docs" / "a.md", "Alpha valves.\n")
    with ragdb.open(tmp_path / "kb.db") as db:  # what 'ragdb sync docs --source-prefix kb/' stored before
        sync.sync_folder(db, "docs", source_prefix="kb/", relative_to="docs")
        assert sources(db) == ["kb/a.md"]
    dry = run(runner, "-d", "kb.db", "sync", "docs", "--source-prefix", "kb/", "--dry-run")
    assert "A kb/docs/a.md" in dry.stdout and "--relative-to docs" in dry.stderr
    kept = run(runner, "-d", "kb.db", "sync", "docs", "--source-prefix", "kb/", "--relative-to", "docs")
    assert "unchanged 1" in kept.stdout and "warning" not in kept.stderr


@pytest.mark.parametrize("kwargs", [{"include": 5}, {"include": [None]}, {"exclude": "x"}, {"acl": "hr"},
                                    {"acl": [1]}, {"acl": 3}, {"relative_to": 7}, {"glob": 3},
                                    {"source_prefix": None}])
def test_bad_arguments_are_invalid_input(tmp_path, kwargs):
    write(tmp_path / "a.md", "text")
    with ragdb.open(":memory:") as db:
        with pytest.raises(InvalidInput):
            sync.add_paths(db, [str(tmp_path)], **kwargs)
        with pytest.raises(InvalidInput):
            sync.sync_folder(db, tmp_path, **kwargs)
        with pytest.raises(InvalidInput):
            sync.add_paths(db, [3])


def test_relative_to_must_be_a_folder(tmp_path):
    write(tmp_path / "d" / "a.md", "# A\n")
    with ragdb.open(tmp_path / "kb.db") as db:
        for bad in (tmp_path / "missing", tmp_path / "d" / "a.md"):
            with pytest.raises(InvalidInput, match="relative_to .*not an existing folder"):
                sync.add_paths(db, [str(tmp_path / "d")], relative_to=bad)
            with pytest.raises(InvalidInput, match="relative_to .*not an existing folder"):
                sync.sync_folder(db, tmp_path / "d", relative_to=bad)
        assert db.count(principals=ragdb.ALL) == 0


def test_a_walk_never_reads_a_database_this_process_holds_open(tmp_path):
    """A knowledge base kept inside the folder it indexes, under a name no suffix rule skips
    (``kb``), and its -wal/-shm files: the walk skips them without opening them (closing a
    descriptor of the file would drop this process's SQLite locks, and another process could
    then delete the -wal under the open handle). Adding the folder twice, with another
    process opening and closing the database in between, leaves it whole."""
    root = tmp_path / "notes"
    root.mkdir()
    (root / "a.md").write_text("# Pumps\n\nThe pump starts slowly.\n")
    with ragdb.open(root / "kb") as db:
        db.add("seed", source="seed.md")
        assert (root / "kb-wal").exists()
        found = walk.walk(root)
        assert [rel for _, rel in found.files] == ["a.md"]
        assert {(Path(s.path).name, s.reason) for s in found.skipped} >= {
            ("kb", "binary"), ("kb-wal", "binary"), ("kb-shm", "binary")}
        sync.add_paths(db, [str(root)])
        other = subprocess.run([sys.executable, "-c", "import ragdb, sys; ragdb.open(sys.argv[1]).close()",
                                str(root / "kb")], env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
                               capture_output=True, text=True, timeout=60)
        assert other.returncode == 0, other.stderr
        assert (root / "kb-wal").exists()
        (root / "b.md").write_text("The valve closes first.\n")
        sync.add_paths(db, [str(root)])
        assert db.count(principals=ragdb.ALL) == 3 and len(db.search("valve")) == 1
        assert db.check() == []
