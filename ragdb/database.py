"""The public :class:`Database`: add, replace, delete, search, inspect."""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import sys
from array import array
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any
from collections.abc import Iterable, Iterator, Mapping, Sequence

import numpy as np
import orjson

from . import filters
from .filters import check_finite, check_text
from . import index as idx
from .analysis import AnalysisPool, Analyzer, PackedCounts, is_blank
from .chunking import Chunker, get_chunker
from .errors import AnalyzerMismatch, DocumentNotFound, InvalidInput
from .storage import Store, dumps, loads, utcnow_iso
from .types import Document, Hit, LoadedDocument, Span, Stats

if TYPE_CHECKING:
    from .llm import Answer
    from .prompt import Prompt

if sys.byteorder != "little":  # pragma: no cover - the blobs are little-endian
    raise ImportError("ragdb stores packed little-endian integers and needs a little-endian machine")

SCORERS = ("bm25", "tfidf")
BULK_FLUSH_CHUNKS = 16384  # during add_many, flush once this many chunks are pending
MAX_K = 10_000


@dataclass
class _Prepared:
    source: str
    version: str | None
    timestamp: str
    ts: float
    title: str | None
    text: str
    metadata: dict[str, Any]
    metadata_json: str
    acl: tuple[str, ...]
    content_hash: str
    chunker: str
    chunks: list[tuple[int, int, dict[str, Any], "dict[str, int] | PackedCounts"]]  # start, end, metadata, term counts


class Database:
    """A ragdb database file. Create with :func:`ragdb.open`.

    Thread safety: a ``Database`` may be shared between threads; its
    operations are serialized by a lock (SQLite allows one statement at a time
    per connection). For parallel reads, open one ``Database`` per thread or
    process: readers never block each other or the writer (WAL mode).
    """

    def __init__(self, store: Store, analyzer: Analyzer, settings: Mapping[str, Any]) -> None:
        self._store = store
        self.analyzer = analyzer
        self._settings = dict(settings)
        self._index = idx.Index(store)
        self.path = store.path
        #: Embedder used on add (new chunks get vectors) and for vector/hybrid queries.
        self.embedder: Any = None

    # -- lifecycle -------------------------------------------------------------
    def close(self) -> None:
        """Close the database file."""
        self._store.close()

    def __enter__(self) -> "Database":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<ragdb.Database {self.path!r}>"

    @property
    def settings(self) -> dict[str, Any]:
        """Database-wide settings (analyzer, default chunker, keep_versions, ...)."""
        return dict(self._settings)

    # -- writing -----------------------------------------------------------------
    @contextlib.contextmanager
    def transaction(self) -> Iterator["Database"]:
        """Make every write inside the block one transaction (all or nothing).

        Adds, deletes and syncs inside become savepoints of one ``BEGIN
        IMMEDIATE`` transaction; other processes see none of it until the block
        ends, and an exception rolls all of it back.
        """
        with self._writing():
            yield self

    @contextlib.contextmanager
    def _writing(self) -> Iterator[None]:
        """A write transaction (nested ones are savepoints). Writes update the
        in-memory index as they go; if anything fails, that view may hold
        uncommitted changes, so it is dropped and reloaded from the file."""
        try:
            with self._store.write():
                yield
        except BaseException:
            self._index = idx.Index(self._store)
            raise
    def add(self, text: str, *, source: str | None = None, version: str | None = None,
            timestamp: str | datetime | None = None, metadata: Mapping[str, Any] | None = None,
            title: str | None = None, acl: Sequence[str] | None = None,
            chunker: str | Chunker | None = None, spans: Sequence[Span] = ()) -> Document:
        """Add one document (or replace the stored document with the same ``source``).

        Adding identical content (text, version, metadata, labels) again changes
        nothing and returns the stored document. Without ``source`` the source
        is derived from the text's hash. One transaction.
        """
        record = {"text": text, "source": source, "version": version, "timestamp": timestamp,
                  "metadata": metadata, "title": title, "acl": acl, "spans": spans}
        return self.add_many([record], chunker=chunker)[0]

    def add_many(self, records: Iterable[Mapping[str, Any] | LoadedDocument], *,
                 chunker: str | Chunker | None = None, batch_size: int = 1000,
                 workers: int | None = None) -> list[Document]:
        """Add many documents; each batch of ``batch_size`` is one transaction.

        Records are mappings with the keyword arguments of :meth:`add`
        (``text`` required) or :class:`LoadedDocument` objects from the loaders.
        An invalid record raises before its batch is written.

        ``workers``: processes that analyze text while this one writes. By
        default (``None``) a load of more than 256 records uses one per spare
        CPU core, up to 3, on Linux (workers are forked); ``0`` analyzes in
        this process. Results do not depend on it.
        """
        if not isinstance(batch_size, int) or batch_size < 1:
            raise InvalidInput(f"batch_size must be a positive integer, got {batch_size!r}")
        if workers is not None and (not isinstance(workers, int) or isinstance(workers, bool) or workers < 0):
            raise InvalidInput(f"workers must be a non-negative integer, got {workers!r}")
        if isinstance(records, (str, bytes, Mapping)) or not hasattr(records, "__iter__"):
            raise InvalidInput(f"records must be an iterable of mappings or LoadedDocument, "
                               f"got {type(records).__name__}")
        ch = get_chunker(chunker if chunker is not None else self._settings.get("chunker"))
        if self.embedder is not None:
            from . import vectors

            vectors.ensure_model(self, self.embedder)  # a different model is refused before writing
        out: list[Document] = []
        now = _timestamp(None, "now")
        bulk_terms: set[int] = set()  # terms flushed by this call in mid-load
        pool: AnalysisPool | None = None
        backlog = max(2, -(-batch_size // ANALYSIS_PART))  # parts a worker may have queued (a batch)
        # Batches are analyzed while the previous one is written: the texts go to
        # the worker processes in parts; this process analyzes a part itself
        # only when the workers are behind (see _dispatch).
        pending: tuple[list[_Prepared], list[_Prepared], list[Any]] | None = None

        def write(batch: list[_Prepared], pooled: list[_Prepared], parts: list[Any]) -> None:
            nonlocal bulk_terms
            if pooled:
                counts = iter([c for part in parts for c in (part if isinstance(part, list) else part.get())])
                for p in pooled:
                    p.chunks[:] = [(s, e, m, next(counts)) for s, e, m, _ in p.chunks]
            out.extend(self._write(batch))
            # bound the memory of a bulk load: flush large tails between batches
            bulk_terms |= self._maybe_flush(BULK_FLUSH_CHUNKS)

        it = iter(records)
        try:
            n = 0
            while True:
                batch: list[_Prepared] = []
                pooled: list[_Prepared] = []  # records of this batch analyzed in parts
                parts: list[Any] = []         # their analysis: lists of counts, or pool jobs
                texts: list[str] = []         # texts not yet sent
                try:
                    for record in it:
                        if pool is None and n == POOL_AFTER and workers != 0:
                            pool = _analysis_pool(self.analyzer, workers)  # a bulk load: analyze in parallel
                        p = self._prepare(record, ch, n, now, analyze=pool is None)
                        n += 1
                        batch.append(p)
                        if pool is not None:
                            pooled.append(p)
                            texts.extend(p.text[s:e] for s, e, _, _ in p.chunks)
                            if len(texts) >= ANALYSIS_PART:
                                parts.append(self._dispatch(pool, texts, backlog))
                                texts = []
                        if len(batch) >= batch_size:
                            break
                    if texts:
                        assert pool is not None
                        parts.append(self._dispatch(pool, texts, backlog))
                except BaseException:
                    if pending is not None:  # the batches before the bad record are written
                        write(*pending)
                        pending = None
                    raise
                if not batch:
                    break
                if pending is not None:
                    write(*pending)  # while the workers analyze this batch
                pending = (batch, pooled, parts)
            if pending is not None:
                write(*pending)
        finally:
            if pool is not None:
                pool.close(wait=False)
        # After a bulk load that flushed in mid-load, flush the rest and merge the
        # segments it wrote, so each term it touched is one segment again
        # (queries then read one row per term, not one per mid-load flush).
        self._maybe_flush(0 if bulk_terms else None, merge_terms=bulk_terms)
        if self.embedder is not None and out:
            from . import vectors

            # Text is committed first; vectors follow in their own transactions.
            # If the embedder fails, the new chunks stay pending (lexical search
            # finds them, vector search does not) until `ragdb embed` fills them.
            vectors.embed_pending(self, self.embedder)
        return out

    def _dispatch(self, pool: AnalysisPool, texts: list[str], backlog: int) -> Any:
        """Analyze a part of a batch in the pool, or here when the workers are behind
        (more than a batch of parts per worker still waiting: they need that
        much queued to stay busy while this process writes the previous batch)."""
        if pool.backlog() > backlog * pool.workers:
            return [self.analyzer.term_counts(t) for t in texts]
        return pool.submit(texts)

    def _maybe_flush(self, threshold: int | None = None, merge_terms: set[int] | frozenset[int] = frozenset()
                     ) -> set[int]:
        """Move the in-memory tail into packed segments once it is large (its own
        transaction); ``merge_terms`` with more than one segment are merged into one.
        Returns the ids of the terms flushed.

        Done after a whole ``add_many`` rather than inside each batch, so bulk
        loads write each term's postings once, in one segment."""
        if threshold is None:
            threshold = self._settings.get("flush_threshold", idx.FLUSH_THRESHOLD)
        if len(self._index.tail_entries) < max(threshold, 1) and not merge_terms:
            return set()
        with self._writing():
            self._index.sync()
            if len(self._index.tail_entries) < max(threshold, 1) and not merge_terms:
                return set()
            flushed = set(self._index.tail.term_ids.tolist())
            self._index.flush(merge_terms=merge_terms)
            self._index.note_write(self._store.bump_stats(), self._index.n_chunks, self._index.total_length)
        return flushed

    def delete(self, doc_id: int | None = None, *, source: str | None = None, glob: bool = False) -> int:
        """Delete a document by id, or every version of a source (``glob=True``:
        a shell-style pattern such as ``docs/*.md``). Returns the number of
        documents deleted. Deleting the latest version by id makes the newest
        kept older version (if any) the latest again."""
        if (doc_id is None) == (source is None):
            raise InvalidInput("delete: give exactly one of doc_id or source")
        if doc_id is not None:
            _check_id(doc_id, "delete: doc_id")
        if source is not None:
            if not isinstance(source, str):
                raise InvalidInput(f"delete: source must be a string, got {source!r}")
            check_text(source, "delete: source")
        store, index = self._store, self._index
        with self._writing():
            index.sync()
            changes = _Changes()
            if doc_id is not None:
                row = store.doc_source(doc_id)
                if row is None:
                    raise DocumentNotFound(f"no document with id {doc_id}")
                self._remove(doc_id, bool(row[1]), changes, (bool(row[2]), bool(row[3])))
                if row[1]:
                    older = store.newest_older_version(row[0])
                    if older is not None:
                        self._promote(older, changes)
                deleted = 1
            else:
                assert source is not None
                docs = store.source_docs_with_chunks(source, glob=glob)
                for did, latest, has_meta, has_acl, chunk_rows in docs:
                    self._remove(did, bool(latest), changes, (has_meta, has_acl), chunk_rows)
                deleted = len(docs)
            if deleted:
                self._commit_changes(changes)
        return deleted

    def _prepare(self, record: Mapping[str, Any] | LoadedDocument, chunker: Chunker, n: int,
                 now: tuple[str, float], analyze: bool = True) -> _Prepared:
        if isinstance(record, LoadedDocument):
            meta = dict(record.metadata)
            record = {"text": record.text, "source": record.source, "title": record.title,
                      "version": meta.pop("version", None), "timestamp": meta.pop("timestamp", None),
                      "metadata": meta, "spans": record.spans}
        if not isinstance(record, Mapping):
            raise InvalidInput(f"record {n}: expected a mapping with 'text', got {type(record).__name__}")
        unknown = set(record) - {"text", "source", "version", "timestamp", "metadata", "title", "acl", "spans",
                                 "chunker"}
        if unknown:
            raise InvalidInput(f"record {n}: unknown keys {sorted(unknown)}")
        text = record.get("text")
        source = record.get("source")
        label = f"document {source!r}" if source is not None else f"record {n}"
        if not isinstance(text, str):
            raise InvalidInput(f"{label}: text must be a string, got {type(text).__name__}")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise InvalidInput(f"{label}: text is not valid Unicode (lone surrogate at offset {e.start})") from None
        if is_blank(text):
            raise InvalidInput(f"{label}: text is empty (only whitespace or invisible characters)")
        content_hash = hashlib.sha256(text.encode("utf-8")).hexdigest()
        if source is None:
            source = f"sha256:{content_hash[:16]}"
        if not isinstance(source, str) or not source:
            raise InvalidInput(f"record {n}: source must be a non-empty string, got {source!r}")
        check_text(source, f"record {n}: source")
        version = record.get("version")
        if version is not None:
            if isinstance(version, (int, float)) and not isinstance(version, bool):
                version = str(version)
            if not isinstance(version, str):
                raise InvalidInput(f"{label}: version must be a string, got {version!r}")
            check_text(version, f"{label}: version")
        if record.get("timestamp") is None:
            timestamp, ts = now  # one "now" for the whole call
        else:
            timestamp, ts = _timestamp(record.get("timestamp"), label)
        metadata = record.get("metadata") or {}
        if not isinstance(metadata, Mapping):
            raise InvalidInput(f"{label}: metadata must be a mapping, got {type(metadata).__name__}")
        metadata = dict(metadata)
        try:
            metadata_json = dumps(metadata)
        except (TypeError, orjson.JSONEncodeError) as e:
            raise InvalidInput(f"{label}: metadata is not JSON-serialisable ({e})") from None
        if "null" in metadata_json:  # NaN and infinity come out as null: look for them only then
            check_finite(metadata, label)
        title = record.get("title")
        if title is not None and not isinstance(title, str):
            raise InvalidInput(f"{label}: title must be a string")
        if title is not None:
            check_text(title, f"{label}: title")
        acl_in = record.get("acl") or ()
        if isinstance(acl_in, str) or not all(isinstance(a, str) and a for a in acl_in):
            raise InvalidInput(f"{label}: acl must be a list of non-empty strings, got {acl_in!r}")
        acl = tuple(sorted(set(check_text(a, f"{label}: acl label") for a in acl_in)))
        rec_chunker = get_chunker(record["chunker"]) if record.get("chunker") else chunker
        spans: Sequence[Span] = record.get("spans") or ()
        if isinstance(spans, (str, bytes)) or not all(isinstance(sp, Span) for sp in spans):
            raise InvalidInput(f"{label}: spans must be a sequence of ragdb.types.Span")
        chunks = []
        for start, end in rec_chunker.split(text):
            cmeta: dict[str, Any] = {}
            for sp in spans:
                if sp.start <= start < sp.end:
                    cmeta.update(sp.metadata)
            chunks.append((start, end, cmeta, self.analyzer.term_counts(text[start:end]) if analyze else {}))
        return _Prepared(source, version, timestamp, ts, title, text, metadata, metadata_json, acl,
                         content_hash, rec_chunker.spec(), chunks)

    def _write(self, batch: list[_Prepared]) -> list[Document]:
        store, index = self._store, self._index
        with self._writing():
            index.sync()
            changes = _Changes()
            existing = store.latest_by_source([p.source for p in batch])
            next_doc, next_chunk = index.next_ids  # read by index.sync() just now
            results: list[Document | int] = []
            new_docs: list[tuple[int, _Prepared]] = []
            pending_ids: set[int] = set()
            new_docs_all: list[tuple[int, _Prepared]] = []
            for p in batch:
                ex = existing.get(p.source)
                if ex is not None:
                    ex_id, ex_hash, ex_version, ex_meta, ex_acl, ex_ts = ex
                    if (ex_hash == p.content_hash and ex_version == p.version and ex_meta == p.metadata_json
                            and tuple(loads(ex_acl)) == p.acl):
                        results.append(ex_id)
                        continue
                    if ex_id in pending_ids:
                        # replaced again within this batch: write what we have first
                        self._insert(new_docs, changes, next_chunk)
                        next_chunk = changes.next_chunk
                        new_docs = []
                        pending_ids = set()
                    if self._settings.get("keep_versions", False):
                        self._demote(ex_id, p.ts, changes)
                    else:
                        self._remove(ex_id, True, changes, (ex_meta != "{}", ex_acl != "[]"))
                doc_id = next_doc
                next_doc += 1
                new_docs.append((doc_id, p))
                new_docs_all.append((doc_id, p))
                pending_ids.add(doc_id)
                existing[p.source] = (doc_id, p.content_hash, p.version, p.metadata_json, dumps(list(p.acl)),
                                      p.timestamp)
                results.append(doc_id)
            if new_docs:
                self._insert(new_docs, changes, next_chunk)
            if new_docs_all:
                changes.next_ids = (next_doc, changes.next_chunk)
            if changes.any:
                self._commit_changes(changes)
            made = {d: p for d, p in new_docs_all}
            return [_doc_from_prepared(r, made[r]) if r in made else self._document(r) for r in results]

    def _insert(self, docs: list[tuple[int, _Prepared]], changes: "_Changes", next_chunk: int) -> None:
        store, index = self._store, self._index
        ids = index.term_cache
        all_terms = set().union(*(counts for _, p in docs for *_, counts in p.chunks))  # unions in C
        missing = [t for t in all_terms if t not in ids]
        if missing:
            if index.term_cache_upto >= 0:
                if index.term_cache_stale:  # another connection wrote: read the terms it added
                    for term, tid in store.term_ids_after(index.term_cache_upto):
                        ids[term] = tid
                        index.term_cache_upto = max(index.term_cache_upto, tid)
                    index.term_cache_stale = False
                    missing = [t for t in missing if t not in ids]
            elif len(missing) > 2000 or store.next_term_id() <= WRITER_TERM_CACHE:
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
                for term, (tid, _df) in store.term_ids(missing).items():
                    ids[term] = tid
                missing = [t for t in missing if t not in ids]
        new_terms = sorted(missing)
        if new_terms:
            first = store.next_term_id()
            for i, term in enumerate(new_terms):
                ids[term] = first + i
            if index.term_cache_upto >= 0:
                index.term_cache_upto = max(index.term_cache_upto, first + len(new_terms) - 1)
        now = utcnow_iso()
        doc_rows = []
        chunk_rows = []
        for doc_id, p in docs:
            doc_rows.append((doc_id, p.source, p.version, p.timestamp, p.ts, p.content_hash, p.title, p.text,
                             p.metadata_json, dumps(list(p.acl)), p.chunker, now))
            whole = len(p.text)
            for ordinal, (start, end, cmeta, counts) in enumerate(p.chunks):
                # The forward index keeps the analyzer's term order, which is the
                # same for the same chunk text in any database, so the TF-IDF norm
                # sums come out bit-identical however the database was built.
                term_ids = list(map(ids.__getitem__, counts))
                tfs = counts.values()
                terms_blob = array("I", term_ids).tobytes()
                tfs_blob = array("H", tfs if max(tfs, default=0) <= 65535 else [min(c, 65535) for c in tfs]).tobytes()
                length = sum(tfs)
                cid = next_chunk
                next_chunk += 1
                # A chunk that is the whole document stores no copy of the text.
                ctext = None if start == 0 and end == whole else p.text[start:end]
                chunk_rows.append((cid, doc_id, ordinal, start, end, length, ctext, dumps(cmeta),
                                   terms_blob, tfs_blob))
                changes.new_chunks.append((cid, doc_id, length, idx.unpack_ids(terms_blob),
                                           idx.unpack_tfs(tfs_blob), ctext is None and ordinal == 0 and not cmeta))
                changes.chunks += 1
                changes.length += length
            changes.docs += 1
        if new_terms:
            store.add_terms([(ids[t], t, 0) for t in new_terms])
        store.insert_documents(doc_rows)
        store.insert_chunks(chunk_rows)
        meta_rows = [(doc_id, k, v) for doc_id, p in docs for k, v in _scalar_items(p.metadata)]
        acl_rows = [(doc_id, label) for doc_id, p in docs for label in p.acl]
        if meta_rows or acl_rows:
            store.insert_doc_index(meta_rows, acl_rows)
        changes.next_chunk = next_chunk

    def _remove(self, doc_id: int, latest: bool, changes: "_Changes",
                indexed: tuple[bool, bool] = (True, True),
                rows: Sequence[tuple[int, int, int, bytes, bytes]] | None = None) -> None:
        """Delete a document's rows; lower statistics if it was counted.

        Document frequencies: an unflushed chunk stops counting by itself; a
        flushed one's terms go with its chunk_log entry and are subtracted until
        the next flush. ``rows``: the document's ``doc_chunks``, when the caller has read them."""
        if rows is None:
            rows = self._store.doc_chunks(doc_id)
        if latest:
            upto = self._index.flushed_upto
            for cid, _l, _latest, terms, _tfs in rows:
                if cid <= upto:
                    changes.absent.append((cid, terms))
                    changes.dead.append(idx.unpack_ids(terms).tolist())
                else:
                    changes.absent.append((cid, None))
            self._uncount(rows, changes, -1, df=False)
            changes.docs -= 1
        else:
            changes.absent.extend((r[0], None) for r in rows)
        self._store.delete_document(doc_id, indexed=indexed)

    def _demote(self, doc_id: int, valid_to: float, changes: "_Changes") -> None:
        """Keep a replaced version for ``versions='all'``/``as_of`` searches, uncounted."""
        rows = self._store.doc_chunks(doc_id)
        self._uncount(rows, changes, -1)
        changes.docs -= 1
        changes.old.extend(r[0] for r in rows)
        self._store.set_latest(doc_id, False, valid_to)

    def _promote(self, doc_id: int, changes: "_Changes") -> None:
        rows = self._store.doc_chunks(doc_id)
        self._uncount(rows, changes, +1)
        changes.docs += 1
        changes.latest.extend(r[0] for r in rows)
        self._store.set_latest(doc_id, True, None)

    def _uncount(self, rows: Sequence[tuple[int, int, int, bytes, bytes]], changes: "_Changes", sign: int,
                 df: bool = True) -> None:
        """Adjust statistics for chunks entering (+1) or leaving (-1) the latest versions.
        Unflushed chunks count in df through their state alone; flushed ones update ``vocabulary``."""
        upto = self._index.flushed_upto
        for cid, length, _latest, terms, _tfs in rows:
            if df and cid <= upto:
                changes.df.update({int(t): sign for t in idx.unpack_ids(terms)})
            changes.chunks += sign
            changes.length += sign * length

    def _commit_changes(self, changes: "_Changes") -> None:
        """Write statistics and document frequencies; bring the in-memory index along."""
        store, index = self._store, self._index
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
        index.note_write(gen, index.n_chunks + changes.chunks, index.total_length + changes.length, log_seq)

    def _document(self, doc_id: int, with_text: bool = False) -> Document:
        row = self._store.doc_row(doc_id)
        if row is None:
            raise DocumentNotFound(f"no document with id {doc_id}")
        return _doc_from_row(row, with_text)

    # -- reading -----------------------------------------------------------------
    def search(self, query: str, k: int = 10, *, scorer: str = "bm25",
               filter: Mapping[str, Any] | None = None, since: str | datetime | None = None,
               until: str | datetime | None = None, as_of: str | datetime | None = None,
               principals: Sequence[str] | None = None, versions: str = "latest",
               min_score: float | None = None, explain: bool = False,
               k1: float | None = None, b: float | None = None,
               fusion: str = "weighted", alpha: float = 0.3, rrf_k: int = 60,
               embedder: Any = None, reranker: Any = None, rerank_top: int = 50) -> list[Hit]:
        """The ``k`` best chunks for ``query``, best first.

        ``scorer``: ``"bm25"`` (default), ``"tfidf"`` (cosine of TF-IDF
        vectors), ``"vector"`` (cosine of dense embeddings) or ``"hybrid"``
        (BM25 and vector candidate pools fused by min-max weighted sum,
        ``fusion="weighted"`` with vector weight ``alpha``, or by Reciprocal
        Rank Fusion, ``fusion="rrf"`` with ``rrf_k``; see :mod:`ragdb.vectors`).
        Vector scorers need embeddings: ``ragdb.open(..., embedder=...)`` or
        ``ragdb embed``; ``embedder`` here overrides the database's.

        ``reranker`` (a :class:`ragdb.rerank.Reranker`, e.g. an HTTP
        ``/rerank`` client or a cross-encoder) re-orders the first
        ``max(k, rerank_top)`` hits (after filters) and returns its top ``k``,
        with the reranker's scores. Equal scores are ordered by source, then position, so the
        order does not depend on insertion history. ``min_score`` drops weaker
        hits (a refusal threshold); ``explain=True`` fills ``Hit.explain`` with
        each query term's contribution. A query without index terms returns ``[]``.

        Restrictions are applied while scoring, before the top-``k`` cut, so
        ``k`` hits come back whenever ``k`` matching chunks exist:
        ``filter`` (see :mod:`ragdb.filters`), ``since``/``until`` (document
        timestamp), ``as_of`` (the knowledge base as it stood then: each
        version valid from its timestamp until a newer version replaced it),
        ``versions="all"`` (every stored version), ``principals`` (only chunks
        whose access labels intersect these; unlabeled chunks only if the
        database's ``public_unlabeled`` setting is on).

        Scores always use the statistics of the latest versions (N, df,
        average length), also for ``as_of`` and ``versions="all"``; they can
        reflect term frequencies of chunks the caller cannot see, never their text.
        """
        if reranker is not None:
            if not callable(getattr(reranker, "rerank", None)):
                raise InvalidInput("reranker must have a rerank(query, hits, top_n) method")
            if not isinstance(rerank_top, int) or isinstance(rerank_top, bool) or rerank_top < 1:
                raise InvalidInput(f"rerank_top must be a positive integer, got {rerank_top!r}")
            if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= MAX_K:
                raise InvalidInput(f"k must be an integer between 1 and {MAX_K}, got {k!r}")
            first = self.search(query, max(k, rerank_top), scorer=scorer, filter=filter, since=since,
                                until=until, as_of=as_of, principals=principals, versions=versions,
                                min_score=min_score, explain=explain, k1=k1, b=b, fusion=fusion, alpha=alpha,
                                rrf_k=rrf_k, embedder=embedder)
            return list(reranker.rerank(query, first, top_n=k))[:k]
        if scorer in ("vector", "hybrid"):
            from . import vectors

            restrictions = dict(filter=filter, since=since, until=until, as_of=as_of, principals=principals,
                                versions=versions, min_score=min_score, explain=explain)
            emb = embedder if embedder is not None else self.embedder
            if scorer == "vector":
                return vectors.vector_search(self, query, k, emb, **restrictions)
            return vectors.hybrid_search(self, query, k, emb, fusion=fusion, alpha=alpha, rrf_k=rrf_k,
                                         k1=k1, b=b, **restrictions)
        if not isinstance(query, str):
            raise InvalidInput(f"query must be a string, got {type(query).__name__}")
        # a query never fails on encoding: lone surrogates become U+FFFD
        query = query.encode("utf-8", "replace").decode("utf-8") if not query.isascii() else query
        if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= MAX_K:
            raise InvalidInput(f"k must be an integer between 1 and {MAX_K}, got {k!r}")
        for name, value in (("k1", k1), ("b", b)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not math.isfinite(value) or value < 0):
                raise InvalidInput(f"{name} must be a non-negative number, got {value!r}")
        if scorer not in SCORERS:
            raise InvalidInput(f"scorer {scorer!r} is unknown; choose one of {', '.join(SCORERS + ('vector', 'hybrid'))}")
        if min_score is not None and not isinstance(min_score, (int, float)):
            raise InvalidInput(f"min_score must be a number, got {min_score!r}")
        restrict = self._restrictions(filter, since, until, as_of, principals, versions)
        store, index = self._store, self._index
        with store.read():
            index.sync()
            cand, sc, contributions = self._lexical(query, k, scorer, index.allowed(restrict),
                                                    versions_all=versions == "all" or as_of is not None,
                                                    min_score=min_score, explain=explain, k1=k1, b=b)
            if len(cand) == 0:
                return []
            cids = cand.tolist()
            protos = index.hit_protos(cids)
        hits = make_hits(protos, cids, sc.tolist(), contributions if explain else None)
        if len(sc) > 1 and bool(np.any(sc[1:] == sc[:-1])):
            # equal scores: order by source and position, which do not depend on history
            hits.sort(key=_hit_order)
        return hits[:k]

    def _restrictions(self, filter: Any, since: Any, until: Any, as_of: Any, principals: Any,
                      versions: str) -> filters.Query:
        return filters.build(filter, since=since, until=until, as_of=as_of, principals=principals,
                             versions=versions, public_unlabeled=bool(self._settings.get("public_unlabeled")),
                             to_epoch=lambda v, label: _timestamp(v, label)[1])

    def _lexical(self, query: str, k: int, scorer: str, mask: np.ndarray, *, versions_all: bool = False,
                 min_score: float | None = None, explain: bool = False, k1: float | None = None,
                 b: float | None = None) -> tuple[np.ndarray, np.ndarray, dict[int, dict[str, float]]]:
        """Lexical scoring without building hits (inside a read transaction, after ``sync``).

        Returns the ids and scores of the ``k`` best chunks that ``mask`` allows
        (plus any tied with the k-th), best first, equal scores by chunk id, and
        per-term contributions when ``explain``. Shared by search and hybrid search.
        """
        none = (np.zeros(0, np.int64), np.zeros(0), {})
        k1 = self._settings.get("bm25_k1", idx.scoring.BM25_K1) if k1 is None else float(k1)
        b = self._settings.get("bm25_b", idx.scoring.BM25_B) if b is None else float(b)
        counts = Counter(self.analyzer.terms(query))
        if not counts:
            return none
        index = self._index
        known = index.lookup_terms(list(counts))
        # Terms found only in kept older versions (df 0) cannot match a latest
        # chunk; leaving them out keeps the TF-IDF query vector equal to a
        # fresh database's.
        order = [t for t in counts if t in known and (known[t][1] > 0 or versions_all)]
        if not order:
            return none
        if scorer == "bm25":
            scores, per_term = index.bm25([known[t] for t in order], k1, b, explain)
        else:
            scores, per_term = index.tfidf([(*known[t], counts[t]) for t in order], explain)
        n = min(len(mask), len(scores))
        cand = np.flatnonzero(mask[:n] & (scores[:n] > 0))
        if min_score is not None:
            cand = cand[scores[cand] >= min_score]
        if len(cand) > k:
            top = np.argpartition(-scores[cand], k - 1)[:k]
            kth = scores[cand[top]].min()
            cand = cand[scores[cand] >= kth]  # keep ties at the cut for the stable order
        sc = scores[cand]
        by_score = np.lexsort((cand, -sc))
        cand, sc = cand[by_score], sc[by_score]
        contributions: dict[int, dict[str, float]] = {}
        if explain:
            for cid in cand.tolist():
                contributions[cid] = {t: float(c[cid]) for t, c in zip(order, per_term)
                                      if len(c) and c[cid] != 0.0}
        return cand, sc, contributions

    # -- grounded answers (the "G" of RAG) --------------------------------------------
    def build_prompt(self, query: str, hits: Sequence[Hit] | None = None, *, template: Any = None,
                     language: str | None = None, k: int = 5, budget_tokens: int | None = None,
                     min_score: float | None = None, relative: float | None = None,
                     **search_kwargs: Any) -> "Prompt":
        """A grounded prompt: numbered, fenced sources and the rules to answer only
        from them (see :func:`ragdb.prompt.build_prompt`). Without ``hits`` the
        database is searched for the top ``k`` (``search_kwargs`` go to :meth:`search`)."""
        from .prompt import build_prompt

        if hits is None:
            hits = self.search(query, k=k, **search_kwargs)
        return build_prompt(query, hits, template=template, language=language, budget_tokens=budget_tokens,
                            min_score=min_score, relative=relative)

    def ask(self, query: str, llm: Any = None, *, k: int = 5, template: Any = None, language: str | None = None,
            budget_tokens: int | None = None, min_score: float | None = None, relative: float | None = None,
            **search_kwargs: Any) -> "Answer":
        """Search, then answer from the evidence with ``llm`` (default: a
        :class:`ragdb.llm.ChatClient` configured from the environment), or
        refuse without calling the model when no hit passes ``min_score`` /
        ``relative``. The answer's citations are checked against the sources."""
        from .llm import ChatClient, ask

        hits = self.search(query, k=k, **search_kwargs)
        return ask(hits, query, llm if llm is not None else ChatClient(), template=template, language=language,
                   budget_tokens=budget_tokens, min_score=min_score, relative=relative)

    def get(self, doc_id: int, *, with_text: bool = True) -> Document:
        """The stored document with this id."""
        _check_id(doc_id)
        with self._store.read():
            return self._document(doc_id, with_text)

    def documents(self, source: str | None = None, *, glob: bool = True, versions: str = "latest",
                  limit: int | None = None, offset: int = 0) -> list[Document]:
        """Stored documents, by source (a glob pattern unless ``glob=False``)."""
        with self._store.read():
            rows = self._store.list_documents(source, glob=glob, latest_only=versions == "latest",
                                              limit=limit, offset=offset)
        return [_doc_from_row(r, False) for r in rows]

    def stats(self) -> Stats:
        """Collection statistics."""
        store = self._store
        with store.read():
            s = store.stats_row()
            stored_docs, stored_chunks = store.stored_counts()
            self._index.sync()
            dfs = self._index.live_dfs()
            vocab = sum(1 for df in dfs.values() if df > 0)
            postings = int(sum(dfs.values()))
            pending = store.count_chunks_since(s["flushed_upto"])
            segments = store.segment_total()
        avg = s["total_length"] / s["n_chunks"] if s["n_chunks"] else 0.0
        return Stats(documents=s["n_docs"], chunks=s["n_chunks"], vocabulary=vocab, postings=postings,
                     avg_chunk_length=avg, stored_documents=stored_docs, stored_chunks=stored_chunks,
                     pending_chunks=pending, segments=segments, file_size=store.file_size())

    # -- maintenance ---------------------------------------------------------------
    def optimize(self, *, vacuum: bool = True) -> None:
        """Flush pending postings, merge each term's segments into one (dropping
        deleted chunks), forget unused terms, then ``ANALYZE`` and ``VACUUM``."""
        store, index = self._store, self._index
        with self._writing():
            index.sync()
            index.flush(merge_all=True)
            if store.delete_unused_terms():
                store.bump_vocab_epoch()
                index.term_cache.clear()
                index.term_cache_upto = -1
            index.note_write(store.bump_stats(), index.n_chunks, index.total_length)
        if vacuum:
            store.vacuum_analyze()

    def check(self) -> list[str]:
        """Verify every invariant; returns a list of problems (empty when healthy).

        Checks SQLite integrity, that statistics equal counts of the rows, that
        no chunk is orphaned, that each document frequency equals the number of
        latest chunks holding the term, and that the packed postings list
        exactly the (term, chunk, tf) triples of the chunks' forward indexes.
        """
        store = self._store
        problems: list[str] = []
        with store.read():
            problems += store.integrity_problems()
            s = store.stats_row()
            docs, n, total = store.real_counts()
            if (docs, n, total) != (s["n_docs"], s["n_chunks"], s["total_length"]):
                problems.append(f"statistics say {s['n_docs']} documents, {s['n_chunks']} chunks, total length "
                                f"{s['total_length']}; rows say {docs}, {n}, {total}")
            if (o := store.orphan_chunks()):
                problems.append(f"{o} chunks belong to no document")
            if (m := store.latest_mismatch()):
                problems.append(f"{m} chunks disagree with their document about being the latest version")
            if (d := store.duplicate_latest_sources()):
                problems.append(f"{d} sources have more than one latest version")
            fwd = store.forward_all()
            table = {cid: latest for cid, _length, latest, _doc, _whole in store.chunk_table()}
            df_real: Counter[int] = Counter()
            triples = []
            for cid, t, f in fwd:
                terms = idx.unpack_ids(t)
                if table.get(cid) == 1:
                    df_real.update(terms.tolist())
                if cid <= s["flushed_upto"]:
                    triples.append(np.stack([terms.astype(np.int64), np.full(len(terms), cid, np.int64),
                                             idx.unpack_tfs(f).astype(np.int64)], axis=1))
            index = idx.Index(store)  # a fresh view, independent of this connection's cache
            index.sync()
            bad_df = [(tid, df, df_real.get(tid, 0)) for tid, df in index.live_dfs().items()
                      if df != df_real.get(tid, 0)]
            if bad_df:
                tid, df, real = bad_df[0]
                problems.append(f"{len(bad_df)} terms have a wrong document frequency "
                                f"(e.g. term id {tid}: df {df}, real {real})")
            posted = []
            for tid, ids, tfs in store.all_postings():
                ids_a = idx.unpack_ids(ids).astype(np.int64)
                live = np.array([c in table for c in ids_a.tolist()], dtype=bool)
                posted.append(np.stack([np.full(int(live.sum()), tid, np.int64), ids_a[live],
                                        idx.unpack_tfs(tfs).astype(np.int64)[live]], axis=1))
            a = _sorted_rows(triples)
            b_ = _sorted_rows(posted)
            if a.shape != b_.shape or not np.array_equal(a, b_):
                problems.append(f"postings disagree with the chunks' forward indexes "
                                f"({len(b_)} live postings, {len(a)} expected)")
        from . import vectors

        problems += vectors.check_vectors(self)
        return problems


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

    @property
    def any(self) -> bool:
        return bool(self.docs or self.chunks or self.new_chunks or self.absent or self.old or self.latest)


def _sorted_rows(parts: list[np.ndarray]) -> np.ndarray:
    if not parts:
        return np.zeros((0, 3), np.int64)
    a = np.concatenate(parts)
    if len(a) == 0:
        return np.zeros((0, 3), np.int64)
    return a[np.lexsort((a[:, 1], a[:, 0]))]


def _doc_from_row(row: Sequence[Any], with_text: bool) -> Document:
    doc_id, source, version, timestamp, content_hash, metadata, acl, latest, _title, nchunks = row[:10]
    meta = loads(metadata)
    if _title is not None:
        meta.setdefault("title", _title)
    return Document(id=doc_id, source=source, version=version, timestamp=timestamp, content_hash=content_hash,
                    metadata=meta, acl=tuple(loads(acl)), chunk_count=nchunks, latest=bool(latest),
                    text=row[10] if with_text and len(row) > 10 else None)


MAX_ANALYSIS_WORKERS = 3
POOL_AFTER = 256     # records of one add_many analyzed here before it starts analysis workers
ANALYSIS_PART = 64   # chunk texts sent to a worker at a time
WRITER_TERM_CACHE = 300_000  # a writer keeps a vocabulary up to this size in memory


def _analysis_pool(analyzer: Analyzer, workers: int | None) -> AnalysisPool | None:
    """Worker processes for a bulk load, or None to analyze in this process."""
    if workers is None:
        if not sys.platform.startswith("linux"):  # fork is unsafe on macOS, absent on Windows
            return None
        workers = min((os.cpu_count() or 1) - 1, MAX_ANALYSIS_WORKERS)
    if workers < 1 or not AnalysisPool.available():
        return None
    try:
        return AnalysisPool(analyzer, workers)
    except OSError:  # no processes to be had (limits, memory): analyze here
        return None


def make_hits(protos: Mapping[int, tuple[dict[str, Any], dict[str, Any]]], chunk_ids: Sequence[int],
              scores: Sequence[float], explain: Mapping[int, Mapping[str, float]] | None = None) -> list[Hit]:
    """:class:`Hit` objects from :meth:`Index.hit_protos` entries, in the given order.

    Built without the frozen dataclass ``__init__`` (which sets each of its 12
    fields through ``object.__setattr__``): the instance dict is one copy of
    the cached fields, several times faster, and search builds up to ``k``
    hits. Each hit gets its own metadata and explain dicts."""
    new, setattr_ = object.__new__, object.__setattr__
    hits = []
    for cid, score in zip(chunk_ids, scores):
        fields, meta = protos[cid]
        d = fields.copy()
        d["score"] = score
        d["metadata"] = meta.copy() if meta else {}
        d["explain"] = dict(explain.get(cid, ())) if explain is not None else {}
        hit = new(Hit)
        setattr_(hit, "__dict__", d)
        hits.append(hit)
    return hits


def _hit_order(h: Hit) -> tuple[float, str, int, int]:
    return (-h.score, h.source, h.start, h.chunk_id)


def _check_id(value: Any, what: str = "doc_id") -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidInput(f"{what} must be an integer, got {value!r}")
    if not 0 < value < 2 ** 63:
        raise InvalidInput(f"{what} {value} is out of range")
    return value


def _scalar_items(metadata: Mapping[str, Any]) -> Iterable[tuple[str, Any]]:
    """(key, value) rows of the filter index: scalars, and scalar elements of lists
    (the same rows migration 0002 derives with json_each)."""
    for key, value in metadata.items():
        if isinstance(value, list):
            for v in value:
                if isinstance(v, (str, int, float, bool)):
                    yield key, int(v) if isinstance(v, bool) else v
        elif isinstance(value, (str, int, float, bool)):
            yield key, int(value) if isinstance(value, bool) else value


def _doc_from_prepared(doc_id: int, p: _Prepared) -> Document:
    meta = dict(p.metadata)
    if p.title is not None:
        meta.setdefault("title", p.title)
    return Document(id=doc_id, source=p.source, version=p.version, timestamp=p.timestamp,
                    content_hash=p.content_hash, metadata=meta, acl=p.acl, chunk_count=len(p.chunks),
                    latest=True)


def _timestamp(value: Any, label: str) -> tuple[str, float]:
    """Canonical ISO-8601 UTC text and epoch seconds; naive times are taken as UTC."""
    if value is None:
        dt = datetime.now(timezone.utc)
    elif isinstance(value, datetime):
        dt = value
    elif isinstance(value, str):
        try:
            dt = datetime.fromisoformat(value.strip().replace("Z", "+00:00").replace("z", "+00:00"))
        except ValueError:
            raise InvalidInput(f"{label}: timestamp {value!r} is not ISO-8601 (e.g. 2026-11-01T09:30:00Z)") from None
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            dt = datetime.fromtimestamp(float(value), timezone.utc)
        except (OverflowError, OSError, ValueError):
            raise InvalidInput(f"{label}: timestamp {value!r} is out of range") from None
    else:
        raise InvalidInput(f"{label}: timestamp must be an ISO-8601 string, a datetime or epoch seconds")
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    dt = dt.astimezone(timezone.utc)
    text = dt.strftime("%Y-%m-%dT%H:%M:%S") + (f".{dt.microsecond:06d}" if dt.microsecond else "") + "Z"
    return text, dt.timestamp()


def open_database(path: str = ":memory:", *, analyzer: "str | Analyzer | Mapping[str, Any] | None" = None,
                  chunker: str | None = None, keep_versions: bool | None = None,
                  public_unlabeled: bool | None = None, readonly: bool = False,
                  create: bool = True, busy_timeout: float = 30.0, embedder: Any = None) -> Database:
    """Open (creating if needed) a ragdb database; see :func:`ragdb.open`."""
    import os

    path = os.fspath(path)
    store = Store(path, busy_timeout=busy_timeout, readonly=readonly, create=create)
    try:
        with store.read():
            settings = store.settings()
        wanted = Analyzer.from_spec(analyzer) if analyzer is not None else None
        if "analyzer" in settings:
            stored = Analyzer.from_config(settings["analyzer"])
            if wanted is not None and wanted.config() != stored.config():
                raise AnalyzerMismatch(
                    f"{path}: built with analyzer {stored.config()}, opened with {wanted.config()}; "
                    f"open it without analyzer= (or with the stored one), or rebuild into a new database")
            an = stored
        else:
            if readonly:
                raise InvalidInput(f"{path}: the database has no analyzer settings and is opened read-only")
            an = wanted or Analyzer()
        new_settings: dict[str, Any] = {}
        if "analyzer" not in settings:
            new_settings["analyzer"] = an.config()
            new_settings["chunker"] = get_chunker(chunker).spec()
            new_settings["keep_versions"] = bool(keep_versions)
            new_settings["public_unlabeled"] = bool(public_unlabeled)
        else:
            if chunker is not None:
                new_settings["chunker"] = get_chunker(chunker).spec()
            if keep_versions is not None and keep_versions != settings.get("keep_versions"):
                new_settings["keep_versions"] = bool(keep_versions)
            if public_unlabeled is not None and public_unlabeled != settings.get("public_unlabeled"):
                new_settings["public_unlabeled"] = bool(public_unlabeled)
        if new_settings:
            if readonly:
                raise InvalidInput(f"{path}: cannot change settings of a database opened read-only")
            with store.write():
                for key, value in new_settings.items():
                    store.set_setting(key, value)
            settings.update(new_settings)
        db = Database(store, an, settings)
        if embedder is not None:
            from . import vectors
            from .embeddings import get_embedder

            db.embedder = get_embedder(embedder) if isinstance(embedder, str) else embedder
            vectors.ensure_model(db, db.embedder)
        return db
    except BaseException:
        store.close()
        raise
