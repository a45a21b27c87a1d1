"""The core engine: adds, replaces, deletes, search, statistics, exactness."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import sqlite3
import subprocess
import sys

import numpy as np
import orjson
import pytest
from unittest import mock
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ragdb
from ragdb.index.scoring import BM25_B, BM25_K1
from ragdb.errors import (AnalyzerMismatch, DocumentNotFound, InvalidInput, NotADatabase, RagdbError,
                          SchemaTooNew)

ZH = "RAG 是检索增强生成的缩写，它先从知识库检索相关资料，再让大模型基于证据生成答案。"
EN = "Retrieval-augmented generation retrieves relevant documents before the model generates an answer."


def fingerprint(hits):
    return [(h.source, h.start, h.end, h.text, h.score) for h in hits]


def test_add_search_delete_roundtrip(tmp_path):
    path = tmp_path / "kb.db"
    with ragdb.open(path) as db:
        d = db.add(ZH, source="notes/rag.md", version="2", timestamp="2026-11-01T00:00:00Z",
                   metadata={"lang": "zh"})
        db.add(EN, source="notes/rag-en.md", metadata={"lang": "en"})
        hits = db.search("什么是检索增强生成", k=5)
        assert hits[0].source == "notes/rag.md"
        h = hits[0]
        assert h.doc_id == d.id and h.version == "2" and h.timestamp == "2026-11-01T00:00:00Z"
        assert h.metadata["lang"] == "zh"
        assert ZH[h.start:h.end] == h.text
        en = db.search("what is retrieval augmented generation", k=5, scorer="tfidf")
        assert en[0].source == "notes/rag-en.md" and 0 < en[0].score <= 1.0 + 1e-12
        assert db.stats().documents == 2
        assert db.delete(d.id) == 1
        assert db.search("检索增强生成") == []
        assert db.delete(source="notes/rag-en.md") == 1
        assert db.stats().documents == 0 and db.stats().vocabulary == 0
        assert db.check() == []
    # persisted
    with ragdb.open(path) as db:
        assert db.stats().documents == 0


def test_persistence_across_open(tmp_path):
    path = tmp_path / "kb.db"
    with ragdb.open(path) as db:
        db.add(EN, source="a")
    with ragdb.open(path) as db:
        assert [h.source for h in db.search("retrieval")] == ["a"]


def test_identical_add_is_noop_and_replace_is_atomic():
    with ragdb.open(":memory:") as db:
        a = db.add(EN, source="s")
        gen = db.stats()
        b = db.add(EN, source="s")
        assert a.id == b.id and db.stats() == gen
        c = db.add("completely different text about penguins", source="s")
        assert c.id != a.id
        assert db.stats().documents == 1
        assert db.search("retrieval") == []
        assert [h.source for h in db.search("penguins")] == ["s"]
        assert db.check() == []


def test_hit_fields_and_spans_with_window_chunker():
    text = " ".join(f"word{i}" for i in range(500))
    with ragdb.open(":memory:") as db:
        db.add(text, source="long", chunker="window:size=100,overlap=20")
        assert db.stats().chunks == 6
        hits = db.search("word250", k=3)
        assert len(hits) == 2  # overlapping windows both hold it
        for h in hits:
            assert text[h.start:h.end] == h.text and "word250" in h.text


def test_chunker_none_keeps_one_chunk():
    with ragdb.open(":memory:") as db:
        db.add("para one.\n\npara two.\n\npara three.", source="x", chunker="none")
        assert db.stats().chunks == 1
        db.add("para one.\n\npara two.\n\npara three.", source="y", chunker="paragraph")
        assert db.stats().chunks == 4


@pytest.mark.parametrize("query", ["", "   ", "!!!", "\"unbalanced", "AND OR NOT", "*", "NEAR(a b)",
                                   "😀🎉", "a" * 100_000, "x' OR 1=1; DROP TABLE chunks; --", "中文 and English 混合",
                                   "\x00\x01", "(((", "col:value", "the of and"])
def test_queries_never_crash(query):
    with ragdb.open(":memory:") as db:
        db.add(EN, source="a")
        db.add(ZH, source="b")
        hits = db.search(query, k=3)
        assert isinstance(hits, list)
        assert db.check() == []


def test_empty_database_search():
    with ragdb.open(":memory:") as db:
        assert db.search("anything") == []
        assert db.search("anything", scorer="tfidf") == []


def test_bad_inputs_are_clear_errors_and_store_nothing():
    with ragdb.open(":memory:") as db:
        db.add(EN, source="keep")
        before = db.stats()
        with pytest.raises(InvalidInput, match="empty"):
            db.add("   ", source="x")
        with pytest.raises(InvalidInput, match="invisible"):  # BOM, zero-width space, joiner: nothing to find
            db.add("\ufeff\u200b \u200d\n", source="x")
        with pytest.raises(InvalidInput, match="JSON"):
            db.add("hello world", source="x", metadata={"bad": object()})
        with pytest.raises(InvalidInput, match="timestamp"):
            db.add("hello world", source="x", timestamp="yesterday")
        with pytest.raises(InvalidInput, match="text must be a string"):
            db.add(b"bytes", source="x")  # type: ignore[arg-type]
        with pytest.raises(InvalidInput, match="surrogate"):
            db.add("bad \udc80 text", source="x")
        with pytest.raises(InvalidInput, match="overlap"):
            db.add("hello world", source="x", chunker="window:size=10,overlap=10")
        with pytest.raises(InvalidInput, match="unknown"):
            db.add("hello world", source="x", chunker="sentences")
        with pytest.raises(InvalidInput, match="k must be"):
            db.search("x", k=0)
        with pytest.raises(InvalidInput, match="scorer"):
            db.search("x", scorer="magic")
        # a bad record in a batch: the whole batch is refused
        with pytest.raises(InvalidInput, match="record 1"):
            db.add_many([{"text": "fine text"}, {"text": 3}])
        with pytest.raises(DocumentNotFound):
            db.delete(12345)
        assert db.stats() == before
        assert db.check() == []
        assert db.add("\ufeffword\u200b", source="y").chunk_count == 1  # visible text among them is fine
        assert [h.source for h in db.search("word")] == ["y"]


def test_errors_share_one_base():
    for cls in (InvalidInput, NotADatabase, SchemaTooNew, AnalyzerMismatch, DocumentNotFound):
        assert issubclass(cls, RagdbError)


def test_not_a_database_is_refused_unchanged(tmp_path):
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not sqlite" * 100)
    before = junk.read_bytes()
    with pytest.raises(NotADatabase):
        ragdb.open(junk)
    assert junk.read_bytes() == before

    other = tmp_path / "other.db"
    conn = sqlite3.connect(other)
    conn.execute("CREATE TABLE t (x)")
    conn.commit()
    conn.close()
    before = other.read_bytes()
    with pytest.raises(NotADatabase, match="not a ragdb database"):
        ragdb.open(other)
    assert other.read_bytes() == before


def test_newer_schema_is_refused(tmp_path):
    path = tmp_path / "kb.db"
    with ragdb.open(path) as db:
        db.add(EN, source="a")
    conn = sqlite3.connect(path)
    conn.execute("INSERT INTO _sqlite_migrations (migration_set, name, applied_at) VALUES ('ragdb', '9999_future', 'x')")
    conn.commit()
    conn.close()
    with pytest.raises(SchemaTooNew, match="newer"):
        ragdb.open(path)


def test_analyzer_is_stored_and_enforced(tmp_path):
    path = tmp_path / "kb.db"
    with ragdb.open(path, analyzer="simple") as db:
        db.add("running dogs", source="a")
        assert db.search("run") == []  # no stemming in the simple analyzer
    with pytest.raises(AnalyzerMismatch):
        ragdb.open(path, analyzer="default")
    with ragdb.open(path) as db:
        assert db.analyzer.config()["stem"] is None


def test_default_analyzer_english_and_chinese():
    an = ragdb.Analyzer()
    assert an.terms("The Running DOGS") == ["run", "dog"]
    assert an.terms("ＡＢＣ") == an.terms("abc")  # NFKC full-width
    terms = an.terms("检索增强")
    assert {"检", "索", "检索", "索增", "增强"} <= set(terms)


def test_jieba_analyzer():
    pytest.importorskip("jieba")
    with ragdb.open(":memory:", analyzer="jieba") as db:
        db.add(ZH, source="zh")
        db.add(EN, source="en")
        assert db.search("检索增强生成")[0].source == "zh"


def test_bm25_matches_reference_formula():
    docs = {"a": "apple banana apple", "b": "banana cherry", "c": "cherry cherry cherry date"}
    with ragdb.open(":memory:", analyzer="simple") as db:
        for s, t in docs.items():
            db.add(t, source=s, chunker="none")
        hits = {h.source: h.score for h in db.search("apple cherry", k=10)}
    toks = {s: t.split() for s, t in docs.items()}
    n = len(toks)
    avgdl = sum(map(len, toks.values())) / n
    k1, b = BM25_K1, BM25_B

    def score(doc, q):
        total = 0.0
        for term in q:
            df = sum(term in t for t in toks.values())
            tf = toks[doc].count(term)
            if not tf:
                continue
            idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
            total += idf * tf / (tf + k1 * (1 - b + b * len(toks[doc]) / avgdl))
        return total

    for s in ("a", "b", "c"):
        expected = score(s, ["apple", "cherry"])
        if expected:
            assert hits[s] == pytest.approx(expected, rel=1e-12)
        else:
            assert s not in hits


def test_bm25_agrees_with_rank_bm25_ordering():
    rank_bm25 = pytest.importorskip("rank_bm25")
    corpus = ["the quick brown fox jumps", "a lazy dog sleeps all day", "quick quick fox and dog",
              "brown bears eat honey", "foxes are quick and clever animals"]
    with ragdb.open(":memory:", analyzer="simple") as db:
        for i, t in enumerate(corpus):
            db.add(t, source=str(i), chunker="none")
        ours = [int(h.source) for h in db.search("quick fox", k=5)]
    ref = rank_bm25.BM25Okapi([t.split() for t in corpus], k1=BM25_K1, b=BM25_B)
    scores = ref.get_scores(["quick", "fox"])
    theirs = [i for i in sorted(range(len(corpus)), key=lambda i: -scores[i]) if scores[i] > 0]
    assert ours == theirs


def test_tfidf_cosine_identical_doc_scores_one():
    with ragdb.open(":memory:") as db:
        db.add("alpha beta gamma", source="x", chunker="none")
        db.add("delta epsilon", source="y", chunker="none")
        hits = db.search("alpha beta gamma", scorer="tfidf")
        assert hits[0].source == "x" and hits[0].score == pytest.approx(1.0)


def test_explain_sums_to_score():
    with ragdb.open(":memory:") as db:
        db.add(EN, source="a")
        db.add("generation of electricity", source="b")
        for scorer in ("bm25", "tfidf"):
            for h in db.search("retrieval generation", scorer=scorer, explain=True):
                assert sum(h.explain.values()) == pytest.approx(h.score)
                assert set(h.explain) <= {"retriev", "generat"}


def test_min_score_refuses_weak_hits():
    with ragdb.open(":memory:") as db:
        db.add(EN, source="a")
        best = db.search("retrieval")[0].score
        assert db.search("retrieval", min_score=best + 1) == []
        assert len(db.search("retrieval", min_score=best)) == 1


def test_ties_are_ordered_by_source_then_position():
    with ragdb.open(":memory:") as db:
        for s in ["c", "a", "b"]:
            db.add("same text here", source=s)
        assert [h.source for h in db.search("same text", collapse=False)] == ["a", "b", "c"]  # copies kept


@pytest.mark.parametrize("scorer", ["bm25", "tfidf"])
def test_many_ties_at_the_cut_are_cut_in_content_order(scorer):
    """With more chunks tied at the k-th score than k (a footer on every page), the first k
    in content order are the hits, and pages neither repeat nor skip one: what sorting every
    tied hit gave (hits are now built for the first k only)."""
    import random

    sources = [f"p{i:03d}" for i in range(60)]
    random.Random(5).shuffle(sources)
    with ragdb.open(":memory:", chunker="none") as db:
        db.add_many([{"text": "copyright acme footer", "source": s} for s in sources]
                    + [{"text": "copyright acme", "source": "z-short"}, {"text": "copyright", "source": "y-shorter"}])
        every = [(h.source, h.score) for h in db.search("copyright", k=100, collapse=False, scorer=scorer)]
        assert [s for s, _ in every[:2]] == ["y-shorter", "z-short"] and [s for s, _ in every[2:]] == sorted(sources)
        for k in (1, 3, 7, 40):
            assert [(h.source, h.score) for h in db.search("copyright", k=k, collapse=False, scorer=scorer)] \
                == every[:k]
            paged = [(h.source, h.score) for offset in range(0, 62, k)
                     for h in db.search("copyright", k=k, offset=offset, collapse=False, scorer=scorer)]
            assert paged == every


def test_delete_by_glob_and_stats():
    with ragdb.open(":memory:") as db:
        db.add_many([{"text": f"document number {i}", "source": f"docs/{i}.md"} for i in range(5)]
                    + [{"text": "other", "source": "keep/x.md"}])
        assert db.delete(source="docs/*", glob=True) == 5
        st = db.stats()
        assert st.documents == 1 and st.chunks == 1
        assert db.check() == []


def test_flush_and_optimize_keep_results(tmp_path):
    texts = [f"topic{i % 7} shared words item{i} {'extra ' * (i % 3)}" for i in range(300)]
    with ragdb.open(tmp_path / "a.db") as db:
        db._settings["flush_threshold"] = 50
        for i, t in enumerate(texts):
            db.add(t, source=str(i))
        for i in range(0, 300, 3):
            db.delete(source=str(i))
        before = {s: fingerprint(db.search(q, k=20, scorer=s)) for q in ("topic3 item4", "shared extra")
                  for s in ("bm25", "tfidf")}
        assert db.stats().segments > 0
        assert db.check() == []
        db.optimize()
        assert db.check() == []
        after = {s: fingerprint(db.search(q, k=20, scorer=s)) for q in ("topic3 item4", "shared extra")
                 for s in ("bm25", "tfidf")}
        assert before == after
        assert db.stats().pending_chunks == 0


def test_two_connections_see_each_others_writes(tmp_path):
    path = tmp_path / "kb.db"
    with ragdb.open(path) as w, ragdb.open(path) as r:
        assert r.search("retrieval") == []
        w.add(EN, source="a")
        assert [h.source for h in r.search("retrieval")] == ["a"]
        w.delete(source="a")
        assert r.search("retrieval") == []
        r.add(ZH, source="b")
        assert [h.source for h in w.search("检索")] == ["b"]
        assert w.check() == [] and r.check() == []


# -- exactness: incremental == rebuild -----------------------------------------------------

WORDS = ["retrieval", "augmented", "generation", "index", "search", "model", "answer", "evidence",
         "检索", "增强", "生成", "知识库", "模型", "答案", "证据", "向量"]
texts = st.lists(st.sampled_from(WORDS), min_size=1, max_size=25).map(" ".join)
ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(0, 7), texts),
        st.tuples(st.just("delete"), st.integers(0, 7), st.just("")),
        st.tuples(st.just("flush"), st.just(0), st.just("")),
    ),
    min_size=1, max_size=30,
)
def assert_same_as_fresh(db, live, chunker):
    """``db`` answers every query exactly like a fresh database of the ``live`` documents
    (same chunks, same order, scores within 1e-9, both scorers); returns the fresh
    database's (documents, chunks, vocabulary, postings, average chunk length)."""
    with ragdb.open(":memory:", chunker=chunker) as fresh:
        fresh.add_many([{"text": t, "source": s} for s, t in sorted(live.items())])
        for q in QUERIES:
            for scorer in ("bm25", "tfidf"):
                a = fingerprint(db.search(q, k=50, scorer=scorer))
                b = fingerprint(fresh.search(q, k=50, scorer=scorer))
                assert [x[:4] for x in a] == [x[:4] for x in b]
                for x, y in zip(a, b):
                    assert abs(x[4] - y[4]) <= 1e-9
        sb = fresh.stats()
        return (sb.documents, sb.chunks, sb.vocabulary, sb.postings, sb.avg_chunk_length)


def apply_op(db, op: str, source: str, text: str, live: dict[str, str]) -> None:
    """One step of a random history: add (or replace) ``source``, delete it, or optimize
    (any other ``op``); ``live`` follows what a fresh database would hold."""
    if op == "add":
        db.add(text, source=source)
        live[source] = text
    elif op == "delete":
        db.delete(source=source)
        live.pop(source, None)
    else:
        db.optimize(vacuum=False)


QUERIES = ["retrieval generation", "检索增强生成", "model answer evidence", "知识库 search", "向量"]


@settings(max_examples=int(__import__("os").environ.get("RAGDB_HYPOTHESIS_EXAMPLES", "60")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(ops=ops, chunker=st.sampled_from(["none", "window:size=6,overlap=2"]), merge_part=st.sampled_from([1, 7, 1 << 21]),
       term_batch=st.sampled_from([1, 3, 50_000]))
def test_incremental_equals_rebuild(ops, chunker, merge_part, term_batch, each_kernel):
    import ragdb.index.inverted

    live: dict[str, str] = {}
    with mock.patch.object(ragdb.index.inverted, "MERGE_PART_POSTINGS", merge_part), \
            mock.patch.object(ragdb.index.inverted, "MERGE_TERM_BATCH", term_batch), \
            ragdb.open(":memory:", chunker=chunker) as db:
        db._settings["flush_threshold"] = 4
        for op, key, text in ops:
            apply_op(db, op, f"doc{key}", text, live)
        assert db.check() == []
        fresh_stats = assert_same_as_fresh(db, live, chunker)
        sa = db.stats()
        assert (sa.documents, sa.chunks, sa.vocabulary, sa.postings, sa.avg_chunk_length) == fresh_stats


@settings(max_examples=int(__import__("os").environ.get("RAGDB_HYPOTHESIS_EXAMPLES", "40")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(ops=ops, keep=st.booleans())
def test_reader_connection_follows_writer(tmp_path_factory, ops, keep):
    """A second connection that searches between another connection's writes
    (catching up through the change log, or reloading after flushes) always
    scores exactly like a fresh database of the live documents."""
    path = tmp_path_factory.mktemp("rw") / "kb.db"
    live: dict[str, str] = {}
    with ragdb.open(path, keep_versions=keep, chunker="window:size=6,overlap=2") as w, ragdb.open(path) as r:
        w._settings["flush_threshold"] = 5
        for op, key, text in ops:
            apply_op(w, op, f"doc{key}", text, live)
            r.search("warm the reader's view")
        assert_same_as_fresh(r, live, "window:size=6,overlap=2")
        assert r.check() == []


two_writer_ops = st.lists(
    st.tuples(st.sampled_from(["add", "delete", "optimize"]), st.integers(0, 1), st.integers(0, 5),
              st.lists(st.sampled_from(WORDS + [f"w{i}" for i in range(12)]), min_size=1, max_size=12).map(" ".join)),
    min_size=1, max_size=25)


@settings(max_examples=int(__import__("os").environ.get("RAGDB_HYPOTHESIS_EXAMPLES", "40")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(ops=two_writer_ops, share=st.sampled_from([1, 4, 1 << 20]))
def test_writers_with_a_vocabulary_too_large_to_keep_whole(tmp_path_factory, ops, share):
    """Writers that keep only the vocabulary's frequent terms (a vocabulary over
    WRITER_TERM_CACHE; forced here) and look the others up: two of them on one file, with
    new terms, deletes and optimizes that remove unused terms (which renumbers nothing but
    must not leave a cached id of a removed term), index exactly like a fresh database."""
    import ragdb.engine.write

    path = tmp_path_factory.mktemp("vocab") / "kb.db"
    live: dict[str, str] = {}
    with mock.patch.object(ragdb.engine.write, "WRITER_TERM_CACHE", 0), \
            mock.patch.object(ragdb.engine.write, "WRITER_FREQUENT_SHARE", share), \
            ragdb.open(path) as a, ragdb.open(path) as b:
        writers = (a, b)
        for w in writers:
            w._settings["flush_threshold"] = 3
        for op, who, key, text in ops:
            apply_op(writers[who], op, f"doc{key}", text, live)
        for w in writers:
            assert w.check() == []
            assert_same_as_fresh(w, live, "none")


@pytest.mark.parametrize("share", [1, 1 << 20])
def test_a_writer_forgets_terms_that_another_connections_optimize_removed(tmp_path, share):
    import ragdb.engine.write

    path = tmp_path / "kb.db"
    with mock.patch.object(ragdb.engine.write, "WRITER_TERM_CACHE", 0), \
            mock.patch.object(ragdb.engine.write, "WRITER_FREQUENT_SHARE", share), \
            ragdb.open(path) as a, ragdb.open(path) as b:
        a.add_many([{"text": f"common words here {i}", "source": f"c{i}"} for i in range(8)])
        a.add("common zeta", source="z")
        a.add("common eta", source="e")
        a.delete(source="z")
        a.delete(source="e")
        b.optimize(vacuum=False)  # removes zeta and eta from the vocabulary
        a.add("common eta again", source="e2")
        b.add("zeta returns", source="z2")
        for w in (a, b):
            assert w.check() == []
            assert [h.source for h in w.search("eta")] == ["e2"]
            assert [h.source for h in w.search("zeta")] == ["z2"]
        assert_same_as_fresh(a, {**{f"c{i}": f"common words here {i}" for i in range(8)},
                                 "e2": "common eta again", "z2": "zeta returns"}, "none")


def test_searching_an_up_to_date_database_does_not_import_sqlite_utils(tmp_path):
    """sqlite-utils (with click, dateutil, pluggy) is only needed to migrate: a
    process that opens a current database and searches stays ~10 MiB smaller."""
    path = tmp_path / "kb.db"
    with ragdb.open(path) as db:
        db.add("retrieval augmented generation", source="a")
    code = ("import sys, ragdb\n"
            f"db = ragdb.open({str(path)!r})\n"
            "assert db.search('retrieval')[0].source == 'a'\n"
            "db.close()\n"
            "print(sorted(m for m in ('sqlite_utils', 'click') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("merge_part,term_batch", [(1, 50_000), (10, 1), (10, 4), (1 << 21, 50_000), (1 << 21, 7)])
def test_bulk_load_that_flushes_midway_ends_with_one_segment_per_term(tmp_path, monkeypatch, merge_part, term_batch):
    """(``merge_part``: postings merged at a time, so the final merge runs in parts;
    ``term_batch``: terms outside the last tail looked at a time)"""
    from ragdb import database
    from ragdb.index import inverted as index

    monkeypatch.setattr(database, "BULK_FLUSH_CHUNKS", 7)
    monkeypatch.setattr(index, "MERGE_PART_POSTINGS", merge_part)
    monkeypatch.setattr(index, "MERGE_TERM_BATCH", term_batch)
    texts = [f"{EN} document {i} {'extra' * (i % 3)}" for i in range(40)] + [f"{ZH} 第{i}篇" for i in range(20)]
    with ragdb.open(tmp_path / "kb.db") as db:
        db.add_many(({"text": t, "source": f"d{i}"} for i, t in enumerate(texts)), batch_size=5, chunker="none")
        s = db.stats()
        assert s.pending_chunks == 0
        assert s.segments == s.vocabulary  # one segment per term
        assert db.check() == []
        got = [(h.source, h.score) for h in db.search("retrieval document 检索", k=60)]
    with ragdb.open(tmp_path / "fresh.db") as fresh:
        for i, t in enumerate(texts):
            fresh.add(t, source=f"d{i}", chunker="none")
        want = [(h.source, h.score) for h in fresh.search("retrieval document 检索", k=60)]
    assert [s for s, _ in got] == [s for s, _ in want]
    assert all(abs(a - b) < 1e-9 for (_, a), (_, b) in zip(got, want))


def _hit_fields(hits):
    return sorted((h.chunk_id, h.doc_id, h.source, h.version, h.timestamp, h.text, h.start, h.end, h.ordinal,
                   dict(h.metadata)) for h in hits)


def test_hits_of_whole_document_chunks_equal_the_stored_rows(tmp_path):
    """Whole-document chunks are read from the document row alone; every field
    must equal what the chunk row says, in the writer, a second connection
    that catches up, and a fresh open."""
    from ragdb.storage.textcodec import new_codec
    from ragdb.types import Span

    path = tmp_path / "kb.db"
    long_text = "\n\n".join(f"Paragraph {i} about retrieval and ranking of passages." for i in range(30))
    with ragdb.open(path) as db, ragdb.open(path) as other:
        other.search("retrieval")  # loaded before the writes: catches up afterwards
        db.add("retrieval in one chunk", source="whole", version="3", metadata={"lang": "en"}, chunker="none")
        db.add(long_text, source="split", chunker="window:size=20,overlap=5")
        db.add("retrieval with a section", source="spanned", chunker="none",
               spans=[Span(0, 9, {"section": "Intro"})])
        db.add("检索 retrieval 中文", source="zh", timestamp="2026-01-02T03:04:05Z", chunker="none")
        views = [db.search("retrieval", k=100), other.search("retrieval", k=100)]
    with ragdb.open(path) as again:
        views.append(again.search("retrieval", k=100))
    with sqlite3.connect(path) as conn:
        rows = conn.execute(
            'SELECT c.id, c.doc_id, d.source, d.version, d.timestamp, coalesce(c.text, d.text), c.start, c."end", '
            "c.ordinal, c.metadata, d.metadata FROM chunks c JOIN documents d ON d.id = c.doc_id").fetchall()
        codec = new_codec(conn)  # a stored text may be a zstd frame (migration 0010)
        want = sorted((r[0], r[1], r[2], r[3], r[4], codec.decode(r[5]), r[6], r[7], r[8],
                       {**orjson.loads(r[10]), **orjson.loads(r[9])}) for r in rows)
    assert len(want) > 5
    for hits in views:
        assert _hit_fields(hits) == want
    whole = [w for w in want if w[2] == "whole"][0]
    assert whole[6:9] == (0, len("retrieval in one chunk"), 0) and whole[9] == {"lang": "en"}
    assert [w for w in want if w[2] == "spanned"][0][9] == {"section": "Intro"}


def _load(db, texts, **kw):
    return db.add_many(({"text": t, "source": f"d{i}"} for i, t in enumerate(texts)), **kw)


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("vocabulary", [None, 10])
def test_parallel_analysis_gives_the_same_database(tmp_path, monkeypatch, workers, vocabulary):
    from ragdb.engine import prepare as ingest
    from ragdb.text import analysis

    monkeypatch.setattr(ingest, "POOL_AFTER", 5)
    monkeypatch.setattr(ingest, "ANALYSIS_PART", 3)
    if vocabulary is not None:  # the workers start their term numbers again many times (the pool passes it on)
        monkeypatch.setattr(analysis, "WORKER_VOCABULARY", vocabulary)
    # (compounds too: their whole forms' overlaps travel back from the workers, and set chunk lengths)
    compounds = [f"node.js e-mail v2.{i} x86_64 " * (i % 2) for i in range(60)]
    texts = [f"{EN} number {i} {'retrieval ' * (i % 4)}{compounds[i]}" if i % 3 else f"{ZH} 第{i}段 检索"
             for i in range(60)]
    with ragdb.open(tmp_path / "par.db") as par, ragdb.open(tmp_path / "ser.db") as ser:
        a = _load(par, texts, workers=workers, batch_size=7, chunker="window:size=8,overlap=2")
        b = _load(ser, texts, workers=0, batch_size=7, chunker="window:size=8,overlap=2")
        assert [(d.id, d.source, d.chunk_count) for d in a] == [(d.id, d.source, d.chunk_count) for d in b]
        assert par.check() == [] and par.stats() == dataclasses.replace(ser.stats(), file_size=par.stats().file_size)
        for q in ("retrieval number", "检索增强", "answer 第3段", "node.js e-mail", "v2.5"):
            assert [(h.chunk_id, h.score, h.text) for h in par.search(q, k=50)] == \
                   [(h.chunk_id, h.score, h.text) for h in ser.search(q, k=50)]
    # the same vocabulary and forward indexes, byte for byte
    for query in ("SELECT id, term, df FROM vocabulary ORDER BY id",
                  "SELECT id, length, terms, tfs FROM chunks ORDER BY id",
                  "SELECT term_id, segment, n, chunk_ids, tfs FROM postings ORDER BY term_id, segment"):
        with contextlib.closing(sqlite3.connect(tmp_path / "par.db")) as x, \
                contextlib.closing(sqlite3.connect(tmp_path / "ser.db")) as y:
            assert x.execute(query).fetchall() == y.execute(query).fetchall()


def test_parallel_load_with_a_bad_record_keeps_the_batches_before_it(tmp_path, monkeypatch):
    from ragdb.engine import prepare as ingest

    monkeypatch.setattr(ingest, "POOL_AFTER", 5)
    monkeypatch.setattr(ingest, "ANALYSIS_PART", 3)

    def records():
        for i in range(40):
            yield {"text": f"document {i} about retrieval", "source": f"d{i}"}
        yield {"text": "", "source": "bad"}  # invalid: empty text
        yield {"text": "never written", "source": "after"}

    with ragdb.open(tmp_path / "kb.db") as db:
        with pytest.raises(InvalidInput, match="bad"):
            db.add_many(records(), batch_size=10, workers=1)
        assert sorted(d.source for d in db.documents()) == sorted(f"d{i}" for i in range(40))
        assert db.check() == []
        with pytest.raises(InvalidInput, match="workers"):
            db.add_many([{"text": "x"}], workers=-1)


def test_bulk_load_falls_back_to_one_process_when_workers_cannot_start(tmp_path, monkeypatch):
    from ragdb.text import analysis
    from ragdb.engine import prepare as ingest

    def refuse(self, *a, **kw):
        raise OSError("no processes for you")

    monkeypatch.setattr(ingest, "POOL_AFTER", 3)
    monkeypatch.setattr(analysis.AnalysisPool, "__init__", refuse)
    with ragdb.open(tmp_path / "kb.db") as db:
        docs = _load(db, [f"document {i} about retrieval" for i in range(20)], workers=2, batch_size=4)
        assert len(docs) == 20 and db.stats().documents == 20 and db.check() == []


def test_analysis_worker_that_dies_is_an_error_not_a_hang(tmp_path, monkeypatch):
    from ragdb.text import analysis
    from ragdb.engine import prepare as ingest

    monkeypatch.setattr(ingest, "POOL_AFTER", 3)
    monkeypatch.setattr(ingest, "ANALYSIS_PART", 2)
    real_submit = analysis.AnalysisPool.submit

    def submit_then_kill(self, texts):
        job = real_submit(self, texts)
        for proc in self._procs:
            proc.kill()
            proc.join()
        return job

    monkeypatch.setattr(analysis.AnalysisPool, "submit", submit_then_kill)
    with ragdb.open(tmp_path / "kb.db") as db:
        with pytest.raises(RagdbError, match="worker"):
            _load(db, [f"document {i} about retrieval" for i in range(30)], workers=1, batch_size=5)
        assert db.check() == []


def test_migration_from_schema_3_keeps_deleted_chunks_out_of_df(tmp_path):
    """0004 moves dead_chunks (the terms of deleted flushed chunks) onto their chunk_log
    entries: after migrating, scores still equal a fresh build, and the next flush folds
    the same corrections into df."""
    path = tmp_path / "old.db"
    live = {f"d{i}": f"retrieval {WORDS[i % len(WORDS)]} generation {WORDS[(i * 3) % len(WORDS)]} doc{i}"
            for i in range(12)}
    with ragdb.open(path, chunker="none") as db:
        db.add_many([{"text": t, "source": s} for s, t in live.items()])
        db.optimize(vacuum=False)  # every chunk flushed
        for s in ("d1", "d4", "d7"):
            db.delete(source=s)  # flushed latest chunks deleted: their terms must leave df
            del live[s]
        db.add("retrieval augmented tail", source="t")  # one unflushed chunk too
        live["t"] = "retrieval augmented tail"
    # Turn it into a schema-3 database: the dead chunks' terms back in dead_chunks.
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE dead_chunks (id INTEGER PRIMARY KEY, terms BLOB NOT NULL)")
    conn.execute("INSERT INTO dead_chunks (id, terms) SELECT chunk_id, terms FROM chunk_log WHERE terms IS NOT NULL")
    assert conn.execute("SELECT count(*) FROM dead_chunks").fetchone()[0] == 3
    # chunk_log as schema 3 had it (rebuilt: DROP COLUMN needs SQLite 3.35)
    conn.execute("CREATE TABLE old_log (seq INTEGER PRIMARY KEY, chunk_id INTEGER NOT NULL, state INTEGER NOT NULL)")
    conn.execute("INSERT INTO old_log SELECT seq, chunk_id, state FROM chunk_log")
    conn.execute("DROP TABLE chunk_log")
    conn.execute("ALTER TABLE old_log RENAME TO chunk_log")
    conn.execute("DELETE FROM _sqlite_migrations WHERE name = '0004_dead_terms_in_log'")
    conn.commit()
    conn.close()
    with ragdb.open(path) as db:
        assert_same_as_fresh(db, live, "none")
        assert db.check() == []
    with ragdb.open(path) as db:
        db.optimize(vacuum=False)  # the flush folds the carried-over corrections into df
        assert_same_as_fresh(db, live, "none")
        assert db.check() == []
    conn = sqlite3.connect(path)
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert "dead_chunks" not in tables
    assert conn.execute("SELECT count(*) FROM chunk_log").fetchone()[0] == 0


@given(st.lists(st.integers(0, 2**32 - 1) | st.integers(0, 70000), max_size=300))
def test_stable_order_is_a_stable_argsort(keys):
    from ragdb.index.inverted import _stable_order

    arr = np.array(keys, dtype=np.int64)
    assert _stable_order(arr).tolist() == np.argsort(arr, kind="stable").tolist()


def test_nan_or_infinity_in_metadata_is_refused_not_stored_as_null():
    with ragdb.open(":memory:") as db:
        with pytest.raises(InvalidInput, match=r"metadata 'score' is nan"):
            db.add("hello world", source="a", metadata={"score": float("nan")})
        with pytest.raises(InvalidInput, match=r"metadata 'x\.y\[1\]' is inf"):
            db.add("hello world", source="a", metadata={"x": {"y": [1.5, float("inf")]}})
        assert db.stats().documents == 0
        doc = db.add("hello world", source="a", metadata={"none": None, "text": "null", "n": 1e308})
        assert doc.metadata == {"none": None, "text": "null", "n": 1e308}


def test_new_files_have_8_kib_pages_and_older_files_keep_theirs(tmp_path):
    from ragdb.storage.store import PAGE_SIZE

    new = tmp_path / "new.db"
    with ragdb.open(new) as db:
        db.add(EN, source="a")
    old = tmp_path / "old.db"
    conn = sqlite3.connect(old)
    conn.execute("PRAGMA page_size = 4096")
    conn.execute("VACUUM")
    conn.close()
    with ragdb.open(old) as db:  # an empty file made elsewhere: ragdb keeps its page size
        db.add(EN, source="a")
        assert db.check() == []
    for path, size in ((new, PAGE_SIZE), (old, 4096)):
        conn = sqlite3.connect(path)
        assert conn.execute("PRAGMA page_size").fetchone()[0] == size
        conn.close()
    assert PAGE_SIZE == 8192


def test_each_write_is_one_transaction(tmp_path, monkeypatch):
    """An add, a small add_many, a replace, an update and a delete each run one transaction:
    nothing before or after the write takes the write lock again (an empty transaction after
    every add had doubled its BEGIN/COMMIT pairs)."""
    statements: list[str] = []
    real = sqlite3.connect

    def connect(*args, **kwargs):
        conn = real(*args, **kwargs)
        conn.set_trace_callback(statements.append)
        return conn

    monkeypatch.setattr(sqlite3, "connect", connect)
    with ragdb.open(tmp_path / "kb.db", chunker="none") as db:
        db.add("warm words", source="w")
        writes = [lambda: db.add("alpha beta", source="a"),
                  lambda: db.add_many([{"text": "gamma", "source": "g"}, {"text": "delta", "source": "d"}]),
                  lambda: db.add("alpha beta again", source="a"),
                  lambda: db.update(3, metadata={"k": 1}),
                  lambda: db.delete(source="d")]
        for write in writes:
            statements.clear()
            write()
            begins = [s for s in statements if s.startswith("BEGIN IMMEDIATE")]  # (reads take BEGIN)
            assert len(begins) == 1, statements
        assert db.get(3).source == "g" and db.get(3).metadata == {"k": 1}


@pytest.mark.parametrize("span,problem", [
    (("abc",), "metadata must be a mapping"),
    (({"x": {1, 2}},), "not JSON-serialisable"),
    (({1: "x"},), "not JSON-serialisable"),
    (({"x": 10**30},), "metadata .x. holds 10+, outside the 64-bit integer range"),
    (({"x": b"raw"},), "not JSON-serialisable"),
    (({"x": float("nan")},), "'x' is nan"),
    (("0", 5, {}), "start must be an integer"),
    ((5, 2, {}), "0 <= start <= end"),
    ((-1, 2, {}), "0 <= start <= end"),
])
def test_span_metadata_and_bounds_are_checked_as_a_documents_are(tmp_path, span, problem):
    """A span's metadata went unchecked: a set or bytes raised TypeError, a str ValueError
    (mid-write), a NaN was stored as null."""
    from ragdb.types import Span

    args = (0, 5, *span) if len(span) == 1 else span
    with ragdb.open(tmp_path / "kb.db") as db:
        db.add("kept text", source="kept.md")
        with pytest.raises(InvalidInput, match=f"document 'bad.md': span 0: .*{problem}"):
            db.add("some span text here", source="bad.md", spans=[Span(*args)])
        assert [d.source for d in db.documents()] == ["kept.md"] and db.check() == []


def test_a_chunk_takes_the_section_its_own_text_starts_in_not_its_overlaps(tmp_path):
    """A chunk of a new section whose overlap began in the last lines of the section before
    was labelled with that section (and 'section:beta' missed it)."""
    from ragdb.files.loaders import load_bytes

    def para(word, n):
        return " ".join([word] * n) + "."

    md = (f"# Guide\n\n## Alpha\n\n{para('alphaword', 70)}\n\n{para('alphaword', 70)}\n\nShort alpha end.\n\n"
          f"## Beta\n\n{para('betaword', 70)}\n\n{para('betaword', 50)}\n")
    with ragdb.open(tmp_path / "kb.db", chunker="recursive:size=800,overlap=100") as db:
        db.add_many(load_bytes(md.encode(), source="g.md", kind="markdown"))
    with ragdb.open(tmp_path / "kb.db") as db:  # as a new handle reads them
        hits = db.search("betaword", k=5, collapse=False)
        assert hits[0].text.startswith("Short alpha end.")  # its overlap: the end of Alpha
        assert {h.section for h in hits} == {"Guide > Beta"}
        assert {h.chunk_id for h in db.search("section:beta", k=5)} == {h.chunk_id for h in hits}
        assert {h.section for h in db.search("alphaword", k=5)} == {"Guide > Alpha"}


@settings(max_examples=200, deadline=None)
@given(text=st.lists(st.sampled_from(list("ab 中文$.!,\n+-") + ["word", "C++", "😀", "\u200b"]), max_size=40).map("".join),
       size=st.integers(1, 6), overlap_share=st.integers(0, 5))
def test_the_window_chunker_leaves_no_text_out(text, size, overlap_share):
    """Windows ran from their first token to their last: the text before the first token,
    after the last and between windows that do not overlap was in no chunk ('$100 fee. C++
    rocks!' chunked as '100 fee', 'C++ rocks')."""
    from ragdb.text.chunking import get_chunker

    overlap = min(overlap_share, size - 1)
    spans = get_chunker(f"window:size={size},overlap={overlap}").split(text)
    covered = {i for a, b in spans for i in range(a, b)}
    assert [text[i] for i in range(len(text)) if i not in covered and not text[i].isspace()] == []
    assert all(0 <= a < b <= len(text) and not text[a].isspace() and not text[b - 1].isspace() for a, b in spans)
    assert [a for a, _b in spans] == sorted(a for a, _b in spans)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(words=st.integers(5, 60), size=st.integers(2, 12), overlap_share=st.floats(0, 0.95),
       cuts=st.lists(st.integers(1, 59), max_size=5, unique=True))
def test_chunk_metadata_survives_export_and_import_unchanged(tmp_path_factory, words, size, overlap_share, cuts):
    """Export wrote each chunk's metadata as a span from its start to the next chunk's; a chunk
    takes the span covering the most of its own text, so with overlaps of more than half the
    labels moved one chunk on at each export and import."""
    from ragdb.files import transfer
    from ragdb.types import Span

    text = " ".join(f"w{i}" for i in range(words))
    bounds = [0, *sorted(text.index(f"w{c}") for c in cuts if c < words), len(text)]
    spans = [Span(a, b, {"section": f"S{k}"}) for k, (a, b) in enumerate(zip(bounds, bounds[1:])) if b > a]
    chunker = f"window:size={size},overlap={min(int(size * overlap_share), size - 1)}"
    folder = tmp_path_factory.mktemp("spans")

    def sections(db):
        return [(s["start"] < s["end"], s["metadata"]) for s in next(db.records(principals=ragdb.ALL))["spans"]]

    with ragdb.open(folder / "a.db", chunker=chunker) as db:
        db.add(text, source="doc.md", spans=spans)
        first = sections(db)
        transfer.export_jsonl(db, folder / "a.jsonl", principals=ragdb.ALL)
    for n in range(2):
        with ragdb.open(folder / f"b{n}.db", chunker=chunker) as db:
            transfer.import_jsonl(db, folder / ("a.jsonl" if n == 0 else "b0.jsonl"))
            assert sections(db) == first
            transfer.export_jsonl(db, folder / f"b{n}.jsonl", principals=ragdb.ALL)
