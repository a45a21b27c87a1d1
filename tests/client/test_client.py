"""``ragdb.connect`` where a server differs from a file: tokens, write scopes, what a caller may
see, collections served or not, errors from the wire. Real ``ragdb serve`` processes on 127.0.0.1
(the shared API suite, tests/client/test_api_parity.py, runs the rest)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

import httpx  # noqa: E402

import ragdb  # noqa: E402
from cli_helpers import free_port, serving  # noqa: E402
from ragdb.errors import (AccessDenied, CollectionNotFound, DocumentNotFound, InvalidInput,  # noqa: E402
                          RemoteError, Unauthorized, WriteForbidden)

ADMIN = "client-admin-token-aaaaaaaaaaaaaa"
READER = "client-reader-token-bbbbbbbbbbbbb"  # team-a, reads only
WRITER = "client-writer-token-ccccccccccccc"  # team-a, writes team-a's documents and public ones
TEAM_B = "client-teamb-token-ddddddddddddddd"  # team-b, writes team-b's documents
TOKENS = {READER: {"principals": ["team-a"]}, WRITER: {"principals": ["team-a"], "write": {"public": True}},
          TEAM_B: {"principals": ["team-b"], "write": True}}


@pytest.fixture(scope="module")
def kb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("client")
    (folder / "tokens.json").write_bytes(orjson.dumps(TOKENS))
    path = folder / "kb.db"
    with ragdb.open(path) as db:
        db.add("Cats sit on mats; a public note.", source="pub/cats.md", metadata={"team": "none"})
        db.add("Team a's plan about mats.", source="a/plan.md", metadata={"team": "a"}, acl=["team-a"])
        db.add("Team b's secret about mats.", source="b/secret.md", metadata={"team": "b"}, acl=["team-b"])
        db.create_collection("other").add("A document of another collection about mats.", source="o.md")
    return path


@pytest.fixture(scope="module")
def url(kb: Path) -> Iterator[str]:
    with serving(str(kb), kb.parent, "--collections", "--tokens", str(kb.parent / "tokens.json"),
                 env={"RAGDB_API_TOKEN": ADMIN}) as base:
        yield base


def test_ragdb_connect_is_lazy_and_exported() -> None:
    code = "import sys, ragdb; assert 'ragdb.client' not in sys.modules and 'httpx' not in sys.modules; " \
           "ragdb.connect; assert 'ragdb.client' in sys.modules; assert 'ragdb.database' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
    assert "connect" in ragdb.__all__ and ragdb.connect is ragdb.client.connect


def test_connect_checks_the_address_and_the_token(url: str) -> None:
    with pytest.raises(Unauthorized):
        ragdb.connect(url, token="not-a-token-of-this-server-xxxx")
    with pytest.raises(RemoteError):
        ragdb.connect(f"http://127.0.0.1:{free_port()}", timeout=5)
    for bad in ("kb.db", "ftp://host/x", "http://user:pw@127.0.0.1:1"):
        with pytest.raises(InvalidInput):
            ragdb.connect(bad)
    with ragdb.connect(url) as anonymous:
        assert repr(anonymous).startswith("<ragdb.Client") and anonymous.collection_name == "default"


def test_reads_are_the_tokens_own(url: str, kb: Path) -> None:
    with ragdb.connect(url) as anonymous, ragdb.connect(url, token=READER) as reader, \
            ragdb.open(kb, readonly=True) as db:
        assert [d.source for d in anonymous.documents()] == ["pub/cats.md"]
        assert reader.documents() == db.documents(principals=["team-a"])
        assert reader.search("mats", k=10) == db.search("mats", k=10, principals=["team-a"])
        assert reader.count() == 2 and anonymous.count() == 1
        with pytest.raises(DocumentNotFound):
            reader.get(source="b/secret.md")  # hidden: as if missing
        with pytest.raises(InvalidInput):
            reader.search("mats", principals=ragdb.ALL)  # who reads is the token's
        with pytest.raises(InvalidInput):
            reader.get(source="pub/cats.md", principals=["team-b"])
        s = reader.stats()
        assert (s.documents, s.collection) == (2, "default") and s.vocabulary == 0  # only what it may see


def test_writes_are_bounded_by_the_tokens_scope(url: str) -> None:
    with ragdb.connect(url, token=READER) as reader, pytest.raises(AccessDenied):
        reader.add("a reader cannot write", source="pub/r.md")
    with ragdb.connect(url, token=WRITER) as writer, ragdb.connect(url, token=ADMIN) as admin:
        with pytest.raises(WriteForbidden):
            writer.add("labelled for team b", source="pub/x.md", acl=["team-b"])
        doc = writer.add("A team-a note about mats.", source="a/note.md", acl=["team-a"])
        assert doc.acl == ("team-a",)
        # a hidden source's delete answers as a missing one's: nothing deleted, nothing said
        assert writer.delete(source="b/secret.md") == 0 == writer.delete(source="b/missing.md")
        assert admin.get(source="b/secret.md").source == "b/secret.md"
        # by filter or pattern: only what it may see, and refused whole when it may not write one of them
        with ragdb.connect(url, token=TEAM_B) as team_b, pytest.raises(WriteForbidden):
            team_b.delete(filter={"team": "none"})  # public: outside team b's scope
        assert admin.count(filter={"team": "none"}) == 1
        assert writer.delete(source="*/*.md", glob=True, filter={"team": {"$in": ["a", "b"]}}) == 1
        assert admin.count(filter={"team": "b"}) == 1 and admin.count(filter={"team": "a"}) == 0
        writer.add("Team a's plan about mats.", source="a/plan.md", metadata={"team": "a"}, acl=["team-a"])
        assert writer.delete(source="a/note.md") == 1
        with pytest.raises(DocumentNotFound):
            writer.update(admin.get(source="b/secret.md").id, metadata={"x": 1})


def test_what_json_cannot_carry_is_refused_as_the_library_refuses_it(url: str, kb: Path) -> None:
    """NaN, infinities and keys that are not strings: orjson wrote them as null and as strings,
    so the server stored metadata None or '1', and a filter matched what the library's refuses."""
    nan, inf = float("nan"), float("inf")
    with ragdb.connect(url, token=ADMIN) as admin, ragdb.open(kb) as db:
        doc = admin.get(source="pub/cats.md")
        for handle in (admin, db):
            for metadata in ({"w": nan}, {"w": [1.0, inf]}, {"m": {"k": -inf}}, {1: "x"}):
                with pytest.raises(InvalidInput):
                    handle.add("Not stored.", source="pub/nan.md", metadata=metadata)
                with pytest.raises(InvalidInput):
                    handle.update(doc.id, metadata=metadata)
            for flt in ({"team": nan}, {"team": {"$nin": [inf]}}, {1: "none"}, {"$or": [{"n": {"$lt": nan}}]}):
                with pytest.raises(InvalidInput):
                    handle.count(filter=flt)
                with pytest.raises(InvalidInput):
                    handle.search("mats", filter=flt)
                with pytest.raises(InvalidInput):
                    handle.delete(filter=flt)
            with pytest.raises(InvalidInput):
                handle.search("mats", since=inf)
        assert db.documents("pub/nan.md", principals=ragdb.ALL) == []
        assert dict(db.get(source="pub/cats.md").metadata) == {"team": "none"}


def test_collections_bounded_by_access(url: str) -> None:
    with ragdb.connect(url, token=READER) as reader, ragdb.connect(url, token=WRITER) as writer, \
            ragdb.connect(url, token=ADMIN) as admin:
        names = {c.name: c for c in reader.collections()}
        assert set(names) >= {"default", "other"} and names["default"].documents == 2
        assert {c.name: c.documents for c in admin.collections()}["default"] == 3
        assert [h.source for h in reader.collection("other", create=False).search("mats")] == ["o.md"]
        with pytest.raises(AccessDenied):
            writer.create_collection("writers-own")
        with pytest.raises(AccessDenied):
            writer.drop_collection("other")
        with pytest.raises(CollectionNotFound):
            reader.collection("nowhere", create=False)
        with pytest.raises(InvalidInput):
            admin.drop_collection("default")
        scratch = admin.create_collection("scratch")
        scratch.add("scratch text", source="s.md")
        with ragdb.connect(url, collection="scratch") as bound:
            assert bound.count() == 1 and bound.collection_name == "scratch"
        admin.drop_collection("scratch")
        with pytest.raises(CollectionNotFound):
            scratch.count()


def test_a_collection_dropped_and_made_again_behind_the_servers_back(url: str, kb: Path) -> None:
    with ragdb.connect(url, token=ADMIN) as admin:
        first = admin.create_collection("again")
        first.add("the first life of the collection", source="one.md")
        assert first.count() == 1  # the server now holds a handle on it
        with ragdb.open(kb) as db:  # another process drops it and makes it again
            db.drop_collection("again")
            db.create_collection("again").add("its second life, about mats", source="two.md")
        assert [d.source for d in first.documents()] == ["two.md"]
        admin.drop_collection("again")


def test_one_collection_served_without_collections(kb: Path) -> None:
    with serving(str(kb), kb.parent, env={"RAGDB_API_TOKEN": ADMIN}) as base, \
            ragdb.connect(base, token=ADMIN) as admin:
        assert [c.name for c in admin.collections()] == ["default"]
        with pytest.raises(CollectionNotFound):
            admin.collection("other", create=False)  # in the file, not served
        with pytest.raises(AccessDenied):
            admin.create_collection("new")
        assert admin.collection("default", create=False).count() == admin.count()


@pytest.mark.parametrize("path", ["/search", "/prompt", "/collections/other/search", "/collections/other/prompt"])
def test_k_must_be_an_integer(url: str, path: str) -> None:
    field = "question" if path.endswith("prompt") else "query"
    for k in (True, "5", 2.5):
        r = httpx.post(url + path, json={field: "mats", "k": k})
        assert r.status_code == 422, r.text
        assert r.json()["error"]["type"] == "InvalidInput"
    r = httpx.post(url + path, json={field: "mats", "k": 0})
    assert r.status_code == 422 and r.json()["error"]["param"] == "k"  # the argument at fault, as the library names it


def test_a_server_that_is_not_ragdb(tmp_path: Path) -> None:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"], cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):  # until it listens (a guard against one that never does, not a timing assertion)
            try:
                httpx.get(f"http://127.0.0.1:{port}/", timeout=5)
                break
            except httpx.TransportError:
                time.sleep(0.05)
        with ragdb.Client(f"http://127.0.0.1:{port}") as client, pytest.raises(RemoteError, match="ragdb server"):
            client.count()
    finally:
        proc.terminate()
        proc.wait(30)


def test_collections_named_by_dots_are_their_own(url: str, kb: Path) -> None:
    """'..' and '.' are collection names like any other, but dot segments of a URL: the client sent
    /collections/../search, which is /search, so a handle on '..' read and wrote the served collection."""
    with ragdb.open(kb) as db:
        db.collection("..").add("Narwhals of the dot-dot collection.", source="n.md")
    try:
        with ragdb.connect(url, token=ADMIN, collection="..") as dots, ragdb.connect(url, token=ADMIN) as admin:
            assert [h.source for h in dots.search("narwhals")] == ["n.md"] and dots.count() == 1
            before = admin.count()
            dots.add("Written through the dot-dot handle.", source="d.md")
            assert admin.count() == before and dots.count() == 2
            assert admin.collection("..", create=False).count() == 2
            one = admin.collection(".")  # created, through the server
            one.add("One dot.", source="o.md")
            assert one.count() == 1 and admin.count() == before
            admin.drop_collection(".")
            admin.drop_collection("..")
    finally:
        with ragdb.open(kb) as db:
            for name in (".", ".."):
                if name in [c.name for c in db.collections()]:
                    db.drop_collection(name)


DOC = {"id": 1, "source": "a.md", "version": None, "timestamp": None, "content_hash": "x", "metadata": {},
       "acl": [], "chunks": 1, "latest": True}
# Each read and write of the client, and an answer of the wrong shape for it.
WRONG_SHAPES = [
    ("/search", lambda c: c.search("q"), [{}, {"hits": 5}, {"hits": [{}]}, [1]]),
    ("/search", lambda c: c.query_plan("q"), [{"hits": [], "plan": {}}]),
    ("/prompt", lambda c: c.build_prompt("q"), [{}, {"system": "s", "user": "u", "sources": 1}]),
    ("/documents/count", lambda c: c.count(), [{}, {"count": "7"}, {"count": None}, {"count": 1.5}]),
    ("/documents/get", lambda c: c.get(1), [{}, {**DOC, "acl": 5}]),
    ("/documents/query", lambda c: c.documents(), [{}, {"documents": [{}], "next_offset": None},
                                                   {"documents": [], "next_offset": "1000"}]),
    ("/documents/batch", lambda c: c.add("text"), [{}, {"documents": [{"status": "added"}]},
                                                   {"documents": [], "embedded": "x"}]),
    ("/documents/1", lambda c: c.delete(1), [{}, {"deleted": None}]),
    ("/documents/delete", lambda c: c.delete(source="a.md"), [{"deleted": "2"}]),
    ("/facets", lambda c: c.facets("team"), [{}, {"field": "team", "by": "chunks", "values": [1]}]),
    ("/stats", lambda c: c.stats(), [[], "stats"]),
    ("/collections", lambda c: c.collections(), [{}, {"collections": [{"unknown": 1}]}]),
]


@pytest.mark.parametrize(("path", "call", "answers"), WRONG_SHAPES, ids=[p + str(i) for i, (p, _, _) in
                                                                         enumerate(WRONG_SHAPES)])
def test_an_answer_of_the_wrong_shape_is_a_remote_error(httpserver, path: str, call, answers) -> None:
    """A server answering JSON that is not what ragdb's API answers (a proxy's, another service's)
    is a RemoteError naming the request: it was a KeyError, TypeError, ValueError or AttributeError."""
    client = ragdb.Client(httpserver.url_for("").rstrip("/"))
    for answer in answers:
        httpserver.clear()
        httpserver.expect_request(path).respond_with_json(answer)
        with pytest.raises(RemoteError, match="answered what is not ragdb's API"):
            call(client)
    client.close()


def test_a_listing_whose_next_offset_does_not_advance_is_a_remote_error(httpserver) -> None:
    """A server answering the same next_offset again made documents() ask for the same page for
    ever (without a limit; with one, the page's documents came again and again)."""
    httpserver.expect_request("/documents/query").respond_with_json({"documents": [DOC], "next_offset": 0})
    with ragdb.Client(httpserver.url_for("").rstrip("/")) as client, \
            pytest.raises(RemoteError, match="next_offset 0 after offset 0"):
        client.documents(limit=3)


@pytest.mark.parametrize("kind", ["InvalidInput", "DocumentNotFound", "MissingDependency", "Teapot"])
def test_a_server_echoing_the_token_never_shows_it(httpserver, kind: str) -> None:
    """A server (a proxy) that quotes the request's Authorization header, or a credential header
    given, in its error message: the library's error never carries the token or the key."""
    from werkzeug import Request, Response

    def echo(request: Request) -> Response:
        message = f"refused {request.headers.get('Authorization')} with key {request.headers.get('X-Api-Key')}"
        return Response(orjson.dumps({"error": {"type": kind, "message": message}}), status=400,
                        content_type="application/json")

    httpserver.expect_request("/documents/count").respond_with_handler(echo)
    key = "proxy-key-QWERTYzxcv"
    with ragdb.Client(httpserver.url_for("").rstrip("/"), token=WRITER, headers={"X-Api-Key": key}) as client, \
            pytest.raises(ragdb.RagdbError, match="refused Bearer") as info:
        client.count()
    shown = str(info.value) + repr(info.value)
    assert "refused" in shown and "ccccccc" not in shown and "QWERTY" not in shown


def test_an_answer_trickled_out_times_out() -> None:
    """A server sending its answer's body a byte at a time, each within the timeout, does not
    hold the client for ever: the whole body gets one timeout, as the model clients' do."""
    from pytest_httpserver import HTTPServer
    from werkzeug import Request, Response

    def trickle(request: Request) -> Response:
        def body() -> Iterator[bytes]:
            for _ in range(40):  # 8 s, a byte every 0.2 s
                yield b" "
                time.sleep(0.2)
        return Response(body(), content_type="application/json")

    server = HTTPServer(host="127.0.0.1", port=0, threaded=True)
    server.start()
    try:
        server.expect_request("/documents/count").respond_with_handler(trickle)
        with ragdb.Client(server.url_for("").rstrip("/"), timeout=1) as client, \
                pytest.raises(RemoteError, match=r"no answer in time \(its body took more than 1s\)"):
            client.count()
    finally:
        server.clear()
        server.stop()


def test_an_answer_past_the_size_limit_is_refused(httpserver, monkeypatch) -> None:
    """A compressed bomb (10 KB of gzip, 16 MiB of body) is read up to the model clients' limit,
    then refused: it was read whole into memory, however big."""
    import gzip

    from ragdb.models import http_client

    monkeypatch.setattr(http_client, "MAX_REPLY_BYTES", 1 << 20)
    bomb = gzip.compress(b" " * (16 << 20))
    httpserver.expect_request("/documents/count").respond_with_data(
        bomb, content_type="application/json", headers={"Content-Encoding": "gzip"})
    with ragdb.Client(httpserver.url_for("").rstrip("/")) as client, \
            pytest.raises(RemoteError, match="more than 1,048,576 bytes"):
        client.count()
