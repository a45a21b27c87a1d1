"""Collections: several knowledge bases in one database file.

Each collection has its own copy of every table of the schema (settings,
statistics, documents, chunks, vocabulary, postings, filter index, vectors),
so its statistics (N, df, average length), analyzer, chunker and embedding
model are its own, and a search in it reads exactly what a separate database
file of its documents would hold. The default collection (id 0) owns the
tables under their plain names (``documents``); collection *n* owns
``c<n>_documents`` and so on. Table names come from the collection's integer
id, never from its (user-chosen) name, which is only a value in the
``collections`` table.

Why one table set per collection rather than a collection column on every
table: every statement, primary key and index of the engine stays as it is
(the default collection runs exactly the statements it ran before
collections existed, at the same speed), and dropping a collection is
dropping its tables. The cost is that the SQL of a collection other than the
default is rewritten once per distinct statement (:func:`rename`, cached by
:class:`CollectionConnection`).

Every numbered migration is written against the plain names; its statements
that touch per-collection objects are applied to each collection too
(``ragdb.storage.store.build_migrations``), and a new collection replays them
all (:func:`collection_ddl`), so every collection always has the schema of the
default one (a test compares them).
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from ragdb.patterns import LazyPattern

#: Tables every collection has, parents before the tables referring to them
#: (``dead_chunks`` existed until migration 0004; a new collection replaying the
#: migrations creates and drops it like an old file did).
TABLES = ("settings", "stats", "chunk_log", "documents", "chunks", "vocabulary", "dead_chunks", "postings",
          "doc_meta", "doc_acl", "vectors", "vector_log", "vector_stats", "chunk_state", "new_terms",
          "bulk_terms")  # keep parents first
#: Indexes and triggers on those tables (schema objects need file-wide unique names too).
OTHER_OBJECTS = ("documents_source", "documents_ts", "chunks_doc", "doc_meta_kv", "doc_meta_doc", "doc_acl_doc",
                 "chunks_delete_vectors", "vectors_text_hash", "doc_meta_num", "doc_meta_at")
#: Every per-collection schema object name; a migration adding a table, index or trigger
#: adds its name here (tests/storage/test_collections.py fails until it does).
OBJECTS = frozenset(TABLES + OTHER_OBJECTS)

DEFAULT = "default"  #: the name of collection 0, whose tables have the plain names
MAX_NAME = 128

# SQL tokens that may hold a name: comments and string literals are copied as they are,
# identifiers (bare or double-quoted) are renamed when they name a per-collection object.
_TOKEN = LazyPattern(r"""(--[^\n]*|/\*.*?\*/|'(?:[^']|'')*')|("(?:[^"]|"")*")|([A-Za-z_][A-Za-z0-9_$]*)""", re.S)


def object_name(collection_id: int, name: str) -> str:
    """The schema name of per-collection object ``name`` in collection ``collection_id``."""
    return name if collection_id == 0 else f"c{int(collection_id)}_{name}"


def rename(sql: str, collection_id: int) -> str:
    """``sql`` (written for the default collection's plain names) for collection ``collection_id``."""
    if collection_id == 0:
        return sql

    def sub(m: re.Match[str]) -> str:
        if m.group(3) is not None:
            word = m.group(3)
            return object_name(collection_id, word.lower()) if word.lower() in OBJECTS else word
        if m.group(2) is not None:
            inner = m.group(2)[1:-1].replace('""', '"')
            return f'"{object_name(collection_id, inner.lower())}"' if inner.lower() in OBJECTS else m.group(2)
        return m.group(0)

    return _TOKEN.sub(sub, sql)


def touches_collection(sql: str) -> bool:
    """Whether a migration statement names a per-collection object (else it is file-wide,
    like the ``collections`` table itself, and runs once)."""
    return any(m.group(3) is not None and m.group(3).lower() in OBJECTS
               or m.group(2) is not None and m.group(2)[1:-1].replace('""', '"').lower() in OBJECTS
               for m in _TOKEN.finditer(sql))


def collection_ddl(statements: Iterable[str], collection_id: int) -> Iterator[str]:
    """The statements that build collection ``collection_id``'s tables: every per-collection
    statement of the migrations, in order, renamed."""
    for stmt in statements:
        if touches_collection(stmt):
            yield rename(stmt, collection_id)


def drop_statements(collection_id: int) -> list[str]:
    """DROP TABLE of each of the collection's tables (their indexes and triggers go with them)."""
    if collection_id == 0:
        raise ValueError("the default collection's tables are never dropped")
    # children before parents: DROP TABLE deletes the rows first, and foreign keys are checked
    return [f"DROP TABLE IF EXISTS {object_name(collection_id, t)}" for t in reversed(TABLES)]


class CollectionConnection:
    """The database's SQLite connection as a collection other than the default sees it:
    each statement's per-collection names are renamed (once per distinct statement)."""

    __slots__ = ("raw", "collection_id", "_cache")

    def __init__(self, raw: sqlite3.Connection, collection_id: int) -> None:
        self.raw = raw
        self.collection_id = collection_id
        self._cache: dict[str, str] = {}

    def _sql(self, sql: str) -> str:
        out = self._cache.get(sql)
        if out is None:
            if len(self._cache) > 4096:  # statements with IN (?, ?, ...) lists vary in length
                self._cache.clear()
            out = self._cache[sql] = rename(sql, self.collection_id)
        return out

    def execute(self, sql: str, parameters: Sequence[Any] | dict[str, Any] = (), /) -> sqlite3.Cursor:
        return self.raw.execute(self._sql(sql), parameters)

    def executemany(self, sql: str, seq_of_parameters: Iterable[Sequence[Any]], /) -> sqlite3.Cursor:
        return self.raw.executemany(self._sql(sql), seq_of_parameters)

    @property
    def in_transaction(self) -> bool:
        return self.raw.in_transaction

    def close(self) -> None:
        self.raw.close()


def check_name(name: object, what: str = "collection name") -> str:
    """A valid collection name: a non-empty string of at most 128 characters, without
    control characters or surrounding whitespace (any language; it is only ever a value)."""
    from ragdb.errors import InvalidInput

    if not isinstance(name, str):
        raise InvalidInput(f"{what} must be a string, got {type(name).__name__}")
    if not name or not name.strip():
        raise InvalidInput(f"{what} must not be empty")
    if name != name.strip():
        raise InvalidInput(f"{what} {name!r} has leading or trailing whitespace")
    if len(name) > MAX_NAME:
        raise InvalidInput(f"{what} {name[:40]!r}... is longer than {MAX_NAME} characters")
    if any(ord(c) < 32 or ord(c) == 127 or 0xD800 <= ord(c) <= 0xDFFF for c in name):
        raise InvalidInput(f"{what} {name!r} contains control characters")
    return name
