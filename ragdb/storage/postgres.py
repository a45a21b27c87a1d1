"""The PostgreSQL store: the same methods and semantics as the SQLite :class:`Store`,
on a PostgreSQL database (``ragdb.open("postgresql://...")``; docs/postgresql.md).

:class:`PgStore` subclasses :class:`Store`: the engine calls the same methods
and gets the same values back. Statements that are plain SQL are inherited and
run through :class:`PgConnection`, which rewrites SQLite's ``?`` placeholders as
psycopg's ``%s`` (and renames the tables of a collection, like SQLite's
collection connection); every statement that uses something SQLite-specific
(``GLOB``, ``max(a, b)``, ``INSERT OR IGNORE``, ``typeof``, ``lastrowid``,
``LIMIT -1``, the untyped ``doc_meta.value``, PRAGMAs) is overridden here.
``tests/storage/test_postgres.py`` checks that nothing SQLite-only is left inherited.
The overrides are grouped by the sections :class:`Store` is assembled from
(``connection.py``, the dialect of ``base.py``, ``documents.py``, ``metadata.py``,
``lexical.py``, ``maintenance.py``, ``vectors.py``), and so is :data:`PLAIN_SQL`.

Transactions and locking (the "locking order" of docs/postgresql.md):

* a read is one ``REPEATABLE READ READ ONLY`` transaction: every statement in
  it sees one snapshot, so a reader sees whole writes only (as SQLite's WAL
  snapshot), on the primary or on a hot-standby replica;
* a write is one ``READ COMMITTED`` transaction whose first statement locks the
  collection's ``stats`` row (``SELECT ... FOR UPDATE``), as SQLite's
  ``BEGIN IMMEDIATE`` takes the file's write lock. Writers of a collection queue
  on that row and then see every earlier commit, so the engine's writes (ids
  from ``stats``, df, the change log, flushes) stay exact with any number of
  writer processes on any number of hosts. Every writer takes that row first
  and holds no other lock while waiting for it, so writers of one collection
  never deadlock; a transaction spanning collections locks each collection's
  row when it first writes it, and two of those taking the same collections in
  opposite orders are a deadlock PostgreSQL breaks by failing one of them
  (``DatabaseBusy``, nothing written). Migrations take a transaction-level
  advisory lock instead (the tables may not exist yet);
* waiting for the lock is bounded by ``busy_timeout`` (``lock_timeout``):
  ``DatabaseBusy`` after it, as with SQLite.

The connection comes from a psycopg_pool ``ConnectionPool`` of one connection
(a ``Database`` runs one statement at a time, as on SQLite): it is checked out
for each transaction and returned after it. A connection idle for more than
``check_after`` seconds is tested on checkout, so one that a server restart or
a failover broke is replaced (with back-off) before a transaction uses it; one
that breaks in the middle of a transaction fails that transaction only (the
pool discards it), and long-lived connections are recycled. Credentials never leave this module: ``path`` is the redacted
connection string, and every error text is scrubbed of the password.
"""

from __future__ import annotations

import contextlib
import logging
import math
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from ragdb.errors import CollectionNotFound, DatabaseBusy, DiskFull, InvalidInput, MissingDependency, NotADatabase, RagdbError, SchemaTooNew, StorageError
from ragdb.storage import collections as _coll
from ragdb.storage.backend import glob_regex, password_of, redact
from ragdb.storage.codec import dumps, loads, utcnow_iso
from ragdb.storage.conditions import COMPARE, Dialect, condition_sql, doc_set_sql
from ragdb.storage.base import CHUNK_STATE_SQL, NO_CODEC
from ragdb.storage.store import WHOLE_CHUNK, Store, migrations_dir
from ragdb.storage.textcodec import TextCodec

if TYPE_CHECKING:
    import sqlite3

    import psycopg

    import sqlite_utils

MIGRATIONS_TABLE = "ragdb_migrations"
_STATS = ("generation", "n_docs", "n_chunks", "total_length", "flushed_upto", "vocab_epoch", "flush_count",
          "next_doc_id", "next_chunk_id")  # the columns of Store.stats_row

# psycopg_pool reports failed connection attempts as warnings of this logger; with no
# handler configured Python would print them to stderr (the library never prints).
logging.getLogger("psycopg.pool").addHandler(logging.NullHandler())


def _psycopg() -> Any:
    try:
        import psycopg  # noqa: F401
        import psycopg_pool  # noqa: F401
    except ImportError as e:
        raise MissingDependency.of("psycopg (with psycopg_pool)", "postgres", e) from None
    return psycopg


def _as_written(given: Any, value: int) -> int | float:
    """``value`` as the document's metadata ``given`` (a value or a list) holds it: the float
    equal to it when it holds one and no equal integer (of equal values facets show the integer)."""
    equal = [x for x in (given if isinstance(given, list) else (given,)) if type(x) in (int, float) and x == value]
    return value if not equal or any(type(x) is int for x in equal) else float(value)


def pg_migration_files() -> list[Path]:
    """The numbered PostgreSQL migrations (``migrations/postgresql/NNNN_name.sql``)."""
    return sorted(p for p in (migrations_dir() / "postgresql").glob("[0-9][0-9][0-9][0-9]_*.sql"))


def split_statements(script: str) -> list[str]:
    """The statements of a migration: each ends with ``;`` at the end of a line;
    comment lines are dropped."""
    out: list[str] = []
    buf: list[str] = []
    for line in script.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("--"):
            continue
        buf.append(line)
        if stripped.endswith(";"):
            out.append("\n".join(buf).strip().rstrip(";"))
            buf = []
    if buf:
        raise StorageError(f"incomplete SQL statement in a PostgreSQL migration: {' '.join(buf)[:80]!r}")
    return out


# -- statements ------------------------------------------------------------------------
_PLACEHOLDER = re.compile(r"""('(?:[^']|'')*')|(\?)|(%)""")


def _to_psycopg(sql: str) -> str:
    """SQLite's ``?`` placeholders as psycopg's ``%s`` (and ``%`` as ``%%``), outside literals."""
    def sub(m: re.Match[str]) -> str:
        if m.group(1) is not None:
            return m.group(1).replace("%", "%%")
        return "%s" if m.group(2) is not None else "%%"

    return _PLACEHOLDER.sub(sub, sql)


class _Rows:
    """The rows of a statement run outside a transaction (fetched before the
    connection went back to the pool), read like a cursor."""

    __slots__ = ("rows", "rowcount", "_i")

    def __init__(self, rows: list[tuple[Any, ...]], rowcount: int) -> None:
        self.rows = rows
        self.rowcount = rowcount
        self._i = 0

    def fetchone(self) -> tuple[Any, ...] | None:
        if self._i >= len(self.rows):
            return None
        self._i += 1
        return self.rows[self._i - 1]

    def fetchall(self) -> list[tuple[Any, ...]]:
        out = self.rows[self._i:]
        self._i = len(self.rows)
        return out

    def fetchmany(self, size: int) -> list[tuple[Any, ...]]:
        out = self.rows[self._i:self._i + size]
        self._i += len(out)
        return out

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        while (row := self.fetchone()) is not None:
            yield row


class _PgShared:
    """What the stores of one database's collections share: the pool, the connection
    of the open transaction (None between transactions), and its state."""

    def __init__(self, pool: Any, lock: threading.RLock, path: str, secret: str | None) -> None:
        self.pool = pool
        self.lock = lock
        self.path = path
        self.secret = secret
        self.conn: psycopg.Connection[Any] | None = None
        self.begin: str | None = None  # the BEGIN of the open transaction, until its first statement sends it
        # (collection id, stats row) read by the write lock's statement, for the stats_row() that
        # follows it at once (Engine.sync); any other statement in between drops it
        self.stats_hint: tuple[int, dict[str, int]] | None = None
        self.reading = False
        self.depth = 0          # savepoints open in the transaction
        self.rollbacks = 0      # writes rolled back (PgStore.rollbacks)
        self.locked: set[int] = set()  # collections whose stats row this transaction locked
        self.closed = False
        self.busy_timeout = 30.0
        self.readonly = False
        #: a connection idle for longer than this many seconds is tested (SELECT 1) before a
        #: transaction uses it: one a server restart or failover broke is replaced, not failed on
        self.check_after = 2.0
        self.returned: dict[int, float] = {}  # id(connection) -> when it last went back to the pool

    def check(self, conn: psycopg.Connection[Any]) -> None:
        """The pool's check of a connection it hands out (raising discards it)."""
        last = self.returned.get(id(conn))
        if last is not None and time.monotonic() - last < self.check_after:
            return
        conn.execute("SELECT 1")

    def scrub(self, text: str) -> str:
        """``text`` without the password (as written in the URL, and decoded)."""
        if self.secret:
            from urllib.parse import quote

            for form in {self.secret, quote(self.secret, safe=""), quote(self.secret)}:
                text = text.replace(form, "***")
        return text

    def checkout(self) -> psycopg.Connection[Any]:
        if self.closed:
            raise StorageError(f"{self.path}: the database is closed")
        import psycopg_pool

        try:
            conn: psycopg.Connection[Any] = self.pool.getconn(timeout=self.busy_timeout)
        except psycopg_pool.PoolTimeout:
            raise StorageError(f"{self.path}: cannot connect to the PostgreSQL server within "
                               f"{self.busy_timeout:g} s{self._why()}") from None
        return conn

    def _why(self) -> str:
        """The reason the pool cannot connect: one direct attempt, for its error text."""
        import psycopg

        try:
            psycopg.connect(self.pool.conninfo, connect_timeout=5, **self.pool.kwargs).close()
        except psycopg.Error as e:
            return ": " + " ".join(self.scrub(str(e)).split())
        return ""

    def checkin(self, conn: psycopg.Connection[Any]) -> None:
        self.returned[id(conn)] = time.monotonic()
        try:
            self.pool.putconn(conn)
        except Exception:  # pragma: no cover - a pool closed meanwhile
            with contextlib.suppress(Exception):
                conn.close()


class PgConnection:
    """A collection's view of the database connection, with the call shapes of
    ``sqlite3.Connection`` that :class:`Store`'s statements use: each statement's
    placeholders (and, for a collection other than the default, its table names)
    are rewritten once per distinct statement."""

    __slots__ = ("shared", "collection_id", "_cache")

    def __init__(self, shared: _PgShared, collection_id: int) -> None:
        self.shared = shared
        self.collection_id = collection_id
        self._cache: dict[str, str] = {}

    def rewrite(self, sql: str) -> str:
        out = self._cache.get(sql)
        if out is None:
            if len(self._cache) > 4096:
                self._cache.clear()
            out = self._cache[sql] = _to_psycopg(_coll.rename(sql, self.collection_id))
        return out

    def execute(self, sql: str, parameters: Sequence[Any] = (), /) -> Any:
        return self.run(self.rewrite(sql), parameters)

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]], /) -> Any:
        self.shared.stats_hint = None
        conn = self.shared.conn
        query = self.rewrite(sql)
        if conn is None:
            with self._oneoff() as c:
                cur = c.cursor()
                cur.executemany(query, list(rows))
                return _Rows([], cur.rowcount)
        self.send_begin(conn)
        cur = conn.cursor()
        cur.executemany(query, rows)
        return cur

    def send_begin(self, conn: psycopg.Connection[Any]) -> None:
        """Send the transaction's BEGIN if it is still pending."""
        begin = self.shared.begin
        if begin is not None:
            self.shared.begin = None
            conn.execute(begin)

    def run(self, query: str, parameters: Sequence[Any] = (), *, binary: bool = False) -> Any:
        """``query`` (psycopg's placeholders, names already renamed) on the transaction's
        connection, or on its own outside one."""
        self.shared.stats_hint = None
        conn = self.shared.conn
        if conn is None:
            with self._oneoff() as c:
                cur = c.execute(query, list(parameters), binary=binary)
                return _Rows(cur.fetchall() if cur.description is not None else [], cur.rowcount)
        begin = self.shared.begin
        if begin is not None:  # the transaction's BEGIN and its first statement in one round trip
            self.shared.begin = None
            with conn.pipeline():
                conn.execute(begin)
                cur = conn.execute(query, list(parameters), binary=binary)
            return cur
        return conn.execute(query, list(parameters), binary=binary)

    @contextlib.contextmanager
    def _oneoff(self) -> Iterator[psycopg.Connection[Any]]:
        import psycopg

        shared = self.shared
        with shared.lock:
            conn = shared.checkout()
            try:
                yield conn
            except psycopg.Error as e:
                raise translate(e, shared) from None
            finally:
                shared.checkin(conn)

    @property
    def in_transaction(self) -> bool:
        return self.shared.conn is not None

    def close(self) -> None:  # pragma: no cover - stores close through PgStore.close
        pass


_DROPPED = re.compile(r'relation "(?:[^"]*\.)?c(\d+)_[a-z_]+" does not exist')


def translate(err: Exception, shared: _PgShared) -> RagdbError:
    """A psycopg error as ragdb's, its text scrubbed of the password."""
    import psycopg

    path = shared.path
    msg = " ".join(shared.scrub(str(err)).split())
    code = getattr(err, "sqlstate", None) or ""
    if _DROPPED.search(msg):
        return CollectionNotFound(f"{path}: the collection this handle reads was dropped (by this or another "
                                  f"process); open the collection again, or another one")
    if code in ("55P03", "40P01", "40001", "57014"):  # lock timeout, deadlock, serialization, cancelled
        what = {"55P03": "another writer held the collection's lock for longer than the busy timeout",
                "40P01": "a deadlock with another transaction (one writing the same collections in another "
                         "order); nothing was written, retry",
                "40001": "a conflict with a concurrent change (on a replica: with the replication of a "
                         "change); nothing was written, retry",
                "57014": "the statement was cancelled (timeout)"}[code]
        return DatabaseBusy(f"{path}: {what}: {msg}")
    if code == "25006" or "read-only transaction" in msg:
        return StorageError(f"{path}: the database is read-only (opened read-only, or a hot-standby replica): "
                            f"{msg}")
    if "NUL (0x00)" in msg or code == "22P05" or "\\u0000" in msg:
        return InvalidInput(f"{path}: PostgreSQL text cannot hold NUL characters (U+0000), to store or to "
                            f"look up, and this input (text, metadata, a filter, a source, a label) holds "
                            f"one: {msg}")
    if code == "54000":  # program_limit_exceeded: a btree entry over 2,704 bytes
        return InvalidInput(f"{path}: PostgreSQL indexes a metadata value, a source or an access label of "
                            f"at most ~2,700 bytes, and this one is longer (SQLite has no such limit; keep "
                            f"long text in the document's text): {msg}")
    if code == "3F000" or "no schema has been selected" in msg:
        return StorageError(f"{path}: the schema of the connection's search_path does not exist; create it "
                            f"first (CREATE SCHEMA ...): {msg}")
    if code in ("53100",):
        return DiskFull(f"{path}: the disk is full; nothing was written: {msg}")
    if isinstance(err, psycopg.OperationalError):
        return StorageError(f"{path}: the connection to the PostgreSQL server failed: {msg}")
    return StorageError(f"{path}: {msg}")


def _exact(value: Any) -> Any:
    """A number as numeric compares it: ints as they are, floats as their exact binary value."""
    if isinstance(value, float):
        return Decimal(value)
    return value


def _jsonb(value: Any) -> Any:
    """A doc_meta value (or a filter's) as jsonb. jsonb holds a number as the decimal it is
    written as, and a float is written as its shortest round trip (``2.0**60`` as
    ``1.152921504606847e+18``, the integer 1152921504606847000): a float that is a whole
    number past 2**53 goes as the integer it is, so it equals the int a filter names, as
    SQLite compares them."""
    from psycopg.types.json import Jsonb

    if isinstance(value, float) and math.isfinite(value) and value.is_integer() and abs(value) >= 2 ** 53:
        whole = str(int(value))  # (JSON's number, of any size: orjson writes ints of 64 bits at most)
        return Jsonb(value, dumps=lambda _v: whole)
    return Jsonb(value, dumps=dumps)


def _meta_row(row: Sequence[Any]) -> tuple[Any, ...]:
    """A doc_meta row (doc id, key, value, num, at) as PostgreSQL stores it."""
    doc_id, key, value, num, at = row
    return doc_id, key, _jsonb(value), None if num is None else _exact(num), at


#: The :class:`Store` methods PgStore inherits, by the section (module) that defines them: their
#: SQL is plain (it runs on PostgreSQL as it is, ``?`` rewritten), or they only call other methods.
#: Every other method is overridden in :class:`PgStore`, under the same sections; tests/storage/test_postgres.py fails when a Store method is in neither group, so a method
#: added to Store is looked at for PostgreSQL before it ships.
PLAIN_SQL = (
    # connection.py
    "_open_or_refuse", "generation", "in_transaction", "set_setting", "settings",
    # base.py: the filter SQL, built from the dialect's pieces; stored texts as read (PostgreSQL's are
    # always str, which _text and _texts pass through)
    "_filter_sql", "_text", "_texts",
    # documents.py
    "chunk_metadata", "chunk_sort_keys", "chunk_table", "count_chunks_since", "count_documents", "doc_chunks",
    "doc_hit_rows", "doc_row", "doc_source", "hit_rows", "insert_chunks", "insert_documents", "iter_chunk_spans",
    "iter_documents", "latest_by_source", "list_documents", "max_chunk_id", "newest_older_version", "set_latest",
    "set_valid_to", "source_docs_with_chunks", "source_versions", "texts_by_id",
    # metadata.py
    "clear_filter_index", "doc_rows_matching", "document_filter_blocks", "filter_index_rows", "filtered_chunk_ids",
    "filtered_doc_ids", "has_metadata_key", "has_private_labels",
    # lexical.py
    "_new_term_ids", "add_df", "add_new_terms", "add_terms", "all_dfs", "all_term_ids", "bump_vocab_epoch",
    "has_bulk_terms", "settle_bulk_terms",
    "chunk_state_snapshot", "chunk_texts_after",
    "clear_lexical_index", "dead_terms", "delete_segments", "field_term_ids", "finish_flush", "finish_reindex",
    "frequent_term_ids", "has_postings", "has_term_with_prefix", "insert_segments", "log_seq", "log_since",
    "next_term_id", "posting_counts", "segment_counts", "segment_counts_all", "segment_total",
    "set_chunk_state_snapshot", "set_forward_indexes", "settle_new_terms", "term_id_map",
    "term_ids", "term_ids_after", "terms_of_ids", "terms_with_prefix", "vocabulary_size",
    # maintenance.py
    "bulk_term_counts", "latest_mismatch", "new_term_counts", "orphan_chunks", "real_counts", "stored_counts",
    # vectors.py
    "_bump_vector_epoch", "_decode_vectors", "_existing_chunks", "_insert_vectors", "_maybe_cut_vector_log",
    "_write_vector_model", "all_vectors", "chunk_text_sample", "chunk_texts_of", "copy_vectors", "doc_vectors",
    "embedded_upto", "has_chunks", "has_vectors", "hashed_vector_texts", "orphan_vectors", "put_vectors",
    "reset_vector_model", "set_text_hashes", "set_vector_model", "unembedded_below_watermark", "unembedded_count",
    "unhashed_vectors", "vector_count", "vector_model", "vector_version", "vectors_by_hash", "vectors_changed_since",
    "vectors_for",
)


class PgStore(Store):
    """One knowledge base (a collection) in a PostgreSQL database; see the module docstring."""

    backend = "postgresql"
    shared: _PgShared  # type: ignore[assignment]

    # -- connection (connection.py): opening and migrations ------------------------------------------
    def __init__(self, path: str, *, busy_timeout: float = 30.0, readonly: bool = False,
                 create: bool = True, _check: bool = True) -> None:
        _psycopg()
        from psycopg_pool import ConnectionPool

        self.conninfo = path  # only ever given to libpq
        self.path = redact(path)
        self.lock = threading.RLock()
        self.owner = True
        self.readonly = readonly
        self.immutable = False
        secret = password_of(path)

        def configure(conn: psycopg.Connection[Any]) -> None:
            conn.execute("SELECT set_config('lock_timeout', %s, false)", [str(int(busy_timeout * 1000))])
            if readonly:
                conn.execute("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY")

        def check(conn: psycopg.Connection[Any]) -> None:
            self.shared.check(conn)

        pool = ConnectionPool(path, min_size=1, max_size=1, open=False, configure=configure, check=check,
                              kwargs={"autocommit": True}, name="ragdb", num_workers=1, timeout=busy_timeout)
        self.shared = _PgShared(pool, self.lock, self.path, secret)
        self.shared.busy_timeout = busy_timeout
        self.shared.readonly = readonly
        self.conn = cast("sqlite3.Connection", PgConnection(self.shared, 0))
        try:
            self._probe(busy_timeout)
            pool.open(wait=False)
            if _check:
                self._open_pg(readonly=readonly, create=create)
        except BaseException:
            self.shared.closed = True
            pool.close()
            raise

    def _probe(self, busy_timeout: float) -> None:
        """One direct connection first: a wrong password, a missing database or an
        unreachable server fails at once with libpq's reason (the pool would retry
        with back-off until the timeout, and say only that it timed out)."""
        import psycopg

        try:
            psycopg.connect(self.conninfo, connect_timeout=max(2, min(int(busy_timeout), 30))).close()
        except psycopg.Error as e:
            raise StorageError(f"{self.path}: cannot connect to the PostgreSQL server: "
                               f"{' '.join(self.shared.scrub(str(e)).split())}") from None

    @property
    def pg(self) -> PgConnection:
        return cast(PgConnection, self.conn)

    @property
    def db(self) -> sqlite_utils.Database:  # pragma: no cover - SQLite only
        raise StorageError(f"{self.path}: sqlite-utils does not apply to a PostgreSQL database")

    def _open(self, *, readonly: bool, memory: bool, busy_timeout: float) -> None:  # pragma: no cover
        raise StorageError("SQLite's open does not apply to a PostgreSQL database")

    def _connect_readonly(self, path: str, busy_timeout: float) -> sqlite3.Connection:  # pragma: no cover
        raise StorageError("SQLite's read-only open does not apply to a PostgreSQL database")

    def _use_wal(self, busy_timeout: float) -> None:  # pragma: no cover
        raise StorageError("SQLite's WAL mode does not apply to a PostgreSQL database")

    def _open_pg(self, *, readonly: bool, create: bool) -> None:
        known = [p.stem for p in pg_migration_files()]
        with self.read():
            exists = self.pg.run("SELECT to_regclass(%s) IS NOT NULL", [MIGRATIONS_TABLE]).fetchone()[0]
            schema = self.pg.run("SELECT current_schema()").fetchone()[0]
            applied = self._applied() if exists else []
            foreign = [] if exists else [r[0] for r in self.pg.run(
                "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() "
                "AND tablename IN ('documents', 'chunks', 'settings', 'stats', 'collections') ORDER BY 1")]
        where = f"{self.path} (schema {schema!r})" if schema else self.path
        if foreign:
            raise NotADatabase(f"{where}: has tables {', '.join(foreign)} but no ragdb schema; use another "
                               f"database or schema (options=-csearch_path=NAME)")
        if exists:
            unknown = [name for name in applied if name not in known]
            if unknown:
                raise SchemaTooNew(f"{self.path}: written by a newer ragdb (PostgreSQL schema {unknown[-1]}; "
                                   f"this ragdb knows up to {known[-1]}); upgrade ragdb to open it")
        elif readonly or not create:
            raise NotADatabase(f"{where}: no ragdb database here (no {MIGRATIONS_TABLE} table)"
                               + ("; a read-only open never creates one" if readonly else ""))
        if schema is None:
            raise StorageError(f"{self.path}: the schema of the connection's search_path does not exist; create "
                               f"it first (CREATE SCHEMA ...)")
        if readonly:
            if len(applied) < len(known):
                raise StorageError(f"{self.path}: needs a schema migration, which a read-only open cannot do")
            return
        self.migrate()

    def _applied(self) -> list[str]:
        return [r[0] for r in self.pg.run(f"SELECT name FROM {MIGRATIONS_TABLE} ORDER BY id")]

    def migrate(self, stop_after: str | None = None) -> list[str]:
        """Apply pending PostgreSQL migrations in one transaction (under an advisory
        lock: concurrent openers wait, then find them applied); returns their names."""
        files = pg_migration_files()
        names = [p.stem for p in files]
        if stop_after is not None and stop_after in names:
            files = files[:names.index(stop_after) + 1]
        with self.read():
            if self.pg.run("SELECT to_regclass(%s) IS NOT NULL", [MIGRATIONS_TABLE]).fetchone()[0] \
                    and {p.stem for p in files} <= set(self._applied()):
                return []
        with self._transaction("migrate"):
            pg = self.pg
            pg.run(f"CREATE TABLE IF NOT EXISTS {MIGRATIONS_TABLE} (id integer PRIMARY KEY, "
                   f"name text NOT NULL UNIQUE, applied_at text NOT NULL)")
            done = set(self._applied())
            pending = [p for p in files if p.stem not in done]
            ids = [int(r[0]) for r in pg.run("SELECT id FROM collections WHERE id != 0 ORDER BY id")] \
                if pg.run("SELECT to_regclass('collections') IS NOT NULL").fetchone()[0] else []
            for path in pending:
                statements = split_statements(path.read_text(encoding="utf-8"))
                for stmt in statements:
                    pg.run(stmt)
                for cid in ids:
                    for stmt in _coll.collection_ddl(statements, cid):
                        pg.run(stmt)
                pg.run(f"INSERT INTO {MIGRATIONS_TABLE} (id, name, applied_at) VALUES (%s, %s, %s)",
                       [int(path.stem[:4]), path.stem, utcnow_iso()])
        return [p.stem for p in pending]

    # -- connection (connection.py): transactions ----------------------------------------------------
    @contextlib.contextmanager
    def _transaction(self, lock: str) -> Iterator[Any]:
        """An outermost transaction: ``lock`` is "read" (a read-only snapshot),
        "write" (lock the collection's stats row first) or "migrate"."""
        import psycopg

        shared = self.shared
        conn = shared.checkout()
        shared.conn = conn
        try:
            if lock == "read":
                # sent with the read's first statement, in one round trip (PgConnection.run)
                shared.begin = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
                shared.reading = True
            else:
                shared.begin = "BEGIN ISOLATION LEVEL READ COMMITTED"
                if lock == "migrate":
                    self.pg.run("SELECT pg_advisory_xact_lock(hashtext('ragdb migrate ' || current_schema()))")
                else:
                    self._lock_collection()
            yield self.conn
            if shared.begin is None:  # else no statement ran: there is no transaction to end
                conn.execute("ROLLBACK" if lock == "read" else "COMMIT")
        except psycopg.Error as e:
            if lock != "read":
                shared.rollbacks += 1
            self._abort(conn)
            raise translate(e, shared) from None
        except BaseException:
            if lock != "read":
                shared.rollbacks += 1
            self._abort(conn)
            raise
        finally:
            shared.conn = None
            shared.begin = None
            shared.stats_hint = None
            shared.reading = False
            shared.depth = 0
            shared.locked = set()
            shared.checkin(conn)

    def _lock_collection(self) -> None:
        """Take this collection's writer lock (its stats row) in the open transaction."""
        shared = self.shared
        if self.collection_id not in shared.locked:
            row = self.pg.execute(f"SELECT {', '.join(_STATS)} FROM stats WHERE id = 1 FOR UPDATE").fetchone()
            shared.locked.add(self.collection_id)
            shared.stats_hint = (self.collection_id, dict(zip(_STATS, row)))

    def stats_row(self) -> dict[str, int]:
        """As :meth:`Store.stats_row`; right after the write lock, the row its statement read."""
        hint = self.shared.stats_hint
        if hint is not None and hint[0] == self.collection_id:
            self.shared.stats_hint = None
            return dict(hint[1])
        row = self.pg.execute(f"SELECT {', '.join(_STATS)} FROM stats WHERE id = 1").fetchone()
        return dict(zip(_STATS, row))

    @staticmethod
    def _abort(conn: psycopg.Connection[Any]) -> None:
        import psycopg

        if not conn.closed and conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            with contextlib.suppress(psycopg.Error):
                conn.execute("ROLLBACK")

    @contextlib.contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction (the collection's stats row locked first); nested, a savepoint."""
        import psycopg

        with self.lock:
            shared = self.shared
            if self.readonly:
                raise StorageError(f"{self.path}: the database is read-only (opened with readonly=True)")
            if shared.conn is not None:
                if shared.reading:
                    raise InvalidInput(f"{self.path}: cannot write while a read of this connection is open "
                                       f"(e.g. inside a loop over db.records()); finish the read first")
                conn = shared.conn
                self.pg.send_begin(conn)
                shared.depth += 1
                name = f"ragdb_sp{shared.depth}"
                try:
                    conn.execute(f"SAVEPOINT {name}")
                    self._lock_collection()
                    yield self.conn
                    conn.execute(f"RELEASE SAVEPOINT {name}")
                except psycopg.Error as e:
                    shared.rollbacks += 1
                    with contextlib.suppress(psycopg.Error):
                        conn.execute(f"ROLLBACK TO SAVEPOINT {name}")
                    raise translate(e, shared) from None
                except BaseException:
                    shared.rollbacks += 1
                    with contextlib.suppress(psycopg.Error):
                        conn.execute(f"ROLLBACK TO SAVEPOINT {name}")
                    raise
                finally:
                    shared.depth -= 1
                return
            with self._transaction("write"):
                yield self.conn

    @contextlib.contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        """A read transaction: every statement inside sees one snapshot."""
        with self.lock:
            if self.shared.conn is not None:
                yield self.conn
                return
            with self._transaction("read"):
                yield self.conn

    def rollbacks(self) -> int:
        """As :meth:`ragdb.storage.connection.ConnectionSQL.rollbacks`."""
        return self.shared.rollbacks

    def _rollback(self) -> None:  # pragma: no cover - transactions end in _transaction
        pass

    def close(self) -> None:
        if not self.owner:
            return
        with self.lock:
            if not self.shared.closed:
                self.refuse_close_in_write()
                self.shared.closed = True
                self.shared.pool.close()

    def in_write(self) -> bool:
        """As :meth:`ragdb.storage.connection.ConnectionSQL.in_write`."""
        return self.shared.conn is not None and not self.shared.reading

    @contextlib.contextmanager
    def no_wait(self) -> Iterator[None]:
        """As :meth:`ragdb.storage.connection.ConnectionSQL.no_wait` in name only: PostgreSQL's
        writers of a collection wait for its lock (``lock_timeout``, the busy timeout) as always."""
        yield

    # -- connection (connection.py): collections -----------------------------------------------------
    def refuse_close_in_write(self) -> None:
        """As :meth:`ragdb.storage.connection.ConnectionSQL.refuse_close_in_write`."""
        if self.owner and not self.shared.closed and self.shared.conn is not None and not self.shared.reading:
            raise InvalidInput(f"{self.path}: cannot close the database inside a write transaction "
                               f"(a db.transaction() block); close it after the block")

    def view(self, collection_id: int, name: str, *, owner: bool = False) -> Store:
        view = object.__new__(PgStore)
        view.conninfo = self.conninfo
        view.path = self.path
        view.lock = self.lock
        view.immutable = False
        view.readonly = self.readonly
        view.shared = self.shared
        view.collection_id = collection_id
        view.collection = name
        view.conn = cast("sqlite3.Connection", PgConnection(self.shared, collection_id))
        view.owner = owner
        if owner:
            self.owner = False
        return view

    def _raw(self) -> PgConnection:
        """The connection without renaming (file-wide tables: collections, migrations)."""
        return PgConnection(self.shared, 0)

    def collection_rows(self) -> list[tuple[int, str, str]]:
        return self._raw().execute("SELECT id, name, created_at FROM collections ORDER BY id").fetchall()

    def collection_row(self, name: str) -> tuple[int, str, str] | None:
        return self._raw().execute("SELECT id, name, created_at FROM collections WHERE name = ?", [name]).fetchone()

    def create_collection(self, name: str) -> tuple[int, str, str]:
        raw = self._raw()
        cid = int(raw.execute("INSERT INTO collections (name, created_at) VALUES (?, ?) RETURNING id",
                              [name, utcnow_iso()]).fetchone()[0])
        statements = [s for path in pg_migration_files() for s in split_statements(path.read_text(encoding="utf-8"))]
        for stmt in _coll.collection_ddl(statements, cid):
            raw.run(stmt)
        return cid, name, self.collection_row(name)[2]  # type: ignore[index]

    def drop_collection(self, collection_id: int) -> None:
        raw = self._raw()
        for stmt in _coll.drop_statements(collection_id):
            raw.run(stmt)
        raw.execute("DELETE FROM collections WHERE id = ?", [collection_id])

    def collection_exists(self) -> bool:
        return self._raw().execute("SELECT 1 FROM collections WHERE id = ? AND name = ?",
                                   [self.collection_id, self.collection]).fetchone() is not None

    def collection_objects(self) -> list[tuple[str, str, str]]:
        """(type, name, table) of the collection's tables and indexes, by their plain names."""
        prefix = _coll.object_name(self.collection_id, "")
        out = []
        for kind, name, table in self._raw().run(
                "SELECT CASE c.relkind WHEN 'i' THEN 'index' ELSE 'table' END, c.relname, "
                "coalesce(t.relname, c.relname) FROM pg_class c "
                "LEFT JOIN pg_index i ON i.indexrelid = c.oid LEFT JOIN pg_class t ON t.oid = i.indrelid "
                "WHERE c.relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema()) "
                "AND c.relkind IN ('r', 'i')"):
            if prefix and not (name.startswith(prefix) and table.startswith(prefix)):
                continue
            plain, plain_table = name[len(prefix):], table[len(prefix):]
            if plain in _coll.OBJECTS:
                out.append((kind, plain, plain_table))
        return sorted(out)

    # -- connection (connection.py): settings and statistics -----------------------------------------
    def bump_stats(self, *, docs: int = 0, chunks: int = 0, length: int = 0,
                   next_ids: tuple[int, int] = (0, 0)) -> int:
        return int(self.pg.execute(
            "UPDATE stats SET generation = generation + 1, n_docs = n_docs + ?, n_chunks = n_chunks + ?, "
            "total_length = total_length + ?, next_doc_id = greatest(next_doc_id, ?), "
            "next_chunk_id = greatest(next_chunk_id, ?) WHERE id = 1 RETURNING generation",
            [docs, chunks, length, *next_ids]).fetchone()[0])

    # -- the dialect (base.py): filters, source tests, packed blobs ----------------------------------
    _NO_LIMIT = None  # LIMIT NULL: no limit

    @staticmethod
    def _condition(c: Any, public_unlabeled: bool, params: list[Any]) -> str:
        return condition_sql(POSTGRES, c, public_unlabeled, params)

    @staticmethod
    def _doc_set(c: Any, params: list[Any]) -> str:
        return doc_set_sql(POSTGRES, c, params)

    @staticmethod
    def _source_test(column: str, source: str, glob: bool) -> tuple[str, list[Any]]:
        """``column = ?`` or, for a pattern, the regular expression of SQLite's GLOB."""
        if not glob:
            return f"{column} = ?", [source]
        regex = glob_regex(source)
        if regex is None:
            return "false", []
        return f"{column} ~ ?", [regex]

    # Packed blobs come back in PostgreSQL's binary format: as the bytes themselves, where
    # the text format would send (and psycopg decode) twice as many hex digits.
    def _binary(self, sql: str, params: Sequence[Any] = ()) -> Any:
        pg = self.pg
        return pg.run(pg.rewrite(sql), params, binary=True)

    # -- documents and chunks (documents.py) ---------------------------------------------------------
    def delete_document(self, doc_id: int, *, indexed: tuple[bool, bool] = (True, True)) -> None:
        """As :meth:`Store.delete_document`, in one statement (one round trip): the filter
        index rows, the chunks' vectors (logged, as SQLite's trigger does), the chunks and
        the document. Foreign keys are checked at the statement's end, when all are gone."""
        self.pg.execute(
            "WITH m AS (DELETE FROM doc_meta WHERE doc_id = ? AND ?), "
            "a AS (DELETE FROM doc_acl WHERE doc_id = ? AND ?), "
            "gone AS (DELETE FROM vectors v USING chunks k WHERE k.doc_id = ? AND v.chunk_id = k.id "
            "RETURNING v.chunk_id), "
            "logged AS (INSERT INTO vector_log (chunk_id) SELECT chunk_id FROM gone ORDER BY 1), "
            "ch AS (DELETE FROM chunks WHERE doc_id = ?) "
            "DELETE FROM documents WHERE id = ?",
            [doc_id, bool(indexed[0]), doc_id, bool(indexed[1]), doc_id, doc_id, doc_id])

    def update_document_fields(self, doc_id: int, *, metadata: tuple[str, list[tuple[str, Any, Any, Any]]] | None = None,
                               acl: tuple[str, list[str]] | None = None) -> list[int]:
        pg = self.pg
        if metadata is not None:
            pg.execute("UPDATE documents SET metadata = ? WHERE id = ?", [metadata[0], doc_id])
            pg.execute("DELETE FROM doc_meta WHERE doc_id = ?", [doc_id])
            rows = [_meta_row((doc_id, *row)) for row in metadata[1]]
            if rows:
                pg.executemany("INSERT INTO doc_meta (doc_id, key, value, num, at) VALUES (?, ?, ?, ?, ?)", rows)
        if acl is not None:
            pg.execute("UPDATE documents SET acl = ? WHERE id = ?", [acl[0], doc_id])
            pg.execute("DELETE FROM doc_acl WHERE doc_id = ?", [doc_id])
            if acl[1]:
                pg.executemany("INSERT INTO doc_acl (doc_id, label) VALUES (?, ?) ON CONFLICT DO NOTHING",
                               [(doc_id, label) for label in acl[1]])
        return [r[0] for r in pg.execute("SELECT id FROM chunks WHERE doc_id = ? ORDER BY id", [doc_id])]

    def chunk_table_blocks(self, size: int = 8192) -> Iterator[list[tuple[int, int, int]]]:
        cur = self._binary(f"SELECT {CHUNK_STATE_SQL} FROM chunks")
        while rows := cur.fetchmany(size):
            yield rows

    def forward_since(self, after_id: int) -> list[tuple[int, bytes, bytes]]:
        return self._binary("SELECT id, terms, tfs FROM chunks WHERE id > ? ORDER BY id", [after_id]).fetchall()

    def forward_all(self) -> Iterator[tuple[int, bytes, bytes]]:
        yield from self._binary("SELECT id, terms, tfs FROM chunks ORDER BY id")

    # -- metadata and filters (metadata.py) ----------------------------------------------------------
    def insert_doc_index(self, meta_rows: Iterable[tuple[int, str, Any, Any, Any]],
                         acl_rows: Iterable[tuple[int, str]]) -> None:
        meta = [_meta_row(r) for r in meta_rows]
        if meta:
            self.pg.executemany("INSERT INTO doc_meta (doc_id, key, value, num, at) VALUES (?, ?, ?, ?, ?)", meta)
        acl = list(acl_rows)
        if acl:
            self.pg.executemany("INSERT INTO doc_acl (doc_id, label) VALUES (?, ?) ON CONFLICT DO NOTHING", acl)

    def facet_rows(self, field: str) -> list[tuple[int, Any]]:
        pg = self.pg
        if field == "source":
            return pg.execute("SELECT id, source FROM documents").fetchall()
        if field == "version":
            return pg.execute("SELECT id, version FROM documents WHERE version IS NOT NULL").fetchall()
        rows = pg.execute("SELECT doc_id, value FROM doc_meta WHERE key = ?", [field]).fetchall()
        # booleans: numbers without num (stored as 1/0); a document holding both 1 and true keeps its 1
        bools = set(pg.execute(
            "SELECT doc_id, value FROM doc_meta b WHERE key = ? AND jsonb_typeof(value) = 'number' "
            "AND num IS NULL AND NOT EXISTS (SELECT 1 FROM doc_meta n WHERE n.key = b.key AND n.value = b.value "
            "AND n.doc_id = b.doc_id AND n.num IS NOT NULL)", [field]))
        if bools:
            rows = [(d, bool(v)) if (d, v) in bools else (d, v) for d, v in rows]
        # A whole float past 2**53 is held as the integer it is (migration 0007, for filters);
        # SQLite's value is the float, so the document's metadata tells which it was. (Facets
        # showed 1e300 as a 301-digit integer.)
        big = {d for d, v in rows if type(v) is int and not -2 ** 53 <= v <= 2 ** 53}
        if big:
            given = {d: loads(text).get(field) for d, text in  # (each document's metadata read once)
                     pg.execute("SELECT id, metadata FROM documents WHERE id = ANY(?)", [sorted(big)]).fetchall()}
            rows = [(d, _as_written(given[d], v)) if d in big else (d, v) for d, v in rows]
        return rows

    # -- the lexical index (lexical.py) --------------------------------------------------------------
    def delete_unused_terms(self) -> int:
        cur = self.pg.execute("DELETE FROM vocabulary v WHERE df = 0 AND NOT EXISTS "
                               "(SELECT 1 FROM postings p WHERE p.term_id = v.id)")
        return int(cur.rowcount)

    def postings(self, term_ids: Sequence[int]) -> list[tuple[int, int, bytes, bytes]]:
        if not term_ids:
            return []
        return self._binary(
            "SELECT term_id, n, chunk_ids, tfs FROM postings WHERE term_id = ANY(?) ORDER BY term_id, segment",
            [list(term_ids)]).fetchall()

    def log_states(self, rows: Sequence[tuple[int, int, bytes | None]]) -> int:
        pg = self.pg
        if len(rows) == 1:
            return int(pg.execute("INSERT INTO chunk_log (chunk_id, state, terms) VALUES (?, ?, ?) RETURNING seq",
                                  rows[0]).fetchone()[0])
        pg.executemany("INSERT INTO chunk_log (chunk_id, state, terms) VALUES (?, ?, ?)", rows)
        return self.log_seq()

    def chunks_since(self, after_id: int) -> list[tuple[int, int, int, int, bytes, bytes, int]]:
        return self._binary(f"SELECT id, length, latest, doc_id, terms, tfs, ({WHOLE_CHUNK})::int FROM chunks "
                            f"WHERE id > ? ORDER BY id", [after_id]).fetchall()

    # -- checks, maintenance, copying (maintenance.py) -----------------------------------------------
    def integrity_problems(self) -> list[str]:
        """PostgreSQL keeps its own pages and constraints (foreign keys are enforced on
        every write); the database being readable is what is checked here."""
        self.pg.execute("SELECT 1 FROM stats WHERE id = 1").fetchone()
        return []

    def duplicate_latest_sources(self) -> int:
        return int(self.pg.execute(
            "SELECT count(*) FROM (SELECT source FROM documents WHERE latest = 1 GROUP BY source "
            "HAVING count(*) > 1) dup").fetchone()[0])

    def packed_forward_rows(self) -> Iterator[tuple[int, str, bytes | None, str, bytes | None]]:
        yield from self.pg.execute("SELECT id, 'blob', terms, 'blob', tfs FROM chunks ORDER BY id").fetchall()

    def packed_postings_rows(self) -> Iterator[tuple[int, int, Any, str, bytes | None, str, bytes | None]]:
        yield from self.pg.execute(
            "SELECT term_id, segment, n, 'blob', chunk_ids, 'blob', tfs FROM postings ORDER BY term_id, segment"
        ).fetchall()

    def packed_log_rows(self) -> Iterator[tuple[int, int, str, bytes | None]]:
        yield from self.pg.execute(
            "SELECT seq, chunk_id, 'blob', terms FROM chunk_log WHERE terms IS NOT NULL ORDER BY seq").fetchall()

    def document_text_blocks(self, rows: int = 256, max_bytes: int = 16 << 20
                             ) -> Iterator[list[tuple[int, bytes | None, str, bytes | None]]]:
        after = -(1 << 63)
        while True:
            block = self.pg.execute(
                "SELECT id, convert_to(content_hash, 'UTF8'), 'text', convert_to(text, 'UTF8') FROM documents "
                "WHERE id > ? ORDER BY id LIMIT ?", [after, rows]).fetchall()
            if not block:
                return
            yield block
            after = block[-1][0]

    def chunk_texts(self, after_doc: int, upto_doc: int) -> list[tuple[int, int, Any, Any, str, bytes | None]]:
        return self.pg.execute(
            "SELECT id, doc_id, start, \"end\", CASE WHEN text IS NULL THEN 'null' ELSE 'text' END, "
            "convert_to(text, 'UTF8') FROM chunks WHERE doc_id > ? AND doc_id <= ? ORDER BY doc_id, id",
            [after_doc, upto_doc]).fetchall()

    def vacuum_analyze(self) -> None:
        """VACUUM ANALYZE the collection's tables (outside a transaction, as VACUUM must be)."""
        import psycopg

        with self.lock:
            if self.shared.conn is not None:
                raise InvalidInput(f"{self.path}: optimize runs VACUUM, which cannot run inside a transaction")
            conn = self.shared.checkout()
            try:
                for table in self._tables():
                    conn.execute(f"VACUUM ANALYZE {table}")  # a constant name (collections.TABLES, renamed)
            except psycopg.Error as e:
                raise translate(e, self.shared) from None
            finally:
                self.shared.checkin(conn)

    def _tables(self) -> list[str]:
        return [_coll.object_name(self.collection_id, t) for t in _coll.TABLES if t != "dead_chunks"]

    def file_size(self) -> int:
        """Bytes on disk of the collection's tables with their indexes and TOAST data."""
        return int(self.pg.run(
            "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
            "WHERE c.relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema()) "
            "AND c.relkind = 'r' AND c.relname = ANY(%s)",
            [self._tables()]).fetchone()[0])

    def table_rows(self, table: str, columns: Sequence[str]) -> Iterator[tuple[Any, ...]]:
        """As :meth:`Store.table_rows`, with rows as SQLite holds them (doc_meta's value and
        num as Python scalars), streamed through a server-side cursor."""
        from ragdb.storage.store import COPY_ORDER, copy_columns

        cols = copy_columns(table, columns)
        order = ", ".join(_quote(c) for c in COPY_ORDER[table])
        conn = self.shared.conn
        if conn is None:
            raise InvalidInput(f"{self.path}: table_rows reads inside a read transaction")
        name = _coll.object_name(self.collection_id, table)
        self.pg.send_begin(conn)  # a server-side cursor lives in the transaction
        with conn.cursor(name=f"ragdb_copy_{name}") as cur:
            cur.itersize = 2000
            cur.execute(f"SELECT {cols} FROM {name} ORDER BY {order}")
            if table != "doc_meta":
                yield from cur
                return
            i_val, i_num = list(columns).index("value"), list(columns).index("num")
            for row in cur:
                if row[i_num] is None:
                    yield row
                else:  # the number itself: value holds it exactly (num is its numeric form)
                    r = list(row)
                    if isinstance(r[i_val], int) and not -2 ** 63 <= r[i_val] < 2 ** 63:
                        r[i_val] = float(r[i_val])  # a float jsonb spells out (1e23), as SQLite holds it
                    r[i_num] = r[i_val]
                    yield tuple(r)

    def insert_table_rows(self, table: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> int:
        """As :meth:`Store.insert_table_rows` (doc_meta rows converted to jsonb/numeric)."""
        from ragdb.storage.store import copy_columns

        cols = copy_columns(table, columns)
        batch = [tuple(r) for r in rows]
        if table == "doc_meta":
            batch = [_meta_row(r) for r in batch]
        if batch:
            self.pg.executemany(f"INSERT INTO {table} ({cols}) VALUES ({', '.join('?' * len(columns))})", batch)
        return len(batch)

    def clear_table(self, table: str) -> None:
        from ragdb.storage.store import COPY_COLUMNS, copy_columns

        copy_columns(table, COPY_COLUMNS.get(table, ()))
        self.pg.execute(f"DELETE FROM {table}")

    def finish_copy(self) -> None:
        """After rows were copied in with their own sequence numbers: the logs' identity
        sequences continue after them."""
        for table in ("chunk_log", "vector_log"):
            name = _coll.object_name(self.collection_id, table)
            self.pg.run("SELECT setval(pg_get_serial_sequence(%s, 'seq'), "
                         f"greatest((SELECT coalesce(max(seq), 0) FROM {name}), 1))", [name])

    # -- stored text (connection.py): PostgreSQL keeps plain text (TOAST compresses values over 2 KB) --
    def text_codec(self) -> TextCodec:
        return NO_CODEC

    def pack_texts(self, texts: Sequence[str | None], doc_ids: Sequence[int] = ()) -> list[str | bytes | None]:
        return list(texts)

    @contextlib.contextmanager
    def packing_ahead(self) -> Iterator[Callable[[Sequence[str]], None] | None]:
        yield None  # (nothing to compress)

    # -- vectors (vectors.py) ------------------------------------------------------------------------
    _CHUNK_TEXT_BYTES = "convert_to(coalesce(c.text, d.text), 'UTF8')"

    def advance_embedded_upto(self, upto: int, seen_from: int) -> None:
        self.pg.execute("UPDATE vector_stats SET embedded_upto = greatest(embedded_upto, ?) "
                         "WHERE id = 1 AND embedded_upto >= ?", [upto, seen_from])

    def unembedded_chunks(self, limit: int | None = None, after: int | None = None) -> list[tuple[int, str]]:
        if after is None:
            after = self.embedded_upto()
        return self.pg.execute(
            "SELECT c.id, coalesce(c.text, d.text) FROM chunks c JOIN documents d ON d.id = c.doc_id "
            "WHERE c.id > ? AND NOT EXISTS (SELECT 1 FROM vectors v WHERE v.chunk_id = c.id) "
            "ORDER BY c.id LIMIT ?", [after, None if limit is None else int(limit)]).fetchall()

    def malformed_vectors(self, width: int) -> tuple[int, int | None, str | None, int | None]:
        n, cid = self.pg.execute(
            "SELECT count(*), min(chunk_id) FROM vectors WHERE octet_length(vector) != ?", [width]).fetchone()
        if not n:
            return 0, None, None, None
        size = self.pg.execute("SELECT octet_length(vector) FROM vectors WHERE chunk_id = ?", [cid]).fetchone()[0]
        return int(n), int(cid), "blob", int(size)


def _quote(column: str) -> str:
    return '"end"' if column == "end" else column


# -- filters in PostgreSQL's SQL ------------------------------------------------------------
class _PgDialect(Dialect):
    """PostgreSQL's pieces of the filter SQL (:mod:`ragdb.storage.conditions` walks the
    conditions): lists bound as arrays, globs as regular expressions, metadata values
    compared as JSON scalars (1 = 1.0 = true, "1" is another value), exact numerics."""

    true, false = "true", "false"
    find = "strpos"

    def one_of(self, column: str, values: Sequence[Any], params: list[Any], sql_type: str) -> str:
        params.append(list(values))
        return f"{column} = ANY(?::{sql_type}[])"

    def label_in(self, values: Sequence[Any], params: list[Any]) -> str:
        params.append(list(values))
        return "label = ANY(?::text[])"

    def glob_any(self, column: str, patterns: Sequence[str], params: list[Any]) -> str:
        regexes = [r for r in (glob_regex(v) for v in patterns) if r is not None]
        if not regexes:
            return "false"
        params.extend(regexes)
        return "(" + " OR ".join([f"{column} ~ ?"] * len(regexes)) + ")"

    def time(self, value: Any) -> Any:
        return float(value)

    def flag(self, value: bool) -> Any:
        return value

    def value_in(self, values: Sequence[Any], params: list[Any]) -> str:
        params.append([_jsonb(int(v) if isinstance(v, bool) else v) for v in values])
        return "value = ANY(?::jsonb[])"

    def bound(self, column: str, op: str, value: Any, params: list[Any]) -> str:
        if column == "num":
            params.append(_exact(value))
            return f"num {COMPARE[op]} ?::numeric"
        params.append(float(value))
        return f"at {COMPARE[op]} ?::double precision"

    def pairs_in(self, pairs: Sequence[tuple[str, Sequence[Any]]], params: list[Any]) -> str:
        rows = [(key, _jsonb(int(v) if isinstance(v, bool) else v)) for key, values in pairs for v in values]
        params += [[k for k, _ in rows], [v for _, v in rows]]
        return ("SELECT m.doc_id FROM unnest(?::text[], ?::jsonb[]) AS v (key, value) "
                "JOIN doc_meta m ON m.key = v.key AND m.value = v.value")


POSTGRES = _PgDialect()


def pg_migration_state(path: str) -> tuple[list[tuple[str, str]], list[str]]:
    """(applied (name, when), pending names) of the PostgreSQL migrations of ``path``,
    read without writing (nor migrating) anything."""
    store = PgStore(path, readonly=True, create=False, _check=False)
    try:
        with store.read():
            if not store.pg.run("SELECT to_regclass(%s) IS NOT NULL", [MIGRATIONS_TABLE]).fetchone()[0]:
                raise NotADatabase(f"{store.path}: no ragdb database here (no {MIGRATIONS_TABLE} table)")
            applied = [(r[0], r[1]) for r in store.pg.run(
                f"SELECT name, applied_at FROM {MIGRATIONS_TABLE} ORDER BY id")]
        done = {name for name, _ in applied}
        return applied, [p.stem for p in pg_migration_files() if p.stem not in done]
    finally:
        store.close()
