"""The public API of the stage split: SearchOptions/Restrictions, AddReport, update(),
delete()/documents() with filter=, get(source=).

Uses the shared ``db`` (an empty database file) and ``filled_db`` (the
``SMALL_DOCS`` of conftest) fixtures; the hypothesis properties open their own
databases (in memory, or in a temporary folder when a second connection is needed).
"""

from __future__ import annotations

import collections.abc
import dataclasses
import fnmatch
import json
import math
import re
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ragdb
from ragdb import AddReport, Change, Document, Restrictions, SearchOptions
from ragdb.models.embeddings import HashEmbedder
from ragdb.errors import DocumentNotFound, InvalidInput, RagdbError

PROPERTY = settings(max_examples=60, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


# -- helpers ---------------------------------------------------------------------------
def generation(db: ragdb.Database) -> int:
    """The write generation of the file (every write transaction that changed something bumps it)."""
    with db._store.read():
        return db._store.generation()


def fingerprint(hits):
    return [(h.source, h.start, h.end, h.text, h.score, dict(h.metadata)) for h in hits]


def snapshot(db: ragdb.Database):
    """Everything a failed call must leave as it was (the full view: every document, whatever its labels)."""
    st_ = db.stats()
    return (generation(db), [dataclasses.astuple(d) for d in db.documents(versions="all", principals=ragdb.ALL)],
            (st_.documents, st_.chunks, st_.vocabulary, st_.postings, st_.stored_documents, st_.stored_chunks),
            fingerprint(db.search("cat mat", k=50, principals=ragdb.ALL)))


class Reverser:
    """A reranker that puts the first-stage hits in reverse order, with scores 1, 2, ..."""

    def rerank(self, query, hits, top_n=None):
        out = [dataclasses.replace(h, score=float(i + 1)) for i, h in enumerate(hits)]
        out.reverse()
        return out[:top_n] if top_n is not None else out


class CountingEmbedder:
    """HashEmbedder that counts the document-embedding calls (queries are counted apart)."""

    def __init__(self, dimensions: int = 32) -> None:
        self.inner = HashEmbedder(dimensions)
        self.name = self.inner.name
        self.dimensions = dimensions
        self.calls = 0
        self.texts = 0
        self.queries = 0

    def embed(self, texts):
        self.calls += 1
        self.texts += len(texts)
        return self.inner.embed(texts)

    def embed_query(self, text):
        self.queries += 1
        return self.inner.embed_query(text)


@pytest.fixture
def vdb(filled_db):
    """``filled_db`` with vectors (HashEmbedder(32)) and that embedder as its own."""
    emb = HashEmbedder(32)
    assert filled_db.embed(emb) == 5
    filled_db.embedder = emb
    return filled_db


def src_of(db, source):
    return db.get(source=source, principals=ragdb.ALL)


#: The full view (every chunk, whatever its access labels): what the option tests below compare.
FULL = Restrictions(principals=ragdb.ALL)


# ======================================================================================
# SearchOptions
# ======================================================================================
INAPPLICABLE = [
    ("alpha", {"scorer": "bm25", "alpha": 0.7}),
    ("alpha", {"scorer": "tfidf", "alpha": 0.7}),
    ("alpha", {"scorer": "vector", "alpha": 0.7}),
    ("alpha", {"scorer": "hybrid", "fusion": "rrf", "alpha": 0.7}),
    ("fusion", {"scorer": "bm25", "fusion": "rrf"}),
    ("fusion", {"scorer": "tfidf", "fusion": "weighted"}),
    ("fusion", {"scorer": "vector", "fusion": "rrf"}),
    ("rrf_k", {"scorer": "bm25", "rrf_k": 10}),
    ("rrf_k", {"scorer": "vector", "rrf_k": 10}),
    ("rrf_k", {"scorer": "hybrid", "rrf_k": 10}),  # default fusion is weighted
    ("rrf_k", {"scorer": "hybrid", "fusion": "weighted", "rrf_k": 10}),
    ("pool", {"scorer": "bm25", "pool": 20}),
    ("pool", {"scorer": "tfidf", "pool": 20}),
    ("pool", {"scorer": "vector", "pool": 20}),
    ("k1", {"scorer": "tfidf", "k1": 1.2}),
    ("k1", {"scorer": "vector", "k1": 1.2}),
    ("b", {"scorer": "tfidf", "b": 0.5}),
    ("b", {"scorer": "vector", "b": 0.5}),
    ("embedder", {"embedder": HashEmbedder(8)}),  # default scorer bm25
    ("embedder", {"scorer": "bm25", "embedder": HashEmbedder(8)}),
    ("embedder", {"scorer": "tfidf", "embedder": "hash-8"}),
    ("rerank_top", {"rerank_top": 5}),
    ("rerank_top", {"scorer": "hybrid", "rerank_top": 5}),
]
INAPPLICABLE_IDS = [f"{name}-" + "-".join(f"{k}={v}" for k, v in kw.items() if k in ("scorer", "fusion"))
                    for name, kw in INAPPLICABLE]

# the same options where they do apply: accepted (so the refusals above are about applicability)
APPLICABLE = [
    {"scorer": "hybrid", "alpha": 0.7},
    {"scorer": "hybrid", "fusion": "weighted", "alpha": 0.7},
    {"scorer": "hybrid", "fusion": "rrf"},
    {"scorer": "hybrid", "fusion": "rrf", "rrf_k": 10},
    {"scorer": "hybrid", "pool": 20},
    {"scorer": "bm25", "k1": 1.2, "b": 0.5},
    {"scorer": "hybrid", "k1": 1.2, "b": 0.5},
    {"scorer": "vector", "embedder": HashEmbedder(32)},
    {"scorer": "hybrid", "embedder": HashEmbedder(32)},
    {"reranker": Reverser(), "rerank_top": 5},
    {"scorer": "vector", "reranker": Reverser(), "rerank_top": 5},
]


def assert_names(excinfo, name):
    message = str(excinfo.value)
    assert re.match(rf"{re.escape(name)}\b", message), f"message does not start with {name!r}: {message}"


@pytest.mark.parametrize("name,kw", INAPPLICABLE, ids=INAPPLICABLE_IDS)
def test_inapplicable_option_refused_by_value(name, kw):
    with pytest.raises(InvalidInput) as e:
        SearchOptions(**kw)
    assert_names(e, name)
    with pytest.raises(InvalidInput) as e:
        SearchOptions.from_keywords(**kw)
    assert_names(e, name)


@pytest.mark.parametrize("name,kw", INAPPLICABLE, ids=INAPPLICABLE_IDS)
def test_inapplicable_option_refused_by_search(vdb, name, kw):
    with pytest.raises(InvalidInput) as e:
        vdb.search("cat", **kw)
    assert_names(e, name)
    with pytest.raises(InvalidInput) as e:  # over an options value: validated again
        vdb.search("cat", options=SearchOptions(k=3), **kw)
    assert_names(e, name)
    with pytest.raises(InvalidInput) as e:
        vdb.build_prompt("cat", **kw)
    assert_names(e, name)

    class NeverCalled:
        def complete(self, messages):  # pragma: no cover - must not be reached
            raise AssertionError("the model was called")

    with pytest.raises(InvalidInput) as e:
        vdb.ask("cat", NeverCalled(), **kw)
    assert_names(e, name)


@pytest.mark.parametrize("kw", APPLICABLE, ids=lambda kw: "-".join(f"{k}" for k in kw))
def test_applicable_options_accepted(vdb, kw):
    opts = SearchOptions(**kw)
    assert opts == SearchOptions.from_keywords(**kw)
    assert isinstance(vdb.search("cat mat", options=opts), list)
    assert vdb.search("cat mat", **kw) == vdb.search("cat mat", options=opts)
    full = SearchOptions(**kw, restrictions=FULL)  # and over every document, whatever its labels
    assert vdb.search("cat mat", **kw, principals=ragdb.ALL) == vdb.search("cat mat", options=full)


@pytest.mark.parametrize("kw,name", [
    ({"alhpa": 0.5}, "alhpa"), ({"topk": 3}, "topk"), ({"scorer": "hybrid", "fusion_k": 3}, "fusion_k"),
    ({"filters": {"lang": "en"}}, "filters"), ({"principal": ["staff"]}, "principal"),
])
def test_unknown_keywords_refused(vdb, kw, name):
    for call in (lambda: vdb.search("cat", **kw), lambda: SearchOptions.from_keywords(**kw),
                 lambda: SearchOptions().replace(**kw), lambda: vdb.build_prompt("cat", **kw),
                 lambda: vdb.search("cat", options=SearchOptions(k=2), **kw)):
        with pytest.raises(InvalidInput, match=re.escape(name)):
            call()


def test_options_must_be_a_search_options_value(vdb):
    for bad in ({"k": 3}, Restrictions(), "k=3"):
        with pytest.raises(InvalidInput, match="options"):
            vdb.search("cat", options=bad)
    with pytest.raises(InvalidInput, match="restrictions"):
        SearchOptions(restrictions={"filter": {"lang": "en"}})
    with pytest.raises(InvalidInput, match="not both"):
        vdb.search("cat", restrictions=Restrictions(filter={"lang": "en"}), filter={"lang": "de"})


EQUIVALENT = [
    {"k": 2},
    {"k": 2, "scorer": "tfidf"},
    {"k": 5, "k1": 0.4, "b": 0.1, "explain": True},
    {"k": 5, "filter": {"lang": "en"}, "principals": ["staff"]},
    {"k": 4, "min_score": 0.2, "filter": {"team": "y"}},
    {"k": 5, "filter": {"source": "notes/*"}},
    {"k": 5, "scorer": "vector", "filter": {"tags": "pets"}},
    {"k": 2, "scorer": "vector", "explain": True},
    {"k": 5, "scorer": "hybrid", "alpha": 0.9, "pool": 2},
    {"k": 5, "scorer": "hybrid", "fusion": "rrf", "rrf_k": 1.0, "explain": True},
    {"k": 3, "reranker": Reverser(), "rerank_top": 4},
]
QUERY = "cat mat floor Katze"


@pytest.mark.parametrize("kw", EQUIVALENT, ids=lambda kw: "-".join(f"{k}" for k in kw))
def test_options_value_gives_exactly_the_keyword_hits(vdb, kw):
    kw = {"principals": ragdb.ALL, **kw}  # the full view, unless the case names its principals
    by_keywords = vdb.search(QUERY, **kw)
    opts = SearchOptions.from_keywords(**kw)
    assert vdb.search(QUERY, options=opts) == by_keywords
    restrict = {n: kw[n] for n in ("filter", "principals") if n in kw}
    others = {n: v for n, v in kw.items() if n not in restrict}
    built = SearchOptions(**others, restrictions=Restrictions(**restrict))
    assert built == opts
    assert vdb.search(QUERY, options=built) == by_keywords
    # the options made a difference (so the comparison above is not between two defaults)
    assert by_keywords
    assert fingerprint(by_keywords) != fingerprint(vdb.search(QUERY, principals=ragdb.ALL))


def test_options_effects(vdb):
    assert len(vdb.search(QUERY, options=SearchOptions(k=2, restrictions=FULL))) == 2
    hits = vdb.search(QUERY, options=SearchOptions(restrictions=Restrictions(filter={"lang": "en"},
                                                                           principals=("staff",))))
    # staff's documents and the public ones (unlabeled: public_unlabeled is on by default)
    assert hits and {h.source for h in hits} <= {"docs/cats.md", "docs/dogs.md", "notes/mats.txt"}
    assert "docs/cats.md" in {h.source for h in hits}
    explained = vdb.search(QUERY, options=SearchOptions(explain=True, restrictions=FULL))
    assert explained and all(h.explain for h in explained)
    reranked = vdb.search(QUERY, options=SearchOptions(k=3, reranker=Reverser(), rerank_top=4, restrictions=FULL))
    first = vdb.search(QUERY, k=4, principals=ragdb.ALL)
    assert [h.chunk_id for h in reranked] == [h.chunk_id for h in first][::-1][:3]


def test_keywords_override_options(vdb):
    base = SearchOptions(k=1, scorer="tfidf", restrictions=FULL)
    full = ragdb.ALL
    hits = vdb.search(QUERY, options=base, k=3)
    assert len(hits) == 3 and hits == vdb.search(QUERY, k=3, scorer="tfidf", principals=full)
    assert vdb.search(QUERY, 2, options=base) == vdb.search(QUERY, k=2, scorer="tfidf", principals=full)  # positional k
    # k=None: the options'
    assert vdb.search(QUERY, None, options=base) == vdb.search(QUERY, k=1, scorer="tfidf", principals=full)
    assert vdb.search(QUERY, options=base, scorer="bm25", k=3) == vdb.search(QUERY, k=3, principals=full)
    # a restriction keyword replaces that restriction only; the others stay
    opts = SearchOptions(k=10, restrictions=Restrictions(filter={"lang": "de"}, principals=("public",)))
    assert [h.source for h in vdb.search(QUERY, options=opts)] == ["notes/katze.txt"]
    overridden = vdb.search(QUERY, options=opts, filter={"lang": "en"})
    assert overridden == vdb.search(QUERY, filter={"lang": "en"}, principals=["public"])
    assert [h.source for h in overridden] == ["notes/mats.txt", "docs/dogs.md"]  # mats: unlabeled, public
    # the value given is not changed by the call
    assert opts.restrictions.filter == {"lang": "de"} and opts.k == 10
    # an override that makes a given option inapplicable is refused, naming it
    with pytest.raises(InvalidInput) as e:
        vdb.search(QUERY, options=SearchOptions(k1=1.5), scorer="tfidf")
    assert_names(e, "k1")
    with pytest.raises(InvalidInput) as e:
        vdb.search(QUERY, options=SearchOptions(scorer="hybrid", alpha=0.5), fusion="rrf")
    assert_names(e, "alpha")


# The prompt tests below compare prompts with searches: min_confidence=0 keeps the refusal
# floor (tests/answers/test_refusal.py) from dropping the weaker of these five small documents' hits.
def test_build_prompt_uses_options(vdb):
    opts = SearchOptions(restrictions=Restrictions(filter={"lang": "de"}, principals=ragdb.ALL))
    prompt = vdb.build_prompt(QUERY, options=opts, min_confidence=0)
    assert [h.source for h in prompt.sources] == ["notes/katze.txt"]
    assert prompt.sources == vdb.build_prompt(QUERY, filter={"lang": "de"}, principals=ragdb.ALL,
                                              min_confidence=0).sources
    tfidf = vdb.build_prompt(QUERY, options=SearchOptions(scorer="tfidf", restrictions=FULL), min_confidence=0)
    assert [h.score for h in tfidf.sources] == \
        [h.score for h in vdb.search(QUERY, k=5, scorer="tfidf", principals=ragdb.ALL)]
    assert [h.score for h in tfidf.sources] != \
        [h.score for h in vdb.build_prompt(QUERY, principals=ragdb.ALL, min_confidence=0).sources]
    # keyword k overrides the options' k
    assert len(vdb.build_prompt(QUERY, k=2, options=SearchOptions(k=4, restrictions=FULL),
                                min_confidence=0).sources) == 2
    hits = vdb.search(QUERY)
    with pytest.raises(InvalidInput, match="hits"):
        vdb.build_prompt(QUERY, hits, options=opts)


class EchoLLM:
    """A model that cites source [1] and records the messages it was given."""

    def __init__(self):
        self.messages = []

    def complete(self, messages):
        self.messages.append(messages)
        return "From the sources [1]."


def test_ask_uses_options(vdb):
    llm = EchoLLM()
    answer = vdb.ask(QUERY, llm, options=SearchOptions(restrictions=Restrictions(filter={"lang": "de"},
                                                                             principals=ragdb.ALL)),
                     min_confidence=0)
    assert [h.source for h in answer.hits] == ["notes/katze.txt"] and len(llm.messages) == 1
    answer = vdb.ask(QUERY, llm, k=2, options=SearchOptions(scorer="tfidf", restrictions=FULL), min_confidence=0)
    assert [h.score for h in answer.hits] == \
        [h.score for h in vdb.search(QUERY, k=2, scorer="tfidf", principals=ragdb.ALL)]


def test_build_prompt_honours_options_k(vdb):
    assert len(vdb.search(QUERY, principals=ragdb.ALL)) >= 3
    assert len(vdb.build_prompt(QUERY, options=SearchOptions(k=2, restrictions=FULL), min_confidence=0).sources) == 2


def test_ask_honours_options_k(vdb):
    assert len(vdb.search(QUERY, principals=ragdb.ALL)) >= 3
    assert len(vdb.ask(QUERY, EchoLLM(), options=SearchOptions(k=2, restrictions=FULL), min_confidence=0).hits) == 2


def test_search_options_frozen_and_replace_validates():
    opts = SearchOptions(k=3, restrictions=Restrictions(filter={"lang": "en"}))
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.k = 4
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.scorer = "tfidf"
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.restrictions.filter = {}
    changed = opts.replace(scorer="tfidf", principals=["b", "a", "a"])
    assert changed.scorer == "tfidf" and changed.k == 3
    assert changed.restrictions.filter == {"lang": "en"} and changed.restrictions.principals == ("a", "b")
    # the original is untouched (principals omitted: the anonymous caller, normalised to ())
    assert opts.scorer == "bm25" and opts.restrictions.principals == ()
    assert opts.replace() == opts
    for kw, name in [({"alpha": 0.5}, "alpha"), ({"k": 0}, "k"), ({"k": 10_001}, "k"), ({"k": True}, "k"),
                     ({"scorer": "bogus"}, "scorer"), ({"versions": "some"}, "versions"),
                     ({"min_score": math.nan}, "min_score"), ({"rerank_top": 3}, "rerank_top"),
                     ({"scorer": "hybrid", "alpha": 1.5}, "alpha"), ({"scorer": "hybrid", "pool": 0}, "pool"),
                     ({"k1": -1.0}, "k1"), ({"explain": "yes"}, "explain")]:
        with pytest.raises(InvalidInput) as e:
            opts.replace(**kw)
        assert_names(e, name)
    with pytest.raises(InvalidInput) as e:
        SearchOptions(k1=1.2).replace(scorer="tfidf")
    assert_names(e, "k1")
    with pytest.raises(InvalidInput, match="as_of"):
        opts.replace(as_of="2026-01-01T00:00:00Z", versions="all")
    with pytest.raises(InvalidInput):
        opts.replace(since="yesterday")
    # dataclasses.replace goes through the same checks
    with pytest.raises(InvalidInput) as e:
        dataclasses.replace(opts, alpha=0.2)
    assert_names(e, "alpha")


# ======================================================================================
# AddReport
# ======================================================================================
def test_add_report_statuses(db):
    r1 = db.add_many([{"text": "alpha one", "source": "s1", "metadata": {"a": 1, "b": 2}, "acl": ["y", "x"]},
                      {"text": "beta two", "source": "s2"}])
    assert isinstance(r1, AddReport) and all(isinstance(c, Change) for c in r1.changes)
    assert [c.status for c in r1.changes] == ["added", "added"]
    assert [c.previous for c in r1.changes] == [None, None]
    assert r1.added == (r1[0].id, r1[1].id) and r1.replaced == () and r1.unchanged == ()
    assert [d.source for d in r1] == ["s1", "s2"] and r1[0].acl == ("x", "y")

    gen, docs, stats = generation(db), db.documents(versions="all", principals=ragdb.ALL), db.stats()
    # identical again (metadata keys and labels in another order): unchanged, nothing written
    r2 = db.add_many([{"text": "alpha one", "source": "s1", "metadata": {"b": 2, "a": 1}, "acl": ["x", "y"]}])
    assert [c.status for c in r2.changes] == ["unchanged"]
    assert r2[0].id == r1[0].id and r2.unchanged == (r1[0].id,) and r2.changes[0].previous is None
    assert r2.added == () and r2.replaced == ()
    assert r2[0].metadata == {"a": 1, "b": 2}
    assert generation(db) == gen and db.documents(versions="all", principals=ragdb.ALL) == docs
    assert (db.stats().documents, db.stats().stored_chunks) == (stats.documents, stats.stored_chunks)
    # a newer timestamp alone is not a change either
    r2b = db.add_many([{"text": "beta two", "source": "s2", "timestamp": "2030-01-01T00:00:00Z"}])
    assert r2b.unchanged == (r1[1].id,) and r2b[0].timestamp == r1[1].timestamp and generation(db) == gen

    r3 = db.add_many([{"text": "alpha one, changed", "source": "s1", "metadata": {"a": 1, "b": 2},
                       "acl": ["x", "y"]}])
    (change,) = r3.changes
    assert change.status == "replaced" and change.previous == r1[0].id and change.document.id != r1[0].id
    assert r3.replaced == (change.document.id,) and r3.added == () and r3.unchanged == ()
    assert generation(db) > gen
    s1 = db.get(source="s1", principals=ragdb.ALL)
    assert s1.id == change.document.id and s1.text == "alpha one, changed"
    with pytest.raises(DocumentNotFound):  # not kept: keep_versions is off
        db.get(r1[0].id, principals=ragdb.ALL)
    assert db.stats().documents == 2 and db.stats().stored_documents == 2
    assert db.check() == []


def test_add_report_holds_changes_compactly_and_gives_them_back_equal(db):
    """add_many's report keeps each record in a few columns (Changes), not one object
    graph a record; every Change comes back equal to the one the writer made."""
    from ragdb.types import Changes

    report = db.add_many([{"text": f"text {i}", "source": f"s{i}", "version": "v2" if i == 1 else None,
                           "metadata": {"k": i} if i == 2 else {}, "acl": ["team"] if i == 3 else None}
                          for i in range(5)])
    assert isinstance(report.changes, Changes) and len(report.changes) == 5
    for c, d in zip(report.changes, report):
        assert c.document == d == dataclasses.replace(db.get(d.id, principals=ragdb.ALL), text=None)
    assert report[1].version == "v2" and report[2].metadata == {"k": 2} and report[3].acl == ("team",)
    assert report[0].metadata == {} and report[0].acl == () and report[0].version is None
    report[2].metadata["k"] = 99  # a copy each time: the report does not change
    assert report[2].metadata == {"k": 2}

    odd = Document(id=7, source="x", version=None, timestamp=None, content_hash="not-a-sha256", metadata={},
                   acl=(), chunk_count=0, latest=False, text="kept")
    upper = dataclasses.replace(odd, content_hash="AB" * 32)  # hex, but not as hexdigest writes it
    plain = Change("added", report[0])
    ch = Changes([plain, Change("replaced", odd, previous=3), Change("unchanged", upper)])
    assert list(ch) == [plain, Change("replaced", odd, previous=3), Change("unchanged", upper)]
    assert ch[-1] == Change("unchanged", upper) and ch[1:] == (ch[1], ch[2]) and ch[::-1][0] == ch[2]
    assert ch.ids() == (report[0].id, 7, 7) and ch.ids("replaced") == (7,) and ch.ids("added") == (report[0].id,)
    assert ch == tuple(ch) and ch == Changes(tuple(ch)) and ch != Changes()
    with pytest.raises(IndexError):
        ch[3]
    with pytest.raises(IndexError):
        ch[-4]
    with pytest.raises(InvalidInput, match="moved"):
        Changes([Change("moved", odd)])
    # sources are kept as UTF-8 in one buffer: every str comes back as it was, any other value too
    sources = ["数据/报告.md", "", "x\udcff.txt", "é" * 300, "plain"]
    kept = Changes([Change("added", dataclasses.replace(odd, source=s, id=n)) for n, s in enumerate(sources)])
    assert [c.document.source for c in kept] == sources and [c.document.id for c in kept] == [0, 1, 2, 3, 4]
    assert Changes([Change("added", dataclasses.replace(odd, source=None))])[0].document.source is None
    assert AddReport(tuple(ch)).replaced == AddReport(ch).replaced == (7,)


@pytest.mark.parametrize("change", [
    {"text": "alpha one two"}, {"metadata": {"a": 2}}, {"metadata": {"a": 1, "c": None}}, {"metadata": {}},
    {"metadata": {"a": True}}, {"acl": ["x"]}, {"acl": []}, {"version": "2"},
])
def test_add_report_replaced_for_each_kind_of_change(db, change):
    first = {"text": "alpha one", "source": "s", "metadata": {"a": 1}, "acl": ["x", "y"], "version": "1"}
    old = db.add_many([first])[0]
    report = db.add_many([{**first, **change}])
    assert [c.status for c in report.changes] == ["replaced"]
    assert report.changes[0].previous == old.id and report[0].id > old.id
    assert db.get(source="s", principals=ragdb.ALL).id == report[0].id
    assert [d.id for d in db.documents(versions="all", principals=ragdb.ALL)] == [report[0].id]


def test_add_report_source_repeated_in_one_batch(db):
    r = db.add_many([{"text": "first words", "source": "s"}, {"text": "second words", "source": "s"},
                     {"text": "second words", "source": "s"}, {"text": "first words", "source": "s"},
                     {"text": "other", "source": "t"}])
    assert [c.status for c in r.changes] == ["added", "replaced", "unchanged", "replaced", "added"]
    ids = [d.id for d in r]
    assert r.changes[1].previous == ids[0] and r.changes[2].document.id == ids[1]
    assert r.changes[3].previous == ids[1] and ids[3] not in ids[:3]
    assert r.added == (ids[0], ids[4]) and r.replaced == (ids[1], ids[3]) and r.unchanged == (ids[1],)
    assert [(d.id, d.source) for d in db.documents(versions="all")] == [(ids[3], "s"), (ids[4], "t")]
    assert db.get(source="s").text == "first words"
    assert [h.source for h in db.search("second")] == []
    assert db.stats().documents == 2 and db.check() == []


def test_add_report_with_keep_versions(tmp_path):
    with ragdb.open(tmp_path / "kv.db", keep_versions=True) as db:
        v1 = db.add_many([{"text": "version one text", "source": "s"}])
        assert [c.status for c in v1.changes] == ["added"]
        v2 = db.add_many([{"text": "version two text", "source": "s"}])
        assert [c.status for c in v2.changes] == ["replaced"] and v2.changes[0].previous == v1[0].id
        assert db.get(v1[0].id).latest is False and db.get(v2[0].id).latest is True
        gen = generation(db)
        same = db.add_many([{"text": "version two text", "source": "s"}])
        assert same.unchanged == (v2[0].id,) and generation(db) == gen
        # identical to an older kept version, but not to the latest: a new version
        back = db.add_many([{"text": "version one text", "source": "s"}])
        assert back.replaced == (back[0].id,) and back.changes[0].previous == v2[0].id
        assert back[0].id not in (v1[0].id, v2[0].id)
        stored = db.documents(versions="all")
        assert [(d.id, d.latest) for d in stored] == [(v1[0].id, False), (v2[0].id, False), (back[0].id, True)]
        # within one batch
        batch = db.add_many([{"text": "three", "source": "u"}, {"text": "four", "source": "u"}])
        assert [c.status for c in batch.changes] == ["added", "replaced"]
        assert batch.changes[1].previous == batch[0].id
        assert db.get(batch[0].id).latest is False and db.get(source="u").id == batch[1].id
        assert [h.source for h in db.search("three", versions="all")] == ["u"]
        assert db.search("three") == []
        assert db.check() == []


def test_add_report_is_the_old_list_of_documents(db):
    records = [{"text": f"document about {w}", "source": f"s{i}"} for i, w in enumerate(["cats", "dogs", "mats", "hats"])]
    r = db.add_many(iter(records))  # any iterable
    docs = list(r)
    assert isinstance(r, collections.abc.Sequence) and len(r) == 4 and len(docs) == 4
    assert all(isinstance(d, ragdb.Document) for d in docs)
    assert [d.source for d in docs] == ["s0", "s1", "s2", "s3"]
    assert r.documents == tuple(docs) and [c.document for c in r.changes] == docs
    assert r[0] == docs[0] and r[-1] == docs[3] and r[2].source == "s2"
    assert list(r[1:3]) == docs[1:3] and list(r[::-1]) == docs[::-1] and list(r[10:]) == []
    assert list(reversed(r)) == docs[::-1]
    with pytest.raises(IndexError):
        r[4]
    assert r.index(docs[2]) == 2 and docs[1] in r and r.count(docs[0]) == 1
    a, b, c, d = r
    assert (a, d) == (docs[0], docs[3])
    assert [x.id for x in r] == [x.id for x in db.documents()]
    assert bool(r) and not db.add_many([]) and len(db.add_many([])) == 0
    assert db.add_many([]).changes == ()
    single = db.add("a single document", source="one")
    assert isinstance(single, ragdb.Document) and single.source == "one"
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.changes[0].status = "added"


# ======================================================================================
# update()
# ======================================================================================
def test_update_replaces_metadata_and_acl_whole(filled_db):
    db = filled_db
    cats = src_of(db, "docs/cats.md")
    assert cats.metadata == {"lang": "en", "team": "x", "tags": ["pets"]} and cats.acl == ("staff",)

    doc = db.update(cats.id, metadata={"team": "z"})
    assert doc.id == cats.id and doc.metadata == {"team": "z"} and doc.acl == ("staff",)
    got = db.get(cats.id, principals=ragdb.ALL)
    assert got.metadata == {"team": "z"} and got.text == cats.text
    assert (doc.content_hash, doc.chunk_count, doc.source, doc.timestamp, doc.latest) == \
        (cats.content_hash, cats.chunk_count, cats.source, cats.timestamp, cats.latest)
    full = ragdb.ALL
    assert "docs/cats.md" not in [h.source for h in db.search("cat", filter={"lang": "en"}, principals=full)]
    assert "docs/cats.md" not in [h.source for h in db.search("cat", filter={"tags": "pets"}, principals=full)]
    assert [h.source for h in db.search("cat", filter={"team": "z"}, principals=full)] == ["docs/cats.md"]
    assert [d.source for d in db.documents(filter={"team": "z"}, principals=full)] == ["docs/cats.md"]
    assert [d.source for d in db.documents(filter={"tags": "pets"}, principals=full)] == ["notes/katze.txt"]
    assert [h.metadata for h in db.search("cat", filter={"team": "z"}, principals=full)] == [{"team": "z"}]

    doc = db.update(cats.id, acl=["board", "audit", "board"])
    assert doc.acl == ("audit", "board") and doc.metadata == {"team": "z"}
    assert "docs/cats.md" not in [h.source for h in db.search("cat", principals=["staff"])]
    assert [h.source for h in db.search("cat", principals=["board"])] == ["docs/cats.md"]
    assert [h.source for h in db.search("cat", principals=["audit", "nobody"])] == ["docs/cats.md"]

    doc = db.update(cats.id, metadata={"lang": "fr", "n": [1, 2]}, acl=["x"])
    assert (doc.metadata, doc.acl) == ({"lang": "fr", "n": [1, 2]}, ("x",))
    assert [h.source for h in db.search("cat", filter={"n": 2}, principals=full)] == ["docs/cats.md"]
    assert db.search("cat", principals=["board"]) == []

    doc = db.update(cats.id, metadata={}, acl=[])
    assert (doc.metadata, doc.acl) == ({}, ())
    assert db.search("cat", filter={"lang": "fr"}, principals=full) == []
    # without labels it is public (public_unlabeled, the default): every caller sees it, anonymous too
    assert [h.source for h in db.search("cat", principals=["x"])] == ["docs/cats.md"]
    assert [h.metadata for h in db.search("cat sat door") if h.source == "docs/cats.md"] == [{}]
    assert db.check() == []


def test_update_keeps_ids_chunks_and_scores():
    text = "Cats sleep a lot.\n\nA mat is where the cat sleeps.\n\nDogs bark at the cat on the mat."
    with ragdb.open(":memory:", chunker="paragraph") as db:
        target = db.add(text, source="t.md", metadata={"old": 1}, acl=["a"])
        db.add("The cat and the hat.\n\nNo mats here.", source="u.md", metadata={"old": 2})
        db.add("Mats, mats and more mats.", source="v.md")
        assert target.chunk_count == 3

        def state():
            lex = [(h.chunk_id, h.doc_id, h.score, h.start, h.end, h.text, dict(h.explain))
                   for h in db.search("cat mat sleep", k=20, explain=True, principals=ragdb.ALL)]
            tfidf = [(h.chunk_id, h.score)
                     for h in db.search("cat mat sleep", k=20, scorer="tfidf", principals=ragdb.ALL)]
            docs = [(d.id, d.source, d.content_hash, d.chunk_count, d.timestamp)
                    for d in db.documents(principals=ragdb.ALL)]
            s = db.stats()
            return lex, tfidf, docs, (s.documents, s.chunks, s.vocabulary, s.postings, s.avg_chunk_length)

        before = state()
        chunk_ids = sorted(h.chunk_id for h in db.search("cat mat sleep dog bark", k=20, principals=ragdb.ALL)
                           if h.doc_id == target.id)
        assert len(chunk_ids) == 3
        db.update(target.id, metadata={"new": True, "tags": ["q"]}, acl=["b"])
        db.update(target.id, metadata={"new": True, "tags": ["q", "r"]})
        assert state() == before
        hits = db.search("cat mat sleep dog bark", k=20, filter={"tags": "r"}, principals=ragdb.ALL)
        assert sorted(h.chunk_id for h in hits) == chunk_ids
        assert all(h.metadata == {"new": True, "tags": ["q", "r"]} for h in hits)
        others = {h.source: h.metadata for h in db.search("cat mat", k=20) if h.doc_id != target.id}
        assert others == {"u.md": {"old": 2}, "v.md": {}}
        assert db.check() == []


def test_update_keeps_chunk_metadata_and_title(db):
    from ragdb.types import Span

    text = "Intro about cats.\n\nDetails about mats."
    doc = db.add(text, source="s.md", title="The Title", metadata={"a": 1}, chunker="paragraph",
                 spans=[Span(0, 19, {"section": "Intro"}), Span(19, len(text), {"section": "Details"})])
    db.update(doc.id, metadata={"b": 2})
    assert db.get(doc.id).metadata == {"b": 2, "title": "The Title"}
    assert {h.text: h.metadata for h in db.search("cats mats", k=5)} == {
        "Intro about cats.": {"b": 2, "section": "Intro"}, "Details about mats.": {"b": 2, "section": "Details"}}
    assert db.check() == []


def test_changing_a_hits_metadata_changes_no_later_search(db):
    """Hits are made from a cache: each gets its own metadata, nested lists and dicts included,
    so a caller that changes them changes neither the next search's hits nor the other hits."""
    meta = {"tags": ["a", "b"], "info": {"authors": ["x"], "year": 2020}, "n": 1}
    db.add("copper wire conducts current", source="c.md", metadata=meta, chunker="none")
    db.add("copper pipes carry water", source="p.md", metadata=meta, chunker="none")
    first = db.search("copper", k=5)
    assert [h.metadata for h in first] == [meta, meta]
    first[0].metadata["tags"].append("mine")
    first[0].metadata["info"]["authors"].append("me")
    first[0].metadata["n"] = 2
    assert first[1].metadata == meta
    assert [h.metadata for h in db.search("copper", k=5)] == [meta, meta]
    assert [h.metadata for h in db.search("copper", k=5, explain=True)] == [meta, meta]


def test_hit_fields_handed_out_are_the_callers_own(db):
    """``Index.hit_protos`` hands out a dict of its own, not its cache: a search makes its hits
    from it after the read transaction, while another thread's search on the same handle may
    evict entries from the cache (or a write forget them)."""
    for i in range(5):
        db.add(f"zinc alloy number {i}", source=f"z{i}.md", chunker="none")
    hits = db.search("zinc", k=5)
    index = db._engine.index
    ids = [h.chunk_id for h in hits]
    with db._engine.store.read():
        protos = index.hit_protos(ids)  # every one cached by the search
    index.forget_hits(ids)
    assert sorted(protos) == sorted(ids) and [protos[c].source for c in ids] == [h.source for h in hits]


@pytest.mark.parametrize("flush_first", [False, True], ids=["tail", "flushed"])
def test_update_seen_by_another_connection_with_cached_hits(tmp_path, flush_first):
    path = tmp_path / "shared.db"
    with ragdb.open(path) as writer, ragdb.open(path) as reader:
        doc = writer.add("gamma delta", source="g.md", metadata={"v": 1}, acl=["a"])
        writer.add("gamma epsilon", source="h.md", metadata={"v": 1}, acl=["a"])
        if flush_first:
            writer.optimize(vacuum=False)
        # the reader searches first: hits (and filter masks) are cached there (the full view: every
        # document is labelled)
        full = ragdb.ALL
        assert {h.source: h.metadata for h in reader.search("gamma", principals=full)} == \
            {"g.md": {"v": 1}, "h.md": {"v": 1}}
        assert len(reader.search("gamma", filter={"v": 1}, principals=full)) == 2
        assert len(reader.search("gamma", principals=["a"])) == 2
        scores = [(h.source, h.score) for h in reader.search("gamma", principals=full)]

        writer.update(doc.id, metadata={"v": 2, "w": "x"}, acl=["b"])
        hits = reader.search("gamma", principals=full)
        assert {h.source: h.metadata for h in hits} == {"g.md": {"v": 2, "w": "x"}, "h.md": {"v": 1}}
        assert [(h.source, h.score) for h in hits] == scores
        assert [h.source for h in reader.search("gamma", filter={"v": 2}, principals=full)] == ["g.md"]
        assert [h.source for h in reader.search("gamma", filter={"v": 1}, principals=full)] == ["h.md"]
        assert [h.source for h in reader.search("gamma", principals=["a"])] == ["h.md"]
        assert [h.source for h in reader.search("gamma", principals=["b"])] == ["g.md"]
        assert reader.get(doc.id, principals=full).metadata == {"v": 2, "w": "x"}
        assert reader.get(doc.id, principals=full).acl == ("b",)
        assert [d.source for d in reader.documents(filter={"w": "x"}, principals=full)] == ["g.md"]

        # twice in a row before the reader looks again, then the other way round
        writer.update(doc.id, metadata={"v": 3})
        writer.update(doc.id, metadata={"v": 4})
        assert [h.metadata for h in reader.search("gamma delta", k=1, principals=full)] == [{"v": 4}]
        reader.update(doc.id, metadata={"v": 5})
        assert [h.metadata for h in writer.search("gamma delta", k=1, principals=full)] == [{"v": 5}]
        assert [h.source for h in writer.search("gamma", filter={"v": 5}, principals=full)] == ["g.md"]
        with ragdb.open(path) as third:
            assert [h.metadata for h in third.search("gamma delta", k=1, principals=full)] == [{"v": 5}]
        assert writer.check() == [] and reader.check() == []


def test_update_seen_by_another_connection_in_vector_hits(tmp_path):
    path = tmp_path / "vec.db"
    emb = HashEmbedder(32)
    with ragdb.open(path, embedder=emb) as writer, ragdb.open(path, embedder=emb) as reader:
        doc = writer.add("gamma delta", source="g.md", metadata={"v": 1})
        writer.add("gamma epsilon", source="h.md", metadata={"v": 1})
        for scorer in ("vector", "hybrid"):
            assert {h.metadata["v"] for h in reader.search("gamma", scorer=scorer)} == {1}
        writer.update(doc.id, metadata={"v": 2})
        for scorer in ("vector", "hybrid"):
            hits = reader.search("gamma", scorer=scorer)
            assert {h.source: h.metadata for h in hits} == {"g.md": {"v": 2}, "h.md": {"v": 1}}
            assert [h.source for h in reader.search("gamma", scorer=scorer, filter={"v": 2})] == ["g.md"]


def test_update_does_not_embed():
    emb = CountingEmbedder(32)
    with ragdb.open(":memory:", embedder=emb) as db:
        docs = [db.add(t, source=s, chunker="paragraph") for s, t in
                [("a.md", "cats on mats\n\nmore cats"), ("b.md", "dogs in parks"), ("c.md", "mats and hats")]]
        assert emb.calls > 0 and emb.texts == 4
        info = db.vector_info()
        assert (info.model, info.dimensions, info.vectors, info.pending) == ("hash-32", 32, 4, 0)
        full = ragdb.ALL
        before = [(h.chunk_id, h.score) for h in db.search("cats mats", scorer="vector", principals=full)]
        hybrid_before = [(h.chunk_id, h.score) for h in db.search("cats mats", scorer="hybrid", principals=full)]
        calls = emb.calls
        db.update(docs[0].id, metadata={"x": 1})
        db.update(docs[0].id, acl=["p"])
        db.update(docs[2].id, metadata={"x": 2}, acl=["p", "q"])
        assert emb.calls == calls and emb.texts == 4
        assert db.vector_info() == info
        assert [(h.chunk_id, h.score) for h in db.search("cats mats", scorer="vector", principals=full)] == before
        assert [(h.chunk_id, h.score) for h in db.search("cats mats", scorer="hybrid", principals=full)] == \
            hybrid_before
        assert {h.source for h in db.search("cats mats", scorer="vector", filter={"x": 1}, principals=full)} == \
            {"a.md"}
        assert {h.source for h in db.search("cats mats", scorer="hybrid", principals=["q"])} == {"c.md"}
        assert db.embed() == 0 and emb.calls == calls
        assert db.check() == []


def test_check_after_updates_deletes_and_versions(tmp_path):
    with ragdb.open(tmp_path / "kv.db", keep_versions=True) as db:
        old = db.add("apple pie recipe", source="r.md", metadata={"kind": "food"}, acl=["a"])
        new = db.add("apple cake recipe", source="r.md", metadata={"kind": "food"}, acl=["a"])
        other = db.add("apple tree care", source="t.md", metadata={"kind": "garden"})
        db.update(old.id, metadata={"kind": "archived"}, acl=["b"])  # an older version
        assert db.check() == []
        full = ragdb.ALL
        assert db.get(old.id, principals=full).latest is False
        assert db.get(old.id, principals=full).metadata == {"kind": "archived"}
        assert [h.doc_id for h in db.search("apple", versions="all", filter={"kind": "archived"}, principals=full)] \
            == [old.id]
        assert db.search("apple", filter={"kind": "archived"}, principals=full) == []
        # an old version is visible only where both its own labels and the latest version's allow it
        # (t.md, unlabeled, is public: public_unlabeled is on by default)
        assert [h.doc_id for h in db.search("apple", versions="all", principals=["b"])] == [other.id]
        assert old.id in [h.doc_id for h in db.search("apple", versions="all", principals=["a", "b"])]
        assert old.id not in [h.doc_id for h in db.search("apple", versions="all", principals=["a"])]
        db.update(new.id, metadata={"kind": "dessert"})
        db.update(other.id, acl=["c"])
        assert db.check() == []
        # deleting the latest brings the updated older version back, with its new fields
        assert db.delete(new.id) == 1
        back = db.get(source="r.md", principals=full)
        assert back.id == old.id and back.latest and back.metadata == {"kind": "archived"}
        assert [h.metadata for h in db.search("pie", principals=full)] == [{"kind": "archived"}]
        assert [h.source for h in db.search("apple", principals=["b"])] == ["r.md"]
        assert db.check() == []
        db.optimize()
        db.update(other.id, metadata={"kind": "tree"})
        assert db.delete(filter={"kind": "tree"}) == 1
        assert [d.id for d in db.documents(versions="all", principals=full)] == [old.id]
        assert db.check() == []


def test_update_rolled_back_with_its_transaction(filled_db):
    db = filled_db
    cats = src_of(db, "docs/cats.md")
    before = snapshot(db)
    assert [h.metadata for h in db.search("cat sat door", k=1, principals=ragdb.ALL)] == [dict(cats.metadata)]  # cached
    with pytest.raises(RuntimeError), db.transaction():
        db.update(cats.id, metadata={"team": "inside"}, acl=["inside"])
        assert [h.metadata for h in db.search("cat sat door", k=1, principals=ragdb.ALL)] == [{"team": "inside"}]
        assert [h.source for h in db.search("cat", principals=["inside"])] == ["docs/cats.md"]
        raise RuntimeError("roll back")
    assert snapshot(db) == before
    assert [h.metadata for h in db.search("cat sat door", k=1, principals=ragdb.ALL)] == [dict(cats.metadata)]
    assert db.search("cat", principals=["inside"]) == []
    assert db.search("cat", filter={"team": "inside"}, principals=ragdb.ALL) == []
    assert db.get(cats.id, principals=ragdb.ALL).acl == ("staff",) and db.check() == []


BAD_METADATA = [
    pytest.param({"a": math.nan}, id="nan"), pytest.param({"a": [1, -math.inf]}, id="inf-in-list"),
    pytest.param({"a": {"b": math.nan}}, id="nested-nan"), pytest.param("text", id="string"),
    pytest.param([("a", 1)], id="list-of-pairs"), pytest.param(3, id="int"),
    pytest.param({"a": object()}, id="object"), pytest.param({"a": {1, 2}}, id="set"),
    pytest.param({1: "a"}, id="int-key"), pytest.param({"a": 2 ** 70}, id="huge-int"),
    pytest.param({"a": "\ud800"}, id="lone-surrogate"),
    # falsy values that are not a mapping are mistakes, not "no metadata"
    pytest.param(False, id="false"), pytest.param(0, id="zero"), pytest.param([], id="empty-list"),
    pytest.param("", id="empty-string"),
]
BAD_ACL = [
    pytest.param("staff", id="string"), pytest.param(b"staff", id="bytes"), pytest.param([1], id="int-label"),
    pytest.param(["ok", None], id="none-label"), pytest.param([""], id="empty-label"),
    pytest.param(["\ud800"], id="lone-surrogate"), pytest.param(("ok", 3), id="tuple-with-int"),
]


@pytest.mark.parametrize("metadata", BAD_METADATA)
def test_update_invalid_metadata_changes_nothing(filled_db, metadata):
    db = filled_db
    doc = src_of(db, "docs/cats.md")
    before = snapshot(db)
    with pytest.raises(InvalidInput, match="metadata"):
        db.update(doc.id, metadata=metadata)
    with pytest.raises(InvalidInput, match="metadata"):  # a valid acl with it is not applied either
        db.update(doc.id, metadata=metadata, acl=["other"])
    assert snapshot(db) == before
    assert db.check() == []


@pytest.mark.parametrize("metadata", BAD_METADATA)
def test_add_invalid_metadata_stores_nothing(filled_db, metadata):
    before = snapshot(filled_db)
    with pytest.raises(InvalidInput, match="metadata"):
        filled_db.add("a new text", source="new.md", metadata=metadata)
    assert snapshot(filled_db) == before


@pytest.mark.parametrize("acl", BAD_ACL)
def test_update_invalid_acl_changes_nothing(filled_db, acl):
    db = filled_db
    doc = src_of(db, "docs/cats.md")
    before = snapshot(db)
    with pytest.raises(InvalidInput, match="acl"):
        db.update(doc.id, acl=acl)
    with pytest.raises(InvalidInput, match="acl"):  # a valid metadata with it is not applied either
        db.update(doc.id, metadata={"lang": "xx"}, acl=acl)
    assert snapshot(db) == before


@pytest.mark.parametrize("call", ["update", "add"])
def test_non_iterable_acl_is_invalid_input(filled_db, call):
    doc = src_of(filled_db, "docs/cats.md")
    with pytest.raises(InvalidInput, match="acl"):
        if call == "update":
            filled_db.update(doc.id, acl=5)
        else:
            filled_db.add("some text", source="new.md", acl=5)


def test_update_arguments(filled_db):
    db = filled_db
    doc = src_of(db, "docs/cats.md")
    before = snapshot(db)
    with pytest.raises(InvalidInput, match="metadata=, acl="):
        db.update(doc.id)
    with pytest.raises(InvalidInput):
        db.update(doc.id, metadata=None, acl=None)
    for bad_id in ("1", 0, -3, True, 2 ** 63, None, 1.0):
        with pytest.raises(InvalidInput):
            db.update(bad_id, metadata={"a": 1})
    with pytest.raises(DocumentNotFound):
        db.update(10_000, metadata={"a": 1})
    with pytest.raises(DocumentNotFound):
        db.update(10_000, acl=["a"])
    assert snapshot(db) == before
    db.delete(doc.id)
    with pytest.raises(DocumentNotFound) as e:
        db.update(doc.id, metadata={"a": 1})
    assert isinstance(e.value, RagdbError) and isinstance(e.value, KeyError)
    replaced = db.add("Dogs chase cats, again.", source="docs/dogs.md")
    old_dogs = [c for c in before[1] if c[1] == "docs/dogs.md"][0][0]
    with pytest.raises(DocumentNotFound):  # replaced (not kept): gone
        db.update(old_dogs, metadata={"a": 1})
    assert db.update(replaced.id, metadata={"a": 1}).metadata == {"a": 1}


# -- property: any sequence of writes answers like a fresh build of the result ----------------
WORDS = ["apple", "berry", "cherry", "date", "elder", "fig"]
texts = st.lists(st.lists(st.sampled_from(WORDS), min_size=1, max_size=5).map(" ".join),
                 min_size=1, max_size=3).map("\n\n".join)
meta_values = st.one_of(st.sampled_from(["u", "v", "w", 1, 2, True]),
                        st.lists(st.sampled_from(["u", "v", 1]), max_size=3))
metas = st.dictionaries(st.sampled_from(["k", "m", "tags"]), meta_values, max_size=3)
acls = st.lists(st.sampled_from(["p", "q", "r"]), max_size=2, unique=True)
SOURCES = ["s0", "s1", "s2", "s3"]
simple_filters = st.dictionaries(st.sampled_from(["k", "tags"]),
                                 st.one_of(st.sampled_from(["u", "v", 1]),
                                           st.lists(st.sampled_from(["u", "v", 1]), min_size=1, max_size=2)),
                                 min_size=1, max_size=1)
operations = st.lists(st.one_of(
    st.tuples(st.just("add"), st.sampled_from(SOURCES), texts, metas, acls),
    st.tuples(st.just("update"), st.integers(0, 3), st.one_of(st.none(), metas), st.one_of(st.none(), acls))
      .filter(lambda op: op[2] is not None or op[3] is not None),
    st.tuples(st.just("delete"), st.integers(0, 3)),
    st.tuples(st.just("delete_filter"), simple_filters),
    st.tuples(st.just("optimize")),
), min_size=1, max_size=12)

COMPARED = [{}, {"principals": ragdb.ALL}, {"filter": {"k": "u"}}, {"filter": {"tags": ["v", 1]}}, {"filter": {"m": True}},
            {"principals": ["p"]}, {"principals": ["q", "r"], "filter": {"k": ["u", "w"]}}, {"scorer": "tfidf"},
            {"scorer": "tfidf", "filter": {"m": "v"}}]
QUERIES = ["apple", "berry cherry", "fig date apple elder"]


def meta_json(meta):
    return json.dumps(meta, sort_keys=True)


def meta_matches(meta, key, wanted):
    """Brute force of a metadata condition: the value, or a scalar element of a list value, equals one wanted."""
    if key not in meta:
        return False
    value = meta[key]
    items = value if isinstance(value, list) else [value]
    scalars = [x for x in items if isinstance(x, (str, int, float, bool))]
    return any(x == w for x in scalars for w in wanted)


def comparable(hits):
    return [(h.source, h.start, h.text, dict(h.metadata)) for h in hits], [h.score for h in hits]


@PROPERTY
@given(ops=operations, keep=st.booleans())
def test_writes_then_search_equal_a_fresh_build(ops, keep, each_kernel):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "p.db"
        db = ragdb.open(path, keep_versions=keep, chunker="paragraph")
        reader = ragdb.open(path)  # a second connection that keeps searching (and caching) meanwhile
        try:
            stacks: dict[str, list[dict]] = {}  # source -> its stored versions, oldest first (latest last)

            def latest_of(i):
                live = sorted(s for s, v in stacks.items() if v)
                return stacks[live[i % len(live)]][-1] if live else None

            for op in ops:
                if op[0] == "add":
                    _, source, text, meta, acl = op
                    report = db.add_many([{"text": text, "source": source, "metadata": meta, "acl": acl}])
                    (change,) = report.changes
                    versions = stacks.setdefault(source, [])
                    top = versions[-1] if versions else None
                    if top and top["text"] == text and meta_json(top["meta"]) == meta_json(meta) \
                            and top["acl"] == tuple(sorted(acl)):
                        assert change.status == "unchanged" and change.document.id == top["id"]
                        continue
                    assert change.status == ("replaced" if top else "added")
                    assert change.previous == (top["id"] if top else None)
                    if top and not keep:
                        versions.pop()
                    versions.append({"id": change.document.id, "text": text, "meta": meta,
                                     "acl": tuple(sorted(acl))})
                elif op[0] == "update":
                    _, i, meta, acl = op
                    target = latest_of(i)
                    if target is None:
                        continue
                    doc = db.update(target["id"], metadata=meta, acl=acl)
                    if meta is not None:
                        target["meta"] = meta
                    if acl is not None:  # a latest version's labels are its whole history's
                        for versions in stacks.values():
                            if versions and versions[-1] is target:
                                for v in versions:
                                    v["acl"] = tuple(sorted(acl))
                    assert doc.id == target["id"] and doc.metadata == target["meta"] and doc.acl == target["acl"]
                elif op[0] == "delete":
                    target = latest_of(op[1])
                    if target is None:
                        continue
                    assert db.delete(target["id"]) == 1
                    for versions in stacks.values():
                        if versions and versions[-1] is target:
                            versions.pop()
                elif op[0] == "delete_filter":
                    (key, value), = op[1].items()
                    wanted = value if isinstance(value, list) else [value]
                    expected = sum(meta_matches(v["meta"], key, wanted) for vs in stacks.values() for v in vs)
                    assert db.delete(filter=op[1]) == expected
                    for source in stacks:
                        stacks[source] = [v for v in stacks[source] if not meta_matches(v["meta"], key, wanted)]
                else:
                    db.optimize(vacuum=False)
                reader.search("apple berry", k=50)
                reader.search("cherry", k=50, filter={"k": "u"})

            assert db.check() == []
            final = {s: v[-1] for s, v in stacks.items() if v}
            assert [(d.source, d.id) for d in db.documents(principals=ragdb.ALL)] == \
                sorted((s, v["id"]) for s, v in final.items())
            with ragdb.open(":memory:", chunker="paragraph") as fresh:
                for source in sorted(final):
                    v = final[source]
                    fresh.add(v["text"], source=source, metadata=v["meta"], acl=list(v["acl"]))
                s1, s2 = db.stats(), fresh.stats()
                assert (s1.documents, s1.chunks, s1.vocabulary, s1.postings, s1.avg_chunk_length) == \
                    (s2.documents, s2.chunks, s2.vocabulary, s2.postings, s2.avg_chunk_length)
                for query in QUERIES:
                    for kw in COMPARED:
                        want_hits, want_scores = comparable(fresh.search(query, k=50, **kw))
                        for conn in (db, reader):
                            got_hits, got_scores = comparable(conn.search(query, k=50, **kw))
                            assert got_hits == want_hits, (query, kw)
                            assert got_scores == pytest.approx(want_scores, rel=0, abs=1e-9), (query, kw)
        finally:
            reader.close()
            db.close()


# ======================================================================================
# delete(filter=...) and documents(filter=...)
# ======================================================================================
DOC_SOURCES = ["a/x.md", "a/y.txt", "b/x.md", "b/z.md", "c.md"]
GLOBS = ["a/*", "*.md", "b/?.md", "c.md", "a/x.md", "b/[xz].md", "*", "z/*"]
scalars = st.sampled_from(["u", "v", 1, 2, 1.0, 0, True, False])
doc_meta_values = st.one_of(scalars, st.lists(st.one_of(scalars, st.lists(scalars, max_size=1)), max_size=3),
                            st.fixed_dictionaries({"x": scalars}))
doc_metas = st.dictionaries(st.sampled_from(["k", "m", "tags"]), doc_meta_values, max_size=3)
records = st.lists(st.fixed_dictionaries({
    "source": st.sampled_from(DOC_SOURCES),
    "text": st.lists(st.sampled_from(WORDS), min_size=0, max_size=3).map(lambda ws: " ".join(["zeta", *ws])),
    "version": st.sampled_from([None, "1", "2"]),
    "metadata": doc_metas,
}), min_size=1, max_size=9)


def _filter_value(key):
    if key == "source":
        one = st.sampled_from(GLOBS)
    elif key == "version":
        one = st.sampled_from(["1", "2", "3"])
    else:
        one = scalars
    return st.one_of(one, st.lists(one, min_size=1, max_size=3))


filters_ = st.lists(st.sampled_from(["k", "m", "tags", "source", "version", "absent"]), unique=True,
                    min_size=1, max_size=2) \
    .flatmap(lambda keys: st.fixed_dictionaries({k: _filter_value(k) for k in keys}))


def filter_matches(flt, doc):
    """Brute force of ragdb.query.filters on a model document (every key must match)."""
    for key, value in flt.items():
        wanted = value if isinstance(value, list) else [value]
        if key == "source":
            if not any(fnmatch.fnmatchcase(doc["source"], str(w)) for w in wanted):
                return False
        elif key == "version":
            if doc["version"] not in [str(w) for w in wanted]:
                return False
        elif not meta_matches(doc["metadata"], key, wanted):
            return False
    return True


def source_matches(source_arg, glob, doc):
    if source_arg is None:
        return True
    return fnmatch.fnmatchcase(doc["source"], source_arg) if glob else doc["source"] == source_arg


def model_listing(model, latest_only=False):
    rows = [(d["source"], d["id"], d["latest"], d["version"], meta_json(d["metadata"])) for d in model
            if d["latest"] or not latest_only]
    return sorted(rows)


def listing(docs):
    return [(d.source, d.id, d.latest, d.version, meta_json(dict(d.metadata))) for d in docs]


def indexed_scalars(records_):
    """(key, value) of every metadata scalar a filter can match (lists: their scalar elements)."""
    out = []
    for rec in records_:
        for key, value in rec["metadata"].items():
            for x in value if isinstance(value, list) else [value]:
                if isinstance(x, (str, int, float, bool)):
                    out.append((key, x))
    return out


@PROPERTY
@given(recs=records, cuts=st.lists(st.integers(0, 9), max_size=2), keep=st.booleans(), flt=filters_,
       derive=st.booleans(), source_arg=st.sampled_from([None] * 6 + GLOBS), glob=st.booleans(),
       data=st.data())
def test_delete_and_documents_by_filter_match_brute_force(recs, cuts, keep, flt, derive, source_arg, glob, data):
    with ragdb.open(":memory:", keep_versions=keep, chunker="none") as db:
        model: list[dict] = []
        bounds = sorted({0, len(recs), *(c for c in cuts if c < len(recs))})
        for lo, hi in zip(bounds, bounds[1:]):  # in one to three batches
            batch = recs[lo:hi]
            report = db.add_many(batch)
            for rec, change in zip(batch, report.changes):
                top = next((d for d in model if d["source"] == rec["source"] and d["latest"]), None)
                if top and top["text"] == rec["text"] and top["version"] == rec["version"] \
                        and meta_json(top["metadata"]) == meta_json(rec["metadata"]):
                    assert (change.status, change.document.id) == ("unchanged", top["id"])
                    continue
                assert change.status == ("replaced" if top else "added")
                if top:
                    assert change.previous == top["id"]
                    if keep:
                        top["latest"] = False
                    else:
                        model.remove(top)
                model.append({**rec, "id": change.document.id, "latest": True})
        assert listing(db.documents(versions="all")) == model_listing(model)
        candidates = indexed_scalars(model)
        if derive and candidates:  # half of the filters are made to match a stored value
            key, value = data.draw(st.sampled_from(candidates), label="derived condition")
            also = data.draw(st.lists(scalars, max_size=2), label="other values")
            narrow = data.draw(st.booleans(), label="keep the source/version conditions")
            flt = {**{k: v for k, v in flt.items() if narrow and k in ("source", "version")},
                   key: [value, *also] if also else value}
            if not narrow:
                source_arg = None

        # documents(filter=): the brute force, for both versions and with a source pattern
        matching = [d for d in model if filter_matches(flt, d)]
        assert listing(db.documents(filter=flt, versions="all")) == model_listing(matching)
        assert listing(db.documents(filter=flt)) == model_listing(matching, latest_only=True)
        if source_arg is not None:
            both = [d for d in matching if fnmatch.fnmatchcase(d["source"], source_arg)]
            assert listing(db.documents(source_arg, filter=flt, versions="all")) == model_listing(both)
        # search(filter=) sees the same documents (every text holds "zeta")
        assert {h.doc_id for h in db.search("zeta", k=100, filter=flt, collapse=False)} == \
            {d["id"] for d in matching if d["latest"]}
        assert {h.doc_id for h in db.search("zeta", k=100, filter=flt, versions="all", collapse=False)} == \
            {d["id"] for d in matching}

        # delete(filter=): exactly the matching documents go, any version
        doomed = [d for d in matching if source_matches(source_arg, glob, d)]
        gen = generation(db)
        assert db.delete(source=source_arg, glob=glob, filter=flt) == len(doomed)
        if not doomed:
            assert generation(db) == gen
        gone = {d["id"] for d in doomed}
        kept = [d for d in model if d["id"] not in gone]
        for source in {d["source"] for d in kept}:
            versions = [d for d in kept if d["source"] == source]
            if not any(d["latest"] for d in versions):  # its latest was deleted: the newest kept one is latest
                max(versions, key=lambda d: d["id"])["latest"] = True
        assert listing(db.documents(versions="all")) == model_listing(kept)
        assert db.check() == []
        stats = db.stats()
        assert (stats.documents, stats.stored_documents) == (sum(d["latest"] for d in kept), len(kept))
        for d in kept:
            if d["latest"]:
                assert db.get(source=d["source"]).id == d["id"]
        assert {h.doc_id for h in db.search("zeta", k=100, collapse=False)} == {d["id"] for d in kept if d["latest"]}


@pytest.fixture
def versioned(tmp_path):
    db = ragdb.open(tmp_path / "kv.db", keep_versions=True)
    yield db
    db.close()


@pytest.mark.parametrize("metas,deleted,latest", [
    (["a", "b", "b"], 2, 0),      # v2, v3 go: v1 is latest again
    (["b", "a", "b"], 2, 1),      # v1, v3 go: v2 is latest again
    (["b", "b", "a"], 2, 2),      # only older versions go: v3 stays latest
    (["b", "b", "b"], 3, None),   # every version goes: the source is gone
    (["a", "a", "a"], 0, 2),      # nothing matches
])
def test_delete_by_filter_promotes_the_newest_kept_version(versioned, metas, deleted, latest):
    db = versioned
    docs = [db.add(f"version {n} text", source="s", metadata={"c": m}, timestamp=f"202{n}-01-01T00:00:00Z")
            for n, m in enumerate(metas)]
    other = db.add("unrelated words", source="t", metadata={"c": "b"})
    assert db.delete(filter={"c": "b"}, source="s") == deleted
    left = db.documents(versions="all")
    assert [d.id for d in left] == [d.id for d, m in zip(docs, metas) if m != "b"] + [other.id]
    if latest is None:
        with pytest.raises(DocumentNotFound):
            db.get(source="s")
        assert [h.source for h in db.search("version text")] == []
    else:
        assert db.get(source="s").id == docs[latest].id
        assert [h.doc_id for h in db.search("version text")] == [docs[latest].id]
        assert sum(d.latest for d in left if d.source == "s") == 1
    assert db.get(source="t").id == other.id  # outside source=: kept although it matches
    assert db.check() == []


def test_delete_by_filter_with_source(filled_db):
    db = filled_db
    assert db.delete(source="docs/*", filter={"team": "y"}) == 0  # glob=False: a literal source
    assert db.delete(source="docs/*", glob=True, filter={"team": "y"}) == 1
    assert [d.source for d in db.documents(principals=ragdb.ALL)] == ["docs/cats.md", "docs/physics.md",
                                                                       "notes/katze.txt", "notes/mats.txt"]
    assert db.delete(source="notes/mats.txt", filter={"rank": [1, 2]}) == 1
    assert db.delete(filter={"tags": "pets", "lang": "de"}) == 1
    assert [d.source for d in db.documents(principals=ragdb.ALL)] == ["docs/cats.md", "docs/physics.md"]
    assert db.delete(filter={"source": "docs/c*"}) == 1
    assert [h.source for h in db.search("cat mat quantum", principals=ragdb.ALL)] == ["docs/physics.md"]
    assert db.check() == []


def test_documents_filter_order_and_paging(filled_db):
    db = filled_db
    en = db.documents(filter={"lang": "en"}, principals=ragdb.ALL)
    assert [d.source for d in en] == ["docs/cats.md", "docs/dogs.md", "docs/physics.md", "notes/mats.txt"]
    assert db.documents(filter={"lang": "en"}, limit=2, offset=1, principals=ragdb.ALL) == en[1:3]
    assert [d.source for d in db.documents("notes/*", filter={"lang": "en"}, principals=ragdb.ALL)] == \
        ["notes/mats.txt"]
    assert db.documents("notes/*", glob=False, filter={"lang": "en"}, principals=ragdb.ALL) == []
    assert [d.source for d in db.documents(filter={"team": "x", "lang": ["en", "de"]}, principals=ragdb.ALL)] == \
        ["docs/cats.md", "docs/physics.md"]
    assert db.documents(filter={"nothing": "here"}, principals=ragdb.ALL) == []
    assert db.documents(filter={}, principals=ragdb.ALL) == db.documents(principals=ragdb.ALL)


BAD_FILTERS = [
    pytest.param([("lang", "en")], id="list"), pytest.param("lang=en", id="string"),
    pytest.param({"lang": []}, id="empty-list"), pytest.param({"lang": None}, id="none"),
    pytest.param({"lang": {"a": 1}}, id="mapping-value"), pytest.param({1: "en"}, id="int-key"),
    pytest.param({"": "en"}, id="empty-key"), pytest.param({"lang": ["en", None]}, id="none-in-list"),
    pytest.param({"rank": 2 ** 64}, id="huge-int"), pytest.param({"lang": "\ud800"}, id="lone-surrogate"),
    pytest.param({"source": []}, id="empty-source"),
]


@pytest.mark.parametrize("flt", BAD_FILTERS)
def test_bad_filters_refused_and_nothing_deleted(filled_db, flt):
    db = filled_db
    before = snapshot(db)
    with pytest.raises(InvalidInput):
        db.delete(filter=flt)
    with pytest.raises(InvalidInput):
        db.delete(source="docs/*", glob=True, filter=flt)
    with pytest.raises(InvalidInput):
        db.documents(filter=flt)
    with pytest.raises(InvalidInput):
        db.search("cat", filter=flt)
    assert snapshot(db) == before


def test_delete_arguments(filled_db):
    db = filled_db
    before = snapshot(db)
    doc = src_of(db, "docs/cats.md")
    for kw in ({}, {"doc_id": doc.id, "filter": {"lang": "en"}}, {"doc_id": doc.id, "source": "docs/cats.md"},
               {"source": 3}, {"doc_id": "1"}):
        with pytest.raises(InvalidInput):
            db.delete(**kw)
    assert snapshot(db) == before
    with pytest.raises(DocumentNotFound):
        db.delete(10_000)


# ======================================================================================
# get()
# ======================================================================================
def test_get_by_source_is_the_latest_version(versioned):
    db = versioned
    v1 = db.add("first version", source="s.md", version="1")
    v2 = db.add("second version", source="s.md", version="2")
    got = db.get(source="s.md")
    assert (got.id, got.version, got.latest, got.text) == (v2.id, "2", True, "second version")
    assert db.get(source="s.md", with_text=False).text is None
    assert db.get(v1.id).text == "first version" and db.get(v1.id).latest is False
    assert db.get(source="s.md") == db.get(v2.id)
    db.delete(v2.id)
    assert db.get(source="s.md").id == v1.id
    db.delete(v1.id)
    with pytest.raises(DocumentNotFound):
        db.get(source="s.md")


def test_get_arguments(filled_db):
    db = filled_db
    doc = db.documents()[0]
    assert db.get(doc.id).source == doc.source
    with pytest.raises(DocumentNotFound, match="nope.md"):
        db.get(source="nope.md")
    with pytest.raises(DocumentNotFound):
        db.get(source="docs/*")  # a source, not a pattern
    with pytest.raises(DocumentNotFound):
        db.get(source="DOCS/CATS.MD")
    with pytest.raises(DocumentNotFound):
        db.get(10_000)
    with pytest.raises(InvalidInput):
        db.get()
    with pytest.raises(InvalidInput):
        db.get(doc.id, source=doc.source)
    for bad in ("", 3, "\ud800"):
        with pytest.raises(InvalidInput):
            db.get(source=bad)
    for bad in ("1", 0, True):
        with pytest.raises(InvalidInput):
            db.get(bad)


def test_delete_with_an_empty_filter_is_refused(filled_db):
    before = filled_db.documents(versions="all", principals=ragdb.ALL)
    with pytest.raises(InvalidInput, match="matches every document"):
        filled_db.delete(filter={})
    assert filled_db.documents(versions="all", principals=ragdb.ALL) == before


@pytest.mark.parametrize("acl", [{"team:a": 1}, 5, "team:a", b"team:a"])
def test_acl_must_be_a_list_of_labels(filled_db, acl):
    doc = filled_db.documents(principals=ragdb.ALL)[0]
    with pytest.raises(InvalidInput, match="acl must be a list"):
        filled_db.update(doc.id, acl=acl)
    with pytest.raises(InvalidInput, match="acl must be a list"):
        filled_db.add("some text", source="new.md", acl=acl)
    assert filled_db.get(doc.id, principals=ragdb.ALL).acl == doc.acl


def test_writing_while_iterating_records_is_refused(filled_db):
    before = filled_db.documents(versions="all", principals=ragdb.ALL)
    with pytest.raises(InvalidInput, match="cannot write while a read"):
        for _record in filled_db.records(principals=ragdb.ALL):
            filled_db.add("written during the read", source="during.md")
    assert filled_db.documents(versions="all", principals=ragdb.ALL) == before
    filled_db.add("written after the read", source="after.md")  # the connection is usable again
    assert filled_db.get(source="after.md").text == "written after the read"
    assert filled_db.check() == []


def test_embed_without_any_embedder_names_what_to_give(db):
    db.add("some text", source="a.md")
    with pytest.raises(InvalidInput, match="give an embedder"):
        db.embed()


@pytest.mark.parametrize("keep", [False, True])
def test_a_batch_that_finds_a_document_unchanged_then_replaces_it_reports_both(keep):
    """One add_many batch: the first record is the stored document again (unchanged), the second
    a new version of the same source, which deletes (or, keeping versions, demotes) it. The
    report names the stored document for the first and the new one for the second (it raised
    DocumentNotFound: the unchanged document was read after the batch had deleted it)."""
    with ragdb.open(":memory:", keep_versions=keep, chunker="none") as db:
        first = db.add_many([{"source": "a/x.md", "text": "zeta"}])[0]
        report = db.add_many([{"source": "a/x.md", "text": "zeta"},
                              {"source": "a/x.md", "text": "zeta", "version": "1"}])
        assert [c.status for c in report.changes] == ["unchanged", "replaced"]
        assert report.changes[0].document.id == first.id
        assert report.changes[1].previous == first.id
        assert [d.version for d in db.documents()] == ["1"]
        assert len(db.documents(versions="all")) == (2 if keep else 1)


def test_options_made_from_the_same_keywords_are_kept_and_stay_exact():
    """Options of plain keyword values are made once and kept (they are frozen): the same
    value again, and a value that is equal but not the same (True is 1, -0.0 is 0.0) is
    still checked and kept as given; a refusal is never kept."""
    first = SearchOptions.from_keywords(k=7, scorer="bm25", min_score=0.5)
    assert SearchOptions.from_keywords(min_score=0.5, scorer="bm25", k=7) is first
    assert first == SearchOptions(k=7, min_score=0.5)
    assert SearchOptions.from_keywords(k=1).k == 1
    for _ in range(2):
        with pytest.raises(InvalidInput, match="k"):
            SearchOptions.from_keywords(k=True)  # (equal to k=1, kept above: still refused)
        with pytest.raises(InvalidInput, match="k1 applies"):
            SearchOptions.from_keywords(scorer="tfidf", k1=1.2)
    assert math.copysign(1.0, SearchOptions.from_keywords(min_score=0.0).min_score) == 1.0
    assert math.copysign(1.0, SearchOptions.from_keywords(min_score=-0.0).min_score) == -1.0
    over = SearchOptions(k=3)  # over another base: made from it, not from the defaults
    assert SearchOptions.from_keywords(over, scorer="tfidf") == SearchOptions(k=3, scorer="tfidf")
    assert SearchOptions.from_keywords(scorer="tfidf") == SearchOptions(scorer="tfidf")
    kept = SearchOptions.from_keywords(filter={"lang": "en"})  # (not plain: made each time, equal)
    assert SearchOptions.from_keywords(filter={"lang": "en"}) == kept


def test_readers_called_with_arguments_that_do_not_fit_say_so():
    """A reader's wrong keyword or argument count is the caller's: an InvalidInput naming the
    method and what is wrong, not an InternalError calling it a bug in ragdb (records, a
    generator, included: its iteration is guarded too)."""
    with ragdb.open(":memory:") as db:
        db.add("apple pie", source="a.md")
        for call, words in ((lambda: db.count(1), "count: too many positional"),
                            (lambda: db.documents(bogus=1), "documents: got an unexpected keyword argument 'bogus'"),
                            (lambda: db.get(1, bogus=1), "get: got an unexpected keyword"),
                            (lambda: db.facets(), "facets: missing a required argument: 'field'"),
                            (lambda: db.search(), "search: missing a required argument: 'query'"),
                            (lambda: db.records(bogus=1), "records: got an unexpected keyword")):
            with pytest.raises(InvalidInput, match=words) as e:
                call()
            assert e.value.__cause__ is None
        with pytest.raises(InvalidInput, match="versions must be"):
            list(db.records(versions="some"))
        assert [r["source"] for r in db.records(principals=ragdb.ALL)] == ["a.md"]


def test_flags_are_true_or_false_everywhere_and_an_empty_source_is_refused_by_delete():
    """delete's glob, optimize's vacuum and check's quick took any value as a truth value
    ("yes", 5), as documents' glob never did; delete(source="") was taken as a source no
    document can have (get refused it)."""
    with ragdb.open(":memory:") as db:
        db.add("apple pie", source="a.md")
        for call, name in ((lambda: db.delete(source="a*", glob="yes"), "delete: glob"),
                           (lambda: db.optimize(vacuum="x"), "vacuum"), (lambda: db.check(quick=5), "quick")):
            with pytest.raises(InvalidInput, match=f"{name} must be True or False"):
                call()
        with pytest.raises(InvalidInput, match="delete: source must be a non-empty string"):
            db.delete(source="")
        assert [d.source for d in db.documents()] == ["a.md"] and db.check(quick=True) == []


def test_a_mapping_is_not_a_list_of_principals_or_of_hits():
    """principals={"team:hr": 1} once read its keys as labels; build_prompt(hits={}) an empty list."""
    with ragdb.open(":memory:") as db:
        db.add("salary table", source="hr.md", acl=["team:hr"])
        with pytest.raises(InvalidInput, match="principals must be a list of labels, not a mapping"):
            db.search("salary", principals={"team:hr": 1})
        with pytest.raises(InvalidInput, match="hits must be a list of Hit objects"):
            db.build_prompt("salary?", hits={})
        assert [h.source for h in db.search("salary", principals=["team:hr"])] == ["hr.md"]
