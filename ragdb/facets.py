"""Facets: exact counts of one field's values over the chunks (or documents) that match.

What matches is what a search under the same restrictions could return: the
chunks the restrictions' mask allows (filter, time, versions, principals:
:meth:`ragdb.index.Index.allowed`, the mask searches use), and with a query
those of them the query matches (a BM25 score above 0: the chunk holds one of
the query's terms), all of them, not the top k. So a caller never counts a
chunk they could not see. Values come from the filter index (``doc_meta``):
the document's metadata, as filters see it (:mod:`ragdb.filters`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import InvalidInput
from .options import Restrictions, SearchOptions, check_positive_int, check_text
from .types import Facets

if TYPE_CHECKING:
    from .engine import Engine
    from .search import Searcher

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
    weight = np.bincount(docs, minlength=1) if len(docs) else np.zeros(1, np.int64)
    if by == "documents":
        weight = (weight > 0).astype(np.int64)
    return _count(field, by, weight, rows, limit)


_RANK = {int: 0, float: 1, bool: 2}  # which of equal values is shown: 1 before 1.0 before True


def _count(field: str, by: str, weight: np.ndarray, rows: Sequence[tuple[int, Any, bool]],
           limit: int | None) -> Facets:
    """Facets from each matched document's weight (its matching chunks, or 1) and the
    (doc id, value, is a boolean) rows of the field."""
    counts: dict[Any, int] = {}
    shown: dict[Any, Any] = {}
    seen: set[tuple[int, Any]] = set()
    with_value: set[int] = set()
    size = len(weight)
    for doc_id, value, is_bool in rows:
        w = int(weight[doc_id]) if doc_id < size else 0
        if not w:
            continue
        v = bool(value) if is_bool else value
        if (doc_id, v) in seen:  # a list holding a value twice (or 1 and 1.0) counts it once
            continue
        seen.add((doc_id, v))
        with_value.add(doc_id)
        counts[v] = counts.get(v, 0) + w
        old = shown.get(v)
        if old is None or _RANK.get(type(v), 3) < _RANK.get(type(old), 3):
            shown[v] = v
    total = int(weight.sum())
    missing = total - sum(int(weight[d]) for d in with_value)
    ordered = sorted(((shown[v], n) for v, n in counts.items()),
                     key=lambda vn: (-vn[1], isinstance(vn[0], str), vn[0]))
    kept = ordered if limit is None else ordered[:limit]
    return Facets(field=field, by=by, counts=tuple(kept), total=total, missing=missing,
                  omitted=len(ordered) - len(kept))
