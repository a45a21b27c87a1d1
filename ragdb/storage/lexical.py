"""The statements of the lexical index: the vocabulary and document frequencies, the
packed postings segments, the chunk change log (``chunk_log``) and flushes, and the
rebuild of a reindex (a section of :class:`ragdb.storage.store.Store`)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from ragdb.storage.base import WHOLE_CHUNK, StoreBase
from ragdb.storage.base import batches as _chunks


class LexicalSQL(StoreBase):
    """Vocabulary, postings, the change log (see the module docstring)."""

    # -- vocabulary --------------------------------------------------------------------------
    def term_ids(self, terms: Sequence[str], recent: bool = True, bulk: bool = True
                 ) -> dict[str, tuple[int, int]]:
        """term -> (id, df) for the terms that are in the vocabulary. ``recent``: whether
        ``new_terms`` may hold some (False only when no chunk was added since the last flush:
        ``Index.may_have_new_terms``); those not in ``vocabulary`` are looked up there, df 0.
        ``bulk``: whether ``bulk_terms`` may too (``Index.bulk_terms``; with ``recent`` only)."""
        out: dict[str, tuple[int, int]] = {}
        for part in _chunks(list(terms)):
            q = ",".join("?" * len(part))
            for tid, term, df in self.conn.execute(
                    f"SELECT id, term, df FROM vocabulary WHERE term IN ({q})", part):
                out[term] = (tid, df)
        if recent:
            for term, tid in self._new_term_ids([t for t in terms if t not in out], bulk):
                out[term] = (tid, 0)
        return out

    def terms_of_ids(self, term_ids: Sequence[int]) -> list[tuple[str, int, int]]:
        """(term, id, df) of these term ids: in ``vocabulary``, or ``new_terms`` and
        ``bulk_terms`` (df 0)."""
        out: list[tuple[str, int, int]] = []
        for part in _chunks(list(term_ids)):
            q = ",".join("?" * len(part))
            out += self.conn.execute(
                f"SELECT term, id, df FROM vocabulary WHERE id IN ({q}) UNION ALL "
                f"SELECT term, id, 0 FROM new_terms WHERE id IN ({q}) UNION ALL "
                f"SELECT term, id, 0 FROM bulk_terms WHERE id IN ({q})", [*part, *part, *part]).fetchall()
        return [(str(t), int(i), int(d)) for t, i, d in out]

    def term_id_map(self, terms: Sequence[str], recent: bool = True, bulk: bool = True) -> dict[str, int]:
        """term -> id for the terms that are in the vocabulary: a writer's lookup (``recent``,
        ``bulk``: as :meth:`term_ids`). Without the df it reads only the term index (``id`` is its
        rowid), about half the page visits of :meth:`term_ids` (measured: 56 terms of a
        354k-term vocabulary, 88 against 158 µs)."""
        out: dict[str, int] = {}
        for part in _chunks(list(terms)):
            q = ",".join("?" * len(part))
            out.update(self.conn.execute(f"SELECT term, id FROM vocabulary WHERE term IN ({q})", part).fetchall())
        if recent:
            out.update(self._new_term_ids([t for t in terms if t not in out], bulk))
        return out

    def _new_term_ids(self, terms: Sequence[str], bulk: bool = True) -> Iterator[tuple[str, int]]:
        """(term, id) of those of ``terms`` in ``new_terms``, then (``bulk``) of the rest in
        ``bulk_terms``. (A second statement for the terms ``vocabulary`` lacks: one UNION ALL of
        both tables cost ~40 µs more a lookup of 5 terms, with ``new_terms`` empty.)"""
        left = set(terms) if bulk else None
        for part in _chunks(list(terms)):
            q = ",".join("?" * len(part))
            for term, tid in self.conn.execute(f"SELECT term, id FROM new_terms WHERE term IN ({q})", part):
                if left is not None:
                    left.discard(term)
                yield term, tid
        if left:
            # a scan (the table has no index on term): it holds terms only during a bulk load
            for part in _chunks(sorted(left)):
                q = ",".join("?" * len(part))
                yield from self.conn.execute(f"SELECT term, id FROM bulk_terms WHERE term IN ({q})", part)

    def frequent_term_ids(self, min_df: int) -> Iterator[tuple[str, int]]:
        """(term, id) of the terms whose stored df is at least ``min_df`` (a scan of the vocabulary;
        ``min_df`` is at least 1, which no term of ``new_terms`` or ``bulk_terms`` has)."""
        yield from self.conn.execute("SELECT term, id FROM vocabulary WHERE df >= ?", [min_df])

    def terms_with_prefix(self, prefix: str, limit: int, recent: bool = True, bulk: bool = True
                          ) -> list[tuple[str, int, int]]:
        """(term, id, df) of up to ``limit`` vocabulary terms starting with ``prefix``, the
        most frequent (by stored df) first: a range scan of the term index (``recent``,
        ``bulk``: as :meth:`term_ids`; ``new_terms`` and ``bulk_terms`` have df 0)."""
        end = prefix + "\U0010ffff"
        if not recent:
            return self.conn.execute(
                "SELECT term, id, df FROM vocabulary WHERE term >= ? AND term < ? ORDER BY df DESC, term LIMIT ?",
                [prefix, end, limit]).fetchall()
        if not bulk:
            return self.conn.execute(
                "SELECT term, id, df FROM vocabulary WHERE term >= ? AND term < ? UNION ALL "
                "SELECT term, id, 0 FROM new_terms WHERE term >= ? AND term < ? ORDER BY 3 DESC, 1 LIMIT ?",
                [prefix, end, prefix, end, limit]).fetchall()
        return self.conn.execute(
            "SELECT term, id, df FROM vocabulary WHERE term >= ? AND term < ? UNION ALL "
            "SELECT term, id, 0 FROM new_terms WHERE term >= ? AND term < ? UNION ALL "
            "SELECT term, id, 0 FROM bulk_terms WHERE term >= ? AND term < ? ORDER BY 3 DESC, 1 LIMIT ?",
            [prefix, end, prefix, end, prefix, end, limit]).fetchall()

    def has_term_with_prefix(self, prefix: str) -> bool:
        """Whether a vocabulary term starts with ``prefix``: a probe of each table's term index
        (a scan of ``bulk_terms``, which has none and is empty but during a bulk load)."""
        end = prefix + "\U0010ffff"
        return any(self.conn.execute(f"SELECT 1 FROM {table} WHERE term >= ? AND term < ? LIMIT 1",
                                     [prefix, end]).fetchone() is not None
                   for table in ("vocabulary", "new_terms", "bulk_terms"))

    def field_term_ids(self) -> list[int]:
        """Ids of the vocabulary's field terms (:mod:`ragdb.text.fields`: they start with its mark)."""
        return [r[0] for r in self.conn.execute("SELECT id FROM vocabulary WHERE term >= ? AND term < ? "
                                                "UNION ALL SELECT id FROM new_terms WHERE term >= ? AND term < ? "
                                                "UNION ALL SELECT id FROM bulk_terms WHERE term >= ? AND term < ?",
                                                ["\x1f", "\x20", "\x1f", "\x20", "\x1f", "\x20"])]

    def all_term_ids(self) -> Iterator[tuple[str, int]]:
        yield from self.conn.execute("SELECT term, id FROM vocabulary UNION ALL SELECT term, id FROM new_terms "
                                     "UNION ALL SELECT term, id FROM bulk_terms")

    def term_ids_after(self, term_id: int) -> Iterator[tuple[str, int]]:
        yield from self.conn.execute("SELECT term, id FROM vocabulary WHERE id > ? "
                                     "UNION ALL SELECT term, id FROM new_terms WHERE id > ? "
                                     "UNION ALL SELECT term, id FROM bulk_terms WHERE id > ?", [term_id] * 3)

    def next_term_id(self, bulk: bool = True) -> int:
        """The next free term id (``bulk``: whether ``bulk_terms`` may hold terms, as for :meth:`term_ids`)."""
        return max(int(self.conn.execute(f"SELECT coalesce(max(id), 0) FROM {table}").fetchone()[0])
                   for table in (("vocabulary", "new_terms", "bulk_terms") if bulk else ("vocabulary", "new_terms"))) + 1

    def has_bulk_terms(self) -> bool:
        """Whether ``bulk_terms`` holds terms (a bulk load's, not yet settled)."""
        return self.conn.execute("SELECT 1 FROM bulk_terms LIMIT 1").fetchone() is not None

    def add_terms(self, rows: Iterable[tuple[int, str, int]]) -> None:
        """Insert terms as (id, term, df) into ``vocabulary`` (a reindex, which flushes everything)."""
        self.conn.executemany("INSERT INTO vocabulary (id, term, df) VALUES (?, ?, ?)", rows)

    def add_new_terms(self, rows: Iterable[tuple[int, str]], bulk: bool = False) -> None:
        """Insert a write's new terms as (id, term): into ``new_terms`` until the next flush
        (:meth:`settle_new_terms`). The unique index of ``vocabulary.term`` is not touched: new
        terms land all over it, so each batch of a bulk load dirtied most of its pages and
        every commit wrote them to the WAL again (migrations/0013_new_terms.sql). ``bulk``:
        a bulk load's batch after its first, into ``bulk_terms``, which has no index on term
        for the same reason at the scale of ``new_terms`` (migrations/0014_bulk_terms.sql),
        until the flush or the load's end (:meth:`settle_bulk_terms`)."""
        if bulk:
            self.conn.executemany("INSERT INTO bulk_terms (id, term) VALUES (?, ?)", rows)
        else:
            self.conn.executemany("INSERT INTO new_terms (id, term) VALUES (?, ?)", rows)

    def settle_new_terms(self) -> None:
        """Move the terms of ``new_terms`` and ``bulk_terms`` into ``vocabulary`` (df 0), at a
        flush, before :meth:`add_df` counts the flushed chunks' terms."""
        self.conn.execute("INSERT INTO vocabulary (id, term, df) SELECT id, term, 0 FROM new_terms UNION ALL "
                          "SELECT id, term, 0 FROM bulk_terms ORDER BY 2")
        self.conn.execute("DELETE FROM new_terms")
        self.conn.execute("DELETE FROM bulk_terms")

    def settle_bulk_terms(self) -> None:
        """Move the terms of ``bulk_terms`` into ``new_terms``, in term order (one pass over its
        index): at the end of a bulk load that no flush ended, or at the next write after one
        that did not end."""
        self.conn.execute("INSERT INTO new_terms (id, term) SELECT id, term FROM bulk_terms ORDER BY term")
        self.conn.execute("DELETE FROM bulk_terms")

    def bump_vocab_epoch(self) -> None:
        self.conn.execute("UPDATE stats SET vocab_epoch = vocab_epoch + 1 WHERE id = 1")

    def add_df(self, deltas: Iterable[tuple[int, int]]) -> None:
        """Apply (delta, term id) document-frequency changes to terms of ``vocabulary`` (the terms
        of flushed chunks: a flush moves ``new_terms`` there first)."""
        self.conn.executemany("UPDATE vocabulary SET df = df + ? WHERE id = ?", deltas)

    def all_dfs(self) -> list[tuple[int, int]]:
        return self.conn.execute("SELECT id, df FROM vocabulary UNION ALL SELECT id, 0 FROM new_terms "
                                 "UNION ALL SELECT id, 0 FROM bulk_terms").fetchall()

    def delete_unused_terms(self) -> int:
        """Delete the terms of ``vocabulary`` that no chunk holds any more (after a flush of
        everything, when ``new_terms`` is empty); returns how many."""
        cur = self.conn.execute(
            "DELETE FROM vocabulary WHERE df = 0 AND id NOT IN (SELECT DISTINCT term_id FROM postings)")
        return cur.rowcount

    def vocabulary_size(self) -> int:
        return int(self.conn.execute("SELECT (SELECT count(*) FROM vocabulary) + (SELECT count(*) FROM new_terms) "
                                     "+ (SELECT count(*) FROM bulk_terms)").fetchone()[0])

    # -- postings ----------------------------------------------------------------------------
    def has_postings(self) -> bool:
        return self.conn.execute("SELECT 1 FROM postings LIMIT 1").fetchone() is not None

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

    def segment_total(self) -> int:
        return int(self.conn.execute("SELECT count(*) FROM postings").fetchone()[0])

    # -- the change log and flushes ----------------------------------------------------------
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

    # -- the chunk-state snapshot (ragdb.index.snapshot) -------------------------------------------
    def chunk_state_snapshot(self) -> tuple[int, int, bytes] | None:
        """(flush_count, flushed_upto, body) of the stored chunk-state snapshot, if any."""
        row = self.conn.execute("SELECT flush_count, flushed_upto, body FROM chunk_state WHERE id = 1").fetchone()
        return None if row is None else (int(row[0]), int(row[1]), bytes(row[2]))

    def set_chunk_state_snapshot(self, flush_count: int, flushed_upto: int, body: bytes) -> None:
        """Store the snapshot of the flush ``flush_count`` (replacing the one before)."""
        self.conn.execute("DELETE FROM chunk_state")
        self.conn.execute("INSERT INTO chunk_state (id, flush_count, flushed_upto, body) VALUES (1, ?, ?, ?)",
                          [flush_count, flushed_upto, body])

    def dead_terms(self) -> list[bytes]:
        """Forward indexes of the flushed latest chunks deleted since the last flush."""
        return [r[0] for r in self.conn.execute("SELECT terms FROM chunk_log WHERE terms IS NOT NULL")]

    # -- rebuilding the lexical index (Database.reindex) -------------------------------------
    def clear_lexical_index(self) -> None:
        """Delete every posting, term and change-log entry (inside the reindex transaction)."""
        self.conn.execute("DELETE FROM postings")
        self.conn.execute("DELETE FROM vocabulary")
        self.conn.execute("DELETE FROM new_terms")
        self.conn.execute("DELETE FROM bulk_terms")
        self.conn.execute("DELETE FROM chunk_log")
        self.conn.execute("DELETE FROM chunk_state")  # (lengths change: the next flush writes it again)

    def chunk_texts_after(self, after_id: int, limit: int) -> list[tuple[int, int, str, str | None, str, str]]:
        """(id, latest, text, document title, source, chunk metadata json) of the next ``limit``
        chunks with id > ``after_id``, by id: a chunk's own text, or its document's when the
        chunk is the whole document (text NULL)."""
        return [(cid, latest, self._text(text), *rest) for cid, latest, text, *rest in self.conn.execute(
            "SELECT c.id, c.latest, coalesce(c.text, d.text), d.title, d.source, c.metadata FROM chunks c "
            "JOIN documents d ON d.id = c.doc_id WHERE c.id > ? ORDER BY c.id LIMIT ?", [after_id, limit])]

    def set_forward_indexes(self, rows: Iterable[tuple[bytes, bytes, int, int]]) -> None:
        """Rows of (terms, tfs, length, chunk id): a chunk's new forward index and length."""
        self.conn.executemany("UPDATE chunks SET terms = ?, tfs = ?, length = ? WHERE id = ?", rows)

    def finish_reindex(self, total_length: int, flushed_upto: int) -> None:
        """After a reindex: the new total length, every chunk flushed, and a flush and a
        vocabulary change recorded, so every open connection reloads its view."""
        self.conn.execute(
            "UPDATE stats SET total_length = ?, flushed_upto = ?, flush_count = flush_count + 1, "
            "vocab_epoch = vocab_epoch + 1 WHERE id = 1", [total_length, flushed_upto])
