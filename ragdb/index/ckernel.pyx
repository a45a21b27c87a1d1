# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The compiled scoring kernel: BM25 accumulation and top-k selection in C, without the GIL.

The numpy path in :mod:`ragdb.index.inverted` and :mod:`ragdb.engine.search` is the reference;
this module does the very same floating-point operations in the same order, so its scores are
bit for bit numpy's (setup.py compiles it without floating-point contraction: no fused
multiply-add):

* a term's contribution to a chunk: ``t = float(tf); s = t * idf; s = s / (t + norm); s = s * weight``
  (numpy: ``tf *= idf; tf /= tf + norm`` then ``* weight``), where ``norm`` is the chunk's BM25
  length part, or ``k1`` for a field's unit;
* the chunk's score: the contributions added to 0.0 term by term, in query order
  (numpy: ``scores[ids] += w`` per term);
* top k: the chunks a mask allows with a score above 0 (and at least a floor), the ``k`` best plus
  any tied with the k-th, by score descending then chunk id (numpy: ``argpartition``, ``lexsort``).

Postings arrive as any buffer (numpy arrays): chunk ids as uint32 or int64, term frequencies as
uint8, uint16 or int64, read in place. Each term's loop runs with the GIL released, so threads
searching at once score in parallel.
"""

from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_C_CONTIGUOUS, PyBUF_FORMAT
from libc.stdint cimport int8_t, uint8_t, uint16_t, uint32_t, uint64_t, int64_t
from libc.stdlib cimport malloc, calloc, free, qsort, realloc
from libc.string cimport memset
from cpython.pyport cimport PY_SSIZE_T_MAX

import numpy as np

ctypedef fused ids_t:
    uint32_t
    int64_t

ctypedef fused tfs_t:
    uint8_t
    uint16_t
    int64_t


cdef Py_ssize_t _bm25_term(double* scores, Py_ssize_t n, const double* norm, const ids_t* ids,
                           const tfs_t* tfs, Py_ssize_t m, double idf, double weight, double flat,
                           bint use_flat) noexcept nogil:
    """Add one term's BM25 contributions; the index of the first posting whose chunk id is out
    of range (nothing after it is added), or -1."""
    cdef Py_ssize_t j
    cdef int64_t c
    cdef double t, s
    for j in range(m):
        c = <int64_t>ids[j]
        if c < 0 or c >= n:
            return j
        t = <double>tfs[j]
        s = t * idf
        if use_flat:
            s = s / (t + flat)
        else:
            s = s / (t + norm[c])
        s = s * weight
        scores[c] += s
    return -1


cdef Py_ssize_t _dispatch_tfs(double* scores, Py_ssize_t n, const double* norm, const ids_t* ids,
                              Py_buffer* tb, Py_ssize_t m, double idf, double weight, double flat,
                              bint use_flat) noexcept nogil:
    if tb.itemsize == 1:
        return _bm25_term(scores, n, norm, ids, <const uint8_t*>tb.buf, m, idf, weight, flat, use_flat)
    if tb.itemsize == 2:
        return _bm25_term(scores, n, norm, ids, <const uint16_t*>tb.buf, m, idf, weight, flat, use_flat)
    return _bm25_term(scores, n, norm, ids, <const int64_t*>tb.buf, m, idf, weight, flat, use_flat)


cdef int _kind(Py_buffer* b, bytes allowed) except -1:
    """Check a buffer holds one of the integer formats ``allowed`` (struct codes of its size)."""
    cdef bytes fmt = b.format if b.format != NULL else b"B"
    code = fmt.lstrip(b"<=@")
    if len(code) != 1 or code not in allowed:
        raise TypeError(f"a postings array of format {fmt!r}, expected one of {allowed!r}")
    if code in b"lq" and b.itemsize != 8:
        raise TypeError(f"a postings array of {b.itemsize}-byte items of format {fmt!r}")
    return 0


def bm25_accumulate(double[::1] scores, const double[::1] norm, list postings, list idfs, list weights,
                    list flats, double flat):
    """Zero ``scores``, then add every term's BM25 contributions in order: ``postings[i]`` is
    (chunk ids, tfs) or None, ``idfs[i]`` and ``weights[i]`` its IDF and weight, ``flats[i]``
    True for a field's unit (length part ``flat``, i.e. k1, instead of ``norm[chunk]``)."""
    cdef Py_ssize_t n = scores.shape[0]
    cdef Py_ssize_t i, m, bad
    cdef Py_buffer ib, tb
    cdef double idf, weight
    cdef bint use_flat
    cdef double* out = &scores[0] if n else NULL
    cdef const double* nrm = &norm[0] if norm.shape[0] else NULL
    if norm.shape[0] < n:
        raise ValueError("a length norm array shorter than the score array")
    with nogil:
        if n:
            memset(out, 0, n * sizeof(double))
    for i in range(len(postings)):
        p = postings[i]
        if p is None:
            continue
        idf = idfs[i]
        weight = weights[i]
        use_flat = flats[i]
        PyObject_GetBuffer(p[0], &ib, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT)
        try:
            PyObject_GetBuffer(p[1], &tb, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT)
            try:
                _kind(&ib, b"Ilq")
                _kind(&tb, b"BHlq")
                m = ib.len // ib.itemsize
                if tb.len // tb.itemsize != m:
                    raise ValueError(f"{m} chunk ids and {tb.len // tb.itemsize} term frequencies")
                with nogil:
                    if ib.itemsize == 4:
                        bad = _dispatch_tfs(out, n, nrm, <const uint32_t*>ib.buf, &tb, m, idf, weight, flat, use_flat)
                    else:
                        bad = _dispatch_tfs(out, n, nrm, <const int64_t*>ib.buf, &tb, m, idf, weight, flat, use_flat)
                if bad >= 0:
                    raise IndexError(f"a posting's chunk id is outside the {n} chunks scored")
            finally:
                PyBuffer_Release(&tb)
        finally:
            PyBuffer_Release(&ib)


ctypedef struct _Hit:
    double score
    int64_t id


cdef int _by_score(const void* a, const void* b) noexcept nogil:
    cdef const _Hit* x = <const _Hit*>a
    cdef const _Hit* y = <const _Hit*>b
    if x.score > y.score:
        return -1
    if x.score < y.score:
        return 1
    return (x.id > y.id) - (x.id < y.id)


cdef void _sift_down(double* heap, Py_ssize_t size, Py_ssize_t i) noexcept nogil:
    cdef Py_ssize_t child
    cdef double v = heap[i]
    while True:
        child = 2 * i + 1
        if child >= size:
            break
        if child + 1 < size and heap[child + 1] < heap[child]:
            child += 1
        if heap[child] >= v:
            break
        heap[i] = heap[child]
        i = child
    heap[i] = v


def top_k(const double[::1] scores, const uint8_t[::1] mask, Py_ssize_t k, double floor):
    """(chunk ids int64, scores float64) of the chunks ``mask`` allows whose score is above 0 and at
    least ``floor``: the ``k`` best and any tied with the k-th, best first, equal scores by id."""
    cdef Py_ssize_t n = min(scores.shape[0], mask.shape[0])
    cdef Py_ssize_t i, j, count = 0, size = 0, cap
    cdef double s, kth = 0.0
    cdef double* heap
    cdef int64_t* cand
    cdef _Hit* hits
    cdef bint keep
    if k < 1:
        raise ValueError(f"k must be at least 1, not {k}")
    cand = <int64_t*>malloc((n if n else 1) * sizeof(int64_t))
    heap = <double*>malloc((min(k, n) if n else 1) * sizeof(double))
    if cand == NULL or heap == NULL:
        free(cand)
        free(heap)
        raise MemoryError()
    try:
        with nogil:
            # the chunks that qualify, without a branch per chunk (most chunks score 0)
            for i in range(n):
                s = scores[i]
                keep = (mask[i] != 0) & (s > 0.0) & (s >= floor)
                cand[count] = i
                count += keep
            if count > k:
                # the k-th best score: a min-heap of the k best
                for j in range(k):
                    heap[j] = scores[cand[j]]
                for j in range(k // 2 - 1, -1, -1):
                    _sift_down(heap, k, j)
                for j in range(k, count):
                    s = scores[cand[j]]
                    if s > heap[0]:
                        heap[0] = s
                        _sift_down(heap, k, 0)
                kth = heap[0]
                for j in range(count):  # those at least as good as the k-th: ties at the cut stay
                    i = cand[j]
                    cand[size] = i
                    size += scores[i] >= kth
            else:
                size = count
        hits = <_Hit*>malloc((size if size else 1) * sizeof(_Hit))
        if hits == NULL:
            raise MemoryError()
        try:
            with nogil:
                for j in range(size):
                    hits[j].id = cand[j]
                    hits[j].score = scores[cand[j]]
                qsort(hits, size, sizeof(_Hit), _by_score)
            ids = np.empty(size, np.int64)
            out = np.empty(size, np.float64)
            _fill(ids, out, hits, size)
        finally:
            free(hits)
    finally:
        free(cand)
        free(heap)
    return ids, out


cdef void _fill(int64_t[::1] ids, double[::1] out, _Hit* hits, Py_ssize_t size) noexcept:
    cdef Py_ssize_t i
    for i in range(size):
        ids[i] = hits[i].id
        out[i] = hits[i].score


cdef bint _any_allowed(const ids_t* ids, Py_ssize_t m, const uint8_t* mask, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t j
    cdef int64_t c
    for j in range(m):
        c = <int64_t>ids[j]
        if 0 <= c < n and mask[c]:
            return True
    return False


def any_allowed(ids, const uint8_t[::1] mask):
    """Whether ``mask`` allows one of the chunk ids ``ids`` (a buffer of uint32 or int64; ids
    outside the mask are not allowed): stops at the first, where numpy gathers them all."""
    cdef Py_buffer ib
    cdef bint found = False
    cdef Py_ssize_t n = mask.shape[0]
    cdef const uint8_t* mk = &mask[0] if n else NULL
    PyObject_GetBuffer(ids, &ib, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT)
    try:
        _kind(&ib, b"Ilq")
        if n:
            with nogil:
                if ib.itemsize == 4:
                    found = _any_allowed(<const uint32_t*>ib.buf, ib.len // 4, mk, n)
                else:
                    found = _any_allowed(<const int64_t*>ib.buf, ib.len // 8, mk, n)
    finally:
        PyBuffer_Release(&ib)
    return found


# -- BM25 top k with dynamic pruning (MaxScore) ---------------------------------------------
#
# Turtle & Flood, "Query evaluation: strategies and optimizations", IP&M 1995 (MaxScore), as
# Mallia et al. describe it for exact top-k ("An Experimental Study of Index Compression and
# DAAT Query Processing Methods", ECIR 2019): terms by their highest contribution, rare first;
# once the terms left could not lift a chunk no term so far holds above the k-th best partial
# score, they only add to the chunks already in the running, found by galloping search in
# their (sorted) postings instead of scoring every posting. Over a dense score array (what this
# engine's index is laid out for) rather than document-at-a-time cursors.
#
# Exact: a chunk is dropped only when its partial score plus everything the terms left could
# add is below the k-th best partial score (a lower bound of the k-th best final one), with
# margins for rounding; the few chunks that can still be in the top k are then scored again
# term by term in query order, the very operations of ``bm25_accumulate``, so the hits, their
# order and their scores are bit for bit those of ``top_k(bm25_accumulate(...))``.

cdef extern from *:
    """
    #if defined(__GNUC__) || defined(__clang__)
    #define RAGDB_PREFETCH(p) __builtin_prefetch((p), 1, 1)
    #else
    #define RAGDB_PREFETCH(p) ((void)0)
    #endif
    """
    void RAGDB_PREFETCH(const void* p) noexcept nogil


#: postings ahead whose score and length slots are asked for before they are needed: a rare
#: term's chunks lie far apart in arrays of 8 bytes a chunk (8 MB each at 1M chunks), each a
#: cache miss otherwise (phase A at 1M chunks: ~70 ns a posting without, about half with)
DEF PREFETCH = 16

ctypedef struct _Term:
    const void* ids
    const void* tfs
    int id_size
    int tf_size
    Py_ssize_t m
    double idf
    double weight
    double ub
    bint flat
    Py_ssize_t pos


cdef inline int64_t _tid(const _Term* t, Py_ssize_t j) noexcept nogil:
    if t.id_size == 4:
        return <int64_t>(<const uint32_t*>t.ids)[j]
    return (<const int64_t*>t.ids)[j]


cdef inline double _ttf(const _Term* t, Py_ssize_t j) noexcept nogil:
    if t.tf_size == 1:
        return <double>(<const uint8_t*>t.tfs)[j]
    if t.tf_size == 2:
        return <double>(<const uint16_t*>t.tfs)[j]
    return <double>(<const int64_t*>t.tfs)[j]


cdef inline double _contribution(const _Term* t, double tf, int64_t c, const double* norm, double flat) noexcept nogil:
    # bm25_accumulate's operations: s = t * idf; s = s / (t + norm); s = s * weight
    cdef double s = tf * t.idf
    if t.flat:
        s = s / (tf + flat)
    else:
        s = s / (tf + norm[c])
    return s * t.weight


cdef int _score_all(double* out, const double* nrm, const ids_t* ids, const tfs_t* tfs, Py_ssize_t m,
                    const _Term* t, double flat, uint64_t* bits, double* maxpartial, Py_ssize_t n) noexcept nogil:
    """Add one term's every contribution to its chunk's partial score (the operations of
    ``_contribution``), mark each chunk in the bitmap ``bits``, and keep the highest partial
    score so far in ``maxpartial``; -1 at a chunk id outside [0, n) (the postings before it
    are added and marked), else 0. The ids are checked one by one here, where the caller
    checked a term's first and last only (which bound them all in sorted postings).

    One loop per id and tf type, as ``_bm25_term``: the generic ``_tid``/``_ttf`` readers tested
    the item sizes at every posting. The chunks met go into a bitmap (one bit a chunk: 16 KiB
    at 131,072 chunks) rather than a list appended to when a chunk's partial score was still 0:
    that test was a branch mispredicted as often as not, and without the branch each store's
    place depended on the load before it, which kept the loads from overlapping."""
    cdef Py_ssize_t j
    cdef int64_t c
    cdef double tf, s, o, mp = maxpartial[0]
    cdef double idf = t.idf, weight = t.weight
    cdef bint use_flat = t.flat
    for j in range(m):
        c = <int64_t>ids[j]
        if <uint64_t>c >= <uint64_t>n:  # (a negative one too: a branch always predicted, about free)
            maxpartial[0] = mp
            return -1
        if j + PREFETCH < m:
            RAGDB_PREFETCH(&out[<int64_t>ids[j + PREFETCH]])
            RAGDB_PREFETCH(&nrm[<int64_t>ids[j + PREFETCH]])
        tf = <double>tfs[j]
        s = tf * idf
        if use_flat:
            s = s / (tf + flat)
        else:
            s = s / (tf + nrm[c])
        s = s * weight
        o = out[c] + s
        out[c] = o
        bits[c >> 6] |= (<uint64_t>1) << (c & 63)
        mp = o if o > mp else mp
    maxpartial[0] = mp
    return 0


cdef int _score_term(double* out, const double* nrm, const _Term* t, double flat, uint64_t* bits,
                     double* maxpartial, Py_ssize_t n) noexcept nogil:
    """:func:`_score_all` for a term of any id and tf types."""
    if t.id_size == 4:
        if t.tf_size == 1:
            return _score_all(out, nrm, <const uint32_t*>t.ids, <const uint8_t*>t.tfs, t.m, t, flat, bits, maxpartial, n)
        if t.tf_size == 2:
            return _score_all(out, nrm, <const uint32_t*>t.ids, <const uint16_t*>t.tfs, t.m, t, flat, bits, maxpartial, n)
        return _score_all(out, nrm, <const uint32_t*>t.ids, <const int64_t*>t.tfs, t.m, t, flat, bits, maxpartial, n)
    if t.tf_size == 1:
        return _score_all(out, nrm, <const int64_t*>t.ids, <const uint8_t*>t.tfs, t.m, t, flat, bits, maxpartial, n)
    if t.tf_size == 2:
        return _score_all(out, nrm, <const int64_t*>t.ids, <const uint16_t*>t.tfs, t.m, t, flat, bits, maxpartial, n)
    return _score_all(out, nrm, <const int64_t*>t.ids, <const int64_t*>t.tfs, t.m, t, flat, bits, maxpartial, n)


cdef Py_ssize_t _gallop(const _Term* t, Py_ssize_t lo, int64_t c) noexcept nogil:
    """The first position at or after ``lo`` whose id is at least ``c`` (ids ascending)."""
    cdef Py_ssize_t step = 1, hi, mid
    if lo >= t.m or _tid(t, lo) >= c:
        return lo
    hi = lo + 1
    while hi < t.m and _tid(t, hi) < c:
        lo = hi
        hi = lo + step
        step *= 2
    if hi > t.m:
        hi = t.m
    # _tid(lo) < c; answer in (lo, hi]
    lo += 1
    while lo < hi:
        mid = (lo + hi) // 2
        if _tid(t, mid) < c:
            lo = mid + 1
        else:
            hi = mid
    return lo


cdef int _DEBRUIJN[64]
_DEBRUIJN[:] = [0, 1, 48, 2, 57, 49, 28, 3, 61, 58, 50, 42, 38, 29, 17, 4, 62, 55, 59, 36, 53, 51, 43, 22, 45,
                39, 33, 30, 24, 18, 12, 5, 63, 47, 56, 27, 60, 41, 37, 16, 54, 35, 52, 21, 44, 32, 23, 11, 46, 26,
                40, 15, 34, 20, 31, 10, 25, 14, 19, 9, 13, 8, 7, 6]


cdef Py_ssize_t _ids_of_bits(const uint64_t* bits, Py_ssize_t words, int64_t* ids) noexcept nogil:
    """The chunk ids whose bits are set, ascending, into ``ids``; how many."""
    cdef Py_ssize_t w, count = 0
    cdef uint64_t word, low
    for w in range(words):
        word = bits[w]
        while word:
            low = word & (~word + 1)  # the lowest set bit; its index by de Bruijn multiplication
            ids[count] = (w << 6) + _DEBRUIJN[(low * <uint64_t>0x03f79d71b4cb0a89) >> 58]
            count += 1
            word ^= low
    return count


cdef double _kth_partial(const double* acc, const int64_t* cand, Py_ssize_t ncand, const uint8_t* mask,
                         Py_ssize_t nmask, double least, Py_ssize_t k, double* heap) noexcept nogil:
    """The k-th largest ``acc`` of the candidates the mask allows with ``acc`` above 0 and at
    least ``least``, or -1 when fewer than k have one (a NaN, only from a damaged index, never
    counts)."""
    cdef Py_ssize_t j, size = 0
    cdef int64_t c
    cdef double s
    for j in range(ncand):
        c = cand[j]
        s = acc[c]
        if c >= nmask or not mask[c] or not (s > 0.0 and s >= least):
            continue
        if size < k:
            heap[size] = s
            size += 1
            if size == k:
                for c in range(k // 2 - 1, -1, -1):
                    _sift_down(heap, k, c)
        elif s > heap[0]:
            heap[0] = s
            _sift_down(heap, k, 0)
    return heap[0] if size == k else -1.0


#: how bm25_top_k scores: 0 chooses per query (:func:`_exhaustive`), 1 always prunes (MaxScore),
#: 2 always scores every posting (tests set it to run both paths on the same inputs)
_mode = 0
cdef Py_ssize_t _full = 0  # calls of bm25_top_k that scored in full (tests: full_count)


def full_count():
    """How many calls of :func:`bm25_top_k` scored every posting rather than pruned (for tests)."""
    return _full


#: a query is scored in full when it has at most this many postings per hit wanted and term
#: (:func:`_exhaustive`)
DEF EXHAUSTIVE_POSTINGS = 75.0


cdef bint _exhaustive(const _Term* terms, Py_ssize_t T, Py_ssize_t k) noexcept nogil:
    """Whether to score every posting in query order rather than prune: when the query has at
    most EXHAUSTIVE_POSTINGS postings per k and term. Both give the same hits. Scoring in full
    costs in proportion to the postings; pruning pays for itself by leaving most postings of the
    common terms unread, at costs that grow with k and the terms: the chunks still in the
    running, walked along each term left, are more the lower the k-th best score, and the
    finalists (some k of them) are scored again term by term (a query's terms are added in
    another order there). Chinese questions are many terms (a character, each pair of
    neighbours) of similar IDF, where the bound of the terms left stays above the k-th best
    partial score until few remain. Measured on the realistic corpus's judged queries, kernel
    time a query (pruned / in full / this rule), k=100: 100k chunks English 0.68 / 0.64 /
    0.63 ms, Chinese 0.53 / 0.27 / 0.27; 1M chunks English 4.9 / 6.9 / 4.9, Chinese 2.5 / 2.5 /
    2.5; k=10: pruned, and within 1% of it, at every size; k=300: 100k English 1.07 / 0.72 /
    0.72, 1M Chinese 4.0 / 2.7 / 2.7."""
    cdef Py_ssize_t j, total = 0
    for j in range(T):
        total += terms[j].m
    return <double>total <= EXHAUSTIVE_POSTINGS * <double>k * <double>T


cdef Py_ssize_t _best_first(_Hit* hits, Py_ssize_t count, Py_ssize_t k) noexcept nogil:
    """Sort ``hits`` best first (equal scores by id) and keep the ``k`` best and any tied with the
    k-th; how many are kept."""
    cdef Py_ssize_t kept = k
    qsort(hits, count, sizeof(_Hit), _by_score)
    if count <= k:
        return count
    while kept < count and hits[kept].score >= hits[k - 1].score:
        kept += 1
    return kept


cdef Py_ssize_t _select(const double* out, const int64_t* cand, Py_ssize_t ncand, const uint8_t* mk,
                        Py_ssize_t nmask, Py_ssize_t k, double floor, double* heap, _Hit* hits) noexcept nogil:
    """``top_k`` over the chunks in ``cand`` (every chunk with a score above 0 is there): the hits
    (best first, equal scores by id) of those ``mk`` allows with a score above 0 and at least
    ``floor``, the ``k`` best and any tied with the k-th; returns how many. ``heap`` holds
    min(k, candidates) values, ``hits`` as many as ``cand``, whose chunks are distinct."""
    cdef Py_ssize_t j, count = 0
    cdef int64_t c
    cdef double s
    cdef double kth = _kth_partial(out, cand, ncand, mk, nmask, floor, k, heap)  # (-1: fewer than k)
    for j in range(ncand):
        c = cand[j]
        s = out[c]
        if c >= nmask or not mk[c] or not (s > 0.0 and s >= floor and s >= kth):
            continue
        hits[count].id = c
        hits[count].score = s
        count += 1
    return _best_first(hits, count, k)


def bm25_top_k(double[::1] acc, const double[::1] norm, list postings, list idfs, list weights, list flats,
               double flat, const uint8_t[::1] mask, Py_ssize_t k, double floor):
    """``top_k(bm25_accumulate(...), mask, k, floor)`` (the same ids, order and scores), with
    MaxScore pruning or, where that costs more (:func:`_exhaustive`), every posting scored in
    query order; either way only the chunks the postings name are visited (a bitmap of them),
    never every chunk. ``acc``: a work array as long as ``norm``, all zeros, left all zeros.
    A term's bound is ``idf * weight``, which no contribution exceeds (on the realistic 100k
    corpus, bounds from each term's highest tf / (tf + norm) moved the switch to galloping by 9%
    of the terms and cost a pass over every new term's postings: not worth it).
    Every term's postings must be sorted by chunk id; every idf and weight positive (else use
    the exhaustive pair: this raises ValueError)."""
    global _full
    cdef Py_ssize_t n = acc.shape[0], nmask = min(mask.shape[0], acc.shape[0])
    cdef Py_ssize_t T = 0, i, j, jj, ncand = 0, nalive = 0, nfin = 0, cap = 0, b_from, pos, attempts = 0
    cdef Py_ssize_t size, count
    cdef double rest, total = 0.0, maxpartial = 0.0, theta = -1.0, thr = 0.0, safe, least, s, last_try
    cdef int64_t c
    cdef _Term* terms = NULL
    cdef _Term* t
    cdef Py_ssize_t* order = NULL
    cdef Py_ssize_t* cursor = NULL
    cdef int64_t* cand = NULL
    cdef int64_t* alive = NULL
    cdef int64_t* src = NULL
    cdef int64_t* fin = NULL
    cdef double* heap = NULL
    cdef _Hit* hits = NULL
    cdef double* out = &acc[0] if n else NULL
    cdef const double* nrm = &norm[0] if norm.shape[0] else NULL
    cdef const uint8_t* mk = &mask[0] if mask.shape[0] else NULL
    cdef bint bad = False
    cdef bint dense = False
    cdef bint exhaustive = False
    cdef Py_buffer* bufs = NULL
    cdef uint64_t* bits = NULL
    cdef Py_ssize_t words = 0, w
    cdef uint64_t word, low
    if k < 1:
        raise ValueError(f"k must be at least 1, not {k}")
    if norm.shape[0] < n:
        raise ValueError("a length norm array shorter than the score array")
    live = [i for i in range(len(postings)) if postings[i] is not None]
    T = len(live)
    terms = <_Term*>malloc((T if T else 1) * sizeof(_Term))
    order = <Py_ssize_t*>malloc((T if T else 1) * sizeof(Py_ssize_t))
    cursor = <Py_ssize_t*>malloc((T if T else 1) * sizeof(Py_ssize_t))
    bufs = <Py_buffer*>malloc((2 * T if T else 1) * sizeof(Py_buffer))
    if terms == NULL or order == NULL or cursor == NULL or bufs == NULL:
        free(terms); free(order); free(cursor); free(bufs)
        raise MemoryError()
    got = 0
    try:
        for j in range(T):
            i = live[j]
            p = postings[i]
            PyObject_GetBuffer(p[0], &bufs[2 * j], PyBUF_C_CONTIGUOUS | PyBUF_FORMAT)
            got += 1
            PyObject_GetBuffer(p[1], &bufs[2 * j + 1], PyBUF_C_CONTIGUOUS | PyBUF_FORMAT)
            got += 1
            _kind(&bufs[2 * j], b"Ilq")
            _kind(&bufs[2 * j + 1], b"BHlq")
            t = &terms[j]
            t.ids = bufs[2 * j].buf
            t.tfs = bufs[2 * j + 1].buf
            t.id_size = bufs[2 * j].itemsize
            t.tf_size = bufs[2 * j + 1].itemsize
            t.m = bufs[2 * j].len // bufs[2 * j].itemsize
            if bufs[2 * j + 1].len // bufs[2 * j + 1].itemsize != t.m:
                raise ValueError(f"{t.m} chunk ids and {bufs[2 * j + 1].len // t.tf_size} term frequencies")
            t.idf = idfs[i]
            t.weight = weights[i]
            t.flat = flats[i]
            t.pos = j
            if not (t.idf > 0.0 and t.weight > 0.0 and t.idf < 1e300 and t.weight < 1e300):
                raise ValueError("MaxScore needs positive, finite idfs and weights")
            # (t * idf) / (t + norm) * weight <= idf * weight, norm >= 0; a margin for rounding
            t.ub = t.idf * t.weight * (1.0 + 1e-9)
            # (ids ascending: the first and the last bound them all. A term out of order, which
            # only a damaged index holds, is caught where its postings are scored, and read only
            # by position where it is pruned: its ids index nothing there)
            if t.m and (_tid(t, 0) < 0 or _tid(t, t.m - 1) >= n):
                raise IndexError(f"a posting's chunk id is outside the {n} chunks scored")
            cap += t.m
            order[j] = j
            total += t.ub
        words = (n + 63) // 64
        bits = <uint64_t*>calloc(max(words, 1), sizeof(uint64_t))
        cand = <int64_t*>malloc(max(min(cap, n), 1) * sizeof(int64_t))  # (each chunk at most once)
        # the k best partial scores: no more than the chunks the postings name
        heap = <double*>malloc(max(min(k, cap), 1) * sizeof(double))
        if bits == NULL or cand == NULL or heap == NULL:
            raise MemoryError()
        exhaustive = _mode == 2 or (_mode == 0 and _exhaustive(terms, T, k))
        _full += exhaustive
        with nogil:
            if exhaustive:
                # every posting, term by term in query order: the sums of bm25_accumulate
                for j in range(T):
                    if _score_term(out, nrm, &terms[j], flat, bits, &maxpartial, n) < 0:
                        bad = True
                        break
                ncand = _ids_of_bits(bits, words, cand)
                if not bad:
                    hits = <_Hit*>malloc((ncand if ncand else 1) * sizeof(_Hit))
                    if hits != NULL:
                        nfin = _select(out, cand, ncand, mk, nmask, k, floor, heap, hits)
        if exhaustive:
            if bad:
                raise IndexError(f"a posting's chunk id is outside the {n} chunks scored")
            if hits == NULL:
                raise MemoryError()
            ids = np.empty(nfin, np.int64)
            scores = np.empty(nfin, np.float64)
            _fill(ids, scores, hits, nfin)
            return ids, scores
        with nogil:
            # rarest (highest bound) first; ties in query order: insertion sort, T is small
            for j in range(1, T):
                pos = order[j]
                i = j - 1
                while i >= 0 and (terms[order[i]].ub < terms[pos].ub):
                    order[i + 1] = order[i]
                    i -= 1
                order[i + 1] = pos
            rest = total
            b_from = T
            last_try = total
            least = floor * (1.0 + 1e-9) if floor > 0.0 else floor
            for jj in range(T):
                t = &terms[order[jj]]
                rest -= t.ub
                if _score_term(out, nrm, t, flat, bits, &maxpartial, n) < 0:
                    bad = True
                    break
                if jj + 1 < T and rest < maxpartial and rest <= 0.7 * last_try and attempts < 6:
                    attempts += 1
                    last_try = rest
                    ncand = _ids_of_bits(bits, words, cand)
                    theta = _kth_partial(out, cand, ncand, mk, nmask, least, k, heap)
                    thr = theta if theta > floor else floor
                    if thr > 0.0 and rest < thr * (1.0 - 1e-9):
                        b_from = jj + 1
                        break
            ncand = _ids_of_bits(bits, words, cand)  # (ascending, as the galloping below needs)
            if not bad and b_from < T:
                # the rest only add to chunks still in the running
                safe = thr * (1.0 - 1e-9)
                alive = <int64_t*>malloc((ncand if ncand else 1) * sizeof(int64_t))
                if alive != NULL:
                    for j in range(ncand):
                        c = cand[j]
                        if c < nmask and mk[c] and out[c] + rest >= safe:
                            alive[nalive] = c
                            nalive += 1
                    for jj in range(b_from, T):
                        t = &terms[order[jj]]
                        rest -= t.ub
                        pos = 0
                        count = 0
                        dense = nalive * 16 > t.m  # a walk along the postings beats galloping
                        for j in range(nalive):
                            c = alive[j]
                            if dense:
                                while pos < t.m and _tid(t, pos) < c:
                                    pos += 1
                            else:
                                pos = _gallop(t, pos, c)
                            if pos < t.m and _tid(t, pos) == c:
                                out[c] += _contribution(t, _ttf(t, pos), c, nrm, flat)
                            if out[c] + (rest if rest > 0.0 else 0.0) >= safe:
                                alive[count] = c
                                count += 1
                        nalive = count
        if bad:
            raise IndexError(f"a posting's chunk id is outside the {n} chunks scored")
        if b_from < T and alive == NULL:
            raise MemoryError()
        with nogil:
            # the chunks that may be in the top k: allowed, and near enough the k-th partial
            if b_from < T:
                src = alive
                size = nalive
            else:
                src = cand
                size = ncand
            theta = _kth_partial(out, src, size, mk, nmask, -1e308, k, heap)
            safe = theta * (1.0 - 1e-9) if theta > 0.0 else 0.0
            fin = <int64_t*>malloc((size if size else 1) * sizeof(int64_t))
            if fin != NULL:
                for j in range(size):  # (ascending, as src is)
                    c = src[j]
                    if c < nmask and mk[c] and out[c] > 0.0 and out[c] >= safe:
                        fin[nfin] = c
                        nfin += 1
            src = fin
            hits = <_Hit*>malloc((nfin if nfin else 1) * sizeof(_Hit)) if fin != NULL else NULL
            if hits != NULL:
                # exact scores: every term in query order, the operations of bm25_accumulate
                for j in range(T):
                    cursor[j] = 0
                count = 0
                for j in range(nfin):
                    c = src[j]
                    s = 0.0
                    for i in range(T):
                        t = &terms[i]
                        cursor[i] = _gallop(t, cursor[i], c)
                        if cursor[i] < t.m and _tid(t, cursor[i]) == c:
                            s += _contribution(t, _ttf(t, cursor[i]), c, nrm, flat)
                    if s > 0.0 and s >= floor:
                        hits[count].id = c
                        hits[count].score = s
                        count += 1
                nfin = _best_first(hits, count, k)
        if hits == NULL:
            raise MemoryError()
        ids = np.empty(nfin, np.int64)
        scores = np.empty(nfin, np.float64)
        _fill(ids, scores, hits, nfin)
        return ids, scores
    finally:
        if bits != NULL:
            with nogil:  # the work array back to all zeros: the chunks marked
                for w in range(words):
                    word = bits[w]
                    while word:
                        low = word & (~word + 1)
                        out[(w << 6) + _DEBRUIJN[(low * <uint64_t>0x03f79d71b4cb0a89) >> 58]] = 0.0
                        word ^= low
        for j in range(got):
            PyBuffer_Release(&bufs[j])
        free(terms); free(order); free(cursor); free(bufs); free(heap); free(bits); free(cand); free(alive); free(fin)
        free(hits)


def unpack_gaps(const uint8_t[::1] blob, Py_ssize_t n):
    """The chunk ids (uint32) of a packed postings blob of ``n`` postings (``ragdb.index.inverted
    .pack_postings``: a width byte 1 or 2, ``n`` gaps of that width, an escape value's gaps as
    uint32 after them), decoded in one pass; numpy needs four (frombuffer, astype, the
    exceptions put back, cumsum) and an array of intp twice the size. The blob's shape is
    checked by the caller (``_packed_width``); ``ragdb check`` validates its contents."""
    cdef Py_ssize_t width = blob[0] if blob.shape[0] else 0
    cdef Py_ssize_t j, x = 1 + width * n
    cdef uint32_t escape = 255 if width == 1 else 65535
    cdef uint32_t gap, acc = 0
    cdef const uint8_t* p = &blob[0] if blob.shape[0] else NULL
    if width not in (1, 2) or blob.shape[0] < x or (blob.shape[0] - x) % 4:
        raise ValueError(f"a chunk ids blob of {blob.shape[0]} bytes for {n} postings is not packed")
    out = np.empty(n, np.uint32)
    cdef uint32_t[::1] ids = out
    cdef Py_ssize_t exceptions = (blob.shape[0] - x) // 4, used = 0
    with nogil:
        for j in range(n):
            if width == 1:
                gap = p[1 + j]
            else:
                gap = <uint32_t>p[1 + 2 * j] | (<uint32_t>p[2 + 2 * j] << 8)
            if gap == escape and used < exceptions:
                gap = (<uint32_t>p[x] | (<uint32_t>p[x + 1] << 8) | (<uint32_t>p[x + 2] << 16)
                       | (<uint32_t>p[x + 3] << 24))
                x += 4
                used += 1
            acc += gap
            ids[j] = acc
    return out


# -- merging segments (inverted._merged_rows) ---------------------------------------------

cdef extern from "Python.h":
    object PyBytes_FromStringAndSize(const char* s, Py_ssize_t n)
    char* PyBytes_AS_STRING(object o)


cdef inline void _put_u32(uint8_t* p, uint64_t v) noexcept nogil:
    p[0] = v & 0xFF
    p[1] = (v >> 8) & 0xFF
    p[2] = (v >> 16) & 0xFF
    p[3] = (v >> 24) & 0xFF


cdef int _grow(uint64_t** ids, uint32_t** tfs, Py_ssize_t* cap, Py_ssize_t need) except -1:
    cdef Py_ssize_t size = cap[0]
    cdef void* p
    if need <= size:
        return 0
    if need > PY_SSIZE_T_MAX // 32:  # (no doubling or byte size below may overflow)
        raise MemoryError()
    while size < need:
        size = 2 * size if size else 1024
    p = realloc(ids[0], size * sizeof(uint64_t))
    if p == NULL:
        raise MemoryError()
    ids[0] = <uint64_t*>p
    p = realloc(tfs[0], size * sizeof(uint32_t))
    if p == NULL:
        raise MemoryError()
    tfs[0] = <uint32_t*>p
    cap[0] = size
    return 0


cdef Py_ssize_t _segment_into(const uint8_t* ib, Py_ssize_t ilen, const uint8_t* tb, Py_ssize_t tlen,
                              Py_ssize_t n, uint64_t* ids, uint32_t* tfs) noexcept nogil:
    """Decode one stored segment (``unpack_postings``: raw or packed ids, uint8 or uint16 tfs)
    into ``ids``/``tfs``; -1 when its blobs are not exactly that shape (the caller falls back
    to the reference, which raises or decodes as it does)."""
    cdef Py_ssize_t j, width, x, exceptions, used = 0, escapes = 0
    cdef uint64_t gap, acc = 0, escape
    if tlen == n:
        for j in range(n):
            tfs[j] = tb[j]
    elif tlen == 2 * n:
        for j in range(n):
            tfs[j] = tb[2 * j] | (<uint32_t>tb[2 * j + 1] << 8)
    else:
        return -1
    if ilen == 4 * n:
        for j in range(n):
            ids[j] = (<uint64_t>ib[4 * j] | (<uint64_t>ib[4 * j + 1] << 8) | (<uint64_t>ib[4 * j + 2] << 16)
                      | (<uint64_t>ib[4 * j + 3] << 24))
        return n
    width = ib[0] if ilen else 0
    x = 1 + width * n
    if (width != 1 and width != 2) or ilen < x or (ilen - x) % 4:
        return -1
    exceptions = (ilen - x) // 4
    escape = 255 if width == 1 else 65535
    for j in range(n):
        gap = ib[1 + j] if width == 1 else (<uint64_t>ib[1 + 2 * j] | (<uint64_t>ib[2 + 2 * j] << 8))
        if gap == escape:
            escapes += 1
            if used >= exceptions:
                return -1
            gap = (<uint64_t>ib[x] | (<uint64_t>ib[x + 1] << 8) | (<uint64_t>ib[x + 2] << 16)
                   | (<uint64_t>ib[x + 3] << 24))
            x += 4
            used += 1
        acc += gap
        ids[j] = acc
    if used != exceptions:
        return -1
    return n


cdef object _pack_one(const uint64_t* ids, const uint32_t* tfs, Py_ssize_t n, Py_ssize_t pack_min):
    """(chunk ids blob, tfs blob) of one term's postings: ``pack_postings_many``'s bytes
    (``tfs`` at most 65,535: the caller clipped them as it does)."""
    cdef Py_ssize_t j, e1 = 0, e2 = 0, size1, size2, width, x
    cdef uint32_t tmax = 0, tf
    cdef uint64_t gap, prev = 0
    cdef uint8_t* p
    for j in range(n):
        if tfs[j] > tmax:
            tmax = tfs[j]
    if tmax <= 255:
        tblob = PyBytes_FromStringAndSize(NULL, n)
        p = <uint8_t*>PyBytes_AS_STRING(tblob)
        for j in range(n):
            p[j] = <uint8_t>tfs[j]
    else:
        tblob = PyBytes_FromStringAndSize(NULL, 2 * n)
        p = <uint8_t*>PyBytes_AS_STRING(tblob)
        for j in range(n):
            tf = tfs[j]
            p[2 * j] = tf & 0xFF
            p[2 * j + 1] = tf >> 8
    width = 0
    if n >= pack_min:
        for j in range(n):
            gap = ids[j] - prev
            prev = ids[j]
            if gap >= 255:
                e1 += 1
                if gap >= 65535:
                    e2 += 1
        size1 = 1 + n + 4 * e1
        size2 = 1 + 2 * n + 4 * e2
        width = 1 if size1 < 4 * n else 0
        if size2 < (size1 if width else 4 * n):
            width = 2
    if width == 0:
        iblob = PyBytes_FromStringAndSize(NULL, 4 * n)
        p = <uint8_t*>PyBytes_AS_STRING(iblob)
        for j in range(n):
            _put_u32(p + 4 * j, ids[j])
        return iblob, tblob
    iblob = PyBytes_FromStringAndSize(NULL, 1 + width * n + 4 * (e1 if width == 1 else e2))
    p = <uint8_t*>PyBytes_AS_STRING(iblob)
    p[0] = <uint8_t>width
    x = 1 + width * n
    prev = 0
    for j in range(n):
        gap = ids[j] - prev
        prev = ids[j]
        if width == 1:
            if gap >= 255:
                p[1 + j] = 255
                _put_u32(p + x, gap)
                x += 4
            else:
                p[1 + j] = <uint8_t>gap
        else:
            if gap >= 65535:
                p[1 + 2 * j] = 0xFF
                p[2 + 2 * j] = 0xFF
                _put_u32(p + x, gap)
                x += 4
            else:
                p[1 + 2 * j] = gap & 0xFF
                p[2 + 2 * j] = gap >> 8
    return iblob, tblob


def merge_postings(list terms, list segments, const int64_t[::1] tail_lens, const int64_t[::1] tail_ids,
                   const int64_t[::1] tail_tfs, state, int absent, Py_ssize_t pack_min):
    """``inverted._merged_rows``: the one-segment rows (term id, 0, n, chunk ids, tfs) of
    ``terms`` (ascending), from their stored ``segments`` (term id, n, chunk ids blob, tfs blob;
    by term, then segment) followed by each term's ``tail_lens[i]`` postings in ``tail_ids`` /
    ``tail_tfs`` (the terms' tail postings, in order of ``terms``), chunks whose ``state``
    (int8, or None) is ``absent`` dropped, a term left without postings without a row; the
    very bytes of the reference. None where the reference must decide: terms not ascending, a
    segment of a term not asked for or out of order, a blob not of the stored shapes, a
    chunk id past ``state`` or past 2**32, or a term's postings not strictly ascending once
    joined (the reference sorts them, stably). Decoding, joining and packing in one pass per
    term, where the reference made numpy arrays per segment (a bulk load's final merge
    decoded ~500,000 segments at 100k chunks)."""
    cdef Py_ssize_t nterms = len(terms), nseg = len(segments), i, s = 0, t_at = 0, m, got, j, k, n, cap = 0
    cdef Py_ssize_t nstate = 0
    cdef int64_t tid, prev_tid = -1, stid
    cdef uint64_t* ids = NULL
    cdef uint32_t* tfs = NULL
    cdef const int8_t[::1] st
    cdef const uint8_t[::1] ib
    cdef const uint8_t[::1] tb
    cdef bint filtering = state is not None
    cdef uint64_t last
    if tail_lens.shape[0] != nterms:
        return None
    if filtering:
        st = state
        nstate = st.shape[0]
    out = []
    try:
        for i in range(nterms):
            tid = terms[i]
            if tid <= prev_tid:
                return None
            prev_tid = tid
            m = 0
            while s < nseg:
                row = segments[s]
                stid = row[0]
                if stid != tid:
                    if stid < tid:
                        return None  # a segment of a term not asked for
                    break
                n = row[1]
                ib = row[2]
                tb = row[3]
                if n < 0 or n > tb.shape[0]:
                    return None  # (a tfs blob holds n or 2n bytes: a damaged n is refused before any allocation)
                _grow(&ids, &tfs, &cap, m + n + 1)
                got = _segment_into(&ib[0] if ib.shape[0] else NULL, ib.shape[0],
                                    &tb[0] if tb.shape[0] else NULL, tb.shape[0], n, ids + m, tfs + m)
                if got < 0:
                    return None
                m += got
                s += 1
            n = tail_lens[i]
            if n < 0 or t_at + n > tail_ids.shape[0] or t_at + n > tail_tfs.shape[0]:
                return None
            if n:
                _grow(&ids, &tfs, &cap, m + n + 1)
                for j in range(n):
                    if tail_ids[t_at + j] < 0 or tail_tfs[t_at + j] < 0:
                        return None
                    ids[m + j] = <uint64_t>tail_ids[t_at + j]
                    tfs[m + j] = <uint32_t>(tail_tfs[t_at + j] if tail_tfs[t_at + j] < 65535 else 65535)
                t_at += n
                m += n
            k = 0
            for j in range(m):
                if filtering:
                    if ids[j] >= <uint64_t>nstate:
                        return None
                    if st[ids[j]] == absent:
                        continue
                if ids[j] >= 4294967296ULL or (k and ids[j] <= last):
                    return None
                last = ids[j]
                ids[k] = ids[j]
                tfs[k] = tfs[j]
                k += 1
            if k:
                iblob, tblob = _pack_one(ids, tfs, k, pack_min)
                out.append((tid, 0, k, iblob, tblob))
        if s != nseg or t_at != tail_ids.shape[0]:
            return None  # segments of terms not asked for
        return out
    finally:
        free(ids)
        free(tfs)


def tail_rows(const int64_t[::1] term_ids, const int64_t[::1] starts, const ids_t[::1] ids, const tfs_t[::1] tfs,
              const int64_t[::1] numbers, const uint8_t[::1] skip, Py_ssize_t g0, Py_ssize_t g1,
              Py_ssize_t pack_min):
    """``inverted._Tail.segment_rows`` of groups ``g0`` to ``g1``: a row (term id, its segment
    number ``numbers[g]``, n, chunk ids, tfs) per group not ``skip``ped, postings of ``pack_min``
    or more packed as ``pack_postings_many`` packs them, shorter ones raw (uint32 ids, uint16
    tfs clipped at 65,535); the very bytes. None where an id is negative or past 2**32. The
    caller passes tfs that are not negative (uint16: what a tail holds)."""
    cdef Py_ssize_t g, a, b, j, n, cap = 0
    cdef uint64_t* buf = NULL
    cdef uint32_t* tbuf = NULL
    cdef uint8_t* p
    cdef uint64_t v
    cdef int64_t tf
    out = []
    try:
        for g in range(g0, g1):
            if skip[g]:
                continue
            a, b = starts[g], starts[g + 1]
            n = b - a
            if n >= pack_min:
                _grow(&buf, &tbuf, &cap, n)
                for j in range(n):
                    if ids[a + j] < 0 or <uint64_t>ids[a + j] >= 4294967296ULL:
                        return None
                    buf[j] = <uint64_t>ids[a + j]
                    tf = <int64_t>tfs[a + j]
                    tbuf[j] = <uint32_t>(tf if tf < 65535 else 65535)
                iblob, tblob = _pack_one(buf, tbuf, n, pack_min)
            else:
                iblob = PyBytes_FromStringAndSize(NULL, 4 * n)
                p = <uint8_t*>PyBytes_AS_STRING(iblob)
                for j in range(n):
                    if ids[a + j] < 0 or <uint64_t>ids[a + j] >= 4294967296ULL:
                        return None
                    _put_u32(p + 4 * j, <uint64_t>ids[a + j])
                tblob = PyBytes_FromStringAndSize(NULL, 2 * n)
                p = <uint8_t*>PyBytes_AS_STRING(tblob)
                for j in range(n):
                    tf = <int64_t>tfs[a + j]
                    tf = tf if tf < 65535 else 65535
                    p[2 * j] = tf & 0xFF
                    p[2 * j + 1] = (tf >> 8) & 0xFF
            out.append((term_ids[g], numbers[g], n, iblob, tblob))
        return out
    finally:
        free(buf)
        free(tbuf)
