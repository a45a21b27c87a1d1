"""What every section of the store shares: the connection it runs on, statements in
parameter batches, how SQLite's errors become ragdb's, and the SQL dialect's pieces.

:class:`ragdb.storage.store.Store` is assembled from sections, one module each
(:mod:`.connection`, :mod:`.documents`, :mod:`.metadata`, :mod:`.lexical`,
:mod:`.maintenance`, :mod:`.vectors`); each is a mixin over :class:`StoreBase`,
running its statements on ``self.conn`` inside the store's transactions. The
dialect's pieces here (a filter condition, the document ids of a metadata condition,
a source test, ``LIMIT``'s "no limit") are SQLite's; :class:`ragdb.storage.postgres.PgStore`
overrides them with PostgreSQL's, and the sections' statements are shared.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, overload

from ragdb.patterns import LazyPattern
from ragdb.errors import CollectionNotFound, DatabaseBusy, DatabaseCorrupt, DiskFull, RagdbError, StorageError, TextDamaged
from ragdb.storage import collections as _coll
from ragdb.storage.conditions import SQLITE, balanced, condition_sql, doc_set_sql, mentions_chunks
from ragdb.storage.textcodec import TextCodec

#: the codec of a backend that stores no compressed text: a BLOB where text belongs is damage
NO_CODEC = TextCodec(lambda dict_id: None)

PARAM_CHUNK = 900  # stay under SQLITE_MAX_VARIABLE_NUMBER on old builds


def batches(items: list[Any], size: int = PARAM_CHUNK) -> Iterator[list[Any]]:
    """``items`` in lists of at most ``size``: the bound parameters of one statement."""
    for i in range(0, len(items), size):
        yield items[i:i + size]


# A chunk that is its whole document (no text copy, start 0) with no metadata of its own.
WHOLE_CHUNK = "(text IS NULL AND start = 0 AND ordinal = 0 AND metadata = '{}')"
#: The columns of ``chunk_table_blocks``: a chunk's id, its document's, and its length, whether
#: it is latest and whether it is whole (:data:`WHOLE_CHUNK`) folded into one integer
#: (length × 4 + latest × 2 + whole). The same SQL on SQLite and PostgreSQL.
CHUNK_STATE_SQL = f"id, doc_id, length * 4 + latest * 2 + CASE WHEN {WHOLE_CHUNK} THEN 1 ELSE 0 END"


_DROPPED = LazyPattern(r"no such table: (?:main\.)?c(\d+)_")


def translate(err: sqlite3.Error, path: str) -> RagdbError:
    """The :class:`RagdbError` of a SQLite error on the database ``path``."""
    msg = str(err)
    low = msg.lower()
    if _DROPPED.search(msg):
        return CollectionNotFound(f"{path}: the collection this handle reads was dropped (by this or another "
                                  f"process); open the collection again, or another one")
    if "locked" in low or "busy" in low:
        return DatabaseBusy(f"{path}: database is locked by another writer (waited for the busy timeout): {msg}")
    if "readonly" in low or "read-only" in low:
        return StorageError(f"{path}: the database is read-only: {msg}")
    if "unable to open" in low:
        return StorageError(f"{path}: cannot open the database file (no permission to read or create it "
                            f"and its -wal/-shm files, or a folder on the path is missing): {msg}")
    if "full" in low:
        return DiskFull(f"{path}: the disk is full; nothing was written: {msg}")
    if "user-defined function raised exception" in low:  # only ragdb_instr raises: a text it could not decode
        return TextDamaged(f"{path}: a stored text could not be read back (a damaged compressed text); "
                           f"`ragdb check` lists them: {msg}")
    if "not a database" in low or "malformed" in low or "encrypted" in low:
        return DatabaseCorrupt(f"{path}: the file is not a database or is corrupt (SQLite says: {msg}). "
                               f"If it was a ragdb database, restore it from a backup or an export")
    return StorageError(f"{path}: {msg}")


class StoreBase:
    """What the sections of :class:`ragdb.storage.store.Store` share: the connection and its
    lock (set when the store is opened), which collection it reads, and the SQL dialect."""

    conn: sqlite3.Connection
    path: str
    lock: threading.RLock
    readonly: bool
    immutable: bool
    owner: bool
    #: which database server holds the tables ("sqlite"; :class:`ragdb.storage.postgres.PgStore`: "postgresql")
    backend = "sqlite"
    #: the collection this store reads and writes (see :mod:`ragdb.storage.collections`)
    collection_id = 0
    collection = _coll.DEFAULT
    #: this file in the open files (:func:`ragdb.storage.connection.held_open`) while this store owns
    #: its connection (None: not a file, or not owner)
    file_key: tuple[int, int] | None = None

    # The SQL dialect's pieces (PgStore has PostgreSQL's): a filter condition, the document
    # ids of a metadata condition, a source test, and LIMIT's "no limit".
    _NO_LIMIT: int | None = -1

    @staticmethod
    def _condition(c: Any, public_unlabeled: bool, params: list[Any]) -> str:
        return condition_sql(SQLITE, c, public_unlabeled, params)

    @staticmethod
    def _doc_set(c: Any, params: list[Any]) -> str:
        return doc_set_sql(SQLITE, c, params)

    @staticmethod
    def _source_test(column: str, source: str, glob: bool) -> tuple[str, list[Any]]:
        """``column = ?``, or ``column GLOB ?`` for a pattern, with its parameters."""
        return (f"{column} GLOB ?" if glob else f"{column} = ?"), [source]

    # -- stored text -------------------------------------------------------------------------
    def text_codec(self) -> TextCodec:
        """The codec of compressed texts (SQLite's: ``ConnectionSQL``; PostgreSQL stores none)."""
        return NO_CODEC

    @overload
    def _text(self, value: str | bytes) -> str: ...
    @overload
    def _text(self, value: None) -> None: ...
    @overload
    def _text(self, value: str | bytes | None) -> str | None: ...

    def _text(self, value: str | bytes | None) -> str | None:
        """A stored text as read: TEXT as it is, a compressed BLOB decoded (a damaged one is
        :class:`ragdb.errors.TextDamaged`). Every read of ``documents.text`` or ``chunks.text``
        goes through it or :meth:`_texts`."""
        if value is None or type(value) is str:
            return value
        return self.text_codec().decode(value)

    def _texts(self, values: Sequence[str | bytes | None]) -> list[str | None]:
        """:meth:`_text` of each of ``values``, in order, in one call (:meth:`TextCodec.decode_many`)."""
        return self.text_codec().decode_many(values)

    def pack_texts(self, texts: Sequence[str | None], doc_ids: Sequence[int] = ()) -> list[str | bytes | None]:
        """What to store for each of ``texts``: as they are (SQLite compresses: ``ConnectionSQL``)."""
        return list(texts)

    @contextlib.contextmanager
    def packing_ahead(self) -> Iterator[Callable[[Sequence[str]], None] | None]:
        """A bulk load's head start on the texts it stores: a function to call with the texts of
        its next batch, which a store that compresses them starts on in the background while
        the load writes the batch before (``ConnectionSQL``), or None (here: nothing to do)."""
        yield None

    def _filter_sql(self, conditions: Sequence[Any], public_unlabeled: bool, per_chunk: bool = False
                    ) -> tuple[list[str], list[Any]]:
        """WHERE terms on ``documents d`` for filter conditions (see ragdb.query.filters.Condition).

        ``per_chunk``: the statement also reads ``chunks c`` (joined to ``d``), and a
        ``contains`` condition looks at that chunk's text. Otherwise the conditions
        holding one become a single ``EXISTS`` over the document's chunks: a document
        matches when one of its chunks meets all of them.

        The SQL text is assembled from the constant fragments of :mod:`ragdb.storage.conditions`;
        every key and value is a bound parameter."""
        where: list[str] = []
        params: list[Any] = []
        chunk_terms: list[str] = []
        chunk_params: list[Any] = []
        for c in conditions:
            if not per_chunk and mentions_chunks(c):
                chunk_terms.append(self._condition(c, public_unlabeled, chunk_params))
            else:
                where.append(self._condition(c, public_unlabeled, params))
        if chunk_terms:
            where.append(f"EXISTS (SELECT 1 FROM chunks c WHERE c.doc_id = d.id AND {balanced(chunk_terms, 'AND')})")
            params += chunk_params
        if len(where) > 8:  # a filter of many keys: one balanced term (see balanced)
            where = [balanced(where, "AND")]
        return where, params
