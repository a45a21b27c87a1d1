"""``ragdb serve``: a real server process on loopback, an httpx client, results against the library's.

Each server is ``python -m ragdb.cli serve -d kb.db --port PORT ...`` as a subprocess; the
tests wait for ``/healthz`` and compare every endpoint's answer with what the library returns
for the same call (same principals). Auth, limits, JSON errors and ``--workers 2`` too.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

import httpx  # noqa: E402

import ragdb  # noqa: E402
from cli_helpers import free_port, serving  # noqa: E402
from ragdb.cli import cli  # noqa: E402
from ragdb.errors import InvalidInput  # noqa: E402
from ragdb.serve.http_api import (  # noqa: E402
    Grant, Limits, ServerConfig, create_app, glob_prefix, api_hit_json, is_loopback, load_tokens, openapi_schema)

SECRET = "zanzibar"  # only the labelled documents say it (the probes ask for it)
MARK = "quokkas"  # another: the probes never say it, so seeing it means seeing a labelled document
READER = "reader-token-aaaaaaaaaaaaaaaa"   # principals team-a, no writes
WRITER = "writer-token-bbbbbbbbbbbbbbbb"   # principals team-a, writes (team-a's and public documents)
OTHER = "other-token-cccccccccccccccccc"   # principals team-b, writes
ADMIN = "admin-token-dddddddddddddddddd"   # RAGDB_API_TOKEN: everything

DOCS = (
    ("docs/cats.md", "The cat sat on the mat. Cats like a warm mat near the door.", {"lang": "en", "n": 1}, None),
    ("docs/dogs.md", "Dogs chase cats around the park; a dog rarely sits on a mat.", {"lang": "en", "n": 2}, None),
    ("docs/physics.md", "Quantum physics describes particles, and cats in boxes.", {"lang": "en", "n": 3}, None),
    ("notes/katze.txt", "Die Katze schläft auf der Matte.", {"lang": "de", "n": 4}, None),
    ("odd/a[1]*.md", "A file whose name holds glob characters: cats again.", {"lang": "en", "n": 5}, None),
    ("team/plan.md", f"The {SECRET} plan: cats and {MARK} take over the mat at dawn.", {"lang": "en", "n": 6}, ["team-a"]),
    ("team/b.md", f"Team b's {SECRET} notes about mats and {MARK}.", {"lang": "en", "n": 7}, ["team-b"]),
)
TOKENS = {READER: {"principals": ["team-a"]}, WRITER: {"principals": ["team-a"], "write": {"public": True}},
          OTHER: {"principals": ["team-b"], "write": True}}


def _make_kb(folder: Path) -> Path:
    path = folder / "kb.db"
    with ragdb.open(path) as db:
        for source, text, metadata, acl in DOCS:
            db.add(text, source=source, metadata=metadata, acl=acl)
    return path


def _server(kb: Path, *args: str, env: dict[str, str] | None = None, root_args: tuple[str, ...] = ()
            ) -> contextlib.AbstractContextManager[str]:
    """``ragdb serve -d kb ARGS`` on a free loopback port; yields its base URL once /healthz answers."""
    return serving(str(kb), kb.parent, *args, env=env, root_args=root_args)


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _tokens_file(folder: Path, tokens: dict[str, Any] = TOKENS) -> Path:
    path = folder / "tokens.json"
    path.write_bytes(orjson.dumps(tokens))
    return path


def _error(response: httpx.Response, status: int) -> str:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"error"} and body["error"]["status"] == status
    return body["error"]["message"]


def _library_message(fn: Any) -> str:
    with pytest.raises(ragdb.RagdbError) as info:
        fn()
    return " ".join(str(info.value).split())


@pytest.fixture(scope="module")
def kb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _make_kb(tmp_path_factory.mktemp("serve"))


@pytest.fixture(scope="module")
def url(kb: Path) -> Iterator[str]:
    """One read-only-use server (tokens configured, RAGDB_API_TOKEN unset) for the read tests."""
    with _server(kb, "--tokens", str(_tokens_file(kb.parent)), "--max-k", "50", "--max-query", "200",
                 "--max-body", "2000") as base:
        yield base


# --------------------------------------------------------------------------- reads equal the library's

@pytest.mark.parametrize("token, principals", [(None, None), (READER, ["team-a"]), (OTHER, ["team-b"])])
@pytest.mark.parametrize("body", [
    {"query": "cats mat"},
    {"query": "cats mat", "k": 3},
    {"query": f"{SECRET} mat", "k": 10},
    {"query": "cat", "k": 10, "scorer": "tfidf"},
    {"query": "cats", "k": 10, "filter": {"source": "docs/*", "lang": ["en", "de"]}},
    {"query": "cats mat", "k": 10, "min_score": 0.05},
    {"query": "the of and"},  # no index terms: no hits
    {"query": "cats mat", "k": 2, "offset": 1},  # a later page: ranks go on from the offset
    {"query": "cats", "k": 10, "filter": {"$or": [{"lang": {"$ne": "en"}}, {"$contains": "mat"}]}},
])
def test_search_equals_the_library(url: str, kb: Path, token: str | None, principals: Any, body: dict) -> None:
    r = httpx.post(url + "/search", json=body, headers=_auth(token) if token else {})
    assert r.status_code == 200, r.text
    options = {k: v for k, v in body.items() if k not in ("query", "k")}
    with ragdb.open(kb) as db:
        expected = db.search(body["query"], body.get("k", 5), principals=principals, **options)
    assert r.json() == {"query": body["query"],
                        "hits": orjson.loads(orjson.dumps([api_hit_json(h, i) for i, h in
                                                           enumerate(expected, 1 + body.get("offset", 0))]))}


@pytest.mark.parametrize("token, principals", [(None, None), (READER, ["team-a"])])
def test_prompt_equals_the_library(url: str, kb: Path, token: str | None, principals: Any) -> None:
    headers = _auth(token) if token else {}
    for body in ({"question": "where does the cat sit on the mat?", "k": 4},
                 {"question": f"what is the {SECRET} plan?", "min_confidence": 0},
                 {"question": "zyzzyva quux?"}):
        r = httpx.post(url + "/prompt", json=body, headers=headers)
        assert r.status_code == 200, r.text
        got = r.json()
        with ragdb.open(kb) as db:
            p = db.build_prompt(body["question"], k=body.get("k"), min_confidence=body.get("min_confidence"),
                                principals=principals)
        assert (got["refused"], got["system"], got["user"], got["language"], got["confidence"],
                got["min_confidence"]) == (p.refused, p.system, p.user, p.language, p.confidence, p.min_confidence)
        assert got["messages"] == p.messages
        assert [(s["number"], s["chunk_id"], s["score"]) for s in got["sources"]] == \
            [(i, h.chunk_id, h.score) for i, h in enumerate(p.sources, 1)]
    refused = httpx.post(url + "/prompt", json={"question": "zyzzyva quux?"}, headers=headers).json()
    assert refused["refused"] and refused["sources"] == [] and refused["refusal"]


@pytest.mark.parametrize("token, principals", [(None, None), (READER, ["team-a"]), (OTHER, ["team-b"])])
@pytest.mark.parametrize("body", [
    {"field": "lang"},
    {"field": "source", "query": "cats mat", "by": "documents"},
    {"field": "n", "filter": {"source": "docs/*"}, "limit": 2},
    {"field": "lang", "query": SECRET},
    {"field": "version"},  # no document has one: all missing
])
def test_facets_equal_the_library(url: str, kb: Path, token: str | None, principals: Any, body: dict) -> None:
    r = httpx.post(url + "/facets", json=body, headers=_auth(token) if token else {})
    assert r.status_code == 200, r.text
    with ragdb.open(kb) as db:
        f = db.facets(body["field"], body.get("query"), by=body.get("by", "chunks"), limit=body.get("limit", 100),
                      filter=body.get("filter"), principals=principals)
    assert r.json() == {"field": f.field, "by": f.by, "total": f.total, "missing": f.missing, "omitted": f.omitted,
                        "values": [{"value": v, "count": n} for v, n in f]}


def test_facets_count_only_what_the_token_may_see(url: str) -> None:
    post = lambda body, token=None: httpx.post(url + "/facets", json=body,  # noqa: E731
                                               headers=_auth(token) if token else {}).json()
    assert post({"field": "source", "query": SECRET})["total"] == 0
    assert "team/" not in str(post({"field": "source", "limit": 1000}))
    assert post({"field": "lang"})["values"] == [{"value": "en", "count": 4}, {"value": "de", "count": 1}]
    assert post({"field": "source", "query": SECRET}, READER)["values"] == [{"value": "team/plan.md", "count": 1}]
    assert post({"field": "source", "query": SECRET}, OTHER)["values"] == [{"value": "team/b.md", "count": 1}]
    assert post({"field": "source", "limit": 2})["omitted"] == len(DOCS) - 2 - 2
    message = _error(httpx.post(url + "/facets", json={"field": "lang", "principals": ["team-a"]}), 422)
    assert "principals" in message and "API token" in message


def test_facets_bad_input_is_a_json_error(url: str, kb: Path) -> None:
    post = lambda body: httpx.post(url + "/facets", json=body)  # noqa: E731
    assert "missing field 'field'" in _error(post({"query": "cats"}), 422)
    assert "unknown field 'k'" in _error(post({"field": "lang", "k": 3}), 422)
    for limit in (0, 1001, "5", True):
        assert "limit must be an integer from 1 to 1000" in _error(post({"field": "lang", "limit": limit}), 422)
    assert "over this server's limit of 200" in _error(post({"field": "lang", "query": "x" * 201}), 422)
    assert _error(post({"field": "lang", "query": 7}), 422) == "query must be a string, got 7"
    with ragdb.open(kb) as db:
        for body, call in (({"field": 5}, lambda: db.facets(5)),  # type: ignore[arg-type]
                           ({"field": "lang", "by": "words"}, lambda: db.facets("lang", by="words")),
                           ({"field": "lang", "filter": []}, lambda: db.facets("lang", filter=[]))):  # type: ignore
            assert _error(post(body), 422) == _library_message(call)


def test_documents_pages_and_prefix_equal_the_library(url: str, kb: Path) -> None:
    with ragdb.open(kb) as db:
        for token, principals in ((None, None), (READER, ["team-a"])):
            headers = _auth(token) if token else {}
            pages: list[dict] = []
            offset: int | None = 0
            while offset is not None:
                r = httpx.get(url + "/documents", params={"limit": 2, "offset": offset}, headers=headers)
                assert r.status_code == 200, r.text
                pages += r.json()["documents"]
                offset = r.json()["next_offset"]
            assert [d["source"] for d in pages] == [d.source for d in db.documents(principals=principals)]
            assert [d["id"] for d in pages] == [d.id for d in db.documents(principals=principals)]
            assert all("text" not in d for d in pages)
        for odd in ("\u0665", " 2", "+2", "2_0", "2.0", ""):  # int() took the first four (5_0 as fifty)
            r = httpx.get(url + "/documents", params={"limit": odd})
            assert r.status_code == 422 and "limit must be an integer" in r.text, odd
        for prefix, sources in (("docs/", ["docs/cats.md", "docs/dogs.md", "docs/physics.md"]),
                                ("odd/a[1]*", ["odd/a[1]*.md"]), ("odd/a[", ["odd/a[1]*.md"]),
                                ("odd/a?", []), ("team/", []), ("zzz", [])):
            got = httpx.get(url + "/documents", params={"prefix": prefix}).json()
            assert [d["source"] for d in got["documents"]] == sources, prefix
            assert got["documents"] == orjson.loads(orjson.dumps(
                [_doc(d) for d in db.documents(glob_prefix(prefix))]))
            assert got["next_offset"] is None
        got = httpx.get(url + "/documents", params={"prefix": "team/"}, headers=_auth(READER)).json()
        assert [d["source"] for d in got["documents"]] == ["team/plan.md"]


def _doc(d: ragdb.Document) -> dict[str, Any]:
    out = {"id": d.id, "source": d.source, "version": d.version, "timestamp": d.timestamp,
           "content_hash": d.content_hash, "metadata": dict(d.metadata), "acl": list(d.acl),
           "chunks": d.chunk_count, "latest": d.latest}
    if d.text is not None:
        out["text"] = d.text
    return out


def test_get_document_equals_the_library_and_hides_labelled_ones(url: str, kb: Path) -> None:
    with ragdb.open(kb) as db:
        cats = db.get(source="docs/cats.md")
        plan = db.get(source="team/plan.md", principals=["team-a"])
        r = httpx.get(f"{url}/documents/{cats.id}")
        assert r.status_code == 200 and r.json() == orjson.loads(orjson.dumps(_doc(cats)))
        assert r.json()["text"] == DOCS[0][1]
        # a labelled document is not found for an anonymous caller, nor for another team, exactly
        # as one that does not exist: the library's message
        missing = _library_message(lambda: db.get(plan.id))
        assert _error(httpx.get(f"{url}/documents/{plan.id}"), 404) == missing
        assert _error(httpx.get(f"{url}/documents/{plan.id}", headers=_auth(OTHER)), 404) == missing
        assert _error(httpx.get(f"{url}/documents/999999"), 404) == _library_message(lambda: db.get(999999))
        r = httpx.get(f"{url}/documents/{plan.id}", headers=_auth(READER))
        assert r.status_code == 200 and r.json() == orjson.loads(orjson.dumps(_doc(plan)))
        assert _error(httpx.get(f"{url}/documents/0"), 422) == _library_message(lambda: db.get(0))
    assert _error(httpx.get(f"{url}/documents/abc"), 404).startswith("no endpoint GET /documents/abc")
    # with_text is true or false: the string "false" was truthy, and the text came back
    r = httpx.post(f"{url}/documents/get", json={"id": cats.id, "with_text": "false"})
    assert "with_text must be True or False" in _error(r, 422)


def test_stats_and_healthz(url: str, kb: Path) -> None:
    """A caller without the full view gets the counts of what it may see, nothing of the whole
    collection (which would tell how much is hidden); /healthz gives no pid to it."""
    with ragdb.open(kb) as db:
        for token, principals in ((None, None), (READER, ["team-a"])):
            got = httpx.get(url + "/stats", headers=_auth(token) if token else {}).json()
            visible = db.count(principals=principals)
            assert got["documents"] == got["visible_documents"] == visible < len(DOCS)
            assert got["chunks"] == len(db.documents(principals=principals))  # one chunk each
            assert not {"vocabulary", "postings", "file_size", "stored_documents", "segments"} & set(got)
            assert got["writes_allowed"] is False
        assert httpx.get(url + "/stats").json()["visible_documents"] == len(DOCS) - 2
    health = httpx.get(url + "/healthz").json()
    assert health == {"status": "ok", "version": ragdb.__version__}


def test_anonymous_callers_never_see_labelled_documents(url: str) -> None:
    """The secret word is in the two labelled documents only: no anonymous read shows it."""
    reads = [httpx.post(url + "/search", json={"query": SECRET, "k": 50}),
             httpx.post(url + "/search", json={"query": f"{SECRET} plan notes mats cats", "k": 50}),
             httpx.post(url + "/prompt", json={"question": f"what is the {SECRET} plan?", "min_confidence": 0}),
             httpx.get(url + "/documents", params={"limit": 1000})]
    for r in reads:
        assert r.status_code == 200, r.text
        assert MARK not in r.text and "team/" not in r.text
    assert httpx.post(url + "/search", json={"query": SECRET}).json()["hits"] == []
    # a token sees its own team's, never the other's
    seen = httpx.post(url + "/search", json={"query": SECRET, "k": 50}, headers=_auth(READER)).json()["hits"]
    assert [h["source"] for h in seen] == ["team/plan.md"]
    seen = httpx.post(url + "/search", json={"query": SECRET, "k": 50}, headers=_auth(OTHER)).json()["hits"]
    assert [h["source"] for h in seen] == ["team/b.md"]


def test_principals_are_never_taken_from_the_request(url: str) -> None:
    for path, body in (("/search", {"query": SECRET, "principals": ["team-a"]}),
                       ("/prompt", {"question": SECRET, "principals": ["team-a"]})):
        message = _error(httpx.post(url + path, json=body), 422)
        assert "principals" in message and "API token" in message
    message = _error(httpx.get(url + "/documents", params={"principals": "team-a"}), 422)
    assert "unknown query parameter 'principals'" in message


# --------------------------------------------------------------------------- auth

def test_a_wrong_or_malformed_token_is_refused_not_read_as_anonymous(url: str) -> None:
    for headers in (_auth("not-a-token-of-this-server-123"), {"Authorization": "Basic dXNlcjpwdw=="},
                    {"Authorization": "Bearer"}, _auth(READER + "x"), _auth(READER[:-1])):
        for r in (httpx.post(url + "/search", json={"query": "cats"}, headers=headers),
                  httpx.get(url + "/stats", headers=headers), httpx.get(url + "/documents", headers=headers)):
            _error(r, 401)
            assert r.headers["www-authenticate"] == "Bearer"


def test_writes_need_a_token_that_may_write(url: str, kb: Path) -> None:
    with ragdb.open(kb) as db:
        cats = db.get(source="docs/cats.md").id
    new = {"text": "Ferrets sleep a lot.", "source": "docs/ferret.md"}
    assert "needs an API token" in _error(httpx.post(url + "/documents", json=new), 401)
    assert _error(httpx.delete(f"{url}/documents/{cats}"), 401)
    assert _error(httpx.post(url + "/documents", json=new, headers=_auth("wrong-token-000000000000")), 401)
    assert "may not write" in _error(httpx.post(url + "/documents", json=new, headers=_auth(READER)), 403)
    assert "may not write" in _error(httpx.delete(f"{url}/documents/{cats}", headers=_auth(READER)), 403)
    with ragdb.open(kb) as db:
        assert db.count(principals=ragdb.ALL) == len(DOCS)


def test_without_tokens_writes_are_off(tmp_path: Path) -> None:
    kb = _make_kb(tmp_path)
    with _server(kb) as url:
        new = {"text": "Ferrets sleep a lot.", "source": "docs/ferret.md"}
        assert "writes are off" in _error(httpx.post(url + "/documents", json=new), 403)
        assert "writes are off" in _error(httpx.delete(f"{url}/documents/1"), 403)
        assert _error(httpx.post(url + "/search", json={"query": "cats"}, headers=_auth(WRITER)), 401)
        assert httpx.post(url + "/search", json={"query": "cats"}).status_code == 200
    with ragdb.open(kb) as db:
        assert db.count(principals=ragdb.ALL) == len(DOCS)


def test_writes_add_replace_and_delete_as_the_library_would(tmp_path: Path) -> None:
    kb = _make_kb(tmp_path)
    with _server(kb, "--tokens", str(_tokens_file(tmp_path)), env={"RAGDB_API_TOKEN": ADMIN}) as url:
        w = _auth(WRITER)
        r = httpx.post(url + "/documents", json={"text": "Ferrets sleep a lot, ferrets play.", "source": "pets/ferret.md",
                                                 "metadata": {"lang": "en"}, "version": "v1"}, headers=w)
        assert r.status_code == 201, r.text
        added = r.json()
        assert added["status"] == "added" and added["source"] == "pets/ferret.md" and added["previous"] is None
        hits = httpx.post(url + "/search", json={"query": "ferrets"}).json()["hits"]  # anonymous sees it at once
        assert [h["doc_id"] for h in hits] == [added["id"]]
        same = httpx.post(url + "/documents", json={"text": "Ferrets sleep a lot, ferrets play.",
                                                    "source": "pets/ferret.md", "metadata": {"lang": "en"},
                                                    "version": "v1"}, headers=w).json()
        assert same["status"] == "unchanged" and same["id"] == added["id"]
        replaced = httpx.post(url + "/documents", json={"text": "Ferrets hunt rabbits.", "source": "pets/ferret.md"},
                              headers=w).json()
        assert replaced["status"] == "replaced" and replaced["previous"] == added["id"]
        with ragdb.open(kb) as db:
            doc = db.get(source="pets/ferret.md")
            assert (doc.id, doc.text) == (replaced["id"], "Ferrets hunt rabbits.")
            assert httpx.get(f"{url}/documents/{doc.id}").json() == orjson.loads(orjson.dumps(_doc(doc)))
            plan = db.get(source="team/plan.md", principals=ragdb.ALL)
            b = db.get(source="team/b.md", principals=ragdb.ALL)
        # a token may not replace or delete what it cannot see: not found, nothing written
        hidden = {"text": "overwritten", "source": "team/b.md"}
        assert "not replacing it" in _error(httpx.post(url + "/documents", json=hidden, headers=w), 404)
        assert _error(httpx.delete(f"{url}/documents/{b.id}", headers=w), 404) == f"no document with id {b.id}"
        # ... what it can see, it may: the replaced team document keeps its labels
        r = httpx.post(url + "/documents", json={"text": f"The {SECRET} plan, revised.", "source": "team/plan.md"},
                       headers=w)
        assert r.json()["status"] == "replaced"
        # the library's messages for bad records
        bad = {"text": 42, "source": "x.md"}
        with ragdb.open(kb) as db:
            expected = _library_message(lambda: db.add_many([bad]))
        assert _error(httpx.post(url + "/documents", json=bad, headers=w), 422) == expected
        # an integer past 64 bits is refused as the library refuses it: orjson read the body's
        # 2**70 + 1 as the float 1.1805916207174113e+21 and stored that (httpx writes it exactly)
        huge = {"text": "Huge numbers.", "source": "huge.md", "metadata": {"n": 2 ** 70 + 1}}
        with ragdb.open(kb) as db:
            expected = _library_message(lambda: db.add_many([huge]))
            assert "outside the 64-bit integer range" in expected
        assert _error(httpx.post(url + "/documents", json=huge, headers=w), 422) == expected
        nested = {"text": "Huge numbers.", "source": "huge.md", "metadata": {"n": [1, -2 ** 64]}}
        assert "outside the 64-bit integer range" in _error(httpx.post(url + "/documents", json=nested, headers=w), 422)
        assert "outside the 64-bit integer range" in \
            _error(httpx.post(url + "/search", json={"query": "cats", "filter": {"n": 2 ** 70}}), 422).replace("out of", "outside")
        # without a source, the library's: derived from the text
        r = httpx.post(url + "/documents", json={"text": "A text without a source."}, headers=w)
        with ragdb.open(":memory:") as scratch:
            assert r.status_code == 201 and r.json()["source"] == scratch.add("A text without a source.").source
        assert httpx.delete(f"{url}/documents/{r.json()['id']}", headers=w).json() == {"deleted": 1}
        r = httpx.delete(f"{url}/documents/{doc.id}", headers=w)
        assert r.status_code == 200 and r.json() == {"deleted": 1}
        assert _error(httpx.get(f"{url}/documents/{doc.id}"), 404)
        # the administrator's token (RAGDB_API_TOKEN) sees and deletes everything
        assert httpx.get(url + "/stats", headers=_auth(ADMIN)).json()["visible_documents"] == len(DOCS)
        assert httpx.delete(f"{url}/documents/{b.id}", headers=_auth(ADMIN)).json() == {"deleted": 1}
    with ragdb.open(kb) as db:
        assert db.get(source="team/plan.md", principals=ragdb.ALL).acl == plan.acl == ("team-a",)
        assert db.get(source="team/plan.md", principals=ragdb.ALL).text == f"The {SECRET} plan, revised."
        assert {d.source for d in db.documents(principals=ragdb.ALL)} == {s for s, *_ in DOCS} - {"team/b.md"}


def test_readonly_serves_reads_and_refuses_writes(tmp_path: Path) -> None:
    kb = _make_kb(tmp_path)
    with _server(kb, root_args=("--readonly",), env={"RAGDB_API_TOKEN": ADMIN}) as url:
        assert httpx.post(url + "/search", json={"query": "cats"}).status_code == 200
        message = _error(httpx.post(url + "/documents", json={"text": "x", "source": "x"}, headers=_auth(ADMIN)), 403)
        assert "read-only" in message


# --------------------------------------------------------------------------- limits and bad input

def test_limits_and_bad_input_are_json_errors_with_the_librarys_messages(url: str, kb: Path) -> None:
    post = lambda body: httpx.post(url + "/search", json=body)  # noqa: E731
    assert "k=51 is over this server's limit of 50" in _error(post({"query": "cats", "k": 51}), 422)
    assert "offset + k = 51 is over this server's limit of 50" in \
        _error(post({"query": "cats", "k": 30, "offset": 21}), 422)
    assert "offset must be a non-negative integer" in _error(post({"query": "cats", "offset": -1}), 422)
    assert "over this server's limit of 200" in _error(post({"query": "cats " * 50}), 422)
    assert "over this server's limit of 200" in _error(httpx.post(url + "/prompt", json={"question": "x" * 201}), 422)
    big = httpx.post(url + "/search", content=orjson.dumps({"query": "cats", "filter": {"x": "y" * 3000}}))
    assert "limit of 2,000 bytes" in _error(big, 413)

    def chunked() -> Iterator[bytes]:  # no Content-Length: the limit holds while reading
        yield b'{"query": "cats", "filter": {"x": "'
        for _ in range(10):
            yield b"y" * 500
        yield b'"}}'

    assert "limit of 2,000 bytes" in _error(httpx.post(url + "/search", content=chunked()), 413)
    assert "not JSON" in _error(httpx.post(url + "/search", content=b"{query: cats"), 400)
    assert "must be a JSON object, got list" in _error(httpx.post(url + "/search", content=b"[1]"), 400)
    assert "missing field 'query'" in _error(post({"k": 3}), 422)
    assert "unknown field 'kk'" in _error(post({"query": "cats", "kk": 3}), 422)
    with ragdb.open(kb) as db:
        for body, call in (({"query": "cats", "k": 0}, lambda: db.search("cats", 0)),
                           ({"query": "cats", "k": "3"}, lambda: db.search("cats", "3")),  # type: ignore[arg-type]
                           ({"query": "cats", "scorer": "bm99"}, lambda: db.search("cats", scorer="bm99")),
                           ({"query": "cats", "filter": []}, lambda: db.search("cats", filter=[])),
                           ({"query": "cats", "scorer": "vector"}, None)):
            message = _error(post(body), 422)
            if call is not None:
                assert message == _library_message(call)
            else:
                assert "needs vectors" in message
        assert _error(post({"query": 7}), 422) == "query must be a string, got 7"
        assert _error(httpx.post(url + "/prompt", json={"question": "cats", "language": "xx"}), 422) == \
            _library_message(lambda: db.build_prompt("cats", language="xx"))
    assert "limit must be from 1 to 1000" in _error(httpx.get(url + "/documents", params={"limit": 0}), 422)
    assert "offset must be an integer" in _error(httpx.get(url + "/documents", params={"offset": "x"}), 422)
    assert _error(httpx.get(url + "/search"), 405).startswith("no endpoint GET /search")
    assert _error(httpx.get(url + "/nothing"), 404) == "no endpoint GET /nothing"


def test_openapi_describes_every_route(url: str) -> None:
    schema = httpx.get(url + "/openapi.json").json()
    assert schema["openapi"].startswith("3.") and schema == orjson.loads(orjson.dumps(openapi_schema(
        Limits(max_body_bytes=2000, max_k=50, max_query_chars=200))))
    described = {(path, method.upper()) for path, ops in schema["paths"].items() for method in ops}
    app = create_app(ServerConfig(database="unused.db"), tokens={})
    routes = [(prefix.path + route.path, route) for prefix in app.routes  # type: ignore[attr-defined]
              for route in getattr(prefix, "routes", None) or []]  # a Mount's: under its path
    routes += [(route.path, route) for route in app.routes if not hasattr(route, "routes")]  # type: ignore[attr-defined]
    served = {(path.replace("{doc_id:int}", "{id}"), method)
              for path, route in routes for method in route.methods - {"HEAD"}  # type: ignore[attr-defined]
              if path != "/openapi.json"}
    assert described == served
    refs = {v for v in _walk(schema) if isinstance(v, str) and v.startswith("#/components/schemas/")}
    assert {r.rsplit("/", 1)[1] for r in refs} <= set(schema["components"]["schemas"])
    assert schema["components"]["schemas"]["SearchRequest"]["properties"]["k"]["maximum"] == 50


def _walk(obj: Any) -> Iterator[Any]:
    if isinstance(obj, dict):
        for v in obj.values():
            yield from _walk(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _walk(v)
    else:
        yield obj


# --------------------------------------------------------------------------- workers

def test_two_workers_each_with_its_own_connection(tmp_path: Path) -> None:
    kb = _make_kb(tmp_path)
    with _server(kb, "--workers", "2", env={"RAGDB_API_TOKEN": ADMIN}) as url:
        pids: set[int] = set()
        for _ in range(400):  # a new connection each time: the kernel hands them to both workers
            pids.add(httpx.get(url + "/healthz", headers=_auth(ADMIN)).json()["pid"])
            if len(pids) == 2:
                break
        assert len(pids) == 2
        # a write through one worker is visible from every worker at once
        for i in range(6):
            r = httpx.post(url + "/documents", json={"text": f"Wombat number {i} digs burrows.",
                                                    "source": f"w/{i}.md"}, headers=_auth(ADMIN))
            assert r.status_code == 201, r.text
            seen: set[int] = set()
            for _ in range(400):
                health = httpx.get(url + "/healthz", headers=_auth(ADMIN)).json()
                r = httpx.post(url + "/search", json={"query": "wombat burrows", "k": 20})
                assert len(r.json()["hits"]) == i + 1
                seen.add(health["pid"])
                if len(seen) == 2:
                    break
        with ragdb.open(kb) as db:
            expected = [api_hit_json(h, n) for n, h in enumerate(db.search("wombat burrows", 20), 1)]
            for _ in range(8):
                got = httpx.post(url + "/search", json={"query": "wombat burrows", "k": 20}).json()["hits"]
                assert got == orjson.loads(orjson.dumps(expected))


# --------------------------------------------------------------------------- the command and the tokens file

def test_serve_refuses_a_remote_host_without_allow_remote(runner: Any, tmp_path: Path) -> None:
    kb = _make_kb(tmp_path)
    result = runner.invoke(cli, ["serve", "-d", str(kb), "--host", "0.0.0.0"])
    assert result.exit_code == 2 and "--allow-remote" in result.output
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3") and not is_loopback("example.com")


def test_serve_refuses_bad_tokens_and_missing_databases(runner: Any, tmp_path: Path, monkeypatch: Any) -> None:
    kb = _make_kb(tmp_path)
    monkeypatch.delenv("RAGDB_API_TOKEN", raising=False)
    bad = tmp_path / "bad.json"
    for content, needle in (({"short": {"principals": ["a"]}}, "at least 16 characters"),
                            ({READER: {"principals": []}}, "principals must be a non-empty list"),
                            ({READER: {"principals": ["a"], "admin": True}}, "unknown key 'admin'"),
                            ({READER: {"principals": ["a"], "write": "yes"}}, "write must be true, false or a scope"),
                            ({READER: {"principals": ["*"]}}, "is the public label"),
                            ([1], "expected a mapping")):
        bad.write_bytes(orjson.dumps(content))
        result = runner.invoke(cli, ["serve", "-d", str(kb), "--tokens", str(bad)])
        assert result.exit_code == 1 and needle in result.output, (content, result.output)
    bad.write_text("{")
    assert "not valid JSON" in runner.invoke(cli, ["serve", "-d", str(kb), "--tokens", str(bad)]).output
    result = runner.invoke(cli, ["serve", "-d", str(kb)], env={"RAGDB_API_TOKEN": "abc"})
    assert result.exit_code == 1 and "RAGDB_API_TOKEN: a token must be at least 16 characters" in result.output
    result = runner.invoke(cli, ["serve", "-d", str(tmp_path / "none.db")])
    assert result.exit_code == 1 and "no such database" in result.output
    assert not (tmp_path / "none.db").exists()
    result = runner.invoke(cli, ["serve", "-d", ":memory:"])
    assert result.exit_code == 2 and "needs a database file" in result.output


def test_tokens_file_in_toml(tmp_path: Path) -> None:
    path = tmp_path / "tokens.toml"
    path.write_text(f'["{READER}"]\nprincipals = ["team-a", "staff"]\n\n["{ADMIN}"]\nall = true\nwrite = true\n')
    tokens = load_tokens(path, env={})
    assert tokens == {READER: Grant(principals=("team-a", "staff"), write=False),
                      ADMIN: Grant(principals=ragdb.ALL, write=True)}
    assert load_tokens(None, env={"RAGDB_API_TOKEN": WRITER}) == {WRITER: Grant(principals=ragdb.ALL, write=True)}
    assert load_tokens(None, env={}) == {}
    path.write_text("not toml = [")
    with pytest.raises(InvalidInput, match="not valid TOML"):
        load_tokens(path, env={})
    path.write_text("x = " + "[" * 3000 + "1" + "]" * 3000 + "\n")  # (tomllib's RecursionError escaped)
    with pytest.raises(InvalidInput, match="not valid TOML: nested too deeply"):
        load_tokens(path, env={})
    # saved with a byte order mark (Windows editors write one), in either format
    path.write_bytes(f'\ufeff["{READER}"]\nprincipals = ["team-a"]\n'.encode())
    assert load_tokens(path, env={}) == {READER: Grant(principals=("team-a",), write=False)}
    as_json = tmp_path / "tokens.json"
    as_json.write_bytes(b"\xef\xbb\xbf" + orjson.dumps({READER: {"principals": ["team-a"]}}))
    assert load_tokens(as_json, env={}) == {READER: Grant(principals=("team-a",), write=False)}


def test_the_workers_socket_gets_tcp_nodelay_on_accepted_connections() -> None:
    """``--workers N`` serves on a socket bound in the parent: bound with IPPROTO_TCP, so asyncio
    turns Nagle's algorithm off on each connection (else keep-alive requests wait for delayed ACKs)."""
    import asyncio

    from ragdb.serve.http_api import UvicornConfig

    listener = UvicornConfig("ragdb.serve.http_api:app_from_environment", host="127.0.0.1", port=free_port()).bind_socket()
    assert listener.proto == socket.IPPROTO_TCP

    async def main() -> int:
        seen: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        class Probe(asyncio.Protocol):
            def connection_made(self, transport: Any) -> None:
                seen.set_result(transport.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
                transport.close()

        server = await asyncio.get_running_loop().create_server(Probe, sock=listener)
        _, writer = await asyncio.open_connection(*listener.getsockname()[:2])
        try:
            return await asyncio.wait_for(seen, 30)
        finally:
            writer.close()
            server.close()

    assert asyncio.run(main()) != 0


def test_serves_the_collection_it_is_given(tmp_path: Path) -> None:
    """``ragdb -c NAME serve`` (and ``serve -c NAME``) answers from that collection only, in every worker."""
    kb = _make_kb(tmp_path)
    with ragdb.open(kb, collection="other") as db:
        db.add("Collections keep their own documents and statistics.", source="other/one.md")
        expected = [h.source for h in db.search("collections statistics")]
    assert expected == ["other/one.md"]
    with _server(kb, "--workers", "2", root_args=("-c", "other")) as url:
        for _ in range(4):  # reach both workers
            hits = httpx.post(url + "/search", json={"query": "collections statistics"}).json()["hits"]
            assert [h["source"] for h in hits] == expected
        assert httpx.get(url + "/stats").json()["documents"] == 1
    with _server(kb, "-c", "other") as url:
        assert [d["source"] for d in httpx.get(url + "/documents").json()["documents"]] == ["other/one.md"]
    with _server(kb) as url:  # the default collection knows nothing of it
        assert httpx.post(url + "/search", json={"query": "collections statistics"}).json()["hits"] == []
