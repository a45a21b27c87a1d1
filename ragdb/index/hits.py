"""Hits: how every scorer turns (chunk id, score) into :class:`~ragdb.types.Hit`, and
how equal scores are ordered.

One rule for all of lexical, vector and hybrid search: best score first,
equal scores by source, then position in the document, then chunk id. Source
and position are content, not insertion history, so a database answers in
the same order as a fresh build of the same documents.
"""

from __future__ import annotations

import dataclasses
import re
import unicodedata
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from ragdb.types import Duplicate, Hit

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


# -- one hit per passage ---------------------------------------------------------------
#
# The same section often reaches a knowledge base several times (a page as Markdown and
# as HTML, and again in an all-in-one page), each copy a chunk of its own with slightly
# different markup and chunk boundaries. Two passages are the same when their sets of word
# 3-shingles (Broder, "On the resemblance and containment of documents", 1997) have a
# Jaccard similarity of at least DUPLICATE_JACCARD, or the smaller set, when it has at
# least DUPLICATE_MIN_SHINGLES shingles, lies DUPLICATE_CONTAINMENT inside the other
# (Broder's containment: a short chunk cut from the middle of the same section). Shingles
# are over the words a reader sees: NFKC, case folded, letters and digits only (markup
# punctuation, Markdown link targets and HTML tags are not words), each CJK character a
# word. The sets are compared exactly, through an inverted index of the kept passages'
# shingles: a search collapses at most a few thousand hits, where exact Jaccard costs less
# than estimating it with MinHash (datasketch), which pays off only across millions.

#: Jaccard similarity of word 3-shingle sets from which two passages are one.
DUPLICATE_JACCARD = 0.6
#: Containment of the smaller shingle set in the larger from which two passages are one...
DUPLICATE_CONTAINMENT = 0.9
#: ... when the smaller set has at least this many shingles.
DUPLICATE_MIN_SHINGLES = 16
SHINGLE = 3

_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
_WORDS = re.compile(f"[{_CJK}]|[^\\W_{_CJK}]+")
_MARKUP = re.compile(r"\]\([^)\s]*\)|<[^>\n]{1,200}>")  # a Markdown link's target, an HTML tag


def passage_shingles(text: str) -> np.ndarray:
    """The word 3-shingles of ``text`` as a reader sees it, each hashed to an integer, sorted
    and distinct (a text of fewer words: one shingle of them all; none for a text without
    words). Hashes of one process: compare shingles of the same process only."""
    if not text.isascii() and not unicodedata.is_normalized("NFKC", text):
        text = unicodedata.normalize("NFKC", text)
    words = _WORDS.findall(_MARKUP.sub(" ", text).casefold())
    if len(words) < SHINGLE:
        return np.array([hash(tuple(words))] if words else [], dtype=np.int64)
    h = np.fromiter(map(hash, words), np.int64, len(words)).astype(np.uint64)
    # a polynomial of the three words' hashes (wrapping uint64 arithmetic)
    mixed = h[:-2] * np.uint64(0x9E3779B97F4A7C15) + h[1:-1] * np.uint64(0xC2B2AE3D27D4EB4F) + h[2:]
    return np.unique(mixed.view(np.int64))


def same_passage(shared: int, a: int, b: int) -> bool:
    """Whether two passages whose shingle sets have ``a`` and ``b`` members, ``shared`` of
    them in common, are one (Jaccard, or containment of a large enough smaller set)."""
    if shared <= 0:
        return False
    if shared >= DUPLICATE_JACCARD * (a + b - shared):
        return True
    small = min(a, b)
    return small >= DUPLICATE_MIN_SHINGLES and shared >= DUPLICATE_CONTAINMENT * small


def same_passages(shared: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """:func:`same_passage` of every two sets at once (the same double arithmetic): ``shared``
    the matrix of :func:`shared_shingles`, ``sizes`` each set's size."""
    a, b = sizes[:, None], sizes[None, :]
    jaccard = shared >= DUPLICATE_JACCARD * (a + b - shared)
    small = np.minimum(a, b)
    contained = (small >= DUPLICATE_MIN_SHINGLES) & (shared >= DUPLICATE_CONTAINMENT * small)
    return (shared > 0) & (jaccard | contained)


def shared_shingles(sets: Sequence[np.ndarray]) -> np.ndarray:
    """The matrix of how many shingles each two of ``sets`` (sorted, distinct) share: all
    sets sorted together, equal neighbours ``d`` apart counted for d = 1, 2, ... while any
    remain, in a few numpy calls (a shingle is in few of the sets)."""
    n = len(sets)
    out = np.zeros((n, n), np.int64)
    if n < 2:
        return out
    vals = np.concatenate(sets) if n else np.zeros(0, np.int64)
    owner = np.repeat(np.arange(n), [len(s) for s in sets])
    # a stable sort keeps the owners of equal shingles in order (the sets were concatenated in order)
    order = np.argsort(vals, kind="stable")
    vals, owner = vals[order], owner[order]
    repeated = np.flatnonzero(vals[1:] == vals[:-1])  # most shingles are in one set only: drop those
    if not len(repeated):
        return out
    keep = np.zeros(len(vals), bool)
    keep[repeated] = True
    keep[repeated + 1] = True
    vals, owner = vals[keep], owner[keep]
    for d in range(1, n):
        same = np.flatnonzero(vals[d:] == vals[:-d])
        if not len(same):
            break
        np.add.at(out, (owner[same], owner[same + d]), 1)
    return out + out.T


def _versions_of_one_source(a: Hit, b: Hit) -> bool:
    return a.source == b.source and a.doc_id != b.doc_id


def collapse_duplicates(hits: Sequence[Hit],
                        shingles: Callable[[Hit], np.ndarray] | None = None) -> list[Hit]:
    """``hits`` (best first) with each passage once: the first hit of a passage stays, its
    later copies go into its :attr:`Hit.duplicates` (in ranking order). Deterministic in the
    ranking: the passages kept from a prefix of it are the same however long it is (the copies
    named grow with it: a search names those among the hits it ranked).
    Versions of one source (a search of history) are never copies of each other.
    ``shingles``: a hit's :func:`passage_shingles` (a cache of them), else computed."""
    if len(hits) < 2:
        return list(hits)
    sets = [shingles(h) if shingles is not None else passage_shingles(h.text) for h in hits]
    same = same_passages(shared_shingles(sets), np.array([len(s) for s in sets], np.int64))
    kept: list[tuple[int, list[Hit]]] = []
    group_of: dict[int, int] = {}  # a lead's index in hits -> its group in kept
    for i, hit in enumerate(hits):
        # the first group (they are in ranking order of their leads) whose lead is this passage
        group = next((group_of[j] for j in np.flatnonzero(same[i, :i]).tolist()
                      if j in group_of and not _versions_of_one_source(hits[j], hit)), None)
        if group is not None:
            kept[group][1].append(hit)
        else:
            group_of[i] = len(kept)
            kept.append((i, []))
    return [dataclasses.replace(hits[lead], duplicates=tuple(Duplicate(d.source, d.chunk_id, d.doc_id, d.score)
                                                            for d in copies)) if copies else hits[lead]
            for lead, copies in kept]
