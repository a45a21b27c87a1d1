"""No query a caller sends stalls the engine (issue 32): vocabulary lookups in batches,
did-you-mean on analyzed terms, a budget on expansions per query."""

from __future__ import annotations

import tracemalloc

import pytest

import ragdb
from ragdb.index import inverted


@pytest.fixture(scope="module")
def kb(tmp_path_factory):
    with ragdb.open(tmp_path_factory.mktemp("bounds") / "kb.db", chunker="none") as db:
        db.add_many([{"source": f"d{i}.md", "text": f"the quick queue quiet word{i} 检索增强"} for i in range(50)])
        yield db


def test_vocabulary_lookups_past_the_cache_size_answer(kb, monkeypatch):
    """lookup_terms cleared its cache and called itself with the same terms when they did
    not fit: past 200,000 distinct terms it recursed forever (issue 32, item 2)."""
    monkeypatch.setattr(inverted, "LOOKUP_CACHE_TERMS", 40)
    monkeypatch.setattr(inverted, "_LOOKUP_BATCH", 7)
    index = kb._engine.index
    asked = ["quick"] + [f"absent{i}" for i in range(100)] + ["word3", "queue", "quick"]
    with kb._engine.store.read():
        kb._engine.sync()
        found = index.lookup_terms(asked)
        assert list(found) == ["quick", "word3", "queue"]
        assert found == index.lookup_terms(["quick", "word3", "queue"])  # cached or not, the same
    assert kb.search("quick queue word3", k=1)


def test_suggestions_of_a_long_fuzzy_word_work_on_its_analyzed_terms(kb):
    """query_plan of a 3,000-letter fuzzy word made every edit of the raw word (quadratic
    in memory: 650 MB, then 200,000+ lookups). Edits are of analyzed terms (at most 64
    characters) now."""
    tracemalloc.start()
    try:
        plan = kb.query_plan("q" * 1000 + "~")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert plan.unknown == ("q" * 1000 + "~",)
    assert peak < 30 << 20, peak
    assert kb.query_plan("qiuet~ zzzz").suggestions == {}  # qiuet~ expands to quiet: known
    assert kb.query_plan("quikk").suggestions == {"quikk": ("quick",)}
    assert kb.query_plan("qxyzt~").unknown == ("qxyzt~",)


def test_expansions_of_one_query_have_a_budget_the_plan_states(kb, monkeypatch):
    """1,000 two-letter prefixes expanded to 64,000 terms (3.1 s warm on 20,000 documents;
    issue 32, item 3): the query's prefix and fuzzy words share MAX_QUERY_EXPANSIONS terms,
    and the plan says which word was cut or searched as written."""
    from ragdb.query import language

    full = kb.query_plan("qu* wor*")
    assert len(full.expansions["wor*"]) == 50 and full.dropped == ()
    monkeypatch.setattr(language, "MAX_QUERY_EXPANSIONS", 5)
    plan = kb.query_plan("qu* wor* quie~")
    assert len(plan.expansions["qu*"]) == 3 and len(plan.expansions["wor*"]) == 2
    assert "quie~" not in plan.expansions
    assert [w for w, _why in plan.dropped] == ["wor*", "quie~"]
    assert "expanded to 2 of its 50 index terms" in plan.dropped[0][1]
    assert "searched as written" in plan.dropped[1][1]
    hits = kb.search("qu* wor* quie~", k=100)
    assert {h.source for h in hits} == {f"d{i}.md" for i in range(50)}  # qu* alone matches every document
    assert sum(len(t) for t in kb.query_plan(" ".join(f"w{c}*" for c in "abcdefghijklmnopqrstuvwxyz")
                                            ).expansions.values()) <= 5
