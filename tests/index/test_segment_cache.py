"""Decoded postings across writes (``Index.term_postings``): a write empties the cache of
postings joined with the tail, but the stored segments' part stays decoded until the next
flush, which alone writes, merges or drops segments. Searches between writes equal a fresh
build of the same documents, on this handle and on another one that follows the writes."""

from __future__ import annotations

from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ragdb
import ragdb.engine.write
import ragdb.index.inverted
from ragdb.storage.lexical import LexicalSQL

QUERIES = ["apple note", "检索 生成", "evidence apple -note", '"apple note"']
WORDS = ["apple", "note", "evidence", "检索", "生成", "model"]


def hits(db):
    return [[(h.source, h.start, h.end, h.text, round(h.score, 9)) for h in db.search(q, k=30)] for q in QUERIES]


def fresh(live):
    with ragdb.open(":memory:", chunker="none") as db:
        db.add_many([{"text": t, "source": s} for s, t in sorted(live.items())])
        return hits(db)


@pytest.fixture
def postings_reads(monkeypatch):
    """The term ids whose stored segments each call of ``Store.postings`` read."""
    reads: list[list[int]] = []
    real = LexicalSQL.postings

    def spy(self, term_ids):
        reads.append(list(term_ids))
        return real(self, term_ids)

    monkeypatch.setattr(LexicalSQL, "postings", spy)
    return reads


def test_a_write_keeps_the_segments_decoded_until_the_next_flush(tmp_path, postings_reads):
    path = tmp_path / "kb.db"
    live = {f"s{i}": f"apple note {i} 检索 evidence {i % 4}" for i in range(300)}
    with ragdb.open(path, chunker="none") as db:
        db.add_many([{"text": t, "source": s} for s, t in live.items()])
        db.optimize(vacuum=False)  # every posting in segments
        want = fresh(live)  # (the fresh build reads postings too: before the reads counted)
        postings_reads.clear()
        assert hits(db) == want
        decoded = {t for r in postings_reads for t in r}
        assert decoded
        db.add("apple note tail 生成", source="t1")  # a tail chunk, no flush
        live["t1"] = "apple note tail 生成"
        db.delete(source="s3")  # a flushed chunk deleted: logged, segments unchanged
        del live["s3"]
        want = fresh(live)
        postings_reads.clear()
        assert hits(db) == want
        assert not decoded & {t for r in postings_reads for t in r}  # (only terms new to the cache)
        db.optimize(vacuum=False)  # a flush: the segments changed, read again
        postings_reads.clear()
        assert hits(db) == want
        assert decoded <= {t for r in postings_reads for t in r}


@pytest.mark.parametrize("flush_every, delta_min, delta_share, cache_bytes", [(4, 64, 8, None), (40, 1, 2, None),
                                                                          (40, 1, 2, 160)])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(st.tuples(st.sampled_from(["add", "replace", "delete", "optimize", "search"]),
                              st.integers(0, 12), st.lists(st.sampled_from(WORDS), min_size=1, max_size=5)),
                    min_size=1, max_size=30))
def test_searches_between_any_writes_equal_a_fresh_build(tmp_path_factory, ops, flush_every, delta_min, delta_share,
                                                          cache_bytes):
    """A file flushing every few chunks; after each write, this handle and a second one (which
    follows another connection's writes) search like a fresh build. The second setting keeps
    up to 40 chunks unflushed and regroups the tail whenever the chunks appended since it was
    grouped outnumber half the rest (Index._tail_parts: grouped apart, then all again); the
    third also gives the decoded postings 160 bytes, so that both caches drop terms all along."""
    path = tmp_path_factory.mktemp("seg") / "kb.db"
    live: dict[str, str] = {}
    inv = ragdb.index.inverted
    budget = {"POSTINGS_CACHE_MIN_BYTES": inv.POSTINGS_CACHE_MIN_BYTES if cache_bytes is None else cache_bytes,
              "POSTINGS_CACHE_BYTES_PER_CHUNK": inv.POSTINGS_CACHE_BYTES_PER_CHUNK if cache_bytes is None else 0}
    with mock.patch.object(ragdb.engine.write, "FLUSH_THRESHOLD", flush_every), \
            mock.patch.multiple(ragdb.index.inverted, **budget), \
            mock.patch.object(ragdb.index.inverted, "TAIL_DELTA_MIN", delta_min), \
            mock.patch.object(ragdb.index.inverted, "TAIL_DELTA_SHARE", delta_share), \
            ragdb.open(path, chunker="none") as db, ragdb.open(path) as other:
        for op, n, words in ops:
            source = f"s{n}"
            if op in ("add", "replace"):
                text = " ".join(words) + f" {n}"
                db.add(text, source=source)
                live[source] = text
            elif op == "delete" and source in live:
                db.delete(source=source)
                del live[source]
            elif op == "optimize":
                db.optimize(vacuum=False)
            want = fresh(live)
            assert hits(db) == want
            assert hits(other) == want


# -- segment numbers and counts across flushes (Index._segment_counts) ------------------------

def stored_segments(path):
    """term id -> its segment numbers, read from the file."""
    import sqlite3

    conn = sqlite3.connect(path)
    try:
        out: dict[int, list[int]] = {}
        for tid, seg in conn.execute("SELECT term_id, segment FROM postings ORDER BY term_id, segment"):
            out.setdefault(tid, []).append(seg)
        return out
    finally:
        conn.close()


def test_a_bulk_load_into_an_empty_file_never_asks_the_store_for_segment_counts(tmp_path, monkeypatch):
    """Its flushes know every term's segments from the ones before (none at first)."""
    asked: list[int] = []
    real = LexicalSQL.segment_counts

    def spy(self, term_ids):
        asked.append(len(term_ids))
        return real(self, term_ids)

    monkeypatch.setattr(LexicalSQL, "segment_counts", spy)
    monkeypatch.setattr(ragdb.database, "BULK_FLUSH_CHUNKS", 50)
    live = {f"s{i}": f"apple note {i} 检索 evidence {i % 7} model{i % 13}" for i in range(400)}
    path = tmp_path / "kb.db"
    with ragdb.open(path, chunker="none") as db:
        db.add_many([{"text": t, "source": s} for s, t in live.items()], workers=0)
        assert db.check() == []
        assert hits(db) == fresh(live)
    assert asked == []
    assert all(segs == [0] for segs in stored_segments(path).values())  # the load's last flush merged them


@pytest.mark.parametrize("max_segments", [2, 16])
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(st.tuples(st.sampled_from(["add", "add", "delete", "optimize"]), st.booleans(),
                              st.integers(0, 9), st.lists(st.sampled_from(WORDS), min_size=1, max_size=4)),
                    min_size=1, max_size=30))
def test_two_writing_handles_number_and_merge_segments_as_the_file_holds_them(tmp_path_factory, ops, max_segments):
    """Two handles write in turn, each flushing every few chunks: a handle's knowledge of the
    segments its last flush left is stale once the other flushed, and its next flush must read
    them again (a stale number would collide with a stored segment; a stale count would leave
    a term past MAX_SEGMENTS). After each write both search like a fresh build; at the end no
    term has more than MAX_SEGMENTS segments and check() finds nothing wrong."""
    path = tmp_path_factory.mktemp("segcount") / "kb.db"
    live: dict[str, str] = {}
    with mock.patch.object(ragdb.engine.write, "FLUSH_THRESHOLD", 2), \
            mock.patch.object(ragdb.index.inverted, "MAX_SEGMENTS", max_segments), \
            ragdb.open(path, chunker="none") as a, ragdb.open(path) as b:
        for op, first, n, words in ops:
            db = a if first else b
            source = f"s{n}"
            if op == "add":
                text = " ".join(words) + f" {n}"
                db.add(text, source=source)
                live[source] = text
            elif op == "delete" and source in live:
                db.delete(source=source)
                del live[source]
            elif op == "optimize":
                db.optimize(vacuum=False)
            want = fresh(live)
            assert hits(a) == want
            assert hits(b) == want
        assert a.check() == []
    assert all(len(segs) <= max_segments for segs in stored_segments(path).values())


def test_a_flush_after_another_handles_flush_numbers_past_its_segments(tmp_path):
    """Handle a flushes, b flushes the same terms, a flushes again: a's segments follow b's."""
    path = tmp_path / "kb.db"
    with mock.patch.object(ragdb.engine.write, "FLUSH_THRESHOLD", 1), \
            ragdb.open(path, chunker="none") as a, ragdb.open(path) as b:
        a.add("apple note one", source="a1")
        b.add("apple note two", source="b1")
        a.add("apple note three", source="a2")
        b.add("apple note four", source="b2")
        want = fresh({"a1": "apple note one", "b1": "apple note two", "a2": "apple note three",
                      "b2": "apple note four"})
        assert hits(a) == want and hits(b) == want
        assert a.check() == []
    segments = stored_segments(path)
    assert max(len(s) for s in segments.values()) == 4  # apple: one segment a flush


@pytest.mark.parametrize("path", [None, "file"])
def test_a_handle_whose_flush_a_rollback_undid_reads_the_file_again(tmp_path, path):
    """Two handles of one collection on one connection: b flushes inside a's transaction, which
    rolls back; a's own flush then brings the file to b's flush count again. b's next flush must
    not number its segments from what its undone flush left (its segment of "two" collided
    with a's), and both handles search like a fresh build."""
    target = ":memory:" if path is None else tmp_path / "kb.db"
    queries = ("two", "epsilon", "gamma", "alpha")

    def flushing(every):
        return mock.patch.object(ragdb.engine.write, "FLUSH_THRESHOLD", every)

    with ragdb.open(target, chunker="none") as a:
        b = a.collection("default")
        with flushing(1000):
            a.add("alpha beta", source="s0")
        with pytest.raises(RuntimeError), a.transaction(), flushing(1):
            b.add("gamma delta two", source="s1")  # flushed: undone below
            raise RuntimeError("undo")
        with flushing(1000):
            for i, word in enumerate(["one", "two", "three"]):
                a.add(f"epsilon {word}", source=f"e{i}")
        with flushing(1):
            a.add("epsilon four", source="e3")  # the file's first flush, as b's undone one was
            b.add("two three", source="s2")
        live = {"s0": "alpha beta", "e0": "epsilon one", "e1": "epsilon two", "e2": "epsilon three",
                "e3": "epsilon four", "s2": "two three"}
        with ragdb.open(":memory:", chunker="none") as db:
            db.add_many([{"text": t, "source": s} for s, t in live.items()])
            want = [[(h.source, round(h.score, 9)) for h in db.search(q, k=10)] for q in queries]
        for handle in (a, b):
            assert [[(h.source, round(h.score, 9)) for h in handle.search(q, k=10)] for q in queries] == want
        assert a.check() == []


def test_a_full_postings_cache_drops_its_least_recently_used_terms(tmp_path, postings_reads, monkeypatch):
    """Over its budget the cache of decoded postings drops the terms used longest ago, down to
    3/4 of the budget, and keeps those searches use again and again (emptying it whole had every
    search after it read and decode the common terms' long lists again)."""
    monkeypatch.setattr(ragdb.index.inverted, "POSTINGS_CACHE_MIN_BYTES", 2400)
    monkeypatch.setattr(ragdb.index.inverted, "POSTINGS_CACHE_BYTES_PER_CHUNK", 0)
    live = {f"s{i}": f"apple tok{i % 20} filler{i}" for i in range(300)}  # apple 1,500 bytes decoded, a tok 75
    with ragdb.open(tmp_path / "kb.db", chunker="none") as db:
        db.add_many([{"text": t, "source": s} for s, t in live.items()])
        db.optimize(vacuum=False)  # every posting in segments: this cache alone decodes them

        def read_by(query):
            postings_reads.clear()
            found = [(h.source, round(h.score, 9)) for h in db.search(query, k=400)]
            return found, {t for r in postings_reads for t in r}

        _, (apple,) = read_by("apple")
        _, (tok0,) = read_by("tok0")
        read = set()
        for j in range(1, 20):  # each query uses apple again; the tok terms overflow the budget
            read |= read_by(f"apple tok{j}")[1]
        assert len(read) == 19 and apple not in read  # used by every search: never dropped
        assert read_by("apple")[1] == set()
        assert read_by("tok0")[1] == {tok0}  # used longest ago: dropped, read again
        with ragdb.open(":memory:", chunker="none") as ref:
            ref.add_many([{"text": t, "source": s} for s, t in sorted(live.items())])
            for q in ["apple", "tok0", "apple tok7", "tok19 apple"]:
                assert read_by(q)[0] == [(h.source, round(h.score, 9)) for h in ref.search(q, k=400)]
    assert apple != tok0
