# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""One hit per passage in C: a passage's word 3-shingles and which of a search's hits share
enough of them, and the hits themselves (the compiled half of :mod:`ragdb.index.hits`, which
holds the numpy reference, the definitions and the reasons).

The values are numpy's, bit for bit (the same uint64 arithmetic: wrapping multiply-adds and
the splitmix64 finalizer, each shingle's low 32 bits kept, as bytes of native uint32), so the
two paths give the same shingle sets and a cache may hold either; the duplicate test is the
same double arithmetic (no fused multiply-add: setup.py).

Why hand-written rather than a library: the tokenization must be exactly the reference's
(its regular expressions, Python's ``str.isalnum`` and ``str.isspace``), which no hashing or
MinHash package does, and MinHash (datasketch) estimates what is computed here exactly, for
the ~150 hits of one search, in less time than its Python calls take.
"""

from cpython.unicode cimport Py_UNICODE_ISALNUM, Py_UNICODE_ISSPACE
from libc.stdint cimport uint64_t, int64_t, int32_t, uint32_t, uint16_t, uint8_t
from libc.stdlib cimport calloc, malloc, free, qsort
from libc.string cimport memcpy, memset, strcmp
from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING, PyBytes_CheckExact
from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_C_CONTIGUOUS, PyBUF_FORMAT, PyBUF_READ
from cpython.memoryview cimport PyMemoryView_FromMemory


# The Unicode tables (ragdb/index/unitables.py), written by setup.py at build time as constant
# data: a process reads them where they lie, no page of them in memory until a search reads it
cdef extern from "ragdb_unitables.h":
    const char* RAGDB_UNIDATA_VERSION
    const uint32_t RAGDB_COMPAT_TABLE[0x10000]
    const uint32_t RAGDB_RAW_TABLE[0x10000]
    const uint32_t RAGDB_NFKC_TABLE[0x10000]


cdef extern from "Python.h":
    int PyObject_GenericSetAttr(object o, object name, object value) except -1
    int PyUnicode_KIND(object o)
    void* PyUnicode_DATA(object o)
    Py_ssize_t PyUnicode_GET_LENGTH(object o)
    Py_UCS4 PyUnicode_READ(int kind, void* data, Py_ssize_t index) nogil
    bint PyUnicode_IS_ASCII(object o)
    object PyUnicode_FromKindAndData(int kind, const void* buffer, Py_ssize_t size)
    int PyUnicode_4BYTE_KIND

# the constants of ragdb.index.hits (the numpy reference)
cdef uint64_t GOLDEN = 0x9E3779B97F4A7C15ULL
cdef uint64_t MIX1 = 0x9E3779B97F4A7C15ULL
cdef uint64_t MIX2 = 0xC2B2AE3D27D4EB4FULL
DEF MAX_MARKUP = 200  # the longest HTML tag the reference's <[^<>\n]{1,200}> removes
DEF TABLE = 256        # positions whose multipliers are precomputed
cdef uint32_t MANY = 0xFFFFFFFFU  # in a case folding table: the character folds to more than one

cdef uint64_t _POSITION[TABLE]


cdef inline uint64_t fmix(uint64_t z) nogil:
    """splitmix64's finalizer (``hits._fmix``)."""
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL
    return z ^ (z >> 31)


cdef inline uint64_t position(Py_ssize_t i) nogil:
    """The multiplier of a word's i-th character (``hits._positions``)."""
    if i < TABLE:
        return _POSITION[i]
    return fmix(<uint64_t>(i + 1) * GOLDEN) | 1


cdef Py_ssize_t _i
for _i in range(TABLE):
    _POSITION[_i] = fmix(<uint64_t>(_i + 1) * GOLDEN) | 1


cdef inline bint is_cjk(Py_UCS4 c) nogil:
    # hits._CJK: each such character is a word of its own
    return ((0x3040 <= c <= 0x30FF) or (0x3400 <= c <= 0x4DBF) or (0x4E00 <= c <= 0x9FFF)
            or (0xAC00 <= c <= 0xD7AF) or (0xF900 <= c <= 0xFAFF))


cdef int _cmp_int32(const void* a, const void* b) noexcept nogil:
    cdef int32_t x = (<const int32_t*>a)[0], y = (<const int32_t*>b)[0]
    return (x > y) - (x < y)


# ASCII word characters of the reference's regular expressions: 1 for str.isalnum ('_' not)
cdef unsigned char _ASCII[128]
for _i in range(128):
    _ASCII[_i] = 1 if (_i != 0x5F and Py_UNICODE_ISALNUM(<Py_UCS4>_i)) else 0


# A text's characters as its str stores them (PEP 393: 1, 2 or 4 bytes each): words_raw and
# markup_end_raw are compiled once per width, so their loops read them without a switch on the
# width per character.
ctypedef fused chars_t:
    uint8_t
    uint16_t
    uint32_t


cdef Py_ssize_t markup_end_raw(const chars_t* s, Py_ssize_t n, Py_ssize_t i) noexcept:
    """Where the markup at ``s[i]`` (a ``]`` or ``<``) ends, -1 where none starts there: the
    reference's ``_MARKUP`` (``\\]\\([^)\\]\\s]*\\)`` and ``<[^<>\\n]{1,200}>``, ``\\s`` being
    ``str.isspace``) at one place, in text of any width (ASCII text's too: :func:`words_ascii`)."""
    cdef Py_ssize_t j
    cdef Py_UCS4 d
    if s[i] == 0x5D:  # ']'
        if i + 1 >= n or s[i + 1] != 0x28:  # '('
            return -1
        j = i + 2
        while j < n:
            d = s[j]
            if d == 0x29:  # ')'
                return j + 1
            if d == 0x5D or Py_UNICODE_ISSPACE(d):  # ']': see the reference
                return -1
            j += 1
        return -1
    j = i + 1  # '<'
    while j < n and j - i - 1 <= MAX_MARKUP:
        d = s[j]
        if d == 0x3E:  # '>'
            return j + 1 if j > i + 1 else -1
        if d == 0x0A or d == 0x3C:  # '<': see the reference
            return -1
        j += 1
    return -1


cdef Py_ssize_t words_ascii(const uint8_t* s, Py_ssize_t n, uint64_t* words) noexcept:
    """The word hashes of raw ASCII text (markup skipped, letters lowered) into ``words``; their count."""
    cdef Py_ssize_t i = 0, end, length = 0, nwords = 0
    cdef unsigned char c
    cdef uint64_t h = 0, code
    while i < n:
        c = s[i]
        if _ASCII[c] == 1:
            code = c + 32 if 0x41 <= c <= 0x5A else c
            h += (code + 1) * position(length)
            length += 1
            i += 1
            continue
        if length:
            words[nwords] = fmix(h + <uint64_t>length * GOLDEN)
            nwords += 1
            length = 0
            h = 0
        if c == 0x5D or c == 0x3C:
            end = markup_end_raw(s, n, i)
            if end > 0:
                i = end
                continue
        i += 1
    if length:
        words[nwords] = fmix(h + <uint64_t>length * GOLDEN)
        nwords += 1
    return nwords


cdef Py_ssize_t words_prepared(int kind, void* data, Py_ssize_t n, uint64_t* words) noexcept:
    """The word hashes of normalized, case-folded text without markup into ``words``; their
    count (the fallback of :func:`shingles_raw`: text Python prepared)."""
    cdef Py_ssize_t i, length = 0, nwords = 0
    cdef Py_UCS4 c
    cdef uint64_t h = 0
    for i in range(n):
        c = PyUnicode_READ(kind, data, i)
        if is_cjk(c):
            if length:
                words[nwords] = fmix(h + <uint64_t>length * GOLDEN)
                nwords += 1
                length = 0
                h = 0
            words[nwords] = fmix((<uint64_t>c + 1) * _POSITION[0] + GOLDEN)
            nwords += 1
        elif (_ASCII[c] == 1) if c < 128 else Py_UNICODE_ISALNUM(c):  # letters and digits, not '_'
            h += (<uint64_t>c + 1) * position(length)
            length += 1
        elif length:
            words[nwords] = fmix(h + <uint64_t>length * GOLDEN)
            nwords += 1
            length = 0
            h = 0
    if length:
        words[nwords] = fmix(h + <uint64_t>length * GOLDEN)
        nwords += 1
    return nwords


cdef Py_ssize_t words_raw(const chars_t* s, Py_ssize_t n, uint64_t* words, const uint32_t* table) noexcept:
    """The word hashes of NFKC-normalized text (markup in it, not case folded) into ``words``;
    their count, or -1 where ``table`` cannot case fold a character outside markup (it folds to
    more than one, or it is a letter or digit past the BMP). ``table`` (``hits._raw_table``):
    each BMP character's case folding in its low 16 bits and the folded character's class in
    bits 24-25 (1 a letter or digit, 2 a CJK character), MANY where it folds to more than one.
    Markup is found on the characters before folding, as the reference removes it before it
    case folds (``str.casefold`` folds each character on its own)."""
    cdef Py_ssize_t i = 0, end, length = 0, nwords = 0
    cdef Py_UCS4 c
    cdef uint32_t e, cls
    cdef uint64_t h = 0
    while i < n:
        c = s[i]
        if chars_t is uint8_t or c < 0x10000:
            e = table[c]
            if e == MANY:
                return -1
        elif Py_UNICODE_ISALNUM(c):  # (past the table: no class or folding of a letter)
            return -1
        else:
            e = 0
        cls = e >> 24
        if cls == 1:
            h += (<uint64_t>(e & 0xFFFF) + 1) * position(length)
            length += 1
            i += 1
            continue
        if length:
            words[nwords] = fmix(h + <uint64_t>length * GOLDEN)
            nwords += 1
            length = 0
            h = 0
        if cls == 2:
            words[nwords] = fmix((<uint64_t>(e & 0xFFFF) + 1) * _POSITION[0] + GOLDEN)
            nwords += 1
        elif c == 0x5D or c == 0x3C:
            end = markup_end_raw(s, n, i)
            if end > 0:
                i = end
                continue
        i += 1
    if length:
        words[nwords] = fmix(h + <uint64_t>length * GOLDEN)
        nwords += 1
    return nwords


DEF SAFE = 0x4000000  # bit 26 of an entry of hits._nfkc_table (hits._NFKC_SAFE)


cdef Py_ssize_t markup_end_nfkc(const chars_t* s, Py_ssize_t n, Py_ssize_t i, const uint32_t* table) noexcept:
    """:func:`markup_end_raw` on the characters' NFKC forms, as ``table`` (``hits._nfkc_table``)
    gives them: where the markup at ``s[i]`` ends, -1 where none starts there, -2 at a
    character the table has no safe form of (:func:`words_nfkc` then gives up)."""
    cdef Py_ssize_t j
    cdef Py_UCS4 c
    cdef uint32_t e, d
    if (table[s[i]] & 0xFFFF) == 0x5D:  # ']'
        if i + 1 >= n:
            return -1
        c = s[i + 1]
        if chars_t is not uint8_t and c >= 0x10000:
            return -2
        e = table[c]
        if not (e & SAFE):
            return -2
        if (e & 0xFFFF) != 0x28:  # '('
            return -1
        j = i + 2
        while j < n:
            c = s[j]
            if chars_t is not uint8_t and c >= 0x10000:
                return -2
            e = table[c]
            if not (e & SAFE):
                return -2
            d = e & 0xFFFF
            if d == 0x29:  # ')'
                return j + 1
            if d == 0x5D or Py_UNICODE_ISSPACE(d):  # ']': see the reference
                return -1
            j += 1
        return -1
    j = i + 1  # '<'
    while j < n and j - i - 1 <= MAX_MARKUP:
        c = s[j]
        if chars_t is not uint8_t and c >= 0x10000:
            return -2
        e = table[c]
        if not (e & SAFE):
            return -2
        d = e & 0xFFFF
        if d == 0x3E:  # '>'
            return j + 1 if j > i + 1 else -1
        if d == 0x0A or d == 0x3C:  # '<': see the reference
            return -1
        j += 1
    return -1


cdef Py_ssize_t words_nfkc(const chars_t* s, Py_ssize_t n, uint64_t* words, const uint32_t* table) noexcept:
    """The word hashes of the NFKC form of ``s`` (any text: markup in it, not case folded) into
    ``words``; their count, or -1 at the first character whose entry in ``table``
    (``hits._nfkc_table``) lacks SAFE, or past the BMP, met as a character or while looking
    for the end of markup (:func:`markup_end_nfkc`). Where every character has SAFE, the
    text's NFKC form is each character's one-character form in turn (``hits._nfkc_table`` says
    why), and the words are :func:`words_raw`'s of that form, read here in the same pass.
    The CJK unified ideographs (most of a Chinese text) are their own forms, words of their own,
    and are not looked up: the table's entries for them are spread over 84 KB of it."""
    cdef Py_ssize_t i = 0, end, length = 0, nwords = 0
    cdef Py_UCS4 c
    cdef uint32_t e, cls
    cdef uint64_t h = 0
    while i < n:
        c = s[i]
        if chars_t is not uint8_t and 0x4E00 <= c <= 0x9FFF:  # (the table's entry: c, class 2, SAFE)
            if length:
                words[nwords] = fmix(h + <uint64_t>length * GOLDEN)
                nwords += 1
                length = 0
                h = 0
            words[nwords] = fmix((<uint64_t>c + 1) * _POSITION[0] + GOLDEN)
            nwords += 1
            i += 1
            continue
        if chars_t is not uint8_t and c >= 0x10000:
            return -1
        e = table[c]
        if not (e & SAFE):
            return -1
        cls = (e >> 24) & 3
        if cls == 1:
            h += (<uint64_t>(e & 0xFFFF) + 1) * position(length)
            length += 1
            i += 1
            continue
        if length:
            words[nwords] = fmix(h + <uint64_t>length * GOLDEN)
            nwords += 1
            length = 0
            h = 0
        if cls == 2:
            words[nwords] = fmix((<uint64_t>(e & 0xFFFF) + 1) * _POSITION[0] + GOLDEN)
            nwords += 1
        elif (e & 0xFFFF) == 0x5D or (e & 0xFFFF) == 0x3C:
            end = markup_end_nfkc(s, n, i, table)
            if end == -2:
                return -1
            if end > 0:
                i = end
                continue
        i += 1
    if length:
        words[nwords] = fmix(h + <uint64_t>length * GOLDEN)
        nwords += 1
    return nwords


cdef object to_bytes(const uint64_t* values, Py_ssize_t n):
    """A bytes object of the low 32 bits of each of ``values``, native uint32 (what a search
    keeps of a passage: 4 bytes a shingle and a 33-byte header, where an int64 array took 8 and
    ~110; ``hits.passage_shingles`` says why 32 bits are enough)."""
    cdef bytes out = PyBytes_FromStringAndSize(NULL, n * 4)
    cdef uint32_t* dst = <uint32_t*>PyBytes_AS_STRING(out)
    cdef Py_ssize_t k
    for k in range(n):
        dst[k] = <uint32_t>values[k]
    return out


def shingles(str text, bint markup):
    """The word 3-shingles of ``text`` in text order, a repeated one repeated
    (``hits.passage_shingles``): with ``markup`` the text is raw ASCII (markup removed and
    letters lowered here), else it is already normalized, without markup and case folded
    (non-ASCII text, prepared in Python)."""
    cdef int kind = PyUnicode_KIND(text)
    cdef void* data = PyUnicode_DATA(text)
    cdef Py_ssize_t n = PyUnicode_GET_LENGTH(text), nwords
    cdef uint64_t* words
    if markup and not PyUnicode_IS_ASCII(text):
        raise ValueError("markup=True takes ASCII text only")
    words = <uint64_t*>malloc((n + 1) * sizeof(uint64_t))
    if words == NULL:
        raise MemoryError()
    try:
        if markup:
            nwords = words_ascii(<const uint8_t*>data, n, words)
        else:
            nwords = words_prepared(kind, data, n, words)
        return from_words(words, nwords)
    finally:
        free(words)


def shingles_raw(str text, const uint32_t[::1] table):
    """:func:`shingles` of ``text`` (NFKC-normalized, markup in it, not case folded): markup
    removed and characters case folded and classed by ``table`` (``hits._raw_table``, 65,536
    entries) as the words are read, in one pass; None where the table cannot fold a character
    (:func:`words_raw`), which Python then prepares."""
    return _table_shingles(text, table, False)


def shingles_nfkc(str text, const uint32_t[::1] table):
    """:func:`shingles` of ``text`` (any text: not normalized, markup in it, not case folded)
    in one pass where every character has a safe entry in ``table`` (``hits._nfkc_table``,
    65,536 entries): the text's NFKC form, markup removed, case folded, without making any of
    them; None where a character has none, which Python then normalizes (:func:`words_nfkc`)."""
    return _table_shingles(text, table, True)


cdef object _table_shingles(str text, const uint32_t[::1] table, bint nfkc):
    """:func:`shingles_nfkc` (``nfkc``) or :func:`shingles_raw`: the words read through ``table``
    by :func:`words_nfkc` or :func:`words_raw`, for the width of the text's characters."""
    cdef int kind = PyUnicode_KIND(text)
    cdef void* data = PyUnicode_DATA(text)
    cdef Py_ssize_t n = PyUnicode_GET_LENGTH(text), nwords
    cdef uint64_t* words
    if table.shape[0] != 0x10000:
        raise ValueError("the table holds the 65,536 BMP characters")
    words = <uint64_t*>malloc((n + 1) * sizeof(uint64_t))
    if words == NULL:
        raise MemoryError()
    try:
        if kind == 1:
            nwords = (words_nfkc(<const uint8_t*>data, n, words, &table[0]) if nfkc
                      else words_raw(<const uint8_t*>data, n, words, &table[0]))
        elif kind == 2:
            nwords = (words_nfkc(<const uint16_t*>data, n, words, &table[0]) if nfkc
                      else words_raw(<const uint16_t*>data, n, words, &table[0]))
        else:
            nwords = (words_nfkc(<const uint32_t*>data, n, words, &table[0]) if nfkc
                      else words_raw(<const uint32_t*>data, n, words, &table[0]))
        if nwords < 0:
            return None
        return from_words(words, nwords)
    finally:
        free(words)


cdef object from_words(uint64_t* words, Py_ssize_t nwords):
    """The shingles of the word hashes ``words`` (overwritten), as :func:`shingles` returns them."""
    cdef uint64_t h
    cdef Py_ssize_t k
    if nwords < 3:  # one shingle of all the words, none without words
        h = words[0] * MIX1 if nwords else 0
        if nwords == 2:
            h += words[1] * MIX2
        return to_bytes(&h, 1 if nwords else 0)
    for k in range(nwords - 2):  # in place: word k is read before shingle k is written
        words[k] = words[k] * MIX1 + words[k + 1] * MIX2 + words[k + 2]
    return to_bytes(words, nwords - 2)


def fold_compat(str text, const uint32_t[::1] table):
    """``text`` with each character ``c`` below ``len(table)`` replaced by ``table[c]`` (a
    character of its own where ``table[c] == c``): ``hits._compat_table``, which maps a
    character to its NFKC form where that is one character, so that ``unicodedata.normalize
    ("NFKC", ...)`` of the result is that of ``text`` and, for most texts, the result itself
    (``hits.passage_shingles`` says why)."""
    cdef int kind = PyUnicode_KIND(text)
    cdef void* data = PyUnicode_DATA(text)
    cdef Py_ssize_t n = PyUnicode_GET_LENGTH(text), i, size = table.shape[0]
    cdef Py_UCS4 c
    cdef Py_UCS4* out = <Py_UCS4*>malloc((n + 1) * sizeof(Py_UCS4))
    if out == NULL:
        raise MemoryError()
    try:
        for i in range(n):
            c = PyUnicode_READ(kind, data, i)
            out[i] = table[c] if c < size else c
        # (the smallest representation the characters allow, as every str is)
        return PyUnicode_FromKindAndData(PyUnicode_4BYTE_KIND, out, n)
    finally:
        free(out)


_sparse_pairs = False  # tests: the sparse count for any number of passages
_full_pairs = False    # tests: every pair counted (no filter of the passages first)
cdef Py_ssize_t _filtered = 0  # searches whose pairs the filter gave (tests: filtered_count)


def filtered_count():
    """How many calls of :func:`same_pairs` the filter of the passages answered (for tests)."""
    return _filtered


DEF MIN_SEEN_BITS = 16  # the bitmaps: at least 2**16 bits (8 KiB each, the first-level cache) ...
DEF MAX_SEEN_BITS = 22  # ... at most 2**22 (512 KiB), and about 16 bits a shingle between: a
# shingle alone in its passage then shares its bit with another in about 1 of 16 (with 8 KiB,
# the 50,000 shingles of 112 Chinese hits set most bits, and most shingles took the hash table)


cdef inline Py_ssize_t seen_bit(int64_t v, uint64_t bits_mask) noexcept nogil:
    return <Py_ssize_t>(((<uint64_t>v) ^ ((<uint64_t>v) >> 29)) & bits_mask)


cdef inline Py_ssize_t table_slot(int64_t v, uint64_t mask) noexcept nogil:
    """A shingle's first slot in a hash table of ``mask + 1`` slots: the high half of a
    multiplicative hash (Knuth), so that shingles sharing a bitmap bit (:func:`seen_bit`, their
    low bits) do not also start at neighbouring slots."""
    return <Py_ssize_t>((((<uint64_t>v) * 0x9E3779B97F4A7C15ULL) >> 32) & mask)


cdef inline bint seen_twice(const uint64_t* seen2, int64_t v, uint64_t bits_mask) noexcept nogil:
    cdef Py_ssize_t bit = seen_bit(v, bits_mask)
    return (seen2[bit >> 6] >> (bit & 63)) & 1


cdef extern from *:
    """
    #if defined(__GNUC__) || defined(__clang__)
    #define RAGDB_POPCOUNT(x) __builtin_popcountll(x)
    #define RAGDB_CTZ(x) __builtin_ctzll(x)
    #else
    static int RAGDB_CTZ(unsigned long long x) {  /* x != 0 */
        int n = 0;
        while (!(x & 1ULL)) { x >>= 1; n++; }
        return n;
    }
    static int RAGDB_POPCOUNT(unsigned long long x) {
        x = x - ((x >> 1) & 0x5555555555555555ULL);
        x = (x & 0x3333333333333333ULL) + ((x >> 2) & 0x3333333333333333ULL);
        x = (x + (x >> 4)) & 0x0F0F0F0F0F0F0F0FULL;
        return (int)((x * 0x0101010101010101ULL) >> 56);
    }
    #endif
    """
    int RAGDB_POPCOUNT(uint64_t x) noexcept nogil
    int RAGDB_CTZ(uint64_t x) noexcept nogil


DEF DENSE_MAX = 256     # up to this many passages, what each two share is counted in a matrix ...
DEF HEAVY_OWNERS = 8    # ... and a shingle in more passages than this sets a bit of each (a
DEF MAX_HEAVY = 4096    # common run of Chinese characters may be in all 112 hits of a search:
                        # counting it pair by pair cost most of the time); at most MAX_HEAVY bits


cdef inline bint same_passage(int64_t shared, int64_t a, int64_t b, double jaccard, double containment,
                              int64_t min_shingles) noexcept nogil:
    """``hits.same_passage`` (shared > 0), the same double arithmetic."""
    cdef int64_t small = a if a < b else b
    return (<double>shared >= jaccard * <double>(a + b - shared)
            or (small >= min_shingles and <double>shared >= containment * <double>small))


cdef list _pairs_dense(Py_buffer* bufs, Py_ssize_t n, const uint64_t* seen2, uint64_t bits_mask,
                       Py_ssize_t again, double jaccard, double containment, int64_t min_shingles):
    """``same_pairs`` of at most DENSE_MAX passages: every shingle met twice goes into a hash
    table with the list of its passages; then a shingle of a few passages adds 1 to the matrix
    cell of each two of them, and one of many sets its bit in each of its passages' bitsets, so
    that two passages share the matrix cell plus the bits their bitsets have in common."""
    cdef Py_ssize_t i, j, t, cap = 16, slot, e = 0, nheavy = 0, words, w, bit
    cdef int64_t v, shared
    cdef const uint32_t* vals
    cdef int64_t* keys = NULL
    cdef int32_t* head = NULL
    cdef int32_t* nowners = NULL
    cdef int32_t* used = NULL  # the slots taken, in the order they were
    cdef Py_ssize_t nused = 0, u
    cdef int32_t* owner = NULL
    cdef int32_t* nxt = NULL
    cdef int32_t* matrix = NULL
    cdef int64_t* sizes = NULL
    cdef uint64_t* bitsets = NULL
    cdef int32_t x, y
    pairs = []
    while cap < 4 * again:  # at most 2 * again shingles were met twice
        cap *= 2
    try:
        keys = <int64_t*>malloc(cap * sizeof(int64_t))
        head = <int32_t*>malloc(cap * sizeof(int32_t))
        nowners = <int32_t*>malloc(cap * sizeof(int32_t))
        used = <int32_t*>malloc((2 * again + 1) * sizeof(int32_t))
        owner = <int32_t*>malloc((2 * again + 1) * sizeof(int32_t))
        nxt = <int32_t*>malloc((2 * again + 1) * sizeof(int32_t))
        matrix = <int32_t*>calloc(n * n, sizeof(int32_t))
        sizes = <int64_t*>calloc(n, sizeof(int64_t))
        if not (keys and head and nowners and used and owner and nxt and matrix and sizes):
            raise MemoryError()
        memset(head, 0xFF, cap * sizeof(int32_t))  # -1: an empty slot
        for i in range(n):
            vals = <const uint32_t*>bufs[i].buf
            for t in range(bufs[i].len // 4):
                v = vals[t]
                if not seen_twice(seen2, v, bits_mask):
                    sizes[i] += 1  # in this passage only, once
                    continue
                slot = table_slot(v, cap - 1)
                while head[slot] != -1 and keys[slot] != v:
                    slot = (slot + 1) & (cap - 1)
                if head[slot] != -1 and owner[head[slot]] == i:
                    continue  # a repeat within passage i
                sizes[i] += 1
                if head[slot] == -1:
                    keys[slot] = v
                    nxt[e] = -1
                    nowners[slot] = 0
                    used[nused] = <int32_t>slot
                    nused += 1
                else:
                    nxt[e] = head[slot]
                owner[e] = <int32_t>i
                head[slot] = <int32_t>e
                nowners[slot] += 1
                e += 1
        for u in range(nused):
            if nowners[used[u]] > HEAVY_OWNERS and nheavy < MAX_HEAVY:
                nheavy += 1
        words = (nheavy + 63) // 64
        if words:
            bitsets = <uint64_t*>calloc(n * words, sizeof(uint64_t))
            if bitsets == NULL:
                raise MemoryError()
        bit = 0
        for u in range(nused):
            slot = used[u]
            if nowners[slot] < 2:
                continue
            if nowners[slot] > HEAVY_OWNERS and bit < nheavy:
                x = head[slot]
                while x != -1:
                    bitsets[owner[x] * words + (bit >> 6)] |= 1ULL << (bit & 63)
                    x = nxt[x]
                bit += 1
                continue
            x = head[slot]  # owners latest first
            while x != -1:
                y = nxt[x]
                while y != -1:
                    matrix[owner[x] * n + owner[y]] += 1
                    y = nxt[y]
                x = nxt[x]
        for i in range(1, n):
            for j in range(i):
                shared = matrix[i * n + j]
                for w in range(words):
                    shared += RAGDB_POPCOUNT(bitsets[i * words + w] & bitsets[j * words + w])
                if shared > 0 and same_passage(shared, sizes[j], sizes[i], jaccard, containment, min_shingles):
                    pairs.append((i, j))
        return pairs
    finally:
        free(keys); free(head); free(nowners); free(used); free(owner); free(nxt); free(matrix); free(sizes); free(bitsets)


DEF FILTER_MAX = 64  # the passages that may be the smaller of a pair: one bit each in a word


cdef int _cmp_int64(const void* a, const void* b) noexcept nogil:
    cdef int64_t x = (<const int64_t*>a)[0], y = (<const int64_t*>b)[0]
    return (x > y) - (x < y)


cdef Py_ssize_t _distinct(int64_t* vals, Py_ssize_t m) noexcept nogil:
    """How many distinct values ``vals[:m]`` holds (sorted in place)."""
    cdef Py_ssize_t t, d = 0
    if m == 0:
        return 0
    qsort(vals, m, sizeof(int64_t), _cmp_int64)
    d = 1
    for t in range(1, m):
        if vals[t] != vals[t - 1]:
            d += 1
    return d


cdef object _pairs_filtered(Py_buffer* bufs, Py_ssize_t n, const uint64_t* seen2, uint64_t bits_mask,
                            double jaccard, double containment, int64_t min_shingles):
    """``same_pairs`` counting only what a pair of one passage needs, or None when that does
    not pay (the callers' full count then runs).

    Two passages that are one share at least ``f * min(a, b)`` of their shingles, ``f`` the
    smaller of ``2 * jaccard / (1 + jaccard)`` (Jaccard: ``shared >= j * (a + b - shared)``
    and ``a + b >= 2 * min``) and ``containment``: 0.75 with the defaults. So the smaller
    passage of such a pair has at most ``(1 - f)`` of its shingles in no other passage. A
    shingle whose bit in ``seen2`` is clear was met once in all: in its passage only. A
    passage with more of those than ``(1 - f)`` of its size (bounded above by every shingle
    it holds) is never the smaller of a pair; most of a search's hits are such (a passage
    shares a few common runs with others, not most of its text). Only the others ("small
    candidates", at most FILTER_MAX) go into a hash table, each shingle with the bitset of
    the candidates holding it; every passage's shingles met twice then look it up, counting
    (once per distinct shingle) what each shares with each candidate. A pair is tested
    (``same_passage``, exactly) when a candidate is in it and, unless both are candidates,
    shares at least ``f`` of the candidate's size, the other passage's size then counted."""
    global _filtered
    cdef double f = containment, fj
    cdef Py_ssize_t i, t, m, nr = 0, nc = 0, ci, cap, slot, li, size_l, twice
    cdef int64_t v, s
    cdef uint64_t bits, one
    cdef const uint32_t* vals
    cdef Py_ssize_t* start = NULL   # passage i's shingles met twice: rv[start[i]:start[i + 1]]
    cdef int64_t* rv = NULL
    cdef int64_t* once = NULL       # shingles met once (each in its passage only): per passage
    cdef int64_t* sizes = NULL      # distinct shingles per passage, -1 while not counted
    cdef int32_t* cand = NULL       # passage -> its candidate index, or -1
    cdef Py_ssize_t cands[FILTER_MAX]
    cdef int64_t* keys = NULL
    cdef uint64_t* owners = NULL
    cdef int32_t* stamp = NULL
    cdef int32_t* shared = NULL     # candidate x passage
    cdef int64_t* scratch = NULL
    if jaccard > 0.0:
        fj = 2.0 * jaccard / (1.0 + jaccard)
        if fj < f:
            f = fj
    else:
        return None
    f *= 1.0 - 1e-9  # a margin for the rounding of the doubles the test computes
    if not (f > 1e-6):  # (below, the margin no longer covers the rounding of (1 - f) * size,
        return None     # and nearly every passage would be a candidate anyway)
    try:
        start = <Py_ssize_t*>malloc((n + 1) * sizeof(Py_ssize_t))
        once = <int64_t*>calloc(n, sizeof(int64_t))
        sizes = <int64_t*>malloc(n * sizeof(int64_t))
        cand = <int32_t*>malloc(n * sizeof(int32_t))
        for i in range(n):
            nr += bufs[i].len // 4
        rv = <int64_t*>malloc((nr if nr else 1) * sizeof(int64_t))
        if not (start and once and sizes and cand and rv):
            raise MemoryError()
        nr = 0
        for i in range(n):
            start[i] = nr
            vals = <const uint32_t*>bufs[i].buf
            for t in range(bufs[i].len // 4):
                v = vals[t]
                rv[nr] = v  # (kept when met twice: without a branch, as above)
                twice = seen_twice(seen2, v, bits_mask)
                nr += twice
                once[i] += 1 - twice
            sizes[i] = -1
            cand[i] = -1
            # at most (1 - f) of its distinct shingles alone, their number at most once + met twice
            if nr > start[i] and (1.0 - f) * <double>(once[i] + nr - start[i]) >= <double>once[i]:
                if nc == FILTER_MAX:
                    return None
                cand[i] = <int32_t>nc
                cands[nc] = i
                nc += 1
        start[n] = nr
        _filtered += 1
        if nc == 0:
            return []
        m = 0
        for ci in range(nc):
            m += start[cands[ci] + 1] - start[cands[ci]]
        cap = 16
        while cap < 2 * m:
            cap *= 2
        keys = <int64_t*>malloc(cap * sizeof(int64_t))
        owners = <uint64_t*>calloc(cap, sizeof(uint64_t))  # 0: an empty slot
        stamp = <int32_t*>calloc(cap, sizeof(int32_t))
        shared = <int32_t*>calloc(nc * n, sizeof(int32_t))
        if not (keys and owners and stamp and shared):
            raise MemoryError()
        for ci in range(nc):
            i = cands[ci]
            one = 1ULL << ci
            s = 0
            for t in range(start[i], start[i + 1]):
                v = rv[t]
                slot = table_slot(v, cap - 1)
                while owners[slot] and keys[slot] != v:
                    slot = (slot + 1) & (cap - 1)
                if owners[slot] & one:
                    continue  # a repeat within the candidate
                keys[slot] = v
                owners[slot] |= one
                s += 1
            sizes[i] = once[i] + s
        for li in range(n):
            for t in range(start[li], start[li + 1]):
                v = rv[t]
                slot = table_slot(v, cap - 1)
                while owners[slot] and keys[slot] != v:
                    slot = (slot + 1) & (cap - 1)
                if not owners[slot] or stamp[slot] == li + 1:
                    continue  # in no candidate, or a repeat within passage li
                stamp[slot] = <int32_t>(li + 1)
                bits = owners[slot]
                while bits:
                    ci = <Py_ssize_t>RAGDB_CTZ(bits)
                    bits &= bits - 1
                    shared[ci * n + li] += 1
        pairs = []
        for ci in range(nc):
            i = cands[ci]
            for li in range(n):
                s = shared[ci * n + li]
                if s == 0 or li == i or (cand[li] >= 0 and li > i):
                    continue  # (two candidates: tested once, from the later one's row)
                if cand[li] < 0:
                    # the other passage is then the larger: it shares at least f of this one
                    if <double>s < f * <double>sizes[i]:
                        continue
                    if sizes[li] < 0:
                        size_l = start[li + 1] - start[li]
                        if scratch == NULL:
                            scratch = <int64_t*>malloc((nr if nr else 1) * sizeof(int64_t))
                            if scratch == NULL:
                                raise MemoryError()
                        memcpy(scratch, &rv[start[li]], size_l * sizeof(int64_t))
                        sizes[li] = once[li] + _distinct(scratch, size_l)
                if same_passage(s, sizes[i], sizes[li], jaccard, containment, min_shingles):
                    pairs.append((i, li) if i > li else (li, i))
        pairs.sort()
        return pairs
    finally:
        free(start); free(rv); free(once); free(sizes); free(cand)
        free(keys); free(owners); free(stamp); free(shared); free(scratch)


def same_pairs(list sets, double jaccard, double containment, int64_t min_shingles):
    """The pairs ``(i, j)``, ``j < i``, of the passages whose shingles are ``sets`` (bytes of
    uint32 values from :func:`shingles`, or native uint32 arrays, in ranking order) that are
    one passage (``hits.same_passages`` of their sets of shingles), sorted.

    Most shingles are in one passage only: a first pass marks each shingle's bit in a bitmap,
    and a second bitmap the bits met twice (two shingles or one repeated), so a shingle whose
    bit was met once is in no other passage and counts for its own passage's size alone. The
    others go through a hash table of each shingle's owners so far, in ranking order, which
    counts what passage ``i`` shares with each earlier one (a repeat within ``i`` is skipped,
    ``i`` being the latest owner); then the test for the passages it shares any with. The
    bitmaps grow with the number of shingles. Up to DENSE_MAX passages, :func:`_pairs_dense`
    counts instead (the same pairs: a test sets ``_sparse_pairs`` to compare the two).

    First, though, :func:`_pairs_filtered` counts only for the few passages that may be the
    smaller of a pair (most hits have too many shingles of their own); the counts above run
    when more than FILTER_MAX may be (tests set ``_full_pairs`` to compare). On the realistic
    10k corpus: 1.05 -> 0.38 ms a Chinese search of 112 hits (52,000 shingles), 0.28 -> 0.10
    ms an English one."""
    cdef Py_ssize_t n = len(sets), got = 0, i, j, t, cap, slot, e = 0, nt, again = 0, bit
    cdef int64_t v, shared, size
    cdef Py_buffer* bufs = NULL
    cdef const uint32_t* vals
    cdef int64_t* keys = NULL
    cdef int32_t* head = NULL
    cdef int32_t* owner = NULL
    cdef int32_t* nxt = NULL
    cdef int32_t* counts = NULL
    cdef int32_t* touched = NULL
    cdef int64_t* sizes = NULL  # each passage's number of distinct shingles
    cdef uint64_t mask, one, bits_mask, met
    cdef uint64_t* seen1 = NULL
    cdef uint64_t* seen2 = NULL
    cdef Py_ssize_t total = 0, seen_bits = MIN_SEEN_BITS
    pairs = []
    if n < 2:
        return pairs
    bufs = <Py_buffer*>malloc(n * sizeof(Py_buffer))
    if bufs == NULL:
        raise MemoryError()
    try:
        for got in range(n):
            try:
                PyObject_GetBuffer(sets[got], &bufs[got], PyBUF_C_CONTIGUOUS | PyBUF_FORMAT)
            except (BufferError, ValueError) as err:  # (not contiguous)
                raise TypeError(f"shingles are bytes or contiguous uint32 values: {err}") from None
            # (the rule of hits.shingle_values: bytes of whole values, or native uint32 items;
            # either is 4-byte aligned, which the reads below need)
            if not ((PyBytes_CheckExact(sets[got]) and bufs[got].len % 4 == 0)
                    or (bufs[got].itemsize == 4 and bufs[got].format != NULL
                        and (strcmp(bufs[got].format, b"I") == 0 or strcmp(bufs[got].format, b"=I") == 0
                             or strcmp(bufs[got].format, b"@I") == 0)
                        and (<size_t>bufs[got].buf) % 4 == 0)):
                PyBuffer_Release(&bufs[got])
                raise TypeError("shingles are uint32 values: bytes (from shingles) or native uint32 arrays")
        got = n
        for i in range(n):
            total += bufs[i].len // 4
        while seen_bits < MAX_SEEN_BITS and (1 << seen_bits) < 16 * total:
            seen_bits += 1
        bits_mask = (1ULL << seen_bits) - 1
        seen1 = <uint64_t*>calloc(1 << (seen_bits - 6), sizeof(uint64_t))
        seen2 = <uint64_t*>calloc(1 << (seen_bits - 6), sizeof(uint64_t))
        if seen1 == NULL or seen2 == NULL:
            raise MemoryError()
        for i in range(n):
            vals = <const uint32_t*>bufs[i].buf
            for t in range(bufs[i].len // 4):
                # (without branches: whether a bit was met before is a coin toss the
                # processor would mispredict a third of the time)
                bit = seen_bit(vals[t], bits_mask)
                met = seen1[bit >> 6]
                seen2[bit >> 6] |= met & (1ULL << (bit & 63))
                again += (met >> (bit & 63)) & 1
                seen1[bit >> 6] = met | (1ULL << (bit & 63))
        if not _full_pairs:
            found = _pairs_filtered(bufs, n, seen2, bits_mask, jaccard, containment, min_shingles)
            if found is not None:
                return found
        if n <= DENSE_MAX and not _sparse_pairs:
            return _pairs_dense(bufs, n, seen2, bits_mask, again, jaccard, containment, min_shingles)
        cap = 16
        while cap < 4 * again:  # at most 2 * again shingles were met twice
            cap *= 2
        mask = cap - 1
        keys = <int64_t*>malloc(cap * sizeof(int64_t))
        head = <int32_t*>malloc(cap * sizeof(int32_t))
        owner = <int32_t*>malloc((2 * again + 1) * sizeof(int32_t))
        nxt = <int32_t*>malloc((2 * again + 1) * sizeof(int32_t))
        counts = <int32_t*>calloc(n, sizeof(int32_t))
        touched = <int32_t*>malloc(n * sizeof(int32_t))
        sizes = <int64_t*>malloc(n * sizeof(int64_t))
        if not (keys and head and owner and nxt and counts and touched and sizes):
            raise MemoryError()
        memset(head, 0xFF, cap * sizeof(int32_t))  # -1: an empty slot
        for i in range(n):
            nt = 0
            size = 0
            vals = <const uint32_t*>bufs[i].buf
            for t in range(bufs[i].len // 4):
                v = vals[t]
                if not seen_twice(seen2, v, bits_mask):
                    size += 1  # in this passage only, once
                    continue
                slot = table_slot(v, mask)
                while head[slot] != -1 and keys[slot] != v:
                    slot = (slot + 1) & mask
                if head[slot] != -1 and owner[head[slot]] == i:
                    continue  # a repeat within passage i
                size += 1
                if head[slot] == -1:
                    keys[slot] = v
                    nxt[e] = -1
                else:
                    j = head[slot]
                    while j != -1:
                        if counts[owner[j]] == 0:
                            touched[nt] = owner[j]
                            nt += 1
                        counts[owner[j]] += 1
                        j = nxt[j]
                    nxt[e] = head[slot]
                owner[e] = <int32_t>i
                head[slot] = <int32_t>e
                e += 1
            sizes[i] = size
            if nt:
                qsort(touched, nt, sizeof(int32_t), _cmp_int32)
                for t in range(nt):
                    j = touched[t]
                    shared = counts[j]
                    counts[j] = 0
                    if same_passage(shared, sizes[j], sizes[i], jaccard, containment, min_shingles):
                        pairs.append((i, j))
        return pairs
    finally:
        for i in range(got):
            PyBuffer_Release(&bufs[i])
        free(bufs)
        free(keys); free(head); free(owner); free(nxt); free(counts); free(touched); free(sizes)
        free(seen1); free(seen2)


def make_hits(hit_type, protos, list chunk_ids, list scores, explain, confidences, own_metadata):
    """``hits.make_hits`` in C: a ``hit_type`` (:class:`ragdb.types.Hit`) for each of
    ``chunk_ids`` in order, from its ``hits.HitEntry`` in ``protos``, with ``scores[i]``, its
    explain dict from ``explain`` (None: an empty one) and ``confidences[i]`` (None: None).
    The same instance dicts as the Python function's, key for key and in its order, each set on
    a new instance without the frozen dataclass's ``__init__``: ``PyObject_GenericSetAttr`` of
    ``__dict__``, what ``object.__setattr__(hit, "__dict__", ...)`` does (through the type's
    ``__dict__`` descriptor; ``PyObject_GenericSetDict`` left Python 3.13's inline values in
    front of the new dict, gh-133912); metadata copied by ``own_metadata``
    (``hits._own_metadata``). The Python function made a search's ~110 hits in ~130 us, most of
    it the dict display's 17 insertions through the interpreter."""
    cdef Py_ssize_t i, n = len(chunk_ids)
    cdef list out = []
    cdef dict d
    cdef tuple e
    if len(scores) != n or (confidences is not None and len(confidences) != n):
        raise ValueError("make_hits: one score (and confidence) for each chunk id")
    new = hit_type.__new__
    empty = ()
    cdef dict template = dict.fromkeys(("score", "chunk_id", "doc_id", "source", "version", "timestamp", "text",
                                        "start", "end", "ordinal", "metadata", "explain", "confidence",
                                        "highlights", "snippet", "title", "section"))
    for i in range(n):
        cid = chunk_ids[i]
        entry = protos[cid]
        if not isinstance(entry, tuple):  # (a HitEntry: a tuple's subclass)
            raise TypeError(f"make_hits: a hit entry is a HitEntry, not {type(entry).__name__}")
        e = <tuple>entry
        if len(e) != 11:
            raise ValueError(f"make_hits: a hit entry of {len(e)} fields, not 11")
        meta = e[10]
        d = template.copy()  # (every key in place: the sets below replace values, no resizing)
        d["score"] = scores[i]
        d["chunk_id"] = cid
        d["doc_id"] = e[0]
        d["source"] = e[1]
        d["version"] = e[2]
        d["timestamp"] = e[3]
        d["text"] = e[4]
        d["start"] = e[5]
        d["end"] = e[6]
        d["ordinal"] = e[7]
        d["metadata"] = own_metadata(meta) if meta else {}
        d["explain"] = dict(explain.get(cid, empty)) if explain is not None else {}
        d["confidence"] = confidences[i] if confidences is not None else None
        d["highlights"] = empty
        d["snippet"] = None
        d["title"] = e[8]
        d["section"] = e[9]
        hit = new(hit_type)
        PyObject_GenericSetAttr(hit, "__dict__", d)
        out.append(hit)
    return out


def unicode_tables():
    """``(unidata_version, compat, raw, nfkc)``: the Unicode version the tables of
    :mod:`ragdb.index.unitables` were made from when this module was built, and the tables
    (``compat_table``, ``raw_table``, ``nfkc_table``: 65,536 native uint32 each) as read-only
    memoryviews of the module's constant data (no copy)."""
    return (RAGDB_UNIDATA_VERSION.decode("ascii"),
            PyMemoryView_FromMemory(<char*>RAGDB_COMPAT_TABLE, 0x40000, PyBUF_READ),
            PyMemoryView_FromMemory(<char*>RAGDB_RAW_TABLE, 0x40000, PyBUF_READ),
            PyMemoryView_FromMemory(<char*>RAGDB_NFKC_TABLE, 0x40000, PyBUF_READ))
