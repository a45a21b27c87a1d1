"""What the LangChain and LlamaIndex vector stores share, without importing either
framework: filters checked when a store or retriever is made, per-call search options
that never widen the principals, the score a framework thresholds, and the rule that a
store writes only documents its own principals may read.

Both stores keep one framework document (a LangChain ``Document``, a LlamaIndex node)
as one ragdb document of one chunk (chunker ``"none"``: the framework splits text
before it reaches a vector store), whose source is the framework's id.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ragdb.errors import DocumentNotFound, InvalidInput
from ragdb.options import ALL, PUBLIC, AllPrincipals, SearchOptions, check_text, to_epoch
from ragdb.query.filters import build as build_filter
from ragdb.types import Hit

if TYPE_CHECKING:
    from ragdb.database import Database

__all__ = ["STORE_CHUNKER", "check_filter", "check_store_labels", "call_options", "relevance",
           "writable", "and_filters", "delete_visible", "check_ids", "id_list"]

#: A store's document is one chunk: frameworks split text before it reaches a vector store.
STORE_CHUNKER = "none"


def check_filter(filter: Any, where: str) -> Mapping[str, Any] | None:
    """``filter`` validated now (ragdb's filter language, :mod:`ragdb.query.filters`), so a
    bad one is an :class:`~ragdb.errors.InvalidInput` when a retriever or store is made or
    called, before anything is searched."""
    if filter is None:
        return None
    if not isinstance(filter, Mapping):
        raise InvalidInput(f"{where}: filter must be a mapping of key to value(s), got {type(filter).__name__}")
    try:
        build_filter(filter, principals=ALL, to_epoch=to_epoch)
    except InvalidInput as e:
        raise InvalidInput(f"{where}: {e}") from None
    return filter


def and_filters(base: Mapping[str, Any] | None, extra: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """Both filters must hold: a per-call filter narrows what a retriever was made with, never widens it."""
    if base is None or not base:
        return extra
    if extra is None or not extra:
        return base
    return {"$and": [dict(base), dict(extra)]}


def call_options(base: SearchOptions, keywords: Mapping[str, Any], where: str) -> SearchOptions:
    """``base`` with the search options given at call time (``k``, ``filter`` (and-ed with
    ``base``'s), ``scorer`` and any other :class:`~ragdb.options.SearchOptions` keyword).
    ``principals`` cannot be given: they are fixed when the retriever or store is made."""
    if not keywords:
        return base
    keywords = dict(keywords)
    if "principals" in keywords or "restrictions" in keywords:
        raise InvalidInput(f"{where}: principals are fixed when it is made; a call cannot change them")
    if "filter" in keywords:
        extra = check_filter(keywords.pop("filter"), where)
        keywords["filter"] = and_filters(base.restrictions.filter, extra)
    return SearchOptions.from_keywords(base, **keywords)


def store_scorer(db: Database, embedder: Any, vectors_seen: bool) -> tuple[str, bool]:
    """The scorer of a vector store's search, and whether vectors have been seen: hybrid when an
    embedding model is at hand (``embedder``, else the database's) and the database holds
    vectors, else BM25. Vectors are counted until seen once (``vector_info`` counts rows);
    once there, they stay."""
    if (embedder if embedder is not None else db.embedder) is None:
        return "bm25", vectors_seen
    if not vectors_seen:
        vectors_seen = db.vector_info().vectors > 0
    return ("hybrid" if vectors_seen else "bm25"), vectors_seen


def relevance(hit: Hit) -> float:
    """The score a framework thresholds, in [0, 1]: ragdb's confidence
    (:mod:`ragdb.index.confidence`: the chunk's BM25 over the query's maximum, the
    same for every scorer and comparable across queries), else, where the search
    gave none (a reranked hit), the raw score clipped to [0, 1]."""
    if hit.confidence is not None:
        return float(hit.confidence)
    return min(1.0, max(0.0, float(hit.score)))


def check_store_labels(acl: Sequence[str] | None, principals: tuple[str, ...] | AllPrincipals, where: str
                       ) -> tuple[str, ...] | None:
    """A store writes only what it may read: each access label it writes must be one of
    its principals (or :data:`ragdb.PUBLIC`), unless its principals are :data:`ragdb.ALL`."""
    if acl is None:
        return None
    if isinstance(acl, str) or not isinstance(acl, Sequence):
        raise InvalidInput(f"{where}: acl must be a list of labels, got {acl!r}")
    labels = tuple(check_text(a, f"{where}: acl label") if isinstance(a, str) and a else _bad_label(a, where)
                   for a in acl)
    if isinstance(principals, tuple):  # not ragdb.ALL
        held = set(principals) | {PUBLIC}
        foreign = sorted(set(labels) - held)
        if foreign:
            raise InvalidInput(f"{where}: acl {foreign} is not among its principals {sorted(principals)}: a store "
                               f"writes only documents it may read")
    return labels


def _bad_label(label: Any, where: str) -> str:
    raise InvalidInput(f"{where}: acl must be a list of non-empty strings, got {label!r}")


def writable(db: Database, source: str, principals: Any) -> bool:
    """Whether a store with these principals may write ``source``: it is new, or the store
    can read its latest version. (Call inside the write's transaction.)"""
    if principals is ALL:
        return True
    try:
        db.get(source=source, with_text=False, principals=principals)
        return True
    except DocumentNotFound:
        pass
    try:
        db.get(source=source, with_text=False, principals=ALL)
    except DocumentNotFound:
        return True
    return False


def id_list(ids: Any, where: str) -> list[Any]:
    """``ids`` as a list: one string is refused, not read as its characters (``delete("abc")``
    deleted the ids ``a``, ``b`` and ``c``), and so is a mapping or what is no iterable."""
    if isinstance(ids, (str, bytes, Mapping)):
        raise InvalidInput(f"{where}: ids must be a list of ids, not {type(ids).__name__} {ids!r}")
    try:
        return list(ids)
    except TypeError:
        raise InvalidInput(f"{where}: ids must be a list of ids, got {type(ids).__name__}") from None


def check_ids(ids: Any, where: str) -> list[str]:
    """A list of ids, each a non-empty string (:func:`id_list`)."""
    listed = id_list(ids, where)
    for doc_id in listed:
        if not isinstance(doc_id, str) or not doc_id:
            raise InvalidInput(f"{where}: ids must be non-empty strings, got {doc_id!r}")
    return listed


def delete_visible(db: Database, principals: Any, *, source: str | None = None,
                   filter: Mapping[str, Any] | None = None) -> int:
    """Delete the versions of the documents with this source (exactly: no pattern) and/or
    matching ``filter`` that ``principals`` may read, each by id, as ``POST /documents/delete``
    does; a kept version they may not read stays (deleting by source removed every version).
    Inside the caller's transaction; returns how many were deleted."""
    docs = db.documents(source, glob=False, versions="all", filter=filter, principals=principals)
    return sum(db.delete(d.id) for d in docs)
