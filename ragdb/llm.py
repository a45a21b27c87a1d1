"""Grounded answers from a language model: an OpenAI-compatible client and :func:`ask`.

:class:`ChatClient` speaks the chat-completions protocol that OpenAI, vLLM,
the llama.cpp server and Ollama (``/v1``) all serve. Any object with a
``complete(messages) -> str`` method (the :class:`LLM` protocol) can be given
to :func:`ask` instead.

The API key never appears in an exception message, a ``repr`` or a log
record: it is redacted from any server text quoted in an error, and errors are
raised ``from None`` so no chained exception carries the request.
"""

from __future__ import annotations

# Only the standard library (urllib.request + http.client): one JSON POST, or
# one Server-Sent-Events stream, does not justify an HTTP client dependency,
# and the core install stays small and works offline with local servers.
import http.client
import json
import logging
import math
import os
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable
from collections.abc import Iterable, Iterator

from ragdb.errors import InvalidInput, LLMError
from ragdb.prompt import (
    REFUSAL,
    CitationCheck,
    Prompt,
    PromptTemplate,
    build_prompt,
    check_citations,
)
from ragdb.types import Hit

__all__ = ["LLM", "StreamingLLM", "ChatClient", "Answer", "ask"]

log = logging.getLogger("ragdb.llm")

DEFAULT_BASE_URL = "https://api.openai.com/v1"
DEFAULT_MODEL = "gpt-4o-mini"
_MAX_ERROR_BODY = 64 * 1024  # bytes of an error body read
_MAX_QUOTE = 300  # characters of server text quoted in an error message


@runtime_checkable
class LLM(Protocol):
    """Anything that answers chat messages: ``complete(messages) -> str``.

    ``messages`` is a list of ``{"role": "system" | "user" | ..., "content": str}``.
    """

    def complete(self, messages: list[dict[str, Any]]) -> str: ...


@runtime_checkable
class StreamingLLM(LLM, Protocol):
    """An :class:`LLM` that can also stream its answer as text pieces."""

    def stream(self, messages: list[dict[str, Any]]) -> Iterator[str]: ...


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Refuse redirects: urllib would re-send the Authorization header to the new host."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # type: ignore[override]
        return None


def _number(name: str, value: Any, *, minimum: float, strict: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidInput(f"{name} must be a finite number, got {value!r}")
    if value < minimum or (strict and value == minimum):
        op = ">" if strict else ">="
        raise InvalidInput(f"{name} must be {op} {minimum}, got {value!r}")
    return float(value)


def _display_url(url: str) -> str:
    """The URL without any user:password part."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "<invalid url>"
    netloc = parts.netloc.rpartition("@")[2]
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def _retry_after(headers: Any) -> float | None:
    value = headers.get("Retry-After") if headers is not None else None
    if value is None:
        return None
    try:
        seconds = float(str(value).strip())
    except ValueError:
        return None  # an HTTP date: fall back to exponential backoff
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def _check_messages(messages: Any) -> list[dict[str, Any]]:
    if not isinstance(messages, list) or not messages:
        raise InvalidInput("messages must be a non-empty list of {'role': ..., 'content': ...} dicts")
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or "content" not in m:
            raise InvalidInput("each message must be a dict with a 'role' string and a 'content'")
    return messages


class _ReadTimeout(Exception):
    """The server accepted the request but did not answer in time (not retried)."""


_KEYISH_RE = re.compile(r"[A-Za-z0-9_\-.+/=:]{8,}")


OPENAI_HOST = "api.openai.com"


def openai_key_for(base_url: str) -> str:
    """``OPENAI_API_KEY`` when ``base_url`` is OpenAI's own API (https://api.openai.com),
    else "": an OpenAI key is never sent to another server unless it is passed or
    set in a ragdb variable (RAGDB_LLM_API_KEY, RAGDB_EMBED_API_KEY) explicitly."""
    parts = urllib.parse.urlsplit(str(base_url).strip())
    if parts.scheme.lower() == "https" and (parts.hostname or "").lower() == OPENAI_HOST:
        return os.environ.get("OPENAI_API_KEY", "")
    return ""


class ChatClient:
    """Client of an OpenAI-compatible ``/chat/completions`` endpoint.

    Defaults come from the environment: ``RAGDB_LLM_BASE_URL`` (else
    ``OPENAI_BASE_URL``, else ``https://api.openai.com/v1``),
    ``RAGDB_LLM_MODEL`` (else ``gpt-4o-mini``) and ``RAGDB_LLM_API_KEY`` (if
    set, even to an empty string, it wins, so local servers can run with no
    key). ``OPENAI_API_KEY`` is used only when the base URL is OpenAI's own API
    or came from ``OPENAI_BASE_URL`` (the pairing the OpenAI SDK uses): an
    OpenAI key set for other tools never goes to a server named in
    ``RAGDB_LLM_BASE_URL`` or ``base_url``. With an empty key no
    Authorization header is sent. Examples of ``base_url``:
    ``http://localhost:8000/v1`` (vLLM), ``http://localhost:8080/v1``
    (llama.cpp), ``http://localhost:11434/v1`` (Ollama).

    ``timeout`` (seconds) applies to connecting and to each read. Requests are
    retried ``max_retries`` times on HTTP 429, 5xx and connection failures
    (including connect timeouts), waiting ``backoff * 2**attempt`` seconds or
    the server's numeric ``Retry-After``, either capped at ``max_backoff``.
    Other 4xx are not retried, nor is a server that accepted the request but
    did not answer within ``timeout`` (it may still be generating; retrying
    would multiply the wait). Redirects are not followed. ``temperature``
    None leaves it to the server.
    """

    def __init__(
        self,
        base_url: str | None = None,
        model: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = 60.0,
        max_retries: int = 2,
        backoff: float = 0.5,
        temperature: float | None = 0.0,
        max_backoff: float = 30.0,
    ) -> None:
        env = os.environ
        openai_paired = False  # base URL from OPENAI_BASE_URL: OPENAI_API_KEY goes with it
        if base_url is None:
            base_url = env.get("RAGDB_LLM_BASE_URL")
            if not base_url and env.get("OPENAI_BASE_URL"):
                base_url, openai_paired = env["OPENAI_BASE_URL"], True
            base_url = base_url or DEFAULT_BASE_URL
        if model is None:
            model = env.get("RAGDB_LLM_MODEL") or DEFAULT_MODEL
        if api_key is None:
            if "RAGDB_LLM_API_KEY" in env:
                api_key = env["RAGDB_LLM_API_KEY"]
            elif openai_paired:
                api_key = env.get("OPENAI_API_KEY", "")
            else:
                api_key = openai_key_for(str(base_url))
        if not isinstance(api_key, str):
            raise InvalidInput("api_key must be a string")
        # Checked here because http.client would quote an invalid header value
        # (the key) in its own error message.
        if not re.fullmatch(r"[\x21-\x7e]*", api_key):
            raise InvalidInput("api_key must be printable ASCII with no spaces")
        if not isinstance(base_url, str):
            raise InvalidInput("base_url must be a string")
        parts = urllib.parse.urlsplit(base_url.strip())
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise InvalidInput(f"base_url must be an http(s) URL, got {_display_url(base_url)!r}")
        if not isinstance(model, str) or not model.strip():
            raise InvalidInput("model must be a non-empty string")
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise InvalidInput(f"max_retries must be an integer >= 0, got {max_retries!r}")

        self.base_url = base_url.strip().rstrip("/")
        self.model = model
        self.timeout = _number("timeout", timeout, minimum=0.0, strict=True)
        self.max_retries = max_retries
        self.backoff = _number("backoff", backoff, minimum=0.0)
        self.max_backoff = _number("max_backoff", max_backoff, minimum=0.0)
        self.temperature = (
            None if temperature is None else _number("temperature", temperature, minimum=0.0)
        )
        self._api_key = api_key
        self._endpoint = self.base_url + "/chat/completions"
        self._where = _display_url(self._endpoint)
        self._opener = urllib.request.build_opener(_NoRedirect)

    def __repr__(self) -> str:
        return (
            f"ChatClient(base_url={_display_url(self.base_url)!r}, model={self.model!r}, "
            f"api_key={'***' if self._api_key else ''!r}, timeout={self.timeout}, "
            f"max_retries={self.max_retries}, backoff={self.backoff}, "
            f"temperature={self.temperature})"
        )

    # ------------------------------------------------------------------ public

    def complete(self, messages: list[dict[str, Any]]) -> str:
        """Send ``messages`` and return the reply's text (``choices[0].message.content``)."""
        body = self._payload(messages, stream=False)

        def action(request: urllib.request.Request) -> bytes:
            response = self._opener.open(request, timeout=self.timeout)
            try:
                return response.read()
            except TimeoutError:
                raise _ReadTimeout() from None
            finally:
                response.close()

        raw = self._send(body, action, stream=False)
        return self._parse_reply(raw)

    def stream(self, messages: list[dict[str, Any]]) -> Iterator[str]:
        """Send ``messages`` with ``stream: true`` and yield the reply's text pieces.

        The messages are checked now; the request is made when iteration
        starts. Reads Server-Sent Events ``data: {...}`` lines and yields each
        ``choices[0].delta.content`` until ``data: [DONE]``. Failures before
        the first event are retried like :meth:`complete`; a stream that breaks
        midway raises :class:`LLMError`.
        """
        body = self._payload(messages, stream=True)
        return self._events(body)

    # ------------------------------------------------------------------ internals

    def _redact(self, text: str) -> str:
        key = self._api_key
        if not key:
            return text
        text = text.replace(key, "***")
        if len(key) >= 8:  # also mask words sharing 8+ characters with the key
            grams = {key[i : i + 8] for i in range(len(key) - 7)}
            text = _KEYISH_RE.sub(
                lambda m: "***" if any(g in m.group(0) for g in grams) else m.group(0), text
            )
        return text

    def _error(self, message: str) -> LLMError:
        return LLMError(self._redact(message))

    def _quote(self, raw: bytes | str) -> str:
        text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
        text = " ".join(text.split())
        if len(text) > _MAX_QUOTE:
            text = text[:_MAX_QUOTE] + "..."
        return self._redact(text)

    def _payload(self, messages: Any, *, stream: bool) -> bytes:
        payload: dict[str, Any] = {
            "model": self.model,
            "messages": _check_messages(messages),
            "stream": stream,
        }
        if self.temperature is not None:
            payload["temperature"] = self.temperature
        try:
            return json.dumps(payload, ensure_ascii=False).encode("utf-8")
        except (TypeError, ValueError) as exc:
            raise InvalidInput(f"messages are not JSON-serialisable: {exc}") from None

    def _request(self, body: bytes, *, stream: bool) -> urllib.request.Request:
        headers = {
            "Content-Type": "application/json",
            "Accept": "text/event-stream" if stream else "application/json",
            "User-Agent": "ragdb",
        }
        if self._api_key:
            headers["Authorization"] = "Bearer " + self._api_key
        return urllib.request.Request(self._endpoint, data=body, headers=headers, method="POST")

    def _http_error_detail(self, exc: urllib.error.HTTPError) -> str:
        try:
            raw = exc.read(_MAX_ERROR_BODY)
        except Exception:
            raw = b""
        finally:
            try:
                exc.close()
            except Exception:
                pass
        text = raw.decode("utf-8", "replace").strip()
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
        return f": {self._quote(text)}" if text else ""

    def _sleep(self, attempt: int, retry_after: float | None, problem: str) -> None:
        delay = retry_after if retry_after is not None else self.backoff * (2**attempt)
        delay = min(delay, self.max_backoff)
        log.debug(
            "LLM request to %s failed (%s); retry %d/%d in %.2fs",
            self._where, problem, attempt + 1, self.max_retries, delay,
        )
        time.sleep(delay)

    def _send(self, body: bytes, action: Any, *, stream: bool) -> Any:
        """Run ``action(request)`` with retries; turn every failure into LLMError."""
        attempt = 0
        while True:
            retry_after: float | None = None
            try:
                return action(self._request(body, stream=stream))
            except urllib.error.HTTPError as exc:
                status = exc.code
                retry_after = _retry_after(exc.headers)
                detail = self._http_error_detail(exc)
                if not (status == 429 or 500 <= status <= 599):
                    note = " (redirects are not followed)" if 300 <= status < 400 else ""
                    raise self._error(
                        f"LLM request to {self._where} returned HTTP {status}{note}{detail}"
                    ) from None
                problem = f"HTTP {status}{detail}"
            except _ReadTimeout:
                raise self._error(
                    f"LLM request to {self._where} timed out after {self.timeout:g}s"
                ) from None
            except urllib.error.URLError as exc:
                if isinstance(exc.reason, TimeoutError):
                    problem = f"timed out after {self.timeout:g}s"
                else:
                    problem = f"connection failed: {exc.reason}"
            except TimeoutError:  # raised by getresponse(): no answer within timeout
                raise self._error(
                    f"LLM request to {self._where} timed out after {self.timeout:g}s"
                ) from None
            except (http.client.HTTPException, OSError) as exc:
                problem = f"connection failed: {type(exc).__name__}: {exc}"
            if attempt >= self.max_retries:
                tries = f" after {attempt + 1} attempts" if attempt else ""
                raise self._error(f"LLM request to {self._where} failed{tries}: {problem}") from None
            self._sleep(attempt, retry_after, self._redact(problem))
            attempt += 1

    def _parse_reply(self, raw: bytes) -> str:
        try:
            data = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            raise self._error(
                f"LLM reply from {self._where} is not JSON: {self._quote(raw) or '(empty body)'}"
            ) from None
        if isinstance(data, dict) and data.get("error") and "choices" not in data:
            err = data["error"]
            if isinstance(err, dict):
                err = err.get("message", err)
            raise self._error(f"LLM reply from {self._where} is an error: {self._quote(str(err))}")
        choices = data.get("choices") if isinstance(data, dict) else None
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise self._error(
                f"LLM reply from {self._where} is malformed: missing choices "
                f"({self._quote(raw)})"
            )
        choice = choices[0]
        message = choice.get("message")
        content = message.get("content") if isinstance(message, dict) else None
        if content is None and isinstance(choice.get("text"), str):  # legacy completions shape
            content = choice["text"]
        if not isinstance(content, str):
            raise self._error(
                f"LLM reply from {self._where} is malformed: choices[0] has no message content"
            )
        return content

    def _events(self, body: bytes) -> Iterator[str]:
        response = self._send(
            body, lambda request: self._opener.open(request, timeout=self.timeout), stream=True
        )
        done = finished = False
        try:
            for raw_line in response:
                line = raw_line.decode("utf-8", "replace").strip()
                if not line.startswith("data:"):
                    continue  # blank separators, ": comments", "event:" / "id:" fields
                data = line[5:].strip()
                if data == "[DONE]":
                    done = True
                    break
                try:
                    event = json.loads(data)
                except ValueError:
                    raise self._error(
                        f"LLM stream from {self._where} sent a malformed event "
                        f"(not JSON): {self._quote(data)}"
                    ) from None
                if not isinstance(event, dict):
                    raise self._error(
                        f"LLM stream from {self._where} sent a malformed event: {self._quote(data)}"
                    )
                if event.get("error"):
                    err = event["error"]
                    if isinstance(err, dict):
                        err = err.get("message", err)
                    raise self._error(
                        f"LLM stream from {self._where} sent an error: {self._quote(str(err))}"
                    )
                choices = event.get("choices")
                if not isinstance(choices, list):
                    raise self._error(
                        f"LLM stream from {self._where} sent a malformed event: missing choices "
                        f"({self._quote(data)})"
                    )
                if not choices or not isinstance(choices[0], dict):
                    continue  # e.g. a final usage-only event
                choice = choices[0]
                if choice.get("finish_reason"):
                    finished = True
                delta = choice.get("delta")
                content = delta.get("content") if isinstance(delta, dict) else None
                if isinstance(content, str) and content:
                    yield content
        except TimeoutError:
            raise self._error(
                f"LLM stream from {self._where} timed out after {self.timeout:g}s"
            ) from None
        except (http.client.HTTPException, OSError) as exc:
            raise self._error(
                f"LLM stream from {self._where} broke: {type(exc).__name__}: {exc}"
            ) from None
        finally:
            response.close()
        if not (done or finished):
            raise self._error(f"LLM stream from {self._where} ended before data: [DONE]")


@dataclass(frozen=True)
class Answer:
    """A grounded answer.

    ``hits`` are the sources given to the model (``hits[i - 1]`` is source
    ``[i]``). ``refused`` is True when no evidence passed selection (the model
    was not called and ``text`` is the refusal sentence) or when the model
    replied with the refusal sentence.
    """

    text: str
    citations: CitationCheck
    hits: tuple[Hit, ...]
    prompt: Prompt
    refused: bool


def ask(
    search_hits: Iterable[Hit],
    query: str,
    llm: LLM,
    *,
    template: PromptTemplate | str | None = None,
    language: str | None = None,
    budget_tokens: int | None = None,
    min_score: float | None = None,
    relative: float | None = None,
) -> Answer:
    """Answer ``query`` from ``search_hits`` with ``llm``, or refuse without calling it.

    Builds the prompt with :func:`ragdb.prompt.build_prompt` (same keyword
    arguments). When no hit passes, returns the refusal sentence of the
    language and never calls the model. Otherwise calls
    ``llm.complete([system, user])`` and checks the answer's citations.
    """
    complete = getattr(llm, "complete", None)
    if not callable(complete):
        raise InvalidInput("llm must have a complete(messages) method")
    prompt = build_prompt(
        query,
        search_hits,
        template=template,
        language=language,
        budget_tokens=budget_tokens,
        min_score=min_score,
        relative=relative,
    )
    if prompt.refused:
        text = REFUSAL[prompt.language]
        return Answer(
            text=text, citations=check_citations(text, 0), hits=(), prompt=prompt, refused=True
        )
    text = complete(prompt.messages)
    if not isinstance(text, str):
        raise LLMError(f"llm.complete returned {type(text).__name__}, not a string")
    citations = check_citations(text, len(prompt.sources))
    return Answer(
        text=text,
        citations=citations,
        hits=prompt.sources,
        prompt=prompt,
        refused=citations.refusal,
    )
