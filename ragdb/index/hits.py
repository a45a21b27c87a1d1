"""Hits: how every scorer turns (chunk id, score) into :class:`~ragdb.types.Hit`, and
how equal scores are ordered.

One rule for all of lexical, vector and hybrid search: best score first,
equal scores by source, then position in the document, then chunk id. Source
and position are content, not insertion history, so a database answers in
the same order as a fresh build of the same documents.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from ragdb.types import Hit

#: chunk id -> (Hit fields but score/metadata/explain/confidence, metadata): ``Index.hit_protos`` entries
Protos = Mapping[int, tuple[dict[str, Any], dict[str, Any]]]


def make_hits(protos: Protos, chunk_ids: Sequence[int], scores: Sequence[float],
              explain: Mapping[int, Mapping[str, float]] | None = None,
              confidences: Sequence[float | None] | None = None) -> list[Hit]:
    """:class:`Hit` objects from :meth:`ragdb.index.inverted.Index.hit_protos` entries, in the given order
    (``confidences``: each hit's :attr:`Hit.confidence`, in the same order; None: none).

    Built without the frozen dataclass ``__init__`` (which sets each of its 13
    fields through ``object.__setattr__``): the instance dict is one copy of
    the cached fields, several times faster, and search builds up to ``k``
    hits. Each hit gets its own metadata and explain dicts."""
    new, setattr_ = object.__new__, object.__setattr__
    hits: list[Hit] = []
    append = hits.append
    confs: Sequence[float | None] = confidences if confidences is not None else [None] * len(chunk_ids)
    for cid, score, conf in zip(chunk_ids, scores, confs):
        fields, meta = protos[cid]
        d = fields.copy()  # (its highlights and snippet are () and None already)
        d["score"] = score
        d["metadata"] = meta.copy() if meta else {}
        d["explain"] = dict(explain.get(cid, ())) if explain is not None else {}
        d["confidence"] = conf
        hit = new(Hit)
        setattr_(hit, "__dict__", d)
        append(hit)
    return hits


def hit_order(h: Hit) -> tuple[float, str, int, int]:
    """Sort key of hits: score descending, then source, position, chunk id."""
    return (-h.score, h.source, h.start, h.chunk_id)


def hits_from_scored(protos: Protos, scored: Iterable[tuple[int, float, Mapping[str, float]]],
                     confidences: Mapping[int, float] | None = None) -> list[Hit]:
    """Hits for ``(chunk id, score, explain)`` triples, in :func:`hit_order`; chunks
    missing from ``protos`` (deleted meanwhile) are left out. ``confidences``: chunk id
    -> :attr:`Hit.confidence`."""
    rows = [s for s in scored if s[0] in protos]
    confs = [confidences.get(c) for c, _, _ in rows] if confidences is not None else None
    hits = make_hits(protos, [c for c, _, _ in rows], [float(v) for _, v, _ in rows], {c: e for c, _, e in rows},
                     confs)
    hits.sort(key=hit_order)
    return hits


Pool = tuple[np.ndarray, np.ndarray]  # (chunk ids, scores), best first


def content_order(pool: Pool, sort_keys: Callable[[Sequence[int]], Mapping[int, tuple[str, int]]]) -> Pool:
    """A best-first pool with equal scores ordered by (source, start) as hits are,
    so ranks (and fusion) do not depend on chunk ids; ``sort_keys`` reads the
    (source, start) of the tied chunks only."""
    ids, scores = pool
    if len(ids) < 2:
        return pool
    eq = scores[1:] == scores[:-1]
    if not eq.any():
        return pool
    pos = np.flatnonzero(eq)
    tied = sorted(set(ids[np.concatenate([pos, pos + 1])].tolist()))
    keys = sort_keys(tied)
    ranked = sorted(zip(ids.tolist(), scores.tolist()),
                    key=lambda cs: (-cs[1], *keys.get(cs[0], ("", 0)), cs[0]))
    return (np.fromiter((c for c, _ in ranked), np.int64, len(ranked)),
            np.fromiter((v for _, v in ranked), np.float64, len(ranked)))


def cut_with_ties(ids: np.ndarray, scores: np.ndarray, k: int) -> Pool:
    """The first ``k`` of a best-first pool plus any tied with the k-th."""
    if len(ids) <= k:
        return ids, scores
    keep = scores >= scores[k - 1]
    return ids[keep], scores[keep]
