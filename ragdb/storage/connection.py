"""The store's connection: opening a file, the schema and its migrations, transactions,
collections, the settings and the statistics row (a section of :class:`ragdb.storage.store.Store`).

Migrations are the numbered SQL files of ``migrations/``, applied by sqlite-utils in
one write transaction; every collection gets each statement on its own tables.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any
from collections.abc import Callable, Iterator, Sequence

if TYPE_CHECKING:
    import sqlite_utils

from ragdb.errors import DatabaseBusy, InvalidInput, NotADatabase, SchemaTooNew, StorageError, TextDamaged
from ragdb.storage import collections as _coll
from ragdb.storage.base import StoreBase
from ragdb.storage.base import translate as _translate
from ragdb.storage.codec import dumps, iso_instant, loads, utcnow_iso
from ragdb.storage import textcodec as _text

MIGRATION_SET = "ragdb"


def migrations_dir() -> Path:
    """The folder of numbered ``NNNN_name.sql`` migrations.

    In a wheel they are packaged as ``ragdb/_migrations``; in a source
    checkout (editable install) they are the top-level ``migrations/``.
    """
    # ragdb's own folder, from this file's path (what importlib.resources.files("ragdb") gives for
    # a package on the file system, the only way ragdb is installed: its migrations were always
    # read as files): importing importlib.resources costs every ragdb start some 8 ms (tempfile,
    # shutil, the compression modules), for one folder name
    packaged = Path(__file__).parent.parent / "_migrations"
    if packaged.is_dir():
        return packaged
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

        def apply(db: sqlite_utils.Database, _sql: str = sql, _name: str = path.stem) -> None:
            _register_functions(db.conn)
            statements = _split_sql(_sql)
            for stmt in statements:
                db.conn.execute(stmt)
            # every collection besides the default gets the statements on its tables too
            for cid in _collection_ids(db.conn):
                for stmt in _coll.collection_ddl(statements, cid):
                    db.conn.execute(stmt)
            step = _PYTHON_STEPS.get(_name)
            if step is not None:  # what SQL alone cannot do, on every collection
                step(db.conn, [0, *_collection_ids(db.conn)])

        migrations(name=path.stem)(apply)
        if stop_after == path.stem:
            break
    return migrations


#: Migrations with a step in Python after their SQL: (connection, collection ids) -> None.
_PYTHON_STEPS = {"0010_compressed_text": _text.compress_stored}


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

    __slots__ = ("raw", "lock", "reading", "writing", "db", "closed", "codec", "rollbacks")

    def __init__(self, raw: sqlite3.Connection, lock: threading.RLock) -> None:
        self.raw = raw
        #: compressed text's (de)compressors and dictionaries (:mod:`ragdb.storage.textcodec`)
        self.codec = _text.new_codec(raw)
        _text.register_functions(raw, self.codec)
        self.lock = lock
        self.reading = False  # a read transaction (``read``) is open: writes must not nest in it
        self.writing = False  # a write transaction (``write``) is open: the connection may not close
        self.closed = False  # closed by its owner's close(): a second close does nothing
        #: writes undone on this connection (a transaction or savepoint rolled back): see
        #: :meth:`ConnectionSQL.rollbacks`
        self.rollbacks = 0
        self.db: sqlite_utils.Database | None = None


class ConnectionSQL(StoreBase):
    """Opening, migrations, transactions, collections, settings and statistics of
    :class:`ragdb.storage.store.Store` (see the module docstring)."""

    # -- opening -----------------------------------------------------------------------------
    def __init__(self, path: str, *, busy_timeout: float = 30.0, readonly: bool = False,
                 create: bool = True) -> None:
        self.path = path
        self.lock = threading.RLock()
        self.owner = True  # closing this store closes the connection
        self.readonly = readonly
        memory = path == ":memory:"
        if not memory:
            p = Path(path)
            try:  # (the path's probes: a name too long or a folder not to be entered raise OSError)
                exists, is_dir = p.exists(), p.is_dir()
                nonempty = p.is_file() and p.stat().st_size > 0
                no_folder = not exists and not p.parent.is_dir()
            except OSError as e:
                raise StorageError(f"{path}: cannot open the database: {e.strerror or e}") from None
            if not exists and (readonly or not create):
                raise NotADatabase(f"{path}: no such database file")
            if exists and is_dir:
                raise NotADatabase(f"{path}: is a directory, not a database file")
            if nonempty and not _OPEN_FILES.holds(p):
                try:
                    with open(p, "rb") as fh:
                        head = fh.read(16)
                except OSError as e:
                    raise StorageError(f"{path}: cannot read the file: {e.strerror or e}") from None
                if head != b"SQLite format 3\x00":
                    raise NotADatabase(f"{path}: not a database file (it does not start with SQLite's header); "
                                       f"check the path")
            if no_folder:
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

    # -- collections -------------------------------------------------------------------------
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
        # its text dictionaries are kept (a dictionary id is never reused: another connection may
        # hold one in its cache) but retired, never compressed with again
        raw.execute(f"UPDATE {_text.DICT_TABLE} SET collection_id = -1 WHERE collection_id = ?", [collection_id])

    def collection_exists(self) -> bool:
        """Whether this store's collection is still registered (not dropped), under its name:
        the id of one whose creation a rollback undid is handed out again (AUTOINCREMENT's
        counter is rolled back too)."""
        return self.shared.raw.execute("SELECT 1 FROM collections WHERE id = ? AND name = ?",
                                        [self.collection_id, self.collection]).fetchone() is not None

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

    # -- opening and migrations --------------------------------------------------------------
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
            if "chunk_log" not in tables:
                # 0001_initial.sql was edited during ragdb's first day of development (before any
                # release): a file made before then has a schema 1 no migration leads from
                raise NotADatabase(f"{self.path}: made by a development build of ragdb from before its first "
                                   f"release, whose schema cannot be migrated (it lacks the table chunk_log); "
                                   f"export it with that build (ragdb export) and import the file into a new "
                                   f"database (ragdb import)")
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
        # 4 MiB of page cache (the default is 2 MiB). Hit texts are served from
        # the index's own row cache and the OS page cache; a larger SQLite
        # cache (16 MiB was tried) mostly raised a reader's memory at 100k docs.
        # The default 2 MiB held 2.2 MiB less in a reader (and ~7 MiB less in a
        # bulk load) but slowed k=100 searches of the realistic 10k corpus ~6%
        # (p50 1.76 vs 1.65 ms, medians of 5 runs each, interleaved).
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

    # -- transactions ------------------------------------------------------------------------
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
                try:
                    with self.db.atomic():
                        yield self.conn
                except BaseException:
                    self.shared.rollbacks += 1
                    self.shared.codec.forget()  # a text dictionary it stored is undone (its id may come again)
                    raise
                return
            try:
                self.conn.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as e:
                raise _translate(e, self.path) from e
            self.shared.writing = True
            try:
                yield self.conn
                self.shared.writing = False
                self.conn.execute("COMMIT")
            except sqlite3.Error as e:
                self._rollback()
                self.shared.rollbacks += 1
                self.shared.codec.forget()  # a text dictionary it stored is undone (its id may come again)
                raise _translate(e, self.path) from e
            except BaseException:
                self._rollback()
                self.shared.rollbacks += 1
                self.shared.codec.forget()
                raise
            finally:
                self.shared.writing = False

    def rollbacks(self) -> int:
        """How many writes were rolled back on this connection (by any collection's store
        on it): a view of the file kept in memory by a write that a rollback undid may hold
        what the file no longer does (``Engine.sync`` drops it when this changes)."""
        return self.shared.rollbacks

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
                self._open_or_refuse()  # (closed while the read was open: say so, not SQLite's words)
                raise _translate(e, self.path) from e
            finally:
                self.shared.reading = False
                self._rollback()

    def refuse_close_in_write(self) -> None:
        """Refuse to close this store's connection inside a write transaction of this thread
        (another thread's write holds the lock until it ends): the block's writes would be
        committed on a closed connection. A store that does not own its connection closes
        nothing, and refuses nothing."""
        if self.owner and self.shared.writing and not self.shared.closed:
            raise InvalidInput(f"{self.path}: cannot close the database inside a write transaction "
                               f"(a db.transaction() block); close it after the block")

    def _open_or_refuse(self) -> None:
        if self.shared.closed:
            raise StorageError(f"{self.path}: this database handle is closed; open the database again")

    def _rollback(self) -> None:
        if self.shared.closed:  # (a read closed under it: nothing to roll back, no connection to ask)
            return
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
            self.refuse_close_in_write()
            self._rollback()
            self.shared.raw.close()
            self.shared.closed = True
            if self.file_key is not None:
                _OPEN_FILES.remove(self.file_key)
                self.file_key = None

    # -- settings and statistics -------------------------------------------------------------
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

    # -- stored text (ragdb.storage.textcodec) ----------------------------------------------
    def text_codec(self) -> _text.TextCodec:
        return self.shared.codec

    def pack_texts(self, texts: Sequence[str | None], doc_ids: Sequence[int] = ()) -> list[str | bytes | None]:
        """What to store for each of ``texts`` (in a write transaction): compressed, in SQLite
        (:func:`ragdb.storage.textcodec.pack`; ``doc_ids``: the documents they are the texts
        of, when they are, so that a collection without a dictionary may train one)."""
        raw = self.shared.raw

        def stored() -> list[str]:  # the newest stored document texts, to train on
            out = []
            for kind, value in self.conn.execute(
                    "SELECT typeof(text), CAST(text AS BLOB) FROM documents ORDER BY id DESC LIMIT ?",
                    [_text.TRAIN_MAX_TEXTS]):
                try:  # a damaged text (check reports it) must not fail this write: left out
                    text = self._text(value) if kind == "blob" else bytes(value).decode("utf-8")
                except (TextDamaged, UnicodeDecodeError, TypeError):
                    continue
                if text:
                    out.append(text)
            return out

        return _text.pack(raw, self.shared.codec, self.collection_id, texts, doc_ids, stored)

    @contextlib.contextmanager
    def packing_ahead(self) -> Iterator[Callable[[Sequence[str]], None] | None]:
        """A bulk load's texts compressed in a background thread with the collection's
        dictionary, a batch ahead, for :meth:`pack_texts` to take when they are written
        (:class:`ragdb.storage.textcodec.AheadCompression`); nothing while the collection has
        no dictionary yet (the load's first write trains it). The thread ends with the block."""
        session = self.shared.codec.ahead()

        def ahead(texts: Sequence[str]) -> None:
            # Only a head start, so it never waits and never fails the load: with another
            # thread's write under way (whose dictionary may yet be rolled back) or on any
            # error, the write compresses these texts itself.
            if not self.lock.acquire(blocking=False):
                return
            try:
                dict_id = _text.current_dict(self.shared.raw, self.collection_id)
                if dict_id:
                    session.submit(texts, dict_id)
            except Exception:
                return
            finally:
                self.lock.release()

        try:
            yield ahead
        finally:
            session.close()

    def in_transaction(self) -> bool:
        """Whether a transaction of this connection is open (then writes nest as savepoints)."""
        return bool(self.conn.in_transaction)

    @contextlib.contextmanager
    def no_wait(self) -> Iterator[None]:
        """Inside, a write that finds the write lock held by another connection fails at once
        (:class:`~ragdb.errors.DatabaseBusy`) instead of waiting for the busy timeout: for what a
        read stores on the side (a measured calibration), which must not make the read wait for
        a writer. Inside a transaction of this connection (it holds the lock, or is a read that
        writes nothing) it changes nothing."""
        with self.lock:
            self._open_or_refuse()
            if self.conn.in_transaction:
                yield
                return
            waited = int(self.conn.execute("PRAGMA busy_timeout").fetchone()[0])
            self.conn.execute("PRAGMA busy_timeout = 0")
            try:
                yield
            finally:
                if not self.shared.closed:
                    self.conn.execute(f"PRAGMA busy_timeout = {waited}")

    def in_write(self) -> bool:
        """Whether a write transaction of this connection is open: what is read now may include
        writes that a rollback will undo."""
        return bool(self.shared.writing)

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
