"""The write stage: insert, replace, delete, update and version documents.

Every public write method but ``embed`` (one transaction per batch) is one write transaction (``BEGIN IMMEDIATE``; nested in
``Database.transaction()`` it is a savepoint) that keeps the statistics,
document frequencies, the chunk change log and the in-memory index exact: after
any sequence of writes, scores equal those of a fresh build of the same
documents. A failure rolls the transaction back and the in-memory index is
reloaded from the file (:meth:`ragdb.engine.state.Engine.writing`).

Vectors of unchanged text are reused, never re-embedded: once a database holds
vectors, every chunk a write stores looks its text hash up (the replaced
version's chunks first, then every stored vector, :func:`ragdb.storage.vectors.text_hash`)
and takes over an equal text's vector, in the same transaction; only the
rest are left pending for :meth:`Writer.embed`, which also looks each pending
chunk up before embedding and embeds each distinct text of a batch once.
A database without vectors skips the hashing.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from array import array
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from itertools import chain
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ragdb.text import fields
from ragdb.index import inverted as idx
from ragdb.errors import DocumentNotFound, EmbeddingError, InvalidInput, StorageError
from ragdb.index.inverted import FLUSH_THRESHOLD
from ragdb.index.terms import TermTable
from ragdb.index.forward import (forward_term_lists, pack_forward, pack_forward_many, pack_forward_one,
                                 unpack_forward_many)
from ragdb.engine.prepare import Prepared, check_acl, check_metadata, field_counts_of
from ragdb.options import check_positive_int
from ragdb.storage import dumps, loads, model_mismatch, utcnow_iso
from ragdb.storage.codec import meta_number
from ragdb.storage.vectors import text_hash
from ragdb.models.embedder import as_float32, dimensions_of

if TYPE_CHECKING:
    from ragdb.records import Change, Document  # (imported where made: a search makes none)
    from ragdb.text.analysis import Analyzer
    from ragdb.models.embedder import Embedder
    from ragdb.engine.state import Engine

REINDEX_BATCH = 8192  # chunks analyzed, written and posted at a time by reindex
WRITER_TERM_CACHE = 300_000  # a writer keeps a vocabulary up to this size in memory
# A larger vocabulary: the writer keeps its terms with a (flushed) df of at least 1/this of
# the chunks, and looks the others up. At most this many times the mean distinct terms per
# chunk of them (their dfs sum to at most the postings); on the realistic 100k corpus 34,821
# terms, read in 25 ms, holding 90% of a new document's distinct terms. Without them every
# add looked up ~56 terms in the term index, which made a one-document add 1.6x slower at
# 100k chunks than at 10k (where the whole vocabulary is kept).
WRITER_FREQUENT_SHARE = 4096
HASH_FILL_BATCH = 4096  # vectors given their text hash per transaction (those stored before migration 0005)


_collector_lock = threading.Lock()
_collector_pauses = 0  # bulk loads now running with the cyclic collector paused by collector_paused


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for a bulk load (``add_many``), when it is on.

    A bulk load keeps a batch's worth of containers alive (prepared documents, their chunks
    and term counts, rows, tail entries): the collector's young passes walked them again and
    again, and its full passes walked the vocabulary and the analyzer's memo (a dict of
    hundreds of thousands of entries) each time, about 1.2 s of a 20k-document load's ~8 s
    in the writing process, for no garbage (the load frees what it made by reference
    counting; it makes no cycles). Only loads of more than one batch pause it (``add_many``
    enters this at its second batch), so single adds never do. Concurrent loads share one
    pause: the collector is switched on again when the last ends. Nothing is paused when the
    collector was off to begin with."""
    global _collector_pauses
    with _collector_lock:
        paused = _collector_pauses > 0 or gc.isenabled()
        if paused:
            if _collector_pauses == 0:
                gc.disable()
            _collector_pauses += 1
    try:
        yield
    finally:
        if paused:
            with _collector_lock:
                _collector_pauses -= 1
                if _collector_pauses == 0:
                    gc.enable()


@dataclass
class VectorTally:
    """Vectors one call gave to chunks: ``embedded`` by the embedder, ``reused``
    (copied from a stored vector of the same text instead). Counted as the call goes."""

    embedded: int = 0
    reused: int = 0


class Writer:
    """The write path of one engine."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def seal_tail(self, at: int) -> None:
        """Group the in-memory tail's newest entries by term once there are ``at`` of them
        (:meth:`ragdb.index.inverted.Index.seal_tail`: a bulk load's memory between flushes)."""
        if len(self.engine.index.tail_entries) < max(at, 1):  # (every single add: nothing to seal)
            return
        with self.engine.changing_view() as index:
            if len(index.tail_entries) >= max(at, 1):
                index.seal_tail()

    def maybe_flush(self, threshold: int | None = None, merge_terms: Collection[int] | np.ndarray = ()
                    ) -> np.ndarray:
        """Move the in-memory tail into packed segments once it is large (its own
        transaction); ``merge_terms`` with more than one segment are merged into one.
        Returns the ids of the terms flushed (sorted, unique; empty if nothing was).

        Done after a whole ``add_many`` rather than inside each batch, so bulk
        loads write each term's postings once, in one segment."""
        if threshold is None:
            threshold = self.engine.settings.get("flush_threshold", FLUSH_THRESHOLD)
        none = np.zeros(0, np.int64)
        if self.engine.index.tail_count() < max(threshold, 1) and not len(merge_terms):
            return none
        with self.engine.writing():
            index = self.engine.index
            self.engine.sync()
            if index.tail_count() < max(threshold, 1) and not len(merge_terms):
                return none
            flushed = index.tail.term_ids.copy()
            index.flush(merge_terms=merge_terms)
            index.note_write(self.engine.store.bump_stats(), index.n_chunks, index.total_length)
        return flushed

    def settle_bulk_terms(self) -> None:
        """At the end of a bulk load: the new terms its batches after the first left in
        ``bulk_terms`` (when no flush moved them into ``vocabulary``) into ``new_terms``, in one
        sorted insert (its own transaction), so that lookups find them by index again.
        (Asked under the write lock, of a synced view: the load's own view may have been
        dropped since it wrote them, by a failed write of this connection.)"""
        with self.engine.writing():
            self.engine.sync()
            index = self.engine.index
            if not index.bulk_terms:
                return
            self.engine.store.settle_bulk_terms()
            index.bulk_terms = False
            index.note_write(self.engine.store.bump_stats(), index.n_chunks, index.total_length)

    def delete(self, doc_id: int | None = None, *, source: str | None = None, glob: bool = False,
               conditions: Sequence[Any] | None = None) -> list[int]:
        """Delete a document by id, every version of a source (``glob``: a pattern),
        or the documents meeting filter ``conditions`` (with ``source``: both);
        returns the ids deleted. Deleting a latest version by id or by filter
        makes the newest kept older version not deleted with it the latest again."""
        store = self.engine.store
        with self.engine.writing():
            self.engine.sync()
            changes = _Changes()
            deleted: list[int] = []
            touched: set[str] = set()  # sources whose other versions survive: their validity is redone
            if doc_id is not None:
                row = store.doc_source(doc_id)
                if row is None:
                    raise DocumentNotFound(f"no document with id {doc_id}")
                self._remove(doc_id, bool(row[1]), changes, (bool(row[2]), bool(row[3])))
                if row[1]:
                    older = store.newest_older_version(row[0])
                    if older is not None:
                        self._promote(older, changes)
                touched.add(row[0])
                deleted = [doc_id]
            elif conditions is None:
                assert source is not None
                docs = store.source_docs_with_chunks(source, glob=glob)
                for did, latest, has_meta, has_acl, chunk_rows in docs:
                    self._remove(did, bool(latest), changes, (has_meta, has_acl), chunk_rows)
                deleted = [d[0] for d in docs]
            else:
                rows = store.doc_rows_matching(conditions, source=source, glob=glob)
                gone = {r[0] for r in rows}
                for did, src, is_latest, meta_flag, acl_flag in rows:  # newest first
                    self._remove(did, bool(is_latest), changes, (bool(meta_flag), bool(acl_flag)))
                    if is_latest:
                        older = store.newest_older_version(src, exclude=gone)
                        if older is not None:
                            self._promote(older, changes)
                    touched.add(src)
                deleted = [r[0] for r in rows]
            for src in sorted(touched):
                self._redo_validity(src)
            if deleted:
                self._commit_changes(changes)
        return deleted

    def _redo_validity(self, source: str) -> None:
        """Each surviving kept version of ``source`` is valid (for ``as_of``) from its
        timestamp until the next surviving version's, by id, the latest without end:
        what replacing the versions in order gives, so deleting a middle version
        leaves no gap and a fresh build (or an import) of the survivors agrees."""
        store = self.engine.store
        versions = store.source_versions(source)
        want = [versions[i + 1][1] for i in range(len(versions) - 1)] + [None]
        fixes = [(end, vid) for (vid, _ts, valid_to), end in zip(versions, want) if valid_to != end]
        if fixes:
            store.set_valid_to(fixes)

    def update(self, doc_id: int, *, metadata: Mapping[str, Any] | None = None,
               acl: Sequence[str] | None = None) -> Document:
        """Change a document's metadata and/or access labels in place: same
        document and chunk ids, same chunks, terms and vectors (nothing is
        re-chunked, re-analyzed or re-embedded)."""
        store = self.engine.store
        label = f"document {doc_id}"
        if metadata is None and acl is None:
            raise InvalidInput(f"update {label}: give metadata=, acl= or both")
        meta = check_metadata(metadata, label) if metadata is not None else None
        labels = check_acl(acl, label) if acl is not None else None
        with self.engine.writing():
            index = self.engine.index
            self.engine.sync()
            row = store.doc_source(doc_id)
            if row is None:
                raise DocumentNotFound(f"no document with id {doc_id}")
            acl_value = None if labels is None else (dumps(list(labels)), list(labels))
            chunk_ids = store.update_document_fields(
                doc_id, metadata=None if meta is None else (meta[1], list(scalar_items(meta[0]))), acl=acl_value)
            # Hits cache each chunk's metadata: the change log tells every
            # connection's index to read these chunks' fields again.
            state = idx.LATEST if row[1] else idx.OLD
            logged = [(cid, state, None) for cid in chunk_ids]
            if acl_value is not None and row[1]:
                # A source's history has the source's labels: the kept older versions get them
                # too, so deleting the latest never promotes a version readable by others.
                for old_id, _ts, _valid in store.source_versions(row[0]):
                    if old_id != doc_id:
                        logged += [(cid, idx.OLD, None)
                                   for cid in store.update_document_fields(old_id, metadata=None, acl=acl_value)]
            log_seq = store.log_states(logged) if logged else None
            index.forget_hits([c for c, _s, _t in logged])
            index.note_write(store.bump_stats(), index.n_chunks, index.total_length, log_seq)
            return self.document(doc_id)

    def optimize(self) -> None:
        """Flush pending postings, merge each term's segments into one (dropping
        deleted chunks) and forget unused terms."""
        store = self.engine.store
        with self.engine.writing():
            index = self.engine.index
            self.engine.sync()
            index.flush(merge_all=True)
            if store.delete_unused_terms():
                store.bump_vocab_epoch()
                index.forget_terms()
            index.note_write(store.bump_stats(), index.n_chunks, index.total_length)

    def reindex(self, analyzer: Analyzer) -> tuple[dict[str, Any], int, int, int]:
        """Rebuild the lexical index with ``analyzer`` in one write transaction: every stored
        chunk (kept older versions too) analyzed again from its text, its forward index and
        length rewritten, the vocabulary, document frequencies, postings and statistics made
        anew, and ``analyzer`` stored as the database's. Documents, chunks (ids, spans,
        texts, metadata), versions, labels and vectors stay as they are; the filter index
        (doc_meta, doc_acl) is written anew from the documents' metadata and labels. Returns the
        previous analyzer configuration, the stored chunks, and the terms before and after."""
        store, engine = self.engine.store, self.engine
        if store.in_transaction():
            raise InvalidInput(f"{store.path}: reindex runs in a transaction of its own; call it outside "
                               f"db.transaction()")
        with engine.writing():
            engine.sync()
            previous = dict(engine.settings.get("analyzer") or {})
            with_fields = True  # a reindex indexes the fields too (a database made before them gets them)
            terms_before = store.vocabulary_size()
            store.clear_lexical_index()
            ids: dict[str, int] = {}
            df: Counter[int] = Counter()
            chunks = total_length = top = 0

            def batches() -> Iterator[list[tuple[int, np.ndarray, np.ndarray]]]:
                nonlocal chunks, total_length, top
                while rows := store.chunk_texts_after(top, REINDEX_BATCH):
                    batch, forward, items = [], [], []
                    for (_cid, _latest, _text, title, source, cmeta), counts in zip(
                            rows, analyzer.term_counts_many(r[2] for r in rows)):
                        extra = None
                        if with_fields:
                            extra = fields.chunk_field_counts(
                                analyzer, fields.field_counts(analyzer, "title", fields.effective_title(title, source)),
                                loads(cmeta) if cmeta != "{}" else {})
                        for term in (*counts, *(extra or ())):
                            if term not in ids:
                                ids[term] = len(ids) + 1
                        items.append((counts, extra))
                    decoded: list[tuple[np.ndarray, np.ndarray]] = []
                    for (cid, latest, *_rest), (terms_blob, tfs_blob, length), (term_ids, tfs) in zip(
                            rows, forward_indexes(items, ids, decoded=decoded), decoded):
                        forward.append((terms_blob, tfs_blob, length, cid))
                        batch.append((cid, term_ids, tfs))
                        if latest:
                            df.update(term_ids.tolist())
                            total_length += length
                    store.set_forward_indexes(forward)
                    chunks += len(rows)
                    top = rows[-1][0]
                    yield batch

            idx.write_all_postings(store, batches())
            store.add_terms((tid, term, df.get(tid, 0)) for term, tid in ids.items())
            rewrite_filter_index(store)
            store.finish_reindex(total_length, max(top, store.stats_row()["flushed_upto"]))
            store.set_setting("analyzer", analyzer.config())
            new_fields = dict(fields.DEFAULT_WEIGHTS) if with_fields and "fields" not in engine.settings else None
            if new_fields is not None:
                store.set_setting("fields", new_fields)
            store.bump_stats(next_ids=(0, top + 1))  # every chunk id below next_chunk_id again (check() asks it)
            # this connection's view is rebuilt from the rows (clear_lexical_index dropped the
            # chunk-state snapshot: lengths changed), and is the snapshot of this flush
            engine.index = idx.Index(store)
            engine.index.sync()
            engine.index.write_snapshot()
        engine.analyzer = analyzer
        engine.analyzer_config = engine.settings["analyzer"] = analyzer.config()
        if new_fields is not None:
            engine.settings["fields"] = new_fields
        return previous, chunks, terms_before, len(ids)

    def embed(self, embedder: Embedder, batch_size: int = 64, *, rebuild: bool = False, full_scan: bool = False,
              progress: Callable[[int, int], None] | None = None, tally: VectorTally | None = None) -> int:
        """Give every pending chunk (one without a vector; kept older versions
        included, as ``versions="all"`` searches see them) a vector; returns how many were stored.

        Pending chunks are read ``batch_size`` at a time. A chunk whose text
        already has a stored vector gets a copy of it; the other distinct texts
        of the batch are embedded once each, outside any transaction (an
        embedding endpoint may be slow); each batch's vectors are then written in
        their own write transaction. ``rebuild=True`` first deletes every vector and
        records ``embedder``'s model; otherwise a different recorded model raises
        :class:`EmbeddingError`. ``full_scan`` looks for pending chunks below the
        watermark too (repairs hand-made holes). ``progress(done, pending_total)``
        is called after each batch; ``tally`` counts what was embedded and reused.
        If the embedder fails, vectors written by
        earlier batches stay, the rest stay pending, and ``EmbeddingError`` says
        how many are pending.
        """
        check_positive_int(batch_size, "batch_size")
        name, dims = embedder.name, dimensions_of(embedder)
        store = self.engine.store
        with self.engine.writing():
            if rebuild:
                store.reset_vector_model(name, dims)
            else:
                store.set_vector_model(name, dims)
            model = store.vector_model()
            start = 0 if full_scan else store.embedded_upto()
            total = store.unembedded_count() if progress is not None else 0
        self._hash_old_vectors()
        tally = tally if tally is not None else VectorTally()
        done = 0
        after = start
        while True:
            with store.read():
                batch = store.unembedded_chunks(limit=batch_size, after=after)
                hashes = [text_hash(text) for _, text in batch]
                stored = store.vectors_by_hash(hashes)
            if not batch:
                break
            todo: dict[bytes, str] = {}  # each distinct text without a stored vector, once
            for (_cid, text), h in zip(batch, hashes):
                if h not in stored and h not in todo:
                    todo[h] = text
            made: dict[bytes, np.ndarray] = {}
            if todo:
                try:
                    vecs = as_float32(embedder.embed(list(todo.values())), name)
                    if vecs.shape != (len(todo), dims):
                        raise EmbeddingError(f"embedder {name!r} returned shape {vecs.shape} for {len(todo)} "
                                             f"texts, expected ({len(todo)}, {dims})")
                    if not np.all(np.isfinite(vecs)):
                        raise EmbeddingError(f"embedder {name!r} returned NaN or infinite values")
                except Exception as e:
                    with store.read():
                        left = store.unembedded_count()
                    msg = (f"embedding with {name!r} failed ({e}); {left} chunks are pending (stored without "
                           f"vectors: lexical search finds them, vector search does not). Run `ragdb embed` to "
                           f"retry")
                    raise EmbeddingError(msg) from e
                made = dict(zip(todo, vecs))
            first: list[tuple[int, np.ndarray]] = []  # a text's first chunk: embedded
            first_hashes: list[bytes] = []
            again: list[tuple[int, np.ndarray]] = []  # the same text again in this batch
            again_hashes: list[bytes] = []
            copies: list[tuple[int, bytes, bytes]] = []  # a stored vector's text
            seen: set[bytes] = set()
            for (cid, _t), h in zip(batch, hashes):
                if h in stored:
                    copies.append((cid, stored[h], h))
                elif h in seen:
                    again.append((cid, made[h]))
                    again_hashes.append(h)
                else:
                    seen.add(h)
                    first.append((cid, made[h]))
                    first_hashes.append(h)
            last = batch[-1][0]
            with self.engine.writing():
                current = store.vector_model()
                if current is None or current != model:  # (the copied bytes are of this model and dtype)
                    raise EmbeddingError(model_mismatch(current or {"model": None, "dimensions": 0}, name, dims)
                                         + " (the model was changed by another process while embedding)")
                embedded = store.put_vectors(first, first_hashes)
                reused = store.put_vectors(again, again_hashes)
                reused += store.copy_vectors(copies, existing_only=True)
                # Every chunk in (start, last] has a vector now (or was deleted):
                # later searches for pending chunks start after it.
                store.advance_embedded_upto(last, start)
                self.engine.vectors.sync()
                done += embedded + reused
                if progress is not None and done > total:
                    # chunks added since the count (a follower, or a writer in another
                    # process): the total grows with them, so done never exceeds it
                    total = done + store.unembedded_count()
            tally.embedded += embedded
            tally.reused += reused
            after = last
            if progress is not None:
                progress(done, total)
        return done

    def _hash_old_vectors(self) -> None:
        """Give vectors stored before migration 0005 their text hash (a few thousand
        per transaction), so later writes find and reuse them; a no-op once done."""
        store = self.engine.store
        while True:
            with store.read():
                rows = store.unhashed_vectors(HASH_FILL_BATCH)
            if not rows:
                return
            with self.engine.writing():
                store.set_text_hashes([(text_hash(text), cid) for cid, text in rows])

    def document(self, doc_id: int, with_text: bool = False) -> Document:
        row = self.engine.store.doc_row(doc_id)
        if row is None:
            raise DocumentNotFound(f"no document with id {doc_id}")
        return doc_from_row(row, with_text)

    def write(self, batch: list[Prepared], tally: VectorTally | None = None,
              analyzer: Analyzer | None = None, bulk: bool = False) -> list[Change]:
        """Write a batch of prepared documents (one transaction): each is added,
        replaces the latest version of its source, or is identical to it (unchanged).

        Once the database holds vectors, each new chunk whose text has one (a
        chunk of the version it replaces, or any stored chunk) gets a copy of it
        in this transaction; ``tally.reused`` counts them. ``analyzer``: the one the
        batch was analyzed with; should another connection have reindexed the database
        with another one since, the batch's chunks are analyzed again with that one here.
        ``bulk``: a batch of a bulk load after its first, whose new terms go to ``bulk_terms``
        (:meth:`settle_bulk_terms` at the load's end; ``LexicalSQL.add_new_terms``)."""
        store, index = self.engine.store, self.engine.index
        with self.engine.writing():
            self.engine.sync()
            settled = bool(index.bulk_terms and not bulk)
            if settled:
                # a bulk load that did not reach its end (interrupted, or still running in another
                # process) left its terms there: into new_terms, where lookups find them by index
                store.settle_bulk_terms()
                index.bulk_terms = False
            current = self.engine.analyzer
            if analyzer is not None and analyzer is not current:
                for p in batch:
                    p.chunks = [(s, e, m, current.term_counts(p.text[s:e])) for s, e, m, _counts in p.chunks]
                    p.field_counts = None  # analyzed again below, with the database's analyzer
            changes = _Changes()
            # text hash -> vector bytes of the versions this batch replaces (read before
            # they are deleted); None: no vectors stored, nothing to reuse, nothing hashed.
            changes.reusable = {} if store.has_vectors() else None
            existing = store.latest_by_source([p.source for p in batch])
            next_doc, next_chunk = index.next_ids  # read by index.sync() just now
            results: list[tuple[str, int, int | None]] = []  # (status, doc id, replaced id)
            new_docs: list[tuple[int, Prepared]] = []
            pending_ids: set[int] = set()
            new_docs_all: list[tuple[int, Prepared]] = []
            written: dict[int, Prepared] = {}  # documents this batch added so far
            # stored documents found unchanged, as they stood then: a later record of the batch
            # may replace the same source, which deletes (or demotes) the version first found
            unchanged: dict[int, Document] = {}
            for p in batch:
                ex = existing.get(p.source)
                if ex is not None:
                    ex_id, ex_hash, ex_version, ex_meta, ex_acl, ex_ts, ex_title, ex_chunker = ex
                    if not p.acl_given:  # no labels given: the new version keeps the stored ones
                        p.acl = tuple(loads(ex_acl))
                    if (ex_hash == p.content_hash and ex_version == p.version and ex_meta == p.metadata_json
                            and tuple(loads(ex_acl)) == p.acl and ex_title == p.title and ex_chunker == p.chunker
                            and _chunk_metadata(store, ex_id, written) == [dumps(m) for _s, _e, m, _c in p.chunks]):
                        # the same text, chunks, headings (spans), title, metadata and labels
                        results.append(("unchanged", ex_id, None))
                        if ex_id not in written and ex_id not in unchanged:
                            unchanged[ex_id] = self.document(ex_id)
                        continue
                    if ex_id in pending_ids:
                        # replaced again within this batch: write what we have first
                        self._insert(new_docs, changes, next_chunk, bulk)
                        next_chunk = changes.next_chunk
                        new_docs = []
                        pending_ids = set()
                    replaced = ex_id
                    if changes.reusable is not None:
                        changes.reusable.update(store.doc_vectors(ex_id))
                    if self.engine.settings.get("keep_versions", False):
                        self._demote(ex_id, p.ts, changes)
                    else:
                        self._remove(ex_id, True, changes, (ex_meta != "{}", ex_acl != "[]"))
                else:
                    replaced = None
                doc_id = next_doc
                next_doc += 1
                new_docs.append((doc_id, p))
                new_docs_all.append((doc_id, p))
                pending_ids.add(doc_id)
                existing[p.source] = (doc_id, p.content_hash, p.version, p.metadata_json, dumps(list(p.acl)),
                                      p.timestamp, p.title, p.chunker)
                written[doc_id] = p
                results.append(("replaced" if replaced is not None else "added", doc_id, replaced))
            if new_docs:
                self._insert(new_docs, changes, next_chunk, bulk)
            if new_docs_all:
                changes.next_ids = (next_doc, changes.next_chunk)
            if changes.any:
                self._commit_changes(changes)
            elif settled:  # (a new generation: other handles read bulk_terms' state again)
                index.note_write(store.bump_stats(), index.n_chunks, index.total_length)
            if tally is not None:
                tally.reused += changes.reused
            made = dict(new_docs_all)
            from ragdb.records import Change

            return [Change(status, doc_from_prepared(d, made[d]) if d in made else unchanged[d], replaced)
                    for status, d, replaced in results]

    def _insert(self, docs: list[tuple[int, Prepared]], changes: _Changes, next_chunk: int,
                bulk: bool = False) -> None:
        store, index = self.engine.store, self.engine.index
        ids = index.term_cache
        chunk_counts = [counts for _, p in docs for *_, counts in p.chunks]
        # Counts from analysis workers come as their term numbers: mapped to term ids through
        # each worker's cached numbers (only numbers not seen before are looked up, by term)
        numbered = _NumberedTerms(chunk_counts, index.term_token)
        all_terms = set(numbered.unknown_terms()).union(  # unions in C
            *(c for i, c in enumerate(chunk_counts) if i not in numbered.positions))
        field_terms: dict[int, list[dict[str, int]]] = {}  # doc id -> each chunk's field terms
        if self.engine.settings.get("fields") is not None:
            analyzer = self.engine.analyzer
            for doc_id, p in docs:
                # analyzed before the write transaction (prepared_batches), else here
                field_terms[doc_id] = p.field_counts if p.field_counts is not None else field_counts_of(analyzer, p)
                for fc in field_terms[doc_id]:
                    all_terms.update(fc)
        missing = ids.missing(all_terms)  # (sorted below, where order matters)
        if missing:
            if index.term_cache_upto >= 0:
                if index.term_cache_stale:  # another connection wrote: read the terms it added
                    for term, tid in store.term_ids_after(index.term_cache_upto):
                        ids[term] = tid
                        index.term_cache_upto = max(index.term_cache_upto, tid)
                    index.term_cache_stale = False
                    missing = [t for t in missing if t not in ids]
            elif len(missing) > 2000 or self._next_term_id() <= WRITER_TERM_CACHE:
                # One scan of the vocabulary, then every miss is a new term: it
                # beats thousands of lookups in bulk loads, and saves single adds
                # a lookup each. Vocabularies over WRITER_TERM_CACHE terms are
                # looked up per write instead (memory), unless the write is large.
                for term, tid in store.all_term_ids():
                    ids[term] = tid
                    index.term_cache_upto = max(index.term_cache_upto, tid)
                index.term_cache_upto = max(index.term_cache_upto, 0)
                index.term_cache_stale = False
                missing = [t for t in missing if t not in ids]
            else:
                if not index.term_cache_frequent:
                    for term, tid in store.frequent_term_ids(max(2, index.n_chunks // WRITER_FREQUENT_SHARE)):
                        ids[term] = tid
                    index.term_cache_frequent = True
                    missing = [t for t in missing if t not in ids]
                if missing:
                    ids.update(store.term_id_map(missing, bulk=index.bulk_terms))
                missing = [t for t in missing if t not in ids]
        new_terms = sorted(missing)
        if new_terms:
            first = self._next_term_id()  # (read once a write at most: remembered until the file changes)
            for i, term in enumerate(new_terms):
                ids[term] = first + i
            index.next_term = (index.generation, first + len(new_terms))  # (Index.next_term)
            if index.term_cache_upto >= 0:
                index.term_cache_upto = max(index.term_cache_upto, first + len(new_terms) - 1)
        now = utcnow_iso()
        doc_rows = []
        chunk_rows = []
        reusable = changes.reusable
        hashed: list[tuple[int, bytes]] = []  # (chunk id, text hash) when vectors may be reused
        # The forward indexes of the whole batch at once (:func:`forward_indexes`). They keep
        # the analyzer's term order, which is the same for the same chunk text in any database,
        # so the TF-IDF norm sums come out bit-identical however the database was built.
        numbered.resolve(ids)
        decoded: list[tuple[np.ndarray, np.ndarray]] = []  # each chunk's sorted term ids and tfs
        forward = iter(forward_indexes(
            [(counts, field_terms[doc_id][ordinal] if field_terms else None)
             for doc_id, p in docs for ordinal, (_s, _e, _m, counts) in enumerate(p.chunks)], ids,
            numbered.term_ids(), decoded=decoded))
        unpacked = iter(decoded)
        for doc_id, p in docs:
            doc_rows.append((doc_id, p.source, p.version, p.timestamp, p.ts, p.content_hash, p.title, p.text,
                             p.metadata_json, "[]" if not p.acl else dumps(list(p.acl)), p.chunker, now))
            whole = len(p.text)
            for ordinal, (start, end, cmeta, _counts) in enumerate(p.chunks):
                terms_blob, tfs_blob, length = next(forward)
                cid = next_chunk
                next_chunk += 1
                ctext = chunk_text(p, start, end, whole)
                if reusable is not None:
                    hashed.append((cid, text_hash(p.text if ctext is None else ctext)))
                chunk_rows.append((cid, doc_id, ordinal, start, end, length, ctext,
                                   "{}" if not cmeta else dumps(cmeta), terms_blob, tfs_blob))
                chunk_ids, chunk_tfs = next(unpacked)
                changes.new_chunks.append((cid, doc_id, length, chunk_ids, chunk_tfs,
                                           ctext is None and ordinal == 0 and not cmeta))
                changes.chunks += 1
                changes.length += length
            changes.docs += 1
        if new_terms:
            store.add_new_terms([(ids[t], t) for t in new_terms], bulk=bulk)
            if bulk:
                index.bulk_terms = True
        store.insert_documents(doc_rows)
        store.insert_chunks(chunk_rows)
        meta_rows = [(doc_id, *row) for doc_id, p in docs for row in scalar_items(p.metadata)]
        acl_rows = [(doc_id, label) for doc_id, p in docs for label in p.acl]
        if meta_rows or acl_rows:
            store.insert_doc_index(meta_rows, acl_rows)
        if hashed:
            assert reusable is not None
            found = {h: reusable[h] for _, h in hashed if h in reusable}
            found.update(store.vectors_by_hash(h for _, h in hashed if h not in found))
            if found:
                changes.reused += store.copy_vectors([(cid, found[h], h) for cid, h in hashed if h in found])
        changes.next_chunk = next_chunk

    def _next_term_id(self) -> int:
        """The vocabulary's next free term id: as this connection's last write left it when
        nothing changed the file since (:attr:`ragdb.index.inverted.Index.next_term`), else read."""
        index = self.engine.index
        known = index.next_term
        if known is not None and known[0] == index.generation:
            return known[1]
        found = self.engine.store.next_term_id(index.bulk_terms)
        index.next_term = (index.generation, found)
        return found

    def _remove(self, doc_id: int, latest: bool, changes: _Changes,
                indexed: tuple[bool, bool] = (True, True),
                rows: Sequence[tuple[int, int, int, bytes, bytes]] | None = None) -> None:
        """Delete a document's rows; lower statistics if it was counted.

        Document frequencies: an unflushed chunk stops counting by itself; a
        flushed one's terms go with its chunk_log entry and are subtracted until
        the next flush. ``rows``: the document's ``doc_chunks``, when the caller has read them."""
        if rows is None:
            rows = self.engine.store.doc_chunks(doc_id)
        if latest:
            upto = self.engine.index.flushed_upto
            flushed = [terms for cid, _l, _latest, terms, _tfs in rows if cid <= upto]
            dead = iter(forward_term_lists(flushed)) if flushed else None
            for cid, _l, _latest, terms, _tfs in rows:
                if cid <= upto:
                    assert dead is not None
                    changes.absent.append((cid, terms))  # (the blob as stored: chunk_log.terms reads either form)
                    changes.dead.append(next(dead))
                else:
                    changes.absent.append((cid, None))
            self._uncount(rows, changes, -1, df=False)
            changes.docs -= 1
        else:
            changes.absent.extend((r[0], None) for r in rows)
        self.engine.store.delete_document(doc_id, indexed=indexed)

    def _demote(self, doc_id: int, valid_to: float, changes: _Changes) -> None:
        """Keep a replaced version for ``versions='all'``/``as_of`` searches, uncounted."""
        rows = self.engine.store.doc_chunks(doc_id)
        self._uncount(rows, changes, -1)
        changes.docs -= 1
        changes.old.extend(r[0] for r in rows)
        self.engine.store.set_latest(doc_id, False, valid_to)

    def _promote(self, doc_id: int, changes: _Changes) -> None:
        rows = self.engine.store.doc_chunks(doc_id)
        self._uncount(rows, changes, +1)
        changes.docs += 1
        changes.latest.extend(r[0] for r in rows)
        self.engine.store.set_latest(doc_id, True, None)

    def _uncount(self, rows: Sequence[tuple[int, int, int, bytes, bytes]], changes: _Changes, sign: int,
                 df: bool = True) -> None:
        """Adjust statistics for chunks entering (+1) or leaving (-1) the latest versions.
        Unflushed chunks count in df through their state alone; flushed ones update ``vocabulary``."""
        upto = self.engine.index.flushed_upto
        flushed = [terms for cid, _l, _latest, terms, _tfs in rows if cid <= upto] if df else []
        for term_ids in (forward_term_lists(flushed) if flushed else ()):
            changes.df.update(dict.fromkeys(term_ids, sign))
        for _cid, length, _latest, _terms, _tfs in rows:
            changes.chunks += sign
            changes.length += sign * length

    def _commit_changes(self, changes: _Changes) -> None:
        """Write statistics and document frequencies; bring the in-memory index along."""
        store, index = self.engine.store, self.engine.index
        deltas = [(d, t) for t, d in changes.df.items() if d]
        if deltas:
            store.add_df(deltas)
        gen = store.bump_stats(docs=changes.docs, chunks=changes.chunks, length=changes.length,
                               next_ids=changes.next_ids)
        log = [(c, idx.ABSENT, terms) for c, terms in changes.absent] + \
              [(c, idx.OLD, None) for c in changes.old] + [(c, idx.LATEST, None) for c in changes.latest]
        log_seq = store.log_states(log) if log else None
        index.add_chunks(changes.new_chunks)
        for terms in changes.dead:  # a chunk's terms are distinct: count each once (in C)
            index.dead.update(terms)
        if changes.absent:
            index.set_state([c for c, _ in changes.absent], idx.ABSENT)
        if changes.old:
            index.set_state(changes.old, idx.OLD)
        if changes.latest:
            index.set_state(changes.latest, idx.LATEST)
        # the next free term id this write left, known at the new generation (it added any terms
        # itself, in _insert, at the generation before)
        known = index.next_term
        index.next_term = (gen, known[1]) if known is not None and known[0] == index.generation else None
        index.note_write(gen, index.n_chunks + changes.chunks, index.total_length + changes.length, log_seq)



class _Changes:
    """What one write transaction changed, to update statistics and the in-memory index."""

    def __init__(self) -> None:
        self.docs = 0
        self.chunks = 0
        self.length = 0
        self.df: Counter[int] = Counter()
        self.dead: list[list[int]] = []  # term ids of each deleted flushed chunk
        self.new_chunks: list[tuple[int, int, int, np.ndarray, np.ndarray, bool]] = []
        self.absent: list[tuple[int, bytes | None]] = []  # deleted chunks (and terms leaving df)
        self.old: list[int] = []
        self.latest: list[int] = []
        self.next_chunk = 0
        self.next_ids = (0, 0)  # next free (document id, chunk id) after this write
        self.reusable: dict[bytes, bytes] | None = None  # see Writer.write
        self.reused = 0  # new chunks that took over a stored vector

    @property
    def any(self) -> bool:
        return bool(self.docs or self.chunks or self.new_chunks or self.absent or self.old or self.latest)




def _chunk_metadata(store: Any, doc_id: int, written: Mapping[int, Prepared]) -> list[str]:
    """The chunks' metadata json of a stored document, or of one this batch adds."""
    if doc_id in written:
        return [dumps(m) for _s, _e, m, _c in written[doc_id].chunks]
    return list(store.chunk_metadata(doc_id))


def forward_index(counts: Any, ids: TermTable | Mapping[str, int], fields: Mapping[str, int] | None = None
                  ) -> tuple[bytes, bytes, int]:
    """A chunk's forward index from its term counts (the analyzer's order, kept so the
    same text gives the same norms in any database: :mod:`ragdb.index.forward`) and term
    ids: the packed term ids and tfs (capped at 65535; :func:`ragdb.index.forward.pack_forward`),
    and its length for BM25: the sum of the counts less the compound whole forms that overlap
    a part (``TermCounts.overlaps``, version 2). ``fields``: the chunk's field terms
    (:mod:`ragdb.text.fields`), stored after the text's and not counted in its length."""
    tfs = list(counts.values())
    length = sum(tfs) - getattr(counts, "overlaps", 0)
    term_ids = list(map(ids.__getitem__, counts))
    if fields:
        term_ids += map(ids.__getitem__, fields)
        tfs += fields.values()
    terms_blob, tfs_blob = pack_forward(term_ids, [min(c, 65535) for c in tfs])
    return terms_blob, tfs_blob, length


class _NumberedTerms:
    """The chunks of a write whose counts came from an analysis worker as its term numbers
    (:class:`ragdb.text.analysis.PackedCounts` with a ``vocabulary``), by worker vocabulary:
    their numbers, and those whose term id the vocabulary's cache does not hold yet. The cache
    (``WorkerVocabulary.term_ids``, number -> term id, 0 for none: term ids start at 1) is
    valid while the index's ``term_token`` is the one it was filled under."""

    def __init__(self, chunk_counts: Sequence[Any], token: object) -> None:
        by_vocabulary: dict[int, tuple[Any, list[int]]] = {}
        for i, counts in enumerate(chunk_counts):
            vocabulary = getattr(counts, "vocabulary", None)
            if vocabulary is not None and counts.numbers is not None:
                by_vocabulary.setdefault(id(vocabulary), (vocabulary, []))[1].append(i)
        self.positions: set[int] = set()
        self.sizes: dict[int, list[int]] = {}  # id(vocabulary) -> its chunks' numbers of terms
        # vocabulary, chunks, numbers, unknown numbers, their terms
        self.groups: list[tuple[Any, list[int], np.ndarray, np.ndarray, list[str]]] = []
        for vocabulary, positions in by_vocabulary.values():
            size = len(vocabulary.names)
            if vocabulary.token is not token or vocabulary.term_ids is None:
                vocabulary.term_ids = np.zeros(size, np.int64)
                vocabulary.token = token
            elif len(vocabulary.term_ids) < size:
                vocabulary.term_ids = np.concatenate(
                    [vocabulary.term_ids, np.zeros(size - len(vocabulary.term_ids), np.int64)])
            numbers = array("I")
            for i in positions:
                numbers.extend(chunk_counts[i].numbers)
            self.sizes[id(vocabulary)] = [len(chunk_counts[i].numbers) for i in positions]
            flat = np.frombuffer(numbers, dtype=np.uint32) if len(numbers) else np.zeros(0, np.uint32)
            seen = np.zeros(size, dtype=bool)  # (a mask over the numbers: np.unique hashed, ~20 ms a batch)
            seen[flat] = True
            unknown = np.flatnonzero(seen & (vocabulary.term_ids[:size] == 0))
            # (the terms made strings once, for this write: the vocabulary holds them joined)
            self.groups.append((vocabulary, positions, flat, unknown, vocabulary.names.many(unknown)))
            self.positions.update(positions)

    def unknown_terms(self) -> Iterator[str]:
        """The terms of the numbers whose term id is not cached (each once a worker)."""
        for *_rest, terms in self.groups:
            yield from terms

    def resolve(self, ids: TermTable) -> None:
        """Cache the term ids of the unknown numbers (``ids`` holds all of them now)."""
        for vocabulary, _positions, _flat, unknown, terms in self.groups:
            if len(unknown):
                vocabulary.term_ids[unknown] = ids.ids_of(terms)

    def term_ids(self) -> dict[int, np.ndarray]:
        """Chunk position -> its text's term ids (in its counts' order), for the numbered chunks."""
        out: dict[int, np.ndarray] = {}
        for vocabulary, positions, flat, _unknown, _terms in self.groups:
            mapped = vocabulary.term_ids[flat]
            a = 0
            for i, n in zip(positions, self.sizes[id(vocabulary)]):
                out[i] = mapped[a:a + n]
                a += n
        return out


def forward_indexes(items: Sequence[tuple[Any, Mapping[str, int] | None]], ids: TermTable | Mapping[str, int],
                    given: Mapping[int, np.ndarray] | None = None,
                    decoded: list[tuple[np.ndarray, np.ndarray]] | None = None) -> list[tuple[bytes, bytes, int]]:
    """:func:`forward_index` of each (counts, fields) of a write's chunks, the same blobs and
    lengths, made for the whole batch at once: one pass in C mapping every term to its id,
    one array of every count, a cumulative sum for the lengths, and the blobs packed in
    whole-array passes (:func:`ragdb.index.forward.pack_forward_many`; per chunk, the sum,
    max, list and array calls had cost ~40 µs a chunk). ``decoded``: extended with each
    chunk's term ids (sorted) and tfs, what the in-memory index keeps of it."""
    sizes: list[int] = []  # per chunk: its text's terms
    extras: list[int] = []  # its field terms
    counts_all = array("I")
    try:
        for counts, fields in items:
            counts_all.extend(counts.values())  # (an array("I") of a worker's counts: one copy)
            sizes.append(len(counts))
            if fields:
                counts_all.extend(fields.values())
                extras.append(len(fields))
            else:
                extras.append(0)
    except (OverflowError, TypeError):  # a count that is no uint32: one at a time, as forward_index takes it
        return _one_at_a_time(items, ids, decoded)
    if len(counts_all) != sum(sizes) + sum(extras):  # pragma: no cover - values() disagreeing with len()
        return _one_at_a_time(items, ids, decoded)
    if not given:
        term_ids = array("I", map(ids.__getitem__, chain.from_iterable((c if not f else chain(c, f)) for c, f in items)))
        if len(items) == 1:  # a single add's one chunk: packed without the batch's arrays
            terms_blob, tfs_blob, sid, stf = pack_forward_one(term_ids, counts_all)
            if decoded is not None:
                decoded.append((sid, stf))
            return [(terms_blob, tfs_blob, sum(counts_all[:sizes[0]]) - getattr(items[0][0], "overlaps", 0))]
        term_arr = np.frombuffer(term_ids, dtype=np.uint32)
    else:  # some chunks' term ids are given (numbered counts): the others' mapped here, in chunk order
        pieces: list[Any] = []
        for i, (c, f) in enumerate(items):
            known = given.get(i)
            if known is None:
                pieces.append(np.array(array("I", map(ids.__getitem__, c if not f else chain(c, f))), dtype=np.int64))
                continue
            pieces.append(known)
            if f:
                pieces.append(np.array(array("I", map(ids.__getitem__, f)), dtype=np.int64))
        term_arr = np.concatenate(pieces) if pieces else np.zeros(0, np.int64)
        if len(term_arr) and (int(term_arr.min()) < 0 or int(term_arr.max()) >= 1 << 32):  # pragma: no cover
            raise OverflowError("a term id does not fit an unsigned 32-bit integer")
    tfs = np.frombuffer(counts_all, dtype=np.uint32) if len(counts_all) else np.zeros(0, np.uint32)
    prefix = np.concatenate(([0], np.cumsum(tfs, dtype=np.int64))).tolist()  # sums of the counts before each
    lens = np.asarray(sizes, dtype=np.int64) + np.asarray(extras, dtype=np.int64)
    blobs = pack_forward_many(term_arr, tfs, lens, decoded=decoded)
    out: list[tuple[bytes, bytes, int]] = []
    a = 0
    for (counts, _f), n, m, (terms_blob, tfs_blob) in zip(items, sizes, extras, blobs):
        b, e = a + n, a + n + m
        out.append((terms_blob, tfs_blob, prefix[b] - prefix[a] - getattr(counts, "overlaps", 0)))
        a = e
    return out


def _one_at_a_time(items: Sequence[tuple[Any, Mapping[str, int] | None]], ids: TermTable | Mapping[str, int],
                   decoded: list[tuple[np.ndarray, np.ndarray]] | None) -> list[tuple[bytes, bytes, int]]:
    out = [forward_index(c, ids, f) for c, f in items]
    if decoded is not None and out:
        decoded.extend(unpack_forward_many([t for t, _f, _n in out], [f for _t, f, _n in out]).rows())
    return out


def scalar_items(metadata: Mapping[str, Any]) -> Iterable[tuple[str, Any, int | float | None, float | None]]:
    """(key, value, num, at) rows of the filter index: scalars, and scalar elements of lists
    (the same rows the migrations derive with json_each); booleans as 1/0, ``num``/``at``
    what range filters compare (:func:`ragdb.storage.codec.meta_number`)."""
    for key, value in metadata.items():
        for v in value if isinstance(value, (list, tuple)) else (value,):  # a tuple is a JSON array too
            if isinstance(v, (str, int, float, bool)):
                yield key, int(v) if isinstance(v, bool) else v, *meta_number(v)




def stored_filter_rows(doc_id: int, metadata_json: Any, acl_json: Any
                       ) -> tuple[list[tuple[Any, ...]] | None, list[tuple[int, str]] | None]:
    """A stored document's filter index rows, derived from its metadata and acl columns as
    every write derives them (:func:`scalar_items`; each label once): (doc_meta rows,
    doc_acl rows), each None when its column is damaged (not a JSON object; not a JSON
    array of strings). Used by reindex, to write them, and by check, to compare."""
    meta = _stored_json(metadata_json, dict)
    labels = _stored_json(acl_json, list)
    if labels is not None and not all(isinstance(x, str) for x in labels):
        labels = None
    return (None if meta is None else [(doc_id, *row) for row in scalar_items(meta)],
            None if labels is None else [(doc_id, label) for label in dict.fromkeys(labels)])


def _stored_json(raw: Any, kind: type) -> Any:
    """A JSON column's value when it is text holding a ``kind``, else None."""
    try:
        value = loads(raw) if isinstance(raw, (str, bytes)) else None
    except ValueError:
        return None
    return value if isinstance(value, kind) else None


def rewrite_filter_index(store: Any) -> None:
    """Write the filter index (doc_meta, doc_acl) anew from every document's metadata and
    labels (:func:`stored_filter_rows`), inside the caller's write transaction. A document
    whose stored JSON is damaged raises :class:`StorageError` naming it (nothing is
    changed then: the transaction rolls back)."""
    store.clear_filter_index()
    for block in store.document_filter_blocks():
        meta_rows: list[tuple[Any, ...]] = []
        acl_rows: list[tuple[int, str]] = []
        for doc_id, metadata, acl in block:
            meta, labels = stored_filter_rows(doc_id, metadata, acl)
            if meta is None or labels is None:
                raise StorageError(f"document {doc_id}: its stored metadata or labels are not valid JSON "
                                   f"(an object and an array of strings); `ragdb check` reports the damage")
            meta_rows += meta
            acl_rows += labels
        store.insert_doc_index(meta_rows, acl_rows)


def chunk_text(p: Prepared, start: int, end: int, whole: int) -> str | None:
    """The text a chunk stores of its own: None for a chunk that is its whole document
    (``whole``: the document text's length), which stores no copy."""
    return None if start == 0 and end == whole else p.text[start:end]


def stored_texts(batch: Sequence[Prepared]) -> list[str]:
    """Every text a write of ``batch`` stores: each document's, and its chunks' own (:func:`chunk_text`)."""
    out: list[str] = []
    for p in batch:
        out.append(p.text)
        whole = len(p.text)
        for start, end, _m, _c in p.chunks:
            if (own := chunk_text(p, start, end, whole)) is not None:
                out.append(own)
    return out


def doc_from_prepared(doc_id: int, p: Prepared) -> Document:
    from ragdb.records import Document

    meta = dict(p.metadata)
    if p.title is not None:
        meta.setdefault("title", p.title)
    return Document(id=doc_id, source=p.source, version=p.version, timestamp=p.timestamp,
                    content_hash=p.content_hash, metadata=meta, acl=p.acl, chunk_count=len(p.chunks),
                    latest=True)




def doc_from_row(row: Sequence[Any], with_text: bool) -> Document:
    from ragdb.records import Document

    doc_id, source, version, timestamp, content_hash, metadata, acl, latest, _title, nchunks = row[:10]
    meta = loads(metadata)
    if _title is not None:
        meta.setdefault("title", _title)
    return Document(id=doc_id, source=source, version=version, timestamp=timestamp, content_hash=content_hash,
                    metadata=meta, acl=tuple(loads(acl)), chunk_count=nchunks, latest=bool(latest),
                    text=row[10] if with_text and len(row) > 10 else None)


