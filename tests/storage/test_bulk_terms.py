"""A bulk load's batches after its first put their new terms in ``bulk_terms``
(migrations/0014_bulk_terms.sql), a table without an index on ``term``, until the flush
that ends the load moves them into ``vocabulary`` or the load's end moves them into
``new_terms``; a load that does not reach its end leaves them there until the next write.
Every read path finds them wherever they are: while the load runs (a second handle, a fresh
process), after it was interrupted, in a copy, in another collection, on PostgreSQL, and
in files migrated from schema 13."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import ragdb
from ragdb.storage.store import build_migrations

EN = ["retrieval augmented generation over documents", "packed postings and segments",
      "sqlite write ahead log frames", "vocabulary of terms and document frequencies"]
N = 30  # records of a load; batches of 2 (the loads below stay under the flush threshold)


def text(i: int) -> str:
    """Record ``i``'s text: words of every record, and words of its own (English and Chinese)."""
    return f"{EN[i % 4]} zqword{i} zqshared{i % 3} 第{i}段落 检{i}索"


def records(n: int = N, fail_at: int | None = None, probe=None) -> Iterator[dict]:
    for i in range(n):
        if probe is not None and i == n // 2:
            probe()
        if i == fail_at:
            raise RuntimeError("the source of the records failed")
        yield {"text": text(i), "source": f"s{i}"}


def counts(path: Path, prefix: str = "") -> tuple[int, int, int]:
    """(rows of vocabulary, of new_terms, of bulk_terms)."""
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return tuple(conn.execute(f"SELECT count(*) FROM {prefix}{t}").fetchone()[0]  # type: ignore[return-value]
                     for t in ("vocabulary", "new_terms", "bulk_terms"))


def queries(n: int) -> list[str]:
    return [*(f"zqword{i}" for i in range(n)), "zqshared1", "zqword1*", "zqword2 OR zqshared0", "第7段落",
            "检3索", '"write ahead"', "retrieval", "zqwordnone"]


def answers(db: ragdb.Database, n: int) -> list:
    return [[(h.source, round(h.score, 9)) for h in db.search(q, k=40)] for q in queries(n)]


def answers_in_a_new_process(path: Path, n: int, collection: str | None = None) -> list:
    code = ("import json, sys, ragdb\n"
            "from test_bulk_terms import answers\n"
            "db = ragdb.open(sys.argv[1])\n"
            "db = db.collection(sys.argv[3]) if len(sys.argv) > 3 else db\n"
            "print(json.dumps(answers(db, int(sys.argv[2]))))\n")
    args = [sys.executable, "-c", code, str(path), str(n), *([collection] if collection else [])]
    out = subprocess.run(args, capture_output=True, text=True, check=True, cwd=Path(__file__).parent)
    return [[tuple(h) for h in hits] for hits in json.loads(out.stdout)]


def fresh_answers(tmp_path: Path, n: int, name: str = "fresh.db", extra: bool = False) -> list:
    """Answers of a database built from the first ``n`` records in one batch (nothing in
    bulk_terms); ``extra``: and the document added before them in the test."""
    with ragdb.open(tmp_path / name, chunker="none") as db:
        if extra:
            db.add("zqwordearly 早", source="early")
        db.add_many(records(n))
        assert counts(tmp_path / name)[2] == 0
        return answers(db, N)


@pytest.mark.parametrize("cache", ["whole", "lookups"])
def test_the_terms_of_a_running_bulk_load_are_found_by_other_handles_and_processes(tmp_path, monkeypatch, cache):
    """Mid-load: a handle that searched before the load began, a new one, a fresh process
    find what the load wrote so far; a second handle's write in between (which moves the
    load's terms into new_terms) and the rest of the load give every term one id.
    ``lookups``: the writer looks terms up per batch (a vocabulary over its term cache) and
    must find the earlier batches' terms in bulk_terms (else a term gets a second id)."""
    if cache == "lookups":
        from ragdb.engine import write

        monkeypatch.setattr(write, "WRITER_TERM_CACHE", 0)
    path = tmp_path / "kb.db"
    seen: dict[str, object] = {}
    with ragdb.open(path, chunker="none") as early:
        early.add("zqwordearly 早", source="early")
        assert answers(early, N)[0] == []

        def probe() -> None:  # mid-load: some batches written, their terms in bulk_terms
            seen["n"] = n = early.stats().documents - 1
            seen["counts"] = counts(path)
            seen["early"] = answers(early, N)
            with ragdb.open(path) as other:
                seen["answers"] = answers(other, N)
                seen["check"] = other.check()
            seen["process"] = answers_in_a_new_process(path, N)
            seen["expected"] = fresh_answers(tmp_path, n, f"fresh-{n}.db", extra=True)
            early.add("zqwordmiddle 中间 zqword1", source="middle")  # a write between two batches
            seen["settled"] = counts(path)

        with ragdb.open(path, chunker="none") as db:
            db.add_many(records(probe=probe), batch_size=2, workers=0)
            n = seen["n"]
            assert isinstance(n, int) and 4 <= n < N
            assert seen["counts"][2] > 0 and seen["settled"][2] == 0  # type: ignore[index]
            expected = seen["expected"]
            assert any(hits for hits in expected[:n])  # type: ignore[index]
            assert seen["early"] == expected and seen["answers"] == expected and seen["process"] == expected
            assert seen["check"] == []
            # the end of the load (no flush: under the threshold) moved them into new_terms
            _vocab, new, bulk = counts(path)
            assert bulk == 0 and new > 0
            db.delete(source="middle")
            everything = fresh_answers(tmp_path, N, "all.db", extra=True)
            assert answers(db, N) == everything and answers(early, N) == everything and db.check() == []
            with ragdb.open(tmp_path / "all.db") as fresh:
                assert db.stats().vocabulary == fresh.stats().vocabulary
    with ragdb.open(path) as db:
        assert answers(db, N) == everything
    assert answers_in_a_new_process(path, N) == everything


def test_an_interrupted_bulk_load_leaves_its_terms_findable_until_the_next_write_settles_them(tmp_path):
    path = tmp_path / "kb.db"
    with ragdb.open(path, chunker="none") as db:
        with pytest.raises(RuntimeError, match="source of the records failed"):
            db.add_many(records(fail_at=20), batch_size=2, workers=0)
        n = db.stats().documents
        assert n == 20  # (every batch before the failure is written)
        _vocab, _new, bulk = counts(path)
        assert bulk > 0
        expected = fresh_answers(tmp_path, n)
        assert answers(db, N) == expected and db.check() == []
    with ragdb.open(path) as db:  # reopened: the view learns that bulk_terms holds terms
        assert answers(db, N) == expected and db.check() == []
        copy = tmp_path / "copy.db"
        ragdb.copy_database(path, copy)
        assert counts(copy) == counts(path)
    assert answers_in_a_new_process(path, N) == expected
    with ragdb.open(copy) as db:
        assert answers(db, N) == expected and db.check() == []
    with ragdb.open(path) as db, ragdb.open(path) as reader:
        assert answers(reader, N) == expected
        db.add("zqwordlater 后来", source="later")  # the next write moves them into new_terms
        assert counts(path)[2] == 0
        assert [h.source for h in reader.search("zqwordlater")] == ["later"]
        db.delete(source="later")
        assert answers(db, N) == expected and answers(reader, N) == expected and db.check() == []
        db.optimize()  # the flush moves everything into vocabulary
        assert counts(path)[1:] == (0, 0)
        assert answers(db, N) == expected and answers(reader, N) == expected and db.check() == []


def test_a_load_that_ends_with_a_flush_leaves_every_term_in_the_vocabulary(tmp_path, monkeypatch):
    from ragdb import database

    monkeypatch.setattr(database, "BULK_FLUSH_CHUNKS", 7)  # flushes in mid-load too
    path = tmp_path / "kb.db"
    with ragdb.open(path, chunker="none") as db:
        db.add_many(records(), batch_size=2, workers=0)
        assert counts(path)[1:] == (0, 0)
        assert answers(db, N) == fresh_answers(tmp_path, N) and db.check() == []


def test_a_collection_keeps_bulk_terms_of_its_own(tmp_path):
    path = tmp_path / "kb.db"
    with ragdb.open(path, chunker="none") as db:
        db.add("zqword1 in the default collection", source="d")
        other = db.collection("other", chunker="none")
        with pytest.raises(RuntimeError):
            other.add_many(records(fail_at=20), batch_size=2, workers=0)
        n = other.stats().documents
    cid = dict(sqlite3.connect(path).execute("SELECT name, id FROM collections").fetchall())["other"]
    assert counts(path, f"c{cid}_")[2] > 0 and counts(path)[2] == 0
    expected = fresh_answers(tmp_path, n)
    with ragdb.open(path) as db:
        other = db.collection("other")
        assert answers(other, N) == expected and other.check() == [] and db.check() == []
        assert [h.source for h in db.search("zqword1")] == ["d"]
    assert answers_in_a_new_process(path, N, "other") == expected
    with ragdb.open(path) as db:
        other = db.collection("other")
        other.add("zqwordlater", source="later")
        assert counts(path, f"c{cid}_")[2] == 0
        other.delete(source="later")
        assert answers(other, N) == expected and other.check() == []


def test_check_reports_bulk_terms_out_of_place(tmp_path):
    path = tmp_path / "kb.db"
    with ragdb.open(path, chunker="none") as db, pytest.raises(RuntimeError):
        db.add_many(records(fail_at=20), batch_size=2, workers=0)
    with contextlib.closing(sqlite3.connect(path)) as conn:
        (term,) = conn.execute("SELECT term FROM bulk_terms ORDER BY id LIMIT 1").fetchone()
        top = conn.execute("SELECT max(id) FROM bulk_terms").fetchone()[0]
        conn.execute("INSERT INTO bulk_terms (id, term) VALUES (?, ?)", [top + 1, term])  # the term twice
        conn.execute("INSERT INTO new_terms (id, term) VALUES (?, ?)", [top + 2, term])  # and in new_terms
        conn.commit()
    with ragdb.open(path) as db:
        problems = db.check()
        assert any("of bulk_terms stored twice" in p for p in problems)
        assert any("of bulk_terms also in vocabulary or new_terms" in p for p in problems)
        db.reindex()
        assert db.check() == [] and counts(path)[2] == 0
        assert [h.source for h in db.search("zqword3")] == ["s3"]
        db.optimize()
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("INSERT INTO bulk_terms (id, term) VALUES (100000, 'orphanword')")
        conn.commit()
    with ragdb.open(path) as db:
        problems = db.check()
        assert len(problems) == 1 and "bulk_terms holds 1 term but no chunk was added" in problems[0]


@pytest.mark.parametrize("unflushed", [False, True])
def test_a_schema_13_file_migrates_and_answers_the_same(tmp_path, unflushed):
    path = tmp_path / "kb.db"
    with ragdb.open(path, chunker="none") as db:
        db.add_many(records(10))
        db.optimize()
        if unflushed:
            db.add("zqwordlater 后来", source="later")
        before = answers(db, N)
    with contextlib.closing(sqlite3.connect(path)) as conn:  # back to schema 13
        conn.execute("DROP TABLE bulk_terms")
        conn.execute("DELETE FROM _sqlite_migrations WHERE name = '0014_bulk_terms'")
        conn.commit()
    with ragdb.open(path) as db:
        assert counts(path)[2] == 0
        assert answers(db, N) == before and db.check() == []
        with pytest.raises(RuntimeError):
            db.add_many(records(fail_at=20), batch_size=2, workers=0)  # (s0-s9 again: unchanged)
        assert counts(path)[2] > 0 and db.check() == []
        db.optimize()
        assert counts(path)[1:] == (0, 0) and db.check() == []


def test_a_blank_schema_13_database_migrates(tmp_path):
    path = tmp_path / "old.db"
    with contextlib.closing(sqlite3.connect(path)) as conn:
        build_migrations(stop_after="0013_new_terms").apply(__import__("sqlite_utils").Database(conn))
    seen = []
    with ragdb.open(path, chunker="none") as db:
        db.add_many(records(probe=lambda: seen.append(counts(path))), batch_size=2, workers=0)
        assert seen[0][2] > 0 and counts(path)[2] == 0
        assert answers(db, N) == fresh_answers(tmp_path, N) and db.check() == []


def pg_bulk_terms(url: str) -> int:
    import psycopg

    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM bulk_terms").fetchone()
        assert row is not None
        return int(row[0])


def test_postgresql_answers_as_sqlite_during_and_after_an_interrupted_bulk_load(tmp_path, pg_url):
    path = tmp_path / "kb.db"
    with ragdb.open(path, chunker="none") as lite, ragdb.open(pg_url, chunker="none") as pg:
        for db in (lite, pg):
            with pytest.raises(RuntimeError):
                db.add_many(records(fail_at=20), batch_size=2, workers=0)
        assert counts(path)[2] > 0 and pg_bulk_terms(pg_url) == counts(path)[2]
        assert answers(pg, N) == answers(lite, N) and pg.check() == []
        assert pg.stats().vocabulary == lite.stats().vocabulary
        with ragdb.open(pg_url) as reader:
            assert answers(reader, N) == answers(lite, N)
        for db in (lite, pg):
            db.add("zqwordlater 后来", source="later")
        assert answers(pg, N) == answers(lite, N) and pg.check() == []
        for db in (lite, pg):
            db.add_many(records(N + 6), batch_size=2, workers=0)  # a load that reaches its end
        assert counts(path)[2] == 0 and pg_bulk_terms(pg_url) == 0
        assert answers(pg, N + 6) == answers(lite, N + 6) and pg.check() == []
        pg.optimize()
        lite.optimize()
        assert answers(pg, N + 6) == answers(lite, N + 6) and pg.check() == []


@pytest.mark.parametrize("cache", ["whole", "lookups"])
def test_two_bulk_loads_at_once_give_each_term_one_id(tmp_path, monkeypatch, cache):
    """Two handles (threads) load documents of the same words in lockstep, batch after batch:
    each finds the terms the other's batches left in bulk_terms (``lookups``: by looking them
    up, a vocabulary over the writer's term cache), so no term gets a second id."""
    import threading

    if cache == "lookups":
        from ragdb.engine import write

        monkeypatch.setattr(write, "WRITER_TERM_CACHE", 0)
    path = tmp_path / "kb.db"
    ragdb.open(path, chunker="none").close()
    step = threading.Barrier(2, timeout=60)
    errors: list[BaseException] = []

    def load(prefix: str) -> None:
        def lockstep() -> Iterator[dict]:
            for i in range(N):
                step.wait()
                yield {"text": text(i), "source": f"{prefix}{i}"}

        try:
            with ragdb.open(path) as db:
                db.add_many(lockstep(), batch_size=2, workers=0)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
            step.abort()

    threads = [threading.Thread(target=load, args=(p,)) for p in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    with ragdb.open(path) as db:
        assert db.check() == [] and counts(path)[2] == 0
        fresh = tmp_path / "fresh.db"
        with ragdb.open(fresh, chunker="none") as f:
            f.add_many([{"text": text(i), "source": f"{p}{i}"} for p in ("a", "b") for i in range(N)])
            assert db.stats().vocabulary == f.stats().vocabulary
            assert answers(db, N) == answers(f, N)
