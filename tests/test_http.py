"""ragdb.http, the one HTTP layer of chat, embeddings and rerank, against real loopback servers.

Every server here listens on 127.0.0.1 only. The redirect tests answer 302 (and
the other 3xx) pointing at a second loopback server, the "trap", and check that
the trap never receives a request: following a redirect would hand it the
Authorization header.
"""

from __future__ import annotations

import base64
import email.utils
import json
import logging
import socket
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest
from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

from ragdb.embeddings import OpenAIEmbedder
from ragdb.errors import EmbeddingError, InvalidInput, LLMError, RemoteError, RerankError
from ragdb.http import (
    Endpoint,
    check_base_url,
    display_url,
    openai_key_for,
    parse_retry_after,
    redact,
    resolve_api_key,
)
from ragdb.llm import ChatClient
from ragdb.rerank import HTTPReranker
from ragdb.types import Hit

KEY = "sk-test-TOPSECRET-0123456789abcdef"
PASSWORD = "pa55-w0rd-hidden"
MESSAGES = [{"role": "user", "content": "Hi"}]
ERRORS = (LLMError, EmbeddingError, RerankError)


def _server(threaded: bool = False) -> Iterator[HTTPServer]:
    server = HTTPServer(host="127.0.0.1", port=0, threaded=threaded)
    server.start()
    try:
        yield server
    finally:
        server.clear()
        if server.is_running():
            server.stop()


@pytest.fixture
def origin() -> Iterator[HTTPServer]:
    """The server the clients are configured for."""
    yield from _server()


@pytest.fixture
def trap() -> Iterator[HTTPServer]:
    """A second server that must never be contacted."""
    yield from _server()


@pytest.fixture
def threaded() -> Iterator[HTTPServer]:
    """A server answering several requests at once (for timeouts)."""
    yield from _server(threaded=True)


def hits(*texts: str) -> list[Hit]:
    return [
        Hit(score=1.0, chunk_id=i, doc_id=i, source=f"d{i}", version=None, timestamp=None,
            text=t, start=0, end=len(t), ordinal=0, metadata={})
        for i, t in enumerate(texts)
    ]


def embeddings_reply(request: Request) -> Response:
    texts = json.loads(request.get_data())["input"]
    data = [{"index": i, "embedding": [1.0, float(i), 0.5]} for i, _ in enumerate(texts)]
    return Response(json.dumps({"data": data}), content_type="application/json")


RERANK_REPLY = [{"index": 0, "score": 0.2}, {"index": 1, "score": 0.9}]
CHAT_REPLY = {"choices": [{"message": {"role": "assistant", "content": "ok [1]"}}]}
SSE_REPLY = 'data: {"choices": [{"delta": {"content": "ok"}, "finish_reason": "stop"}]}\n\ndata: [DONE]\n\n'


# Each client kind: (path on the server, make the client, call it once, its error class)


def _embedder(url: str, **kw):
    return OpenAIEmbedder(base_url=url + "/v1", model="m", api_key=kw.pop("api_key", KEY), dimensions=3, **kw)


def _reranker(url: str, **kw):
    return HTTPReranker(base_url=url + "/v1", model="rr", api_key=kw.pop("api_key", KEY), **kw)


def _chat(url: str, **kw):
    return ChatClient(base_url=url + "/v1", model="m", api_key=kw.pop("api_key", KEY), **kw)


KINDS = {
    "embeddings": ("/v1/embeddings", _embedder, lambda c: c.embed(["a text"]), EmbeddingError),
    "rerank": ("/v1/rerank", _reranker, lambda c: c.rerank("q", hits("a", "b")), RerankError),
    "chat": ("/v1/chat/completions", _chat, lambda c: c.complete(MESSAGES), LLMError),
    "chat-stream": ("/v1/chat/completions", _chat, lambda c: list(c.stream(MESSAGES)), LLMError),
}


def _ok(kind: str, server: HTTPServer) -> None:
    """Make ``server`` answer ``kind``'s request successfully from now on."""
    path = KINDS[kind][0]
    if kind == "embeddings":
        server.expect_request(path).respond_with_handler(embeddings_reply)
    elif kind == "rerank":
        server.expect_request(path).respond_with_json({"results": [
            {"index": 0, "relevance_score": 0.2}, {"index": 1, "relevance_score": 0.9}]})
    elif kind == "chat":
        server.expect_request(path).respond_with_json(CHAT_REPLY)
    else:
        server.expect_request(path).respond_with_data(SSE_REPLY, content_type="text/event-stream")


def _no_secret(text: str) -> None:
    assert KEY not in text
    assert "TOPSECRET" not in text
    assert PASSWORD not in text


# ------------------------------------------------------------------ redirects


@pytest.mark.parametrize("kind", list(KINDS))
def test_302_is_refused_and_the_key_never_reaches_the_other_server(kind, origin, trap):
    path, make, call, error = KINDS[kind]
    target = trap.url_for("/steal")
    origin.expect_request(path).respond_with_response(
        Response("moved", status=302, headers={"Location": target})
    )
    _ok(kind, trap)  # a trap that would even answer well
    client = make(origin.url_for("").rstrip("/"), max_retries=3, backoff=0.001)
    with pytest.raises(error) as info:
        call(client)
    err = info.value
    assert isinstance(err, RemoteError)
    assert not isinstance(err, tuple(e for e in ERRORS if e is not error))
    message = str(err)
    assert "HTTP 302" in message and repr(target) in message and "refused" in message
    assert "never follows redirects" in message and "credentials" in message
    _no_secret(message)
    assert err.__cause__ is None
    assert trap.log == []  # the second server never saw any request, so never the key
    assert len(origin.log) == 1  # and a refused redirect is not retried
    assert origin.log[0][0].headers["Authorization"] == f"Bearer {KEY}"


@pytest.mark.parametrize("status", [301, 303, 307, 308])
def test_every_redirect_status_is_refused(status, origin, trap):
    origin.expect_request("/v1/embeddings").respond_with_response(
        Response("", status=status, headers={"Location": trap.url_for("/v1/embeddings")})
    )
    _ok("embeddings", trap)
    with pytest.raises(EmbeddingError, match=f"HTTP {status} redirect"):
        _embedder(origin.url_for("").rstrip("/")).embed(["x"])
    assert trap.log == []


def test_redirect_location_is_scrubbed(origin, trap):
    location = f"http://user:{PASSWORD}@127.0.0.1:{trap.port}/steal?token={KEY}"
    origin.expect_request("/v1/chat/completions").respond_with_response(
        Response("", status=302, headers={"Location": location})
    )
    with pytest.raises(LLMError) as info:
        _chat(origin.url_for("").rstrip("/")).complete(MESSAGES)
    message = str(info.value)
    assert f"'http://127.0.0.1:{trap.port}/steal'" in message
    _no_secret(message)
    assert "token" not in message
    assert trap.log == []


# ------------------------------------------------------------------ retries


def test_429_with_retry_after_then_success(origin):
    origin.expect_ordered_request("/v1/embeddings").respond_with_data(
        "slow down", status=429, headers={"Retry-After": "0"}
    )
    origin.expect_ordered_request("/v1/embeddings").respond_with_handler(embeddings_reply)
    # backoff=5 would wait 5 s: Retry-After: 0 is honoured instead
    e = _embedder(origin.url_for("").rstrip("/"), backoff=5.0)
    t0 = time.monotonic()
    out = e.embed(["one", "two"])
    assert time.monotonic() - t0 < 2
    assert out.shape == (2, 3)
    assert [resp.status_code for _, resp in origin.log] == [429, 200]


def test_retry_after_http_date_is_honoured(origin):
    past = email.utils.formatdate(time.time() - 60, usegmt=True)
    origin.expect_ordered_request("/v1/rerank").respond_with_data(
        "busy", status=503, headers={"Retry-After": past}
    )
    origin.expect_ordered_request("/v1/rerank").respond_with_json({"results": [
        {"index": 0, "relevance_score": 0.2}, {"index": 1, "relevance_score": 0.9}]})
    t0 = time.monotonic()
    out = _reranker(origin.url_for("").rstrip("/"), backoff=5.0).rerank("q", hits("a", "b"))
    assert time.monotonic() - t0 < 2  # a date in the past: no wait, not the 5 s backoff
    assert [h.text for h in out] == ["b", "a"]
    assert len(origin.log) == 2


def test_retry_after_waits_and_is_capped(origin):
    origin.expect_ordered_request("/v1/chat/completions").respond_with_data(
        "", status=429, headers={"Retry-After": "0.3"}
    )
    origin.expect_ordered_request("/v1/chat/completions").respond_with_data(
        "", status=429, headers={"Retry-After": "3600"}
    )
    origin.expect_ordered_request("/v1/chat/completions").respond_with_json(CHAT_REPLY)
    t0 = time.monotonic()
    assert _chat(origin.url_for("").rstrip("/"), backoff=0.001, max_backoff=0.4).complete(MESSAGES) == "ok [1]"
    elapsed = time.monotonic() - t0
    assert 0.3 + 0.4 <= elapsed < 3  # waited 0.3 s, then 3600 s capped to 0.4 s
    assert len(origin.log) == 3


def test_parse_retry_after():
    now = 1_700_000_000.0
    assert parse_retry_after("0") == 0.0
    assert parse_retry_after(" 12 ") == 12.0
    assert parse_retry_after("1.5") == 1.5
    assert parse_retry_after(email.utils.formatdate(now + 30, usegmt=True), now=now) == pytest.approx(30.0)
    assert parse_retry_after(email.utils.formatdate(now - 30, usegmt=True), now=now) == 0.0
    for bad in (None, "", "soon", "-1", "nan", "inf"):
        assert parse_retry_after(bad) is None


@pytest.mark.parametrize("kind", list(KINDS))
def test_503_is_retried_then_success(kind, origin):
    origin.expect_oneshot_request(KINDS[kind][0]).respond_with_data("overloaded", status=503)
    _ok(kind, origin)
    path, make, call, _ = KINDS[kind]
    result = call(make(origin.url_for("").rstrip("/"), max_retries=1, backoff=0.001))
    assert len(origin.log) == 2
    if kind == "embeddings":
        assert isinstance(result, np.ndarray) and result.shape == (1, 3)
    elif kind == "rerank":
        assert [h.text for h in result] == ["b", "a"]
    else:
        assert result in ("ok [1]", ["ok"])


@pytest.mark.parametrize("status", [408, 429, 500, 502, 503, 504])
@pytest.mark.parametrize("kind", list(KINDS))
def test_retries_are_bounded(kind, status, origin):
    path, make, call, error = KINDS[kind]
    origin.expect_request(path).respond_with_data("try later", status=status)
    with pytest.raises(error, match=f"after 3 attempts: HTTP {status}: try later"):
        call(make(origin.url_for("").rstrip("/"), max_retries=2, backoff=0.001))
    assert len(origin.log) == 3


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422])
@pytest.mark.parametrize("kind", list(KINDS))
def test_other_4xx_are_not_retried(kind, status, origin):
    path, make, call, error = KINDS[kind]
    origin.expect_request(path).respond_with_json({"error": {"message": "bad request body"}}, status=status)
    with pytest.raises(error) as info:
        call(make(origin.url_for("").rstrip("/"), max_retries=3, backoff=0.001))
    assert f"HTTP {status}: bad request body" in str(info.value)
    assert "attempts" not in str(info.value)
    assert len(origin.log) == 1


def test_a_dropped_connection_is_retried():
    """A server that closes the first connection without answering, then answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    port = listener.getsockname()[1]
    seen: list[bytes] = []

    def serve() -> None:
        for n in range(2):
            conn, _ = listener.accept()
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                head, _, body = data.partition(b"\r\n\r\n")
                length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                                  if line.lower().startswith(b"content-length")))
                while len(body) < length:
                    body += conn.recv(65536)
                seen.append(body)
                if n == 0:
                    continue  # close without a word
                reply = json.dumps(RERANK_REPLY).encode()
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                             b"Content-Length: " + str(len(reply)).encode() + b"\r\n\r\n" + reply)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        rr = HTTPReranker(base_url=f"http://127.0.0.1:{port}", backoff=0.001, max_retries=1, timeout=5)
        assert [h.text for h in rr.rerank("q", hits("a", "b"))] == ["b", "a"]
    finally:
        thread.join(5)
        listener.close()
    assert len(seen) == 2 and json.loads(seen[0]) == json.loads(seen[1])


def test_read_timeout_retried_for_embeddings_not_for_chat(threaded):
    calls = []

    def slow_first(request: Request) -> Response:
        calls.append(time.monotonic())
        if len(calls) == 1:
            time.sleep(0.8)
        return embeddings_reply(request)

    threaded.expect_request("/v1/embeddings").respond_with_handler(slow_first)
    e = _embedder(threaded.url_for("").rstrip("/"), timeout=0.3, backoff=0.001, max_retries=1)
    assert e.embed(["x"]).shape == (1, 3)
    assert len(calls) == 2

    chat_calls = []

    def slow(request: Request) -> Response:
        chat_calls.append(time.monotonic())
        time.sleep(0.8)
        return Response(json.dumps(CHAT_REPLY), content_type="application/json")

    threaded.expect_request("/v1/chat/completions").respond_with_handler(slow)
    with pytest.raises(LLMError, match=r"timed out after 0\.3s") as info:
        _chat(threaded.url_for("").rstrip("/"), timeout=0.3, max_retries=3).complete(MESSAGES)
    assert "attempts" not in str(info.value)
    time.sleep(0.1)  # a retry would have been sent by now
    assert len(chat_calls) == 1


# ------------------------------------------------------------------ secrets


@pytest.mark.parametrize("kind", list(KINDS))
def test_errors_never_show_the_key_or_the_url_password(kind, origin, caplog):
    path, make, call, error = KINDS[kind]

    def echo(request: Request) -> Response:
        auth = request.headers.get("Authorization", "")
        text = (f"denied: {auth} / key={KEY} / {KEY[5:25]} / "
                f"http://user:{PASSWORD}@127.0.0.1/v1 / password {PASSWORD}")
        return Response(json.dumps({"error": {"message": text}}), status=500, content_type="application/json")

    origin.expect_request(path).respond_with_handler(echo)
    caplog.set_level(logging.DEBUG)  # ragdb.http's retry lines, and httpx's own
    base = f"http://user:{PASSWORD}@127.0.0.1:{origin.port}"
    client = make(base, max_retries=1, backoff=0.001)
    _no_secret(repr(client))
    with pytest.raises(error) as info:
        call(client)
    message = str(info.value)
    assert "HTTP 500: denied" in message and "after 2 attempts" in message
    for text in (message, repr(info.value), caplog.text):
        _no_secret(text)
    assert len(origin.log) == 2
    request = origin.log[0][0]
    assert request.headers["Authorization"] == f"Bearer {KEY}"  # the key was sent, though
    assert PASSWORD not in request.url


def test_connection_errors_never_show_the_password_or_key():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nobody listens there
    e = OpenAIEmbedder(base_url=f"http://user:{PASSWORD}@127.0.0.1:{port}/v1", model="m", api_key=KEY,
                       max_retries=1, backoff=0.001)
    with pytest.raises(EmbeddingError, match="after 2 attempts: connection failed") as info:
        e.embed(["x"])
    _no_secret(str(info.value))
    assert f"http://127.0.0.1:{port}/v1/embeddings" in str(info.value)


def test_url_userinfo_is_sent_as_basic_auth_without_a_key(origin, monkeypatch):
    monkeypatch.delenv("RAGDB_RERANK_API_KEY", raising=False)
    origin.expect_request("/rerank").respond_with_json(RERANK_REPLY)
    rr = HTTPReranker(base_url=f"http://user:{PASSWORD}@127.0.0.1:{origin.port}")
    rr.rerank("q", hits("a", "b"))
    request = origin.log[0][0]
    assert request.headers["Authorization"] == "Basic " + base64.b64encode(f"user:{PASSWORD}".encode()).decode()
    assert PASSWORD not in repr(rr)


def test_redact():
    assert redact(f"key {KEY} here", KEY) == "key *** here"
    assert "TOPSECRET" not in redact(f"partial {KEY[4:24]}...", KEY)  # 8+ characters shared with the key
    assert redact("Authorization: Bearer abc.def-123", None) == "Authorization: Bearer ***"
    assert redact("header basic dXNlcjpwYXNz", None) == "header basic ***"
    assert redact("leaked sk-proj-AbCdEf0123456789 and sk-short", None) == "leaked sk-*** and sk-short"
    assert redact(f"see https://bob:{PASSWORD}@host.example/x", None) == "see https://host.example/x"
    assert redact(f"password is {PASSWORD}", None, PASSWORD) == "password is ***"
    assert redact("nothing secret in here about a task-force", KEY) == "nothing secret in here about a task-force"
    assert redact("a b c", "a") == "a b c"  # a secret that short is not searched for


def test_display_url_and_check_base_url():
    assert display_url(f"https://u:{PASSWORD}@h.example:8443/v1?key=1#f") == "https://h.example:8443/v1"
    assert check_base_url(" http://127.0.0.1:8080/v1/ ") == "http://127.0.0.1:8080/v1"
    for bad in ("ftp://x/v1", "file:///etc/passwd", "localhost:8080", "http://", "http://h:port/"):
        with pytest.raises(InvalidInput, match="base_url"):
            check_base_url(bad)
    with pytest.raises(InvalidInput, match="base_url must be a string"):
        check_base_url(None)
    with pytest.raises(InvalidInput) as info:
        check_base_url(f"ftp://u:{PASSWORD}@h/")
    assert PASSWORD not in str(info.value)


# ------------------------------------------------------------------ the API-key rule


def test_api_key_rule(monkeypatch):
    for name in ("RAGDB_EMBED_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    local = "http://127.0.0.1:9/v1"
    openai = "https://api.openai.com/v1"
    assert resolve_api_key(None, "RAGDB_EMBED_API_KEY", openai) == ""
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    assert resolve_api_key(None, "RAGDB_EMBED_API_KEY", openai) == KEY  # OpenAI's own API
    assert openai_key_for("https://API.OpenAI.com/v1") == KEY
    for other in (local, "http://api.openai.com/v1", "https://api.openai.com.evil.test/v1",
                  "https://evil.test/api.openai.com/v1"):
        assert resolve_api_key(None, "RAGDB_EMBED_API_KEY", other) == ""  # never elsewhere
    assert resolve_api_key(None, "RAGDB_EMBED_API_KEY", local, openai_paired=True) == KEY  # OPENAI_BASE_URL
    assert resolve_api_key("mine", "RAGDB_EMBED_API_KEY", openai) == "mine"  # explicit wins
    assert resolve_api_key("", "RAGDB_EMBED_API_KEY", openai) == ""  # even empty
    monkeypatch.setenv("RAGDB_EMBED_API_KEY", "ragdb-key")
    assert resolve_api_key(None, "RAGDB_EMBED_API_KEY", local) == "ragdb-key"  # the ragdb variable
    monkeypatch.setenv("RAGDB_EMBED_API_KEY", "")
    assert resolve_api_key(None, "RAGDB_EMBED_API_KEY", openai) == ""  # set to "" wins too
    monkeypatch.setenv("RAGDB_EMBED_API_KEY", KEY + "\n")
    with pytest.raises(InvalidInput, match="RAGDB_EMBED_API_KEY.*printable ASCII") as info:
        resolve_api_key(None, "RAGDB_EMBED_API_KEY", local)
    _no_secret(str(info.value))
    with pytest.raises(InvalidInput, match="api_key"):
        HTTPReranker(base_url=local, api_key=KEY + " x")


@pytest.mark.parametrize("kind", ["embeddings", "rerank", "chat"])
def test_openai_key_is_not_sent_to_a_configured_server(kind, origin, monkeypatch):
    for name in ("RAGDB_EMBED_API_KEY", "RAGDB_RERANK_API_KEY", "RAGDB_LLM_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    path, make, call, _ = KINDS[kind]
    _ok(kind, origin)
    call(make(origin.url_for("").rstrip("/"), api_key=None))
    assert "Authorization" not in origin.log[0][0].headers


# ------------------------------------------------------------------ the endpoint itself


def test_endpoint_validation_and_repr():
    for kwargs, name in (
        ({"timeout": 0}, "timeout"), ({"timeout": float("inf")}, "timeout"),
        ({"max_retries": -1}, "max_retries"), ({"max_retries": True}, "max_retries"),
        ({"backoff": -1}, "backoff"), ({"max_backoff": float("nan")}, "max_backoff"),
        ({"error": ValueError}, "error"), ({"url": "file:///etc/passwd"}, "url"),
    ):
        args = {"url": "http://127.0.0.1:9/x", "error": RerankError, "what": "test request", **kwargs}
        with pytest.raises(InvalidInput, match=name):
            Endpoint(**args)
    ep = Endpoint(f"http://u:{PASSWORD}@127.0.0.1:9/x", error=RerankError, what="test request", api_key=KEY)
    _no_secret(repr(ep))
    assert ep.shown == "http://127.0.0.1:9/x"
    with pytest.raises(InvalidInput, match="not JSON-serialisable"):
        ep.post_json({"x": object()})


def test_endpoint_invalid_json_and_sse_events(origin):
    origin.expect_oneshot_request("/bad").respond_with_data(f"<html>{KEY}</html>")
    ep = Endpoint(origin.url_for("/bad"), error=EmbeddingError, what="test request", api_key=KEY)
    with pytest.raises(EmbeddingError, match="not valid JSON: '?<html>\\*\\*\\*</html>"):
        ep.post_json({})
    stream = (": comment\n\nevent: message\ndata: one\n\ndata: two\ndata:  lines\n\nid: 7\nretry: 10\n\n"
              "data: last, no blank line")
    origin.expect_oneshot_request("/sse").respond_with_data(stream, content_type="text/event-stream")
    ep = Endpoint(origin.url_for("/sse"), error=LLMError, what="test stream")
    assert list(ep.stream_events({})) == ["one", "two\n lines", "last, no blank line"]
    assert origin.log[-1][0].headers["Accept"] == "text/event-stream"
