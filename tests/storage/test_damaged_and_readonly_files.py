"""Smaller defaults: read-only media, damaged files reported as damaged, init errors as sentences."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import ragdb
from ragdb.errors import DatabaseCorrupt, NotADatabase, StorageError

CLI = [sys.executable, "-m", "ragdb.cli"]


def _as_unprivileged(code: str, cwd: Path, input: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a Python process that cannot write ``cwd`` (a read-only folder).

    As root, permission bits do not stop writes, so the child drops to the
    ``nobody`` user (setpriv, util-linux); otherwise the folder's write bits suffice."""
    cmd = [sys.executable, "-c", code]
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root without setpriv: cannot make a folder read-only")
        cmd = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", *cmd]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=120, env=env, input=input)


@pytest.fixture
def readonly_folder():
    # Not under pytest's tmp_path: its parents are private to the user running pytest.
    folder = Path(tempfile.mkdtemp(prefix="ragdb-ro-"))
    folder.chmod(0o755)
    yield folder
    for p in [folder, *folder.iterdir()]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    shutil.rmtree(folder)


def _freeze(folder: Path) -> None:
    for p in folder.iterdir():
        p.chmod(stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
    folder.chmod(0o555)


def test_readonly_open_on_a_read_only_folder_uses_immutable(readonly_folder):
    path = readonly_folder / "kb.db"
    with ragdb.open(path) as db:
        db.add("read-only media hold knowledge too", source="a.md")
        db.add("another document", source="b.md")
    assert not (readonly_folder / "kb.db-wal").exists()  # a clean close folds the WAL in
    _freeze(readonly_folder)
    code = ("import ragdb\n"
            "with ragdb.open('kb.db', readonly=True) as db:\n"
            "    print([h.source for h in db.search('knowledge')], db.stats().documents, db.check(quick=True))\n"
            "try:\n"
            "    ragdb.open('kb.db')\n"
            "except ragdb.RagdbError as e:\n"
            "    print('write-open:', type(e).__name__)\n")
    p = _as_unprivileged(code, readonly_folder)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0] == "['a.md'] 2 []"
    assert lines[1] == "write-open: StorageError"
    assert sorted(x.name for x in readonly_folder.iterdir()) == ["kb.db"]  # nothing was created


def test_readonly_refuses_a_read_only_folder_with_pending_wal(readonly_folder):
    path = readonly_folder / "kb.db"
    src = ragdb.open(path)  # kept open: its commits stay in kb.db-wal
    try:
        src.add("committed but not checkpointed", source="a.md")
        wal = readonly_folder / "kb.db-wal"
        assert wal.stat().st_size > 0
        snapshot = readonly_folder / "snap"
        snapshot.mkdir()
        for name in ("kb.db", "kb.db-wal"):
            shutil.copy(readonly_folder / name, snapshot / name)
    finally:
        src.close()
    _freeze(snapshot)
    code = ("import ragdb\n"
            "try:\n"
            "    ragdb.open('kb.db', readonly=True)\n"
            "except ragdb.RagdbError as e:\n"
            "    print(type(e).__name__, e)\n")
    p = _as_unprivileged(code, snapshot)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("StorageError kb.db: cannot be read here")
    assert "kb.db-wal holds commits not yet in the database file" in p.stdout
    for x in snapshot.iterdir():
        x.chmod(0o644)
    snapshot.chmod(0o755)


def test_readonly_on_a_writable_folder_is_not_immutable(tmp_path):
    path = tmp_path / "kb.db"
    with ragdb.open(path) as writer, ragdb.open(path, readonly=True) as reader:
        writer.add("first", source="a")
        assert [h.source for h in reader.search("first")] == ["a"]
        writer.add("second first", source="b")
        assert {h.source for h in reader.search("first")} == {"a", "b"}  # sees later commits


def test_damaged_file_is_reported_as_damaged(tmp_path):
    path = tmp_path / "kb.db"
    with ragdb.open(path) as db:
        for i in range(200):
            db.add(f"document number {i} " * 20, source=f"s{i}")
    data = bytearray(path.read_bytes())
    data[4096:3 * 4096] = b"\xff" * (2 * 4096)  # overwrite pages 2-3 (the schema's tables)
    path.write_bytes(bytes(data))
    with pytest.raises(DatabaseCorrupt, match="the file is not a database or is corrupt") as e, \
            ragdb.open(path) as db:
        db.search("document")
        db.check()
    assert "not a ragdb database" not in str(e.value)
    assert isinstance(e.value, NotADatabase)  # the older, wider class still catches it


def test_a_file_of_another_kind_is_not_a_database(tmp_path):
    junk = tmp_path / "notes.txt"
    junk.write_bytes(b"plain text, not SQLite" * 100)
    before = junk.read_bytes()
    with pytest.raises(NotADatabase, match=r"notes.txt: not a database file \(it does not start with SQLite's "
                                           r"header\)") as e:
        ragdb.open(junk)
    assert not isinstance(e.value, DatabaseCorrupt)
    assert junk.read_bytes() == before


def test_a_damaged_header_is_corrupt(tmp_path):
    path = tmp_path / "kb.db"
    with ragdb.open(path) as db:
        db.add("some text", source="a")
    data = bytearray(path.read_bytes())
    data[16:100] = os.urandom(84)  # the rest of the header page: page size, counters ...
    path.write_bytes(bytes(data))
    with pytest.raises(DatabaseCorrupt, match="the file is not a database or is corrupt"):
        ragdb.open(path)


def test_init_errors_are_sentences(tmp_path):
    def init(*args):
        return subprocess.run([*CLI, *args], cwd=tmp_path, capture_output=True, text=True, timeout=120)

    p = init("-d", "missing/kb.db", "init")
    assert p.returncode == 1
    assert p.stderr.strip() == "Error: missing/kb.db: cannot create the database: the folder 'missing' does not exist"
    assert init("-d", "kb.db", "init", "--analyzer", "simple").returncode == 0
    p = init("-d", "kb.db", "init", "--analyzer", "default")
    assert p.returncode == 1
    assert ("kb.db: was built with the simple (no stemming, no stopwords, CJK bigrams) analyzer and cannot be "
            "opened with the default (English stemming, English and Chinese stopwords, CJK bigrams) one") in p.stderr
    assert "{" not in p.stderr and "None" not in p.stderr
    p = init("-d", "kb.db", "init")
    assert "simple (no stemming, no stopwords, CJK bigrams)" in p.stdout and "None" not in p.stdout
    (tmp_path / "junk.db").write_bytes(b"\x01" * 4096)
    p = init("-d", "junk.db", "init")
    assert p.returncode == 1 and "junk.db: not a database file" in p.stderr
    p = init("-d", "kb.db", "init", "--no-public-unlabeled")
    assert p.returncode == 1
    assert ("this database makes documents without access labels public (public_unlabeled true), and opening "
            "it never changes that; change it with 'ragdb config public_unlabeled false'") in p.stderr


def test_missing_folder_from_the_library(tmp_path):
    with pytest.raises(StorageError, match="the folder .* does not exist"):
        ragdb.open(tmp_path / "no" / "such" / "kb.db")


def test_cli_readonly_on_a_read_only_folder(readonly_folder):
    with ragdb.open(readonly_folder / "kb.db") as db:
        db.add("read-only media hold knowledge too", source="a.md")
    _freeze(readonly_folder)
    code = ("import sys\n"
            "from ragdb.cli.main import main\n"
            "sys.argv = ['ragdb', '--readonly', '-d', 'kb.db'] + sys.argv[1:]\n"
            "main()\n")
    search = _as_unprivileged(code.replace("sys.argv[1:]", "['search', 'knowledge', '--json']"), readonly_folder)
    assert search.returncode == 0, search.stderr
    assert '"source":"a.md"' in search.stdout.replace(" ", "")
    add = _as_unprivileged(code.replace("sys.argv[1:]", "['add', '-', '--source', 'x']"), readonly_folder,
                           input="new text")
    assert add.returncode == 1 and "read-only" in add.stderr, add.stderr
    assert sorted(x.name for x in readonly_folder.iterdir()) == ["kb.db"]
