"""Tests of ragdb.index.fusion and ragdb.models.rerank (HTTP tests use a real loopback server)."""

from __future__ import annotations

import json
import math
import sys

import pytest
from werkzeug import Request, Response

from ragdb.errors import EmbeddingError, InvalidInput, MissingDependency, RemoteError, RerankError
from ragdb.index.fusion import minmax_weighted, rrf
from ragdb.models.rerank import CrossEncoderReranker, HTTPReranker, Reranker
from ragdb.types import Hit

SECRET = "rr-key-SECRET-9876543210"


# ------------------------------------------------------------------- rrf


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


# ------------------------------------------------------ minmax_weighted

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


# --------------------------------------------------------------- rerank


def make_hits(texts):
    return [
        Hit(
            score=1.0 / (i + 1),
            chunk_id=100 + i,
            doc_id=10 + i,
            source=f"doc{i}.txt",
            version=None,
            timestamp=None,
            text=t,
            start=0,
            end=len(t),
            ordinal=0,
            metadata={"n": i, "tag": ["x"]},
            explain={"term": 0.5},
        )
        for i, t in enumerate(texts)
    ]


TEXTS = ["apples are red", "bananas are yellow", "cherries are dark red"]


def _score(text: str) -> float:
    """A fake cross-encoder: longer text, higher score."""
    return len(text) / 100.0


def test_http_reranker_tei_style(httpserver):
    seen: list = []

    def handler(request: Request) -> Response:
        body = request.get_json()
        seen.append(body)
        results = [{"index": i, "score": _score(t)} for i, t in enumerate(body["texts"])]
        results.sort(key=lambda r: -r["score"])  # TEI answers best first
        return Response(json.dumps(results), content_type="application/json")

    httpserver.expect_request("/rerank", method="POST").respond_with_handler(handler)
    rr = HTTPReranker(httpserver.url_for("/"))
    assert isinstance(rr, Reranker)
    assert rr.style == "tei"
    hits = make_hits(TEXTS)
    out = rr.rerank("which fruit is red", hits)
    assert seen == [{"query": "which fruit is red", "texts": TEXTS, "truncate": True}]
    assert [h.text for h in out] == ["cherries are dark red", "bananas are yellow", "apples are red"]
    assert [h.score for h in out] == [_score(h.text) for h in out]
    by_id = {h.chunk_id: h for h in hits}
    for h in out:
        original = by_id[h.chunk_id]
        assert h.metadata == original.metadata and h.metadata is original.metadata
        assert (h.doc_id, h.source, h.text, h.start, h.end) == (
            original.doc_id,
            original.source,
            original.text,
            original.start,
            original.end,
        )
    assert [h.text for h in rr.rerank("q", hits, top_n=1)] == ["cherries are dark red"]


def test_http_reranker_cohere_style(httpserver):
    seen: list = []

    def handler(request: Request) -> Response:
        body = request.get_json()
        seen.append(body)
        results = [
            {"index": i, "relevance_score": _score(t)} for i, t in enumerate(body["documents"])
        ]
        results.sort(key=lambda r: -r["relevance_score"])
        results = results[: body.get("top_n", len(results))]
        return Response(json.dumps({"id": "x", "results": results}), content_type="application/json")

    httpserver.expect_request("/v1/rerank").respond_with_handler(handler)
    rr = HTTPReranker(httpserver.url_for("/v1"), model="rerank-v3", api_key=SECRET)
    assert rr.style == "cohere"
    out = rr.rerank("red fruit", make_hits(TEXTS), top_n=2)
    assert seen[0] == {"query": "red fruit", "documents": TEXTS, "model": "rerank-v3", "top_n": 2}
    assert [h.text for h in out] == ["cherries are dark red", "bananas are yellow"]
    assert out[0].score == pytest.approx(_score("cherries are dark red"))
    request, _ = httpserver.log[0]
    assert request.headers["Authorization"] == f"Bearer {SECRET}"
    assert SECRET not in repr(rr)


def test_http_reranker_accepts_either_reply_shape(httpserver):
    # a TEI-style request answered with a Cohere-style reply, and vice versa
    httpserver.expect_oneshot_request("/rerank").respond_with_json(
        {"results": [{"index": 1, "relevance_score": 0.9}, {"index": 0, "relevance_score": 0.2}]}
    )
    httpserver.expect_oneshot_request("/rerank").respond_with_json(
        [{"index": 0, "score": 0.7}, {"index": 1, "score": 0.1}]
    )
    rr_tei = HTTPReranker(httpserver.url_for(""), style="tei")
    rr_cohere = HTTPReranker(httpserver.url_for(""), style="cohere")
    hits = make_hits(["first", "second"])
    assert [h.text for h in rr_tei.rerank("q", hits)] == ["second", "first"]
    assert [h.text for h in rr_cohere.rerank("q", hits)] == ["first", "second"]
    assert "model" not in json.loads(httpserver.log[1][0].get_data())


def test_http_reranker_batches_and_ties(httpserver):
    bodies: list = []

    def handler(request: Request) -> Response:
        body = request.get_json()
        bodies.append(body)
        return Response(
            json.dumps([{"index": i, "score": _score(t)} for i, t in enumerate(body["texts"])]),
            content_type="application/json",
        )

    httpserver.expect_request("/rerank").respond_with_handler(handler)
    rr = HTTPReranker(httpserver.url_for(""), batch_size=2)
    texts = ["aaaa", "bb", "cccccc", "dd", "e"]
    out = rr.rerank("q", make_hits(texts), top_n=4)
    assert [len(b["texts"]) for b in bodies] == [2, 2, 1]
    # "bb" and "dd" tie: input order kept
    assert [h.text for h in out] == ["cccccc", "aaaa", "bb", "dd"]


def test_http_reranker_trivial_cases_make_no_request(httpserver):
    rr = HTTPReranker(httpserver.url_for(""))
    assert rr.rerank("q", []) == []
    assert rr.rerank("q", make_hits(["a"]), top_n=0) == []
    assert len(httpserver.log) == 0
    with pytest.raises(InvalidInput):
        rr.rerank("q", make_hits(["a"]), top_n=-1)
    with pytest.raises(InvalidInput):
        rr.rerank("q", ["not a hit"])
    with pytest.raises(InvalidInput):
        HTTPReranker(httpserver.url_for(""), style="other")


def test_http_reranker_errors(httpserver):
    rr = HTTPReranker(httpserver.url_for(""), api_key=SECRET, max_retries=0)
    hits = make_hits(["a", "b"])
    httpserver.expect_oneshot_request("/rerank").respond_with_data(
        f"bad key {SECRET}", status=401
    )
    with pytest.raises(RerankError, match="HTTP 401") as info:
        rr.rerank("q", hits)
    assert SECRET not in str(info.value)
    assert isinstance(info.value, RemoteError) and not isinstance(info.value, EmbeddingError)
    httpserver.expect_oneshot_request("/rerank").respond_with_json({"unexpected": True})
    with pytest.raises(RerankError, match="neither"):
        rr.rerank("q", hits)
    httpserver.expect_oneshot_request("/rerank").respond_with_json([{"index": 5, "score": 1.0}])
    with pytest.raises(RerankError, match="invalid index 5"):
        rr.rerank("q", hits)
    httpserver.expect_oneshot_request("/rerank").respond_with_json([{"index": 0, "score": 1.0}])
    with pytest.raises(RerankError, match="sent 2 documents but got 1"):
        rr.rerank("q", hits)
    httpserver.expect_oneshot_request("/rerank").respond_with_json(
        [{"index": 0, "score": None}, {"index": 1, "score": 1.0}]
    )
    with pytest.raises(RerankError, match="finite"):
        rr.rerank("q", hits)


def test_http_reranker_retries_503(httpserver):
    httpserver.expect_oneshot_request("/rerank").respond_with_data("busy", status=503)
    httpserver.expect_request("/rerank").respond_with_json(
        [{"index": 0, "score": 0.1}, {"index": 1, "score": 0.2}]
    )
    rr = HTTPReranker(httpserver.url_for(""), backoff=0.01)
    assert [h.text for h in rr.rerank("q", make_hits(["a", "b"]))] == ["b", "a"]
    assert len(httpserver.log) == 2


def test_http_reranker_env_defaults(monkeypatch, httpserver):
    monkeypatch.delenv("RAGDB_RERANK_BASE_URL", raising=False)
    with pytest.raises(InvalidInput, match="RAGDB_RERANK_BASE_URL"):
        HTTPReranker()
    monkeypatch.setenv("RAGDB_RERANK_BASE_URL", httpserver.url_for("/v2"))
    monkeypatch.setenv("RAGDB_RERANK_MODEL", "m")
    monkeypatch.setenv("RAGDB_RERANK_API_KEY", SECRET)
    rr = HTTPReranker()
    assert rr.style == "cohere" and rr.model == "m"
    assert SECRET not in repr(rr)


def test_cross_encoder_missing_dependency(monkeypatch):
    monkeypatch.setitem(sys.modules, "sentence_transformers", None)
    with pytest.raises(MissingDependency, match=r"ragdb\[sentence-transformers\]"):
        CrossEncoderReranker("/nonexistent/model")
