"""The arithmetic of hybrid fusion (ragdb.index.fusion), without a database: Reciprocal Rank
Fusion, min-max weighted fusion (the dict reference and its numpy form), and the adaptive
weight (the query's language, the base weight per model, how the weight follows coverage)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragdb.errors import InvalidInput
from ragdb.index import fusion
from ragdb.index.fusion import minmax_weighted, rrf


# -- Reciprocal Rank Fusion ------------------------------------------------------------------


def test_rrf_values_by_hand():
    fused = rrf([["a", "b", "c"], ["b", "a", "d"]], k=60)
    scores = dict(fused)
    assert scores["a"] == pytest.approx(1 / 61 + 1 / 62)
    assert scores["b"] == pytest.approx(1 / 62 + 1 / 61)
    assert scores["c"] == pytest.approx(1 / 63)
    assert scores["d"] == pytest.approx(1 / 63)
    # a and b tie exactly; c and d tie exactly: first appearance breaks ties
    assert scores["a"] == scores["b"]
    assert [key for key, _ in fused] == ["a", "b", "c", "d"]


def test_rrf_default_k_and_order():
    fused = rrf([[1, 2, 3], [3, 2], [2]])
    scores = dict(fused)
    assert scores[2] == pytest.approx(1 / 62 + 1 / 62 + 1 / 61)
    assert scores[3] == pytest.approx(1 / 63 + 1 / 61)
    assert scores[1] == pytest.approx(1 / 61)
    assert [key for key, _ in fused] == [2, 3, 1]


def test_rrf_k_zero_duplicates_and_empty():
    assert rrf([["x", "y"]], k=0) == [("x", 1.0), ("y", 0.5)]
    # a key repeated within one ranking counts once, at its best rank
    assert rrf([["x", "x", "y"]], k=0) == [("x", 1.0), ("y", 1 / 3)]
    assert rrf([]) == []
    assert rrf([[], []]) == []
    # tuples as keys
    assert rrf([[(1, "a"), (2, "b")]], k=1)[0] == ((1, "a"), 0.5)


def test_rrf_exact_ties_regardless_of_order():
    # three rankings, same contributions in different orders: exactly equal sums
    fused = dict(rrf([["p", "q", "r"], ["q", "r", "p"], ["r", "p", "q"]]))
    assert fused["p"] == fused["q"] == fused["r"]
    assert [k for k, _ in rrf([["p", "q", "r"], ["q", "r", "p"], ["r", "p", "q"]])] == ["p", "q", "r"]


@pytest.mark.parametrize("k", [-1, math.nan, math.inf, "60", True, None])
def test_rrf_validates_k(k):
    with pytest.raises(InvalidInput):
        rrf([["a"]], k=k)


def test_rrf_rejects_strings():
    with pytest.raises(InvalidInput):
        rrf(["abc"])
    with pytest.raises(InvalidInput):
        rrf("abc")


# -- min-max weighted fusion -----------------------------------------------------------------

LEX = {"a": 10.0, "b": 5.0, "c": 0.0}  # normalized: a 1, b .5, c 0


DENSE = {"b": 0.9, "c": 0.5, "d": 0.1}  # normalized: b 1, c .5, d 0


def test_minmax_alpha_zero_is_lexical_only():
    fused = minmax_weighted(LEX, DENSE, 0)
    assert fused == [("a", 1.0), ("b", 0.5), ("c", 0.0), ("d", 0.0)]


def test_minmax_alpha_one_is_dense_only():
    fused = minmax_weighted(LEX, DENSE, 1.0)
    assert [k for k, _ in fused] == ["b", "c", "a", "d"]
    assert dict(fused) == pytest.approx({"b": 1.0, "c": 0.5, "a": 0.0, "d": 0.0})


def test_minmax_alpha_half():
    fused = minmax_weighted(LEX, DENSE, 0.5)
    assert [k for k, _ in fused] == ["b", "a", "c", "d"]
    assert dict(fused) == pytest.approx({"b": 0.75, "a": 0.5, "c": 0.25, "d": 0.0})


def test_minmax_weighted_general_alpha():
    fused = dict(minmax_weighted(LEX, DENSE, 0.3))
    assert fused["b"] == pytest.approx(0.3 * 1.0 + 0.7 * 0.5)
    assert fused["c"] == pytest.approx(0.3 * 0.5 + 0.7 * 0.0)
    assert fused["a"] == pytest.approx(0.7)
    assert fused["d"] == pytest.approx(0.0)


def test_minmax_equal_scores_normalize_to_one():
    fused = dict(minmax_weighted({"a": 3.0, "b": 3.0}, {"c": 7.0}, 0.5))
    assert fused == {"a": 0.5, "b": 0.5, "c": 0.5}
    assert minmax_weighted({"only": -2.0}, {}, 0.25) == [("only", 0.75)]
    assert minmax_weighted({}, {}, 0.5) == []


def test_minmax_ties_by_first_appearance():
    fused = minmax_weighted({"x": 1.0, "y": 0.0}, {"y": 1.0, "x": 0.0, "z": 0.5}, 0.5)
    assert [k for k, _ in fused] == ["x", "y", "z"]


@pytest.mark.parametrize("alpha", [-0.1, 1.1, math.nan, "0.5", True, None])
def test_minmax_validates_alpha(alpha):
    with pytest.raises(InvalidInput):
        minmax_weighted(LEX, DENSE, alpha)


def test_minmax_validates_scores():
    with pytest.raises(InvalidInput, match="lexical"):
        minmax_weighted({"a": math.nan}, {}, 0.5)
    with pytest.raises(InvalidInput, match="dense"):
        minmax_weighted({}, {"a": math.inf}, 0.5)


@given(lex=st.dictionaries(st.integers(0, 30), st.floats(0.01, 50, allow_nan=False), max_size=12),
       den=st.dictionaries(st.integers(0, 30), st.floats(0.001, 1, allow_nan=False), max_size=12),
       alpha=st.sampled_from([0.0, 0.2, 0.3, 0.5, 1.0]))
@settings(max_examples=40, deadline=None)
def test_numpy_minmax_weighted_equals_reference(lex, den, alpha):
    pools = [(np.array(list(d), np.int64), np.array(list(d.values()), np.float64)) for d in (lex, den)]
    ids, fused = fusion.minmax_weighted_pools(pools[0], pools[1], alpha)
    assert list(zip(ids.tolist(), fused.tolist())) == minmax_weighted(lex, den, alpha)


# -- the adaptive weight ---------------------------------------------------------------------


def test_query_language():
    assert fusion.query_language("how are deleted documents handled") == "en"
    assert fusion.query_language("删除文档后分数会变吗") == "zh"
    assert fusion.query_language("ragdb 的 BM25 分数怎么算") == "zh"
    assert fusion.query_language("ragdb BM25 score of 分") == "en"
    assert fusion.query_language("1234 ???") == "en"


@given(base=st.floats(0, 1), c1=st.floats(0, 1), c2=st.floats(0, 1))
def test_adaptive_alpha_is_bounded_and_falls_with_coverage(base, c1, c2):
    lo, hi = sorted((c1, c2))
    a_lo, a_hi = fusion.adaptive_alpha(base, lo), fusion.adaptive_alpha(base, hi)
    assert base <= a_hi <= a_lo <= max(base, fusion.LOW_COVERAGE_ALPHA)
    assert fusion.adaptive_alpha(base, fusion.COVERAGE_HIGH) == base
    assert fusion.adaptive_alpha(base, 0.0) == max(base, fusion.LOW_COVERAGE_ALPHA)


def test_adaptive_alpha_refuses_bad_input():
    with pytest.raises(InvalidInput):
        fusion.adaptive_alpha(1.5, 0.2)
    with pytest.raises(InvalidInput):
        fusion.adaptive_alpha(0.3, float("nan"))


def test_base_alpha_per_model_and_language():
    assert fusion.base_alpha("wordllama-l2-supercat-256", "pump") == fusion.FITTED_ALPHA["wordllama-l2-supercat-256"]["en"]
    assert fusion.base_alpha("unknown-model", "泵") == fusion.GENERIC_ALPHA["zh"]
