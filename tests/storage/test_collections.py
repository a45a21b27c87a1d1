"""Collections: several knowledge bases in one file, each exactly a separate database."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import ragdb
from ragdb.errors import CollectionExists, CollectionNotFound, InvalidInput, StorageError
from ragdb.storage import build_migrations, migration_files
from ragdb.storage.collections import OBJECTS, collection_ddl, rename, touches_collection

from cli_helpers import out_json, run

EXAMPLES = int(os.environ.get("RAGDB_HYPOTHESIS_EXAMPLES", "60"))
FILE_WIDE = {"_sqlite_migrations", "idx__sqlite_migrations_migration_set_name", "collections", "sqlite_sequence",
             "text_dictionaries", "text_dictionaries_collection"}  # one table for the file (migration 0010)


def schema(path) -> dict[str, str]:
    conn = sqlite3.connect(path)
    try:
        return dict(conn.execute(
            "SELECT name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_autoindex%'"))
    finally:
        conn.close()


def test_every_schema_object_is_per_collection_or_file_wide(tmp_path):
    """A migration adding a table, index or trigger must add its name to OBJECTS (or it would
    exist in the default collection only)."""
    with ragdb.open(tmp_path / "kb.db") as db:
        db.collection("other")
    names = set(schema(tmp_path / "kb.db"))
    plain = {n for n in names if not n.startswith("c1_")}
    assert plain - FILE_WIDE <= OBJECTS, plain - FILE_WIDE - OBJECTS
    assert {n[3:] for n in names if n.startswith("c1_")} == plain - FILE_WIDE


def test_a_collection_has_the_default_schema_renamed(tmp_path):
    with ragdb.open(tmp_path / "kb.db") as db:
        db.collection("other")
    objects = schema(tmp_path / "kb.db")
    for name, sql in objects.items():
        if name in FILE_WIDE or name.startswith("c1_") or sql is None:
            continue
        # the same statement, every per-collection name prefixed
        assert objects[f"c1_{name}"] == rename(sql, 1), name


def test_rename_leaves_comments_strings_and_columns_alone():
    sql = ("-- documents and chunks\nSELECT d.source, 'documents', \"end\" FROM documents d JOIN chunks c "
           "ON c.doc_id = d.id /* postings */ WHERE d.text = 'chunks' AND \"chunks\".id = 1")
    assert rename(sql, 7) == (
        "-- documents and chunks\nSELECT d.source, 'documents', \"end\" FROM c7_documents d JOIN c7_chunks c "
        "ON c.doc_id = d.id /* postings */ WHERE d.text = 'chunks' AND \"c7_chunks\".id = 1")
    assert rename(sql, 0) == sql
    assert touches_collection("CREATE INDEX documents_ts ON documents (ts)")
    assert not touches_collection("CREATE TABLE collections (id INTEGER, name TEXT) -- documents")
    assert list(collection_ddl(["INSERT INTO collections VALUES (1)", "DELETE FROM stats"], 3)) == \
        ["DELETE FROM c3_stats"]


# -- each collection is a database of its own --------------------------------------------------

WORDS = ["retrieval", "augmented", "generation", "检索", "增强", "生成", "index", "postings", "知识库", "向量",
         "model", "answer", "evidence", "search", "文档"]
texts = st.lists(st.sampled_from(WORDS), min_size=1, max_size=12).map(" ".join)
ops = st.lists(st.tuples(st.sampled_from(["add", "add", "delete", "update", "flush"]), st.sampled_from("AB"),
                         st.integers(0, 5), texts, st.sampled_from([{}, {"lang": "en"}, {"lang": "zh"}])),
               max_size=25)
QUERIES = ["retrieval generation", "检索增强生成", "model answer evidence", "知识库 search", "向量"]


def fingerprint(hits):
    return [(h.chunk_id, h.doc_id, h.source, h.start, h.end, h.text, round(h.score, 12)) for h in hits]


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                      HealthCheck.function_scoped_fixture])
@given(ops=ops, chunker=st.sampled_from(["none", "window:size=5,overlap=2"]))
def test_a_collection_searches_exactly_like_a_separate_database(tmp_path_factory, ops, chunker):
    """Interleaved writes to the default collection and two others of one file give, in each,
    exactly the hits (ids, spans, scores), statistics and listings of a separate database
    that received only that collection's writes."""
    path = tmp_path_factory.mktemp("c") / "kb.db"
    with ragdb.open(path, chunker=chunker) as db, ragdb.open(":memory:", chunker=chunker) as sep_a, \
            ragdb.open(":memory:", chunker=chunker) as sep_b, ragdb.open(":memory:", chunker=chunker) as sep_d:
        one = {"A": db.collection("A", chunker=chunker), "B": db.collection("B", chunker=chunker), "D": db}
        sep = {"A": sep_a, "B": sep_b, "D": sep_d}
        for step, (op, name, key, text, meta) in enumerate(ops):
            name = "D" if step % 3 == 2 else name  # the default collection takes writes too
            pair = (one[name], sep[name])
            source = f"doc{key}"
            for target in pair:
                if op == "add":
                    target.add(text, source=source, metadata=meta)
                elif op == "delete":
                    target.delete(source=source)
                elif op == "update":
                    docs = target.documents(source, glob=False)
                    if docs:
                        target.update(docs[0].id, metadata=meta)
                else:
                    target.optimize(vacuum=False)
        for name in one:
            a, b = one[name], sep[name]
            for q in QUERIES:
                for scorer in ("bm25", "tfidf"):
                    assert fingerprint(a.search(q, k=20, scorer=scorer)) == fingerprint(b.search(q, k=20, scorer=scorer))
                assert fingerprint(a.search(q, k=20, filter={"lang": "zh"})) == \
                    fingerprint(b.search(q, k=20, filter={"lang": "zh"}))
            sa, sb = a.stats(), b.stats()
            assert (sa.documents, sa.chunks, sa.vocabulary, sa.postings, sa.avg_chunk_length) == \
                (sb.documents, sb.chunks, sb.vocabulary, sb.postings, sb.avg_chunk_length)
            assert [(d.id, d.source, d.metadata) for d in a.documents()] == \
                [(d.id, d.source, d.metadata) for d in b.documents()]
            assert a.check() == []


def test_collections_have_their_own_settings_and_vectors(tmp_path):
    with ragdb.open(tmp_path / "kb.db") as db:
        zh = db.collection("中文", analyzer="jieba", chunker="none", keep_versions=True)
        db.add("the cat sat on the mat", source="en.md")
        zh.add("检索增强生成是一种技术", source="zh.md")
        zh.add("检索增强生成是一种新技术", source="zh.md")  # a kept older version
        assert zh.analyzer.cjk == "jieba" and db.analyzer.cjk == "bigram"
        assert zh.settings["chunker"] == "none" and zh.settings["keep_versions"] is True
        assert db.settings["keep_versions"] is False
        assert [h.source for h in db.search("检索")] == []
        assert [h.source for h in zh.search("检索")] == ["zh.md"]
        assert len(zh.documents(versions="all")) == 2
        zh.embed("hash:64")
        assert zh.vector_info().model == "hash-64" and db.vector_info().model is None
        assert [h.source for h in zh.search("检索", scorer="vector")] == ["zh.md"]
        db.embed("hash:32")  # another model in the default collection: not a mismatch
        assert db.vector_info().model == "hash-32"
        infos = {c.name: c for c in db.collections()}
        assert list(infos) == ["default", "中文"]
        assert (infos["中文"].documents, infos["中文"].chunks, infos["中文"].embedding_model) == (1, 1, "hash-64")
        assert infos["中文"].analyzer.startswith("jieba") and infos["default"].documents == 1
        assert zh.collection_name == "中文" and db.collection_name == "default"
        assert "collection='中文'" in repr(zh)
        assert db.check() == [] and zh.check() == []
    # reopened directly, with the stored settings
    with ragdb.open(tmp_path / "kb.db", collection="中文") as zh:
        assert zh.analyzer.cjk == "jieba" and zh.settings["keep_versions"] is True
        assert zh.stats().documents == 1
        with pytest.raises(ragdb.errors.AnalyzerMismatch, match="collection '中文'"):
            zh.collection("中文", analyzer="simple")


def test_open_collection_rules(tmp_path):
    path = tmp_path / "kb.db"
    with ragdb.open(path, collection="new") as db:  # made with the file
        assert db.collection_name == "new"
        db.add("hello world", source="h")
    with pytest.raises(CollectionNotFound, match="no collection 'other'.*'default', 'new'"):
        ragdb.open(path, collection="other", create=False)
    with pytest.raises(CollectionNotFound, match="read-only"):
        ragdb.open(path, collection="other", readonly=True)
    with ragdb.open(path, collection="new", readonly=True) as db:
        assert db.stats().documents == 1
        with pytest.raises(CollectionNotFound):
            db.collection("other")
    with ragdb.open(path, collection="default") as db:
        assert db.collection_name == "default" and db.stats().documents == 0
        with pytest.raises(CollectionNotFound):
            db.collection("other", create=False)
        with pytest.raises(CollectionExists, match="'new' already exists"):
            db.create_collection("new")
        made = db.create_collection("made", chunker="paragraph")
        assert made.settings["chunker"] == "paragraph"
        assert [c.name for c in db.collections()] == ["default", "new", "made"]


@pytest.mark.parametrize("name, message", [
    ("", "must not be empty"), ("  ", "must not be empty"), (" x", "leading or trailing whitespace"),
    ("a\nb", "control characters"), ("x" * 129, "longer than 128"), (3, "must be a string"),
    (None, "must be a string"),
])
def test_bad_collection_names(tmp_path, name, message):
    with ragdb.open(tmp_path / "kb.db") as db:
        with pytest.raises(InvalidInput, match=message):
            db.collection(name)
        with pytest.raises(InvalidInput, match=message):
            db.drop_collection(name)
    if name is not None:
        with pytest.raises(InvalidInput, match=message):
            ragdb.open(tmp_path / "kb.db", collection=name)
    assert [c.name for c in ragdb.open(tmp_path / "kb.db").collections()] == ["default"]


def test_names_are_values_never_sql(tmp_path):
    evil = "x'); DROP TABLE documents; --"
    with ragdb.open(tmp_path / "kb.db") as db:
        db.add("kept", source="k")
        c = db.collection(evil)
        c.add("inside", source="i")
        assert [x.name for x in db.collections()] == ["default", evil]
        assert db.stats().documents == 1 and c.stats().documents == 1
        db.drop_collection(evil)
        assert db.check() == [] and db.stats().documents == 1


def test_drop_collection(tmp_path):
    path = tmp_path / "kb.db"
    with ragdb.open(path) as db:
        db.add("default text", source="d")
        tmp = db.collection("tmp")
        tmp.add("temporary text", source="t")
        other = ragdb.open(path, collection="tmp")  # another connection on it
        assert other.stats().documents == 1
        with pytest.raises(InvalidInput, match="default collection cannot be dropped"):
            db.drop_collection("default")
        with pytest.raises(CollectionNotFound):
            db.drop_collection("nope")
        db.drop_collection("tmp")
        for handle in (tmp, other):
            with pytest.raises(CollectionNotFound, match="dropped"):
                handle.search("temporary")
            with pytest.raises(CollectionNotFound):
                handle.add("more", source="m")
        other.close()
        again = db.collection("tmp")  # a new collection under the old name: fresh, and a new id
        assert again.stats().documents == 0 and again.search("temporary") == []
        assert not any(n.startswith("c1_") for n in schema(path))
        assert db.check() == [] and db.stats().documents == 1


def test_one_transaction_spans_collections(tmp_path):
    with ragdb.open(tmp_path / "kb.db") as db:
        c = db.collection("c")
        with pytest.raises(RuntimeError), db.transaction():
            db.add("in default", source="a")
            c.add("in c", source="b")
            raise RuntimeError("roll back both")
        assert db.stats().documents == 0 and c.stats().documents == 0
        with db.transaction():
            db.add("in default", source="a")
            c.add("in c", source="b")
        assert db.stats().documents == 1 and c.stats().documents == 1
        assert db.check() == [] and c.check() == []


def test_other_processes_see_a_collections_writes(tmp_path):
    path = tmp_path / "kb.db"
    with ragdb.open(path, collection="shared") as db:
        db.add("retrieval augmented generation", source="one")
        code = ("import ragdb,sys\n"
                "with ragdb.open(sys.argv[1], collection='shared', create=False) as db:\n"
                "    db.add('retrieval from another process', source='two')\n")
        subprocess.run([sys.executable, "-c", code, str(path)], check=True)
        assert sorted(h.source for h in db.search("retrieval")) == ["one", "two"]
        assert db.check() == []


def test_check_reports_a_collection_missing_a_table(tmp_path):
    path = tmp_path / "kb.db"
    with ragdb.open(path) as db:
        db.collection("broken")
    conn = sqlite3.connect(path)
    conn.execute("DROP INDEX c1_documents_ts")
    conn.commit()
    conn.close()
    with ragdb.open(path) as db:
        problems = db.check()
        assert len(problems) == 1 and "collection 'broken'" in problems[0] and "documents_ts" in problems[0]
        assert "documents_ts" in ragdb.open(path, collection="broken").check()[0]


# -- migrations ------------------------------------------------------------------------------

NAMES = [p.stem for p in migration_files()]


@pytest.mark.parametrize("stop_after", [n for n in NAMES if n < "0006"])
def test_each_older_schema_migrates_to_collections(tmp_path, stop_after):
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    build_migrations(stop_after=stop_after).apply(__import__("sqlite_utils").Database(conn))
    conn.close()
    records = [{"text": f"retrieval document {i} 检索 {i % 3}", "source": f"s{i}"} for i in range(8)]
    with ragdb.open(path) as db:  # migrates to the current schema
        assert [c.name for c in db.collections()] == ["default"]
        db.add_many(records, chunker="none")
        other = db.collection("other", chunker="none")
        other.add_many(records, chunker="none")
        assert fingerprint(db.search("retrieval 检索", k=20)) == fingerprint(other.search("retrieval 检索", k=20))
        assert db.check() == [] and other.check() == []
    applied = {r[0] for r in sqlite3.connect(path).execute("SELECT name FROM _sqlite_migrations")}
    assert applied == set(NAMES)


def test_a_file_from_before_collections_keeps_its_content_as_the_default(tmp_path):
    """A schema-5 file with documents, vectors, labels and kept versions: after migrating,
    the default collection holds all of it and answers exactly as before."""
    path = tmp_path / "kb.db"
    with ragdb.open(path, keep_versions=True, chunker="window:size=6,overlap=2") as db:
        db.add_many([{"text": f"retrieval augmented generation {i} 检索增强 {i % 4} evidence", "source": f"s{i}",
                      "metadata": {"n": i}, "acl": ["team"] if i % 3 == 0 else None} for i in range(20)])
        db.add("retrieval replaced text", source="s1")
        db.embed("hash:32")
        before = [fingerprint(db.search(q, k=30, principals=ragdb.ALL)) for q in QUERIES]
        vec_before = fingerprint(db.search("retrieval", scorer="vector", principals=ragdb.ALL))
    conn = sqlite3.connect(path)  # back to schema 5: no collections table, 0006 and 0007 not applied
    conn.execute("DROP TABLE collections")
    for stmt in ("DROP INDEX doc_meta_num", "DROP INDEX doc_meta_at", "DROP INDEX doc_meta_kv",
                 "ALTER TABLE doc_meta DROP COLUMN num", "ALTER TABLE doc_meta DROP COLUMN at",
                 "CREATE INDEX doc_meta_kv ON doc_meta (key, value)"):
        conn.execute(stmt)
    conn.execute("DELETE FROM _sqlite_migrations WHERE name IN ('0006_collections', '0007_filter_operators', "
                 "'0008_packed_postings')")
    conn.commit()
    conn.close()
    with ragdb.open(path) as db:
        assert [(c.name, c.documents) for c in db.collections()] == [("default", 20)]
        assert [fingerprint(db.search(q, k=30, principals=ragdb.ALL)) for q in QUERIES] == before
        assert fingerprint(db.search("retrieval", scorer="vector", principals=ragdb.ALL)) == vec_before
        assert len(db.documents(versions="all", principals=ragdb.ALL)) == 21
        assert db.check() == []


def test_a_later_migration_reaches_every_collection(tmp_path):
    """Migrations after 0006 apply their per-collection statements to each collection: undo
    0005 (an index and a column) in the default collection and in two others, forget that it
    was applied, and reopen."""
    path = tmp_path / "kb.db"
    with ragdb.open(path) as db:
        db.add("alpha", source="a")
        db.collection("one").add("beta", source="b")
        db.collection("two").add("gamma", source="g")
    conn = sqlite3.connect(path)
    for prefix in ("", "c1_", "c2_"):
        conn.execute(f"DROP INDEX {prefix}vectors_text_hash")
        conn.execute(f"ALTER TABLE {prefix}vectors DROP COLUMN text_hash")
    conn.execute("DELETE FROM _sqlite_migrations WHERE name = '0005_vector_text_hash'")
    conn.commit()
    conn.close()
    before = schema(path)
    assert "c2_vectors_text_hash" not in before
    with ragdb.open(path) as db:
        assert db.check() == []
        for name in ("one", "two"):
            assert db.collection(name).check() == []
    after = schema(path)
    assert "c1_vectors_text_hash" in after and "c2_vectors_text_hash" in after
    assert after["c2_vectors"] == rename(after["vectors"], 2)


# -- CLI ---------------------------------------------------------------------------------------

def test_cli_collections(runner, tmp_path):
    kb = str(tmp_path / "kb.db")
    (tmp_path / "zh.md").write_text("# 中文\n\n检索增强生成是一种技术。\n", encoding="utf-8")
    (tmp_path / "en.md").write_text("# English\n\nRetrieval augmented generation.\n", encoding="utf-8")
    run(runner, "-d", kb, "add", str(tmp_path / "en.md"))
    made = out_json(run(runner, "-d", kb, "collections", "create", "zh", "--analyzer", "jieba", "--json"))
    assert made["collection"] == "zh" and made["analyzer"]["cjk"] == "jieba"
    assert "already exists" in run(runner, "-d", kb, "collections", "create", "zh", ok=False).output
    run(runner, "-d", kb, "-c", "zh", "add", str(tmp_path / "zh.md"))
    listed = out_json(run(runner, "-d", kb, "collections", "--json"))
    assert [(c["name"], c["documents"]) for c in listed] == [("default", 1), ("zh", 1)]
    assert out_json(run(runner, "-d", kb, "collections", "list", "--json")) == listed
    csv_lines = run(runner, "-d", kb, "collections", "--csv").stdout.splitlines()
    assert csv_lines[0] == "name,documents,chunks,analyzer,embedding_model,created_at" and len(csv_lines) == 3
    table = run(runner, "-d", kb, "collections").stdout
    assert "zh" in table and "jieba" in table
    zh_source = str(tmp_path / "zh.md")  # added from outside the working folder: named by its path
    hits = out_json(run(runner, "-d", kb, "-c", "zh", "search", "检索", "--json"))
    assert [h["source"] for h in hits] == [zh_source]
    # the command's own -c wins over the group's; RAGDB_COLLECTION is the group's default
    hits = out_json(run(runner, "-d", kb, "-c", "default", "search", "-c", "zh", "检索", "--json"))
    assert [h["source"] for h in hits] == [zh_source]
    hits = out_json(run(runner, "-d", kb, "search", "检索", "--json", env={"RAGDB_COLLECTION": "zh"}))
    assert [h["source"] for h in hits] == [zh_source]
    assert out_json(run(runner, "-d", kb, "search", "检索", "--json")) == []
    stats = out_json(run(runner, "-d", kb, "-c", "zh", "stats", "--json"))
    assert stats["collection"] == "zh" and stats["documents"] == 1
    missing = run(runner, "-d", kb, "-c", "nope", "search", "x", ok=False)
    assert missing.exit_code == 1 and "no collection 'nope'" in missing.output
    assert [c["name"] for c in out_json(run(runner, "-d", kb, "collections", "--json"))] == ["default", "zh"]
    init = out_json(run(runner, "-d", kb, "-c", "simple", "init", "--analyzer", "simple", "--json"))
    assert init["created"] is True and init["collection"] == "simple"
    assert out_json(run(runner, "-d", kb, "-c", "simple", "init", "--json"))["created"] is False
    dropped = out_json(run(runner, "-d", kb, "collections", "drop", "zh", "--yes", "--json"))
    assert dropped == {"database": kb, "dropped": "zh", "documents": 1}
    assert "Aborted" in run(runner, "-d", kb, "collections", "drop", "simple", ok=False, input="n\n").output
    assert "default collection cannot be dropped" in run(runner, "-d", kb, "collections", "drop", "default",
                                                         "--yes", ok=False).output
    assert [c["name"] for c in out_json(run(runner, "-d", kb, "collections", "--json"))] == ["default", "simple"]


def test_cli_collection_in_a_subprocess(tmp_path):
    kb = str(tmp_path / "kb.db")
    env = {**os.environ, "RAGDB_DATABASE": kb, "RAGDB_COLLECTION": "notes"}
    cli = [sys.executable, "-m", "ragdb.cli"]
    add = subprocess.run(cli + ["add", "-", "--source", "n.txt", "--json"], input="vector search notes",
                         text=True, capture_output=True, env=env)
    assert add.returncode == 0, add.stderr
    out = subprocess.run(cli + ["collections", "--json"], text=True, capture_output=True, env=env)
    assert [(c["name"], c["documents"]) for c in json.loads(out.stdout)] == [("default", 0), ("notes", 1)]
    found = subprocess.run(cli + ["search", "vector", "--json"], text=True, capture_output=True, env=env)
    assert [h["source"] for h in json.loads(found.stdout)] == ["n.txt"]
    ro = subprocess.run(cli + ["--readonly", "-c", "absent", "search", "vector"], text=True, capture_output=True,
                        env=env)
    assert ro.returncode == 1 and "no collection 'absent'" in ro.stderr


def test_readonly_file_cannot_create_or_drop(tmp_path):
    path = tmp_path / "kb.db"
    with ragdb.open(path) as db:
        db.collection("x")
    with ragdb.open(path, readonly=True) as db:
        with pytest.raises(CollectionNotFound):
            db.collection("y")
        with pytest.raises(StorageError, match="read-only"):
            db.drop_collection("x")
        assert [c.name for c in db.collections()] == ["default", "x"]


def test_a_schema_1_from_before_the_first_release_is_refused_saying_what_to_do(tmp_path):
    """0001_initial.sql changed during ragdb's first day of development: a file made before
    then has a schema 1 without chunk_log, and opening it failed with 'no such table:
    chunk_log' (a StorageError naming no way out)."""
    path = tmp_path / "early.db"
    conn = sqlite3.connect(path)
    build_migrations(stop_after="0001_initial").apply(__import__("sqlite_utils").Database(conn))
    conn.execute("DROP TABLE chunk_log")  # as that build's schema 1 had it
    conn.commit()
    conn.close()
    with pytest.raises(ragdb.errors.NotADatabase, match="before its first release.*ragdb export"):
        ragdb.open(path)
