"""Text analysis: turning text into index terms, the same way for documents and queries.

The default analyzer handles English and Chinese (and both mixed in one text):

* Unicode NFKC normalization, so full-width forms (``ＡＢＣ``, ``１２３``) match
  their ASCII forms, then case folding.
* Latin/Cyrillic/other words: English stopwords removed, Snowball English
  stemming (PyStemmer); technical words kept (version 2, below).
* CJK runs (Han ideographs, kana): character unigrams plus bigrams. Unigrams
  give recall for one-character words, bigrams give most of the precision of
  a word segmenter without a dictionary. Chinese question words are stopwords.
* Optionally (``cjk="jieba"``, extra ``ragdb[jieba]``) CJK runs are segmented
  with jieba's search mode instead.

The configuration is stored in the database (:meth:`Analyzer.config`) and a
database refuses to be opened with another one, so indexing and querying
always agree. ``ragdb reindex`` (:meth:`ragdb.Database.reindex`) rebuilds a
database's index with another analyzer.

Versions
--------
The word rules have a version, stored with the configuration; a database keeps
the version it was built with (its terms and scores never change under it), and
new databases get :data:`ANALYZER_VERSION`.

Version 1 splits words at every character that is not a letter or digit and
drops one-letter words: ``C++`` and ``C#`` are ``c`` (dropped), ``node.js`` is
``node`` and ``js``.

Version 2 (the default) keeps technical words. Text is split at whitespace and
punctuation, except the characters ``. - _ : + # '`` inside a token, which it
reads as follows (results after case folding and stemming):

* Symbols: a word ending in ``++`` (``c++``, ``g++``, ``notepad++``) and one
  letter ending in ``#`` (``c#``, ``f#``) are one term each, not stemmed.
* Compounds joined by ``.``, runs of ``_`` or ``::`` (``node.js``,
  ``x86_64``, ``CMAKE_CXX_STANDARD``, ``std::vector``, version numbers
  ``3.11`` and ``v2.0.1``) are indexed as the whole compound, not stemmed,
  and as each of their parts, stemmed like other words: ``node.js``, ``node``,
  ``js``. A leading dot belongs to the word: ``.NET`` is ``.net`` and ``net``.
* Letters joined by dots are an abbreviation, one word of its letters:
  ``U.S.A.`` is ``usa``; ``e.g.`` and ``i.e.`` are stopwords.
* Hyphens join weaker: each part between hyphens is a word or compound of its
  own (``tissue-resident``: ``tissu``, ``resid``; ``0.5-9.6``: ``0.5`` ... ``9.6``
  ...). When the first part is a single letter, which means little alone, it
  also forms one word with the second, so ``e-mail`` meets ``email``
  (``e-mail`` is ``email``, ``e``, ``mail``; ``x-ray``, ``T-cell``). Joining
  every hyphenated compound cost SciFact nDCG@10 0.003 (measured): a rare
  joined term outweighed the words that matter.
* One-letter words are terms (``C``, ``R``, ``vitamin D``, ``T`` cells); the
  English stopwords are NLTK's less the one-letter ``t d m o y``, which are
  there for contractions: version 2 drops the endings ``'s 't 'd 'm 'll 're
  've`` after a word instead (``don't`` is ``don``, a stopword). ``a``, ``i``
  and ``s`` (mostly a plural mark: ``protein(s)``) stay stopwords.
* A leading ``-`` or ``+`` is not part of a word (``-5`` is ``5``), so a query
  parser can read ``-word`` and ``+word`` as operators; ``"`` is a separator.

A chunk's length for BM25 counts its terms less the compound whole forms that
share the position of their first part (as Lucene discounts overlapping
tokens): writing ``node.js`` instead of ``node js`` does not make a text
longer (:class:`TermCounts`).

Measured (SciFact train and CMRC 2018 trial, full query sets): nDCG@10 0.70229
(version 1) and 0.70226 (version 2), 0.99275 and 0.99275; of the choices above,
joining every hyphenated compound cost 0.003 and counting whole forms in the
length 0.001. Cost: version 2 analyzes SciFact's abstracts in 1.07-1.15x the
time of version 1 once their words are known (the memo) and 1.35-1.4x while
learning new ones (a compound is parsed once, a plain word only stemmed);
Chinese text costs the same.

Tokens and positions
--------------------
:meth:`Analyzer.tokens` gives each term with its character span in the original
text (before normalization) and its position, for phrase adjacency: each word
(a part of a compound, a piece of a word cut at ``MAX_TOKEN_CHARS``, a symbol
such as ``c++``) takes one position, and so does a dropped word (a stopword,
and in version 1 a one-letter word), so ``state of the art`` keeps the gap; a
compound's whole form has the position of its first part (``node.js`` at p:
``node.js`` p, ``node`` p, ``js`` p+1); a dropped clitic takes none. In CJK
text each character takes one position; a bigram (or jieba word) has the
position of its first character.
"""

from __future__ import annotations

import bisect
import collections
import functools
import os
import re
import signal
import sys
import time
import unicodedata
from array import array
from collections import Counter, _count_elements  # type: ignore[attr-defined]
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence, Set
from itertools import accumulate, chain, filterfalse
from typing import Any, NamedTuple

from ragdb.errors import InvalidInput, MissingDependency, RagdbError
from ragdb.patterns import LazyPattern

try:  # built by setup.py beside the scoring kernel; absent where no compiler was found
    from ragdb.text import canalysis as _canalysis_module
    _canalysis: Any = _canalysis_module
except ImportError:  # pragma: no cover - a platform without the extension
    _canalysis = None


def _file_stamps() -> tuple[tuple[str, int, int], ...]:
    """The path, size and modification time of this module's file and of the compiled
    analysis's (as this process imports them: :data:`_CODE_STAMP`). A worker started as a fresh
    interpreter reads the files on disk, which an upgrade (or an edit) may have changed since
    this process read them, or finds another copy of ragdb first; the pool forks its workers
    instead then (:func:`_start_fresh_workers`)."""
    stamps = []
    for path in (__file__, getattr(_canalysis, "__file__", None)):
        try:
            st = os.stat(path) if path else None
        except OSError:
            st = None
        stamps.append((str(path), st.st_size, st.st_mtime_ns) if st is not None else (str(path), -1, -1))
    return tuple(stamps)


_CODE_STAMP = _file_stamps()

# CJK ideographs (unified + extension A + compatibility + supplementary planes)
# and Japanese kana. Hangul is space-delimited, so it is treated as words.
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003134f"


def _below_cjk(text: str) -> bool:
    """True when ``text`` has no character from the first CJK range (U+3040) up: it has no CJK
    character then. ASCII text answers from a flag (``str.isascii``); other text with one scan
    of a one-range class, which compiles in a third of the CJK class's time and scans faster
    (13 against 20 us a 1,500-character text; ``max(text)`` took 89)."""
    return text.isascii() or _FROM_CJK.search(text) is None


_TERM_RE = LazyPattern(rf"[{_CJK}]+|[^\W_{_CJK}]+")  # version 1 only
# Words: two or more letters/digits (longer ones are cut at MAX_TOKEN_CHARS),
# or a single digit. Single letters carry no meaning as index terms.
_WORD_RE = LazyPattern(r"[^\W_]{2,64}|\d")
# For chunking: every CJK character is one token, words are tokens.
_SPAN_RE = LazyPattern(rf"[{_CJK}]|[^\W_{_CJK}]+")
_CJK_CHAR = LazyPattern(rf"[{_CJK}]")
_FROM_CJK = LazyPattern("[^\x00-\u303f]")  # a character from the first CJK range up (see _below_cjk)

# English stopwords (the NLTK list, which bm25s and most BM25 setups use).
ENGLISH_STOPWORDS = frozenset(
    """a about above after again against ain all am an and any are aren aren't as at be
    because been before being below between both but by can couldn couldn't d did didn
    didn't do does doesn doesn't doing don don't down during each few for from further had
    hadn hadn't has hasn hasn't have haven haven't having he her here hers herself him
    himself his how i if in into is isn isn't it it's its itself just ll m ma me mightn
    mightn't more most mustn mustn't my myself needn needn't no nor not now o of off on once
    only or other our ours ourselves out over own re s same shan shan't she she's should
    should've shouldn shouldn't so some such t than that that'll the their theirs them
    themselves then there these they this those through to too under until up ve very was
    wasn wasn't we were weren weren't what when where which while who whom why will with won
    won't wouldn wouldn't y you you'd you'll you're you've your yours yourself
    yourselves""".split()
)

# Chinese stopwords: the interrogatives and question particles, the
# counterparts of the interrogatives in the English list (what, which, who,
# how...). Questions are full of them and encyclopedic or technical text
# rarely has them, so their high IDF made a document that merely contains
# "什么" outrank the one that answers "X 是什么？" (measured on CMRC 2018:
# nDCG@10 0.9904 -> 0.9928; BENCHMARKS.md). With bigram analysis these are
# the unigram and bigram terms dropped; a bigram that holds a stopword
# character but means something else (几乎, 茶几) is kept.
CHINESE_STOPWORDS = frozenset(
    "什 么 哪 谁 几 吗 呢 什么 哪些 哪个 哪里 怎么 怎样 如何 为何 多少 为什么 是什么".split()
)
# Version 2 keeps one-letter words as terms (T cells, vitamin D, the C language, R).
# The single letters of the NLTK list are there for contractions (don't, I'd, I'm),
# whose endings version 2 drops as clitics instead; of them "a", "i" and "s" stay
# stopwords ("s" is mostly a plural mark, "protein(s)").
ENGLISH_STOPWORDS_V2 = ENGLISH_STOPWORDS - frozenset("t d m o y".split())
# Abbreviations written with dots that are function words: "e.g." and "i.e." give no
# term (while "IE" and "u.s.a." do).
DOTTED_STOPWORDS = frozenset({"eg", "ie"})
STOPWORD_LISTS = {None: frozenset(), "english": ENGLISH_STOPWORDS, "chinese": CHINESE_STOPWORDS,
                  "english+chinese": ENGLISH_STOPWORDS | CHINESE_STOPWORDS}

# Upper bound on the length of one word token. A 1 MB "word" is not a word;
# cutting it keeps the vocabulary and the stemmer sane.
MAX_TOKEN_CHARS = 64  # keep in step with _WORD_RE

# ASCII text is split by bytes.translate: every byte that is not an ASCII
# letter or digit becomes a space (for ASCII, ``[^\W_]`` is exactly [A-Za-z0-9]).
_ASCII_SPLIT = bytes(c if chr(c).isascii() and chr(c).isalnum() else 0x20 for c in range(256))
# Bound of the token memo (distinct tokens); it is emptied when full.
MEMO_SIZE = 200_000
#: The size of ``array("i")``'s items: the compiled token table gives 32-bit offsets.
_INT_BYTES = array("i").itemsize
# Bound of the positions memo (phrase checks) in (term, position) pairs, not runs: a CJK
# run is a whole clause, hundreds of pairs, so 200,000 runs of them could be gigabytes.
# Measured about 165 bytes a pair (the memo, its indexes, the terms' strings; see _pos_info):
# about 10 MiB. The phrase queries of the realistic 100k benchmark held 74,000 pairs.
POS_MEMO_PAIRS = 64_000
# A CJK run of more (term, position) pairs is read each time, never remembered: it is a
# clause, which comes back in another text about as rarely as the text itself (the realistic
# 100k benchmark's Chinese phrase queries filled the memo with clauses and emptied it again
# and again; the reader's peak RSS over its 1,811 queries held ~5 MiB of them), while words
# (``os.path.join`` too) and two-character CJK runs come back text after text.
POS_MEMO_RUN_PAIRS = 3


# -- version 2 -----------------------------------------------------------------
#: The analyzer version new databases get; stored configurations keep theirs.
ANALYZER_VERSION = 2
ANALYZER_VERSIONS = (1, 2)

# Version 2 keeps the characters that join a word's parts or mark it in the raw
# tokens text is split into (ASCII text with one bytes.translate + split, like
# version 1), and _plan2 reads each raw token: ``.`` ``-`` ``_`` ``::`` join
# compounds, ``++`` and ``#`` end symbols, an apostrophe starts a clitic.
_RAW2 = LazyPattern(r"[\w.\-:+#'\u2019]+")  # text without CJK (\w includes "_")
_TERM2_RE = LazyPattern(rf"[{_CJK}]+|(?:[^\W{_CJK}]|[.\-:+#'\u2019])+")  # _RAW2's runs without CJK
_ASCII_SPLIT2 = bytes(c if (chr(c).isascii() and chr(c).isalnum()) or chr(c) in "._-:+#'" else 0x20
                      for c in range(256))
# The units of a raw token, in order of preference at each place:
# * sym: a word ending in ``++`` (c++, g++, notepad++) or one letter ending in ``#`` (c#, f#);
# * clitic: ``'s 't 'd 'm 'll 're 've`` after a word (dropped: "don't" is "don", a stopword);
# * a word or compound, optionally after a leading dot (.net): words joined by single
#   ``.`` or ``-``, runs of ``_``, or ``::`` (node.js, e-mail, x86_64, std::vector, 3.11).
_UNIT2 = LazyPattern(r"(?P<sym>[^\W_]+\+\+(?!\+)|(?<![^\W_])[^\W\d_]\#)"
                    r"|(?P<clitic>(?<=[^\W_])['\u2019](?:s|t|d|m|ll|re|ve)(?![^\W_]))"
                    r"|(?P<lead>(?<![^\W_.])\.(?=[^\W\d_]))?(?P<body>[^\W_]+(?:(?:[.\-]|_+|::)[^\W_]+)*)")
_RUN = LazyPattern(r"[^\W_]+")
_CLITIC_WORD = LazyPattern(r"([^\W_]+)(['\u2019](?:s|t|d|m|ll|re|ve))")
# The parts of a compound between hyphens: words joined by ``.`` ``_`` ``::``.
_SEGMENT = LazyPattern(r"[^\W_]+(?:(?:\.|_+|::)[^\W_]+)*")
# Version 1's words for tokens(): a run is cut like _WORD_RE cuts it, and a lone letter,
# which _WORD_RE skips, is a dropped word of its own (it keeps its position).
_WORD1_ALL = LazyPattern(r"[^\W_]{2,64}|[^\W_]")
_DIGIT = LazyPattern(r"\d")
# Items of a plan: a word (word rules decide its term), a final term, a dropped clitic
# (version 1: a lone letter), and a compound's whole form as a word or as a final term
# (it shares the position of the compound's first part, the item after it).
_WORD, _TERM, _DROP, _WHOLE_WORD, _WHOLE_TERM = 0, 1, 2, 3, 4
_WORDS = (_WORD, _WHOLE_WORD)
# Counted among a raw token's terms for each whole form that overlaps a part (never a term:
# analysis never keeps a NUL); term_counts takes them out as TermCounts.overlaps.
_OVERLAP = "\0"
_TERMS = (_TERM, _WHOLE_TERM)
_EDGE_JOINERS = ".-_:'\u2019"
# Punctuation around a query word, left out when naming it (``"the?"`` is "the").
_PIECE_EDGES = LazyPattern(r"^[^\w.]+|[^\w+#]+$")

Plan = list[tuple[int, str, int, int, int]]  # (kind, value, start, end, position)


# Text that is not ASCII but has no CJK (mostly English with a few other characters: a
# Greek letter, a dash, an accent) is split like ASCII text, by bytes: its UTF-8 bytes with
# every ASCII byte that joins no token made a space, the bytes of other characters kept;
# only the few tokens holding such bytes are split again by _RAW2. The same tokens, in order,
# as _RAW2 over the whole text (a match never crosses an ASCII character outside its class),
# in ~1/4 of its time; ASCII tokens as bytes, as in ASCII text (the memo takes either).
_MIXED_SPLIT2 = bytes(c if c >= 0x80 or chr(c).isalnum() or chr(c) in "._-:+#'" else 0x20 for c in range(256))


def _raw_tokens2(text: str) -> list[Any]:
    """Version 2's raw tokens of normalized text without CJK: ``_RAW2.findall(text)``, with
    its pure ASCII tokens as bytes."""
    try:
        pieces = text.encode("utf-8").translate(_MIXED_SPLIT2).split()
    except UnicodeEncodeError:  # a lone surrogate (a query's): no bytes to split
        return _RAW2.findall(text)
    out: list[Any] = []
    for piece in pieces:
        if piece.isascii():
            out.append(piece)
        else:
            out.extend(_RAW2.findall(piece.decode("utf-8")))
    return out


def _core(raw: str) -> str | None:
    """A version 2 raw token without the joining characters at its ends (``word.``, ``(word``,
    ``-0.5``), or None when an end matters (``.net``, ``c++``, ``c#.``: _plan2 reads those)."""
    left = raw.lstrip("-_:'\u2019+#")
    if left[:1] == ".":
        return None
    core = left.rstrip(_EDGE_JOINERS)
    return core if core and core[-1] not in "+#" else None


def _compound_items(core: str) -> list[tuple[int, str]] | None:
    """The (kind, value) items _plan2 gives a token core made of words joined by single
    hyphens and dots, or of a word and a clitic: the common compounds (well-known, 0.05,
    node.js, 0.5-9.6, Alzheimer's), found without the unit parser; None for any other core."""
    if "'" in core or "\u2019" in core:
        m = _CLITIC_WORD.fullmatch(core)
        return None if m is None or len(m.group(1)) > MAX_TOKEN_CHARS else [(_WORD, m.group(1)), (_DROP, m.group(2))]
    found = _joined_plan(core)  # words joined by hyphens and dots: their items without the offsets
    return None if found is None else [(kind, value) for kind, value, *_ in found[0]]


def _word_items(word: str, start: int, pos: int, out: Plan) -> int:
    """Append a word's items (cut at MAX_TOKEN_CHARS, one position each); returns the positions used."""
    if len(word) <= MAX_TOKEN_CHARS:
        out.append((_WORD, word, start, start + len(word), pos))
        return 1
    n = 0
    for i in range(0, len(word), MAX_TOKEN_CHARS):
        piece = word[i:i + MAX_TOKEN_CHARS]
        out.append((_WORD, piece, start + i, start + i + len(piece), pos + n))
        n += 1
    return n


def _plan2(raw: str) -> tuple[Plan, int]:
    """Version 2: the items of one raw token (offsets into it, positions from 0) and
    the number of positions it takes. See the module docstring for the rules."""
    found = _joined_plan(raw)
    return found if found is not None else _unit_plan(raw)


def _joined_plan(raw: str) -> tuple[Plan, int] | None:
    """:func:`_unit_plan` of the raw tokens most texts hold besides words, without the unit
    expression: words joined by single hyphens and dots (tissue-resident, 0.05, 24.7-fold,
    u.s.a), after any hyphens and before any of ``.`` ``-`` ``:`` (-0.5, world-wide.); None for
    any other token. In such a token the expression finds one body, its hyphens cut it into
    segments (:data:`_SEGMENT`) and its dots into words (:data:`_RUN`): here ``str.split``
    does both. 85% of the SciFact tokens that are not one word (4,814 in 1,000 texts) take
    this path; a cold highlight spent ~40% of its time in the expression
    (tests/text/test_analyzer_tokens.py compares the two)."""
    core = raw.lstrip("-")
    base = len(raw) - len(core)
    core = core.rstrip(".-:")
    if not core or core[0] == ".":
        return None
    out: Plan = []
    segments = core.split("-")
    for seg in segments:
        if not seg or not seg.replace(".", "a").isalnum() or ".." in seg or seg[-1] == "." or seg[0] == ".":
            return None
    if len(segments) > 1:
        first, second = segments[0], segments[1]
        if len(first) == 1 and not first.isdecimal() and second.isalnum() and len(second) < MAX_TOKEN_CHARS:
            out.append((_WHOLE_WORD, first + second, base, base + 2 + len(second), 0))
    pos = 0
    start = base
    for seg in segments:
        if seg.isalnum():
            pos += _word_items(seg, start, pos, out)
        else:  # _segment_items of words joined by dots
            parts = seg.split(".")
            if all(len(p) == 1 and not p.isdecimal() for p in parts):  # u.s.a, e.g
                letters = "".join(parts)
                out.append((_DROP, seg, start, start + len(seg), pos) if letters in DOTTED_STOPWORDS else
                           (_WORD, letters, start, start + len(seg), pos))
                pos += 1
            else:
                if len(seg) <= MAX_TOKEN_CHARS:
                    out.append((_WHOLE_TERM, seg, start, start + len(seg), pos))
                n, at = 0, start
                for p in parts:
                    n += _word_items(p, at, pos + n, out)
                    at += len(p) + 1
                pos += n
        start += len(seg) + 1
    return out, pos


def _unit_plan(raw: str) -> tuple[Plan, int]:
    """:func:`_plan2` through the unit expression (:data:`_UNIT2`): every raw token."""
    out: Plan = []
    pos = 0
    for m in _UNIT2.finditer(raw):
        kind = m.lastgroup
        if kind == "sym":
            out.append((_TERM, m.group(), m.start(), m.end(), pos))
            pos += 1
        elif kind == "clitic":
            out.append((_DROP, m.group(), m.start(), m.end(), max(pos - 1, 0)))
        elif m.start("lead") >= 0 and m.group("body").isalnum():  # .net: the whole and the word
            if len(m.group()) <= MAX_TOKEN_CHARS:
                out.append((_WHOLE_TERM, m.group(), m.start(), m.end(), pos))
            pos += _word_items(m.group("body"), m.start("body"), pos, out)
        else:
            lead = m.start("lead") >= 0
            segments = list(_SEGMENT.finditer(m.string, m.start() + lead, m.end()))
            if len(segments) > 1:
                # Hyphens join words weaker than the other joiners: each part between
                # hyphens is a word or compound of its own (tissue-resident: tissue,
                # resident, at adjacent positions; 0.5-9.6: 0.5 and 9.6), and when the
                # first is a single letter, which means little alone, it also makes one
                # word with the second (e-mail: email, e, mail; x-ray, T-cell). Joining
                # every hyphenated compound cost SciFact nDCG@10 0.003 (a rare joined
                # term outweighed the words that matter).
                first, second = segments[0].group(), segments[1].group()
                if len(first) == 1 and not first.isdecimal() and second.isalnum() \
                        and len(second) < MAX_TOKEN_CHARS:
                    out.append((_WHOLE_WORD, first + second, segments[0].start(), segments[1].end(), pos))
            for seg in segments:
                pos += _segment_items(seg, pos, out)
    return out, pos


def _segment_items(seg: re.Match[str], pos: int, out: Plan) -> int:
    """Append the items of a word or a compound joined by ``.`` ``_`` ``::`` (no hyphen);
    returns the positions used. A compound is its whole form (not stemmed, at the first
    part's position) then its parts; letters joined by dots are one word (u.s.a, e.g)."""
    text, s0 = seg.group(), seg.start()
    if text.isalnum():
        return _word_items(text, s0, pos, out)
    runs = list(_RUN.finditer(text))
    if all(len(r.group()) == 1 and not r.group().isdecimal() for r in runs) \
            and all(text[a.end():b.start()] == "." for a, b in zip(runs, runs[1:])):
        letters = "".join(r.group() for r in runs)
        out.append((_DROP, text, s0, seg.end(), pos) if letters in DOTTED_STOPWORDS else
                   (_WORD, letters, s0, seg.end(), pos))
        return 1
    if len(text) <= MAX_TOKEN_CHARS:
        out.append((_WHOLE_TERM, text, s0, seg.end(), pos))
    n = 0
    for r in runs:
        n += _word_items(r.group(), s0 + r.start(), pos + n, out)
    return n


def _plan1(run: str) -> tuple[Plan, int]:
    """Version 1: the items of an alphanumeric run for tokens() (each its own position)."""
    out: Plan = []
    for i, m in enumerate(_WORD1_ALL.finditer(run)):
        w = m.group()
        kind = _DROP if len(w) == 1 and _DIGIT.match(w) is None else _WORD
        out.append((kind, w, m.start(), m.end(), i))
    return out, len(out)


_NON_ASCII_RUN = LazyPattern(r"[^\x00-\x7f]+")


def _normalize_map(text: str) -> tuple[str, list[int] | None, list[int] | None]:
    """``NFKC(text).casefold()`` (what analysis reads) and, per character of it, the start
    and end of the original characters it came from (None, None: the same offsets).

    The text is cut into clusters (a character and the combining marks after it),
    each normalized on its own; a cluster that composes with the one before it
    (Hangul jamo, half-width voiced marks) is merged into it. Should the pieces
    still not add up to the whole, every character maps to the whole text.

    Only the clusters that hold a character beyond ASCII are looked at one by one: an ASCII
    character with no mark after it is a cluster of its own, the same character once
    normalized, and nothing merges into it unless the cluster after it starts beyond ASCII
    (which is looked at). A text with a few such characters among 1,500 took ~2.5 ms when
    every character was a Python step. The tests compare this with the cluster-by-cluster
    definition (tests/text/test_analyzer_tokens.py)."""
    if text.isascii():
        return text.lower(), None, None
    if unicodedata.is_normalized("NFKC", text):
        folded = text.casefold()
        if len(folded) == len(text):  # casefold maps each character to one
            return folded, None, None
    nfkc = unicodedata.normalize
    combining = unicodedata.combining
    # segments in text order: (start, end, its NFKC) of a cluster, or (start, end, None) for a
    # stretch of plain ASCII clusters (one character each)
    segs: list[tuple[int, int, str | None]] = []
    done = 0  # the clusters before this are in segs
    for m in _NON_ASCII_RUN.finditer(text):
        r0, r1 = m.start(), m.end()
        if r0 > done and combining(text[r0]):  # an ASCII character with marks after it: its cluster
            r0 -= 1
        if r0 > done:
            segs.append((done, r0, None))
        bounds = [r0] + [i for i in range(r0 + 1, r1) if not combining(text[i])] + [r1]
        for a, b in zip(bounds, bounds[1:]):
            norm = nfkc("NFKC", text[a:b])
            if segs and not text[a].isascii():
                pa, pb, pn = segs[-1]
                stretch = pn is None
                if pn is None:  # the cluster before is the stretch's last character
                    pa, pn = pb - 1, text[pb - 1]
                joined = nfkc("NFKC", text[pa:b])
                if joined != pn + norm:
                    if stretch:  # that character leaves the stretch, merged into this cluster
                        if segs[-1][0] < pa:
                            segs[-1] = (segs[-1][0], pa, None)
                        else:
                            segs.pop()
                        segs.append((pa, b, joined))
                    else:
                        segs[-1] = (pa, b, joined)
                    continue
            segs.append((a, b, norm))
        done = r1
    if done < len(text):
        segs.append((done, len(text), None))
    whole = unicodedata.normalize("NFKC", text).casefold()
    starts: list[int] = []
    ends: list[int] = []
    pieces: list[str] = []
    for a, b, seg_norm in segs:
        if seg_norm is None:
            starts.extend(range(a, b))
            ends.extend(range(a + 1, b + 1))
            pieces.append(text[a:b].lower())
            continue
        folded = seg_norm.casefold()
        starts.extend([a] * len(folded))
        ends.extend([b] * len(folded))
        pieces.append(folded)
    if "".join(pieces) != whole:  # pragma: no cover - no known text does this
        return whole, [0] * len(whole), [len(text)] * len(whole)
    return whole, starts, ends


#: Whether analysis runs compiled where it can (:meth:`Analyzer.compiled`): ``RAGDB_KERNEL=numpy``
#: turns it off as it turns off every compiled part of ragdb, and :func:`ragdb.index.kernel.use`
#: switches it with the scoring kernel (through :func:`use_compiled`: the text layer does not
#: import the index layer).
_compiled_on = os.environ.get("RAGDB_KERNEL", "").strip().lower() != "numpy"


def use_compiled(enabled: bool) -> None:
    """Let analysis run compiled (where it is installed) or not: :func:`ragdb.index.kernel.use`
    calls this; the results are the same either way, only the time differs."""
    global _compiled_on
    _compiled_on = bool(enabled)


def compiled_available() -> bool:
    """Whether the compiled analysis (:mod:`ragdb.text.canalysis`) is installed."""
    return _canalysis is not None


def is_cjk(text: str) -> bool:
    """True when ``text`` contains at least one CJK ideograph or kana."""
    return not _below_cjk(text) and _CJK_CHAR.search(text) is not None


def describe_config(config: Any) -> str:
    """A stored analyzer configuration in words (see :meth:`Analyzer.describe`)."""
    if isinstance(config, Mapping) and isinstance(config.get("name"), str) and config.get("name") != "ragdb":
        name = config["name"]
        return f"{name} (a plugin analyzer{'' if _plugin_analyzer(name) is not None else ', plugin not installed'})"
    if not isinstance(config, Mapping) or config.get("name") != "ragdb":
        return f"an unknown analyzer ({config!r})"
    stem, stop, cjk = config.get("stem"), config.get("stopwords"), config.get("cjk", "bigram")
    parts = ["English stemming" if stem == "english" else "no stemming",
             f"{stop.replace('+', ' and ')} stopwords".replace("english", "English").replace("chinese", "Chinese")
             if stop else "no stopwords",
             "CJK bigrams" if cjk == "bigram" else "jieba word segmentation"]
    names = {("english", "english+chinese", "bigram"): "default", ("english", "english+chinese", "jieba"): "jieba",
             (None, None, "bigram"): "simple"}
    name = names.get((stem, stop, cjk), "custom")
    version = config.get("version")
    if version != ANALYZER_VERSION:  # the current version goes without saying
        parts.append(f"version {version}")
    return f"{name} ({', '.join(parts)})"


class TermCounts(Counter[str]):
    """Term frequencies (:meth:`Analyzer.term_counts`, version 2) that also know how many
    of the terms are a compound's whole form sharing the position of its first part
    (``node.js`` beside ``node``): ``overlaps``. A chunk's length for BM25 is the sum of
    the counts less ``overlaps`` (as Lucene discounts overlapping tokens), so writing a
    word as a compound does not make a text longer."""

    overlaps: int = 0


class Token(NamedTuple):
    """One index term of a text where it occurs (:meth:`Analyzer.tokens`).

    ``start``/``end``: character offsets into the original text (before
    normalization), so ``text[start:end]`` is what produced the term.
    ``position``: the token position for phrase adjacency (see the module
    docstring: a word takes one position, a dropped stopword keeps its own,
    each CJK character takes one)."""

    term: str
    start: int
    end: int
    position: int


#: ``Token`` of a (term, start, end, position) tuple, made in C (``Token(...)`` runs the
#: named tuple's ``__new__`` in Python: twice the time, for ~150 tokens a highlighted chunk)
_new_token = functools.partial(tuple.__new__, Token)


class Analyzer:
    """Turns text into index terms.

    Parameters are part of the stored configuration: ``stem`` (``"english"``
    or ``None``), ``stopwords`` (``"english+chinese"``, ``"english"``,
    ``"chinese"`` or ``None``), ``cjk`` (``"bigram"`` or ``"jieba"``), and
    ``version``, the word rules (1: the first analyzer; 2, the default for new
    databases: technical words such as ``c++`` and ``node.js`` are kept; see the
    module docstring). English stopwords are dropped from words, Chinese ones
    from CJK terms.
    """

    def __init__(self, *, stem: str | None = "english", stopwords: str | None = "english+chinese",
                 cjk: str = "bigram", version: int = ANALYZER_VERSION) -> None:
        if stem not in (None, "english"):
            raise InvalidInput(f"analyzer stem={stem!r}: only 'english' or None are supported")
        if stopwords not in STOPWORD_LISTS:
            raise InvalidInput(f"analyzer stopwords={stopwords!r}: choose one of "
                               f"{', '.join(repr(k) for k in STOPWORD_LISTS)}")
        if cjk not in ("bigram", "jieba"):
            raise InvalidInput(f"analyzer cjk={cjk!r}: choose 'bigram' or 'jieba'")
        if version not in ANALYZER_VERSIONS or isinstance(version, bool):
            raise InvalidInput(f"analyzer version={version!r}: this ragdb knows versions "
                               f"{', '.join(map(str, ANALYZER_VERSIONS))} (a newer ragdb may know more)")
        self.stem = stem
        self.stopwords = stopwords
        self.cjk = cjk
        self.version = version
        self._v1 = version == 1
        english = stopwords in ("english", "english+chinese")
        self._stop = (ENGLISH_STOPWORDS if self._v1 else ENGLISH_STOPWORDS_V2) if english else frozenset()
        self._cjk_stop = CHINESE_STOPWORDS if stopwords in ("chinese", "english+chinese") else frozenset()
        self._stemmer: Any = None
        if stem == "english":
            import Stemmer  # PyStemmer, a core dependency

            self._stemmer = Stemmer.Stemmer("english", 0)  # no cache: _memo is ours (its cache made new words ~2.5x slower)
        self._jieba: Any = None
        if cjk == "jieba":
            try:
                import jieba
            except ImportError as e:  # pragma: no cover - depends on environment
                raise MissingDependency(
                    "the jieba analyzer needs jieba: pip install 'ragdb[jieba]'"
                ) from e
            jieba.setLogLevel(60)  # jieba logs its dictionary loading otherwise
            self._jieba = jieba
        # Version 1: memo of raw word token -> its index term ("" for none; see _tokens);
        # version 2: raw token -> the tuple of its index terms (see _learn2).
        self._memo: dict[Any, Any] = {}
        self._multi: dict[Any, tuple[str, ...]] = {}  # version 1: tokens that yield several terms
        self._pos_memo: dict[Any, tuple[tuple[str, ...], tuple[int, ...], int]] = {}  # run -> _pos_info
        self._runs_of: dict[str, Any] = {}  # term -> the remembered run holding it, or a set of them
        self._pos_terms: dict[str, str] = {}  # one string object per remembered term
        self._width: dict[Any, int] = {}  # run -> its width in positions
        self._nonsimple: set[Any] = set()  # runs of other than one position
        self._pos_pairs = 0  # (term, position) pairs held by _pos_memo
        self._tok_memo: dict[str, tuple[list[tuple[str, int, int, int]], int]] = {}  # the same with offsets
        self._words: dict[str, str] = {}  # version 2: word -> its term after word rules ("" dropped)
        self._learning = False  # version 2: the last text counted had tokens not in the memo
        self._fast: Any = None  # the compiled hot loop (_compiled), made on first use

    # -- configuration ---------------------------------------------------
    def config(self) -> dict[str, Any]:
        """The configuration stored in the database."""
        return {"name": "ragdb", "version": self.version, "stem": self.stem,
                "stopwords": self.stopwords, "cjk": self.cjk}

    def describe(self) -> str:
        """The configuration in words: its spec name when it has one, then what it does
        (``"simple (no stemming, no stopwords, CJK bigrams)"``)."""
        return describe_config(self.config())

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> "Analyzer":
        """The analyzer of a stored configuration: ragdb's own (``"name": "ragdb"``), or
        one a plugin provides under the configuration's ``name`` (see :mod:`ragdb.plugins`);
        a plugin that is not installed is an :class:`InvalidInput` saying so."""
        name = config.get("name") if isinstance(config, Mapping) else None
        if name == "ragdb" and config.get("version") in ANALYZER_VERSIONS \
                and not isinstance(config.get("version"), bool):
            return Analyzer(stem=config.get("stem"), stopwords=config.get("stopwords"),
                            cjk=config.get("cjk", "bigram"), version=config["version"])
        if name == "ragdb" and isinstance(config.get("version"), int) and not isinstance(config.get("version"), bool) \
                and config["version"] > ANALYZER_VERSION:
            raise InvalidInput(f"analyzer version {config['version']} was written by a newer ragdb (this one knows "
                               f"versions {', '.join(map(str, ANALYZER_VERSIONS))}); upgrade ragdb to open the "
                               f"database (stored configuration {dict(config)!r})")
        if isinstance(name, str) and name != "ragdb":
            found = _plugin_analyzer(name)
            if found is None:
                raise InvalidInput(
                    f"the analyzer {name!r} of this database comes from a plugin that is not installed (or "
                    f"failed to load: 'ragdb plugins' lists them and their problems); install the package "
                    f"that provides it to open the database (stored configuration {dict(config)!r})")
            factory = found.obj
            overridden = getattr(getattr(factory, "from_config", None), "__func__", None) is not \
                Analyzer.from_config.__func__  # type: ignore[attr-defined]
            made = _checked_plugin_analyzer(found, lambda: factory.from_config(config) if overridden else factory())
            if made.config() != dict(config):
                raise InvalidInput(f"analyzer {name!r} (plugin {found.plugin!r}) cannot rebuild the stored "
                                   f"configuration {dict(config)!r}: it gives {made.config()!r}")
            return made
        raise InvalidInput(f"unknown analyzer configuration {dict(config) if isinstance(config, Mapping) else config!r}")

    @classmethod
    def from_spec(cls, spec: "str | Analyzer | Mapping[str, Any] | None") -> "Analyzer":
        """``None``/``"default"``, ``"jieba"``, ``"simple"`` (no stemming or stopwords),
        the name of an analyzer an installed plugin provides, a config mapping (e.g. a
        stored version 1 configuration), or an :class:`Analyzer`. The names give the
        current version (:data:`ANALYZER_VERSION`); they go through :func:`ragdb.plugins.find`
        (ragdb's own are registered by :func:`register_builtins`)."""
        if spec is None:
            spec = "default"
        if isinstance(spec, Analyzer):
            return spec
        if isinstance(spec, Mapping):
            return cls.from_config(spec)
        from ragdb import plugins

        found = plugins.find("analyzer", spec) if isinstance(spec, str) else None
        if found is not None and found.arg is None:
            if found.provided.builtin:
                made: Analyzer = found.build()
                return made
            return _checked_plugin_analyzer(found.provided, found.build)
        listed = ", ".join(repr(name) for name in plugins.names("analyzer"))
        raise InvalidInput(f"analyzer {spec!r}: use {listed} or an Analyzer "
                           f"('ragdb plugins' lists the installed plugins)")

    # -- analysis --------------------------------------------------------
    # Speed matters here: analysis is most of the work of adding a document.
    # Text is split into raw word tokens first (ASCII text with one C-level
    # bytes.translate + split instead of a Unicode regex), and each distinct
    # token is expanded once through a memo of token -> index terms
    # (stopwords dropped, Snowball stem applied, words over MAX_TOKEN_CHARS
    # cut; in version 2 also compounds and symbols, see _plan2).
    # Version 1: the memo maps a token to its one term ("" for none; the rare
    # token with several is in _multi). The result is the same as applying
    # ``_WORD_RE`` to the whole text: that regex never matches across a
    # non-alphanumeric character, and it is what expands a token on a miss.
    # Version 2: raw tokens keep the joining characters (``_RAW2``), and the
    # memo maps a token to the tuple of its terms, chained in C.
    def _tokens(self, text: str) -> tuple[list[Any], list[str]]:
        """Raw word tokens (bytes for ASCII text, else str) and CJK terms, both in text order."""
        if not text.isascii():
            text = unicodedata.normalize("NFKC", text).casefold()
        if self._v1:
            if text.isascii():
                return text.lower().encode("ascii").translate(_ASCII_SPLIT).split(), []
            if _below_cjk(text) or _CJK_CHAR.search(text) is None:
                return _WORD_RE.findall(text), []
            term_re: Any = _TERM_RE  # a LazyPattern here, a compiled pattern below
            word_re = _WORD_RE
        else:
            if text.isascii():
                return text.lower().encode("ascii").translate(_ASCII_SPLIT2).split(), []
            if _below_cjk(text) or _CJK_CHAR.search(text) is None:
                return _raw_tokens2(text), []
            term_re, word_re = _TERM2_RE, None
        words: list[Any] = []
        cjk: list[str] = []
        for run in term_re.findall(text):
            if _CJK_CHAR.match(run):
                cjk.extend(self._cjk_terms(run))
            elif word_re is not None:
                words.extend(word_re.findall(run))
            else:
                words.append(run)
        return words, cjk

    def _word_terms(self, words: list[Any]) -> list[str]:
        """Version 1: the index term of each raw token, in order ("" where a token yields none)."""
        memo = self._memo
        try:
            terms = list(map(memo.__getitem__, words))
        except KeyError:
            self._learn(words)
            terms = list(map(memo.__getitem__, words))
        multi = self._multi
        if multi and not multi.keys().isdisjoint(words):  # rare: words over MAX_TOKEN_CHARS
            terms = [t for tok, term in zip(words, terms) for t in multi.get(tok, (term,))]
        return terms

    def _learn(self, words: list[Any]) -> None:
        """Version 1: memoize the terms of the tokens of ``words`` not seen before (stemmed in one batch)."""
        memo = self._memo
        missing = set(words).difference(memo)
        if len(memo) + len(missing) > MEMO_SIZE:
            memo.clear()
            self._multi.clear()
            missing = set(words)
        stop = self._stop
        pending: list[Any] = []
        plain: list[str] = []
        for tok in missing:
            if isinstance(tok, bytes):  # an ASCII alphanumeric run: cut or dropped like _WORD_RE does
                word = tok.decode("ascii")
                if len(word) > MAX_TOKEN_CHARS:
                    found = [w for w in _WORD_RE.findall(word) if w not in stop]
                    if self._stemmer is not None:
                        found = self._stemmer.stemWords(found)
                    memo[tok] = found[0] if len(found) == 1 else ""
                    if len(found) > 1:
                        self._multi[tok] = tuple(found)
                    continue
                if len(word) == 1 and not ("0" <= word <= "9"):
                    memo[tok] = ""
                    continue
            else:  # already a _WORD_RE match
                word = tok
            if word in stop:
                memo[tok] = ""
            else:
                pending.append(tok)
                plain.append(word)
        if plain and self._stemmer is not None:
            plain = self._stemmer.stemWords(plain)
        memo.update(zip(pending, plain))


    def _learn2(self, words: list[Any]) -> None:
        """Version 2: memoize the terms of the raw tokens of ``words`` not seen before. A token
        that is one plain word once joining characters at its ends are stripped (most are:
        ``word``, ``word.``, ``word:``) skips the unit parser; words are stemmed in one batch.
        A compound's whole form that overlaps its first part adds an :data:`_OVERLAP` to the
        token's terms, which term_counts takes out again as ``TermCounts.overlaps``."""
        memo = self._memo
        missing = set(words).difference(memo)
        if not missing:
            return
        if len(memo) + len(missing) > MEMO_SIZE:
            memo.clear()
            missing = set(words)
        self._expand2(missing, memo)

    def _expand2(self, tokens: Iterable[Any], memo: dict[Any, Any]) -> dict[Any, Any]:
        """Version 2: the terms of each raw token of ``tokens`` (distinct), into ``memo`` (also
        read: a word ending a sentence takes the terms of the word when known); returns it.
        A token's terms depend on its characters only (bytes or str alike), which the compiled
        analysis (:mod:`ragdb.text.canalysis`) relies on when it remembers them itself; it learns
        the tokens that are one word once their ends are stripped, and those of words joined by
        hyphens and dots (:func:`_joined_plan`), by this method's rules for them
        (``Analysis._learn``), and sends it the others."""
        stop = self._stop
        pending: list[Any] = []  # tokens that are one word to stem, and the word
        plain: list[str] = []
        compounds: list[tuple[Any, list[tuple[int, str]]]] = []  # tokens of several items, and the items
        for tok in tokens:
            raw = tok.decode("ascii") if type(tok) is bytes else tok
            if raw.isalnum():
                word = raw
            elif raw[-1] in ".:" and raw[:-1].isalnum():  # the most common other token: a word ending a sentence
                known = memo.get(tok[:-1])
                if known is not None:
                    memo[tok] = known
                    continue
                word = raw[:-1]
            else:
                core = _core(raw)
                if core is None or not core.isalnum():
                    items = _compound_items(core) if core is not None else None
                    compounds.append((tok, items if items is not None else [(i[0], i[1]) for i in _plan2(raw)[0]]))
                    continue
                word = core
            if len(word) > MAX_TOKEN_CHARS:
                compounds.append((tok, [(i[0], i[1]) for i in _plan2(raw)[0]]))
            elif word in stop:
                memo[tok] = ()
            else:
                pending.append(tok)
                plain.append(word)
        parts: list[str] = []
        if compounds:
            stems = {v: "" for _tok, items in compounds for kind, v in items if kind in _WORDS}
            parts = [w for w in stems if w not in stop]
        # one stemming batch for all: plain words (the most: stemmed like version 1 does) and parts
        stemmed = self._stemmer.stemWords(plain + parts) if self._stemmer is not None else plain + parts
        memo.update(zip(pending, zip(stemmed)))  # (zip makes the 1-tuples)
        if not compounds:
            return memo
        stems.update(zip(parts, stemmed[len(plain):]))
        for tok, items in compounds:
            terms: list[str] = []
            whole = False  # the item before was a whole form with a term: this one is its first part
            for kind, v in items:
                t = stems[v] if kind in _WORDS else v if kind in _TERMS else ""
                if t:
                    terms.append(t)
                    if whole:
                        terms.append(_OVERLAP)
                whole = kind >= _WHOLE_WORD and bool(t)
            memo[tok] = tuple(terms)
        return memo

    def _expand_list(self, tokens: list[str]) -> list[tuple[str, ...]]:
        """The terms of each of ``tokens`` (distinct), in order: for the compiled analysis."""
        found = self._expand2(tokens, {})
        return list(map(found.__getitem__, tokens))

    def _learn_words(self, words: Iterable[str]) -> None:
        """Version 2, for tokens(): the term of each word not known yet (stopwords dropped, the
        rest stemmed), as _learn2 gives it."""
        table = self._words
        words = set(words)
        missing = words.difference(table)
        if not missing:
            return
        if len(table) + len(missing) > MEMO_SIZE:
            table.clear()
            missing = words  # (every word the caller asks about, the known ones too, is looked up next)
        stop = self._stop
        plain = [w for w in missing if w not in stop]
        table.update((w, "") for w in missing if w in stop)
        table.update(zip(plain, self._stemmer.stemWords(plain) if self._stemmer is not None else plain))

    def terms(self, text: str) -> list[str]:
        """Index terms of ``text``: word terms first, then CJK terms (with repeats).

        The order is deterministic (queries sum term scores in this order)."""
        words, cjk = self._tokens(text)
        if self._v1:
            out = [t for t in self._word_terms(words) if t] if words else []
        else:
            out = []
            if words:
                if not self._memo.keys() >= set(words):
                    self._learn2(words)
                try:
                    out = list(chain.from_iterable(map(self._memo.__getitem__, words)))
                except KeyError:  # another thread's learning emptied the memo since: these words apart
                    found = self._expand2(set(words), {})
                    out = list(chain.from_iterable(map(found.__getitem__, words)))
                if _OVERLAP in out:
                    out = [t for t in out if t != _OVERLAP]
        if cjk:
            out.extend(cjk)
        return out

    def term_counts(self, text: str) -> dict[str, int]:
        """Term frequencies of ``text`` (the terms of :meth:`terms`, counted, in order of
        first appearance). Version 2 returns a :class:`TermCounts`, a dict that also
        counts the compound whole forms that overlap a part (``overlaps``), which the
        chunk's length for BM25 leaves out."""
        fast = self.compiled()
        if fast is not None:
            found = fast.counts([text])
            if found is not None:
                return found[0]
        return self._counts(*self._tokens(text))

    def term_counts_many(self, texts: Iterable[str]) -> list[dict[str, int]]:
        """:meth:`term_counts` of each text. (Learning a part's new words in one batch was
        measured: it cost more than it saved, the set of every word of the part included;
        the compiled analysis does learn a call's new words in one batch.)"""
        fast = self.compiled()
        if fast is not None:
            texts = list(texts)
            found = fast.counts(texts)
            if found is not None:
                return found
        return [self.term_counts(t) for t in texts]

    def compiled(self) -> Any:
        """The compiled hot loop this analyzer counts terms with (a
        :class:`ragdb.text.canalysis.Analysis`), or None where its Python code runs: a version 1
        or jieba analyzer, a plugin's (a subclass may analyze its own way), no compiled module,
        or the numpy kernel chosen (``RAGDB_KERNEL=numpy``, :func:`ragdb.index.kernel.use`: the
        switch of every compiled part). Both give the same terms, counts and order
        (tests/text/test_canalysis.py)."""
        if not _compiled_on or _canalysis is None or type(self) is not Analyzer or self._v1 \
                or self._jieba is not None:
            return None
        fast = self._fast
        if fast is None:
            # (one-word and compound tokens are learned there with these, by _expand2's rules)
            fast = self._fast = _canalysis.Analysis(
                self._expand_list, self._cjk_stop, TermCounts, _OVERLAP, self._stop,
                self._stemmer.stemWords if self._stemmer is not None else None, MAX_TOKEN_CHARS, DOTTED_STOPWORDS)
        return fast

    def _counts(self, words: list[Any], cjk: list[str]) -> dict[str, int]:
        """term_counts from a text's raw word tokens and CJK terms (see _tokens)."""
        if self._v1:
            counts = Counter(self._word_terms(words)) if words else Counter()
            counts.pop("", None)
            if cjk:
                counts.update(cjk)  # CJK terms never equal word terms: they follow them
            return dict(counts)
        out = TermCounts()
        if words:
            memo = self._memo
            if self._learning:
                # The text before had new tokens, so this one likely has too (a corpus of many
                # rare words, where most texts do): learn first, then count once, rather than
                # count until the first unknown token, learn, and count again.
                known = len(memo)
                self._learn2(words)
                self._learning = len(memo) != known
                _count_elements(out, chain.from_iterable(map(memo.__getitem__, words)))
            else:
                try:  # (Counter's own C loop, without the Python-level update around it)
                    _count_elements(out, chain.from_iterable(map(memo.__getitem__, words)))
                except KeyError:
                    self._learn2(words)
                    self._learning = True
                    out = TermCounts()
                    _count_elements(out, chain.from_iterable(map(memo.__getitem__, words)))
            if _OVERLAP in out:
                out.overlaps = out.pop(_OVERLAP)
        if cjk:
            _count_elements(out, cjk)
        return out

    def _cjk_terms(self, run: str) -> list[str]:
        if self._jieba is not None:
            terms = [w for w in self._jieba.cut_for_search(run) if w.strip()]
        elif len(run) == 1:
            terms = [run]
        else:
            terms = list(run)
            terms.extend(run[i:i + 2] for i in range(len(run) - 1))
        stop = self._cjk_stop
        if stop:
            terms = [t for t in terms if t not in stop]
        return terms

    # -- where terms come from -------------------------------------------------
    def tokens(self, text: str) -> list[Token]:
        """The index terms of ``text`` where they occur, in text order: each a
        :class:`Token` (term, start, end, position). Their terms are those of
        :meth:`term_counts` (the same multiset); ``start``/``end`` are offsets into
        ``text`` itself, mapped back through normalization (a full-width ``Ａ`` or a
        ligature ``ﬁ`` is the span of the original characters). Positions: see the
        module docstring."""
        if type(self).term_counts is not Analyzer.term_counts and type(self).tokens is Analyzer.tokens:
            raise InvalidInput(f"analyzer {self.config().get('name')!r} analyzes text its own way and does not "
                               f"provide tokens() (its plugin would have to)")
        table = self._compiled_table(text)
        if table is not None:
            terms, offsets = table
            return list(map(_new_token, zip(terms, offsets[0::3], offsets[1::3], offsets[2::3])))
        return self._reference_tokens(text)

    def token_table(self, text: str) -> tuple[list[str], array]:
        """:meth:`tokens` as two columns: the terms, and an ``array("i")`` of each token's
        start, end and position in turn (``3 * i`` onwards for the i-th token). What highlights
        keep of a text (:class:`ragdb.text.snippets.TextTokens`); made without a
        :class:`Token` a token where the compiled analysis runs."""
        table = self._compiled_table(text)  # (None for a subclass: compiled() runs only for Analyzer)
        if table is not None:
            return table
        tokens = self.tokens(text)  # (a plugin's own, or its refusal)
        return [t[0] for t in tokens], array("i", chain.from_iterable(t[1:] for t in tokens))

    def _compiled_table(self, text: str) -> tuple[list[str], array] | None:
        """:meth:`token_table` from the compiled analysis (:func:`ragdb.text.canalysis.token_table`:
        the same tokens as :meth:`_reference_tokens`, tests/text/test_canalysis.py), or None
        where it does not run."""
        if self.compiled() is None or _INT_BYTES != 4:
            return None
        norm, starts, ends = _normalize_map(text)
        found = _canalysis.token_table(norm, self._tok_memo, starts, ends, self._cjk_stop, self._learn_runs)
        if found is None:  # (a text of 2**31 characters or more)
            return None
        offsets = array("i")
        offsets.frombytes(found[1])
        return found[0], offsets

    def _reference_tokens(self, text: str) -> list[Token]:
        """:meth:`tokens` in Python: the reference, and what runs where the compiled analysis
        does not (version 1, jieba, ``RAGDB_KERNEL=numpy``, no compiled module)."""
        norm, starts, ends = _normalize_map(text)
        out: list[Token] = []
        pos = 0
        memo = self._tok_memo
        cjk = not _below_cjk(norm)
        term_re: Any = _TERM_RE if self._v1 else _TERM2_RE if cjk else _RAW2  # (the same runs without CJK)
        runs = [(m.group(), m.start()) for m in term_re.finditer(norm)]
        cjk_match = _CJK_CHAR.match if cjk else None
        if not self._v1:
            # the words of the runs not met before, stemmed in one call rather than one a run
            # (a first highlight's cost: a command-line search tokenizes ten texts cold)
            new = {run for run, _ in runs}.difference(memo)
            if new:
                self._learn_words({run for run in new if run.isalnum() and not (cjk_match and cjk_match(run))})
        for run, base in runs:
            if cjk_match is not None and cjk_match(run):
                found = [(t, s, e, p) for t, s, e, p in self._cjk_spans(run)]
                width = len(run)
            else:
                cached = memo.get(run)
                if cached is None:
                    cached = self._run_entry(run)
                found, width = cached
            for term, s, e, p in found:
                a, b = base + s, base + e
                out.append(Token(term, a if starts is None else starts[a], b if ends is None else ends[b - 1],
                                 pos + p))
            pos += width
        return out

    def _run_entry(self, run: str) -> tuple[list[tuple[str, int, int, int]], int]:
        """A word run's tokens (term, start, end, position within it) and its width in
        positions, remembered in the memo of :meth:`tokens`."""
        if self._v1:
            plan, width = _plan1(run)
        elif run.isalnum():  # one word (what _plan2 makes of it, without its expressions)
            plan = []
            width = _word_items(run, 0, 0, plan)
        else:
            plan, width = _plan2(run)
        return self._remember_run(run, ([(t, s, e, p) for t, s, e, p, _why in self._resolve(plan) if t], width))

    def _remember_run(self, run: str, entry: tuple[list[tuple[str, int, int, int]], int]
                      ) -> tuple[list[tuple[str, int, int, int]], int]:
        """Keep a run's entry in the memo of :meth:`tokens` (emptied when full); returns it."""
        memo = self._tok_memo
        if len(memo) >= MEMO_SIZE:
            memo.clear()
        memo[run] = entry
        return entry

    def _learn_runs(self, runs: list[str]) -> list[tuple[list[tuple[str, int, int, int]], int]]:
        """:meth:`_run_entry` of each of ``runs`` (word runs not met before, distinct), their
        words stemmed in one call: what the compiled :meth:`token_table` asks of Python."""
        if self._v1:
            return [self._run_entry(run) for run in runs]
        # A word, or a word ending a sentence (``word.``, ``word:``: the joiner after it is no
        # unit): its one word. Other runs are planned first; every word of both is learned in one call.
        words: dict[str, str] = {}
        plans: dict[str, tuple[Plan, int]] = {}
        learn: set[str] = set()
        for run in runs:
            if run.isalnum() or (run[-1] in ".:" and run[:-1].isalnum()):
                learn.add(word := run if run.isalnum() else run[:-1])
                words[run] = word
            else:
                plan = plans[run] = _plan2(run)
                learn.update(v for kind, v, *_ in plan[0] if kind in _WORDS)
        self._learn_words(learn)
        table = self._words
        out = []
        for run in runs:
            planned = plans.get(run)
            if planned is not None:
                out.append(self._remember_run(run, ([(t, s, e, p) for t, s, e, p, _why
                                                     in self._resolve(planned[0], learn=False) if t], planned[1])))
                continue
            # a word of at most MAX_TOKEN_CHARS: its one item, as _run_entry resolves it (_word_items,
            # _plan2 and _resolve, without them). The tests compare the two.
            word = words[run]
            term = table.get(word) if len(word) <= MAX_TOKEN_CHARS else None
            if term is None:
                out.append(self._run_entry(run))
                continue
            out.append(self._remember_run(run, ([(term, 0, len(word), 0)] if term else [], 1)))
        return out

    def positions(self, text: str) -> dict[str, list[int]]:
        """term -> its positions in ``text``, in order: the terms and positions of
        :meth:`tokens` without their character offsets, several times faster (each
        distinct word's terms are worked out once and remembered). Phrase queries check
        candidates with it."""
        if type(self).term_counts is not Analyzer.term_counts and type(self).tokens is Analyzer.tokens:
            raise InvalidInput(f"analyzer {self.config().get('name')!r} analyzes text its own way and does not "
                               f"provide positions() (its plugin would have to)")
        return self._positions(text, None)

    def positions_of(self, text: str, wanted: Set[str]) -> dict[str, list[int]]:
        """:meth:`positions` of the ``wanted`` terms only (a phrase's): the text's distinct
        words are looked at once each, and a text holding none of them is done with then."""
        return self._positions(text, wanted)

    def _pos_info(self, run: str | bytes) -> tuple[tuple[str, ...], tuple[int, ...], int]:
        """A run's terms, their positions relative to the run's start, and its width in
        positions: remembered. ``run``: text, or ASCII bytes.

        Compactly, as the memo holds up to ``POS_MEMO_PAIRS`` of them: two tuples rather than a
        tuple a pair, one string object per distinct term (a CJK run's terms are slices of it,
        new strings each time), and a term held by one run maps to that run rather than to a
        set. Measured on the realistic 100k benchmark's queries (74,000 pairs held): 21.0 MiB as a
        tuple a pair, 11.6 MiB so (~300 and ~165 bytes a pair); a reader's peak RSS over those
        queries went from 111 to 101 MiB."""
        memo = self._pos_memo
        found = memo.get(run)
        if found is None:
            text = run.decode("ascii") if isinstance(run, bytes) else run
            if _CJK_CHAR.match(text):
                items = [(t, p) for t, _s, _e, p in self._cjk_spans(text)]
                width = len(text)
                if len(items) > POS_MEMO_RUN_PAIRS:  # a clause: not remembered
                    return tuple([t for t, _p in items]), tuple([p for _t, p in items]), width
            else:
                plan, width = (_plan1 if self._v1 else _plan2)(text)
                items = [(t, p) for t, _s, _e, p, _why in self._resolve(plan) if t]
            if len(memo) >= MEMO_SIZE or self._pos_pairs + len(items) > POS_MEMO_PAIRS:
                memo.clear()
                self._runs_of.clear()
                self._pos_terms.clear()
                self._width.clear()
                self._nonsimple.clear()
                self._pos_pairs = 0
            one = self._pos_terms.setdefault
            terms = tuple([one(t, t) for t, _p in items])
            positions = tuple([p for _t, p in items])
            found = memo[run] = (terms, positions, width)
            self._pos_pairs += len(terms)
            self._width[run] = width
            if width != 1 or any(positions):
                self._nonsimple.add(run)
            runs_of = self._runs_of
            for t in terms:
                held = runs_of.get(t)
                if held is None:
                    runs_of[t] = run
                elif type(held) is set:
                    held.add(run)
                elif held != run:
                    runs_of[t] = {held, run}
        return found

    def _runs(self, text: str) -> list[Any]:
        """The runs of ``text`` that :meth:`tokens` reads, in order (ASCII text as bytes, split
        in C by ``bytes.translate``: the same runs as the regular expression)."""
        if text.isascii() and not self._v1:
            return text.lower().encode("ascii").translate(_ASCII_SPLIT2).split()
        norm = text.lower() if text.isascii() else unicodedata.normalize("NFKC", text).casefold()
        return (_TERM_RE if self._v1 else _TERM2_RE if not _below_cjk(norm) else _RAW2).findall(norm)

    def _positions(self, text: str, wanted: Set[str] | None) -> dict[str, list[int]]:
        runs = self._runs(text)
        info = self._pos_info
        out: dict[str, list[int]] = {}
        if wanted is not None:
            # Set operations in C on what the memo knows: the runs that hold a wanted term
            # (term -> its runs), whether any run takes other than one position.
            distinct = set(runs)
            memo = self._pos_memo
            for run in distinct.difference(memo):
                info(run)
                if run not in memo:
                    break  # a run the memo does not keep (see POS_MEMO_RUN_PAIRS)
            if not memo.keys() >= distinct:
                # a run not remembered, or the memo filled up and was emptied on the way: read
                # the runs one by one
                return {t: p for t, p in self._positions(text, None).items() if t in wanted}
            runs_of = self._runs_of
            holding: set[Any] = set()
            for t in wanted:
                held = runs_of.get(t)
                if held is None:
                    continue
                if type(held) is set:
                    holding |= distinct & held
                elif held in distinct:
                    holding.add(held)
            if not holding:
                return out
            hits = [i for i, run in enumerate(runs) if run in holding]
            if distinct.isdisjoint(self._nonsimple):  # a run is a position
                starts: Sequence[int] = hits
            else:
                acc = list(accumulate(map(self._width.__getitem__, runs), initial=0))
                starts = [acc[i] for i in hits]
            memo = self._pos_memo
            for i, start in zip(hits, starts):
                terms, positions, _width = memo[runs[i]]
                for term, p in zip(terms, positions):
                    if term in wanted:
                        out.setdefault(term, []).append(start + p)
            return out
        pos = 0
        for run in runs:
            terms, positions, width = info(run)
            for term, p in zip(terms, positions):
                entry = out.get(term)
                if entry is None:
                    out[term] = [pos + p]
                else:
                    entry.append(pos + p)
            pos += width
        return out

    def _resolve(self, plan: list[tuple[int, str, int, int, int]], learn: bool = True
                 ) -> list[tuple[str, int, int, int, str]]:
        """(term or "", start, end, position, why it is dropped) of the items of a plan
        (``learn``: False when the caller learned its words already)."""
        out = []
        if self._v1:
            for kind, value, s, e, p in plan:
                if kind == _WORD:
                    term = self._word_terms([value])[0]
                    out.append((term, s, e, p, "" if term else "English stopword"))
                else:
                    out.append(("", s, e, p, "one letter: too short"))
            return out
        if learn:
            self._learn_words(v for kind, v, *_ in plan if kind in _WORDS)
        table = self._words
        for kind, value, s, e, p in plan:
            if kind in _WORDS:
                known = table.get(value)
                if known is None:  # (another thread's learning emptied the table since)
                    known = "" if value in self._stop else \
                        self._stemmer.stemWords([value])[0] if self._stemmer is not None else value
                term = known
                why = "" if term else "English stopword" if value in self._stop else "one letter"
                out.append((term, s, e, p, why))
            elif kind in _TERMS:
                out.append((value, s, e, p, ""))
            else:
                out.append(("", s, e, p, "apostrophe ending" if value[0] in "'\u2019" else "English stopword"))
        return out

    def _cjk_spans(self, run: str) -> list[tuple[str, int, int, int]]:
        """(term, start, end, position) of the CJK terms of a run, in text order: a
        character is one position, a bigram or word has its first character's."""
        if self._jieba is not None:
            found = sorted(((w, s, e) for w, s, e in self._jieba.tokenize(run, mode="search") if w.strip()),
                           key=lambda t: (t[1], t[2]))
            spans = [(w, s, e, s) for w, s, e in found]
        else:
            spans = []
            for i, ch in enumerate(run):
                spans.append((ch, i, i + 1, i))
                if i + 1 < len(run):
                    spans.append((run[i:i + 2], i, i + 2, i))
        stop = self._cjk_stop
        return [sp for sp in spans if sp[0] not in stop] if stop else spans

    def dropped(self, text: str) -> list[tuple[str, str]]:
        """The words of ``text`` (split at whitespace) that give no index term, each with
        why: ``("the", "English stopword")``, ``("什么", "Chinese stopword")``,
        ``("x", "one letter: too short")`` (version 1), ``("?", "no letters or digits")``.
        A query made only of such words finds nothing; the CLI says so with these."""
        out: list[tuple[str, str]] = []
        for piece in text.split():
            if self.terms(piece):
                continue
            word = _PIECE_EDGES.sub("", piece) or piece
            out.append((word, self._why_dropped(piece)))
        return out

    def _why_dropped(self, piece: str) -> str:
        if self.config().get("name") != "ragdb":
            return "the analyzer gives it no index term"
        norm = unicodedata.normalize("NFKC", piece).casefold()
        reasons: list[str] = []
        for m in (_TERM_RE if self._v1 else _TERM2_RE).finditer(norm):
            run = m.group()
            if _CJK_CHAR.match(run):
                reasons.append("Chinese stopword")
                continue
            plan, _width = (_plan1 if self._v1 else _plan2)(run)
            reasons.extend(why for _t, _s, _e, _p, why in self._resolve(plan) if why)
        if len(reasons) > 1 and "apostrophe ending" in reasons:
            reasons = [r for r in reasons if r != "apostrophe ending"]
        return " and ".join(dict.fromkeys(reasons)) or "no letters or digits"


def _jieba_analyzer() -> Analyzer:
    return Analyzer(cjk="jieba")


def _simple_analyzer() -> Analyzer:
    return Analyzer(stem=None, stopwords=None)


def register_builtins(register: Callable[..., None]) -> None:
    """Register ragdb's own analyzers with the ``register`` callback of the
    ``register_analyzers`` hook (called by the default plugin :mod:`ragdb.text.builtins`).
    ``ragdb``, the name their stored configuration carries, is an alias of ``default``
    (so that no plugin can take it)."""
    register("default", Analyzer, aliases=["ragdb"])
    register("jieba", _jieba_analyzer)
    register("simple", _simple_analyzer)


def _plugin_analyzer(name: str) -> Any:
    from ragdb import plugins

    return plugins.lookup("analyzer", name)


def _checked_plugin_analyzer(found: Any, make: Any) -> Analyzer:
    """Build a plugin's analyzer; it must be an :class:`Analyzer` whose stored
    configuration carries the plugin's name for it (how the database finds it again)."""
    try:
        made = make()
    except RagdbError:
        raise
    except Exception as e:  # a plugin's bug: one clear error naming it
        raise InvalidInput(f"analyzer {found.name!r} (plugin {found.plugin!r}) failed to start: "
                           f"{type(e).__name__}: {e}") from e
    if not isinstance(made, Analyzer):
        raise InvalidInput(f"analyzer {found.name!r} (plugin {found.plugin!r}) is a {type(made).__name__}, "
                           f"not a ragdb.text.analysis.Analyzer subclass")
    config = made.config()
    if not isinstance(config, Mapping) or config.get("name") != found.name:
        raise InvalidInput(f"analyzer {found.name!r} (plugin {found.plugin!r}): its config() must have "
                           f"'name': {found.name!r} (the name the database stores), got {config!r}")
    return made


# Whitespace and the invisible format characters text editors and converters
# leave behind (zero-width space/joiners, direction marks, word joiner, BOM).
_BLANK_RE = LazyPattern(r"[\s\u00ad\u200b-\u200f\u202a-\u202e\u2060-\u2064\ufeff]*")


def is_blank(text: str) -> bool:
    """True when ``text`` has nothing to read: only whitespace and invisible format
    characters. Such a document would be stored but could never be found."""
    return _BLANK_RE.fullmatch(text) is not None


def token_spans(text: str) -> Iterator[tuple[int, int]]:
    """Character spans of the chunking tokens of ``text``: words, and every CJK
    character on its own. Computed on the original text so spans index it."""
    for m in _SPAN_RE.finditer(text):
        yield m.start(), m.end()


# -- analysis in worker processes (bulk loads) ------------------------------
# Analysis is pure Python and holds the GIL, so threads cannot overlap it with
# the SQLite writes of a bulk load; worker processes can. Workers are forked
# (fast to start, no re-import); where fork is unavailable bulk loads analyze
# in-process. Not multiprocessing.Pool: its task and result threads in the
# writing process wait for the GIL while that process is busy, which left a
# worker idle most of the time. Here the writing process sends and receives on
# a pipe itself, and each worker has a reading and a sending thread, so
# neither side ever waits on the other's pipe buffer.


#: Terms a worker numbers (its local vocabulary, :func:`_pack`) before it starts again from none.
WORKER_VOCABULARY = 1_000_000


class Numbering:
    """A worker's local vocabulary (:func:`_pack`): term -> number. The Python path keeps it
    in ``terms``; the compiled analysis (``canalysis.Analysis.pack``) holds the numbers in its
    own table of terms instead (``holder``: that object, else None), which already holds each
    term, so the worker keeps no dict entry and int a term (~30 MiB in the worker of the
    realistic 100k build, whose 354,000 terms it numbers), and puts them back into ``terms``
    when another path is to go on from them (:meth:`terms_now`)."""

    __slots__ = ("terms", "holder")

    def __init__(self) -> None:
        self.terms: dict[str, int] = {}
        self.holder: Any = None

    def terms_now(self) -> dict[str, int]:
        """The numbering as a dict (term -> number), taken back from the compiled analysis
        holding it, if one does: what the Python path reads and extends."""
        if self.holder is not None:
            self.holder.give_back(self)
        return self.terms


def _pack(analyzer: Analyzer, texts: list[str], numbering: Numbering
          ) -> tuple[bool, str, bytes, bytes, bytes, bytes]:
    """Term counts of each text, packed for the trip back. Each term is sent once, numbered
    in the worker's local vocabulary ``numbering`` (kept between parts); a text is
    then its terms' numbers, its counts (uint32s each) and its ``overlaps``. Unpickling a dict
    of a hundred terms per text cost the writing process more than the analysis it saved, and
    splitting each text's joined terms made a new string of every term of every text: numbered,
    the writing process holds one string of each term (hashed once; dict lookups of the same
    string object compare no characters).

    New terms are numbered in the order the counts list them (first appearance), so the numbers
    are the same in every process (a set's order is the hash seed's); the compiled analysis
    (:meth:`Analyzer.compiled`) numbers the same way.

    Returns (whether the vocabulary was started again, the new terms joined by NUL (never part
    of a term), every text's term numbers, every text's counts, the texts' term counts and
    overlaps, as uint32 arrays' bytes)."""
    fast = analyzer.compiled()
    if fast is not None:
        packed = fast.pack(list(texts), numbering, WORKER_VOCABULARY)
        if packed is not None:
            return packed
    local = numbering.terms_now()
    restarted = False
    if len(local) > WORKER_VOCABULARY:
        local.clear()
        restarted = True
    new: list[str] = []
    numbers = array("I")
    counts_all = array("I")
    sizes = array("I")
    overlaps = array("I")
    for counts in analyzer.term_counts_many(texts):
        fresh = list(filterfalse(local.__contains__, counts))
        if fresh:
            first = len(local)
            local.update(zip(fresh, range(first, first + len(fresh))))
            new.extend(fresh)  # (in the order of their numbers)
        numbers.extend(map(local.__getitem__, counts))
        counts_all.extend(counts.values())
        sizes.append(len(counts))
        overlaps.append(getattr(counts, "overlaps", 0))
    return restarted, "\0".join(new), numbers.tobytes(), counts_all.tobytes(), sizes.tobytes(), overlaps.tobytes()


class WorkerNames:
    """number -> term of a worker's vocabulary as the writing process holds it: the strings of
    NUL-joined new terms its results brought, one a result, numbered on from the one before. A
    str object a term (~75 bytes with its list slot) was 26 MiB of the writing process's peak in
    the realistic 100k bulk load; the writer needs a number's term about once (when it first
    maps the number to its term id, and again only when term ids change), so terms are made
    strings again when asked for (:meth:`many`)."""

    __slots__ = ("_blocks", "_firsts", "_size")

    def __init__(self) -> None:
        self._blocks: list[str] = []
        self._firsts: list[int] = []  # the number of each block's first term
        self._size = 0

    def add(self, joined: str) -> None:
        """The new terms of one result, joined by NUL (never part of a term), numbered next."""
        self._blocks.append(joined)
        self._firsts.append(self._size)
        self._size += joined.count("\0") + 1

    def __len__(self) -> int:
        return self._size

    def __getitem__(self, number: int) -> str:
        return self.many([number])[0]

    def many(self, numbers: Iterable[int]) -> list[str]:
        """The terms of ``numbers`` (a list, an array; any order: each block they fall in is
        split once)."""
        tolist = getattr(numbers, "tolist", None)
        nums: list[int] = tolist() if tolist is not None else list(numbers)
        firsts, blocks, size = self._firsts, self._blocks, self._size
        split: dict[int, list[str]] = {}
        out: list[str] = []
        lo = hi = 0
        terms: list[str] = []
        for number in nums:
            if not lo <= number < hi:
                if not 0 <= number < size:
                    raise IndexError(f"a worker's term number out of range: {number} (it has {size})")
                b = bisect.bisect_right(firsts, number) - 1
                lo, hi = firsts[b], firsts[b + 1] if b + 1 < len(firsts) else size
                got = split.get(b)
                terms = split[b] = got if got is not None else blocks[b].split("\0")
            out.append(terms[number - lo])
        return out


class WorkerVocabulary:
    """A worker's term numbers as the writing process knows them (see :func:`_pack`): ``names``,
    number -> term, grown as the worker's results arrive; ``term_ids`` and ``token``: the
    writer's cache of number -> the database's term id (0: not looked up yet), valid while the
    writer's index has that ``token`` (:meth:`ragdb.engine.write.Writer` fills them)."""

    __slots__ = ("names", "term_ids", "token")

    def __init__(self) -> None:
        self.names = WorkerNames()
        self.term_ids: Any = None
        self.token: Any = None


class PackedCounts:
    """Term counts as a worker sends them: the terms (in order of first appearance) and their
    counts. Iterates like the dict :meth:`Analyzer.term_counts` returns (terms, ``values()``,
    ``overlaps``), which is all the writer needs, without building one. From a worker, the
    terms are its numbers (``numbers``, in ``vocabulary``), made strings only when asked for:
    the writer maps the numbers to term ids without them."""

    __slots__ = ("_terms", "counts", "overlaps", "numbers", "vocabulary")

    def __init__(self, terms: tuple[str, ...] | None, counts: array, overlaps: int = 0,
                 numbers: array | None = None, vocabulary: WorkerVocabulary | None = None) -> None:
        self._terms, self.counts, self.overlaps = terms, counts, overlaps
        self.numbers, self.vocabulary = numbers, vocabulary

    @property
    def terms(self) -> tuple[str, ...]:
        if self._terms is None:
            assert self.numbers is not None and self.vocabulary is not None
            self._terms = tuple(self.vocabulary.names.many(self.numbers))
        return self._terms

    def __iter__(self) -> Iterator[str]:
        return iter(self.terms)

    def __len__(self) -> int:
        return len(self.counts)

    def values(self) -> array:
        return self.counts

    def items(self) -> Iterator[tuple[str, int]]:
        return zip(self.terms, self.counts)


def _unpack_counts(packed: tuple[bool, str, bytes, bytes, bytes, bytes], vocabulary: WorkerVocabulary
                   ) -> list[PackedCounts]:
    """The term counts of a part's texts from what :func:`_pack` sent, the worker's
    ``vocabulary`` already extended with its new terms."""
    _restarted, _new, raw_numbers, raw_counts, raw_sizes, raw_overlaps = packed
    numbers, counts, sizes, overlaps = array("I"), array("I"), array("I"), array("I")
    numbers.frombytes(raw_numbers)
    counts.frombytes(raw_counts)
    sizes.frombytes(raw_sizes)
    overlaps.frombytes(raw_overlaps)
    out = []
    a = 0
    for n, overlap in zip(sizes, overlaps):
        b = a + n
        out.append(PackedCounts(None, counts[a:b], overlap, numbers[a:b], vocabulary))
        a = b
    return out


#: How often a worker looks whether the process that started it is still there (seconds).
PARENT_POLL = 0.5


def _end_worker() -> None:
    """End this worker process now, from any of its threads (no cleanup is owed to anyone:
    the process that would read its results is gone)."""
    os.kill(os.getpid(), signal.SIGKILL)


def _watch_parent(parent: int) -> None:
    """End this worker as soon as the process that forked it is gone (issue 32, item 9: the
    workers of a SIGKILLed bulk load lived on forever, holding the database's file open).

    Two watches, both portable to any fork platform: the pipe (the worker closes every copy
    of the pool's parent-side ends it inherited, so the parent's death is an end of file on
    its pipe, see :func:`_worker_main`), and this thread, which polls the parent's pid (a
    reparented worker sees another ``getppid()``). Not ``PR_SET_PDEATHSIG``: Linux sends it
    when the forking *thread* ends, and a pool may outlive the thread that started it."""
    import threading

    def poll() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL)
        _end_worker()

    threading.Thread(target=poll, name="ragdb-parent-watch", daemon=True).start()


def _worker_main(conn: Any, config: dict[str, Any], parent: int = 0, inherited: Sequence[Any] = ()) -> None:
    """A worker: texts in, packed term counts out (or ("error", message)), in order.

    ``parent``: the pid of the writing process (the worker exits when it is gone);
    ``inherited``: the parent-side connections of the pool's pipes, which a forked worker
    holds copies of and closes, so that its pipe ends when the parent dies."""
    import queue
    import threading

    for other in inherited:
        try:
            other.close()
        except OSError:  # pragma: no cover - already closed
            pass
    if parent:
        _watch_parent(parent)
    analyzer = Analyzer.from_config(config)
    # Analysis holds the GIL; let the reading and sending threads in promptly
    # (the default 5 ms switch interval left the writer blocked on a full pipe).
    sys.setswitchinterval(0.0005)
    tasks: queue.SimpleQueue[Any] = queue.SimpleQueue()
    results: queue.SimpleQueue[Any] = queue.SimpleQueue()

    def receive() -> None:
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):  # the writing process is gone: nobody wants the results
                _end_worker()
            tasks.put(msg)
            if msg is None:
                return

    def send() -> None:
        while (msg := results.get()) is not None:
            try:
                conn.send(msg)
            except (BrokenPipeError, OSError):
                return

    threading.Thread(target=receive, daemon=True).start()
    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    local = Numbering()  # this worker's term numbers (see _pack)
    while (texts := tasks.get()) is not None:
        try:
            results.put(("ok", _pack(analyzer, texts, local)))
        except Exception as e:  # reported to the writing process, which raises it
            results.put(("error", f"{type(e).__name__}: {e}"))
    results.put(None)
    sender.join()


#: What a worker started as a fresh interpreter runs (:class:`_FreshWorker`): the writing
#: process's ``sys.path``, then :func:`_fresh_worker_main` on its end of the pipe.
#: A worker that cannot import it ends quietly (the pool then forks its workers instead). The
#: working directory that ``-c`` puts first on the path goes before anything is imported (a
#: ``json.py`` there is not run); the writer's path, which may hold it again, replaces it.
_FRESH_WORKER_CODE = ("import sys\n"
                      "if sys.path and sys.path[0] == '':\n"
                      "    del sys.path[0]\n"
                      "try:\n"
                      "    import json\n"
                      "    sys.path[:] = json.loads(sys.argv[1])\n"
                      "    from ragdb.text.analysis import _fresh_worker_main\n"
                      "except BaseException:\n"
                      "    sys.exit(3)\n"
                      "_fresh_worker_main(int(sys.argv[2]), int(sys.argv[3]))\n")


def _fresh_worker_main(fd: int, parent: int) -> None:
    """A worker started as a fresh interpreter: its pipe is the socket ``fd``; the first message
    is (the analyzer's configuration, whether analysis runs compiled, the writer's
    :data:`WORKER_VOCABULARY`), then :func:`_worker_main`. A failure before it says it is ready
    ends it quietly (exit 3: the pool forks instead)."""
    global WORKER_VOCABULARY
    try:
        from multiprocessing.connection import Connection

        conn = Connection(fd)
        config, compiled, WORKER_VOCABULARY = conn.recv()
        use_compiled(compiled)
        Analyzer.from_config(config)  # (what _worker_main makes: a failure here is one to start)
        conn.send(("ready", _CODE_STAMP))
    except BaseException:
        sys.exit(3)  # (SystemExit: no traceback)
    _worker_main(conn, config, parent)


class _FreshWorker:
    """An analysis worker started as a fresh interpreter, with the calls of
    ``multiprocessing.Process`` the pool makes. A forked worker's resident set starts as the
    writing process's at the fork (~48 MiB of it with numpy and the database open, counted again
    in the worker's peak); a fresh one holds ~17 MiB before its first text (the realistic 100k
    bulk load: the worker's peak 100 -> 82 MiB). Not multiprocessing's ``spawn`` or
    ``forkserver``: they import the user's ``__main__`` again, which a library must not do.
    ragdb's own analyzer only: a plugin's may exist only in this process (registered at run
    time), and is forked with it."""

    def __init__(self, fd: int, parent: int) -> None:
        import json
        import subprocess

        path = [os.fsdecode(p) for p in sys.path if isinstance(p, (str, bytes, os.PathLike))]
        self._popen = subprocess.Popen([sys.executable, "-c", _FRESH_WORKER_CODE, json.dumps(path), str(fd),
                                        str(parent)], pass_fds=(fd,), stdin=subprocess.DEVNULL)
        self.pid = self._popen.pid

    def join(self, timeout: float | None = None) -> None:
        import subprocess

        try:
            self._popen.wait(timeout)
        except subprocess.TimeoutExpired:
            pass

    def is_alive(self) -> bool:
        return self._popen.poll() is None

    def terminate(self) -> None:
        self._popen.terminate()

    def kill(self) -> None:
        self._popen.kill()


#: How long the pool waits for a worker started as a fresh interpreter to say it is ready (it
#: takes ~0.1 s here) before it kills it and forks its workers instead.
FRESH_WORKER_START_S = 20.0


def _start_fresh_workers(analyzer: Analyzer, workers: int) -> list[tuple[Any, Any]] | None:
    """``workers`` workers started as fresh interpreters (:class:`_FreshWorker`), each with its
    end of the pipe, all ready; None where that is not for this process (a plugin's analyzer,
    a frozen application, no interpreter to start) or did not work (those started are ended)."""
    import socket
    from multiprocessing.connection import Connection

    if type(analyzer) is not Analyzer or analyzer.cjk == "jieba" or not sys.executable \
            or getattr(sys, "frozen", False) or os.name != "posix":
        # (jieba: words added to its dictionary in this process would not reach the workers)
        return None
    import fcntl

    stamp = _CODE_STAMP
    started: list[tuple[Any, Any]] = []
    try:
        for _ in range(workers):  # (a socket pair, as multiprocessing's duplex Pipe is on POSIX)
            ours, theirs = socket.socketpair()
            conn = Connection(ours.detach())
            fd = theirs.fileno()
            try:
                if fd < 3:  # (not where the child's stdin, stdout or stderr go)
                    fd = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
                started.append((conn, _FreshWorker(fd, os.getpid())))
            except BaseException:
                conn.close()
                raise
            finally:
                if fd != theirs.fileno():
                    os.close(fd)
                theirs.close()
            conn.send((analyzer.config(), _compiled_on, WORKER_VOCABULARY))
        deadline = time.monotonic() + FRESH_WORKER_START_S
        for conn, _proc in started:
            if not conn.poll(max(0.0, deadline - time.monotonic())) or conn.recv() != ("ready", stamp):
                raise OSError("an analysis worker did not start, or runs other code than this process")
        return started
    except BaseException as e:  # (any failure: the workers started so far end here)
        for conn, proc in started:
            conn.close()
            proc.kill()
            proc.join()
        if not isinstance(e, Exception):  # (an interrupt goes on)
            raise
        return None


class AnalysisPool:
    """Worker processes running :meth:`Analyzer.term_counts` with one configuration."""

    def __init__(self, analyzer: Analyzer, workers: int) -> None:
        import multiprocessing

        ctx = multiprocessing.get_context("fork")
        self.workers = workers
        self._conns: list[Any] = []
        self._procs: list[Any] = []
        self._waiting: list[collections.deque[_Job]] = []  # per worker, in send order
        self._vocabulary: list[WorkerVocabulary] = []  # per worker, its term numbers (see _pack)
        self._jobs: collections.deque[_Job] = collections.deque()
        self._next = 0
        try:
            fresh = _start_fresh_workers(analyzer, workers)
            for w in range(workers):
                if fresh is not None:
                    parent, proc = fresh[w]
                else:  # forked
                    parent, child = ctx.Pipe()
                    proc = ctx.Process(target=_worker_main, daemon=True,
                                       args=(child, analyzer.config(), os.getpid(), [*self._conns, parent]))
                    proc.start()
                    child.close()
                self._conns.append(parent)
                self._procs.append(proc)
                self._waiting.append(collections.deque())
                self._vocabulary.append(WorkerVocabulary())
        except BaseException:
            self.close(wait=False)
            raise

    @staticmethod
    def available() -> bool:
        import multiprocessing

        return "fork" in multiprocessing.get_all_start_methods()

    def submit(self, texts: list[str]) -> _Job:
        """Start analyzing ``texts``; ``.get()`` on the result gives their term counts in order."""
        w = self._next
        self._next = (w + 1) % self.workers
        job = _Job(self, w)
        self._conns[w].send(texts)
        self._waiting[w].append(job)
        self._jobs.append(job)
        return job

    def _receive(self, w: int, block: bool) -> None:
        """Hand worker ``w``'s finished results to its oldest waiting jobs."""
        conn, waiting = self._conns[w], self._waiting[w]
        while waiting and (block or conn.poll()):
            try:
                status, value = conn.recv()
            except (EOFError, OSError):  # (a reset connection, when the worker died mid-send)
                raise RagdbError("an analysis worker process ended unexpectedly") from None
            job = waiting.popleft()
            job.done, job.value = True, value
            if status != "ok":
                raise RagdbError(f"text analysis failed in a worker process: {value}")
            # The worker numbered its new terms in the order it analyzed the parts, which is
            # the order they arrive in: its vocabulary grows here, as they arrive.
            restarted, new = value[0], value[1]
            if restarted:
                self._vocabulary[w] = WorkerVocabulary()  # (jobs received before keep the one they were given)
            if new:
                self._vocabulary[w].names.add(new)
            job.vocabulary = self._vocabulary[w]
            if block:
                return

    def backlog(self) -> int:
        """Submitted parts not finished yet."""
        for w in range(self.workers):
            self._receive(w, block=False)
        jobs = self._jobs
        while jobs and jobs[0].done:
            jobs.popleft()
        return len(jobs)

    def close(self, *, wait: bool = True) -> None:
        for conn in self._conns:
            try:
                conn.send(None)
            except OSError:
                pass
        for proc in self._procs:
            proc.join(timeout=5 if wait else 0.2)
            if proc.is_alive():
                proc.terminate()
                proc.join()
        for conn in self._conns:
            conn.close()


class _Job:
    def __init__(self, pool: AnalysisPool, worker: int) -> None:
        self.pool, self.worker = pool, worker
        self.done = False
        self.value: Any = None
        self.vocabulary = WorkerVocabulary()  # its worker's term numbers when the result came

    def get(self) -> list[PackedCounts]:
        while not self.done:
            self.pool._receive(self.worker, block=True)
        return _unpack_counts(self.value, self.vocabulary)
