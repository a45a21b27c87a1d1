"""ragdb: a persistent, embedded retrieval database for RAG, on SQLite.

>>> import ragdb
>>> with ragdb.open(":memory:") as db:
...     _ = db.add("RAG retrieves evidence before generating.", source="notes/rag.md")
...     [h.source for h in db.search("what does RAG retrieve?")]
['notes/rag.md']
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ragdb import compat
from ragdb.errors import RagdbError

if TYPE_CHECKING:  # the names below are imported on first use (``__getattr__``): ``ragdb --help`` stays fast
    from ragdb import options
    from ragdb.client import Client, connect
    from ragdb.database import Database
    from ragdb.files.transfer import CopyReport, copy_database
    from ragdb.options import ALL, PUBLIC, Restrictions, SearchOptions
    from ragdb.text.analysis import Analyzer
    from ragdb.records import (AddReport, Change, Changes, CollectionInfo, Document, Facets, ReindexReport, Stats,
                               VectorInfo)
    from ragdb.types import Hit, QueryPlan

compat.install()  # old module paths (ragdb.embeddings, ragdb.server, ...) keep importing

#: public name -> the module that defines it; imported on first access (PEP 562), so that
#: importing ``ragdb`` (every CLI start does) costs no numpy, no SQLite schema code, no models
_LAZY = {
    "Database": "ragdb.database",
    "connect": "ragdb.client", "Client": "ragdb.client",
    "copy_database": "ragdb.files.transfer", "CopyReport": "ragdb.files.transfer",
    "ALL": "ragdb.options", "PUBLIC": "ragdb.options", "Restrictions": "ragdb.options",
    "SearchOptions": "ragdb.options",
    "Analyzer": "ragdb.text.analysis",
    "Hit": "ragdb.types", "QueryPlan": "ragdb.types",
    **dict.fromkeys(("AddReport", "Change", "Changes", "CollectionInfo", "Document", "Facets", "ReindexReport", "Stats",
                     "VectorInfo"), "ragdb.records"),
}


def __getattr__(name: str) -> Any:
    if name == "options":
        return importlib.import_module("ragdb.options")
    where = _LAZY.get(name)
    if where is None:
        raise AttributeError(f"module 'ragdb' has no attribute {name!r}")
    value = getattr(importlib.import_module(where), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | {"options"})


__version__ = "0.1.0"
__all__ = ["open", "connect", "Client", "copy_database", "Database", "Hit", "Document", "Stats", "AddReport", "Change", "Changes",
           "CollectionInfo",
           "Facets", "QueryPlan", "CopyReport", "VectorInfo", "ReindexReport", "SearchOptions",
           "Restrictions", "ALL", "PUBLIC", "Analyzer", "RagdbError", "options", "__version__"]


def open(path: str | os.PathLike[str] = ":memory:", *, analyzer: "str | Analyzer | Mapping[str, Any] | None" = None,
         chunker: str | None = None, keep_versions: bool | None = None,
         public_unlabeled: bool | None = None, readonly: bool = False,
         create: bool | None = None, busy_timeout: float = 30.0, embedder: Any = None,
         embed_on_add: bool = True, collection: str | None = None) -> Database:
    """Open a ragdb database file, creating it and applying pending migrations.

    ``path`` may also name a PostgreSQL database: a libpq URL (``postgresql://app@db/kb``)
    or connection string (``service=kb``); the same API and results, with many writer
    processes and read replicas (``pip install 'ragdb[postgres]'``; docs/postgresql.md).

    ``analyzer``: ``"default"`` (English stemming + CJK unigrams/bigrams, technical
    words such as ``c++`` and ``node.js`` kept: analyzer version 2),
    ``"jieba"`` or ``"simple"``; stored at creation, and opening with a
    different one raises :class:`ragdb.errors.AnalyzerMismatch` (a database built
    with version 1 keeps it; :meth:`Database.reindex` rebuilds it with another).
    ``chunker``: the default chunker spec for adds (``"recursive"``,
    ``"window:size=200,overlap=40"``, ``"paragraph"``, ``"none"``).
    ``keep_versions``: keep replaced versions of a source for
    ``versions="all"`` and ``as_of`` searches (default: replace).
    ``public_unlabeled``: whether chunks without access labels are public,
    visible to every caller (default for a new database: yes; off, a
    caller sees only chunks labelled for one of its ``principals`` or
    :data:`PUBLIC`, and ``principals=ALL`` everything). An access setting:
    stored when the file is created; on an existing database a value other than
    the stored one raises :class:`~ragdb.errors.InvalidInput` (opening never
    changes it: :meth:`Database.set_public_unlabeled` or ``ragdb config`` does).
    ``chunker`` and ``keep_versions`` given on an existing database do update
    the stored settings.
    ``readonly``: open without writing anything (no migrations).
    ``create``: ``None`` (default) creates the file if it does not exist, and
    an existing empty (zero-byte) file is :class:`~ragdb.errors.NotADatabase`;
    ``True`` also makes an existing empty file a new database; ``False``
    requires an existing database.
    ``busy_timeout``: seconds (0 to about 24.8 days) to wait for another
    process's write lock.
    ``embedder``: an :class:`ragdb.models.embeddings.Embedder` or a spec such as
    ``"wordllama"`` (offline), ``"e5"``, ``"openai:MODEL"``: new chunks get
    vectors on add, and ``scorer="vector"``/``"hybrid"`` searches use it. A
    database holding vectors of another model refuses it.
    ``embed_on_add=False``: adds do not embed (the embedder serves queries and
    :meth:`Database.embed`); new chunks stay pending until ``db.embed()``. Either
    way, a new chunk whose text already has a stored vector (an unchanged chunk of
    a replaced document) gets that vector in the write, without embedding.
    ``collection``: open this collection of the file (a knowledge base of its own:
    documents, statistics, analyzer, chunker, embedding model; see
    :meth:`Database.collection`) instead of the default one (``"default"``, which
    holds what a file made before collections holds). A missing collection is
    created with the settings given, unless ``create=False`` or ``readonly``
    (then :class:`~ragdb.errors.CollectionNotFound`).
    ``":memory:"`` opens a private in-memory database.
    """
    from ragdb.database import open_database

    return open_database(path, analyzer=analyzer, chunker=chunker, keep_versions=keep_versions,
                         public_unlabeled=public_unlabeled, readonly=readonly, create=create,
                         busy_timeout=busy_timeout, embedder=embedder, embed_on_add=embed_on_add,
                         collection=collection)
