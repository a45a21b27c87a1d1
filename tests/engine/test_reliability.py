"""Reliability, CI sizes: concurrency, SIGKILL crashes, disk full / read-only, hostile input.

The scenarios and their sizes live in ``tests/reliability_worker.py``; this module
runs them at the CI sizes (``rw.SIZES["ci"]``) in pytest's ``tmp_path`` and asserts
their expectations. It writes nothing into the repository: the *CI run* figures of
RELIABILITY.md come from ``.venv/bin/python benchmarks/reliability.py --ci``, which
runs the same scenarios at the same sizes (and the *Long run* ones from
``benchmarks/reliability.py`` without options).

The tests at the end are regression tests for the library bugs these
scenarios found (``reliability_worker.KNOWN_BUGS``), all fixed.
"""

from __future__ import annotations

import os
import random
import sqlite3
import sys
from pathlib import Path

import pytest

import ragdb
from ragdb.errors import InvalidInput, RagdbError, StorageError

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # also under --import-mode=importlib
import reliability_worker as rw  # noqa: E402

pytestmark = pytest.mark.skipif(os.name != "posix", reason="SIGKILL, fork server, FIFOs: POSIX only")


# ----------------------------------------------------------------------------- concurrency


def test_concurrent_readers_threads_and_two_writers(tmp_path: Path) -> None:
    fig = rw.run_scenario("concurrency", tmp_path)
    assert rw.failures({"concurrency": fig}) == []
    assert fig["n_errors"] == 0, fig["errors"]            # no "database is locked" (or anything) escaped
    assert fig["n_violations"] == 0, fig["violations"]    # never a half-added document or a torn snapshot
    assert fig["final_mismatches"] == []                  # both writer processes' work is all there
    assert fig["final_check"] == [] and fig["final_whole_problems"] == []
    busy = fig["busy"]
    assert busy["tiny_timeout"] == "DatabaseBusy"
    assert "locked" in busy["tiny_timeout_message"] and "concurrency.db" in busy["tiny_timeout_message"]
    assert busy["unchanged_after_busy"] and busy["search_while_locked"]
    # it waited for the lock (finished only once the holder was letting go), then succeeded
    assert busy["default_timeout_finished_after_release"] is True and busy["default_timeout_waited_and_succeeded"]
    assert busy["check"] == []


def test_database_object_documents_thread_safety() -> None:
    """The issue: a Database is safe to share between threads, or says clearly that it is not. The
    concurrency run shares one between threads; its documentation must say so."""
    doc = " ".join((ragdb.Database.__doc__ or "").split()).lower()
    assert "thread" in doc and "shared between threads" in doc


# ----------------------------------------------------------------------------- crashes


def test_sigkill_during_writes(tmp_path: Path) -> None:
    fig = rw.run_scenario("crashes", tmp_path)
    assert rw.failures({"crashes": fig}) == []
    assert fig["problems"] == []
    assert fig["kills"] >= 20 and fig["exited_by_itself"] == []
    assert fig["operations_completed"] > fig["kills"]     # the worker really worked between kills
    assert fig["interrupted_total"] >= 1                  # and some kills landed inside an operation
    assert fig["cli_checks"] and all(c["exit"] == 0 and "ok" in c["output"] for c in fig["cli_checks"])


# ----------------------------------------------------------------------------- disk full, read-only


def test_disk_full_and_read_only(tmp_path: Path) -> None:
    fig = rw.run_scenario("faults", tmp_path)
    assert rw.failures({"faults": fig}) == []
    for case in fig["cases"]:
        name = f"{case['condition']} / {case['operation']}"
        assert case["outcome"] != "crash", (name, case.get("message"))
        assert case["file_check"] == [], name
        assert case.get("later_writes_correct") in (None, True), (name, case.get("later_problem"))
        if case["outcome"] == "no error":
            # only allowed where the operation could be done without growing the file
            assert case["condition"] == "disk full" and case["operation"] in ("delete", "optimize+vacuum"), name
            continue
        assert case["file_unchanged"], name
        msg = case["message"]
        if case["condition"] == "disk full":
            assert case["outcome"] == "StorageError" and "disk is full" in msg and ".db" in msg, (name, msg)
        elif case["condition"].startswith("path 'file:"):
            assert case["stray_files"] == [], case   # no file named 'file:...' appeared
        else:
            assert case["outcome"] == "StorageError" and "read-only" in msg, (name, msg)
    full = {c["operation"]: c for c in fig["cases"] if c["condition"] == "disk full"}
    for op in ("add", "add_many", "replace", "sync", "optimize"):
        assert full[op]["outcome"] == "StorageError", op


def test_readonly_open_cannot_write_and_says_so(tmp_path: Path) -> None:
    path = str(tmp_path / "kb.db")
    with ragdb.open(path) as db:
        db.add("read only knowledge", source="a")
    with ragdb.open(path, readonly=True) as ro:
        with pytest.raises(StorageError, match="read-only"):
            ro.add("more", source="b")
        assert [h.source for h in ro.search("knowledge")] == ["a"]
        assert ro.check() == []


# ----------------------------------------------------------------------------- hostile input


def test_torture_hostile_inputs(tmp_path: Path) -> None:
    fig = rw.run_scenario("torture", tmp_path)
    assert rw.failures({"torture": fig}) == []
    assert fig["cases"] >= 1000
    assert fig["findings"] == [], "\n".join(fig["findings"])  # no crash, no hang, outside the known bugs
    assert fig["check"] == [] and fig["baseline_unchanged"]
    classes = fig["per_class"]
    for cls in rw.TORTURE_CLASSES:
        assert classes[cls]["cases"] > 0, cls
    assert sum(r["cli"] for r in classes.values()) >= 200


def test_long_sizes_reach_the_long_targets() -> None:
    """The long run's sizes (run by benchmarks/reliability.py, not here) reach what the issue asks of it:
    >= 1,000 kills, >= 10,000 hostile cases with >= 25% through the CLI, 8 readers + 2 writers for 60 s.
    Only the case list is generated (well under a second); nothing runs."""
    long, tg = rw.SIZES["long"], rw.TARGETS["long"]
    assert long["crashes"]["kills"] >= tg["kills"] >= 1000
    assert long["concurrency"]["readers"] >= tg["reader_processes"] >= 8
    assert long["concurrency"]["seconds"] >= tg["seconds"] >= 60
    sz = long["torture"]
    cases = rw.torture_cases(sz["seed"], sz["scale"], sz["big_mb"], sz["token_mb"], sz["deep"])
    cli = sum(1 for c in cases if c.channel == "cli")
    assert len(cases) >= tg["torture_cases"] >= 10_000
    assert cli >= tg["cli_cases"] and cli >= tg["cli_share"] * len(cases) and tg["cli_share"] >= 0.25
    assert {c.cls for c in cases} >= set(rw.TORTURE_CLASSES)


# ----------------------------------------------------------------------------- after a failed write


def _full(db: ragdb.Database) -> None:
    conn = db._store.conn
    conn.execute(f"PRAGMA max_page_count = {conn.execute('PRAGMA page_count').fetchone()[0]}")


def _unfull(db: ragdb.Database) -> None:
    db._store.conn.execute("PRAGMA max_page_count = 4294967294")


def test_failed_write_leaves_no_phantom_term_ids(tmp_path: Path) -> None:
    """Regression: a write that failed inside its transaction once left uncommitted term ids in the
    Database's term cache, so later adds wrote postings under ids of no or another term."""
    db = ragdb.open(str(tmp_path / "t.db"))
    db.add("alpha beta gamma", source="a")
    _full(db)
    with pytest.raises(StorageError, match="disk is full"):
        db.add("phantom " + " ".join(f"filler{i}" for i in range(20000)), source="big")
    _unfull(db)
    db.add("phantom appears here", source="p")
    db.add("filler0 only", source="f")
    assert [h.source for h in db.search("phantom")] == ["p"]
    assert [h.source for h in db.search("appears")] == ["p"]
    assert [h.source for h in db.search("filler0")] == ["f"]
    assert db.check() == []


def test_failed_flush_keeps_document_frequencies(tmp_path: Path) -> None:
    """Regression: a flush that failed (disk full) once dropped the in-memory deleted-chunk corrections,
    so the same Database scored with wrong df and its next flush wrote them to the file."""
    path = str(tmp_path / "f.db")
    db = ragdb.open(path, chunker="window:size=20,overlap=0")
    words = [f"w{i}" for i in range(3000)]
    r = random.Random(1)
    for i in range(60):
        db.add(" ".join(r.choice(words) for _ in range(200)) + " shared", source=f"d{i}")
    db.optimize(vacuum=False)
    db.delete(source="d0")                      # flushed chunks die: their terms go to chunk_log
    for i in range(60, 70):
        db.add(" ".join(r.choice(words) for _ in range(200)) + " shared", source=f"d{i}")
    _full(db)
    with pytest.raises(StorageError, match="disk is full"):
        db.optimize(vacuum=False)
    _unfull(db)
    fresh = ragdb.open(path)
    assert db.search("shared", k=1)[0].score == fresh.search("shared", k=1)[0].score
    db.optimize(vacuum=False)
    assert db.check() == []


# ----------------------------------------------------------------------------- library bugs found here
# Regression tests for the bugs in reliability_worker.KNOWN_BUGS, all fixed.


@pytest.mark.parametrize("where", ["source", "title", "version", "acl", "delete", "filter key", "filter value",
                                   "source filter", "principals"])
def test_bug_b1_lone_surrogates_raise_unicode_errors(where: str) -> None:
    db = ragdb.open(":memory:")
    db.add("alpha text", source="a", metadata={"k": "v"})
    bad = "name\udcff"                          # os.fsdecode(b"name\xff")
    with pytest.raises(RagdbError):
        if where == "delete":
            db.delete(source=bad)
        elif where == "acl":
            db.add("text", source="s", acl=[bad])
        elif where == "filter key":
            db.search("alpha", filter={bad: "v"})
        elif where == "filter value":
            db.search("alpha", filter={"k": bad})
        elif where == "source filter":
            db.search("alpha", filter={"source": bad})
        elif where == "principals":
            db.search("alpha", principals=[bad])
        else:
            db.add("text", **{"source": "s", where: bad})


def test_bug_b1_cli_json_report_of_undecodable_file_name(tmp_path: Path) -> None:
    from click.testing import CliRunner
    from ragdb.cli import cli
    with open(os.path.join(os.fsencode(tmp_path), b"name\xff.txt"), "wb") as fh:
        fh.write(b"some text")
    res = CliRunner().invoke(cli, ["-d", str(tmp_path / "kb.db"), "add", str(tmp_path), "--json"])
    assert "internal error" not in res.output     # actually: internal error: TypeError: str is not valid UTF-8


@pytest.mark.parametrize("param", ["k1", "b"])
def test_bug_b2_search_bm25_parameters_not_numbers(param: str) -> None:
    db = ragdb.open(":memory:")
    db.add("alpha", source="a")
    with pytest.raises(InvalidInput):
        db.search("alpha", **{param: "x"})


def test_bug_b3_open_waits_for_a_writer(tmp_path: Path) -> None:
    path = str(tmp_path / "b3.db")
    with ragdb.open(path) as db:
        db.add("alpha beta", source="a")
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")          # a writer in the middle of a long add or sync
    try:
        with ragdb.open(path, busy_timeout=0.3) as reader:   # DatabaseBusy: 'database is locked'
            assert [h.source for h in reader.search("alpha")] == ["a"]
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()


@pytest.mark.parametrize("call", ["get", "delete", "filter"])
def test_bug_b4_integers_beyond_64_bits(call: str) -> None:
    db = ragdb.open(":memory:")
    db.add("alpha", source="a", metadata={"n": 1})
    with pytest.raises(RagdbError):
        if call == "get":
            db.get(10 ** 30)
        elif call == "delete":
            db.delete(10 ** 30)
        else:
            db.search("alpha", filter={"n": 2 ** 70})


@pytest.mark.parametrize("call", ["spans", "records"])
def test_bug_b5_argument_types_not_checked(call: str) -> None:
    db = ragdb.open(":memory:")
    with pytest.raises(InvalidInput):
        if call == "spans":
            db.add("alpha text", source="a", spans="bogus")  # type: ignore[arg-type]
        else:
            db.add_many(None)  # type: ignore[arg-type]


@pytest.mark.parametrize("front_matter", ["date: 2026-13-45", "n: !!int abc", "t: !!timestamp garbage",
                                          "x: !!bool maybe"])
def test_bug_b6_front_matter_constructor_errors(tmp_path: Path, front_matter: str) -> None:
    from ragdb.files import loaders
    p = tmp_path / "note.md"
    p.write_text(f"---\n{front_matter}\n---\n# Title\n\nbody", encoding="utf-8")
    with pytest.raises(RagdbError):     # actually ValueError / AttributeError / KeyError
        loaders.load_file(p)


def test_bug_b6_sync_skips_a_file_with_a_bad_front_matter_date(tmp_path: Path) -> None:
    from ragdb.files import sync
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "good.txt").write_text("a good file", encoding="utf-8")
    (folder / "bad.md").write_text("---\ndate: 2026-13-45\n---\nbody", encoding="utf-8")
    db = ragdb.open(str(tmp_path / "kb.db"))
    report = sync.sync_folder(db, folder, relative_to=folder)  # actually raised ValueError: month must be in 1..12
    assert report.added == ("good.txt",) and [f.source for f in report.failed] == ["bad.md"]


# ----------------------------------------------------------------------------- found by the concurrency hunt


def test_add_is_not_reported_failed_when_the_flush_after_it_finds_the_lock_taken(tmp_path: Path) -> None:
    """An add commits, then flushes the in-memory tail in a transaction of its own. When another
    process took the write lock in between and held it past the busy timeout, the flush's
    DatabaseBusy ('database is locked by another writer') reached the caller, although the
    document was stored: a caller that took the error at its word added it again, or gave up on
    a write that was made. The flush is left to a later write instead."""
    from ragdb.index.inverted import FLUSH_THRESHOLD

    path = str(tmp_path / "f.db")
    db = ragdb.open(path, busy_timeout=0.1)
    db.add_many([{"text": f"word{i} common", "source": f"d{i}"} for i in range(FLUSH_THRESHOLD - 1)],
                workers=0, batch_size=FLUSH_THRESHOLD)
    other = sqlite3.connect(path, isolation_level=None)
    flush = db._writer.maybe_flush

    def lock_taken_first(*args: object, **kwargs: object) -> object:
        if not other.in_transaction:
            other.execute("BEGIN IMMEDIATE")    # another process writes, right after the add committed
        return flush(*args, **kwargs)

    db._writer.maybe_flush = lock_taken_first  # type: ignore[method-assign]
    try:
        added = db.add("the last straw common", source="last")
    finally:
        other.execute("ROLLBACK")
        other.close()
    del db._writer.maybe_flush
    assert db.get(added.id).source == "last"
    with ragdb.open(path) as fresh:
        assert fresh.count() == FLUSH_THRESHOLD
        assert [h.source for h in fresh.search("straw")] == ["last"]
    assert db.stats().pending_chunks == FLUSH_THRESHOLD
    db.add("one more common", source="more")      # the next write flushes the tail
    assert db.stats().pending_chunks == 0
    assert db.check() == []


def test_a_failed_flush_inside_a_transaction_fails_the_transaction(tmp_path: Path) -> None:
    """Inside the caller's transaction nothing is committed when the flush after an add fails
    (here: the disk fills), so the error is raised and the transaction rolls back whole, rather
    than going on as if its writes were all there."""
    from ragdb.errors import StorageError
    from ragdb.index.inverted import FLUSH_THRESHOLD

    path = str(tmp_path / "t.db")
    db = ragdb.open(path)
    db.add("kept before", source="before")

    def disk_full(*args: object, **kwargs: object) -> object:
        raise StorageError("the disk is full; nothing was written")

    db._writer.maybe_flush = disk_full  # type: ignore[method-assign]
    with pytest.raises(StorageError, match="disk is full"), db.transaction():
        db.add_many([{"text": f"w{i} x", "source": f"d{i}"} for i in range(FLUSH_THRESHOLD)], workers=0)
    del db._writer.maybe_flush
    assert [d.source for d in db.documents()] == ["before"]
    assert db.check() == []


def test_upkeep_after_a_write_leaves_only_a_busy_lock_or_a_full_disk_for_later(tmp_path: Path) -> None:
    """The flush after a committed add is left for later when the lock is taken or the disk is
    full (the add was stored: its caller must not hear otherwise). Any other storage error (an
    I/O error, a damaged text) says something is wrong with the file, and is raised."""
    from ragdb.errors import DiskFull, StorageError
    from ragdb.index.inverted import FLUSH_THRESHOLD

    db = ragdb.open(str(tmp_path / "u.db"))
    db.add_many([{"text": f"w{i} x", "source": f"d{i}"} for i in range(FLUSH_THRESHOLD - 1)], workers=0)
    failure: list[Exception] = []

    def failing(*args: object, **kwargs: object) -> object:
        raise failure[0]

    db._writer.maybe_flush = failing  # type: ignore[method-assign]
    failure.append(DiskFull("the disk is full; nothing was written"))
    db.add("first x", source="first")
    failure[0] = StorageError("disk I/O error")
    with pytest.raises(StorageError, match="disk I/O error"):
        db.add("second x", source="second")
    del db._writer.maybe_flush
    assert {d.source for d in db.documents(source="first")} == {"first"}
    db.add("third x", source="third")
    assert db.stats().pending_chunks == 0 and db.check() == []
