"""Schema 11 (migrations/0011_packed_forward.sql): forward indexes written before it (raw uint32
term ids and uint16 tfs in the analyzer's order) read as they are next to packed ones, so a
database written by an older ragdb searches the same after the migration (hits, order, scores,
both lexical scorers), in this process and a fresh one, and keeps searching like a database
built by this version alike; deletes of flushed chunks, reopening after them, check(), and a
copy through PostgreSQL and back see either form."""

from __future__ import annotations

import json
import random
import sqlite3
import subprocess
import sys
from pathlib import Path

import ragdb
from ragdb.index.forward import unpack_forward_many

WORDS = ("retrieval index vector search engine database chunk term posting forward packed norm score "
         "query answer document source version label metadata filter python sqlite postgres numpy "
         "cosine frequency analyzer token stem").split()
ZH = "数据库检索系统使用倒排索引北京天气很好我们去公园散步"
QUERIES = ["retrieval index", "packed forward norm", "python sqlite numpy", "数据库 检索", "北京天气",
           "document source version", "frequency"]


def text(rng: random.Random, i: int) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(5, 60))]
    if i % 5 == 0:
        words.append(ZH[rng.randint(0, 10):rng.randint(11, len(ZH))])
    return f"doc{i} " + " ".join(words) + f" unique{i}"


def history(db: ragdb.Database, rng: random.Random, start: int, n: int) -> None:
    """Adds (some multi-chunk), replacements, an optimize (a flush), deletes of flushed and of
    unflushed documents, more adds after them (the tail)."""
    db.add_many(({"text": text(rng, i), "source": f"s{i}"} for i in range(start, start + n)),
                chunker="window:size=12,overlap=3")
    db.optimize(vacuum=False)
    for i in range(start, start + n, 7):
        db.delete(source=f"s{i}")  # flushed: the chunk's terms ride on chunk_log
    for i in range(start + 1, start + n, 9):
        db.add(text(rng, i + 1000), source=f"s{i}", chunker="none")  # replaced
    db.add_many(({"text": text(rng, i), "source": f"t{i}"} for i in range(start, start + 10)), chunker="none")
    db.delete(source=f"t{start}")  # unflushed


def results(db: ragdb.Database) -> dict:
    return {f"{q}|{scorer}|{versions}": [(h.chunk_id, h.source, h.score) for h in
                                         db.search(q, k=30, scorer=scorer, versions=versions)]
            for q in QUERIES for scorer in ("bm25", "tfidf") for versions in ("latest", "all")}


def _tables(conn: sqlite3.Connection) -> list[str]:
    return [p for (p,) in conn.execute(
        "SELECT substr(name, 1, length(name) - length('chunks')) FROM sqlite_master "
        "WHERE type = 'table' AND name LIKE '%chunks'")]


def to_raw(path: Path) -> None:
    """Make ``path`` what a ragdb before schema 11 wrote: every forward index (chunks and
    chunk_log) raw, in the analyzer's order; 0011 not applied."""
    conn = sqlite3.connect(path)
    try:
        for prefix in _tables(conn):
            rows = conn.execute(f"SELECT id, terms, tfs FROM {prefix}chunks").fetchall()
            got = unpack_forward_many([r[1] for r in rows], [r[2] for r in rows], analyzer_order=True).rows()
            conn.executemany(f"UPDATE {prefix}chunks SET terms = ?, tfs = ? WHERE id = ?",
                             [(t.astype("<u4").tobytes(), f.astype("<u2").tobytes(), r[0]) for r, (t, f) in zip(rows, got)])
            log = conn.execute(f"SELECT seq, terms FROM {prefix}chunk_log WHERE terms IS NOT NULL").fetchall()
            got = unpack_forward_many([r[1] for r in log], analyzer_order=True).rows()
            conn.executemany(f"UPDATE {prefix}chunk_log SET terms = ? WHERE seq = ?",
                             [(t.astype("<u4").tobytes(), r[0]) for r, (t, _f) in zip(log, got)])
        conn.execute("DELETE FROM _sqlite_migrations WHERE name = '0011_packed_forward'")
        conn.commit()
    finally:
        conn.close()


def forms(path: Path) -> dict[str, int]:
    """How many chunk rows of each form (raw: terms a multiple of 4 bytes long)."""
    conn = sqlite3.connect(path)
    try:
        return dict(conn.execute("SELECT CASE length(terms) % 4 WHEN 0 THEN 'raw' ELSE 'packed' END, count(*) "
                                 "FROM chunks GROUP BY 1").fetchall())
    finally:
        conn.close()


def applied(path: Path) -> list[str]:
    conn = sqlite3.connect(path)
    try:
        return [r[0] for r in conn.execute("SELECT name FROM _sqlite_migrations ORDER BY name")]
    finally:
        conn.close()


SEARCH_IN_A_NEW_PROCESS = """
import json, sys
import ragdb
sys.path.insert(0, sys.argv[2])
from test_forward_migration import results
with ragdb.open(sys.argv[1], readonly=True) as db:
    print(json.dumps(results(db)))
"""


def in_a_new_process(path: Path) -> dict:
    done = subprocess.run([sys.executable, "-c", SEARCH_IN_A_NEW_PROCESS, str(path), str(Path(__file__).parent)],
                          capture_output=True, text=True, timeout=120, check=True)
    return {k: [tuple(h) for h in v] for k, v in json.loads(done.stdout).items()}


def test_a_database_written_before_schema_11_migrates_and_searches_the_same(tmp_path):
    old, ref = tmp_path / "old.db", tmp_path / "ref.db"
    for path in (old, ref):
        with ragdb.open(path, keep_versions=True) as db:
            history(db, random.Random(5), 0, 60)
            want = results(db)
            assert db.check() == []
    to_raw(old)
    assert forms(old) == {"raw": forms(ref)["packed"]} and "0011_packed_forward" not in applied(old)
    with ragdb.open(old, keep_versions=True) as db:  # migrates (no rewrite) and reads the raw rows
        assert results(db) == want
        assert db.check() == []
    assert "0011_packed_forward" in applied(old) and set(forms(old)) == {"raw"}
    assert in_a_new_process(old) == want
    # writing on: new rows packed next to the raw ones; deletes of raw flushed chunks; a flush
    for path in (old, ref):
        with ragdb.open(path, keep_versions=True) as db:
            history(db, random.Random(6), 100, 40)
            db.delete(source="s1")  # a raw row (in old), flushed, deleted: its raw terms ride on chunk_log
    assert set(forms(old)) == {"raw", "packed"}
    with ragdb.open(old, keep_versions=True) as a, ragdb.open(ref, keep_versions=True) as b:
        assert results(a) == results(b)
        assert a.check() == [] and b.check() == []
        for db in (a, b):
            db.optimize()
        assert results(a) == results(b) and a.check() == []


def test_deletes_of_flushed_chunks_and_reopening_after_them(tmp_path):
    path = tmp_path / "kb.db"
    rng = random.Random(7)
    with ragdb.open(path) as writer, ragdb.open(path) as reader:
        writer.add_many(({"text": text(rng, i), "source": f"s{i}"} for i in range(80)), chunker="none")
        writer.optimize(vacuum=False)
        before = results(reader)  # the reader's view: flushed, nothing deleted
        for i in range(0, 80, 3):
            writer.delete(source=f"s{i}")  # flushed and latest: packed terms on chunk_log
        want = results(writer)
        assert want != before
        assert results(reader) == want  # caught up through the change log (its terms decoded)
        assert writer.check() == []
    conn = sqlite3.connect(path)
    logged = conn.execute("SELECT terms FROM chunk_log WHERE terms IS NOT NULL").fetchall()
    conn.close()
    assert len(logged) == 27 and all(len(t) % 4 for (t,) in logged)
    with ragdb.open(path) as db:  # a fresh view: the deleted chunks' terms read from chunk_log
        assert results(db) == want
        assert db.check() == []
        db.add("zyzzyva retrieval index after the deletes", source="late")
        db.optimize(vacuum=False)  # the flush folds the deleted terms into df
        assert db.check() == []
        assert [h.source for h in db.search("zyzzyva")] == ["late"]
        want = results(db)
    assert in_a_new_process(path) == want


def test_check_reports_a_damaged_packed_row_once(tmp_path):
    path = tmp_path / "kb.db"
    with ragdb.open(path) as db:
        db.add_many(({"text": text(random.Random(1), i), "source": f"s{i}"} for i in range(20)), chunker="none")
        db.optimize(vacuum=False)
    conn = sqlite3.connect(path)
    cid, terms = conn.execute("SELECT id, terms FROM chunks WHERE length(terms) > 8 ORDER BY id LIMIT 1").fetchone()
    n_at = 2 + terms[1] if terms[0] & 3 == 1 else None
    assert n_at is not None  # (a chunk of a few terms: a one-byte permutation)
    broken = terms[:n_at + 1] + b"\x00" + terms[n_at + 2:]  # a zero gap: a term id repeated
    conn.execute("UPDATE chunks SET terms = ? WHERE id = ?", [broken, cid])
    conn.commit()
    conn.close()
    with ragdb.open(path) as db:
        problems = db.check()
    assert problems == [f"chunks.terms is not a packed forward index: term ids not strictly increasing in 1 chunk "
                        f"(e.g. chunk {cid}: {len(broken)} bytes, flags {broken[0]}, {broken[1]} terms)"], problems


def test_either_form_round_trips_through_postgresql(pg_url, tmp_path):
    """A copy moves the blobs as they are: raw rows stay raw, packed stay packed, and the
    PostgreSQL database searches the same, and so does the copy back."""
    src, back = tmp_path / "a.db", tmp_path / "b.db"
    with ragdb.open(src) as db:
        history(db, random.Random(8), 0, 40)
    to_raw(src)
    with ragdb.open(src) as db:
        history(db, random.Random(9), 100, 30)  # packed rows after the raw ones
        want = results(db)
    mixed = forms(src)
    assert set(mixed) == {"raw", "packed"}
    ragdb.copy_database(src, pg_url)
    with ragdb.open(pg_url) as db:
        assert results(db) == want
        assert db.check() == []
        db.delete(source="s1")  # a raw flushed row deleted on PostgreSQL
        db.delete(source="s101")  # a packed one
        want = results(db)
    ragdb.copy_database(pg_url, back)
    with ragdb.open(back) as db:
        assert results(db) == want
        assert db.check() == []
    conn = sqlite3.connect(back)
    forms_back = dict(conn.execute("SELECT CASE length(terms) % 4 WHEN 0 THEN 'raw' ELSE 'packed' END, count(*) "
                                   "FROM chunks GROUP BY 1").fetchall())
    conn.close()
    assert set(forms_back) == {"raw", "packed"}
