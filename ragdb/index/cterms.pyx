# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""A writer's term -> term id table in C (:class:`TermTable`; :class:`ragdb.index.terms.TermDict`,
a dict, is the reference and the fallback).

Why not a dict: a bulk load's writer keeps every term of the vocabulary it meets (the realistic
100k corpus has ~350,000), and a dict of them held a str object (~75 bytes), a dict entry and
an int object (~70 bytes together) a term, ~50 MiB of the writing process's peak. Here a term is
its UTF-8 bytes in one arena, its offset, its id and 32 bits of its hash in arrays, and a slot
of an open-addressing index (~45 bytes a term with the arrays' headroom): no Python object is
kept a term. The strings looked up are hashed by Python (``hash(str)``, cached in the string)
and compared by their UTF-8 bytes (``surrogatepass``: a lone surrogate has its own bytes, which
no other string's UTF-8 has, so equal bytes are equal strings either way).

Not a general mapping: str keys (a str subclass is taken as its characters), int values, no deletion (a writer's ids only change in a
clean-up of unused terms, which empties the table), no iteration.
"""

from libc.stdint cimport int64_t, int32_t, uint32_t
from libc.stdlib cimport malloc, realloc, free
from libc.string cimport memcpy, memcmp, memset
from cpython.object cimport PyObject_Hash
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE

import numpy as np

cdef extern from "Python.h":
    bint PyUnicode_IS_ASCII(object o)
    void* PyUnicode_DATA(object o)
    Py_ssize_t PyUnicode_GET_LENGTH(object o)
    object PyUnicode_AsEncodedString(object o, const char* encoding, const char* errors)


cdef inline object _exact(object term):
    """``term`` as an exact str (a str subclass's characters: what a dict compares, as a rule),
    TypeError for anything else: the C reads below are a str's."""
    if type(term) is str:
        return term
    if isinstance(term, str):
        return str.__str__(term)
    raise TypeError(f"a term is a str, not {type(term).__name__}")


cdef inline object _key_bytes(str term, const char** s, Py_ssize_t* size):
    """A term's key: its UTF-8 (``surrogatepass``) in ``*s``, ``*size`` bytes; returns what holds
    them (the str itself where it is ASCII, else the encoded bytes), to be kept while they are read."""
    cdef object encoded
    if PyUnicode_IS_ASCII(term):
        s[0] = <const char*>PyUnicode_DATA(term)
        size[0] = PyUnicode_GET_LENGTH(term)
        return term
    encoded = PyUnicode_AsEncodedString(term, "utf-8", "surrogatepass")
    s[0] = PyBytes_AS_STRING(encoded)
    size[0] = PyBytes_GET_SIZE(encoded)
    return encoded


cdef class TermTable:
    """term (str) -> term id (int): ``t[term]``, ``t[term] = id``, ``term in t``, ``t.get``,
    ``len(t)``, ``t.clear()``, ``t.update(pairs or mapping)``, and for a batch:
    :meth:`missing` and :meth:`ids_of`."""

    cdef uint32_t* hashes     # per term: the low 32 bits of its hash
    cdef int64_t* tids        # per term: its id
    cdef int64_t* offs        # per term, and one past the last: where its bytes start in arena
    cdef char* arena
    cdef Py_ssize_t n, cap, arena_len, arena_cap
    cdef int32_t* slots       # -1: empty, else a term's index; at most half of them used
    cdef Py_ssize_t nslots    # a power of two (0 before the first term)

    def __cinit__(self):
        self.hashes = NULL
        self.tids = NULL
        self.offs = NULL
        self.arena = NULL
        self.slots = NULL
        self.n = self.cap = self.arena_len = self.arena_cap = self.nslots = 0

    def __dealloc__(self):
        free(self.hashes); free(self.tids); free(self.offs); free(self.arena); free(self.slots)

    # -- finding ------------------------------------------------------------

    cdef inline Py_ssize_t _slot(self, Py_hash_t h, const char* s, Py_ssize_t size) noexcept:
        """The slot of the term with these bytes, or the empty slot where it would go
        (``nslots`` > 0)."""
        cdef size_t mask = <size_t>(self.nslots - 1)
        cdef size_t i = (<size_t>h) & mask
        cdef uint32_t h32 = <uint32_t>h
        cdef int32_t e
        cdef int64_t a
        while True:
            e = self.slots[i]
            if e < 0:
                return <Py_ssize_t>i
            if self.hashes[e] == h32:
                a = self.offs[e]
                if self.offs[e + 1] - a == size and memcmp(self.arena + a, s, size) == 0:
                    return <Py_ssize_t>i
            i = (i + 1) & mask

    cdef int64_t _find(self, object term) except -2:
        """The term's id, or -1 when the table does not hold it (TypeError: not a str)."""
        cdef Py_ssize_t size, i
        cdef const char* s
        cdef Py_hash_t h
        term = _exact(term)
        if self.n == 0:
            return -1
        h = PyObject_Hash(term)
        keep = _key_bytes(term, &s, &size)
        i = self._slot(h, s, size)
        if self.slots[i] < 0:
            return -1
        return self.tids[self.slots[i]]

    # -- growing ------------------------------------------------------------

    cdef int _rehash(self, Py_ssize_t nslots) except -1:
        cdef int32_t* slots = <int32_t*>malloc(nslots * sizeof(int32_t))
        cdef size_t mask = <size_t>(nslots - 1)
        cdef size_t i
        cdef Py_ssize_t e
        if slots == NULL:
            raise MemoryError("the writer's term table")
        memset(slots, 0xFF, nslots * sizeof(int32_t))
        for e in range(self.n):
            i = (<size_t>self.hashes[e]) & mask
            while slots[i] >= 0:
                i = (i + 1) & mask
            slots[i] = <int32_t>e
        free(self.slots)
        self.slots, self.nslots = slots, nslots
        return 0

    cdef int _reserve(self, Py_ssize_t size) except -1:
        """Room for one more term of ``size`` bytes (the index rehashed first where needed, so
        a slot found after this call stays the term's)."""
        cdef Py_ssize_t cap
        cdef void* p
        if self.n >= 0x7FFFFFFE:
            raise OverflowError("the writer's term table holds 2**31 terms")
        if self.n + 1 > self.cap:
            cap = max(1024, self.cap + self.cap // 2)
            p = realloc(self.hashes, cap * sizeof(uint32_t))
            if p == NULL:
                raise MemoryError("the writer's term table")
            self.hashes = <uint32_t*>p
            p = realloc(self.tids, cap * sizeof(int64_t))
            if p == NULL:
                raise MemoryError("the writer's term table")
            self.tids = <int64_t*>p
            p = realloc(self.offs, (cap + 1) * sizeof(int64_t))
            if p == NULL:
                raise MemoryError("the writer's term table")
            self.offs = <int64_t*>p
            if self.cap == 0:
                self.offs[0] = 0
            self.cap = cap
        if self.arena_len + size > self.arena_cap:
            cap = max(16384, self.arena_cap + self.arena_cap // 2, self.arena_len + size)
            p = realloc(self.arena, cap)
            if p == NULL:
                raise MemoryError("the writer's term table")
            self.arena = <char*>p
            self.arena_cap = cap
        if 2 * (self.n + 1) > self.nslots:
            self._rehash(max(2048, 2 * self.nslots))
        return 0

    cdef int _set(self, object term, int64_t tid) except -1:
        cdef Py_ssize_t size, i
        cdef const char* s
        cdef Py_hash_t h
        term = _exact(term)
        h = PyObject_Hash(term)
        keep = _key_bytes(term, &s, &size)
        self._reserve(size)
        i = self._slot(h, s, size)
        if self.slots[i] >= 0:  # held: a new id
            self.tids[self.slots[i]] = tid
            return 0
        memcpy(self.arena + self.arena_len, s, size)
        self.arena_len += size
        self.hashes[self.n] = <uint32_t>h
        self.tids[self.n] = tid
        self.offs[self.n + 1] = self.arena_len
        self.slots[i] = <int32_t>self.n
        self.n += 1
        return 0

    # -- the mapping --------------------------------------------------------

    def __len__(self):
        return self.n

    def __contains__(self, term):
        return isinstance(term, str) and self._find(term) >= 0

    def __getitem__(self, term):
        if not isinstance(term, str):
            raise KeyError(term)
        cdef int64_t tid = self._find(term)
        if tid < 0:
            raise KeyError(term)
        return tid

    def __setitem__(self, term, tid):
        cdef int64_t value = tid
        if value < 0:
            raise ValueError(f"a term id is never negative: {tid!r}")
        self._set(term, value)

    def get(self, term, default=None):
        if not isinstance(term, str):
            return default
        cdef int64_t tid = self._find(term)
        return default if tid < 0 else tid

    def update(self, items):
        """Add (term, id) pairs, or a mapping's items."""
        if hasattr(items, "items"):
            items = items.items()
        for term, tid in items:
            self[term] = tid

    def clear(self):
        free(self.hashes); free(self.tids); free(self.offs); free(self.arena); free(self.slots)
        self.hashes = NULL
        self.tids = NULL
        self.offs = NULL
        self.arena = NULL
        self.slots = NULL
        self.n = self.cap = self.arena_len = self.arena_cap = self.nslots = 0

    # -- batches ------------------------------------------------------------

    def missing(self, terms):
        """The terms of ``terms`` (an iterable of str) the table does not hold, in order."""
        cdef list out = []
        for term in terms:
            if self._find(term) < 0:
                out.append(term)
        return out

    def ids_of(self, list terms not None):
        """The ids of ``terms`` (every one held: KeyError otherwise), as an int64 array."""
        cdef Py_ssize_t k, m = len(terms)
        out = np.empty(m, np.int64)
        cdef int64_t[::1] view = out
        cdef int64_t tid
        for k in range(m):
            term = terms[k]
            tid = self._find(term)
            if tid < 0:
                raise KeyError(term)
            view[k] = tid
        return out

    def memory(self):
        """Bytes held by the table's arrays (for the tests and the benchmarks' notes)."""
        return (self.cap * (sizeof(uint32_t) + 2 * sizeof(int64_t)) + self.arena_cap
                + self.nslots * sizeof(int32_t))
