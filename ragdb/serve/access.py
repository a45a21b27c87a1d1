"""What a server's writer may touch, shared by ``ragdb serve`` and ``ragdb mcp``.

A writer (an HTTP token allowed to write, or an MCP server started with
``--allow-writes``) reads as its principals and writes within a
:class:`WriteScope`: the access labels a document it writes may carry, whether
it may write public documents (no labels, or :data:`ragdb.PUBLIC` among them),
and optionally the source prefixes it may write under. Every write goes through
:func:`check_write` inside the write's transaction, through the public library
API only: the document it would replace or delete is read as the writer (one it
cannot see is "not found", exactly like one that does not exist), and its
labels, and the labels it would get, must lie within the scope.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Sequence
from typing import Any

import ragdb
from ragdb.errors import DocumentNotFound, InvalidInput, WriteForbidden

__all__ = ["WriteScope", "WriteForbidden", "FULL_SCOPE", "check_write", "visible_or_missing", "scope_for",
           "client_message"]


@dataclasses.dataclass(frozen=True)
class WriteScope:
    """What a writer may write: documents labelled only with ``labels`` (:data:`ragdb.ALL`:
    any label), public ones (no labels, or ``"*"``) only with ``public``, and with
    ``sources`` given, only sources starting with one of those prefixes."""

    labels: Any = ()
    public: bool = False
    sources: tuple[str, ...] = ()

    @property
    def unbounded(self) -> bool:
        return self.labels is ragdb.ALL and self.public and not self.sources

    def describe(self) -> str:
        labels = "any label" if self.labels is ragdb.ALL else \
            ("labels " + ", ".join(map(repr, self.labels)) if self.labels else "no label")
        parts = [labels, "public documents" if self.public else "no public document"]
        if self.sources:
            parts.append("sources under " + ", ".join(map(repr, self.sources)))
        return "; ".join(parts)

    def allows_source(self, source: str) -> bool:
        return not self.sources or any(source.startswith(p) for p in self.sources)

    def allows_labels(self, acl: Sequence[str]) -> bool:
        labels = [a for a in acl if a != ragdb.PUBLIC]
        if (not labels or len(labels) < len(acl)) and not self.public:
            return False  # public: unlabelled, or "*" among its labels
        return self.labels is ragdb.ALL or all(a in self.labels for a in labels)


#: An administrator's scope: anything.
FULL_SCOPE = WriteScope(labels=ragdb.ALL, public=True)


def scope_for(principals: Any) -> WriteScope:
    """The default scope of a writer reading as ``principals``: the full view writes anything;
    an anonymous writer (None) public documents only; else documents labelled with its own labels."""
    if principals is ragdb.ALL:
        return FULL_SCOPE
    if not principals:
        return WriteScope(labels=(), public=True)
    return WriteScope(labels=tuple(principals), public=False)


def visible_or_missing(db: ragdb.Database, principals: Any, doc_id: int | None, source: str | None
                       ) -> ragdb.Document | None:
    """The document a write would touch (by id, or the latest version of ``source``) as the
    writer sees it; None when there is none *or the writer cannot see it*: the two are never
    told apart. (A missing or hidden id raises the library's :class:`DocumentNotFound`.)"""
    try:
        return db.get(doc_id, source=source, with_text=False, principals=principals)
    except DocumentNotFound:
        if doc_id is not None:
            raise
        return None


def check_write(db: ragdb.Database, principals: Any, scope: WriteScope, *, holder: str,
                doc_id: int | None = None, source: str | None = None, acl: Sequence[str] | None = None,
                new: bool = False) -> ragdb.Document | None:
    """Inside a write's transaction: refuse a write outside ``scope`` (:class:`WriteForbidden`)
    or of a document ``principals`` cannot see (:class:`DocumentNotFound`, as if missing).

    ``new``: an add (or replace) of ``source`` with labels ``acl`` (None: a replace keeps the
    replaced version's labels, a new document has none). Else an update or delete of ``doc_id``
    or ``source`` (``acl``: the labels an update sets). Returns the visible document touched
    (None: a new source, or for a delete by source, nothing visible to delete)."""
    if acl is not None and (isinstance(acl, str) or not isinstance(acl, Sequence)
                            or not all(isinstance(a, str) for a in acl)):
        raise InvalidInput(f"acl must be a list of labels, got {acl!r:.80}")
    current = visible_or_missing(db, principals, doc_id, source)
    if current is None and new and source is not None and principals is not ragdb.ALL:
        # a source held by a document this writer cannot see: not replaced (nor said to exist)
        try:
            db.get(source=source, with_text=False, principals=ragdb.ALL)
        except DocumentNotFound:
            pass
        else:
            raise DocumentNotFound(f"no document with source {source!r} visible to {holder}; not replacing it")
    if scope.unbounded:
        return current
    what = source if source is not None else (current.source if current is not None else None)
    if what is not None and not scope.allows_source(what):
        raise WriteForbidden(f"{holder} may not write source {what!r} (it writes {scope.describe()})")
    if current is not None and not scope.allows_labels(current.acl):
        raise WriteForbidden(f"{holder} may not change {current.source!r}: its labels "
                             f"{list(current.acl)} are outside what it writes ({scope.describe()})")
    if new or acl is not None:
        labels = acl if acl is not None else (current.acl if current is not None else ())
        if not scope.allows_labels(labels):
            raise WriteForbidden(f"{holder} may not write a document labelled {list(labels)} "
                                 f"(it writes {scope.describe()}; give acl)")
    return current


#: A database URL (PostgreSQL's carry a user, a host, maybe a password) or a file URL.
_URL = re.compile(r"\b(?:postgres(?:ql)?|sqlite|file)://[^\s'\"]*", re.IGNORECASE)
#: An absolute path of at least two parts (POSIX), or a Windows drive path.
_PATH = re.compile(r"(?<![\w.:/-])(?:/[^\s/'\"():,;]+){2,}/?|\b[A-Za-z]:\\[^\s'\"]+")


def client_message(error: BaseException, *, database: str | None = None) -> str:
    """``error``'s message as a client of a server may read it, on one line: without the
    database's URL or path (``<database>``) nor any other path of the host (``<path>``).
    A server's clients need not know where the data lives; a leaked path or URL (with a
    PostgreSQL user and host) helps an attacker more than it helps them."""
    text = " ".join(str(error).split()) or type(error).__name__
    if database:
        forms = {database, os.path.abspath(database), os.path.realpath(database)} if "://" not in database \
            else {database}
        for form in sorted(forms, key=len, reverse=True):
            text = text.replace(form, "<database>")
    text = _URL.sub("<database>", text)
    return _PATH.sub("<path>", text)
