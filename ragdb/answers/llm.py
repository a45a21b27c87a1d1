"""Grounded answers from a language model: an OpenAI-compatible client and :func:`ask`.

:class:`ChatClient` speaks the chat-completions protocol that OpenAI, vLLM,
the llama.cpp server and Ollama (``/v1``) all serve. Any object with a
``complete(messages) -> str`` method (the :class:`LLM` protocol) can be given
to :func:`ask` instead.

HTTP goes through :mod:`ragdb.models.http_client` (retries, no redirects, the API-key rule,
redaction): the API key never appears in an exception message, a ``repr`` or a
log record, and errors are raised ``from None`` so no chained exception carries
the request.
"""

from __future__ import annotations

import json
import os
import urllib.parse
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from ragdb.errors import InvalidInput, LLMError
from ragdb.models.http_client import OPENAI_HOST, Endpoint, check_base_url, display_url, resolve_api_key
from ragdb.options import check_number
from ragdb.answers.prompt import (
    REFUSAL,
    CitationCheck,
    Prompt,
    PromptTemplate,
    build_prompt,
    check_citations,
)
from ragdb.types import Hit

__all__ = ["LLM", "StreamingLLM", "ChatClient", "Answer", "ask"]

DEFAULT_BASE_URL = "https://api.openai.com/v1"
DEFAULT_MODEL = "gpt-4o-mini"


_NOT_JSON = object()  # marks a stream event that did not decode


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


def _check_messages(messages: Any) -> list[dict[str, Any]]:
    if not isinstance(messages, list) or not messages:
        raise InvalidInput("messages must be a non-empty list of {'role': ..., 'content': ...} dicts")
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or "content" not in m:
            raise InvalidInput("each message must be a dict with a 'role' string and a 'content'")
    return messages


def _is_openai(base_url: str) -> bool:
    """Whether ``base_url`` is OpenAI's own API (which needs a key)."""
    parts = urllib.parse.urlsplit(base_url)
    return parts.scheme.lower() == "https" and (parts.hostname or "").lower() == OPENAI_HOST


def _no_endpoint_message(defaulted: bool) -> str:
    where = ("no chat endpoint is configured and no API key is set" if defaulted
             else "OpenAI's API needs an API key and none is set")
    return (f"{where}: set RAGDB_LLM_BASE_URL (or pass base_url / --base-url) to an OpenAI-compatible "
            f"endpoint such as http://localhost:11434/v1 (Ollama), http://localhost:8000/v1 (vLLM) or "
            f"http://localhost:8080/v1 (llama.cpp); or, for OpenAI's API, set RAGDB_LLM_API_KEY or "
            f"OPENAI_API_KEY (RAGDB_LLM_MODEL names the model)")


def _error_text(err: Any) -> str:
    if isinstance(err, dict):
        err = err.get("message", err)
    return str(err)


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

    With neither an endpoint nor a key (the base URL falls back to OpenAI's API,
    which refuses every request without a key) the constructor raises
    :class:`~ragdb.errors.LLMError` at once, naming the settings to set, before
    any request is attempted; so does OpenAI's API named explicitly without a key.

    ``timeout`` (seconds) applies to connecting and to each read, and bounds
    reading a whole answer of :meth:`complete` once it started. Requests are
    retried ``max_retries`` times on HTTP 408, 429, 5xx and connection failures
    (including connect timeouts), waiting ``backoff * 2**attempt`` seconds or
    the server's ``Retry-After``, either capped at ``max_backoff``.
    Other 4xx are not retried, nor is a server that accepted the request but
    did not answer within ``timeout`` (it may still be generating; retrying
    would multiply the wait). Redirects are refused (:mod:`ragdb.models.http_client`).
    ``temperature`` None leaves it to the server.
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
        defaulted = False  # no base URL anywhere: OpenAI's API by default
        if base_url is None:
            base_url = env.get("RAGDB_LLM_BASE_URL")
            if not base_url and env.get("OPENAI_BASE_URL"):
                base_url, openai_paired = env["OPENAI_BASE_URL"], True
            defaulted = not base_url
            base_url = base_url or DEFAULT_BASE_URL
        if model is None:
            model = env.get("RAGDB_LLM_MODEL") or DEFAULT_MODEL
        self.base_url = check_base_url(base_url)
        key = resolve_api_key(api_key, "RAGDB_LLM_API_KEY", self.base_url, openai_paired=openai_paired)
        if not key and _is_openai(self.base_url):
            raise LLMError(_no_endpoint_message(defaulted))
        if not isinstance(model, str) or not model.strip():
            raise InvalidInput("model must be a non-empty string")
        if temperature is not None:
            temperature = check_number(temperature, "temperature", low=0.0)
        self._http = Endpoint(
            self.base_url + "/chat/completions",
            error=LLMError,
            what="LLM request",
            api_key=key,
            timeout=timeout,
            max_retries=max_retries,
            backoff=backoff,
            max_backoff=max_backoff,
            retry_read_timeout=False,  # the model may still be generating
        )
        self.model = model
        self.timeout = self._http.timeout
        self.max_retries = self._http.max_retries
        self.backoff = self._http.backoff
        self.max_backoff = self._http.max_backoff
        self.temperature = temperature
        self._api_key = key

    def __repr__(self) -> str:
        return (
            f"ChatClient(base_url={display_url(self.base_url)!r}, model={self.model!r}, "
            f"api_key={'***' if self._api_key else ''!r}, timeout={self.timeout}, "
            f"max_retries={self.max_retries}, backoff={self.backoff}, "
            f"temperature={self.temperature})"
        )

    # ------------------------------------------------------------------ public

    def complete(self, messages: list[dict[str, Any]]) -> str:
        """Send ``messages`` and return the reply's text (``choices[0].message.content``)."""
        return self._parse_reply(self._http.post_json(self._payload(messages, stream=False)))

    def stream(self, messages: list[dict[str, Any]]) -> Iterator[str]:
        """Send ``messages`` with ``stream: true`` and yield the reply's text pieces.

        The messages are checked now; the request is made when iteration
        starts. Reads Server-Sent Events ``data: {...}`` and yields each
        ``choices[0].delta.content`` until ``data: [DONE]``. Failures before
        the answer starts are retried like :meth:`complete`; a stream that
        breaks midway raises :class:`LLMError`.
        """
        return self._events(self._payload(messages, stream=True))

    # ------------------------------------------------------------------ internals

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

    def _parse_reply(self, data: Any) -> str:
        fail, quote = self._http.error, self._http.quote
        if isinstance(data, dict) and data.get("error") and "choices" not in data:
            raise fail(f"the reply is an error: {quote(_error_text(data['error']))}")
        choices = data.get("choices") if isinstance(data, dict) else None
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            shown = quote(json.dumps(data, ensure_ascii=False))
            raise fail(f"the reply is malformed: missing choices ({shown})")
        choice = choices[0]
        message = choice.get("message")
        content = message.get("content") if isinstance(message, dict) else None
        if content is None and isinstance(choice.get("text"), str):  # legacy completions shape
            content = choice["text"]
        if not isinstance(content, str):
            raise fail("the reply is malformed: choices[0] has no message content")
        return content

    def _events(self, body: bytes) -> Iterator[str]:
        fail, quote = self._http.error, self._http.quote
        done = finished = False
        events = self._http.stream_events(body)
        try:
            for data in events:
                if data.strip() == "[DONE]":
                    done = True
                    break
                try:
                    event = json.loads(data)
                except (ValueError, RecursionError):  # not JSON, or nested too deeply to decode
                    event = _NOT_JSON  # raised below, outside the handler: the decoder's error
                    # (whose .doc holds the raw event) must not ride along as __context__
                if event is _NOT_JSON:
                    raise fail(f"the stream sent a malformed event (not JSON): {quote(data)}")
                if not isinstance(event, dict):
                    raise fail(f"the stream sent a malformed event: {quote(data)}")
                if event.get("error"):
                    raise fail(f"the stream sent an error: {quote(_error_text(event['error']))}")
                choices = event.get("choices")
                if not isinstance(choices, list):
                    raise fail(f"the stream sent a malformed event: missing choices ({quote(data)})")
                if not choices or not isinstance(choices[0], dict):
                    continue  # e.g. a final usage-only event
                choice = choices[0]
                if choice.get("finish_reason"):
                    finished = True
                delta = choice.get("delta")
                content = delta.get("content") if isinstance(delta, dict) else None
                if isinstance(content, str) and content:
                    yield content
        finally:
            events.close()
        if not (done or finished):
            raise fail("the stream ended before data: [DONE]")


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
    on_text: Callable[[str], None] | None = None,
    min_confidence: float | None = None,
) -> Answer:
    """Answer ``query`` from ``search_hits`` with ``llm``, or refuse without calling it.

    Builds the prompt with :func:`ragdb.answers.prompt.build_prompt` (same keyword
    arguments; so by default hits below
    :data:`ragdb.index.confidence.DEFAULT_MIN_CONFIDENCE` are dropped, unless
    ``min_score`` or ``min_confidence`` is given). When no hit passes, returns
    the refusal sentence of the language and never calls the model. Otherwise calls
    ``llm.complete([system, user])`` and checks the answer's citations.

    ``on_text``: called with the answer's text as it arrives. If ``llm`` has a
    ``stream(messages)`` method (a :class:`StreamingLLM` such as
    :class:`ChatClient`), the answer is streamed and each non-empty piece is
    passed on as soon as it is read; otherwise (and for the refusal sentence)
    ``on_text`` gets the whole text once. Either way the pieces join to
    ``Answer.text`` and the same :class:`Answer` is returned as without
    ``on_text`` (citations checked, ``refused`` set, ``hits``). An exception
    raised by ``on_text`` stops the stream and propagates.
    """
    complete = getattr(llm, "complete", None)
    if not callable(complete):
        raise InvalidInput("llm must have a complete(messages) method")
    if on_text is not None and not callable(on_text):
        raise InvalidInput(f"on_text must be callable or None, got {type(on_text).__name__}")
    prompt = build_prompt(
        query,
        search_hits,
        template=template,
        language=language,
        budget_tokens=budget_tokens,
        min_score=min_score,
        relative=relative,
        min_confidence=min_confidence,
    )
    if prompt.refused:
        text = REFUSAL[prompt.language]
        if on_text is not None:
            on_text(text)
        return Answer(
            text=text, citations=check_citations(text, 0), hits=(), prompt=prompt, refused=True
        )
    stream = getattr(llm, "stream", None)
    if on_text is not None and callable(stream):
        text = _stream_text(stream(prompt.messages), on_text)
    else:
        text = complete(prompt.messages)
        if not isinstance(text, str):
            raise LLMError(f"llm.complete returned {type(text).__name__}, not a string")
        if on_text is not None and text:
            on_text(text)
    citations = check_citations(text, len(prompt.sources))
    return Answer(
        text=text,
        citations=citations,
        hits=prompt.sources,
        prompt=prompt,
        refused=citations.refusal,
    )


def _stream_text(pieces: Iterable[str], on_text: Callable[[str], None]) -> str:
    """Pass each piece of a stream to ``on_text``; return them joined."""
    seen: list[str] = []
    try:
        for piece in pieces:
            if not isinstance(piece, str):
                raise LLMError(f"llm.stream yielded {type(piece).__name__}, not a string")
            if piece:
                seen.append(piece)
                on_text(piece)
    finally:
        close = getattr(pieces, "close", None)
        if callable(close):
            close()
    return "".join(seen)
