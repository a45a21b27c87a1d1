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
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from ragdb.types import Snippet

if TYPE_CHECKING:
    from ragdb.text.analysis import Analyzer

Span = tuple[int, int]
#: Characters a snippet has by default (``SearchOptions.snippet_chars``).
SNIPPET_CHARS = 240
_ROOM = 30  # how far a snippet edge moves to reach a word boundary, at most


Match = tuple[int, int, frozenset[str]]


def highlight(analyzer: Analyzer, text: str, terms: Iterable[str],
              phrases: Sequence[Sequence[tuple[str, int]]] = ()) -> list[Match]:
    """(start, end, keys) of the matches of ``terms`` and ``phrases`` (each a sequence of
    (term, position relative to its first)) in ``text``, merged, in text order; ``keys``
    are the terms a span holds (and, for a phrase, the phrase itself, so a window with the
    whole phrase counts more than one with its words apart)."""
    wanted = set(terms)
    tokens = analyzer.tokens(text)
    raw: list[Match] = [(t.start, t.end, frozenset((t.term,))) for t in tokens if t.term in wanted]
    if phrases:
        at: dict[tuple[str, int], list[tuple[int, int]]] = {}
        for t in tokens:
            at.setdefault((t.term, t.position), []).append((t.start, t.end))
        positions: dict[str, list[int]] = {}
        for t in tokens:
            positions.setdefault(t.term, []).append(t.position)
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
    j = 0
    for i in range(len(matches)):
        j = max(j, i)
        while j + 1 < len(matches) and matches[j + 1][1] - matches[i][0] <= size:
            j += 1
        window = matches[i:j + 1]
        score = (len(frozenset().union(*(k for _s, _e, k in window))), len(window), -matches[i][0])
        if score > best:
            best, best_span = score, (matches[i][0], matches[j][1])
    lo, hi = best_span
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
            size: int) -> tuple[tuple[Span, ...], Snippet]:
    """(highlights in ``text``, the :class:`~ragdb.types.Snippet`) of one hit."""
    matches = highlight(analyzer, text, terms, phrases)
    start, end = best_window(text, matches, size)
    inside = tuple((s - start, e - start) for s, e, _k in matches if s >= start and e <= end)
    return tuple((s, e) for s, e, _k in matches), Snippet(text[start:end], start, end, inside)


def query_terms(order: Sequence[str], expansions: Mapping[str, Sequence[str]]) -> set[str]:
    """The index terms a query scores: its terms, and what its prefix/fuzzy words expand to."""
    out: set[str] = set()
    for key in order:
        out.update(expansions.get(key, (key,)))
    return out
