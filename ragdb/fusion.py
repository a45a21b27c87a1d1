"""Rank fusion for hybrid (lexical + dense) retrieval: pure functions.

Both functions return ``[(key, fused_score), ...]`` sorted by score
descending, with a deterministic tie-break: keys with equal scores keep the
order in which they were first seen in the inputs.  Keys can be any hashable
values (chunk ids, typically).
"""

from __future__ import annotations

import math
from numbers import Real
from typing import TypeVar
from collections.abc import Hashable, Iterable, Mapping, Sequence

from ragdb.errors import InvalidInput

__all__ = ["rrf", "minmax_weighted"]

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
