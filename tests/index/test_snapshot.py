"""The chunk-state snapshot (ragdb/index/snapshot.py, migration 0012): a handle opening reads the
per-chunk arrays of the last flush plus the rows and the change log after it, instead of every
chunk row; it holds exactly what the scan gives. A snapshot of another flush, or one that cannot
be read, is not used (the rows are scanned: slower, never wrong); ``check()`` reports a damaged
or disagreeing one and ``reindex`` writes it again. The property tests of
tests/engine/test_reopen.py reopen through it after any history (and run check(), which
compares it with the scan)."""

from __future__ import annotations

import sqlite3
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import ragdb
import ragdb.engine.write
from ragdb.index import snapshot
from ragdb.storage.documents import DocumentSQL

QUERIES = ["apple note", "检索 生成", "evidence -apple"]


def hits(db):
    return [[(h.source, h.start, h.end, h.text, h.score) for h in db.search(q, k=50)] for q in QUERIES]


def build(path, n=300):
    """A database flushed every 64 chunks, with deletes and replaces of flushed chunks after
    its last flush (so the change log matters) and an unflushed tail."""
    with mock.patch.object(ragdb.engine.write, "FLUSH_THRESHOLD", 64), ragdb.open(path, chunker="none") as db:
        db.add_many([{"text": f"apple note {i} 检索 {i % 5} evidence {i % 3}", "source": f"s{i}"} for i in range(n)])
        db.delete(source="s7")
        db.delete(source="s299")
        db.add("apple note replaced 生成", source="s11")
        for i in range(20):
            db.add(f"tail apple {i} 生成", source=f"t{i}")
        db.delete(source="t3")
        return hits(db)


def scanned_instead(monkeypatch, store_class=DocumentSQL):
    """Record every full scan of the chunk rows (opening without a usable snapshot)."""
    calls = []
    real = store_class.chunk_table_blocks

    def spy(self, *args, **kwargs):
        calls.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(store_class, "chunk_table_blocks", spy)
    return calls


def snapshot_row(path):
    with sqlite3.connect(path) as conn:
        return conn.execute("SELECT flush_count, flushed_upto, body FROM chunk_state").fetchone()


# -- the codec ---------------------------------------------------------------------------------

@settings(max_examples=60, deadline=None)
@given(st.integers(0, 300).flatmap(lambda n: st.tuples(
    hnp.arrays(np.int64, n, elements=st.integers(0, 2**32 - 1)),
    hnp.arrays(np.int8, n, elements=st.integers(0, 2)),
    hnp.arrays(np.int64, n, elements=st.integers(0, 2**62)),
    hnp.arrays(bool, n))))
def test_the_body_gives_back_the_arrays_with_absent_ids_zeroed(arrays):
    lengths, state, docs, whole = arrays
    got = snapshot.decode(snapshot.encode(lengths.astype(np.float64), state, docs, whole, len(state)))
    present = state != 0
    assert np.array_equal(got.state, state) and got.state.dtype == np.int8
    assert np.array_equal(got.lengths, np.where(present, lengths, 0).astype(np.float64))
    assert np.array_equal(got.chunk_doc, np.where(present, docs, 0))
    assert np.array_equal(got.whole, whole & present) and got.whole.dtype == bool


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_a_damaged_body_is_refused_with_a_value_error(data):
    state = np.array([1, 0, 2, 1, 1] * 20, np.int8)
    body = bytearray(snapshot.encode(np.arange(100.0), state, np.arange(100) // 3, state == 1, 100))
    how = data.draw(st.sampled_from(["cut", "flip", "append", "empty"]))
    if how == "cut":
        body = body[:data.draw(st.integers(0, len(body) - 1))]
    elif how == "flip":
        at = data.draw(st.integers(0, len(body) - 1))
        body[at] ^= data.draw(st.integers(1, 255))
    elif how == "append":
        body += bytes(data.draw(st.binary(min_size=1, max_size=20)))
    else:
        body = bytearray()
    try:
        got = snapshot.decode(bytes(body))
    except ValueError:
        return
    assert len(got.lengths) == 100  # a change zstd's frame still accepts: whole arrays, known states


def test_a_header_claiming_a_huge_frame_is_refused_before_allocating():
    header = snapshot._HEADER.pack(snapshot.MAGIC, snapshot.FORMAT, 2**39)
    with pytest.raises(ValueError):
        snapshot.decode(header + b"\x28\xb5\x2f\xfd" + b"\x00" * 16)


# -- opening through it ----------------------------------------------------------------------------

def test_a_handle_opens_through_the_snapshot_and_equals_a_scan(tmp_path, monkeypatch):
    path = tmp_path / "kb.db"
    want = build(path)
    flush_count, upto, _ = snapshot_row(path)
    assert upto > 0
    calls = scanned_instead(monkeypatch)
    with ragdb.open(path) as db:
        assert hits(db) == want
        assert not calls  # the snapshot was current: no row scanned
        assert db.check() == []  # (which compares the view with a scan: the only scan)
    with sqlite3.connect(path) as conn:  # a snapshot of another flush is not used
        conn.execute("UPDATE chunk_state SET flush_count = flush_count - 1")
    calls.clear()
    with ragdb.open(path) as db:
        assert hits(db) == want and calls
        assert db.check() == []


@pytest.mark.parametrize("damage", ["garbage", "truncated", "disagrees"])
def test_check_reports_a_bad_snapshot_search_stays_right_and_reindex_writes_it_again(tmp_path, damage):
    path = tmp_path / "kb.db"
    want = build(path)
    _fc, upto, body = snapshot_row(path)
    if damage == "garbage":
        body = b"not a snapshot at all"
    elif damage == "truncated":
        body = body[:-5]
    else:  # a valid body saying every chunk is absent
        n = upto + 1
        body = snapshot.encode(np.zeros(n), np.zeros(n, np.int8), np.zeros(n, np.int64), np.zeros(n, bool), n)
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE chunk_state SET body = ?", [body])
    with ragdb.open(path) as db:
        problems = db.check()
        assert len(problems) == 1 and problems[0].startswith("chunk_state: ") and "ragdb reindex" in problems[0]
        if damage != "disagrees":  # unreadable: not used, the rows are scanned
            assert hits(db) == want
        db.reindex()
        assert db.check() == []
        assert hits(db) == want
    assert snapshot_row(path)[1] >= upto
    with ragdb.open(path) as db:
        assert hits(db) == want and db.check() == []


def test_a_file_from_schema_11_migrates_and_gets_its_snapshot_at_the_next_flush(tmp_path, monkeypatch):
    from ragdb.storage import build_migrations, migration_files

    names = [p.stem for p in migration_files()]
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    build_migrations(stop_after="0011_packed_forward").apply(__import__("sqlite_utils").Database(conn))
    conn.close()
    want = build(path)  # opening migrates it; every flush since wrote the snapshot
    applied = {r[0] for r in sqlite3.connect(path).execute("SELECT name FROM _sqlite_migrations")}
    assert applied == set(names) and snapshot_row(path) is not None
    calls = scanned_instead(monkeypatch)
    with ragdb.open(path) as db:
        assert hits(db) == want and not calls


def test_a_copy_carries_the_snapshot(tmp_path, monkeypatch):
    from ragdb.files.transfer import copy_database

    source, target = tmp_path / "a.db", tmp_path / "b.db"
    want = build(source)
    copy_database(str(source), str(target))
    assert snapshot_row(target) == snapshot_row(source)
    calls = scanned_instead(monkeypatch)
    with ragdb.open(target) as db:
        assert hits(db) == want and not calls
        assert db.check() == []


def test_on_postgres_a_handle_opens_through_the_snapshot(pg_url, monkeypatch):
    from ragdb.storage.postgres import PgStore

    with mock.patch.object(ragdb.engine.write, "FLUSH_THRESHOLD", 16), ragdb.open(pg_url, chunker="none") as db:
        db.add_many([{"text": f"apple note {i} 检索 {i % 5}", "source": f"s{i}"} for i in range(100)])
        db.delete(source="s5")
        db.add("apple tail 生成", source="t")
        want = hits(db)
    calls = scanned_instead(monkeypatch, PgStore)
    with ragdb.open(pg_url) as db:
        assert hits(db) == want and not calls
        assert db.check() == []
