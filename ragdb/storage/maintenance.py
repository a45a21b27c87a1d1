"""The statements of ``check()`` (every table read as stored, without trusting it),
``optimize`` (ANALYZE, VACUUM), the file's size, and copying rows between databases
(a section of :class:`ragdb.storage.store.Store`)."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from ragdb.storage.base import StoreBase
from ragdb.storage.base import translate as _translate

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
    ("new_terms", ("id", "term")),
    ("bulk_terms", ("id", "term")),
    ("postings", ("term_id", "segment", "n", "chunk_ids", "tfs")),
    ("chunk_log", ("seq", "chunk_id", "state", "terms")),
    ("doc_meta", ("doc_id", "key", "value", "num", "at")),
    ("doc_acl", ("doc_id", "label")),
    ("vectors", ("chunk_id", "vector", "text_hash")),
    ("vector_log", ("seq", "chunk_id")),
    ("chunk_state", ("id", "flush_count", "flushed_upto", "body")),  # valid with stats and chunks copied as they are
)
#: The order rows of each copied table are read in (a unique key where the table has one).
COPY_ORDER: dict[str, tuple[str, ...]] = {
    "settings": ("key",), "stats": ("id",), "vector_stats": ("id",), "documents": ("id",), "chunks": ("id",),
    "vocabulary": ("id",), "new_terms": ("id",), "bulk_terms": ("id",),
    "postings": ("term_id", "segment"), "chunk_log": ("seq",),
    "doc_meta": ("doc_id", "key", "at", "num"), "doc_acl": ("doc_id", "label"), "vectors": ("chunk_id",),
    "vector_log": ("seq",), "chunk_state": ("id",),
}
COPY_COLUMNS = dict(COPY_TABLES)


def copy_columns(table: str, columns: Sequence[str]) -> str:
    """The column list of a copied table: only the constant names of COPY_TABLES."""
    if tuple(columns) != COPY_COLUMNS.get(table):
        raise ValueError(f"not a copied table and its columns: {table} {columns}")
    return ", ".join('"end"' if c == "end" else c for c in columns)


class MaintenanceSQL(StoreBase):
    """Checks, maintenance and copying (see the module docstring)."""

    # -- checks ------------------------------------------------------------------------------
    def integrity_problems(self) -> list[str]:
        rows = [r[0] for r in self.conn.execute("PRAGMA integrity_check")]
        problems = [] if rows == ["ok"] else [f"sqlite integrity_check: {r}" for r in rows]
        problems += [f"foreign key violation in {r[0]} rowid {r[1]}"
                     for r in self.conn.execute("PRAGMA foreign_key_check")]
        return problems

    def orphan_chunks(self) -> int:
        return int(self.conn.execute(
            "SELECT count(*) FROM chunks c LEFT JOIN documents d ON d.id = c.doc_id WHERE d.id IS NULL").fetchone()[0])

    def new_term_counts(self) -> tuple[int, int]:
        """(terms in ``new_terms``, those of them also in ``vocabulary`` by id or by term)."""
        n = int(self.conn.execute("SELECT count(*) FROM new_terms").fetchone()[0])
        both = int(self.conn.execute(
            "SELECT count(*) FROM new_terms n WHERE EXISTS (SELECT 1 FROM vocabulary v WHERE v.id = n.id) "
            "OR EXISTS (SELECT 1 FROM vocabulary v WHERE v.term = n.term)").fetchone()[0]) if n else 0
        return n, both

    def bulk_term_counts(self) -> tuple[int, int, int]:
        """(rows of ``bulk_terms``, those of them whose id or term ``vocabulary`` or ``new_terms``
        also holds, rows whose term an earlier row of ``bulk_terms`` holds: it has no unique index)."""
        n, distinct = self.conn.execute("SELECT count(*), count(DISTINCT term) FROM bulk_terms").fetchone()
        elsewhere = int(self.conn.execute(
            "SELECT count(*) FROM bulk_terms b WHERE EXISTS (SELECT 1 FROM vocabulary v WHERE v.id = b.id) "
            "OR EXISTS (SELECT 1 FROM vocabulary v WHERE v.term = b.term) "
            "OR EXISTS (SELECT 1 FROM new_terms n WHERE n.id = b.id) "
            "OR EXISTS (SELECT 1 FROM new_terms n WHERE n.term = b.term)").fetchone()[0]) if n else 0
        return int(n), elsewhere, int(n) - int(distinct)

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

    def chunk_texts(self, after_doc: int, upto_doc: int) -> list[tuple[int, int, Any, Any, str, bytes | None]]:
        """(id, doc id, start, end, typeof text, text as bytes or None) of the chunks of the
        documents with after_doc < id <= upto_doc, by document then chunk id."""
        return self.conn.execute(
            'SELECT id, doc_id, start, "end", typeof(text), CAST(text AS BLOB) FROM chunks '
            "WHERE doc_id > ? AND doc_id <= ? ORDER BY doc_id, id", [after_doc, upto_doc]).fetchall()

    # -- maintenance -------------------------------------------------------------------------
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

    # -- copying between databases (ragdb.files.transfer.copy_database) ----------------------
    def table_rows(self, table: str, columns: Sequence[str]) -> Iterator[tuple[Any, ...]]:
        """Every row of the per-collection ``table`` (one of :data:`COPY_TABLES`, with its
        ``columns``), in :data:`COPY_ORDER`, streamed (call inside a read)."""
        cols = copy_columns(table, columns)
        order = ", ".join('"end"' if c == "end" else c for c in COPY_ORDER[table])
        rows = self.conn.execute(f"SELECT {cols} FROM {table} ORDER BY {order}")
        if table not in ("documents", "chunks"):
            yield from rows
            return
        i = list(columns).index("text")  # the text as it reads, not as this file compressed it
        for row in rows:
            yield (*row[:i], self._text(row[i]), *row[i + 1:])

    def insert_table_rows(self, table: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> int:
        """Insert rows that :meth:`table_rows` of either backend read (in a write transaction);
        returns how many."""
        cols = copy_columns(table, columns)
        batch = [tuple(r) for r in rows]
        if batch and table in ("documents", "chunks"):  # the text as this file stores it (pack_texts)
            i = list(columns).index("text")
            packed = self.pack_texts([r[i] for r in batch], [r[0] for r in batch] if table == "documents" else ())
            batch = [(*r[:i], t, *r[i + 1:]) for r, t in zip(batch, packed)]
        if batch:
            self.conn.executemany(f"INSERT INTO {table} ({cols}) VALUES ({','.join('?' * len(columns))})", batch)
        return len(batch)

    def clear_table(self, table: str) -> None:
        """Delete every row of a copied table (the target's initial rows, before a copy)."""
        copy_columns(table, COPY_COLUMNS.get(table, ()))
        self.conn.execute(f"DELETE FROM {table}")

    def finish_copy(self) -> None:
        """After a copy into this collection (SQLite's rowids continue by themselves)."""
