# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Decoding forward indexes in C: the rows' bytes read once, where numpy's whole-array passes
(:func:`ragdb.index.forward.unpack_forward_many`, the reference and the fallback) make some
twenty passes over index arrays (the TF-IDF norms of 100k chunks decode ~12M terms).

The same values as the numpy path. Every read stays inside its row: a row whose bytes do not
fit its layout (or, in the analyzer's order, whose permutation points past its terms) stops
the decoding with its row number, and the caller reads the batch with numpy to report it.
"""

from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t, int64_t
from libc.stdlib cimport malloc, free
from libc.string cimport memcpy
from cpython.bytes cimport PyBytes_FromStringAndSize

import numpy as np


cdef inline int64_t _header(const uint8_t* b, int64_t length, int64_t* n_out, int64_t* vl_out) noexcept nogil:
    """The term count of a packed row (its varint), or -1 when the header does not parse."""
    cdef int64_t n = 0, j
    cdef uint8_t byte
    if length < 2 or (b[0] & 0xF8) != 0 or (b[0] & 3) == 3:
        return -1
    for j in range(5):
        if 1 + j >= length:
            return -1
        byte = b[1 + j]
        n |= (<int64_t>(byte & 127)) << (7 * j)
        if byte < 128:
            if n >= (<int64_t>1) << 32:
                return -1
            n_out[0] = n
            vl_out[0] = j + 1
            return 0
    return -1


def counts(const uint8_t[::1] buf, const int64_t[::1] offsets):
    """Each row's number of terms (raw rows: length / 4), or (-1 - row) for the first row
    whose header does not parse."""
    cdef Py_ssize_t rows = offsets.shape[0] - 1, i
    out = np.empty(rows, np.int64)
    cdef int64_t[::1] n = out
    cdef int64_t length, vl = 0, cnt = 0
    cdef Py_ssize_t bad = -1
    with nogil:
        for i in range(rows):
            length = offsets[i + 1] - offsets[i]
            if length % 4 == 0:
                n[i] = length // 4
            elif _header(&buf[offsets[i]], length, &cnt, &vl) < 0:
                bad = i
                break
            else:
                n[i] = cnt
    return out if bad < 0 else -1 - bad


def decode(const uint8_t[::1] buf, const int64_t[::1] offsets, const int64_t[::1] n,
           const uint8_t[::1] tbuf, const int64_t[::1] toffsets, bint with_tfs, bint analyzer_order,
           uint32_t[::1] ids, uint16_t[::1] tfs):
    """Decode every row into ``ids`` and (``with_tfs``) ``tfs`` at the rows' places (the
    cumulative sums of ``n``). Returns -1, or the first row that is malformed."""
    cdef Py_ssize_t bad
    with nogil:
        bad = _decode(buf, offsets, n, tbuf, toffsets, with_tfs, analyzer_order, ids, tfs)
    return bad


cdef Py_ssize_t _decode(const uint8_t[::1] buf, const int64_t[::1] offsets, const int64_t[::1] n,
                        const uint8_t[::1] tbuf, const int64_t[::1] toffsets, bint with_tfs, bint analyzer_order,
                        uint32_t[::1] ids, uint16_t[::1] tfs) noexcept nogil:
    cdef Py_ssize_t rows = offsets.shape[0] - 1, i
    cdef int64_t at = 0, length, k, m, pw, pad, vl, cnt, e16, e32, pos, p, tlen, wide
    cdef const uint8_t* b
    cdef const uint8_t* g
    cdef const uint8_t* perm
    cdef const uint8_t* esc16
    cdef const uint8_t* esc32
    cdef const uint8_t* t
    cdef uint64_t acc, gap
    cdef uint32_t sorted_ids[256]
    cdef uint16_t sorted_tfs[256]
    cdef uint32_t* sid
    cdef uint16_t* stf
    cdef uint32_t* big_ids = NULL
    cdef uint16_t* big_tfs = NULL
    cdef Py_ssize_t bad = -1
    for i in range(rows):
        b = &buf[offsets[i]]
        length = offsets[i + 1] - offsets[i]
        m = n[i]
        t = &tbuf[toffsets[i]] if with_tfs else NULL
        tlen = toffsets[i + 1] - toffsets[i] if with_tfs else 0
        if length % 4 == 0:  # raw: uint32 ids and uint16 tfs, in the analyzer's order
            if with_tfs and tlen != 2 * m:
                bad = i
                break
            memcpy(&ids[at], b, 4 * m)
            if with_tfs:
                memcpy(&tfs[at], t, 2 * m)
            at += m
            continue
        if _header(b, length, &cnt, &vl) < 0 or cnt != m:
            bad = i
            break
        pw = b[0] & 3
        pad = (b[0] >> 2) & 1
        if pw == 1 and m > 256:
            bad = i
            break
        if 1 + vl + pw * m + m + pad > length:
            bad = i
            break
        if with_tfs and tlen != m and tlen != 2 * m:
            bad = i
            break
        wide = with_tfs and tlen == 2 * m and m > 0
        perm = b + 1 + vl
        g = perm + pw * m
        esc16 = g + m
        e16 = 0
        for k in range(m):  # the escapes: where the uint32 ones start
            if g[k] == 255:
                e16 += 1
        if 1 + vl + pw * m + m + 2 * e16 + pad > length:
            bad = i
            break
        esc32 = esc16 + 2 * e16
        e32 = 0
        for k in range(e16):
            if esc16[2 * k] == 255 and esc16[2 * k + 1] == 255:
                e32 += 1
        if 1 + vl + pw * m + m + 2 * e16 + 4 * e32 + pad != length:
            bad = i
            break
        # the sorted ids (and tfs): in place, or in a work array when the order is permuted
        if analyzer_order and pw:
            if m > 256:
                free(big_ids)
                free(big_tfs)
                big_ids = <uint32_t*>malloc(4 * m)
                big_tfs = <uint16_t*>malloc(2 * m)
                if big_ids == NULL or big_tfs == NULL:
                    bad = i
                    break
                sid = big_ids
                stf = big_tfs
            else:
                sid = sorted_ids
                stf = sorted_tfs
        else:
            sid = <uint32_t*>&ids[at]
            stf = <uint16_t*>&tfs[at] if with_tfs else NULL
        acc = 0
        e16 = 0
        e32 = 0
        for k in range(m):
            gap = g[k]
            if gap == 255:
                gap = esc16[2 * e16] | (<uint64_t>esc16[2 * e16 + 1] << 8)
                e16 += 1
                if gap == 65535:
                    pos = 4 * e32
                    gap = (esc32[pos] | (<uint64_t>esc32[pos + 1] << 8) | (<uint64_t>esc32[pos + 2] << 16)
                           | (<uint64_t>esc32[pos + 3] << 24))
                    e32 += 1
            acc += gap
            sid[k] = <uint32_t>acc
            if with_tfs:
                stf[k] = (t[2 * k] | (<uint16_t>t[2 * k + 1] << 8)) if wide else t[k]
        if acc >= (<uint64_t>1) << 32:
            bad = i
            break
        if analyzer_order and pw:
            for k in range(m):
                p = perm[k] if pw == 1 else (perm[2 * k] | (<int64_t>perm[2 * k + 1] << 8))
                if p >= m:
                    bad = i
                    break
                ids[at + k] = sid[p]
                if with_tfs:
                    tfs[at + k] = stf[p]
            if bad >= 0:
                break
        at += m
    free(big_ids)
    free(big_tfs)
    return bad


cdef void _sort(uint64_t* a, int64_t n) noexcept nogil:
    """Sort ``a[:n]`` ascending (distinct keys): quicksort, median of three, insertion sort
    for short runs; recursing into the shorter side keeps the depth at log2(n). (qsort's
    comparison callback had been most of the encoding's time.)"""
    cdef int64_t i, j, lo = 0, hi = n - 1, mid
    cdef uint64_t pivot, tmp
    while hi - lo > 16:
        mid = lo + (hi - lo) // 2
        if a[mid] < a[lo]:
            tmp = a[mid]; a[mid] = a[lo]; a[lo] = tmp
        if a[hi] < a[lo]:
            tmp = a[hi]; a[hi] = a[lo]; a[lo] = tmp
        if a[hi] < a[mid]:
            tmp = a[hi]; a[hi] = a[mid]; a[mid] = tmp
        pivot = a[mid]
        i = lo
        j = hi
        while i <= j:
            while a[i] < pivot:
                i += 1
            while a[j] > pivot:
                j -= 1
            if i <= j:
                tmp = a[i]; a[i] = a[j]; a[j] = tmp
                i += 1
                j -= 1
        if j - lo < hi - i:
            _sort(a + lo, j - lo + 1)
            lo = i
        else:
            _sort(a + i, hi - i + 1)
            hi = j
    for i in range(lo + 1, hi + 1):
        tmp = a[i]
        j = i - 1
        while j >= lo and a[j] > tmp:
            a[j + 1] = a[j]
            j -= 1
        a[j + 1] = tmp


cdef int _encode(const int64_t* ids, const int64_t* tfs, const int64_t* lens, Py_ssize_t rows,
                 uint8_t* out, int64_t* offsets, uint8_t* tout, int64_t* toffsets,
                 uint32_t* sid, uint16_t* stf) noexcept nogil:
    """The body of :func:`encode` (and of :func:`pack_one`), on raw arrays."""
    cdef Py_ssize_t i
    cdef int64_t at = 0, w = 0, tw = 0, m, k, pw, vl, e16, e32, size, pad, j, moved, p, v
    cdef uint64_t gap, prev
    cdef uint64_t* keys = NULL
    cdef int64_t cap = 0
    cdef int64_t* perm = NULL
    cdef uint8_t* o
    cdef int wide
    cdef int status = 0
    offsets[0] = 0
    toffsets[0] = 0
    for i in range(rows):
        m = lens[i]
        if m > cap:
            free(keys)
            free(perm)
            cap = m if m > 2 * cap else 2 * cap
            keys = <uint64_t*>malloc(8 * cap)
            perm = <int64_t*>malloc(8 * cap)
            if keys == NULL or perm == NULL:
                status = -1
                break
        for k in range(m):
            keys[k] = (<uint64_t>ids[at + k] << 32) | <uint64_t>k
        _sort(keys, m)
        moved = 0
        e16 = 0
        e32 = 0
        prev = 0
        wide = 0
        for k in range(m):
            p = <int64_t>(<uint32_t>keys[k])  # (the low half: the analyzer place)
            perm[p] = k
            if p != k:
                moved = 1
            gap = (keys[k] >> 32) - prev
            prev = keys[k] >> 32
            if gap >= 255:
                e16 += 1
                if gap >= 65535:
                    e32 += 1
            sid[at + k] = <uint32_t>prev
            stf[at + k] = <uint16_t>tfs[at + p]
            if tfs[at + p] > 255:
                wide = 1
        pw = 0 if not moved else (1 if m <= 256 else 2)
        vl = 1
        for j in range(1, 5):
            if m >= (<int64_t>1) << (7 * j):
                vl += 1
        size = 1 + vl + pw * m + m + 2 * e16 + 4 * e32
        pad = 1 if size % 4 == 0 else 0
        size += pad
        o = &out[w]
        o[0] = <uint8_t>(pw | (pad << 2))
        v = m
        for j in range(vl):
            o[1 + j] = <uint8_t>((v & 127) | (128 if j + 1 < vl else 0))
            v >>= 7
        o += 1 + vl
        if pw == 1:
            for k in range(m):
                o[k] = <uint8_t>perm[k]
        elif pw == 2:
            for k in range(m):
                o[2 * k] = <uint8_t>(perm[k] & 255)
                o[2 * k + 1] = <uint8_t>(perm[k] >> 8)
        o += pw * m
        # gaps, then the uint16 escapes, then the uint32 ones
        e16 = 0
        e32 = 0
        prev = 0
        for k in range(m):
            gap = (keys[k] >> 32) - prev
            prev = keys[k] >> 32
            o[k] = <uint8_t>(gap if gap < 255 else 255)
        o += m
        prev = 0
        for k in range(m):
            gap = (keys[k] >> 32) - prev
            prev = keys[k] >> 32
            if gap >= 255:
                v = <int64_t>(gap if gap < 65535 else 65535)
                o[0] = <uint8_t>(v & 255)
                o[1] = <uint8_t>(v >> 8)
                o += 2
        prev = 0
        for k in range(m):
            gap = (keys[k] >> 32) - prev
            prev = keys[k] >> 32
            if gap >= 65535:
                o[0] = <uint8_t>(gap & 255)
                o[1] = <uint8_t>((gap >> 8) & 255)
                o[2] = <uint8_t>((gap >> 16) & 255)
                o[3] = <uint8_t>((gap >> 24) & 255)
                o += 4
        if pad:
            o[0] = 0
        w += size
        offsets[i + 1] = w
        if wide:
            for k in range(m):
                tout[tw + 2 * k] = <uint8_t>(stf[at + k] & 255)
                tout[tw + 2 * k + 1] = <uint8_t>(stf[at + k] >> 8)
            tw += 2 * m
        else:
            for k in range(m):
                tout[tw + k] = <uint8_t>stf[at + k]
            tw += m
        toffsets[i + 1] = tw
        at += m
    free(keys)
    free(perm)
    return status


def encode(const int64_t[::1] ids, const int64_t[::1] tfs, const int64_t[::1] lens,
           uint8_t[::1] out, int64_t[::1] offsets, uint8_t[::1] tout, int64_t[::1] toffsets,
           uint32_t[::1] sid, uint16_t[::1] stf):
    """:func:`ragdb.index.forward.pack_forward_many` in C, the same bytes: each row's packed
    terms blob into ``out`` (from ``offsets[i]`` to ``offsets[i + 1]``), its tfs blob into
    ``tout`` (``toffsets``), its sorted ids and tfs into ``sid``/``stf``. ``ids`` in [0, 2**32),
    ``tfs`` capped at 65535 by the caller; ``out`` holds 7 * rows + 9 * len(ids) bytes and
    ``tout`` 2 * len(ids). Returns 0, or -1 when memory ran out."""
    cdef int status
    with nogil:
        status = _encode(&ids[0] if ids.shape[0] else NULL, &tfs[0] if tfs.shape[0] else NULL,
                         &lens[0] if lens.shape[0] else NULL, lens.shape[0],
                         &out[0] if out.shape[0] else NULL, &offsets[0],
                         &tout[0] if tout.shape[0] else NULL, &toffsets[0],
                         &sid[0] if sid.shape[0] else NULL, &stf[0] if stf.shape[0] else NULL)
    return status


def pack_one(const uint32_t[::1] ids, const uint32_t[::1] tfs):
    """:func:`encode` of one chunk, without the arrays around it (a single add packs one
    chunk: the numpy calls around ``encode`` cost more than the packing): ``ids`` its term ids
    in the analyzer's order, ``tfs`` their counts (capped at 65535 here). Returns (terms blob,
    tfs blob, sorted ids as uint32, their tfs as uint16): :func:`ragdb.index.forward.pack_forward_many`'s
    bytes and ``decoded`` entry."""
    cdef Py_ssize_t m = ids.shape[0], k
    cdef int64_t lens = m
    cdef int64_t offsets[2]
    cdef int64_t toffsets[2]
    cdef int64_t* ids64 = NULL
    cdef int64_t* tfs64 = NULL
    cdef uint8_t* out = NULL
    cdef uint8_t* tout = NULL
    cdef int status
    if tfs.shape[0] != m:
        raise ValueError(f"{m} term ids and {tfs.shape[0]} counts")
    sid = np.empty(m, np.uint32)
    stf = np.empty(m, np.uint16)
    cdef uint32_t[::1] sv = sid
    cdef uint16_t[::1] tv = stf
    try:
        ids64 = <int64_t*>malloc((m + 1) * sizeof(int64_t))
        tfs64 = <int64_t*>malloc((m + 1) * sizeof(int64_t))
        out = <uint8_t*>malloc(7 + 9 * m)
        tout = <uint8_t*>malloc(2 * m + 1)
        if ids64 == NULL or tfs64 == NULL or out == NULL or tout == NULL:
            raise MemoryError()
        for k in range(m):
            ids64[k] = ids[k]
            tfs64[k] = tfs[k] if tfs[k] < 65535 else 65535
        with nogil:
            status = _encode(ids64, tfs64, &lens, 1, out, offsets, tout, toffsets,
                             &sv[0] if m else NULL, &tv[0] if m else NULL)
        if status < 0:
            raise MemoryError()
        return (PyBytes_FromStringAndSize(<char*>out, offsets[1]),
                PyBytes_FromStringAndSize(<char*>tout, toffsets[1]), sid, stf)
    finally:
        free(ids64); free(tfs64); free(out); free(tout)


def invert(list entries, bint wide_ids):
    """The postings of forward indexes, grouped by term (CSR), by a counting sort: ``entries``
    are (chunk id, term ids (uint32), tfs (uint16)); returns (the distinct term ids ascending
    (int64), where each one's postings start (int64, one more at the end), the postings' chunk
    ids (uint32; int64 with ``wide_ids``) and tfs (uint16)), a term's postings in the entries'
    order: what ``inverted._Tail.build``'s stable sort gives (its reference), without the
    concatenated copies and the int64 order array (some 24 bytes a posting at once: a bulk
    load's flush of 16,384 chunks sorts ~3M). None when the counts would cost more than the
    sort: fewer postings than half the highest term id (a few chunks' tail in a large
    vocabulary: the counts take 8 bytes a term id up to the highest, at most 16 a posting), or
    no postings. Raises ValueError for an entry of other types or lengths."""
    cdef Py_ssize_t n = len(entries), i, j, m, total = 0, nterms = 0
    cdef int64_t t, top = -1
    cdef const uint32_t[::1] terms
    cdef int64_t* place = NULL
    for i in range(n):
        terms = entries[i][1]
        m = terms.shape[0]
        if len(entries[i][2]) != m:
            raise ValueError(f"{m} term ids and {len(entries[i][2])} tfs")
        total += m
        for j in range(m):
            if terms[j] > top:
                top = terms[j]
    if total == 0 or total * 2 < top:
        return None
    place = <int64_t*>malloc((top + 1) * sizeof(int64_t))
    if place == NULL:
        raise MemoryError()
    try:
        for t in range(top + 1):
            place[t] = 0
        for i in range(n):
            terms = entries[i][1]
            for j in range(terms.shape[0]):
                place[terms[j]] += 1
        for t in range(top + 1):
            if place[t]:
                nterms += 1
        term_ids = np.empty(nterms, np.int64)
        starts = np.empty(nterms + 1, np.int64)
        cids = np.empty(total, np.int64 if wide_ids else np.uint32)
        tfs = np.empty(total, np.uint16)
        _fill_starts(place, top, term_ids, starts)
        if wide_ids:
            _scatter[int64_t](entries, place, cids, tfs)
        else:
            _scatter[uint32_t](entries, place, cids, tfs)
        return term_ids, starts, cids, tfs
    finally:
        free(place)

cdef void _fill_starts(int64_t* place, int64_t top_term, int64_t[::1] term_ids, int64_t[::1] starts) noexcept:
    """Each term's first position, into ``place`` (which held its count) and ``starts``."""
    cdef int64_t t, c, pos = 0
    cdef Py_ssize_t u = 0
    for t in range(top_term + 1):
        c = place[t]
        if c:
            term_ids[u] = t
            starts[u] = pos
            place[t] = pos
            pos += c
            u += 1
    starts[u] = pos


ctypedef fused chunk_id_t:  # the chunk ids' type: uint32 while they fit, else int64
    uint32_t
    int64_t


cdef _scatter(list entries, int64_t* place, chunk_id_t[::1] cids, uint16_t[::1] out_tfs):
    """Each entry's postings to their term's next place (``place``: each term's first, advanced)."""
    cdef Py_ssize_t i, j, p
    cdef chunk_id_t cid
    cdef const uint32_t[::1] terms
    cdef const uint16_t[::1] tf
    for i in range(len(entries)):
        cid = entries[i][0]
        terms = entries[i][1]
        tf = entries[i][2]
        for j in range(terms.shape[0]):
            p = place[terms[j]]
            place[terms[j]] = p + 1
            cids[p] = cid
            out_tfs[p] = tf[j]

def term_id_lists(list blobs):
    """Each forward-index blob's term ids (either form; sorted when packed) as a list of ints,
    what ``forward_term_ids(blobs)[i].tolist()`` gives; None when a blob is malformed (the caller
    reads the batch with numpy to report it). For the few rows of a delete: no numpy arrays
    (their setup was most of a one-chunk delete's decoding, ~25 µs)."""
    cdef Py_ssize_t i, k, rows = len(blobs)
    cdef int64_t length, m, vl = 0
    cdef bytes blob
    cdef uint32_t[::1] ids_view
    cdef uint16_t[::1] no_tfs
    cdef int64_t[::1] offs, ns, toffs
    out = []
    no_tfs = np.empty(0, np.uint16)
    tbuf = np.zeros(8, np.uint8)
    toffs = np.zeros(2, np.int64)
    offs = np.zeros(2, np.int64)
    ns = np.zeros(1, np.int64)
    for i in range(rows):
        blob = blobs[i]
        length = len(blob)
        if length % 4 == 0:
            m = length // 4
        elif _header(<const uint8_t*><char*>blob, length, &m, &vl) < 0:
            return None
        ids = np.empty(m, np.uint32)
        ids_view = ids
        offs[1] = length
        ns[0] = m
        buf = np.frombuffer(blob + bytes(8), np.uint8)
        if _decode(buf, offs, ns, tbuf, toffs, False, False, ids_view, no_tfs) >= 0:
            return None
        out.append(ids.tolist())
    return out
