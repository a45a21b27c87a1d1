"""``ragdb.connect(url, token=...)``: a :class:`Client` of a ``ragdb serve`` server.

The client has the reading and writing methods of :class:`ragdb.Database` (``search``,
``build_prompt``, ``get``, ``documents``, ``count``, ``facets``, ``stats``, ``add``,
``add_many``, ``update``, ``delete``, ``collection``, ``collections``,
``create_collection``, ``drop_collection``) with the same arguments, and returns the
same frozen types (:class:`~ragdb.types.Hit`, :class:`~ragdb.types.Document`,
:class:`~ragdb.types.Stats`, :class:`~ragdb.types.AddReport`,
:class:`~ragdb.types.Facets`, :class:`~ragdb.types.CollectionInfo`,
:class:`~ragdb.answers.prompt.Prompt`). Errors are the library's
:class:`~ragdb.errors.RagdbError` subclasses, as the server names them
(:class:`~ragdb.errors.DocumentNotFound`, :class:`~ragdb.errors.InvalidInput`,
:class:`~ragdb.errors.CollectionNotFound`, ...); a refused token is
:class:`~ragdb.errors.Unauthorized`, a write the token may not make
:class:`~ragdb.errors.AccessDenied` (:class:`~ragdb.errors.WriteForbidden` for one
outside its write scope); a server that cannot be reached, or answers what is not
ragdb's API, :class:`~ragdb.errors.RemoteError`.

What differs from a file, because a server decides it:

* who reads is the token's (its principals), never the call's: ``principals=`` is
  refused (:class:`~ragdb.errors.InvalidInput`). Without a token the client is an
  anonymous caller, as ``principals`` omitted is for a file;
* the server bounds ``k`` and query lengths (``ragdb serve --max-k``), and serves the
  search options its API has (``scorer``, ``filter``, ``min_score``, ``since``,
  ``until``, ``offset``, ``syntax``, ``fuzzy``, ``highlight``, ``snippet_chars``);
  others (``reranker``, ``k1``, ``as_of`` ...) are refused here, not ignored;
* each request of ``add_many`` is one transaction (1,000 records or about 1 MiB of
  JSON at most, ``batch_size`` records at most) and refuses two records of one source
  (:class:`~ragdb.errors.InvalidInput`; a file's replaces the first with the second);
  ``spans`` and ``chunker`` are not sent (the server's chunker applies), and
  :meth:`Database.transaction` has no counterpart;
* ``stats()`` of a token without the full view counts only what it may see
  (documents and chunks; the other counts are 0);
* collections other than the served one need ``ragdb serve --collections``;
  creating and dropping them, the administrator's token.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import math
import os
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlsplit

import httpx
import orjson

from ragdb import errors
from ragdb.errors import AccessDenied, InvalidInput, RagdbError, RemoteError, Unauthorized
from ragdb.options import SearchOptions, check_id
from ragdb.records import AddReport, Change, CollectionInfo, Document, Facets, LoadedDocument, Stats
from ragdb.types import Duplicate, Hit, QueryPlan, Snippet

if TYPE_CHECKING:
    from ragdb.answers.prompt import Prompt

__all__ = ["Client", "connect", "DEFAULT_TIMEOUT"]

#: Seconds a request may take (connecting, sending, waiting for the answer) by default.
DEFAULT_TIMEOUT = 60.0
#: The search options the server's API takes (POST /search), by their library names.
SEARCH_OPTIONS = ("scorer", "min_score", "offset", "syntax", "fuzzy", "highlight", "snippet_chars")
#: The restrictions it takes.
SEARCH_RESTRICTIONS = ("filter", "since", "until")
_SEARCH_FIELDS = SEARCH_OPTIONS + SEARCH_RESTRICTIONS
#: The most records of one add request (the server's limit), and about the most bytes of JSON.
BATCH_RECORDS = 1000
BATCH_BYTES = 1 << 20
#: The largest page of a document listing (the server's limit).
PAGE = 1000

_DEFAULT_OPTIONS = SearchOptions()
#: Headers whose values are credentials, never shown in an error.
_SECRET_HEADER = re.compile(r"(?i)auth|key|token|secret|cookie|session|password")


def connect(url: str, token: str | None = None, *, collection: str | None = None,
            timeout: float = DEFAULT_TIMEOUT, headers: Mapping[str, str] | None = None) -> Client:
    """A client of the ``ragdb serve`` server at ``url`` (``http://host:port``), reading
    and writing as ``token`` (a bearer token of the server's; None: an anonymous
    caller, who reads public documents and cannot write).

    ``collection``: use this collection of the server (which needs ``ragdb serve
    --collections`` unless it is the one served) instead of the one it serves.
    ``timeout``: seconds a request may take. ``headers``: more HTTP headers for every
    request (a proxy's). The server is asked once now (``/healthz``), so a wrong
    address or an unknown token fails here: :class:`~ragdb.errors.RemoteError`,
    :class:`~ragdb.errors.Unauthorized`."""
    client = Client(url, token, collection=collection, timeout=timeout, headers=headers)
    try:
        client.ping()
    except BaseException:
        client.close()
        raise
    return client


def _check_url(url: Any) -> str:
    if isinstance(url, os.PathLike) or not isinstance(url, str):
        raise InvalidInput(f"connect: url must be a string such as 'http://127.0.0.1:8000', got {url!r:.80}",
                           param="url")
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidInput(f"connect: url must be an http:// or https:// address of a ragdb server "
                           f"('http://127.0.0.1:8000'), got {url!r:.80} (a file: ragdb.open)", param="url")
    if parts.username or parts.password:
        raise InvalidInput("connect: url must not hold a user or password; give token=", param="url")
    return url.strip().rstrip("/")


def _collection_path(name: Any) -> str:
    from ragdb.storage.collections import check_name

    name = check_name(name)  # the library's check, and its messages
    if "/" in name:
        raise InvalidInput(f"collection {name!r} holds '/': a server cannot name it in a URL", param="name")
    # dots too: a name '..' or '.' is a dot segment, which the URL drops ('/collections/../search' is
    # '/search', the served collection's), and %2E is a dot to the server and a letter to the URL
    return "/collections/" + quote(name, safe="").replace(".", "%2E")


def _no_principals(principals: Any) -> None:
    if principals is not None:
        raise InvalidInput("principals cannot be given to a server's client: who reads is its API token's "
                           "(no token: an anonymous caller)", param="principals")


class Client:
    """A ``ragdb serve`` server, with the reading and writing methods of
    :class:`ragdb.Database` (see :mod:`ragdb.client.remote`). Made by :func:`connect`;
    a handle from :meth:`collection` shares its connection. Thread safe (httpx's
    connection pool); close it, or use it as a context manager."""

    def __init__(self, url: str, token: str | None = None, *, collection: str | None = None,
                 timeout: float = DEFAULT_TIMEOUT, headers: Mapping[str, str] | None = None,
                 _http: httpx.Client | None = None) -> None:
        self.url = _check_url(url)
        if token is not None and (not isinstance(token, str) or not token.strip()
                                  or any(c.isspace() for c in token)):
            raise InvalidInput("connect: token must be a non-empty string without spaces", param="token")
        self._prefix = "" if collection is None else _collection_path(collection)
        self._name = collection
        self._owner = _http is None
        if _http is None:
            sent = dict(headers or {})
            if token is not None:
                sent["Authorization"] = f"Bearer {token}"
            _http = httpx.Client(base_url=self.url, headers=sent, timeout=timeout, follow_redirects=False)
        self._http = _http

    # -- lifecycle -----------------------------------------------------------------------
    @property
    def path(self) -> str:
        """The server's URL (a file's :attr:`ragdb.Database.path`)."""
        return self.url

    def close(self) -> None:
        """Close the connections (a handle from :meth:`collection`: does nothing; closing the
        client it came from closes both)."""
        if self._owner:
            self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        where = "" if self._name is None else f" collection={self._name!r}"
        return f"<ragdb.Client {self.url!r}{where}>"

    # -- requests ------------------------------------------------------------------------
    def _call(self, method: str, path: str, body: Any = None, *, root: bool = False,
              read: Callable[[Any], Any] | None = None) -> Any:
        """One request: its JSON answer (``read`` of it, when given), or the server's error
        raised as the library's. An answer ``read`` cannot take (a field missing, of
        another type) is a :class:`~ragdb.errors.RemoteError`: what answered is not
        ragdb's API."""
        answer = self._request(method, path, body, root=root)
        if read is None:
            return answer
        try:
            return read(answer)
        except RagdbError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError):
            pass  # raised below, with no __context__
        raise RemoteError(f"{self.url}: {method} {path} answered what is not ragdb's API (a field missing or "
                          f"of another type): is this a ragdb server?")

    def _request(self, method: str, path: str, body: Any, *, root: bool) -> Any:
        """One request: its JSON answer, or the server's error raised as the library's."""
        if self._http.is_closed:
            raise RagdbError(f"{self.url}: the client is closed")
        content = None if body is None else _json(body, f"{method} {path}")
        headers = {"Content-Type": "application/json"} if content is not None else None
        try:
            request = self._http.build_request(method, path if root else self._prefix + path, content=content,
                                               headers=headers)
            response = self._http.send(request, stream=True)
            try:
                raw = self._body(response, f"{method} {path}")
            finally:
                response.close()
        except httpx.TimeoutException as e:
            raise RemoteError(f"{self.url}: no answer in time ({type(e).__name__})") from None
        except httpx.HTTPError as e:
            raise RemoteError(f"{self.url}: cannot reach the server ({type(e).__name__}: {e})") from None
        if response.is_success:
            try:
                return orjson.loads(raw)
            except orjson.JSONDecodeError:
                raise RemoteError(f"{self.url}: {method} {path} answered {response.status_code} with what is "
                                  f"not JSON: is this a ragdb server?") from None
        raise _error(self.url, method, path, response.status_code, raw, self._secrets())

    def _body(self, response: httpx.Response, what: str) -> bytes:
        """An answer's body, as the model clients read theirs (:mod:`ragdb.models.http_client`): at
        most ``MAX_REPLY_BYTES`` (after ``Content-Encoding``), and within one timeout in all (httpx's
        bounds each read: a server sending a byte now and then held the call for ever)."""
        from ragdb.models.http_client import MAX_REPLY_BYTES

        timeout = self._http.timeout.read
        deadline = None if timeout is None else time.monotonic() + timeout
        raw = bytearray()
        for piece in response.iter_bytes():
            raw += piece
            if len(raw) > MAX_REPLY_BYTES:
                raise RemoteError(f"{self.url}: {what} answered more than {MAX_REPLY_BYTES:,} bytes")
            if deadline is not None and time.monotonic() > deadline:
                raise RemoteError(f"{self.url}: no answer in time (its body took more than {timeout:g}s)")
        return bytes(raw)

    def _secrets(self) -> list[str]:
        """The credentials this client sends: the token, and the values of headers given whose
        name says they are one (a proxy's ``Proxy-Authorization``, an ``X-Api-Key``)."""
        found = []
        for name, value in self._http.headers.items():
            if _SECRET_HEADER.search(name):  # ("Bearer <token>": the token; redact masks "Bearer <token>")
                found.append(value[7:].strip() if value[:7].lower() == "bearer " else value)
        return found

    def ping(self) -> None:
        """Ask the server whether it answers, and knows the token (:func:`connect` does). A
        server whose last request failed in the database (``/healthz`` answers 503) answers."""
        try:
            self._call("GET", "/healthz", root=True)
        except RemoteError as e:
            if not isinstance(e.__cause__, _Unhealthy):
                raise

    # -- collections ---------------------------------------------------------------------
    @property
    def collection_name(self) -> str:
        """The collection this client reads and writes (asked of the server the first time)."""
        if self._name is None:
            self._name = self._call("GET", "/stats", read=lambda s: str(s["collection"]))
        return self._name

    def collection(self, name: str, *, create: bool = True, analyzer: str | Mapping[str, Any] | None = None,
                   chunker: str | None = None, keep_versions: bool | None = None,
                   public_unlabeled: bool | None = None) -> Client:
        """A handle on collection ``name`` of the server (sharing this client's connection);
        a missing one is created when ``create`` (the administrator's token), else
        :class:`~ragdb.errors.CollectionNotFound`. Settings given are those of a new
        collection; an existing one keeps its own."""
        handle = self._handle(name)
        try:
            self._call("GET", _collection_path(name), root=True)
        except errors.CollectionNotFound:
            if not create:
                raise
            try:
                return self.create_collection(name, analyzer=analyzer, chunker=chunker, keep_versions=keep_versions,
                                              public_unlabeled=public_unlabeled)
            except errors.CollectionExists:  # made meanwhile by another client
                pass
        return handle

    def _handle(self, name: str) -> Client:
        _collection_path(name)
        return Client(self.url, collection=name, _http=self._http)

    def collections(self) -> list[CollectionInfo]:
        """The collections the server serves, each with the documents and chunks this
        client may see of it."""
        return self._call("GET", "/collections", root=True,
                          read=lambda a: [CollectionInfo(**c) for c in a["collections"]])

    def create_collection(self, name: str, *, analyzer: str | Mapping[str, Any] | None = None,
                          chunker: str | None = None, keep_versions: bool | None = None,
                          public_unlabeled: bool | None = None) -> Client:
        """Create collection ``name`` (:class:`~ragdb.errors.CollectionExists` if there is one)
        and return a handle on it."""
        _collection_path(name)
        body = {"name": name, "analyzer": analyzer, "chunker": chunker, "keep_versions": keep_versions,
                "public_unlabeled": public_unlabeled}
        self._call("POST", "/collections", {k: v for k, v in body.items() if v is not None}, root=True)
        return self._handle(name)

    def drop_collection(self, name: str) -> None:
        """Drop collection ``name`` and everything in it (:class:`~ragdb.errors.CollectionNotFound`
        if there is none)."""
        self._call("DELETE", _collection_path(name), root=True)

    # -- writing -------------------------------------------------------------------------
    def add(self, text: str, *, source: str | None = None, version: str | None = None,
            timestamp: str | _dt.datetime | None = None, metadata: Mapping[str, Any] | None = None,
            title: str | None = None, acl: Sequence[str] | None = None, chunker: Any = None,
            spans: Sequence[Any] = ()) -> Document:
        """Add one document, or replace the stored one with the same ``source``
        (:meth:`ragdb.Database.add`); one transaction."""
        record = {"text": text, "source": source, "version": version, "timestamp": timestamp,
                  "metadata": metadata, "title": title, "acl": acl, "spans": spans}
        return self.add_many([record], chunker=chunker)[0]

    def add_many(self, records: Iterable[Mapping[str, Any] | LoadedDocument], *, chunker: Any = None,
                 batch_size: int = BATCH_RECORDS, workers: int | None = None) -> AddReport:
        """Add many documents (:meth:`ragdb.Database.add_many`): each request of at most
        ``batch_size`` records (and :data:`BATCH_RECORDS`, about :data:`BATCH_BYTES` of JSON)
        is one transaction. ``workers`` is the server's business (ignored)."""
        if chunker is not None:
            raise InvalidInput("add: chunker cannot be sent to a server (its chunker applies)", param="chunker")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise InvalidInput(f"batch_size must be a positive integer, got {batch_size!r}", param="batch_size")
        if isinstance(records, (str, bytes, Mapping)) or not hasattr(records, "__iter__"):
            raise InvalidInput(f"records must be an iterable of mappings or LoadedDocument, "
                               f"got {type(records).__name__}")
        limit = min(batch_size, BATCH_RECORDS)
        changes: list[Change] = []
        embedded = reused = 0
        for batch in _batches((_record(r, n) for n, r in enumerate(records)), limit):
            got, n_embedded, n_reused = self._call(
                "POST", "/documents/batch", {"documents": batch},
                read=lambda a: ([_change(c) for c in a["documents"]], int(a.get("embedded", 0)),
                                int(a.get("reused", 0))))
            changes.extend(got)
            embedded += n_embedded
            reused += n_reused
        return AddReport(tuple(changes), embedded=embedded, reused=reused)

    def update(self, doc_id: int, *, metadata: Mapping[str, Any] | None = None,
               acl: Sequence[str] | None = None) -> Document:
        """Change a document's metadata and/or access labels in place (:meth:`ragdb.Database.update`)."""
        body = {k: v for k, v in (("metadata", metadata), ("acl", acl)) if v is not None}
        if not body:
            raise InvalidInput(f"update document {doc_id!r:.40}: give metadata=, acl= or both")
        return self._call("PATCH", f"/documents/{_doc_id(doc_id, 'update: doc_id')}", body, read=_document)

    def delete(self, doc_id: int | None = None, *, source: str | None = None, glob: bool = False,
               filter: Mapping[str, Any] | None = None) -> int:
        """Delete by id, or every version of ``source`` (a pattern with ``glob``) and/or every
        document matching ``filter`` (:meth:`ragdb.Database.delete`), of those this client may
        see; returns how many. One transaction."""
        given = [name for name, v in (("doc_id", doc_id), ("source", source), ("filter", filter)) if v is not None]
        if not given or (doc_id is not None and len(given) > 1):
            raise InvalidInput("delete: give doc_id, or source and/or filter")
        if doc_id is not None:
            return self._call("DELETE", f"/documents/{_doc_id(doc_id, 'delete: doc_id')}", read=_deleted)
        body = {"source": source, "glob": glob, "filter": filter}
        return self._call("POST", "/documents/delete", {k: v for k, v in body.items() if v is not None},
                          read=_deleted)

    # -- reading -------------------------------------------------------------------------
    def search(self, query: str, k: int | None = None, *, options: SearchOptions | None = None,
               **keywords: Any) -> list[Hit]:
        """The ``k`` best chunks for ``query``, best first (:meth:`ragdb.Database.search`; the
        options the server serves, see :mod:`ragdb.client.remote`)."""
        body = {"query": _query(query), **_search_fields(k, options, keywords)}
        return self._call("POST", "/search", body, read=lambda a: [_hit(h) for h in a["hits"]])

    def search_and_plan(self, query: str, k: int | None = None, *, options: SearchOptions | None = None,
                        **keywords: Any) -> tuple[list[Hit], QueryPlan]:
        """:meth:`search` and :meth:`query_plan` of one query from one snapshot
        (:meth:`ragdb.Database.search_and_plan`)."""
        body = {"query": _query(query), **_search_fields(k, options, keywords), "plan": True}
        hits, plan = self._call("POST", "/search", body,
                                read=lambda a: ([_hit(h) for h in a["hits"]], _plan(a["plan"])))
        return hits, plan

    def query_plan(self, query: str, *, options: SearchOptions | None = None, **keywords: Any) -> QueryPlan:
        """How the server's search reads ``query`` with these options (:meth:`ragdb.Database.query_plan`)."""
        return self.search_and_plan(query, options=options, **keywords)[1]

    def build_prompt(self, query: str, hits: Sequence[Hit] | None = None, *, template: Any = None,
                     language: str | None = None, k: int | None = None, budget_tokens: int | None = None,
                     min_score: float | None = None, relative: float | None = None,
                     min_confidence: float | None = None, options: SearchOptions | None = None,
                     **search_keywords: Any) -> Prompt:
        """A grounded prompt from the server's top ``k`` (default: the ``options``' k, else 5) for ``query``
        (:meth:`ragdb.Database.build_prompt`), with the server's confidence floor unless
        ``min_confidence`` is given. ``hits``, ``template``, ``min_score`` and ``relative``
        are not sent to a server: build those prompts with
        :func:`ragdb.answers.prompt.build_prompt` on this client's hits."""
        from ragdb.answers.prompt import Prompt

        for name, value in (("hits", hits), ("template", template), ("min_score", min_score),
                            ("relative", relative)):
            if value is not None:
                raise InvalidInput(f"build_prompt: {name} is not sent to a server (use "
                                   f"ragdb.answers.prompt.build_prompt on search results)", param=name)
        if not _query(query).strip():
            raise InvalidInput("query must not be empty")  # (the library's words: the server says 'question')
        fields = _search_fields(None, options, search_keywords, allowed=("scorer", "filter"))
        if k is None and isinstance(options, SearchOptions):  # the options' depth, as the library's prompt
            k = options.k
        body = {"question": query, "k": k, "budget_tokens": budget_tokens, "language": language,
                "min_confidence": min_confidence, **fields}
        def read(p: Any) -> Prompt:
            system, user = p["system"], p["user"]
            return Prompt(text=f"{system}\n\n{user}" if system else user, system=system, user=user,
                          sources=tuple(_hit(h) for h in p["sources"]), language=p["language"],
                          refused=p["refused"], confidence=p["confidence"], min_confidence=p["min_confidence"])

        prompt: Prompt = self._call("POST", "/prompt", {key: v for key, v in body.items() if v is not None},
                                    read=read)
        return prompt

    def get(self, doc_id: int | None = None, *, source: str | None = None, with_text: bool = True,
            principals: Any = None) -> Document:
        """The document with this id, or the latest version of ``source``, if this client may
        see it (:meth:`ragdb.Database.get`; else :class:`~ragdb.errors.DocumentNotFound`)."""
        _no_principals(principals)
        if (doc_id is None) == (source is None):
            raise InvalidInput("get: give exactly one of doc_id or source")
        body = {"id": None if doc_id is None else check_id(doc_id), "source": source, "with_text": with_text}
        return self._call("POST", "/documents/get", {k: v for k, v in body.items() if v is not None},
                          read=_document)

    def documents(self, source: str | None = None, *, glob: bool = True, versions: str = "latest",
                  limit: int | None = None, offset: int = 0, filter: Mapping[str, Any] | None = None,
                  principals: Any = None) -> list[Document]:
        """Stored documents by source (:meth:`ragdb.Database.documents`), fetched a page of
        :data:`PAGE` at a time."""
        _no_principals(principals)
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
            raise InvalidInput(f"limit must be a non-negative integer, got {limit!r:.40}", param="limit")
        out: list[Document] = []
        if limit == 0:
            return out
        for doc in self._pages(source, glob, versions, filter, offset):
            if limit is not None and len(out) >= limit:
                break
            out.append(doc)
        return out

    def _pages(self, source: str | None, glob: bool, versions: str, filter: Mapping[str, Any] | None,
               offset: int) -> Iterator[Document]:
        body: dict[str, Any] = {"source": source, "glob": glob, "versions": versions, "filter": filter,
                                "offset": offset, "limit": PAGE}
        body = {k: v for k, v in body.items() if v is not None}
        while True:
            docs, next_offset = self._call("POST", "/documents/query", body, read=_page)
            yield from docs
            if next_offset is None:
                return
            if next_offset <= body["offset"]:  # the same page again, for ever
                raise RemoteError(f"{self.url}: POST /documents/query answered next_offset {next_offset} after "
                                  f"offset {body['offset']}: is this a ragdb server?")
            body["offset"] = next_offset

    def count(self, *, versions: str = "latest", filter: Mapping[str, Any] | None = None,
              principals: Any = None) -> int:
        """How many stored documents this client may see (:meth:`ragdb.Database.count`)."""
        _no_principals(principals)
        body = {"versions": versions, "filter": filter}
        return self._call("POST", "/documents/count", {k: v for k, v in body.items() if v is not None},
                          read=lambda a: _integer(a["count"]))

    def facets(self, field: str, query: str | None = None, *, filter: Mapping[str, Any] | None = None,
               principals: Any = None, since: Any = None, until: Any = None, as_of: Any = None,
               versions: str = "latest", by: str = "chunks", limit: int | None = None) -> Facets:
        """Exact counts of ``field``'s values over what matches (:meth:`ragdb.Database.facets`);
        ``limit`` None asks for the server's most (1,000 values)."""
        _no_principals(principals)
        if as_of is not None or versions != "latest":
            raise InvalidInput("facets: as_of and versions are not served over HTTP", param="as_of")
        body = {"field": field, "query": query, "filter": filter, "since": since, "until": until, "by": by,
                "limit": PAGE if limit is None else limit}
        return self._call("POST", "/facets", {k: v for k, v in body.items() if v is not None},
                          read=lambda f: Facets(field=f["field"], by=f["by"],
                                                counts=tuple((v["value"], v["count"]) for v in f["values"]),
                                                total=f["total"], missing=f["missing"], omitted=f["omitted"]))

    def stats(self) -> Stats:
        """The collection's statistics (:meth:`ragdb.Database.stats`); a token without the full
        view gets the documents and chunks it may see, and 0 for the other counts."""
        names = [f.name for f in dataclasses.fields(Stats)]
        return self._call("GET", "/stats", read=lambda s: Stats(
            **{name: s.get(name, 0.0 if name == "avg_chunk_length" else 0) for name in names
               if name != "collection"}, collection=s.get("collection", "default")))


# --------------------------------------------------------------------------- JSON in, types out

def _doc_id(doc_id: Any, what: str) -> int:
    return check_id(doc_id, what)  # the library's check, and its messages


def _query(query: Any) -> str:
    """A query or question, checked as the library checks it (None would be sent as a field not
    given, and answered 'missing field')."""
    if not isinstance(query, str):
        raise InvalidInput(f"query must be a string, got {type(query).__name__}")
    return query


def _search_fields(k: int | None, options: SearchOptions | None, keywords: dict[str, Any],
                   allowed: Sequence[str] = _SEARCH_FIELDS) -> dict[str, Any]:
    """The body fields of a search: the library's checks first (the same errors), then each
    option given (by keyword, or differing from the default in ``options``) as the server
    names it; one the server does not serve is refused."""
    _no_principals(keywords.get("principals"))
    keywords.pop("principals", None)
    if options is not None and not isinstance(options, SearchOptions):
        raise InvalidInput(f"options must be a ragdb.options.SearchOptions, got {type(options).__name__}")
    if k is not None:
        keywords["k"] = k
    checked = SearchOptions.from_keywords(options, **keywords)  # the library's validation
    given: dict[str, Any] = {}
    if options is not None:
        for f in dataclasses.fields(SearchOptions):
            if f.name != "restrictions" and getattr(options, f.name) != getattr(_DEFAULT_OPTIONS, f.name):
                given[f.name] = getattr(options, f.name)
        for f in dataclasses.fields(options.restrictions):
            if getattr(options.restrictions, f.name) != getattr(_DEFAULT_OPTIONS.restrictions, f.name):
                given[f.name] = getattr(options.restrictions, f.name)
    given.update(keywords)
    if "principals" in given:
        _no_principals(given["principals"])
    body: dict[str, Any] = {}
    for name, value in given.items():
        if name == "k":
            continue
        if name not in allowed:
            raise InvalidInput(f"search option {name} is not served over HTTP (the server's: "
                               f"{', '.join(allowed)})", param=name)
        body[name] = value
    if allowed is _SEARCH_FIELDS:  # (a prompt's k is its own argument)
        body["k"] = checked.k
    return body


def _record(record: Mapping[str, Any] | LoadedDocument, n: int) -> dict[str, Any]:
    if isinstance(record, LoadedDocument):
        record = {"text": record.text, "source": record.source, "title": record.title,
                  "metadata": dict(record.metadata), "acl": record.acl, "spans": record.spans}
    if not isinstance(record, Mapping):
        raise InvalidInput(f"record {n}: expected a mapping with 'text', got {type(record).__name__}")
    out = {k: v for k, v in record.items() if v is not None}
    if out.pop("spans", ()):
        raise InvalidInput(f"record {n}: spans cannot be sent to a server", param="spans")
    if out.pop("chunker", None) is not None:
        raise InvalidInput(f"record {n}: chunker cannot be sent to a server (its chunker applies)", param="chunker")
    if isinstance(out.get("acl"), tuple):
        out["acl"] = list(out["acl"])
    return out


def _batches(records: Iterable[dict[str, Any]], limit: int) -> Iterator[list[dict[str, Any]]]:
    batch: list[dict[str, Any]] = []
    size = 0
    for record in records:
        n = len(_json(record, f"document {record.get('source', '')!r}"))
        if batch and (len(batch) >= limit or size + n > BATCH_BYTES):
            yield batch
            batch, size = [], 0
        batch.append(record)
        size += n
    if batch:
        yield batch


def _json(value: Any, what: str) -> bytes:
    """``value`` as JSON, or InvalidInput where the library refuses it too: a NaN or infinity
    (orjson would write null, so a filter would change and metadata come back None) or a key
    that is not a string (a library write refuses it, and so does a filter)."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, float) and not math.isfinite(v):
            raise InvalidInput(f"{what}: {v!r} cannot be sent as JSON (it has no NaN or infinity)")
        if isinstance(v, Mapping):
            stack.extend(v.values())
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
    try:
        return orjson.dumps(value)  # (a naive datetime stays naive, as the library stores it; a naive time is UTC)
    except TypeError as e:
        raise InvalidInput(f"{what}: cannot be sent as JSON: {e}") from None


def _document(d: Mapping[str, Any]) -> Document:
    return Document(id=d["id"], source=d["source"], version=d["version"], timestamp=d["timestamp"],
                    content_hash=d["content_hash"], metadata=d["metadata"], acl=tuple(d["acl"]),
                    chunk_count=d["chunks"], latest=d["latest"], text=d.get("text"))


def _integer(value: Any) -> int:
    """A count from the server: an integer (not a float, a string or a bool)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an integer, got {type(value).__name__}")
    return value


def _deleted(answer: Mapping[str, Any]) -> int:
    return _integer(answer["deleted"])


def _page(page: Mapping[str, Any]) -> tuple[list[Document], int | None]:
    """A page of a document listing, and the offset of the next one (None: the last)."""
    offset = page["next_offset"]
    return [_document(d) for d in page["documents"]], None if offset is None else _integer(offset)


def _change(c: Mapping[str, Any]) -> Change:
    return Change(c["status"], _document(c["document"]), c["previous"])


def _spans(spans: Iterable[Sequence[int]]) -> tuple[tuple[int, int], ...]:
    return tuple((int(a), int(b)) for a, b in spans)


def _hit(h: Mapping[str, Any]) -> Hit:
    snippet = h.get("snippet")
    return Hit(score=h["score"], chunk_id=h["chunk_id"], doc_id=h["doc_id"], source=h["source"],
               version=h["version"], timestamp=h["timestamp"], text=h["text"], start=h["start"], end=h["end"],
               ordinal=h["ordinal"], metadata=h["metadata"], explain=h.get("explain", {}),
               confidence=h.get("confidence"), highlights=_spans(h.get("highlights", ())),
               snippet=None if snippet is None else Snippet(snippet["text"], snippet["start"], snippet["end"],
                                                            _spans(snippet["highlights"])),
               title=h.get("title"), section=h.get("section"),
               duplicates=tuple(Duplicate(d["source"], d["chunk_id"], d["doc_id"], d["score"])
                                for d in h.get("duplicates", ())))


def _plan(p: Mapping[str, Any]) -> QueryPlan:
    return QueryPlan(query=p["query"], syntax=p["syntax"], error=p["error"], terms=tuple(p["terms"]),
                     weights=dict(p["weights"]), expansions={t: tuple(v) for t, v in p["expansions"].items()},
                     phrases=tuple(p["phrases"]), excluded=tuple(p["excluded"]),
                     dropped=tuple((w, why) for w, why in p["dropped"]), unknown=tuple(p["unknown"]),
                     suggestions={t: tuple(v) for t, v in p["suggestions"].items()},
                     filters=tuple(p.get("filters", ())), notes=tuple(p.get("notes", ())))


# --------------------------------------------------------------------------- errors

#: What an error answer without a library error's name becomes, by HTTP status.
_BY_STATUS: dict[int, type[RagdbError]] = {401: Unauthorized, 403: AccessDenied, 413: InvalidInput,
                                           422: InvalidInput}


class _Unhealthy(Exception):
    """The cause of a :class:`RemoteError` for a server whose ``/healthz`` says it failed."""


def _error(url: str, method: str, path: str, status: int, raw: bytes, secrets: Sequence[str] = ()) -> RagdbError:
    """The library's error for a server's error answer: the class it names
    (``{"error": {"type": "DocumentNotFound", ...}}``), else one for its status. Its message is
    redacted of ``secrets`` before the error is made (a server, a proxy, echoing the request's
    credentials back): an error's text is not only its ``args`` (an ImportError's is its ``msg``)."""
    try:
        error = orjson.loads(raw)["error"]
        kind, message = str(error["type"]), str(error["message"])
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return RemoteError(f"{url}: {method} {path} answered HTTP {status}, not a ragdb error: is this a ragdb "
                           f"server?")
    if secrets:
        from ragdb.models.http_client import redact

        message = redact(message, *secrets)
    cls = getattr(errors, kind, None)
    if isinstance(cls, type) and issubclass(cls, InvalidInput):
        param = error.get("param")
        return cls(message, param=param if isinstance(param, str) else None)
    if isinstance(cls, type) and issubclass(cls, RagdbError) and cls is not RagdbError:
        return cls(message)
    if status == 503 and kind == "Unhealthy":
        err = RemoteError(f"{url}: {message}")
        err.__cause__ = _Unhealthy()
        return err
    if status in (404, 405) and kind in ("NotFound", "MethodNotAllowed"):
        return RemoteError(f"{url}: {message} (a ragdb server older than this client?)")
    return _BY_STATUS.get(status, RemoteError)(message)
