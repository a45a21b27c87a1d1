"""Terms added since the last flush live in ``new_terms`` (migrations/0013_new_terms.sql) and
move into ``vocabulary`` at the flush; the vocabulary is both tables. Every read path sees
a term wherever it is: searches, prefix queries, a second handle, a fresh process, copies,
check(), and files written before the table existed."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

import ragdb
from ragdb.storage.store import build_migrations

EN = ["retrieval augmented generation over documents", "packed postings and segments",
      "sqlite write ahead log frames", "vocabulary of terms and document frequencies"]


def counts(path: Path) -> tuple[int, int]:
    """(rows of vocabulary, rows of new_terms)."""
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return (conn.execute("SELECT count(*) FROM vocabulary").fetchone()[0],
                conn.execute("SELECT count(*) FROM new_terms").fetchone()[0])


def fingerprint(hits) -> list:
    return [(h.chunk_id, h.source, round(h.score, 12)) for h in hits]


QUERIES = ["retrieval", "zyxwordone", "zyxword*", "frames 检索", "zyxwordtwo OR postings", '"write ahead"']


def answers(db: ragdb.Database) -> list:
    return [fingerprint(db.search(q, k=20)) for q in QUERIES]


def in_a_new_process(path: Path) -> list:
    code = ("import json, sys, ragdb\n"
            "db = ragdb.open(sys.argv[1])\n"
            f"qs = {QUERIES!r}\n"
            "print(json.dumps([[[h.chunk_id, h.source, round(h.score, 12)] for h in db.search(q, k=20)] "
            "for q in qs]))\n")
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True)
    return [[tuple(h) for h in hits] for hits in json.loads(out.stdout)]


def test_new_terms_are_found_before_and_after_the_flush_that_moves_them(tmp_path):
    path = tmp_path / "kb.db"
    with ragdb.open(path, chunker="none") as db:
        db.add_many([{"text": t, "source": f"s{i}"} for i, t in enumerate(EN)])
        db.optimize()  # everything flushed: the vocabulary holds every term
        vocab, new = counts(path)
        assert vocab > 0 and new == 0
        db.add("zyxwordone and zyxwordtwo 检索增强", source="new")  # new terms, not flushed
        vocab2, new2 = counts(path)
        assert vocab2 == vocab and new2 > 0
        assert db.stats().vocabulary == vocab + new2
        hits = db.search("zyxwordone")
        assert [h.source for h in hits] == ["new"]
        assert [h.source for h in db.search("zyxword*")] == ["new"]
        assert [h.source for h in db.search("检索")] == ["new"]
        before = answers(db)
        assert db.check() == []
        with ragdb.open(path) as other:  # a second handle, opened after the write
            assert answers(other) == before
        assert in_a_new_process(path) == before
        db.optimize()  # the flush moves them
        assert counts(path) == (vocab + new2, 0)
        assert answers(db) == before
        assert db.check() == []
    assert in_a_new_process(path) == before


def test_a_handle_opened_before_the_write_sees_the_new_terms(tmp_path):
    """A handle that last synced when nothing was unflushed (it skips new_terms then) looks
    there again once another handle has added chunks."""
    path = tmp_path / "kb.db"
    with ragdb.open(path, chunker="none") as a, ragdb.open(path) as b:
        a.add_many([{"text": t, "source": f"s{i}"} for i, t in enumerate(EN)])
        a.optimize()
        assert b.search("zyxwordone") == [] and b.search("zyxword*") == []
        a.add("zyxwordone here", source="new")
        assert [h.source for h in b.search("zyxwordone")] == ["new"]
        assert [h.source for h in b.search("zyxword*")] == ["new"]
        a.delete(source="new")  # the newest chunk deleted: its terms stay until a flush
        assert b.search("zyxwordone") == [] and a.search("zyxwordone") == []
        assert a.check() == [] and b.check() == []
    with ragdb.open(path) as c:  # reopened after deleting the newest document
        assert c.search("zyxwordone") == []
        assert [h.source for h in c.search("retrieval")] == ["s0"]
        c.add("zyxwordone again", source="again")  # the term is known: no second row for it
        assert [h.source for h in c.search("zyxwordone")] == ["again"]
        assert c.check() == []
        c.optimize()
        assert counts(path)[1] == 0 and c.check() == []
        assert [h.source for h in c.search("zyxwordone")] == ["again"]


def test_a_bulk_load_leaves_every_term_in_the_vocabulary(tmp_path, monkeypatch):
    from ragdb import database

    monkeypatch.setattr(database, "BULK_FLUSH_CHUNKS", 7)  # flushes in mid-load, then the last one
    path = tmp_path / "kb.db"
    records = [{"text": f"{EN[i % 4]} word{i} 第{i}段", "source": f"s{i}"} for i in range(40)]
    with ragdb.open(path, chunker="none") as db:
        db.add_many(records, batch_size=5, workers=0)
        assert counts(path)[1] == 0
        assert [h.source for h in db.search("word17")] == ["s17"]
        assert db.check() == []


def test_check_reports_a_term_in_both_tables_and_new_terms_nobody_looks_at(tmp_path):
    path = tmp_path / "kb.db"
    with ragdb.open(path, chunker="none") as db:
        db.add_many([{"text": t, "source": f"s{i}"} for i, t in enumerate(EN)])
        db.optimize()
        db.add("zyxwordone", source="new")
    with contextlib.closing(sqlite3.connect(path)) as conn:
        tid, term = conn.execute("SELECT id, term FROM new_terms").fetchone()
        conn.execute("INSERT INTO vocabulary (id, term, df) VALUES (?, ?, 0)", [tid + 1000, term])
        conn.commit()
    with ragdb.open(path) as db:
        assert any("1 term of new_terms also in vocabulary" in p for p in db.check())
        db.reindex()
        assert db.check() == [] and counts(path)[1] == 0
        assert [h.source for h in db.search("zyxwordone")] == ["new"]
        db.optimize()
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("INSERT INTO new_terms (id, term) VALUES (100000, 'orphanword')")
        conn.commit()
    with ragdb.open(path) as db:
        problems = db.check()
        assert len(problems) == 1 and "new_terms holds 1 term but no chunk was added" in problems[0]
        db.reindex()
        assert db.check() == []


def test_a_copy_keeps_unflushed_terms(tmp_path):
    src, dst = tmp_path / "a.db", tmp_path / "b.db"
    with ragdb.open(src, chunker="none") as db:
        db.add_many([{"text": t, "source": f"s{i}"} for i, t in enumerate(EN)])
        db.optimize()
        db.add("zyxwordone and zyxwordtwo 检索增强", source="new")
        before = answers(db)
    ragdb.copy_database(src, dst)
    assert counts(dst) == counts(src)
    with ragdb.open(dst) as db:
        assert answers(db) == before and db.check() == []
        db.optimize()
        assert answers(db) == before and db.check() == []


@pytest.mark.parametrize("unflushed", [False, True])
def test_a_schema_12_file_migrates_and_answers_the_same(tmp_path, unflushed):
    """Before schema 13 a write put its new terms straight into vocabulary (df 0 until the
    flush): such a file, with unflushed chunks or without, migrates to an empty new_terms and
    answers as before, before and after its next flush."""
    path = tmp_path / "kb.db"
    with ragdb.open(path, chunker="none") as db:
        db.add_many([{"text": t, "source": f"s{i}"} for i, t in enumerate(EN)])
        db.optimize()
        if unflushed:
            db.add("zyxwordone and zyxwordtwo 检索增强", source="new")
        before = answers(db)
    with contextlib.closing(sqlite3.connect(path)) as conn:  # back to schema 12, as its writer left it
        conn.execute("INSERT INTO vocabulary (id, term, df) SELECT id, term, 0 FROM new_terms")
        conn.execute("DROP TABLE new_terms")
        conn.execute("DELETE FROM _sqlite_migrations WHERE name = '0013_new_terms'")
        conn.commit()
    with ragdb.open(path) as db:
        assert counts(path)[1] == 0
        assert answers(db) == before and db.check() == []
        db.add("zyxwordthree", source="later")
        assert counts(path)[1] == 1
        assert [h.source for h in db.search("zyxwordthree")] == ["later"]
        db.delete(source="later")  # (it changed N and every score)
        db.optimize()
        assert answers(db) == before and db.check() == []


def test_a_blank_schema_12_database_migrates(tmp_path):
    path = tmp_path / "old.db"
    with contextlib.closing(sqlite3.connect(path)) as conn:
        build_migrations(stop_after="0012_chunk_state").apply(__import__("sqlite_utils").Database(conn))
    with ragdb.open(path) as db:
        db.add("zyxwordone 检索", source="a")
        assert counts(path)[1] > 0
        assert [h.source for h in db.search("zyxwordone")] == ["a"] and db.check() == []


def test_postgresql_keeps_new_terms_apart_too_and_answers_as_sqlite(tmp_path, pg_url):
    path = tmp_path / "kb.db"
    with ragdb.open(path, chunker="none") as lite, ragdb.open(pg_url, chunker="none") as pg:
        for db in (lite, pg):
            db.add_many([{"text": t, "source": f"s{i}"} for i, t in enumerate(EN)])
            db.optimize()
            db.add("zyxwordone and zyxwordtwo 检索增强", source="new")
        assert answers(pg) == answers(lite)
        assert pg.stats().vocabulary == lite.stats().vocabulary
        assert pg.check() == []
        pg.optimize()
        lite.optimize()
        assert answers(pg) == answers(lite) and pg.check() == []


def _by_source(hits) -> list:
    return [(h.source, round(h.score, 9)) for h in hits]


def _source_queries(db: ragdb.Database) -> list:
    return [_by_source(db.search(q, k=20)) for q in QUERIES + ["zyxwordtwo", "检索增强 frames"]]


def test_unflushed_new_terms_answer_as_a_fresh_build_of_the_same_documents(tmp_path):
    """Adds with new words, a replaced version and a deleted document, left unflushed: the
    file reopened, in this process and a fresh one, answers as a new database built from the
    documents that remain, and so does it after the flush that moves the terms."""
    docs = {f"s{i}": t for i, t in enumerate(EN)}
    path = tmp_path / "kb.db"
    with ragdb.open(path, chunker="none") as db:
        db.add_many([{"text": t, "source": s} for s, t in docs.items()])
        db.optimize()
        for source, text in (("new", "zyxwordone and zyxwordtwo 检索增强"), ("gone", "zyxwordgone frames"),
                             ("s1", "packed postings zyxwordtwo replaced")):
            db.add(text, source=source)
            docs[source] = text
        db.delete(source="gone")
        del docs["gone"]
        assert counts(path)[1] > 0
    fresh = tmp_path / "fresh.db"
    with ragdb.open(fresh, chunker="none") as db:
        for source, text in docs.items():  # (s1's replacement added where it was replaced: last)
            if source != "s1":
                db.add(text, source=source)
        db.add(docs["s1"], source="s1")
        expected = _source_queries(db)
    with ragdb.open(path) as db:
        assert _source_queries(db) == expected and db.check() == []
        code = ("import json, sys, ragdb\n"
                "from test_new_terms import _source_queries\n"
                "print(json.dumps(_source_queries(ragdb.open(sys.argv[1]))))\n")
        out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True,
                             cwd=Path(__file__).parent)
        assert [[tuple(h) for h in hits] for hits in json.loads(out.stdout)] == expected
        db.optimize()
        assert counts(path)[1] == 0
        assert _source_queries(db) == expected and db.check() == []


def _term_ids(path: Path) -> list[tuple[int, str]]:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return conn.execute("SELECT id, term FROM vocabulary UNION ALL SELECT id, term FROM new_terms "
                            "UNION ALL SELECT id, term FROM bulk_terms ORDER BY id").fetchall()


def test_handles_taking_turns_at_adding_new_words_give_each_term_its_own_id(tmp_path):
    """A writer remembers the next free term id after its own write (Index.next_term) and
    must read it again once anything else wrote: another handle's adds, a flush, a delete and
    the clean-up of unused terms, a write rolled back inside a transaction. Each new word gets
    one id of its own, and the file, reopened here and in a fresh process, answers as a fresh
    build of the same documents."""
    path = tmp_path / "kb.db"
    docs: dict[str, str] = {}
    a, b = ragdb.open(path, chunker="none"), ragdb.open(path, chunker="none")
    try:
        for i in range(6):
            for name, db in (("a", a), ("a", a), ("b", b)):
                source, text = f"{name}{i}-{len(docs)}", f"zyxnew{name}{i}w{len(docs)} shared words {i}"
                db.add(text, source=source)
                docs[source] = text
            if i == 2:
                a.optimize()  # a flush moves the new terms into the vocabulary
            if i == 3:
                with pytest.raises(RuntimeError), a.transaction():
                    a.add("zyxrolledback words", source="rolled")
                    raise RuntimeError("undo")
                gone = next(iter(docs))
                b.delete(source=gone)
                del docs[gone]
                b.optimize()  # forgets the deleted document's own words: their ids may be given again
            if i == 4:
                with a.transaction():  # two adds in one transaction: the second goes on from the first
                    for j in range(2):
                        source, text = f"t{j}", f"zyxtxn{j} words"
                        a.add(text, source=source)
                        docs[source] = text
    finally:
        a.close()
        b.close()
    ids = _term_ids(path)
    assert len({i for i, _ in ids}) == len(ids) and len({t for _, t in ids}) == len(ids)
    assert "zyxrolledback" not in {t for _, t in ids}
    fresh = tmp_path / "fresh.db"
    with ragdb.open(fresh, chunker="none") as db:
        db.add_many([{"text": t, "source": s} for s, t in docs.items()])
        queries = [t.split()[0] for t in docs.values()] + ["shared words"]
        expected = [_by_source(db.search(q, k=50)) for q in queries]
    with ragdb.open(path) as db:
        assert db.check() == []
        assert [_by_source(db.search(q, k=50)) for q in queries] == expected
    code = ("import json, sys, ragdb\n"
            "from test_new_terms import _by_source\n"
            "db = ragdb.open(sys.argv[1])\n"
            "print(json.dumps([_by_source(db.search(q, k=50)) for q in json.loads(sys.argv[2])]))\n")
    out = subprocess.run([sys.executable, "-c", code, str(path), json.dumps(queries)], capture_output=True,
                         text=True, check=True, cwd=Path(__file__).parent)
    assert [[tuple(h) for h in hits] for hits in json.loads(out.stdout)] == expected
