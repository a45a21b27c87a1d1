"""Keep a knowledge base in step with files: ingest paths, mirror a folder.

:func:`plan_sync` compares a folder with the documents stored under it and
says what would change; :func:`apply_sync` carries the plan out;
:func:`sync_folder` does both. :func:`add_paths` ingests files, folders and
standard input (``ragdb add``). Nothing here prints: every function returns a
frozen report, and failures are :class:`~ragdb.errors.RagdbError` subclasses.

Sources: one per file, the same from ``add`` and ``sync``
(:func:`source_name`): a path inside the current working folder (or
``relative_to``) is named by its path relative to it (posix, normalised:
``docs/a.md``, ``./docs/a.md`` and ``$PWD/docs/a.md`` are one document); a
path outside it keeps its absolute normalised path; ``source_prefix`` is
prepended as it is. A sync of ``docs`` therefore manages the sources under
``PREFIX + "docs/"`` (under ``PREFIX`` alone, the whole database when there
is no prefix, for a sync of the working folder itself).

Which files of a folder are taken: :func:`ragdb.files.walk.walk` (ignore files,
default skips, ``include``/``exclude``); what it leaves out is reported in
``skipped``, with a reason. A walked file whose content turns out to be
binary or a minified bundle is skipped when it is loaded. A file named
explicitly (``add_paths``) is always loaded.

How a sync decides, per file:

* no stored latest document with its source: **added**;
* the file's size and modification time equal the stored ``metadata["size"]``
  and ``metadata["mtime"]``: **unchanged**, without reading the file;
* otherwise its bytes are hashed (SHA-256) and compared with the stored
  ``metadata["content_hash"]``: equal is **unchanged** (a file touched but
  not edited; it is hashed again on each sync until its content changes),
  different is **changed** (re-loaded and replaced).

Stored documents in scope whose file is gone, or is now skipped (ignored, a
default skip), are **deleted** (every kept version). ``include`` and
``exclude`` narrow the scope: a sync with ``include=["*.md"]`` never
deletes the ``.txt`` documents, one with ``exclude=["drafts/"]`` leaves the
stored drafts alone. ``recursive=False`` leaves the sub-folders' documents
alone.

A file that yields several documents (JSON Lines: one per record) gives
them the sources ``<file source>#<record id>`` (``#<line>`` for a record
without one) and ``metadata["sync_file"] = <file source>``, from ``add`` and
from ``sync`` alike, so that all of a file's documents are replaced or
deleted together with it (records gone from the file are deleted).

Access labels: a document's ``acl`` comes from its file (front matter
``acl:``/``labels:``, a JSON Lines record's ``acl``) unless ``acl=`` is
given, which sets the labels of every document written (``[ragdb.PUBLIC]``
makes them visible to every caller). A sync only writes added and changed
files: pass the same ``acl`` on every sync of a folder.

A file that cannot be loaded (encrypted or broken PDF, empty, unreadable)
is reported in ``failed`` and left out; if it was stored before, the stored
version is kept (so is it for a file whose content became binary). With
``strict=True`` the first such file aborts and nothing is written.

Atomicity: all the writes of one :func:`apply_sync` or :func:`add_paths` call
are one SQLite transaction (see :func:`transaction`), so an error or an
interrupt leaves the database exactly as it was, and other readers see the
whole sync at once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import math
import os
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from collections.abc import Callable, Iterator, Mapping, Sequence


from ragdb.files import loaders
from ragdb.files import walk
from ragdb.text.analysis import is_blank
from ragdb.errors import DocumentNotFound, InvalidInput, LoaderError, RagdbError
from ragdb.options import ALL
from ragdb.records import LoadedDocument
from ragdb.files.walk import Patterns, Skipped

if TYPE_CHECKING:
    from ragdb.database import Database

__all__ = [
    "FileFailure",
    "Skipped",
    "Selection",
    "SyncPlan",
    "SyncReport",
    "IngestReport",
    "plan_sync",
    "apply_sync",
    "sync_folder",
    "add_paths",
    "select_paths",
    "expand_paths",
    "source_name",
    "transaction",
    "escape_glob",
    "file_sha256",
]

Progress = Callable[[int], None]
STDIN = "-"
SYNC_FILE = "sync_file"


@dataclass(frozen=True)
class FileFailure:
    """A file (or standard input) that could not be loaded, and why."""

    source: str
    path: str
    error: str


@dataclass(frozen=True)
class SyncPlan:
    """What a sync of ``root`` would do. The tuples hold sources, sorted.

    ``prefix`` is the scope: the source prefix plus the folder's own name
    (see :func:`source_name`); ``skipped`` what the walk left out and why;
    ``unmatched`` the ``(option, pattern)`` pairs (``"include"`` or
    ``"exclude"``) that matched no path.
    """

    root: str
    prefix: str
    added: tuple[str, ...]
    changed: tuple[str, ...]
    deleted: tuple[str, ...]
    unchanged: tuple[str, ...]
    failed: tuple[FileFailure, ...] = ()
    skipped: tuple[Skipped, ...] = ()
    unmatched: tuple[tuple[str, str], ...] = ()
    #: source -> file path of every added or changed source
    paths: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)
    #: source -> the stored document sources of that file (more than one for JSON Lines files)
    stored: Mapping[str, tuple[str, ...]] = field(default_factory=dict, compare=False, repr=False)
    #: the access labels the sync sets on every document it writes (None: the files' own)
    acl: tuple[str, ...] | None = field(default=None, compare=False, repr=False)
    #: file path -> (device, inode) the walk saw (:attr:`ragdb.files.walk.Walk.identities`)
    identities: Mapping[str, walk.FileIdentity] = field(default_factory=dict, compare=False, repr=False)

    @property
    def has_changes(self) -> bool:
        return bool(self.added or self.changed or self.deleted)

    @property
    def skip_counts(self) -> dict[str, int]:
        """Reason -> number of skipped paths (a skipped folder counts once), most frequent first."""
        return walk.skip_counts(self.skipped)

    def dry_run(self) -> SyncReport:
        """The report of this plan as a dry run: what a sync would do, nothing written."""
        return SyncReport(root=self.root, prefix=self.prefix, added=self.added, changed=self.changed,
                          deleted=self.deleted, unchanged=self.unchanged, failed=self.failed,
                          documents=0, removed=0, dry_run=True, skipped=self.skipped, unmatched=self.unmatched)


@dataclass(frozen=True)
class SyncReport:
    """What a sync did (``dry_run``: would do). The tuples hold sources, sorted.

    ``documents`` is the number of documents written (a loader may make more
    than one of a file); ``removed`` the number of stored documents deleted
    (kept older versions included); ``skipped`` the paths left out and why
    (see :mod:`ragdb.files.walk`), ``skip_counts`` their number by reason.
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
    skipped: tuple[Skipped, ...] = ()
    unmatched: tuple[tuple[str, str], ...] = ()

    @property
    def skip_counts(self) -> dict[str, int]:
        return walk.skip_counts(self.skipped)


@dataclass(frozen=True)
class IngestReport:
    """What :func:`add_paths` did: sources added or replaced (``replaced``: those of them that
    replaced a stored version), already identical, failed,
    skipped (with reasons), and the stored records of JSON Lines files that the new
    content no longer holds (``removed`` documents deleted)."""

    added: tuple[str, ...]
    unchanged: tuple[str, ...]
    failed: tuple[FileFailure, ...]
    documents: int
    #: new chunks that took over the stored vector of an equal text (:attr:`ragdb.AddReport.reused`)
    reused: int = 0
    skipped: tuple[Skipped, ...] = ()
    unmatched: tuple[tuple[str, str], ...] = ()
    removed: int = 0
    #: the sources in ``added`` that replaced a stored version of the same source
    replaced: tuple[str, ...] = ()

    @property
    def skip_counts(self) -> dict[str, int]:
        return walk.skip_counts(self.skipped)


@dataclass(frozen=True)
class Selection:
    """The files :func:`add_paths` would load: ``items`` holds (path, source,
    explicit) -- explicit for a file named in the inputs, which no default
    rule skips -- and ``"-"`` for standard input."""

    items: tuple[tuple[str, str, bool], ...]
    skipped: tuple[Skipped, ...] = ()
    unmatched: tuple[tuple[str, str], ...] = ()
    #: file path -> (device, inode) the walk saw, for the files of folders
    identities: Mapping[str, walk.FileIdentity] = field(default_factory=dict, compare=False, repr=False)


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


def file_sha256(path: str | os.PathLike[str], identity: walk.FileIdentity | None = None) -> str:
    """SHA-256 of a file's bytes, read from one descriptor (:func:`ragdb.files.walk.read_file`:
    with ``identity``, a file swapped since the walk raises :class:`~ragdb.files.walk.FileChanged`)."""
    return hashlib.sha256(walk.read_file(path, identity)[0]).hexdigest()


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
        doc.text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise LoaderError(f"{label}: the text is not valid Unicode (lone surrogate at offset {e.start})") from None
    # what add_many checks of a loaded document's version, timestamp, metadata, title, access
    # labels and spans (as ragdb.engine.prepare.prepare takes them): a file failing one is a
    # failed file, not the end of the whole add or sync
    from ragdb.engine.prepare import check_acl, check_metadata, check_span
    from ragdb.options import check_text, parse_timestamp

    meta = dict(doc.metadata)
    version, timestamp = meta.pop("version", None), meta.pop("timestamp", None)
    try:
        if doc.title is not None:
            check_text(doc.title, f"{label}: title")
        if doc.acl is not None:
            check_acl(doc.acl, label)
        for i, span in enumerate(doc.spans):
            check_span(span, f"{label}: span {i}")
        if version is not None:
            if isinstance(version, bool) or not isinstance(version, (str, int, float)):
                raise InvalidInput(f"{label}: version must be a string, got {version!r}")
            check_text(str(version), f"{label}: version")
        if timestamp is not None:
            parse_timestamp(timestamp, label)
        check_metadata(meta, label)
    except InvalidInput as e:
        raise LoaderError(str(e)) from None


class _ContentSkip(Exception):
    """A walked file whose content is not text to index (binary, a minified bundle)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _file_documents(path: str, source: str, acl: tuple[str, ...] | None, *, check: bool,
                    identity: walk.FileIdentity | None = None) -> list[LoadedDocument]:
    """A file's documents: the one named ``source``, or (JSON Lines) ``source#record`` each
    with ``metadata["sync_file"]``; ``acl`` (when given) on every one. ``check``: refuse
    binary content and bundles first (:class:`_ContentSkip`), as for a walked file.

    The file is opened once and read from that descriptor; with ``identity`` (what the walk
    saw) a file swapped since raises :class:`~ragdb.files.walk.FileChanged`."""
    loaders.check_name(path, source)  # before reading: such a file fails whatever it holds
    if identity is None and not os.path.isfile(path):
        raise LoaderError(f"{path}: not a regular file" if os.path.exists(path) else f"{path}: no such file")
    if check:  # the head first: a large binary file is skipped without reading it all
        head = walk.read_file(path, identity, limit=1 << 16)[0]
        reason = walk.content_reason(head, os.path.basename(path))
        if reason is not None:
            raise _ContentSkip(reason)
    data, st = walk.read_file(path, identity)
    docs = loaders.load_read(data, st, where=path, source=source)
    if not docs:
        raise LoaderError(f"{path}: no text found")
    for doc in docs:
        _check_loaded(doc, path)
    out = []
    for doc in docs:
        if doc.source != source:
            own = doc.source if doc.source.startswith(source + "#") else f"{source}#{doc.source}"
            doc = dataclasses.replace(doc, source=own, metadata={**doc.metadata, SYNC_FILE: source})
        elif SYNC_FILE in doc.metadata:  # the file's own key (front matter): not sync's to trust
            doc = dataclasses.replace(doc, metadata={k: v for k, v in doc.metadata.items() if k != SYNC_FILE})
        if acl is not None:
            doc = dataclasses.replace(doc, acl=acl)
        out.append(doc)
    return out


def _as_stored_if_touched(db: Database, doc: LoadedDocument) -> LoadedDocument:
    """A file's document whose bytes the stored latest version holds already (the file was
    touched, not edited): with that version's modification time (and the timestamp taken
    from it), so that adding it again is unchanged, as a sync finds it; else as it is."""
    meta = doc.metadata
    if "mtime" not in meta or "content_hash" not in meta:
        return doc
    try:
        stored = db.get(source=doc.source, with_text=False, principals=ALL)
    except DocumentNotFound:
        return doc
    if stored.metadata.get("content_hash") != meta["content_hash"] or stored.metadata.get("mtime") == meta["mtime"]:
        return doc
    kept = {**meta, "mtime": stored.metadata.get("mtime")}
    if meta.get("timestamp") == meta["mtime"]:  # the file's time, not its own (front matter's, a record's)
        kept["timestamp"] = stored.timestamp
    return dataclasses.replace(doc, metadata=kept)


def _with_extra(doc: LoadedDocument, extra: Mapping[str, Any]) -> LoadedDocument:
    if not extra:
        return doc
    return dataclasses.replace(doc, metadata={**doc.metadata, **extra})


def _check_acl(acl: Sequence[str] | None) -> tuple[str, ...] | None:
    if acl is None:
        return None
    if (isinstance(acl, (str, bytes)) or not isinstance(acl, (list, tuple, set, frozenset))
            or not all(isinstance(a, str) and a.strip() for a in acl)):
        raise InvalidInput(f"acl must be a list of labels (non-empty strings), got {acl!r}")
    return tuple(sorted({a.strip() for a in acl}))


def _patterns(include: Sequence[str] | None, exclude: Sequence[str] | None,
              glob: str | None) -> tuple[Patterns, Patterns]:
    if glob is not None and not isinstance(glob, str):
        raise InvalidInput(f"glob must be a pattern string, got {glob!r}")
    for value, what in ((include, "include"), (exclude, "exclude")):
        if value is not None and (isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple))):
            raise InvalidInput(f"{what} must be a list of patterns, got {value!r}")
    inc = [*(include or ()), *([glob] if glob is not None else [])]
    return Patterns(inc, "include"), Patterns(exclude, "exclude")


def _unmatched(inc: Patterns, exc: Patterns) -> tuple[tuple[str, str], ...]:
    return tuple(("include", p) for p in inc.unmatched()) + tuple(("exclude", p) for p in exc.unmatched())


def source_name(path: str | os.PathLike[str], *, relative_to: str | os.PathLike[str] | None = None) -> str:
    """The canonical name of a file or folder in sources (without any prefix).

    Inside ``relative_to`` (default: the current working folder) it is the
    path relative to it, in posix form and normalised (``./docs//a.md`` ->
    ``docs/a.md``; the folder itself is ``""``); outside it, the absolute
    normalised path. Symbolic links are not resolved: a link is named by
    where it is, not by what it points to.
    """
    for value, what in ((path, "path"), (relative_to, "relative_to")):
        if value is not None and not isinstance(value, (str, os.PathLike)):
            raise InvalidInput(f"{what} must be a path, got {value!r}")
    if relative_to is not None and not os.path.isdir(relative_to):
        raise InvalidInput(f"relative_to {os.fspath(relative_to)!r}: not an existing folder")
    base = os.path.abspath(relative_to if relative_to is not None else os.curdir)
    full = os.path.abspath(path)
    if full == base:
        return ""
    try:
        rel = os.path.relpath(full, base)
    except ValueError:  # pragma: no cover - another drive (Windows)
        return Path(full).as_posix()
    if rel == os.pardir or rel.startswith(os.pardir + os.sep):
        return Path(full).as_posix()
    return Path(rel).as_posix()


def _scope(root: str | os.PathLike[str], prefix: str, relative_to: str | os.PathLike[str] | None) -> str:
    name = source_name(root, relative_to=relative_to)
    return prefix + (name.rstrip("/") + "/" if name else "")


# ----------------------------------------------------------------------------- sync


def _in_scope(source: str, scope: str, inc: Patterns, exc: Patterns, recursive: bool) -> bool:
    """Whether a stored file source belongs to a sync of ``scope`` with these patterns."""
    if not source.startswith(scope):
        return False
    rel = source[len(scope):]
    if not rel or (not recursive and "/" in rel):
        return False
    if inc and not inc.test(rel):
        return False
    return not exc.test(rel)


def plan_sync(db: Database, root: str | os.PathLike[str], *, source_prefix: str = "",
              include: Sequence[str] | None = None, exclude: Sequence[str] | None = None,
              glob: str | None = None, recursive: bool = True, probe: bool = False,
              relative_to: str | os.PathLike[str] | None = None, acl: Sequence[str] | None = None,
              progress: Progress | None = None) -> SyncPlan:
    """Compare the folder ``root`` with the documents stored under its sources (see the module docs).

    ``include``/``exclude``: gitignore-style patterns relative to ``root``
    (``glob``, deprecated, is one more include pattern). Reads nothing but
    ``stat`` for files whose size and mtime are unchanged. ``probe=True``
    also loads the added and changed files (without writing) so that files
    that would fail are listed in ``failed`` (for dry runs). ``acl`` is
    kept in the plan for :func:`apply_sync`. ``progress`` is called with 1
    per file examined.
    """
    rootp = Path(root)
    if not rootp.is_dir():
        raise InvalidInput(f"{rootp}: not a folder")
    if not isinstance(source_prefix, str):
        raise InvalidInput("source_prefix must be a string")
    labels = _check_acl(acl)
    inc, exc = _patterns(include, exclude, glob)
    scope = _scope(rootp, source_prefix, relative_to)
    found = walk.walk(rootp, recursive=recursive, include=inc, exclude=exc)
    files = {scope + rel: path for path, rel in found.files}
    pattern = escape_glob(scope) + "*" if scope else None
    stored: dict[str, Mapping[str, Any]] = {}  # file source -> metadata of one of its documents
    groups: dict[str, list[str]] = {}  # file source -> its stored document sources
    relabel: set[str] = set()  # file sources whose stored labels are not the acl= given
    for doc in db.documents(pattern, principals=ALL):  # sync mirrors every document, whoever may read it
        key = doc.metadata.get(SYNC_FILE)
        # a record of a JSON Lines file (source "<file>#<record>") is grouped with its file; any
        # other document is its own (a "sync_file" a file's front matter set grouped it elsewhere)
        key = key if isinstance(key, str) and key and doc.source.startswith(key + "#") else doc.source
        if _in_scope(key, scope, inc, exc, recursive):
            stored.setdefault(key, doc.metadata)
            groups.setdefault(key, []).append(doc.source)
            if labels is not None and doc.acl != labels:
                relabel.add(key)
    added, changed, unchanged = [], [], []
    failed: list[FileFailure] = []
    skipped: list[Skipped] = list(found.skipped)
    paths: dict[str, str] = {}
    ids = found.identities
    for source in sorted(files):
        path = files[source]
        meta = stored.get(source)
        try:
            if meta is None:
                added.append(source)
                paths[source] = path
            elif source not in relabel and (_same_stat(meta, os.stat(path))
                                            or file_sha256(path, ids.get(path)) == meta.get("content_hash")):
                unchanged.append(source)
            else:
                changed.append(source)
                paths[source] = path
        except walk.FileChanged as e:
            skipped.append(Skipped(path, e.reason))
        except (OSError, LoaderError) as e:
            failed.append(FileFailure(source, path, f"{path}: cannot read: {_error_text(e)}"))
        if progress is not None:
            progress(1)
    # a file under a folder the walk could not list, or one it listed but could not stat, is
    # unknown, not gone: kept
    hidden = tuple(scope + rel for rel in found.unreadable if not rel or rel.endswith("/"))
    kept = {scope + rel for rel in found.unreadable if rel and not rel.endswith("/")}
    deleted = sorted(s for s in stored if s not in files and s not in kept
                     and not (hidden and s.startswith(hidden)))
    if probe:
        ok: set[str] = set()
        for source in added + changed:
            try:
                _file_documents(paths[source], source, labels, check=True, identity=ids.get(paths[source]))
                ok.add(source)
            except walk.FileChanged as e:
                skipped.append(Skipped(paths[source], e.reason))
            except _ContentSkip as e:
                skipped.append(Skipped(paths[source], e.reason))
            except (RagdbError, OSError) as e:
                failed.append(FileFailure(source, paths[source], _failure_text(paths[source], e)))
        added = [s for s in added if s in ok]
        changed = [s for s in changed if s in ok]
    return SyncPlan(root=os.fspath(rootp), prefix=scope, added=tuple(added), changed=tuple(changed),
                    deleted=tuple(deleted), unchanged=tuple(unchanged),
                    failed=tuple(sorted(failed, key=lambda f: f.source)), skipped=tuple(skipped),
                    unmatched=_unmatched(inc, exc), paths=paths,
                    stored={k: tuple(v) for k, v in groups.items()}, acl=labels,
                    identities={p: ids[p] for p in paths.values() if p in ids})


def _failure_text(path: str, err: BaseException) -> str:
    text = _error_text(err)
    return text if path in text else f"{path}: {text}"


def apply_sync(db: Database, plan: SyncPlan, *, strict: bool = False, batch_size: int = 200,
               progress: Progress | None = None) -> SyncReport:
    """Carry out ``plan``: load and add the added and changed files, delete the vanished sources.

    One transaction. A file that fails to load is left out and listed in
    ``failed`` (its stored version, if any, is kept); ``strict=True`` raises
    :class:`~ragdb.errors.LoaderError` instead, with nothing written, and so
    does a plan that already lists failures. A file whose content is binary
    or a minified bundle is listed in ``skipped`` (a stored version is kept
    too); that is not a failure. ``progress`` is called with 1 per file
    loaded or source deleted.
    """
    if strict and plan.failed:
        raise LoaderError(plan.failed[0].error)
    failed: list[FileFailure] = list(plan.failed)
    skipped: list[Skipped] = list(plan.skipped)
    written: set[str] = set()
    stale: list[str] = []  # stored documents of a changed file that its new content no longer holds
    counts = {"documents": 0, "removed": 0, "reused": 0}

    def records() -> Iterator[LoadedDocument]:
        for source in plan.added + plan.changed:
            path = plan.paths[source]
            try:
                docs = _file_documents(path, source, plan.acl, check=True, identity=plan.identities.get(path))
            except walk.FileChanged as e:
                skipped.append(Skipped(path, e.reason))
            except _ContentSkip as e:
                skipped.append(Skipped(path, e.reason))
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
                      documents=counts["documents"], removed=counts["removed"], reused=counts["reused"],
                      skipped=tuple(skipped), unmatched=plan.unmatched)


def sync_folder(db: Database, root: str | os.PathLike[str], *, source_prefix: str = "",
                include: Sequence[str] | None = None, exclude: Sequence[str] | None = None,
                glob: str | None = None, recursive: bool = True, dry_run: bool = False, strict: bool = False,
                relative_to: str | os.PathLike[str] | None = None, acl: Sequence[str] | None = None,
                progress: Progress | None = None) -> SyncReport:
    """Make the documents under ``root``'s sources mirror the folder ``root`` (see the module docs).

    ``dry_run=True`` writes nothing and reports what would change (loading
    the added and changed files to find those that would fail). ``acl``
    sets the access labels of every document written (``[ragdb.PUBLIC]``:
    visible to everyone), overriding the files' own.
    """
    plan = plan_sync(db, root, source_prefix=source_prefix, include=include, exclude=exclude, glob=glob,
                     recursive=recursive, probe=dry_run, relative_to=relative_to, acl=acl)
    if dry_run:
        if strict and plan.failed:
            raise LoaderError(plan.failed[0].error)
        return plan.dry_run()
    return apply_sync(db, plan, strict=strict, progress=progress)


# ----------------------------------------------------------------------------- add


def select_paths(inputs: Sequence[str | os.PathLike[str]], *, recursive: bool = True,
                 include: Sequence[str] | None = None, exclude: Sequence[str] | None = None,
                 glob: str | None = None, source_prefix: str = "",
                 relative_to: str | os.PathLike[str] | None = None) -> Selection:
    """The files ``inputs`` name (files, folders, ``-`` for standard input), with their sources.

    A file named in ``inputs`` is taken as it is; a folder's files are
    chosen by :func:`ragdb.files.walk.walk` with ``include``/``exclude``
    (relative to that folder; ``glob``, deprecated, is one more include).
    Sources: ``source_prefix`` + :func:`source_name`. Raises
    :class:`~ragdb.errors.InvalidInput` for a path that does not exist.
    """
    if isinstance(inputs, (str, os.PathLike)):
        inputs = [inputs]
    if not isinstance(source_prefix, str):
        raise InvalidInput("source_prefix must be a string")
    inc, exc = _patterns(include, exclude, glob)
    items: list[tuple[str, str, bool]] = []
    skipped: list[Skipped] = []
    identities: dict[str, walk.FileIdentity] = {}
    seen: set[str] = set()
    for item in inputs:
        if not isinstance(item, (str, os.PathLike)):
            raise InvalidInput(f"inputs must be paths, got {item!r}")
        where = os.fspath(item)
        if where == STDIN:
            items.append((STDIN, source_prefix + "stdin", True))
            continue
        p = Path(where)
        if p.is_dir():
            found = walk.walk(p, recursive=recursive, include=inc, exclude=exc)
            scope = _scope(p, source_prefix, relative_to)
            skipped.extend(found.skipped)
            identities.update(found.identities)
            for path, rel in found.files:
                source = scope + rel
                if source not in seen:
                    seen.add(source)
                    items.append((path, source, False))
        elif p.exists():
            source = source_prefix + source_name(p, relative_to=relative_to)
            if source not in seen:
                seen.add(source)
                items.append((where, source, True))
        else:
            raise InvalidInput(f"{where}: no such file or folder")
    return Selection(tuple(items), tuple(skipped), _unmatched(inc, exc), identities)


def expand_paths(inputs: Sequence[str], *, recursive: bool = True, glob: str | None = None,
                 source_prefix: str = "", include: Sequence[str] | None = None,
                 exclude: Sequence[str] | None = None,
                 relative_to: str | os.PathLike[str] | None = None) -> list[tuple[str, str]]:
    """(path, source) of every file :func:`select_paths` selects."""
    sel = select_paths(inputs, recursive=recursive, include=include, exclude=exclude, glob=glob,
                       source_prefix=source_prefix, relative_to=relative_to)
    return [(path, source) for path, source, _ in sel.items]


def add_paths(db: Database, inputs: Sequence[str | os.PathLike[str]] | Selection, *, recursive: bool = True,
              include: Sequence[str] | None = None, exclude: Sequence[str] | None = None,
              glob: str | None = None, source_prefix: str = "", source: str | None = None,
              version: str | None = None, metadata: Mapping[str, Any] | None = None,
              acl: Sequence[str] | None = None, relative_to: str | os.PathLike[str] | None = None,
              stdin: bytes | None = None, stdin_kind: str | None = None, strict: bool = False,
              batch_size: int = 200, progress: Progress | None = None) -> IngestReport:
    """Load files, folders' files and standard input and add them, in one transaction.

    ``inputs``: paths (``-`` stands for ``stdin``, bytes the caller read,
    loaded as ``stdin_kind``, e.g. ``"md"``; default: guessed), or a
    :class:`Selection` from :func:`select_paths` (then the selection
    arguments are not used). Sources and the files of folders: see
    :func:`select_paths`. ``source`` names the document when there is
    exactly one input file; standard input without it is named by its
    content (:func:`stdin_source`). ``version`` and ``metadata`` are set on every
    document, ``acl`` (labels; ``[ragdb.PUBLIC]`` for everyone) too,
    overriding the files' own. Files that fail to load are listed in
    ``failed`` and left out, unless ``strict=True``: then the first failure
    raises :class:`~ragdb.errors.LoaderError` and nothing is written.
    ``progress`` is called with 1 per file.
    """
    labels = _check_acl(acl)
    if isinstance(inputs, Selection):
        sel = inputs
    else:
        sel = select_paths(inputs, recursive=recursive, include=include, exclude=exclude, glob=glob,
                           source_prefix=source_prefix, relative_to=relative_to)
    items = list(sel.items)
    if source is not None:
        if not isinstance(source, str) or not source:
            raise InvalidInput(f"source must be a non-empty string, got {source!r}")
        if len(items) != 1:
            raise InvalidInput(f"source {source!r} names one document, but the inputs hold {len(items)} files")
        items = [(items[0][0], source, items[0][2])]
    extra: dict[str, Any] = dict(metadata or {})
    if version is not None:
        extra["version"] = version
    failed: list[FileFailure] = []
    skipped: list[Skipped] = list(sel.skipped)
    groups: dict[str, set[str]] = {}  # file source -> its record sources (JSON Lines files)

    def records() -> Iterator[LoadedDocument]:
        for path, src, explicit in items:
            try:
                if path == STDIN:
                    if stdin is None:
                        raise InvalidInput("-: no standard input given")
                    if source is None:  # named by its content: another text is another document
                        src = stdin_source(stdin, source_prefix)
                    docs = loaders.load_bytes(stdin, source=src, kind=stdin_kind)
                    if not docs:
                        raise LoaderError("-: no text found")
                    for d in docs:
                        _check_loaded(d, "-")
                    docs = [d if labels is None else dataclasses.replace(d, acl=labels) for d in docs]
                    if source_prefix:  # JSON Lines records name their own sources
                        docs = [d if d.source == src else dataclasses.replace(d, source=source_prefix + d.source)
                                for d in docs]
                else:
                    docs = _file_documents(path, src, labels, check=not explicit,
                                           identity=None if explicit else sel.identities.get(path))
                    if any(d.source != src for d in docs):
                        groups[src] = {d.source for d in docs}
                    docs = [_as_stored_if_touched(db, d) for d in docs]
            except walk.FileChanged as e:
                skipped.append(Skipped(path, e.reason))
            except _ContentSkip as e:
                skipped.append(Skipped(path, e.reason))
            except (RagdbError, OSError) as e:
                where = "-" if path == STDIN else path
                # stdin's own name (stdin-HASH) holds a "-": say "-:" first all the same
                text = _failure_text(where, e) if path != STDIN else f"-: {_error_text(e)}"
                if strict:
                    raise LoaderError(text) from None
                failed.append(FileFailure(src, where, text))
            else:
                for d in docs:
                    yield _with_extra(d, extra)
            if progress is not None:
                progress(1)

    removed = 0
    with transaction(db):
        report = db.add_many(records(), batch_size=batch_size)
        for src, new in groups.items():  # records gone from a JSON Lines file go with it
            for doc in db.documents(escape_glob(src) + "#*", principals=ALL):
                if doc.metadata.get(SYNC_FILE) == src and doc.source not in new:
                    removed += db.delete(source=doc.source)
    added = tuple(c.document.source for c in report.changes if c.status != "unchanged")
    unchanged = tuple(c.document.source for c in report.changes if c.status == "unchanged")
    replaced = tuple(c.document.source for c in report.changes if c.status == "replaced")
    return IngestReport(added=added, unchanged=unchanged, failed=tuple(failed), documents=len(added),
                        skipped=tuple(skipped), unmatched=sel.unmatched, removed=removed, reused=report.reused,
                        replaced=replaced)


def stdin_source(data: bytes, source_prefix: str = "") -> str:
    """The source of standard input added without one: ``stdin-`` and the first 12 hex digits of
    the SHA-256 of its bytes (after ``source_prefix``). The same text added again is unchanged;
    another text is another document, never a replacement of the first."""
    return f"{source_prefix}stdin-{hashlib.sha256(data).hexdigest()[:12]}"
