"""The state one open database shares between its stages (ingest, write, search).

:class:`Engine` holds the store, the analyzer and settings, the in-memory
lexical index and vector index, and the configured embedder. ``Database`` is
the public facade; :mod:`ragdb.engine.write`, :mod:`ragdb.engine.search` and
:mod:`ragdb.engine.check` each work on an ``Engine`` and touch nothing else
(:mod:`ragdb.engine.prepare` needs only the analyzer, a chunker and a write callback).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ragdb.query import filters
from ragdb.errors import CollectionNotFound, DatabaseBusy, EmbeddingError, InvalidInput
from ragdb.index.inverted import Index
from ragdb.options import ALL, Restrictions, to_epoch
from ragdb.storage import Store, model_mismatch
from ragdb.index.vectors import VectorIndex
from ragdb.models.embedder import dimensions_of

if TYPE_CHECKING:
    from ragdb.text.analysis import Analyzer
    from ragdb.models.embedder import Embedder


class Engine:
    """What the stages of one open database share (see the module docstring)."""

    def __init__(self, store: Store, analyzer: Analyzer, settings: dict[str, Any]) -> None:
        self.store = store
        self.analyzer = analyzer
        self.settings = settings
        #: the stored analyzer configuration ``analyzer`` was made from (see :meth:`sync`)
        self.analyzer_config: Any = settings.get("analyzer")
        self.index = Index(store)
        self.vectors = VectorIndex(store)
        #: Embedder used on add (new chunks get vectors) and for vector/hybrid queries.
        self.embedder: Embedder | None = None
        self._recorded: tuple[str, Embedder] | None = None
        self._private: tuple[Index, int, bool] | None = None  # (index, generation, has private labels)
        self._rollbacks = store.rollbacks()  # the connection's rollbacks this engine's views have seen

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """A write transaction (nested ones are savepoints). Writes update the
        in-memory index as they go; if anything fails, that view may hold
        uncommitted changes, so it is dropped and reloaded from the file. A write that never
        began (the write lock not had: ``DatabaseBusy``) changed nothing, and keeps it (a
        prompt storing its calibration beside another process's write dropped the whole
        view, vectors too, at each call)."""
        with self.store.lock:  # no other thread reads the dropped view in between
            began = False
            try:
                with self.store.write():
                    began = True
                    yield
            except BaseException:
                if began:
                    self.index = Index(self.store)
                    self._new_vectors()
                raise

    @contextlib.contextmanager
    def changing_view(self) -> Iterator[Index]:
        """The in-memory index view, to change outside a write (``Index.seal_tail``): if the
        change fails midway (an interrupt included), the view is dropped and reloaded from
        the file, as after a failed write."""
        with self.store.lock:
            try:
                yield self.index
            except BaseException:
                self.index = Index(self.store)
                raise

    def _new_vectors(self) -> None:
        mode = self.vectors.ann_mode
        self.vectors = VectorIndex(self.store)
        self.vectors.ann_mode = mode

    def view_key(self) -> tuple[int, int]:
        """What a cache of this engine's view is keyed by: the rollbacks seen and the index's
        generation. The generation alone is not enough: after a rollback the file reaches the
        generation of the write it undid again, with other writes."""
        return self._rollbacks, self.index.generation

    def sync(self) -> None:
        """Bring the in-memory index up to date (inside a transaction). After another
        connection wrote, the stored settings are read again too, so a setting it
        changed (``Database.set_public_unlabeled``, ``ragdb config``) holds here at
        once: every settings change advances the generation, as every write does.
        That includes the analyzer: after another connection's ``reindex`` this one
        analyzes queries and new documents with the new analyzer from then on (its
        index view reloads in the same sync: a reindex counts as a flush).

        After a rollback on this connection (any collection's, any handle's: a transaction
        of one handle may hold another's writes as savepoints), the views start again from
        the file: what they learned from a write it undid (term ids, segment counts, decoded
        postings) may be keyed by counters the file reaches again with other writes."""
        rollbacks = self.store.rollbacks()
        if rollbacks != self._rollbacks:
            if not self.store.collection_exists():  # (until it is: the id may be another collection's now)
                raise CollectionNotFound(f"{self.store.path}: collection {self.store.collection!r} of this handle "
                                         f"is gone: a rollback undid its creation, or it was dropped; open it again")
            self._rollbacks = rollbacks
            self.index.reset()  # (in place: a write may hold the index it took before this sync)
            self._new_vectors()
            self._private = None  # (keyed by the index and its generation, which may come again)
        index = self.index
        before = index.generation
        index.sync()
        if index.generation != before:
            self.settings.update(self.store.settings())
            stored = self.settings.get("analyzer")
            if stored is not None and stored != self.analyzer_config:
                from ragdb.text.analysis import Analyzer

                self.analyzer = Analyzer.from_config(stored)
                self.analyzer_config = stored

    def set_setting(self, key: str, value: Any) -> None:
        """Store one setting in a write transaction of its own, visible to every open
        connection from its next search or write on (refused inside another transaction,
        whose rollback would undo it after the caller took it as done)."""
        store = self.store
        if store.in_transaction():
            raise InvalidInput(f"{store.path}: setting {key!r} changes in a transaction of its own; "
                               f"change it outside db.transaction()")
        with self.writing():
            self.sync()
            index = self.index
            store.set_setting(key, value)
            index.note_write(store.bump_stats(), index.n_chunks, index.total_length)
        self.settings[key] = value

    def set_setting_if_free(self, key: str, value: Any) -> bool:
        """:meth:`set_setting` for what a read stores on the side (a measured calibration): done
        at once, or not at all when another connection holds the write lock (False), never
        waiting for it: a read must neither wait for a writer nor fail because of one."""
        try:
            with self.store.no_wait():
                self.set_setting(key, value)
        except DatabaseBusy:
            return False
        return True

    def restrictions(self, r: Restrictions) -> filters.Query:
        """The validated filter query of a :class:`Restrictions` value (call after :meth:`sync`,
        inside a read). Where every chunk is visible to everyone (``public_unlabeled`` on
        and no document labelled for anyone in particular), the access condition would
        keep every chunk, so it is left out and such a search costs what it did before
        access labels."""
        public = bool(self.settings.get("public_unlabeled"))
        principals = r.principals
        if principals is not ALL and public and not self._has_private_labels():
            principals = ALL
        return filters.build(r.filter, since=r.since, until=r.until, as_of=r.as_of, principals=principals,
                             versions=r.versions, public_unlabeled=public, to_epoch=to_epoch)

    def _has_private_labels(self) -> bool:
        index = self.index
        cached = self._private
        if cached is None or cached[0] is not index or cached[1] != index.generation:
            # in a read of its own where the caller holds none (the vector and hybrid searches
            # check their restrictions before embedding the query): on a closed handle, the
            # read's StorageError, not SQLite's error raised again as an InternalError
            with self.store.read():
                cached = self._private = (index, index.generation, self.store.has_private_labels())
        return cached[2]

    # -- embedders -----------------------------------------------------------------
    def recorded_embedder(self) -> Embedder | None:
        """An embedder for the model recorded in the database (None if none is),
        made with :func:`ragdb.models.embeddings.get_embedder` and kept for reuse."""
        with self.store.read():
            info = self.store.vector_model()
        if info is None:
            return None
        if self._recorded is not None and self._recorded[0] == info["model"]:
            return self._recorded[1]
        from ragdb.models.embeddings import get_embedder  # optional models load lazily

        emb = get_embedder(info["model"])
        self._recorded = (info["model"], emb)
        return emb

    def check_embedder(self, embedder: Embedder) -> None:
        """:class:`EmbeddingError` if the database holds vectors of another model
        than ``embedder``'s (read only; called before anything is written)."""
        with self.store.read():
            current = self.store.vector_model()
            if current is None or not self.store.has_vectors():
                return  # nothing to disagree with (and no need to probe a remote model's size)
        name, dims = embedder.name, dimensions_of(embedder)
        if (current["model"], int(current["dimensions"])) != (name, dims):
            raise EmbeddingError(model_mismatch(current, name, dims))

    def query_embedder(self, embedder: Embedder | str | None) -> Embedder:
        """The embedder of a vector/hybrid query: the one given (object or spec),
        else the database's, else the recorded model's."""
        if isinstance(embedder, str):
            from ragdb.models.embeddings import get_embedder

            return get_embedder(embedder)
        if embedder is not None:
            return embedder
        if self.embedder is not None:
            return self.embedder
        emb = self.recorded_embedder()
        if emb is None:
            raise EmbeddingError("the database has no vectors: embed it first (ragdb embed --model wordllama)")
        return emb
