"""Frozen result types of the public API: what a search returns (:class:`Hit`, its
:class:`Snippet` and :class:`Duplicate` copies, :class:`QueryPlan`).

The types of documents, changes and reports (:class:`~ragdb.records.Document`,
:class:`~ragdb.records.Stats`, :class:`~ragdb.records.AddReport`, ...) live in
:mod:`ragdb.records` and are read here too (``from ragdb.types import Span`` keeps working),
imported on first use: a search makes none of them, and the ten frozen dataclasses cost a
``ragdb search`` ~12 ms to make (Python 3.11 compiles each generated method on its own).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # (read through __getattr__ below)
    from ragdb.records import AddReport as AddReport
    from ragdb.records import Change as Change
    from ragdb.records import Changes as Changes
    from ragdb.records import CollectionInfo as CollectionInfo
    from ragdb.records import Document as Document
    from ragdb.records import Facets as Facets
    from ragdb.records import LoadedDocument as LoadedDocument
    from ragdb.records import ReindexReport as ReindexReport
    from ragdb.records import Span as Span
    from ragdb.records import Stats as Stats
    from ragdb.records import VectorInfo as VectorInfo

#: The names of :mod:`ragdb.records` this module reads for its callers.
RECORDS = frozenset({"AddReport", "Change", "Changes", "CollectionInfo", "Document", "Facets", "LoadedDocument", "ReindexReport", "Span", "Stats", "VectorInfo"})


def __getattr__(name: str) -> Any:
    """A type of :mod:`ragdb.records` (PEP 562), imported on first use."""
    if name in RECORDS:
        import ragdb.records

        return getattr(ragdb.records, name)
    raise AttributeError(f"module 'ragdb.types' has no attribute {name!r}")


@dataclass(frozen=True)
class Snippet:
    """The part of a hit's text to show (``SearchOptions(highlight=True)``): ``text`` is
    ``hit.text[start:end]``, the window with the most distinct query terms, and
    ``highlights`` the spans of matches within ``text`` (offsets into the snippet)."""

    text: str
    start: int
    end: int
    highlights: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class Duplicate:
    """Another copy of a hit's passage that a search collapsed into it (:attr:`Hit.duplicates`):
    the chunk that holds it, its document's source and the score it had."""

    source: str
    chunk_id: int
    doc_id: int
    score: float


@dataclass(frozen=True)
class Hit:
    """One retrieved chunk.

    ``start``/``end`` are the chunk's character span in its document's text.
    ``metadata`` is the document's user metadata merged with the chunk's own
    (for example ``section`` from Markdown headings or ``page`` from PDFs).
    ``explain`` maps each query term to its contribution to ``score`` when the
    search was made with ``explain=True``; otherwise it is empty.
    ``confidence`` (in [0, 1]) is how much of the query the chunk supports,
    the same measure for every query, corpus and scorer: its BM25 score over
    the highest one any chunk could reach for the query (:mod:`ragdb.index.confidence`).
    Prompts refuse when no hit reaches the floor (``min_confidence``). None on
    a hit not made by a search.
    ``highlights`` (character spans within ``text`` of the query's terms and phrases)
    and ``snippet`` (a :class:`Snippet`) are filled by a search with ``highlight=True``;
    otherwise they are ``()`` and None. ``title`` is the document's title (else the file
    name of a path-like source) and ``section`` the chunk's heading path (``A > B``), the
    fields :mod:`ragdb.text.fields` indexes.
    ``duplicates`` names the other chunks among those the search ranked that hold the same passage (the
    same text after markup and whitespace, or nearly: :func:`ragdb.index.hits.same_passage`),
    best first: a search keeps the best copy of a passage and names the others here, unless
    ``collapse=False`` asks for every copy (then it is ``()``).
    """

    score: float
    chunk_id: int
    doc_id: int
    source: str
    version: str | None
    timestamp: str | None
    text: str
    start: int
    end: int
    ordinal: int
    metadata: Mapping[str, Any] = field(default_factory=dict)
    explain: Mapping[str, float] = field(default_factory=dict)
    confidence: float | None = None
    highlights: tuple[tuple[int, int], ...] = ()
    snippet: Snippet | None = None
    title: str | None = None
    section: str | None = None
    duplicates: tuple[Duplicate, ...] = ()


@dataclass(frozen=True)
class QueryPlan:
    """How a query is searched (:meth:`ragdb.Database.query_plan`, ``ragdb search --explain``).

    ``syntax``: the query language or plain words; ``error``: why the query language was
    not applied (the query was then searched as plain words), else None; ``terms``: the
    query's terms: those scored in the order their scores are summed (the text's index terms
    and ``word*``/``word~`` for expanded words, then a field's, such as ``title:word``), then
    those in ``unknown``, which score nothing; with their ``weights`` (boosts, times a field's weight); ``expansions``: the index terms each prefix or fuzzy word
    stands for; ``phrases`` and ``excluded``: as typed; ``dropped``: words the analyzer
    drops, with why (a stopword...); ``unknown``: query terms no chunk the caller may see
    holds; ``suggestions``: for each unknown term, the closest terms (one edit away) that
    visible chunks hold, the most frequent first ("did you mean"): words as a document
    holds them (``environment``), not index terms (``environ``); ``filters``: the
    ``field:value`` clauses of the query that filter rather than score (a metadata key or
    ``source``), as typed; ``notes``: what else a user should know about how the query was
    searched (e.g. that its script has no counterpart in the knowledge base, and the remedy).
    ``excluded`` names a field's exclusion as ``field:value``."""

    query: str
    syntax: str
    error: str | None
    terms: tuple[str, ...]
    weights: Mapping[str, float]
    expansions: Mapping[str, tuple[str, ...]]
    phrases: tuple[str, ...]
    excluded: tuple[str, ...]
    dropped: tuple[tuple[str, str], ...]
    unknown: tuple[str, ...]
    suggestions: Mapping[str, tuple[str, ...]]
    filters: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
