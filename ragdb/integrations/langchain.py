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
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from ragdb.database import Database
from ragdb.errors import DocumentNotFound, InvalidInput, MissingDependency
from ragdb.serve.shapes import (
    DEFAULT_K,
    PrincipalsArg,
    check_distinct_sources,
    document_metadata,
    hit_metadata,
    retriever_options,
    to_record,
)
from ragdb.options import SearchOptions, check_principals
from ragdb.types import AddReport, Hit

try:
    from langchain_core.callbacks import AsyncCallbackManagerForRetrieverRun, CallbackManagerForRetrieverRun
    from langchain_core.document_loaders import BaseLoader
    from langchain_core.documents import Document
    from langchain_core.retrievers import BaseRetriever
    from pydantic import ConfigDict, SkipValidation
except ImportError as exc:  # the optional extra is not installed
    raise MissingDependency.of("langchain-core", "langchain", exc) from exc

__all__ = ["RagdbRetriever", "RagdbLoader", "add_documents", "to_document"]


def to_document(hit: Hit) -> Document:
    """A retrieved chunk as a LangChain ``Document`` (see the module's docstring)."""
    return Document(page_content=hit.text, metadata=hit_metadata(hit), id=f"chunk:{hit.chunk_id}")


class RagdbRetriever(BaseRetriever):
    """A LangChain retriever searching a ragdb database.

    ``RagdbRetriever(db, k=4, scorer="bm25", filter={"lang": "en"},
    principals=["staff"])``; ``options`` (a :class:`ragdb.options.SearchOptions`)
    gives any other search option, with ``k``, ``scorer`` and ``filter`` over it
    where given (``k`` without either: 4). Invalid options raise
    :class:`~ragdb.errors.InvalidInput` when the retriever is made. The retriever
    is frozen: its principals cannot be changed after it is made, and query-time
    arguments never reach the search.
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

    def search(self, query: str) -> list[Hit]:
        """The ragdb hits behind :meth:`invoke`'s documents, best first."""
        return self.db.search(query, options=self.search_options.as_question())  # a question: plain words unless syntax='query'

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun
                                ) -> list[Document]:
        return [to_document(hit) for hit in self.search(query)]

    async def _aget_relevant_documents(self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun
                                       ) -> list[Document]:
        # ragdb is synchronous (SQLite, and scoring in numpy): the search runs in a worker
        # thread so that it does not block the event loop. A Database may be used from
        # several threads (its connection is shared under a lock), and the thread sees one
        # consistent snapshot, so the result is the same as the synchronous search's.
        hits = await asyncio.to_thread(self.search, query)
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
