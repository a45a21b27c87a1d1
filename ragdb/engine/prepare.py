"""The ingest stage: validating records, chunking and analyzing them, in batches.

:func:`prepare` turns one record (a mapping with the keywords of
``Database.add``, or a :class:`~ragdb.types.LoadedDocument`) into a
:class:`Prepared` document, or raises :class:`~ragdb.errors.InvalidInput`
naming the record and the problem. :func:`prepared_batches` prepares a whole
``add_many``: batches of ``batch_size`` records, each then written by the write
stage as one transaction; a bulk load's text is analyzed by worker processes while
the previous batch is written.
"""

from __future__ import annotations

import numbers
import os
import sys
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from ragdb.text.analysis import AnalysisPool, Analyzer, PackedCounts, is_blank
from ragdb.text import fields as fields_mod
from ragdb.errors import InvalidInput
from ragdb.query.filters import check_finite
from ragdb.options import check_count, check_positive_int, check_text, parse_timestamp
from ragdb.storage import dumps, loads

if TYPE_CHECKING:
    from ragdb.records import LoadedDocument, Span  # (imported where read: a search reads none)
    from ragdb.text.chunking import Chunker

MAX_ANALYSIS_WORKERS = 3
POOL_AFTER = 256     # records of one add_many analyzed here before it starts analysis workers
ANALYSIS_PART = 64   # chunk texts sent to a worker at a time
RECORD_KEYS = frozenset({"text", "source", "version", "timestamp", "metadata", "title", "acl", "spans", "chunker"})

Counts = dict[str, int] | PackedCounts


@dataclass
class Prepared:
    """A validated document, chunked; its chunks' term counts are filled in by :func:`prepared_batches`
    (in parts, here or in worker processes)."""

    source: str
    version: str | None
    timestamp: str
    ts: float
    title: str | None
    text: str
    metadata: dict[str, Any]
    metadata_json: str
    acl: tuple[str, ...]
    content_hash: str
    chunker: str
    chunks: list[tuple[int, int, dict[str, Any], Counts]]  # start, end, metadata, term counts
    #: False when the record gave no ``acl`` (None): replacing a stored version then keeps
    #: that version's labels, so an edit never makes a labelled document public
    acl_given: bool = True
    #: each chunk's field terms, when analyzed before the write (:func:`prepared_batches`)
    field_counts: list[dict[str, int]] | None = None


def check_metadata(metadata: Any, label: str) -> tuple[dict[str, Any], str]:
    """Validated metadata and its JSON text (None: none; ``False``, ``0`` or ``[]`` are
    mistakes, not empty metadata)."""
    if metadata is None:
        return {}, "{}"  # (most records of a bulk load: what the steps below make of {})
    if not isinstance(metadata, Mapping):
        raise InvalidInput(f"{label}: metadata must be a mapping, got {type(metadata).__name__}")
    metadata = dict(metadata)
    try:
        metadata_json = dumps(metadata)
    except (TypeError, orjson.JSONEncodeError) as e:
        _check_integers(metadata, label)  # (names the key of an integer past 64 bits)
        raise InvalidInput(f"{label}: metadata is not JSON-serialisable ({e})") from None
    if "null" in metadata_json:  # NaN and infinity come out as null: look for them only then
        check_finite(metadata, label)
    if metadata_json != "{}":
        # What is stored is the JSON, so everything else is derived from it too: the filter
        # index rows and the Document returned. Values JSON writes in another form (a
        # datetime or date as its ISO string, a UUID as a string, a tuple as a list) are
        # then filtered as the stored document says; from the values as given, the filter
        # index left out every datetime, date and UUID (before schema 9).
        metadata = loads(metadata_json)
    _check_integers(metadata, label)
    return metadata, metadata_json


def _check_integers(metadata: Mapping[str, Any], label: str) -> None:
    """Refuses an integer the filter index cannot hold (outside -2**63 .. 2**63-1) in a value
    or a list's element: scalars and list elements go into the filter index."""
    for key, value in metadata.items():
        for v in value if isinstance(value, (list, tuple)) else (value,):
            if isinstance(v, int) and not isinstance(v, bool) and not -2 ** 63 <= v < 2 ** 63:
                raise InvalidInput(f"{label}: metadata {key!r} holds {v}, outside the 64-bit integer range")


def check_span(span: Span, label: str) -> tuple[int, int, dict[str, Any]]:
    """A span's bounds and metadata, validated as a document's metadata is (``label`` names the
    span): integers (numpy's too), ``start <= end``, neither negative."""
    bounds = []
    for name in ("start", "end"):
        value = getattr(span, name)
        if not isinstance(value, numbers.Integral) or isinstance(value, bool):
            raise InvalidInput(f"{label}: {name} must be an integer, got {value!r}")
        bounds.append(int(value))
    start, end = bounds
    if not 0 <= start <= end:
        raise InvalidInput(f"{label}: start {start} and end {end} must satisfy 0 <= start <= end")
    return start, end, check_metadata(span.metadata, label)[0]


def check_acl(acl_in: Any, label: str) -> tuple[str, ...]:
    """Validated access labels, distinct and sorted."""
    if acl_in is None:
        return ()
    # (no ``acl_in or ()``: an empty string, 0 or False would have passed as "no labels", and a
    # labelled document updated with one became public)
    if not isinstance(acl_in, (list, tuple, set, frozenset)) or not all(isinstance(a, str) and a for a in acl_in):
        raise InvalidInput(f"{label}: acl must be a list of non-empty strings, got {acl_in!r}")
    return tuple(sorted({check_text(a, f"{label}: acl label") for a in acl_in}))


def prepare(record: Mapping[str, Any] | LoadedDocument, chunker: Chunker, n: int,
            now: tuple[str, float]) -> Prepared:
    """Validate and chunk record number ``n`` (its chunks' counts left empty); ``now`` is the
    timestamp of records without one."""
    from ragdb.records import LoadedDocument, Span

    if isinstance(record, LoadedDocument):
        meta = dict(record.metadata)
        record = {"text": record.text, "source": record.source, "title": record.title,
                  "version": meta.pop("version", None), "timestamp": meta.pop("timestamp", None),
                  "metadata": meta, "spans": record.spans, "acl": record.acl}
    if not isinstance(record, Mapping):
        raise InvalidInput(f"record {n}: expected a mapping with 'text', got {type(record).__name__}")
    if not RECORD_KEYS.issuperset(record):
        unknown = set(record) - RECORD_KEYS
        raise InvalidInput(f"record {n}: unknown keys {sorted(unknown, key=repr)}")
    text = record.get("text")
    source = record.get("source")
    label = f"document {source!r}" if source is not None else f"record {n}"
    if not isinstance(text, str):
        raise InvalidInput(f"{label}: text must be a string, got {type(text).__name__}")
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidInput(f"{label}: text is not valid Unicode (lone surrogate at offset {e.start})") from None
    if is_blank(text):
        raise InvalidInput(f"{label}: text is empty (only whitespace or invisible characters)")
    # (hashlib and the chunkers imported here, not with the module: the engine imports this
    # module, and a command-line search, which never ingests, would pay ~15 ms for them)
    import hashlib

    content_hash = hashlib.sha256(data).hexdigest()
    if source is None:
        source = f"sha256:{content_hash[:16]}"
    if not isinstance(source, str) or not source:
        raise InvalidInput(f"record {n}: source must be a non-empty string, got {source!r}")
    check_text(source, f"record {n}: source")
    version = record.get("version")
    if version is not None:
        if isinstance(version, (int, float)) and not isinstance(version, bool):
            version = str(version)
        if not isinstance(version, str):
            raise InvalidInput(f"{label}: version must be a string, got {version!r}")
        check_text(version, f"{label}: version")
    if record.get("timestamp") is None:
        timestamp, ts = now  # one "now" for the whole call
    else:
        timestamp, ts = parse_timestamp(record.get("timestamp"), label)
    metadata, metadata_json = check_metadata(record.get("metadata"), label)
    title = record.get("title")
    if title is not None and not isinstance(title, str):
        raise InvalidInput(f"{label}: title must be a string")
    if title is not None:
        check_text(title, f"{label}: title")
    acl = check_acl(record.get("acl"), label)
    rec_chunker = chunker
    if record.get("chunker"):
        from ragdb.text.chunking import get_chunker

        rec_chunker = get_chunker(record["chunker"])
    spans: Sequence[Span] = record.get("spans") or ()
    if not isinstance(spans, (list, tuple)) or not all(isinstance(sp, Span) for sp in spans):
        raise InvalidInput(f"{label}: spans must be a sequence of ragdb.types.Span")
    checked = [check_span(sp, f"{label}: span {i}") for i, sp in enumerate(spans)]
    chunks: list[tuple[int, int, dict[str, Any], Counts]] = []
    done = 0  # where the chunks so far end
    from ragdb.text.chunking import split_checked

    for start, end in split_checked(rec_chunker, text, label):
        # A chunk's own text (not its overlap with the chunk before, which is that chunk's)
        # takes each metadata key from the span covering the most of it, the first on a tie:
        # by where the chunk started, a chunk of a new section that began in the last lines of
        # the one before, or with the title above the first section, was labelled so
        own = max(start, done) if done < end else start
        done = max(done, end)
        cover = [(min(end, sp_end) - max(own, sp_start), -sp_start, n) for n, (sp_start, sp_end, _m) in enumerate(checked)
                 if sp_start < end and own < sp_end]
        cmeta: dict[str, Any] = {}
        for *_rank, n in sorted(cover):
            cmeta.update(checked[n][2])
        chunks.append((start, end, cmeta, {}))
    return Prepared(source, version, timestamp, ts, title, text, metadata, metadata_json, acl,
                    content_hash, rec_chunker.spec(), chunks, record.get("acl") is not None)


def check_add_arguments(records: Any, batch_size: Any, workers: Any) -> None:
    check_positive_int(batch_size, "batch_size")
    if workers is not None:
        check_count(workers, "workers")
    if isinstance(records, (str, bytes, Mapping)) or not hasattr(records, "__iter__"):
        raise InvalidInput(f"records must be an iterable of mappings or LoadedDocument, "
                           f"got {type(records).__name__}")


def analysis_pool(analyzer: Analyzer, workers: int | None) -> AnalysisPool | None:
    """Worker processes for a bulk load, or None to analyze in this process."""
    if workers is None:
        if not sys.platform.startswith("linux"):  # fork is unsafe on macOS, absent on Windows
            return None
        workers = min((os.cpu_count() or 1) - 1, MAX_ANALYSIS_WORKERS)
    if workers < 1 or not AnalysisPool.available():
        return None
    try:
        return AnalysisPool(analyzer, workers)
    except OSError:  # no processes to be had (limits, memory): analyze here
        return None


def _dispatch(analyzer: Analyzer, pool: AnalysisPool | None, texts: list[str], backlog: int) -> Any:
    """Analyze a part of a batch in the pool, or here when there is none or the workers
    are behind (more than a batch of parts per worker still waiting: they need that
    much queued to stay busy while this process writes the previous batch)."""
    if pool is None or pool.backlog() > backlog * pool.workers:
        return analyzer.term_counts_many(texts)
    return pool.submit(texts)


def prepared_batches(records: Iterable[Mapping[str, Any] | LoadedDocument], *, analyzer: Analyzer,
                     chunker: Chunker, batch_size: int, workers: int | None, fields: bool = False,
                     ahead: Callable[[list[Prepared]], None] | None = None
                     ) -> Generator[list[Prepared], None, None]:
    """``records`` validated, chunked and analyzed, ``batch_size`` at a time, in record
    order: everything a write does that needs no lock. With ``fields`` (the database
    indexes titles and headings) each chunk's field terms are analyzed here too
    (:attr:`Prepared.field_counts`), outside the write transaction.

    A batch is analyzed while the one before it is written (the texts go to worker
    processes in parts; this process analyzes a part itself when there are no workers
    or they are behind). An invalid record raises after the batches before it were
    yielded. Close the generator when done early (the worker pool stops with it).

    ``ahead``: called with each batch after the first once it is prepared, before the batch
    before it is yielded (and written): the texts it will store may be compressed meanwhile,
    in a thread. Not before the analysis workers are forked (``POOL_AFTER`` records), which
    forking with another thread alive could deadlock."""
    now = parse_timestamp(None, "now")
    pool: AnalysisPool | None = None
    backlog = max(2, -(-batch_size // ANALYSIS_PART))  # parts a worker may have queued (a batch)
    pending: tuple[list[Prepared], list[Prepared], list[Any]] | None = None

    def finish(batch: list[Prepared], pooled: list[Prepared], parts: list[Any]) -> list[Prepared]:
        if pooled:
            counts = iter([c for part in parts for c in (part if isinstance(part, list) else part.get())])
            for p in pooled:
                p.chunks[:] = [(s, e, m, next(counts)) for s, e, m, _ in p.chunks]
        if fields:
            for p in batch:
                p.field_counts = field_counts_of(analyzer, p)
        return batch

    it = iter(records)
    try:
        n = 0
        while True:
            batch: list[Prepared] = []
            pooled: list[Prepared] = []  # records of this batch, analyzed in parts
            parts: list[Any] = []         # their analysis: lists of counts, or pool jobs
            texts: list[str] = []         # texts not yet sent
            try:
                for record in it:
                    if pool is None and n == POOL_AFTER and workers != 0:
                        pool = analysis_pool(analyzer, workers)  # a bulk load: analyze in parallel
                    p = prepare(record, chunker, n, now)
                    n += 1
                    batch.append(p)
                    pooled.append(p)
                    texts.extend(p.text[s:e] for s, e, _, _ in p.chunks)
                    if len(texts) >= ANALYSIS_PART:
                        parts.append(_dispatch(analyzer, pool, texts, backlog))
                        texts = []
                    if len(batch) >= batch_size:
                        break
                if texts:
                    parts.append(_dispatch(analyzer, pool, texts, backlog))
            except BaseException:
                if pending is not None:  # the batches before the bad record are written
                    done, pending = pending, None
                    yield finish(*done)
                raise
            if not batch:
                break
            if pending is not None:
                if ahead is not None and n > POOL_AFTER:  # (no worker is forked after: see ahead)
                    ahead(batch)
                done, pending = pending, None
                yield finish(*done)  # while the workers analyze this batch
            pending = (batch, pooled, parts)
        if pending is not None:
            done, pending = pending, None
            yield finish(*done)
    finally:
        if pool is not None:
            pool.close(wait=False)


def field_counts_of(analyzer: Analyzer, p: Prepared) -> list[dict[str, int]]:
    """Each chunk's field terms (its document's title, its heading path: :mod:`ragdb.text.fields`)."""
    title = fields_mod.field_counts(analyzer, "title", fields_mod.effective_title(p.title, p.source))
    return [fields_mod.chunk_field_counts(analyzer, title, cmeta) for _s, _e, cmeta, _c in p.chunks]
