"""Keep a knowledge base in step with files: ingest paths, mirror a folder.

:func:`plan_sync` compares a folder with the documents stored under a source
prefix and says what would change; :func:`apply_sync` carries the plan out;
:func:`sync_folder` does both. :func:`add_paths` ingests files, folders and
standard input (``ragdb add``). Nothing here prints: every function returns a
frozen report, and failures are :class:`~ragdb.errors.RagdbError` subclasses.

How a sync decides, per file (``source`` = prefix + path relative to the folder):

* no stored latest document with that source: **added**;
* the file's size and modification time equal the stored ``metadata["size"]``
  and ``metadata["mtime"]``: **unchanged**, without reading the file;
* otherwise its bytes are hashed (SHA-256) and compared with the stored
  ``metadata["content_hash"]``: equal is **unchanged** (a file touched but
  not edited; it is hashed again on each sync until its content changes),
  different is **changed** (re-loaded and replaced).

Stored documents under the prefix whose file is gone are **deleted** (every
kept version). With ``glob`` only stored sources the glob matches are
considered, so syncing ``*.md`` never deletes the ``.txt`` documents. With no
prefix the scope is the whole database: it then mirrors the folder exactly.

A file that yields several documents (JSON Lines: one per record) or a
document with a source of its own gets the source ``<file source>#<record
source>`` and ``metadata["sync_file"] = <file source>``, so that all of a
file's documents are replaced or deleted together with it.

A file that cannot be loaded (binary, encrypted or broken PDF, empty) is
reported in ``failed`` and skipped; if it was stored before, the stored
version is kept. With ``strict=True`` the first such file aborts and nothing
is written.

Atomicity: all the writes of one :func:`apply_sync` or :func:`add_paths` call
are one SQLite transaction (see :func:`transaction`), so an error or an
interrupt leaves the database exactly as it was, and other readers see the
whole sync at once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import hashlib
import math
import os
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from collections.abc import Callable, Iterator, Mapping, Sequence

import orjson

from . import loaders
from .analysis import is_blank
from .errors import InvalidInput, LoaderError, RagdbError
from .options import ALL
from .types import LoadedDocument

if TYPE_CHECKING:
    from .database import Database

__all__ = [
    "FileFailure",
    "SyncPlan",
    "SyncReport",
    "IngestReport",
    "plan_sync",
    "apply_sync",
    "sync_folder",
    "add_paths",
    "transaction",
    "escape_glob",
    "file_sha256",
]

Progress = Callable[[int], None]
STDIN = "-"


@dataclass(frozen=True)
class FileFailure:
    """A file (or standard input) that could not be loaded, and why."""

    source: str
    path: str
    error: str


@dataclass(frozen=True)
class SyncPlan:
    """What a sync of ``root`` would do. The tuples hold sources, sorted."""

    root: str
    prefix: str
    added: tuple[str, ...]
    changed: tuple[str, ...]
    deleted: tuple[str, ...]
    unchanged: tuple[str, ...]
    failed: tuple[FileFailure, ...] = ()
    #: source -> file path of every added or changed source
    paths: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)
    #: source -> the stored document sources of that file (more than one for JSON Lines files)
    stored: Mapping[str, tuple[str, ...]] = field(default_factory=dict, compare=False, repr=False)

    @property
    def has_changes(self) -> bool:
        return bool(self.added or self.changed or self.deleted)

    def dry_run(self) -> SyncReport:
        """The report of this plan as a dry run: what a sync would do, nothing written."""
        return SyncReport(root=self.root, prefix=self.prefix, added=self.added, changed=self.changed,
                          deleted=self.deleted, unchanged=self.unchanged, failed=self.failed,
                          documents=0, removed=0, dry_run=True)


@dataclass(frozen=True)
class SyncReport:
    """What a sync did (``dry_run``: would do). The tuples hold sources, sorted.

    ``documents`` is the number of documents written (a loader may make more
    than one of a file); ``removed`` the number of stored documents deleted
    (kept older versions included).
    """

    root: str
    prefix: str
    added: tuple[str, ...]
    changed: tuple[str, ...]
    deleted: tuple[str, ...]
    unchanged: tuple[str, ...]
    failed: tuple[FileFailure, ...]
    documents: int
    removed: int
    dry_run: bool = False
    #: new chunks that took over the stored vector of an equal text (:attr:`ragdb.AddReport.reused`)
    reused: int = 0


@dataclass(frozen=True)
class IngestReport:
    """What :func:`add_paths` did: sources added or replaced, already identical, and failed."""

    added: tuple[str, ...]
    unchanged: tuple[str, ...]
    failed: tuple[FileFailure, ...]
    documents: int
    #: new chunks that took over the stored vector of an equal text (:attr:`ragdb.AddReport.reused`)
    reused: int = 0


# ----------------------------------------------------------------------------- helpers


@contextlib.contextmanager
def transaction(db: Database) -> Iterator[None]:
    """Make every write of ``db`` inside the block one transaction.

    Uses the store's re-entrant ``write()`` (each ``add_many`` batch and
    ``delete`` inside becomes a savepoint). The library keeps an in-memory
    view of the index that its writes update as they go; when the outer
    transaction rolls back, that view is rebuilt from the file, since it may
    hold chunks and term ids that were never committed.
    """
    with db.transaction():
        yield


def escape_glob(text: str) -> str:
    """``text`` as a SQLite GLOB pattern matching itself only (``*``, ``?``, ``[`` bracketed)."""
    return "".join(f"[{c}]" if c in "*?[" else c for c in text)


def file_sha256(path: str | os.PathLike[str]) -> str:
    """SHA-256 of a file's bytes, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _as_epoch(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value.strip().replace("Z", "+00:00")).timestamp()
        except ValueError:
            try:
                return float(value)
            except ValueError:
                return None
    return None


def _same_stat(meta: Mapping[str, Any], st: os.stat_result) -> bool:
    """Size and modification time equal the stored ones (within a microsecond)."""
    size = meta.get("size")
    if not isinstance(size, int) or isinstance(size, bool) or size != st.st_size:
        return False
    mtime = _as_epoch(meta.get("mtime"))
    return mtime is not None and math.isclose(mtime, st.st_mtime, rel_tol=0.0, abs_tol=2e-6)


def _error_text(err: BaseException) -> str:
    if isinstance(err, OSError):
        return err.strerror or str(err)
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def _check_loaded(doc: LoadedDocument, label: str) -> None:
    """What add_many would refuse about a loaded file, found before the batch is written."""
    if not isinstance(doc.text, str) or is_blank(doc.text):
        raise LoaderError(f"{label}: no text (empty file?)")
    try:
        orjson.dumps(dict(doc.metadata))
    except (TypeError, orjson.JSONEncodeError) as e:
        raise LoaderError(f"{label}: metadata is not JSON-serialisable ({e})") from None


SYNC_FILE = "sync_file"


def _load(path: str, source: str) -> list[LoadedDocument]:
    docs = loaders.load_file(path, source=source)
    if not docs:
        raise LoaderError(f"{path}: no text found")
    for doc in docs:
        _check_loaded(doc, path)
    return docs


def _load_for_sync(path: str, source: str) -> list[LoadedDocument]:
    """A file's documents, each with a source under the file's own (see the module docs)."""
    out = []
    for doc in _load(path, source):
        if doc.source != source:
            doc = dataclasses.replace(doc, source=f"{source}#{doc.source}",
                                      metadata={**doc.metadata, SYNC_FILE: source})
        out.append(doc)
    return out


def _with_extra(doc: LoadedDocument, extra: Mapping[str, Any]) -> LoadedDocument:
    if not extra:
        return doc
    return dataclasses.replace(doc, metadata={**doc.metadata, **extra})


def _rel_source(prefix: str, rel: str) -> str:
    return prefix + Path(rel).as_posix()


# ----------------------------------------------------------------------------- sync


def _scan(root: Path, prefix: str, glob: str | None, recursive: bool) -> dict[str, str]:
    """source -> file path of the files to mirror."""
    files: dict[str, str] = {}
    for f in loaders.iter_files(root, recursive=recursive, glob=glob):
        rel = os.path.relpath(f, root)
        files[_rel_source(prefix, rel)] = os.fspath(f)
    return files


def _in_scope(source: str, prefix: str, glob: str | None) -> bool:
    if not source.startswith(prefix):
        return False
    if glob is None:
        return True
    rel = source[len(prefix):]
    return _glob_match(rel.rsplit("/", 1)[-1], rel, glob)


def _glob_match(name: str, rel: str, pattern: str) -> bool:
    """The test :func:`ragdb.loaders.iter_files` applies to a file (name or relative path; ``**/``)."""
    if fnmatch.fnmatchcase(name, pattern) or fnmatch.fnmatchcase(rel, pattern):
        return True
    return pattern.startswith("**/") and _glob_match(name, rel, pattern[3:])


def plan_sync(db: Database, root: str | os.PathLike[str], *, source_prefix: str = "", glob: str | None = None,
              recursive: bool = True, probe: bool = False, progress: Progress | None = None) -> SyncPlan:
    """Compare the folder ``root`` with the documents stored under ``source_prefix``.

    Reads nothing but ``stat`` for files whose size and mtime are unchanged.
    ``probe=True`` also loads the added and changed files (without writing)
    so that files that would fail are listed in ``failed`` (for dry runs).
    ``progress`` is called with 1 per file examined.
    """
    rootp = Path(root)
    if not rootp.is_dir():
        raise InvalidInput(f"{rootp}: not a folder")
    if not isinstance(source_prefix, str):
        raise InvalidInput("source_prefix must be a string")
    files = _scan(rootp, source_prefix, glob, recursive)
    pattern = escape_glob(source_prefix) + "*" if source_prefix else None
    stored: dict[str, Mapping[str, Any]] = {}  # file source -> metadata of one of its documents
    groups: dict[str, list[str]] = {}  # file source -> its stored document sources
    for doc in db.documents(pattern, principals=ALL):  # sync mirrors every document, whoever may read it
        key = doc.metadata.get(SYNC_FILE)
        key = key if isinstance(key, str) and key else doc.source
        if _in_scope(key, source_prefix, glob):
            stored.setdefault(key, doc.metadata)
            groups.setdefault(key, []).append(doc.source)
    added, changed, unchanged = [], [], []
    failed: list[FileFailure] = []
    paths: dict[str, str] = {}
    for source in sorted(files):
        path = files[source]
        meta = stored.get(source)
        try:
            if meta is None:
                added.append(source)
                paths[source] = path
            elif _same_stat(meta, os.stat(path)) or file_sha256(path) == meta.get("content_hash"):
                unchanged.append(source)
            else:
                changed.append(source)
                paths[source] = path
        except OSError as e:
            failed.append(FileFailure(source, path, f"{path}: cannot read: {_error_text(e)}"))
        if progress is not None:
            progress(1)
    deleted = sorted(s for s in stored if s not in files)
    if probe:
        ok: set[str] = set()
        for source in added + changed:
            try:
                _load_for_sync(paths[source], source)
                ok.add(source)
            except (RagdbError, OSError) as e:
                failed.append(FileFailure(source, paths[source], _failure_text(paths[source], e)))
        added = [s for s in added if s in ok]
        changed = [s for s in changed if s in ok]
    return SyncPlan(root=os.fspath(rootp), prefix=source_prefix, added=tuple(added), changed=tuple(changed),
                    deleted=tuple(deleted), unchanged=tuple(unchanged),
                    failed=tuple(sorted(failed, key=lambda f: f.source)), paths=paths,
                    stored={k: tuple(v) for k, v in groups.items()})


def _failure_text(path: str, err: BaseException) -> str:
    text = _error_text(err)
    return text if path in text else f"{path}: {text}"


def apply_sync(db: Database, plan: SyncPlan, *, strict: bool = False, batch_size: int = 200,
               progress: Progress | None = None) -> SyncReport:
    """Carry out ``plan``: load and add the added and changed files, delete the vanished sources.

    One transaction. A file that fails to load is skipped and listed in
    ``failed`` (its stored version, if any, is kept); ``strict=True`` raises
    :class:`~ragdb.errors.LoaderError` instead, with nothing written, and so
    does a plan that already lists failures. ``progress`` is called with 1 per
    file loaded or source deleted.
    """
    if strict and plan.failed:
        raise LoaderError(plan.failed[0].error)
    failed: list[FileFailure] = list(plan.failed)
    written: set[str] = set()
    stale: list[str] = []  # stored documents of a changed file that its new content no longer holds
    counts = {"documents": 0, "removed": 0, "reused": 0}

    def records() -> Iterator[LoadedDocument]:
        for source in plan.added + plan.changed:
            path = plan.paths[source]
            try:
                docs = _load_for_sync(path, source)
            except (RagdbError, OSError) as e:
                if strict:
                    raise LoaderError(_failure_text(path, e)) from None
                failed.append(FileFailure(source, path, _failure_text(path, e)))
            else:
                written.add(source)
                new = {d.source for d in docs}
                stale.extend(s for s in plan.stored.get(source, ()) if s not in new)
                yield from docs
            if progress is not None:
                progress(1)

    with transaction(db):
        if plan.added or plan.changed:
            added = db.add_many(records(), batch_size=batch_size)
            counts["documents"], counts["reused"] = len(added), added.reused
        for source in stale:
            counts["removed"] += db.delete(source=source)
        for source in plan.deleted:
            for doc_source in plan.stored.get(source, (source,)):
                counts["removed"] += db.delete(source=doc_source)
            if progress is not None:
                progress(1)
    return SyncReport(root=plan.root, prefix=plan.prefix,
                      added=tuple(s for s in plan.added if s in written),
                      changed=tuple(s for s in plan.changed if s in written),
                      deleted=plan.deleted, unchanged=plan.unchanged,
                      failed=tuple(sorted(failed, key=lambda f: f.source)),
                      documents=counts["documents"], removed=counts["removed"], reused=counts["reused"])


def sync_folder(db: Database, root: str | os.PathLike[str], *, source_prefix: str = "", glob: str | None = None,
                recursive: bool = True, dry_run: bool = False, strict: bool = False,
                progress: Progress | None = None) -> SyncReport:
    """Make the documents under ``source_prefix`` mirror the folder ``root`` (see the module docs).

    ``dry_run=True`` writes nothing and reports what would change (loading
    the added and changed files to find those that would fail).
    """
    plan = plan_sync(db, root, source_prefix=source_prefix, glob=glob, recursive=recursive, probe=dry_run)
    if dry_run:
        if strict and plan.failed:
            raise LoaderError(plan.failed[0].error)
        return SyncReport(root=plan.root, prefix=plan.prefix, added=plan.added, changed=plan.changed,
                          deleted=plan.deleted, unchanged=plan.unchanged, failed=plan.failed,
                          documents=0, removed=0, dry_run=True)
    return apply_sync(db, plan, strict=strict, progress=progress)


# ----------------------------------------------------------------------------- add


def expand_paths(inputs: Sequence[str], *, recursive: bool = True, glob: str | None = None,
                 source_prefix: str = "") -> list[tuple[str, str]]:
    """(path, source) of every file named by ``inputs`` (files, folders, ``-`` for stdin).

    A file's source is ``source_prefix`` + the path as given (``./`` and
    doubled slashes removed); a folder's files are its path joined with their
    path inside it. Raises :class:`~ragdb.errors.InvalidInput` for a path that
    does not exist.
    """
    out: list[tuple[str, str]] = []
    for item in inputs:
        if item == STDIN:
            out.append((STDIN, source_prefix + "stdin"))
            continue
        p = Path(item)
        if p.is_dir():
            for f in loaders.iter_files(p, recursive=recursive, glob=glob):
                rel = os.path.relpath(f, p)
                out.append((os.fspath(f), _rel_source(source_prefix, os.path.join(item, rel))))
        elif p.exists():
            out.append((os.fspath(p), _rel_source(source_prefix, item)))
        else:
            raise InvalidInput(f"{item}: no such file or folder")
    return out


def add_paths(db: Database, inputs: Sequence[str], *, recursive: bool = True, glob: str | None = None,
              source_prefix: str = "", source: str | None = None, version: str | None = None,
              metadata: Mapping[str, Any] | None = None, stdin: bytes | None = None,
              stdin_kind: str | None = None, strict: bool = False, batch_size: int = 200,
              progress: Progress | None = None) -> IngestReport:
    """Load files, folders' files and standard input and add them, in one transaction.

    ``inputs``: paths; ``-`` stands for ``stdin`` (bytes the caller read),
    loaded as ``stdin_kind`` (e.g. ``"md"``; default: guessed). ``source``
    names the document when there is exactly one input file. ``version`` and
    ``metadata`` are set on every document. Files that fail to load are
    listed in ``failed`` and skipped, unless ``strict=True``: then the first
    failure raises :class:`~ragdb.errors.LoaderError` and nothing is written.
    ``progress`` is called with 1 per file.
    """
    items = expand_paths(inputs, recursive=recursive, glob=glob, source_prefix=source_prefix)
    if source is not None:
        if len(items) != 1:
            raise InvalidInput(f"source {source!r} names one document, but the inputs hold {len(items)} files")
        items = [(items[0][0], source)]
    extra: dict[str, Any] = dict(metadata or {})
    if version is not None:
        extra["version"] = version
    failed: list[FileFailure] = []

    def records() -> Iterator[LoadedDocument]:
        for path, src in items:
            try:
                if path == STDIN:
                    if stdin is None:
                        raise InvalidInput("-: no standard input given")
                    docs = loaders.load_bytes(stdin, source=src, kind=stdin_kind)
                    if not docs:
                        raise LoaderError("-: no text found")
                    for d in docs:
                        _check_loaded(d, "-")
                else:
                    docs = _load(path, src)
            except (RagdbError, OSError) as e:
                where = "-" if path == STDIN else path
                if strict:
                    raise LoaderError(_failure_text(where, e)) from None
                failed.append(FileFailure(src, where, _failure_text(where, e)))
            else:
                for d in docs:
                    if d.source != src and source_prefix:  # JSON Lines records name their own sources
                        d = dataclasses.replace(d, source=source_prefix + d.source)
                    yield _with_extra(d, extra)
            if progress is not None:
                progress(1)

    with transaction(db):
        report = db.add_many(records(), batch_size=batch_size)
    added = tuple(c.document.source for c in report.changes if c.status != "unchanged")
    unchanged = tuple(c.document.source for c in report.changes if c.status == "unchanged")
    return IngestReport(added=added, unchanged=unchanged, failed=tuple(failed), documents=len(added),
                        reused=report.reused)
