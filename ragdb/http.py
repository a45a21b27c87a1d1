"""The one HTTP layer of ragdb: JSON POSTs and Server-Sent-Event streams over httpx.

Chat (:mod:`ragdb.llm`), embeddings (:mod:`ragdb.embeddings`) and rerank
(:mod:`ragdb.rerank`) all talk to their servers through an :class:`Endpoint`;
nothing else in ragdb does HTTP. The policy, the same for every endpoint:

* **Retries.** HTTP 408, 429 and 5xx answers, failed or timed-out connects, and
  connections that break before an answer are retried, at most ``max_retries``
  times (``max_retries + 1`` attempts in all). A read timeout (the server took
  the request but did not answer within ``timeout``) is retried only where the
  endpoint says so (``retry_read_timeout``; the chat client does not, as the
  model may still be generating). TLS certificate failures and other 4xx
  answers are not retried. Before retry ``n`` (0-based) ragdb waits the server's
  ``Retry-After`` (delta-seconds or an HTTP-date) if it sent one, else
  ``backoff * 2**n`` seconds plus up to 25 % jitter; either is capped at
  ``max_backoff``. A stream is retried only until the answer's status arrives;
  once text has been yielded, a failure raises.
* **Redirects are never followed.** A 3xx answer raises the endpoint's error
  naming the status and the (scrubbed) ``Location``: following it would send the
  ``Authorization`` header, or the body, to another server.
* **API keys** (:func:`resolve_api_key`): a key given explicitly or set in the
  client's ragdb variable (``RAGDB_LLM_API_KEY``, ``RAGDB_EMBED_API_KEY``,
  ``RAGDB_RERANK_API_KEY``), even to an empty string, goes to the configured
  server; otherwise ``OPENAI_API_KEY`` is used only for OpenAI's own API
  (``https://api.openai.com``) or for a base URL that came from
  ``OPENAI_BASE_URL``; otherwise no key (and no ``Authorization`` header).
  A URL's ``user:password@`` is never part of the URL sent or shown; it is sent
  as HTTP Basic authentication when no API key is set.
* **Redaction** (:func:`redact`): every error message and log line is passed
  through one function that removes the API key in use (and words sharing 8
  characters with it), ``Bearer``/``Basic`` credentials, ``sk-...`` style keys
  and URL userinfo. Errors are raised ``from None``, so no chained exception
  carries the request or its headers.

Failures raise the error class the endpoint was built with
(:class:`~ragdb.errors.LLMError`, :class:`~ragdb.errors.EmbeddingError`,
:class:`~ragdb.errors.RerankError`, all :class:`~ragdb.errors.RemoteError`),
with a message naming what was requested, the URL and the problem. Bad
arguments raise :class:`~ragdb.errors.InvalidInput`. The module never prints;
retries are logged at DEBUG level on the ``ragdb.http`` logger.
"""

from __future__ import annotations

import email.utils
import json
import logging
import math
import os
import random
import re
import ssl
import time
import urllib.parse
from collections.abc import Callable, Generator
from typing import Any, TypeVar

import httpx

from ragdb.errors import InvalidInput, RemoteError

__all__ = [
    "Endpoint",
    "RETRY_STATUSES",
    "OPENAI_HOST",
    "check_base_url",
    "display_url",
    "openai_key_for",
    "parse_retry_after",
    "redact",
    "resolve_api_key",
]

log = logging.getLogger("ragdb.http")
_T = TypeVar("_T")

#: Statuses answered by a retry (besides connection failures): 408, 429, 5xx.
RETRY_STATUSES = frozenset({408, 429, *range(500, 600)})
#: The host whose API may receive ``OPENAI_API_KEY`` without being named with it.
OPENAI_HOST = "api.openai.com"

_MAX_ERROR_BODY = 64 * 1024  # bytes of an error body read
_MAX_QUOTE = 300  # characters of server text quoted in an error message
_MIN_SECRET = 4  # shorter secrets are not searched for (they would mangle messages)

_KEYISH_RE = re.compile(r"[A-Za-z0-9_\-.+/=:~]{8,}")
_AUTH_RE = re.compile(r"(?i)\b(bearer|basic)(\s+|%20)[A-Za-z0-9_\-.+/=~]+")
_SK_RE = re.compile(r"\bsk-[A-Za-z0-9_\-]{8,}")
_USERINFO_RE = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://)[^\s/?#@]*@")
_KEY_CHARS_RE = re.compile(r"[\x21-\x7e]*")


# --------------------------------------------------------------------------- redaction and URLs


def redact(text: str, *secrets: str | None) -> str:
    """``text`` with credentials removed: each of ``secrets`` (the key in use, a URL
    password; with 8+ characters, also any word sharing 8 characters with it),
    ``Bearer``/``Basic`` credentials, ``sk-...`` keys and URL ``user:password@`` parts."""
    for secret in secrets:
        if not secret or len(secret) < _MIN_SECRET:
            continue
        text = text.replace(secret, "***")
        if len(secret) >= 8:
            text = _KEYISH_RE.sub(_mask_sharing(secret), text)
    text = _AUTH_RE.sub(lambda m: f"{m.group(1)}{m.group(2)}***", text)
    text = _SK_RE.sub("sk-***", text)
    return _USERINFO_RE.sub(r"\1", text)


def _mask_sharing(secret: str) -> Callable[[re.Match[str]], str]:
    """A substitution masking words that share 8 characters with ``secret``."""
    grams = {secret[i : i + 8] for i in range(len(secret) - 7)}

    def mask(m: re.Match[str]) -> str:
        word = m.group(0)
        return "***" if any(g in word for g in grams) else word

    return mask


def display_url(url: str) -> str:
    """``url`` as shown in messages: no ``user:password@``, no query, no fragment."""
    try:
        parts = urllib.parse.urlsplit(str(url))
    except ValueError:
        return "<invalid url>"
    netloc = parts.netloc.rpartition("@")[2]
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def check_base_url(base_url: object, *, name: str = "base_url") -> str:
    """``base_url`` stripped of spaces and trailing slashes; :class:`InvalidInput`
    unless it is an ``http://`` or ``https://`` URL with a host."""
    if not isinstance(base_url, str):
        raise InvalidInput(f"{name} must be a string, got {type(base_url).__name__}")
    base_url = base_url.strip().rstrip("/")
    try:
        parts = urllib.parse.urlsplit(base_url)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        raise InvalidInput(f"{name} is not a valid URL: {display_url(base_url)!r}") from None
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        raise InvalidInput(f"{name} must be an http(s) URL, got {display_url(base_url)!r}")
    return base_url


def openai_key_for(base_url: str) -> str:
    """``OPENAI_API_KEY`` when ``base_url`` is OpenAI's own API (https://api.openai.com),
    else "": an OpenAI key is never sent to another server unless it is passed or set
    in a ragdb variable explicitly."""
    parts = urllib.parse.urlsplit(str(base_url).strip())
    if parts.scheme.lower() == "https" and (parts.hostname or "").lower() == OPENAI_HOST:
        return os.environ.get("OPENAI_API_KEY", "")
    return ""


def resolve_api_key(
    explicit: str | None, env_var: str, base_url: str, *, openai_paired: bool = False
) -> str:
    """The API key for a client of ``base_url`` ("" for none); the one rule of ragdb.

    ``explicit`` (not None, even "") wins; then the ragdb variable ``env_var`` if it
    is set (even to ""); then ``OPENAI_API_KEY`` if ``openai_paired`` (the base URL
    came from ``OPENAI_BASE_URL``) or ``base_url`` is OpenAI's own API; else "".
    The key must be printable ASCII without spaces (:class:`InvalidInput` otherwise,
    naming where it came from but never showing it).
    """
    source = "api_key"
    if explicit is not None:
        key: Any = explicit
    elif env_var in os.environ:
        key, source = os.environ[env_var], f"api_key (from {env_var})"
    elif openai_paired:
        key, source = os.environ.get("OPENAI_API_KEY", ""), "api_key (from OPENAI_API_KEY)"
    else:
        key = openai_key_for(base_url)
        source = "api_key (from OPENAI_API_KEY)" if key else source
    if not isinstance(key, str):
        raise InvalidInput(f"{source} must be a string, got {type(key).__name__}")
    # Checked here because an HTTP library would quote an invalid header value
    # (the key) in its own error message.
    if not _KEY_CHARS_RE.fullmatch(key):
        raise InvalidInput(f"{source} must be printable ASCII with no spaces")
    return key


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` value: delta-seconds (a float is
    accepted) or an HTTP-date (seconds from ``now``, at least 0); None if absent
    or unreadable."""
    if value is None:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:  # RFC 9110 dates are GMT
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
        return max(0.0, seconds)
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def _number(name: str, value: Any, *, strict: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidInput(f"{name} must be a finite number of seconds, got {value!r}")
    if value < 0 or (strict and value == 0):
        raise InvalidInput(f"{name} must be {'> 0' if strict else '>= 0'} seconds, got {value!r}")
    return float(value)


def _ssl_failure(exc: BaseException) -> bool:
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, ssl.SSLCertVerificationError):
            return True
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return False


class _Give(Exception):
    """An attempt failed: ``problem`` says how; ``retry`` whether to try again."""

    def __init__(self, problem: str, retry: bool, wait: float | None = None) -> None:
        super().__init__(problem)
        self.problem, self.retry, self.wait = problem, retry, wait


# --------------------------------------------------------------------------- endpoint


class Endpoint:
    """One remote URL with its key, timeout, retry policy and error class.

    ``url`` is the full URL POSTed to (``user:password@`` is taken out of it and
    sent as Basic authentication when ``api_key`` is empty). ``what`` names the
    request in messages (``"LLM request"``, ``"embedding request (model 'x')"``).
    ``error`` is the :class:`~ragdb.errors.RemoteError` subclass raised.
    See the module docstring for the policy.
    """

    def __init__(
        self,
        url: str,
        *,
        error: type[RemoteError],
        what: str,
        api_key: str = "",
        timeout: float = 60.0,
        max_retries: int = 2,
        backoff: float = 0.5,
        max_backoff: float = 30.0,
        retry_read_timeout: bool = True,
    ) -> None:
        if not (isinstance(error, type) and issubclass(error, RemoteError)):
            raise InvalidInput(f"error must be a RemoteError subclass, got {error!r}")
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise InvalidInput(f"max_retries must be an integer >= 0, got {max_retries!r}")
        self.timeout = _number("timeout", timeout, strict=True)
        self.backoff = _number("backoff", backoff, strict=False)
        self.max_backoff = _number("max_backoff", max_backoff, strict=False)
        self.max_retries = max_retries
        self.retry_read_timeout = bool(retry_read_timeout)
        self.error_class = error
        self.what = what
        check_base_url(url, name="url")
        parts = urllib.parse.urlsplit(url.strip())
        host = parts.netloc.rpartition("@")[2]
        self._url = urllib.parse.urlunsplit((parts.scheme, host, parts.path, parts.query, ""))
        self.shown = display_url(url)
        self._api_key = api_key
        password = urllib.parse.unquote(parts.password) if parts.password else None
        self._secrets = tuple(s for s in (api_key, password) if s)
        self._auth: httpx.BasicAuth | None = None
        if not api_key and (parts.username or parts.password):
            self._auth = httpx.BasicAuth(
                urllib.parse.unquote(parts.username or ""), password or ""
            )

    def __repr__(self) -> str:
        return (
            f"Endpoint({self.shown!r}, what={self.what!r}, error={self.error_class.__name__}, "
            f"api_key={'***' if self._api_key else ''!r}, timeout={self.timeout:g}, "
            f"max_retries={self.max_retries})"
        )

    # ------------------------------------------------------------------ messages

    def redact(self, text: str) -> str:
        """:func:`redact` with this endpoint's key and URL password."""
        return redact(text, *self._secrets)

    def quote(self, raw: bytes | str) -> str:
        """Server text for a message: one line, at most 300 characters, redacted."""
        text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
        text = " ".join(text.split())
        if len(text) > _MAX_QUOTE:
            text = text[:_MAX_QUOTE] + "..."
        return self.redact(text)

    def error(self, problem: str) -> RemoteError:
        """The error to raise: ``"<what> to <url>: <problem>"``, redacted."""
        return self.error_class(self.redact(f"{self.what} to {self.shown}: {problem}"))

    # ------------------------------------------------------------------ requests

    def session(self) -> httpx.Client:
        """An httpx client for several requests over kept-alive connections; use
        it as a context manager and pass it to :meth:`post_json`."""
        return httpx.Client(
            timeout=httpx.Timeout(self.timeout), follow_redirects=False, auth=self._auth
        )

    def post_json(self, payload: Any, *, client: httpx.Client | None = None) -> Any:
        """POST ``payload`` (JSON-able, or already encoded ``bytes``) and return the
        decoded JSON reply, retrying as the policy says. ``client``: one from
        :meth:`session`, to reuse its connections; by default a new one is used."""
        body = self._encode(payload)
        if client is None:
            with self.session() as http:
                raw = self._send(http, body)
        else:
            raw = self._send(client, body)
        try:
            return json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            raise self.error(
                f"the reply is not valid JSON: {self.quote(raw) or '(empty body)'}"
            ) from None

    def stream_events(self, payload: Any) -> Generator[str, None, None]:
        """POST ``payload`` asking for ``text/event-stream`` and yield the ``data`` of
        each Server-Sent Event (several ``data:`` lines of one event joined by
        newlines) as it arrives. Retried as the policy says until the answer
        starts; a stream that breaks or stalls for ``timeout`` midway raises."""
        body = self._encode(payload)
        with self.session() as http:
            response = self._send_stream(http, body)
            try:
                data: list[str] = []
                for line in response.iter_lines():
                    if not line:
                        if data:
                            yield "\n".join(data)
                            data = []
                        continue
                    field, _, value = line.partition(":")
                    if field == "data":
                        data.append(value[1:] if value.startswith(" ") else value)
                    # ": comment", "event:", "id:", "retry:" lines carry no data
                if data:  # a last event without its blank line
                    yield "\n".join(data)
            except httpx.TimeoutException:
                raise self.error(f"the stream stalled: timed out after {self.timeout:g}s waiting for more") from None
            except httpx.HTTPError as exc:
                raise self.error(f"the stream broke: {self._describe(exc)}") from None
            finally:
                response.close()

    # ------------------------------------------------------------------ internals

    def _encode(self, payload: Any) -> bytes:
        if isinstance(payload, bytes):
            return payload
        try:
            return json.dumps(payload, ensure_ascii=False).encode("utf-8")
        except (TypeError, ValueError) as exc:
            raise InvalidInput(f"{self.what}: the request is not JSON-serialisable: {exc}") from None

    def _headers(self, stream: bool) -> dict[str, str]:
        headers = {
            "Content-Type": "application/json",
            "Accept": "text/event-stream" if stream else "application/json",
            "User-Agent": "ragdb",
        }
        if self._api_key:
            headers["Authorization"] = "Bearer " + self._api_key
        return headers

    def _describe(self, exc: BaseException) -> str:
        text = str(exc)
        return f"{type(exc).__name__}: {text}" if text else type(exc).__name__

    def _send(self, http: httpx.Client, body: bytes) -> bytes:
        """The body of a 2xx answer, after retries; else raise."""

        def attempt() -> bytes:
            response = self._attempt(http, body, False)
            try:
                return response.read()
            except httpx.ReadTimeout:
                raise _Give(f"timed out after {self.timeout:g}s waiting for the answer", self.retry_read_timeout) from None
            except httpx.HTTPError as exc:
                raise _Give(f"the connection broke: {self._describe(exc)}", True) from None
            finally:
                response.close()

        return self._retrying(attempt)

    def _send_stream(self, http: httpx.Client, body: bytes) -> httpx.Response:
        """A 2xx answer whose body is not read yet, after retries; else raise."""
        return self._retrying(lambda: self._attempt(http, body, True))

    def _retrying(self, attempt: Callable[[], _T]) -> _T:
        """``attempt()`` until it succeeds or the policy gives up."""
        n = 0
        while True:
            try:
                return attempt()
            except _Give as give:
                if not give.retry or n >= self.max_retries:
                    tries = f" after {n + 1} attempts" if n else ""
                    raise self.error_class(
                        self.redact(f"{self.what} to {self.shown} failed{tries}: {give.problem}")
                    ) from None
                if give.wait is not None:
                    delay = give.wait
                else:
                    delay = self.backoff * (2**n) * (1.0 + 0.25 * random.random())
                delay = min(delay, self.max_backoff)
                log.debug(
                    "%s to %s failed (%s); retry %d/%d in %.2fs",
                    self.what, self.shown, self.redact(give.problem), n + 1, self.max_retries, delay,
                )
                time.sleep(delay)
                n += 1

    def _attempt(self, http: httpx.Client, body: bytes, stream: bool) -> httpx.Response:
        try:
            request = http.build_request("POST", self._url, content=body, headers=self._headers(stream))
            response = http.send(request, stream=True, follow_redirects=False)
        except (httpx.ConnectTimeout, httpx.PoolTimeout):
            raise _Give(f"timed out after {self.timeout:g}s connecting", True) from None
        except httpx.ReadTimeout:
            raise _Give(f"timed out after {self.timeout:g}s waiting for the answer", self.retry_read_timeout) from None
        except httpx.WriteTimeout:
            raise _Give(f"timed out after {self.timeout:g}s sending the request", True) from None
        except (httpx.ConnectError, httpx.ProxyError) as exc:
            problem = f"connection failed: {self._describe(exc)}"
            raise _Give(problem, not _ssl_failure(exc)) from None
        except (httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError) as exc:
            raise _Give(f"connection failed: {self._describe(exc)}", True) from None
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            raise _Give(f"request failed: {self._describe(exc)}", False) from None
        status = response.status_code
        if 200 <= status < 300:
            return response
        try:
            detail = "" if 300 <= status < 400 else self._error_detail(response)
        finally:
            response.close()
        if 300 <= status < 400:
            location = response.headers.get("Location")
            target = f" to {display_url(location)!r}" if location else ""
            raise _Give(
                f"HTTP {status} redirect{target} refused: ragdb never follows redirects, "
                "so credentials never go to another server",
                False,
            )
        if status in RETRY_STATUSES:
            wait = parse_retry_after(response.headers.get("Retry-After"))
            raise _Give(f"HTTP {status}{detail}", True, wait)
        raise _Give(f"HTTP {status}{detail}", False)

    def _error_detail(self, response: httpx.Response) -> str:
        """``": <message>"`` from an error body (JSON ``error.message`` / ``detail`` or the text)."""
        raw = bytearray()
        try:
            for piece in response.iter_bytes():
                raw += piece
                if len(raw) >= _MAX_ERROR_BODY:
                    break
        except (httpx.HTTPError, httpx.StreamError):
            pass
        text = bytes(raw[:_MAX_ERROR_BODY]).decode("utf-8", "replace").strip()
        try:
            data = json.loads(text)
        except ValueError:
            data = None
        if isinstance(data, dict):
            err = data.get("error", data)
            if isinstance(err, dict):
                err = err.get("message") or err.get("detail") or err
            elif isinstance(data.get("detail"), str):
                err = data["detail"]
            text = err if isinstance(err, str) else json.dumps(err, ensure_ascii=False)
        return f": {self.quote(text)}" if text else ""
