"""The SQLite store, assembled from its sections, one module each:

=====================  ==============================================================
:mod:`.base`           what every section shares; the SQL dialect's pieces (filters)
:mod:`.connection`     opening, migrations, transactions, collections, settings, stats
:mod:`.documents`      documents and chunks: writes, listings, the chunk table, hit rows
:mod:`.metadata`       the filter index (``doc_meta``, ``doc_acl``), filtered reads, facets
:mod:`.lexical`        vocabulary, postings segments, the chunk change log, reindex
:mod:`.maintenance`    ``check()``'s reads, ANALYZE/VACUUM, copying between databases
:mod:`.vectors`        the vector tables
=====================  ==============================================================

:class:`ragdb.storage.postgres.PgStore` is the same class with PostgreSQL's overrides,
in the same sections.

Every value is a bound parameter; the only identifiers in statements are
constants written here.
"""

from __future__ import annotations

import sqlite3
from typing import cast

from ragdb.storage.base import WHOLE_CHUNK, StoreBase, batches, translate
from ragdb.storage.collections import CollectionConnection
from ragdb.storage.connection import (MIGRATION_SET, PAGE_SIZE, ConnectionSQL, build_migrations, held_open,
                                      migration_files, migration_state, migrations_dir)
from ragdb.storage.documents import DocumentSQL
from ragdb.storage.lexical import LexicalSQL
from ragdb.storage.maintenance import COPY_COLUMNS, COPY_ORDER, COPY_TABLES, MaintenanceSQL, copy_columns
from ragdb.storage.metadata import FilterSQL
from ragdb.storage.vectors import VectorSQL

__all__ = ["COPY_COLUMNS", "COPY_ORDER", "COPY_TABLES", "MIGRATION_SET", "PAGE_SIZE", "WHOLE_CHUNK", "Store",
           "StoreBase", "batches", "build_migrations", "copy_columns", "held_open", "migration_files",
           "migration_state", "migrations_dir", "translate"]


class Store(ConnectionSQL, DocumentSQL, FilterSQL, LexicalSQL, MaintenanceSQL, VectorSQL):
    """One SQLite connection with ragdb's schema, plus the statements ragdb runs.

    The connection runs in autocommit mode; :meth:`read` and :meth:`write`
    open explicit transactions. Writes use ``BEGIN IMMEDIATE``, not
    sqlite-utils' ``atomic()`` (a deferred ``BEGIN``): a deferred transaction
    that first reads and then writes fails with SQLITE_BUSY without waiting
    when another process committed in between, and the busy timeout cannot
    help. Taking the write lock up front makes a second writer wait instead.

    Each base class is a section, in its own module (see the module docstring); this
    class adds what makes a store of another collection on the same connection.
    """

    def view(self, collection_id: int, name: str, *, owner: bool = False) -> Store:
        """A store of collection ``collection_id`` on this store's connection (same
        transactions and lock). ``owner``: closing it closes the connection (this
        store then no longer does)."""
        view = object.__new__(Store)
        view.path = self.path
        view.lock = self.lock
        view.immutable = self.immutable
        view.readonly = self.readonly
        view.shared = self.shared
        view.collection_id = collection_id
        view.collection = name
        raw = self.shared.raw
        view.conn = raw if collection_id == 0 else cast(sqlite3.Connection, CollectionConnection(raw, collection_id))
        view.owner = owner
        view.file_key = None
        if owner:
            self.owner = False
            view.file_key, self.file_key = self.file_key, None
        return view
