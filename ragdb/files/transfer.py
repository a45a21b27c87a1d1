"""Export a database to JSON Lines and import it back.

The format is one JSON object per stored document (every kept version, in
the order they were stored)::

    {"source": "docs/a.md", "version": "2", "timestamp": "2026-11-01T09:30:00Z",
     "title": "A", "text": "...", "metadata": {...}, "acl": ["team-a"],
     "chunker": "recursive:size=...", "latest": true,
     "spans": [{"start": 0, "end": 812, "metadata": {"section": "Intro"}}, ...]}

``spans`` is present only when some chunk of the document carries metadata of
its own (Markdown sections, PDF pages): it records, for each chunk, the range
from its start to the next chunk's start, so that re-chunking the text with
the same chunker on import gives every chunk the same metadata again.

:func:`import_jsonl` reads the file back with :meth:`Database.add_many` (each
record's own ``chunker``), all of it in one transaction: a bad line rolls the
whole import back. Imported into an empty database built with the same
analyzer (``ragdb init --analyzer ...``), searches return the same sources,
spans and scores as in the exported one. Records with ``"latest": false`` (kept
older versions) are imported only into a database that keeps versions;
elsewhere they are skipped and counted.

:func:`copy_database` copies a knowledge base between databases, SQLite and
PostgreSQL alike, row for row (ids, versions, labels, metadata, vectors kept).

Nothing here prints; every function returns a frozen report.
"""

from __future__ import annotations

import codecs
import os
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any
from collections.abc import Callable, Iterator

import orjson

from ragdb.errors import InvalidInput, StorageError
from ragdb.options import ALL
from ragdb.records import Span
from ragdb.storage.codec import loads_exact

if TYPE_CHECKING:
    from ragdb.database import Database

__all__ = ["ExportReport", "ImportReport", "CopyReport", "CopiedCollection", "export_jsonl", "import_jsonl",
           "copy_database", "RECORD_KEYS"]

#: The keys of an exported record (``spans`` is optional).
RECORD_KEYS = ("source", "version", "timestamp", "title", "text", "metadata", "acl", "chunker", "latest", "spans")

Progress = Callable[[int], None]


@dataclass(frozen=True)
class ExportReport:
    """``documents``: records written (``latest`` of them latest versions);
    ``hidden``: stored documents the caller's principals could not see, left out."""

    path: str
    documents: int
    latest: int
    hidden: int = 0


@dataclass(frozen=True)
class ImportReport:
    """``documents``: records imported; ``skipped_versions``: older versions not
    imported because the database does not keep versions; ``unchanged``: records
    identical to what the database already held (nothing written for them)."""

    path: str
    documents: int
    skipped_versions: int
    unchanged: int


def _name(target: Any) -> str:
    if isinstance(target, (str, os.PathLike)):
        return os.fspath(target)
    return str(getattr(target, "name", "<stream>"))


def export_jsonl(db: Database, target: "str | os.PathLike[str] | IO[bytes]", *,
                 progress: Progress | None = None, principals: Any = None) -> ExportReport:
    """Write the stored documents of ``db`` that ``principals`` may see (as in
    :meth:`Database.search`: omitted is an anonymous caller, so a full backup
    needs ``principals=ragdb.ALL``) to ``target`` (a path or a binary file) as
    JSON Lines; ``hidden`` in the report counts the stored documents left out.

    A path is written to a temporary file next to it and renamed into place
    when complete, so a failed export never leaves a truncated file.
    """
    name = _name(target)
    if isinstance(target, (str, os.PathLike)):
        path = Path(target)
        if path.is_dir():  # found before the whole export is written to a temporary file
            raise InvalidInput(f"{name}: cannot write: is a folder")
        tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
        try:
            fh = open(tmp, "wb")  # noqa: SIM115 - closed by the with below; only open() errors are "cannot write"
        except OSError as e:  # a missing folder, no permission: the target's problem, not the temp file's
            raise InvalidInput(f"{name}: cannot write: {e.strerror or e}") from None
        try:
            with fh:
                report = _export_to(db, fh, name, progress, principals)
            os.replace(tmp, path)
        except BaseException as e:
            try:
                tmp.unlink()
            except OSError:
                pass
            if isinstance(e, OSError):  # the disk filled, the folder went: nothing was left behind
                raise StorageError(f"{name}: cannot write: {e.strerror or e}") from None
            raise
        return report
    return _export_to(db, target, name, progress, principals)


def _export_to(db: Database, fh: IO[bytes], name: str, progress: Progress | None, principals: Any
               ) -> ExportReport:
    n = latest = 0
    for record in db.records(principals=principals):
        fh.write(orjson.dumps(record) + b"\n")
        n += 1
        latest += record["latest"]
        if progress is not None:
            progress(1)
    fh.flush()
    hidden = 0 if principals is ALL else db.count(versions="all", principals=ALL) - n
    return ExportReport(path=name, documents=n, latest=latest, hidden=max(hidden, 0))


def _parse(name: str, lineno: int, obj: Any) -> dict[str, Any]:
    where = f"{name}:{lineno}"
    if not isinstance(obj, dict):
        raise InvalidInput(f"{where}: expected a JSON object, got {type(obj).__name__}")
    unknown = set(obj) - set(RECORD_KEYS)
    if unknown:
        raise InvalidInput(f"{where}: unknown keys {sorted(unknown)}")
    if not isinstance(obj.get("text"), str):
        raise InvalidInput(f"{where}: 'text' must be a string")
    if not isinstance(obj.get("source"), str) or not obj["source"]:
        raise InvalidInput(f"{where}: 'source' must be a non-empty string")
    if not isinstance(obj.get("latest", True), bool):
        # (an export writes true or false; "no" or 0 would otherwise be read as a latest version)
        raise InvalidInput(f"{where}: 'latest' must be true or false, got {obj['latest']!r}")
    record = {k: obj[k] for k in ("text", "source", "version", "timestamp", "title", "metadata", "acl",
                                  "chunker") if obj.get(k) is not None}
    _check_fields(record, where)
    spans = obj.get("spans")
    if spans is not None:
        if not isinstance(spans, list):
            raise InvalidInput(f"{where}: 'spans' must be a list")
        out = []
        for sp in spans:
            if (not isinstance(sp, dict) or not isinstance(sp.get("start"), int)
                    or not isinstance(sp.get("end"), int) or not isinstance(sp.get("metadata", {}), dict)):
                raise InvalidInput(f"{where}: each span must be {{'start': int, 'end': int, 'metadata': {{...}}}}")
            out.append(Span(sp["start"], sp["end"], sp.get("metadata", {})))
        record["spans"] = tuple(out)
    return record


def _check_fields(record: dict[str, Any], where: str) -> None:
    """The checks :meth:`Database.add_many` makes of a record's timestamp, metadata, labels and
    chunker, made here too so that a bad value is named by its file and line (add_many reads
    the records in batches and names a record by its source only)."""
    from ragdb.engine.prepare import check_acl, check_metadata
    from ragdb.options import parse_timestamp
    from ragdb.text.chunking import get_chunker

    version = record.get("version")
    if version is not None and (isinstance(version, bool) or not isinstance(version, (str, int, float))):
        raise InvalidInput(f"{where}: version must be a string, got {version!r}")
    if not isinstance(record.get("title", ""), str):
        raise InvalidInput(f"{where}: title must be a string, got {type(record['title']).__name__}")
    if "timestamp" in record:
        parse_timestamp(record["timestamp"], where)
    check_metadata(record.get("metadata"), where)
    check_acl(record.get("acl"), where)
    if "chunker" in record:
        try:
            get_chunker(record["chunker"])  # (ragdb's own chunkers: a parsed spec is kept)
        except InvalidInput as e:
            raise InvalidInput(f"{where}: {e}") from None


def _read_records(fh: IO[bytes], name: str, keep_old: bool, skipped: list[int],
                  progress: Progress | None, held: Callable[[dict[str, Any]], bool] | None = None
                  ) -> Iterator[dict[str, Any]]:
    """The file's records to add. ``held``: whether the database already holds an older
    version's record as it is (``skipped[1]`` counts them: not added again)."""
    for lineno, line in enumerate(fh, 1):
        if lineno == 1:  # a UTF-8 byte order mark (Windows editors write one; the loader skips it too)
            line = line.removeprefix(codecs.BOM_UTF8)
        if not line.strip():
            continue
        try:
            obj = loads_exact(line)
        except orjson.JSONDecodeError as e:
            raise InvalidInput(f"{name}:{lineno}: invalid JSON ({e})") from None
        record = _parse(name, lineno, obj)
        if progress is not None:
            progress(1)
        if obj.get("latest") is False and not keep_old:
            skipped[0] += 1
            continue
        if obj.get("latest") is False and held is not None and held(record):
            skipped[1] += 1
            continue
        yield record


def _older_version_held(db: Database) -> Callable[[dict[str, Any]], bool]:
    """Whether ``db`` holds a version of the record's source with its version, timestamp,
    text, metadata and labels (its title came with its text: ``update`` changes neither): an older version exported and imported again is that
    (add_many compares a record with the source's latest version only, so it added each again:
    a second import of one export doubled every kept version)."""
    import hashlib

    versions: dict[str, set[tuple[Any, ...]]] = {}

    def key(version: Any, timestamp: Any, content_hash: str, metadata: Any, acl: Any) -> tuple[Any, ...]:
        return (None if version is None else str(version), timestamp, content_hash,
                orjson.dumps(metadata or {}, option=orjson.OPT_SORT_KEYS), tuple(sorted(acl or ())))

    def held(record: dict[str, Any]) -> bool:
        source = record["source"]
        if source not in versions:
            versions[source] = {key(d.version, d.timestamp, d.content_hash, dict(d.metadata), d.acl)
                                for d in db.documents(source, glob=False, versions="all", principals=ALL)}
        digest = hashlib.sha256(record["text"].encode("utf-8")).hexdigest()
        # a Document's metadata holds its title (Database.documents merges it in); the record
        # has it apart: merged the same way, or a titled document never matched
        metadata = dict(record.get("metadata") or {})
        if record.get("title") is not None:
            metadata.setdefault("title", record["title"])
        return key(record.get("version"), record.get("timestamp"), digest, metadata,
                   record.get("acl")) in versions[source]

    return held


def import_jsonl(db: Database, source: "str | os.PathLike[str] | IO[bytes]", *, batch_size: int = 500,
                 progress: Progress | None = None) -> ImportReport:
    """Add the documents of an :func:`export_jsonl` file to ``db``, in one transaction.

    Raises :class:`~ragdb.errors.InvalidInput` naming the file and line of a
    malformed record; nothing is imported then. ``progress`` is called with 1
    per record read.
    """
    from ragdb.files.sync import transaction  # the one place that wraps several library writes

    name = _name(source)
    keep_old = bool(db.settings.get("keep_versions", False))
    skipped = [0, 0]  # older versions: not kept by the database; held already

    def run(fh: IO[bytes]) -> ImportReport:
        with transaction(db):
            docs = db.add_many(_read_records(fh, name, keep_old, skipped, progress,
                                             _older_version_held(db) if keep_old else None), batch_size=batch_size)
        return ImportReport(path=name, documents=len(docs) - len(docs.unchanged), skipped_versions=skipped[0],
                            unchanged=len(docs.unchanged) + skipped[1])

    if isinstance(source, (str, os.PathLike)):
        try:
            fh = open(source, "rb")  # noqa: SIM115 - closed by the with below; only open() errors are "cannot read"
        except OSError as e:
            raise InvalidInput(f"{name}: cannot read: {e.strerror or e}") from None
        with fh:
            return run(fh)
    return run(source)



# -- copying a database between backends ------------------------------------------------------

@dataclass(frozen=True)
class CopiedCollection:
    """One collection a copy moved: its latest documents, stored documents (kept versions
    too), chunks and vectors."""

    name: str
    documents: int
    stored_documents: int
    chunks: int
    vectors: int


@dataclass(frozen=True)
class CopyReport:
    """What :func:`copy_database` copied (``source`` and ``target`` as messages show them:
    passwords redacted)."""

    source: str
    target: str
    collections: tuple[CopiedCollection, ...]


def copy_database(source: "str | os.PathLike[str]", target: "str | os.PathLike[str]", *,
                  collections: "list[str] | tuple[str, ...] | None" = None, busy_timeout: float = 30.0,
                  progress: Progress | None = None) -> CopyReport:
    """Copy a knowledge base between databases of either backend (SQLite file ↔
    PostgreSQL, or the same kind): every collection (or those named), each one row
    for row, so ids, versions, timestamps, validity, labels, metadata, settings,
    statistics, postings, the change log and vectors are the target's as they were
    the source's, and searches return the same hits with the same scores.

    The source is read in one snapshot per collection (opened read-only); each
    target collection is written in one transaction and must be new or empty (no
    documents, no settings): a copy never merges into a knowledge base.
    ``progress`` is called with the number of rows of each table copied.
    """
    from ragdb.options import check_busy_timeout, check_path
    from ragdb.storage import open_store
    from ragdb.storage.collections import DEFAULT, check_name
    from ragdb.storage.store import COPY_TABLES

    src_path, dst_path = check_path(source), check_path(target)
    busy_timeout = check_busy_timeout(busy_timeout)
    wanted = None if collections is None else [check_name(c) for c in collections]
    if src_path == dst_path or src_path == ":memory:" or dst_path == ":memory:":
        raise InvalidInput("copy: give two different databases, neither ':memory:'")
    src = open_store(src_path, readonly=True, create=False, busy_timeout=busy_timeout)
    try:
        dst = open_store(dst_path, create=True, busy_timeout=busy_timeout)
    except BaseException:
        src.close()
        raise
    done: list[CopiedCollection] = []
    try:
        with src.read():
            rows = src.collection_rows()
        names = [r[1] for r in rows]
        if wanted is not None:
            missing = [w for w in wanted if w not in names]
            if missing:
                raise InvalidInput(f"copy: {src.path} has no collection {missing[0]!r}; it has "
                                   f"{', '.join(repr(n) for n in names)}")
            rows = [r for r in rows if r[1] in wanted]
        for cid, name, _created in rows:
            s_view = src.view(cid, name)
            with dst.write():
                row = dst.collection_row(name)
                if row is None:
                    row = dst.create_collection(name)
                d_view = dst.view(row[0], name if row[0] else DEFAULT)
                if d_view.settings() or d_view.stored_counts() != (0, 0):
                    raise InvalidInput(f"copy: the target {dst.path} collection {name!r} is not empty; copy into "
                                       f"a new database (or drop the collection first)")
                with s_view.read():
                    for table, columns in COPY_TABLES:
                        d_view.clear_table(table)
                        batch: list[tuple[Any, ...]] = []
                        for r in s_view.table_rows(table, columns):
                            batch.append(r)
                            if len(batch) >= 2000:
                                d_view.insert_table_rows(table, columns, batch)
                                if progress is not None:
                                    progress(len(batch))
                                batch = []
                        d_view.insert_table_rows(table, columns, batch)
                        if progress is not None and batch:
                            progress(len(batch))
                    d_view.finish_copy()
                    stats = s_view.stats_row()
                    stored = s_view.stored_counts()
                    vectors = s_view.vector_count()
                done.append(CopiedCollection(name=name, documents=stats["n_docs"], stored_documents=stored[0],
                                             chunks=stored[1], vectors=vectors))
        return CopyReport(source=src.path, target=dst.path, collections=tuple(done))
    finally:
        dst.close()
        src.close()
