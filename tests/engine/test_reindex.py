"""Database.reindex and ``ragdb reindex``: a database's lexical index rebuilt with another
analyzer, in place and in one transaction, equal to a fresh build of the same documents."""

import os
import subprocess
import sys

import pytest

import ragdb
from ragdb.engine import write
from ragdb.models.embeddings import HashEmbedder
from ragdb.errors import AnalyzerMismatch, InvalidInput, StorageError
from ragdb.storage import Store

from cli_helpers import out_json, run

V1 = {"name": "ragdb", "version": 1, "stem": "english", "stopwords": "english+chinese", "cjk": "bigram"}
V2 = dict(V1, version=2)

LONG = ("CMake configures C++ projects. Set CMAKE_CXX_STANDARD to 17 and link std::vector code. " * 6
        + "node.js and npm install packages; e-mail the maintainers about x86_64 builds. " * 5)
HISTORY = [  # (operation, arguments) replayed on both databases
    ("add", {"text": "C++ and C# on .NET: the C++ standard library.", "source": "lang/cpp.md",
                 "metadata": {"lang": "en", "tags": ["cpp"]}, "acl": ["dev"]}),
    ("add", {"text": "The C language and R for statistics; vitamin D and T cells.", "source": "lang/c.md"}),
    ("add", {"text": "向量数据库是什么？使用C++编程和node.js开发。检索增强生成（RAG）。", "source": "zh/rag.md",
                 "metadata": {"lang": "zh"}}),
    ("add", {"text": LONG, "source": "guide/long.md", "chunker": "recursive:size=160,overlap=30"}),
    ("add", {"text": LONG.replace("CMake", "Meson"), "source": "guide/window.md", "chunker": "window:size=12,overlap=4"}),
    ("add", {"text": "Python 3.11 and v2.0.1 wheels for x86_64, version one.", "source": "rel/notes.md",
                 "version": "1"}),
    ("add", {"text": "Python 3.12 and v2.1.0 wheels for aarch64, version two.", "source": "rel/notes.md",
                 "version": "2"}),
    ("add", {"text": "Python 3.13 and v3.0.0 wheels, e-mail us.", "source": "rel/notes.md", "version": "3"}),
    ("add", {"text": "Temporary note about F# and g++.", "source": "tmp/note.md"}),
    ("add", {"text": "Another temporary note about email.", "source": "tmp/other.md"}),
    ("delete", {"source": "tmp/note.md"}),
    ("update", {"source": "lang/c.md", "metadata": {"lang": "en", "reviewed": True}}),
    ("delete_version", {"source": "rel/notes.md", "version": "2"}),
]
QUERIES = ["C++", "C#", ".NET", "node.js", "e-mail", "email", "x86_64", "std::vector", "CMAKE_CXX_STANDARD",
           "cxx standard", "Python 3.11", "v2.1.0", "vitamin D", "T cells", "R", "向量数据库", "什么是检索增强生成",
           "the C language", "wheels", "F#", "temporary note", "the of"]


def replay(db, history=HISTORY):
    for op, args in history:
        if op == "add":
            db.add(**args)
        elif op == "delete":
            db.delete(source=args["source"])
        elif op == "update":
            doc = db.documents(args["source"], principals=ragdb.ALL)[0]
            db.update(doc.id, metadata=args["metadata"])
        else:  # one kept version of a source
            doc = next(d for d in db.documents(args["source"], versions="all", principals=ragdb.ALL)
                       if d.version == args["version"])
            db.delete(doc.id)


def searches(db, queries=QUERIES):
    """Every query with both lexical scorers, latest and all versions: (source, version, span, score, confidence)."""
    out = {}
    for q in queries:
        for scorer in ("bm25", "tfidf"):
            for versions in ("latest", "all"):
                out[q, scorer, versions] = [
                    (h.source, h.version, h.start, h.end, h.score, h.confidence)
                    for h in db.search(q, k=20, scorer=scorer, versions=versions, principals=ragdb.ALL)]
    return out


def documents(db):
    return [(d.id, d.source, d.version, d.content_hash, dict(d.metadata), d.acl, d.chunk_count, d.latest)
            for d in db.documents(versions="all", principals=ragdb.ALL)]


def test_reindex_equals_a_fresh_build(tmp_path):
    """A version 1 database with kept versions, replacements, deletes and an update, reindexed
    with the default analyzer: every search (scores, confidences, both scorers, latest and all
    versions) equals a new database built with it by the same history; documents, chunk ids,
    spans and vectors stay; every invariant holds."""
    emb = HashEmbedder(64)
    path = tmp_path / "kb.db"
    with ragdb.open(path, analyzer=V1, keep_versions=True, embedder=emb) as db:
        replay(db)
        docs_before = documents(db)
        chunks_before = sorted((h.chunk_id, h.source, h.start, h.end) for h in
                               db.search("wheels C++ node.js RAG", k=100, scorer="vector", versions="all",
                                         principals=ragdb.ALL))
        vectors_before = db.vector_info()
        assert db.search("C++") == []  # version 1 drops it
        report = db.reindex()
        assert report.previous == V1 and report.analyzer == V2
        assert report.documents == len(docs_before) and report.chunks == db.stats().stored_chunks
        assert db.check() == []
        assert db.settings["analyzer"] == V2 and db.analyzer.config() == V2
        assert documents(db) == docs_before
        assert sorted((h.chunk_id, h.source, h.start, h.end) for h in
                      db.search("wheels C++ node.js RAG", k=100, scorer="vector", versions="all",
                                principals=ragdb.ALL)) == chunks_before
        assert db.vector_info() == vectors_before
        got = searches(db)
    with ragdb.open(tmp_path / "fresh.db", keep_versions=True) as fresh:
        replay(fresh)
        assert fresh.settings["analyzer"] == V2
        expected = searches(fresh)
        fresh_stats = fresh.stats()
    assert got == expected
    assert got["C++", "bm25", "latest"][0][0] == "lang/cpp.md"
    with ragdb.open(path) as db:  # reopened: the stored analyzer is the new one
        assert db.analyzer.config() == V2 and searches(db) == expected
        s = db.stats()
        assert (s.documents, s.chunks, s.avg_chunk_length, s.vocabulary, s.postings) == \
            (fresh_stats.documents, fresh_stats.chunks, fresh_stats.avg_chunk_length, fresh_stats.vocabulary,
             fresh_stats.postings)
        assert s.pending_chunks == 0 and db.check() == []


@pytest.mark.parametrize("target", ["simple", V1, "default"])
def test_reindex_to_any_analyzer_and_back(tmp_path, target, monkeypatch):
    """Into another analyzer (or the same one again), in batches (several postings segments
    merged): searches equal a fresh build with it; then back to the default."""
    monkeypatch.setattr(write, "REINDEX_BATCH", 3)
    with ragdb.open(tmp_path / "kb.db", keep_versions=True) as db:
        replay(db)
        db.reindex(target)
        assert db.check() == []
        with ragdb.open(":memory:", analyzer=target, keep_versions=True) as fresh:
            replay(fresh)
            assert searches(db) == searches(fresh)
        db.reindex()
        assert db.check() == [] and db.analyzer.config() == V2
        with ragdb.open(":memory:", keep_versions=True) as fresh:
            replay(fresh)
            assert searches(db) == searches(fresh)


def test_a_failed_reindex_changes_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(write, "REINDEX_BATCH", 2)
    real = Store.set_forward_indexes
    calls = []

    def fail_second_batch(self, rows):
        calls.append(1)
        if len(calls) == 2:
            raise OSError("disk on fire")
        real(self, rows)

    path = tmp_path / "kb.db"
    with ragdb.open(path, analyzer=V1, keep_versions=True) as db, ragdb.open(path) as other:
        replay(db)
        before = searches(db)
        monkeypatch.setattr(Store, "set_forward_indexes", fail_second_batch)
        with pytest.raises(OSError, match="disk on fire"):
            db.reindex()
        monkeypatch.setattr(Store, "set_forward_indexes", real)
        assert len(calls) == 2
        assert db.settings["analyzer"] == V1 and db.analyzer.config() == V1
        assert searches(db) == before and searches(other) == before
        assert db.check() == []
        db.add("C++ again", source="late.md")  # and the database goes on working
        assert db.check() == []


def test_reindex_is_refused_inside_a_transaction_and_read_only(tmp_path):
    path = tmp_path / "kb.db"
    with ragdb.open(path, analyzer=V1) as db:
        db.add("C++ text", source="a")
        with pytest.raises(InvalidInput, match="reindex runs in a transaction of its own"), db.transaction():
            db.reindex()
        assert db.analyzer.config() == V1
    with ragdb.open(path, readonly=True) as ro, pytest.raises(StorageError):
        ro.reindex()
    with pytest.raises(InvalidInput, match="analyzer 'bogus'"), ragdb.open(path) as db:
        db.reindex("bogus")


def test_other_connections_follow_a_reindex(tmp_path):
    """A connection opened before another one reindexed searches and writes with the new
    analyzer from its next read on; a read it holds open meanwhile sees the old index whole."""
    path = tmp_path / "kb.db"
    with ragdb.open(path, analyzer=V1) as first:
        first.add("C++ templates", source="cpp")
        first.add("Plain words only", source="plain")
    with ragdb.open(path) as a, ragdb.open(path) as b:
        assert b.analyzer.version == 1
        reading = b.records()
        next(reading)  # b holds a read transaction: its snapshot is from before the reindex
        a.reindex()
        assert b.search("C++") == [] and b.search("templates")[0].source == "cpp"  # the old index, whole
        reading.close()
        assert [h.source for h in b.search("C++")] == ["cpp"]  # the new one
        assert b.analyzer.version == 2
        b.add("More C++ and node.js", source="more")
        assert b.check() == [] and a.check() == []
        with ragdb.open(":memory:") as fresh:
            for source, text in (("cpp", "C++ templates"), ("plain", "Plain words only"),
                                 ("more", "More C++ and node.js")):
                fresh.add(text, source=source)
            for q in ("C++", "node.js", "templates", "plain words"):
                assert [(h.source, h.score) for h in a.search(q)] == [(h.source, h.score) for h in fresh.search(q)]
                assert [(h.source, h.score) for h in b.search(q)] == [(h.source, h.score) for h in fresh.search(q)]


def test_a_batch_analyzed_before_another_connections_reindex_is_analyzed_again(tmp_path):
    path = tmp_path / "kb.db"
    with ragdb.open(path, analyzer=V1) as first:
        first.add("seed text", source="seed")
    with ragdb.open(path) as a, ragdb.open(path) as b:
        def records():
            yield {"text": "C++ first record", "source": "r1"}  # analyzed by b with version 1...
            a.reindex()  # ...then the other connection reindexes before b writes it
            yield {"text": "C# second record", "source": "r2"}

        b.add_many(records(), batch_size=1)
        assert [h.source for h in b.search("C++")] == ["r1"] and [h.source for h in a.search("C#")] == ["r2"]
        assert b.check() == []
        with ragdb.open(":memory:") as fresh:
            for source, text in (("seed", "seed text"), ("r1", "C++ first record"), ("r2", "C# second record")):
                fresh.add(text, source=source)
            for q in ("C++", "C#", "record", "seed"):
                assert [(h.source, h.score) for h in b.search(q)] == [(h.source, h.score) for h in fresh.search(q)]


# --------------------------------------------------------------------------- the command


def test_ragdb_init_makes_version_2_databases(tmp_path, runner):
    made = out_json(run(runner, "-d", tmp_path / "new.db", "init", "--json"))
    assert made["analyzer"] == V2
    simple = out_json(run(runner, "-d", tmp_path / "simple.db", "init", "--analyzer", "simple", "--json"))
    assert simple["analyzer"] == {"name": "ragdb", "version": 2, "stem": None, "stopwords": None, "cjk": "bigram"}


def test_ragdb_reindex_command(tmp_path, runner):
    path = tmp_path / "kb.db"
    with ragdb.open(path, analyzer=V1) as db:
        db.add("C++ templates and the standard library", source="cpp.md")
        db.add("Node.js and npm", source="node.md")
    no_hits = run(runner, "-d", path, "search", "C++")
    assert no_hits.stdout.strip() == "no hits"
    assert ('no hits: every word of the query was dropped by the analyzer: "C++" (one letter: too short); this '
            "database's analyzer is version 1, and version 2 keeps \"C++\": 'ragdb reindex' rebuilds the index "
            "with it") in no_hits.stderr
    dry = out_json(run(runner, "-d", path, "reindex", "--dry-run", "--json"))
    assert dry["dry_run"] and dry["previous"] == V1 and dry["analyzer"] == V2 and dry["chunks"] == 2
    with ragdb.open(path) as db:
        assert db.analyzer.config() == V1  # a dry run changes nothing
    text = run(runner, "-d", path, "reindex", "--dry-run").stdout
    assert text.startswith("would reindex 2 chunks of 2 documents: default (English stemming, English and Chinese "
                           "stopwords, CJK bigrams, version 1) -> default (")
    done = run(runner, "-d", path, "reindex")
    assert done.stdout.startswith("reindexed 2 chunks of 2 documents: ") and "vocabulary " in done.stdout
    assert "cpp.md" in run(runner, "-d", path, "search", "C++").stdout
    again = out_json(run(runner, "-d", path, "reindex", "--json"))
    assert again["previous"] == again["analyzer"] == V2 and not again["dry_run"] and again["terms"] > 0
    simple = out_json(run(runner, "-d", path, "reindex", "--analyzer", "simple", "--json"))
    assert simple["analyzer"]["stem"] is None
    bad = run(runner, "-d", path, "reindex", "--analyzer", "bogus", ok=False)
    assert bad.exit_code == 2 and "--analyzer" in bad.output
    ro = run(runner, "-d", path, "--readonly", "reindex", ok=False)
    assert ro.exit_code == 1 and "Traceback" not in ro.output


def test_search_says_why_a_query_of_dropped_words_has_no_hits(tmp_path, runner):
    path = tmp_path / "kb.db"
    with ragdb.open(path) as db:
        db.add("C++ templates", source="cpp.md")
    result = run(runner, "-d", path, "search", "the of")
    assert result.stdout.strip() == "no hits"
    assert result.stderr.strip() == ('no hits: every word of the query was dropped by the analyzer: '
                                     '"the" (English stopword), "of" (English stopword)')
    explained = run(runner, "-d", path, "search", "what is the?", "--explain")
    assert explained.stdout.splitlines()[:3] == [
        "query terms: none", 'dropped: "what" (English stopword), "is" (English stopword), "the" (English stopword)',
        "no hits"]
    as_json = run(runner, "-d", path, "search", "the C++ standard", "--explain", "--json")
    assert [h["source"] for h in out_json(as_json)] == ["cpp.md"]
    assert 'query terms: "c++", "standard"' in as_json.stderr and 'dropped: "the" (English stopword)' in as_json.stderr
    assert "dropped by the analyzer" not in run(runner, "-d", path, "search", "nothing matches").stderr


def test_reindex_and_search_as_real_processes(tmp_path):
    path = tmp_path / "kb.db"
    with ragdb.open(path, analyzer=V1) as db:
        db.add("C# properties", source="cs.md")
    env = {**os.environ, "RAGDB_DATABASE": ""}

    def ragdb_proc(*args):
        return subprocess.run([sys.executable, "-m", "ragdb.cli", "-d", str(path), *args], capture_output=True,
                              text=True, env=env, timeout=120)

    before = ragdb_proc("search", "C#")
    assert before.returncode == 0 and before.stdout.strip() == "no hits" and "'ragdb reindex'" in before.stderr
    done = ragdb_proc("reindex")
    assert done.returncode == 0 and done.stdout.startswith("reindexed 1 chunks of 1 documents")
    after = ragdb_proc("search", "C#")
    assert after.returncode == 0 and "cs.md" in after.stdout and after.stderr == ""
    with pytest.raises(AnalyzerMismatch, match=r"in place: Database.reindex\(analyzer\) with that configuration"):
        ragdb.open(path, analyzer=V1)  # (no --analyzer names version 1: the library call does it)
