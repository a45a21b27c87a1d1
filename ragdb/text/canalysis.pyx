# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The analyzer's hot loop in C (the compiled half of :mod:`ragdb.text.analysis`, whose Python
code is the reference and the fallback): a text's split into word tokens and CJK runs, CJK
unigrams and bigrams, case folding of ASCII, counting, and a worker's term numbering
(``analysis._pack``). The word rules (compounds, clitics, stopwords) stay in Python, and stemming
with PyStemmer: each distinct token is learned once and its terms are remembered here, in a table
keyed by the token's characters. A token that is one word once the joining characters at its
ends are stripped, or words joined by single hyphens and dots, is learned here, by
``Analyzer._expand2``'s rules for it (``Analysis._learn``); every other token is sent to
``Analyzer._expand2``.

Why the results are the reference's, exactly:

* Normalization is the reference's own: a text that is not ASCII goes through
  ``unicodedata.normalize("NFKC", text).casefold()`` (a Python call), as ``Analyzer._tokens``
  does; an ASCII text is not normalized there either, only lowered, and lowering ``A-Z`` here
  is ``str.lower`` of ASCII.
* The split is the regular expressions' (``_TERM2_RE``, ``_RAW2``, and for ASCII text
  ``_ASCII_SPLIT2``), character class by character class: a CJK run is a maximal run of the
  code points of ``analysis._CJK`` (the same ranges, below); a word token is a maximal run of
  characters that are not CJK and are ``\\w`` (``Py_UNICODE_ISALNUM`` or ``_``, what Python's
  ``re`` tests for ``\\w``) or one of ``. - : + # ' \\u2019``. Everything else separates.
  ``_TERM2_RE`` matches CJK first at each place and never backtracks (two classes with ``+``),
  so its matches are exactly these maximal runs; ``_RAW2`` (text without CJK) is the same
  class; ``_ASCII_SPLIT2`` keeps the same ASCII characters. The tests compare the class with
  the regular expressions over every code point.
* A token's terms are a function of its characters (``Analyzer._expand2``, which the reference
  memo ``_learn2`` fills from too), so remembering them by the token's characters, whether the
  reference held the token as bytes or str, gives the reference's terms.
* CJK terms: per run, every character, then every pair of neighbours (a run of one character
  is its one unigram), the Chinese stopwords dropped (each distinct unigram/bigram is tested
  against the analyzer's stopword set once, in Python), in run order after all word terms, as
  ``Analyzer._cjk_terms`` and ``_counts`` give them.
* Counting: terms in order of first appearance, word terms then CJK terms, into one table of
  distinct terms (a term string has one id whichever way it came, so a CJK term equal to a word
  term adds to its count as ``Counter`` does); the reference's ``_OVERLAP`` (NUL) is counted
  apart as ``overlaps``.
* A worker's numbering (``pack``) gives each term not numbered yet the next number in the
  order the counts list the terms, as ``analysis._pack`` does. The numbering is the caller's
  ``analysis.Numbering``: while this object numbers it, the numbers live here, in ``number``
  (one int64 a term of the table, which holds each term anyway), and the Numbering's dict stays
  empty; they go back into that dict (``give_back``) before anything else numbers from it or
  this table forgets its terms, and a numbering kept in the dict (the Python path's, another
  object's) is read back from it.
"""

from cpython.unicode cimport Py_UNICODE_ISALNUM, Py_UNICODE_ISDECIMAL
from cpython.dict cimport PyDict_GetItem, PyDict_SetItem
from cpython.object cimport PyObject_Hash
from cpython.list cimport PyList_GET_ITEM
from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.ref cimport PyObject
from libc.stdint cimport uint64_t, uint32_t, int32_t, int64_t, uint8_t, uint16_t
from libc.stdlib cimport malloc, realloc, free
from libc.string cimport memcpy, memcmp, memset

cdef extern from "Python.h":
    bint PyUnicode_IS_ASCII(object o)
    int PyUnicode_KIND(object o)
    void* PyUnicode_DATA(object o)
    Py_ssize_t PyUnicode_GET_LENGTH(object o)
    object PyUnicode_FromKindAndData(int kind, const void* buffer, Py_ssize_t size)
    int PyUnicode_1BYTE_KIND
    int PyUnicode_2BYTE_KIND
    int PyUnicode_4BYTE_KIND

import unicodedata

cdef object _normalize = unicodedata.normalize

ctypedef fused uchar:
    uint8_t
    uint16_t
    uint32_t

# ASCII characters of a word token: [A-Za-z0-9_] (``\w`` of ASCII) and the joiners ``. - : + # '``
# (``analysis._ASCII_SPLIT2`` keeps exactly these).
cdef uint8_t ASCII_WORD[128]
cdef int _c
for _c in range(128):
    ASCII_WORD[_c] = (48 <= _c <= 57) or (65 <= _c <= 90) or (97 <= _c <= 122) or chr(_c) in "_.-:+#'"

cdef uint64_t FNV_OFFSET = 0xcbf29ce484222325ULL
cdef uint64_t FNV_PRIME = 0x100000001b3ULL
#: The memo of tokens is emptied when it holds more than this many (``analysis.MEMO_SIZE``).
MEMO_TOKENS = 200_000
#: ... or more than this many characters of tokens (a few very long "words").
MEMO_CHARS = 16_000_000
#: The table of distinct terms (and with it the memos) is emptied when it holds more (a worker
#: keeps the terms it numbered until its numbering starts again: see ``pack``).
MAX_TERMS = 1_000_000


cdef inline bint is_cjk(uint32_t c) noexcept nogil:
    """``analysis._CJK``: kana, CJK unified ideographs (extension A, the main block, the
    supplementary planes' extensions) and the compatibility ideographs."""
    return (0x3040 <= c <= 0x30FF) or (0x3400 <= c <= 0x4DBF) or (0x4E00 <= c <= 0x9FFF) \
        or (0xF900 <= c <= 0xFAFF) or (0x20000 <= c <= 0x3134F)


cdef inline bint is_word(uint32_t c) noexcept:
    """A character of a word token (not CJK)."""
    if c < 128:
        return ASCII_WORD[c]
    return c == 0x2019 or (not is_cjk(c) and Py_UNICODE_ISALNUM(<Py_UCS4>c))


def word_class(str chars):
    """For the tests: per character of ``chars``, 2 for CJK, 1 for a word token's, 0 for a separator."""
    return [2 if is_cjk(<uint32_t>ord(ch)) else 1 if is_word(<uint32_t>ord(ch)) else 0 for ch in chars]


ctypedef struct Entry:
    uint64_t hash
    Py_ssize_t key      # offset of its characters in keys
    Py_ssize_t length
    Py_ssize_t terms    # offset of its term ids in tids
    Py_ssize_t nterms   # -1: not learned yet


cdef inline Py_ssize_t _count(int64_t tid, int64_t clock, int64_t* stamp, int64_t* cnt, int64_t* order,
                              Py_ssize_t norder) noexcept nogil:
    """Count term ``tid`` once more in a text whose count is stamped ``clock``: a term met
    first in it starts at 1 and goes at the end of ``order``; returns the new length of order."""
    if stamp[tid] != clock:
        stamp[tid] = clock
        cnt[tid] = 1
        order[norder] = tid
        return norder + 1
    cnt[tid] += 1
    return norder


cdef int grow(void** buf, Py_ssize_t* cap, Py_ssize_t need, size_t item) except -1:
    """Make ``*buf`` hold at least ``need`` items (doubling)."""
    cdef Py_ssize_t n = cap[0] if cap[0] > 0 else 16
    cdef void* p
    if need <= cap[0]:
        return 0
    while n < need:
        n *= 2
    p = realloc(buf[0], n * item)
    if p == NULL:
        raise MemoryError()
    buf[0] = p
    cap[0] = n
    return 0


cdef int32_t* empty_slots(Py_ssize_t n) except NULL:
    """A new table of ``n`` slots of an open-addressing map, every one empty (-1)."""
    cdef int32_t* slots = <int32_t*>malloc(n * sizeof(int32_t))
    if slots == NULL:
        raise MemoryError()
    memset(slots, 0xFF, n * sizeof(int32_t))  # (all bits set: -1)
    return slots


# the kinds of a compound's items, named as analysis names them (made and read here only)
DEF _WORD = 0
DEF _TERM = 1
DEF _DROP = 2
DEF _WHOLE_WORD = 3
DEF _WHOLE_TERM = 4


cdef inline bint _alnum(str s, Py_ssize_t a, Py_ssize_t b):
    """``s[a:b].isalnum()``."""
    cdef Py_ssize_t j
    if b <= a:
        return False
    for j in range(a, b):
        if not Py_UNICODE_ISALNUM(<Py_UCS4>s[j]):
            return False
    return True


cdef inline bint _left_joiner(Py_UCS4 c):
    return c == u'-' or c == u'_' or c == u':' or c == u"'" or c == 0x2019 or c == u'+' or c == u'#'


cdef inline bint _edge_joiner(Py_UCS4 c):  # analysis._EDGE_JOINERS
    return c == u'.' or c == u'-' or c == u'_' or c == u':' or c == u"'" or c == 0x2019


cdef (Py_ssize_t, Py_ssize_t) _core(str raw):
    """``analysis._core(raw)`` as the bounds ``a, b`` of ``raw[a:b]``; ``b`` -1 for None. (A
    token whose whole is one word, or one word and ``.`` or ``:``, has that word for its core.)"""
    cdef Py_ssize_t a = 0, b = len(raw)
    while a < b and _left_joiner(raw[a]):
        a += 1
    if a < b and raw[a] == u'.':
        return 0, -1
    while b > a and _edge_joiner(raw[b - 1]):
        b -= 1
    if b == a or raw[b - 1] == u'+' or raw[b - 1] == u'#':
        return 0, -1
    return a, b


cdef class Analysis:
    """The compiled hot loop of one version 2, bigram analyzer (see the module docstring).

    ``expand``: tokens (a list of str) -> their terms (a list of tuples, ``_OVERLAP`` among
    them); ``cjk_stop``: the CJK stopwords; ``counts_type``: the dict subclass term counts are
    made of (``TermCounts``); ``overlap``: the marker of a compound's overlapping whole form."""

    cdef object expand, cjk_stop, counts_type, overlap_term
    # the word rules of the tokens that are one word (see _learn): the analyzer's stopwords, its
    # stemmer's stemWords (None: no stemming) and the longest word; max_chars 0: every token
    # goes to ``expand``
    cdef object stop, stem, dotted
    cdef Py_ssize_t max_chars
    # term -> its id: open addressing over the terms' own hashes and ``names`` (what a dict of
    # term -> int did, without a dict entry and an int object a term: ~45 bytes a term less,
    # 16 MiB in the worker of the realistic 100k build, whose table holds 354,000 terms)
    cdef int32_t* tslots      # slot -> term id, -1: empty; at least twice as many slots as terms
    cdef Py_ssize_t ntslots
    cdef list names           # id -> term
    cdef Py_ssize_t overlap   # id of the overlap marker
    # per term id
    cdef Py_ssize_t term_cap, _stamp_cap, _number_cap
    cdef int64_t* cnt
    cdef int64_t* stamp
    cdef int64_t* number      # its number in the local vocabulary of ``owner``, -1: none
    cdef int64_t clock
    # tokens -> their term ids
    cdef Entry* entries
    cdef Py_ssize_t nentries, entries_cap
    cdef int32_t* slots
    cdef Py_ssize_t nslots
    cdef Py_UCS4* keys
    cdef Py_ssize_t keys_len, keys_cap
    cdef int32_t* tids
    cdef Py_ssize_t tids_len, tids_cap
    # CJK unigram/bigram (c1 << 32 | c2) -> term id, -1 for a stopword
    cdef uint64_t* ckeys
    cdef int32_t* cvals
    cdef Py_ssize_t cslots, cused
    # the texts of one call: their tokens' entries, their CJK term ids, where each text ends
    cdef int32_t* words
    cdef Py_ssize_t words_len, words_cap
    cdef int32_t* cjk
    cdef Py_ssize_t cjk_len, cjk_cap
    cdef Py_ssize_t* ends
    cdef Py_ssize_t ends_cap
    cdef int32_t* pending
    cdef Py_ssize_t pending_len, pending_cap
    cdef Py_UCS4* tok
    cdef Py_ssize_t tok_cap
    cdef int64_t* order
    cdef Py_ssize_t order_cap
    # the local vocabulary numbered (pack): the analysis.Numbering whose numbers ``number``
    # holds (None: none), and how many terms it has
    cdef object owner
    cdef Py_ssize_t nlocal
    cdef bint busy  # a call is running (another thread's call meanwhile gets None: the Python path)

    def __cinit__(self, expand, cjk_stop, counts_type, str overlap, stop=frozenset(), stem=None,
                  Py_ssize_t max_chars=0, dotted=frozenset()):
        self.expand, self.cjk_stop, self.counts_type, self.overlap_term = expand, cjk_stop, counts_type, overlap
        self.stop, self.stem, self.max_chars, self.dotted = stop, stem, max_chars, dotted
        self.owner = None
        self.nlocal = -1
        self._clear_terms()

    def __dealloc__(self):
        free(self.cnt); free(self.stamp); free(self.number)
        free(self.entries); free(self.slots); free(self.keys); free(self.tids)
        free(self.ckeys); free(self.cvals); free(self.tslots)
        free(self.words); free(self.cjk); free(self.ends); free(self.pending); free(self.tok); free(self.order)

    # -- tables ------------------------------------------------------------
    cdef int _clear_memo(self) except -1:
        self.nentries = 0
        self.keys_len = 0
        self.tids_len = 0
        free(self.slots)
        self.slots = NULL
        self.nslots = 0
        self.slots = empty_slots(1024)
        self.nslots = 1024
        return 0

    cdef int _clear_terms(self) except -1:
        """Forget every term (their ids), and so the memos that hold ids; a numbering held here
        goes back to its dict first."""
        cdef Py_ssize_t i
        self._give_back()
        free(self.tslots)
        self.tslots = NULL
        self.ntslots = 0
        self.tslots = empty_slots(1024)
        self.ntslots = 1024
        self.names = []
        self.clock = 0
        self.nlocal = -1
        free(self.ckeys); free(self.cvals)
        self.ckeys = <uint64_t*>malloc(1024 * sizeof(uint64_t))
        self.cvals = <int32_t*>malloc(1024 * sizeof(int32_t))
        if self.ckeys == NULL or self.cvals == NULL:
            self.cslots = 0
            raise MemoryError()
        self.cslots = 1024
        self.cused = 0
        for i in range(self.cslots):
            self.ckeys[i] = 0
        self._clear_memo()
        self.overlap = self._intern(self.overlap_term)
        return 0

    cdef Py_ssize_t _slot(self, object term, long h) except -1:
        """The slot of ``term`` (hash ``h``) in ``tslots``: where its id is, else the empty slot
        it would take (equality as a dict's: the same object, or equal hashes and ``==``)."""
        cdef size_t mask = <size_t>(self.ntslots - 1)
        cdef size_t slot = (<size_t>h) & mask
        cdef int32_t tid
        cdef object other
        while True:
            tid = self.tslots[slot]
            if tid < 0:
                return <Py_ssize_t>slot
            other = <object>PyList_GET_ITEM(self.names, tid)
            if other is term or (PyObject_Hash(other) == h and other == term):
                return <Py_ssize_t>slot
            slot = (slot + 1) & mask

    cdef int _grow_term_slots(self) except -1:
        """Twice as many slots, every term placed again (a str keeps its hash: no rehashing)."""
        cdef Py_ssize_t n = self.ntslots * 2, i
        cdef int32_t* fresh = empty_slots(n)
        cdef size_t slot, mask = <size_t>(n - 1)
        for i in range(len(self.names)):
            slot = (<size_t>PyObject_Hash(<object>PyList_GET_ITEM(self.names, i))) & mask
            while fresh[slot] >= 0:
                slot = (slot + 1) & mask
            fresh[slot] = <int32_t>i
        free(self.tslots)
        self.tslots = fresh
        self.ntslots = n
        return 0

    cdef Py_ssize_t _intern(self, object term) except -1:
        """The id of ``term`` (a str), a new one when it has none."""
        cdef long h = PyObject_Hash(term)
        cdef Py_ssize_t slot = self._slot(term, h)
        cdef Py_ssize_t tid = self.tslots[slot]
        if tid >= 0:
            return tid
        tid = len(self.names)
        if tid >= self.term_cap:
            grow(<void**>&self.cnt, &self.term_cap, tid + 1, sizeof(int64_t))
            grow(<void**>&self.stamp, &self._stamp_cap, self.term_cap, sizeof(int64_t))
            grow(<void**>&self.number, &self._number_cap, self.term_cap, sizeof(int64_t))
        self.names.append(term)
        self.tslots[slot] = <int32_t>tid
        self.stamp[tid] = 0
        self.number[tid] = -1
        if 2 * (tid + 1) > self.ntslots:
            self._grow_term_slots()
        return tid

    cdef Py_ssize_t _cjk_term(self, uint32_t c1, uint32_t c2) except -2:
        """The id of the CJK unigram ``c1`` (``c2`` 0) or bigram ``c1 c2``; -1 for a stopword."""
        cdef uint64_t key = (<uint64_t>c1 << 32) | c2
        cdef uint64_t h = key * 0x9E3779B97F4A7C15ULL
        cdef Py_ssize_t mask = self.cslots - 1
        cdef Py_ssize_t i = <Py_ssize_t>((h >> 32) & mask)
        cdef Py_UCS4 pair[2]
        cdef object term
        cdef Py_ssize_t tid
        while self.ckeys[i] != 0:
            if self.ckeys[i] == key:
                return self.cvals[i]
            i = (i + 1) & mask
        pair[0] = <Py_UCS4>c1
        pair[1] = <Py_UCS4>c2
        term = PyUnicode_FromKindAndData(PyUnicode_4BYTE_KIND, pair, 1 if c2 == 0 else 2)
        tid = -1 if term in self.cjk_stop else self._intern(term)
        if (self.cused + 1) * 2 > self.cslots:
            self._grow_cjk()
            mask = self.cslots - 1
            i = <Py_ssize_t>((h >> 32) & mask)
            while self.ckeys[i] != 0:
                i = (i + 1) & mask
        self.ckeys[i] = key
        self.cvals[i] = <int32_t>tid
        self.cused += 1
        return tid

    cdef int _grow_cjk(self) except -1:
        cdef Py_ssize_t n = self.cslots * 2, i, j, mask = n - 1
        cdef uint64_t* ks = <uint64_t*>malloc(n * sizeof(uint64_t))
        cdef int32_t* vs = <int32_t*>malloc(n * sizeof(int32_t))
        if ks == NULL or vs == NULL:
            free(ks); free(vs)
            raise MemoryError()
        for i in range(n):
            ks[i] = 0
        for i in range(self.cslots):
            if self.ckeys[i] != 0:
                j = <Py_ssize_t>(((self.ckeys[i] * 0x9E3779B97F4A7C15ULL) >> 32) & mask)
                while ks[j] != 0:
                    j = (j + 1) & mask
                ks[j] = self.ckeys[i]
                vs[j] = self.cvals[i]
        free(self.ckeys); free(self.cvals)
        self.ckeys, self.cvals, self.cslots = ks, vs, n
        return 0

    cdef int _grow_slots(self) except -1:
        cdef Py_ssize_t n = self.nslots * 2, i, j, mask = n - 1
        cdef int32_t* s = <int32_t*>malloc(n * sizeof(int32_t))
        if s == NULL:
            raise MemoryError()
        for i in range(n):
            s[i] = -1
        for i in range(self.nentries):
            j = <Py_ssize_t>(self.entries[i].hash & mask)
            while s[j] != -1:
                j = (j + 1) & mask
            s[j] = <int32_t>i
        free(self.slots)
        self.slots, self.nslots = s, n
        return 0

    # -- splitting -----------------------------------------------------------
    cdef int _word(self, uint64_t h, Py_ssize_t m, list missing) except -1:
        """The token in ``tok[:m]`` (hash ``h``): its entry to ``words``, a new one learned later."""
        cdef Py_ssize_t mask = self.nslots - 1
        cdef Py_ssize_t i
        cdef int32_t e
        cdef Entry* ent
        h ^= h >> 29
        i = <Py_ssize_t>(h & mask)
        while True:
            e = self.slots[i]
            if e == -1:
                break
            ent = &self.entries[e]
            if ent.hash == h and ent.length == m and memcmp(self.keys + ent.key, self.tok, m * sizeof(Py_UCS4)) == 0:
                break
            i = (i + 1) & mask
        if e == -1:
            e = <int32_t>self.nentries
            grow(<void**>&self.entries, &self.entries_cap, e + 1, sizeof(Entry))
            grow(<void**>&self.keys, &self.keys_cap, self.keys_len + m, sizeof(Py_UCS4))
            memcpy(self.keys + self.keys_len, self.tok, m * sizeof(Py_UCS4))
            ent = &self.entries[e]
            ent.hash, ent.key, ent.length, ent.terms, ent.nterms = h, self.keys_len, m, 0, -1
            self.keys_len += m
            self.nentries += 1
            self.slots[i] = e
            grow(<void**>&self.pending, &self.pending_cap, self.pending_len + 1, sizeof(int32_t))
            self.pending[self.pending_len] = e
            self.pending_len += 1
            missing.append(PyUnicode_FromKindAndData(PyUnicode_4BYTE_KIND, self.tok, m))
            if self.nentries * 2 > self.nslots:
                self._grow_slots()
        grow(<void**>&self.words, &self.words_cap, self.words_len + 1, sizeof(int32_t))
        self.words[self.words_len] = e
        self.words_len += 1
        return 0

    cdef int _push_cjk(self, Py_ssize_t tid) except -1:
        if tid >= 0:
            grow(<void**>&self.cjk, &self.cjk_cap, self.cjk_len + 1, sizeof(int32_t))
            self.cjk[self.cjk_len] = <int32_t>tid
            self.cjk_len += 1
        return 0

    cdef int _split(self, list texts) except -1:
        """Split every text, then learn the new tokens' terms (one call of ``expand``)."""
        cdef Py_ssize_t t, n = len(texts), k, e, j
        cdef object text
        cdef list missing = []
        cdef list learned
        cdef tuple terms
        cdef int kind
        self.words_len = self.cjk_len = self.pending_len = 0
        grow(<void**>&self.ends, &self.ends_cap, 2 * n, sizeof(Py_ssize_t))
        try:
            for t in range(n):
                text = <object>PyList_GET_ITEM(texts, t)
                if not PyUnicode_IS_ASCII(text):
                    text = _normalize("NFKC", text).casefold()
                kind = PyUnicode_KIND(text)
                if kind == PyUnicode_1BYTE_KIND:
                    scan(self, <uint8_t*>PyUnicode_DATA(text), PyUnicode_GET_LENGTH(text), missing)
                elif kind == PyUnicode_2BYTE_KIND:
                    scan(self, <uint16_t*>PyUnicode_DATA(text), PyUnicode_GET_LENGTH(text), missing)
                else:
                    scan(self, <uint32_t*>PyUnicode_DATA(text), PyUnicode_GET_LENGTH(text), missing)
                self.ends[2 * t] = self.words_len
                self.ends[2 * t + 1] = self.cjk_len
                if t % 16 == 15:
                    # Let other threads in: in an analysis worker, the ones that receive texts and
                    # send results (they need the GIL, which this loop would hold for a whole part,
                    # milliseconds, while the writing process waits on a full pipe; the Python code
                    # gave it up every switch interval).
                    with nogil:
                        pass
            if missing:
                learned = self._learn(missing)
                for k in range(self.pending_len):
                    e = self.pending[k]
                    terms = learned[k]
                    grow(<void**>&self.tids, &self.tids_cap, self.tids_len + len(terms), sizeof(int32_t))
                    self.entries[e].terms = self.tids_len
                    for j in range(len(terms)):
                        self.tids[self.tids_len + j] = <int32_t>self._intern(terms[j])
                    self.tids_len += len(terms)
                    self.entries[e].nterms = len(terms)
        except BaseException:
            self._clear_memo()  # tokens met but not learned must not stay
            raise
        return 0

    cdef list _learn(self, list missing):
        """The terms of each of ``missing`` (tokens not met before, str), in order, by
        ``Analyzer._expand2``'s rules. Learned here: a token that is one word once the joining
        characters at its ends are stripped (``word``, ``word.``, ``-word``: no term for a
        stopword, else the word's stem), and one of words joined by single hyphens and dots
        (``_compound``); the words are stemmed in one batch. Every other token (a clitic, a
        symbol, a word past ``max_chars``...) goes to ``expand``. A process's first adds spent
        ~20% of their time learning new tokens in Python; 95% of SciFact's are learned here."""
        cdef Py_ssize_t n = len(missing), k, j, a, b, m
        cdef list out = [()] * n
        cdef list words = [], word_at = [], others = [], other_at = [], compounds = [], compound_at = []
        cdef list found, items
        cdef dict stems = {}
        cdef str tok, core
        cdef object word, v, t
        cdef int kind
        cdef bint whole
        cdef list terms
        if self.max_chars <= 0:  # no word rules given: every token to expand
            return self._expanded(missing)
        for k in range(n):
            tok = <str>PyList_GET_ITEM(missing, k)
            m = len(tok)
            a, b = _core(tok)
            if b < 0:  # (no core: a symbol such as c++ or .net)
                others.append(tok)
                other_at.append(k)
                continue
            if _alnum(tok, a, b):
                if b - a > self.max_chars:
                    others.append(tok)
                    other_at.append(k)
                    continue
                word = tok if a == 0 and b == m else tok[a:b]
                if word not in self.stop:
                    words.append(word)
                    word_at.append(k)
                continue
            core = tok[a:b]
            items = self._compound(core)
            if items is None:
                others.append(tok)
                other_at.append(k)
                continue
            for kind, v in items:
                if kind == _WORD or kind == _WHOLE_WORD:
                    stems[v] = ""
            compounds.append(items)
            compound_at.append(k)
        if others:
            found = self._expanded(others)
            for j in range(len(others)):
                out[<Py_ssize_t>other_at[j]] = found[j]
        a = len(words)
        for v in stems:
            if v not in self.stop:
                words.append(v)
        if words:
            found = list(self.stem(words)) if self.stem is not None else words
            if len(found) != len(words):
                raise RuntimeError("stem gave another number of results than words")
            for j in range(a):
                out[<Py_ssize_t>word_at[j]] = (found[j],)
            for j in range(a, len(words)):
                stems[words[j]] = found[j]
        for j in range(len(compounds)):
            terms = []
            whole = False  # the item before was a whole form with a term: this one is its first part
            for kind, v in <list>compounds[j]:
                t = stems[v] if kind == _WORD or kind == _WHOLE_WORD else v if kind == _TERM or kind == _WHOLE_TERM else ""
                if t:
                    terms.append(t)
                    if whole:
                        terms.append(self.overlap_term)
                whole = kind >= _WHOLE_WORD and bool(t)
            out[<Py_ssize_t>compound_at[j]] = tuple(terms)
        return out

    cdef list _expanded(self, list tokens):
        """``expand(tokens)``: one result a token."""
        cdef list found = list(self.expand(tokens))
        if len(found) != len(tokens):
            raise RuntimeError("expand gave another number of results than tokens")
        return found

    cdef object _compound(self, str core):
        """``analysis._joined_plan``'s (kind, value) items of ``core`` (a token's core, see
        :func:`_core`, that is not one word): words joined by single hyphens and dots
        (tissue-resident, 0.05, 24.7-fold, u.s.a); None for any other core (a clitic's
        apostrophe, ``_``, ``::``, ``..``), which the Python rules take."""
        cdef list segments, parts, items = []
        cdef str seg, first, second, p
        cdef Py_ssize_t i, j, ns
        cdef Py_UCS4 c, prev
        cdef bint letters
        if core.find(u"'") >= 0 or core.find(u"\u2019") >= 0:
            return None
        segments = core.split(u"-")
        for seg in segments:
            ns = len(seg)
            if ns == 0 or seg[0] == u'.' or seg[ns - 1] == u'.':
                return None
            prev = 0
            for j in range(ns):
                c = seg[j]
                if c == u'.':
                    if prev == u'.':
                        return None
                elif not Py_UNICODE_ISALNUM(c):
                    return None
                prev = c
        if len(segments) > 1:
            first, second = segments[0], segments[1]
            if len(first) == 1 and not Py_UNICODE_ISDECIMAL(first[0]) and _alnum(second, 0, len(second)) \
                    and len(second) < self.max_chars:
                items.append((_WHOLE_WORD, first + second))
        for seg in segments:
            if _alnum(seg, 0, len(seg)):
                self._word_items(seg, items)
                continue
            parts = seg.split(u".")  # words joined by dots
            letters = True
            for p in parts:
                if len(p) != 1 or Py_UNICODE_ISDECIMAL(p[0]):
                    letters = False
                    break
            if letters:  # u.s.a, e.g
                p = u"".join(parts)
                items.append((_DROP, seg) if p in self.dotted else (_WORD, p))
                continue
            if len(seg) <= self.max_chars:
                items.append((_WHOLE_TERM, seg))
            for p in parts:
                self._word_items(p, items)
        return items

    cdef int _word_items(self, str word, list items) except -1:
        """A word's items, cut at ``max_chars`` (``analysis._word_items``)."""
        cdef Py_ssize_t i, n = len(word)
        if n <= self.max_chars:
            items.append((_WORD, word))
            return 0
        for i in range(0, n, self.max_chars):
            items.append((_WORD, word[i:i + self.max_chars]))
        return 0

    cdef Py_ssize_t _count(self, Py_ssize_t t, Py_ssize_t* overlaps) except -1:
        """Count text ``t`` of the last split: its distinct term ids to ``order`` (first
        appearance, word terms then CJK terms), their counts in ``cnt``; returns how many."""
        cdef Py_ssize_t w0 = self.ends[2 * t - 2] if t > 0 else 0
        cdef Py_ssize_t c0 = self.ends[2 * t - 1] if t > 0 else 0
        cdef Py_ssize_t w1 = self.ends[2 * t], c1 = self.ends[2 * t + 1]
        cdef Py_ssize_t k, j, norder = 0, ov = 0, need = c1 - c0
        cdef int64_t tid, clock
        cdef Entry* ent
        for k in range(w0, w1):
            need += self.entries[self.words[k]].nterms
        grow(<void**>&self.order, &self.order_cap, need, sizeof(int64_t))
        self.clock += 1
        clock = self.clock
        for k in range(w0, w1):
            ent = &self.entries[self.words[k]]
            for j in range(ent.terms, ent.terms + ent.nterms):
                tid = self.tids[j]
                if tid == self.overlap:
                    ov += 1
                else:
                    norder = _count(tid, clock, self.stamp, self.cnt, self.order, norder)
        for k in range(c0, c1):
            norder = _count(self.cjk[k], clock, self.stamp, self.cnt, self.order, norder)
        overlaps[0] = ov
        return norder

    cdef int _bound(self, Py_ssize_t keep) except -1:
        if len(self.names) > MAX_TERMS and len(self.names) > keep:
            self._clear_terms()
        elif self.nentries > MEMO_TOKENS or self.keys_len > MEMO_CHARS:
            self._clear_memo()
        return 0

    # -- the analyzer's calls --------------------------------------------------
    def counts(self, list texts):
        """``Analyzer.term_counts`` of each text (``TermCounts``); None when a text is not a str
        (the reference raises its own error then) or another thread's call is running (the
        buffers of a call are this object's; the caller runs the Python code instead)."""
        cdef Py_ssize_t t, k, norder, ov
        cdef object out, names = self.names
        cdef list result = []
        cdef int64_t tid
        for text in texts:
            if not isinstance(text, str):
                return None
        if self.busy:
            return None
        self.busy = True  # (tested and set holding the GIL: no other thread runs in between)
        try:
            self._bound(0)
            self._split(texts)
            names = self.names
            new = self.counts_type.__new__
            for t in range(len(texts)):
                norder = self._count(t, &ov)
                out = new(self.counts_type)
                for k in range(norder):
                    tid = self.order[k]
                    PyDict_SetItem(out, <object>PyList_GET_ITEM(names, tid), self.cnt[tid])
                if ov:
                    out.overlaps = ov
                result.append(out)
        finally:
            self.busy = False
        return result

    cdef int _give_back(self) except -1:
        """Put the numbering held here into its Numbering's dict (term -> number) and let it go."""
        cdef Py_ssize_t i
        cdef dict terms = {}
        cdef object owner = self.owner
        if owner is None:
            return 0
        for i in range(len(self.names)):
            if self.number[i] >= 0:
                terms[<object>PyList_GET_ITEM(self.names, i)] = self.number[i]
                self.number[i] = -1
        self.owner = None
        self.nlocal = -1
        owner.terms = terms
        owner.holder = None
        return 0

    def give_back(self, numbering):
        """``analysis.Numbering.terms_now``: the numbers of ``numbering``, if held here, back into
        its dict. (A call running in another thread with it would be numbering it: refused.)"""
        if self.owner is not numbering:
            return
        if self.busy:
            raise RuntimeError("a worker numbering is being numbered by another thread")
        self._give_back()

    cdef int _take(self, object numbering) except -1:
        """Hold ``numbering``: its dict (complete: no object holds it) read into ``number``, then
        emptied (the numbers live here until given back)."""
        cdef dict terms = numbering.terms
        self._give_back()  # (another numbering held here goes back first: one numbering at a time)
        for term, n in terms.items():
            self.number[self._intern(term)] = n
        self.owner = numbering
        self.nlocal = len(terms)
        numbering.terms = {}
        numbering.holder = self
        return 0

    def pack(self, list texts, object numbering, Py_ssize_t limit):
        """``analysis._pack``: (restarted, new terms joined by NUL, term numbers, counts, sizes,
        overlaps), numbering ``numbering`` (an ``analysis.Numbering``; started again when it has
        more than ``limit`` terms); None when a text is not a str or another thread's call is
        running."""
        for text in texts:
            if not isinstance(text, str):
                return None
        if self.busy:
            return None
        holder = numbering.holder
        if holder is not None and holder is not self:
            holder.give_back(numbering)  # (another compiled analysis numbered it last)
        self.busy = True
        try:
            return self._pack(texts, numbering, limit)
        finally:
            self.busy = False

    cdef object _pack(self, list texts, object numbering, Py_ssize_t limit):
        cdef bint restarted = False
        cdef Py_ssize_t t, k, norder, ov, total = 0, n = len(texts)
        cdef int64_t tid
        cdef list new = [], names
        cdef uint32_t* numbers
        cdef uint32_t* counts
        cdef uint32_t* sizes
        cdef uint32_t* overlaps
        cdef object out
        if self.owner is numbering:
            if self.nlocal > limit:  # started again: the numbers held here are dropped
                self.owner = None
                numbering.holder = None
                restarted = True
                self._clear_terms()  # (the terms numbered, more than limit, go with their numbers)
        elif len(numbering.terms) > limit:
            numbering.terms.clear()
            restarted = True
            self._clear_terms()
        self._bound(2 * limit)  # (the terms numbered stay until the numbering starts again)
        if self.owner is not numbering:  # (_bound may have given it back)
            self._take(numbering)
        self._split(texts)
        names = self.names
        for k in range(self.words_len):  # (an upper bound of the terms of all texts)
            total += self.entries[self.words[k]].nterms
        total += self.cjk_len
        numbers = <uint32_t*>malloc((total + 1) * sizeof(uint32_t))
        counts = <uint32_t*>malloc((total + 1) * sizeof(uint32_t))
        sizes = <uint32_t*>malloc((n + 1) * sizeof(uint32_t))
        overlaps = <uint32_t*>malloc((n + 1) * sizeof(uint32_t))
        try:
            if numbers == NULL or counts == NULL or sizes == NULL or overlaps == NULL:
                raise MemoryError()
            total = 0
            for t in range(n):
                norder = self._count(t, &ov)
                for k in range(norder):
                    tid = self.order[k]
                    if self.number[tid] < 0:
                        self.number[tid] = self.nlocal
                        new.append(<object>PyList_GET_ITEM(names, tid))
                        self.nlocal += 1
                    numbers[total + k] = <uint32_t>self.number[tid]
                    counts[total + k] = <uint32_t>self.cnt[tid]
                total += norder
                sizes[t] = <uint32_t>norder
                overlaps[t] = <uint32_t>ov
            out = (restarted, "\0".join(new),
                   PyBytes_FromStringAndSize(<char*>numbers, total * sizeof(uint32_t)),
                   PyBytes_FromStringAndSize(<char*>counts, total * sizeof(uint32_t)),
                   PyBytes_FromStringAndSize(<char*>sizes, n * sizeof(uint32_t)),
                   PyBytes_FromStringAndSize(<char*>overlaps, n * sizeof(uint32_t)))
        finally:
            free(numbers); free(counts); free(sizes); free(overlaps)
        return out


cdef int scan(Analysis self, const uchar* s, Py_ssize_t n, list missing) except -1:
    """Split one (normalized) text: its word tokens to ``words``, its CJK terms to ``cjk``."""
    cdef Py_ssize_t i = 0, a, j, m
    cdef uint32_t c
    cdef uint64_t h
    while i < n:
        c = s[i]
        if is_cjk(c):
            a = i
            while i < n and is_cjk(s[i]):
                i += 1
            for j in range(a, i):  # the unigrams, then the bigrams (_cjk_terms)
                self._push_cjk(self._cjk_term(s[j], 0))
            for j in range(a, i - 1):
                self._push_cjk(self._cjk_term(s[j], s[j + 1]))
            continue
        if not is_word(c):
            i += 1
            continue
        h = FNV_OFFSET
        m = 0
        while i < n:
            c = s[i]
            if c < 128:
                if not ASCII_WORD[c]:
                    break
                if 65 <= c <= 90:  # str.lower of an ASCII text (a normalized one is casefolded already)
                    c += 32
            elif not is_word(c):
                break
            if m >= self.tok_cap:
                grow(<void**>&self.tok, &self.tok_cap, m + 1, sizeof(Py_UCS4))
            self.tok[m] = <Py_UCS4>c
            h = (h ^ c) * FNV_PRIME
            m += 1
            i += 1
        self._word(h, m, missing)
    return 0


# -- tokens with their offsets (``Analyzer.token_table``: highlights) -------------------------
#
# The same runs as ``scan`` (and the reference's regular expressions): maximal runs of CJK
# characters, and of word characters. A word run's tokens come from the analyzer's memo of
# runs (``Analyzer._tok_memo``: run -> ([(term, start, end, position)], width), filled in Python
# by ``learn`` for the runs it lacks, all of a text's at once); a CJK run's are made here, as
# ``Analyzer._cjk_spans`` makes them: per character its unigram then its bigram with the next,
# each at the character's place, the stopwords left out.

cdef Py_ssize_t _token_runs(const uchar* s, Py_ssize_t n, Py_ssize_t** bounds, Py_ssize_t* cap) except -1:
    """The runs of a normalized text as (start, end, is CJK) triples in ``bounds``; their count."""
    cdef Py_ssize_t i = 0, a, r = 0
    cdef uint32_t c
    cdef bint cjk
    while i < n:
        c = s[i]
        cjk = is_cjk(c)
        if not cjk and not is_word(c):
            i += 1
            continue
        a = i
        i += 1
        if cjk:
            while i < n and is_cjk(s[i]):
                i += 1
        else:
            while i < n and is_word(s[i]):
                i += 1
        if 3 * (r + 1) > cap[0]:
            grow(<void**>bounds, cap, 3 * (r + 1), sizeof(Py_ssize_t))
        bounds[0][3 * r] = a
        bounds[0][3 * r + 1] = i
        bounds[0][3 * r + 2] = cjk
        r += 1
    return r


cdef inline Py_ssize_t _mapped(object table, Py_ssize_t i) except? -1:
    return i if table is None else <Py_ssize_t>(<list>table)[i]


cdef int _emit(list terms, int32_t** offs, Py_ssize_t* cap, Py_ssize_t* m, object term, Py_ssize_t a,
               Py_ssize_t b, Py_ssize_t position, object starts, object ends) except -1:
    """One token: its term, and its start, end (offsets in the original text, through the
    normalization maps) and position."""
    if m[0] + 3 > cap[0]:
        grow(<void**>offs, cap, m[0] + 3, sizeof(int32_t))
    terms.append(term)
    offs[0][m[0]] = <int32_t>_mapped(starts, a)
    offs[0][m[0] + 1] = <int32_t>(b if ends is None else <Py_ssize_t>(<list>ends)[b - 1])
    offs[0][m[0] + 2] = <int32_t>position
    m[0] += 3
    return 0


def token_table(str norm, dict memo, object starts, object ends, object cjk_stop, object learn):
    """The tokens of a normalized text as ``(terms, offsets)``: each token's term, and a bytes
    of int32 (start, end, position) triples (``Analyzer.tokens``' fields, in its order);
    None for a text too long for 32-bit offsets. ``starts``/``ends``: ``_normalize_map``'s
    (None: the same offsets); ``learn``: word runs not in ``memo`` (a list, each once) -> their
    memo entries, in order (it also remembers them)."""
    cdef Py_ssize_t n = PyUnicode_GET_LENGTH(norm), nruns, r, a, b, j, pos = 0, width
    cdef Py_ssize_t bcap = 0, ocap = 0, m = 0
    cdef int kind = PyUnicode_KIND(norm)
    cdef Py_ssize_t* bounds = NULL
    cdef int32_t* offs = NULL
    cdef list terms = [], entries = [], missing = []
    cdef dict learned = {}
    cdef tuple tok, entry
    cdef PyObject* got
    if n >= 0x7FFFFFFF:
        return None
    if (starts is not None and type(starts) is not list) or (ends is not None and type(ends) is not list):
        raise TypeError("starts and ends must be lists or None")
    try:
        if kind == PyUnicode_1BYTE_KIND:
            nruns = _token_runs(<const uint8_t*>PyUnicode_DATA(norm), n, &bounds, &bcap)
        elif kind == PyUnicode_2BYTE_KIND:
            nruns = _token_runs(<const uint16_t*>PyUnicode_DATA(norm), n, &bounds, &bcap)
        else:
            nruns = _token_runs(<const uint32_t*>PyUnicode_DATA(norm), n, &bounds, &bcap)
        for r in range(nruns):  # the memo's entries of the word runs (held: ``learn`` may empty it)
            if bounds[3 * r + 2]:
                entries.append(None)
                continue
            run = norm[bounds[3 * r]:bounds[3 * r + 1]]
            got = PyDict_GetItem(memo, run)
            if got != NULL:
                entries.append(<object>got)
            else:
                if run not in learned:
                    learned[run] = None
                    missing.append(run)
                entries.append(run)
        if missing:
            found = learn(missing)
            if len(found) != len(missing):
                raise ValueError("learn gave another number of entries than runs")
            for run, entry in zip(missing, found):
                learned[run] = entry
        for r in range(nruns):
            a = bounds[3 * r]
            b = bounds[3 * r + 1]
            if bounds[3 * r + 2]:
                for j in range(a, b):
                    term = norm[j:j + 1]
                    if term not in cjk_stop:
                        _emit(terms, &offs, &ocap, &m, term, j, j + 1, pos + j - a, starts, ends)
                    if j + 1 < b:
                        term = norm[j:j + 2]
                        if term not in cjk_stop:
                            _emit(terms, &offs, &ocap, &m, term, j, j + 2, pos + j - a, starts, ends)
                pos += b - a
                continue
            item = entries[r]
            entry = learned[item] if type(item) is str else <tuple>item
            for tok in <list>entry[0]:
                _emit(terms, &offs, &ocap, &m, tok[0], a + <Py_ssize_t>tok[1], a + <Py_ssize_t>tok[2],
                      pos + <Py_ssize_t>tok[3], starts, ends)
            width = entry[1]
            pos += width
        return terms, PyBytes_FromStringAndSize(<char*>offs, m * sizeof(int32_t))
    finally:
        free(bounds)
        free(offs)
