"""One API suite, run against ``ragdb.open(path)`` and against ``ragdb.connect(url, token)`` of
a real ``ragdb serve`` on 127.0.0.1, each on SQLite and on PostgreSQL.

Every test gets ``api`` (a fresh collection, through the library or through the client)
and ``direct`` (the same collection opened with the library: for the library it is
``api`` itself), so that what a client returns is also compared with what the library
returns for the same call on the same data. The client holds the administrator's token
and the library reads as the default (anonymous) caller: the documents here are
unlabelled or labelled public (``"*"``), so both see the same ones.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

import ragdb  # noqa: E402
from cli_helpers import serving  # noqa: E402
from ragdb.errors import (CollectionExists, CollectionNotFound, DocumentNotFound, InvalidInput,  # noqa: E402
                          RagdbError)

ADMIN = "parity-admin-token-aaaaaaaaaaaaaaaa"
_names = itertools.count(1)

DOCS = [
    {"text": "The cat sat on the mat. Cats like a warm mat near the door.", "source": "docs/cats.md",
     "metadata": {"lang": "en", "n": 1, "tags": ["pets"]}},
    {"text": "Dogs chase cats around the park; a dog rarely sits on a mat.", "source": "docs/dogs.md",
     "metadata": {"lang": "en", "n": 2, "tags": ["pets", "parks"]}, "version": "v1"},
    {"text": "Quantum physics describes particles, and cats in boxes.", "source": "docs/physics.md",
     "metadata": {"lang": "en", "n": 3}, "timestamp": "2026-01-02T03:04:05Z"},
    {"text": "Die Katze schläft auf der Matte, cats sleep.", "source": "notes/katze.txt",
     "metadata": {"lang": "de", "n": 4}, "acl": ["*", "team-a"]},
    {"text": "Notes on mats, rugs and carpets for cats.", "source": "notes/mats.txt",
     "metadata": {"lang": "en", "n": 5}, "title": "Mats"},
]


class Backend:
    """One database (a file or a PostgreSQL schema) and, for the server kinds, a ``ragdb serve`` of it."""

    def __init__(self, database: str, url: str | None) -> None:
        self.database, self.url = database, url
        self.root = ragdb.open(database)
        self.client = ragdb.connect(url, token=ADMIN) if url is not None else None

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
        self.root.close()


@pytest.fixture(scope="module")
def sqlite_db(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    folder = tmp_path_factory.mktemp("parity")
    path = folder / "kb.db"
    ragdb.open(path).close()
    return str(path), folder


@pytest.fixture(scope="module")
def pg_db(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    import uuid

    import psycopg
    from conftest import with_schema

    server = request.getfixturevalue("pg_server")  # skips when no PostgreSQL server can be had
    schema = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")  # a generated name, not input
    url = with_schema(server, schema)
    ragdb.open(url).close()
    yield url, tmp_path_factory.mktemp("parity-pg")
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


@pytest.fixture(scope="module", params=["library-sqlite", "client-sqlite", "library-postgres", "client-postgres"])
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    kind, store = request.param.split("-")
    database, folder = request.getfixturevalue("sqlite_db" if store == "sqlite" else "pg_db")
    if kind == "library":
        b = Backend(database, None)
        yield b
        b.close()
        return
    with serving(database, folder, "--collections", env={"RAGDB_API_TOKEN": ADMIN}) as url:
        b = Backend(database, url)
        yield b
        b.close()


@pytest.fixture
def pair(backend: Backend) -> Iterator[tuple[Any, ragdb.Database]]:
    """(api, direct): a new collection through the API under test, and through the library."""
    name = f"c{next(_names)}"
    if backend.client is None:
        db = backend.root.create_collection(name)
        yield db, db
        backend.root.drop_collection(name)
        return
    api = backend.client.create_collection(name)
    yield api, backend.root.collection(name, create=False)
    backend.client.drop_collection(name)


@pytest.fixture
def api(pair: tuple[Any, ragdb.Database]) -> Any:
    return pair[0]


@pytest.fixture
def direct(pair: tuple[Any, ragdb.Database]) -> ragdb.Database:
    return pair[1]


@pytest.fixture
def loaded(api: Any) -> Any:
    api.add_many(DOCS)
    return api


def _same(doc: ragdb.Document) -> tuple[Any, ...]:
    """What a document is, without its id (ids are the database's own)."""
    return (doc.source, doc.version, doc.content_hash, dict(doc.metadata), doc.acl, doc.chunk_count, doc.latest,
            doc.text)


# --------------------------------------------------------------------------- writing

def test_add_returns_the_stored_document(api: Any, direct: ragdb.Database) -> None:
    doc = api.add("Cats purr when they are content.", source="a.md", metadata={"lang": "en"}, version="3",
                  timestamp=datetime(2026, 5, 1, 12, 0, tzinfo=timezone.utc), title="Purring", acl=["*", "team-a"])
    assert isinstance(doc, ragdb.Document)
    assert (doc.source, doc.version, dict(doc.metadata), doc.acl, doc.latest) == \
        ("a.md", "3", {"lang": "en", "title": "Purring"}, ("*", "team-a"), True)
    assert doc.timestamp == "2026-05-01T12:00:00Z"
    assert doc == direct.get(doc.id, with_text=False)
    assert api.get(doc.id).text == "Cats purr when they are content."
    derived = api.add("A document without a source.")
    assert derived.source.startswith("sha256:") and derived == direct.get(source=derived.source, with_text=False)


def test_a_naive_datetime_in_metadata_stays_naive(api: Any, direct: ragdb.Database) -> None:
    """The library stores a naive datetime of metadata as its naive ISO text; the client sent it with
    '+00:00' (orjson's OPT_NAIVE_UTC), so an equality filter on the library's text missed it."""
    when = datetime(2024, 5, 1, 9, 30, 0, 123456)
    doc = api.add("Stamped.", source="when.md", metadata={"when": when, "deep": {"at": when}},
                  timestamp=datetime(2024, 5, 1, 9, 30))  # a naive timestamp: UTC, both ways
    assert dict(doc.metadata) == {"when": "2024-05-01T09:30:00.123456", "deep": {"at": "2024-05-01T09:30:00.123456"}}
    assert doc.timestamp == "2024-05-01T09:30:00Z" and doc == direct.get(source="when.md", with_text=False)
    assert api.count(filter={"when": "2024-05-01T09:30:00.123456"}) == 1
    at = datetime(2024, 5, 1, 9, 30)  # naive: UTC
    assert [h.source for h in api.search("stamped", since=at, until=at)] == ["when.md"]


def test_add_many_reports_added_replaced_unchanged(api: Any, direct: ragdb.Database) -> None:
    report = api.add_many(DOCS)
    assert isinstance(report, ragdb.AddReport) and len(report) == len(DOCS)
    assert len(report.added) == len(DOCS) and not report.replaced and not report.unchanged
    assert [d.source for d in report] == [r["source"] for r in DOCS]
    assert [_same(d) for d in report] == [_same(direct.get(d.id, with_text=False)) for d in report]
    again = api.add_many([DOCS[0], {**DOCS[1], "text": "Dogs chase cats; edited."}])
    assert again.unchanged == (report[0].id,)
    assert [c.status for c in again.changes] == ["unchanged", "replaced"]
    assert again.changes[1].previous == report[1].id
    assert api.count() == len(DOCS)


def test_replace_keeps_the_labels_and_gives_a_new_version(api: Any, direct: ragdb.Database) -> None:
    first = api.add("Version one of the guide.", source="guide.md", acl=["*", "ops"])
    second = api.add("Version two of the guide.", source="guide.md", version="2")
    assert second.id != first.id and second.acl == ("*", "ops")
    assert api.get(source="guide.md").text == "Version two of the guide."
    assert api.get(source="guide.md") == direct.get(source="guide.md")


def test_update_changes_metadata_and_labels_in_place(loaded: Any, direct: ragdb.Database) -> None:
    doc = loaded.get(source="docs/cats.md", with_text=False)
    updated = loaded.update(doc.id, metadata={"lang": "fr", "reviewed": True}, acl=["*", "team-b"])
    assert updated.id == doc.id and dict(updated.metadata) == {"lang": "fr", "reviewed": True}
    assert updated.acl == ("*", "team-b")
    assert updated == direct.get(doc.id, with_text=False)
    assert loaded.count(filter={"lang": "fr"}) == 1


def test_delete_by_id_source_pattern_and_filter(loaded: Any, direct: ragdb.Database) -> None:
    cats = loaded.get(source="docs/cats.md", with_text=False)
    assert loaded.delete(cats.id) == 1
    with pytest.raises(DocumentNotFound):
        loaded.get(cats.id)
    assert loaded.delete(source="docs/dogs.md") == 1
    assert loaded.delete(source="docs/none.md") == 0
    assert loaded.delete(source="notes/*", glob=True, filter={"lang": "de"}) == 1
    assert loaded.delete(filter={"n": {"$gte": 3}}) == 2
    assert loaded.count() == 0 == direct.count()


def test_delete_by_source_takes_every_version(api: Any) -> None:
    api.add("one", source="v.md")
    api.add("two", source="v.md")
    stored = api.count(versions="all")
    assert stored >= 1
    assert api.delete(source="v.md") == stored
    assert api.count(versions="all") == 0


# --------------------------------------------------------------------------- reading

def test_get_by_id_and_by_source(loaded: Any, direct: ragdb.Database) -> None:
    doc = loaded.get(source="notes/mats.txt")
    assert doc.text == DOCS[4]["text"] and doc == direct.get(source="notes/mats.txt")
    assert loaded.get(doc.id, with_text=False) == direct.get(doc.id, with_text=False)
    assert loaded.get(doc.id, with_text=False).text is None


@pytest.mark.parametrize("call", [
    {},
    {"source": "docs/*"},
    {"source": "docs/cats.md", "glob": False},
    {"filter": {"lang": "en"}},
    {"filter": {"tags": "pets"}, "source": "docs/*"},
    {"limit": 2},
    {"limit": 2, "offset": 2},
    {"versions": "all"},
])
def test_documents_equal_the_library(loaded: Any, direct: ragdb.Database, call: dict[str, Any]) -> None:
    docs = loaded.documents(**call)
    assert docs == direct.documents(**call)
    assert all(isinstance(d, ragdb.Document) for d in docs)


def test_count(loaded: Any, direct: ragdb.Database) -> None:
    assert loaded.count() == len(DOCS)
    assert loaded.count(filter={"lang": "en"}) == 4 == direct.count(filter={"lang": "en"})
    assert loaded.count(filter={"n": {"$in": [1, 2]}}) == 2


@pytest.mark.parametrize("query, options", [
    ("cats mat", {}),
    ("cats mat", {"k": 2}),
    ("cats mat", {"k": 2, "offset": 2}),
    ("cats", {"k": 10, "filter": {"lang": "en", "source": "docs/*"}}),
    ("cats", {"filter": {"$or": [{"lang": {"$ne": "en"}}, {"n": 5}]}}),
    ("cat", {"scorer": "tfidf", "k": 3}),
    ("cats mat", {"min_score": 0.05}),
    ('"warm mat"', {}),
    ("cats -dogs", {"syntax": "query"}),
    ("cots", {"fuzzy": 1}),
    ("cats mat", {"highlight": True, "snippet_chars": 30}),
    ("cats", {"since": "2026-01-01T00:00:00Z", "until": datetime(2026, 2, 1, tzinfo=timezone.utc)}),
    ("the of and", {}),
])
def test_search_equals_the_library(loaded: Any, direct: ragdb.Database, query: str, options: dict[str, Any]) -> None:
    hits = loaded.search(query, **options)
    assert hits == direct.search(query, **options)
    assert all(isinstance(h, ragdb.Hit) for h in hits)
    if "k" in options:
        assert len(hits) <= options["k"]


@pytest.mark.parametrize("query, options", [
    ("cats mat", {}),
    ('"warm mat" -dogs cats* katz~ lang:en', {"syntax": "query", "k": 3}),
    ("cots mattt", {"filter": {"lang": "en"}}),
    ("the of cats", {"scorer": "tfidf"}),
])
def test_search_and_plan_equal_the_library(loaded: Any, direct: ragdb.Database, query: str,
                                          options: dict[str, Any]) -> None:
    hits, plan = loaded.search_and_plan(query, **options)
    assert (hits, plan) == direct.search_and_plan(query, **options)
    assert isinstance(plan, ragdb.QueryPlan)
    options.pop("k", None)
    assert loaded.query_plan(query, **options) == direct.query_plan(query, **options)


def test_search_options_value(loaded: Any, direct: ragdb.Database) -> None:
    options = ragdb.SearchOptions.from_keywords(k=3, filter={"lang": "en"}, scorer="tfidf")
    assert loaded.search("cats", options=options) == direct.search("cats", options=options)


def test_build_prompt_equals_the_library(loaded: Any, direct: ragdb.Database) -> None:
    for call in ({}, {"k": 2, "min_confidence": 0}, {"filter": {"lang": "de"}, "min_confidence": 0},
                 {"budget_tokens": 60, "min_confidence": 0},
                 {"options": ragdb.SearchOptions.from_keywords(k=1), "min_confidence": 0},  # the options' k
                 {"options": ragdb.SearchOptions.from_keywords(k=2, scorer="tfidf"), "min_confidence": 0}):
        p = loaded.build_prompt("Where do cats sit?", **call)
        q = direct.build_prompt("Where do cats sit?", **call)
        assert (p.text, p.system, p.user, p.sources, p.language, p.refused, p.confidence, p.min_confidence) == \
            (q.text, q.system, q.user, q.sources, q.language, q.refused, q.confidence, q.min_confidence)
    refused = loaded.build_prompt("What is the capital of Peru?")
    assert refused.refused and refused.sources == ()


def test_facets_equal_the_library(loaded: Any, direct: ragdb.Database) -> None:
    for args, kw in ((("lang",), {}), (("tags", "cats"), {}), (("source",), {"by": "documents", "limit": 2}),
                     (("n",), {"filter": {"lang": "en"}})):
        f = loaded.facets(*args, **kw)
        assert isinstance(f, ragdb.Facets) and f == direct.facets(*args, **kw)


def test_stats(loaded: Any, direct: ragdb.Database) -> None:
    s, d = loaded.stats(), direct.stats()
    assert isinstance(s, ragdb.Stats)
    assert (s.documents, s.chunks, s.vocabulary, s.postings, s.stored_documents, s.collection) == \
        (d.documents, d.chunks, d.vocabulary, d.postings, d.stored_documents, d.collection)
    assert s.documents == len(DOCS) and s.collection == loaded.collection_name


# --------------------------------------------------------------------------- collections

def test_collections_create_list_count_drop(api: Any) -> None:
    name = api.collection_name + "-more"
    other = api.create_collection(name, keep_versions=True)
    try:
        assert other.collection_name == name
        with pytest.raises(CollectionExists):
            api.create_collection(name)
        other.add("a document of the other collection", source="x.md")
        infos = {c.name: c for c in api.collections()}
        assert isinstance(infos[name], ragdb.CollectionInfo)
        assert (infos[name].documents, infos[name].chunks) == (1, 1)
        assert infos[api.collection_name].documents == 0
        assert api.collection(name, create=False).count() == 1
        assert api.count() == 0  # collections do not share documents
    finally:
        api.drop_collection(name)
    assert name not in {c.name for c in api.collections()}
    with pytest.raises(CollectionNotFound):
        api.collection(name, create=False)
    with pytest.raises(CollectionNotFound):
        api.drop_collection(name)
    made = api.collection(name)  # create=True: made when missing
    assert made.count() == 0
    api.drop_collection(name)


# --------------------------------------------------------------------------- errors

@pytest.mark.parametrize("call, error", [
    (lambda db: db.get(999_999), DocumentNotFound),
    (lambda db: db.get(source="no/such.md"), DocumentNotFound),
    (lambda db: db.update(999_999, metadata={"a": 1}), DocumentNotFound),
    (lambda db: db.get(), InvalidInput),
    (lambda db: db.delete(), InvalidInput),
    (lambda db: db.delete(filter={}), InvalidInput),
    (lambda db: db.search("cats", k=0), InvalidInput),
    (lambda db: db.search("cats", k=True), InvalidInput),
    (lambda db: db.search("cats", scorer="nope"), InvalidInput),
    (lambda db: db.search("cats", filter={"n": {"$regex": "x"}}), InvalidInput),
    (lambda db: db.search("cats", colour="red"), InvalidInput),
    (lambda db: db.documents(versions="some"), InvalidInput),
    (lambda db: db.documents(limit=-1), InvalidInput),
    (lambda db: db.documents(offset=-1), InvalidInput),
    (lambda db: db.update(1), InvalidInput),
    (lambda db: db.search("cats", k=10, offset=-1), InvalidInput),
    (lambda db: db.count(filter={"$bad": 1}), InvalidInput),
    (lambda db: db.add(""), InvalidInput),
    (lambda db: db.add_many([{"text": "x", "colour": "red"}]), InvalidInput),
    (lambda db: db.facets("lang", by="pages"), InvalidInput),
    (lambda db: db.collection(" spaced "), InvalidInput),
])
def test_errors_are_the_library_errors(loaded: Any, call: Any, error: type[RagdbError]) -> None:
    with pytest.raises(error):
        call(loaded)


def test_a_bad_collection_name_is_refused_with_the_librarys_message(api: Any, direct: ragdb.Database) -> None:
    for name in ("", " spaced ", "a\x00b", "x" * 129, 7):
        for method, kw in (("collection", {"create": False}), ("create_collection", {}), ("drop_collection", {})):
            with pytest.raises(InvalidInput) as got:
                getattr(api, method)(name, **kw)
            with pytest.raises(InvalidInput) as expected:
                getattr(direct, method)(name, **kw)
            assert str(got.value) == str(expected.value)


@pytest.mark.parametrize("call", [
    lambda db: db.search(None), lambda db: db.search(5), lambda db: db.search_and_plan(b"cats"),
    lambda db: db.build_prompt(None), lambda db: db.build_prompt("   "),
    lambda db: db.get(0), lambda db: db.get("3"), lambda db: db.get(2 ** 63),
    lambda db: db.update(0, metadata={"a": 1}), lambda db: db.delete(-1), lambda db: db.delete(True),
])
def test_bad_queries_and_ids_are_refused_with_the_librarys_message(loaded: Any, direct: ragdb.Database,
                                                                   call: Any) -> None:
    with pytest.raises(InvalidInput) as got:
        call(loaded)
    with pytest.raises(InvalidInput) as expected:
        call(direct)
    assert str(got.value) == str(expected.value)


def test_invalid_input_names_the_argument(loaded: Any, direct: ragdb.Database) -> None:
    with pytest.raises(InvalidInput) as got:
        loaded.search("cats", alpha=2.0, scorer="hybrid")
    with pytest.raises(InvalidInput) as expected:
        direct.search("cats", alpha=2.0, scorer="hybrid")
    assert got.value.param == expected.value.param is not None


def test_delete_of_a_missing_id(loaded: Any, direct: ragdb.Database) -> None:
    try:
        expected: Any = direct.delete(999_999)
    except RagdbError as e:
        expected = type(e)
    try:
        got: Any = loaded.delete(999_999)
    except RagdbError as e:
        got = type(e)
    assert got == expected
