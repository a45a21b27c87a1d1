"""Packed postings (schema 8, ragdb.index.inverted.pack_postings): the codec round-trips, check()
tells malformed packed blobs, and segments written raw (before schema 8) read alike."""

from __future__ import annotations

import sqlite3

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ragdb
from ragdb.errors import StorageError
from ragdb.index.inverted import (PACK_MIN, pack_ids, pack_postings, pack_postings_many, pack_tfs, postings_problem,
                                  unpack_postings)

gaps = st.lists(st.one_of(st.integers(1, 300), st.integers(1, 70_000), st.integers(1, 1 << 24)), min_size=0,
                max_size=400)


@settings(max_examples=300, deadline=None)
@given(gaps=gaps, first=st.integers(0, 1 << 20), tfs=st.data())
def test_pack_then_unpack_gives_the_postings_back(gaps, first, tfs):
    ids = np.cumsum([first, *gaps]).astype(np.int64)
    ids = ids[ids < 1 << 32]
    n = len(ids)
    tf = np.array(tfs.draw(st.lists(st.integers(1, 70_000), min_size=n, max_size=n)), dtype=np.int64)
    ids_blob, tfs_blob = pack_postings(ids, tf)
    got_ids, got_tfs = unpack_postings(ids_blob, tfs_blob, n)
    assert got_ids.tolist() == ids.tolist()
    assert got_tfs.tolist() == np.minimum(tf, 65535).tolist()
    assert len(ids_blob) <= 4 * n and len(tfs_blob) <= 2 * n  # never larger than raw
    problem, _detail, ids64, tfs64 = postings_problem(ids_blob, tfs_blob, n)
    assert problem == "" and ids64.tolist() == ids.tolist() and tfs64.tolist() == got_tfs.tolist()


@settings(max_examples=200, deadline=None)
@given(groups=st.lists(st.tuples(gaps, st.integers(0, 1 << 20), st.sampled_from([3, 255, 256, 70_000])),
                       min_size=1, max_size=12), data=st.data())
def test_packing_many_groups_gives_the_bytes_of_packing_each(groups, data):
    """pack_postings_many (a merge's terms at once) writes exactly what pack_postings writes for
    each term: short and long groups, either gap width, escapes, raw when packing is not smaller."""
    id_parts, tf_parts = [], []
    for group_gaps, first, top in groups:
        ids = np.cumsum([first, *group_gaps]).astype(np.int64)
        ids = ids[ids < 1 << 32]
        id_parts.append(ids)
        tf_parts.append(np.array(data.draw(st.lists(st.integers(1, top), min_size=len(ids), max_size=len(ids))),
                                 dtype=np.int64))
    starts = np.concatenate(([0], np.cumsum([len(i) for i in id_parts])))
    got = pack_postings_many(np.concatenate(id_parts).astype(np.uint32), np.concatenate(tf_parts), starts)
    assert got == [pack_postings(i, f) for i, f in zip(id_parts, tf_parts)]


def test_dense_postings_pack_to_about_a_byte_each():
    ids = np.arange(0, 3 * 4096, 3)
    ids_blob, tfs_blob = pack_postings(ids, np.ones(len(ids), np.int64))
    assert len(ids_blob) == 1 + len(ids) and len(tfs_blob) == len(ids)
    ids[100:] += 100_000  # one gap too large for a byte: one escape and one uint32
    ids_blob, _ = pack_postings(ids, np.ones(len(ids), np.int64))
    assert len(ids_blob) == 1 + len(ids) + 4
    assert unpack_postings(ids_blob, _, len(ids))[0].tolist() == ids.tolist()


def test_short_and_sparse_postings_stay_raw():
    short = np.arange(PACK_MIN - 1) * 2
    assert pack_postings(short, np.ones(len(short), np.int64))[0] == pack_ids(short)
    sparse = np.arange(PACK_MIN * 2) * 1_000_000  # every gap an escape: packing would be larger
    assert pack_postings(sparse, np.ones(len(sparse), np.int64))[0] == pack_ids(sparse)


@pytest.mark.parametrize("mangle, needle", [
    (lambda b: b"\x03" + b[1:], "neither postings.n uint32 values nor postings.n packed gaps"),
    (lambda b: b[:-1], "neither postings.n uint32 values nor postings.n packed gaps"),
    (lambda b: b + b"\x00\x00\x00\x00", "a different number of large gaps than escapes"),
    (lambda b: b[:-4] + b"\xff\xff\xff\xff", "2**32 or more"),
    (lambda b: b[:2] + b"\x00" + b[3:], "not strictly increasing"),
])
def test_a_malformed_packed_blob_is_named(mangle, needle):
    ids = np.concatenate([np.arange(0, 2 * PACK_MIN, 2), [10_000_000]])
    ids_blob, tfs_blob = pack_postings(ids, np.ones(len(ids), np.int64))
    assert ids_blob[0] == 1 and len(ids_blob) == 1 + len(ids) + 4
    problem, _detail, _i, _t = postings_problem(mangle(ids_blob), tfs_blob, len(ids))
    assert needle in problem


def test_tfs_of_the_wrong_length_are_named():
    ids = np.arange(50)
    ids_blob, tfs_blob = pack_postings(ids, np.ones(50, np.int64))
    assert "postings.tfs is not postings.n uint8 or uint16 values" in postings_problem(ids_blob, tfs_blob[:-1], 50)[0]


TEXTS = [f"retrieval evidence item{i} {'common ' * (i % 3)}检索{'增强' if i % 2 else ''} word{i % 7}" for i in range(400)]
QUERIES = ["retrieval evidence", "common word3", "检索增强", "item17 word5", "evidence 增强 common"]


def _answers(db):
    return [[(h.source, h.score) for h in db.search(q, k=50)] for q in QUERIES]


def test_a_database_of_raw_segments_answers_alike_and_is_packed_by_optimize(tmp_path):
    """A file whose segments are all raw (as schema 7 wrote them) reads as it is; optimize
    rewrites them packed; the answers are the same before and after, and check() is clean."""
    path = tmp_path / "kb.db"
    with ragdb.open(path) as db:
        db.add_many([{"text": t, "source": f"s{i}"} for i, t in enumerate(TEXTS)], chunker="none")
        db.optimize()  # the tail written as segments
        packed = _answers(db)
    conn = sqlite3.connect(path)
    rows = conn.execute("SELECT term_id, segment, n, chunk_ids, tfs FROM postings").fetchall()
    assert any(len(ids) != 4 * n for _t, _s, n, ids, _f in rows)  # some were packed
    raw = []
    for t, seg, n, ids, tfs in rows:
        i, f = unpack_postings(ids, tfs, n)
        raw.append((pack_ids(i), pack_tfs(f), t, seg))
    conn.executemany("UPDATE postings SET chunk_ids = ?, tfs = ? WHERE term_id = ? AND segment = ?", raw)
    conn.commit()
    conn.close()
    with ragdb.open(path) as db:
        assert db.check() == []
        assert _answers(db) == packed
        db.add("retrieval evidence added later", source="late")
        db.delete(source="s3")
        db.optimize()
        assert db.check() == []
        after = _answers(db)
    with ragdb.open(tmp_path / "fresh.db") as fresh:
        fresh.add_many([{"text": t, "source": f"s{i}"} for i, t in enumerate(TEXTS) if i != 3], chunker="none")
        fresh.add("retrieval evidence added later", source="late")
        assert after == _answers(fresh)
    conn = sqlite3.connect(path)
    n_packed = conn.execute("SELECT count(*) FROM postings WHERE length(chunk_ids) != 4 * n").fetchone()[0]
    conn.close()
    assert n_packed > 0


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(order=st.permutations(range(60)), flush=st.sampled_from([3, 17, 2048]))
def test_packed_segments_score_like_a_fresh_build_after_updates(tmp_path_factory, order, flush, each_kernel):
    """Adds in any order, deletes and flushes at several sizes (so segments of every length,
    raw and packed, are merged with each other and with the tail) score as a fresh build."""
    path = tmp_path_factory.mktemp("packed") / "kb.db"
    live = {}
    with ragdb.open(path) as db:
        db._settings["flush_threshold"] = flush
        for k, i in enumerate(order):
            db.add(TEXTS[i], source=f"s{i}", chunker="none")
            live[f"s{i}"] = TEXTS[i]
            if k % 7 == 6:
                gone = f"s{order[k - 3]}"
                db.delete(source=gone)
                live.pop(gone, None)
        db.optimize() if flush == 17 else None
        assert db.check() == []
        got = _answers(db)
    with ragdb.open(":memory:") as fresh:
        fresh.add_many([{"text": t, "source": s} for s, t in sorted(live.items())], chunker="none")
        want = _answers(fresh)
    for g, w in zip(got, want):
        assert [s for s, _ in g] == [s for s, _ in w]
        assert all(abs(a - b) <= 1e-9 for (_, a), (_, b) in zip(g, w))


def test_check_reports_a_damaged_packed_segment(tmp_path):
    path = tmp_path / "kb.db"
    with ragdb.open(path) as db:
        db.add_many([{"text": t, "source": f"s{i}"} for i, t in enumerate(TEXTS)], chunker="none")
        db.optimize()
        assert db.check() == []
    conn = sqlite3.connect(path)
    term, seg = conn.execute("SELECT term_id, segment FROM postings WHERE length(chunk_ids) != 4 * n "
                             "ORDER BY term_id LIMIT 1").fetchone()
    conn.execute("UPDATE postings SET chunk_ids = CAST(x'07' || substr(chunk_ids, 2) AS BLOB) WHERE term_id = ? AND segment = ?",
                 [term, seg])
    conn.commit()
    conn.close()
    with ragdb.open(path) as db:
        problems = db.check()
        # a search that reads the damaged row says which term and what to run, not numpy's words
        word = sqlite3.connect(path).execute("SELECT term FROM vocabulary WHERE id = ?", [term]).fetchone()[0]
        with pytest.raises(StorageError, match=rf"postings of term id {term} are damaged .*ragdb check.*reindex"):
            db.search(word)
        db.reindex()  # rebuilt from the chunks' forward indexes
        assert db.check() == []
        assert db.search(word)
    assert len(problems) == 1, problems
    assert problems[0].startswith("postings.chunk_ids is neither postings.n uint32 values nor postings.n packed gaps "
                                  f"in 1 segment (e.g. term id {term}, segment {seg}: ")


@pytest.mark.parametrize("ids_blob,tfs_blob,n", [
    (b"", b"\x01", 1), (b"\x03" + bytes(200), bytes(200), 200), (b"\x01" + bytes(199), bytes(200), 200),
    (b"\x01" + bytes(200) + b"\x01", bytes(200), 200), (bytes(800), bytes(3), 200),
])
def test_unpack_postings_refuses_blobs_of_the_wrong_shape(ids_blob, tfs_blob, n):
    with pytest.raises(ValueError):
        unpack_postings(ids_blob, tfs_blob, n)


# -- merging segments: the compiled kernel's merge_postings against numpy's _merged_rows ----------

def _segment_rows(data, tid, start, count, segments):
    """``segments`` stored segments of ``count`` postings each from chunk id ``start`` on,
    chunk ids ascending across them; (rows, next id)."""
    rows = []
    nxt = start
    for _ in range(segments):
        gap = data.draw(st.sampled_from([1, 3, 300, 70_000]))
        ids = nxt + np.cumsum(np.full(count, gap, np.int64)) - gap
        tfs = np.asarray(data.draw(st.lists(st.sampled_from([1, 2, 255, 256, 65535, 70_000]),
                                            min_size=count, max_size=count)), np.int64)
        ib, tb = pack_postings(ids, tfs)
        rows.append((tid, count, ib, tb))
        nxt = int(ids[-1]) + 1 if count else nxt
    return rows, nxt


@settings(max_examples=200, deadline=None)
@given(data=st.data(), nterms=st.integers(0, 6), shuffle=st.booleans(), with_state=st.booleans())
def test_the_compiled_merge_gives_the_rows_of_the_numpy_merge(data, nterms, shuffle, with_state):
    """Segments of every stored shape (raw and packed, 1- and 2-byte gaps with escapes, uint8 and
    uint16 tfs, tfs clipped at 65535), then tail postings, deleted chunks dropped: the same rows,
    byte for byte. With ``shuffle`` some term's postings come out of order (a segment written
    after a later one: the reference sorts them), which the compiled merge leaves to numpy."""
    from ragdb.index import inverted, kernel
    from ragdb.index.inverted import _merged_rows, _Tail

    if "compiled" not in kernel.available():
        pytest.skip("the compiled kernel is not installed")
    terms = sorted(data.draw(st.sets(st.integers(1, 10_000), min_size=nterms, max_size=nterms)))
    segments: list = []
    entries: dict[int, list[tuple[int, int]]] = {}  # chunk id -> (term id, tf) of the tail
    nxt = 0
    top = 0
    for tid in terms:
        rows, after = _segment_rows(data, tid, data.draw(st.integers(0, 5_000)),
                                    data.draw(st.sampled_from([0, 1, 5, PACK_MIN - 1, PACK_MIN, 300])),
                                    data.draw(st.integers(0, 3)))
        rows = [r for r in rows if r[1]]
        if shuffle and len(rows) > 1 and data.draw(st.booleans()):
            rows.reverse()
        segments.extend(rows)
        top = max(top, after)
        nxt = max(nxt, after)
    for cid in range(nxt, nxt + data.draw(st.integers(0, 40))):  # tail chunks, after every segment's
        for tid in data.draw(st.sets(st.sampled_from(terms), max_size=len(terms))) if terms else ():
            entries.setdefault(cid, []).append((tid, data.draw(st.integers(1, 300))))
    tail = _Tail.build([(cid, np.asarray([t for t, _ in pairs], np.uint32), np.asarray([f for _, f in pairs], np.uint16))
                        for cid, pairs in sorted(entries.items())])
    size = max([top, nxt, *entries]) + 41
    state = None
    if with_state:
        rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
        state = rng.choice(np.asarray([0, 1, 1, 2], np.int8), size)
    before = kernel.use("compiled")
    try:
        got = _merged_rows(terms, segments, tail, state)
        compiled = inverted._merged_rows_compiled(kernel.compiled(), terms, segments, tail, state)
        kernel.use("numpy")
        want = _merged_rows(terms, segments, tail, state)
    finally:
        kernel.use(before)
    assert got == want
    if not shuffle:  # every term's postings in chunk order: the compiled merge made them itself
        assert compiled == want


def test_the_compiled_merge_leaves_what_it_cannot_prove_to_numpy():
    """Terms not ascending, a segment of a term not asked for, a malformed blob, a chunk id past
    the state array: None (numpy decides, and raises where it raises)."""
    from ragdb.index import kernel
    from ragdb.index.inverted import ABSENT, _Tail

    if "compiled" not in kernel.available():
        pytest.skip("the compiled kernel is not installed")
    from ragdb.index import ckernel

    ib, tb = pack_postings(np.arange(3, dtype=np.int64), np.ones(3, np.int64))
    none = np.zeros(0, np.int64)

    def merge(terms, segments, state=None):
        return ckernel.merge_postings(terms, segments, np.zeros(len(terms), np.int64), none, none, state,
                                      ABSENT, PACK_MIN)

    assert merge([5], [(5, 3, ib, tb)]) == [(5, 0, 3, ib, tb)]
    assert merge([6, 5], [(5, 3, ib, tb)]) is None
    assert merge([5], [(4, 3, ib, tb), (5, 3, ib, tb)]) is None
    assert merge([5], [(5, 3, ib, tb), (6, 3, ib, tb)]) is None
    assert merge([5], [(5, 3, ib[:-1], tb)]) is None
    assert merge([5], [(5, 3, ib, tb + b"\0")]) is None
    assert merge([5], [(5, 3, ib, tb)], np.ones(2, np.int8)) is None
    assert merge([5], [(5, 3, ib, tb)], np.asarray([0, 1, 0], np.int8)) == [(5, 0, 1, *pack_postings(np.asarray([1]), np.ones(1)))]
    # a damaged n (SQLite's INTEGER holds any): refused before any allocation, never a crash or a hang
    for n in (2**31, 2**60 + 1, 2**62, -1):
        assert merge([1, 2], [(1, 3, ib, tb), (2, n, b"", b"")]) is None
    # tail lengths that do not fit the tail's arrays
    assert ckernel.merge_postings([5], [], np.asarray([2], np.int64), np.asarray([1], np.int64),
                                  np.asarray([1], np.int64), None, ABSENT, PACK_MIN) is None
    assert ckernel.merge_postings([5], [], np.asarray([-1], np.int64), none, none, None, ABSENT, PACK_MIN) is None
    assert _Tail.build([]).count == 0


@pytest.mark.parametrize("n", [PACK_MIN, PACK_MIN + 1, PACK_MIN + 3, 200])
def test_the_compiled_merge_packs_at_every_width_boundary_as_pack_postings(n):
    """Gaps mixing small ones with ones of 255 (an escape at width 1) and 65,535 (at width 2), in
    every proportion around where raw, width 1 and width 2 cost the same: the bytes of
    pack_postings, whose choice (the smallest, raw on a tie, then width 1) decides the layout."""
    from ragdb.index import kernel
    from ragdb.index.inverted import ABSENT

    if "compiled" not in kernel.available():
        pytest.skip("the compiled kernel is not installed")
    from ragdb.index import ckernel

    none = np.zeros(0, np.int64)
    for big in range(n + 1):
        for size in (255, 65535):
            gaps = np.ones(n, np.int64)
            gaps[:big] = size
            for order in (gaps, gaps[::-1]):
                ids = np.cumsum(order)
                tfs = np.arange(n, dtype=np.int64) % 300
                raw = (5, n, pack_ids(ids), pack_tfs(tfs))
                got = ckernel.merge_postings([5], [raw], np.zeros(1, np.int64), none, none, None, ABSENT, PACK_MIN)
                assert got == [(5, 0, n, *pack_postings(ids, tfs))], (big, size)
