"""Second-stage rerankers: re-score retrieved hits with a stronger model.

A :class:`Reranker` takes a query and first-stage :class:`~ragdb.types.Hit`
objects and returns them re-ordered by a new ``score`` (best first).  Hits are
copied with :func:`dataclasses.replace`; only ``score`` changes (``metadata``,
spans and ``explain``, which still describes the first-stage score, are kept).
Ties keep the input order.

* :class:`HTTPReranker`: a reranking endpoint (text-embeddings-inference,
  Cohere, Jina, vLLM, ...), through :mod:`ragdb.models.http_client`.
* :class:`CrossEncoderReranker`: a local sentence-transformers cross-encoder
  (optional extra).

:func:`get_reranker` builds one from a spec string (``http``, a URL,
``cross-encoder:MODEL``, or a reranker an installed plugin provides, see
:mod:`ragdb.plugins`).
"""

from __future__ import annotations

import math
import os
from dataclasses import replace
from typing import Any, Protocol, runtime_checkable
from collections.abc import Callable, Sequence

from ragdb.errors import InvalidInput, MissingDependency, RerankError
from ragdb.models.http_client import Endpoint, check_base_url, display_url, resolve_api_key
from ragdb.types import Hit

__all__ = ["Reranker", "HTTPReranker", "CrossEncoderReranker", "get_reranker", "register_builtins"]


@runtime_checkable
class Reranker(Protocol):
    """Re-scores hits for a query; returns them best first, at most ``top_n``."""

    def rerank(self, query: str, hits: Sequence[Hit], top_n: int | None = None) -> list[Hit]: ...


def _check_args(query: str, hits: Sequence[Hit], top_n: int | None) -> list[Hit]:
    if not isinstance(query, str):
        raise InvalidInput(f"query is {type(query).__name__}, expected str")
    if top_n is not None and (not isinstance(top_n, int) or isinstance(top_n, bool) or top_n < 0):
        raise InvalidInput(f"top_n must be None or an integer >= 0, got {top_n!r}")
    hits = list(hits)
    for i, hit in enumerate(hits):
        if not isinstance(hit, Hit):
            raise InvalidInput(f"hits[{i}] is {type(hit).__name__}, expected Hit")
    return hits


def _finite(score: float) -> bool:
    """Whether ``score`` is a finite float, or an integer a float can hold (JSON has integers
    of any size, which ``math.isfinite`` and ``float`` refuse with OverflowError)."""
    try:
        return math.isfinite(score)
    except OverflowError:
        return False


def _apply(hits: list[Hit], scores: dict[int, float], top_n: int | None) -> list[Hit]:
    """Hits that got a score, sorted by it (desc; ties in input order), cut to top_n."""
    order = sorted(scores, key=lambda i: (-scores[i], i))
    if top_n is not None:
        order = order[:top_n]
    return [replace(hits[i], score=scores[i]) for i in order]


class HTTPReranker:
    """Rerank through an HTTP ``POST {base_url}/rerank`` endpoint.

    Two protocols are spoken:

    * ``style="tei"`` (Hugging Face text-embeddings-inference): request
      ``{"query", "texts", "truncate": true}``, reply
      ``[{"index", "score"}, ...]``.  ``base_url`` is the server root, e.g.
      ``http://localhost:8080``.
    * ``style="cohere"`` (Cohere, Jina, vLLM, ...): request
      ``{"model", "query", "documents", "top_n"}``, reply
      ``{"results": [{"index", "relevance_score"}, ...]}``.  ``base_url`` is
      the API root, e.g. ``https://api.cohere.com/v2`` or
      ``https://api.jina.ai/v1``.
    * ``style="auto"`` (default): cohere-style if ``model`` is given (those
      services need it), else TEI-style (TEI serves one model and takes none).

    Either reply shape is accepted whatever the style.  Documents are sent
    ``batch_size`` at a time (TEI refuses more than 32 per request by
    default); scores from different batches are comparable because a
    cross-encoder scores each (query, document) pair alone.

    ``base_url``/``model``/``api_key`` default to ``RAGDB_RERANK_BASE_URL``,
    ``RAGDB_RERANK_MODEL``, ``RAGDB_RERANK_API_KEY`` (the API-key rule of
    :func:`ragdb.models.http_client.resolve_api_key`).  Retries on 408/429/5xx, timeouts and
    connection errors (``max_retries`` times, exponential backoff from
    ``backoff`` seconds or the server's ``Retry-After``); redirects are refused.
    Failures (HTTP or a malformed reply) raise :class:`~ragdb.errors.RerankError`
    naming the problem; the API key never appears in messages or ``repr``.
    """

    STYLES = ("auto", "tei", "cohere")

    def __init__(
        self,
        base_url: str | None = None,
        model: str | None = None,
        api_key: str | None = None,
        timeout: float = 30.0,
        max_retries: int = 3,
        *,
        style: str = "auto",
        batch_size: int = 32,
        backoff: float = 0.5,
    ) -> None:
        base_url = base_url or os.environ.get("RAGDB_RERANK_BASE_URL")
        if not base_url:
            raise InvalidInput("no reranker URL: pass base_url= or set RAGDB_RERANK_BASE_URL")
        self.base_url = check_base_url(base_url)
        self.model = model or os.environ.get("RAGDB_RERANK_MODEL") or None
        key = resolve_api_key(api_key, "RAGDB_RERANK_API_KEY", self.base_url)
        self._api_key = key or None
        if style not in self.STYLES:
            raise InvalidInput(f"style must be one of {self.STYLES}, got {style!r}")
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise InvalidInput(f"batch_size must be a positive integer, got {batch_size!r}")
        self._http = Endpoint(
            f"{self.base_url}/rerank",
            error=RerankError,
            what="rerank request" + (f" (model {self.model!r})" if self.model else ""),
            api_key=key,
            timeout=timeout,
            max_retries=max_retries,
            backoff=backoff,
        )
        self.style = ("cohere" if self.model else "tei") if style == "auto" else style
        self.timeout = self._http.timeout
        self.max_retries = max_retries
        self.batch_size = batch_size
        self.backoff = self._http.backoff

    def __repr__(self) -> str:
        return (
            f"HTTPReranker(base_url={display_url(self.base_url)!r}, model={self.model!r}, "
            f"style={self.style!r}, api_key={'***' if self._api_key else None})"
        )

    def rerank(self, query: str, hits: Sequence[Hit], top_n: int | None = None) -> list[Hit]:
        hits = _check_args(query, hits, top_n)
        if not hits or top_n == 0:
            return []
        scores: dict[int, float] = {}
        single = len(hits) <= self.batch_size
        for start in range(0, len(hits), self.batch_size):
            batch = [h.text for h in hits[start : start + self.batch_size]]
            # top_n can only be passed on when one request sees every document.
            got = self._request(query, batch, top_n if single else None)
            for index, score in got.items():
                scores[start + index] = score
        return _apply(hits, scores, top_n)

    def _request(self, query: str, texts: list[str], top_n: int | None) -> dict[int, float]:
        payload: dict[str, Any]
        if self.style == "tei":
            payload = {"query": query, "texts": texts, "truncate": True}
        else:
            payload = {"query": query, "documents": texts}
            if self.model:
                payload["model"] = self.model
            if top_n is not None:
                payload["top_n"] = min(top_n, len(texts))
        reply = self._http.post_json(payload)
        fail = self._http.error
        if isinstance(reply, list):  # text-embeddings-inference
            items, key = reply, "score"
        elif isinstance(reply, dict) and isinstance(reply.get("results"), list):
            items, key = reply["results"], "relevance_score"
        else:
            raise fail("reply is neither a list of {index, score} nor {results: [...]}")
        scores: dict[int, float] = {}
        for pos, item in enumerate(items):
            if not isinstance(item, dict):
                raise fail(f"result {pos} is not an object")
            index = item.get("index")
            score = item.get(key, item.get("score" if key != "score" else "relevance_score"))
            if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(texts):
                raise fail(f"result {pos} has invalid index {index!r} ({len(texts)} documents sent)")
            if index in scores:
                raise fail(f"index {index} appears twice in the reply")
            if isinstance(score, bool) or not isinstance(score, (int, float)) or not _finite(score):
                raise fail(f"result {pos} has no finite {key!r}")
            scores[index] = float(score)
        expected = len(texts) if top_n is None else min(top_n, len(texts))
        if len(scores) < expected:
            raise fail(f"sent {len(texts)} documents but got {len(scores)} scores back")
        return scores


class CrossEncoderReranker:
    """Rerank with a local sentence-transformers ``CrossEncoder`` (optional extra).

    ``model_name_or_path`` is a local folder or a Hugging Face model id (an id
    makes sentence-transformers download the model on first use; pass a local
    path for offline work).  Scores are the model's raw outputs (logits for
    most MS MARCO cross-encoders): comparable within one query only.
    """

    def __init__(
        self,
        model_name_or_path: str,
        *,
        device: str | None = None,
        batch_size: int = 32,
        max_length: int | None = None,
    ) -> None:
        try:
            from sentence_transformers import CrossEncoder
        except ImportError as exc:
            raise MissingDependency.of("sentence-transformers", "sentence-transformers", exc) from exc
        try:
            self._model = CrossEncoder(model_name_or_path, device=device, max_length=max_length)
        except Exception as exc:
            raise RerankError(f"cannot load cross-encoder {model_name_or_path!r}: {exc}") from exc
        self.model_name_or_path = str(model_name_or_path)
        self.batch_size = batch_size

    def __repr__(self) -> str:
        return f"CrossEncoderReranker({self.model_name_or_path!r})"

    def rerank(self, query: str, hits: Sequence[Hit], top_n: int | None = None) -> list[Hit]:
        hits = _check_args(query, hits, top_n)
        if not hits or top_n == 0:
            return []
        try:
            raw = self._model.predict(
                [(query, h.text) for h in hits],
                batch_size=self.batch_size,
                show_progress_bar=False,
            )
        except Exception as exc:
            raise RerankError(f"cross-encoder failed to score: {exc}") from exc
        try:
            values = [float(v) for v in list(raw)]
        except (TypeError, ValueError):
            raise RerankError(
                "cross-encoder returned several scores per pair; use a single-output model"
            ) from None
        if len(values) != len(hits) or not all(math.isfinite(v) for v in values):
            raise RerankError("cross-encoder returned a wrong number of scores or non-finite ones")
        return _apply(hits, dict(enumerate(values)), top_n)


def get_reranker(spec: str) -> Reranker:
    """A reranker from a short spec: ``"http"`` (an :class:`HTTPReranker` configured by the
    ``RAGDB_RERANK_*`` environment variables), a base URL (``"http://localhost:8080"``),
    ``"cross-encoder:<model name or path>"``, or ``"<name>"`` / ``"<name>:<arg>"`` of a
    reranker an installed plugin provides; every spec goes through :func:`ragdb.plugins.build`
    (ragdb's own rerankers are registered by :func:`register_builtins`). Unknown specs raise
    :class:`InvalidInput`."""
    if not isinstance(spec, str) or not spec.strip():
        raise InvalidInput(f"reranker spec must be a non-empty string, got {spec!r}")
    from ragdb import plugins

    made: Reranker = plugins.build("reranker", spec, expect=Reranker,
                                   what="a reranker (rerank(query, hits, top_n))")
    return made


def _url(scheme: str, arg: str | None) -> HTTPReranker:
    """``http`` alone (the ``RAGDB_RERANK_*`` variables), or the URL ``scheme:arg``."""
    if arg is None and scheme == "http":
        return HTTPReranker()
    if arg is None or not arg.startswith("//"):
        raise InvalidInput(f"reranker spec {scheme + ':' + (arg or '')!r}: expected http or an http(s):// URL")
    return HTTPReranker(base_url=f"{scheme}:{arg}")


def _http(arg: str | None = None) -> HTTPReranker:
    return _url("http", arg)


def _https(arg: str | None = None) -> HTTPReranker:
    return _url("https", arg)


def _cross_encoder(arg: str | None = None) -> CrossEncoderReranker:
    if not arg:
        raise InvalidInput(f"reranker spec {'cross-encoder:' + (arg or '')!r}: "
                           f"expected cross-encoder:<model name or path>")
    return CrossEncoderReranker(arg)


def register_builtins(register: Callable[..., None]) -> None:
    """Register ragdb's own rerankers with the ``register`` callback of the
    ``register_rerankers`` hook (called by the default plugin :mod:`ragdb.models.builtins`).
    A URL spec is its scheme's name and the rest as the argument (``http`` +
    ``//localhost:8080``)."""
    register("http", _http, usage="http, http://<url>")
    register("https", _https, usage="https://<url>")
    register("cross-encoder", _cross_encoder, usage="cross-encoder:<model>")
