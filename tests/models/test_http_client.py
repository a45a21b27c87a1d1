"""ragdb.models.http_client, the one HTTP layer of chat, embeddings and rerank, against real loopback servers.

Every server here listens on 127.0.0.1 only. The redirect tests answer 302 (and
the other 3xx) pointing at a second loopback server, the "trap", and check that
the trap never receives a request: following a redirect would hand it the
Authorization header.
"""

from __future__ import annotations

import base64
import email.utils
import gzip
import html
import json
import logging
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st
from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

from ragdb.models import http_client
from ragdb.models.embeddings import OpenAIEmbedder
from ragdb.errors import EmbeddingError, InvalidInput, LLMError, RemoteError, RerankError
from ragdb.models.http_client import (
    Endpoint,
    check_base_url,
    display_url,
    openai_key_for,
    parse_retry_after,
    redact,
    resolve_api_key,
    secret_part,
)
from ragdb.answers.llm import ChatClient
from ragdb.models.rerank import HTTPReranker
from ragdb.types import Hit

# No run of digits in the key: a port number in a message must not look like a piece of it.
KEY = "sk-test-TOPSECRET-Qz7xW3vK9mLp2Rb8"
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


@pytest.fixture
def waits(monkeypatch):
    """The waits between retries, recorded instead of slept."""
    out: list[float] = []
    monkeypatch.setattr(http_client, "sleep", out.append)
    return out


def test_429_with_retry_after_then_success(origin, waits):
    origin.expect_ordered_request("/v1/embeddings").respond_with_data(
        "slow down", status=429, headers={"Retry-After": "0"}
    )
    origin.expect_ordered_request("/v1/embeddings").respond_with_handler(embeddings_reply)
    # backoff=5 would wait 5 s: Retry-After: 0 is honoured instead
    e = _embedder(origin.url_for("").rstrip("/"), backoff=5.0)
    out = e.embed(["one", "two"])
    assert waits == [0]
    assert out.shape == (2, 3)
    assert [resp.status_code for _, resp in origin.log] == [429, 200]


def test_retry_after_http_date_is_honoured(origin, waits):
    past = email.utils.formatdate(time.time() - 60, usegmt=True)
    origin.expect_ordered_request("/v1/rerank").respond_with_data(
        "busy", status=503, headers={"Retry-After": past}
    )
    origin.expect_ordered_request("/v1/rerank").respond_with_json({"results": [
        {"index": 0, "relevance_score": 0.2}, {"index": 1, "relevance_score": 0.9}]})
    out = _reranker(origin.url_for("").rstrip("/"), backoff=5.0).rerank("q", hits("a", "b"))
    assert waits == [0]  # a date in the past: no wait, not the 5 s backoff
    assert [h.text for h in out] == ["b", "a"]
    assert len(origin.log) == 2


def test_retry_after_waits_and_is_capped(origin, waits):
    origin.expect_ordered_request("/v1/chat/completions").respond_with_data(
        "", status=429, headers={"Retry-After": "0.3"}
    )
    origin.expect_ordered_request("/v1/chat/completions").respond_with_data(
        "", status=429, headers={"Retry-After": "3600"}
    )
    origin.expect_ordered_request("/v1/chat/completions").respond_with_json(CHAT_REPLY)
    assert _chat(origin.url_for("").rstrip("/"), backoff=0.001, max_backoff=0.4).complete(MESSAGES) == "ok [1]"
    assert waits == [0.3, 0.4]  # waited 0.3 s, then 3600 s capped to 0.4 s
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
    caplog.set_level(logging.DEBUG)  # ragdb.models.http_client's retry lines, and httpx's own
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
    assert "TOPSECRET" not in redact(f"partial {KEY[4:24]}...", KEY)  # a piece of the key
    assert redact("Authorization: Bearer abc.def-123", None) == "Authorization: Bearer ***"
    assert redact("header basic dXNlcjpwYXNz", None) == "header basic ***"
    assert redact("leaked sk-proj-AbCdEf0123456789 and sk-short", None) == "leaked sk-*** and sk-short"
    assert redact(f"see https://bob:{PASSWORD}@host.example/x", None) == "see https://host.example/x"
    assert redact(f"password is {PASSWORD}", None, PASSWORD) == "password is ***"
    assert redact("nothing secret in here about a task-force", KEY) == "nothing secret in here about a task-force"
    assert redact("a b c, banana", "a") == "*** b c, banana"  # so short a secret: as a whole word only
    assert redact("key=sk-ab; sk-abc", "sk-ab") == "key=***; ***c"  # short: whole, and its last 4


# ------------------------------------------------------------------ no piece of the key, in any form


def _grams(key: str) -> set[str]:
    """The 4-character runs of ``key``'s secret part: a text holding none of them
    holds no substring of 4+ characters of it."""
    part = secret_part(key)
    return {part[i : i + 4] for i in range(len(part) - 3)}


def _leaks(text: str, key: str = KEY) -> list[str]:
    return sorted(g for g in _grams(key) if g in text)


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and every exception chained to it (``__cause__``, ``__context__``)."""
    seen: list[BaseException] = []
    todo: list[BaseException | None] = [exc]
    while todo:
        cur = todo.pop()
        if cur is not None and all(cur is not s for s in seen):
            seen.append(cur)
            todo += [cur.__cause__, cur.__context__]
    return seen


def _assert_clean(exc: BaseException, caplog: pytest.LogCaptureFixture, key: str = KEY, *, alone: bool = True) -> None:
    """No piece of ``key`` in ``exc``, the errors chained to it, or the log records;
    ``alone``: ``exc`` carries no chained error at all (ragdb.models.http_client raises it so)."""
    for e in _chain(exc):
        for text in (str(e), repr(e), repr(e.args)):
            assert not _leaks(text, key), (text, _leaks(text, key))
    assert exc.__cause__ is None
    assert exc.__context__ is None or not alone
    for record in caplog.records:
        assert not _leaks(record.getMessage(), key), record.getMessage()
    assert not _leaks(caplog.text, key)


def _json_escaped(s: str) -> str:
    """``s`` as a JSON string's inside, with ``/`` escaped too (PHP's json_encode)."""
    return json.dumps(s)[1:-1].replace("/", "\\/")


def _u_escaped(s: str) -> str:
    return "".join(f"\\u{ord(c):04x}" for c in s)


def _percent(s: str) -> str:
    return "".join(f"%{b:02X}" for b in s.encode())


OLD_CUT = 300  # where the server text used to be cut before it was redacted
SECRET = secret_part(KEY)  # "TOPSECRET-Qz7xW3vK9mLp2Rb8"
# The key's pieces a server may echo, in the forms it may echo them.
ECHOES = {
    "whole": KEY,
    "bearer": f"Bearer {KEY}",
    "first 10 after sk-": KEY[3:13],
    "last 6": KEY[-6:],
    "secret part": SECRET,
    "json-escaped": _json_escaped(KEY.replace("-", "/")),
    "u-escaped": _u_escaped(KEY[8:20]),
    "mixed escapes": KEY[8:12] + _u_escaped(KEY[12:14]) + "\\/" + KEY[14:18],
    "double-escaped": _u_escaped(KEY[9:16]).replace("\\", "\\\\"),
    "percent-encoded": urllib.parse.quote(f"Bearer {KEY}", safe=""),
    "all percent": _percent(KEY[10:22]),
    "html": html.escape(f'"{KEY[5:17]}"') + "".join(f"&#{ord(c)};" for c in KEY[-5:]),
}


def _at_the_cut(echo: str, inside: int) -> str:
    """A message with ``echo`` placed so that a cut at 300 characters would keep
    ``inside`` characters of it (and split it)."""
    return "denied: " + "x" * (OLD_CUT - len("denied: ") - inside) + echo + " (end)"


MESSAGES_ECHOING = {
    **{name: f"denied: you sent {echo}." for name, echo in ECHOES.items()},
    "all at once": "denied: " + " | ".join(ECHOES.values()),
    **{f"{name} at the cut ({n})": _at_the_cut(ECHOES[name], n)
       for name in ("whole", "secret part", "json-escaped", "percent-encoded") for n in (4, 7, 12)},
}
# How the server wraps the message: in OpenAI's error JSON, as plain text, or in a
# JSON error object without "message" (ragdb shows it re-encoded as JSON).
BODIES: dict[str, Callable[[str], tuple[str, str]]] = {
    "json": lambda m: (json.dumps({"error": {"message": m, "type": "invalid_request_error"}}), "application/json"),
    "text": lambda m: (m, "text/plain"),
    "json-object": lambda m: (json.dumps({"error": {"code": "denied", "echo": m}}), "application/json"),
}


@pytest.mark.parametrize("body", list(BODIES))
@pytest.mark.parametrize("message", list(MESSAGES_ECHOING))
@pytest.mark.parametrize("kind", list(KINDS))
def test_no_piece_of_the_key_in_any_error(kind, message, body, origin, caplog):
    """The server's error (HTTP 500, retried once, so a retry is logged) echoes the
    key whole, in pieces, escaped or encoded, or right where a cut used to split it."""
    path, make, call, error = KINDS[kind]
    data, content_type = BODIES[body](MESSAGES_ECHOING[message])
    origin.expect_request(path).respond_with_data(data, status=500, content_type=content_type)
    caplog.set_level(logging.DEBUG)
    with pytest.raises(error) as info:
        call(make(origin.url_for("").rstrip("/"), max_retries=1, backoff=0.001))
    assert "after 2 attempts: HTTP 500: " in str(info.value) and "denied" in str(info.value)
    assert len([r for r in caplog.records if r.name == "ragdb.models.http_client"]) == 1  # the retry line
    _assert_clean(info.value, caplog)
    assert origin.log[0][0].headers["Authorization"] == f"Bearer {KEY}"


@pytest.mark.parametrize("message", ["whole", "all at once", "json-escaped at the cut (7)", "percent-encoded"])
def test_no_piece_of_the_key_in_chat_replies_that_are_errors(message, origin, caplog):
    """A 200 answer that is an error (plain and streamed) echoing the key."""
    text = MESSAGES_ECHOING[message]
    path = KINDS["chat"][0]
    origin.expect_oneshot_request(path).respond_with_json({"error": {"message": text}})
    sse = f"data: {json.dumps({'error': {'message': text}})}\n\n"
    origin.expect_oneshot_request(path).respond_with_data(sse, content_type="text/event-stream")
    origin.expect_oneshot_request(path).respond_with_data(f"data: {text}\n\n", content_type="text/event-stream")
    caplog.set_level(logging.DEBUG)
    client = _chat(origin.url_for("").rstrip("/"))
    for call, shown in ((client.complete, "the reply is an error"), (client.stream, "the stream sent an error"),
                        (client.stream, "malformed event")):
        with pytest.raises(LLMError) as info:
            result = call(MESSAGES)
            if not isinstance(result, str):
                list(result)
        assert shown in str(info.value)
        _assert_clean(info.value, caplog, alone=False)  # ragdb.answers.llm raises "not JSON" in its except block


def test_no_piece_of_the_key_in_malformed_replies(origin, caplog):
    """200 answers whose bad fields echo the key (ragdb quotes them with repr)."""
    echo = f"{KEY[3:20]}\\/{_u_escaped(KEY[20:26])}"
    origin.expect_oneshot_request("/v1/embeddings").respond_with_json({"data": [{"index": echo, "embedding": [1.0]}]})
    origin.expect_oneshot_request("/v1/rerank").respond_with_json([{"index": KEY, "score": 1.0}, {"index": 0}])
    origin.expect_oneshot_request("/v1/embeddings").respond_with_data(f"not json: {KEY} " + "y" * 400)
    caplog.set_level(logging.DEBUG)
    base = origin.url_for("").rstrip("/")
    for call, error in ((KINDS["embeddings"][2], EmbeddingError), (KINDS["rerank"][2], RerankError),
                        (KINDS["embeddings"][2], EmbeddingError)):
        kind = "rerank" if error is RerankError else "embeddings"
        with pytest.raises(error) as info:
            call(KINDS[kind][1](base))
        _assert_clean(info.value, caplog)


def test_the_url_password_and_basic_credential_are_never_shown(origin, caplog, monkeypatch):
    monkeypatch.delenv("RAGDB_RERANK_API_KEY", raising=False)
    basic = base64.b64encode(f"user:{PASSWORD}".encode()).decode()
    text = (f"denied {PASSWORD[2:9]} {urllib.parse.quote(PASSWORD)} {_json_escaped(PASSWORD)} "
            f"{basic[4:12]} Basic {basic} http://user:{PASSWORD}@h/x http:\\/\\/user:pw@h")
    origin.expect_request("/rerank").respond_with_json({"error": {"message": text}}, status=401)
    caplog.set_level(logging.DEBUG)
    with pytest.raises(RerankError) as info:
        HTTPReranker(base_url=f"http://user:{PASSWORD}@127.0.0.1:{origin.port}").rerank("q", hits("a", "b"))
    assert "HTTP 401: denied" in str(info.value) and "user:pw" not in str(info.value)
    for secret in (PASSWORD, basic):
        _assert_clean(info.value, caplog, key=secret)


@pytest.mark.parametrize("offset", range(OLD_CUT - 30, OLD_CUT + 5))
def test_quote_redacts_before_it_cuts(offset):
    ep = Endpoint("http://127.0.0.1:9/x", error=RerankError, what="test", api_key=KEY)
    for echo in (KEY, SECRET, ECHOES["json-escaped"], ECHOES["u-escaped"], ECHOES["all percent"]):
        shown = ep.quote("z" * offset + echo + " tail " + "w" * 50)
        assert not _leaks(shown), shown
        assert len(shown) <= OLD_CUT + 3 and shown.startswith("z" * min(offset, 20))


# Keys of printable ASCII (as resolve_api_key allows), some with a conventional prefix.
_PRINTABLE = st.characters(min_codepoint=0x21, max_codepoint=0x7E)
_KEYS = st.builds(lambda prefix, body: prefix + body,
                  st.sampled_from(["", "", "sk-", "sk-proj-", "ghp_", "hf_"]),
                  st.text(_PRINTABLE, min_size=4, max_size=64))
# Per-character encodings: the encoded form of a piece is the encoded pieces joined,
# so a surviving 4-character piece of the key would show as its encoded form.
_ENCODINGS: dict[str, Callable[[str], str]] = {
    "as sent": lambda c: c,
    "json": _json_escaped,
    "\\u": _u_escaped,
    "double json": lambda c: _json_escaped(_json_escaped(c)),
    "percent": lambda c: urllib.parse.quote(c, safe=""),
    "all percent": _percent,
    "html": lambda c: html.escape(c),
    "html numeric": lambda c: f"&#{ord(c)};",
}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(key=_KEYS, before=st.text(max_size=40), after=st.text(max_size=40),
       encoding=st.sampled_from(list(_ENCODINGS)), data=st.data())
@example(key=KEY, before="you sent: Bearer ", after="", encoding="as sent", data=None)
def test_redact_leaves_no_piece_of_the_key(key, before, after, encoding, data):
    part = secret_part(key)
    if data is None:
        piece = key
    else:
        start = data.draw(st.integers(0, len(part) - 4), label="start")
        end = data.draw(st.integers(start + 4, len(part)), label="end")
        piece = data.draw(st.sampled_from([key, part, part[start:end]]), label="piece")
    encode = _ENCODINGS[encoding]
    out = redact(before + "".join(map(encode, piece)) + after, key)
    assert not _leaks(out, key), out
    for gram in _grams(key):
        assert "".join(map(encode, gram)) not in out, (gram, out)


@settings(max_examples=300, deadline=None)
@given(key=_KEYS, text=st.text(st.characters(blacklist_characters="\\%&"), max_size=80))
def test_redact_leaves_text_without_a_piece_of_the_key_alone(key, text):
    assume(not _leaks(text, key) and redact(text) == text)
    assert redact(text, key) == text


def test_redact_without_a_key_blanks_no_ordinary_words():
    text = ("HTTP 401: Incorrect API key provided; check https://platform.example/account/api-keys, "
            "a token-budget of 4096 tokens, model 'text-embedding-3-small', sk-short, "
            "Basic authentication required; Bearer token missing, 100% of \\n &amp; all")
    assert redact(text) == text
    assert redact(text, None, "") == text


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


def test_malformed_replies_carry_no_decoder_error_holding_the_raw_text(origin, caplog):
    """A decoder's exception keeps the raw reply (``JSONDecodeError.doc``, numpy's message):
    the clients raise their own error outside the handler, so none is chained to it."""
    origin.expect_request("/v1/chat/completions").respond_with_data(
        f"data: {{not json {KEY}\n\n", content_type="text/event-stream")
    with pytest.raises(LLMError, match="malformed event") as info:
        list(_chat(origin.url_for("").rstrip("/")).stream(MESSAGES))
    _assert_clean(info.value, caplog)
    origin.clear()
    for embedding in ([KEY, 1.0, 2.0], KEY + "!"):
        origin.expect_ordered_request("/v1/embeddings").respond_with_json(
            {"data": [{"index": 0, "embedding": embedding}]})
        with pytest.raises(EmbeddingError, match="embedding 0 is not") as info:
            _embedder(origin.url_for("").rstrip("/")).embed(["a text"])
        _assert_clean(info.value, caplog)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("status", [200, 400])
def test_json_nested_too_deeply_is_the_clients_error(kind, status, origin):
    """A reply nested deeper than Python's decoder can recurse (json raises RecursionError,
    not ValueError) is a reply that is not JSON, in a success or an error answer, and in a
    stream's event."""
    path, make, call, error = KINDS[kind]
    deep = "[" * 100_000
    if kind == "chat-stream" and status == 200:
        origin.expect_request(path).respond_with_data(f"data: {deep}\n\n", content_type="text/event-stream")
    else:
        origin.expect_request(path).respond_with_data(deep, status=status, content_type="application/json")
    with pytest.raises(error, match="not JSON|not valid JSON|HTTP 400"):
        call(make(origin.url_for("").rstrip("/"), max_retries=0))


@pytest.mark.parametrize("kind", ["embeddings", "rerank", "chat"])
def test_an_answer_trickled_out_times_out(kind, threaded):
    """A server that sends its answer's body a byte at a time, each within the timeout,
    does not hold the call for ever: the whole body gets one timeout."""
    path, make, call, error = KINDS[kind]

    def trickle(request: Request) -> Response:
        def body() -> Iterator[bytes]:
            for _ in range(60):  # 12 s, a byte every 0.2 s
                yield b" "
                time.sleep(0.2)
        return Response(body(), content_type="application/json")

    threaded.expect_request(path).respond_with_handler(trickle)
    with pytest.raises(error, match=r"timed out after 1s reading the answer"):
        call(make(threaded.url_for("").rstrip("/"), timeout=1, max_retries=0))


@pytest.mark.parametrize("kind", ["embeddings", "rerank", "chat"])
def test_an_answer_past_the_size_limit_is_refused(kind, origin, monkeypatch):
    """A compressed bomb (10 KB of gzip, 16 MiB of body) is read up to the limit, then
    refused, not retried: it was read whole into memory, however big."""
    monkeypatch.setattr(http_client, "MAX_REPLY_BYTES", 1 << 20)
    path, make, call, error = KINDS[kind]
    bomb = gzip.compress(b" " * (16 << 20))
    assert len(bomb) < 100_000
    origin.expect_request(path).respond_with_data(
        bomb, content_type="application/json", headers={"Content-Encoding": "gzip"})
    with pytest.raises(error, match=r"the answer is larger than 1,048,576 bytes") as info:
        call(make(origin.url_for("").rstrip("/"), max_retries=2, backoff=0))
    assert "attempts" not in str(info.value)
    assert len(origin.log) == 1


@pytest.mark.parametrize("body", [b"data: " + b"x" * (16 << 20), (b"data: x\n") * (2 << 20)])
def test_a_stream_past_the_size_limit_is_refused(origin, monkeypatch, body):
    """A stream is held to MAX_REPLY_BYTES too: httpx's iter_lines holds a line until its end, so
    one endless line (10 KB of gzip) was read whole into memory, and an event of endless data
    lines grew as long as the server sent them."""
    monkeypatch.setattr(http_client, "MAX_REPLY_BYTES", 1 << 20)
    origin.expect_oneshot_request("/sse").respond_with_data(
        gzip.compress(body), content_type="text/event-stream", headers={"Content-Encoding": "gzip"})
    ep = Endpoint(origin.url_for("/sse"), error=LLMError, what="test stream")
    with pytest.raises(LLMError, match=r"the stream is larger than 1,048,576 bytes"):
        list(ep.stream_events({}))
