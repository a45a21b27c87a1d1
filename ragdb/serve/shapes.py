"""What the integrations and servers share, without importing any framework: the
search options of a retriever, the metadata a retrieved chunk or a loaded document
carries into a framework's document, and a framework document back as an
:meth:`ragdb.Database.add_many` record.

Metadata is flat, as both frameworks expect: the document's own metadata (merged
with the chunk's, as in :attr:`ragdb.Hit.metadata`) plus ragdb's fields under the
names in :data:`HIT_KEYS` / :data:`DOCUMENT_KEYS`; ragdb's fields win over
document metadata keys of the same name. Also shared by ``ragdb mcp``, ``ragdb
serve`` and the CLI: :func:`hit_json`, :func:`document_json` and :func:`stats_json` (a hit, a document
and statistics as JSON, one shape wherever they are shown), :func:`facets_json`
(facet counts as JSON).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ragdb.errors import InvalidInput
from ragdb.options import AllPrincipals, SearchOptions, check_principals
from ragdb.types import Hit

if TYPE_CHECKING:  # (the CLI's search imports this module and makes none of them)
    from ragdb.records import Document, Facets, Stats

#: The default number of chunks a retriever returns (LangChain's ``as_retriever`` default).
DEFAULT_K = 4

#: ragdb's fields in the metadata of a retrieved chunk.
HIT_KEYS = ("source", "version", "timestamp", "start", "end", "ordinal", "score", "confidence", "doc_id", "chunk_id")

#: ragdb's fields in the metadata of a loaded document (``acl`` only when it has labels).
DOCUMENT_KEYS = ("source", "version", "timestamp", "doc_id", "acl")

#: Metadata keys that become record fields when a framework document is added.
RECORD_KEYS = ("source", "version", "timestamp", "acl")

#: Metadata keys ragdb wrote that are not record fields: dropped when a document is added
#: (a retrieved chunk's score is not metadata of the document it came from).
DERIVED_KEYS = frozenset(HIT_KEYS + DOCUMENT_KEYS) - frozenset(RECORD_KEYS)

#: Hit fields that are numbers about the retrieval rather than about the text; the
#: LlamaIndex integration keeps them out of what the LLM and embedders see.
NUMERIC_KEYS = ("start", "end", "ordinal", "score", "confidence", "doc_id", "chunk_id")

PrincipalsArg = Sequence[str] | AllPrincipals | None


def retriever_options(k: int | None, scorer: str | None, filter: Mapping[str, Any] | None, principals: PrincipalsArg,
                   options: SearchOptions | None) -> SearchOptions:
    """The options a retriever searches with: ``options`` (for any other search
    option: ``min_score``, ``k1``, ``versions``, ``reranker`` ...) with ``k``,
    ``scorer`` and ``filter`` over it where given (``k`` without either:
    :data:`DEFAULT_K`), and always the retriever's ``principals`` (omitted: an
    anonymous caller, who sees public chunks only; ``ragdb.ALL``: everything).
    Invalid options raise :class:`~ragdb.errors.InvalidInput` here, when the
    retriever is made, not at its first query."""
    if options is not None and not isinstance(options, SearchOptions):
        raise InvalidInput(f"options must be a ragdb.options.SearchOptions, got {type(options).__name__}")
    if options is not None and options.restrictions.principals:
        raise InvalidInput("options must not hold principals: a retriever's principals are its principals= "
                           "argument (omitted: an anonymous caller)")
    keywords: dict[str, Any] = {"principals": check_principals(principals)}
    if k is not None or options is None:
        keywords["k"] = DEFAULT_K if k is None else k
    if scorer is not None:
        keywords["scorer"] = scorer
    if filter is not None:
        keywords["filter"] = filter
    return SearchOptions.from_keywords(options, **keywords)


def hit_metadata(hit: Hit) -> dict[str, Any]:
    """The metadata of a retrieved chunk: its document's (and its own), then ragdb's :data:`HIT_KEYS`."""
    meta = dict(hit.metadata)
    meta.update(source=hit.source, version=hit.version, timestamp=hit.timestamp, start=hit.start, end=hit.end,
                ordinal=hit.ordinal, score=hit.score, confidence=hit.confidence, doc_id=hit.doc_id,
                chunk_id=hit.chunk_id)
    return meta


def document_metadata(doc: Document) -> dict[str, Any]:
    """The metadata of a loaded document: its own, then ragdb's :data:`DOCUMENT_KEYS`."""
    meta = dict(doc.metadata)
    meta.update(source=doc.source, version=doc.version, timestamp=doc.timestamp, doc_id=doc.id)
    if doc.acl:  # kept, so that adding the document elsewhere keeps it labelled
        meta["acl"] = list(doc.acl)
    else:
        meta.pop("acl", None)
    return meta


def to_record(text: str, metadata: Mapping[str, Any] | None, fallback_source: str | None,
              acl: Sequence[str] | None, where: str) -> dict[str, Any]:
    """An ``add_many`` record for a framework document (``where`` names it in errors).

    ``source`` is ``metadata["source"]`` (a string or a path), else
    ``fallback_source`` (the framework's document id), else derived from the text
    by ragdb. ``version``, ``timestamp`` and ``acl`` come from the metadata keys of
    those names; ``acl`` given here applies instead (to every document of the call).
    The keys in :data:`DERIVED_KEYS` are dropped; the rest is the document's metadata."""
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, Mapping):
        raise InvalidInput(f"{where}: metadata must be a mapping, got {type(metadata).__name__}")
    meta = {key: value for key, value in metadata.items() if key not in DERIVED_KEYS}
    source = meta.pop("source", None)
    if isinstance(source, os.PathLike):
        source = os.fspath(source)
    if source is None:
        source = fallback_source
    if source is not None and (not isinstance(source, str) or not source):
        raise InvalidInput(f"{where}: metadata['source'] must be a non-empty string or a path, got {source!r}")
    labels = meta.pop("acl", None)
    return {"text": text, "source": source, "version": meta.pop("version", None),
            "timestamp": meta.pop("timestamp", None), "metadata": meta, "acl": labels if acl is None else acl}


def check_distinct_sources(records: Sequence[Mapping[str, Any]], what: str, named_by: str = "metadata['source']",
                           ) -> None:
    """Refuse two records of one call with the same source: the second would replace the
    first (ragdb chunks a document itself), losing it silently. ``named_by``: what names a
    record's source for the caller (a vector store's id)."""
    seen: dict[str, int] = {}
    for n, record in enumerate(records):
        source = record.get("source")
        if source is None:
            continue
        if source in seen:
            raise InvalidInput(
                f"{what} {seen[source]} and {n} have the same source {source!r}: the second would replace the "
                f"first. ragdb chunks documents itself, so add whole documents (before a text splitter), or give "
                f"each its own {named_by}")
        seen[source] = n


def hit_json(h: Hit, rank: int | None = None) -> dict[str, Any]:
    """A search hit as JSON, the one shape of the CLI's ``--json``, the HTTP API and a prompt's
    sources: ``rank`` first when given; ``confidence`` always (null where the scorer has none);
    ``explain`` when the search asked for it; highlights and the snippet when made."""
    out: dict[str, Any] = {} if rank is None else {"rank": rank}
    out.update(score=h.score, source=h.source, doc_id=h.doc_id, chunk_id=h.chunk_id, version=h.version,
               timestamp=h.timestamp, start=h.start, end=h.end, ordinal=h.ordinal, confidence=h.confidence,
               metadata=dict(h.metadata), text=h.text)
    if h.duplicates:  # the other copies of this passage that the search collapsed into it
        out["duplicates"] = [{"source": d.source, "chunk_id": d.chunk_id, "doc_id": d.doc_id, "score": d.score}
                             for d in h.duplicates]
    if h.explain:
        out["explain"] = dict(h.explain)
    if h.snippet is not None:
        out["highlights"] = [list(span) for span in h.highlights]
        out["snippet"] = {"text": h.snippet.text, "start": h.snippet.start, "end": h.snippet.end,
                          "highlights": [list(span) for span in h.snippet.highlights]}
    return out


def stats_json(s: Stats) -> dict[str, Any]:
    """Collection statistics as JSON: every field of :class:`~ragdb.types.Stats` (the CLI, the
    HTTP API and the MCP server each add what only they know)."""
    return dataclasses.asdict(s)


def document_json(d: Document) -> dict[str, Any]:
    """A document as the CLI's ``--json`` and the HTTP API give it (``text`` only when read)."""
    out = {"id": d.id, "source": d.source, "version": d.version, "timestamp": d.timestamp,
           "content_hash": d.content_hash, "metadata": dict(d.metadata), "acl": list(d.acl),
           "chunks": d.chunk_count, "latest": d.latest}
    if d.text is not None:
        out["text"] = d.text
    return out


def facets_json(f: Facets) -> dict[str, Any]:
    """Facet counts as the CLI's ``--json`` and the HTTP API give them: the field, what is
    counted, the totals and the ``(value, count)`` pairs as ``values``, most frequent first."""
    return {"field": f.field, "by": f.by, "total": f.total, "missing": f.missing, "omitted": f.omitted,
            "values": [{"value": v, "count": n} for v, n in f]}
