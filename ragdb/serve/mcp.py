"""An MCP server over one ragdb database (``ragdb mcp``), on the official ``mcp`` SDK.

``pip install 'ragdb[mcp]'``. :func:`build_server` makes an SDK ``MCPServer``
whose tools answer from the database through the public library API only;
:func:`serve` runs it over stdio (what desktop assistants launch) or the SDK's
Streamable HTTP transport. The tools:

* ``search`` (query, k, offset, scorer, filter): the best chunks, each with its source,
  character span, a snippet (the chunk's text; of a longer chunk than :data:`SNIPPET_CHARS`,
  its part with the most query terms) with the query's matches marked by their spans,
  score and confidence, exactly as :meth:`ragdb.Database.search` ranks them;
* ``get_document`` (doc_id or source): one document and a page of its text;
* ``list_sources`` (prefix, limit, offset): the stored documents by source;
* ``build_prompt`` (question): the grounded prompt with numbered, fenced
  sources, and whether it is a refusal (no evidence passed selection);
* ``facets`` (field, query, filter, by, limit): exact counts of a metadata field's
  values (or source, version) over the passages (documents) that match, the most
  frequent first;
* ``stats``: the database's statistics;
* with ``allow_writes`` only: ``add_text`` and ``add_texts`` (one document, or a batch of
  them in one transaction; a source that exists is replaced: an upsert), ``update_document``
  (metadata and/or labels in place), ``delete`` (by doc_id, or by source and/or filter), and
  the collections of the file: ``list_collections`` (with the documents this server may read
  in each), ``create_collection`` and ``drop_collection``; the other tools then take a
  ``collection`` argument (default: the collection the server was started on).

Access: who reads is fixed when the server is built (``principals``, as in
:meth:`ragdb.Database.search`: None is an anonymous caller who sees public
documents only, :data:`ragdb.ALL` the full view). No tool has a principals
argument, so a model cannot widen its own view. A write that would replace, update or
delete a document the server cannot see is refused as not found (a delete by filter deletes
only documents the server can see, and only if it may write every one of them); a
collection whose every document is hidden from the server is not listed, and is answered
as one that does not exist.

Errors: bad arguments (the SDK validates each call against the tool's JSON
schema) and every :class:`~ragdb.errors.RagdbError` come back as MCP tool errors
(``isError`` results carrying the library's message); the server keeps serving.
"""

import contextlib
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Annotated, Any, Literal

import orjson

from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.tools import Tool
from mcp.types import CallToolResult, TextContent, ToolAnnotations
from pydantic import BaseModel, ConfigDict, Field

import ragdb
from ragdb.errors import CollectionNotFound, DocumentNotFound, InvalidInput, RagdbError
from ragdb.models.http_client import is_loopback
from ragdb.serve.access import WriteForbidden, WriteScope, check_write, client_message, scope_for
from ragdb.serve.shapes import check_distinct_sources, facets_json, stats_json
from ragdb.answers.prompt import REFUSAL
from ragdb.files.sync import escape_glob

__all__ = ["SNIPPET_CHARS", "build_server", "serve", "parse_http_address", "is_loopback"]

#: The longest snippet of a search hit, in characters (a longer chunk is cut and marked ``truncated``).
SNIPPET_CHARS = 2000
#: The default and the largest page of text ``get_document`` returns, in characters.
TEXT_PAGE_CHARS = 20_000
MAX_TEXT_PAGE_CHARS = 1_000_000
MAX_K = 100
MAX_OFFSET = 900  # a page ranks offset + k hits
MAX_LIST = 1000
MAX_BATCH = 100  #: the most documents of one ``add_texts`` call (one transaction)
MAX_QUERY_CHARS = 4000  #: the longest query or question (as ``ragdb serve --max-query``)

INSTRUCTIONS = """\
A ragdb knowledge base (exact BM25 full-text search over stored documents).
Use `search` to find passages for a question, then `get_document` to read a whole document;
`build_prompt` returns a grounded prompt with numbered sources (refused=true: the knowledge base
has no evidence for the question). `list_sources` pages through the stored documents, `facets`
counts a metadata field's values (which sources, languages, years ... and how many passages each),
`stats` describes the database. Documents hidden from this server by access labels are never returned."""

# --------------------------------------------------------------------------- argument types (the JSON schemas)

Scorer = Literal["bm25", "tfidf", "vector", "hybrid"]
Filter = Annotated[dict[str, Any] | None, Field(
    description='Restrict to documents matching every key: "source" (a source or a glob such as "docs/*.md"), '
                '"version", "timestamp", "tags", or any metadata key; a list value means any of them. A key may '
                'take operators ($eq, $ne, $gt, $gte, $lt, $lte on numbers or ISO dates, $in, $nin, $exists), '
                'and "$and"/"$or" (lists of filters), "$not" and "$contains" (text of the passage) stand where '
                'keys do. Example: {"source": "docs/*", "lang": ["en", "de"], "year": {"$gte": 2020}}.')]
CollectionArg = Annotated[str | None, Field(
    min_length=1, max_length=128,
    description="The collection to use (list_collections names them); default: the one this server serves.")]
Labels = Annotated[list[Annotated[str, Field(min_length=1)]] | None, Field(
    description="Access labels to set (replacing the old ones; [] makes the document public). Only labels "
                "this server writes are accepted.")]


# --------------------------------------------------------------------------- results (the output schemas)

class SearchHit(BaseModel):
    rank: int = Field(description="1 for the best hit.")
    source: str
    doc_id: int
    chunk_id: int
    version: str | None
    start: int = Field(description="Character offset of the chunk in its document's text.")
    end: int = Field(description="Character offset just past the chunk.")
    score: float = Field(description="The scorer's score (higher is better; BM25 scores are unbounded).")
    confidence: float | None = Field(description="How much of the query the chunk supports, 0 to 1.")
    snippet: str = Field(description="The chunk's text; of a chunk longer than the snippet limit, the part "
                                     "with the most query terms.")
    snippet_start: int = Field(description="Offset of the snippet in the chunk's text.")
    highlights: list[tuple[int, int]] = Field(description="Spans of the query's terms and phrases in the snippet "
                                                          "(start, end offsets into snippet).")
    truncated: bool = Field(description="True when the snippet is shorter than the chunk.")
    metadata: dict[str, Any]


class SearchResult(BaseModel):
    query: str
    hits: list[SearchHit]


class DocumentResult(BaseModel):
    id: int
    source: str
    version: str | None
    timestamp: str | None
    latest: bool
    chunks: int
    metadata: dict[str, Any]
    text: str = Field(description="The requested page of the document's text.")
    offset: int = Field(description="Where the page starts in the text, in characters.")
    text_length: int = Field(description="Length of the whole text, in characters.")
    next_offset: int | None = Field(description="Offset of the next page; null at the end of the text.")


class SourceEntry(BaseModel):
    id: int
    source: str
    version: str | None
    timestamp: str | None
    chunks: int
    metadata: dict[str, Any]


class SourceList(BaseModel):
    sources: list[SourceEntry]
    next_offset: int | None = Field(description="Offset of the next page; null when there is none.")


class PromptSource(BaseModel):
    number: int = Field(description="The source's number in the prompt, as cited: [1], [2], ...")
    source: str
    doc_id: int
    chunk_id: int
    start: int
    end: int
    score: float
    confidence: float | None


class PromptResult(BaseModel):
    refused: bool = Field(description="True when no evidence passed selection: do not answer; say `refusal`.")
    refusal: str = Field(description="The sentence to answer with when refused.")
    language: str
    system: str
    user: str
    messages: list[dict[str, str]]
    confidence: float | None = Field(description="The best confidence among the hits (null: no hit).")
    min_confidence: float = Field(description="The confidence floor applied.")
    sources: list[PromptSource]


class FacetValue(BaseModel):
    value: str | int | float
    count: int


class FacetsResult(BaseModel):
    field: str
    by: str = Field(description='What is counted: "chunks" (passages) or "documents".')
    total: int = Field(description="How many passages (documents) matched.")
    missing: int = Field(description="How many of them have no value for the field.")
    omitted: int = Field(description="Distinct values left out by limit.")
    values: list[FacetValue] = Field(description="The values with their counts, the most frequent first.")


class StatsResult(BaseModel):
    documents: int = Field(description="Latest documents this server may read (with the full view: all).")
    visible_documents: int = Field(description="Latest documents this server may read.")
    chunks: int = Field(description="Their chunks.")
    # the whole collection's, only for a server with the full view (others would learn of hidden writes)
    vocabulary: int | None = None
    postings: int | None = None
    avg_chunk_length: float | None = None
    stored_documents: int | None = None
    stored_chunks: int | None = None
    pending_chunks: int | None = None
    segments: int | None = None
    file_size: int | None = None
    collection: str = Field(description="The collection of the database file this server reads.")
    writes_allowed: bool


class AddResult(BaseModel):
    status: str = Field(description='"added", "replaced" (a new version of the source) or "unchanged".')
    id: int
    source: str
    version: str | None
    chunks: int
    previous: int | None = Field(description="Id of the version it replaced, if any.")


class NewDocument(BaseModel):
    """One document of ``add_texts``."""

    model_config = ConfigDict(extra="forbid")
    text: str = Field(description="The document's text.")
    source: str = Field(min_length=1, description="Its source (an id or path); a source that exists is replaced "
                                                  "by this new version.")
    metadata: dict[str, Any] | None = Field(default=None, description="Metadata to store (filterable).")
    version: str | None = Field(default=None, description="A version label.")
    title: str | None = Field(default=None, description="A title.")


class AddTextsResult(BaseModel):
    documents: list[AddResult] = Field(description="One result per document, in the order given.")


class UpdateResult(BaseModel):
    id: int
    source: str
    version: str | None
    metadata: dict[str, Any]
    labels: list[str] = Field(description="The document's access labels ([]: public).")


class DeleteResult(BaseModel):
    deleted: int = Field(description="How many stored documents (versions) were deleted.")


class CollectionEntry(BaseModel):
    name: str
    documents: int = Field(description="Latest documents of the collection this server may read.")
    served: bool = Field(description="True for the collection this server serves (the tools' default).")


class CollectionList(BaseModel):
    collections: list[CollectionEntry]


class CollectionResult(BaseModel):
    name: str
    status: str = Field(description='"created" or "dropped".')


# --------------------------------------------------------------------------- the server

def build_server(db: ragdb.Database, *, principals: Any = None, allow_writes: bool = False,
                 write_labels: Sequence[str] | None = None, max_query_chars: int = MAX_QUERY_CHARS,
                 name: str = "ragdb") -> MCPServer:
    """An SDK ``MCPServer`` serving ``db`` to MCP clients, reading as ``principals``
    (fixed here: None is anonymous, :data:`ragdb.ALL` the full view, else a
    sequence of access labels). ``allow_writes`` adds ``add_text`` and ``delete``;
    what ``add_text`` stores carries ``write_labels`` (default: the principals; an
    anonymous server writes public documents, the full view keeps a replaced
    document's labels), and a write touches only documents the server may see whose
    labels lie within those (:mod:`ragdb.serve.access`). ``max_query_chars``: the
    longest query or question a tool takes. The tools call ``db`` one at a time
    (the SDK runs tools in worker threads)."""
    if principals is not None and principals is not ragdb.ALL:
        if isinstance(principals, str) or not isinstance(principals, Sequence):
            raise InvalidInput(f"principals must be None, ragdb.ALL or a list of labels, got {principals!r}")
        principals = list(principals)
    db.count(principals=principals)  # a bad label fails here, at start, not at the first call
    who = principals
    if write_labels is not None:
        if isinstance(write_labels, str) or not write_labels or not all(isinstance(a, str) and a
                                                                        for a in write_labels):
            raise InvalidInput(f"write_labels must be a non-empty list of labels, got {write_labels!r}")
        if principals is not ragdb.ALL and not set(write_labels) <= set(principals or ()):
            raise InvalidInput(f"write labels {sorted(set(write_labels) - set(principals or ()))} are not among "
                               f"the server's principals: it would write what it cannot read")
        scope = WriteScope(labels=tuple(write_labels), public=False)
        acl: list[str] | None = list(write_labels)
    else:
        scope = scope_for(principals)
        acl = list(principals) if isinstance(principals, list) else None
    lock = threading.Lock()
    read_only = ToolAnnotations(read_only_hint=True, open_world_hint=False)
    Query = Annotated[str, Field(max_length=max_query_chars)]
    K = Annotated[int, Field(strict=True, ge=1, le=MAX_K)]

    @contextlib.contextmanager
    def library() -> Iterator[None]:
        """One database call at a time; a library error becomes the tool error's message (without
        the database's path or any other of the host's)."""
        with lock:
            try:
                yield
            except RagdbError as e:
                raise ToolError(client_message(e, database=db.path)) from None

    def hidden(handle: ragdb.Database) -> bool:
        """Whether every stored document of ``handle``'s collection is hidden from this server
        (an empty collection is not)."""
        return who is not ragdb.ALL and handle.count(versions="all", principals=who) == 0 \
            and handle.count(versions="all", principals=ragdb.ALL) > 0

    def target(collection: str | None) -> ragdb.Database:
        """Inside :func:`library`: the served collection, or (a writing server) another of the
        file; one missing, or whose every document is hidden from this server, is not found
        (the library's message would name the file's other collections)."""
        if collection is None or collection == db.collection_name:
            return db
        try:
            handle: ragdb.Database | None = db.collection(collection, create=False)
        except CollectionNotFound:
            handle = None
        if handle is None or hidden(handle):
            raise CollectionNotFound(f"no collection {collection!r}")
        return handle

    def search_keywords(t: ragdb.Database, scorer: str, filter: Mapping[str, Any] | None) -> dict[str, Any]:
        kw: dict[str, Any] = {"scorer": scorer, "principals": who}
        if filter is not None:
            kw["filter"] = filter
        if scorer in ("vector", "hybrid") and t.embedder is None:
            embedder = t.recorded_embedder()
            if embedder is None:
                raise InvalidInput(f"scorer {scorer!r} needs vectors, and this database has none "
                                   f"(make them with 'ragdb embed')")
            kw["embedder"] = embedder
        return kw

    def search(
        query: Annotated[Query, Field(description="What to look for, in natural language or keywords.")],
        k: Annotated[K, Field(description="How many hits to return.")] = 5,
        scorer: Annotated[Scorer, Field(description='"bm25" (default, exact lexical), "tfidf", or, on a '
                                                    'database with embeddings, "vector" or "hybrid".')] = "bm25",
        filter: Filter = None,
        offset: Annotated[int, Field(strict=True, ge=0, le=MAX_OFFSET,
                                     description="Skip this many hits: k=5, offset=5 is the second page "
                                                 "of five.")] = 0,
        collection: CollectionArg = None,
    ) -> Annotated[CallToolResult, SearchResult]:
        """Search the knowledge base: the k best passages (chunks) for the query, best first, each with its
        source, character span (start, end), a snippet of its text, score and confidence (0-1)."""
        with library():
            t = target(collection)
            hits = t.search(query, k, offset=offset, highlight=True, snippet_chars=SNIPPET_CHARS,
                            **search_keywords(t, scorer, filter))
        return _compact(SearchResult(query=query, hits=[_search_hit(h, i) for i, h in enumerate(hits, offset + 1)]))

    def get_document(
        doc_id: Annotated[int | None, Field(strict=True,
                                            description="The document's id (as in search hits' doc_id).")] = None,
        source: Annotated[str | None, Field(description="The document's source (its latest version).")] = None,
        offset: Annotated[int, Field(strict=True, ge=0, le=2**63 - 1,  # (the result is JSON: a 64-bit integer)
                                     description="First character of the text page.")] = 0,
        max_chars: Annotated[int, Field(strict=True, ge=1, le=MAX_TEXT_PAGE_CHARS,
                                        description="Longest text page, in characters.")] = TEXT_PAGE_CHARS,
        collection: CollectionArg = None,
    ) -> Annotated[CallToolResult, DocumentResult]:
        """Read one stored document, by doc_id or by source (give exactly one): its metadata and a page of
        its text (offset, max_chars; next_offset says where the next page starts)."""
        with library():
            doc = target(collection).get(doc_id, source=source, principals=who)
        text = doc.text or ""
        page = text[offset:offset + max_chars]
        end = offset + len(page)
        return _compact(DocumentResult(id=doc.id, source=doc.source, version=doc.version, timestamp=doc.timestamp,
                              latest=doc.latest, chunks=doc.chunk_count, metadata=dict(doc.metadata),
                              text=page, offset=offset, text_length=len(text),
                              next_offset=end if end < len(text) else None))

    def list_sources(
        prefix: Annotated[str, Field(description="Only sources starting with this text (literally).")] = "",
        limit: Annotated[int, Field(strict=True, ge=1, le=MAX_LIST, description="Most sources in one page.")] = 100,
        offset: Annotated[int, Field(strict=True, ge=0, le=2**63 - 1,
                                     description="Sources to skip (for the next page).")] = 0,
        filter: Filter = None,
        collection: CollectionArg = None,
    ) -> Annotated[CallToolResult, SourceList]:
        """List the stored documents (latest versions) with their metadata, ordered by source, a page at a
        time; with filter, only the documents matching it."""
        pattern = escape_glob(prefix) + "*" if prefix else None
        with library():
            docs = target(collection).documents(pattern, glob=True, limit=limit + 1, offset=offset, filter=filter,
                                                principals=who)
        more = len(docs) > limit
        entries = [SourceEntry(id=d.id, source=d.source, version=d.version, timestamp=d.timestamp,
                               chunks=d.chunk_count, metadata=dict(d.metadata)) for d in docs[:limit]]
        return _compact(SourceList(sources=entries, next_offset=offset + limit if more else None))

    def build_prompt(
        question: Annotated[Query, Field(description="The question to answer from the knowledge base.")],
        k: Annotated[K, Field(description="Hits retrieved before evidence selection.")] = 5,
        scorer: Annotated[Scorer, Field(description="As in search.")] = "bm25",
        filter: Filter = None,
        min_confidence: Annotated[float | None, Field(
            ge=0.0, le=1.0, description="Drop evidence below this confidence (0: never refuse by confidence; "
                                        "default: the database's floor).")] = None,
        budget_tokens: Annotated[int | None, Field(strict=True, ge=1,
                                                   description="Token budget of the sources.")] = None,
        language: Annotated[Literal["en", "zh"] | None, Field(
            description="Language of the prompt (default: detected from the question).")] = None,
        collection: CollectionArg = None,
    ) -> Annotated[CallToolResult, PromptResult]:
        """Build a grounded prompt for the question: the system and user messages with the evidence as
        numbered, fenced sources and the rules to answer only from them and cite them as [n]. When
        refused is true no evidence passed selection: answer with the refusal sentence instead."""
        with library():
            t = target(collection)
            p = t.build_prompt(question, k=k, min_confidence=min_confidence, budget_tokens=budget_tokens,
                               language=language, **search_keywords(t, scorer, filter))
        return _compact(PromptResult(
            refused=p.refused, refusal=REFUSAL[p.language], language=p.language, system=p.system, user=p.user,
            messages=p.messages, confidence=p.confidence, min_confidence=p.min_confidence,
            sources=[PromptSource(number=i, source=h.source, doc_id=h.doc_id, chunk_id=h.chunk_id, start=h.start,
                                  end=h.end, score=h.score, confidence=h.confidence)
                     for i, h in enumerate(p.sources, 1)]))

    def facets(
        field: Annotated[str, Field(description='A metadata key (e.g. "lang", "year", "tags"), or "source" or '
                                                '"version".')],
        query: Annotated[Query | None, Field(description="Count only the passages this query matches (default: "
                                                       "every passage the filter keeps).")] = None,
        filter: Filter = None,
        by: Annotated[Literal["chunks", "documents"], Field(
            description='Count matching passages ("chunks"), or documents with a matching passage.')] = "chunks",
        limit: Annotated[int, Field(strict=True, ge=1, le=MAX_LIST,
                                    description="Most values returned, the most frequent first.")] = 20,
        collection: CollectionArg = None,
    ) -> Annotated[CallToolResult, FacetsResult]:
        """Count the values of a metadata field over what matches: which sources, languages, years or tags the
        knowledge base (or a query's matches) holds, and how many passages of each. Exact counts over every
        match this server may read, not only the top hits."""
        kw: dict[str, Any] = {"principals": who}
        if filter is not None:
            kw["filter"] = filter
        with library():
            f = target(collection).facets(field, query, by=by, limit=limit, **kw)
        return _compact(FacetsResult.model_validate(facets_json(f)))

    def stats() -> Annotated[CallToolResult, StatsResult]:
        """Statistics of the knowledge base: documents (all, and those this server may read), chunks,
        vocabulary, file size, and whether this server accepts writes."""
        with library():
            if who is ragdb.ALL:
                s = db.stats()
                return _compact(StatsResult(**stats_json(s), visible_documents=s.documents,
                                            writes_allowed=allow_writes))
            visible = db.count(principals=who)
            chunks = db.facets("source", limit=1, principals=who).total  # the chunks it may see
            return _compact(StatsResult(documents=visible, visible_documents=visible, chunks=chunks,
                               collection=db.collection_name, writes_allowed=allow_writes))

    tools = [Tool.from_function(fn, annotations=read_only)
             for fn in (search, get_document, list_sources, build_prompt, facets, stats)]
    if not allow_writes:
        for tool in tools:  # a read-only server serves its own collection only
            tool.parameters.get("properties", {}).pop("collection", None)
        return _server(name, tools)

    holder = "this server"

    def add_records(t: ragdb.Database, records: list[dict[str, Any]]) -> list[AddResult]:
        """Inside :func:`library` and a transaction: check each record as this server's write, then add them."""
        for record in records:
            check_write(t, who, scope, holder=holder, source=record["source"], acl=acl, new=True)
        changes = t.add_many([{**record, "acl": acl} for record in records]).changes
        return [AddResult(status=c.status, id=c.document.id, source=c.document.source, version=c.document.version,
                          chunks=c.document.chunk_count, previous=c.previous) for c in changes]

    def add_text(
        text: Annotated[str, Field(description="The document's text.")],
        source: Annotated[str, Field(min_length=1, description="Its source (an id or path); adding a source "
                                                              "that exists stores a new version of it.")],
        metadata: Annotated[dict[str, Any] | None, Field(description="Metadata to store (filterable).")] = None,
        version: Annotated[str | None, Field(description="A version label.")] = None,
        title: Annotated[str | None, Field(description="A title.")] = None,
        collection: CollectionArg = None,
    ) -> Annotated[CallToolResult, AddResult]:
        """Add a document to the knowledge base (chunked and indexed at once), or replace the stored document
        with the same source. It is stored with this server's write labels (a server with the full view:
        a replaced document keeps its labels)."""
        with library():
            t = target(collection)
            with t.transaction():
                (added,) = add_records(t, [{"text": text, "source": source, "metadata": metadata,
                                            "version": version, "title": title}])
        return _compact(added)

    def add_texts(
        documents: Annotated[list[NewDocument], Field(min_length=1, max_length=MAX_BATCH, description=(
            f"The documents (1 to {MAX_BATCH}), each with its text and source, and optionally metadata, version "
            "and title; no two with the same source."))],
        collection: CollectionArg = None,
    ) -> Annotated[CallToolResult, AddTextsResult]:
        """Add (or replace: upsert by source) many documents in one transaction: none is written unless every
        one may be. Each is stored with this server's write labels, as add_text stores one."""
        records = [d.model_dump() for d in documents]
        with library():
            check_distinct_sources(records, "documents", named_by="source")
            t = target(collection)
            with t.transaction():
                added = add_records(t, records)
        return _compact(AddTextsResult(documents=added))

    def update_document(
        doc_id: Annotated[int | None, Field(strict=True, ge=1, description="The stored document (one version).")
                          ] = None,
        source: Annotated[str | None, Field(min_length=1, description="The latest version of this source.")] = None,
        metadata: Annotated[dict[str, Any] | None, Field(
            description="The document's new metadata (it replaces the old metadata whole).")] = None,
        labels: Labels = None,
        collection: CollectionArg = None,
    ) -> Annotated[CallToolResult, UpdateResult]:
        """Change a stored document's metadata and/or access labels in place (by doc_id or source; give exactly
        one), without re-indexing it: its id, chunks and scores stay; filters see the new values at once."""
        if (doc_id is None) == (source is None):
            raise ToolError("update_document: give exactly one of doc_id or source")
        if metadata is None and labels is None:
            raise ToolError("update_document: give metadata and/or labels to change")
        with library():
            t = target(collection)
            with t.transaction():
                current = check_write(t, who, scope, holder=holder, doc_id=doc_id, source=source, acl=labels)
                if current is None:  # a source this server cannot see answers as one that does not exist
                    raise DocumentNotFound(f"no document with source {source!r}")
                d = t.update(current.id, metadata=metadata, acl=labels)
        return _compact(UpdateResult(id=d.id, source=d.source, version=d.version, metadata=dict(d.metadata),
                                     labels=list(d.acl)))

    def delete(
        doc_id: Annotated[int | None, Field(strict=True, ge=1,
                                            description="Delete this stored document (one version).")] = None,
        source: Annotated[str | None, Field(min_length=1, description="Delete every version of this source (an "
                                                                     "exact source; for a pattern use filter).")
                          ] = None,
        filter: Filter = None,
        collection: CollectionArg = None,
    ) -> Annotated[CallToolResult, DeleteResult]:
        """Delete documents from the knowledge base: by doc_id (one version), or by source (every version)
        and/or filter (every stored document matching it, e.g. {"source": "drafts/*"}). Only documents this
        server may read are deleted, and none unless it may write every one of them."""
        if doc_id is not None and (source is not None or filter is not None) or \
                (doc_id is None and source is None and filter is None):
            raise ToolError("delete: give doc_id, or source and/or filter")
        if filter is not None and not filter:
            raise ToolError("delete: filter={} matches every document; give a condition")
        with library():
            t = target(collection)
            with t.transaction():
                if doc_id is not None:
                    check_write(t, who, scope, holder=holder, doc_id=doc_id)
                    return _compact(DeleteResult(deleted=t.delete(doc_id)))
                # what this server can see: a hidden source answers exactly as one that does not exist
                docs = t.documents(source, glob=False, versions="all", filter=filter, principals=who)
                if not docs and source is not None:
                    raise DocumentNotFound(f"no document with source {source!r}")
                for d in docs:
                    check_write(t, who, scope, holder=holder, doc_id=d.id)
                deleted = sum(t.delete(d.id) for d in docs)
        return _compact(DeleteResult(deleted=deleted))

    def list_collections() -> Annotated[CallToolResult, CollectionList]:
        """The collections of the database file (separate knowledge bases; the tools' collection argument
        picks one), each with how many documents this server may read in it."""
        with library():
            entries = []
            for info in db.collections():
                handle = db if info.name == db.collection_name else db.collection(info.name, create=False)
                served = handle is db
                if served or not hidden(handle):
                    entries.append(CollectionEntry(name=info.name, documents=handle.count(principals=who),
                                                   served=served))
        return _compact(CollectionList(collections=entries))

    Name = Annotated[str, Field(min_length=1, max_length=128, description="The collection's name.")]

    def create_collection(name: Name) -> Annotated[CallToolResult, CollectionResult]:
        """Create an empty collection (a separate knowledge base in the same file, with the default settings);
        add to it with add_text or add_texts and its collection argument."""
        with library():
            db.create_collection(name)
        return _compact(CollectionResult(name=name, status="created"))

    def drop_collection(name: Name) -> Annotated[CallToolResult, CollectionResult]:
        """Delete a collection and every document in it, only if this server may read and write every one
        of them. The collection this server serves (and the default one) cannot be dropped."""
        with library():
            if name == db.collection_name:
                raise InvalidInput(f"this server serves collection {name!r}: it cannot drop it")
            handle = target(name)
            with db.transaction():
                everything = handle.count(versions="all", principals=ragdb.ALL)
                mine = handle.documents(versions="all", principals=who)
                if len(mine) < everything or not all(scope.allows_labels(d.acl) and scope.allows_source(d.source)
                                                     for d in mine):
                    raise WriteForbidden(f"collection {name!r} holds documents this server may not delete "
                                         f"(it writes {scope.describe()}); not dropping it")
                db.drop_collection(name)
        return _compact(CollectionResult(name=name, status="dropped"))

    def writing(destructive: bool, idempotent: bool = False) -> ToolAnnotations:
        return ToolAnnotations(read_only_hint=False, destructive_hint=destructive, idempotent_hint=idempotent,
                               open_world_hint=False)

    tools += [Tool.from_function(add_text, annotations=writing(False)),
              Tool.from_function(add_texts, annotations=writing(False)),
              Tool.from_function(update_document, annotations=writing(True, True)),
              Tool.from_function(delete, annotations=writing(True, True)),
              Tool.from_function(list_collections, annotations=read_only),
              Tool.from_function(create_collection, annotations=writing(False)),
              Tool.from_function(drop_collection, annotations=writing(True, True))]
    return _server(name, tools)


def _server(name: str, tools: list[Tool]) -> MCPServer:
    """The SDK server holding ``tools``, each with a closed argument schema: an argument a tool
    does not declare (a model's guess such as ``principals``) is a tool error, not silently dropped
    (the SDK's own argument models ignore unknown keys)."""
    known: dict[str, frozenset[str]] = {}
    for tool in tools:
        tool.parameters["additionalProperties"] = False
        known[tool.name] = frozenset(tool.parameters.get("properties", {}))

    async def reject_unknown_arguments(ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        params = ctx.params
        if ctx.method == "tools/call" and isinstance(params, Mapping):
            allowed = known.get(params.get("name"))  # type: ignore[arg-type]
            arguments = params.get("arguments")
            if allowed is not None and isinstance(arguments, Mapping):
                unknown = sorted(str(a) for a in arguments if a not in allowed)
                if unknown:
                    takes = ", ".join(sorted(allowed)) or "none"
                    text = (f"{params['name']}: unknown argument{'s' if len(unknown) > 1 else ''} "
                            f"{', '.join(map(repr, unknown))} (it takes: {takes})")
                    return CallToolResult(is_error=True, content=[TextContent(type="text", text=text)])
        return await call_next(ctx)

    return MCPServer(name, instructions=INSTRUCTIONS, version=ragdb.__version__, log_level="WARNING",
                     tools=tools, middleware=[reject_unknown_arguments])


def _compact(result: BaseModel) -> CallToolResult:
    """A tool's result: its structured content, and as text the same JSON without indentation
    or spaces (the SDK indents it by default, a third more characters for the model to read)."""
    data = result.model_dump(mode="json")
    return CallToolResult(content=[TextContent(type="text", text=orjson.dumps(data).decode())],
                          structured_content=data)


def _search_hit(h: ragdb.Hit, rank: int) -> SearchHit:
    snip = h.snippet if h.snippet is not None else ragdb.types.Snippet(h.text[:SNIPPET_CHARS], 0,
                                                                      min(len(h.text), SNIPPET_CHARS))
    return SearchHit(rank=rank, source=h.source, doc_id=h.doc_id, chunk_id=h.chunk_id, version=h.version,
                     start=h.start, end=h.end, score=h.score, confidence=h.confidence, snippet=snip.text,
                     snippet_start=snip.start, highlights=list(snip.highlights),
                     truncated=len(snip.text) < len(h.text), metadata=dict(h.metadata))


# --------------------------------------------------------------------------- running it

def parse_http_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6; a bare ``PORT`` is 127.0.0.1) as ``(host, port)``."""
    value = text.strip()
    host, sep, port = value.rpartition(":")
    if not sep:
        host, port = "127.0.0.1", value
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidInput(f"{text!r} is not HOST:PORT (a port from 1 to 65535, e.g. 127.0.0.1:8765)")
    return host, int(port)


def serve(db: ragdb.Database, *, principals: Any = None, allow_writes: bool = False,
          http: tuple[str, int] | None = None, write_labels: Sequence[str] | None = None,
          max_query_chars: int = MAX_QUERY_CHARS) -> None:
    """Serve ``db`` until the client goes away (stdio) or the process is stopped
    (``http``: the SDK's Streamable HTTP transport on ``(host, port)``, endpoint
    ``/mcp``; on a loopback host the SDK also checks Host/Origin headers against
    DNS rebinding). Binding another host is the caller's decision: the transport
    has no authentication."""
    server = build_server(db, principals=principals, allow_writes=allow_writes, write_labels=write_labels,
                          max_query_chars=max_query_chars)
    if http is None:
        server.run("stdio")
    else:
        server.run("streamable-http", host=http[0], port=http[1])
