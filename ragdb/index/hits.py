"""Hits: how every scorer turns (chunk id, score) into :class:`~ragdb.types.Hit`, and
how equal scores are ordered.

One rule for all of lexical, vector and hybrid search: best score first,
equal scores by source, then position in the document, then chunk id. Source
and position are content, not insertion history, so a database answers in
the same order as a fresh build of the same documents.
"""

from __future__ import annotations

import dataclasses
import re
import unicodedata
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from ragdb.patterns import LazyPattern
from ragdb.index import kernel, unitables
from ragdb.types import Duplicate, Hit

class HitEntry(NamedTuple):
    """What a search keeps of a chunk to make its hits (:meth:`ragdb.index.inverted.Index.hit_protos`):
    the :class:`Hit` fields that do not depend on the query, and the metadata (the document's
    merged with the chunk's; never mutated: each hit gets its own copy, nested lists and
    dicts included, :func:`_own_metadata`). A tuple, where a dict of the fields was before: the
    cache of these is bounded in bytes, and an entry took 711 of them besides its text with the
    dict, 327 with the tuple (``inverted.HIT_ENTRY_OVERHEAD``), so the same bytes hold more
    chunks (at 12 MiB all of SciFact's 5,183 fit; before, ~3,600-4,800 did and a search read
    ~17 of its ~110 hits from SQLite)."""

    doc_id: int
    source: str
    version: str | None
    timestamp: str | None
    text: str
    start: int
    end: int
    ordinal: int
    title: str | None
    section: str | None
    metadata: Mapping[str, Any]


#: chunk id -> its :class:`HitEntry` (``Index.hit_protos``)
Protos = Mapping[int, HitEntry]


def make_hits(protos: Protos, chunk_ids: Sequence[int], scores: Sequence[float],
              explain: Mapping[int, Mapping[str, float]] | None = None,
              confidences: Sequence[float | None] | None = None) -> list[Hit]:
    """:class:`Hit` objects from :meth:`ragdb.index.inverted.Index.hit_protos` entries, in the given order
    (``confidences``: each hit's :attr:`Hit.confidence`, in the same order; None: none).

    Built without the frozen dataclass ``__init__`` (which sets each of its fields through
    ``object.__setattr__``): the instance dict is made in one expression, in the fields'
    order, several times faster, and search builds up to ``k`` hits; in C where the compiled
    kernel is chosen (``cpassages.make_hits``: the same dicts). Each hit gets its own
    metadata and explain dicts."""
    compiled = _compiled()
    if compiled is not None:  # (the same dicts, made in C: cpassages.make_hits)
        return compiled.make_hits(Hit, protos, list(chunk_ids), list(scores), explain,
                                  None if confidences is None else list(confidences), _own_metadata)
    new, setattr_ = object.__new__, object.__setattr__
    hits: list[Hit] = []
    append = hits.append
    confs: Sequence[float | None] = confidences if confidences is not None else [None] * len(chunk_ids)
    for cid, score, conf in zip(chunk_ids, scores, confs):
        doc_id, source, version, timestamp, text, start, end, ordinal, title, section, meta = protos[cid]
        hit = new(Hit)
        setattr_(hit, "__dict__", {
            "score": score, "chunk_id": cid, "doc_id": doc_id, "source": source, "version": version,
            "timestamp": timestamp, "text": text, "start": start, "end": end, "ordinal": ordinal,
            "metadata": _own_metadata(meta) if meta else {},
            "explain": dict(explain.get(cid, ())) if explain is not None else {},
            "confidence": conf, "highlights": (), "snippet": None, "title": title, "section": section})
        append(hit)
    return hits


def _own_metadata(meta: Mapping[str, Any]) -> dict[str, Any]:
    """A hit's own copy of cached metadata: a caller changing a list or dict in a hit's
    metadata (``hit.metadata["tags"].append(...)``) changes neither the cache nor other hits."""
    out = dict(meta)
    for key, value in out.items():
        if type(value) is list or type(value) is dict:
            out[key] = _copied(value)
    return out


def _copied(value: Any) -> Any:
    """A copy of a JSON value's lists and dicts, at every depth (scalars are immutable)."""
    if type(value) is list:
        return [_copied(v) for v in value]
    if type(value) is dict:
        return {k: _copied(v) for k, v in value.items()}
    return value


def hit_order(h: Hit) -> tuple[float, str, int, int]:
    """Sort key of hits: score descending, then source, position, chunk id."""
    return (-h.score, h.source, h.start, h.chunk_id)


def hits_from_scored(protos: Protos, scored: Iterable[tuple[int, float, Mapping[str, float]]],
                     confidences: Mapping[int, float] | None = None) -> list[Hit]:
    """Hits for ``(chunk id, score, explain)`` triples, in :func:`hit_order`; chunks
    missing from ``protos`` (deleted meanwhile) are left out. ``confidences``: chunk id
    -> :attr:`Hit.confidence`."""
    rows = [s for s in scored if s[0] in protos]
    confs = [confidences.get(c) for c, _, _ in rows] if confidences is not None else None
    hits = make_hits(protos, [c for c, _, _ in rows], [float(v) for _, v, _ in rows], {c: e for c, _, e in rows},
                     confs)
    hits.sort(key=hit_order)
    return hits


Pool = tuple[np.ndarray, np.ndarray]  # (chunk ids, scores), best first


def content_order(pool: Pool, sort_keys: Callable[[Sequence[int]], Mapping[int, tuple[str, int]]]) -> Pool:
    """A best-first pool with equal scores ordered by (source, start) as hits are,
    so ranks (and fusion) do not depend on chunk ids; ``sort_keys`` reads the
    (source, start) of the tied chunks only."""
    ids, scores = pool
    if len(ids) < 2:
        return pool
    eq = scores[1:] == scores[:-1]
    if not eq.any():
        return pool
    pos = np.flatnonzero(eq)
    tied = sorted(set(ids[np.concatenate([pos, pos + 1])].tolist()))
    keys = sort_keys(tied)
    ranked = sorted(zip(ids.tolist(), scores.tolist()),
                    key=lambda cs: (-cs[1], *keys.get(cs[0], ("", 0)), cs[0]))
    return (np.fromiter((c for c, _ in ranked), np.int64, len(ranked)),
            np.fromiter((v for _, v in ranked), np.float64, len(ranked)))


def first_k(pool: Pool, k: int, sort_keys: Callable[[Sequence[int]], Mapping[int, tuple[str, int]]]) -> Pool:
    """The first ``k`` of a best-first pool that keeps the chunks tied with its k-th: those
    scoring above the k-th, then the tied ones first in :func:`hit_order` (source, start,
    chunk id), whose ``sort_keys`` alone are read. Hits were built for every tied chunk
    before the cut: 20,000 copies of a page footer made a one-word search 200 ms."""
    ids, scores = pool
    if len(ids) <= k:
        return pool
    kth = scores[k - 1]
    above = int(np.count_nonzero(scores > kth))
    tied = ids[scores == kth].tolist()
    keys = sort_keys(tied)
    chosen = sorted(tied, key=lambda c: (*keys.get(c, ("", 0)), c))[:k - above]
    return (np.concatenate([ids[:above], np.asarray(chosen, np.int64)]),
            np.concatenate([scores[:above], np.full(len(chosen), kth, np.float64)]))


def cut_with_ties(ids: np.ndarray, scores: np.ndarray, k: int) -> Pool:
    """The first ``k`` of a best-first pool plus any tied with the k-th."""
    if len(ids) <= k:
        return ids, scores
    keep = scores >= scores[k - 1]
    return ids[keep], scores[keep]


# -- one hit per passage ---------------------------------------------------------------
#
# The same section often reaches a knowledge base several times (a page as Markdown and
# as HTML, and again in an all-in-one page), each copy a chunk of its own with slightly
# different markup and chunk boundaries. Two passages are the same when their sets of word
# 3-shingles (Broder, "On the resemblance and containment of documents", 1997) have a
# Jaccard similarity of at least DUPLICATE_JACCARD, or the smaller set, when it has at
# least DUPLICATE_MIN_SHINGLES shingles, lies DUPLICATE_CONTAINMENT inside the other
# (Broder's containment: a short chunk cut from the middle of the same section). Shingles
# are over the words a reader sees: NFKC, case folded, letters and digits only (markup
# punctuation, Markdown link targets and HTML tags are not words), each CJK character a
# word. The sets (of each shingle's 32-bit hash: :func:`passage_shingles`) are compared
# exactly, through an inverted index of the hits' shingles: a search collapses at most a
# few thousand hits, where exact Jaccard costs less than estimating it with MinHash
# (datasketch), which pays off only across millions.
#
# Every search collapses its hits, so this runs on the ~150 hits of a k=100 search each
# time: in C where the compiled kernel is installed and chosen (ragdb/index/cpassages.pyx;
# on SciFact's hits 20 times faster than numpy for the shingles, 12 times for the pairs),
# else in numpy here, the reference. The two give the very same shingle values: a word's
# hash is a sum of its characters times per-position odd constants through splitmix64's
# finalizer, which numpy computes for all words at once (a sum per word, ``np.add.reduceat``)
# and C in its scan, where Python's ``hash`` of a word could be neither vectorized nor
# reproduced in C; the values are the same in every process, too. Storing each chunk's
# shingles (or a sketch of them) at index time was measured and not chosen: reading back
# 150 sketches of 132 bytes took 0.19 ms on SciFact, more than the C scan of the texts a
# search already holds, and would add bytes to every chunk and a migration to both backends.

#: Jaccard similarity of word 3-shingle sets from which two passages are one.
DUPLICATE_JACCARD = 0.6
#: Containment of the smaller shingle set in the larger from which two passages are one...
DUPLICATE_CONTAINMENT = 0.9
#: ... when the smaller set has at least this many shingles.
DUPLICATE_MIN_SHINGLES = 16
SHINGLE = 3

_CJK = "".join(f"{chr(lo)}-{chr(hi)}" for lo, hi in unitables.CJK_RANGES)  # (a character class's ranges)
#: The words of a passage: each CJK character one, else runs of word characters (``_`` not one).
#: The definition :func:`word_hashes` and the compiled module's tables follow; its source, not a
#: compiled pattern (re takes ~10 ms to compile the CJK ranges, which no search here needs).
WORDS_SOURCE = f"[{_CJK}]|[^\\W_{_CJK}]+"
#: A Markdown link's target, an HTML tag. A target ends at its first ``)`` and holds no space and
#: no ``]``, a tag holds no ``<``: so the scans from successive ``](`` (or ``<``) never overlap,
#: and a text of ``](a`` repeated without a ``)`` is read once, not once from each ``](`` (a
#: 150 kB one took 19 s; 300 kB of ``<`` took 0.45 s).
_MARKUP = LazyPattern(r"\]\([^)\]\s]*\)|<[^<>\n]{1,200}>")

# uint64 constants of the shingle hash (cpassages.pyx has the same)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1, _MIX2 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xC2B2AE3D27D4EB4F)
_FMIX1, _FMIX2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)

try:  # built by setup.py beside the scoring kernel; absent where no compiler was found
    from ragdb.index import cpassages as _cpassages_module
    _cpassages: Any = _cpassages_module
    if not all(hasattr(_cpassages, name) for name in ("shingles", "shingles_raw", "shingles_nfkc", "fold_compat",
                                                        "same_pairs", "unicode_tables")):
        _cpassages = None  # pragma: no cover - an extension built from older sources: not used
except ImportError:  # pragma: no cover - a platform without the extension
    _cpassages = None


def _compiled() -> Any:
    """The compiled passages module when the compiled kernel is chosen (``RAGDB_KERNEL``,
    :func:`ragdb.index.kernel.use`) and it is installed, else None (numpy)."""
    return _cpassages if _cpassages is not None and kernel.name() == "compiled" else None


_MANY = unitables.MANY  # cpassages.MANY: a character that case folds to more than one
_NFKC_SAFE = unitables.NFKC_SAFE  # cpassages.SAFE
_tables: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None


def _unicode_tables() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The Unicode tables of :mod:`ragdb.index.unitables` (compat, raw, nfkc), read-only uint32
    arrays of 65,536 entries: the compiled module's constant data where it was built with this
    Python's Unicode data version (no copy, nothing to make: making them took a process's first
    non-ASCII search ~17 ms and kept 1 MiB), else made once now (~0.1 s, the same tables)."""
    global _tables
    if _tables is None:
        built = _cpassages.unicode_tables() if _cpassages is not None else None
        if built is not None and built[0] == unicodedata.unidata_version:
            made: Sequence[Any] = built[1:]
        else:
            made = unitables.tables()
        arrays = tuple(np.frombuffer(table, np.uint32) for table in made)
        for table in arrays:
            table.flags.writeable = False  # shared by every search
        _tables = (arrays[0], arrays[1], arrays[2])
    return _tables


def _compat_table() -> np.ndarray:
    """The table of ``cpassages.fold_compat`` (:func:`ragdb.index.unitables.compat_table`): each
    BMP code point to itself, but those whose NFKC form is one other character to that one."""
    return _unicode_tables()[0]


def _raw_table() -> np.ndarray:
    """The table of ``cpassages.shingles_raw`` (:func:`ragdb.index.unitables.raw_table`): each BMP
    code point to its case folding in the low 16 bits and the folded character's class in bits
    24-25 (1 a word character: ``str.isalnum``, which ``_`` is not; 2 a CJK character, a word of
    its own; 0 neither), :data:`_MANY` where it folds to more than one character or to one past
    the BMP."""
    return _unicode_tables()[1]


def _nfkc_table() -> np.ndarray:
    """The table of ``cpassages.shingles_nfkc`` (:func:`ragdb.index.unitables.nfkc_table`): each
    BMP character ``c`` to the :func:`_raw_table` entry (case folding and class) of its NFKC form
    where that is one character (:func:`_compat_table`, else ``c`` itself), with bit
    :data:`_NFKC_SAFE` where that form ``f`` is "safe": ``c`` and ``f`` lie in the ranges of
    ``unitables.SAFE_CHECKED`` or ``unitables.SAFE_ALWAYS`` (so ``f`` is no character a character
    before it may compose with: a half-width Hangul letter's form is a conjoining jamo, outside
    them), ``f`` is NFKC-normalized alone, of combining class 0, and case folds to one character;
    0 (no SAFE) for every other character.

    A text of safe characters only has as NFKC form its characters' forms in turn: the forms
    replace each character with its one-character NFKC form (as ``fold_compat``, which
    :func:`_nfkc` shows keeps the text's NFKC form), and a text of characters whose NFKC quick
    check is YES (normalized alone, not composing with a character before) and of combining
    class 0 is normalized (UAX #15's quick check: YES for every character, and no combining
    marks to reorder)."""
    return _unicode_tables()[2]


def _nfkc(text: str, compiled: Any) -> str:
    """``unicodedata.normalize("NFKC", text)``. With the compiled module, the characters whose
    NFKC form is one character are first replaced by it (``fold_compat``), which leaves the
    text's NFKC form as it was (NFKD(NFKC(c)) is NFKD(c), and NFKD decomposes each character on
    its own, then orders the combining marks of the whole text); a text that is then
    normalized is that form, and needs no normalization (most Chinese text: its full-width
    commas and brackets were all it had to change; normalize costs ~130 µs a paragraph, the
    replacement ~2 µs)."""
    if compiled is not None:
        text = compiled.fold_compat(text, _compat_table())
        if unicodedata.is_normalized("NFKC", text):
            return text
    return unicodedata.normalize("NFKC", text)


def _fmix(z: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer on uint64 values (wrapping)."""
    z = (z ^ (z >> _S30)) * _FMIX1
    z = (z ^ (z >> _S27)) * _FMIX2
    return z ^ (z >> _S31)


_position_table = _fmix((np.arange(256, dtype=np.uint64) + np.uint64(1)) * _GOLDEN) | np.uint64(1)


def _positions(n: int) -> np.ndarray:
    """The odd multipliers of the first ``n`` character positions of a word."""
    global _position_table
    if n > len(_position_table):
        size = 1 << (n - 1).bit_length()
        _position_table = _fmix((np.arange(size, dtype=np.uint64) + np.uint64(1)) * _GOLDEN) | np.uint64(1)
    return _position_table


_classes: np.ndarray | None = None


def _char_classes() -> np.ndarray:
    """Each code point's class in the words of :data:`WORDS_SOURCE`: 0 none, 1 a word character
    (``str.isalnum``, the regular expression's word class, but not ``_``), 2 a CJK character
    (a word of its own). Made once, on first use: the word characters found by the regular
    expression engine in one string of every code point (as ``unitables.raw_table`` finds them;
    calling ``str.isalnum`` on each took ~0.1 s)."""
    global _classes
    if _classes is None:
        every = np.arange(0x110000, dtype=np.uint32).tobytes().decode("utf-32-le", "surrogatepass")
        table = np.zeros(0x110000, np.uint8)
        for m in re.finditer(r"[^\W_]+", every):  # exactly str.isalnum: both are Py_UNICODE_ISALNUM
            table[m.start():m.end()] = unitables.WORD
        for lo, hi in unitables.CJK_RANGES:
            table[lo:hi + 1] = unitables.CJK
        _classes = table
    return _classes


def word_hashes(prepared: str) -> np.ndarray:
    """The 64-bit hash (uint64) of each word of ``prepared`` (normalized, case folded, without
    markup), in order: ``fmix(sum((char + 1) * P[i]) + len * GOLDEN)`` over its characters'
    code points at positions ``i``, ``P`` odd constants (``_positions``). The words are those
    :data:`WORDS_SOURCE` finds, found here with a table of character classes, all at once."""
    codes = np.frombuffer(prepared.encode("utf-32-le", "surrogatepass"), np.uint32)
    cls = _char_classes()[codes]
    at = np.flatnonzero(cls)  # the characters of words
    if not len(at):
        return np.zeros(0, np.uint64)
    cls = cls[at]
    # a word starts at a CJK character, or at a word character not right after one
    start = (cls == 2) | np.concatenate(([True], (at[1:] != at[:-1] + 1) | (cls[:-1] != 1)))
    starts = np.flatnonzero(start)
    lengths = np.diff(np.append(starts, len(at)))
    pos = np.arange(len(at)) - np.repeat(starts, lengths)
    sums = np.add.reduceat((codes[at].astype(np.uint64) + np.uint64(1)) * _positions(int(lengths.max()))[pos],
                           starts)
    return _fmix(sums + lengths.astype(np.uint64) * _GOLDEN)


def passage_shingles(text: str) -> bytes:
    """The word 3-shingles of ``text`` as a reader sees it, each hashed to an integer, in text
    order (a shingle the text repeats repeats: a passage's shingles are their set; sorting them
    cost more than the rest of the work in C). A text of fewer words: one shingle of them all;
    none for a text without words. The same values in every process and from either kernel.

    Each shingle is the low 32 bits of its 64-bit hash, and the shingles of a passage are one
    bytes object of native uint32 values (:func:`shingle_values` reads them): a search keeps the
    shingles of the passages it met (``Searcher._passage_shingles``), and int64 arrays took
    ~13 MiB of the ~100 MiB a process held after the realistic 100k corpus's 1,811 queries
    (8 bytes a shingle and ~110 of array header, against 4 and 33 here; the process's peak
    RSS 99.8 -> 90.2 MiB). 32 bits are enough: two unrelated passages of 500 shingles each
    share a value by chance with probability ~6e-5, one shingle more in their count, which
    moves no pair far from the thresholds across them."""
    compiled = _compiled()
    if text.isascii():
        if compiled is not None:
            return compiled.shingles(text, True)
    else:
        if compiled is not None:
            # most texts, Chinese with its full-width commas and brackets included, in one pass
            # (normalizing first cost Chinese paragraphs about as much as the shingles)
            found = compiled.shingles_nfkc(text, _nfkc_table())
            if found is not None:
                return found
        if not unicodedata.is_normalized("NFKC", text):
            text = _nfkc(text, compiled)
    if compiled is not None:
        # markup removed, then case folded, as the words are read, in one pass where the table
        # can fold (searching for markup cost ~1.5 us a paragraph, casefold ~10 us)
        found = compiled.shingles_raw(text, _raw_table())
        if found is not None:
            return found
    # (markup is found before case folding, which may change lengths; most texts have none)
    prepared = _MARKUP.sub(" ", text) if "<" in text or "](" in text else text
    prepared = prepared.casefold()
    if compiled is not None:
        return compiled.shingles(prepared, False)
    h = word_hashes(prepared)
    if len(h) < SHINGLE:
        one = h[:1] * _MIX1 + (h[1:] * _MIX2 if len(h) > 1 else np.uint64(0))
        return one.astype(np.uint32).tobytes()
    # a polynomial of the three words' hashes (wrapping uint64 arithmetic), its low 32 bits
    return (h[:-2] * _MIX1 + h[1:-1] * _MIX2 + h[2:]).astype(np.uint32).tobytes()


def shingle_values(shingles: bytes | np.ndarray) -> np.ndarray:
    """The uint32 values of a passage's shingles: bytes of them (:func:`passage_shingles`), or
    a contiguous buffer of native uint32 items (a uint32 array), read as it is. The compiled
    ``same_pairs`` takes the same and refuses the same (a ``TypeError``)."""
    if type(shingles) is bytes:
        if len(shingles) % 4:
            raise TypeError(f"shingles are whole uint32 values, not {len(shingles)} bytes")
        return np.frombuffer(shingles, np.uint32)
    try:
        view = memoryview(shingles)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"shingles are bytes or uint32 values, not {type(shingles).__name__}") from None
    if view.itemsize != 4 or view.format not in ("I", "=I", "@I") or not view.c_contiguous:
        raise TypeError(f"shingles are bytes or native uint32 values, not items of format {view.format!r}")
    return np.frombuffer(view, np.uint32)


def same_passage(shared: int, a: int, b: int) -> bool:
    """Whether two passages whose shingle sets have ``a`` and ``b`` members, ``shared`` of
    them in common, are one (Jaccard, or containment of a large enough smaller set)."""
    if shared <= 0:
        return False
    if shared >= DUPLICATE_JACCARD * (a + b - shared):
        return True
    small = min(a, b)
    return small >= DUPLICATE_MIN_SHINGLES and shared >= DUPLICATE_CONTAINMENT * small


def same_passages(shared: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """:func:`same_passage` of every two sets at once (the same double arithmetic): ``shared``
    the matrix of :func:`shared_shingles`, ``sizes`` each set's size."""
    a, b = sizes[:, None], sizes[None, :]
    jaccard = shared >= DUPLICATE_JACCARD * (a + b - shared)
    small = np.minimum(a, b)
    contained = (small >= DUPLICATE_MIN_SHINGLES) & (shared >= DUPLICATE_CONTAINMENT * small)
    return (shared > 0) & (jaccard | contained)


def shared_shingles(sets: Sequence[bytes | np.ndarray]) -> np.ndarray:
    """The matrix of how many distinct shingles each two passages share (``sets``: their
    :func:`passage_shingles`)."""
    return _shared_and_sizes(sets)[0]


def _shared_and_sizes(sets: Sequence[bytes | np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(:func:`shared_shingles`, each passage's number of distinct shingles): all shingles
    sorted together with their owners, repeats within a passage dropped, equal neighbours
    ``d`` apart counted for d = 1, 2, ... while any remain, in a few numpy calls (a shingle is
    in few of the passages)."""
    n = len(sets)
    out = np.zeros((n, n), np.int64)
    arrays = [shingle_values(s) for s in sets]
    vals = np.concatenate(arrays) if n else np.zeros(0, np.uint32)
    owner = np.repeat(np.arange(n), [len(a) for a in arrays])
    # a stable sort keeps the owners of equal shingles in order (the sets were concatenated in order)
    order = np.argsort(vals, kind="stable")
    vals, owner = vals[order], owner[order]
    again = np.concatenate(([False], (vals[1:] == vals[:-1]) & (owner[1:] == owner[:-1])))
    if again.any():  # a shingle a passage repeats: once
        vals, owner = vals[~again], owner[~again]
    sizes = np.bincount(owner, minlength=n).astype(np.int64)
    if n < 2:
        return out, sizes
    repeated = np.flatnonzero(vals[1:] == vals[:-1])  # most shingles are in one set only: drop those
    if not len(repeated):
        return out, sizes
    keep = np.zeros(len(vals), bool)
    keep[repeated] = True
    keep[repeated + 1] = True
    vals, owner = vals[keep], owner[keep]
    for d in range(1, n):
        same = np.flatnonzero(vals[d:] == vals[:-d])
        if not len(same):
            break
        np.add.at(out, (owner[same], owner[same + d]), 1)
    return out + out.T, sizes


def same_pairs(sets: Sequence[bytes | np.ndarray]) -> list[tuple[int, int]]:
    """The pairs ``(i, j)``, ``j < i``, of passages (``sets``: their :func:`passage_shingles`,
    in ranking order) that are one passage (:func:`same_passages` of their sets), sorted."""
    compiled = _compiled()
    if compiled is not None:
        return compiled.same_pairs(list(sets), DUPLICATE_JACCARD, DUPLICATE_CONTAINMENT, DUPLICATE_MIN_SHINGLES)
    shared, sizes = _shared_and_sizes(sets)
    i, j = np.nonzero(np.tril(same_passages(shared, sizes), -1))
    return list(zip(i.tolist(), j.tolist()))


#: Chinese numerals: 十四天 and 三十天 are two numbers of days as 14 and 30 are
_NUMERALS = "〇零一二两三四五六七八九十百千万亿"
#: a number: digits with their separators (0.5, 1,000, 2024-05-01 is three), or a run of numerals
_NUMBER = LazyPattern(r"\d+(?:[.,]\d+)*|[" + _NUMERALS + "]+")


def passage_numbers(text: str) -> tuple[str, ...]:
    """The numbers a passage writes, in order: after NFKC (fullwidth digits, ², ①) and with
    markup left out, as the shingles read the text; digits of any script as ASCII, leading
    zeros dropped, separators kept (``0.5`` is not ``5``). See :func:`numbers_within`."""
    if not text.isascii():
        text = unicodedata.normalize("NFKC", text)
    if "<" in text or "](" in text:
        text = _MARKUP.sub(" ", text)
    out = []
    for m in _NUMBER.findall(text):
        if not m.isascii() and m[0] not in _NUMERALS:
            m = "".join(str(unicodedata.decimal(c)) if c.isdecimal() else c for c in m)
        out.append(m.lstrip("0") or "0" if m.isdigit() else m)
    return tuple(out)


def numbers_within(later: Sequence[str], earlier: Sequence[str]) -> bool:
    """Whether a later near copy of an earlier passage writes no number the earlier one does not,
    in the same order (a subsequence of its numbers): then it is the same passage (a copy in
    another format, a part of it quoted). Otherwise it is another passage: "paid within 14
    days" and "within 30 days" (a policy and its change), "0.5 mg" and "5 mg", numbers
    swapped, or the earlier text with a sentence that adds a number ("From March refunds take
    30 days"): folding it would hide the very difference from a prompt. One-way and pairwise,
    so the passages kept from a prefix of a ranking stay the same however long it is."""
    rest = iter(earlier)
    return all(number in rest for number in later)


def _versions_of_one_source(a: Hit, b: Hit) -> bool:
    return a.source == b.source and a.doc_id != b.doc_id


def collapse_duplicates(hits: Sequence[Hit],
                        shingles: Callable[[Sequence[Hit]], Sequence[bytes]] | None = None) -> list[Hit]:
    """``hits`` (best first) with each passage once: the first hit of a passage stays, its
    later copies go into its :attr:`Hit.duplicates` (in ranking order). A near copy that
    writes other numbers is not a copy (:func:`numbers_within`). Deterministic in the
    ranking: the passages kept from a prefix of it are the same however long it is (the copies
    named grow with it: a search names those among the hits it ranked).
    Versions of one source (a search of history) are never copies of each other.
    ``shingles``: the hits' :func:`passage_shingles` in their order (a cache of them), else computed."""
    if len(hits) < 2:
        return list(hits)
    sets = shingles(hits) if shingles is not None else [passage_shingles(h.text) for h in hits]
    earlier: dict[int, list[int]] = {}  # a hit's index -> the earlier hits of its passage, in order
    numbers: dict[int, tuple[str, ...]] = {}
    for i, j in same_pairs(sets):  # (j < i: j ranks first)
        if i not in numbers:
            numbers[i] = passage_numbers(hits[i].text)
        if j not in numbers:
            numbers[j] = passage_numbers(hits[j].text)
        if numbers_within(numbers[i], numbers[j]):
            earlier.setdefault(i, []).append(j)
    if not earlier:
        return list(hits)
    kept: list[tuple[int, list[Hit]]] = []
    group_of: dict[int, int] = {}  # a lead's index in hits -> its group in kept
    for i, hit in enumerate(hits):
        # the first group (they are in ranking order of their leads) whose lead is this passage
        group = next((group_of[j] for j in earlier[i]
                      if j in group_of and not _versions_of_one_source(hits[j], hit)), None) if i in earlier else None
        if group is not None:
            kept[group][1].append(hit)
        else:
            group_of[i] = len(kept)
            kept.append((i, []))
    return [dataclasses.replace(hits[lead], duplicates=tuple(Duplicate(d.source, d.chunk_id, d.doc_id, d.score)
                                                            for d in copies)) if copies else hits[lead]
            for lead, copies in kept]
