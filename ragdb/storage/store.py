"""The SQLite store: connection, migrations, transactions, and the statements of
documents, chunks, vocabulary, postings, the change log and the filter index
(vector statements are in :mod:`ragdb.storage.vectors`, mixed into :class:`Store`).

Every value is a bound parameter; the only identifiers in statements are
constants written here.
"""

from __future__ import annotations

import contextlib
import os
import re
import sqlite3
import time
import threading
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast
from collections.abc import Iterable, Iterator, Sequence

if TYPE_CHECKING:
    import sqlite_utils

from ragdb.errors import CollectionNotFound, DatabaseBusy, DatabaseCorrupt, InvalidInput, NotADatabase, RagdbError, SchemaTooNew, StorageError
from ragdb.storage import collections as _coll
from ragdb.storage.codec import dumps, iso_instant, loads, utcnow_iso
from ragdb.storage.conditions import DOC_SETS, SQLITE, balanced, condition_sql, doc_set_sql, mentions_chunks
from ragdb.storage.collections import CollectionConnection
from ragdb.storage.vectors import VectorSQL

MIGRATION_SET = "ragdb"
_PARAM_CHUNK = 900  # stay under SQLITE_MAX_VARIABLE_NUMBER on old builds


def migrations_dir() -> Path:
    """The folder of numbered ``NNNN_name.sql`` migrations.

    In a wheel they are packaged as ``ragdb/_migrations``; in a source
    checkout (editable install) they are the top-level ``migrations/``.
    """
    packaged = resources.files("ragdb").joinpath("_migrations")
    if packaged.is_dir():
        return Path(str(packaged))
    here = Path(__file__).resolve().parent.parent.parent / "migrations"
    if here.is_dir():
        return here
    raise StorageError("ragdb's migrations are missing from the installation")  # pragma: no cover


def migration_files() -> list[Path]:
    return sorted(p for p in migrations_dir().glob("[0-9][0-9][0-9][0-9]_*.sql"))


def _split_sql(script: str) -> list[str]:
    """Split a script into statements (``executescript`` would COMMIT first,
    breaking the migration's transaction)."""
    out: list[str] = []
    buf = ""
    for line in script.splitlines(keepends=True):
        buf += line
        if sqlite3.complete_statement(buf):
            stmt = buf.strip()
            if stmt and not all(l.strip().startswith("--") or not l.strip() for l in stmt.splitlines()):
                out.append(stmt)
            buf = ""
    if buf.strip() and not all(l.strip().startswith("--") or not l.strip() for l in buf.splitlines()):
        raise StorageError(f"incomplete SQL statement in migration: {buf.strip()[:80]!r}")
    return out


def _register_functions(conn: sqlite3.Connection) -> None:
    """The SQL functions migrations call (on whatever connection applies them)."""
    conn.create_function("ragdb_iso_instant", 1, lambda v: iso_instant(v) if isinstance(v, str) else None,
                         deterministic=True)


# Page size of new files (SQLite's default is 4 KiB; a file keeps the size it was made
# with). A document row is its text plus ~200 bytes, a chunk row its forward index: rows
# of 1-2 KiB left a quarter of each 4 KiB page empty (two rows fit, a third did not).
# Measured on the realistic 100k corpus: file 369 -> 341 MB, query p50 unchanged, a
# one-document add about 5% slower (twice the bytes per page it writes to the WAL).
PAGE_SIZE = 8192


def build_migrations(stop_after: str | None = None) -> sqlite_utils.Migrations:
    """The ragdb migration set, read from the SQL files (``stop_after`` is for tests)."""
    import sqlite_utils  # imported here: see Store.db

    migrations = sqlite_utils.Migrations(MIGRATION_SET)
    for path in migration_files():
        sql = path.read_text(encoding="utf-8")

        def apply(db: sqlite_utils.Database, _sql: str = sql) -> None:
            _register_functions(db.conn)
            statements = _split_sql(_sql)
            for stmt in statements:
                db.conn.execute(stmt)
            # every collection besides the default gets the statements on its tables too
            for cid in _collection_ids(db.conn):
                for stmt in _coll.collection_ddl(statements, cid):
                    db.conn.execute(stmt)

        migrations(name=path.stem)(apply)
        if stop_after == path.stem:
            break
    return migrations


def _collection_ids(conn: sqlite3.Connection) -> list[int]:
    """Ids of the collections other than the default (none before migration 0006)."""
    if conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'collections'").fetchone() is None:
        return []
    return [int(r[0]) for r in conn.execute("SELECT id FROM collections WHERE id != 0 ORDER BY id")]


def migration_state(path: str) -> tuple[list[tuple[str, str]], list[str]]:
    """(applied (name, when), pending names) of the database file at ``path``,
    read on a read-only connection (nothing is written, nothing migrated)."""
    import sqlite_utils  # imported here: see Store.db

    uri = Path(path).resolve().as_uri() + "?mode=ro"
    try:
        conn = sqlite3.connect(uri, uri=True)
    except sqlite3.Error as e:
        raise NotADatabase(f"{path}: cannot open: {e}") from None
    try:
        sdb = sqlite_utils.Database(conn)
        migrations = build_migrations()
        try:
            applied = [(m.name, str(m.applied_at)) for m in migrations.applied(sdb)]
            pending = [m.name for m in migrations.pending(sdb)]
            tables = sdb.table_names()
        except sqlite3.DatabaseError as e:
            raise _translate(e, path) from None
        if tables and not applied:
            raise NotADatabase(f"{path}: is a SQLite database but not a ragdb database")
        return applied, pending
    finally:
        conn.close()


#: The per-collection tables a copy between databases moves (``ragdb.files.transfer.copy_database``),
#: parents first, with their columns; every row is copied as it is, ids and sequence numbers too.
COPY_TABLES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("settings", ("key", "value")),
    ("stats", ("id", "generation", "n_docs", "n_chunks", "total_length", "flushed_upto", "vocab_epoch",
               "next_doc_id", "next_chunk_id", "flush_count")),
    ("vector_stats", ("id", "epoch", "embedded_upto")),
    ("documents", ("id", "source", "version", "timestamp", "ts", "valid_to", "latest", "content_hash", "metadata",
                   "acl", "chunker", "added_at", "title", "text")),
    ("chunks", ("id", "doc_id", "ordinal", "start", "end", "length", "latest", "metadata", "terms", "tfs", "text")),
    ("vocabulary", ("id", "term", "df")),
    ("postings", ("term_id", "segment", "n", "chunk_ids", "tfs")),
    ("chunk_log", ("seq", "chunk_id", "state", "terms")),
    ("doc_meta", ("doc_id", "key", "value", "num", "at")),
    ("doc_acl", ("doc_id", "label")),
    ("vectors", ("chunk_id", "vector", "text_hash")),
    ("vector_log", ("seq", "chunk_id")),
)
#: The order rows of each copied table are read in (a unique key where the table has one).
COPY_ORDER: dict[str, tuple[str, ...]] = {
    "settings": ("key",), "stats": ("id",), "vector_stats": ("id",), "documents": ("id",), "chunks": ("id",),
    "vocabulary": ("id",), "postings": ("term_id", "segment"), "chunk_log": ("seq",),
    "doc_meta": ("doc_id", "key", "at", "num"), "doc_acl": ("doc_id", "label"), "vectors": ("chunk_id",),
    "vector_log": ("seq",),
}
COPY_COLUMNS = dict(COPY_TABLES)


def copy_columns(table: str, columns: Sequence[str]) -> str:
    """The column list of a copied table: only the constant names of COPY_TABLES."""
    if tuple(columns) != COPY_COLUMNS.get(table):
        raise ValueError(f"not a copied table and its columns: {table} {columns}")
    return ", ".join('"end"' if c == "end" else c for c in columns)


# A chunk that is its whole document (no text copy, start 0) with no metadata of its own.
WHOLE_CHUNK = "(text IS NULL AND start = 0 AND ordinal = 0 AND metadata = '{}')"


_DROPPED = re.compile(r"no such table: (?:main\.)?c(\d+)_")


def _translate(err: sqlite3.Error, path: str) -> RagdbError:
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
        return StorageError(f"{path}: the disk is full; nothing was written: {msg}")
    if "not a database" in low or "malformed" in low or "encrypted" in low:
        return DatabaseCorrupt(f"{path}: the file is not a database or is corrupt (SQLite says: {msg}). "
                               f"If it was a ragdb database, restore it from a backup or an export")
    return StorageError(f"{path}: {msg}")


class _OpenFiles:
    """The database files this process holds open (by device and inode), with how many stores.

    Why: closing *any* file descriptor of a file drops every POSIX advisory lock this process
    holds on it, SQLite's included (sqlite.org/howtocorrupt.html, section 2.2). The header
    check below opens the file with Python's ``open``; done while another handle of this
    process had the file open, its close dropped that handle's locks, and another process
    closing its connection then took the file for unused and deleted the ``-wal`` under the
    open handle ("disk I/O error" at its next write, or lost commits). A file this process
    already holds open was checked when it was opened, so the check is skipped for it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count: dict[tuple[int, int], int] = {}

    @staticmethod
    def _key(path: Path) -> tuple[int, int] | None:
        try:
            st = path.stat()
        except OSError:
            return None
        return (st.st_dev, st.st_ino)

    def holds(self, path: Path) -> bool:
        if not self._count:  # nothing open: no need to look at the file
            return False
        key = self._key(path)
        with self._lock:
            return key is not None and key in self._count

    def add(self, path: Path) -> tuple[int, int] | None:
        key = self._key(path)
        if key is not None:
            with self._lock:
                self._count[key] = self._count.get(key, 0) + 1
        return key

    def remove(self, key: tuple[int, int]) -> None:
        with self._lock:
            n = self._count.get(key, 0) - 1
            if n > 0:
                self._count[key] = n
            else:
                self._count.pop(key, None)


_OPEN_FILES = _OpenFiles()


def held_open(path: str | os.PathLike[str]) -> bool:
    """Whether this process holds the database file ``path`` open (a :class:`Store` owns a
    connection to it). Code that reads files (a folder walk) must leave such a file alone:
    closing any descriptor of it would drop this process's SQLite locks (see :class:`_OpenFiles`)."""
    return _OPEN_FILES.holds(Path(path))


class _Shared:
    """What the stores of one file's collections share: the connection, its lock, and
    whether a read transaction is open on it."""

    __slots__ = ("raw", "lock", "reading", "db", "closed")

    def __init__(self, raw: sqlite3.Connection, lock: threading.RLock) -> None:
        self.raw = raw
        self.lock = lock
        self.reading = False  # a read transaction (``read``) is open: writes must not nest in it
        self.closed = False  # closed by its owner's close(): a second close does nothing
        self.db: sqlite_utils.Database | None = None


class Store(VectorSQL):
    """One SQLite connection with ragdb's schema, plus the statements ragdb runs.

    The connection runs in autocommit mode; :meth:`read` and :meth:`write`
    open explicit transactions. Writes use ``BEGIN IMMEDIATE``, not
    sqlite-utils' ``atomic()`` (a deferred ``BEGIN``): a deferred transaction
    that first reads and then writes fails with SQLITE_BUSY without waiting
    when another process committed in between, and the busy timeout cannot
    help. Taking the write lock up front makes a second writer wait instead.
    """

    #: which database server holds the tables ("sqlite"; :class:`ragdb.storage.postgres.PgStore`: "postgresql")
    backend = "sqlite"
    #: the collection this store reads and writes (see :mod:`ragdb.storage.collections`)
    collection_id = 0
    collection = _coll.DEFAULT
    #: this file in :data:`_OPEN_FILES` while this store owns its connection (None: not a file, or not owner)
    file_key: tuple[int, int] | None = None

    def __init__(self, path: str, *, busy_timeout: float = 30.0, readonly: bool = False,
                 create: bool = True) -> None:
        self.path = path
        self.lock = threading.RLock()
        self.owner = True  # closing this store closes the connection
        self.readonly = readonly
        memory = path == ":memory:"
        if not memory:
            p = Path(path)
            if not p.exists() and (readonly or not create):
                raise NotADatabase(f"{path}: no such database file")
            if p.exists() and p.is_dir():
                raise NotADatabase(f"{path}: is a directory, not a database file")
            if p.is_file() and p.stat().st_size > 0 and not _OPEN_FILES.holds(p):
                try:
                    with open(p, "rb") as fh:
                        head = fh.read(16)
                except OSError as e:
                    raise StorageError(f"{path}: cannot read the file: {e.strerror or e}") from None
                if head != b"SQLite format 3\x00":
                    raise NotADatabase(f"{path}: not a database file (it does not start with SQLite's header); "
                                       f"check the path")
            if not p.exists() and not p.parent.is_dir():
                raise StorageError(f"{path}: cannot create the database: the folder {os.fspath(p.parent)!r} "
                                   f"does not exist")
        #: opened with SQLite's ``immutable=1`` (read-only medium: see :meth:`_connect_readonly`)
        self.immutable = False
        try:
            if readonly and not memory:
                conn = self._connect_readonly(path, busy_timeout)
            else:
                conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None,
                                       timeout=busy_timeout)
        except sqlite3.Error as e:
            raise _translate(e, path) from e
        self.conn: sqlite3.Connection = conn
        #: the connection, its lock and read state, shared with the stores of the file's other collections
        self.shared = _Shared(conn, self.lock)
        try:
            self._open(readonly=readonly, memory=memory, busy_timeout=busy_timeout)
        except sqlite3.Error as e:  # e.g. a damaged page met while reading the schema
            conn.close()
            raise _translate(e, path) from e
        except BaseException:
            conn.close()
            raise
        self.file_key = None if memory else _OPEN_FILES.add(Path(path))

    def _connect_readonly(self, path: str, busy_timeout: float) -> sqlite3.Connection:
        """A read-only connection (``mode=ro``). A WAL database needs its ``-shm`` file even
        to read; on a read-only filesystem or medium where it cannot be made, and where no
        ``-wal`` file holds commits not yet in the database file, the file is opened with
        ``immutable=1``: SQLite then takes no locks and assumes that nobody changes the
        file while it is open (so it must not be used on a file another process writes)."""
        base = Path(path).resolve().as_uri()
        conn = sqlite3.connect(base + "?mode=ro", uri=True, check_same_thread=False, isolation_level=None,
                               timeout=busy_timeout)
        try:
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
            return conn
        except sqlite3.OperationalError as e:
            low = str(e).lower()
            conn.close()
            if "readonly" not in low and "read-only" not in low and "unable to open" not in low:
                raise
        wal = Path(path + "-wal")
        try:
            pending = wal.stat().st_size > 0
        except OSError:
            pending = False
        if pending:
            raise StorageError(f"{path}: cannot be read here: its folder is read-only and {wal.name} holds "
                               f"commits not yet in the database file; open it once read-write (or copy the "
                               f"database, its -wal and -shm files somewhere writable)")
        self.immutable = True
        return sqlite3.connect(base + "?immutable=1", uri=True, check_same_thread=False, isolation_level=None,
                               timeout=busy_timeout)

    @property
    def db(self) -> sqlite_utils.Database:
        """sqlite-utils' view of the connection (migrations, savepoints), made on first use.

        Importing sqlite-utils (and click, dateutil, pluggy with it) costs a
        process about 10 MiB and tens of milliseconds; a process that only
        opens an up-to-date database and searches never needs it."""
        shared = self.shared
        if shared.db is None:
            import sqlite_utils

            shared.db = sqlite_utils.Database(shared.raw, execute_plugins=False, recursive_triggers=False)
        return shared.db

    # -- collections -------------------------------------------------------------
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

    def collection_rows(self) -> list[tuple[int, str, str]]:
        """(id, name, created_at) of every collection, the default first."""
        return self.shared.raw.execute("SELECT id, name, created_at FROM collections ORDER BY id").fetchall()

    def collection_row(self, name: str) -> tuple[int, str, str] | None:
        return self.shared.raw.execute("SELECT id, name, created_at FROM collections WHERE name = ?",
                                        [name]).fetchone()

    def create_collection(self, name: str) -> tuple[int, str, str]:
        """Register collection ``name`` and build its tables (in a write transaction)."""
        raw = self.shared.raw
        cur = raw.execute("INSERT INTO collections (name, created_at) VALUES (?, ?)", [name, utcnow_iso()])
        cid = int(cur.lastrowid or 0)
        _register_functions(raw)
        statements = [stmt for path in migration_files() for stmt in _split_sql(path.read_text(encoding="utf-8"))]
        for stmt in _coll.collection_ddl(statements, cid):
            raw.execute(stmt)
        return cid, name, self.collection_row(name)[2]  # type: ignore[index]

    def drop_collection(self, collection_id: int) -> None:
        """Drop collection ``collection_id``'s tables and forget it (in a write transaction)."""
        raw = self.shared.raw
        for stmt in _coll.drop_statements(collection_id):
            raw.execute(stmt)
        raw.execute("DELETE FROM collections WHERE id = ?", [collection_id])

    def collection_exists(self) -> bool:
        """Whether this store's collection is still registered (not dropped)."""
        return self.shared.raw.execute("SELECT 1 FROM collections WHERE id = ?",
                                        [self.collection_id]).fetchone() is not None

    def collection_objects(self) -> list[tuple[str, str, str]]:
        """(type, name, table) of every schema object of this store's collection, by the
        plain (default collection) names: what ``check`` compares with the default's."""
        prefix = _coll.object_name(self.collection_id, "")
        out = []
        for kind, name, table in self.shared.raw.execute(
                "SELECT type, name, tbl_name FROM sqlite_master WHERE type IN ('table', 'index', 'trigger') "
                "AND name NOT LIKE 'sqlite_%' ORDER BY name"):
            if prefix and not (name.startswith(prefix) and table.startswith(prefix)):
                continue
            plain, plain_table = name[len(prefix):], table[len(prefix):]
            if plain in _coll.OBJECTS:
                out.append((kind, plain, plain_table))
        return sorted(out)

    # -- opening and migrations --------------------------------------------
    def _open(self, *, readonly: bool, memory: bool, busy_timeout: float) -> None:
        conn = self.conn
        try:
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        except sqlite3.Error as e:
            raise _translate(e, self.path) from e
        known = [p.stem for p in migration_files()]
        if tables:
            applied = self._applied() if "_sqlite_migrations" in tables else []
            if not applied:
                raise NotADatabase(f"{self.path}: is a SQLite database but not a ragdb database "
                                   f"(it has tables {', '.join(sorted(tables)[:5])} and no ragdb schema)")
            unknown = [name for name in applied if name not in known]
            if unknown:
                raise SchemaTooNew(f"{self.path}: written by a newer ragdb (schema {unknown[-1]}; "
                                   f"this ragdb knows up to {known[-1]}); upgrade ragdb to open it")
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
        # 4 MiB of page cache (the default is 2 MiB). Hit texts are served from
        # the index's own row cache and the OS page cache; a larger SQLite
        # cache (16 MiB was tried) mostly raised a reader's memory at 100k docs.
        conn.execute("PRAGMA cache_size = -4096")
        conn.execute("PRAGMA foreign_keys = ON")
        if readonly:
            if not tables:
                raise NotADatabase(f"{self.path}: empty file, not a ragdb database")
            if len(self._applied()) < len(known):
                raise StorageError(f"{self.path}: needs a schema migration, which a read-only open cannot do")
            return
        if not tables and not memory:
            conn.execute(f"PRAGMA page_size = {PAGE_SIZE}")  # a new file, before its first page is written
        if not memory:
            self._use_wal(busy_timeout)
            conn.execute("PRAGMA synchronous = NORMAL")
        self.migrate()

    def _use_wal(self, busy_timeout: float) -> None:
        """Switch the file to WAL mode unless it is already. The switch needs the file
        to itself, and SQLite answers SQLITE_BUSY at once, without its busy handler,
        while another connection is looking at a new file (six threads opening one new
        file failed ~1 time in 8): so it is tried again until ``busy_timeout``, looking
        each time whether another opener has switched it meanwhile."""
        conn = self.conn
        deadline = time.monotonic() + busy_timeout
        pause = 0.001
        while True:
            try:
                if conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal":
                    return
                if conn.execute("PRAGMA journal_mode = WAL").fetchone()[0] == "wal":
                    return
                if time.monotonic() >= deadline:  # (SQLite answers the old mode when it cannot change it)
                    raise DatabaseBusy(f"{self.path}: could not switch to WAL mode: other connections kept "
                                       f"the file busy for the busy timeout ({busy_timeout:g} s)")
            except sqlite3.OperationalError as e:
                if "locked" not in str(e) or time.monotonic() >= deadline:
                    raise _translate(e, self.path) from e
            time.sleep(pause)
            pause = min(pause * 2, 0.05)

    def _applied(self) -> list[str]:
        return [r[0] for r in self.conn.execute(
            "SELECT name FROM _sqlite_migrations WHERE migration_set = ? ORDER BY id", [MIGRATION_SET])]

    def migrate(self, stop_after: str | None = None) -> list[str]:
        """Apply pending migrations in one write transaction; returns their names."""
        names = [p.stem for p in migration_files()]
        if stop_after is not None and stop_after in names:
            names = names[:names.index(stop_after) + 1]
        # Look first without the write lock: opening an up-to-date database
        # must not wait for (or block) a writer in another process. This
        # look is plain SQL on sqlite-utils' own table, so that searching
        # processes need not import sqlite-utils (see ``db``).
        with self.read():
            recorded = self.conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = '_sqlite_migrations'").fetchone()
            if recorded and set(names) <= set(self._applied()):
                return []
        migrations = build_migrations(stop_after)
        with self.write():  # look again under the lock: another process may have migrated
            pending = [m.name for m in migrations.pending(self.db)]
            if pending:
                migrations.apply(self.db)
        return pending

    # -- transactions ------------------------------------------------------
    @contextlib.contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction (``BEGIN IMMEDIATE``); rolled back on any error."""
        with self.lock:
            self._open_or_refuse()
            if self.conn.in_transaction:
                if self.shared.reading:
                    # its savepoint would be undone when the read ends (a read always rolls back)
                    raise InvalidInput(f"{self.path}: cannot write while a read of this connection is open "
                                       f"(e.g. inside a loop over db.records()); finish the read first")
                # Nested: a savepoint inside the caller's transaction.
                with self.db.atomic():
                    yield self.conn
                return
            try:
                self.conn.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as e:
                raise _translate(e, self.path) from e
            try:
                yield self.conn
                self.conn.execute("COMMIT")
            except sqlite3.Error as e:
                self._rollback()
                raise _translate(e, self.path) from e
            except BaseException:
                self._rollback()
                raise

    @contextlib.contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        """A read transaction: every statement inside sees one snapshot."""
        with self.lock:
            self._open_or_refuse()
            if self.conn.in_transaction:
                yield self.conn
                return
            try:
                self.conn.execute("BEGIN")
                self.shared.reading = True
                yield self.conn
            except sqlite3.Error as e:
                raise _translate(e, self.path) from e
            finally:
                self.shared.reading = False
                self._rollback()

    def _open_or_refuse(self) -> None:
        if self.shared.closed:
            raise StorageError(f"{self.path}: this database handle is closed; open the database again")

    def _rollback(self) -> None:
        if self.conn.in_transaction:
            try:
                self.conn.execute("ROLLBACK")
            except sqlite3.Error:  # pragma: no cover - connection already broken
                pass

    def close(self) -> None:
        """Close the connection, if this store owns it (a collection view of another
        store's connection leaves it open)."""
        if not self.owner:
            return
        with self.lock:
            if self.shared.closed:  # closing twice is harmless, as for files
                return
            self._rollback()
            self.shared.raw.close()
            self.shared.closed = True
            if self.file_key is not None:
                _OPEN_FILES.remove(self.file_key)
                self.file_key = None

    # -- settings and statistics ---------------------------------------------
    def settings(self) -> dict[str, Any]:
        """Every setting, decoded; a value that is not JSON (or a flag that is not
        true/false) is a :class:`StorageError` naming the file and the key."""
        out: dict[str, Any] = {}
        for key, value in self.conn.execute("SELECT key, value FROM settings"):
            try:
                out[key] = loads(value)
            except (ValueError, TypeError) as e:  # orjson.JSONDecodeError is a ValueError
                raise StorageError(f"{self.path}: the database is damaged: setting {key!r} is not valid JSON "
                                   f"({e}); restore the file from a backup") from None
            if key in ("keep_versions", "public_unlabeled") and not isinstance(out[key], bool):
                # never guess an access setting: "false" would read as true
                raise StorageError(f"{self.path}: the database is damaged: setting {key!r} is {out[key]!r}, "
                                   f"not true or false; restore the file from a backup")
        return out

    def set_setting(self, key: str, value: Any) -> None:
        self.conn.execute("INSERT INTO settings (key, value) VALUES (?, ?) "
                          "ON CONFLICT (key) DO UPDATE SET value = excluded.value", [key, dumps(value)])

    def in_transaction(self) -> bool:
        """Whether a transaction of this connection is open (then writes nest as savepoints)."""
        return bool(self.conn.in_transaction)

    def stats_row(self) -> dict[str, int]:
        row = self.conn.execute("SELECT generation, n_docs, n_chunks, total_length, flushed_upto, vocab_epoch, "
                                "flush_count, next_doc_id, next_chunk_id FROM stats WHERE id = 1").fetchone()
        return dict(zip(("generation", "n_docs", "n_chunks", "total_length", "flushed_upto", "vocab_epoch",
                         "flush_count", "next_doc_id", "next_chunk_id"), row))

    def generation(self) -> int:
        return int(self.conn.execute("SELECT generation FROM stats WHERE id = 1").fetchone()[0])

    def bump_stats(self, *, docs: int = 0, chunks: int = 0, length: int = 0,
                   next_ids: tuple[int, int] = (0, 0)) -> int:
        """Adjust the statistics (and raise the next free ids to at least ``next_ids``),
        advance the generation; returns the new generation. It runs in every write."""
        # UPDATE then SELECT, not UPDATE ... RETURNING: RETURNING cost ~30 µs more here
        # (it was a tenth of deleting a document).
        self.conn.execute(
            "UPDATE stats SET generation = generation + 1, n_docs = n_docs + ?, n_chunks = n_chunks + ?, "
            "total_length = total_length + ?, next_doc_id = max(next_doc_id, ?), "
            "next_chunk_id = max(next_chunk_id, ?) WHERE id = 1",
            [docs, chunks, length, *next_ids])
        return self.generation()

    # -- documents -------------------------------------------------------------
    # the columns of a Document, on ``documents d``
    _DOC_COLS = ("d.id, d.source, d.version, d.timestamp, d.content_hash, d.metadata, d.acl, d.latest, d.title, "
                 "(SELECT count(*) FROM chunks c WHERE c.doc_id = d.id)")

    def latest_by_source(self, sources: Sequence[str]
                         ) -> dict[str, tuple[int, str, str | None, str, str, str, str | None, str]]:
        """source -> (id, content_hash, version, metadata json, acl json, timestamp, title, chunker)
        of latest versions."""
        out: dict[str, tuple[int, str, str | None, str, str, str, str | None, str]] = {}
        for part in _chunks(list(dict.fromkeys(sources))):
            q = ",".join("?" * len(part))
            for row in self.conn.execute(
                    f"SELECT source, id, content_hash, version, metadata, acl, timestamp, title, chunker FROM documents "
                    f"WHERE latest = 1 AND source IN ({q})", part):
                out[row[0]] = tuple(row[1:])
        return out

    def chunk_metadata(self, doc_id: int) -> list[str]:
        """The metadata json of a document's chunks, in order."""
        return [r[0] for r in self.conn.execute("SELECT metadata FROM chunks WHERE doc_id = ? ORDER BY id", [doc_id])]

    def insert_documents(self, rows: Iterable[Sequence[Any]]) -> None:
        self.conn.executemany(
            "INSERT INTO documents (id, source, version, timestamp, ts, valid_to, latest, content_hash, title, "
            "text, metadata, acl, chunker, added_at) VALUES (?, ?, ?, ?, ?, NULL, 1, ?, ?, ?, ?, ?, ?, ?)", rows)

    def insert_chunks(self, rows: Iterable[Sequence[Any]]) -> None:
        self.conn.executemany(
            'INSERT INTO chunks (id, doc_id, ordinal, start, "end", length, latest, text, metadata, terms, tfs) '
            "VALUES (?, ?, ?, ?, ?, ?, 1, ?, ?, ?, ?)", rows)

    def doc_chunks(self, doc_id: int) -> list[tuple[int, int, int, bytes, bytes]]:
        """(chunk id, length, latest, terms, tfs) of a document's chunks."""
        return self.conn.execute("SELECT id, length, latest, terms, tfs FROM chunks WHERE doc_id = ? ORDER BY id",
                                 [doc_id]).fetchall()

    def set_latest(self, doc_id: int, latest: bool, valid_to: float | None) -> None:
        self.conn.execute("UPDATE documents SET latest = ?, valid_to = ? WHERE id = ?",
                          [int(latest), valid_to, doc_id])
        self.conn.execute("UPDATE chunks SET latest = ? WHERE doc_id = ?", [int(latest), doc_id])

    def insert_doc_index(self, meta_rows: Iterable[tuple[int, str, Any, Any, Any]],
                         acl_rows: Iterable[tuple[int, str]]) -> None:
        """Filter index rows: (doc id, key, scalar value, num, at) and (doc id, label)."""
        self.conn.executemany("INSERT INTO doc_meta (doc_id, key, value, num, at) VALUES (?, ?, ?, ?, ?)", meta_rows)
        self.conn.executemany("INSERT OR IGNORE INTO doc_acl (doc_id, label) VALUES (?, ?)", acl_rows)

    def delete_document(self, doc_id: int, *, indexed: tuple[bool, bool] = (True, True)) -> None:
        """Delete a document and its chunks; ``indexed`` says whether it may have
        rows in doc_meta and doc_acl (a document with metadata ``{}`` and acl
        ``[]`` has none, and deletes skip looking)."""
        if indexed[0]:
            self.conn.execute("DELETE FROM doc_meta WHERE doc_id = ?", [doc_id])
        if indexed[1]:
            self.conn.execute("DELETE FROM doc_acl WHERE doc_id = ?", [doc_id])
        self.conn.execute("DELETE FROM chunks WHERE doc_id = ?", [doc_id])
        self.conn.execute("DELETE FROM documents WHERE id = ?", [doc_id])

    def source_docs_with_chunks(self, source: str, *, glob: bool = False
                                ) -> list[tuple[int, int, bool, bool, list[tuple[int, int, int, bytes, bytes]]]]:
        """(id, latest, has metadata, has acl, its ``doc_chunks`` rows) of every stored
        version of matching sources, newest first: one query (all that deleting by
        source reads)."""
        test, value = self._source_test("d.source", source, glob)
        out: list[tuple[int, int, bool, bool, list[tuple[int, int, int, bytes, bytes]]]] = []
        last = None
        for did, latest, has_meta, has_acl, *chunk in self.conn.execute(
                f"SELECT d.id, d.latest, d.metadata != '{{}}', d.acl != '[]', c.id, c.length, c.latest, c.terms, "
                f"c.tfs FROM documents d LEFT JOIN chunks c ON c.doc_id = d.id WHERE {test} "
                f"ORDER BY d.id DESC, c.id", value):
            if did != last:
                out.append((did, latest, bool(has_meta), bool(has_acl), []))
                last = did
            if chunk[0] is not None:
                out[-1][4].append(tuple(chunk))
        return out

    def doc_row(self, doc_id: int) -> tuple[Any, ...] | None:
        return self.conn.execute(f"SELECT {self._DOC_COLS}, d.text FROM documents d WHERE d.id = ?",
                                 [doc_id]).fetchone()

    def doc_source(self, doc_id: int) -> tuple[str, int, bool, bool] | None:
        """(source, latest, has metadata, has acl) of a document."""
        return self.conn.execute("SELECT source, latest, metadata != '{}', acl != '[]' FROM documents WHERE id = ?",
                                 [doc_id]).fetchone()

    def newest_older_version(self, source: str, exclude: Iterable[int] = ()) -> int | None:
        """The newest kept older version of ``source`` whose id is not in ``exclude``."""
        skip = set(exclude)
        for (doc_id,) in self.conn.execute("SELECT id FROM documents WHERE source = ? AND latest = 0 "
                                           "ORDER BY id DESC", [source]):
            if doc_id not in skip:
                return int(doc_id)
        return None

    def source_versions(self, source: str) -> list[tuple[int, float, float | None]]:
        """(id, ts, valid_to) of every stored version of ``source``, by id (oldest first)."""
        return self.conn.execute("SELECT id, ts, valid_to FROM documents WHERE source = ? ORDER BY id",
                                 [source]).fetchall()

    def set_valid_to(self, rows: Iterable[tuple[float | None, int]]) -> None:
        """Set (valid_to, document id): the end of a kept version's validity for ``as_of``."""
        self.conn.executemany("UPDATE documents SET valid_to = ? WHERE id = ?", rows)

    def update_document_fields(self, doc_id: int, *, metadata: tuple[str, list[tuple[str, Any, Any, Any]]] | None = None,
                               acl: tuple[str, list[str]] | None = None) -> list[int]:
        """Set a document's metadata (JSON text, filter-index rows) and/or access
        labels (JSON text, labels) in place; returns the ids of its chunks."""
        if metadata is not None:
            self.conn.execute("UPDATE documents SET metadata = ? WHERE id = ?", [metadata[0], doc_id])
            self.conn.execute("DELETE FROM doc_meta WHERE doc_id = ?", [doc_id])
            self.conn.executemany("INSERT INTO doc_meta (doc_id, key, value, num, at) VALUES (?, ?, ?, ?, ?)",
                                  [(doc_id, *row) for row in metadata[1]])
        if acl is not None:
            self.conn.execute("UPDATE documents SET acl = ? WHERE id = ?", [acl[0], doc_id])
            self.conn.execute("DELETE FROM doc_acl WHERE doc_id = ?", [doc_id])
            self.conn.executemany("INSERT OR IGNORE INTO doc_acl (doc_id, label) VALUES (?, ?)",
                                  [(doc_id, label) for label in acl[1]])
        return [r[0] for r in self.conn.execute("SELECT id FROM chunks WHERE doc_id = ? ORDER BY id", [doc_id])]

    def list_documents(self, source: str | None = None, *, glob: bool = True, latest_only: bool = True,
                       limit: int | None = None, offset: int = 0, conditions: Sequence[Any] = (),
                       public_unlabeled: bool = False) -> list[tuple[Any, ...]]:
        """Document rows (``_DOC_COLS``) by source (a pattern when ``glob``) and filter
        ``conditions``, ordered by source then id."""
        where, params = self._filter_sql(conditions, public_unlabeled)
        if source is not None:
            test, value = self._source_test("d.source", source, glob)
            where.append(test)
            params += value
        if latest_only:
            where.append("d.latest = 1")
        sql = f"SELECT {self._DOC_COLS} FROM documents d"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY d.source, d.id LIMIT ? OFFSET ?"
        params += [self._NO_LIMIT if limit is None else limit, offset]
        return self.conn.execute(sql, params).fetchall()

    def count_documents(self, conditions: Sequence[Any] = (), public_unlabeled: bool = False,
                        latest_only: bool = True) -> int:
        """How many documents meet the filter ``conditions``."""
        where, params = self._filter_sql(conditions, public_unlabeled)
        if latest_only:
            where.append("d.latest = 1")
        sql = "SELECT count(*) FROM documents d"
        if where:
            sql += " WHERE " + " AND ".join(where)
        return int(self.conn.execute(sql, params).fetchone()[0])

    def iter_documents(self, latest_only: bool = False, conditions: Sequence[Any] = (),
                       public_unlabeled: bool = False) -> Iterator[tuple[Any, ...]]:
        """Full rows for export: id, source, version, timestamp, title, text, metadata, acl, chunker,
        latest, of the documents meeting the filter ``conditions``."""
        where, params = self._filter_sql(conditions, public_unlabeled)
        if latest_only:
            where.append("d.latest = 1")
        sql = ("SELECT d.id, d.source, d.version, d.timestamp, d.title, d.text, d.metadata, d.acl, d.chunker, "
               "d.latest FROM documents d")
        if where:
            sql += " WHERE " + " AND ".join(where)
        yield from self.conn.execute(sql + " ORDER BY d.id", params)

    def iter_chunk_spans(self) -> Iterator[tuple[int, int, int, str]]:
        """(doc id, start, end, chunk metadata json) of every chunk of the documents that have
        a chunk with metadata of its own, by document id then start (for export)."""
        yield from self.conn.execute(
            'SELECT doc_id, start, "end", metadata FROM chunks WHERE doc_id IN '
            "(SELECT doc_id FROM chunks WHERE metadata != '{}') ORDER BY doc_id, start, \"end\"")

    # -- chunks for the in-memory index ------------------------------------------
    def chunk_table(self) -> list[tuple[int, int, int, int, int]]:
        """(id, length, latest, doc id, whole) of every stored chunk; ``whole`` is 1 for a
        chunk that is its whole document without metadata of its own (see ``doc_hit_rows``)."""
        return self.conn.execute(f"SELECT id, length, latest, doc_id, {WHOLE_CHUNK} FROM chunks").fetchall()

    def chunk_table_blocks(self, size: int = 8192) -> Iterator[list[tuple[int, int, int, int, int]]]:
        """``chunk_table`` in blocks of ``size`` rows."""
        cur = self.conn.execute(f"SELECT id, length, latest, doc_id, {WHOLE_CHUNK} FROM chunks")
        while rows := cur.fetchmany(size):
            yield rows

    def count_chunks_since(self, after_id: int) -> int:
        return int(self.conn.execute("SELECT count(*) FROM chunks WHERE id > ?", [after_id]).fetchone()[0])

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

    def filtered_chunk_ids(self, conditions: Sequence[Any], public_unlabeled: bool) -> list[int]:
        """Ids of the chunks meeting every condition (conditions on chunks included)."""
        where, params = self._filter_sql(conditions, public_unlabeled, per_chunk=True)
        sql = "SELECT c.id FROM chunks c JOIN documents d ON d.id = c.doc_id"
        if where:
            sql += " WHERE " + " AND ".join(where)
        return [r[0] for r in self.conn.execute(sql, params)]

    def facet_rows(self, field: str) -> list[tuple[int, Any]]:
        """(doc id, value) of every value of a field, for facets: a metadata key's indexed
        values, booleans as True/False, or the column ``source`` / ``version`` of every
        document (with one). Read from the covering (key, value, doc_id) index; the few
        rows that are booleans (1/0 without ``num``) are looked up apart."""
        if field == "source":
            return self.conn.execute("SELECT id, source FROM documents").fetchall()
        if field == "version":
            return self.conn.execute("SELECT id, version FROM documents WHERE version IS NOT NULL").fetchall()
        rows = self.conn.execute("SELECT doc_id, value FROM doc_meta WHERE key = ?", [field]).fetchall()
        # a document holding both 1 and true keeps its 1 (they are one value to filters and facets)
        bools = set(self.conn.execute(
            "SELECT doc_id, value FROM doc_meta b WHERE key = ? AND value IN (0, 1) AND num IS NULL "
            "AND NOT EXISTS (SELECT 1 FROM doc_meta n WHERE n.key = b.key AND n.value = b.value "
            "AND n.doc_id = b.doc_id AND n.num IS NOT NULL)", [field]))
        if bools:
            rows = [(d, bool(v)) if (d, v) in bools else (d, v) for d, v in rows]
        return rows

    def has_private_labels(self) -> bool:
        """Whether any stored document carries an access label other than the public ``*``."""
        return bool(self.conn.execute("SELECT EXISTS (SELECT 1 FROM doc_acl WHERE label != '*')").fetchone()[0])

    def filtered_doc_ids(self, conditions: Sequence[Any], public_unlabeled: bool,
                         doc_id: int | None = None) -> list[int]:
        """Ids of documents meeting every condition (see ragdb.query.filters.Condition), of
        ``doc_id`` alone when given."""
        if doc_id is None and 0 < len(conditions) <= _MAX_INTERSECT and all(c.kind in DOC_SETS for c in conditions):
            # only conditions on metadata: their document ids straight from doc_meta's indexes
            # (each exists: rows go with their document), without a lookup of each document
            set_params: list[Any] = []
            sets = " INTERSECT ".join(self._doc_set(c, set_params) for c in conditions)
            return [r[0] for r in self.conn.execute(sets, set_params)]
        where, params = self._filter_sql(conditions, public_unlabeled)
        if doc_id is not None:
            where.append("d.id = ?")
            params.append(doc_id)
        sql = "SELECT d.id FROM documents d"
        if where:
            sql += " WHERE " + " AND ".join(where)
        return [r[0] for r in self.conn.execute(sql, params)]

    def doc_rows_matching(self, conditions: Sequence[Any], *, source: str | None = None, glob: bool = False
                          ) -> list[tuple[int, str, int, int, int]]:
        """(id, source, latest, has metadata, has acl) of the documents meeting every
        condition (and ``source``, a pattern when ``glob``), newest first."""
        where, params = self._filter_sql(conditions, False)
        if source is not None:
            test, value = self._source_test("d.source", source, glob)
            where.append(test)
            params += value
        sql = "SELECT d.id, d.source, d.latest, d.metadata != '{}', d.acl != '[]' FROM documents d"
        if where:
            sql += " WHERE " + " AND ".join(where)
        return self.conn.execute(sql + " ORDER BY d.id DESC", params).fetchall()

    def forward_since(self, after_id: int) -> list[tuple[int, bytes, bytes]]:
        return self.conn.execute("SELECT id, terms, tfs FROM chunks WHERE id > ? ORDER BY id", [after_id]).fetchall()

    def forward_all(self) -> Iterator[tuple[int, bytes, bytes]]:
        yield from self.conn.execute("SELECT id, terms, tfs FROM chunks ORDER BY id")

    def max_chunk_id(self) -> int:
        return int(self.conn.execute("SELECT coalesce(max(id), 0) FROM chunks").fetchone()[0])

    def hit_rows(self, chunk_ids: Sequence[int]) -> dict[int, tuple[Any, ...]]:
        """chunk id -> (doc_id, source, version, timestamp, text, start, end, ordinal, chunk metadata,
        document metadata, title)."""
        out: dict[int, tuple[Any, ...]] = {}
        for part in _chunks(list(chunk_ids)):
            q = ",".join("?" * len(part))
            for row in self.conn.execute(
                    f'SELECT c.id, c.doc_id, d.source, d.version, d.timestamp, coalesce(c.text, d.text), c.start, c."end", '
                    f"c.ordinal, "
                    f"c.metadata, d.metadata, d.title FROM chunks c JOIN documents d ON d.id = c.doc_id "
                    f"WHERE c.id IN ({q})", part):
                out[row[0]] = tuple(row[1:])
        return out

    def doc_hit_rows(self, doc_ids: Sequence[int]) -> dict[int, tuple[Any, ...]]:
        """doc id -> (source, version, timestamp, text, metadata, title): the hit fields of
        chunks that are their whole document, read without touching ``chunks``
        (whose rows carry the forward index, so reading them costs a page each)."""
        out: dict[int, tuple[Any, ...]] = {}
        for part in _chunks(list(doc_ids)):
            q = ",".join("?" * len(part))
            for row in self.conn.execute(
                    f"SELECT id, source, version, timestamp, text, metadata, title FROM documents WHERE id IN ({q})",
                    part):
                out[row[0]] = tuple(row[1:])
        return out

    def texts_by_id(self, chunk_ids: Sequence[int], doc_ids: Sequence[int]) -> tuple[dict[int, str], dict[int, str]]:
        """(chunk id -> its own text, doc id -> its text) of chunks that store a copy of their
        text and of documents (for chunks that are their whole document): only the text
        columns, for phrase checks."""
        own: dict[int, str] = {}
        for part in _chunks(list(chunk_ids)):
            q = ",".join("?" * len(part))
            own.update(self.conn.execute(f"SELECT id, text FROM chunks WHERE id IN ({q}) AND text IS NOT NULL",
                                         part).fetchall())
        docs: dict[int, str] = {}
        for part in _chunks(list(doc_ids)):
            q = ",".join("?" * len(part))
            docs.update(self.conn.execute(f"SELECT id, text FROM documents WHERE id IN ({q})", part).fetchall())
        return own, docs

    def chunk_sort_keys(self, chunk_ids: Sequence[int]) -> dict[int, tuple[str, int]]:
        """chunk id -> (source, start): the content-based tie-break of equal scores."""
        out: dict[int, tuple[str, int]] = {}
        for part in _chunks(list(chunk_ids)):
            q = ",".join("?" * len(part))
            for cid, source, start in self.conn.execute(
                    f"SELECT c.id, d.source, c.start FROM chunks c JOIN documents d ON d.id = c.doc_id "
                    f"WHERE c.id IN ({q})", part):
                out[cid] = (source, start)
        return out

    # -- vocabulary ------------------------------------------------------------
    def term_ids(self, terms: Sequence[str]) -> dict[str, tuple[int, int]]:
        """term -> (id, df) for the terms that are in the vocabulary."""
        out: dict[str, tuple[int, int]] = {}
        for part in _chunks(list(terms)):
            q = ",".join("?" * len(part))
            for tid, term, df in self.conn.execute(
                    f"SELECT id, term, df FROM vocabulary WHERE term IN ({q})", part):
                out[term] = (tid, df)
        return out

    def term_id_map(self, terms: Sequence[str]) -> dict[str, int]:
        """term -> id for the terms that are in the vocabulary: a writer's lookup. Without
        the df it reads only the term index (``id`` is its rowid), about half the page
        visits of :meth:`term_ids` (measured: 56 terms of a 354k-term vocabulary,
        88 against 158 µs)."""
        out: dict[str, int] = {}
        for part in _chunks(list(terms)):
            q = ",".join("?" * len(part))
            out.update(self.conn.execute(f"SELECT term, id FROM vocabulary WHERE term IN ({q})", part).fetchall())
        return out

    def frequent_term_ids(self, min_df: int) -> Iterator[tuple[str, int]]:
        """(term, id) of the terms whose stored df is at least ``min_df`` (a scan of the vocabulary)."""
        yield from self.conn.execute("SELECT term, id FROM vocabulary WHERE df >= ?", [min_df])

    def terms_with_prefix(self, prefix: str, limit: int) -> list[tuple[str, int, int]]:
        """(term, id, df) of up to ``limit`` vocabulary terms starting with ``prefix``, the
        most frequent (by stored df) first: a range scan of the term index."""
        return self.conn.execute(
            "SELECT term, id, df FROM vocabulary WHERE term >= ? AND term < ? ORDER BY df DESC, term LIMIT ?",
            [prefix, prefix + "\U0010ffff", limit]).fetchall()

    def has_term_with_prefix(self, prefix: str) -> bool:
        """Whether a vocabulary term starts with ``prefix``: one probe of the term index."""
        return self.conn.execute("SELECT 1 FROM vocabulary WHERE term >= ? AND term < ? LIMIT 1",
                                 [prefix, prefix + "\U0010ffff"]).fetchone() is not None

    def field_term_ids(self) -> list[int]:
        """Ids of the vocabulary's field terms (:mod:`ragdb.text.fields`: they start with its mark)."""
        return [r[0] for r in self.conn.execute("SELECT id FROM vocabulary WHERE term >= ? AND term < ?",
                                                ["\x1f", "\x20"])]

    def has_metadata_key(self, key: str) -> bool:
        """Whether any stored document has scalar metadata under ``key``."""
        return self.conn.execute("SELECT 1 FROM doc_meta WHERE key = ? LIMIT 1", [key]).fetchone() is not None

    def all_term_ids(self) -> Iterator[tuple[str, int]]:
        yield from self.conn.execute("SELECT term, id FROM vocabulary")

    def term_ids_after(self, term_id: int) -> Iterator[tuple[str, int]]:
        yield from self.conn.execute("SELECT term, id FROM vocabulary WHERE id > ?", [term_id])

    def has_postings(self) -> bool:
        return self.conn.execute("SELECT 1 FROM postings LIMIT 1").fetchone() is not None

    def next_term_id(self) -> int:
        return int(self.conn.execute("SELECT coalesce(max(id), 0) FROM vocabulary").fetchone()[0]) + 1

    def add_terms(self, rows: Iterable[tuple[int, str, int]]) -> None:
        """Insert new terms as (id, term, df)."""
        self.conn.executemany("INSERT INTO vocabulary (id, term, df) VALUES (?, ?, ?)", rows)

    def bump_vocab_epoch(self) -> None:
        self.conn.execute("UPDATE stats SET vocab_epoch = vocab_epoch + 1 WHERE id = 1")

    def add_df(self, deltas: Iterable[tuple[int, int]]) -> None:
        """Apply (delta, term id) document-frequency changes."""
        self.conn.executemany("UPDATE vocabulary SET df = df + ? WHERE id = ?", deltas)

    def all_dfs(self) -> list[tuple[int, int]]:
        return self.conn.execute("SELECT id, df FROM vocabulary").fetchall()

    def delete_unused_terms(self) -> int:
        cur = self.conn.execute(
            "DELETE FROM vocabulary WHERE df = 0 AND id NOT IN (SELECT DISTINCT term_id FROM postings)")
        return cur.rowcount

    # -- postings ----------------------------------------------------------------
    def postings(self, term_ids: Sequence[int]) -> list[tuple[int, int, bytes, bytes]]:
        """(term id, n, chunk ids blob, tfs blob) of every segment of these terms
        (``ragdb.index.inverted.unpack_postings`` reads the blobs)."""
        out: list[tuple[int, int, bytes, bytes]] = []
        for part in _chunks(list(term_ids)):
            q = ",".join("?" * len(part))
            out.extend(self.conn.execute(
                f"SELECT term_id, n, chunk_ids, tfs FROM postings WHERE term_id IN ({q}) ORDER BY term_id, segment",
                part).fetchall())
        return out

    def segment_counts(self, term_ids: Sequence[int]) -> dict[int, tuple[int, int]]:
        """term id -> (number of segments, highest segment number)."""
        out: dict[int, tuple[int, int]] = {}
        for part in _chunks(list(term_ids)):
            q = ",".join("?" * len(part))
            for tid, n, mx in self.conn.execute(
                    f"SELECT term_id, count(*), max(segment) FROM postings WHERE term_id IN ({q}) "
                    f"GROUP BY term_id", part):
                out[tid] = (n, mx)
        return out

    def posting_counts(self, term_ids: Sequence[int]) -> dict[int, int]:
        """term id -> postings in its segments (deleted chunks' included), for terms that have any."""
        out: dict[int, int] = {}
        for part in _chunks(list(term_ids)):
            q = ",".join("?" * len(part))
            out.update(self.conn.execute(
                f"SELECT term_id, sum(n) FROM postings WHERE term_id IN ({q}) GROUP BY term_id", part).fetchall())
        return out

    def segment_counts_all(self) -> list[int]:
        return [r[0] for r in self.conn.execute("SELECT DISTINCT term_id FROM postings")]

    def insert_segments(self, rows: Iterable[tuple[int, int, int, bytes, bytes]]) -> None:
        """Rows of (term id, segment, n, chunk ids, tfs)."""
        self.conn.executemany("INSERT INTO postings (term_id, segment, n, chunk_ids, tfs) VALUES (?, ?, ?, ?, ?)",
                              rows)

    def delete_segments(self, term_ids: Sequence[int]) -> None:
        for part in _chunks(list(term_ids)):
            q = ",".join("?" * len(part))
            self.conn.execute(f"DELETE FROM postings WHERE term_id IN ({q})", part)

    def log_states(self, rows: Sequence[tuple[int, int, bytes | None]]) -> int:
        """Append (chunk id, state, terms) changes to chunk_log; returns the last sequence
        number. ``terms``: the forward index of a flushed latest chunk being deleted
        (its terms stop counting in df), else None."""
        if len(rows) == 1:  # the common case (a one-chunk document): one statement, its rowid is seq
            # (lastrowid, not RETURNING seq, which cost ~30 µs more per call)
            seq = self.conn.execute("INSERT INTO chunk_log (chunk_id, state, terms) VALUES (?, ?, ?)",
                                    rows[0]).lastrowid
            assert seq is not None
            return int(seq)
        self.conn.executemany("INSERT INTO chunk_log (chunk_id, state, terms) VALUES (?, ?, ?)", rows)
        return self.log_seq()

    def log_seq(self) -> int:
        return int(self.conn.execute("SELECT coalesce(max(seq), 0) FROM chunk_log").fetchone()[0])

    def log_since(self, seq: int) -> list[tuple[int, int, int, bytes | None]]:
        """(seq, chunk id, state, terms) of chunk_log entries after ``seq``."""
        return self.conn.execute("SELECT seq, chunk_id, state, terms FROM chunk_log WHERE seq > ? ORDER BY seq",
                                 [seq]).fetchall()

    def chunks_since(self, after_id: int) -> list[tuple[int, int, int, int, bytes, bytes, int]]:
        """(id, length, latest, doc id, terms, tfs, whole) of chunks with id > after_id."""
        return self.conn.execute(f"SELECT id, length, latest, doc_id, terms, tfs, {WHOLE_CHUNK} FROM chunks "
                                 f"WHERE id > ? ORDER BY id", [after_id]).fetchall()

    def finish_flush(self, flushed_upto: int) -> None:
        """A flush folded the tail and the deleted chunks' terms into df: restart the change log."""
        self.conn.execute("DELETE FROM chunk_log")
        self.conn.execute("UPDATE stats SET flushed_upto = ?, flush_count = flush_count + 1 WHERE id = 1",
                          [flushed_upto])

    def dead_terms(self) -> list[bytes]:
        """Forward indexes of the flushed latest chunks deleted since the last flush."""
        return [r[0] for r in self.conn.execute("SELECT terms FROM chunk_log WHERE terms IS NOT NULL")]

    def segment_total(self) -> int:
        return int(self.conn.execute("SELECT count(*) FROM postings").fetchone()[0])

    # -- rebuilding the lexical index (Database.reindex) -------------------------------
    def clear_lexical_index(self) -> None:
        """Delete every posting, term and change-log entry (inside the reindex transaction)."""
        self.conn.execute("DELETE FROM postings")
        self.conn.execute("DELETE FROM vocabulary")
        self.conn.execute("DELETE FROM chunk_log")

    def chunk_texts_after(self, after_id: int, limit: int) -> list[tuple[int, int, str, str | None, str, str]]:
        """(id, latest, text, document title, source, chunk metadata json) of the next ``limit``
        chunks with id > ``after_id``, by id: a chunk's own text, or its document's when the
        chunk is the whole document (text NULL)."""
        return self.conn.execute(
            "SELECT c.id, c.latest, coalesce(c.text, d.text), d.title, d.source, c.metadata FROM chunks c "
            "JOIN documents d ON d.id = c.doc_id WHERE c.id > ? ORDER BY c.id LIMIT ?", [after_id, limit]).fetchall()

    def set_forward_indexes(self, rows: Iterable[tuple[bytes, bytes, int, int]]) -> None:
        """Rows of (terms, tfs, length, chunk id): a chunk's new forward index and length."""
        self.conn.executemany("UPDATE chunks SET terms = ?, tfs = ?, length = ? WHERE id = ?", rows)

    def finish_reindex(self, total_length: int, flushed_upto: int) -> None:
        """After a reindex: the new total length, every chunk flushed, and a flush and a
        vocabulary change recorded, so every open connection reloads its view."""
        self.conn.execute(
            "UPDATE stats SET total_length = ?, flushed_upto = ?, flush_count = flush_count + 1, "
            "vocab_epoch = vocab_epoch + 1 WHERE id = 1", [total_length, flushed_upto])

    def vocabulary_size(self) -> int:
        return int(self.conn.execute("SELECT count(*) FROM vocabulary").fetchone()[0])

    # -- checks and maintenance -----------------------------------------------------
    def integrity_problems(self) -> list[str]:
        rows = [r[0] for r in self.conn.execute("PRAGMA integrity_check")]
        problems = [] if rows == ["ok"] else [f"sqlite integrity_check: {r}" for r in rows]
        problems += [f"foreign key violation in {r[0]} rowid {r[1]}"
                     for r in self.conn.execute("PRAGMA foreign_key_check")]
        return problems

    def orphan_chunks(self) -> int:
        return int(self.conn.execute(
            "SELECT count(*) FROM chunks c LEFT JOIN documents d ON d.id = c.doc_id WHERE d.id IS NULL").fetchone()[0])

    def latest_mismatch(self) -> int:
        return int(self.conn.execute(
            "SELECT count(*) FROM chunks c JOIN documents d ON d.id = c.doc_id WHERE c.latest != d.latest"
        ).fetchone()[0])

    def real_counts(self) -> tuple[int, int, int]:
        """(latest documents, latest chunks, total length of latest chunks) counted from the rows."""
        docs = self.conn.execute("SELECT count(*) FROM documents WHERE latest = 1").fetchone()[0]
        n, total = self.conn.execute(
            "SELECT count(*), coalesce(sum(length), 0) FROM chunks WHERE latest = 1").fetchone()
        return int(docs), int(n), int(total)

    def stored_counts(self) -> tuple[int, int]:
        d = self.conn.execute("SELECT count(*) FROM documents").fetchone()[0]
        c = self.conn.execute("SELECT count(*) FROM chunks").fetchone()[0]
        return int(d), int(c)

    def duplicate_latest_sources(self) -> int:
        return int(self.conn.execute(
            "SELECT count(*) FROM (SELECT source FROM documents WHERE latest = 1 GROUP BY source HAVING count(*) > 1)"
        ).fetchone()[0])

    def vacuum_analyze(self) -> None:
        with self.lock:
            try:
                self.conn.execute("ANALYZE")
                self.conn.execute("VACUUM")
                if self.path != ":memory:":
                    self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            except sqlite3.Error as e:
                raise _translate(e, self.path) from e

    def file_size(self) -> int:
        if self.path == ":memory:":
            page_count = self.conn.execute("PRAGMA page_count").fetchone()[0]
            page_size = self.conn.execute("PRAGMA page_size").fetchone()[0]
            return int(page_count * page_size)
        total = 0
        for suffix in ("", "-wal"):
            try:
                total += os.path.getsize(self.path + suffix)
            except OSError:
                pass
        return total

    # Reads for check(): every packed or text column comes with its storage class
    # (typeof) and as a blob (CAST ... AS BLOB), so a value of the wrong kind, or
    # text that is not UTF-8, is read without raising and reported by the caller.
    def packed_forward_rows(self) -> Iterator[tuple[int, str, bytes | None, str, bytes | None]]:
        """(id, typeof terms, terms, typeof tfs, tfs) of every chunk by id (streamed)."""
        yield from self.conn.execute(
            "SELECT id, typeof(terms), CAST(terms AS BLOB), typeof(tfs), CAST(tfs AS BLOB) FROM chunks ORDER BY id")

    def packed_postings_rows(self) -> Iterator[tuple[int, int, Any, str, bytes | None, str, bytes | None]]:
        """(term id, segment, n, typeof chunk_ids, chunk_ids, typeof tfs, tfs) of every segment,
        by term id then segment (streamed)."""
        yield from self.conn.execute(
            "SELECT term_id, segment, n, typeof(chunk_ids), CAST(chunk_ids AS BLOB), typeof(tfs), "
            "CAST(tfs AS BLOB) FROM postings ORDER BY term_id, segment")

    def packed_log_rows(self) -> Iterator[tuple[int, int, str, bytes | None]]:
        """(seq, chunk id, typeof terms, terms) of the chunk_log entries with terms, by seq."""
        yield from self.conn.execute(
            "SELECT seq, chunk_id, typeof(terms), CAST(terms AS BLOB) FROM chunk_log "
            "WHERE terms IS NOT NULL ORDER BY seq")

    def document_filter_blocks(self, rows: int = 4096) -> Iterator[list[tuple[int, Any, Any]]]:
        """(id, metadata json, acl json) of every document by id, in blocks of ``rows``
        (each block one query, after the last id of the one before)."""
        after = -(1 << 63)
        while block := self.conn.execute("SELECT id, metadata, acl FROM documents WHERE id > ? ORDER BY id LIMIT ?",
                                          [after, rows]).fetchall():
            yield block
            after = block[-1][0]

    def filter_index_rows(self, after_doc: int, upto_doc: int
                          ) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
        """The filter index rows of documents ``after_doc < id <= upto_doc``: (doc id, key,
        value, num, at) of doc_meta and (doc id, label) of doc_acl, whether or not such a
        document exists."""
        meta = self.conn.execute("SELECT doc_id, key, value, num, at FROM doc_meta WHERE doc_id > ? AND doc_id <= ?",
                                 [after_doc, upto_doc]).fetchall()
        acl = self.conn.execute("SELECT doc_id, label FROM doc_acl WHERE doc_id > ? AND doc_id <= ?",
                                [after_doc, upto_doc]).fetchall()
        return meta, acl

    def clear_filter_index(self) -> None:
        """Delete every row of the filter index (doc_meta, doc_acl), to write it anew."""
        self.conn.execute("DELETE FROM doc_meta")
        self.conn.execute("DELETE FROM doc_acl")

    def document_text_blocks(self, rows: int = 256, max_bytes: int = 16 << 20
                             ) -> Iterator[list[tuple[int, bytes | None, str, bytes | None]]]:
        """(id, content_hash, typeof text, text) of every document by id, the hash and text as
        bytes (never decoded), in blocks of at most ``rows`` rows or about ``max_bytes`` of text."""
        cur = self.conn.execute(
            "SELECT id, CAST(content_hash AS BLOB), typeof(text), CAST(text AS BLOB) FROM documents ORDER BY id")
        block: list[tuple[int, bytes | None, str, bytes | None]] = []
        held = 0
        for row in cur:
            block.append(row)
            held += len(row[3] or b"")
            if len(block) >= rows or held >= max_bytes:
                yield block
                block, held = [], 0
        if block:
            yield block

    # -- copying between databases (ragdb.files.transfer.copy_database) ---------------------
    def table_rows(self, table: str, columns: Sequence[str]) -> Iterator[tuple[Any, ...]]:
        """Every row of the per-collection ``table`` (one of :data:`COPY_TABLES`, with its
        ``columns``), in :data:`COPY_ORDER`, streamed (call inside a read)."""
        cols = copy_columns(table, columns)
        order = ", ".join('"end"' if c == "end" else c for c in COPY_ORDER[table])
        yield from self.conn.execute(f"SELECT {cols} FROM {table} ORDER BY {order}")

    def insert_table_rows(self, table: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> int:
        """Insert rows that :meth:`table_rows` of either backend read (in a write transaction);
        returns how many."""
        cols = copy_columns(table, columns)
        batch = [tuple(r) for r in rows]
        if batch:
            self.conn.executemany(f"INSERT INTO {table} ({cols}) VALUES ({','.join('?' * len(columns))})", batch)
        return len(batch)

    def clear_table(self, table: str) -> None:
        """Delete every row of a copied table (the target's initial rows, before a copy)."""
        copy_columns(table, COPY_COLUMNS.get(table, ()))
        self.conn.execute(f"DELETE FROM {table}")

    def finish_copy(self) -> None:
        """After a copy into this collection (SQLite's rowids continue by themselves)."""

    def chunk_texts(self, after_doc: int, upto_doc: int) -> list[tuple[int, int, Any, Any, str, bytes | None]]:
        """(id, doc id, start, end, typeof text, text as bytes or None) of the chunks of the
        documents with after_doc < id <= upto_doc, by document then chunk id."""
        return self.conn.execute(
            'SELECT id, doc_id, start, "end", typeof(text), CAST(text AS BLOB) FROM chunks '
            "WHERE doc_id > ? AND doc_id <= ? ORDER BY doc_id, id", [after_doc, upto_doc]).fetchall()


_MAX_INTERSECT = 100  # SQLite allows 500 terms in a compound SELECT


def _chunks(items: list[Any], size: int = _PARAM_CHUNK) -> Iterator[list[Any]]:
    for i in range(0, len(items), size):
        yield items[i:i + size]
