"""``ragdb serve``'s trust model, against real server processes on 127.0.0.1: which Host headers
and browser origins it answers, what a write token may write, what errors and statistics tell
a caller, and how long a connection may hold the server without sending a request."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import orjson
import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

import httpx  # noqa: E402

import ragdb  # noqa: E402
from cli_helpers import serving  # noqa: E402
from ragdb.errors import InvalidInput  # noqa: E402
from ragdb.serve.access import WriteScope, client_message  # noqa: E402
from ragdb.serve.http_api import default_allowed_hosts, load_tokens  # noqa: E402

ADMIN = "admin-token-dddddddddddddddddd"      # RAGDB_API_TOKEN: everything
TEAM_A = "team-a-writer-bbbbbbbbbbbbbbbb"     # reads team-a, writes team-a's documents (write: true)
NOBODY = "nobody-writer-eeeeeeeeeeeeeeee"     # reads "nobody", writes (nothing public)
PUBLISHER = "publisher-ffffffffffffffffffff"  # reads team-a; writes public or team-a documents under pub/
TOKENS = {TEAM_A: {"principals": ["team-a"], "write": True},
          NOBODY: {"principals": ["nobody"], "write": True},
          PUBLISHER: {"principals": ["team-a"], "write": {"public": True, "sources": ["pub/"]}}}

DOCS = (("docs/cats.md", "The cat sat on the mat.", None),
        ("team/a.md", "Team a's plan about mats.", ["team-a"]),
        ("team/ab.md", "Shared plan of team a and team b about mats.", ["team-a", "team-b"]),
        ("team/b.md", "Team b's secret plan about mats.", ["team-b"]))


def _kb(folder: Path) -> Path:
    path = folder / "kb.db"
    with ragdb.open(path) as db:
        for source, text, acl in DOCS:
            db.add(text, source=source, acl=acl)
    (folder / "tokens.json").write_bytes(orjson.dumps(TOKENS))
    return path


def _serve(kb: Path, *args: str) -> Any:
    return serving(str(kb), kb.parent, "--tokens", str(kb.parent / "tokens.json"), *args,
                   env={"RAGDB_API_TOKEN": ADMIN})


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _error(r: httpx.Response, status: int) -> str:
    assert r.status_code == status, r.text
    return str(r.json()["error"]["message"])


@pytest.fixture(scope="module")
def kb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _kb(tmp_path_factory.mktemp("trust"))


@pytest.fixture(scope="module")
def url(kb: Path) -> Any:
    with _serve(kb, "--header-timeout", "1", "--body-timeout", "1") as base:
        yield base


# --------------------------------------------------------------------------- DNS rebinding and CORS

def test_a_foreign_host_header_is_refused(url: str) -> None:
    """A web page at evil.example whose name resolves to 127.0.0.1 (DNS rebinding) sends
    ``Host: evil.example``: the server does not answer it."""
    port = url.rsplit(":", 1)[1]
    for host in ("evil.example", f"evil.example:{port}", "127.0.0.1.evil.example", "localhost.", ""):
        r = httpx.get(url + "/stats", headers={"Host": host})
        assert r.status_code == 400 and "cats" not in r.text, (host, r.text)
    for host in ("127.0.0.1", f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", "LOCALHOST"):
        assert httpx.get(url + "/stats", headers={"Host": host}).status_code == 200, host


def test_allowed_hosts_are_configurable(kb: Path) -> None:
    # (the test waits for the server at 127.0.0.1: that name stays allowed)
    with _serve(kb, "--allowed-host", "kb.example", "--allowed-host", "*.corp.example",
                "--allowed-host", "127.0.0.1") as base:
        for host, status in (("kb.example", 200), ("a.corp.example", 200), ("localhost", 400),
                             ("evil.example", 400)):
            assert httpx.get(base + "/healthz", headers={"Host": host}).status_code == status, host
    with _serve(kb, "--allowed-host", "*") as base:
        assert httpx.get(base + "/healthz", headers={"Host": "anything.example"}).status_code == 200


def test_default_allowed_hosts_are_the_bound_address_names() -> None:
    assert set(default_allowed_hosts("127.0.0.1")) == {"127.0.0.1", "localhost", "[::1]"}
    assert set(default_allowed_hosts("::1")) == {"127.0.0.1", "localhost", "[::1]"}
    assert default_allowed_hosts("10.1.2.3") == ("10.1.2.3",)
    assert "localhost" in default_allowed_hosts("0.0.0.0")


def test_cors_is_off_by_default_and_configurable(url: str, kb: Path) -> None:
    origin = {"Origin": "https://evil.example"}
    preflight = {**origin, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization"}
    assert "access-control-allow-origin" not in httpx.get(url + "/stats", headers=origin).headers
    assert "access-control-allow-origin" not in httpx.options(url + "/search", headers=preflight).headers
    with _serve(kb, "--cors-origin", "https://app.example") as base:
        ok = {"Origin": "https://app.example"}
        r = httpx.get(base + "/stats", headers=ok)
        assert r.headers["access-control-allow-origin"] == "https://app.example"
        r = httpx.options(base + "/search", headers={**preflight, **ok})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "https://app.example"
        # every method the API has may be asked for from an allowed page (PATCH updates a document)
        patch = {**preflight, **ok, "Access-Control-Request-Method": "PATCH"}
        r = httpx.options(base + "/documents/1", headers=patch)
        assert r.status_code == 200 and "PATCH" in r.headers["access-control-allow-methods"]
        assert "access-control-allow-origin" not in httpx.get(base + "/stats", headers=origin).headers


# --------------------------------------------------------------------------- writes bounded by the writer's access

def test_a_write_token_writes_only_within_its_labels(tmp_path: Path) -> None:
    kb = _kb(tmp_path)
    with ragdb.open(kb) as db:
        ids = {d.source: d.id for d in db.documents(principals=ragdb.ALL)}
    with _serve(kb) as url:
        post = lambda token, body: httpx.post(url + "/documents", json=body, headers=_auth(token))  # noqa: E731
        # another team's label, a public document, public among labels: refused, nothing written
        assert "labelled ['team-b']" in _error(post(TEAM_A, {"text": "x", "source": "n/1", "acl": ["team-b"]}), 403)
        assert "labelled []" in _error(post(TEAM_A, {"text": "x", "source": "n/2"}), 403)
        assert _error(post(TEAM_A, {"text": "x", "source": "n/3", "acl": ["team-a", "*"]}), 403)
        assert _error(post(NOBODY, {"text": "x", "source": "n/4"}), 403)
        # its own label: written; a replace keeping its labels too
        assert post(TEAM_A, {"text": "Team a's note.", "source": "n/5", "acl": ["team-a"]}).status_code == 201
        assert post(TEAM_A, {"text": "Team a's plan, revised.", "source": "team/a.md"}).json()["status"] == "replaced"
        # a document it sees but whose labels reach beyond its own, or a public one: not changed
        assert "team-b" in _error(post(TEAM_A, {"text": "x", "source": "team/ab.md", "acl": ["team-a"]}), 403)
        assert _error(post(TEAM_A, {"text": "x", "source": "docs/cats.md", "acl": ["team-a"]}), 403)
        # what it cannot see: not found, exactly as what does not exist
        missing = _error(httpx.delete(f"{url}/documents/999999", headers=_auth(TEAM_A)), 404)
        hidden = _error(httpx.delete(f"{url}/documents/{ids['team/b.md']}", headers=_auth(TEAM_A)), 404)
        assert hidden == missing.replace("999999", str(ids["team/b.md"]))
        # a token whose principals see nothing deletes nothing, public or not
        assert _error(httpx.delete(f"{url}/documents/{ids['docs/cats.md']}", headers=_auth(NOBODY)), 403)
        assert _error(httpx.delete(f"{url}/documents/{ids['team/a.md']}", headers=_auth(NOBODY)), 404)
        assert _error(httpx.delete(f"{url}/documents/{ids['team/ab.md']}", headers=_auth(TEAM_A)), 403)
        # a scope with sources and public documents
        assert post(PUBLISHER, {"text": "Public news.", "source": "pub/news.md"}).status_code == 201
        assert "may not write source 'docs/x.md'" in _error(post(PUBLISHER, {"text": "x", "source": "docs/x.md"}),
                                                           403)
        assert _error(post(PUBLISHER, {"text": "x", "source": "pub/y.md", "acl": ["team-b"]}), 403)
        assert _error(httpx.delete(f"{url}/documents/{ids['docs/cats.md']}", headers=_auth(PUBLISHER)), 403)
        assert "acl must be a list" in _error(post(TEAM_A, {"text": "x", "source": "n/6", "acl": "team-a"}), 422)
    with ragdb.open(kb) as db:
        docs = {d.source: d for d in db.documents(principals=ragdb.ALL)}
        assert set(docs) == {s for s, _, _ in DOCS} | {"n/5", "pub/news.md"}
        assert docs["team/a.md"].acl == ("team-a",) and docs["n/5"].acl == ("team-a",)
        assert docs["team/ab.md"].acl == ("team-a", "team-b") and docs["pub/news.md"].acl == ()


def test_write_scopes_in_the_tokens_file(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    for scope, needle in (({"labels": ["team-b"]}, "not among its principals"),
                          ({"public": "yes"}, "write.public must be true or false"),
                          ({"sources": "pub/"}, "write.sources must be a list"),
                          ({"everything": True}, "unknown key 'everything'")):
        path.write_bytes(orjson.dumps({TEAM_A: {"principals": ["team-a"], "write": scope}}))
        with pytest.raises(InvalidInput, match=needle):
            load_tokens(path, env={})
    path.write_bytes(orjson.dumps(TOKENS))
    grants = load_tokens(path, env={"RAGDB_API_TOKEN": ADMIN})
    assert grants[TEAM_A].write_scope == WriteScope(labels=("team-a",), public=False)
    assert grants[PUBLISHER].write_scope == WriteScope(labels=("team-a",), public=True, sources=("pub/",))
    assert grants[ADMIN].write_scope.unbounded


# --------------------------------------------------------------------------- what errors and statistics tell

def test_errors_never_carry_the_database_path(tmp_path: Path) -> None:
    kb = _kb(tmp_path)
    with _serve(kb, "--busy-timeout", "0.2") as url, ragdb.open(kb) as db, db.transaction():
        db.add("Held by another writer.", source="held.md")  # this process holds the write lock
        r = httpx.post(url + "/documents", json={"text": "x", "source": "y"}, headers=_auth(ADMIN))
        message = _error(r, 503)
        assert "locked" in message and "<database>" in message
        assert str(tmp_path) not in r.text and "/tmp" not in r.text


def test_client_messages_drop_urls_and_paths() -> None:
    assert client_message(OSError("postgresql://u:secret@db.internal:5432/kb: cannot connect"),
                          database="postgresql://u:secret@db.internal:5432/kb") == "<database>: cannot connect"
    assert client_message(OSError("cannot read /srv/data/x.json: gone")) == "cannot read <path>: gone"
    assert client_message(OSError("no document with source 'docs/a.md'")) == "no document with source 'docs/a.md'"


def test_stats_show_no_hidden_write(tmp_path: Path) -> None:
    kb = _kb(tmp_path)
    with _serve(kb) as url:
        before = httpx.get(url + "/stats").json()
        r = httpx.post(url + "/documents", json={"text": "A hidden note on many new words: alpha beta gamma.",
                                                 "source": "team/new.md", "acl": ["team-b"]}, headers=_auth(ADMIN))
        assert r.status_code == 201
        assert httpx.get(url + "/stats").json() == before
        assert httpx.get(url + "/stats", headers=_auth(TEAM_A)).json()["documents"] == 3
        full = httpx.get(url + "/stats", headers=_auth(ADMIN)).json()
        assert full["documents"] == len(DOCS) + 1 and full["vocabulary"] > 0
        assert "pid" not in httpx.get(url + "/healthz").json()
        assert isinstance(httpx.get(url + "/healthz", headers=_auth(ADMIN)).json()["pid"], int)


def test_k_must_be_a_number_not_a_boolean(url: str) -> None:
    assert "k must be an integer, got true" in _error(httpx.post(url + "/search", json={"query": "cat", "k": True}),
                                                     422)
    assert "offset must be an integer" in _error(httpx.post(url + "/search", json={"query": "cat", "offset": False}),
                                                 422)
    assert _error(httpx.post(url + "/prompt", json={"question": "cat", "k": True}), 422)


# --------------------------------------------------------------------------- idle and trickling connections

def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    sock = socket.create_connection((host, int(port)))
    sock.settimeout(60)  # a guard: the server closes long before (--header-timeout 1)
    return sock


def _read_all(sock: socket.socket) -> bytes:
    out = b""
    while chunk := sock.recv(65536):
        out += chunk
    return out


def test_an_idle_connection_is_closed(url: str) -> None:
    with _connect(url) as sock:
        assert _read_all(sock) == b""  # closed without a word (a timeout here: still open)


def test_a_trickling_request_head_is_closed(url: str) -> None:
    with _connect(url) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # ... and never the end of the head
        assert _read_all(sock) == b""


def test_an_idle_keep_alive_connection_is_closed_after_its_response(url: str) -> None:
    with _connect(url) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert _read_all(sock).startswith(b"HTTP/1.1 200")


def test_a_trickling_body_is_answered_408(url: str) -> None:
    with _connect(url) as sock:
        sock.sendall(b"POST /search HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n{\"query\": ")
        answer = _read_all(sock)
        assert answer.startswith(b"HTTP/1.1 408"), answer
        assert b"not sent within 1 s" in answer


# --------------------------------------------------------------------------- batches and updates, within the scope

def test_batch_add_and_update_stay_within_the_scope(tmp_path: Path) -> None:
    kb = _kb(tmp_path)
    with ragdb.open(kb) as db:
        ids = {d.source: d.id for d in db.documents(principals=ragdb.ALL)}
    with _serve(kb) as url:
        batch = lambda token, docs: httpx.post(url + "/documents/batch", json={"documents": docs},  # noqa: E731
                                               headers=_auth(token))
        patch = lambda token, doc_id, body: httpx.patch(f"{url}/documents/{doc_id}", json=body,  # noqa: E731
                                                        headers=_auth(token))
        r = batch(TEAM_A, [{"text": "First team note.", "source": "b/1", "acl": ["team-a"]},
                           {"text": "Second team note.", "source": "b/2", "acl": ["team-a"]}])
        assert r.status_code == 201, r.text
        assert [d["status"] for d in r.json()["documents"]] == ["added", "added"]
        # one record outside the scope: none of them is written
        assert "labelled []" in _error(batch(TEAM_A, [{"text": "Third.", "source": "b/3", "acl": ["team-a"]},
                                                      {"text": "Public.", "source": "b/4"}]), 403)
        same = _error(batch(TEAM_A, [{"text": "x", "source": "b/5", "acl": ["team-a"]},
                                     {"text": "y", "source": "b/5", "acl": ["team-a"]}]), 422)
        assert "same source" in same and "its own source" in same and "metadata['source']" not in same
        assert _error(batch(TEAM_A, []), 422)
        # updates: its own documents, to labels within its scope
        got = patch(TEAM_A, ids["team/a.md"], {"metadata": {"reviewed": True}})
        assert got.status_code == 200 and got.json()["metadata"] == {"reviewed": True}
        assert _error(patch(TEAM_A, ids["team/a.md"], {"acl": []}), 403)  # would make it public
        assert _error(patch(TEAM_A, ids["team/a.md"], {"acl": ["team-b"]}), 403)
        assert _error(patch(TEAM_A, ids["team/ab.md"], {"metadata": {"x": 1}}), 403)
        assert _error(patch(TEAM_A, ids["team/b.md"], {"metadata": {"x": 1}}), 404) == \
            _error(patch(TEAM_A, 999999, {"metadata": {"x": 1}}), 404).replace("999999", str(ids["team/b.md"]))
        assert patch(ADMIN, ids["team/b.md"], {"acl": ["team-a"]}).json()["acl"] == ["team-a"]
        assert httpx.patch(f"{url}/documents/{ids['team/b.md']}", json={"acl": []}).status_code == 401
    with ragdb.open(kb) as db:
        assert {d.source for d in db.documents(principals=ragdb.ALL)} == {s for s, _, _ in DOCS} | {"b/1", "b/2"}
        assert db.get(source="team/a.md", principals=ragdb.ALL).acl == ("team-a",)
        assert dict(db.get(source="team/ab.md", principals=ragdb.ALL).metadata) == {}
