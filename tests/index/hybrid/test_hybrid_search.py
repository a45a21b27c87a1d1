"""Hybrid search through a database: the lexical and vector pools fused (weighted, RRF, and
the default, adaptive), filters, access and versions on both sides, no padding with
irrelevant chunks, scores equal to the reference fusion, the adaptive weight, confidence,
the arguments checked, and an embedding endpoint end to end."""

from __future__ import annotations

import json

import pytest

import ragdb
from ragdb.errors import EmbeddingError, InvalidInput
from ragdb.index import fusion
from ragdb.index.fusion import minmax_weighted, rrf
from ragdb.models.embeddings import HashEmbedder, OpenAIEmbedder
from ragdb.options import DEFAULT_FUSION, SearchOptions
from vector_helpers import DOCS, cosine, fill, hybrid_search, vector_search


@pytest.fixture
def emb():
    return HashEmbedder(64)


@pytest.fixture
def db(emb):
    with ragdb.open(":memory:") as d:
        fill(d)
        assert d.embed(emb) == len(DOCS)
        yield d


def relevant(db, emb, query, hit):
    """A hit is relevant when it matches lexically or has positive cosine."""
    lexical = {h.chunk_id for h in db.search(query, k=100)}
    return hit.chunk_id in lexical or cosine(emb, query, hit.text) > 0


# -- weighted and RRF fusion --------------------------------------------------------------------


@pytest.mark.parametrize("fusion", ["weighted", "rrf"])
def test_hybrid_filters_apply_to_both_sides(db, emb, fusion):
    found = 0
    for query in ("cat on the mat", "the cat on the mat Katze", "dogs in the park"):
        everything = {h.source for h in hybrid_search(db, query, 10, emb, fusion=fusion)}
        for filt in ({"lang": "de"}, {"team": "x"}, {"source": "e.md"}, {"team": "y", "lang": "en"}):
            hits = hybrid_search(db, query, 10, emb, fusion=fusion, filter=filt)
            allowed = {d.source for d in db.documents()
                       if all(d.source == v if k == "source" else db.get(d.id).metadata.get(k) == v
                              for k, v in filt.items())}
            assert {h.source for h in hits} <= allowed
            # the filter is applied before the cut: every allowed candidate still comes back
            assert {h.source for h in hits} == everything & allowed
            found += len(hits)
    assert found > 5
    assert [h.source for h in vector_search(db, "cat on the mat Katze", 10, emb, filter={"lang": "de"})] == ["d.md"]
    assert hybrid_search(db, "cat", 10, emb, fusion=fusion, filter={"lang": "fr"}) == []
    # unlabeled documents are public (public_unlabeled, the default): "nobody" sees what everyone sees;
    # with the setting off, a caller without a matching label sees nothing, on either side
    public = hybrid_search(db, "cat", 10, emb, fusion=fusion)
    assert public and hybrid_search(db, "cat", 10, emb, fusion=fusion, principals=["nobody"]) == public
    db.set_public_unlabeled(False)
    assert hybrid_search(db, "cat", 10, emb, fusion=fusion, principals=["nobody"]) == []
    assert hybrid_search(db, "cat", 10, emb, fusion=fusion) == []
    assert hybrid_search(db, "cat", 10, emb, fusion=fusion, principals=ragdb.ALL) == public


@pytest.mark.parametrize("fusion", ["weighted", "rrf"])
def test_hybrid_never_pads_with_zero_relevance(db, emb, fusion):
    for query in ("cat on the mat", "quantum", "Katze", "nothing matches zzz qqq", "door floor fabric"):
        hits = hybrid_search(db, query, 10, emb, fusion=fusion)
        assert len(hits) < len(DOCS) or query == "cat on the mat"
        for h in hits:
            assert relevant(db, emb, query, h), (query, h.source)
        for h in vector_search(db, query, 10, emb):
            assert h.score > 0 and h.score == pytest.approx(cosine(emb, query, h.text), abs=1e-6)
    assert hybrid_search(db, "   ", 5, emb, fusion=fusion) == []


def test_hybrid_scores_match_the_reference_fusion(db, emb):
    query = "the cat and the mat"
    lex = {h.chunk_id: h.score for h in db.search(query, k=100)}
    dense = {h.chunk_id: h.score for h in vector_search(db, query, 100, emb)}
    for alpha in (0.0, 0.3, 1.0):
        want = minmax_weighted(lex, dense, alpha)
        got = hybrid_search(db, query, 100, emb, fusion="weighted", alpha=alpha)
        assert sorted((h.chunk_id, h.score) for h in got) == sorted(want)
    lex_rank = [h.chunk_id for h in db.search(query, k=100)]
    dense_rank = [h.chunk_id for h in vector_search(db, query, 100, emb)]
    want = dict(rrf([lex_rank, dense_rank], k=60))
    got = hybrid_search(db, query, 100, emb, fusion="rrf")
    assert {h.chunk_id: h.score for h in got} == want
    # explain shows both raw scores
    top = hybrid_search(db, query, 1, emb, explain=True)[0]
    assert top.explain["lexical:bm25"] == lex[top.chunk_id]
    assert top.explain["vector:cosine"] == dense[top.chunk_id]
    assert top.explain["cat"] > 0


def test_hybrid_arguments_are_checked(db, emb):
    for kwargs in ({"fusion": "max"}, {"alpha": 1.5}, {"alpha": True}, {"rrf_k": -1}, {"pool": 0},
                   {"lexical": "hybrid"}, {"versions": "some"}, {"min_score": "x"}, {"filter": []}):
        with pytest.raises(InvalidInput):
            hybrid_search(db, "cat", 5, emb, **kwargs)
    for k in (0, 10_001, True, 2.0):
        with pytest.raises(InvalidInput):
            hybrid_search(db, "cat", k, emb)
        with pytest.raises(InvalidInput):
            vector_search(db, "cat", k, emb)
    with pytest.raises(InvalidInput):
        vector_search(db, 42, 5, emb)  # type: ignore[arg-type]


def test_hybrid_versions_and_min_score(emb):
    with ragdb.open(":memory:", keep_versions=True) as d:
        d.add("old cat text about mats", source="v", version="1", timestamp="2020-01-01T00:00:00Z")
        d.add("new dog text about parks", source="v", version="2", timestamp="2021-01-01T00:00:00Z")
        d.embed(emb)
        assert {h.version for h in hybrid_search(d, "cat mats", 5, emb)} <= {"2"}
        assert {h.version for h in hybrid_search(d, "cat mats", 5, emb, versions="all")} >= {"1"}
        assert [h.version for h in hybrid_search(d, "cat mats", 5, emb, as_of="2020-06-01T00:00:00Z")] == ["1"]
        hits = hybrid_search(d, "cat mats", 5, emb, versions="all", min_score=0.5)
        assert hits and all(h.score >= 0.5 for h in hits)


# -- adaptive fusion (the default) ---------------------------------------------------------------


def test_default_fusion_is_adaptive_and_alpha_is_its_base():
    assert DEFAULT_FUSION == "adaptive"
    assert SearchOptions(scorer="hybrid").fusion_method == "adaptive"
    SearchOptions(scorer="hybrid", alpha=0.4)  # the base weight
    with pytest.raises(InvalidInput, match="'weighted' or fusion 'adaptive' only"):
        SearchOptions(scorer="hybrid", fusion="rrf", alpha=0.4)


PUMP_DOCS = [("pump.md", "The pump starts when the valve opens and pressure rises."),
        ("seal.md", "Replace the seal of the pump every spring."),
        ("cat.md", "The cat sleeps on the warm mat by the door."),
        ("tea.md", "Green tea is brewed at eighty degrees for two minutes.")]


@pytest.fixture
def hashed(tmp_path):
    with ragdb.open(tmp_path / "kb.db", embedder=HashEmbedder(64)) as db:
        for source, text in PUMP_DOCS:
            db.add(text, source=source, chunker="none")
        yield db


def test_adaptive_weight_is_the_base_when_bm25_covers_the_query(hashed):
    hits = hashed.search("pump valve pressure", k=3, scorer="hybrid", explain=True)
    assert hits[0].source == "pump.md"
    assert hits[0].explain["fusion:alpha"] == pytest.approx(fusion.GENERIC_ALPHA["en"])
    fixed = hashed.search("pump valve pressure", k=3, scorer="hybrid", fusion="weighted",
                          alpha=fusion.GENERIC_ALPHA["en"])
    assert [(h.chunk_id, h.score) for h in hits] == [(h.chunk_id, h.score) for h in fixed]


def test_adaptive_weight_rises_when_bm25_covers_little(hashed):
    # one known term among many unknown ones: low lexical coverage
    hits = hashed.search("pump zqx wvy kjh plm", k=3, scorer="hybrid", explain=True)
    assert hits and hits[0].explain["fusion:alpha"] == pytest.approx(fusion.LOW_COVERAGE_ALPHA)
    # nothing matched lexically: the vector ranking alone
    only = hashed.search("zqx wvy", k=4, scorer="hybrid")
    vec = hashed.search("zqx wvy", k=4, scorer="vector")
    assert [h.chunk_id for h in only] == [h.chunk_id for h in vec]


def test_explicit_alpha_sets_the_base_of_adaptive(hashed):
    hits = hashed.search("pump valve pressure", k=3, scorer="hybrid", alpha=0.6, explain=True)
    assert hits[0].explain["fusion:alpha"] == pytest.approx(0.6)


def test_hybrid_confidence_is_the_chunks_lexical_confidence(hashed):
    for q in ("pump valve pressure", "seal spring", "warm door tea", "zqx pump"):
        lexical = {h.chunk_id: h.confidence for h in hashed.search(q, k=10)}
        for fusion_name in ("adaptive", "rrf"):
            for h in hashed.search(q, k=10, scorer="hybrid", fusion=fusion_name):
                assert h.confidence == pytest.approx(lexical.get(h.chunk_id, 0.0), abs=1e-9)


# -- an OpenAI-compatible embedding endpoint -----------------------------------------------------


def test_hybrid_end_to_end_over_http(httpserver):
    from werkzeug import Response

    local = HashEmbedder(32)
    seen = []

    def handler(request):
        body = request.get_json()
        seen.append(len(body["input"]))
        vecs = local.embed(body["input"])
        data = [{"object": "embedding", "index": i, "embedding": v.tolist()} for i, v in enumerate(vecs)]
        return Response(json.dumps({"object": "list", "data": data[::-1], "model": body["model"]}),
                        content_type="application/json")

    httpserver.expect_request("/v1/embeddings", method="POST").respond_with_handler(handler)
    remote = OpenAIEmbedder(base_url=httpserver.url_for("/v1"), model="tiny", dimensions=32, max_retries=0)
    with ragdb.open(":memory:") as d:
        fill(d)
        assert d.embed(remote, batch_size=2) == len(DOCS)
        assert seen[:3] == [2, 2, 1]
        with d._store.read():
            assert d._store.vector_model()["model"] == "openai:tiny"
        for fusion in ("weighted", "rrf"):
            hits = hybrid_search(d, "cat on the mat", 3, remote, fusion=fusion, filter={"lang": "en"})
            assert hits[0].source == "a.md" and all(h.metadata["lang"] == "en" for h in hits)
        v = vector_search(d, DOCS[2][1], 1, remote)
        assert v[0].source == "c.md" and v[0].score == pytest.approx(1.0)
        # the endpoint failing while adding leaves the chunk pending, not half-added
        httpserver.clear()
        httpserver.expect_request("/v1/embeddings").respond_with_data("overloaded", status=503)
        d.add("A new document about cats.", source="g.md")
        with pytest.raises(EmbeddingError, match="1 chunks are pending"):
            d.embed(remote)
        assert d.search("new document")[0].source == "g.md"
        with pytest.raises(EmbeddingError, match="503"):
            hybrid_search(d, "cats", 3, remote)


@pytest.mark.parametrize("collapse", [False, True])
def test_a_phrase_restricts_the_vector_candidates_before_the_cut(collapse):
    """A phrase was checked on the k most similar chunks only: when they lacked it and others
    held it, a vector search returned fewer than k hits (none at k=1), and hybrid's dense pool
    held fewer than its size. The chunks without the phrase are left out before the cut now,
    as a filter's are (found by tests/index/test_random_vectors.py at 200 examples)."""
    emb = HashEmbedder(32)
    with ragdb.open(":memory:", chunker="none") as db:
        # 40 chunks with every word of the query but not the phrase, then the phrase in two
        db.add_many([{"text": f"note apple model {i}", "source": f"near{i}"} for i in range(40)]
                    + [{"text": "zebra apple note giraffe", "source": "phrase1"},
                       {"text": "apple note", "source": "phrase2"}])
        db.embed(emb)
        holders = sorted(["phrase1", "phrase2"], key=lambda s: -cosine(emb, "apple note model", db.get(source=s).text))
        for k in (1, 2, 5):
            got = [h.source for h in db.search('"apple note" model', k=k, scorer="vector", embedder=emb,
                                                collapse=collapse)]
            assert got == holders[:k], k
            hits = db.search('"apple note" model', k=k, scorer="hybrid", embedder=emb, collapse=collapse, pool=4,
                             explain=True)
            assert sorted(h.source for h in hits) == sorted(holders[:k]), k
            assert all("vector:cosine" in h.explain for h in hits), k  # (in the dense pool: its 4 best with the phrase)


@pytest.mark.parametrize("scorer", ["vector", "hybrid"])
def test_a_vector_search_embeds_the_words_that_score(scorer):
    """The query embedded was the whole query text: 'pump -seal' pulled the similarity toward
    'seal', and 'pump seal lang:en' embedded 'lang:en' (so it differed from filter=). Now the
    words and phrases that score are embedded; plain words stay as they are."""
    emb = HashEmbedder(32)
    with ragdb.open(":memory:", chunker="none") as db:
        db.add_many([{"text": "pump valve", "source": "a", "metadata": {"lang": "en"}},
                     {"text": "pump seal", "source": "b", "metadata": {"lang": "zh"}},
                     {"text": "pump ring seal", "source": "c", "metadata": {"lang": "en"}},
                     {"text": "other words entirely", "source": "d", "metadata": {"lang": "en"}}])
        db.embed(emb)

        def seen(query, **kw):
            return [(h.source, h.score) for h in db.search(query, scorer=scorer, embedder=emb, k=10, **kw)]

        assert seen("pump seal lang:en") == seen("pump seal -zzqq", filter={"lang": "en"}) \
            == seen("pump seal", filter={"lang": "en"})
        assert seen("pump -source:d") == seen("pump", filter={"$not": {"source": "d"}})
        if scorer == "vector":  # (hybrid scores are min-max over the pool: an exclusion changes them)
            assert seen("pump -seal") == [(s, v) for s, v in seen("pump") if s in ("a", "d")]
        assert seen("lang:en -seal") == []  # no word to embed or score
