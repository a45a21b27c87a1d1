"""The statements of documents and chunks: writing, replacing and deleting them, listing
them, the chunk table the in-memory index loads, and the rows of hits (a section of
:class:`ragdb.storage.store.Store`)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from ragdb.storage.base import CHUNK_STATE_SQL, WHOLE_CHUNK, StoreBase
from ragdb.storage.base import batches as _chunks


class DocumentSQL(StoreBase):
    """Documents and chunks (see the module docstring)."""

    # -- documents ---------------------------------------------------------------------------
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
        out = [list(r) for r in rows]  # the text (8th) as stored: compressed in SQLite (pack_texts)
        for r, packed in zip(out, self.pack_texts([r[7] for r in out], [r[0] for r in out])):
            r[7] = packed
        self.conn.executemany(
            "INSERT INTO documents (id, source, version, timestamp, ts, valid_to, latest, content_hash, title, "
            "text, metadata, acl, chunker, added_at) VALUES (?, ?, ?, ?, ?, NULL, 1, ?, ?, ?, ?, ?, ?, ?)", out)

    def insert_chunks(self, rows: Iterable[Sequence[Any]]) -> None:
        out = [list(r) for r in rows]  # the chunk's own text (7th, NULL for a whole document) as stored
        for r, packed in zip(out, self.pack_texts([r[6] for r in out])):
            r[6] = packed
        self.conn.executemany(
            'INSERT INTO chunks (id, doc_id, ordinal, start, "end", length, latest, text, metadata, terms, tfs) '
            "VALUES (?, ?, ?, ?, ?, ?, 1, ?, ?, ?, ?)", out)

    def doc_chunks(self, doc_id: int) -> list[tuple[int, int, int, bytes, bytes]]:
        """(chunk id, length, latest, terms, tfs) of a document's chunks."""
        return self.conn.execute("SELECT id, length, latest, terms, tfs FROM chunks WHERE doc_id = ? ORDER BY id",
                                 [doc_id]).fetchall()

    def set_latest(self, doc_id: int, latest: bool, valid_to: float | None) -> None:
        self.conn.execute("UPDATE documents SET latest = ?, valid_to = ? WHERE id = ?",
                          [int(latest), valid_to, doc_id])
        self.conn.execute("UPDATE chunks SET latest = ? WHERE doc_id = ?", [int(latest), doc_id])

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
        row = self.conn.execute(f"SELECT {self._DOC_COLS}, d.text FROM documents d WHERE d.id = ?",
                                [doc_id]).fetchone()
        return None if row is None else (*row[:-1], self._text(row[-1]))

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
        for row in self.conn.execute(sql + " ORDER BY d.id", params):
            yield (*row[:5], self._text(row[5]), *row[6:])

    def iter_chunk_spans(self) -> Iterator[tuple[int, int, int, str]]:
        """(doc id, start, end, chunk metadata json) of every chunk of the documents that have
        a chunk with metadata of its own, by document id then start (for export)."""
        yield from self.conn.execute(
            'SELECT doc_id, start, "end", metadata FROM chunks WHERE doc_id IN '
            "(SELECT doc_id FROM chunks WHERE metadata != '{}') ORDER BY doc_id, start, \"end\"")

    # -- chunks for the in-memory index ------------------------------------------------------
    def chunk_table(self) -> list[tuple[int, int, int, int, int]]:
        """(id, length, latest, doc id, whole) of every stored chunk; ``whole`` is 1 for a
        chunk that is its whole document without metadata of its own (see ``doc_hit_rows``)."""
        return self.conn.execute(f"SELECT id, length, latest, doc_id, {WHOLE_CHUNK} FROM chunks").fetchall()

    def chunk_table_blocks(self, size: int = 8192) -> Iterator[list[tuple[int, int, int]]]:
        """``chunk_table`` in blocks of ``size`` rows, each row folded into three integers: (id,
        doc id, length × 4 + latest × 2 + whole), :data:`CHUNK_STATE_SQL`. Opening a handle
        reads every row: three Python integers a row instead of five took a third less time
        (100k chunks: ~170 → ~110 ms)."""
        cur = self.conn.execute(f"SELECT {CHUNK_STATE_SQL} FROM chunks")
        while rows := cur.fetchmany(size):
            yield rows

    def count_chunks_since(self, after_id: int) -> int:
        return int(self.conn.execute("SELECT count(*) FROM chunks WHERE id > ?", [after_id]).fetchone()[0])

    def forward_since(self, after_id: int) -> list[tuple[int, bytes, bytes]]:
        return self.conn.execute("SELECT id, terms, tfs FROM chunks WHERE id > ? ORDER BY id", [after_id]).fetchall()

    def forward_all(self) -> Iterator[tuple[int, bytes, bytes]]:
        yield from self.conn.execute("SELECT id, terms, tfs FROM chunks ORDER BY id")

    def max_chunk_id(self) -> int:
        return int(self.conn.execute("SELECT coalesce(max(id), 0) FROM chunks").fetchone()[0])

    # -- hits --------------------------------------------------------------------------------
    def hit_rows(self, chunk_ids: Sequence[int]) -> dict[int, tuple[Any, ...]]:
        """chunk id -> (doc_id, source, version, timestamp, text, start, end, ordinal, chunk metadata,
        document metadata, title)."""
        out: dict[int, tuple[Any, ...]] = {}
        for part in _chunks(list(chunk_ids)):
            q = ",".join("?" * len(part))
            rows = self.conn.execute(
                f'SELECT c.id, c.doc_id, d.source, d.version, d.timestamp, coalesce(c.text, d.text), c.start, c."end", '
                f"c.ordinal, "
                f"c.metadata, d.metadata, d.title FROM chunks c JOIN documents d ON d.id = c.doc_id "
                f"WHERE c.id IN ({q})", part).fetchall()
            for row, text in zip(rows, self._texts([row[5] for row in rows])):
                out[row[0]] = (*row[1:5], text, *row[6:])
        return out

    def doc_hit_rows(self, doc_ids: Sequence[int]) -> dict[int, tuple[Any, ...]]:
        """doc id -> (source, version, timestamp, text, metadata, title): the hit fields of
        chunks that are their whole document, read without touching ``chunks``
        (whose rows carry the forward index, so reading them costs a page each)."""
        out: dict[int, tuple[Any, ...]] = {}
        for part in _chunks(list(doc_ids)):
            q = ",".join("?" * len(part))
            rows = self.conn.execute(
                f"SELECT id, source, version, timestamp, text, metadata, title FROM documents WHERE id IN ({q})",
                part).fetchall()
            for row, text in zip(rows, self._texts([row[4] for row in rows])):
                out[row[0]] = (*row[1:4], text, *row[5:])
        return out

    def texts_by_id(self, chunk_ids: Sequence[int], doc_ids: Sequence[int]) -> tuple[dict[int, str], dict[int, str]]:
        """(chunk id -> its own text, doc id -> its text) of chunks that store a copy of their
        text and of documents (for chunks that are their whole document): only the text
        columns, for phrase checks."""
        own: dict[int, str] = {}
        for part in _chunks(list(chunk_ids)):
            q = ",".join("?" * len(part))
            own.update((i, self._text(t)) for i, t in self.conn.execute(
                f"SELECT id, text FROM chunks WHERE id IN ({q}) AND text IS NOT NULL", part))
        docs: dict[int, str] = {}
        for part in _chunks(list(doc_ids)):
            q = ",".join("?" * len(part))
            docs.update((i, self._text(t)) for i, t in self.conn.execute(
                f"SELECT id, text FROM documents WHERE id IN ({q})", part))
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
