"""Database.search_and_plan: the hits and the plan of one query from one derivation of its
terms in one snapshot (what ``ragdb search`` shows) equal search() and query_plan() called
apart, for every kind of query and restriction."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ragdb
from ragdb.models.embeddings import HashEmbedder

DOCS = [
    ("docs/pumps.md", "# Pumps\n\nThe pump starts slowly; close the valve first.", {"team": "ops", "year": 2025}, []),
    ("docs/valves.md", "# Valves\n\nA valve that sticks needs grease, not force.", {"team": "ops", "year": 2026}, ["staff"]),
    ("docs/zh.md", "检索增强生成先检索证据，再生成答案。", {"team": "ml", "year": 2026}, []),
    ("notes/draft.md", "Draft: pumps and valves, to be written.", {"team": "ml"}, []),
]
QUERIES = ["pump valve", '"close the valve"', "valve -grease", "pum*", "valv~", "title:pumps", "team:ops pump",
           "检索 证据", "what is the capital of France", "", "pump OR 答案", "(pump AND valve) -draft"]
OPTIONS = [{}, {"scorer": "tfidf"}, {"principals": ["staff"]}, {"principals": ragdb.ALL, "k": 2, "offset": 1},
           {"filter": {"year": {"$gte": 2026}}, "principals": ragdb.ALL}, {"explain": True, "highlight": True},
           {"fuzzy": 1}, {"syntax": "plain"}, {"scorer": "hybrid", "embedder": HashEmbedder(32)},
           {"scorer": "vector", "embedder": HashEmbedder(32), "highlight": True}]


@pytest.fixture(scope="module")
def kb(tmp_path_factory):
    with ragdb.open(tmp_path_factory.mktemp("sp") / "kb.db", chunker="none") as db:
        for source, text, meta, acl in DOCS:
            db.add(text, source=source, metadata=meta, acl=acl)
        db.embed(HashEmbedder(32))
        yield db


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(query=st.sampled_from(QUERIES), options=st.sampled_from(OPTIONS))
def test_search_and_plan_equal_search_and_query_plan(kb, query, options):
    hits, plan = kb.search_and_plan(query, **options)
    assert hits == kb.search(query, **options)
    assert plan == kb.query_plan(query, **{k: v for k, v in options.items() if k not in ("k", "offset")})


def test_bad_options_are_input_errors(kb):
    with pytest.raises(ragdb.errors.InvalidInput):
        kb.search_and_plan("pump", k=0)
