"""The PostgreSQL backend: the same knowledge base on a PostgreSQL server.

Every test here but the first few (which need no server) runs against a real
server (conftest.py's ``pg_server``: RAGDB_TEST_PG, or a throwaway cluster from
scripts/pg-test-cluster), each in a schema of its own; without one they skip,
saying why (under CI=true they fail).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import sqlite3
import subprocess
import sys
import time
import uuid

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import ragdb
from ragdb.errors import DatabaseBusy, NotADatabase, RagdbError, StorageError
from ragdb.storage import Store, is_postgres, redact
from ragdb.storage.backend import glob_regex, password_of

from bulk_helpers import seal_hits, seal_records
from cli_helpers import cli, mcp_call, mcp_session, out_json, run, serving
from conftest import with_schema


EXAMPLES = int(os.environ.get("RAGDB_HYPOTHESIS_EXAMPLES", "60"))


# -- no server needed -------------------------------------------------------------------------

@pytest.mark.parametrize("path, pg", [
    ("postgresql://app@db.internal/kb", True), ("postgres://app:pw@h:5433/kb?sslmode=require", True),
    ("POSTGRESQL://h/kb", True), ("postgresql://", True), ("service=kb", True), ("host=h dbname=kb", True),
    (" dbname = kb", True), ("kb.db", False), ("./service=kb", False), (":memory:", False),
    ("/tmp/postgresql/kb.db", False), ("postgresql.db", False),
])
def test_backend_is_chosen_by_the_path(path, pg):
    assert is_postgres(path) is pg


@pytest.mark.parametrize("path, shown", [
    ("postgresql://app:s3cr%40t@db.internal:5432/kb", "postgresql://app:***@db.internal:5432/kb"),
    ("postgresql://app@db.internal/kb", "postgresql://app@db.internal/kb"),
    ("postgresql://db/kb?user=app&password=s3cr3t&sslmode=require",
     "postgresql://db/kb?user=app&password=***&sslmode=require"),
    ("host=db user=app password=s3cr3t dbname=kb", "host=db user=app password=*** dbname=kb"),
    ("host=db password='s3 cr\\'et' dbname=kb", "host=db password=*** dbname=kb"),
    ("service=kb", "service=kb"),
    ("kb.db", "kb.db"),
])
def test_passwords_are_redacted(path, shown):
    assert redact(path) == shown
    secret = password_of(path)
    if secret:
        assert secret not in redact(path)


def _sqlite_glob(pattern: str, text: str) -> bool:
    conn = sqlite3.connect(":memory:")
    try:
        return bool(conn.execute("SELECT ? GLOB ?", [text, pattern]).fetchone()[0])
    finally:
        conn.close()


GLOB_CHARS = st.sampled_from(list("ab-]^[*?.\\$()|+{}/ é中") + ["\n"])


@settings(max_examples=400, deadline=None)
@given(pattern=st.text(GLOB_CHARS, max_size=8), text=st.text(st.sampled_from(list("ab-]^[.\\/ é中\n*?")), max_size=6))
def test_glob_regex_matches_exactly_what_sqlite_glob_matches(pattern, text):
    """The translation of a GLOB pattern (PostgreSQL's ``~``) accepts exactly the strings
    SQLite's GLOB does. Python's ``re`` reads the escapes and classes it emits the same way."""
    regex = glob_regex(pattern)
    # PostgreSQL's $ is the end of the string and its . matches a newline: Python's \Z, DOTALL
    ours = regex is not None and re.search(regex[:-1] + r"\Z", text, re.DOTALL) is not None
    assert ours == _sqlite_glob(pattern, text), (pattern, text, regex)


def test_glob_regex_on_postgres_matches_sqlite_glob(pg_server):
    """The same on the server: PostgreSQL's ``~`` with the translation, against SQLite's GLOB,
    on many patterns and strings at once."""
    import random

    import psycopg

    rnd = random.Random(7)
    alphabet = list("ab-]^[*?.\\$()|+{}/ é中\n")
    pairs = [("".join(rnd.choice(alphabet) for _ in range(rnd.randint(0, 7))),
              "".join(rnd.choice("ab-]^[./ é中\n*?") for _ in range(rnd.randint(0, 6)))) for _ in range(3000)]
    pairs += [("docs/*", "docs/a.md"), ("[]]", "]"), ("[^]]", "a"), ("[a-]", "-"), ("[z-a]", "b"), ("a[", "a[")]
    want = [_sqlite_glob(p, t) for p, t in pairs]
    with psycopg.connect(pg_server) as conn:
        got = [bool(r[0]) for r in conn.execute(
            "SELECT t ~ r FROM unnest(%s::text[], %s::text[]) WITH ORDINALITY AS x(t, r, i) ORDER BY i",
            [[t for _, t in pairs], [glob_regex(p) or "[^\\s\\S]" for p, _ in pairs]])]
    bad = [(p, t) for (p, t), a, b in zip(pairs, want, got) if a != b]
    assert not bad, bad[:5]


def test_every_store_method_is_overridden_or_plain_sql():
    """PgStore inherits only methods whose SQL is plain (runs on PostgreSQL unchanged through
    PgConnection): a new Store method must be added to one list or the other, or this fails."""
    from ragdb.storage.postgres import PLAIN_SQL, PgStore

    methods = {name for cls in Store.__mro__[:-1] for name, v in vars(cls).items()
               if callable(v) or isinstance(v, (property, staticmethod))}
    methods -= {n for n in methods if n.startswith("__")}
    overridden = set(vars(PgStore))
    inherited = methods - overridden
    assert inherited == set(PLAIN_SQL), (sorted(inherited - set(PLAIN_SQL)), sorted(set(PLAIN_SQL) - inherited))


def test_missing_driver_is_named(monkeypatch):
    import builtins

    real = builtins.__import__

    def fake(name, *args, **kwargs):
        if name.startswith("psycopg"):
            raise ImportError(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake)
    with pytest.raises(ragdb.errors.MissingDependency, match=r"ragdb\[postgres\]"):
        ragdb.open("postgresql://nobody@127.0.0.1:1/none")


def test_check_sees_filter_index_damage_and_reindex_repairs_it(pg_url):
    """The filter index check on PostgreSQL (jsonb values, numeric numbers): healthy with
    every kind of value; a stray label and a changed value are reported; reindex repairs."""
    import psycopg

    with ragdb.open(pg_url, public_unlabeled=False) as db:
        db.add("salaries of the team", source="hr.md", acl=["hr"],
               metadata={"lang": "en", "tags": ["pay", "pay"], "n": 1.5, "big": 10**15, "draft": True,
                         "when": "2024-05-01T09:30:00+02:00"})
        other = db.add("the staff handbook", source="staff.md", acl=["staff"], metadata={"lang": "zh"})
        assert db.check() == []
    with psycopg.connect(pg_url) as conn:
        conn.execute("INSERT INTO doc_acl (doc_id, label) VALUES (%s, 'hr')", [other.id])
        conn.execute("UPDATE doc_meta SET num = 2.5 WHERE key = 'n'")
    with ragdb.open(pg_url) as db:
        assert [h.source for h in db.search("handbook", principals=["hr"])] == ["staff.md"]  # the leak
        problems = db.check()
        assert [p.split(" (")[0] for p in problems] == [
            "doc_meta lacks 1 row of the documents' metadata", "doc_meta has 1 row not in the documents' metadata",
            "doc_acl has 1 row not in the documents' labels"], problems
        assert f"(e.g. document {other.id}, label 'hr')" in problems[2]
        db.reindex()
        assert db.check() == []
        assert db.search("handbook", principals=["hr"]) == []
        assert [h.source for h in db.search("salaries", filter={"n": {"$lt": 2}}, principals=ragdb.ALL)] == ["hr.md"]


def test_check_compares_large_floats_as_postgresql_stores_them(pg_url, tmp_path):
    """jsonb keeps 1e23 as the numeric 100000000000000000000000, read back as that int: the
    check compared it with the float 1e23 and reported damage after a normal add, which
    reindex could not clear and which made `ragdb copy` fail (issue 32, item 11)."""
    import psycopg

    values = [1e23, 1e300, 1.797e308, -1e23, 0.1, 5e-324, 123456789012345678901234.0, 2.5, 10**15, 1e16]
    with ragdb.open(pg_url) as db:
        for n, v in enumerate(values):
            db.add(f"number {n}", source=f"n{n}.md", metadata={"k": v, "l": [v, "x"]})
        assert db.check() == []
        db.reindex()
        assert db.check() == []
        for v in values:
            assert db.count(filter={"k": v}, principals=ragdb.ALL) == 1, v
    ragdb.copy_database(pg_url, str(tmp_path / "copy.db"))
    with ragdb.open(tmp_path / "copy.db") as db:
        assert db.check() == [] and db.count(principals=ragdb.ALL) == len(values)
    with psycopg.connect(pg_url) as conn:  # damage is still seen
        conn.execute("UPDATE doc_meta SET value = '3.5'::jsonb WHERE key = 'k' AND value = '2.5'::jsonb")
    with ragdb.open(pg_url) as db:
        assert [p.split(" (")[0] for p in db.check()] == [
            "doc_meta lacks 1 row of the documents' metadata", "doc_meta has 1 row not in the documents' metadata"]


def test_datetime_metadata_is_filtered_as_stored_on_postgresql(pg_url):
    """The same rows as SQLite: a datetime, date or UUID value filtered as its stored string."""
    import datetime as dt

    meta = {"published": dt.datetime(2025, 6, 1, 12, 30), "day": dt.date(2025, 6, 1), "id": uuid.UUID(int=5)}
    with ragdb.open(pg_url) as pg, ragdb.open(":memory:") as lite:
        for db in (pg, lite):
            doc = db.add("the published report", source="r.md", metadata=meta)
            assert dict(doc.metadata) == dict(db.get(doc.id).metadata)
            assert doc.metadata["day"] == "2025-06-01"
            for f in ({"published": {"$gte": "2025-06-01"}}, {"day": "2025-06-01"}, {"id": str(uuid.UUID(int=5))}):
                assert [h.source for h in db.search("report", filter=f)] == ["r.md"], f
            assert db.check() == []


# -- one database, the same results -------------------------------------------------------------

def test_basic_round_trip_and_migrations_recorded(pg_url):
    with ragdb.open(pg_url) as db:
        d = db.add("The cat sat on the mat.", source="a.md", metadata={"lang": "en"}, acl=["staff"])
        assert [h.source for h in db.search("cat", principals=["staff"])] == ["a.md"]
        assert db.search("cat") == []  # labelled for staff only
        assert db.get(d.id, principals=ragdb.ALL).source == "a.md"
        assert db.check() == []
        assert db._store.backend == "postgresql"
    import psycopg

    with psycopg.connect(pg_url) as conn:
        names = [r[0] for r in conn.execute("SELECT name FROM ragdb_migrations ORDER BY id")]
    from ragdb.storage.postgres import pg_migration_files

    assert names == [p.stem for p in pg_migration_files()] and names[0] == "0001_initial"
    with ragdb.open(pg_url) as db:  # opening again applies nothing, finds everything
        assert db.count(principals=ragdb.ALL) == 1


def test_open_rules(pg_url, pg_server):
    with pytest.raises(NotADatabase, match="no ragdb database"):
        ragdb.open(pg_url, create=False)
    with pytest.raises(NotADatabase, match="no ragdb database"):
        ragdb.open(pg_url, readonly=True)
    with ragdb.open(pg_url, analyzer="simple") as db:
        db.add("hello world", source="h")
    with pytest.raises(ragdb.errors.AnalyzerMismatch):
        ragdb.open(pg_url, analyzer="jieba")
    with ragdb.open(pg_url, readonly=True) as ro:
        assert ro.count() == 1
        with pytest.raises(StorageError, match="read-only"):
            ro.add("more", source="m")
    import psycopg

    schema = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        conn.execute(f"CREATE TABLE {schema}.documents (id int)")
    try:
        with pytest.raises(NotADatabase, match="no ragdb schema"):
            ragdb.open(with_schema(pg_server, schema))
    finally:
        with psycopg.connect(pg_server, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


SOURCES = [f"docs/{n}.md" for n in ("a", "b", "c")] + ["notes/x.txt", "notes/y.txt", "中文/z.md"]
WORDS = ["retrieval", "augmented", "generation", "cat", "mat", "检索", "增强", "生成", "知识库", "index",
         "vector", "evidence"]
scalars = st.sampled_from(["u", "v", "2024-05-01", "2024-06-01T12:00:00Z", 1, 2, 2.5, 1.0, 0, True, False, -3])
meta_values = st.one_of(scalars, st.lists(scalars, max_size=3))
metas = st.dictionaries(st.sampled_from(["k", "m", "tags", "day"]), meta_values, max_size=3)
acls = st.lists(st.sampled_from(["p", "q", "r"]), max_size=2, unique=True)
texts = st.lists(st.sampled_from(WORDS), min_size=1, max_size=14).map(" ".join)
timestamps = st.sampled_from(["2024-01-01T00:00:00Z", "2024-03-01T00:00:00Z", "2024-06-01T00:00:00Z",
                              "2025-01-01T00:00:00Z"])
ops = st.lists(st.one_of(
    st.tuples(st.just("add"), st.sampled_from(SOURCES), texts, metas, acls, timestamps,
              st.sampled_from([None, "1", "2"])),
    st.tuples(st.just("delete_id"), st.integers(0, 30)),
    st.tuples(st.just("delete_source"), st.sampled_from(SOURCES + ["docs/*", "notes/[xy].txt", "*"])),
    st.tuples(st.just("delete_filter"), st.sampled_from([{"k": "u"}, {"m": {"$gt": 1}}, {"tags": 2.5}])),
    st.tuples(st.just("update"), st.integers(0, 30), metas, st.one_of(st.none(), acls)),
    st.tuples(st.just("embed")),
    st.tuples(st.just("optimize")),
), max_size=22)

FILTERS = [None, {"k": "u"}, {"k": 1}, {"k": True}, {"tags": ["u", 2]}, {"m": {"$gte": 1, "$lt": 2.5}},
           {"day": {"$gte": "2024-05-15"}}, {"source": "docs/*"}, {"source": "notes/[x].txt"},
           {"k": {"$exists": False}}, {"$or": [{"k": "v"}, {"m": {"$ne": 2}}]}, {"$contains": "cat"},
           {"version": "2"}, {"timestamp": {"$lt": "2024-06-01"}}, {"k": {"$in": [0, "u", 2.5]}},
           {"m": {"$not": {"$gt": 0}}},
           # alternatives grouped into lists (issue 32, item 1): one key, several keys, fields
           {"$or": [{"k": "u"}, {"k": 1}, {"m": 2.5}, {"tags": "v"}, {"tags": {"$in": [2, True]}}]},
           {"$or": [{"source": "docs/*"}, {"source": "notes/x.txt"}, {"version": "1"}, {"version": ["2"]}]},
           {"$and": [{"k": {"$ne": "u"}}, {"m": {"$nin": [1, 2]}}, {"tags": {"$ne": False}}]}]
PRINCIPALS = [ragdb.ALL, None, ["p"], ["q", "r"]]
QUERIES = ["retrieval generation", "检索增强", "cat mat evidence", "知识库 vector index", "absent"]


OPERATOR_QUERIES = ['"retrieval augmented"', "retrieval -generation", "retriev* +index", "indx~ 检索",
                    'title:retrieval', '"检索增强" OR vector', "lang:en retrieval"]


def fingerprint(hits):
    return [(h.chunk_id, h.doc_id, h.source, h.version, h.timestamp, h.start, h.end, h.text, h.metadata)
            for h in hits]


def assert_same_hits(a, b):
    assert fingerprint(a) == fingerprint(b)
    for x, y in zip(a, b):
        assert abs(x.score - y.score) <= 1e-9, (x, y)


def apply(db, op):
    kind = op[0]
    if kind == "add":
        _, source, text, meta, acl, ts, version = op
        db.add(text, source=source, metadata=meta, acl=acl, timestamp=ts, version=version)
    elif kind == "delete_id":
        ids = [d.id for d in db.documents(versions="all", principals=ragdb.ALL)]
        if ids:
            db.delete(ids[op[1] % len(ids)])
    elif kind == "delete_source":
        db.delete(source=op[1], glob=any(c in op[1] for c in "*[?"))
    elif kind == "delete_filter":
        db.delete(filter=op[1])
    elif kind == "update":
        ids = [d.id for d in db.documents(versions="all", principals=ragdb.ALL)]
        if ids:
            db.update(ids[op[1] % len(ids)], metadata=op[2], acl=op[3])
    elif kind == "embed":
        db.embed("hash:32")
    else:
        db.optimize(vacuum=False)


def compare(lite, pg):
    for q in QUERIES:
        for flt in FILTERS:
            for who in PRINCIPALS:
                assert_same_hits(lite.search(q, k=8, filter=flt, principals=who),
                                 pg.search(q, k=8, filter=flt, principals=who))
        assert_same_hits(lite.search(q, k=8, scorer="tfidf", principals=ragdb.ALL, versions="all"),
                         pg.search(q, k=8, scorer="tfidf", principals=ragdb.ALL, versions="all"))
        assert_same_hits(lite.search(q, k=5, as_of="2024-04-01", principals=ragdb.ALL),
                         pg.search(q, k=5, as_of="2024-04-01", principals=ragdb.ALL))
    for q in OPERATOR_QUERIES:  # the query language: phrases, exclusions, prefixes, fuzzy words, fields
        assert_same_hits(lite.search(q, k=8, principals=ragdb.ALL), pg.search(q, k=8, principals=ragdb.ALL))
        assert lite.query_plan(q) == pg.query_plan(q)
    for q in QUERIES:
        if lite.vector_info().vectors:
            for scorer in ("vector", "hybrid"):
                assert_same_hits(lite.search(q, k=6, scorer=scorer, principals=ragdb.ALL),
                                 pg.search(q, k=6, scorer=scorer, principals=ragdb.ALL))
    for flt in FILTERS:
        for who in PRINCIPALS:
            assert [(d.id, d.source, d.version, d.timestamp, d.metadata, d.acl, d.chunk_count, d.latest)
                    for d in lite.documents(filter=flt, principals=who, versions="all")] == \
                [(d.id, d.source, d.version, d.timestamp, d.metadata, d.acl, d.chunk_count, d.latest)
                 for d in pg.documents(filter=flt, principals=who, versions="all")]
            assert lite.count(filter=flt, principals=who) == pg.count(filter=flt, principals=who)
    for field in ("k", "tags", "day", "source", "version"):
        for q in (None, "retrieval cat"):
            assert lite.facets(field, q, principals=ragdb.ALL) == pg.facets(field, q, principals=ragdb.ALL)
    sl, sp = lite.stats(), pg.stats()
    assert (sl.documents, sl.chunks, sl.vocabulary, sl.postings, sl.avg_chunk_length, sl.stored_documents,
            sl.stored_chunks, sl.pending_chunks, sl.segments) == \
        (sp.documents, sp.chunks, sp.vocabulary, sp.postings, sp.avg_chunk_length, sp.stored_documents,
         sp.stored_chunks, sp.pending_chunks, sp.segments)
    assert lite.vector_info() == pg.vector_info()


@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(ops=ops, chunker=st.sampled_from(["none", "window:size=6,overlap=2"]), keep=st.booleans(),
       public=st.booleans())
def test_postgres_answers_exactly_like_sqlite(pg_server, ops, chunker, keep, public):
    """One random sequence of adds, replaces, deletes (by id, source, pattern and filter),
    metadata/label updates, versions, embeddings and optimizes, run against SQLite and
    PostgreSQL: every search (BM25, TF-IDF, vector, hybrid; filters, principals, versions,
    as_of) returns the same hits in the same order with scores within 1e-9, and listings,
    counts, facets, statistics and check() agree."""
    import psycopg

    schema = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        kw = {"chunker": chunker, "keep_versions": keep, "public_unlabeled": public}
        with ragdb.open(":memory:", **kw) as lite, ragdb.open(with_schema(pg_server, schema), **kw) as pg:
            for op in ops:
                results = []
                for db in (lite, pg):
                    try:
                        apply(db, op)
                        results.append(None)
                    except RagdbError as e:
                        results.append(type(e))
                assert results[0] == results[1], op
            compare(lite, pg)
            assert lite.check() == [] and pg.check() == []
    finally:
        with psycopg.connect(pg_server, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


@pytest.mark.parametrize("flush", [11, 1000])
def test_a_sealed_bulk_load_on_postgres_answers_as_on_sqlite(pg_url, tmp_path, monkeypatch, each_kernel, flush):
    """A bulk load whose tail is sealed between flushes (``BULK_SEAL_CHUNKS``), with flushes
    of sealed parts in mid-load (11) and without (1000: the tail stays sealed), writes on
    PostgreSQL what one-by-one adds write on SQLite: the same hits and scores from the writer,
    a second handle and a reopened one, the same statistics, a clean ``check()``; then a load
    stopped by a bad record, deletes of sealed documents and an ``optimize`` agree too (the
    flush's df corrections reach PostgreSQL's ``add_df`` as pairs, a term twice)."""
    from ragdb import database

    monkeypatch.setattr(database, "BULK_SEAL_CHUNKS", 3)
    monkeypatch.setattr(database, "BULK_FLUSH_CHUNKS", flush)
    records = seal_records(60)
    with ragdb.open(tmp_path / "one.db", chunker="none") as lite:
        for r in records:
            lite.add(r["text"], source=r["source"])
        want = seal_hits(lite)
    with ragdb.open(pg_url, chunker="none") as pg, ragdb.open(pg_url) as other, \
            ragdb.open(tmp_path / "bulk.db", chunker="none") as bulk:
        other.search("retrieval")  # opened before the load: catches up after it
        pg.add_many(records, batch_size=2, workers=0)
        bulk.add_many(records, batch_size=2, workers=0)
        sp, sl = pg.stats(), bulk.stats()
        assert (sp.documents, sp.chunks, sp.vocabulary, sp.postings, sp.pending_chunks, sp.segments) == \
            (sl.documents, sl.chunks, sl.vocabulary, sl.postings, sl.pending_chunks, sl.segments)
        assert sp.pending_chunks == (0 if flush == 11 else 60)
        assert pg.check() == []
        assert seal_hits(pg) == want and seal_hits(other) == want
        # a second load stopped by a bad record: its batches before it stay, sealed
        more = seal_records(80)[60:]
        for db in (pg, bulk):
            with pytest.raises(RagdbError):
                db.add_many([*more[:9], {"text": 42, "source": "bad"}, *more[9:]], batch_size=2, workers=0)
        assert {d.source for d in pg.documents()} == {d.source for d in bulk.documents()}
        for source in ("s0", "s61", "s65"):
            assert pg.delete(source=source) == bulk.delete(source=source)
        assert pg.check() == [] and seal_hits(pg) == seal_hits(bulk) and seal_hits(other) == seal_hits(bulk)
        pg.optimize(vacuum=False)
        bulk.optimize(vacuum=False)
        assert pg.stats().pending_chunks == 0 and pg.check() == []
        assert seal_hits(pg) == seal_hits(bulk)
    with ragdb.open(pg_url) as again, ragdb.open(tmp_path / "bulk.db") as bulk:
        assert seal_hits(again) == seal_hits(bulk) and again.check() == []


def test_collections_on_postgres(pg_url):
    with ragdb.open(pg_url) as db:
        zh = db.collection("中文", analyzer="jieba", chunker="none")
        db.add("the cat sat on the mat", source="en.md")
        zh.add("检索增强生成是一种技术", source="zh.md")
        assert [h.source for h in db.search("检索")] == []
        assert [h.source for h in zh.search("检索")] == ["zh.md"]
        assert [c.name for c in db.collections()] == ["default", "中文"]
        assert db.check() == [] and zh.check() == []
        with db.transaction():  # one transaction spans collections
            db.add("dogs", source="d.md")
            zh.add("狗", source="g.md")
        assert db.count() == 2 and zh.count() == 2
    with ragdb.open(pg_url, collection="中文") as zh:
        assert zh.count() == 2
    with ragdb.open(pg_url) as db:
        db.drop_collection("中文")
        assert [c.name for c in db.collections()] == ["default"]
        with pytest.raises(ragdb.errors.CollectionNotFound):
            ragdb.open(pg_url, collection="中文", create=False)


def test_nul_characters_are_an_input_error(pg_url):
    with ragdb.open(pg_url) as db:
        with pytest.raises(ragdb.errors.InvalidInput, match="NUL"):
            db.add("a\x00b", source="n")
        assert db.count() == 0 and db.check() == []


def test_a_transaction_rolls_back_whole(pg_url):
    with ragdb.open(pg_url) as db:
        db.add("kept", source="k")
        with pytest.raises(RuntimeError), db.transaction():
            db.add("gone", source="g")
            raise RuntimeError("boom")
        assert [d.source for d in db.documents()] == ["k"] and db.check() == []


def test_closing_inside_a_transaction_is_refused_and_the_block_rolls_back(pg_url):
    with ragdb.open(pg_url) as db:
        db.add("kept", source="k")
        with pytest.raises(ragdb.errors.InvalidInput, match="inside a write transaction"), db.transaction():
            db.add("gone", source="g")
            db.close()
        assert [d.source for d in db.documents()] == ["k"] and db.check() == []


# -- credentials ------------------------------------------------------------------------------------

def test_credentials_never_appear(pg_server, pg_url, runner, tmp_path):
    """The password of the URL is used (the server asks for it) but never shown: not in
    db.path, repr, stats, errors (wrong password, missing database) or CLI output."""
    from urllib.parse import urlsplit

    secret = urlsplit(pg_server).password
    assert secret, "the test server's URL carries a password"
    with ragdb.open(pg_url) as db:
        db.add("the cat", source="c")
        shown = [db.path, repr(db), str(db.stats()), str(db.collections())]
    assert all(secret not in s for s in shown) and "***" in db.path
    wrong = pg_url.replace(f":{secret}@", ":not-the-password@")
    with pytest.raises(StorageError) as err:
        ragdb.open(wrong, busy_timeout=5)
    assert "not-the-password" not in str(err.value) and secret not in str(err.value)
    assert "password authentication failed" in str(err.value)
    missing = pg_server.rsplit("/", 1)[0] + "/no_such_db"
    with pytest.raises(StorageError) as err:
        ragdb.open(missing, busy_timeout=5)
    assert secret not in str(err.value) and "no_such_db" in str(err.value)
    for args in (["-d", pg_url, "stats", "--json"], ["-d", pg_url, "search", "cat"],
                 ["-d", wrong, "search", "cat"], ["-d", pg_url, "init", "--json"],
                 ["-d", pg_url, "migrate", "--list", "--json"]):
        result = runner.invoke(cli, args)
        assert secret not in result.output and "not-the-password" not in result.output, args


def test_pg_environment_variables_and_service_files(pg_server, pg_url, tmp_path, monkeypatch):
    """libpq's PG* variables and service files work as for psql: a bare URL, or service=NAME."""
    from urllib.parse import parse_qs, unquote, urlsplit

    parts = urlsplit(pg_url)
    options = unquote(parse_qs(parts.query)["options"][0])
    with ragdb.open(pg_url) as db:
        db.add("environment", source="e")
    monkeypatch.setenv("PGHOST", parts.hostname)
    monkeypatch.setenv("PGPORT", str(parts.port))
    monkeypatch.setenv("PGUSER", parts.username)
    monkeypatch.setenv("PGPASSWORD", parts.password)
    monkeypatch.setenv("PGDATABASE", parts.path.lstrip("/"))
    monkeypatch.setenv("PGOPTIONS", options)
    with ragdb.open("postgresql://", readonly=True) as db:
        assert [h.source for h in db.search("environment")] == ["e"]
    for var in ("PGHOST", "PGPORT", "PGUSER", "PGPASSWORD", "PGDATABASE", "PGOPTIONS"):
        monkeypatch.delenv(var)
    service = tmp_path / "pg_service.conf"
    service.write_text(f"[kb]\nhost={parts.hostname}\nport={parts.port}\nuser={parts.username}\n"
                       f"password={parts.password}\ndbname={parts.path.lstrip('/')}\noptions={options}\n")
    monkeypatch.setenv("PGSERVICEFILE", str(service))
    with ragdb.open("service=kb", readonly=True) as db:
        assert db.count() == 1 and db.path == "service=kb"


# -- many processes --------------------------------------------------------------------------------

def _writer(url: str, worker: int, rounds: int, queue) -> None:
    try:
        with ragdb.open(url) as db:
            for i in range(rounds):
                words = " ".join(["shared", f"w{worker}", f"r{i}"] + ["filler"] * (i % 7))
                db.add(f"{words}\n\n{words} part two\n\n{words} part three", source=f"w{worker}/{i % 5}.md",
                       metadata={"worker": worker, "i": i}, chunker="paragraph")
                if i % 4 == 3:
                    db.delete(source=f"w{worker}/{(i + 2) % 5}.md")
                if i % 9 == 8:
                    db.optimize(vacuum=False)
        queue.put(("ok", worker))
    except BaseException as e:  # reported to the test
        queue.put(("error", f"{type(e).__name__}: {e}"))


def _reader(url: str, seconds: float, queue) -> None:
    """Searches while the writers write: every document it sees is whole (all three chunks)."""
    try:
        seen = 0
        with ragdb.open(url, readonly=True) as db:
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                hits = db.search("shared part", k=200, collapse=False)  # every chunk, copies too
                by_doc: dict[int, int] = {}
                for h in hits:
                    by_doc[h.doc_id] = by_doc.get(h.doc_id, 0) + 1
                docs = {d.id: d.chunk_count for d in db.documents()}
                for doc_id, n in by_doc.items():
                    if n != 3 or docs.get(doc_id, 3) != 3:
                        queue.put(("error", f"document {doc_id}: {n} of its chunks found, listed {docs.get(doc_id)}"))
                        return
                seen += len(hits)
        queue.put(("ok", seen))
    except BaseException as e:
        queue.put(("error", f"{type(e).__name__}: {e}"))


def test_concurrent_writer_processes_keep_df_and_n_exact(pg_url):
    """Four writer processes add, replace, delete and optimize one knowledge base at once
    while a reader searches: nobody deadlocks or fails, the reader sees whole documents
    only, and afterwards every statistic and document frequency equals a recount
    (check()) and search equals a fresh SQLite build of the surviving documents."""
    with ragdb.open(pg_url) as db:
        db.add("seed", source="seed.md")
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(pg_url, w, 24, queue)) for w in range(4)]
    procs.append(ctx.Process(target=_reader, args=(pg_url, 6.0, queue)))
    for p in procs:
        p.start()
    results = [queue.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert all(r[0] == "ok" for r in results), results
    with ragdb.open(pg_url) as db:
        assert db.check() == []
        records = list(db.records(principals=ragdb.ALL))
        with ragdb.open(":memory:") as fresh:
            for r in records:
                fresh.add(r["text"], source=r["source"], metadata=r["metadata"], timestamp=r["timestamp"],
                          chunker="paragraph")
            for q in ("shared part two", "w1 r3 filler", "w2 part three"):
                a, b = db.search(q, k=30), fresh.search(q, k=30)
                assert [(h.source, h.start) for h in a] == [(h.source, h.start) for h in b]
                assert all(abs(x.score - y.score) <= 1e-9 for x, y in zip(a, b))
        assert db.count() == len(records)


def test_a_writer_waits_for_the_lock_then_busy(pg_url):
    """A second writer waits for the collection's lock; past busy_timeout it is DatabaseBusy."""
    with ragdb.open(pg_url) as a, ragdb.open(pg_url, busy_timeout=0.5) as b:
        a.add("one", source="1")
        with a.transaction():
            a.add("two", source="2")
            with pytest.raises(DatabaseBusy, match="busy timeout"):
                b.add("three", source="3")
            assert b.count() == 1  # readers do not wait, and see committed writes only
        b.add("three", source="3")
        assert a.count() == 3 and a.check() == []


def test_a_reader_cache_follows_other_writers(pg_url):
    """A reader's in-memory index (generation counter) follows another process's writes."""
    with ragdb.open(pg_url) as reader:
        reader.add("alpha beta", source="a")
        assert [h.source for h in reader.search("alpha")] == ["a"]
        code = ("import ragdb, sys\nwith ragdb.open(sys.argv[1]) as db:\n"
                "    db.add('alpha gamma alpha', source='b')\n    db.delete(source='a')\n    db.optimize()\n")
        subprocess.run([sys.executable, "-c", code, pg_url], check=True, timeout=120)
        assert [h.source for h in reader.search("alpha")] == ["b"]
        assert reader.stats().documents == 1 and reader.check() == []


def test_a_broken_connection_is_replaced(pg_url, pg_server):
    """A connection the server dropped (a restart, a failover: here its backend is
    terminated) is tested before the next transaction uses it and replaced."""
    import psycopg

    with ragdb.open(pg_url) as db:
        db.add("survives reconnects", source="r")
        db._store.shared.check_after = 0.0  # test every checkout (the default: after 2 s idle)
        for _ in range(2):
            pid = db._store.pg.run("SELECT pg_backend_pid()").fetchone()[0]
            with psycopg.connect(pg_server, autocommit=True) as admin:
                assert admin.execute("SELECT pg_terminate_backend(%s)", [pid]).fetchone()[0]
            assert [h.source for h in db.search("reconnects")] == ["r"]
            db.add("and writes too", source=f"w{_}")
        assert db.count() == 3 and db.check() == []


# -- replica ----------------------------------------------------------------------------------------

def test_a_replica_reader_catches_up_with_the_primary(pg_server, pg_replica):
    """A reader on the hot-standby replica sees each write made on the primary once the
    replica has replayed it (waited for by WAL position, not by time)."""
    import psycopg

    schema = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    primary_url, replica_url = with_schema(pg_server, schema), with_schema(pg_replica, schema)

    def caught_up() -> None:
        with psycopg.connect(pg_server, autocommit=True) as p:
            lsn = p.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]
        with psycopg.connect(pg_replica, autocommit=True) as r:
            for _ in range(600):
                if r.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", [lsn]).fetchone()[0]:
                    return
                time.sleep(0.05)
        raise AssertionError("the replica did not replay the primary's WAL")

    try:
        with ragdb.open(primary_url) as primary:
            primary.add("replicated knowledge", source="r1")
            caught_up()
            with ragdb.open(replica_url, readonly=True) as replica:
                assert [h.source for h in replica.search("knowledge")] == ["r1"]
                with pytest.raises(StorageError, match="read-only"):
                    replica.add("x", source="x")
                primary.add("more replicated knowledge knowledge", source="r2")
                primary.delete(source="r1")
                caught_up()
                assert [h.source for h in replica.search("knowledge")] == ["r2"]  # the cached index followed
                assert_same_hits(replica.search("replicated"), primary.search("replicated"))
                assert replica.check() == []
    finally:
        with psycopg.connect(pg_server, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


# -- copy ---------------------------------------------------------------------------------------------

def _fill(db):
    db.add("retrieval augmented generation with evidence", source="a.md", version="1",
           timestamp="2024-01-01T00:00:00Z", metadata={"lang": "en", "n": 1.5, "ok": True, "tags": ["x", 2]},
           acl=["staff"])
    db.add("retrieval augmented generation, second edition", source="a.md", version="2",
           timestamp="2024-02-01T00:00:00Z", metadata={"lang": "en", "day": "2024-02-01"}, acl=["staff"])
    db.add("检索增强生成 知识库", source="zh.md", metadata={"lang": "zh"}, timestamp="2024-03-01T00:00:00Z")
    from ragdb.types import Span

    text = "Intro\n\nintro text here\n\nUsage\n\nusage text here"
    db.add(text, source="doc.md", chunker="paragraph",
           spans=(Span(0, 24, {"section": "Intro"}), Span(24, len(text), {"section": "Usage"})))
    db.delete(source="zh.md")
    db.add("检索增强生成 知识库 again", source="zh.md", metadata={"lang": "zh"})
    db.embed("hash:16")
    db.add("one more without a vector", source="pending.md")


def _snapshot(db):
    searches = [fingerprint(db.search(q, k=10, principals=ragdb.ALL, versions=v, scorer=s))
                for q in ("retrieval generation", "检索", "text") for v in ("latest", "all")
                for s in ("bm25", "tfidf")]
    if db.vector_info().vectors:
        searches.append(fingerprint(db.search("retrieval", scorer="vector", principals=ragdb.ALL)))
    docs = [(d.id, d.source, d.version, d.timestamp, d.metadata, d.acl, d.latest, d.chunk_count, d.content_hash)
            for d in db.documents(versions="all", principals=ragdb.ALL)]
    settings = {k: v for k, v in db.settings.items() if k != "embedding"}  # vector_info has the model
    return searches, docs, db.vector_info(), settings


@pytest.mark.parametrize("direction", ["sqlite-to-postgres", "postgres-to-sqlite"])
def test_copy_between_backends(pg_url, tmp_path, direction):
    """ragdb.copy_database moves every collection with ids, versions, timestamps, labels,
    metadata and vectors: check() passes on the target and every search matches."""
    lite = str(tmp_path / "kb.db")
    src, dst = (lite, pg_url) if direction == "sqlite-to-postgres" else (pg_url, lite)
    with ragdb.open(src, keep_versions=True) as db:
        _fill(db)
        other = db.collection("other", analyzer="simple")
        other.add("alpha beta gamma", source="o.md", metadata={"k": 1})
        want = _snapshot(db), _snapshot(other)
    report = ragdb.copy_database(src, dst)
    assert [(c.name, c.documents) for c in report.collections] == [("default", 4), ("other", 1)]
    with ragdb.open(dst) as db:
        assert db.check() == []
        other = db.collection("other", create=False)
        assert other.check() == []
        assert (_snapshot(db), _snapshot(other)) == want
        db.add("after the copy", source="new.md")  # ids and logs continue after the copied ones
        assert db.check() == [] and db.get(source="new.md").id == 7
    with pytest.raises(ragdb.errors.InvalidInput, match="not empty"):
        ragdb.copy_database(src, dst)


def test_cli_copy_and_search(pg_url, tmp_path, runner):
    lite = str(tmp_path / "kb.db")
    with ragdb.open(lite) as db:
        db.add("the cat sat on the mat", source="cat.md")
    out = out_json(run(runner, "copy", lite, pg_url, "--json"))
    assert out["collections"][0]["documents"] == 1 and out["problems"] == []
    assert "***" in out["target"] or "@" not in out["target"]
    hits = out_json(run(runner, "-d", pg_url, "search", "cat", "--json"))
    assert [h["source"] for h in hits] == ["cat.md"]
    assert out_json(run(runner, "-d", pg_url, "stats", "--json"))["documents"] == 1
    listed = out_json(run(runner, "-d", pg_url, "migrate", "--list", "--json"))
    assert [m["name"] for m in listed["applied"]] == ["0001_initial", "0002_packed_postings", "0003_packed_forward",
                                                      "0004_chunk_state", "0005_new_terms", "0006_bulk_terms",
                                                      "0007_whole_floats"]
    assert listed["pending"] == []
    assert json.loads(run(runner, "-d", pg_url, "check", "--json").output)["problems"] == []


def test_reindex_and_fields_on_postgres(pg_url, tmp_path):
    v1 = {"name": "ragdb", "version": 1, "stem": "english", "stopwords": "english+chinese", "cjk": "bigram"}
    docs = [("C++ templates and the standard library", "docs/cpp.md", "C++ guide"),
            ("Node.js and npm packages", "docs/node.md", None), ("检索增强生成", "docs/rag.md", "检索")]
    with ragdb.open(pg_url, analyzer=v1) as pg, ragdb.open(tmp_path / "kb.db", analyzer=v1) as lite:
        for db in (pg, lite):
            for text, source, title in docs:
                db.add(text, source=source, title=title, timestamp="2026-01-01T00:00:00Z")
            assert db.search("C++") == []
            db.reindex()
            assert db.check() == []
        for q in ("C++", "node.js", "title:guide", '"standard library"', "检索", "templ*"):
            assert_same_hits(lite.search(q), pg.search(q))
            assert pg.search(q), q


# -- the servers on PostgreSQL -------------------------------------------------------------------

def test_http_server_on_postgresql(pg_url, tmp_path):
    """``ragdb serve -d postgresql://...``: a real uvicorn process on loopback writes and reads
    the PostgreSQL knowledge base; every answer equals the library's on the same database."""
    pytest.importorskip("starlette")
    httpx = pytest.importorskip("httpx")

    admin = "admin-token-" + uuid.uuid4().hex
    with ragdb.open(pg_url) as db:
        db.add("Cats sit on warm mats near the door.", source="docs/cats.md", metadata={"lang": "en"})
        db.add("Die Katze schläft auf der Matte.", source="docs/katze.md", metadata={"lang": "de"})
        db.add("The zanzibar plan: cats take the mat.", source="team/plan.md", acl=["team"],
               metadata={"lang": "en"})
    auth = {"Authorization": f"Bearer {admin}"}
    with serving(pg_url, tmp_path, env={"RAGDB_API_TOKEN": admin}) as url:
        added = httpx.post(url + "/documents", json={"text": "Dogs chase cats off the mat.", "source": "docs/dogs.md",
                                                     "metadata": {"lang": "en"}}, headers=auth)
        assert added.status_code == 201 and added.json()["status"] == "added", added.text
        anonymous = httpx.post(url + "/search", json={"query": "cats mat zanzibar", "k": 10}).json()["hits"]
        everything = httpx.post(url + "/search", json={"query": "cats mat zanzibar", "k": 10}, headers=auth).json()
        facets = httpx.post(url + "/facets", json={"field": "lang", "query": "cats"}).json()
        listed = httpx.get(url + "/documents", params={"prefix": "docs/"}).json()["documents"]
        with ragdb.open(pg_url) as db:
            want = db.search("cats mat zanzibar", 10)
            assert [(h["chunk_id"], h["score"]) for h in anonymous] == [(h.chunk_id, h.score) for h in want]
            assert "team/plan.md" not in str(anonymous)
            assert [h["source"] for h in everything["hits"]] == \
                [h.source for h in db.search("cats mat zanzibar", 10, principals=ragdb.ALL)]
            assert "team/plan.md" in [h["source"] for h in everything["hits"]]
            f = db.facets("lang", "cats")
            assert facets["values"] == [{"value": v, "count": n} for v, n in f] and facets["total"] == f.total
            assert [d["source"] for d in listed] == [d.source for d in db.documents("docs/*")] == \
                ["docs/cats.md", "docs/dogs.md", "docs/katze.md"]
            dogs = db.get(source="docs/dogs.md")
        assert httpx.delete(f"{url}/documents/{dogs.id}", headers=auth).json() == {"deleted": 1}
        with ragdb.open(pg_url) as db:
            assert db.count() == 2 and db.check() == []


def test_mcp_server_on_postgresql(pg_url, tmp_path):
    """``ragdb mcp -d postgresql://...`` over stdio with the official SDK client: the tools
    answer from the PostgreSQL knowledge base as the library does."""
    pytest.importorskip("mcp")
    import anyio

    with ragdb.open(pg_url) as db:
        db.add("Cats sit on warm mats near the door.", source="docs/cats.md", metadata={"lang": "en"})
        db.add("检索增强生成使用倒排索引。", source="zh/rag.md", metadata={"lang": "zh"})
        db.add("The zanzibar plan.", source="team/plan.md", acl=["team"])
        want_hits = [(h.chunk_id, h.score) for h in db.search("cats mats", 5)]
        want_zh = [h.source for h in db.search("倒排索引", 5)]
        want_facets = [{"value": v, "count": n} for v, n in db.facets("lang")]

    async def main() -> None:
        async with mcp_session(pg_url, tmp_path) as session:
            async def call(tool: str, arguments: dict) -> dict:
                return await mcp_call(session, tool, arguments)

            got = await call("search", {"query": "cats mats"})
            assert [(h["chunk_id"], h["score"]) for h in got["hits"]] == want_hits
            assert [h["source"] for h in (await call("search", {"query": "倒排索引"}))["hits"]] == want_zh
            assert (await call("facets", {"field": "lang"}))["values"] == want_facets
            assert (await call("search", {"query": "zanzibar plan"}))["hits"] == []  # labelled: not for it
            assert (await call("stats", {}))["visible_documents"] == 2

    anyio.run(main)


def test_whole_floats_past_2_53_compare_with_ints_as_on_sqlite(pg_url, tmp_path):
    """jsonb held 2.0**60 as its shortest decimal, 1.152921504606847e18 (the integer
    1152921504606847000): an equality filter naming 2**60 found it on SQLite, not here, and
    `ragdb copy` to SQLite made a file whose check failed."""
    with ragdb.open(pg_url) as pg, ragdb.open(tmp_path / "lite.db") as lite:
        for db in (pg, lite):
            db.add("float doc", source="f.md", metadata={"k": 2.0 ** 60, "m": -(2.0 ** 70)})
            db.add("int doc", source="i.md", metadata={"j": 2 ** 60})
            got = [db.count(filter=f) for f in ({"k": 2 ** 60}, {"j": 2.0 ** 60}, {"m": -(2.0 ** 70)},
                                                 {"k": {"$lte": 2 ** 60}}, {"k": {"$in": [1, 2 ** 60]}})]
            assert got == [1, 1, 1, 1, 1]
            assert db.check() == []
            db.add("more floats", source="g.md", metadata={"k": [2 ** 60, 3], "m": 1e300, "j": [2.0 ** 62, 2 ** 62]})
            db.add("and ints", source="h.md", metadata={"k": 2 ** 61, "m": -(2 ** 63)})
        # facets show each value as SQLite does: PostgreSQL's showed whole floats past 2**53 as
        # integers (1e300 as 301 digits)
        for field in ("k", "m", "j"):
            want = lite.facets(field, by="documents")
            assert [(v, type(v)) for v, _ in pg.facets(field, by="documents").counts] == \
                [(v, type(v)) for v, _ in want.counts], field
            assert pg.facets(field) == lite.facets(field)
        assert {type(v) for v, _ in lite.facets("m").counts} == {int, float}
        lite_facets = lite.facets("m")
    ragdb.copy_database(pg_url, str(tmp_path / "copy.db"))
    with ragdb.open(tmp_path / "copy.db") as db:
        assert db.check() == [] and db.count(filter={"k": {"$lte": 2 ** 60}}) == 2
        assert db.facets("m") == lite_facets


def test_a_value_postgresql_cannot_index_is_an_input_error_naming_the_limit(pg_url):
    """A metadata value, source or label over ~2,700 bytes exceeds a btree entry: it failed
    as 'the connection to the PostgreSQL server failed'."""
    import random

    rnd = random.Random(1)
    long = "".join(chr(rnd.randrange(0x4E00, 0x9FFF)) for _ in range(3000))  # 9,000 bytes compression cannot halve
    with ragdb.open(pg_url) as db:
        db.add("kept", source="k.md")
        for kw in ({"source": "m.md", "metadata": {"summary": long}}, {"source": "l.md", "acl": [long]},
                   {"source": long}):
            with pytest.raises(ragdb.errors.InvalidInput, match="at most ~2,700 bytes"):
                db.add("hello world", **kw)
        assert [d.source for d in db.documents(principals=ragdb.ALL)] == ["k.md"] and db.check() == []


def test_nul_in_a_read_is_an_input_error_saying_so_and_long_globs_work(pg_url):
    with ragdb.open(pg_url) as db:
        db.add("hello world", source="a/x.md", metadata={"k": "v"})
        with pytest.raises(ragdb.errors.InvalidInput, match="to store or to look up"):
            db.count(filter={"k": "v\x00"})
        assert db.count(filter={"source": "*" * 1600}) == 1  # "regular expression is too complex"
        assert [d.source for d in db.documents("a/" + "*" * 2000)] == ["a/x.md"]


def test_the_whole_floats_migration_rewrites_what_schema_6_stored(pg_url):
    """A database of schema 6 holds 2.0**60 as jsonb's 1.152921504606847e18: migration 0007
    rewrites it as the integer it is, so filters and check agree with SQLite."""
    import psycopg

    with ragdb.open(pg_url) as db:
        db.add("float doc", source="f.md", metadata={"k": 2.0 ** 60, "small": 2.5, "n": 2 ** 62})
    with psycopg.connect(pg_url, autocommit=True) as conn:  # as schema 6 wrote it
        conn.execute("UPDATE doc_meta SET value = '1.152921504606847e+18'::jsonb WHERE key = 'k'")
        conn.execute("DELETE FROM ragdb_migrations WHERE name = '0007_whole_floats'")
    with ragdb.open(pg_url) as db:
        assert db.count(filter={"k": 2 ** 60}) == 1 and db.count(filter={"small": 2.5}) == 1
        assert db.count(filter={"n": 2 ** 62}) == 1 and db.check() == []
