"""The unflushed chunks' postings grouped by term (``ragdb.index.inverted._Tail``): the compiled
counting sort (``cforward.invert``) and numpy's stable sort, the reference, give the same arrays,
of the same types, for chunks in any order, wide chunk ids included."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
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
