"""Highlights and snippets: where a hit's text matches the query, and the best window of it.

:func:`highlight` gives the character spans, within a chunk's text, of the query's
terms (every token whose index term is one the query scores: a stemmed word finds its
other forms, a prefix or fuzzy word each term it expands to) and of its phrases (one
span from the phrase's first token to its last, wherever the whole phrase occurs),
merged where they touch or overlap, so a CJK run of matching characters is one span.
Positions come from the analyzer (:meth:`ragdb.text.analysis.Analyzer.tokens`), the same
analysis the index used, so a highlight is exactly a match.

:func:`best_window` picks the snippet: the window of at most ``size`` characters
holding the most distinct matched terms (then the most matches, then the earliest),
widened to ``size`` around them and moved to word boundaries where the text has
spaces (never for CJK, which has none). A text without matches starts at its
beginning.

Tokenizing a hit's text was most of a highlighted search's time, and the same chunks
come back search after search: :class:`TokenCache` keeps the tokens of recent texts
(a bounded LRU, keyed by the text, for one analyzer), so a text is
tokenized once and a search only picks the query's terms out of its tokens.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from itertools import compress
from typing import TYPE_CHECKING

from ragdb.types import Snippet

if TYPE_CHECKING:
    from ragdb.text.analysis import Analyzer

Span = tuple[int, int]
#: Characters a snippet has by default (``SearchOptions.snippet_chars``).
SNIPPET_CHARS = 240
_ROOM = 30  # how far a snippet edge moves to reach a word boundary, at most


Match = tuple[int, int, frozenset[str]]


class TextTokens:
    """The tokens of one text, compactly: ``terms[i]`` is the i-th token's index term (the
    analyzer's own string objects, shared between texts) and ``offsets[3 * i: 3 * i + 3]``
    its start, end and position (an ``array`` of machine integers: about 20 bytes a token
    in all, where a tuple of Python ints is over 100)."""

    __slots__ = ("terms", "offsets")

    def __init__(self, analyzer: Analyzer, text: str) -> None:
        self.terms, self.offsets = analyzer.token_table(text)  # (start, end, position) a token

    def find(self, wanted: set[str] | frozenset[str]) -> Iterator[tuple[str, int, int, int]]:
        """(term, start, end, position) of the tokens whose term is in ``wanted``, in text order."""
        offsets, terms = self.offsets, self.terms
        # (the tokens picked in C: a Python step a token was most of a cached text's highlight)
        for i in compress(range(len(terms)), map(wanted.__contains__, terms)):
            j = 3 * i
            yield terms[i], offsets[j], offsets[j + 1], offsets[j + 2]


class TokenCache:
    """The :class:`TextTokens` of recently highlighted texts, for one analyzer (given
    another, it starts afresh): the least recently used go first once the cached texts
    hold more than ``max_chars`` characters (a text and its tokens take about 4 bytes a
    character: the default, 2M characters, about 8 MB, some 2,000 chunks of ragdb's default
    size, the hits of 200 searches).
    Safe to share between threads."""

    def __init__(self, max_chars: int = 1 << 21) -> None:
        self.max_chars = max_chars
        self._lock = threading.Lock()
        self._analyzer: Analyzer | None = None
        self._entries: OrderedDict[str, TextTokens] = OrderedDict()
        self._chars = 0

    def get(self, analyzer: Analyzer, text: str) -> TextTokens:
        with self._lock:
            if analyzer is not self._analyzer:
                self._entries.clear()
                self._chars = 0
                self._analyzer = analyzer
            found = self._entries.get(text)
            if found is not None:
                self._entries.move_to_end(text)
                return found
        tokens = TextTokens(analyzer, text)  # outside the lock: other threads' lookups go on
        if len(text) > self.max_chars // 4:  # a text that would push out most others is not kept
            return tokens
        with self._lock:
            if analyzer is self._analyzer and text not in self._entries:
                self._entries[text] = tokens
                self._chars += len(text)
                while self._chars > self.max_chars:
                    old, _tokens = self._entries.popitem(last=False)
                    self._chars -= len(old)
        return tokens


def highlight(analyzer: Analyzer, text: str, terms: Iterable[str],
              phrases: Sequence[Sequence[tuple[str, int]]] = (), *,
              cache: TokenCache | None = None) -> list[Match]:
    """(start, end, keys) of the matches of ``terms`` and ``phrases`` (each a sequence of
    (term, position relative to its first)) in ``text``, merged, in text order; ``keys``
    are the terms a span holds (and, for a phrase, the phrase itself, so a window with the
    whole phrase counts more than one with its words apart). ``cache``: where the text's
    tokens are kept between calls."""
    tokens = cache.get(analyzer, text) if cache is not None else TextTokens(analyzer, text)
    wanted = set(terms)
    raw: list[Match] = [(start, end, frozenset((term,))) for term, start, end, _p in tokens.find(wanted)]
    if phrases:
        at: dict[tuple[str, int], list[tuple[int, int]]] = {}
        positions: dict[str, list[int]] = {}
        for term, start, end, position in tokens.find({term for seq in phrases for term, _ in seq}):
            at.setdefault((term, position), []).append((start, end))
            positions.setdefault(term, []).append(position)
        for seq in phrases:
            if not seq:
                continue
            first, off0 = seq[0]
            for p in sorted(set(positions.get(first, ()))):
                start_pos = p - off0
                found = [at.get((term, start_pos + off)) for term, off in seq]
                if all(found):
                    spans = [s for group in found if group for s in group]
                    keys = frozenset([term for term, _ in seq] + [" ".join(term for term, _ in seq)])
                    raw.append((min(s for s, _ in spans), max(e for _, e in spans), keys))
    raw.sort(key=lambda m: (m[0], m[1]))
    merged: list[Match] = []
    for start, end, keys in raw:
        if merged and start <= merged[-1][1]:
            s0, e0, k0 = merged[-1]
            merged[-1] = (s0, max(e0, end), k0 | keys)
        else:
            merged.append((start, end, keys))
    return merged


def best_window(text: str, matches: Sequence[Match], size: int) -> Span:
    """(start, end) of the snippet window (see the module docstring)."""
    n = len(text)
    if n <= size:
        return 0, n
    if not matches:
        return 0, _word_end(text, size, 0)
    best = (-1, -1, 0)  # (distinct terms, matches, -start)
    best_span = (matches[0][0], matches[0][1])
    # Each window starts at a match i and holds the matches after it that end within ``size``
    # of its start (at least match i itself), slid along: ``held`` counts the keys of the
    # matches in it, so a window's distinct terms are len(held), without a union of the whole
    # window at each step.
    held: dict[str, int] = {}
    j = -1  # the window's last match
    for i in range(len(matches)):
        if j < i:
            j = i
            for key in matches[i][2]:
                held[key] = held.get(key, 0) + 1
        while j + 1 < len(matches) and matches[j + 1][1] - matches[i][0] <= size:
            j += 1
            for key in matches[j][2]:
                held[key] = held.get(key, 0) + 1
        score = (len(held), j - i + 1, -matches[i][0])
        if score > best:
            best, best_span = score, (matches[i][0], matches[j][1])
        for key in matches[i][2]:  # match i leaves the window
            if held[key] == 1:
                del held[key]
            else:
                held[key] -= 1
    lo, hi = best_span
    if hi - lo > size:  # the matches are longer than the window: it shows their start
        return lo, _word_end(text, min(n, lo + size), lo)
    room = size - (hi - lo)
    start = max(0, lo - room // 2)
    end = min(n, start + size)
    start = max(0, end - size)
    return _word_start(text, start, lo), _word_end(text, end, hi)


def _word_start(text: str, start: int, limit: int) -> int:
    """``start`` moved forward to the start of a word, if a space is near (and before ``limit``)."""
    if start == 0 or text[start - 1].isspace():
        return start
    for i in range(start, min(start + _ROOM, limit)):
        if text[i].isspace():
            return i + 1
    return start


def _word_end(text: str, end: int, limit: int) -> int:
    """``end`` moved back to the end of a word, if a space is near (and after ``limit``)."""
    if end >= len(text) or text[end].isspace():
        return end
    for i in range(end - 1, max(end - _ROOM, limit), -1):
        if text[i].isspace():
            return i
    return end


def snippet(analyzer: Analyzer, text: str, terms: Iterable[str], phrases: Sequence[Sequence[tuple[str, int]]],
            size: int, *, cache: TokenCache | None = None) -> tuple[tuple[Span, ...], Snippet]:
    """(highlights in ``text``, the :class:`~ragdb.types.Snippet`) of one hit (``cache``: see
    :func:`highlight`)."""
    matches = highlight(analyzer, text, terms, phrases, cache=cache)
    start, end = best_window(text, matches, size)
    # each match the window shows, cut to it (a match longer than the window is shown in part)
    inside = tuple((max(s, start) - start, min(e, end) - start) for s, e, _k in matches if s < end and e > start)
    return tuple((s, e) for s, e, _k in matches), Snippet(text[start:end], start, end, inside)


def query_terms(order: Sequence[str], expansions: Mapping[str, Sequence[str]]) -> set[str]:
    """The index terms a query scores: its terms, and what its prefix/fuzzy words expand to."""
    out: set[str] = set()
    for key in order:
        out.update(expansions.get(key, (key,)))
    return out
