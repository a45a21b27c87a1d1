"""Rerankers (ragdb.models.rerank): the HTTP /rerank client against a real loopback server, and the
cross-encoder's missing dependency (fusion arithmetic: tests/index/hybrid/test_fusion_arithmetic.py)."""

from __future__ import annotations

import json
import sys

import pytest
from werkzeug import Request, Response

from ragdb.errors import EmbeddingError, InvalidInput, MissingDependency, RemoteError, RerankError
from ragdb.models.rerank import CrossEncoderReranker, HTTPReranker, Reranker
from ragdb.types import Hit

SECRET = "rr-key-SECRET-9876543210"


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


def test_http_reranker_integer_score_past_any_float(httpserver):
    """A score that is a JSON integer too large for a float is no finite score (math.isfinite
    raised OverflowError, which escaped)."""
    rr = HTTPReranker(httpserver.url_for(""), max_retries=0)
    big = "9" * 400
    httpserver.expect_request("/rerank").respond_with_data(
        f'[{{"index": 0, "score": {big}}}, {{"index": 1, "score": 1.0}}]', content_type="application/json")
    with pytest.raises(RerankError, match="result 0 has no finite 'score'"):
        rr.rerank("q", make_hits(["a", "b"]))


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
