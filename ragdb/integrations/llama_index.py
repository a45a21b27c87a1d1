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
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ragdb.database import Database
from ragdb.errors import InvalidInput, MissingDependency
from ragdb.serve.shapes import (
    NUMERIC_KEYS,
    PrincipalsArg,
    check_distinct_sources,
    hit_metadata,
    retriever_options,
    to_record,
)
from ragdb.options import SearchOptions
from ragdb.types import AddReport, Hit

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
except ImportError as exc:  # the optional extra is not installed
    raise MissingDependency.of("llama-index-core", "llama-index", exc) from exc

__all__ = ["RagdbRetriever", "add_documents", "add_nodes", "to_node"]

#: Metadata keys kept out of the text the LLM and embedding models see.
HIDDEN_KEYS = [*NUMERIC_KEYS, "timestamp"]


def to_node(hit: Hit) -> NodeWithScore:
    """A retrieved chunk as a LlamaIndex ``NodeWithScore`` (see the module's docstring)."""
    hidden = HIDDEN_KEYS if hit.version is not None else [*HIDDEN_KEYS, "version"]  # no "version: None" lines
    node = TextNode(
        id_=f"chunk:{hit.chunk_id}", text=hit.text, metadata=hit_metadata(hit),
        start_char_idx=hit.start, end_char_idx=hit.end,
        excluded_llm_metadata_keys=list(hidden), excluded_embed_metadata_keys=list(hidden),
        relationships={NodeRelationship.SOURCE: RelatedNodeInfo(node_id=f"doc:{hit.doc_id}",
                                                                metadata={"source": hit.source})},
    )
    return NodeWithScore(node=node, score=hit.score)


class RagdbRetriever(BaseRetriever):
    """A LlamaIndex retriever searching a ragdb database.

    ``RagdbRetriever(db, k=4, scorer="bm25", filter={"lang": "en"},
    principals=["staff"])``; ``options`` (a :class:`ragdb.options.SearchOptions`)
    gives any other search option, with ``k``, ``scorer`` and ``filter`` over it
    where given (``k`` without either: 4). Invalid options raise
    :class:`~ragdb.errors.InvalidInput` when the retriever is made. The search
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
