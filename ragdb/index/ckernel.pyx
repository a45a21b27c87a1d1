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
from libc.stdint cimport uint8_t, uint16_t, uint32_t, int64_t
from libc.stdlib cimport malloc, free, qsort
from libc.string cimport memset

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
