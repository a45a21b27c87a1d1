"""Rank fusion for hybrid (lexical + dense) retrieval: pure functions.

Both functions return ``[(key, fused_score), ...]`` sorted by score
descending, with a deterministic tie-break: keys with equal scores keep the
order in which they were first seen in the inputs.  Keys can be any hashable
values (chunk ids, typically).
"""

from __future__ import annotations

import functools
import math
import re
from numbers import Real
from typing import TypeVar
from collections.abc import Hashable, Iterable, Mapping, Sequence

import numpy as np

from ragdb.patterns import LazyPattern
from ragdb.errors import InvalidInput
from ragdb.index.hits import Pool

__all__ = ["rrf", "minmax_weighted", "minmax_weighted_pools", "rrf_pools", "empty_pool", "adaptive_alpha", "base_alpha", "query_language", "FITTED_ALPHA"]

K = TypeVar("K", bound=Hashable)


def rrf(rankings: Sequence[Sequence[K]], k: float = 60) -> list[tuple[K, float]]:
    """Reciprocal Rank Fusion.

    ``score(d) = sum over rankings r containing d of 1 / (k + rank_r(d))``,
    ranks counted from 1, ``k = 60`` as recommended by the source:
    G. V. Cormack, C. L. A. Clarke and S. Büttcher, "Reciprocal Rank Fusion
    outperforms Condorcet and individual Rank Learning Methods", SIGIR 2009,
    pp. 758-759, https://doi.org/10.1145/1571941.1572114.

    Each ranking is a best-first sequence of keys; a key repeated within one
    ranking counts at its first (best) position only.  Per-key sums use
    :func:`math.fsum`, so equal contributions give exactly equal scores
    whatever the order of the rankings.  Ties are broken by first appearance,
    reading ranking 0 top to bottom, then ranking 1, and so on.
    """
    if isinstance(k, bool) or not isinstance(k, Real) or not math.isfinite(k) or k < 0:
        raise InvalidInput(f"k must be a finite number >= 0, got {k!r}")
    if isinstance(rankings, (str, bytes)):
        raise InvalidInput("rankings must be a sequence of rankings")
    parts: dict[K, list[float]] = {}
    for ranking in rankings:
        if isinstance(ranking, (str, bytes)):
            raise InvalidInput("each ranking must be a sequence of keys, not a string")
        seen: set[K] = set()
        for rank, key in enumerate(ranking, start=1):
            if key in seen:
                continue
            seen.add(key)
            parts.setdefault(key, []).append(1.0 / (k + rank))
    scored = [(key, math.fsum(values)) for key, values in parts.items()]
    # sorted() is stable: equal scores keep first-appearance order.
    scored.sort(key=lambda item: -item[1])
    return scored


def _normalized(scores: Mapping[K, float], side: str) -> dict[K, float]:
    values: list[float] = []
    for key, value in scores.items():
        if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
            raise InvalidInput(f"{side} score of {key!r} must be a finite number, got {value!r}")
        values.append(float(value))
    if not values:
        return {}
    low, high = min(values), max(values)
    if high == low:
        return dict.fromkeys(scores, 1.0)
    span = high - low
    return {key: (float(value) - low) / span for key, value in scores.items()}


def minmax_weighted(
    lexical: Mapping[K, float], dense: Mapping[K, float], alpha: float
) -> list[tuple[K, float]]:
    """Convex combination of min-max normalized scores.

    Each side is min-max normalized over its own candidate pool,
    ``(s - min) / (max - min)``, into [0, 1] (J. H. Lee, "Analyses of multiple
    evidence combination", SIGIR 1997);
    then ``fused = alpha * dense + (1 - alpha) * lexical``, the convex
    combination analysed by S. Bruch, S. Gai and A. Ingber, "An Analysis of
    Fusion Functions for Hybrid Retrieval", ACM TOIS 42(1), 2023,
    https://doi.org/10.1145/3596512.

    * ``alpha`` must be in [0, 1]: 0 is lexical only, 1 dense only.
    * A key missing from one side contributes 0 for that side.
    * If every score on a side is equal (including a single candidate), the
      normalized value of all of them is 1.0: they are all that side's best.
    * Every key of either side is returned, even with a fused score of 0.

    Ties are broken by first appearance: ``lexical``'s iteration order, then
    keys found only in ``dense`` in its order.
    """
    if isinstance(alpha, bool) or not isinstance(alpha, Real) or not 0.0 <= alpha <= 1.0:
        raise InvalidInput(f"alpha must be a number in [0, 1], got {alpha!r}")
    alpha = float(alpha)
    lex = _normalized(lexical, "lexical")
    den = _normalized(dense, "dense")
    keys: Iterable[K] = list(lex) + [key for key in den if key not in lex]
    scored = [(key, alpha * den.get(key, 0.0) + (1.0 - alpha) * lex.get(key, 0.0)) for key in keys]
    scored.sort(key=lambda item: -item[1])
    return scored


# --------------------------------------------------------------------------
# Adaptive weighting (the default fusion of hybrid search)
# --------------------------------------------------------------------------

#: The vector weight of the min-max weighted sum by model and query language, fitted by
#: the benchmark (BENCHMARKS.md, section hybrid: the weight with the best nDCG@10 on
#: SciFact train for English queries and on CMRC trial for Chinese ones, on a 0.05
#: grid). A model not listed uses :data:`GENERIC_ALPHA`.
FITTED_ALPHA: dict[str, dict[str, float]] = {
    "wordllama-l2-supercat-256": {"en": 0.3, "zh": 0.0},
    "use-multilingual-v3-512": {"en": 0.25, "zh": 0.0},
    "multilingual-e5-small-q4": {"en": 0.5, "zh": 0.15},
}
GENERIC_ALPHA = {"en": 0.3, "zh": 0.0}
#: Lexical coverage (the best BM25 hit's :attr:`ragdb.Hit.confidence`: its score over the
#: highest any chunk could reach, query terms the collection lacks counted fully) at or
#: below which the lexical side is not trusted and the vector weight is :data:`LOW_COVERAGE_ALPHA`;
#: at or above :data:`COVERAGE_HIGH` it is the fitted base weight; linear in between.
#: Chosen as the widest band that costs nothing on SciFact and CMRC (measured in the
#: benchmark); it is what lets a Chinese question find English chunks (BM25 then covers
#: only the query's stray Latin tokens) without hurting queries BM25 answers well.
COVERAGE_LOW = 0.10
COVERAGE_HIGH = 0.15
LOW_COVERAGE_ALPHA = 0.9

_HAN_SOURCE = "[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af]"


@functools.cache
def _han() -> re.Pattern[str]:
    """CJK letters, compiled on first use (hybrid searches): the ranges take re a few ms to
    compile, which every process importing this module (every search) would pay."""
    return re.compile(_HAN_SOURCE)
_LETTER = LazyPattern(r"[^\W\d_]")


def query_language(query: str) -> str:
    """``"zh"`` when at least 30% of the query's letters are CJK (Han, kana, hangul), else ``"en"``
    (the two kinds of query the fitted weights were measured on)."""
    letters = len(_LETTER.findall(query))
    return "zh" if letters and len(_han().findall(query)) >= 0.3 * letters else "en"


def base_alpha(model: str, query: str) -> float:
    """The fitted vector weight of ``model`` for ``query``'s language."""
    return FITTED_ALPHA.get(model, GENERIC_ALPHA)[query_language(query)]


def adaptive_alpha(base: float, coverage: float) -> float:
    """The vector weight of one query: ``base`` when the best lexical hit covers the query
    well (``coverage >= COVERAGE_HIGH``), rising linearly to ``LOW_COVERAGE_ALPHA`` (never
    below ``base``) as coverage falls to ``COVERAGE_LOW``; 1.0 when nothing matched lexically
    (``coverage`` 0 with an empty lexical side is the caller's to pass as 0)."""
    if not 0.0 <= base <= 1.0 or not math.isfinite(coverage):
        raise InvalidInput(f"adaptive_alpha: base must be in [0, 1] and coverage finite, got {base!r}, {coverage!r}")
    top = max(base, LOW_COVERAGE_ALPHA)
    if coverage >= COVERAGE_HIGH:
        return base
    if coverage <= COVERAGE_LOW:
        return top
    return base + (top - base) * (COVERAGE_HIGH - coverage) / (COVERAGE_HIGH - COVERAGE_LOW)


# -- the same arithmetic on (chunk ids, scores) arrays, as hybrid search runs it --------------------

def empty_pool() -> Pool:
    """No candidates."""
    return np.zeros(0, np.int64), np.zeros(0, np.float64)


def _minmax(v: np.ndarray) -> np.ndarray:
    if not len(v):
        return v
    lo, hi = float(v.min()), float(v.max())
    if hi == lo:
        return np.ones(len(v))
    return (v - lo) / (hi - lo)


def minmax_weighted_pools(lexical: Pool, dense: Pool, alpha: float) -> Pool:
    """:func:`ragdb.index.fusion.minmax_weighted` on pools: the same arithmetic in
    the same order, so the same floats and the same order (the tests check it
    against the reference, which validates every value through
    ``numbers.Real`` and cost a third of a hybrid query's time)."""
    keys = lexical[0].tolist()
    lex = _minmax(lexical[1]).tolist()
    den = [0.0] * len(keys)
    pos = dict(zip(keys, range(len(keys))))
    for cid, v in zip(dense[0].tolist(), _minmax(dense[1]).tolist()):
        i = pos.get(cid)
        if i is None:
            keys.append(cid)
            lex.append(0.0)
            den.append(v)
        else:
            den[i] = v
    fused = alpha * np.array(den) + (1.0 - alpha) * np.array(lex)
    order = np.argsort(-fused, kind="stable")  # equal scores keep first-appearance order
    return np.array(keys, np.int64)[order], fused[order]


def rrf_pools(lexical: Pool, dense: Pool, k: float) -> Pool:
    """:func:`ragdb.index.fusion.rrf` on pools."""
    fused = rrf([lexical[0].tolist(), dense[0].tolist()], k=k)
    return (np.fromiter((c for c, _ in fused), np.int64, len(fused)),
            np.fromiter((v for _, v in fused), np.float64, len(fused)))
