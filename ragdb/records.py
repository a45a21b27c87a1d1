"""Frozen types of the public API for documents, changes and reports: a stored
:class:`Document`, what a loader returns (:class:`LoadedDocument`, its :class:`Span`), what
adding records did (:class:`Change`, :class:`Changes`, :class:`AddReport`), and the reports of
statistics, collections, facets, vectors and reindexing. They are also read through
:mod:`ragdb.types`, whose search results a search needs without these.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, overload

from ragdb.errors import InvalidInput


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
    collection: str = "default"  #: the collection these statistics are of (the file size is the whole file's)


@dataclass(frozen=True)
class CollectionInfo:
    """One collection of a database file (:meth:`ragdb.Database.collections`):
    its name, latest documents and chunks, analyzer (in words), embedding model
    (None before any vector) and creation time (ISO-8601 UTC)."""

    name: str
    documents: int
    chunks: int
    analyzer: str | None
    embedding_model: str | None
    created_at: str


@dataclass(frozen=True)
class Span:
    """A character span of a loaded document with metadata for its chunks: each metadata key
    of a chunk comes from the span that covers the most of the chunk's own text (its text
    less its overlap with the chunk before), the first of them on a tie."""

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
    #: access labels (front matter ``acl:``/``labels:``, or set by the caller); None: none given
    acl: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Change:
    """What adding one record did: ``status`` is ``"added"`` (a new source),
    ``"replaced"`` (a new version of a source; ``previous`` is the id of the
    version it replaced) or ``"unchanged"`` (identical to the stored latest
    version, which ``document`` is; nothing was written)."""

    status: str
    document: Document
    previous: int | None = None


_STATUSES = ("added", "replaced", "unchanged")
_NO_PREVIOUS = -1


class Changes(Sequence[Change]):
    """A compact sequence of :class:`Change` values, the one :class:`AddReport`
    holds: a bulk load reports every record, and one ``Change`` object per record
    (with its ``Document``, hash string and metadata dict) costs ~500 bytes, 470 MiB
    for a million records, most of a streaming load's memory. Here a record costs
    ~80 bytes: ids, counts, statuses and hashes in arrays, the sources' UTF-8 in one
    buffer (a str object a record was ~50 bytes more: 5 MiB of the realistic 100k
    load's peak, 50 MiB of a million records'), and the rare values (a version, metadata, access labels, a hash that is not a
    SHA-256 hex digest) in dicts by index; each ``Change`` is made again on access
    (equal to the one appended, not the same object)."""

    __slots__ = ("_status", "_ids", "_previous", "_counts", "_latest", "_hashes", "_sources", "_source_ends",
                 "_timestamps", "_rare")

    def __init__(self, changes: Iterable[Change] = ()) -> None:
        self._status = bytearray()
        self._ids = array("q")
        self._previous = array("q")
        self._counts = array("q")
        self._latest = bytearray()
        self._hashes = bytearray()  # 32 bytes a record
        self._sources = bytearray()  # every record's source, UTF-8 (surrogatepass: any str comes back)
        self._source_ends = array("q")  # where each record's source ends in it
        self._timestamps: list[str | None] = []  # (one string object for a whole load, as a rule)
        self._rare: dict[int, dict[str, Any]] = {}  # index -> the fields that do not fit the columns
        self.extend(changes)

    def append(self, change: Change) -> None:
        if change.status not in _STATUSES:
            raise InvalidInput(f"Changes: status must be one of {', '.join(_STATUSES)}, got {change.status!r}")
        d = change.document
        i = len(self._status)
        rare: dict[str, Any] = {}
        if d.version is not None:
            rare["version"] = d.version
        if d.metadata:
            rare["metadata"] = d.metadata
        if d.acl:
            rare["acl"] = d.acl
        if d.text is not None:
            rare["text"] = d.text
        try:
            digest = bytes.fromhex(d.content_hash) if len(d.content_hash) == 64 else b""
        except ValueError:
            digest = b""
        if len(digest) != 32 or digest.hex() != d.content_hash:
            rare["content_hash"] = d.content_hash
            digest = bytes(32)
        if isinstance(d.source, str):
            source = d.source.encode("utf-8", "surrogatepass")
        else:  # (not a str: kept as it is)
            source = b""
            rare["source"] = d.source
        if rare:
            self._rare[i] = rare
        self._status.append(_STATUSES.index(change.status))
        self._ids.append(d.id)
        self._previous.append(_NO_PREVIOUS if change.previous is None else change.previous)
        self._counts.append(d.chunk_count)
        self._latest.append(1 if d.latest else 0)
        self._hashes += digest
        self._sources += source
        self._source_ends.append(len(self._sources))
        self._timestamps.append(d.timestamp)

    def extend(self, changes: Iterable[Change]) -> None:
        for c in changes:
            self.append(c)

    def __len__(self) -> int:
        return len(self._status)

    def _make(self, i: int) -> Change:
        rare = self._rare.get(i, {})
        h = rare.get("content_hash")
        source = rare["source"] if "source" in rare else \
            self._sources[self._source_ends[i - 1] if i else 0:self._source_ends[i]].decode("utf-8", "surrogatepass")
        doc = Document(id=self._ids[i], source=source, version=rare.get("version"),
                       timestamp=self._timestamps[i],
                       content_hash=h if h is not None else self._hashes[32 * i:32 * i + 32].hex(),
                       metadata=dict(rare.get("metadata", {})), acl=rare.get("acl", ()),
                       chunk_count=self._counts[i], latest=bool(self._latest[i]), text=rare.get("text"))
        prev = self._previous[i]
        return Change(_STATUSES[self._status[i]], doc, None if prev == _NO_PREVIOUS else prev)

    @overload
    def __getitem__(self, i: int) -> Change: ...

    @overload
    def __getitem__(self, i: slice) -> tuple[Change, ...]: ...

    def __getitem__(self, i: int | slice) -> Change | tuple[Change, ...]:
        if isinstance(i, slice):
            return tuple(self._make(j) for j in range(*i.indices(len(self))))
        n = len(self)
        if not -n <= i < n:
            raise IndexError("Changes index out of range")
        return self._make(i % n)

    def __iter__(self) -> Iterator[Change]:
        return (self._make(i) for i in range(len(self)))

    def ids(self, status: str | None = None) -> tuple[int, ...]:
        """The document ids, or those of one status, without making the changes."""
        if status is None:
            return tuple(self._ids)
        code = _STATUSES.index(status)
        return tuple(d for d, s in zip(self._ids, self._status) if s == code)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Changes):
            return tuple(self) == tuple(other)
        if isinstance(other, tuple):
            return tuple(self) == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable while add_many fills it

    def __repr__(self) -> str:
        return f"Changes({list(self)!r})"


@dataclass(frozen=True)
class AddReport(Sequence[Document]):
    """What ``Database.add_many`` did, record by record.

    A sequence of the resulting :class:`Document` objects in record order
    (as ``add_many`` returned before it reported more), plus ``changes``:
    one :class:`Change` per record; ``added``, ``replaced`` and
    ``unchanged`` are the document ids of each kind.

    ``embedded``: chunks the embedder gave a vector during the call (an
    embedding add: chunks left pending before it included); ``reused``: new
    chunks that took over the stored vector of an equal text (an unchanged
    chunk of the replaced version, or any stored chunk) instead (an embedding
    add: pending chunks included too)."""

    changes: Sequence[Change] = ()  # a Changes (compact) from add_many; any sequence of Change works
    embedded: int = 0
    reused: int = 0

    @property
    def documents(self) -> tuple[Document, ...]:
        return tuple(c.document for c in self.changes)

    def _ids(self, status: str) -> tuple[int, ...]:
        if isinstance(self.changes, Changes):
            return self.changes.ids(status)
        return tuple(c.document.id for c in self.changes if c.status == status)

    @property
    def added(self) -> tuple[int, ...]:
        return self._ids("added")

    @property
    def replaced(self) -> tuple[int, ...]:
        return self._ids("replaced")

    @property
    def unchanged(self) -> tuple[int, ...]:
        return self._ids("unchanged")

    def __len__(self) -> int:
        return len(self.changes)

    @overload
    def __getitem__(self, i: int) -> Document: ...

    @overload
    def __getitem__(self, i: slice) -> list[Document]: ...

    def __getitem__(self, i: int | slice) -> Document | list[Document]:
        if isinstance(i, slice):  # a list, as add_many returned before it returned a report
            return [c.document for c in self.changes[i]]
        return self.changes[i].document

    def __iter__(self) -> Iterator[Document]:
        return (c.document for c in self.changes)


@dataclass(frozen=True)
class Facets(Sequence[tuple[Any, int]]):
    """Counts of one field's values over what matched (:meth:`ragdb.Database.facets`).

    A sequence of ``(value, count)`` pairs, the most frequent first, equal counts
    by value (numbers before strings); ``dict(facets)`` maps each value to its
    count. ``by`` says what is counted: ``"chunks"`` or ``"documents"``.
    ``total``: how many chunks (documents) matched; ``missing``: how many of those
    have no value for ``field``; ``omitted``: distinct values left out by ``limit``.
    A list value counts once for each distinct element, so counts may add up to
    more than ``total - missing``. Values equal under ``$eq`` (``1``, ``1.0``,
    ``True``) are one value, shown as the integer if there is one, else the float."""

    field: str
    by: str
    counts: tuple[tuple[Any, int], ...] = ()
    total: int = 0
    missing: int = 0
    omitted: int = 0

    def __len__(self) -> int:
        return len(self.counts)

    @overload
    def __getitem__(self, i: int) -> tuple[Any, int]: ...

    @overload
    def __getitem__(self, i: slice) -> tuple[tuple[Any, int], ...]: ...

    def __getitem__(self, i: int | slice) -> tuple[Any, int] | tuple[tuple[Any, int], ...]:
        return self.counts[i]

    def __iter__(self) -> Iterator[tuple[Any, int]]:
        return iter(self.counts)


@dataclass(frozen=True)
class VectorInfo:
    """The dense vectors of a database: the recorded model (None before the first
    ``embed``), how many chunks have a vector, and how many wait for one."""

    model: str | None
    dimensions: int | None
    dtype: str | None
    vectors: int
    pending: int


@dataclass(frozen=True)
class ReindexReport:
    """What ``Database.reindex`` did: the analyzer configuration before (``previous``)
    and after (``analyzer``), the stored documents and chunks (kept versions included)
    analyzed again, and the vocabulary's size before and after (``terms_before``,
    ``terms``)."""

    previous: Mapping[str, Any]
    analyzer: Mapping[str, Any]
    documents: int
    chunks: int
    terms_before: int
    terms: int
