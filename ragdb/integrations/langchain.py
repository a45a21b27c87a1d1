"""LangChain integration (``pip install 'ragdb[langchain]'``): ragdb as a retriever of
a LangChain pipeline, and a LangChain pipeline filling a ragdb database.

>>> from ragdb.integrations.langchain import RagdbRetriever
>>> retriever = RagdbRetriever(db, k=4)                     # doctest: +SKIP
>>> chain = retriever | format_docs | prompt | llm          # doctest: +SKIP

* :class:`RagdbRetriever`: a LangChain ``BaseRetriever`` (``invoke``/``ainvoke``,
  batching, composition with ``|``) searching a :class:`ragdb.Database` with
  ``k``, ``scorer``, ``filter`` and any other :class:`ragdb.options.SearchOptions`.
  Its ``principals`` are fixed when it is made (omitted: an anonymous caller, who
  sees public chunks only; ``ragdb.ALL``: everything): nothing passed at query
  time widens them.
* Each result is a LangChain ``Document`` of one chunk: ``page_content`` is the
  chunk's text, ``id`` is ``"chunk:<chunk id>"``, and ``metadata`` is the
  document's metadata plus ragdb's ``source``, ``version``, ``timestamp``,
  ``start``/``end`` (the chunk's span in its document), ``ordinal``, ``score``,
  ``confidence``, ``doc_id`` and ``chunk_id`` (these win over document metadata of
  the same name).
* :class:`RagdbLoader`: a LangChain document loader yielding a database's
  documents (whole texts; metadata with ``source``, ``version``, ``timestamp``,
  ``doc_id`` and, for labelled documents, ``acl``) to the caller it is made for.
* :func:`add_documents`: LangChain documents into a database, one ragdb document
  each (ragdb chunks them), in one :meth:`ragdb.Database.add_many` call.
* :class:`RagdbVectorStore`: a LangChain ``VectorStore`` kept in a ragdb database:
  each LangChain document is one ragdb document of one chunk whose source is the
  document's id, searched by ragdb's hybrid search when an embedding model and
  vectors exist, by BM25 otherwise; scores are ragdb's confidence, in [0, 1].
  Usable by LangChain's ``index()`` API (a ``RecordManager`` keeps it in sync).
* :class:`RagdbEmbeddings` (a ragdb embedder as LangChain ``Embeddings``) and
  :class:`LangChainEmbedder` (LangChain ``Embeddings`` as a ragdb embedder).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

import ragdb
from ragdb.database import Database
from ragdb.errors import DocumentNotFound, InvalidInput, MissingDependency
from ragdb.integrations.stores import (
    STORE_CHUNKER,
    call_options,
    check_filter,
    store_scorer,
    check_store_labels,
    relevance,
    writable,
    check_ids,
    delete_visible,
    id_list,
)
from ragdb.models.embedder import Embedder, as_float32, check_texts, embed_query, normalize_rows
from ragdb.models.embeddings import get_embedder
from ragdb.serve.shapes import (
    DEFAULT_K,
    PrincipalsArg,
    check_distinct_sources,
    document_metadata,
    hit_metadata,
    retriever_options,
    to_record,
)
from ragdb.options import SearchOptions, check_principals, check_text
from ragdb.records import AddReport
from ragdb.types import Hit

try:
    from langchain_core.callbacks import AsyncCallbackManagerForRetrieverRun, CallbackManagerForRetrieverRun
    from langchain_core.document_loaders import BaseLoader
    from langchain_core.documents import Document
    from langchain_core.embeddings import Embeddings
    from langchain_core.retrievers import BaseRetriever
    from langchain_core.vectorstores import VectorStore
    from pydantic import ConfigDict, SkipValidation
except ImportError as exc:  # the optional extra is not installed
    raise MissingDependency.of("langchain-core", "langchain", exc) from exc

__all__ = ["RagdbRetriever", "RagdbLoader", "RagdbVectorStore", "RagdbEmbeddings", "LangChainEmbedder",
           "add_documents", "to_document"]


def to_document(hit: Hit) -> Document:
    """A retrieved chunk as a LangChain ``Document`` (see the module's docstring)."""
    return Document(page_content=hit.text, metadata=hit_metadata(hit), id=f"chunk:{hit.chunk_id}")


class RagdbRetriever(BaseRetriever):
    """A LangChain retriever searching a ragdb database.

    ``RagdbRetriever(db, k=4, scorer="bm25", filter={"lang": "en"},
    principals=["staff"])``; ``options`` (a :class:`ragdb.options.SearchOptions`)
    gives any other search option, with ``k``, ``scorer`` and ``filter`` over it
    where given (``k`` without either: 4). Invalid options (a bad filter included)
    raise :class:`~ragdb.errors.InvalidInput` when the retriever is made. The
    retriever is frozen: its principals cannot be changed after it is made.

    A call may give search options for itself: ``invoke(q, k=1)``,
    ``invoke(q, filter={"lang": "de"})`` (and-ed with the retriever's own filter: a
    call narrows, never widens), ``scorer=`` or any other
    :class:`~ragdb.options.SearchOptions` keyword; ``principals`` cannot be given
    (:class:`~ragdb.errors.InvalidInput`).
    """

    # Frozen: principals are fixed on the object. Fields are not validated by pydantic
    # (SkipValidation): ragdb's own checks run in __init__, with ragdb's error messages.
    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    db: SkipValidation[Database]
    k: SkipValidation[int] = DEFAULT_K
    scorer: SkipValidation[str] = "bm25"
    filter: SkipValidation[Mapping[str, Any] | None] = None
    principals: SkipValidation[PrincipalsArg] = None
    options: SkipValidation[SearchOptions | None] = None

    def __init__(self, db: Database, *, k: int | None = None, scorer: str | None = None,
                 filter: Mapping[str, Any] | None = None, principals: PrincipalsArg = None,
                 options: SearchOptions | None = None, **kwargs: Any) -> None:
        if not isinstance(db, Database):
            raise InvalidInput(f"RagdbRetriever: db must be a ragdb.Database, got {type(db).__name__}")
        checked = retriever_options(k, scorer, filter, principals, options)
        check_filter(checked.restrictions.filter, "RagdbRetriever")
        fields: dict[str, Any] = {"db": db, "k": checked.k, "scorer": checked.scorer,
                                  "filter": checked.restrictions.filter, "principals": check_principals(principals),
                                  "options": options}
        super().__init__(**fields, **kwargs)

    @property
    def search_options(self) -> SearchOptions:
        """The options every query of this retriever searches with (principals included).
        Made from the fields at each query (microseconds), so a copy made with
        ``model_copy(update=...)`` searches with its own fields, validated then."""
        return retriever_options(self.k, self.scorer, self.filter, self.principals, self.options)

    def search(self, query: str, **options: Any) -> list[Hit]:
        """The ragdb hits behind :meth:`invoke`'s documents, best first (``options``: a
        call's own search options, as :meth:`invoke` takes them). A question: plain words
        unless the options say ``syntax='query'``."""
        return self.db.search(query, options=call_options(self.search_options, options, "RagdbRetriever").as_question())

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun,
                                **options: Any) -> list[Document]:
        return [to_document(hit) for hit in self.search(query, **options)]

    async def _aget_relevant_documents(self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun,
                                       **options: Any) -> list[Document]:
        # ragdb is synchronous (SQLite, and scoring in numpy): the search runs in a worker
        # thread so that it does not block the event loop. A Database may be used from
        # several threads (its connection is shared under a lock), and the thread sees one
        # consistent snapshot, so the result is the same as the synchronous search's.
        hits = await asyncio.to_thread(self.search, query, **options)
        return [to_document(hit) for hit in hits]


class RagdbLoader(BaseLoader):
    """A LangChain document loader yielding a ragdb database's documents, whole.

    ``RagdbLoader(db, source="docs/*", filter=..., versions="latest",
    principals=...)`` lists the documents :meth:`ragdb.Database.documents` lists
    for the same arguments (ordered by source; ``principals`` omitted: an
    anonymous caller; ``ragdb.ALL``: everything) and yields each as a LangChain
    ``Document`` with its text (fetched one at a time: :meth:`lazy_load` holds one
    text in memory). ``id`` is ``"doc:<document id>"``; ``metadata`` is the
    document's plus ``source``, ``version``, ``timestamp``, ``doc_id`` and, when it
    has access labels, ``acl`` (so :func:`add_documents` keeps them). A document
    deleted between the listing and its turn is skipped.
    """

    def __init__(self, db: Database, source: str | None = None, *, glob: bool = True, versions: str = "latest",
                 filter: Mapping[str, Any] | None = None, principals: PrincipalsArg = None) -> None:
        if not isinstance(db, Database):
            raise InvalidInput(f"RagdbLoader: db must be a ragdb.Database, got {type(db).__name__}")
        self.db = db
        self.source = source
        self.glob = glob
        self.versions = versions
        self.filter = filter
        self.principals = check_principals(principals)

    def lazy_load(self) -> Iterator[Document]:
        listed = self.db.documents(self.source, glob=self.glob, versions=self.versions, filter=self.filter,
                                   principals=self.principals)
        for listing in listed:
            try:
                doc = self.db.get(listing.id, principals=self.principals)
            except DocumentNotFound:
                continue  # deleted (or relabelled out of view) since the listing
            assert doc.text is not None
            yield Document(page_content=doc.text, metadata=document_metadata(doc), id=f"doc:{doc.id}")


def add_documents(db: Database, documents: Iterable[Document], *, acl: Sequence[str] | None = None,
                  chunker: str | None = None, batch_size: int = 1000) -> AddReport:
    """Add LangChain ``Document``\\ s to ``db``, one ragdb document each; returns the
    :class:`~ragdb.types.AddReport` of :meth:`ragdb.Database.add_many`.

    ``page_content`` is the text; ``metadata["source"]`` (a string or path) the
    source, else the document's ``id``, else one derived from the text. Metadata
    ``version``, ``timestamp`` and ``acl`` (access labels) become those fields;
    ``acl=`` here labels every document instead. What ragdb's retriever adds to a
    chunk's metadata (``score``, ``chunk_id``, ``start`` ...) is dropped; the rest
    is the document's metadata. Two documents with one source are refused
    (:class:`~ragdb.errors.InvalidInput`, nothing written): ragdb chunks documents
    itself, so add whole documents rather than a text splitter's pieces. Each
    batch of ``batch_size`` documents is one transaction.
    """
    records = []
    for n, document in enumerate(documents):
        if not isinstance(document, Document):
            raise InvalidInput(f"add_documents: document {n} must be a langchain_core Document, "
                               f"got {type(document).__name__}")
        records.append(to_record(document.page_content, document.metadata, document.id, acl,
                                 f"add_documents: document {n}"))
    check_distinct_sources(records, "add_documents: documents")
    return db.add_many(records, chunker=chunker, batch_size=batch_size)


# ------------------------------------------------------------------------------------ embeddings
class LangChainEmbedder:
    """LangChain ``Embeddings`` as a ragdb embedder (:class:`ragdb.models.embedder.Embedder`):
    rows L2-normalized, a zero row for blank text, as ragdb's contract asks.

    ``name`` is what the database records as its embedding model (a database holding
    vectors refuses another): by default ``"langchain:<class>"`` plus ``":<model>"``
    when the object has a ``model`` or ``model_name``. ``dimensions`` is asked of the
    model once (one query embedded) unless given."""

    def __init__(self, embeddings: Embeddings, *, name: str | None = None, dimensions: int | None = None) -> None:
        if not isinstance(embeddings, Embeddings):
            raise InvalidInput(f"LangChainEmbedder: embeddings must be a langchain_core Embeddings, "
                               f"got {type(embeddings).__name__}")
        if name is None:
            model = getattr(embeddings, "model", None) or getattr(embeddings, "model_name", None)
            name = f"langchain:{type(embeddings).__name__}" + (f":{model}" if isinstance(model, str) else "")
        self.name = check_text(name, "LangChainEmbedder: name")
        if dimensions is not None and (not isinstance(dimensions, int) or dimensions < 1):
            raise InvalidInput(f"LangChainEmbedder: dimensions must be a positive integer, got {dimensions!r}")
        self.embeddings = embeddings
        self._dimensions = dimensions

    def __repr__(self) -> str:
        return f"LangChainEmbedder({self.embeddings!r}, name={self.name!r})"

    @property
    def dimensions(self) -> int:
        if self._dimensions is None:
            self._dimensions = len(self.embeddings.embed_query("dimensions"))
        return self._dimensions

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        texts = check_texts(texts)
        out = np.zeros((len(texts), self.dimensions), dtype=np.float32)
        keep = [n for n, text in enumerate(texts) if text.strip()]
        if keep:
            out[keep] = as_float32(self.embeddings.embed_documents([texts[n] for n in keep]), self.name)
        return normalize_rows(out)

    def embed_query(self, text: str) -> np.ndarray:
        if not text.strip():
            return np.zeros(self.dimensions, dtype=np.float32)
        vec = as_float32(self.embeddings.embed_query(text), self.name)[None, :]
        return normalize_rows(vec)[0]


class RagdbEmbeddings(Embeddings):
    """A ragdb embedder (an object, or a spec such as ``"wordllama"``, offline) as
    LangChain ``Embeddings``: ``embed_documents`` and ``embed_query`` give its vectors
    as lists of floats (its query form for queries, e5's ``"query: "`` prefix)."""

    def __init__(self, embedder: Embedder | str) -> None:
        self.embedder: Embedder = get_embedder(embedder) if isinstance(embedder, str) else embedder
        if not isinstance(self.embedder, Embedder):
            raise InvalidInput(f"RagdbEmbeddings: embedder must be a ragdb embedder or a spec, "
                               f"got {type(embedder).__name__}")

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return [row.tolist() for row in np.asarray(self.embedder.embed(check_texts(texts)), dtype=np.float32)]

    def embed_query(self, text: str) -> list[float]:
        return [float(x) for x in embed_query(self.embedder, text)]


def _ragdb_embedder(embedding: Embeddings | Embedder | str | None) -> Embedder | None:
    if embedding is None:
        return None
    if isinstance(embedding, RagdbEmbeddings):
        return embedding.embedder  # ragdb's own model, recorded under its own name
    if isinstance(embedding, Embeddings):
        return LangChainEmbedder(embedding)
    if isinstance(embedding, str):
        return get_embedder(embedding)
    if isinstance(embedding, Embedder):
        return embedding
    raise InvalidInput(f"RagdbVectorStore: embedding must be LangChain Embeddings, a ragdb embedder or a spec "
                       f"(e.g. 'wordllama'), got {type(embedding).__name__}")


# ---------------------------------------------------------------------------------- vector store
class RagdbVectorStore(VectorStore):
    """A LangChain ``VectorStore`` kept in a ragdb database.

    ``RagdbVectorStore(db, embedding, principals=None, acl=None)``: ``embedding`` is
    LangChain ``Embeddings``, a ragdb embedder or a spec (``"wordllama"``); omitted, the
    database's own embedder (:attr:`ragdb.Database.embedder`), else none: the store is
    then lexical (BM25) only.

    * Each LangChain ``Document`` is one ragdb document of one chunk (chunker
      ``"none"``: split text before adding it, as for any vector store) whose source is
      the document's id (given in ``ids=``, else ``Document.id``, else a new UUID); its
      metadata is stored and returned as it is (JSON values). Adding an id again
      replaces that document; two documents with one id in one call are refused.
    * Searches read the question as plain words (``syntax="plain"``) and use ragdb's
      hybrid search (BM25 and the vectors, fused) when an embedding model is at hand and
      the database holds vectors, BM25 otherwise; ``scorer=`` or any other ragdb search
      option may be given per call. ``filter`` is ragdb's filter mapping
      (``{"year": {"$gte": 2024}}``; the key ``source`` is the document's id). Like every
      ragdb search, a hit needs a positive cosine or a query word: ``k`` is at most
      ``k``, never padded with unrelated documents.
    * Scores (``similarity_search_with_score``, ``..._with_relevance_scores``) are
      ragdb's confidence in [0, 1] (:func:`ragdb.integrations.stores.relevance`): the
      lexical support of the hit, comparable across queries, the number ragdb's own
      refusal floor uses. A hit found by meaning alone has confidence 0.
    * ``principals`` (omitted: an anonymous caller; ``ragdb.ALL``: everything) bound what
      it reads, and what it deletes or replaces: an id it cannot read is treated as
      missing by ``delete`` and ``get_by_ids`` and refused by ``add_documents``. ``acl``
      labels what it adds; it must lie within ``principals``.
    """

    def __init__(self, db: Database, embedding: Embeddings | Embedder | str | None = None, *,
                 principals: PrincipalsArg = None, acl: Sequence[str] | None = None, owns_db: bool = False
                 ) -> None:
        if not isinstance(db, Database):
            raise InvalidInput(f"RagdbVectorStore: db must be a ragdb.Database, got {type(db).__name__}")
        self.db = db
        self.principals = check_principals(principals)
        self.acl = check_store_labels(acl, self.principals, "RagdbVectorStore")
        self._embedding = embedding if isinstance(embedding, Embeddings) else None
        self.embedder = _ragdb_embedder(embedding)
        self.owns_db = bool(owns_db)
        self._vectors_seen = False

    def close(self) -> None:
        """Close the database when the store owns it (``owns_db=True``; :meth:`from_texts` without ``db``)."""
        if self.owns_db:
            self.db.close()

    @property
    def embeddings(self) -> Embeddings | None:
        if self._embedding is not None:
            return self._embedding
        embedder = self.embedder if self.embedder is not None else self.db.embedder
        return RagdbEmbeddings(embedder) if embedder is not None else None

    # -- writing -------------------------------------------------------------------------------
    def add_texts(self, texts: Iterable[str], metadatas: list[dict[str, Any]] | None = None, *,
                  ids: list[str] | None = None, **kwargs: Any) -> list[str]:
        if isinstance(texts, (str, bytes)):  # (its characters are no list of texts)
            raise InvalidInput(f"add_texts: texts must be a list of texts, not {type(texts).__name__} {texts!r:.40}")
        texts = list(texts)
        metas = list(metadatas) if metadatas is not None else [None] * len(texts)
        if len(metas) != len(texts):
            raise InvalidInput(f"add_texts: {len(metas)} metadatas for {len(texts)} texts")
        for n, (text, meta) in enumerate(zip(texts, metas)):  # ragdb's errors, not the Document's pydantic ones
            if not isinstance(text, str):
                raise InvalidInput(f"add_texts: text {n} must be a string, got {type(text).__name__}")
            if meta is not None and not isinstance(meta, Mapping):  # (0, "" or [] is a mistake, not {})
                raise InvalidInput(f"add_texts: metadata {n} must be a mapping, got {type(meta).__name__}")
        docs = [Document(page_content=text, metadata=dict(meta or {})) for text, meta in zip(texts, metas)]
        return self.add_documents(docs, ids=ids, **kwargs)

    def add_documents(self, documents: list[Document], **kwargs: Any) -> list[str]:
        """Add or replace documents (ids: ``ids=``, else each ``Document.id``, else a new
        UUID); returns the ids. One transaction for the text (``batch_size`` documents a
        batch of it), then the new chunks are embedded when the store has an embedding model."""
        ids = kwargs.pop("ids", None)
        batch_size = kwargs.pop("batch_size", 1000)  # index() passes its batch size
        if kwargs:
            raise InvalidInput(f"add_documents: unknown arguments {sorted(kwargs)}")
        documents = list(documents)
        if ids is not None:  # (an item may be None: that document's own id, else a new one)
            ids = id_list(ids, "add_documents")
        if ids is not None and len(ids) != len(documents):
            raise InvalidInput(f"add_documents: {len(ids)} ids for {len(documents)} documents")
        records = []
        out: list[str] = []
        for n, document in enumerate(documents):
            if not isinstance(document, Document):
                raise InvalidInput(f"add_documents: document {n} must be a langchain_core Document, "
                                   f"got {type(document).__name__}")
            given = ids[n] if ids is not None and ids[n] is not None else document.id
            doc_id = str(uuid.uuid4()) if given is None else given
            if not isinstance(doc_id, str) or not doc_id:
                raise InvalidInput(f"add_documents: document {n}: id must be a non-empty string, got {doc_id!r}")
            check_text(doc_id, f"add_documents: document {n}: id")
            records.append({"text": document.page_content, "source": doc_id, "metadata": document.metadata,
                            "acl": self.acl})
            out.append(doc_id)
        check_distinct_sources(records, "add_documents: documents", "id")
        if not records:
            return []
        with self.db.transaction():
            if self.embedder is not None and self.embedder is not self.db.embedder:
                # another model than the stored vectors' is refused before anything is written (the
                # documents were added, then the embedding raised EmbeddingError)
                self.db.check_embedder(self.embedder)
            for doc_id in out:
                if not writable(self.db, doc_id, self.principals):
                    raise DocumentNotFound(f"add_documents: no document with id {doc_id!r} visible to this "
                                           f"store; not replacing it")
            self.db.add_many(records, chunker=STORE_CHUNKER, batch_size=batch_size)
        if self.embedder is not None and self.embedder is not self.db.embedder:
            self.db.embed(self.embedder)  # the chunks just added (and any other pending one)
        return out

    def delete(self, ids: list[str] | None = None, **kwargs: Any) -> bool | None:
        """Delete the documents with these ids (every version this store's principals may
        read), in one transaction; an id that does not exist, or that they cannot read, is skipped."""
        if ids is None:
            raise InvalidInput("delete: give the ids to delete")
        if kwargs:
            raise InvalidInput(f"delete: unknown arguments {sorted(kwargs)}")
        listed = check_ids(ids, "delete")
        with self.db.transaction():
            for doc_id in listed:
                delete_visible(self.db, self.principals, source=doc_id)
        return True

    # -- reading -------------------------------------------------------------------------------
    def get_by_ids(self, ids: Sequence[str], /) -> list[Document]:
        """The documents with these ids that exist and this store may read, in the order of ``ids``."""
        found = []
        for doc_id in check_ids(ids, "get_by_ids"):
            try:
                doc = self.db.get(source=doc_id, principals=self.principals)
            except DocumentNotFound:
                continue
            found.append(Document(page_content=doc.text or "", metadata=dict(doc.metadata), id=doc.source))
        return found

    def search_options(self, k: int = 4, filter: Mapping[str, Any] | None = None, **options: Any) -> SearchOptions:
        """The ragdb options a search of this store runs with (see the class's docstring)."""
        if "scorer" not in options:
            options["scorer"] = self._scorer()
        if options["scorer"] in ("vector", "hybrid") and "embedder" not in options and self.embedder is not None:
            options["embedder"] = self.embedder
        # a vector store gives back the documents stored in it, copies included (LangChain's
        # contract, and index()'s): collapsing copies is the retrievers' and prompts' default
        base = SearchOptions.from_keywords(None, k=k, syntax="plain", collapse=False, principals=self.principals)
        if filter is not None:
            options["filter"] = filter
        return call_options(base, options, "RagdbVectorStore")

    def _scorer(self) -> str:
        scorer, self._vectors_seen = store_scorer(self.db, self.embedder, self._vectors_seen)
        return scorer

    def search_hits(self, query: str, k: int = 4, filter: Mapping[str, Any] | None = None,
                    **options: Any) -> list[Hit]:
        """The ragdb hits behind the similarity searches (raw scores, spans, confidence)."""
        return self.db.search(query, options=self.search_options(k, filter, **options))

    def similarity_search(self, query: str, k: int = 4, filter: Mapping[str, Any] | None = None,
                          **kwargs: Any) -> list[Document]:
        return [doc for doc, _ in self.similarity_search_with_score(query, k, filter, **kwargs)]

    def similarity_search_with_score(self, query: str, k: int = 4, filter: Mapping[str, Any] | None = None,
                                     **kwargs: Any) -> list[tuple[Document, float]]:
        """Documents and their ragdb confidence in [0, 1], best first (ranked by the search's own score)."""
        return [(Document(page_content=hit.text, metadata=dict(hit.metadata), id=hit.source), relevance(hit))
                for hit in self.search_hits(query, k, filter, **kwargs)]

    def max_marginal_relevance_search(self, query: str, k: int = 4, fetch_k: int = 20, lambda_mult: float = 0.5,
                                      filter: Mapping[str, Any] | None = None, **kwargs: Any) -> list[Document]:
        """``k`` of the ``fetch_k`` best documents, chosen for relevance and diversity
        (LangChain's ``maximal_marginal_relevance`` over the embedding model's vectors of
        the candidates, embedded again here: ragdb does not hand out stored vectors)."""
        from langchain_core.vectorstores.utils import maximal_marginal_relevance

        from ragdb.models.embedder import embed_batched

        embedder = self.embedder if self.embedder is not None else self.db.embedder
        if embedder is None:
            raise InvalidInput("max_marginal_relevance_search needs an embedding model: give the store one")
        hits = self.search_hits(query, max(fetch_k, k), filter, **kwargs)
        if not hits:
            return []
        vectors = embed_batched(embedder, [hit.text for hit in hits])
        chosen = maximal_marginal_relevance(embed_query(embedder, query), vectors.tolist(), lambda_mult, k)
        return [Document(page_content=hits[i].text, metadata=dict(hits[i].metadata), id=hits[i].source)
                for i in chosen]

    def as_retriever(self, **kwargs: Any) -> Any:
        """LangChain's retriever over this store; a bad ``filter`` in ``search_kwargs`` is
        refused here, when it is made."""
        check_filter((kwargs.get("search_kwargs") or {}).get("filter"), "RagdbVectorStore.as_retriever")
        return super().as_retriever(**kwargs)

    def _select_relevance_score_fn(self) -> Any:
        return lambda score: score  # the scores are already ragdb's confidence, in [0, 1]

    @classmethod
    def from_texts(cls, texts: list[str], embedding: Embeddings | None = None,
                   metadatas: list[dict[str, Any]] | None = None, *, ids: list[str] | None = None,
                   db: Database | None = None, path: str = ":memory:", principals: PrincipalsArg = None,
                   acl: Sequence[str] | None = None, **kwargs: Any) -> RagdbVectorStore:
        """A store over ``db``, else over ``ragdb.open(path, **kwargs)`` (``":memory:"`` by
        default; closed by the store's :meth:`close`), with these texts added."""
        owned = db is None
        if db is None:
            db = ragdb.open(path, **kwargs)
        elif kwargs:
            raise InvalidInput(f"from_texts: unknown arguments {sorted(kwargs)} (ragdb.open's arguments "
                               f"apply only without db=)")
        try:
            store = cls(db, embedding, principals=principals, acl=acl, owns_db=owned)
            store.add_texts(texts, metadatas, ids=ids)
        except BaseException:
            if owned:
                db.close()
            raise
        return store
