"""LlamaIndex integration (``pip install 'ragdb[llama-index]'``): ragdb as the retriever
of a LlamaIndex query engine, and LlamaIndex documents and nodes stored in ragdb.

>>> from llama_index.core.query_engine import RetrieverQueryEngine
>>> from ragdb.integrations.llama_index import RagdbRetriever
>>> engine = RetrieverQueryEngine.from_args(RagdbRetriever(db, k=4), llm=llm)   # doctest: +SKIP

* :class:`RagdbRetriever`: a LlamaIndex ``BaseRetriever`` (``retrieve``/
  ``aretrieve``) searching a :class:`ragdb.Database` with ``k``, ``scorer``,
  ``filter`` and any other :class:`ragdb.options.SearchOptions`. Its
  ``principals`` are fixed when it is made (omitted: an anonymous caller, who sees
  public chunks only; ``ragdb.ALL``: everything).
* Each result is a ``NodeWithScore`` (``score``: ragdb's) of a ``TextNode`` of one
  chunk: ``id_`` is ``"chunk:<chunk id>"``, ``text`` the chunk's text,
  ``start_char_idx``/``end_char_idx`` its span in its document, its ``SOURCE``
  relationship (``ref_doc_id``) ``"doc:<document id>"``, and ``metadata`` the
  document's metadata plus ragdb's ``source``, ``version``, ``timestamp``,
  ``start``, ``end``, ``ordinal``, ``score``, ``confidence``, ``doc_id`` and
  ``chunk_id`` (these win over document metadata of the same name; the numeric
  ones, ``timestamp`` and an empty ``version`` are excluded from what the LLM and
  embedders see).
* :func:`add_documents` and :func:`add_nodes`: LlamaIndex documents or nodes into
  a database, one ragdb document each (ragdb chunks them), in one
  :meth:`ragdb.Database.add_many` call.
* :class:`RagdbVectorStore`: a LlamaIndex ``BasePydanticVectorStore`` kept in a ragdb
  database, for ``VectorStoreIndex.from_documents(docs, storage_context=
  StorageContext.from_defaults(vector_store=...))``, ``IngestionPipeline(vector_store=
  ...)`` and ``delete_ref_doc``; ``MetadataFilters`` become ragdb filters
  (:func:`to_ragdb_filter`).

A node's score (``NodeWithScore.score``, from the retriever and the store) is ragdb's
confidence in [0, 1], comparable across queries, so a postprocessor
(``SimilarityPostprocessor(similarity_cutoff=0.3)``) can threshold it; the raw score
of the search is the node's ``metadata["score"]``. Loader bookkeeping (``path``,
``mtime``, ``content_hash``, ``size``, ``encoding``, ``loader``: what ``ragdb add``
records of a file) is kept out of what the LLM and the embedder see.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ragdb.database import Database
from ragdb.engine.prepare import check_metadata
from ragdb.errors import DocumentNotFound, InvalidInput, MissingDependency
from ragdb.files.sync import escape_glob
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
)
from ragdb.models.embedder import Embedder
from ragdb.models.embeddings import get_embedder
from ragdb.serve.shapes import (
    NUMERIC_KEYS,
    PrincipalsArg,
    check_distinct_sources,
    hit_metadata,
    retriever_options,
    to_record,
)
from ragdb.options import MAX_K, SearchOptions, check_int, check_k, check_number, check_principals
from ragdb.records import AddReport
from ragdb.types import Hit

try:
    from llama_index.core.callbacks import CallbackManager
    from llama_index.core.retrievers import BaseRetriever
    from llama_index.core.schema import (
        BaseNode,
        Document,
        MetadataMode,
        NodeRelationship,
        NodeWithScore,
        QueryBundle,
        RelatedNodeInfo,
        TextNode,
    )
    from llama_index.core.vector_stores.types import (
        BasePydanticVectorStore,
        FilterCondition,
        FilterOperator,
        MetadataFilter,
        MetadataFilters,
        VectorStoreQuery,
        VectorStoreQueryResult,
    )
    from llama_index.core.vector_stores.utils import metadata_dict_to_node, node_to_metadata_dict
    from pydantic import PrivateAttr
except ImportError as exc:  # the optional extra is not installed
    raise MissingDependency.of("llama-index-core", "llama-index", exc) from exc

__all__ = ["RagdbRetriever", "RagdbVectorStore", "add_documents", "add_nodes", "to_node", "to_ragdb_filter"]

#: What ragdb's file loaders record of a file (``ragdb add``): bookkeeping, not content.
LOADER_KEYS = ("path", "mtime", "content_hash", "size", "encoding", "loader")

#: Metadata keys kept out of the text the LLM and embedding models see.
HIDDEN_KEYS = [*NUMERIC_KEYS, "timestamp", *LOADER_KEYS]


def to_node(hit: Hit) -> NodeWithScore:
    """A retrieved chunk as a LlamaIndex ``NodeWithScore`` (see the module's docstring):
    its score is ragdb's confidence in [0, 1], the raw score is ``metadata["score"]``."""
    hidden = HIDDEN_KEYS if hit.version is not None else [*HIDDEN_KEYS, "version"]  # no "version: None" lines
    node = TextNode(
        id_=f"chunk:{hit.chunk_id}", text=hit.text, metadata=hit_metadata(hit),
        start_char_idx=hit.start, end_char_idx=hit.end,
        excluded_llm_metadata_keys=list(hidden), excluded_embed_metadata_keys=list(hidden),
        relationships={NodeRelationship.SOURCE: RelatedNodeInfo(node_id=f"doc:{hit.doc_id}",
                                                                metadata={"source": hit.source})},
    )
    return NodeWithScore(node=node, score=relevance(hit))


class RagdbRetriever(BaseRetriever):
    """A LlamaIndex retriever searching a ragdb database.

    ``RagdbRetriever(db, k=4, scorer="bm25", filter={"lang": "en"},
    principals=["staff"])``; ``options`` (a :class:`ragdb.options.SearchOptions`)
    gives any other search option, with ``k``, ``scorer`` and ``filter`` over it
    where given (``k`` without either: 4). Invalid options (a bad filter included)
    raise :class:`~ragdb.errors.InvalidInput` when the retriever is made. The search
    options, principals included, are fixed when it is made
    (:attr:`search_options`).
    """

    def __init__(self, db: Database, *, k: int | None = None, scorer: str | None = None,
                 filter: Mapping[str, Any] | None = None, principals: PrincipalsArg = None,
                 options: SearchOptions | None = None, callback_manager: CallbackManager | None = None,
                 verbose: bool = False) -> None:
        if not isinstance(db, Database):
            raise InvalidInput(f"RagdbRetriever: db must be a ragdb.Database, got {type(db).__name__}")
        self._db = db
        self._options = retriever_options(k, scorer, filter, principals, options)
        check_filter(self._options.restrictions.filter, "RagdbRetriever")
        super().__init__(callback_manager=callback_manager, verbose=verbose)

    @property
    def db(self) -> Database:
        return self._db

    @property
    def search_options(self) -> SearchOptions:
        """The options every query of this retriever searches with (principals included)."""
        return self._options

    def search(self, query: str) -> list[Hit]:
        """The ragdb hits behind :meth:`retrieve`'s nodes, best first."""
        return self._db.search(query, options=self._options.as_question())  # a question: plain words unless syntax='query'

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return [to_node(hit) for hit in self.search(query_bundle.query_str)]

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        # ragdb is synchronous (SQLite, and scoring in numpy): the search runs in a worker
        # thread so that it does not block the event loop. A Database may be used from
        # several threads (its connection is shared under a lock), and the thread sees one
        # consistent snapshot, so the result is the same as the synchronous search's.
        hits = await asyncio.to_thread(self.search, query_bundle.query_str)
        return [to_node(hit) for hit in hits]


def _records(nodes: Iterable[BaseNode | NodeWithScore], acl: Sequence[str] | None, what: str,
             source_keys: Sequence[str]) -> list[dict[str, Any]]:
    records = []
    for n, item in enumerate(nodes):
        node = item.node if isinstance(item, NodeWithScore) else item
        where = f"{what}: node {n}"
        if not isinstance(node, BaseNode):
            raise InvalidInput(f"{where} must be a llama_index Document or node, got {type(node).__name__}")
        meta = dict(node.metadata)
        source = next((meta[key] for key in source_keys if meta.get(key) is not None), None)
        if source is not None:
            meta["source"] = source
        records.append(to_record(node.get_content(metadata_mode=MetadataMode.NONE), meta, node.node_id, acl,
                                 where))
    check_distinct_sources(records, f"{what}: nodes")
    return records


def add_documents(db: Database, documents: Iterable[Document | BaseNode], *, acl: Sequence[str] | None = None,
                  chunker: str | None = None, batch_size: int = 1000) -> AddReport:
    """Add LlamaIndex ``Document``\\ s to ``db``, one ragdb document each (ragdb chunks
    them); returns the :class:`~ragdb.types.AddReport` of :meth:`ragdb.Database.add_many`.

    The source is ``metadata["source"]``, else ``metadata["file_path"]`` (what
    ``SimpleDirectoryReader`` sets), else the document's ``doc_id``. Metadata
    ``version``, ``timestamp`` and ``acl`` (access labels) become those fields;
    ``acl=`` here labels every document instead. The rest is the document's
    metadata (what ragdb's retriever adds, ``score``, ``chunk_id`` ..., is
    dropped). Two documents with one source are refused
    (:class:`~ragdb.errors.InvalidInput`, nothing written). Each batch of
    ``batch_size`` documents is one transaction.
    """
    records = _records(documents, acl, "add_documents", ("source", "file_path"))
    return db.add_many(records, chunker=chunker, batch_size=batch_size)


def add_nodes(db: Database, nodes: Iterable[BaseNode | NodeWithScore], *, acl: Sequence[str] | None = None,
              chunker: str | None = None, batch_size: int = 1000) -> AddReport:
    """Add LlamaIndex nodes (``TextNode``, or ``NodeWithScore``) to ``db``, one ragdb
    document each, as :func:`add_documents` does, but with ``metadata["source"]``,
    else the node's ``node_id``, as the source (not ``file_path``, which the
    nodes of one file share). ``chunker="none"`` keeps each node one chunk; by
    default the database's chunker splits long ones. Two nodes with one source are
    refused (:class:`~ragdb.errors.InvalidInput`, nothing written).
    """
    records = _records(nodes, acl, "add_nodes", ("source",))
    return db.add_many(records, chunker=chunker, batch_size=batch_size)


# ---------------------------------------------------------------------------------- vector store
_OPERATORS = {FilterOperator.EQ: "$eq", FilterOperator.NE: "$ne", FilterOperator.GT: "$gt",
              FilterOperator.GTE: "$gte", FilterOperator.LT: "$lt", FilterOperator.LTE: "$lte",
              FilterOperator.IN: "$in", FilterOperator.NIN: "$nin"}


def to_ragdb_filter(filters: MetadataFilters | None) -> dict[str, Any] | None:
    """LlamaIndex ``MetadataFilters`` as a ragdb filter mapping (:mod:`ragdb.query.filters`):
    ``EQ``, ``NE``, ``GT``, ``GTE``, ``LT``, ``LTE``, ``IN``, ``NIN`` on a key, combined by
    ``AND``, ``OR`` or ``NOT`` and nested. Another operator is an
    :class:`~ragdb.errors.InvalidInput` naming it. The key ``source`` is ragdb's source
    (the store's node id)."""
    if filters is None:
        return None
    if not isinstance(filters, MetadataFilters):
        raise InvalidInput(f"filters must be llama_index MetadataFilters, got {type(filters).__name__}")
    parts: list[dict[str, Any]] = []
    for item in filters.filters:
        if isinstance(item, MetadataFilters):
            sub = to_ragdb_filter(item)
            if sub is not None:
                parts.append(sub)
            continue
        assert isinstance(item, MetadataFilter)
        op = _OPERATORS.get(FilterOperator(item.operator))
        if op is None:
            raise InvalidInput(f"filters: operator {FilterOperator(item.operator).name} on {item.key!r} is not "
                               f"supported by ragdb (supported: {', '.join(o.name for o in _OPERATORS)})")
        parts.append({item.key: {op: item.value}})
    if not parts:
        return None
    condition = FilterCondition(filters.condition or FilterCondition.AND)
    if condition is FilterCondition.NOT:
        # none of them matches: LlamaIndex's NOT (``build_metadata_filter_fn``: ``not any(...)``)
        return {"$not": parts[0] if len(parts) == 1 else {"$or": parts}}
    if len(parts) == 1:
        return parts[0]
    return {"$and" if condition is FilterCondition.AND else "$or": parts}


class RagdbVectorStore(BasePydanticVectorStore):
    """A LlamaIndex vector store kept in a ragdb database.

    ``RagdbVectorStore(db, embedder=None, principals=None, acl=None)``: each node is one
    ragdb document of one chunk (chunker ``"none"``: LlamaIndex has split the text),
    whose source is the node's id; the node itself (metadata, relationships, excluded
    keys) is kept in the document's metadata as LlamaIndex's stores keep it
    (``_node_content``, ``ref_doc_id``, ...), so queries give back the node as added.

    * Text in, text out (``stores_text``): ragdb searches the query's text, by its hybrid
      search when an embedding model (``embedder``: a ragdb embedder or a spec such as
      ``"wordllama"``; omitted: the database's own) and vectors exist, by BM25 otherwise.
      The vectors LlamaIndex computed for the nodes and the query are not used (ragdb
      embeds with its own model), so any ``embed_model`` LlamaIndex asks for will do.
    * ``similarity_top_k`` is ``k``; ``MetadataFilters``, ``doc_ids`` and ``node_ids``
      restrict the search (:func:`to_ragdb_filter`). The query's ``mode``: ``default`` as
      above, ``sparse``/``text_search`` BM25, ``hybrid``/``semantic_hybrid`` hybrid
      (``alpha``: the dense side's weight, ragdb's weighted fusion; ``hybrid_top_k``),
      ``mmr`` LlamaIndex's MMR over re-embedded candidates (:meth:`_mmr`); the learner
      modes are refused. Similarities are ragdb's
      confidence in [0, 1]; the raw score is ``metadata["score"]`` (hidden from the LLM).
    * ``delete(ref_doc_id)`` (what ``delete_ref_doc`` calls) deletes the nodes of that
      document; ``principals`` (omitted: an anonymous caller; ``ragdb.ALL``: everything)
      bound what it reads and deletes, and it never replaces a node it cannot read;
      ``acl`` labels what it adds and must lie within ``principals``.
    """

    stores_text: bool = True
    is_embedding_query: bool = False
    flat_metadata: bool = False

    _db: Database = PrivateAttr()
    _embedder: Embedder | None = PrivateAttr(default=None)
    _principals: Any = PrivateAttr(default=())
    _acl: tuple[str, ...] | None = PrivateAttr(default=None)
    _vectors_seen: bool = PrivateAttr(default=False)

    def __init__(self, db: Database, *, embedder: Embedder | str | None = None, principals: PrincipalsArg = None,
                 acl: Sequence[str] | None = None) -> None:
        if not isinstance(db, Database):
            raise InvalidInput(f"RagdbVectorStore: db must be a ragdb.Database, got {type(db).__name__}")
        super().__init__(stores_text=True)
        self._db = db
        self._embedder = get_embedder(embedder) if isinstance(embedder, str) else embedder
        self._principals = check_principals(principals)
        self._acl = check_store_labels(acl, self._principals, "RagdbVectorStore")

    @classmethod
    def class_name(cls) -> str:
        return "RagdbVectorStore"

    @property
    def client(self) -> Database:
        """The ragdb database."""
        return self._db

    # -- writing -------------------------------------------------------------------------------
    def add(self, nodes: Sequence[BaseNode], **kwargs: Any) -> list[str]:
        """Add or replace nodes (one transaction for the text, then ragdb embeds the new
        chunks when the store has an embedding model); returns their ids."""
        records: list[dict[str, Any]] = []
        for n, node in enumerate(nodes):
            if not isinstance(node, BaseNode):
                raise InvalidInput(f"add: node {n} must be a llama_index node, got {type(node).__name__}")
            # checked as ragdb stores metadata: LlamaIndex's JSON dump turns NaN into null, a set
            # into a list, bytes into text, and fails on other objects with pydantic's own error
            check_metadata(node.metadata, f"add: node {n} ({node.node_id!r})")
            meta = node_to_metadata_dict(node, remove_text=True, flat_metadata=self.flat_metadata)
            records.append({"text": node.get_content(metadata_mode=MetadataMode.NONE), "source": node.node_id,
                            "metadata": meta, "acl": self._acl})
        check_distinct_sources(records, "add: nodes", "node id")
        if not records:
            return []
        db = self._db
        with db.transaction():
            if self._embedder is not None and self._embedder is not db.embedder:
                db.check_embedder(self._embedder)  # another model than the vectors': nothing written
            for record in records:
                if not writable(db, record["source"], self._principals):
                    raise DocumentNotFound(f"add: no node with id {record['source']!r} visible to this store; "
                                           f"not replacing it")
            db.add_many(records, chunker=STORE_CHUNKER)
        if self._embedder is not None and self._embedder is not db.embedder:
            db.embed(self._embedder)
        return [record["source"] for record in records]

    def delete(self, ref_doc_id: str, **delete_kwargs: Any) -> None:
        """Delete the nodes of the LlamaIndex document ``ref_doc_id`` that this store may read."""
        if not isinstance(ref_doc_id, str) or not ref_doc_id:
            raise InvalidInput(f"delete: ref_doc_id must be a non-empty string, got {ref_doc_id!r}")
        self._delete_where({"ref_doc_id": ref_doc_id})

    def delete_nodes(self, node_ids: list[str] | None = None, filters: MetadataFilters | None = None,
                     **delete_kwargs: Any) -> None:
        """Delete the nodes with these ids and/or matching ``filters`` that this store may read.
        An empty list of ids deletes nothing, as LlamaIndex's ``SimpleVectorStore`` reads it
        (not every node ``filters`` match)."""
        ids = None if node_ids is None else check_ids(node_ids, "delete_nodes: node_ids")
        if ids is not None and not ids:
            return
        where = self._where(ids, filters, "delete_nodes")
        if where is None:
            raise InvalidInput("delete_nodes: give node_ids and/or filters (clear() deletes every node)")
        self._delete_where(where)

    def clear(self) -> None:
        """Delete every node this store added (every document holding a node) that it may read."""
        self._delete_where({"_node_content": {"$exists": True}})

    def _delete_where(self, where: Mapping[str, Any]) -> None:
        db = self._db
        with db.transaction():
            delete_visible(db, self._principals, filter=where)

    # -- reading -------------------------------------------------------------------------------
    def get_nodes(self, node_ids: list[str] | None = None, filters: MetadataFilters | None = None
                  ) -> list[BaseNode]:
        """The nodes with these ids and/or matching ``filters`` that this store may read. An
        empty list of ids names no node (as for :meth:`delete_nodes`), not every node."""
        ids = None if node_ids is None else check_ids(node_ids, "get_nodes: node_ids")  # (an iterator read once)
        if ids is not None and not ids:
            return []
        where = self._where(ids, filters, "get_nodes")
        nodes = []
        for listed in self._db.documents(filter=where, principals=self._principals):
            try:
                doc = self._db.get(listed.id, principals=self._principals)
            except DocumentNotFound:
                continue
            if "_node_content" in doc.metadata:
                nodes.append(metadata_dict_to_node(dict(doc.metadata), text=doc.text))
        return nodes

    @staticmethod
    def _where(node_ids: Sequence[str] | None, filters: MetadataFilters | None, what: str
               ) -> dict[str, Any] | None:
        parts: list[dict[str, Any]] = []
        ids = None if node_ids is None else check_ids(node_ids, f"{what}: node_ids")
        if ids:  # an empty list restricts nothing: VectorStoreIndex's retriever passes one for a
            # store that keeps the text (its nodes_dict is empty); delete_nodes reads it apart.
            # A filter's source is a glob: an id is escaped to match itself only
            parts.append({"source": {"$in": [escape_glob(i) for i in ids]}})
        converted = to_ragdb_filter(filters)
        if converted is not None:
            parts.append(converted)
        if not parts:
            return None
        where = parts[0] if len(parts) == 1 else {"$and": parts}
        check_filter(where, what)
        return where

    def search_options(self, query: VectorStoreQuery, k: int | None = None) -> SearchOptions:
        """The ragdb options ``query`` runs with (``k``: instead of the query's top k)."""
        mode = _mode(query)
        parts = [f for f in (self._where(query.node_ids, query.filters, "query"),
                             {"ref_doc_id": {"$in": list(query.doc_ids)}} if query.doc_ids else None) if f]
        scorer = _MODE_SCORERS[mode] or self._scorer()
        if k is None:
            # (a hybrid mode's: the default mode, hybrid too once there are vectors, keeps similarity_top_k)
            k = query.hybrid_top_k if _MODE_SCORERS[mode] == "hybrid" and query.hybrid_top_k is not None \
                else query.similarity_top_k
        # a vector store gives back the nodes stored in it, copies included (collapse=False)
        keywords: dict[str, Any] = {"k": k, "scorer": scorer, "syntax": "plain", "collapse": False}
        if scorer == "hybrid" and self._embedder is not None:
            keywords["embedder"] = self._embedder
        if mode in ("hybrid", "semantic_hybrid") and query.alpha is not None:
            # LlamaIndex's alpha is the weight of the dense side, as ragdb's weighted fusion's
            keywords.update(fusion="weighted", alpha=query.alpha)
        if parts:
            keywords["filter"] = parts[0] if len(parts) == 1 else {"$and": parts}
        base = SearchOptions.from_keywords(None, principals=self._principals)
        return call_options(base, keywords, "RagdbVectorStore")

    def _scorer(self) -> str:
        scorer, self._vectors_seen = store_scorer(self._db, self._embedder, self._vectors_seen)
        return scorer

    def query(self, query: VectorStoreQuery, **kwargs: Any) -> VectorStoreQueryResult:
        """The ``similarity_top_k`` nodes best matching ``query.query_str`` (see the class's docstring)."""
        if query.query_str is None:
            raise InvalidInput("query: ragdb searches the query's text (query_str); an embedding alone is not "
                               "enough")
        if _mode(query) == "mmr":
            hits = self._mmr(query, kwargs)
        else:
            hits = self._db.search(query.query_str, options=self.search_options(query))
        nodes, similarities, ids = [], [], []
        for hit in hits:
            if "_node_content" in hit.metadata:
                node = metadata_dict_to_node(dict(hit.metadata), text=hit.text)
                node.metadata["score"] = hit.score
                for keys in (node.excluded_llm_metadata_keys, node.excluded_embed_metadata_keys):
                    if "score" not in keys:
                        keys.append("score")
            else:  # a document ragdb stored itself (ragdb add, db.add): its chunk, as the retriever gives it
                node = to_node(hit).node
            nodes.append(node)
            similarities.append(relevance(hit))
            ids.append(node.node_id)
        return VectorStoreQueryResult(nodes=nodes, similarities=similarities, ids=ids)

    def _mmr(self, query: VectorStoreQuery, kwargs: Mapping[str, Any]) -> list[Hit]:
        """Mode MMR: ``similarity_top_k`` of the best ``mmr_prefetch_k`` hits (else
        ``mmr_prefetch_factor`` times as many, 4 by default), chosen by LlamaIndex's
        ``get_top_k_mmr_embeddings`` with ``mmr_threshold`` (the query's, else the keyword's;
        0.5 by default) over the embedding model's vectors of the hits and the query, embedded
        again here as LangChain's store does (ragdb does not hand out stored vectors)."""
        from llama_index.core.indices.query.embedding_utils import get_top_k_mmr_embeddings

        from ragdb.models.embedder import embed_batched, embed_query

        embedder = self._embedder if self._embedder is not None else self._db.embedder
        if embedder is None:
            raise InvalidInput("query: mode 'mmr' needs an embedding model: give the store one (embedder=) or "
                               "the database one")
        k = check_k(query.similarity_top_k, "query: similarity_top_k")  # (as every other mode's search checks it)
        threshold = query.mmr_threshold if query.mmr_threshold is not None else kwargs.get("mmr_threshold")
        if threshold is not None:
            check_number(threshold, "query: mmr_threshold", low=0.0, high=1.0)
        fetch = kwargs.get("mmr_prefetch_k")
        if fetch is None:
            factor = kwargs.get("mmr_prefetch_factor", 4.0)
            check_number(factor, "query: mmr_prefetch_factor", low=1.0, high=float(MAX_K))
            fetch = math.ceil(k * factor)
        fetch = check_int(fetch, "query: mmr_prefetch_k", 1)
        hits = self._db.search(query.query_str or "", options=self.search_options(query, min(max(fetch, k), MAX_K)))
        if not hits:
            return []
        vectors = embed_batched(embedder, [hit.text for hit in hits])
        _similarities, chosen = get_top_k_mmr_embeddings(
            embed_query(embedder, query.query_str or "").tolist(), vectors.tolist(), similarity_top_k=k,
            embedding_ids=list(range(len(hits))), mmr_threshold=threshold)
        return [hits[i] for i in chosen]


#: The ragdb scorer of each LlamaIndex query mode the store runs (None: the store's own
#: choice, hybrid when an embedding model and vectors are at hand, else BM25). The learner
#: modes (svm, logistic_regression, linear_regression) are refused.
_MODE_SCORERS: dict[str, str | None] = {"default": None, "mmr": None, "sparse": "bm25", "text_search": "bm25",
                                        "hybrid": "hybrid", "semantic_hybrid": "hybrid"}


def _mode(query: VectorStoreQuery) -> str:
    mode = str(getattr(query.mode, "value", query.mode))
    if mode not in _MODE_SCORERS:
        raise InvalidInput(f"query: mode {mode!r} is not supported by ragdb's store; it runs "
                           f"{', '.join(map(repr, _MODE_SCORERS))}")
    return mode
