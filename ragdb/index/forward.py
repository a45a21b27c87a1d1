"""Packed forward indexes (schema 11): ``chunks.terms`` and ``chunks.tfs``, and ``chunk_log.terms``.

A chunk's forward index is its distinct term ids with their term frequencies, in the
analyzer's order (first occurrence in the text, then the field terms). Until schema 11
it was stored raw: ``terms`` 4 * n bytes of uint32 ids, ``tfs`` 2 * n bytes of uint16.
From schema 11 on, new rows are packed, sorted by term id:

``terms`` (n terms)::

    byte 0      flags: bits 0-1 the permutation's width p (0: none, 1: uint8, 2: uint16),
                bit 2 set when a pad byte ends the blob; the other bits 0
    varint      n (LEB128, 1-5 bytes)
    p * n       the permutation: for each term in the analyzer's order, its place among the
                sorted ids (uint8 when n <= 256, else little-endian uint16); left out (p 0)
                when the analyzer's order is the sorted order
    n bytes     the sorted ids' gaps (the first id itself, then each id minus the one
                before), each in one byte; 255 says "the gap is in the next uint16 escape"
    2 * e16     uint16 escapes, in order; 65535 says "the gap is in the next uint32 escape"
    4 * e32     uint32 escapes, in order
    [0]         the pad byte, when bit 2 is set: present exactly when the blob would
                otherwise be a multiple of 4 bytes long

``tfs``: the term frequencies in the sorted ids' order, n uint8 values when every tf fits
in one byte, else n little-endian uint16 values (capped at 65535, as before).

The two forms are told apart by the length of ``terms`` alone: a raw blob is 4 * n bytes
(a multiple of 4, the empty blob included), and a packed blob never is (the pad byte is
added exactly when it would be; :func:`forward_form` and tests/index/test_forward.py). So
rows written before schema 11 read as they are, without a rewrite; new writes pack.
``chunk_log.terms`` (a deleted flushed chunk's terms) is the chunk's ``terms`` blob as
stored, in either form, and reads the same way (the term ids only).

Why the order is kept (the permutation, ~1 byte a term of the ~4 a packed term takes):
TF-IDF norms sum a chunk's squared weights in its stored order, which being the analyzer's
makes them bit-identical in every database holding the chunk, however it was built (its
term ids differ) -- ``tests/engine/test_reindex.py`` compares them exactly -- and a database
written before schema 11 searches as it did. Only :meth:`Index.norms` asks for it; the
tail, deletes and document frequencies read the sorted ids.

Why this layout: byte-aligned, so numpy decodes a batch of rows in whole-array passes (one
gather of the gaps, the escapes put back, a ``cumsum``), as the packed postings do; the
compiled ``ragdb.index.cforward`` (optional, used with the compiled kernel) encodes and decodes
the same bytes in one pass a row, which keeps :meth:`Index.norms` (every chunk's forward index,
in the analyzer's order) as fast as reading raw rows was. Measured on the
realistic corpus (10k chunks, ~118 terms a chunk, a 108k-term vocabulary): 78% of the
sorted gaps fit a byte and 99.99% two; terms and tfs 7.1 -> 4.4 MB (gaps 1.7, the
permutation 1.45, tfs 1.2); variable-byte gaps would have saved 0.07 MB more.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from types import ModuleType
from typing import cast

import numpy as np

from ragdb.index import kernel

try:  # built by setup.py where a compiler is found (ragdb/index/cforward.pyx): the same values, faster
    from ragdb.index import cforward as _cforward_module
    _cforward: ModuleType | None = _cforward_module
except ImportError:  # pragma: no cover - a platform without the extension
    _cforward = None

PAD = 0x04
_WIDTH = 0x03
_MAX_VARINT = 5  # bytes of a varint below 2**35 (n < 2**32)


def forward_form(terms_blob: bytes) -> str:
    """"raw" (uint32 ids in the analyzer's order, before schema 11) or "packed"."""
    return "raw" if len(terms_blob) % 4 == 0 else "packed"


def pack_forward_many(ids: np.ndarray, tfs: np.ndarray, lens: Sequence[int] | np.ndarray,
                      decoded: list[tuple[np.ndarray, np.ndarray]] | None = None) -> list[tuple[bytes, bytes]]:
    """The packed (terms, tfs) blobs of each chunk: chunk ``i`` is ``lens[i]`` distinct term
    ids (in [0, 2**32)) of ``ids`` in the analyzer's order, with their ``tfs`` (capped at
    65535), after those of the chunks before it. In whole-array passes over the batch.
    ``decoded``: extended with each chunk's sorted term ids (uint32) and their tfs (uint16),
    what :func:`unpack_forward_many` would read back."""
    lens = np.asarray(lens, dtype=np.int64)
    rows = len(lens)
    if not rows:
        return []
    ids = np.asarray(ids, dtype=np.int64)
    tf = np.minimum(np.asarray(tfs, dtype=np.int64), 65535)
    total = len(ids)
    if total != int(lens.sum()) or len(tf) != total:
        raise ValueError("term ids, tfs and lengths disagree")
    if total and (int(ids.min()) < 0 or int(ids.max()) >= 1 << 32):
        raise OverflowError("a term id does not fit an unsigned 32-bit integer")
    if _cforward is not None and kernel.compiled() is not None:
        return _compiled_pack(ids, tf, lens, decoded)
    rowstart = np.zeros(rows + 1, np.int64)
    np.cumsum(lens, out=rowstart[1:])
    r = np.repeat(np.arange(rows, dtype=np.int64), lens)
    k = np.arange(total, dtype=np.int64) - rowstart[r]  # place within the chunk
    # sorted by (chunk, id): a chunk's entries keep their range, so r and k hold in sorted order too
    order = np.argsort((r << 32) | ids, kind="stable")
    sid = ids[order]
    stf = tf[order]
    perm = np.empty(total, np.int64)
    perm[order] = k  # each analyzer-order term's place among the sorted ids
    moved = np.bincount(r[perm != k], minlength=rows) > 0
    pw = np.where(moved, np.where(lens > 256, 2, 1), 0)
    nonempty = rowstart[:-1][lens > 0]
    gaps = np.diff(sid, prepend=0)
    gaps[nonempty] = sid[nonempty]
    big1 = gaps >= 255
    big2 = gaps >= 65535
    c1 = np.bincount(r[big1], minlength=rows)
    c2 = np.bincount(r[big2], minlength=rows)
    vl = np.ones(rows, np.int64)  # bytes of the varint n
    for j in range(1, _MAX_VARINT):
        vl += lens >= 1 << (7 * j)
    size = 1 + vl + pw * lens + lens + 2 * c1 + 4 * c2
    pad = (size % 4 == 0).astype(np.int64)
    size += pad
    off = np.zeros(rows + 1, np.int64)
    np.cumsum(size, out=off[1:])
    start = off[:-1]
    out = np.zeros(int(off[-1]), np.uint8)
    out[start] = pw | (pad << 2)
    for j in range(_MAX_VARINT):
        m = vl > j
        if not m.any():
            break
        byte = ((lens >> (7 * j)) & 127) | np.where(vl > j + 1, 128, 0)
        out[(start + 1 + j)[m]] = byte[m]
    pstart = start + 1 + vl
    rpw = pw[r]
    at = pstart[r]
    m = rpw == 1
    out[(at + k)[m]] = perm[m]
    m = rpw == 2
    out[(at + 2 * k)[m]] = perm[m] & 255
    out[(at + 2 * k + 1)[m]] = perm[m] >> 8
    gstart = pstart + pw * lens
    out[gstart[r] + k] = np.minimum(gaps, 255)
    e16 = gstart + lens
    if len(c1) and int(c1.sum()):
        e = np.flatnonzero(big1)
        re = r[e]
        rank = np.arange(len(e)) - (np.cumsum(c1) - c1)[re]
        v = np.minimum(gaps[e], 65535)
        loc = e16[re] + 2 * rank
        out[loc] = v & 255
        out[loc + 1] = v >> 8
    if len(c2) and int(c2.sum()):
        e = np.flatnonzero(big2)
        re = r[e]
        rank = np.arange(len(e)) - (np.cumsum(c2) - c2)[re]
        v = gaps[e]
        loc = (e16 + 2 * c1)[re] + 4 * rank
        for b in range(4):
            out[loc + b] = (v >> (8 * b)) & 255
    blob = out.tobytes()
    wide = np.zeros(rows, bool)
    if len(nonempty):
        wide[lens > 0] = np.maximum.reduceat(stf, nonempty) > 255
    tf1 = stf.astype("u1").tobytes()  # (a wide chunk's values wrap here: not used)
    tf2 = stf.astype("<u2").tobytes()
    ol, rl, wl = off.tolist(), rowstart.tolist(), wide.tolist()
    if decoded is not None:
        sid32, stf16 = sid.astype(np.uint32), stf.astype(np.uint16)
        decoded.extend((sid32[rl[i]:rl[i + 1]], stf16[rl[i]:rl[i + 1]]) for i in range(rows))
    return [(blob[ol[i]:ol[i + 1]], tf2[2 * rl[i]:2 * rl[i + 1]] if wl[i] else tf1[rl[i]:rl[i + 1]])
            for i in range(rows)]


def pack_forward_one(ids: array[int], tfs: array[int]) -> tuple[bytes, bytes, np.ndarray, np.ndarray]:
    """:func:`pack_forward_many` of one chunk from uint32 arrays (``array("I")``: its term ids
    in the analyzer's order and their counts): (terms blob, tfs blob, sorted ids as uint32,
    their tfs as uint16), the blobs and the ``decoded`` entry. A single add packs one chunk,
    where the numpy calls around the compiled encoder cost more than the packing."""
    if _cforward is not None and kernel.compiled() is not None:
        return _cforward.pack_one(ids, tfs)
    decoded: list[tuple[np.ndarray, np.ndarray]] = []
    (terms_blob, tfs_blob), = pack_forward_many(np.frombuffer(ids, np.uint32).astype(np.int64),
                                                np.frombuffer(tfs, np.uint32).astype(np.int64), [len(ids)], decoded)
    return terms_blob, tfs_blob, decoded[0][0], decoded[0][1]


def _compiled_pack(ids: np.ndarray, tf: np.ndarray, lens: np.ndarray,
                   decoded: list[tuple[np.ndarray, np.ndarray]] | None) -> list[tuple[bytes, bytes]]:
    """:func:`pack_forward_many` by the compiled encoder: the same bytes."""
    assert _cforward is not None
    rows, total = len(lens), len(ids)
    out = np.empty(7 * rows + 9 * total, np.uint8)
    tout = np.empty(2 * total, np.uint8)
    offsets = np.empty(rows + 1, np.int64)
    toffsets = np.empty(rows + 1, np.int64)
    sid = np.empty(total, np.uint32)
    stf = np.empty(total, np.uint16)
    if _cforward.encode(np.ascontiguousarray(ids, np.int64), np.ascontiguousarray(tf, np.int64),
                        np.ascontiguousarray(lens, np.int64), out, offsets, tout, toffsets, sid, stf) < 0:
        raise MemoryError("packing forward indexes")
    blob = out[:int(offsets[-1])].tobytes()
    tblob = tout[:int(toffsets[-1])].tobytes()
    ol, tl = offsets.tolist(), toffsets.tolist()
    if decoded is not None:
        s = np.zeros(rows + 1, np.int64)
        np.cumsum(lens, out=s[1:])
        sl = s.tolist()
        decoded.extend((sid[sl[i]:sl[i + 1]], stf[sl[i]:sl[i + 1]]) for i in range(rows))
    return [(blob[ol[i]:ol[i + 1]], tblob[tl[i]:tl[i + 1]]) for i in range(rows)]


def pack_forward(ids: Sequence[int] | np.ndarray, tfs: Sequence[int] | np.ndarray) -> tuple[bytes, bytes]:
    """:func:`pack_forward_many` of one chunk."""
    return pack_forward_many(np.asarray(ids, dtype=np.int64), np.asarray(tfs, dtype=np.int64), [len(ids)])[0]


def forward_term_ids(terms: Sequence[bytes]) -> list[np.ndarray]:
    """Each blob's term ids (``chunks.terms`` or ``chunk_log.terms``, either form; sorted when
    packed), as uint32 arrays: what deletes and document frequencies read."""
    return [ids for ids, _tfs in unpack_forward_many(terms).rows()]


def forward_term_lists(terms: Sequence[bytes]) -> list[list[int]]:
    """:func:`forward_term_ids` as lists of ints, for the few rows of a write (a delete, a
    replace): the compiled decoder makes them without numpy's per-call setup."""
    if _cforward is not None and kernel.compiled() is not None:
        found = _cforward.term_id_lists(list(terms))
        if found is not None:
            return cast("list[list[int]]", found)
        # a malformed row: the numpy path names it
    return [ids.tolist() for ids in forward_term_ids(terms)]


class ForwardBatch:
    """Decoded forward indexes of a batch of rows: row ``i``'s term ids and tfs are
    ``ids[starts[i]:starts[i + 1]]`` and ``tfs[...]`` (uint32 and uint16; tfs empty when
    not read), sorted by term id or in the analyzer's order as asked (raw rows keep their
    stored, analyzer order either way). ``problems[i]``: (what is wrong with row ``i``,
    details), or None; a bad row decodes as no terms."""

    __slots__ = ("ids", "tfs", "starts", "problems")

    def __init__(self, ids: np.ndarray, tfs: np.ndarray, starts: np.ndarray,
                 problems: list[tuple[str, str] | None]) -> None:
        self.ids, self.tfs, self.starts, self.problems = ids, tfs, starts, problems

    def rows(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """(term ids, tfs) of each row, views into the batch's arrays."""
        s = self.starts.tolist()
        ids, tfs = self.ids, self.tfs
        if not len(tfs) and len(ids):
            return [(ids[s[i]:s[i + 1]], tfs) for i in range(len(s) - 1)]
        return [(ids[s[i]:s[i + 1]], tfs[s[i]:s[i + 1]]) for i in range(len(s) - 1)]

    def lengths(self) -> np.ndarray:
        return np.diff(self.starts)


def unpack_forward_many(terms: Sequence[bytes], tfs: Sequence[bytes] | None = None, *,
                        analyzer_order: bool = False, check: bool = False,
                        column: str = "chunks.terms") -> ForwardBatch:
    """Decode the forward indexes of a batch of rows (``terms`` blobs, and their ``tfs`` blobs
    unless None: ``chunk_log.terms``), in either form, in whole-array passes.

    Every row's blob lengths are verified (so no read leaves a row's bytes); ``check`` also
    verifies the content (ids strictly increasing below 2**32, the permutation one). Without
    ``check`` a malformed row raises ValueError; with it, the row is reported in
    ``problems`` (naming ``column``) and decodes as empty (``ragdb.engine.check``)."""
    rows = len(terms)
    problems: list[tuple[str, str] | None] = [None] * rows
    tlen = np.fromiter((len(b) for b in terms), np.int64, rows)
    raw = tlen % 4 == 0
    if not check and _cforward is not None and kernel.compiled() is not None and not raw.all():
        fast = _compiled_batch(terms, tfs, tlen, analyzer_order)
        if fast is not None:
            return fast
        # a malformed row: the numpy path below names it
    n = np.where(raw, tlen // 4, 0)
    if tfs is not None:
        flen = np.fromiter((len(b) for b in tfs), np.int64, rows)
        bad = raw & (flen != 2 * n)
        for i in np.flatnonzero(bad).tolist():
            problems[i] = ("chunks.terms and chunks.tfs differ in length",
                           f"{n[i]} term ids, {flen[i]} bytes of tfs")
            n[i] = 0
    packed = np.flatnonzero(~raw)
    p_ids = p_tfs = p_starts = None
    if len(packed):
        p_ids, p_tfs, p_n, p_problems = _unpack_packed(
            [terms[i] for i in packed.tolist()], None if tfs is None else [tfs[i] for i in packed.tolist()],
            analyzer_order, check, column)
        n[packed] = p_n
        for j, problem in p_problems:
            problems[int(packed[j])] = problem
        p_starts = np.zeros(len(packed) + 1, np.int64)
        np.cumsum(p_n, out=p_starts[1:])
    starts = np.zeros(rows + 1, np.int64)
    np.cumsum(n, out=starts[1:])
    total = int(starts[-1])
    if not check:
        bad_rows = [p for p in problems if p]
        if bad_rows:
            raise ValueError(f"a malformed forward index: {bad_rows[0][0]} ({bad_rows[0][1]})")
    if not len(packed):  # every row raw (a database written before schema 11): views of the joined bytes
        ok = [i for i in range(rows) if not problems[i]] if check else range(rows)
        ids = np.frombuffer(b"".join([terms[i] for i in ok]), "<u4")
        tf = np.frombuffer(b"".join([tfs[i] for i in ok]), "<u2") if tfs is not None else np.zeros(0, np.uint16)
        return ForwardBatch(ids, tf, starts, problems)
    ids = np.empty(total, np.uint32)
    tf = np.empty(total if tfs is not None else 0, np.uint16)
    assert p_ids is not None and p_starts is not None and p_tfs is not None
    at = np.repeat(starts[packed] - p_starts[:-1], n[packed]) + np.arange(len(p_ids))
    ids[at] = p_ids
    if tfs is not None:
        tf[at] = p_tfs
    rawrows = np.flatnonzero(raw & (n > 0))
    if len(rawrows):
        rl = rawrows.tolist()
        rn = n[rawrows]
        at = np.repeat(starts[rawrows] - np.concatenate(([0], np.cumsum(rn)[:-1])), rn) + np.arange(int(rn.sum()))
        ids[at] = np.frombuffer(b"".join([terms[i] for i in rl]), "<u4")
        if tfs is not None:
            tf[at] = np.frombuffer(b"".join([tfs[i] for i in rl]), "<u2")
    return ForwardBatch(ids, tf, starts, problems)


def invert_compiled(entries: list[tuple[int, np.ndarray, np.ndarray]], wide_ids: bool
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """Forward indexes (chunk id, term ids, tfs) grouped by term by the compiled counting sort
    (``cforward.invert``): (distinct term ids, their starts, chunk ids, tfs), what
    ``ragdb.index.inverted._Tail.build`` makes with numpy, its reference. None where numpy is to
    do it: no compiled module or the numpy kernel chosen, entries not of the forward indexes'
    own types (uint32 term ids, uint16 tfs), or too few postings for the counting to pay."""
    if _cforward is None or kernel.compiled() is None:
        return None
    try:
        return cast("tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None",
                    _cforward.invert(entries, wide_ids))
    except (ValueError, TypeError):  # another type (a buffer mismatch) or lengths that disagree: numpy decides
        return None


def _compiled_batch(terms: Sequence[bytes], tfs: Sequence[bytes] | None, tlen: np.ndarray,
                    analyzer_order: bool) -> ForwardBatch | None:
    """:func:`unpack_forward_many` by the compiled decoder (None: a row is malformed)."""
    assert _cforward is not None
    rows = len(terms)
    offsets = np.zeros(rows + 1, np.int64)
    np.cumsum(tlen, out=offsets[1:])
    buf = np.frombuffer(b"".join(terms) + bytes(8), np.uint8)
    n = _cforward.counts(buf, offsets)
    if isinstance(n, int):
        return None
    starts = np.zeros(rows + 1, np.int64)
    np.cumsum(n, out=starts[1:])
    total = int(starts[-1])
    ids = np.empty(total, np.uint32)
    tf = np.empty(total if tfs is not None else 0, np.uint16)
    toffsets = np.zeros(rows + 1, np.int64)
    if tfs is not None:
        np.cumsum(np.fromiter((len(b) for b in tfs), np.int64, rows), out=toffsets[1:])
        tbuf = np.frombuffer(b"".join(tfs) + bytes(8), np.uint8)
    else:
        tbuf = np.zeros(8, np.uint8)
    if _cforward.decode(buf, offsets, n, tbuf, toffsets, tfs is not None, analyzer_order, ids, tf) >= 0:
        return None
    return ForwardBatch(ids, tf, starts, [None] * rows)


def _unpack_packed(terms: list[bytes], tfs: list[bytes] | None, analyzer_order: bool, check: bool, column: str
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[tuple[int, tuple[str, str]]]]:
    """(ids, tfs, n per row, [(row, (problem, details))]) of packed rows; a bad row has n 0."""
    rows = len(terms)
    problems: list[tuple[int, tuple[str, str]]] = []
    L = np.fromiter((len(b) for b in terms), np.int64, rows)
    off = np.zeros(rows + 1, np.int64)
    np.cumsum(L, out=off[1:])
    start = off[:-1]
    buf = np.frombuffer(b"".join(terms) + bytes(8), np.uint8)  # (8 spare bytes: a varint read past a short last row)
    flags = buf[start].astype(np.int64)
    pw = flags & _WIDTH
    pad = (flags >> 2) & 1
    n = np.zeros(rows, np.int64)
    vl = np.zeros(rows, np.int64)
    cont = np.ones(rows, bool)
    for j in range(_MAX_VARINT):
        b = buf[start + 1 + j].astype(np.int64)
        n |= np.where(cont, (b & 127) << (7 * j), 0)
        vl += cont
        cont &= b >= 128
        if not cont.any():
            break
    fixed = 1 + vl + pw * n + n + pad  # the bytes besides the escapes
    bad = np.zeros(rows, bool)

    def report(mask: np.ndarray, what: str, whole: bool = False) -> None:
        for i in np.flatnonzero(mask & ~bad).tolist():
            problems.append((i, (what if whole else f"{column} is not a packed forward index: {what}",
                                 f"{int(L[i])} bytes, flags {int(flags[i])}, {int(n[i])} terms")))
        bad[mask] = True

    report((flags & ~(_WIDTH | PAD)) != 0, "unknown flags")
    report(pw == 3, "an unknown permutation width")
    report(cont | (n >= 1 << 32), "no valid term count")
    report((pw == 1) & (n > 256), "a one-byte permutation of over 256 terms")
    report(fixed > L, "shorter than its terms need")
    if tfs is not None:
        flen = np.fromiter((len(b) for b in tfs), np.int64, rows)
        report((flen != n) & (flen != 2 * n), "chunks.tfs is not as many uint8 or uint16 values as chunks.terms has terms",
               whole=True)
    n = np.where(bad, 0, n)
    total = int(n.sum())
    rowstart = np.zeros(rows + 1, np.int64)
    np.cumsum(n, out=rowstart[1:])
    r = np.repeat(np.arange(rows, dtype=np.int64), n)
    k = np.arange(total, dtype=np.int64) - rowstart[r]
    pstart = start + 1 + vl
    gstart = pstart + pw * n
    top = len(buf) - 1
    gaps = buf[gstart[r] + k].astype(np.int64)
    e = np.flatnonzero(gaps == 255)
    re = r[e]
    c1 = np.bincount(re, minlength=rows)
    e16 = gstart + n
    loc = np.minimum(e16[re] + 2 * (np.arange(len(e)) - (np.cumsum(c1) - c1)[re]), top - 1)
    v16 = buf[loc].astype(np.int64) | (buf[loc + 1].astype(np.int64) << 8)
    gaps[e] = v16
    e2 = e[v16 == 65535]
    re2 = r[e2]
    c2 = np.bincount(re2, minlength=rows)
    loc = np.minimum((e16 + 2 * c1)[re2] + 4 * (np.arange(len(e2)) - (np.cumsum(c2) - c2)[re2]), top - 3)
    gaps[e2] = (buf[loc].astype(np.int64) | (buf[loc + 1].astype(np.int64) << 8)
                | (buf[loc + 2].astype(np.int64) << 16) | (buf[loc + 3].astype(np.int64) << 24))
    size = fixed + 2 * c1 + 4 * c2
    report(size != L, "not the length its terms and their escapes take")
    report(pad != ((size - pad) % 4 == 0), "a pad byte where none belongs, or none where one does")
    report((pad == 1) & (buf[np.minimum(off[1:] - 1, top)] != 0), "a pad byte that is not 0")
    cs = np.cumsum(gaps)
    ids = cs - np.repeat(np.concatenate(([0], cs))[rowstart[:-1]], n)
    if check and total:
        later = k > 0
        report(np.bincount(r[later & (gaps <= 0)], minlength=rows) > 0, "term ids not strictly increasing")
        last = rowstart[1:][n > 0] - 1
        top_id = np.zeros(rows, np.int64)
        top_id[n > 0] = ids[last]
        report(top_id >= 1 << 32, "a term id of 2**32 or more")
    perm = None
    if (analyzer_order or check) and total:
        rpw = pw[r]
        at = pstart[r]
        perm = k.copy()  # rows without a permutation: the sorted order
        m = rpw == 1
        perm[m] = buf[at[m] + k[m]]
        m = rpw == 2
        perm[m] = buf[at[m] + 2 * k[m]].astype(np.int64) | (buf[at[m] + 2 * k[m] + 1].astype(np.int64) << 8)
        out_of_range = perm >= n[r]  # (read past its row's terms in the analyzer's order: always looked at)
        report(np.bincount(r[out_of_range], minlength=rows) > 0, "a permutation past its terms")
        if check:
            hits = np.bincount(rowstart[r] + np.minimum(perm, n[r] - 1), minlength=total)
            report(np.bincount(r[hits != 1], minlength=rows) > 0, "a permutation that is not one")
    tf = np.zeros(0, np.uint16)
    if tfs is not None:
        flen = np.fromiter((len(b) for b in tfs), np.int64, rows)
        tbuf = np.frombuffer(b"".join(tfs) + bytes(2), np.uint8)
        toff = np.zeros(rows + 1, np.int64)
        np.cumsum(flen, out=toff[1:])
        wide = (flen == 2 * n) & (n > 0)
        rw = wide[r]
        at = toff[:-1][r] + np.where(rw, 2 * k, k)
        tf = (tbuf[at].astype(np.uint16) | np.where(rw, tbuf[at + 1].astype(np.uint16) << 8, 0)).astype(np.uint16)
    if bad.any():  # rows found bad after their terms were read: dropped from the outputs
        keep = ~bad[r] if total else np.zeros(0, bool)
        ids, r, k = ids[keep], r[keep], k[keep]
        if perm is not None:
            perm = perm[keep]
        if tfs is not None:
            tf = tf[keep]
        n = np.where(bad, 0, n)
        rowstart = np.zeros(rows + 1, np.int64)
        np.cumsum(n, out=rowstart[1:])
    if analyzer_order and perm is not None and len(ids):
        src = rowstart[r] + perm
        ids = ids[src]
        if tfs is not None:
            tf = tf[src]
    return ids.astype(np.uint32), tf, n, problems
