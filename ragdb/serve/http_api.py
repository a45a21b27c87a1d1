"""An HTTP API over one ragdb database (``ragdb serve``): a small Starlette app served by uvicorn.

``pip install 'ragdb[server]'``. Endpoints (JSON in, JSON out; the schema is at
``GET /openapi.json``):

* ``POST /search`` (query, k, offset, scorer, filter, min_score, since, until, syntax, fuzzy,
  highlight, snippet_chars): the hits
  of :meth:`ragdb.Database.search`, best first (``offset``: a later page);
* ``POST /prompt`` (question, k, scorer, filter, min_confidence, budget_tokens,
  language): :meth:`ragdb.Database.build_prompt`'s grounded prompt;
* ``POST /facets`` (field, query, filter, since, until, by, limit): exact counts of a
  metadata field's values (or source, version) over the chunks (documents) the caller may
  see that match, :meth:`ragdb.Database.facets`, the most frequent first;
* ``GET /documents?prefix=&limit=&offset=``: the stored documents (latest
  versions) by source, a page at a time; ``GET /documents/{id}``: one, with its text;
* ``GET /stats``, ``GET /healthz``;
* ``POST /documents/get`` (id or source), ``POST /documents/query`` (source, glob, filter,
  versions, limit, offset), ``POST /documents/count`` (filter, versions): :meth:`ragdb.Database.get`,
  ``documents`` and ``count`` as the caller sees them;
* writes, only for a token allowed to write, within its write scope: ``POST /documents`` (text,
  source, metadata, version, timestamp, title, acl), ``POST /documents/batch`` (many in one
  transaction), ``PATCH /documents/{id}`` (metadata, acl), ``DELETE /documents/{id}`` and
  ``POST /documents/delete`` (source, glob, filter: of what the caller may see);
* ``GET /collections``, ``GET /collections/{name}``; with ``--collections``
  (:attr:`ServerConfig.collections`) every route above also under ``/collections/{name}/`` for
  each collection of the file, and for the administrator's token ``POST /collections`` and
  ``DELETE /collections/{name}``. :mod:`ragdb.client` is the Python client of all of it.

Access: who reads is the caller's bearer token's, never the request's. Tokens
are ``RAGDB_API_TOKEN`` (an administrator's token: it writes and reads
everything) and the entries of a tokens file (``--tokens``, JSON or TOML; see
:func:`load_tokens`), each with its principals and whether, and what, it may
write (a write scope, :mod:`ragdb.serve.access`: a token writes only documents
labelled within its scope, and nothing it cannot read). A request without a token
is anonymous: public chunks only, no writes; a token the server does not know is
refused (401), never read as anonymous. A body field ``principals`` is refused
(422). Only the Host header names in :attr:`ServerConfig.allowed_hosts` are
answered (400 otherwise: DNS rebinding); CORS is off unless
:attr:`ServerConfig.cors_origins` names origins. ``/stats`` gives a caller without
the full view the counts of what it may see only.

Errors are JSON, ``{"error": {"status", "type", "message"}}``, the message
being the library's :class:`~ragdb.errors.RagdbError` message without the database's
path or URL nor any other path of the host (:func:`~ragdb.serve.access.client_message`): 400 (not JSON,
not an object), 401 (no or unknown token where one is needed), 403 (the token
may not write; writes off), 404 (no such document, or one the caller may not
see; unknown path), 405, 413 (body over the limit), 422 (invalid input, a
limit on k or the query's length), 503 (database busy), 500 otherwise. A 500 from
the database (a StorageError, or an unexpected failure: logged with its traceback and
answered without details) makes ``GET /healthz`` answer 503 with what failed until a
request succeeds again: a worker that cannot search does not report itself healthy.

Processes: :func:`run` serves the app factory :func:`app_from_environment`
through uvicorn; with ``workers > 1`` each worker process imports it and opens
its own connection to the database when it starts (the lifespan handler), so
workers share nothing but the file (SQLite's WAL: readers never block).
Inside a worker, requests run the blocking library calls in Starlette's thread
pool; a :class:`ragdb.Database` serializes its own operations.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import dataclasses
import hashlib
import hmac
import logging
import os
import socket
import threading
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio
import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Mount, Route
from uvicorn.protocols.http.h11_impl import H11Protocol

import ragdb
from ragdb.errors import (AccessDenied, CollectionExists, CollectionNotFound, DatabaseBusy, DocumentNotFound,
                          InternalError, InvalidInput, RagdbError, RemoteError, StorageError, Unauthorized)
from ragdb.models.http_client import is_loopback
from ragdb.records import CollectionInfo
from ragdb.serve.access import WriteScope, check_write, client_message, scope_for
from ragdb.storage.codec import loads_exact
from ragdb.serve.shapes import check_distinct_sources, document_json, facets_json, hit_json, stats_json
from ragdb.answers.prompt import REFUSAL
from ragdb.files.sync import escape_glob

__all__ = ["Grant", "Limits", "ServerConfig", "load_tokens", "create_app", "app_from_environment", "run",
           "is_loopback", "api_hit_json", "UvicornConfig", "CONFIG_ENV", "TOKEN_ENV", "MIN_TOKEN_LENGTH"]

log = logging.getLogger("ragdb.serve.http_api")

#: The administrator's token (writes, reads everything), from the environment.
TOKEN_ENV = "RAGDB_API_TOKEN"
#: Where :func:`run` hands the configuration to the worker processes (JSON; no secrets in it).
CONFIG_ENV = "RAGDB_SERVE_CONFIG"
#: The shortest token accepted (a guessable token is refused when the server starts).
MIN_TOKEN_LENGTH = 16
MAX_LIST = 1000  # the largest page of GET /documents
MAX_ID = 2 ** 63 - 1  # the largest id or offset (SQLite's and PostgreSQL's 64-bit integers)


@dataclasses.dataclass(frozen=True)
class Grant:
    """What a token may do: read as ``principals`` (a tuple of labels, or :data:`ragdb.ALL`),
    whether it may write, and what (``scope``; None: :func:`~ragdb.serve.access.scope_for` its
    principals: the full view writes anything, a token with principals documents labelled with
    them only)."""

    principals: Any = ()
    write: bool = False
    scope: WriteScope | None = None

    @property
    def write_scope(self) -> WriteScope:
        return self.scope if self.scope is not None else scope_for(self.principals)


ANONYMOUS = Grant()


@dataclasses.dataclass(frozen=True)
class Limits:
    """Request limits: body size (bytes), k of a search or prompt, query length (characters);
    and of connections: how long a connection may take to send a request's headers (also: how
    long an idle connection is kept, seconds), to send its body (seconds), how long an idle
    keep-alive connection is kept after a response (seconds), and how many connections and
    requests in progress one worker holds at most (past that: 503)."""

    max_body_bytes: int = 4 * 1024 * 1024
    max_k: int = 100
    max_query_chars: int = 4000
    header_timeout: float = 10.0
    body_timeout: float = 30.0
    keep_alive: int = 5
    max_connections: int = 512


@dataclasses.dataclass(frozen=True)
class ServerConfig:
    """What each worker process needs to serve: the database file, whether it is opened
    read-only, the tokens file (read by each worker; secrets stay out of this value) and the limits."""

    database: str
    readonly: bool = False
    tokens_file: str | None = None
    limits: Limits = Limits()
    collection: str | None = None  #: the collection served (None: the default one)
    #: the Host header names answered (others: 400, against DNS rebinding); ``"*"`` among them: any
    allowed_hosts: tuple[str, ...] = ("127.0.0.1", "localhost", "[::1]")
    #: the browser origins allowed to read answers (CORS); none by default
    cors_origins: tuple[str, ...] = ()
    busy_timeout: float = 30.0  #: how long a write waits for another writer (then 503), seconds
    #: serve every collection of the file under ``/collections/NAME/`` (and let the administrator's
    #: token create and drop them), not only the served one
    collections: bool = False

    def to_json(self) -> str:
        return orjson.dumps(dataclasses.asdict(self)).decode()

    @classmethod
    def from_json(cls, text: str) -> ServerConfig:
        data = orjson.loads(text)
        return cls(database=data["database"], readonly=data["readonly"], tokens_file=data["tokens_file"],
                   limits=Limits(**data["limits"]), collection=data.get("collection"),
                   allowed_hosts=tuple(data["allowed_hosts"]), cors_origins=tuple(data["cors_origins"]),
                   busy_timeout=data["busy_timeout"], collections=data.get("collections", False))


#: The names of the loopback interface a Host header may carry.
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")


def default_allowed_hosts(host: str) -> tuple[str, ...]:
    """The Host header names a server bound to ``host`` answers by default: the bound address
    itself (``[...]`` for IPv6) and, for a loopback address, every loopback name; for a wildcard
    address (0.0.0.0, ::) the loopback names and this machine's host name (add the names clients
    use with ``--allowed-host``)."""
    names: list[str] = []
    if host in ("0.0.0.0", "::", ""):
        names += [*LOOPBACK_HOSTS, socket.gethostname().lower(), socket.getfqdn().lower()]
    else:
        names.append(f"[{host}]" if ":" in host else host.lower())
        if is_loopback(host):
            names += LOOPBACK_HOSTS
    return tuple(dict.fromkeys(names))


# --------------------------------------------------------------------------- tokens

def load_tokens(path: str | os.PathLike[str] | None = None, *,
                env: Mapping[str, str] | None = None) -> dict[str, Grant]:
    """The tokens the server accepts, each with its :class:`Grant`.

    ``path``: a JSON (``.json``) or TOML (other names) file mapping each token to
    ``{"principals": [labels...], "write": false}`` (``"all": true`` instead of
    principals: the full view); at least one of principals or all. ``"write"``:
    false, true (a token with principals writes documents labelled with them only;
    one with ``all`` writes anything) or a write scope, ``{"labels": [...],
    "public": false, "sources": ["prefix/", ...]}``: the labels its documents may
    carry (among its principals; default: all of them), whether it may write
    public (unlabelled) ones, and the source prefixes it may write under (default:
    any). Example::

        {"3f9c...a long random token": {"principals": ["team-a"], "write": false},
         "c2d8...a team's writer":     {"principals": ["team-a"], "write": {"sources": ["team-a/"]}},
         "b71e...another one":       {"all": true, "write": true}}

    ``env`` (default ``os.environ``): :data:`TOKEN_ENV`, when set, is one more
    token, with the full view and writes. A token shorter than
    :data:`MIN_TOKEN_LENGTH` characters, or with spaces, is refused."""
    env = os.environ if env is None else env
    tokens: dict[str, Grant] = {}
    if path is not None:
        where = os.fspath(path)
        try:
            raw = Path(where).read_bytes()
        except OSError as e:
            raise InvalidInput(f"tokens file {where}: {e.strerror or e}") from None
        data = _parse_tokens_file(where, raw)
        if not isinstance(data, Mapping) or not data:
            raise InvalidInput(f"tokens file {where}: expected a mapping of tokens to "
                               f'{{"principals": [...], "write": false}}')
        for n, (token, entry) in enumerate(data.items(), 1):
            tokens[_check_token(token, f"tokens file {where}, token {n}")] = \
                _grant(entry, f"tokens file {where}, token {n}")
    admin = env.get(TOKEN_ENV)
    if admin:
        tokens[_check_token(admin, TOKEN_ENV)] = Grant(principals=ragdb.ALL, write=True)
    return tokens


def _parse_tokens_file(where: str, raw: bytes) -> Any:
    raw = raw.removeprefix(codecs.BOM_UTF8)  # a UTF-8 byte order mark, as Windows editors write
    if where.endswith(".json"):
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError as e:
            raise InvalidInput(f"tokens file {where}: not valid JSON: {e}") from None
    try:
        import tomllib  # Python 3.11+
    except ImportError:  # pragma: no cover - Python 3.10
        raise InvalidInput(f"tokens file {where}: TOML needs Python 3.11 or later; write it as JSON "
                           f"(a name ending in .json)") from None
    try:
        return tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise InvalidInput(f"tokens file {where}: not valid TOML: {e}") from None
    except RecursionError:  # tomllib recurses once per nested array or inline table
        raise InvalidInput(f"tokens file {where}: not valid TOML: nested too deeply") from None


def _check_token(token: Any, where: str) -> str:
    if not isinstance(token, str) or len(token) < MIN_TOKEN_LENGTH or any(c.isspace() for c in token):
        raise InvalidInput(f"{where}: a token must be at least {MIN_TOKEN_LENGTH} characters without spaces "
                           f"(e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))')")
    return token


def _grant(entry: Any, where: str) -> Grant:
    if not isinstance(entry, Mapping):
        raise InvalidInput(f'{where}: expected {{"principals": [...], "write": false}}, got {entry!r}')
    unknown = sorted(set(entry) - {"principals", "all", "write"})
    if unknown:
        raise InvalidInput(f"{where}: unknown key{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))} "
                           f"(known: principals, all, write)")
    write, full = entry.get("write", False), entry.get("all", False)
    if not isinstance(full, bool):
        raise InvalidInput(f"{where}: all must be true or false, got {full!r}")
    if not isinstance(write, (bool, Mapping)):
        raise InvalidInput(f'{where}: write must be true, false or a scope {{"labels": [...], "public": false, '
                           f'"sources": [...]}}, got {write!r}')
    if full:
        if "principals" in entry:
            raise InvalidInput(f"{where}: all=true already sees everything: drop principals")
        principals: Any = ragdb.ALL
    else:
        labels = entry.get("principals")
        if not isinstance(labels, list) or not labels:
            raise InvalidInput(f"{where}: principals must be a non-empty list of labels (or all=true), "
                               f"got {labels!r}")
        principals = tuple(labels)
    if isinstance(write, Mapping):
        return Grant(principals=principals, write=True, scope=_scope(write, principals, where))
    return Grant(principals=principals, write=write)


def _scope(entry: Mapping[str, Any], principals: Any, where: str) -> WriteScope:
    unknown = sorted(set(entry) - {"labels", "public", "sources"})
    if unknown:
        raise InvalidInput(f"{where}: write: unknown key{'s' if len(unknown) > 1 else ''} "
                           f"{', '.join(map(repr, unknown))} (known: labels, public, sources)")
    default = scope_for(principals)
    labels, public, sources = entry.get("labels", default.labels), entry.get("public", False), \
        entry.get("sources", [])
    if labels is not ragdb.ALL:
        if not isinstance(labels, (list, tuple)) or not all(isinstance(a, str) and a for a in labels):
            raise InvalidInput(f"{where}: write.labels must be a list of labels, got {labels!r}")
        if principals is not ragdb.ALL and not set(labels) <= set(principals):
            outside = sorted(set(labels) - set(principals))
            raise InvalidInput(f"{where}: write.labels {outside} are not among its principals: a token writes "
                               f"nothing it cannot read")
        labels = tuple(labels)
    if not isinstance(public, bool):
        raise InvalidInput(f"{where}: write.public must be true or false, got {public!r}")
    if not isinstance(sources, list) or not all(isinstance(p, str) and p for p in sources):
        raise InvalidInput(f"{where}: write.sources must be a list of source prefixes, got {sources!r}")
    return WriteScope(labels=labels, public=public, sources=tuple(sources))


def _bearer(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer TOKEN`` header (None without the header)."""
    if header is None:
        return None
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise _Refused(401, "Unauthorized", "the Authorization header must be 'Bearer TOKEN'")
    return token.strip()


def _lookup(tokens: Mapping[str, Grant], token: str) -> Grant | None:
    """The grant of ``token``: every configured token is compared, each in constant time
    (:func:`hmac.compare_digest`), so the time taken says nothing about which, if any, matched."""
    given = token.encode("utf-8", "surrogatepass")
    found: Grant | None = None
    for known, grant in tokens.items():
        if hmac.compare_digest(given, known.encode("utf-8", "surrogatepass")):
            found = grant
    return found


# --------------------------------------------------------------------------- errors

class _Refused(Exception):
    """A request refused before it reaches the library (auth, body, routing)."""

    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status, self.kind, self.message = status, kind, message


def _error(status: int, kind: str, message: str, headers: Mapping[str, str] | None = None,
           param: str | None = None) -> Response:
    error: dict[str, Any] = {"status": status, "type": kind, "message": message}
    if param is not None:  # the argument at fault (InvalidInput.param)
        error["param"] = param
    body = {"error": error}
    return Response(orjson.dumps(body), status_code=status, media_type="application/json", headers=headers)


def _status_of(e: RagdbError) -> int:
    if isinstance(e, Unauthorized):
        return 401
    if isinstance(e, AccessDenied):  # WriteForbidden among them
        return 403
    if isinstance(e, (DocumentNotFound, CollectionNotFound)):
        return 404
    if isinstance(e, CollectionExists):
        return 409
    if isinstance(e, InvalidInput):
        return 422
    if isinstance(e, DatabaseBusy):
        return 503
    if isinstance(e, RemoteError):
        return 502
    return 500


def _json(obj: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(obj, option=orjson.OPT_NON_STR_KEYS), status_code=status,
                    media_type="application/json")


# --------------------------------------------------------------------------- the app

SEARCH_FIELDS = ("query", "k", "scorer", "filter", "min_score", "since", "until", "offset", "syntax", "fuzzy",
                 "highlight", "snippet_chars", "plan")
PROMPT_FIELDS = ("question", "k", "scorer", "filter", "min_confidence", "budget_tokens", "language")
FACETS_FIELDS = ("field", "query", "filter", "since", "until", "by", "limit")
FACETS_LIMIT = 100  # the default number of values of POST /facets (at most MAX_LIST)
ADD_FIELDS = ("text", "source", "metadata", "version", "timestamp", "title", "acl")
UPDATE_FIELDS = ("metadata", "acl")
GET_FIELDS = ("id", "source", "with_text")
QUERY_FIELDS = ("source", "glob", "filter", "versions", "limit", "offset")
COUNT_FIELDS = ("filter", "versions")
DELETE_FIELDS = ("source", "glob", "filter")
COLLECTION_FIELDS = ("name", "analyzer", "chunker", "keep_versions", "public_unlabeled")
MAX_BATCH = 1000  # the most documents of one POST /documents/batch


class _Service:
    """One worker's database and configuration; each method is one request's library work
    (called in the thread pool), on the collection the request names (:meth:`resolve`)."""

    def __init__(self, config: ServerConfig, tokens: Mapping[str, Grant]) -> None:
        self.config = config
        self.limits = config.limits
        self.tokens = dict(tokens)
        self.db: ragdb.Database | None = None
        self._embedders: dict[str, Any] = {}  #: by collection
        self._embedder_lock = threading.Lock()
        #: handles on the other collections of the file (``--collections``), made once each
        self._handles: dict[str, ragdb.Database] = {}
        self._handles_lock = threading.Lock()
        #: why the last request failed unexpectedly (an InternalError, a StorageError or a bug), until a
        #: request succeeds again: /healthz answers 503 with it, since the database cannot be served
        self.failure: str | None = None

    @property
    def writable(self) -> bool:
        return not self.config.readonly and any(g.write for g in self.tokens.values())

    def open(self) -> None:
        self.db = ragdb.open(self.config.database, readonly=self.config.readonly,
                             create=None if self.config.readonly else False, collection=self.config.collection,
                             busy_timeout=self.config.busy_timeout)

    def close(self) -> None:
        self._handles.clear()
        if self.db is not None:
            self.db.close()
            self.db = None

    @property
    def database(self) -> ragdb.Database:
        if self.db is None:
            raise _Refused(503, "Unavailable", "the database is not open (the server is starting or stopping)")
        return self.db

    def resolve(self, name: str | None) -> ragdb.Database:
        """The collection a request reads or writes: the served one (``name`` None, or its name),
        else, when the server serves every collection (``--collections``), collection ``name``
        (:class:`CollectionNotFound` if the file has none; a handle made once per worker)."""
        db = self.database
        if name is None or name == db.collection_name:
            return db
        if not self.config.collections:
            raise CollectionNotFound(f"no collection {name!r} is served here: this server serves "
                                     f"{db.collection_name!r} ('ragdb serve --collections' serves every "
                                     f"collection of the database)")
        with self._handles_lock:
            handle = self._handles.get(name)
            if handle is None:
                handle = self._handles[name] = db.collection(name, create=False)
            return handle

    def on(self, name: str | None, work: Callable[[ragdb.Database], Any]) -> Any:
        """``work`` on collection ``name`` (:meth:`resolve`). A handle made before the collection
        was dropped and made again (by another worker or process) raises
        :class:`CollectionNotFound` before doing anything: it is made again and ``work`` run once more."""
        db = self.resolve(name)
        try:
            return work(db)
        except CollectionNotFound:
            if db is self.database:
                raise
            self.forget(name)
            return work(self.resolve(name))

    def forget(self, name: str | None) -> None:
        """Drop the handle on collection ``name`` (dropped, perhaps by another worker) and its embedder."""
        if name is not None:
            with self._handles_lock:
                self._handles.pop(name, None)
            with self._embedder_lock:
                self._embedders.pop(name, None)

    def grant(self, request: Request) -> Grant:
        token = _bearer(request.headers.get("authorization"))
        if token is None:
            return ANONYMOUS
        grant = _lookup(self.tokens, token) if self.tokens else None
        if grant is None:
            raise _Refused(401, "Unauthorized", "unknown API token")
        return grant

    def writer(self, request: Request) -> Grant:
        if self.config.readonly:
            raise _Refused(403, "Forbidden", "writes are off: the server opened the database read-only")
        if not self.writable:
            raise _Refused(403, "Forbidden", f"writes are off: no token may write (set {TOKEN_ENV}, or give "
                                             f"a token write=true in the --tokens file)")
        if request.headers.get("authorization") is None:
            raise _Refused(401, "Unauthorized", "writing needs an API token: 'Authorization: Bearer TOKEN'")
        grant = self.grant(request)
        if not grant.write:
            raise _Refused(403, "Forbidden", "this API token may not write")
        return grant

    # -- library calls ----------------------------------------------------------------
    def _who(self, grant: Grant) -> Any:
        return ragdb.ALL if grant.principals is ragdb.ALL else (list(grant.principals) or None)

    def _search_keywords(self, db: ragdb.Database, body: Mapping[str, Any], grant: Grant,
                         fields: Sequence[str]) -> dict[str, Any]:
        kw: dict[str, Any] = {name: body[name] for name in fields if name in body and body[name] is not None}
        kw["principals"] = self._who(grant)
        if kw.get("scorer") in ("vector", "hybrid") and db.embedder is None:
            kw["embedder"] = self.recorded_embedder(db, kw["scorer"])
        return kw

    def recorded_embedder(self, db: ragdb.Database, scorer: str) -> Any:
        """The embedder of the model ``db``'s vectors were made with (each collection has its own)."""
        with self._embedder_lock:  # made once per worker and collection: a model may take a while to load
            embedder = self._embedders.get(db.collection_name)
            if embedder is None:
                embedder = db.recorded_embedder()
                if embedder is None:
                    raise InvalidInput(f"scorer {scorer!r} needs vectors, and this collection has none "
                                       f"(make them with 'ragdb embed')")
                self._embedders[db.collection_name] = embedder
            return embedder

    def _check_limits(self, text: Any, what: str, k: Any, offset: Any = 0) -> None:
        if not isinstance(text, str):
            raise InvalidInput(f"{what} must be a string, got {_brief(text)}")
        for name, value in (("k", k), ("offset", offset)):  # JSON's true is not a number (Python's is)
            if isinstance(value, bool):
                raise InvalidInput(f"{name} must be an integer, got {str(value).lower()}")
        if len(text) > self.limits.max_query_chars:
            raise InvalidInput(f"{what} is {len(text):,} characters long, over this server's limit of "
                               f"{self.limits.max_query_chars:,}")
        if isinstance(k, int) and not isinstance(k, bool) and k > self.limits.max_k:
            raise InvalidInput(f"k={k} is over this server's limit of {self.limits.max_k}")
        # a page ranks offset + k hits: the limit bounds that work too
        if all(isinstance(v, int) and not isinstance(v, bool) for v in (k, offset)) and offset + k > self.limits.max_k:
            raise InvalidInput(f"offset + k = {offset + k} is over this server's limit of {self.limits.max_k}")

    def search(self, db: ragdb.Database, body: Mapping[str, Any], grant: Grant) -> dict[str, Any]:
        _fields(body, SEARCH_FIELDS, required=("query",))
        self._check_limits(body["query"], "query", body.get("k", 5), body.get("offset"))
        kw = self._search_keywords(db, body, grant, SEARCH_FIELDS[2:-1])
        plan = body.get("plan", False)
        if not isinstance(plan, bool):
            raise InvalidInput(f"plan must be true or false, got {_brief(plan)}")
        if plan:  # the hits and how the query was read, from one snapshot
            hits, how = db.search_and_plan(body["query"], body.get("k", 5), **kw)
        else:
            hits = db.search(body["query"], body.get("k", 5), **kw)
        out: dict[str, Any] = {"query": body["query"],
                               "hits": [api_hit_json(h, i) for i, h in enumerate(hits, 1 + kw.get("offset", 0))]}
        if plan:
            out["plan"] = dataclasses.asdict(how)
        return out

    def prompt(self, db: ragdb.Database, body: Mapping[str, Any], grant: Grant) -> dict[str, Any]:
        _fields(body, PROMPT_FIELDS, required=("question",))
        self._check_limits(body["question"], "question", body.get("k"))
        if not body["question"].strip():
            raise InvalidInput("question must not be empty")
        kw = self._search_keywords(db, body, grant, ("scorer", "filter"))
        p = db.build_prompt(body["question"], k=body.get("k"), min_confidence=body.get("min_confidence"),
                            budget_tokens=body.get("budget_tokens"), language=body.get("language"), **kw)
        return {"refused": p.refused, "refusal": REFUSAL[p.language], "language": p.language, "system": p.system,
                "user": p.user, "messages": p.messages, "confidence": p.confidence,
                "min_confidence": p.min_confidence,
                "sources": [{"number": i, **api_hit_json(h, i)} for i, h in enumerate(p.sources, 1)]}

    def facets(self, db: ragdb.Database, body: Mapping[str, Any], grant: Grant) -> dict[str, Any]:
        _fields(body, FACETS_FIELDS, required=("field",))
        query = body.get("query")
        if query is not None:
            self._check_limits(query, "query", None)  # (no k)
        limit = body.get("limit", FACETS_LIMIT)
        if not (isinstance(limit, int) and not isinstance(limit, bool) and 1 <= limit <= MAX_LIST):
            raise InvalidInput(f"limit must be an integer from 1 to {MAX_LIST}, got {_brief(limit)} "
                               f"(omitted: how many values were left out)")
        kw = {name: body[name] for name in ("filter", "since", "until", "by") if body.get(name) is not None}
        return facets_json(db.facets(body["field"], query, limit=limit, principals=self._who(grant), **kw))

    def documents(self, db: ragdb.Database, params: Mapping[str, str], grant: Grant) -> dict[str, Any]:
        unknown = sorted(set(params) - {"prefix", "limit", "offset"})
        if unknown:
            raise InvalidInput(f"unknown query parameter{'s' if len(unknown) > 1 else ''} "
                               f"{', '.join(map(repr, unknown))} (known: prefix, limit, offset)")
        prefix = params.get("prefix", "")
        limit = _int_param(params, "limit", 100)
        offset = _int_param(params, "offset", 0)
        if not 1 <= limit <= MAX_LIST:
            raise InvalidInput(f"limit must be from 1 to {MAX_LIST}, got {limit}")
        docs = db.documents(glob_prefix(prefix) if prefix else None, glob=True, limit=limit + 1,
                            offset=offset, principals=self._who(grant))
        more = len(docs) > limit
        return {"documents": [document_json(d) for d in docs[:limit]],
                "next_offset": offset + limit if more else None}

    def query_documents(self, db: ragdb.Database, body: Mapping[str, Any], grant: Grant) -> dict[str, Any]:
        """The documents the caller may see matching ``source`` (a glob pattern unless ``glob`` is
        false) and ``filter``, by source, a page at a time (:meth:`ragdb.Database.documents`)."""
        _fields(body, QUERY_FIELDS, required=())
        limit = _int_field(body, "limit", 100, 1, MAX_LIST)
        offset = _int_field(body, "offset", 0, 0, MAX_ID)
        docs = db.documents(body.get("source"), glob=body.get("glob", True), versions=body.get("versions", "latest"),
                            filter=body.get("filter"), limit=limit + 1, offset=offset, principals=self._who(grant))
        more = len(docs) > limit
        return {"documents": [document_json(d) for d in docs[:limit]],
                "next_offset": offset + limit if more else None}

    def count(self, db: ragdb.Database, body: Mapping[str, Any], grant: Grant) -> dict[str, Any]:
        """How many documents the caller may see match ``filter`` (:meth:`ragdb.Database.count`)."""
        _fields(body, COUNT_FIELDS, required=())
        return {"count": db.count(versions=body.get("versions", "latest"), filter=body.get("filter"),
                                  principals=self._who(grant))}

    def document(self, db: ragdb.Database, doc_id: int, grant: Grant) -> dict[str, Any]:
        return document_json(db.get(doc_id, principals=self._who(grant)))

    def get(self, db: ragdb.Database, body: Mapping[str, Any], grant: Grant) -> dict[str, Any]:
        """One document by id, or the latest version of a source, if the caller may see it."""
        _fields(body, GET_FIELDS, required=())
        doc_id = body.get("id")
        if doc_id is not None:
            doc_id = _int_field(body, "id", 0, 1, MAX_ID)
        return document_json(db.get(doc_id, source=body.get("source"), with_text=body.get("with_text", True),
                                    principals=self._who(grant)))

    def stats(self, db: ragdb.Database, grant: Grant) -> dict[str, Any]:
        """The collection's statistics for a token with the full view; for any other caller
        only what it may see (its documents and chunks): the whole collection's counts would
        tell how much is hidden, and let it watch hidden writes."""
        who = self._who(grant)
        out: dict[str, Any]
        if who is ragdb.ALL:
            out = stats_json(db.stats())
            out["visible_documents"] = out["documents"]
        else:
            visible, chunks = self._visible(db, who)
            out = {"documents": visible, "chunks": chunks, "collection": db.collection_name,
                   "visible_documents": visible}
        out["writes_allowed"] = grant.write and not self.config.readonly
        out["version"] = ragdb.__version__
        return out

    @staticmethod
    def _visible(db: ragdb.Database, who: Any) -> tuple[int, int]:
        """The documents and chunks (latest versions) ``who`` may see."""
        return db.count(principals=who), db.facets("source", limit=1, principals=who).total

    def health(self, grant: Grant) -> dict[str, Any]:
        self.database.count(principals=ragdb.ALL)  # the file is readable
        if self.failure is not None:  # ... but the last request failed where it should not have
            raise _Refused(503, "Unhealthy", f"the database cannot be served: {self.failure}")
        out: dict[str, Any] = {"status": "ok", "version": ragdb.__version__}
        if grant.principals is ragdb.ALL:  # the administrator's: which worker answered
            out["pid"] = os.getpid()
        return out

    def _record(self, item: Mapping[str, Any], where: str) -> dict[str, Any]:
        """An add's record: its fields checked, its source derived from the text when not given
        (as the library derives it), so that the write is checked against the source it writes."""
        _fields(item, ADD_FIELDS, required=("text",))
        record = {name: item[name] for name in ADD_FIELDS if name in item}
        source = record.get("source")
        if source is None and isinstance(record["text"], str):
            record["source"] = source = derived_source(record["text"])
        if not isinstance(source, str) or not source:
            raise InvalidInput(f"{where}source must be a non-empty string, got {_brief(source)}")
        if not isinstance(record.get("metadata", {}), dict):
            raise InvalidInput(f"{where}metadata must be a JSON object, got {_brief(record['metadata'])}")
        return record

    def add(self, db: ragdb.Database, body: Mapping[str, Any], grant: Grant) -> dict[str, Any]:
        record = self._record(body, "")
        with db.transaction():
            check_write(db, self._who(grant), grant.write_scope, holder="this token", source=record["source"],
                        acl=record.get("acl"), new=True)
            report = db.add_many([record])
        return {**_change(report.changes[0]), "embedded": report.embedded, "reused": report.reused}

    def add_batch(self, db: ragdb.Database, body: Mapping[str, Any], grant: Grant) -> dict[str, Any]:
        """Add (or replace) many documents in one transaction: each checked as :meth:`add` checks
        one, and none written unless every one may be."""
        _fields(body, ("documents",), required=("documents",))
        docs = body["documents"]
        if not isinstance(docs, list) or not 1 <= len(docs) <= MAX_BATCH:
            raise InvalidInput(f"documents must be a list of 1 to {MAX_BATCH} documents, got {_brief(docs)}")
        records = []
        for n, item in enumerate(docs):
            if not isinstance(item, dict):
                raise InvalidInput(f"documents[{n}] must be a JSON object, got {_brief(item)}")
            records.append(self._record(_normalized(item), f"documents[{n}]: "))
        check_distinct_sources(records, "documents", named_by="source")
        with db.transaction():
            for record in records:
                check_write(db, self._who(grant), grant.write_scope, holder="this token", source=record["source"],
                            acl=record.get("acl"), new=True)
            report = db.add_many(records)
        return {"documents": [_change(c) for c in report.changes], "embedded": report.embedded,
                "reused": report.reused}

    def update(self, db: ragdb.Database, doc_id: int, body: Mapping[str, Any], grant: Grant) -> dict[str, Any]:
        """Change a document's metadata and/or labels in place (:meth:`ragdb.Database.update`)."""
        _fields(body, UPDATE_FIELDS, required=())
        if not body:
            raise InvalidInput("give metadata and/or acl to change")
        if not isinstance(body.get("metadata", {}), dict):
            raise InvalidInput(f"metadata must be a JSON object, got {_brief(body['metadata'])}")
        with db.transaction():
            check_write(db, self._who(grant), grant.write_scope, holder="this token", doc_id=doc_id,
                        acl=body.get("acl"))
            return document_json(db.update(doc_id, metadata=body.get("metadata"), acl=body.get("acl")))

    def delete(self, db: ragdb.Database, doc_id: int, grant: Grant) -> dict[str, Any]:
        with db.transaction():
            check_write(db, self._who(grant), grant.write_scope, holder="this token", doc_id=doc_id)
            return {"deleted": db.delete(doc_id)}

    def delete_matching(self, db: ragdb.Database, body: Mapping[str, Any], grant: Grant) -> dict[str, Any]:
        """Delete every version of ``source`` (a glob pattern with ``glob``) and/or every document
        matching ``filter`` (:meth:`ragdb.Database.delete`), of those the caller may see: one it
        cannot see is left alone and not counted, exactly as if it did not exist; one it sees but
        may not write refuses the whole delete (403). One transaction."""
        _fields(body, DELETE_FIELDS, required=())
        source, glob, filt = body.get("source"), body.get("glob", False), body.get("filter")
        if source is None and filt is None:
            raise InvalidInput("delete: give source and/or filter (one document: DELETE /documents/{id})")
        who, scope = self._who(grant), grant.write_scope
        with db.transaction():
            if who is ragdb.ALL and scope.unbounded:  # the full view, writing anything: the library's delete
                return {"deleted": db.delete(source=source, glob=glob, filter=filt)}
            if isinstance(filt, Mapping) and not filt:
                raise InvalidInput("delete: filter={} matches every document; give a condition")
            if not isinstance(glob, bool):
                raise InvalidInput(f"delete: glob must be true or false, got {_brief(glob)}")
            docs = db.documents(source, glob=glob, versions="all", filter=filt, principals=who)
            for d in docs:
                check_write(db, who, scope, holder="this token", doc_id=d.id)
            return {"deleted": sum(db.delete(d.id) for d in docs)}

    # -- collections ----------------------------------------------------------------------
    def collection_json(self, db: ragdb.Database, info: CollectionInfo, grant: Grant) -> dict[str, Any]:
        out = dataclasses.asdict(info)
        who = self._who(grant)
        if who is not ragdb.ALL:  # what the caller may see of it, as /stats counts
            out["documents"], out["chunks"] = self._visible(db, who)
        return out

    def collections(self, grant: Grant) -> dict[str, Any]:
        """The collections served (every one of the file with ``--collections``), each with the
        documents and chunks the caller may see."""
        db = self.database
        out = []
        for info in db.collections():
            if self.config.collections or info.name == db.collection_name:
                out.append(self.collection_json(self.resolve(info.name), info, grant))
        return {"collections": out}

    def collection_info(self, name: str, grant: Grant) -> dict[str, Any]:
        handle = self.resolve(name)
        for info in self.database.collections():
            if info.name == handle.collection_name:
                return self.collection_json(handle, info, grant)
        raise CollectionNotFound(f"no collection {name!r}")

    def _administrator(self, grant: Grant, what: str) -> None:
        if not self.config.collections:
            raise _Refused(403, "Forbidden", f"this server serves one collection; 'ragdb serve --collections' "
                                             f"lets the administrator's token {what}")
        if not (grant.principals is ragdb.ALL and grant.write_scope.unbounded):
            raise AccessDenied(f"only a token with the full view that writes anything may {what}")

    def create_collection(self, body: Mapping[str, Any], grant: Grant) -> dict[str, Any]:
        self._administrator(grant, "create a collection")
        _fields(body, COLLECTION_FIELDS, required=("name",))
        name = body["name"]
        if isinstance(name, str) and "/" in name:
            raise InvalidInput(f"collection name {name!r} holds '/': it could not be named in a URL")
        handle = self.database.create_collection(name, **{k: body[k] for k in COLLECTION_FIELDS[1:] if k in body})
        with self._handles_lock:
            self._handles[handle.collection_name] = handle
        return self.collection_info(handle.collection_name, grant)

    def drop_collection(self, name: str, grant: Grant) -> dict[str, Any]:
        self._administrator(grant, "drop a collection")
        if name == self.database.collection_name:
            raise InvalidInput(f"collection {name!r} is the one this server serves: it cannot be dropped here")
        self.forget(name)
        self.database.drop_collection(name)
        return {"dropped": name}


def derived_source(text: str) -> str:
    """The source the library gives a document added without one (its text's hash)."""
    return f"sha256:{hashlib.sha256(text.encode('utf-8', 'surrogatepass')).hexdigest()[:16]}"


def api_hit_json(h: ragdb.Hit, rank: int) -> dict[str, Any]:
    """A hit as the HTTP API gives it: :func:`hit_json` with the hit's title and section."""
    return {**hit_json(h, rank), "title": h.title, "section": h.section}


def _change(c: ragdb.Change) -> dict[str, Any]:
    d = c.document
    return {"status": c.status, "id": d.id, "source": d.source, "version": d.version, "chunks": d.chunk_count,
            "previous": c.previous, "document": document_json(d)}


def _int_field(body: Mapping[str, Any], name: str, default: int, low: int, high: int) -> int:
    value = body.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(f"{name} must be an integer, got {_brief(value)}")
    if not low <= value <= high:
        raise InvalidInput(f"{name} must be from {low} to {high}, got {value}")
    return value


def glob_prefix(prefix: str) -> str:
    """A GLOB pattern (the rule of :meth:`ragdb.Database.documents`) matching sources that start
    with ``prefix`` literally."""
    return escape_glob(prefix) + "*"


def _brief(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


INTEGER_FIELDS = frozenset({"k", "offset", "snippet_chars", "budget_tokens", "limit", "fuzzy", "id"})


def _normalized(body: Mapping[str, Any]) -> dict[str, Any]:
    """A request body as the schema reads it: a field given as null is a field not given, and a
    whole number written as a float (``5.0``, a JSON Schema integer) is that integer."""
    out = {}
    for name, value in body.items():
        if value is None:
            continue
        if name in INTEGER_FIELDS and isinstance(value, float) and value.is_integer() and abs(value) < 2 ** 63:
            value = int(value)
        out[name] = value
    return out


def _fields(body: Mapping[str, Any], known: Sequence[str], required: Sequence[str]) -> None:
    if "principals" in body:
        raise InvalidInput("principals cannot be given in a request: they come from the API token "
                           "(no token: an anonymous caller, who sees public documents only)")
    unknown = sorted(set(body) - set(known))
    if unknown:
        raise InvalidInput(f"unknown field{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))} "
                           f"(known: {', '.join(known)})")
    missing = [name for name in required if name not in body]
    if missing:
        raise InvalidInput(f"missing field{'s' if len(missing) > 1 else ''} {', '.join(map(repr, missing))}")


def _int_param(params: Mapping[str, str], name: str, default: int) -> int:
    text = params.get(name)
    if text is None:
        return default
    # ASCII digits only: int() also takes "٥", " 5 ", "+5" and "5_0" (fifty)
    if not (text.isascii() and text.isdigit() or text[:1] == "-" and text[1:].isascii() and text[1:].isdigit()):
        raise InvalidInput(f"{name} must be an integer, got {text!r}")
    value = int(text, 10)
    if value < 0:
        raise InvalidInput(f"{name} must not be negative, got {value}")
    return value


async def _body(request: Request, limit: int, timeout: float) -> dict[str, Any]:
    """The request's JSON object, read at most ``limit`` bytes far, within ``timeout`` seconds
    (a client trickling its body holds a connection and a task: 408)."""
    try:
        with anyio.fail_after(timeout):
            return await _read_body(request, limit)
    except TimeoutError:
        raise _Refused(408, "RequestTimeout", f"the request body was not sent within {timeout:g} s") from None


async def _read_body(request: Request, limit: int) -> dict[str, Any]:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _Refused(413, "PayloadTooLarge", f"request body of {int(declared):,} bytes is over this server's "
                                               f"limit of {limit:,} bytes")
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise _Refused(413, "PayloadTooLarge", f"request body is over this server's limit of {limit:,} bytes")
            chunks.append(chunk)
    except ClientDisconnect:
        raise _Refused(400, "BadRequest", "the client went away before sending the whole body") from None
    try:
        data = loads_exact(b"".join(chunks))
    except orjson.JSONDecodeError as e:
        raise _Refused(400, "BadRequest", f"request body is not JSON: {e}") from None
    if not isinstance(data, dict):
        raise _Refused(400, "BadRequest", f"request body must be a JSON object, got {type(data).__name__}")
    return _normalized(data)


def create_app(config: ServerConfig, tokens: Mapping[str, Grant] | None = None) -> Starlette:
    """The ASGI app serving ``config.database``: it opens the database when it starts
    (lifespan) and closes it when it stops. ``tokens``: default :func:`load_tokens` of
    ``config.tokens_file`` (and :data:`TOKEN_ENV`), read now."""
    service = _Service(config, load_tokens(config.tokens_file) if tokens is None else tokens)

    def endpoint(work: Callable[[Request, Grant], Any], *, write: bool = False,
                 status: int = 200) -> Callable[[Request], Any]:
        async def handle(request: Request) -> Response:
            try:
                grant = service.writer(request) if write else service.grant(request)
                result = await work(request, grant)
            except _Refused as e:
                headers = {"WWW-Authenticate": "Bearer"} if e.status == 401 else None
                return _error(e.status, e.kind, e.message, headers)
            except (InternalError, StorageError) as e:  # the database cannot serve: logged, /healthz says so
                log.exception("%s on %s %s", type(e).__name__, request.method, request.url.path)
                service.failure = f"{type(e).__name__} on {request.method} {request.url.path}"
                if isinstance(e, InternalError):  # a bug's details stay in the log
                    return _error(500, "InternalError", "internal server error")
                return _error(500, type(e).__name__, client_message(e, database=config.database))
            except RagdbError as e:
                if isinstance(e, CollectionNotFound):  # dropped (perhaps by another worker): made again next time
                    service.forget(request.path_params.get("collection"))
                return _error(_status_of(e), type(e).__name__, client_message(e, database=config.database),
                              param=e.param if isinstance(e, InvalidInput) else None)
            except Exception:  # a bug: logged, answered without its details
                log.exception("internal error on %s %s", request.method, request.url.path)
                service.failure = f"internal error on {request.method} {request.url.path}"
                return _error(500, "InternalError", "internal server error")
            service.failure = None
            return _json(result, status)
        return handle

    limit = config.limits.max_body_bytes

    def on_body(method: Callable[[ragdb.Database, Mapping[str, Any], Grant], Any]
                ) -> Callable[[Request, Grant], Any]:
        """A request whose body is a JSON object, worked on the collection the path names."""
        async def work(request: Request, grant: Grant) -> Any:
            body = await _body(request, limit, config.limits.body_timeout)
            name = request.path_params.get("collection")
            return await run_in_threadpool(service.on, name, lambda db: method(db, body, grant))
        return work

    def on_id(method: Callable[..., Any], with_body: bool = False) -> Callable[[Request, Grant], Any]:
        """A request on one document (``/documents/{id}``), with its JSON body or none."""
        async def work(request: Request, grant: Grant) -> Any:
            extra = (await _body(request, limit, config.limits.body_timeout),) if with_body else ()
            name, doc_id = request.path_params.get("collection"), request.path_params["doc_id"]
            return await run_in_threadpool(service.on, name, lambda db: method(db, doc_id, *extra, grant))
        return work

    async def list_documents(request: Request, grant: Grant) -> Any:
        name, params = request.path_params.get("collection"), dict(request.query_params)
        return await run_in_threadpool(service.on, name, lambda db: service.documents(db, params, grant))

    async def stats(request: Request, grant: Grant) -> Any:
        name = request.path_params.get("collection")
        return await run_in_threadpool(service.on, name, lambda db: service.stats(db, grant))

    async def collections(request: Request, grant: Grant) -> Any:
        return await run_in_threadpool(service.collections, grant)

    async def collection_info(request: Request, grant: Grant) -> Any:
        return await run_in_threadpool(service.collection_info, request.path_params["collection"], grant)

    async def create_collection(request: Request, grant: Grant) -> Any:
        body = await _body(request, limit, config.limits.body_timeout)
        return await run_in_threadpool(service.create_collection, body, grant)

    async def drop_collection(request: Request, grant: Grant) -> Any:
        return await run_in_threadpool(service.drop_collection, request.path_params["collection"], grant)

    def by_method(**handlers: Callable[[Request], Any]) -> Callable[[Request], Any]:
        async def handle(request: Request) -> Response:
            method = "GET" if request.method == "HEAD" else request.method
            return await handlers[method](request)  # (the route admits only these methods)
        return handle

    async def healthz(request: Request) -> Response:
        try:
            return _json(await run_in_threadpool(service.health, service.grant(request)))
        except _Refused as e:
            return _error(e.status, e.kind, e.message)
        except RagdbError as e:
            return _error(503, type(e).__name__, client_message(e, database=config.database))

    async def openapi(request: Request) -> Response:
        return _json(openapi_schema(config.limits))

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        kind = {404: "NotFound", 405: "MethodNotAllowed"}.get(exc.status_code, "HTTPError")
        message = f"no endpoint {request.method} {request.url.path}" if exc.status_code in (404, 405) \
            else str(exc.detail)
        return _error(exc.status_code, kind, message, exc.headers)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await run_in_threadpool(service.open)  # this process's own connection
        try:
            yield
        finally:
            await run_in_threadpool(service.close)

    # the routes of one collection: at the root for the served one, under /collections/NAME for any
    collection_routes = [
        Route("/search", endpoint(on_body(service.search)), methods=["POST"]),
        Route("/prompt", endpoint(on_body(service.prompt)), methods=["POST"]),
        Route("/facets", endpoint(on_body(service.facets)), methods=["POST"]),
        # one route per path, so that a 405's Allow header lists every method of the path
        Route("/documents", by_method(GET=endpoint(list_documents),
                                      POST=endpoint(on_body(service.add), write=True, status=201)),
              methods=["GET", "POST"]),
        Route("/documents/batch", endpoint(on_body(service.add_batch), write=True, status=201), methods=["POST"]),
        Route("/documents/get", endpoint(on_body(service.get)), methods=["POST"]),
        Route("/documents/query", endpoint(on_body(service.query_documents)), methods=["POST"]),
        Route("/documents/count", endpoint(on_body(service.count)), methods=["POST"]),
        Route("/documents/delete", endpoint(on_body(service.delete_matching), write=True), methods=["POST"]),
        Route("/documents/{doc_id:int}", by_method(GET=endpoint(on_id(service.document)),
                                                   PATCH=endpoint(on_id(service.update, with_body=True), write=True),
                                                   DELETE=endpoint(on_id(service.delete), write=True)),
              methods=["GET", "PATCH", "DELETE"]),
        Route("/stats", endpoint(stats), methods=["GET"]),
    ]
    routes = [
        *collection_routes,
        Route("/collections", by_method(GET=endpoint(collections),
                                        POST=endpoint(create_collection, write=True, status=201)),
              methods=["GET", "POST"]),
        Route("/collections/{collection}", by_method(GET=endpoint(collection_info),
                                                     DELETE=endpoint(drop_collection, write=True)),
              methods=["GET", "DELETE"]),
        Mount("/collections/{collection}", routes=collection_routes),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/openapi.json", openapi, methods=["GET"]),
    ]
    middleware = [Middleware(TrustedHostMiddleware, allowed_hosts=list(config.allowed_hosts), www_redirect=False)]
    if config.cors_origins:
        middleware.append(Middleware(CORSMiddleware, allow_origins=list(config.cors_origins),
                                     allow_methods=["GET", "POST", "PATCH", "DELETE"],
                                     allow_headers=["Authorization", "Content-Type"]))
    return Starlette(routes=routes, lifespan=lifespan, middleware=middleware,
                     exception_handlers={HTTPException: http_error})


def app_from_environment() -> Starlette:
    """The app factory uvicorn calls in each worker process: the :class:`ServerConfig` that
    :func:`run` put in :data:`CONFIG_ENV`."""
    text = os.environ.get(CONFIG_ENV)
    if not text:
        raise InvalidInput(f"{CONFIG_ENV} is not set: start the server with 'ragdb serve'")
    return create_app(ServerConfig.from_json(text))


# --------------------------------------------------------------------------- running it

def check_config(config: ServerConfig) -> dict[str, Grant]:
    """Read the tokens and check each one's principals against the database (a bad label
    fails here, when the server starts, not at a request); returns the tokens."""
    tokens = load_tokens(config.tokens_file)
    with ragdb.open(config.database, readonly=config.readonly, create=None if config.readonly else False,
                    collection=config.collection) as db:
        for grant in tokens.values():
            db.count(principals=ragdb.ALL if grant.principals is ragdb.ALL else list(grant.principals))
    return tokens


class UvicornConfig(uvicorn.Config):
    """uvicorn's ``Config``, binding its TCP socket with ``proto=IPPROTO_TCP``.

    uvicorn binds the socket it hands to its worker processes (``workers > 1``)
    with proto 0; accepted connections inherit it, and asyncio then leaves
    Nagle's algorithm on (it sets TCP_NODELAY only for IPPROTO_TCP sockets), so
    on Linux every keep-alive request after the first waits ~40 ms for the
    client's delayed ACK (uvicorn issue #3149, open as of uvicorn 0.54). Binding
    the socket here, as uvicorn does but with the protocol named, avoids that."""

    header_timeout: float | None = None  #: read by :class:`HeaderTimeoutProtocol`

    def bind_socket(self) -> socket.socket:
        if self.uds is not None or self.fd is not None:
            return super().bind_socket()
        family = socket.AF_INET6 if self.host and ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host, self.port))
        except OSError:
            sock.close()
            raise
        sock.set_inheritable(True)
        return sock


class HeaderTimeoutProtocol(H11Protocol):
    """uvicorn's h11 protocol, closing a connection that has not sent a whole request head
    within the config's ``header_timeout`` seconds of connecting or of its last response.

    uvicorn (0.55) closes an idle keep-alive connection only after a response, and has no
    timeout on reading a request's headers: a connection that never sends anything, or
    trickles its headers a byte at a time, stays open forever, and ~1,000 of them exhaust
    the process's file descriptors. A request whose head has arrived is the app's (its body
    has ``Limits.body_timeout``)."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_header_timeout()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm_header_timeout()

    def _arm_header_timeout(self) -> None:
        timeout = getattr(self.config, "header_timeout", None)
        if timeout and not self.transport.is_closing():
            self.loop.call_later(timeout, self._header_deadline, self.cycle)

    def _header_deadline(self, cycle: Any) -> None:
        # no new request head since the timer was set (the cycle is the same one, or none)
        if self.cycle is cycle and (cycle is None or cycle.response_complete) and not self.transport.is_closing():
            self.transport.close()


def raise_open_files_limit() -> tuple[int, int] | None:
    """Raise this process's soft limit on open files to its hard limit (as Go's runtime does
    for every server since 1.19), before serving: under the common soft ``ulimit -n 1024``,
    1,100 idle connections used every descriptor and ``accept()`` failed (EMFILE) for every
    later client, the header timeout never freeing them (issue 32, item 10). Returns the
    (soft, hard) limits after, or None where the platform has no such limit (Windows)."""
    try:
        import resource
    except ImportError:  # pragma: no cover - Windows
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard_cap = 1 << 20  # macOS and some kernels refuse "infinity" as a soft limit
    else:
        hard_cap = hard
    if soft != resource.RLIM_INFINITY and soft < hard_cap:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard_cap, hard))
        except (ValueError, OSError):  # pragma: no cover - a kernel cap below the hard limit
            pass
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def run(config: ServerConfig, *, host: str = "127.0.0.1", port: int = 8000, workers: int = 1,
        access_log: bool = False) -> None:
    """Serve until stopped, with uvicorn: ``workers`` processes, each importing
    :func:`app_from_environment` and opening its own connection. Binding a host other
    than loopback is the caller's decision (``ragdb serve`` asks for --allow-remote).
    A server that could not start raises :class:`~ragdb.errors.RagdbError` (uvicorn
    logged why); a port in use raises :class:`OSError`."""
    from uvicorn.supervisors import Multiprocess

    os.environ[CONFIG_ENV] = config.to_json()  # inherited by uvicorn's worker processes
    limits = config.limits
    raise_open_files_limit()
    settings = UvicornConfig("ragdb.serve.http_api:app_from_environment", factory=True, host=host, port=port,
                             workers=workers, log_level="warning", access_log=access_log, server_header=False,
                             http=HeaderTimeoutProtocol, limit_concurrency=limits.max_connections,
                             timeout_keep_alive=limits.keep_alive)
    settings.header_timeout = limits.header_timeout
    try:
        if workers > 1:
            Multiprocess(settings, sockets=[settings.bind_socket()]).run()
            return
        server = uvicorn.Server(settings)
        server.run()
    except KeyboardInterrupt:
        return
    if not server.started:
        raise RagdbError("the server did not start (see uvicorn's messages above)")


# --------------------------------------------------------------------------- the OpenAPI schema

def _request(properties: Mapping[str, Any], required: Sequence[str] = ()) -> dict[str, Any]:
    """A request body's schema: like :func:`_obj`, each optional field also taking null (not given)."""
    props: dict[str, Any] = {}
    for name, schema in properties.items():
        if name not in required and "type" in schema:
            types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
            schema = {**schema, "type": [*types, "null"]}
            if "enum" in schema:
                schema["enum"] = [*schema["enum"], None]
        props[name] = schema
    return _obj(props, required)


def _obj(properties: Mapping[str, Any], required: Sequence[str] = ()) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "object", "properties": dict(properties), "additionalProperties": False}
    if required:
        out["required"] = list(required)
    return out


def openapi_schema(limits: Limits = Limits()) -> dict[str, Any]:
    """The API's OpenAPI 3.1 description (served at ``GET /openapi.json``). Written by hand:
    Starlette's schema generator only collects YAML from docstrings, and this keeps the
    request bodies' limits next to the code that enforces them."""
    any_obj = {"type": "object"}
    nullable_str = {"type": ["string", "null"]}
    scorer = {"type": "string", "enum": ["bm25", "tfidf", "vector", "hybrid"], "default": "bm25"}
    k = {"type": "integer", "minimum": 1, "maximum": limits.max_k}
    filt = {"type": "object", "description": 'Keep documents matching every key: "source" (a glob), "version", '
                                             '"timestamp", "tags" or a metadata key; a list value means any of '
                                             'them; a mapping of operators ($eq $ne $gt $gte $lt $lte $in $nin '
                                             '$exists $not) compares, and $and/$or/$not/$contains stand where keys '
                                             'do (README: Filters).'}
    span = {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 2}
    when = {"type": ["string", "number"], "format": "date-time",
            "description": "An ISO-8601 date and time (2026-11-01T09:30:00Z; without a zone: UTC), or epoch "
                           "seconds."}
    text = {"type": "string", "minLength": 1, "pattern": "\\S"}  # not empty, not only spaces
    versions = {"type": "string", "enum": ["latest", "all"], "default": "latest"}
    hit = _obj({"rank": {"type": "integer"}, "source": {"type": "string"}, "doc_id": {"type": "integer"},
                "chunk_id": {"type": "integer"}, "version": nullable_str, "timestamp": nullable_str,
                "start": {"type": "integer"}, "end": {"type": "integer"}, "ordinal": {"type": "integer"},
                "score": {"type": "number"}, "confidence": {"type": ["number", "null"]}, "text": {"type": "string"},
                "metadata": any_obj,
                "highlights": {"type": "array", "items": span,
                               "description": "Spans of the query's terms and phrases in text (with highlight)."},
                "snippet": _obj({"text": {"type": "string"}, "start": {"type": "integer"}, "end": {"type": "integer"},
                                 "highlights": {"type": "array", "items": span}}),
                "title": nullable_str, "section": nullable_str,
                "explain": {"type": "object", "additionalProperties": {"type": "number"}},
                "duplicates": {"type": "array", "items": any_obj}})
    document = _obj({"id": {"type": "integer"}, "source": {"type": "string"}, "version": nullable_str,
                     "timestamp": nullable_str, "content_hash": {"type": "string"}, "metadata": any_obj,
                     "acl": {"type": "array", "items": {"type": "string"}}, "chunks": {"type": "integer"},
                     "latest": {"type": "boolean"}, "text": {"type": "string"}})
    error = _obj({"error": _obj({"status": {"type": "integer"}, "type": {"type": "string"},
                                 "message": {"type": "string"},
                                 "param": {"type": "string", "description": "The argument at fault, where one "
                                                                            "is (invalid input)."}},
                                ["status", "type", "message"])}, ["error"])
    schemas = {
        "SearchRequest": _request({"query": {"type": "string", "maxLength": limits.max_query_chars},
                               "k": {**k, "default": 5}, "offset": {"type": "integer", "minimum": 0, "default": 0,
                                                                    "description": "Skip this many hits (a later "
                                                                                   "page; offset + k at most "
                                                                                   f"{limits.max_k})."},
                               "scorer": scorer, "filter": filt,
                               "min_score": {"type": "number"}, "since": when, "until": when,
                               "syntax": {"type": "string", "enum": ["query", "plain"], "default": "query",
                                          "description": "query: the query language (\"phrases\", -exclude, "
                                                         "+require, OR, prefix*, word~, field:, ^boost); plain: "
                                                         "words only."},
                               "fuzzy": {"type": "integer", "enum": [0, 1], "default": 0},
                               "highlight": {"type": "boolean", "default": False,
                                             "description": "Add highlights and a snippet to each hit."},
                               "snippet_chars": {"type": "integer", "minimum": 1, "default": 240},
                               "plan": {"type": "boolean", "default": False,
                                        "description": "Also say how the query was read (plan: "
                                                       "db.query_plan's terms, phrases, unknown words, "
                                                       "suggestions)."}}, ["query"]),
        "SearchResult": _obj({"query": {"type": "string"}, "hits": {"type": "array", "items": _ref("Hit")},
                              "plan": any_obj}),
        "Hit": hit,
        "PromptRequest": _request({"question": {**text, "maxLength": limits.max_query_chars},
                               "k": {**k, "default": 5}, "scorer": scorer, "filter": filt,
                               "min_confidence": {"type": "number", "minimum": 0, "maximum": 1},
                               "budget_tokens": {"type": "integer", "minimum": 0},
                               "language": {"type": "string", "enum": ["en", "zh"]}}, ["question"]),
        "Prompt": _obj({"refused": {"type": "boolean"}, "refusal": {"type": "string"}, "language": {"type": "string"},
                        "system": {"type": "string"}, "user": {"type": "string"},
                        "messages": {"type": "array", "items": any_obj},
                        "confidence": {"type": ["number", "null"]}, "min_confidence": {"type": "number"},
                        "sources": {"type": "array", "items": any_obj}}),
        "FacetsRequest": _request({"field": {"type": "string", "minLength": 1,
                                             "description": 'A metadata key, or "source" or "version".'},
                               "query": {"type": "string", "maxLength": limits.max_query_chars,
                                         "description": "Count only the chunks the query's search returns "
                                                        "(all of them); without it, everything the filters keep."},
                               "filter": filt, "since": when, "until": when,
                               "by": {"type": "string", "enum": ["chunks", "documents"], "default": "chunks"},
                               "limit": {"type": "integer", "minimum": 1, "maximum": MAX_LIST,
                                         "default": FACETS_LIMIT}}, ["field"]),
        "Facets": _obj({"field": {"type": "string"}, "by": {"type": "string"},
                        "total": {"type": "integer", "description": "Chunks (documents) matched."},
                        "missing": {"type": "integer", "description": "Of those, how many have no value."},
                        "omitted": {"type": "integer", "description": "Distinct values left out by limit."},
                        "values": {"type": "array", "items": _obj({"value": {"type": ["string", "number"]},
                                                                   "count": {"type": "integer"}})}}),
        "Document": document,
        "DocumentList": _obj({"documents": {"type": "array", "items": _ref("Document")},
                              "next_offset": {"type": ["integer", "null"]}}),
        "AddRequest": _request({"text": text,
                                "source": {"type": "string", "minLength": 1,
                                           "description": "Omitted: derived from the text's hash (sha256:...)."},
                                "metadata": any_obj, "version": {"type": ["string", "number"]}, "timestamp": when,
                                "title": {"type": "string"},
                                "acl": {"type": "array", "items": {"type": "string", "minLength": 1}}},
                               ["text"]),
        "AddResult": _obj({"status": {"type": "string", "enum": ["added", "replaced", "unchanged"]},
                           "id": {"type": "integer"}, "source": {"type": "string"}, "version": nullable_str,
                           "chunks": {"type": "integer"}, "previous": {"type": ["integer", "null"]},
                           "document": _ref("Document"), "embedded": {"type": "integer"},
                           "reused": {"type": "integer"}}),
        "BatchRequest": _obj({"documents": {"type": "array", "items": _ref("AddRequest"), "minItems": 1,
                                            "maxItems": MAX_BATCH}}, ["documents"]),
        "BatchResult": _obj({"documents": {"type": "array", "items": _ref("AddResult")},
                             "embedded": {"type": "integer", "description": "Chunks given a vector."},
                             "reused": {"type": "integer", "description": "New chunks that took a stored vector."}}),
        "GetRequest": _request({"id": {"type": "integer", "minimum": 1, "maximum": MAX_ID},
                                "source": {"type": "string", "minLength": 1},
                                "with_text": {"type": "boolean", "default": True}}),
        "QueryRequest": _request({"source": {"type": "string",
                                             "description": "Sources matching this glob pattern (with glob "
                                                            "false: this source)."},
                                  "glob": {"type": "boolean", "default": True}, "filter": filt, "versions": versions,
                                  "limit": {"type": "integer", "minimum": 1, "maximum": MAX_LIST, "default": 100},
                                  "offset": {"type": "integer", "minimum": 0, "maximum": MAX_ID, "default": 0}}),
        "CountRequest": _request({"filter": filt, "versions": versions}),
        "Count": _obj({"count": {"type": "integer"}}),
        "DeleteRequest": _request({"source": {"type": "string",
                                              "description": "Every version of this source (with glob: of the "
                                                             "sources matching this pattern)."},
                                   "glob": {"type": "boolean", "default": False}, "filter": filt}),
        "Collection": _obj({"name": {"type": "string"},
                            "documents": {"type": "integer", "description": "Latest documents the caller may see."},
                            "chunks": {"type": "integer"}, "analyzer": nullable_str,
                            "embedding_model": nullable_str, "created_at": {"type": "string"}}),
        "CollectionList": _obj({"collections": {"type": "array", "items": _ref("Collection")}}),
        "CollectionRequest": _request({"name": {"type": "string", "minLength": 1, "maxLength": 128,
                                                "pattern": "^[^/]+$"},
                                       "analyzer": {"type": ["string", "object"]}, "chunker": {"type": "string"},
                                       "keep_versions": {"type": "boolean"},
                                       "public_unlabeled": {"type": "boolean"}}, ["name"]),
        "Dropped": _obj({"dropped": {"type": "string"}}),
        "UpdateRequest": _request({"metadata": any_obj,
                                   "acl": {"type": "array", "items": {"type": "string", "minLength": 1}}}),
        "DeleteResult": _obj({"deleted": {"type": "integer"}}),
        "Stats": any_obj,
        "Health": _obj({"status": {"type": "string"}, "pid": {"type": "integer"}, "version": {"type": "string"}}),
        "Error": error,
    }
    errors = {str(s): {"description": d, "content": {"application/json": {"schema": _ref("Error")}}}
              for s, d in ((400, "Not JSON, or not a JSON object"), (401, "No or unknown API token"),
                           (403, "The token may not write, or not this document (outside its write scope)"),
                           (404, "No such document (or not visible), or no such collection served"),
                           (409, "A collection of that name exists"),
                           (408, f"Body not sent within {limits.body_timeout:g} s"),
                           (413, f"Body over {limits.max_body_bytes} bytes"), (422, "Invalid input"),
                           (503, "The database is busy (another writer)"))}

    def op(summary: str, result: str, body: str | None = None, params: Sequence[Any] = (),
           status: str = "200", write: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {"summary": summary, "responses": {
            status: {"description": "OK", "content": {"application/json": {"schema": _ref(result)}}}, **errors}}
        if body is not None:
            out["requestBody"] = {"required": True, "content": {"application/json": {"schema": _ref(body)}}}
        if params:
            out["parameters"] = list(params)
        out["security"] = [{"bearer": []}] if write else [{}, {"bearer": []}]
        return out

    doc_id = {"name": "id", "in": "path", "required": True,
              "schema": {"type": "integer", "minimum": 1, "maximum": MAX_ID}}
    paging = [{"name": "prefix", "in": "query", "schema": {"type": "string"},
               "description": "Only sources starting with this text (literally)."},
              {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": MAX_LIST,
                                                          "default": 100}},
              {"name": "offset", "in": "query", "schema": {"type": "integer", "minimum": 0, "maximum": MAX_ID,
                                                           "default": 0}}]
    paths = {
        "/search": {"post": op("The best chunks for a query, best first", "SearchResult", "SearchRequest")},
        "/prompt": {"post": op("A grounded prompt with numbered sources", "Prompt", "PromptRequest")},
        "/facets": {"post": op("Exact counts of a field's values over what matches, most frequent first", "Facets",
                               "FacetsRequest")},
        "/documents": {"get": op("Stored documents (latest versions) by source, a page at a time", "DocumentList",
                                 params=paging),
                       "post": op("Add a document, or replace the one with its source", "AddResult", "AddRequest",
                                  status="201", write=True)},
        "/documents/batch": {"post": op("Add many documents (or replace those with their sources) in one "
                                        "transaction", "BatchResult", "BatchRequest", status="201", write=True)},
        "/documents/{id}": {"get": op("One document, with its text", "Document", params=[doc_id]),
                            "patch": op("Change a document's metadata and/or labels in place", "Document",
                                        "UpdateRequest", params=[doc_id], write=True),
                            "delete": op("Delete one stored document", "DeleteResult", params=[doc_id],
                                         write=True)},
        "/documents/get": {"post": op("One document by id, or the latest version of a source", "Document",
                                      "GetRequest")},
        "/documents/query": {"post": op("Stored documents matching a source pattern and/or a filter, by source, a "
                                        "page at a time", "DocumentList", "QueryRequest")},
        "/documents/count": {"post": op("How many documents the caller may see match a filter", "Count",
                                        "CountRequest")},
        "/documents/delete": {"post": op("Delete every version of a source (or of the sources matching a "
                                         "pattern) and/or every document matching a filter, of those the caller "
                                         "may see", "DeleteResult", "DeleteRequest", write=True)},
        "/stats": {"get": op("Database statistics", "Stats")},
        "/healthz": {"get": {"summary": "Liveness: the database is readable and the last request did not fail in it",
                             "security": [{}], "responses": {
            "200": {"description": "OK", "content": {"application/json": {"schema": _ref("Health")}}},
            "503": {"description": "The database cannot be read, or the last request failed in it (a 500 from "
                                   "the database) and none has succeeded since",
                    "content": {"application/json": {"schema": _ref("Error")}}}}}},
    }
    collection = {"name": "collection", "in": "path", "required": True,
                  "schema": {"type": "string", "minLength": 1, "maxLength": 128, "pattern": "^[^/]+$"}}
    for path in [p for p in paths if p.startswith(("/documents", "/search", "/prompt", "/facets", "/stats"))]:
        paths["/collections/{collection}" + path] = {
            method: {**o, "summary": o["summary"] + " (in the collection named)",
                     "parameters": [collection, *o.get("parameters", ())]}
            for method, o in paths[path].items()}
    paths["/collections"] = {
        "get": op("The collections served, with what the caller may see of each", "CollectionList"),
        "post": op("Create a collection (the administrator's token; ragdb serve --collections)", "Collection",
                   "CollectionRequest", status="201", write=True)}
    paths["/collections/{collection}"] = {
        "get": op("One collection, with what the caller may see of it", "Collection", params=[collection]),
        "delete": op("Drop a collection and everything in it (the administrator's token)", "Dropped",
                     params=[collection], write=True)}
    return {"openapi": "3.1.0",
            "info": {"title": "ragdb", "version": ragdb.__version__,
                     "description": "A ragdb knowledge base over HTTP. Reads without a token are anonymous "
                                    "(public documents only); a bearer token reads as its principals."},
            "paths": paths,
            "components": {"schemas": schemas,
                           "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}}}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}
