"""Frozen result types of the public API."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from collections.abc import Mapping


@dataclass(frozen=True)
class Hit:
    """One retrieved chunk.

    ``start``/``end`` are the chunk's character span in its document's text.
    ``metadata`` is the document's user metadata merged with the chunk's own
    (for example ``section`` from Markdown headings or ``page`` from PDFs).
    ``explain`` maps each query term to its contribution to ``score`` when the
    search was made with ``explain=True``; otherwise it is empty.
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


@dataclass(frozen=True)
class Document:
    """A stored document (one version of one source)."""

    id: int
    source: str
    version: str | None
    timestamp: str | None
    content_hash: str
    metadata: Mapping[str, Any]
    acl: tuple[str, ...]
    chunk_count: int
    latest: bool
    text: str | None = None


@dataclass(frozen=True)
class Stats:
    """Collection statistics (documents and chunks counted are the latest versions)."""

    documents: int
    chunks: int
    vocabulary: int
    postings: int
    avg_chunk_length: float
    stored_documents: int
    stored_chunks: int
    pending_chunks: int
    segments: int
    file_size: int


@dataclass(frozen=True)
class Span:
    """A character span of a loaded document with metadata for chunks starting in it."""

    start: int
    end: int
    metadata: Mapping[str, Any]


@dataclass(frozen=True)
class LoadedDocument:
    """What a loader returns: text plus what it learned about the file."""

    text: str
    source: str
    title: str | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    spans: tuple[Span, ...] = ()
