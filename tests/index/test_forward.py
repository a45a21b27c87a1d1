"""Packed forward indexes (schema 11, ragdb/index/forward.py): what is packed reads back (sorted,
or in the analyzer's order), a packed blob's length is never a multiple of 4 (so it is never
taken for a raw one, and a raw one never for it), and damage is reported, not read."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragdb.index import kernel
from ragdb.index.forward import (forward_form, forward_term_ids, forward_term_lists, pack_forward,
                                 pack_forward_many, unpack_forward_many)

# term ids: small gaps (one byte), middling (a uint16 escape), large (a uint32 escape), the top
ids_st = st.one_of(st.integers(0, 300), st.integers(0, 70_000), st.integers(0, 2**32 - 1))
chunk_st = st.lists(st.tuples(ids_st, st.integers(1, 70_000)), max_size=40, unique_by=lambda p: p[0])


def _raw(ids, tfs) -> tuple[bytes, bytes]:
    """A forward index as written before schema 11."""
    return (np.asarray(ids, dtype="<u4").tobytes(), np.minimum(np.asarray(tfs, dtype=np.int64), 65535)
            .astype("<u2").tobytes())


def _flat(chunks):
    ids = np.array([t for c in chunks for t, _ in c], dtype=np.int64)
    tfs = np.array([f for c in chunks for _, f in c], dtype=np.int64)
    return ids, tfs, [len(c) for c in chunks]


@pytest.mark.usefixtures("each_kernel")  # the compiled decoder (ragdb/index/cforward.pyx) and numpy
@settings(max_examples=300, deadline=None)
@given(chunks=st.lists(chunk_st, max_size=12), raw_every=st.integers(0, 3))
def test_packed_rows_read_back_sorted_and_in_the_analyzer_order(chunks, raw_every):
    ids, tfs, lens = _flat(chunks)
    packed = pack_forward_many(ids, tfs, lens)
    assert packed == [pack_forward([t for t, _ in c], [f for _, f in c]) for c in chunks]
    other = "numpy" if kernel.name() == "compiled" else "compiled"
    if other in kernel.available():  # the compiled encoder and numpy's: the same bytes
        before = kernel.use(other)
        try:
            assert pack_forward_many(ids, tfs, lens) == packed
        finally:
            kernel.use(before)
    # the length tells the forms apart: a packed terms blob is never a multiple of 4 bytes long
    assert all(len(t) % 4 and forward_form(t) == "packed" for t, _ in packed)
    # a batch mixing rows written before schema 11 (raw) with packed ones
    rows = [_raw([t for t, _ in c], [f for _, f in c]) if raw_every and i % raw_every == 0 else packed[i]
            for i, c in enumerate(chunks)]
    capped = np.minimum(tfs, 65535)
    got = unpack_forward_many([t for t, _ in rows], [f for _, f in rows], analyzer_order=True, check=True)
    assert got.problems == [None] * len(chunks)
    assert got.ids.tolist() == ids.tolist() and got.tfs.tolist() == capped.tolist()
    assert got.lengths().tolist() == lens
    fast = unpack_forward_many([t for t, _ in rows], [f for _, f in rows], analyzer_order=True)  # (check: numpy)
    assert fast.ids.tolist() == ids.tolist() and fast.tfs.tolist() == capped.tolist()
    assert fast.starts.tolist() == got.starts.tolist()
    decoded: list = []
    assert pack_forward_many(ids, tfs, lens, decoded=decoded) == packed
    sorted_rows = unpack_forward_many([t for t, _ in packed], [f for _, f in packed]).rows()
    for c, (a, b), (d, e) in zip(chunks, sorted_rows, decoded):
        want = sorted(c)
        assert a.tolist() == d.tolist() == [t for t, _ in want]
        assert b.tolist() == e.tolist() == [min(f, 65535) for _, f in want]
    assert [x.tolist() for x in forward_term_ids([t for t, _ in rows])] == \
        [sorted(t for t, _ in c) if not (raw_every and i % raw_every == 0) else [t for t, _ in c]
         for i, c in enumerate(chunks)] == forward_term_lists([t for t, _ in rows])


def test_the_pad_byte_keeps_every_length_off_multiples_of_4():
    """Lengths 1 + varint + permutation + gaps + escapes cover every residue; the pad byte is
    there exactly when the rest is a multiple of 4."""
    seen = set()
    for n in range(0, 300):
        for step in (1, 300, 70_000):
            ids = np.arange(1, n + 1, dtype=np.int64) * step
            for order in (ids, ids[::-1]):
                t, f = pack_forward(order, np.ones(n, np.int64))
                pad = t[0] >> 2 & 1
                assert len(t) % 4 != 0 and ((len(t) - pad) % 4 == 0) == bool(pad)
                seen.add((len(t) - pad) % 4)
    assert seen == {0, 1, 2, 3}


@pytest.mark.usefixtures("each_kernel")
def test_wide_chunks_have_two_byte_permutations_and_tfs():
    ids = np.arange(600, 0, -1, dtype=np.int64) * 7
    tfs = np.arange(600, dtype=np.int64) * 200
    t, f = pack_forward(ids, tfs)
    assert t[0] & 3 == 2 and len(f) == 1200
    for check in (True, False):
        got = unpack_forward_many([t, t], [f, f], analyzer_order=True, check=check)
        assert got.ids.tolist() == ids.tolist() * 2 and got.tfs.tolist() == np.minimum(tfs, 65535).tolist() * 2


def _damaged() -> dict[str, tuple[bytes, bytes]]:
    t, f = pack_forward([900, 3, 70_000, 5_000_000_000 % 2**32, 17], [1, 2, 3, 4, 300])  # every escape kind
    assert t[0] & 3 == 1 and len(f) == 10
    n_at = 2 + 5  # flags, n, then the 5 permutation bytes: the gaps
    cases = {
        "truncated": (t[:-3], f),
        "longer": (t + b"\x00\x00\x00\x00", f),
        "flags": (bytes([t[0] | 0x40]) + t[1:], f),
        "permutation width 3": (bytes([t[0] | 3]) + t[1:], f),
        "term count": (t[:1] + b"\x09" + t[2:], f),
        "tfs length": (t, f + b"\x01"),
        "repeated permutation": (t[:2] + bytes([0, 0]) + t[4:], f),
        "permutation past the terms": (t[:2] + bytes([9]) + t[3:], f),
        "a zero gap": (t[:n_at + 1] + b"\x00" + t[n_at + 2:], f),
    }
    if t[0] & 4:
        cases["pad byte not 0"] = (t[:-1] + b"\x07", f)
    else:
        cases["missing pad"] = (t + b"\x00", f)  # a byte too many, said to be no pad
    return cases


@pytest.mark.usefixtures("each_kernel")
@pytest.mark.parametrize("name", list(_damaged()))
def test_a_damaged_row_is_reported_and_not_read(name):
    good = pack_forward([5, 1, 9], [1, 1, 2])
    t, f = _damaged()[name]
    got = unpack_forward_many([good[0], t, good[0]], [good[1], f, good[1]], analyzer_order=True, check=True)
    assert got.problems[0] is None and got.problems[2] is None
    assert got.problems[1] is not None and got.problems[1][0].startswith(("chunks.terms", "chunks.tfs")), got.problems
    assert got.lengths().tolist() == [3, 0, 3] and got.ids.tolist() == [5, 1, 9, 5, 1, 9]
    for order in (True, False):
        if name in ("a zero gap", "repeated permutation") or (name == "permutation past the terms" and not order):
            continue  # the content, not the layout: check() looks (and the sorted ids ignore the permutation)
        with pytest.raises(ValueError, match="malformed forward index"):
            unpack_forward_many([good[0], t], [good[1], f], analyzer_order=order)
    # the term ids alone (a delete's read): the lists and the arrays agree, or both refuse the row
    try:
        want = [x.tolist() for x in forward_term_ids([good[0], t])]
    except ValueError:
        with pytest.raises(ValueError, match="malformed forward index"):
            forward_term_lists([good[0], t])
    else:
        assert forward_term_lists([good[0], t]) == want


def test_a_raw_row_whose_tfs_disagree_is_reported():
    t, f = _raw([4, 2], [1, 1])
    got = unpack_forward_many([t], [f + b"\x01\x00"], check=True)
    assert got.problems[0] is not None and got.problems[0][0] == "chunks.terms and chunks.tfs differ in length"
    with pytest.raises(ValueError):
        unpack_forward_many([t], [f + b"\x01\x00"])
