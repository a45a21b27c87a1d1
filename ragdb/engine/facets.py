"""Facets: exact counts of one field's values over the chunks (or documents) that match.

What matches is what a search under the same restrictions could return: the
chunks the restrictions' mask allows (filter, time, versions, principals:
:meth:`ragdb.index.inverted.Index.allowed`, the mask searches use), and with a query
those of them the query's lexical search returns (its phrases, exclusions, required
words and fields included: :meth:`ragdb.engine.search.Searcher.matching`), all of them,
not the top k. So a caller never counts a
chunk they could not see. Values come from the filter index (``doc_meta``):
the document's metadata, as filters see it (:mod:`ragdb.query.filters`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ragdb.errors import InvalidInput
from ragdb.options import Restrictions, SearchOptions, check_positive_int, check_text
from ragdb.records import Facets

if TYPE_CHECKING:
    from ragdb.engine.state import Engine
    from ragdb.engine.search import Searcher

FACET_BY = ("chunks", "documents")


def check_facet_args(field: Any, query: Any, by: Any, limit: Any) -> None:
    if not isinstance(field, str) or not field:
        raise InvalidInput(f"facets: field must be a non-empty string (a metadata key, source or version), "
                           f"got {field!r}")
    check_text(field, "facets: field")
    if field == "timestamp" or field.startswith("$"):
        raise InvalidInput(f"facets: cannot count values of {field!r}; give a metadata key, source or version")
    if query is not None and not isinstance(query, str):
        raise InvalidInput(f"facets: query must be a string or None, got {type(query).__name__}")
    if by not in FACET_BY:
        raise InvalidInput(f"facets: by must be 'chunks' or 'documents', got {by!r}")
    if limit is not None:
        check_positive_int(limit, "facets: limit")


def facets(engine: Engine, searcher: Searcher, field: str, query: str | None, restrictions: Restrictions,
           by: str = "chunks", limit: int | None = None) -> Facets:
    """Count ``field``'s values over what matches (see the module docstring)."""
    check_facet_args(field, query, by, limit)
    store = engine.store
    with store.read():  # one snapshot for the mask, the query's matches and the values
        engine.sync()
        index = engine.index
        mask = index.allowed(engine.restrictions(restrictions))
        if query is None:
            ids = np.flatnonzero(mask)
        else:
            ids = searcher.matching(query, SearchOptions(restrictions=restrictions), mask)
        docs = index.chunk_doc[ids]
        rows = store.facet_rows(field) if len(ids) else []
    # the matched documents (sorted) and each one's matching chunks: arrays as long as the
    # matches, where counts by document id were as long as the largest id (a knowledge base
    # that had handed out 2**31 document ids took 62 s and 18 GiB for one call)
    doc_ids, per_doc = np.unique(docs, return_counts=True)
    weight = np.ones(len(doc_ids), np.int64) if by == "documents" else per_doc.astype(np.int64)
    return _count(field, by, doc_ids, weight, rows, limit)


_RANK = {int: 0, float: 1, bool: 2}  # which of equal values is shown: 1 before 1.0 before True


def _count(field: str, by: str, doc_ids: np.ndarray, weight: np.ndarray, rows: Sequence[tuple[int, Any]],
           limit: int | None) -> Facets:
    """Facets from each matched document's weight (``doc_ids``, sorted, and their weights: the
    matching chunks, or 1) and the (doc id, value) rows of the field."""
    total = int(weight.sum())
    docs = np.fromiter((d for d, _ in rows), np.int64, len(rows))
    at = np.minimum(np.searchsorted(doc_ids, docs), max(len(doc_ids) - 1, 0))
    inside = doc_ids[at] == docs if len(doc_ids) else np.zeros(len(docs), bool)
    w = np.zeros(len(rows), np.int64)
    w[inside] = weight[at[inside]]
    keep = np.flatnonzero(w)
    if not len(keep):
        return Facets(field=field, by=by, total=total, missing=total)
    # a code per distinct value, equal values (1, 1.0, True) one code, as $eq sees them
    code_of: dict[Any, int] = {}
    codes = np.fromiter((code_of.setdefault(rows[i][1], len(code_of)) for i in keep.tolist()), np.int64, len(keep))
    shown = list(code_of)
    for kind, v in {(type(rows[i][1]), rows[i][1]) for i in keep.tolist()}:
        c = code_of[v]
        if _RANK.get(kind, 3) < _RANK.get(type(shown[c]), 3):
            shown[c] = v
    docs, w = docs[keep], w[keep]
    # a document counts once per value (a list may hold it twice, or 1 and 1.0)
    _, first = np.unique(np.stack([docs, codes], axis=1), axis=0, return_index=True)
    counts = np.bincount(codes[first], weights=w[first], minlength=len(shown)).astype(np.int64)
    with_value = np.unique(docs)  # (each one of doc_ids)
    missing = total - int(weight[np.searchsorted(doc_ids, with_value)].sum())
    ordered = sorted(zip(shown, counts.tolist()), key=lambda vn: (-vn[1], isinstance(vn[0], str), vn[0]))
    kept = ordered if limit is None else ordered[:limit]
    return Facets(field=field, by=by, counts=tuple(kept), total=total, missing=missing,
                  omitted=len(ordered) - len(kept))
