"""The unflushed chunks' postings grouped by term (``ragdb.index.inverted._Tail``): the compiled
counting sort (``cforward.invert``) and numpy's stable sort, the reference, give the same arrays,
of the same types, for chunks in any order, wide chunk ids included."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ragdb.index import kernel
from ragdb.index.forward import invert_compiled
from ragdb.index.inverted import _Tail

compiled = pytest.mark.skipif("compiled" not in kernel.available(), reason="no compiled kernel here")

term_st = st.one_of(st.integers(0, 40), st.integers(0, 5_000), st.integers(0, 2**32 - 1))
forward_st = st.lists(st.tuples(term_st, st.integers(1, 65_535)), max_size=30, unique_by=lambda p: p[0])


def _entries(chunk_ids, forwards):
    return [(cid, np.array([t for t, _ in f], np.uint32), np.array([c for _, c in f], np.uint16))
            for cid, f in zip(chunk_ids, forwards)]


def _built(entries, name: str) -> _Tail:
    before = kernel.use(name)
    try:
        return _Tail.build(entries)
    finally:
        kernel.use(before)


@compiled
@settings(max_examples=300, deadline=None)
@given(forwards=st.lists(forward_st, max_size=25), wide=st.booleans(), shuffled=st.randoms(use_true_random=False))
@example(forwards=[[(3, 1), (1, 2)], [(1, 5)], []], wide=False, shuffled=None)
@example(forwards=[[(2**32 - 1, 7)], [(0, 1)]], wide=True, shuffled=None)  # too sparse: numpy decides
def test_the_counting_sort_groups_postings_as_the_stable_sort_does(forwards, wide, shuffled):
    ids = list(range(1, len(forwards) + 1))
    if wide:
        ids = [i + (1 << 32) for i in ids]
    if shuffled is not None:
        shuffled.shuffle(ids)  # a tail is in write order; the grouping must keep whatever order it has
    entries = _entries(ids, forwards)
    want, got = _built(entries, "numpy"), _built(entries, "compiled")
    for name in ("term_ids", "starts", "chunk_ids", "tfs"):
        a, b = getattr(want, name), getattr(got, name)
        assert a.dtype == b.dtype and a.tolist() == b.tolist(), name
    assert want.count == got.count == len(entries)
    # the compiled path ran wherever it was to (not a silent fallback to numpy)
    total = sum(len(f) for f in forwards)
    top = max((t for f in forwards for t, _ in f), default=-1)
    dense = total > 0 and total * 2 >= top
    before = kernel.use("compiled")
    try:
        assert (invert_compiled(entries, wide) is not None) == dense
    finally:
        kernel.use(before)


@compiled
def test_other_types_are_left_to_numpy():
    entries = [(1, np.array([1, 2], np.int64), np.array([1, 1], np.int64))]
    before = kernel.use("compiled")
    try:
        assert invert_compiled(entries, False) is None
        assert _Tail.build(entries).chunk_ids.tolist() == [1, 1]
    finally:
        kernel.use(before)


def _rows(tail: _Tail, name: str, segment, skip) -> list:
    before = kernel.use(name)
    try:
        return list(tail.segment_rows(segment, skip))
    finally:
        kernel.use(before)


@compiled
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), chunks=st.integers(0, 400), terms=st.integers(1, 12), numbered=st.booleans(),
       rows_part=st.sampled_from([1, 3, 8192]))
def test_the_compiled_segment_rows_are_the_numpy_rows(data, chunks, terms, numbered, rows_part, monkeypatch):
    """A flush's rows: raw below PACK_MIN postings, packed from it (gaps past the 1- and 2-byte
    escapes, tfs past 255 and 65,535), per-term segment numbers or one number, terms skipped;
    the compiled kernel's, made a part at a time, are the numpy path's, byte for byte."""
    from ragdb.index import inverted

    monkeypatch.setattr(inverted, "ROWS_PART", rows_part)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    step = data.draw(st.sampled_from([1, 300, 70_000]))
    entries = []
    for i in range(chunks):
        held = np.flatnonzero(rng.random(terms) < data.draw(st.sampled_from([0.2, 0.9]), label="density"))
        entries.append((1 + i * step + int(rng.integers(0, step)), held.astype(np.uint32),
                        rng.choice(np.asarray([1, 2, 255, 256, 65_535], np.uint16), len(held))))
    tail = _Tail.build(entries)
    ids = tail.term_ids.tolist()
    segment = np.asarray(rng.integers(0, 20, len(ids)), np.int64) if numbered else data.draw(st.integers(0, 20))
    skip = set(data.draw(st.lists(st.sampled_from(ids), max_size=len(ids)))) if ids else set()
    assert _rows(tail, "compiled", segment, skip) == _rows(tail, "numpy", segment, skip)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), chunks=st.integers(0, 300), terms=st.integers(1, 30), numbered=st.booleans(),
       run=st.sampled_from([1, 5, 1 << 19]), name=st.sampled_from(["compiled", "numpy"]))
def test_sealed_parts_read_as_the_one_grouping_of_all_their_entries(data, chunks, terms, numbered, run, name,
                                                                     monkeypatch):
    """A bulk load's tail sealed in parts (``_Tails``: ``Index.seal_tail``) gives a flush and a
    search what one ``_Tail`` of all the entries gives: the same segment rows byte for byte
    (made a run of terms at a time, ``SEALED_RUN_POSTINGS``), sizes, live counts, the postings
    ``_merged_rows`` reads, each term's postings, and without a deleted chunk the same again."""
    from ragdb.index import inverted
    from ragdb.index.inverted import LATEST, OLD, _merged_rows, _Tails

    if name not in kernel.available():
        return
    monkeypatch.setattr(inverted, "SEALED_RUN_POSTINGS", run)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    entries = []
    for i in range(chunks):
        held = np.flatnonzero(rng.random(terms) < data.draw(st.sampled_from([0.1, 0.8]), label="density"))
        entries.append((1 + 3 * i, held.astype(np.uint32),
                        rng.choice(np.asarray([1, 2, 255, 256, 65_535], np.uint16), len(held))))
    cuts = sorted(set(data.draw(st.lists(st.integers(0, chunks), max_size=5))))
    pieces = [entries[a:b] for a, b in zip([0, *cuts], [*cuts, chunks])]
    before = kernel.use(name)
    try:
        one = _Tail.build(entries)
        parts = _Tails([_Tail.build(p) for p in pieces])
        state = np.where(rng.random(3 * chunks + 2) < 0.8, LATEST, OLD).astype(np.int8)
        gone = np.asarray(sorted(set(data.draw(st.lists(st.sampled_from([e[0] for e in entries]), max_size=4))
                                     if entries else [])), np.int64)
        for whole, split in ((one, parts), (one.without(gone), _Tails([_Tail.build(p).without(gone) for p in pieces]))):
            ids = whole.term_ids.tolist()
            assert split.term_ids.tolist() == ids and split.count == whole.count
            segment = np.asarray(rng.integers(0, 20, len(ids)), np.int64) if numbered else data.draw(st.integers(0, 20))
            skip = set(data.draw(st.lists(st.sampled_from(ids), max_size=len(ids)))) if ids else set()
            assert list(split.segment_rows(segment, skip)) == list(whole.segment_rows(segment, skip))
            asked = sorted(set(data.draw(st.lists(st.integers(0, terms + 2), max_size=terms))))
            assert split.sizes(asked) == whole.sizes(asked)
            a, b = split.latest_counts(state), whole.latest_counts(state)
            assert a[0].tolist() == b[0].tolist() and a[1].tolist() == b[1].tolist()
            assert _merged_rows(asked, [], split.restricted(asked), state) == _merged_rows(asked, [], whole, state)
            got, want = split.restricted(asked).get_many(asked), whole.get_many(asked)
            assert {t: (i.tolist(), f.tolist()) for t, (i, f) in got.items()} == \
                {t: (i.tolist(), f.tolist()) for t, (i, f) in want.items()}
    finally:
        kernel.use(before)
