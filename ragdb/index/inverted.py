"""The inverted index: packed postings in SQLite, scored with numpy.

Layout (see ``migrations/0001_initial.sql``):

* every chunk row carries its forward index (term ids and term frequencies;
  packed, sorted by term id with the analyzer's order kept: :mod:`ragdb.index.forward`);
* ``postings`` holds, per term, segments of sorted chunk ids and tfs;
* chunks newer than ``stats.flushed_upto`` are not in ``postings`` yet:
  their postings come from their forward index, kept in memory as a small
  "tail" index. A flush (when the tail grows past a threshold, or on
  ``optimize``) writes the tail as one new segment per term, so a single
  ``add`` only writes its own rows and document frequencies;
* deleting a chunk deletes its row and lowers the document frequencies of its
  terms at once (IDF never drifts); its ids stay in old segments until the
  next merge, and readers skip them because the chunk no longer exists.

Each process keeps per-chunk lengths and states in numpy arrays, reloaded
when ``stats.generation`` shows that another connection wrote. Queries read
only the segments of the query's terms.
"""

from __future__ import annotations

import math

import sys
from collections import Counter
from dataclasses import dataclass, field
from itertools import chain
from typing import TYPE_CHECKING, Any
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence

import numpy as np
import orjson

from ragdb.index import kernel, scoring, snapshot
from ragdb.index.cache import GenerationCache
from ragdb.index.hits import HitEntry
from ragdb.index.forward import forward_term_ids, invert_compiled, unpack_forward_many
from ragdb.index.terms import TermTable, new_table
from ragdb.errors import StorageError
from ragdb.text.fields import effective_title
from ragdb.storage import Store

if TYPE_CHECKING:
    from ragdb.query.filters import Query

# chunk states in the in-memory table
ABSENT, LATEST, OLD = 0, 1, 2

FLUSH_THRESHOLD = 2048      # tail chunks that trigger a flush
# Tail entries appended since the tail was grouped are grouped apart while they are at most
# TAIL_DELTA_MIN or 1/TAIL_DELTA_SHARE of the rest (Index._tail_parts), then all regrouped.
TAIL_DELTA_MIN, TAIL_DELTA_SHARE = 64, 8
HIT_CACHE_BYTES = 12 << 20  # hit fields (text, metadata) kept for building hits, about 12 MiB
# Bytes of one cache entry besides its text and metadata: its HitEntry tuple, the cache's slot,
# its ints, source and title strings. Measured (tracemalloc, 2,009 entries of the realistic 100k
# corpus, text 1,907 bytes on average, no metadata): 327; a dict of the fields and the tuple
# holding it, before HitEntry, took 711. Plus 16 for the two list slots of its generation in
# the cache (ragdb.index.cache.GenerationCache).
HIT_ENTRY_OVERHEAD = 346
# Metadata, counted from its JSON: a parsed dict took 4-14 bytes a byte of its JSON (tracemalloc:
# 314-916 bytes for 50-151 bytes of JSON, nested values the most), counted as 200 + 6 a byte.
HIT_META_BYTES = (200, 6)
_NO_META: dict[str, Any] = {}  # shared by cache entries without metadata; never mutated
# Decoded postings kept between queries, in bytes: at least POSTINGS_CACHE_MIN_BYTES, and
# POSTINGS_CACHE_BYTES_PER_CHUNK per chunk of the database. A query's postings grow with the
# database (~700k at 1M chunks, ~3.5 MB decoded), and common terms come back query after query:
# a fixed 300,000 postings held no common term's list at 1M, so every query read and decoded
# them all again from SQLite (27 ms of a 60 ms English query). At 100k this stays near the old
# ~2 MB (1M postings there had added ~3 MiB of RSS for no speed).
POSTINGS_CACHE_MIN_BYTES = 4 << 20
POSTINGS_CACHE_BYTES_PER_CHUNK = 32
# postings of sealed tail parts a flush groups at a time (_Tails.segment_rows): ~4 MiB of
# work arrays; 1 << 19 held ~25 MiB at once in a 65,536-chunk flush
SEALED_RUN_POSTINGS = 1 << 17
_NO_TAIL_BYTES = 100  # what a cached "no tail postings" entry counts for (a dict slot and an int)
_ABSENT: Any = object()  # not in a cache (None is a cached "no postings")


def _evict_oldest(cache: dict[int, tuple[np.ndarray, np.ndarray] | None], at_least: int, empty: int) -> int:
    """Drop the least recently used entries of a postings cache (its first: a hit moves an
    entry to the end) until ``at_least`` bytes are freed, or all; returns the bytes freed
    (``empty``: what an entry of None counts for). A full cache is cut to 3/4 of its budget,
    not emptied: emptying it had every query after read and decode again the common terms'
    long lists, which come back query after query (the realistic 1M corpus, its 1,811 mixed
    queries: 681 -> 553 KB of postings read and decoded a query at the same 30 MiB, the time
    spent in ``term_postings`` 12-18% lower)."""
    freed = 0
    victims = []
    for t, e in cache.items():  # one pass (popping the first again and again walks the holes)
        if freed >= at_least:
            break
        victims.append(t)
        freed += empty if e is None else e[0].nbytes + e[1].nbytes
    for t in victims:
        del cache[t]
    return freed
LOOKUP_CACHE_TERMS = 200_000  # vocabulary lookups kept until the generation changes
_LOOKUP_BATCH = 50_000  # terms looked up in the vocabulary at a time
MAX_SEGMENTS = 16           # segments per term before they are merged
MERGE_TERM_BATCH = 50_000   # terms outside the tail a flush looks at (counts, merges) at a time
_VISIBLE_BLOCK = 4096  # postings :meth:`Index.visible` checks at a time without the compiled kernel
_PACK_RUN = 1 << 18  # postings a flush packs at a time (pack_postings_many's work arrays: ~12 MiB)
MERGE_PART_POSTINGS = 1 << 19  # postings merged (read, rewritten) at a time: ~3 MiB of blobs, ~30 MiB of work arrays
# (merged all at once, _merged_rows: int64 work arrays of a part, where the merge of a term at a
# time had needed little more than its blobs; 1 << 21 raised the realistic 100k build's peak RSS 534 -> 592 MiB)


def pack_ids(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a, dtype="<u4").tobytes()


def pack_tfs(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(np.minimum(np.asarray(a, dtype=np.int64), 65535), dtype="<u2").tobytes()


# (A chunk's forward index is read with ragdb.index.forward.unpack_forward_many: raw or packed.)


# -- packed postings (schema 8) -----------------------------------------------------
#
# A segment's ``chunk_ids`` blob is either raw (``4 * n`` bytes: uint32 ids) or packed:
# one byte ``w`` (1 or 2), then the ids' gaps (the first id itself, then each id minus
# the one before) as ``n`` unsigned ``w``-byte values, a gap too large for them written
# as the escape value (255, 65535) there and as a uint32 in a list after them, in order.
# A term's postings are packed when that is smaller than raw (so a packed blob is never
# ``4 * n`` bytes long: the length tells the two apart, and segments written before
# schema 8 read as they are). ``tfs`` is ``n`` uint8 values when every tf fits in one
# byte, else ``2 * n`` uint16 values.
#
# Byte-aligned gaps with exceptions rather than variable-byte or bit-packing: numpy
# decodes them in three or four whole-array calls (a ``frombuffer``, the exceptions put
# back, a ``cumsum``), measured at 3.5 ns a posting on the realistic 100k corpus, about
# what reading the raw bytes' extra pages cost; variable-byte needs a per-byte loop or
# several passes. Measured there: chunk ids 45.4 -> 20.3 MiB, tfs 22.7 -> 11.6 MiB, the
# postings table 90 -> 48 MiB; query p50 unchanged on SciFact and English, +4% on Chinese
# (more of its terms' postings are decoded per query).
ROWS_PART = 8192  # segment rows the compiled kernel makes at a time (Tail.segment_rows)
PACK_MIN = 128  # shorter postings stay raw: packing saves them little, and costs a call per term in flushes


def pack_postings(ids: np.ndarray, tfs: np.ndarray) -> tuple[bytes, bytes]:
    """(chunk_ids blob, tfs blob) of one segment: ``ids`` strictly increasing, in [0, 2**32)."""
    n = len(ids)
    tf = np.minimum(np.asarray(tfs, dtype=np.int64), 65535)
    tfs_blob = tf.astype("u1").tobytes() if n and int(tf.max()) <= 255 else tf.astype("<u2").tobytes()
    if n < PACK_MIN:
        return pack_ids(ids), tfs_blob
    gaps = np.diff(np.asarray(ids, dtype=np.int64), prepend=0)
    best: bytes | None = None
    for width, escape, dtype in ((1, 255, "u1"), (2, 65535, "<u2")):
        big = gaps >= escape
        exceptions = int(np.count_nonzero(big))
        size = 1 + width * n + 4 * exceptions
        if size < (4 * n if best is None else len(best)):
            best = bytes((width,)) + np.where(big, escape, gaps).astype(dtype).tobytes() \
                + gaps[big].astype("<u4").tobytes()
    return (best if best is not None else pack_ids(ids)), tfs_blob


def pack_postings_many(ids: np.ndarray, tfs: np.ndarray, starts: Sequence[int] | np.ndarray
                       ) -> list[tuple[bytes, bytes]]:
    """:func:`pack_postings` of each group ``ids[starts[g]:starts[g + 1]]`` (every group
    non-empty, its ids strictly increasing, in [0, 2**32)), the same bytes, in a few
    whole-array passes: a bulk load's merge packs ~45,000 terms' postings, and numpy's
    per-call cost of one :func:`pack_postings` each was most of the merge's time."""
    bounds = np.asarray(starts, dtype=np.int64)
    firsts = bounds[:-1]
    groups = len(firsts)
    if not groups:
        return []
    ids64 = np.asarray(ids, dtype=np.int64)
    tf = np.minimum(np.asarray(tfs, dtype=np.int64), 65535)
    narrow = (np.maximum.reduceat(tf, firsts) <= 255).tolist()
    tf1 = tf.astype("u1").tobytes()  # (the values of the groups that are not narrow wrap: not used)
    tf2 = tf.astype("<u2").tobytes()
    raw = ids64.astype("<u4").tobytes()
    del tf
    bl = bounds.tolist()
    sizes = np.diff(bounds)
    if int(sizes.max()) >= PACK_MIN:
        gaps = np.diff(ids64, prepend=0)
        gaps[firsts] = ids64[firsts]  # a group's first gap is its first id
        big1 = gaps >= 255
        big2 = gaps >= 65535
        c1 = np.concatenate(([0], np.cumsum(np.add.reduceat(big1, firsts, dtype=np.int64)))).tolist()
        c2 = np.concatenate(([0], np.cumsum(np.add.reduceat(big2, firsts, dtype=np.int64)))).tolist()
        w1 = np.where(big1, 255, gaps).astype("u1").tobytes()
        w2 = np.where(big2, 65535, gaps).astype("<u2").tobytes()
        x1 = gaps[big1].astype("<u4").tobytes()
        x2 = gaps[big2].astype("<u4").tobytes()
        del gaps, big1, big2
    out: list[tuple[bytes, bytes]] = []
    append = out.append
    for g in range(groups):
        a, b = bl[g], bl[g + 1]
        n = b - a
        tfs_blob = tf1[a:b] if narrow[g] else tf2[2 * a:2 * b]
        if n < PACK_MIN:
            append((raw[4 * a:4 * b], tfs_blob))
            continue
        # pack_postings' choice: width 1 if smaller than raw, then width 2 if smaller than that
        size1 = 1 + n + 4 * (c1[g + 1] - c1[g])
        size2 = 1 + 2 * n + 4 * (c2[g + 1] - c2[g])
        width = 1 if size1 < 4 * n else 0
        if size2 < (size1 if width else 4 * n):
            width = 2
        if width == 1:
            append((b"\x01" + w1[a:b] + x1[4 * c1[g]:4 * c1[g + 1]], tfs_blob))
        elif width == 2:
            append((b"\x02" + w2[2 * a:2 * b] + x2[4 * c2[g]:4 * c2[g + 1]], tfs_blob))
        else:
            append((raw[4 * a:4 * b], tfs_blob))
    return out


def _packed_width(ids_blob: bytes, n: int) -> int:
    """The gap width (1 or 2) of a packed chunk ids blob of ``n`` postings, or 0 when its
    width byte or length does not fit the packed layout (O(1): the shape only)."""
    width = ids_blob[0] if ids_blob else 0
    rest = len(ids_blob) - 1 - width * n
    return width if width in (1, 2) and rest >= 0 and rest % 4 == 0 else 0


def unpack_postings(ids_blob: bytes, tfs_blob: bytes, n: int, *, wide: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(chunk ids, tfs) of a segment of ``n`` postings (see :func:`pack_postings`): raw
    blobs as uint32 views of the bytes, without a copy; packed ones decoded by the compiled
    kernel to uint32, else (or ``wide``) by numpy as intp.
    ``ragdb.engine.check`` validates stored blobs with :func:`postings_problem`; this trusts them."""
    if len(tfs_blob) not in (n, 2 * n):
        raise ValueError(f"a tfs blob of {len(tfs_blob)} bytes for {n} postings")
    tfs = np.frombuffer(tfs_blob, "u1" if len(tfs_blob) == n else "<u2")
    if len(ids_blob) == 4 * n:
        return np.frombuffer(ids_blob, "<u4"), tfs
    width = _packed_width(ids_blob, n)
    if not width:
        raise ValueError(f"a chunk ids blob of {len(ids_blob)} bytes for {n} postings is neither raw nor packed")
    fast = None if wide else kernel.compiled()
    if fast is not None:  # one pass, to uint32 (the compiled kernel reads them as they are)
        return fast.unpack_gaps(ids_blob, n), tfs
    escape, dtype = (255, "u1") if width == 1 else (65535, "<u2")
    # decoded as intp, the type numpy indexes with (a uint32 index array is converted on
    # every use, which the raw form pays in the scorer instead)
    gaps = np.frombuffer(ids_blob, dtype, n, 1).astype(np.intp)
    if len(ids_blob) > 1 + width * n:
        gaps[gaps == escape] = np.frombuffer(ids_blob, "<u4", offset=1 + width * n)
    return np.cumsum(gaps, out=gaps), tfs


def postings_problem(ids_blob: bytes, tfs_blob: bytes, n: int) -> tuple[str, str, np.ndarray, np.ndarray]:
    """("", "", chunk ids as int64, tfs as int64) of a stored segment of ``n`` postings, or
    (what is wrong, details, empty, empty) when its blobs are not well-formed (raw or packed,
    see :func:`pack_postings`), or its ids not strictly increasing below 2**32. The blobs'
    shape is checked here; :func:`unpack_postings` then decodes them."""
    none = np.zeros(0, np.int64)
    if len(tfs_blob) not in (n, 2 * n):
        return ("postings.tfs is not postings.n uint8 or uint16 values",
                f"{len(tfs_blob)} bytes for n {n}", none, none)
    if len(ids_blob) != 4 * n:
        width = _packed_width(ids_blob, n)
        if not width:
            return ("postings.chunk_ids is neither postings.n uint32 values nor postings.n packed gaps",
                    f"{len(ids_blob)} bytes for n {n}" + (f", width byte {ids_blob[0]}" if ids_blob else ""), none, none)
        rest = len(ids_blob) - 1 - width * n
        escape, dtype = (255, "u1") if width == 1 else (65535, "<u2")
        escapes = int(np.count_nonzero(np.frombuffer(ids_blob, dtype, n, 1) == escape))
        if escapes != rest // 4:
            return ("postings.chunk_ids has a different number of large gaps than escapes",
                    f"{rest // 4} large gaps, {escapes} escapes", none, none)
    ids_u, tfs_u = unpack_postings(ids_blob, tfs_blob, n, wide=True)  # intp: a sum past 2**32 shows
    ids, tfs = ids_u.astype(np.int64), tfs_u.astype(np.int64)
    if len(ids) and int(ids[-1]) >= 1 << 32:  # (gaps are not negative: the last id is the largest)
        return "postings.chunk_ids holds a chunk id of 2**32 or more", f"{int(ids[-1])}", none, none
    if len(ids) > 1 and not bool(np.all(ids[1:] > ids[:-1])):
        return "postings.chunk_ids is not strictly increasing", "", none, none
    return "", "", ids, tfs


def _stable_order(keys: np.ndarray) -> np.ndarray:
    """``np.argsort(keys, kind="stable")`` for ids in [0, 2**32): a two-pass LSD radix
    sort on 16-bit halves, because numpy radix-sorts 16-bit keys (3-4x faster than
    its stable sort of wider ones, which was the slowest step of a flush)."""
    if len(keys) and (int(keys.min()) < 0 or int(keys.max()) >= 1 << 32):
        return np.argsort(keys, kind="stable")
    order = np.argsort(keys.astype(np.uint16), kind="stable")  # (the low 16 bits: astype wraps)
    if len(keys) and int(keys.max()) >= 1 << 16:
        high = (keys >> 16).astype(np.uint16)[order]
        order = order[np.argsort(high, kind="stable")]
    return order


@dataclass
class _Tail:
    """Postings of unflushed chunks, grouped by term (CSR by term id)."""

    term_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))   # sorted unique
    starts: np.ndarray = field(default_factory=lambda: np.zeros(1, np.int64))
    chunk_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    tfs: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    count: int = 0  # chunks in the tail

    @classmethod
    def build(cls, entries: Sequence[tuple[int, np.ndarray, np.ndarray]]) -> "_Tail":
        if not entries:
            return cls()
        top = max(cid for cid, _, _ in entries)
        inverted = invert_compiled(entries if isinstance(entries, list) else list(entries), top >= 1 << 32)
        if inverted is not None:  # the same arrays, by a counting sort in C
            term_ids, starts, cids, tfs = inverted
            return cls(term_ids, starts, cids, tfs, len(entries))
        # Forward indexes' own types (uint32 term ids, uint16 tfs) and uint32 chunk ids
        # while ids fit: a bulk load's flush of 16,384 chunks (~2M postings) peaked
        # ~45 MiB higher with every array widened to int64 first.
        terms = np.concatenate([t for _, t, _ in entries])
        tfs = np.concatenate([f for _, _, f in entries])
        lens = np.fromiter((len(t) for _, t, _ in entries), np.int64, len(entries))
        cids = np.repeat(np.fromiter((cid for cid, _, _ in entries), np.uint32 if top < 1 << 32 else np.int64,
                                     len(entries)), lens)
        del lens
        order = _stable_order(terms)  # chunk ids stay ascending within a term
        terms = terms[order]
        tfs = tfs[order]
        cids = cids[order]
        del order
        if not len(terms):
            return cls(count=len(entries))
        starts = np.flatnonzero(np.concatenate(([True], terms[1:] != terms[:-1])))  # terms are sorted
        return cls(terms[starts].astype(np.int64), np.append(starts, len(terms)), cids, tfs, len(entries))

    def segment_rows(self, segment: int | np.ndarray, skip: Collection[int] = frozenset()
                     ) -> Iterator[tuple[int, int, int, bytes, bytes]]:
        """One postings row (term id, segment number, n, chunk ids, tfs) per term not in
        ``skip``, numbered ``segment``, or ``segment[i]`` for the i-th term (an array aligned
        with ``term_ids``): postings of ``PACK_MIN`` or more packed (:func:`pack_postings`),
        shorter ones raw, sliced from one buffer each (cheaper than a numpy slice and tobytes per
        term). Made as they are written (a list of a 16,384-chunk flush's ~140k rows held
        ~24 MiB): by the compiled kernel ``ROWS_PART`` terms at a time where it runs (the same
        rows; a 100k-chunk bulk load's flushes made ~700,000 rows here, ~0.9 s in Python)."""
        fast = kernel.compiled()
        if fast is not None and self.chunk_ids.dtype == np.uint32 and self.tfs.dtype == np.uint16:
            yield from self._compiled_rows(fast, segment, skip)
            return
        terms = self.term_ids.tolist()
        numbers: list[int] = segment.tolist() if isinstance(segment, np.ndarray) else [segment] * len(terms)
        starts = self.starts.tolist()
        ids32 = self.chunk_ids.astype("<u4").tobytes()
        tfs16 = np.minimum(self.tfs, 65535).astype("<u2").tobytes()
        # The terms of PACK_MIN postings or more (not skipped) are packed by pack_postings_many,
        # in runs of about _PACK_RUN postings, each run when the rows reach it.
        sizes = np.diff(self.starts)
        longs = np.flatnonzero(sizes >= PACK_MIN).tolist()
        if skip and longs:
            longs = [i for i in longs if terms[i] not in skip]
        runs: list[list[int]] = []
        total = _PACK_RUN
        for i in longs:
            if total >= _PACK_RUN:
                runs.append([])
                total = 0
            runs[-1].append(i)
            total += starts[i + 1] - starts[i]
        runs.reverse()
        packed: dict[int, tuple[bytes, bytes]] = {}
        for i, t in enumerate(terms):
            if skip and t in skip:
                continue
            a, b = starts[i], starts[i + 1]
            number = numbers[i]
            if b - a < PACK_MIN:
                yield (t, number, b - a, ids32[4 * a:4 * b], tfs16[2 * a:2 * b])
                continue
            if i not in packed:
                packed = self._pack_run(runs.pop())
            yield (t, number, b - a, *packed[i])

    def _compiled_rows(self, fast: Any, segment: int | np.ndarray, skip: Collection[int]
                       ) -> Iterator[tuple[int, int, int, bytes, bytes]]:
        """:meth:`segment_rows` by the compiled kernel (``chunk_ids`` uint32: every id fits)."""
        groups = len(self.term_ids)
        numbers = np.ascontiguousarray(np.broadcast_to(np.asarray(segment, dtype=np.int64), (groups,)))
        skipped = np.zeros(groups, np.uint8)
        if skip:
            skipped[np.isin(self.term_ids, np.fromiter(skip, np.int64, len(skip)))] = 1
        for g in range(0, groups, ROWS_PART):
            rows = fast.tail_rows(self.term_ids, self.starts, self.chunk_ids, self.tfs, numbers, skipped,
                                  g, min(groups, g + ROWS_PART), PACK_MIN)
            assert rows is not None  # (uint32 ids: never refused)
            yield from rows

    def _pack_run(self, groups: list[int]) -> dict[int, tuple[bytes, bytes]]:
        """Group number -> its packed (chunk ids, tfs) blobs, for these groups (ascending)."""
        at = self.starts[groups]
        lens = self.starts[np.asarray(groups) + 1] - at
        bounds = np.concatenate(([0], np.cumsum(lens)))
        picks = np.repeat(at - bounds[:-1], lens) + np.arange(int(bounds[-1]))
        return dict(zip(groups, pack_postings_many(self.chunk_ids[picks], self.tfs[picks], bounds)))

    def picks(self, term_ids: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(the places in ``term_ids`` of the terms this tail holds, their numbers of postings,
        the positions of their postings in the tail's arrays, one term after another in the
        order of ``term_ids``); ``term_ids`` and the tail not empty."""
        want = np.asarray(term_ids, dtype=np.int64)
        at = np.minimum(np.searchsorted(self.term_ids, want), len(self.term_ids) - 1)
        found = np.flatnonzero(self.term_ids[at] == want)
        a, b = self.starts[at[found]], self.starts[at[found] + 1]
        lens = b - a
        picks = np.repeat(a - np.concatenate(([0], np.cumsum(lens)[:-1])), lens) + np.arange(int(lens.sum()))
        return found, lens, picks

    def gathered(self, term_ids: Sequence[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """(chunk ids, tfs, each one's term's place in ``term_ids``) of the postings of those
        of ``term_ids`` this tail holds, one term after another in the order of ``term_ids``;
        None when it holds none of them."""
        if not len(self.term_ids) or not len(term_ids):
            return None
        found, lens, picks = self.picks(term_ids)
        if not len(found):
            return None
        return self.chunk_ids[picks], self.tfs[picks], np.repeat(found.astype(np.int64), lens)

    def sizes(self, term_ids: Sequence[int]) -> dict[int, int]:
        """term id -> its number of tail postings, for those of ``term_ids`` in the tail
        (one searchsorted for all of them)."""
        if not len(self.term_ids) or not len(term_ids):
            return {}
        want = np.asarray(term_ids, dtype=np.int64)
        at = np.minimum(np.searchsorted(self.term_ids, want), len(self.term_ids) - 1)
        found = self.term_ids[at] == want
        counts = self.starts[at + 1] - self.starts[at]
        return dict(zip(want[found].tolist(), counts[found].tolist()))

    def latest_counts(self, state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(this tail's term ids, how many of each one's chunks are LATEST in ``state``)."""
        if not len(self.term_ids):
            return self.term_ids, np.zeros(0, np.int64)
        latest = (state[self.chunk_ids] == LATEST).astype(np.int64)
        return self.term_ids, np.add.reduceat(latest, self.starts[:-1])

    def without(self, chunk_ids: np.ndarray) -> "_Tail":
        """This tail without the postings of ``chunk_ids`` (a term left without any goes)."""
        keep = ~np.isin(self.chunk_ids, chunk_ids)
        if bool(keep.all()):
            return self
        sizes = np.add.reduceat(keep.astype(np.int64), self.starts[:-1]) if len(self.term_ids) else keep[:0]
        kept = np.flatnonzero(sizes)
        return _Tail(self.term_ids[kept], np.concatenate(([0], np.cumsum(sizes[kept]))),
                     self.chunk_ids[keep], self.tfs[keep], self.count)

    def restricted(self, term_ids: Sequence[int] | np.ndarray) -> "_Tail":
        """What :func:`_merged_rows` reads of the tail for ``term_ids``: the tail itself (see
        :meth:`_Tails.restricted`)."""
        return self

    def get_many(self, term_ids: Sequence[int]) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """term id -> (chunk ids, tfs) of those of ``term_ids`` this tail holds (one searchsorted)."""
        if not self.count or not len(self.term_ids) or not len(term_ids):
            return {}
        want = np.asarray(term_ids, dtype=np.int64)
        at = np.minimum(np.searchsorted(self.term_ids, want), len(self.term_ids) - 1)
        hit = np.flatnonzero(self.term_ids[at] == want)
        if not len(hit):
            return {}
        at = at[hit]
        starts, ends = self.starts[at].tolist(), self.starts[at + 1].tolist()
        ids, tfs = self.chunk_ids, self.tfs
        return {t: (ids[a:b], tfs[a:b]) for t, a, b in zip(want[hit].tolist(), starts, ends)}


class _Tails:
    """The tail as several :class:`_Tail` parts, in chunk order (a bulk load's sealed groups,
    :meth:`Index.seal_tail`, then the entries after them), with what a flush reads of one
    :class:`_Tail`: the segment rows are made from a few terms of every part at a time, so
    the whole tail is never grouped twice over (one grouping of a bulk load's 65,536-chunk
    flush is ~50 MiB; its forward indexes beside it had been ~70 MiB more)."""

    def __init__(self, parts: Sequence[_Tail]) -> None:
        self.parts = [p for p in parts if len(p.term_ids)]
        self.count = sum(p.count for p in parts)
        self.term_ids = (np.unique(np.concatenate([p.term_ids for p in self.parts])) if self.parts
                         else np.zeros(0, np.int64))

    def sizes(self, term_ids: Sequence[int]) -> dict[int, int]:
        out: dict[int, int] = {}
        for p in self.parts:
            for t, n in p.sizes(term_ids).items():
                out[t] = out.get(t, 0) + n
        return out

    def latest_counts(self, state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        counts = np.zeros(len(self.term_ids), np.int64)
        for p in self.parts:
            terms, c = p.latest_counts(state)
            counts[np.searchsorted(self.term_ids, terms)] += c
        return self.term_ids, counts

    def restricted(self, term_ids: Sequence[int] | np.ndarray) -> _Tail:
        """One :class:`_Tail` of the postings of ``term_ids`` (ascending) in every part, each
        term's in chunk order (the parts' order)."""
        want = np.asarray(term_ids, dtype=np.int64)
        ids: list[np.ndarray] = []
        tfs: list[np.ndarray] = []
        places: list[np.ndarray] = []
        for p in self.parts:
            got = p.gathered(want)
            if got is not None:
                ids.append(got[0])
                tfs.append(got[1])
                places.append(got[2])
        if not ids:
            return _Tail(count=self.count)
        place = np.concatenate(places)
        order = np.argsort(place, kind="stable")  # by term; each term's postings stay in part order
        place = place[order]
        starts = np.flatnonzero(np.concatenate(([True], place[1:] != place[:-1])))
        return _Tail(want[place[starts]], np.append(starts, len(place)), np.concatenate(ids)[order],
                     np.concatenate(tfs)[order], self.count)

    def segment_rows(self, segment: int | np.ndarray, skip: Collection[int] = frozenset()
                     ) -> Iterator[tuple[int, int, int, bytes, bytes]]:
        """:meth:`_Tail.segment_rows` of the parts together: the terms in runs of about
        ``SEALED_RUN_POSTINGS`` postings, each run's postings grouped (:meth:`restricted`)
        as its rows are made."""
        terms = self.term_ids
        numbers = np.broadcast_to(np.asarray(segment, dtype=np.int64), (len(terms),))
        skipped = (np.isin(terms, np.fromiter(skip, np.int64, len(skip))) if skip
                   else np.zeros(len(terms), bool))
        sizes = np.zeros(len(terms), np.int64)
        for p in self.parts:
            sizes[np.searchsorted(terms, p.term_ids)] += np.diff(p.starts)
        bounds = np.cumsum(sizes)
        a = 0
        while a < len(terms):
            b = max(a + 1, int(np.searchsorted(bounds, (bounds[a - 1] if a else 0) + SEALED_RUN_POSTINGS,
                                               side="right")))
            run = terms[a:b]
            part = self.restricted(run)
            yield from part.segment_rows(np.ascontiguousarray(numbers[a:b]),
                                         set(run[skipped[a:b]].tolist()))
            a = b


class Index:
    """In-memory view of one database's index, kept in step with its generation."""

    def __init__(self, store: Store, *, use_snapshot: bool = True) -> None:
        self.store = store
        #: read the chunk-state snapshot of the last flush when it is current (False: scan
        #: every chunk row; ``check()`` compares the two)
        self.use_snapshot = use_snapshot
        self.generation = -1
        self.lengths = np.zeros(0, np.uint32)  # (token counts; BM25's length part is float64)
        self.state = np.zeros(0, np.int8)
        self.chunk_doc = np.zeros(0, np.int32)  # (int64 once a document id needs it: _fit_doc_ids)
        self.whole = np.zeros(0, bool)  # chunk is its whole document, no metadata of its own
        # (generation, filter) -> allowed-chunk mask, for repeated filters
        self.masks: dict[Any, np.ndarray] = {}
        # versions_all -> the mask of every latest chunk (False) or every stored one (True),
        # read-only: every search without conditions shares it (and is_latest_mask knows it)
        self._bases: dict[bool, np.ndarray] = {}
        self.n_chunks = 0
        self.total_length = 0
        self.flushed_upto = 0
        self.flush_count = -1
        self.max_id = 0       # highest chunk id this view has seen
        self.log_seq = 0      # last chunk_log entry applied
        self.tail_entries: list[tuple[int, np.ndarray, np.ndarray]] = []
        # the tail's first chunks grouped by seal_tail (their ids below the entries'), and their ids
        self._sealed: list[_Tail] = []
        self._sealed_ids: list[np.ndarray] = []
        self._tail: _Tail | _Tails | None = None
        # (the tail_entries list, how many of its entries ``base`` groups, base, the rest's or None)
        self._tail_split: tuple[list[tuple[int, np.ndarray, np.ndarray]], int, _Tail, _Tail | None] | None = None
        # term id -> number of deleted flushed latest chunks holding it (chunk_log terms)
        self.dead: Counter[int] = Counter()
        self._norms: np.ndarray | None = None
        self._norms_generation = -1
        self._length_norm: tuple[Any, np.ndarray] | None = None  # BM25 length part per chunk
        self._zeros: np.ndarray | None = None  # the pruning kernel's work array, all zeros between queries
        self._lookup_cache: dict[str, tuple[int, int] | None] = {}
        self._rows: GenerationCache[int, HitEntry] = GenerationCache(HIT_CACHE_BYTES, self._entry_bytes)
        self._scratch: dict[str, np.ndarray] = {}
        self._shared_strings: dict[str, str] = {}
        self._postings_cache: dict[int, tuple[np.ndarray, np.ndarray] | None] = {}
        self._postings_cached = 0
        # term id -> its stored segments' postings alone, kept across writes until the next
        # flush (segments change only then): a write empties the cache above, whose entries
        # hold the tail's postings too, and the next searches decode only what the tail adds
        self._segment_cache: dict[int, tuple[np.ndarray, np.ndarray] | None] = {}
        self._segment_cached = 0
        self._segment_key: tuple[int, int] = (-1, -1)  # (flush_count, vocab_epoch) it holds
        # Each term's (number of segments, highest segment number) as this handle's last flush
        # left them (:meth:`_segment_counts`), valid while the file is at that flush:
        # ``_seg_key`` (flush_count, vocab_epoch). -1: not known (read from the store when
        # asked); with ``_seg_complete``, a term past the arrays has no segment.
        self._seg_n = np.zeros(0, np.int32)
        self._seg_top = np.zeros(0, np.int32)
        self._seg_key: tuple[int, int] | None = None
        self._seg_complete = False
        # term -> id of terms known to exist; ids change only when optimize
        # removes unused terms, which bumps stats.vocab_epoch.
        self.term_cache: TermTable = new_table()  # (held in C where the compiled kernel runs)
        # Stands for the term ids this index's writer has looked up: a new one when they may have
        # changed (forget_terms), so caches of them kept elsewhere (a bulk load's worker term
        # numbers, ragdb.text.analysis.WorkerVocabulary) know to start again.
        self.term_token = object()
        # When >= 0, term_cache holds every term with an id up to this one:
        # set by a scan of the vocabulary, advanced as this connection adds
        # terms. Ids only grow (until a vocabulary clean-up, which changes
        # vocab_epoch and empties the cache), so after another connection's
        # write only the terms above it need reading (term_cache_stale).
        self.term_cache_upto = -1
        self.term_cache_stale = False
        # Whether term_cache holds the vocabulary's frequent terms (a vocabulary too large to
        # keep whole: see ragdb.engine.write.WRITER_FREQUENT_SHARE).
        self.term_cache_frequent = False
        # (generation, the vocabulary's next free term id) as this connection's writer last
        # knew it: good while the generation is that one (any write of another connection, a
        # flush or a clean-up changes it), so a write that adds terms right after this
        # connection's own last one reads no max(id) (two statements, ~20 us of a single add).
        self.next_term: tuple[int, int] | None = None
        self.vocab_epoch = -1
        self.next_ids = (0, 0)  # next free (document id, chunk id), as of the last sync
        #: whether ``bulk_terms`` holds terms (a bulk load's, not yet settled), as of the last
        #: sync or this connection's own write: lookups scan that table only then
        self.bulk_terms = False

    def reset(self) -> None:
        """Forget everything this view knows, as a new view of the store would (the next sync
        reads the file again): after a rollback undid writes it had seen (``Engine.sync``). In
        place, every attribute a new view's: a write holds the index it took before syncing."""
        fresh = Index(self.store, use_snapshot=self.use_snapshot)
        self.__dict__.clear()
        self.__dict__.update(fresh.__dict__)

    # -- keeping in step -----------------------------------------------------
    def sync(self) -> None:
        """Bring this view up to date with the file. Call inside a transaction.

        After writes by another connection, read only what changed (new
        chunks and the change log) unless a flush or a vocabulary clean-up
        happened since, which needs a full reload."""
        stats = self.store.stats_row()
        self.next_ids = (stats["next_doc_id"], stats["next_chunk_id"])  # for a writer, in this transaction
        if stats["generation"] == self.generation:
            return
        # another connection wrote: it may have added terms this cache lacks
        self.term_cache_stale = True
        self.bulk_terms = self.store.has_bulk_terms()
        if stats["vocab_epoch"] != self.vocab_epoch:
            self.forget_terms()
            self.vocab_epoch = stats["vocab_epoch"]
        if (self.generation >= 0 and stats["flush_count"] == self.flush_count
                and stats["flushed_upto"] == self.flushed_upto):
            self._catch_up()
        else:
            self._reload(stats)
        self.n_chunks = stats["n_chunks"]
        self.total_length = stats["total_length"]
        self.flush_count = stats["flush_count"]
        self.generation = stats["generation"]
        self._invalidate()

    def _reload(self, stats: dict[str, int]) -> None:
        # Sized by every chunk id ever handed out (stats.next_chunk_id), not by the highest
        # surviving chunk: postings keep the ids of deleted chunks until a merge drops them,
        # and a view sized by max(chunks.id) failed on them after the newest chunks were
        # deleted (issue 27). check() verifies that no stored id reaches next_chunk_id.
        size = max(self.store.max_chunk_id(), stats["next_chunk_id"] - 1, stats["flushed_upto"]) + 1
        self.lengths = np.zeros(_capacity(size), np.uint32)
        self.state = np.zeros(_capacity(size), np.int8)
        self.chunk_doc = np.zeros(_capacity(size), np.int32)
        self.whole = np.zeros(_capacity(size), bool)
        self.flushed_upto = stats["flushed_upto"]
        self._tail_split = None
        self._sealed, self._sealed_ids = [], []
        snap = self._current_snapshot(stats, size) if self.use_snapshot else None
        if snap is not None:
            self._load_snapshot(snap)
        else:
            self._scan_chunks()
        self.max_id = size - 1
        self.dead = Counter()
        dead = self.store.dead_terms()
        if dead:  # a chunk's terms are distinct: one count each, as per blob
            self.dead.update(unpack_forward_many(dead).ids.tolist())
        self.log_seq = self.store.log_seq()
        # the change log that told which chunks' fields changed is gone with the flush
        self.forget_hits(None)

    def _scan_chunks(self) -> None:
        """The per-chunk arrays from every chunk row, and the tail's forward indexes."""
        # In blocks: a list of every row as Python tuples would be the largest
        # thing a searching process ever holds (~15 MB at 100k chunks).
        for rows in self.store.chunk_table_blocks():
            # (id, doc id, length * 4 + latest * 2 + whole) a row; fromiter over the flattened
            # rows costs a third of np.array's reading of a list of tuples
            arr = np.fromiter(chain.from_iterable(rows), np.int64, 3 * len(rows)).reshape(-1, 3)
            ids, folded = arr[:, 0], arr[:, 2]
            self._fit_doc_ids(int(arr[:, 1].max(initial=0)))
            self.lengths[ids] = folded >> 2
            self.state[ids] = np.where(folded & 2, LATEST, OLD)
            self.chunk_doc[ids] = arr[:, 1]
            self.whole[ids] = (folded & 1).astype(bool)
        forward = self.store.forward_since(self.flushed_upto)
        self.tail_entries = [(row[0], t, f) for row, (t, f) in zip(
            forward, unpack_forward_many([r[1] for r in forward], [r[2] for r in forward]).rows())]

    def _current_snapshot(self, stats: dict[str, int], size: int) -> snapshot.ChunkState | None:
        """The stored chunk-state snapshot if it is the last flush's and whole (else None: scan)."""
        got = self.store.chunk_state_snapshot()
        if got is None or got[0] != stats["flush_count"] or got[1] != stats["flushed_upto"]:
            return None
        try:
            snap = snapshot.decode(got[2])
        except ValueError:
            return None  # (check() reports it; the rows are the truth)
        return snap if len(snap.lengths) == got[1] + 1 <= size else None

    def _load_snapshot(self, snap: snapshot.ChunkState) -> None:
        """The per-chunk arrays from the last flush's snapshot, brought up to date with the rows
        after it (the tail, with their forward indexes) and the change log since it, which
        holds every state change of a flushed chunk since that flush."""
        n = len(snap.lengths)
        self._fit_doc_ids(int(snap.chunk_doc.max(initial=0)))
        self.lengths[:n] = snap.lengths
        self.state[:n] = snap.state
        self.chunk_doc[:n] = snap.chunk_doc
        self.whole[:n] = snap.whole
        upto = self.flushed_upto
        self.tail_entries = []
        for _seq, cid, state, _terms in self.store.log_since(0):
            if 0 <= cid <= upto:  # (a tail chunk's row is current)
                self.set_state([cid], state)
        self._add_rows(self.store.chunks_since(upto))

    def _add_rows(self, rows: Sequence[tuple[int, int, int, int, bytes, bytes, int]]) -> None:
        """Chunk rows (``Store.chunks_since``) into the per-chunk arrays, their forward indexes
        onto the tail."""
        if not rows:
            return
        decoded = unpack_forward_many([r[4] for r in rows], [r[5] for r in rows]).rows()
        self._fit_doc_ids(max(r[3] for r in rows))
        for (cid, length, latest, doc_id, _terms, _tfs, whole), (terms, tfs) in zip(rows, decoded):
            self.lengths[cid] = length
            self.state[cid] = LATEST if latest == 1 else OLD
            self.chunk_doc[cid] = doc_id
            self.whole[cid] = whole == 1
            self.tail_entries.append((cid, terms, tfs))

    def write_snapshot(self) -> None:
        """Store this view's per-chunk arrays as the snapshot of the flush just recorded
        (in the flush's transaction: :meth:`flush` calls it)."""
        n = self.flushed_upto + 1
        self._grow(n)
        body = snapshot.encode(self.lengths, self.state, self.chunk_doc, self.whole, n)
        self.store.set_chunk_state_snapshot(self.store.stats_row()["flush_count"], self.flushed_upto, body)

    def _catch_up(self) -> None:
        """Apply other connections' writes since this view was current."""
        new = self.store.chunks_since(self.max_id)
        if new:
            self._grow(new[-1][0] + 1)
            self._add_rows(new)
            self.max_id = new[-1][0]
        log = self.store.log_since(self.log_seq)
        if log:
            dead = [r[3] for r in log if r[3] is not None]
            dead_ids = iter(forward_term_ids(dead)) if dead else None  # (one batch, in log order)
            for _seq, cid, state, dead_terms in log:
                gone = next(dead_ids) if dead_terms is not None and dead_ids is not None else None
                if cid < len(self.state) and self.state[cid] != ABSENT:
                    if gone is not None:  # a flushed latest chunk deleted: its terms leave df
                        self.dead.update(gone.tolist())
                    self.set_state([cid], state)
            # a logged chunk may have new fields (metadata or labels changed in place)
            self.forget_hits([row[1] for row in log])
            self.log_seq = log[-1][0]

    def may_have_new_terms(self) -> bool:
        """Whether ``new_terms`` may hold terms (as of the last :meth:`sync`): a chunk id was
        handed out after the last flush, which moved them all into ``vocabulary``. Lookups
        skip that table otherwise (the store's ``recent``)."""
        return bool(self.next_ids[1] - 1 > self.flushed_upto)

    def forget_terms(self) -> None:
        """Empty the writer's term cache (term ids changed: a vocabulary clean-up)."""
        self.term_cache.clear()
        self.term_cache_upto = -1
        self.term_cache_frequent = False
        self.term_token = object()
        self.next_term = None

    def forget_hits(self, chunk_ids: Sequence[int] | None) -> None:
        """Drop cached hit fields of these chunks (``None``: of every chunk)."""
        if chunk_ids is None:
            self._rows.clear()
            return
        for cid in chunk_ids:
            self._rows.pop(cid)

    def _invalidate(self) -> None:
        self.masks.clear()
        self._bases.clear()
        self._lookup_cache.clear()
        self._postings_cache.clear()
        self._postings_cached = 0
        self._tail = None
        self._norms = None
        self._length_norm = None

    def note_write(self, generation: int, n_chunks: int, total_length: int, log_seq: int | None = None) -> None:
        """This connection wrote (and updated this view itself) up to ``generation``."""
        self.generation = generation
        self.n_chunks = n_chunks
        self.total_length = total_length
        if log_seq is not None:
            self.log_seq = log_seq
        self._invalidate()

    def live_dfs(self) -> dict[int, int]:
        """term id -> live document frequency, for every term (call inside a transaction)."""
        dfs = dict(self.store.all_dfs())
        for t, c in self.df_corrections().items():
            dfs[t] = dfs.get(t, 0) + c
        return dfs

    def add_chunks(self, chunks: Sequence[tuple[int, int, int, np.ndarray, np.ndarray, bool]]) -> None:
        """Record new latest chunks (id, doc id, length, term ids, tfs, whole) written by this connection."""
        if not chunks:
            return
        top = max(c[0] for c in chunks)
        self._grow(top + 1)
        self._fit_doc_ids(max(c[1] for c in chunks))
        self.masks.clear()  # (the writer's note_write clears them too: a mask is never older than the state)
        self._bases.clear()
        self.max_id = max(self.max_id, top)
        for cid, doc_id, length, terms, tfs, whole in chunks:
            self.lengths[cid] = length
            self.state[cid] = LATEST
            self.chunk_doc[cid] = doc_id
            self.whole[cid] = whole
            self.tail_entries.append((cid, terms, tfs))
        self._tail = None

    def set_state(self, chunk_ids: Sequence[int], state: int) -> None:
        ids = np.asarray(chunk_ids, dtype=np.int64)
        self.state[ids] = state
        self.masks.clear()
        self._bases.clear()
        if state == ABSENT:  # (as a scan of the rows leaves an id no row has)
            self.lengths[ids] = 0
            self.chunk_doc[ids] = 0
            self.whole[ids] = False
            if self._sealed:
                parts: list[_Tail] = []
                part_ids: list[np.ndarray] = []
                for part, sealed_ids in zip(self._sealed, self._sealed_ids):
                    hit = np.isin(sealed_ids, ids)
                    if bool(hit.any()):
                        part = part.without(ids)
                        sealed_ids = sealed_ids[~hit]
                        part = _Tail(part.term_ids, part.starts, part.chunk_ids, part.tfs, len(sealed_ids))
                        self._tail = None
                    if len(sealed_ids):  # (a part left without chunks goes)
                        parts.append(part)
                        part_ids.append(sealed_ids)
                self._sealed, self._sealed_ids = parts, part_ids
            if self.tail_entries:
                gone = set(chunk_ids)
                kept = [e for e in self.tail_entries if e[0] not in gone]
                if len(kept) != len(self.tail_entries):  # (a deleted flushed chunk leaves the tail be)
                    self.tail_entries = kept
                    self._tail = None
                    self._tail_split = None

    def _grow(self, size: int) -> None:
        if size > len(self.lengths):
            cap = _capacity(size)
            self.lengths = np.concatenate([self.lengths, np.zeros(cap - len(self.lengths), np.uint32)])
            self.state = np.concatenate([self.state, np.zeros(cap - len(self.state), np.int8)])
            self.chunk_doc = np.concatenate([self.chunk_doc, np.zeros(cap - len(self.chunk_doc), self.chunk_doc.dtype)])
            self.whole = np.concatenate([self.whole, np.zeros(cap - len(self.whole), bool)])

    def _fit_doc_ids(self, top: int) -> None:
        """``chunk_doc`` able to hold document id ``top``: int32 (half the memory: 0.4 MiB a
        reader at 100k chunks) until an id needs int64, then int64 for good (numpy would wrap
        a larger id into int32 without a word)."""
        if top > _INT32_MAX and self.chunk_doc.dtype != np.int64:
            self.chunk_doc = self.chunk_doc.astype(np.int64)

    @property
    def tail(self) -> _Tail | _Tails:
        """The unflushed chunks' postings grouped by term: one :class:`_Tail`, or a
        :class:`_Tails` of the sealed groups and the entries after them."""
        if self._tail is None:
            base, delta = self._tail_parts()
            if delta is not None:
                base = _Tail.build(self.tail_entries)
                self._tail_split = (self.tail_entries, len(self.tail_entries), base, None)
            self._tail = _Tails([*self._sealed, base]) if self._sealed else base
        return self._tail

    def tail_count(self) -> int:
        """How many chunks the tail holds (sealed or not)."""
        return sum(p.count for p in self._sealed) + len(self.tail_entries)

    def tail_chunk_ids(self) -> list[int]:
        """The ids of the tail's chunks, ascending."""
        return [*(c for ids in self._sealed_ids for c in ids.tolist()), *sorted(e[0] for e in self.tail_entries)]

    def seal_tail(self) -> None:
        """Group the tail's entries by term now and keep only that grouping of them (a bulk
        load's, between its flushes: see ``ragdb.database.BULK_SEAL_CHUNKS``). The entries'
        forward indexes (two arrays a chunk, and the batches' buffers behind them) would
        otherwise be held until the flush grouped them all again beside themselves. Searches
        and flushes read the sealed groups with the entries after them (:class:`_Tails`)."""
        entries = self.tail_entries
        if not entries:
            return
        part = _Tail.build(entries)
        ids = np.fromiter((e[0] for e in entries), np.int64, len(entries))
        # (made first, then set together: the caller drops the whole view if this fails midway)
        self._sealed, self._sealed_ids, self.tail_entries = [*self._sealed, part], [*self._sealed_ids, ids], []
        self._tail = None
        self._tail_split = None

    def tail_counts(self) -> tuple[np.ndarray, np.ndarray]:
        """(term ids, how many latest tail chunks hold each), most first: what a term's live df
        may exceed its ``vocabulary.df`` by (empty without a tail)."""
        if not self.has_tail():
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        terms, counts = self.tail.latest_counts(self.state)
        order = np.argsort(-counts, kind="stable")
        return terms[order], counts[order]

    def has_tail(self) -> bool:
        return bool(self.tail_entries) or bool(self._sealed)

    def _tail_parts(self) -> tuple[_Tail, _Tail | None]:
        """The tail as (a :class:`_Tail` of the first tail entries, one of the entries appended
        since or None), for searches: a write that adds chunks appends their entries, and
        grouping only those (while they are few beside the rest) spares each search after a
        write the regrouping of the whole tail (up to FLUSH_THRESHOLD chunks: ~0.6 ms of a
        ~1 ms search at 100k chunks). Entries are only appended to one list (chunk ids
        ascending); removing any makes a new list, and so a new grouping of all of them."""
        entries = self.tail_entries
        parts = self._tail_split
        if parts is not None and parts[0] is entries and parts[1] <= len(entries):
            _list, covered, base, delta = parts
            rest = len(entries) - covered
            if rest == 0:
                return base, None
            if rest <= max(TAIL_DELTA_MIN, covered // TAIL_DELTA_SHARE):
                if delta is None or delta.count != rest:
                    delta = _Tail.build(entries[covered:])
                    self._tail_split = (entries, covered, base, delta)
                return base, delta
        base = _Tail.build(entries)
        self._tail_split = (entries, len(entries), base, None)
        return base, None

    def tail_postings_many(self, term_ids: Sequence[int]) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """term id -> its tail postings (chunk ids ascending, tfs), for those of ``term_ids``
        the tail holds (:meth:`_tail_parts`; one search of each part for all of them)."""
        base, delta = self._tail_parts()
        parts = [*self._sealed, base] if delta is None else [*self._sealed, base, delta]
        if len(parts) == 1:
            return base.get_many(term_ids)
        got: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}
        for part in parts:  # (in chunk order)
            for t, postings in part.get_many(term_ids).items():
                got.setdefault(t, []).append(postings)
        return {t: _joined(p) for t, p in got.items()}

    # -- document frequencies ------------------------------------------------------
    def df_corrections(self) -> dict[int, int]:
        """term id -> live df minus ``vocabulary.df``: latest unflushed chunks
        holding the term, minus deleted flushed chunks that held it."""
        terms, counts = self.tail.latest_counts(self.state)
        corr: dict[int, int] = dict(zip(terms.tolist(), counts.tolist()))
        for t, c in self.dead.items():
            corr[t] = corr.get(t, 0) - c
        return corr

    def effective_df(self, term_id: int, base: int) -> int:
        """The live document frequency of a term whose ``vocabulary.df`` is ``base``."""
        return self._live_df(term_id, base, self.tail_postings_many([term_id]).get(term_id))

    def _live_df(self, term_id: int, base: int, tail: tuple[np.ndarray, np.ndarray] | None) -> int:
        n = base - self.dead.get(term_id, 0)
        if tail is not None:
            n += int(np.count_nonzero(self.state[tail[0]] == LATEST))
        return n

    # -- flushing and merging (inside a write transaction) ---------------------
    def flush(self, *, merge_all: bool = False, merge_terms: Collection[int] | np.ndarray = ()) -> None:
        """Write the tail's postings as new segments; merge terms with too many segments,
        and the terms of ``merge_terms`` that would have more than one.

        Terms outside the tail are looked at ``MERGE_TERM_BATCH`` at a time: after a bulk
        load ``merge_terms`` is the whole vocabulary, and dicts of per-term counts for all
        of it (and sets of it) held ~400 bytes a term (~600 MiB at a million chunks)."""
        tail = self.tail
        # fold the live corrections into vocabulary.df (the terms added since the last flush
        # moved there first), then the tail becomes segments
        self.store.settle_new_terms()
        self.bulk_terms = False
        # (df_corrections' sums, as arrays: a dict and a list of pairs for a bulk load's ~250k
        # tail terms held ~40 MiB at once; a term both in the tail and dead gets two updates)
        terms, counts = tail.latest_counts(self.state)
        live = counts != 0
        self.store.add_df(chain(zip(counts[live].tolist(), terms[live].tolist()),
                                ((-c, t) for t, c in self.dead.items() if c)))
        del terms, counts, live  # (finish_flush then empties chunk_log, deleted chunks' terms with it)
        self.dead = Counter()
        top = max((e[0] for e in self.tail_entries),
                  default=max((int(ids[-1]) for ids in self._sealed_ids if len(ids)), default=self.flushed_upto))
        new_upto = max(self.flushed_upto, top, self.store.max_chunk_id())
        wanted = np.asarray(merge_terms, dtype=np.int64)
        if tail.count == 0 and not merge_all and not len(wanted):
            self.tail_entries = []
            self._sealed, self._sealed_ids = [], []
            self.store.finish_flush(new_upto)
            self.flushed_upto = new_upto
            self.flush_count += 1
            if self._seg_key == (self.flush_count - 1, self.vocab_epoch):
                self._seg_key = (self.flush_count, self.vocab_epoch)  # (no segment changed)
            self.log_seq = 0
            self.write_snapshot()
            return
        store = self.store
        in_tail = tail.term_ids
        # the tail's terms: segment numbers, and which are merged (with their tail postings)
        seg_n, seg_top = self._segment_counts(in_tail)
        if merge_all:
            merge = set(in_tail.tolist())
            wanted = np.setdiff1d(np.asarray(store.segment_counts_all(), dtype=np.int64), in_tail)
        else:
            if len(wanted) > 1 and not bool(np.all(wanted[1:] > wanted[:-1])):
                wanted = np.unique(wanted)
            # (both sorted and unique now: after a bulk load ``wanted`` is every term it flushed, and
            # numpy's setdiff1d without assume_unique sorted them all again, ~90 ms a flush at 20k)
            asked = np.isin(in_tail, wanted, assume_unique=True)  # the tail's terms asked for
            merge = set(in_tail[(seg_n > 0) & ((seg_n + 1 > MAX_SEGMENTS) | asked)].tolist())
            wanted = np.setdiff1d(wanted, in_tail, assume_unique=True)  # sorted, unique, outside the tail
        numbers = np.where(seg_n > 0, seg_top + 1, 0)
        store.insert_segments(tail.segment_rows(numbers, merge))
        self._note_segments(in_tail, seg_n + 1, numbers)
        if merge:
            self._merge(sorted(merge), tail)
        # the other terms asked for: merged where they have more than one segment (all: merge_all)
        for a in range(0, len(wanted), MERGE_TERM_BATCH):
            part = wanted[a:a + MERGE_TERM_BATCH]
            batch = part.tolist() if merge_all else part[self._segment_counts(part)[0] > 1].tolist()
            if batch:
                self._merge(batch, tail)
        store.finish_flush(new_upto)
        self.flushed_upto = new_upto
        self.flush_count += 1
        self._seg_key = (self.flush_count, self.vocab_epoch)  # what this flush left (noted as it went)
        self.log_seq = 0
        self.tail_entries = []
        self._sealed, self._sealed_ids = [], []
        self._tail = None
        self._tail_split = None  # (a bulk load's flushed tail is large: not kept)
        self.write_snapshot()

    def _segment_counts(self, term_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(number of segments, highest segment number) of each of ``term_ids`` (sorted,
        unique; 0 and 0 for a term without segments), as the file holds them in this write
        transaction. Read from the store only where this handle's flushes have not left them
        known: a bulk load's flushes asked the store for every term of each flush (and its
        last flush for every term it loaded), ~1 s of a 100k-chunk load's ~17 s.

        What a flush left stays true until the file's next flush or vocabulary clean-up, which
        change ``flush_count`` or ``vocab_epoch`` (the same key as :meth:`_segment_postings`'s
        cache); a failed write drops the whole view (``Engine.writing``), this with it."""
        ids = np.asarray(term_ids, dtype=np.int64)
        if self._seg_key != (self.flush_count, self.vocab_epoch):
            self._seg_n = np.zeros(0, np.int32)
            self._seg_top = np.zeros(0, np.int32)
            self._seg_complete = False
            self._seg_key = (self.flush_count, self.vocab_epoch)
            if not self.store.has_postings():
                self._seg_complete = True  # no term has a segment
        top = int(ids.max()) + 1 if len(ids) else 0
        if top > len(self._seg_n):
            self._grow_segment_counts(top)
        n, high = self._seg_n[ids], self._seg_top[ids]
        unknown = np.flatnonzero(n < 0)
        if len(unknown):
            found = self.store.segment_counts(ids[unknown].tolist())
            got = [found.get(t, (0, 0)) for t in ids[unknown].tolist()]
            n[unknown] = [c for c, _ in got]
            high[unknown] = [h for _, h in got]
            self._seg_n[ids[unknown]] = n[unknown]
            self._seg_top[ids[unknown]] = high[unknown]
        return n.astype(np.int64), high.astype(np.int64)

    def _grow_segment_counts(self, top: int) -> None:
        size = max(top, 2 * len(self._seg_n))
        fill = 0 if self._seg_complete else -1
        n = np.full(size, fill, np.int32)
        high = np.zeros(size, np.int32)
        n[:len(self._seg_n)] = self._seg_n
        high[:len(self._seg_top)] = self._seg_top
        self._seg_n, self._seg_top = n, high

    def _note_segments(self, term_ids: np.ndarray, n: np.ndarray, high: np.ndarray) -> None:
        """Record that ``term_ids`` now have ``n`` segments, the highest numbered ``high``."""
        if self._seg_key is None or not len(term_ids):
            return
        top = int(np.max(term_ids)) + 1
        if top > len(self._seg_n):
            self._grow_segment_counts(top)
        self._seg_n[term_ids] = n
        self._seg_top[term_ids] = high

    def _merge(self, term_ids: list[int], tail: _Tail | _Tails) -> None:
        """Rewrite these terms' segments (plus their tail postings) as one, dropping deleted chunks.

        In parts of about ``MERGE_PART_POSTINGS`` postings, each read, merged, deleted and
        written before the next is read: merging every term of a bulk load at once held
        the whole corpus's postings two or three times over (the realistic 100k build's
        peak RSS went from 402 to 742 MiB in its final merge)."""
        store = self.store
        sizes = store.posting_counts(term_ids)
        for t, n in tail.sizes(term_ids).items():
            sizes[t] = sizes.get(t, 0) + n
        for terms in _parts(term_ids, sizes, MERGE_PART_POSTINGS):
            rows = _merged_rows(terms, store.postings(terms), tail.restricted(terms), self.state)
            store.delete_segments(terms)
            store.insert_segments(rows)
            # one segment numbered 0 each, none for a term whose every posting was dropped
            self._note_segments(np.asarray(terms, dtype=np.int64), np.zeros(len(terms), np.int32),
                                np.zeros(len(terms), np.int32))
            kept = np.asarray([r[0] for r in rows], dtype=np.int64)
            self._note_segments(kept, np.ones(len(kept), np.int32), np.zeros(len(kept), np.int32))

    # -- which chunks a search sees ---------------------------------------------
    def allowed(self, query: Query) -> np.ndarray:
        """Boolean mask over chunk ids for a ``ragdb.query.filters.Query`` (call inside a read transaction)."""
        versions_all = query.versions == "all" or any(c.kind == "as_of" for c in query.conditions)
        base = self._bases.get(versions_all)
        if base is None:
            base = self.state != ABSENT if versions_all else self.state == LATEST
            base.flags.writeable = False  # shared by every search: a caller's change would be every later search's
            self._bases[versions_all] = base
        if not query.needs_sql:
            return base
        key = (query.conditions, query.public_unlabeled, versions_all)
        mask = self.masks.pop(key, None)
        if mask is not None:
            self.masks[key] = mask  # last used last: filters in steady use outlive one-off ones
        else:
            if query.per_chunk:  # a condition on the chunk's text: the chunks themselves
                ids = np.array(self.store.filtered_chunk_ids(query.conditions, query.public_unlabeled), dtype=np.int64)
                ok = np.zeros(len(base), bool)
                ok[ids[ids < len(ok)]] = True
                mask = base & ok
            else:
                docs = np.array(self.store.filtered_doc_ids(query.conditions, query.public_unlabeled), dtype=np.int64)
                top = int(max(self.chunk_doc.max(initial=0), docs.max(initial=0)))
                if top <= 4 * len(self.chunk_doc) + 65536:  # ids handed out in order: the usual case
                    doc_ok = np.zeros(top + 1, bool)
                    doc_ok[docs] = True
                    doc_ok[0] = False  # chunk_doc is 0 for absent chunks
                    mask = base & doc_ok[self.chunk_doc]
                else:  # ids far above the chunks' count: no array as long as the largest id
                    mask = base & np.isin(self.chunk_doc, docs[docs > 0])
            if len(self.masks) >= 16:
                self.masks.pop(next(iter(self.masks)))  # the least recently used
            self.masks[key] = mask
        return mask

    def is_latest_mask(self, mask: np.ndarray) -> bool:
        """Whether ``mask`` is :meth:`allowed`'s mask of a query without conditions over the
        latest versions: every latest chunk, and no other (so a term whose live df is above 0
        is in a chunk it allows)."""
        return mask is self._bases.get(False)

    # -- scoring ----------------------------------------------------------------
    def hit_protos(self, chunk_ids: Sequence[int]) -> dict[int, HitEntry]:
        """chunk id -> its :class:`~ragdb.index.hits.HitEntry` (the :class:`~ragdb.types.Hit`
        fields that do not depend on the query; its metadata, the document's merged with the
        chunk's), for building hits, through a cache.

        A chunk's text and position never change (replacing a document creates
        new chunks; ids are never reused); its metadata can (``Database.update``),
        which logs the chunk in chunk_log, and :meth:`sync` drops the entries
        of logged chunks (all of them after a flush, which empties the log).
        A deleted chunk's entry is simply never asked for again. The cache is
        bounded by size (``HIT_CACHE_BYTES``, mostly text): a
        :class:`~ragdb.index.cache.GenerationCache`, whose oldest entries go a
        generation at a time without a walk over them."""
        cache = self._rows
        # (a dict of the caller's own, not the cache: hits are made from it after the read
        # transaction, while another thread's search on this handle may evict entries)
        out = cache.get_many(chunk_ids)
        if len(out) == len(chunk_ids):
            return out
        missing = [c for c in chunk_ids if c not in out]
        ids = np.asarray(missing, dtype=np.intp)
        whole = self.whole[ids]
        rows = self.store.hit_rows(ids[~whole].tolist()) if not whole.all() else {}
        if whole.any():
            # chunks that are their whole document: one read of the document row
            by_doc = dict(zip(ids[whole].tolist(), self.chunk_doc[ids[whole]].tolist()))
            docs = self.store.doc_hit_rows(sorted(set(by_doc.values())))
            for cid, doc_id in by_doc.items():
                if doc_id in docs:
                    source, version, timestamp, text, dmeta, title = docs[doc_id]
                    rows[cid] = (doc_id, source, version, timestamp, text, 0, len(text), 0, "{}", dmeta, title)
        shared = self._shared_strings
        if len(shared) > 10_000:
            shared.clear()
        for cid, (doc_id, source, version, timestamp, text, start, end, ordinal, cmeta, dmeta, title) in rows.items():
            meta = orjson.loads(dmeta) if dmeta != "{}" else _NO_META
            section = None
            if cmeta != "{}":
                own = orjson.loads(cmeta)
                meta = {**meta, **own}
                section = own.get("section") if isinstance(own.get("section"), str) else None
            # documents loaded together share their timestamp and version: keep one copy
            timestamp = shared.setdefault(timestamp, timestamp)
            if version is not None:
                version = shared.setdefault(version, version)
            out[cid] = entry = HitEntry(doc_id, source, version, timestamp, text, start, end,
                                        ordinal, effective_title(title, source), section, meta)
            cache.put(cid, entry)
        return out

    @staticmethod
    def _entry_bytes(entry: HitEntry) -> int:
        """What a hit cache entry counts for (:data:`HIT_CACHE_BYTES`): its text, the rest of it
        and its metadata (estimated from its JSON: :data:`HIT_META_BYTES`)."""
        size = sys.getsizeof(entry.text) + HIT_ENTRY_OVERHEAD
        if entry.metadata:
            base, per_byte = HIT_META_BYTES
            size += base + per_byte * len(orjson.dumps(entry.metadata))
        return size

    def texts(self, chunk_ids: Sequence[int]) -> dict[int, str]:
        """chunk id -> its text, read from the text columns alone (a chunk that is its whole
        document from the document row), for checking phrases; chunks cached for hits are
        taken from that cache."""
        cached = self._rows.get_many(chunk_ids)
        out: dict[int, str] = {cid: e.text for cid, e in cached.items()}
        own, whole = [], []
        for cid in chunk_ids:
            if cid in out:
                continue
            if self.whole[cid]:
                whole.append(cid)
            else:
                own.append(cid)
        if own or whole:
            texts, docs = self.store.texts_by_id(own, sorted({int(self.chunk_doc[c]) for c in whole}))
            out.update(texts)
            for cid in whole:
                doc = int(self.chunk_doc[cid])
                if doc in docs:
                    out[cid] = docs[doc]
        return out

    def lookup_terms(self, terms: Sequence[str]) -> dict[str, tuple[int, int]]:
        """term -> (id, live df) for the terms in the vocabulary (inside a read transaction).

        ``vocabulary`` rows change only in writes, which advance the
        generation, so lookups are cached until it changes."""
        cache = self._lookup_cache
        known: dict[str, tuple[int, int] | None] = {}
        missing: list[str] = []
        for t in dict.fromkeys(terms):
            if t in cache:
                known[t] = cache[t]
            else:
                missing.append(t)
        for n in range(0, len(missing), _LOOKUP_BATCH):  # in batches; the answer never waits on the cache
            part = missing[n:n + _LOOKUP_BATCH]
            found = self.store.term_ids(part, recent=self.may_have_new_terms(), bulk=self.bulk_terms)
            if len(cache) + len(part) > LOOKUP_CACHE_TERMS:
                cache.clear()
            tail = self.tail_postings_many([v[0] for v in found.values()]) if self.has_tail() else {}
            for t in part:
                v = found.get(t)
                known[t] = cache[t] = None if v is None else (v[0], self._live_df(v[0], v[1], tail.get(v[0])))
        return {t: v for t, v in known.items() if v is not None}

    def term_postings(self, term_ids: Sequence[int]) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """term id -> (chunk ids, tfs), segments and tail together (may include deleted chunks).

        The stored segments' postings are decoded through a cache kept until the next flush
        (:meth:`_segment_postings`; writes between flushes only add to the tail and log
        states). A term that also has tail postings gets them joined on, cached until the
        generation changes (every write does), so a write costs the next searches only the
        terms the tail holds. Each cache holds up to :meth:`postings_cache_bytes`."""
        budget = self.postings_cache_bytes()
        stored = self._segment_postings(term_ids, budget)
        if not self.has_tail():
            return {t: e for t in term_ids if (e := stored[t]) is not None}
        cache = self._postings_cache  # term -> joined postings, or None: the tail has none of it
        out: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        missing = []
        for t in term_ids:
            e = cache.pop(t, _ABSENT)
            if e is _ABSENT:
                missing.append(t)
                e = stored[t]
            else:
                cache[t] = e  # (the newest again: least recently used first)
                if e is None:
                    e = stored[t]
            if e is not None:
                out[t] = e
        if missing:
            tail = self.tail_postings_many(missing)
            for t in missing:
                got = tail.get(t)
                entry = None
                size = _NO_TAIL_BYTES
                if got is not None:
                    # tail ids and tfs in the stored types (uint32 ids index numpy arrays directly)
                    more = (got[0].astype("<u4"), got[1].astype("<u2"))
                    seg = stored[t]
                    entry = out[t] = more if seg is None else _joined([seg, more])
                    size = entry[0].nbytes + entry[1].nbytes
                if self._postings_cached + size > budget:  # (this call's entries are kept in ``out``)
                    self._postings_cached -= _evict_oldest(cache, self._postings_cached + size - budget * 3 // 4,
                                                           _NO_TAIL_BYTES)
                cache[t] = entry
                self._postings_cached += size
        return {t: out[t] for t in term_ids if t in out}  # (in the order asked)

    def _segment_postings(self, term_ids: Sequence[int], budget: int
                          ) -> dict[int, tuple[np.ndarray, np.ndarray] | None]:
        """term id -> its stored segments' postings joined (None: it has none), through a
        cache of this flush (``stats.flush_count`` and ``vocab_epoch``: segments are written,
        merged and dropped only by a flush, an optimize or a reindex, which each count one)."""
        key = (self.flush_count, self.vocab_epoch)
        seg = self._segment_cache
        if self._segment_key != key:
            seg.clear()
            self._segment_cached = 0
            self._segment_key = key
        out: dict[int, tuple[np.ndarray, np.ndarray] | None] = {}
        need = []
        for t in term_ids:
            e = seg.pop(t, _ABSENT)
            if e is _ABSENT:
                need.append(t)
            else:
                seg[t] = out[t] = e  # (the newest again: least recently used first)
        if not need:
            return out
        parts: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {t: [] for t in need}
        for tid, n, ids, tfs in self.store.postings(need):
            try:
                parts[tid].append(unpack_postings(ids, tfs, n))
            except (ValueError, TypeError) as damage:  # a damaged row: say where, not numpy's words
                raise StorageError(f"the postings of term id {tid} are damaged ({damage}); `ragdb check` "
                                   f"lists what is damaged, and `ragdb reindex` rebuilds the postings from "
                                   f"the chunks") from damage
        for t in need:
            entry = _joined(parts[t]) if parts[t] else None
            size = 0 if entry is None else entry[0].nbytes + entry[1].nbytes
            if self._segment_cached + size > budget:  # (this call's entries are kept in ``out``)
                self._segment_cached -= _evict_oldest(seg, self._segment_cached + size - budget * 3 // 4, 0)
            seg[t] = out[t] = entry
            self._segment_cached += size
        return out

    def postings_cache_bytes(self) -> int:
        """How many bytes of decoded postings :meth:`term_postings` keeps between queries."""
        return max(POSTINGS_CACHE_MIN_BYTES, POSTINGS_CACHE_BYTES_PER_CHUNK * self.n_chunks)

    def stored_terms(self, term_ids: Sequence[int]) -> set[int]:
        """The ids among ``term_ids`` that some stored chunk (latest or kept older
        version) holds. A term whose chunks were all deleted keeps its vocabulary
        row (df 0) until ``optimize``; to searches of history it does not exist,
        as in a fresh database of the stored documents."""
        state = self.state
        out = set()
        for t, (ids, _tfs) in self.term_postings(term_ids).items():
            if len(ids) and bool(np.any(state[ids.astype(np.intp)] != ABSENT)):
                out.add(t)
        return out

    def scratch(self, name: str, size: int, dtype: Any = np.float64) -> np.ndarray:
        """A reusable array of ``size`` elements (contents undefined), valid until the
        next call with the same ``name``.

        Queries need a few arrays as large as the chunk table; allocating them
        afresh each time (1 MB at 100k chunks) made every query page-fault them
        in, whenever the C allocator handed such blocks back to the OS."""
        buf = self._scratch.get(name)
        if buf is None or len(buf) < size or buf.dtype != dtype:
            buf = self._scratch[name] = np.empty(size, dtype)
        return buf[:size]

    def _accumulate(self, term_ids: Sequence[int], weigh: Callable[[int, np.ndarray, np.ndarray], np.ndarray],
                    contributions: bool) -> tuple[np.ndarray, list[np.ndarray]]:
        """Sum ``weigh(i, chunk ids, tfs)`` over the query's terms, in query order,
        into a dense score array; optionally keep each term's contributions.

        Deleted chunks still listed in old segments get a (meaningless) score
        here; every caller masks results with ``allowed()``, which excludes them."""
        posting = self.term_postings(term_ids)
        return self._accumulate_postings([posting.get(t) for t in term_ids], weigh, contributions)

    def _accumulate_postings(self, postings: Sequence[tuple[np.ndarray, np.ndarray] | None],
                             weigh: Callable[[int, np.ndarray, np.ndarray], np.ndarray],
                             contributions: bool) -> tuple[np.ndarray, list[np.ndarray]]:
        """:meth:`_accumulate` over each term's or unit's (chunk ids, tfs), None for none."""
        scores = self.scratch("scores", len(self.lengths))
        scores.fill(0.0)
        per_term: list[np.ndarray] = []
        for i, p in enumerate(postings):
            if p is None:
                if contributions:
                    per_term.append(np.zeros(0))
                continue
            # numpy converts uint32 indexes to intp on every fancy index (a gather
            # in weigh, a gather and a scatter below): convert once
            ids = np.asarray(p[0], dtype=np.intp)  # (no copy when it is intp already)
            w = weigh(i, ids, p[1])
            scores[ids] += w
            if contributions:
                c = np.zeros(len(self.lengths))
                c[ids] = w
                per_term.append(c)
        return scores, per_term

    def _bm25_length_norm(self, k1: float, b: float) -> np.ndarray:
        """BM25's length part of every chunk (:func:`ragdb.index.scoring.bm25_length_norm`), per
        generation and parameters."""
        key = (self.generation, k1, b, len(self.lengths))
        if self._length_norm is None or self._length_norm[0] != key:
            self._length_norm = None  # (the old one's memory back first)
            lengths = self.lengths
            used = min(len(lengths), self.max_id + 1)  # (every chunk with a length is at or below it)
            # As long as the arrays (a kernel takes any id below that), written up to the last
            # chunk id handed out (the highest a posting may hold, a deleted chunk's included):
            # the pages past it (up to half the array, whose room doubles) stay the untouched
            # zero pages np.zeros maps, in no process's memory
            norm = np.zeros(len(lengths), np.float64)
            norm[:used] = scoring.bm25_length_norm(lengths[:used], self.total_length / self.n_chunks, k1, b)
            self._length_norm = (key, norm)
        return self._length_norm[1]

    def bm25(self, query: Sequence[tuple[int, int]], k1: float, b: float,
             contributions: bool = False) -> tuple[np.ndarray, list[np.ndarray]]:
        """BM25 scores over all chunk ids for ``query`` = [(term id, df)] in query order."""
        if self.n_chunks == 0:
            return np.zeros(len(self.lengths), np.float64), []
        norm = self._bm25_length_norm(k1, b)
        idfs = [scoring.bm25_idf(self.n_chunks, df) for _, df in query]
        compiled = kernel.compiled()
        if compiled is not None and not contributions:
            term_ids = [t for t, _ in query]
            posting = self.term_postings(term_ids)
            return self._compiled_bm25(compiled, [posting.get(t) for t in term_ids], norm, idfs,
                                       [1.0] * len(idfs), [False] * len(idfs), k1), []
        return self._accumulate(
            [t for t, _ in query],
            lambda i, ids, tfs: scoring.bm25_term_scores(tfs, norm[ids], idfs[i]),
            contributions)

    def _compiled_bm25(self, compiled: Any, postings: list[tuple[np.ndarray, np.ndarray] | None], norm: np.ndarray,
                       idfs: list[float], weights: list[float], flats: list[bool], k1: float) -> np.ndarray:
        """BM25 scores of every chunk from the compiled kernel (:mod:`ragdb.index.kernel`): the
        numpy path's operations in its order (``_accumulate_postings`` with
        :func:`~ragdb.index.scoring.bm25_term_scores` times the weight), bit for bit, without the GIL."""
        scores = self.scratch("scores", len(self.lengths))
        compiled.bm25_accumulate(scores, norm, postings, idfs, weights, flats, float(k1))
        return scores

    def bm25_top_k(self, units: Sequence[tuple[Sequence[int], int, float]], k1: float, b: float,
                   fields: Sequence[bool], mask: np.ndarray, k: int, floor: float
                   ) -> tuple[np.ndarray, np.ndarray] | None:
        """The ``k`` best chunks ``mask`` allows (and any tied with the k-th) with a BM25 score
        above 0 and at least ``floor``, best first, equal scores by id, and their scores: what
        :meth:`bm25_units` then the kernel's ``top_k`` give, bit for bit, from the compiled
        kernel (MaxScore in windows of chunk ids, which leaves most postings of common terms
        unscored where that pays; else every posting). None when the
        compiled kernel does not run or a unit's weight is not positive (the caller scores every
        posting then)."""
        compiled = kernel.compiled()
        if compiled is None or self.n_chunks == 0 or k < 1 or any(not 0 < w < math.inf for _ids, _df, w in units):
            return None
        norm = self._bm25_length_norm(k1, b)
        size = len(self.lengths)
        if self._zeros is None or len(self._zeros) != size:
            self._zeros = np.zeros(size, np.float64)  # the kernel's work array: it leaves it all zeros
        read = self.term_postings(sorted({t for ids, _df, _w in units for t in ids}))  # one read for every unit
        postings = [self.unit_postings(ids, read) for ids, _df, _w in units]
        idfs = [scoring.bm25_idf(self.n_chunks, df) for _, df, _ in units]
        if not all(0 < x < math.inf for x in idfs):  # only a damaged index has such a df: scored in full
            return None
        weights = [float(w) for _ids, _df, w in units]
        flats = [i < len(fields) and bool(fields[i]) for i in range(len(units))]
        n = min(len(mask), size)
        return compiled.bm25_top_k(self._zeros, norm, postings, idfs, weights, flats, float(k1),
                                   np.ascontiguousarray(mask[:n]).view(np.uint8), k, float(floor))

    def unit_postings(self, ids: Sequence[int], read: Mapping[int, tuple[np.ndarray, np.ndarray]] | None = None
                      ) -> tuple[np.ndarray, np.ndarray] | None:
        """(chunk ids, tfs) of index terms ``ids`` scored as one term: one term's postings,
        or for several the chunks holding any of them with their term frequencies summed
        (a prefix or fuzzy word's expansions; see :mod:`ragdb.index.matching`). ``read``: what
        :meth:`term_postings` gave for all of ``ids`` (and more), when the caller has it."""
        postings = self.term_postings(ids) if read is None else read
        found = [postings[t] for t in ids if t in postings]
        if not found:
            return None
        if len(found) == 1:
            return found[0]
        cids = np.concatenate([p[0] for p in found]).astype(np.int64)
        tfs = np.concatenate([p[1] for p in found]).astype(np.int64)
        uniq, inverse = np.unique(cids, return_inverse=True)
        return uniq, np.bincount(inverse, weights=tfs).astype(np.int64)

    def visible(self, ids: Sequence[int], mask: np.ndarray) -> bool:
        """Whether a chunk ``mask`` allows holds one of the index terms ``ids`` (a unit's): the
        compiled kernel stops at the first such posting; numpy looks a block at a time."""
        postings = self.term_postings(ids)
        allowed = np.ascontiguousarray(mask).view(np.uint8)
        fast = kernel.compiled()
        for t in ids:
            p = postings.get(t)
            if p is None:
                continue
            if fast is not None:
                if fast.any_allowed(np.ascontiguousarray(p[0]), allowed):
                    return True
                continue
            for start in range(0, len(p[0]), _VISIBLE_BLOCK):
                block = p[0][start:start + _VISIBLE_BLOCK]
                if bool(np.any(mask[block[block < len(mask)].astype(np.intp)])):
                    return True
        return False

    def union_df(self, ids: Sequence[int]) -> int:
        """Latest chunks holding any of the index terms ``ids`` (the df of a unit of several)."""
        p = self.unit_postings(ids)
        return 0 if p is None else int(np.count_nonzero(self.state[p[0].astype(np.intp)] == LATEST))

    def bm25_units(self, units: Sequence[tuple[Sequence[int], int, float]], k1: float, b: float,
                   contributions: bool = False, fields: Sequence[bool] = ()) -> tuple[np.ndarray, list[np.ndarray]]:
        """BM25 over all chunk ids for scoring units (index term ids scored as one term, live
        df, weight), in order: each unit's :func:`~ragdb.index.scoring.bm25_term_scores` times its weight.
        ``fields[i]``: unit ``i`` is a field's (:mod:`ragdb.text.fields`): no length normalisation."""
        if self.n_chunks == 0:
            return np.zeros(len(self.lengths), np.float64), []
        norm = self._bm25_length_norm(k1, b)
        idfs = [scoring.bm25_idf(self.n_chunks, df) for _, df, _ in units]
        flat = np.float64(k1)  # k1 * (1 - b + b * dl / avgdl) with b = 0
        compiled = kernel.compiled()
        if compiled is not None and not contributions:
            read = self.term_postings(sorted({t for ids, _df, _w in units for t in ids}))  # one read for every unit
            return self._compiled_bm25(compiled, [self.unit_postings(ids, read) for ids, _df, _w in units], norm, idfs,
                                       [float(w) for _ids, _df, w in units],
                                       [i < len(fields) and bool(fields[i]) for i in range(len(units))], k1), []

        def weigh(i: int, ids: np.ndarray, tfs: np.ndarray) -> np.ndarray:
            return scoring.bm25_term_scores(tfs, flat if i < len(fields) and fields[i] else norm[ids], idfs[i]) \
                * units[i][2]

        return self._accumulate_units(units, weigh, contributions)

    def tfidf_units(self, units: Sequence[tuple[Sequence[int], int, float, int]], contributions: bool = False
                    ) -> tuple[np.ndarray, list[np.ndarray]]:
        """TF-IDF cosine for scoring units ``(ids, df, weight, query tf)``: each a query term of
        that frequency (as :meth:`tfidf`'s) times its weight."""
        if self.n_chunks == 0 or not units:
            return np.zeros(len(self.lengths), np.float64), []
        idfs = [scoring.tfidf_idf(self.n_chunks, df) for _, df, _, _ in units]
        qw = [float(scoring.tfidf_tf(np.array([qtf]))[0] * idf) * w for idf, (_, _, w, qtf) in zip(idfs, units)]
        qnorm = float(np.sqrt(np.sum(np.square(qw))))
        scores, per_term = self._accumulate_units(
            [u[:3] for u in units], lambda i, ids, tfs: qw[i] * scoring.tfidf_tf(tfs) * idfs[i], contributions)
        return self._cosine(scores, per_term, qnorm)

    def _accumulate_units(self, units: Sequence[tuple[Sequence[int], int, float]],
                          weigh: Callable[[int, np.ndarray, np.ndarray], np.ndarray],
                          contributions: bool) -> tuple[np.ndarray, list[np.ndarray]]:
        """:meth:`_accumulate` for scoring units (each unit's terms' postings as one)."""
        read = self.term_postings(sorted({t for ids, _df, _w in units for t in ids}))  # one read for every unit
        return self._accumulate_postings([self.unit_postings(ids, read) for ids, _df, _w in units], weigh,
                                         contributions)

    def tfidf(self, query: Sequence[tuple[int, int, int]], contributions: bool = False
              ) -> tuple[np.ndarray, list[np.ndarray]]:
        """Cosine similarity of TF-IDF vectors; ``query`` = [(term id, df, query tf)]."""
        if self.n_chunks == 0 or not query:
            return np.zeros(len(self.lengths), np.float64), []
        n = self.n_chunks
        idfs = [scoring.tfidf_idf(n, df) for _, df, _ in query]
        qw = [float(scoring.tfidf_tf(np.array([qtf]))[0] * idf) for (_, _, qtf), idf in zip(query, idfs)]
        qnorm = float(np.sqrt(np.sum(np.square(qw))))
        scores, per_term = self._accumulate(
            [t for t, _, _ in query],
            lambda i, ids, tfs: qw[i] * scoring.tfidf_tf(tfs) * idfs[i],
            contributions)
        return self._cosine(scores, per_term, qnorm)

    def _cosine(self, scores: np.ndarray, per_term: list[np.ndarray], qnorm: float
                ) -> tuple[np.ndarray, list[np.ndarray]]:
        """Dot products (and each term's part) divided by the chunks' and the query's norms
        (0 where either is 0): TF-IDF cosine."""
        denom = self.norms() * qnorm
        nz = denom > 0
        scores[nz] /= denom[nz]
        scores[~nz] = 0.0
        for c in per_term:
            if len(c):
                c[nz] /= denom[nz]
        return scores, per_term

    def norms(self) -> np.ndarray:
        """TF-IDF vector norm of every chunk under the current statistics.

        Every add or delete changes N and so every IDF, so norms are
        recomputed lazily, at the first TF-IDF query after a write: one pass
        over all forward indexes with numpy (measured in BENCHMARKS.md).
        """
        if self._norms is not None and self._norms_generation == self.generation:
            return self._norms
        size = len(self.lengths)
        norms = np.zeros(size)
        df_pairs = np.array(self.store.all_dfs(), dtype=np.int64).reshape(-1, 2)
        df = np.zeros(int(df_pairs[:, 0].max(initial=0)) + 1, np.int64)
        df[df_pairs[:, 0]] = df_pairs[:, 1]
        for t, c in self.df_corrections().items():
            df[t] += c
        idf = scoring.tfidf_idf(self.n_chunks, df)
        idf[self.store.field_term_ids()] = 0.0  # a chunk's vector is its text's: field terms weigh nothing
        # In blocks of chunks, to keep memory flat on large databases; a
        # chunk's terms are summed in their stored order either way.
        block: list[tuple[int, bytes, bytes]] = []
        for row in self.store.forward_all():
            block.append(row)
            if len(block) >= 8192:
                _norm_block(block, idf, norms)
                block = []
        if block:
            _norm_block(block, idf, norms)
        self._norms = norms
        self._norms_generation = self.generation
        return self._norms


class TermMask:
    """A set of term ids as one byte a vocabulary entry (a bulk load's flushed terms:
    a Python set of a million-term vocabulary held ~70 MiB, this ~1.5 MiB)."""

    def __init__(self) -> None:
        self._mask = np.zeros(0, dtype=bool)

    def add(self, term_ids: np.ndarray) -> None:
        if not len(term_ids):
            return
        top = int(term_ids.max()) + 1
        if top > len(self._mask):
            grown = np.zeros(max(top, 2 * len(self._mask)), dtype=bool)
            grown[:len(self._mask)] = self._mask
            self._mask = grown
        self._mask[term_ids] = True

    def ids(self) -> np.ndarray:
        """The ids added, sorted."""
        return np.flatnonzero(self._mask).astype(np.int64)


def _joined(parts: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """One term's postings from several parts (segments, then the tail), sorted by chunk id."""
    if len(parts) == 1:
        return parts[0]
    entry = (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))
    if any(int(a[0][-1]) >= int(z[0][0]) for a, z in zip(parts, parts[1:]) if len(a[0]) and len(z[0])):
        # each segment is sorted; segments after one another hold later chunks, but
        # the pruning kernel's galloping search relies on it: sort when they do not
        order = np.argsort(entry[0], kind="stable")
        entry = (entry[0][order], entry[1][order])
    return entry


def write_all_postings(store: Store, batches: Iterable[Sequence[tuple[int, np.ndarray, np.ndarray]]]) -> None:
    """Write the postings of every chunk from forward indexes given in batches of
    (chunk id, term ids, tfs) in chunk id order (``Database.reindex``, into emptied
    postings): each batch becomes one segment per term, then a term's segments are
    merged into one, so memory holds one batch (and one merge part) at a time."""
    segment = 0
    for batch in batches:
        tail = _Tail.build(batch)
        if not len(tail.term_ids):
            continue
        store.insert_segments(tail.segment_rows(segment))
        segment += 1
    if segment <= 1:
        return
    several = [t for t, (n, _top) in store.segment_counts(store.segment_counts_all()).items() if n > 1]
    for terms in _parts(several, store.posting_counts(several), MERGE_PART_POSTINGS):
        rows = _merged_rows(terms, store.postings(terms), _Tail(), None)
        store.delete_segments(terms)
        store.insert_segments(rows)


def _merged_rows(terms: Sequence[int], segments: Sequence[tuple[int, int, bytes, bytes]], tail: _Tail,
                 state: np.ndarray | None) -> list[tuple[int, int, int, bytes, bytes]]:
    """The one-segment postings rows (term id, 0, n, chunk ids, tfs) of ``terms``: each term's
    stored ``segments`` (term id, n, chunk ids, tfs; by term, then segment) then its ``tail``
    postings, chunks whose ``state`` is ABSENT dropped (``state`` None: none), sorted by chunk
    id (stably); a term left without postings gets no row. In order of ``terms``.

    Done for all the terms at once (one stable sort of (term, chunk id), one
    :func:`pack_postings_many`) rather than a concatenate, sort and pack per term: the same
    rows, but numpy's per-call cost had been most of a bulk load's final merge. The compiled
    kernel's ``merge_postings`` gives the same rows in one pass per term where it can (terms
    ascending, each term's postings already in chunk order: every merge of segments written
    in chunk order), and leaves the rest to the code here."""
    fast = kernel.compiled()
    if fast is not None:
        rows = _merged_rows_compiled(fast, terms, segments, tail, state)
        if rows is not None:
            return rows
    place = {t: i for i, t in enumerate(terms)}  # term id -> its place in terms
    id_parts: list[np.ndarray] = []
    tf_parts: list[np.ndarray] = []
    seg_place: list[int] = []
    seg_sizes: list[int] = []
    for tid, n, ids_blob, tfs_blob in segments:
        ids, tfs = unpack_postings(ids_blob, tfs_blob, n)
        id_parts.append(ids)
        tf_parts.append(tfs)
        seg_place.append(place[tid])
        seg_sizes.append(len(ids))
    places = [np.repeat(np.asarray(seg_place, dtype=np.int64), np.asarray(seg_sizes, dtype=np.int64))]
    got = tail.gathered(terms)
    if got is not None:
        id_parts.append(got[0])
        tf_parts.append(got[1])
        places.append(got[2])
    if not id_parts:
        return []
    ids = np.concatenate(id_parts).astype(np.int64)
    tfs = np.concatenate(tf_parts)
    place_of = np.concatenate(places)
    del id_parts, tf_parts, places
    if state is not None:
        keep = state[ids] != ABSENT
        if not bool(keep.all()):
            ids, tfs, place_of = ids[keep], tfs[keep], place_of[keep]
    if not len(ids):
        return []
    # Stable by (place, chunk id): within a term, what a stable sort of its segments' then its
    # tail's postings by chunk id gives (mostly two sorted runs, which timsort merges in one pass).
    if int(ids.max()) < 1 << 32:
        order = np.argsort((place_of << 32) | ids, kind="stable")
    else:  # pragma: no cover - chunk ids past 2**32
        order = np.lexsort((ids, place_of))
    ids, tfs, place_of = ids[order], tfs[order], place_of[order]
    del order
    starts = np.flatnonzero(np.concatenate(([True], place_of[1:] != place_of[:-1])))
    bounds = np.append(starts, len(ids))
    packed = pack_postings_many(ids, tfs, bounds)
    sizes = np.diff(bounds).tolist()
    return [(terms[p], 0, n, ib, tb) for p, n, (ib, tb) in zip(place_of[starts].tolist(), sizes, packed)]


def _merged_rows_compiled(fast: Any, terms: Sequence[int], segments: Sequence[tuple[int, int, bytes, bytes]],
                          tail: _Tail, state: np.ndarray | None) -> list[tuple[int, int, int, bytes, bytes]] | None:
    """:func:`_merged_rows` by the compiled kernel, or None where it leaves them to numpy."""
    lens = np.zeros(len(terms), np.int64)
    tail_ids = tail_tfs = np.zeros(0, np.int64)
    if len(tail.term_ids) and len(terms):
        found, found_lens, picks = tail.picks(terms)
        if len(found):
            lens[found] = found_lens
            tail_ids = np.ascontiguousarray(tail.chunk_ids[picks], dtype=np.int64)
            tail_tfs = np.ascontiguousarray(tail.tfs[picks], dtype=np.int64)
    flags = None if state is None else np.ascontiguousarray(state, dtype=np.int8)
    rows: list[tuple[int, int, int, bytes, bytes]] | None = fast.merge_postings(
        list(terms), list(segments), lens, tail_ids, tail_tfs, flags, ABSENT, PACK_MIN)
    return rows


def _parts(term_ids: Sequence[int], sizes: dict[int, int], budget: int) -> Iterator[list[int]]:
    """``term_ids`` in order, in runs whose ``sizes`` sum to at most ``budget`` (a term
    larger than it alone), and of at most 2,000 terms."""
    part: list[int] = []
    total = 0
    for t in term_ids:
        n = sizes.get(t, 0)
        if part and (total + n > budget or len(part) >= 2000):
            yield part
            part, total = [], 0
        part.append(t)
        total += n
    if part:
        yield part


def _norm_block(block: Sequence[tuple[int, bytes, bytes]], idf: np.ndarray, out: np.ndarray) -> None:
    """TF-IDF norms of a block of (chunk id, terms, tfs) forward indexes, written into ``out``
    (each chunk's weights summed in the analyzer's order: see :mod:`ragdb.index.forward`)."""
    ids = np.array([cid for cid, _, _ in block], dtype=np.int64)
    batch = unpack_forward_many([t for _, t, _ in block], [f for _, _, f in block], analyzer_order=True)
    w = scoring.tfidf_tf(batch.tfs) * idf[batch.ids.astype(np.intp)]
    out[ids] = scoring.cosine_norms(np.repeat(np.arange(len(block)), batch.lengths()), w, len(block))


_INT32_MAX = 2**31 - 1


def _capacity(size: int) -> int:
    cap = 1024
    while cap < size:
        cap *= 2
    return cap
