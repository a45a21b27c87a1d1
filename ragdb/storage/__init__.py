"""The storage layer: every SQL statement ragdb runs is in this package.

:class:`Store` is one SQLite connection with ragdb's schema (``migrations/``),
its transactions, and the statements of the engine, assembled (:mod:`.store`) from
sections, a module each: the connection, migrations and transactions
(:mod:`.connection`), documents and chunks (:mod:`.documents`), the filter index and
filtered reads (:mod:`.metadata`), vocabulary, postings and the chunk change log
(:mod:`.lexical`), checks and copying (:mod:`.maintenance`) and dense vectors
(:mod:`.vectors`), over what they share and SQLite's dialect (:mod:`.base`).
:class:`ragdb.storage.postgres.PgStore` overrides them for PostgreSQL, section by section.
The other modules call its methods; none of them holds SQL.
"""

from __future__ import annotations

from ragdb.storage.backend import is_postgres, redact
from ragdb.storage.codec import dumps, loads, utcnow_iso
from ragdb.storage.store import (MIGRATION_SET, Store, build_migrations, held_open, migration_files, migration_state,
                                 migrations_dir)
from ragdb.storage.vectors import DTYPES, check_model_args, model_mismatch

__all__ = ["MIGRATION_SET", "DTYPES", "Store", "build_migrations", "check_model_args", "dumps", "is_postgres",
           "loads", "migration_files", "migration_state", "migrations_dir", "model_mismatch", "open_store",
           "database_state", "held_open", "redact", "utcnow_iso"]


def open_store(path: str, *, busy_timeout: float = 30.0, readonly: bool = False, create: bool = True) -> Store:
    """The store of the database ``path`` names: a PostgreSQL database for a libpq URL
    or connection string (:func:`is_postgres`; :class:`ragdb.storage.postgres.PgStore`),
    else a SQLite file (:class:`Store`). Both have the same methods and semantics."""
    if is_postgres(path):
        from ragdb.storage.postgres import PgStore

        return PgStore(path, busy_timeout=busy_timeout, readonly=readonly, create=create)
    return Store(path, busy_timeout=busy_timeout, readonly=readonly, create=create)


def database_state(path: str) -> tuple[list[tuple[str, str]], list[str]]:
    """(applied (name, when), pending names) of the migrations of the database ``path``
    names (either backend), read without writing anything."""
    if is_postgres(path):
        from ragdb.storage.postgres import pg_migration_state

        return pg_migration_state(path)
    return migration_state(path)
