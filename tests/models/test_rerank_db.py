"""Database.search(reranker=...) against a real loopback /rerank server."""

from __future__ import annotations

import orjson
from werkzeug import Request, Response

import ragdb
from ragdb.models.rerank import HTTPReranker


def test_search_reranks_first_stage_hits(httpserver):
    def handler(request: Request) -> Response:
        body = orjson.loads(request.data)
        # a "cross-encoder" that prefers texts mentioning penguins
        scores = [{"index": i, "score": (2.0 if "penguin" in t else 0.1) + i * 0.001}
                  for i, t in enumerate(body["texts"])]
        return Response(orjson.dumps(scores), content_type="application/json")

    httpserver.expect_request("/rerank", method="POST").respond_with_handler(handler)
    with ragdb.open(":memory:") as db:
        db.add("birds birds birds birds fly south", source="a")
        db.add("birds that swim: the penguin", source="b", metadata={"team": "x"})
        db.add("birds of prey", source="c", metadata={"team": "x"})
        plain = db.search("birds", k=3)
        assert plain[0].source == "a"
        reranked = db.search("birds", k=2, reranker=HTTPReranker(base_url=httpserver.url_for("")))
        assert [h.source for h in reranked][0] == "b" and len(reranked) == 2
        assert reranked[0].score > 1.0
        # filters apply to the first stage: the reranker never sees filtered-out chunks
        only_x = db.search("birds", k=5, filter={"team": "x"}, reranker=HTTPReranker(base_url=httpserver.url_for("")))
        assert {h.source for h in only_x} == {"b", "c"}


def test_cli_search_rerank_url(httpserver, tmp_path):
    from click.testing import CliRunner

    from ragdb.cli import cli

    httpserver.expect_request("/rerank", method="POST").respond_with_json(
        [{"index": 0, "score": 0.1}, {"index": 1, "score": 0.9}])
    db = str(tmp_path / "kb.db")
    with ragdb.open(db) as d:
        d.add("birds birds birds fly", source="a")
        d.add("birds swim", source="b")
    result = CliRunner().invoke(cli, ["-d", db, "search", "birds", "-k", "2", "--rerank-url",
                                      httpserver.url_for(""), "--json"])
    assert result.exit_code == 0, result.output
    rows = orjson.loads(result.output)
    assert [r["source"] for r in rows] == ["b", "a"]


def test_a_reranker_answer_that_does_not_fit_its_hits_is_a_rerank_error():
    """A reranker is the caller's code: what it returns is checked. None, a string, a hit it
    was not given (one the caller's principals may not see), a hit twice or a score that is
    not a number is a RerankError naming the problem (it was an InternalError calling it a
    bug in ragdb, or the hit passed through)."""
    import dataclasses

    import pytest

    from ragdb.errors import RerankError

    with ragdb.open(":memory:") as db:
        db.add("birds fly south", source="a")
        db.add("birds swim", source="b")
        hidden = db.add("birds of the board", source="secret", acl=["board"])
        secret = db.search("birds", principals=ragdb.ALL, filter={"source": "secret"})[0]
        assert secret.doc_id == hidden.id

        class Returns:
            def __init__(self, make):
                self.make = make

            def rerank(self, query, hits, top_n=None):
                return self.make(list(hits))

        for make, words in ((lambda hits: None, "returned NoneType"),
                            (lambda hits: [1], "returned int at position 0"),
                            (lambda hits: [secret, *hits], "not one of the hits it was given"),
                            (lambda hits: hits + hits[:1], "there twice"),
                            (lambda hits: [dataclasses.replace(hits[0], score=float("nan"))], "not a number")):
            with pytest.raises(RerankError, match=words):
                db.search("birds", reranker=Returns(make))
        kept = db.search("birds", reranker=Returns(lambda hits: hits[::-1]))
        assert [h.source for h in kept] == [h.source for h in db.search("birds")][::-1]
        import numpy as np  # a model's scores are often numpy scalars: numbers all the same

        scored = db.search("birds", reranker=Returns(lambda hits: [dataclasses.replace(h, score=np.float32(1 / (i + 1)))
                                                                   for i, h in enumerate(hits)]))
        assert [float(h.score) for h in scored] == [1.0, 0.5]
        assert not db.build_prompt("birds?", hits=scored, min_confidence=0).refused
