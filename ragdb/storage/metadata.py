"""The statements of the filter index (``doc_meta``: a document's scalar metadata,
``doc_acl``: its access labels) and of the reads that filters restrict: the chunks and
documents meeting filter conditions, and facet values (a section of
:class:`ragdb.storage.store.Store`). The conditions become SQL in :mod:`ragdb.storage.conditions`
and :meth:`ragdb.storage.base.StoreBase._filter_sql`."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from ragdb.storage.base import StoreBase
from ragdb.storage.conditions import DOC_SETS

_MAX_INTERSECT = 100  # SQLite allows 500 terms in a compound SELECT


class FilterSQL(StoreBase):
    """Metadata, access labels and filters (see the module docstring)."""

    # -- the filter index (doc_meta, doc_acl) ------------------------------------------------
    def insert_doc_index(self, meta_rows: Iterable[tuple[int, str, Any, Any, Any]],
                         acl_rows: Iterable[tuple[int, str]]) -> None:
        """Filter index rows: (doc id, key, scalar value, num, at) and (doc id, label)."""
        self.conn.executemany("INSERT INTO doc_meta (doc_id, key, value, num, at) VALUES (?, ?, ?, ?, ?)", meta_rows)
        self.conn.executemany("INSERT OR IGNORE INTO doc_acl (doc_id, label) VALUES (?, ?)", acl_rows)

    def has_metadata_key(self, key: str) -> bool:
        """Whether any stored document has scalar metadata under ``key``."""
        return self.conn.execute("SELECT 1 FROM doc_meta WHERE key = ? LIMIT 1", [key]).fetchone() is not None

    def has_private_labels(self) -> bool:
        """Whether any stored document carries an access label other than the public ``*``."""
        return bool(self.conn.execute("SELECT EXISTS (SELECT 1 FROM doc_acl WHERE label != '*')").fetchone()[0])

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

    # -- filtered reads ----------------------------------------------------------------------
    def filtered_chunk_ids(self, conditions: Sequence[Any], public_unlabeled: bool) -> list[int]:
        """Ids of the chunks meeting every condition (conditions on chunks included)."""
        where, params = self._filter_sql(conditions, public_unlabeled, per_chunk=True)
        sql = "SELECT c.id FROM chunks c JOIN documents d ON d.id = c.doc_id"
        if where:
            sql += " WHERE " + " AND ".join(where)
        return [r[0] for r in self.conn.execute(sql, params)]

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
