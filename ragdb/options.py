"""Search options as values, and the one place where shared parameters are validated.

:class:`Restrictions` says which chunks a search may see (filter, time,
versions, principals); :class:`SearchOptions` says how they are ranked (k,
scorer and the parameters of that scorer, thresholds, explain, rerank).
``Database.search``, ``build_prompt`` and ``ask`` take either a
``SearchOptions`` (``options=``) or the same names as keywords
(:meth:`SearchOptions.from_keywords`), and both forms are validated here:

>>> SearchOptions.from_keywords(k=5, scorer="bm25", alpha=0.7)
Traceback (most recent call last):
...
ragdb.errors.InvalidInput: alpha applies to scorer 'hybrid' only (the search uses scorer 'bm25')

Options that do not apply to the chosen scorer are refused with an
:class:`~ragdb.errors.InvalidInput` naming the option, never silently ignored.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from ragdb.errors import InvalidInput

MAX_K = 10_000
LEXICAL_SCORERS = ("bm25", "tfidf")
VECTOR_SCORERS = ("vector", "hybrid")
SCORERS = LEXICAL_SCORERS + VECTOR_SCORERS
FUSIONS = ("adaptive", "weighted", "rrf")
VERSIONS = ("latest", "all")
MAX_SNIPPET_CHARS = 100_000
SYNTAXES = ("query", "plain")  # of ragdb.query.language (kept here: options validates, query parses)


class AllPrincipals:
    """The type of :data:`ALL`: ``principals=ragdb.ALL`` asks for the full view,
    every chunk whatever its access labels (an administrator's or a batch job's)."""

    _instance: AllPrincipals | None = None

    def __new__(cls) -> AllPrincipals:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "ragdb.ALL"

    def __reduce__(self) -> str:
        return "ALL"


#: ``principals=ALL``: see every chunk, whatever its labels. Omitting ``principals``
#: (or ``None``, or ``()``) is an anonymous caller, who sees public chunks only.
ALL = AllPrincipals()

#: The access label that makes a document visible to every caller, anonymous ones
#: included, whatever the database's ``public_unlabeled`` setting (``ragdb add --public``).
#: It is not a principal: ``principals=["*"]`` is refused.
PUBLIC = "*"

#: What principals become once checked: the caller's labels (``()``: anonymous) or ALL.
Principals = tuple[str, ...] | AllPrincipals
# Chosen from SciFact train and CMRC trial measurements (BENCHMARKS.md, section hybrid):
# "adaptive" is the min-max weighted sum with a vector weight per query (ragdb.index.fusion.adaptive_alpha:
# fitted per model and query language, raised when BM25 covers little of the query); it never
# ranks below the better side there, which no fixed weight does on both. DEFAULT_ALPHA is the
# weight of fusion="weighted" (vector weight 0.3 beats BM25 on SciFact; RRF does not).
DEFAULT_FUSION = "adaptive"
DEFAULT_ALPHA = 0.3
DEFAULT_RRF_K = 60
DEFAULT_POOL = 100
DEFAULT_RERANK_TOP = 50

TimeValue = str | datetime | int | float


# -- shared parameter checks -----------------------------------------------------------
def check_k(k: Any, name: str = "k") -> int:
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= MAX_K:
        raise InvalidInput(f"{name} must be an integer between 1 and {MAX_K}, got {k!r}", param=name)
    return k


def check_id(value: Any, what: str = "doc_id") -> int:
    """A document id: a positive 64-bit integer."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidInput(f"{what} must be an integer, got {value!r}", param=what)
    if not 0 < value < 2 ** 63:
        raise InvalidInput(f"{what} {value} is out of range", param=what)
    return value


def check_int(value: Any, name: str, low: int) -> int:
    """An integer (not a bool) from ``low`` (0 or 1) to 2**63 - 1, SQLite's 64-bit INTEGER."""
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        kind = "positive" if low >= 1 else "non-negative"
        raise InvalidInput(f"{name} must be a {kind} integer, got {value!r}", param=name)
    if value >= 2 ** 63:
        raise InvalidInput(f"{name} {value} is out of range (at most 2**63 - 1)", param=name)
    return value


def check_positive_int(value: Any, name: str) -> int:
    """A positive integer SQLite can bind (a batch size, a pool)."""
    return check_int(value, name, 1)


def check_number(value: Any, name: str, *, low: float | None = None, high: float | None = None) -> float:
    """A finite real number (not a bool) within [low, high]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not _finite(value):
        raise InvalidInput(f"{name} must be a finite number, got {value!r}", param=name)
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f"in [{low}, {high}]" if low is not None and high is not None else \
            f">= {low}" if low is not None else f"<= {high}"
        raise InvalidInput(f"{name} must be a number {bounds}, got {value!r}", param=name)
    return float(value)


def check_threshold(value: Any, name: str = "min_score") -> float | None:
    """A score threshold: None, or a finite number."""
    return None if value is None else check_number(value, name)


#: The most labels a caller's ``principals`` may hold. Each is bound twice in a search's SQL
#: (the version's labels and its latest version's); with a filter's 10,000 values (20,000
#: parameters at most) they stay within SQLite's default 32,766 parameters a statement.
MAX_PRINCIPALS = 5_000


def check_principals(principals: Any) -> Principals:
    """:data:`ALL`, or the caller's distinct labels, sorted (``None``: anonymous, ``()``)."""
    if principals is None:
        return ()
    if principals is ALL:
        return ALL
    if isinstance(principals, (str, bytes)):
        raise InvalidInput("principals must be a list of labels, not one string", param="principals")
    if isinstance(principals, Mapping):  # (its keys would have been taken for labels)
        raise InvalidInput("principals must be a list of labels, not a mapping", param="principals")
    try:
        items = list(principals)
    except TypeError:
        raise InvalidInput(f"principals must be a list of labels, got {type(principals).__name__}", param="principals") from None
    if not all(isinstance(p, str) for p in items):
        raise InvalidInput(f"principals must be strings, got {items!r}" if len(items) <= 100 else
                           "principals must be strings", param="principals")
    if len(items) > MAX_PRINCIPALS and len(set(items)) > MAX_PRINCIPALS:  # (distinct labels count)
        raise InvalidInput(f"principals: {len(set(items)):,} labels, more than the {MAX_PRINCIPALS:,} a caller "
                           f"may hold", param="principals")
    for p in items:
        check_text(p, "principal")
        if not p:
            raise InvalidInput("principals must be non-empty labels, got ''", param="principals")
        if p == PUBLIC:
            raise InvalidInput(f"{PUBLIC!r} is the public label, not a principal: leave principals out for the "
                               f"public view, or pass principals=ragdb.ALL for everything", param="principals")
    return tuple(sorted(set(items)))


def check_text(value: str, what: str) -> str:
    """Refuse strings SQLite cannot store (lone surrogates, e.g. from undecodable file names)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidInput(f"{what} {value!r} is not valid Unicode (lone surrogate at offset {e.start})", param=what) from None
    return value


def parse_timestamp(value: Any, label: str) -> tuple[str, float]:
    """Canonical ISO-8601 UTC text and epoch seconds of ``value`` (ISO-8601 text, a
    datetime or epoch seconds; ``None`` is now); naive times are taken as UTC."""
    if value is None:
        dt = datetime.now(timezone.utc)
    elif isinstance(value, datetime):
        dt = value
    elif isinstance(value, str):
        try:
            dt = datetime.fromisoformat(value.strip().replace("Z", "+00:00").replace("z", "+00:00"))
        except ValueError:
            raise InvalidInput(f"{label}: timestamp {value!r} is not ISO-8601 (e.g. 2026-11-01T09:30:00Z)", param=label) from None
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            dt = datetime.fromtimestamp(float(value), timezone.utc)
        except (OverflowError, OSError, ValueError):
            raise InvalidInput(f"{label}: timestamp {value!r} is out of range", param=label) from None
    else:
        raise InvalidInput(f"{label}: timestamp must be an ISO-8601 string, a datetime or epoch seconds", param=label)
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    try:
        dt = dt.astimezone(timezone.utc)  # 9999-12-31T23:00-05:00 is past year 9999 in UTC
    except (OverflowError, ValueError):
        raise InvalidInput(f"{label}: timestamp {value!r} is out of range (years 1 to 9999, in UTC)", param=label) from None
    # the year zero-padded: strftime's %Y gives "999", not "0999", which fromisoformat refuses
    text = f"{dt.year:04d}" + dt.strftime("-%m-%dT%H:%M:%S") + (f".{dt.microsecond:06d}" if dt.microsecond else "") + "Z"
    return text, dt.timestamp()


def to_epoch(value: Any, label: str) -> float:
    return parse_timestamp(value, label)[1]


def _finite(value: int | float) -> bool:
    """math.isfinite, False for an int past the float range (10**400) where it raises OverflowError."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


#: SQLite's busy timeout is a 32-bit count of milliseconds: about 24.8 days.
MAX_BUSY_TIMEOUT = (2 ** 31 - 1) // 1000
#: The largest BM25 k1 a search takes (typical values are 0.5 to 2).
MAX_K1 = 1e6


def check_count(value: Any, name: str) -> int:
    """A non-negative integer SQLite can bind (a limit, an offset): 0 to 2**63 - 1."""
    return check_int(value, name, 0)


def check_flag(value: Any, name: str) -> bool:
    """True or False: not 0/1, not a string (``"false"`` is truthy)."""
    if not isinstance(value, bool):
        raise InvalidInput(f"{name} must be True or False, got {value!r}", param=name)
    return value


def check_optional_flag(value: Any, name: str) -> bool | None:
    """None ("not given"), True or False."""
    return None if value is None else check_flag(value, name)


def check_busy_timeout(value: Any) -> float:
    """Seconds to wait for another process's write lock: 0 to :data:`MAX_BUSY_TIMEOUT`."""
    return check_number(value, "busy_timeout", low=0.0, high=float(MAX_BUSY_TIMEOUT))


def check_path(value: Any) -> str:
    """A database path (text or an ``os.PathLike`` of text; ``":memory:"``), one SQLite can open."""
    try:
        path = os.fspath(value)
    except TypeError:
        raise InvalidInput(f"path must be a string or a path-like object, got {type(value).__name__}", param="path") from None
    if not isinstance(path, str):
        raise InvalidInput(f"path must be text, not {type(path).__name__} (decode it with os.fsdecode)", param="path")
    if not path:
        raise InvalidInput("path must not be empty (':memory:' opens an in-memory database)", param="path")
    if "\x00" in path:
        raise InvalidInput(f"path {path!r} contains a NUL character", param="path")
    if path.startswith("file:"):
        # SQLite reads a name starting with "file:" as a URI (the system's SQLite does even
        # without uri=True): "file:kb.db" opened kb.db while ragdb checked and registered another
        # path, and "file::memory:?cache=shared" waited the busy timeout to switch to WAL
        raise InvalidInput(f"path {path!r} is an SQLite URI: ragdb opens a file by its path (./{path} for a file "
                           f"whose name starts with 'file:'), or ':memory:'", param="path")
    return check_text(path, "path")


def check_embedder(value: Any, name: str = "embedder") -> Any:
    """None, a model spec (``"wordllama"``, ``"openai:MODEL"``...), or an object with a
    ``name`` and an ``embed(texts)`` method (see :class:`ragdb.models.embeddings.Embedder`)."""
    if value is None:
        return None
    if isinstance(value, str):
        if not value:
            raise InvalidInput(f"{name} must not be an empty model spec", param=name)
        return check_text(value, name)
    if not isinstance(getattr(value, "name", None), str) or not callable(getattr(value, "embed", None)):
        raise InvalidInput(f"{name} must be a model spec (e.g. 'wordllama') or an object with a name and "
                           f"an embed(texts) method, got {type(value).__name__}", param=name)
    return value


# -- the values -----------------------------------------------------------------------
@dataclass(frozen=True)
class Restrictions:
    """Which chunks a search (or a listing, or a delete) may see.

    ``filter``: see :mod:`ragdb.query.filters`; ``since``/``until``: bounds of the
    document timestamp (inclusive); ``as_of``: the knowledge base as it stood
    then; ``versions="all"``: every stored version; ``principals``: only
    chunks whose access labels intersect these.
    """

    filter: Mapping[str, Any] | None = None
    since: TimeValue | None = None
    until: TimeValue | None = None
    as_of: TimeValue | None = None
    principals: Principals | None = None
    versions: str = "latest"

    def __post_init__(self) -> None:
        if self.versions not in VERSIONS:
            raise InvalidInput(f"versions must be 'latest' or 'all', got {self.versions!r}", param="versions")
        if self.filter is not None and not isinstance(self.filter, Mapping):
            raise InvalidInput(f"filter must be a mapping of key to value(s), got {type(self.filter).__name__}", param="filter")
        if self.as_of is not None and self.versions != "latest":
            raise InvalidInput("as_of and versions='all' cannot be combined: as_of picks the versions", param="as_of")
        object.__setattr__(self, "principals", check_principals(self.principals))
        for name in ("since", "until", "as_of"):
            value = getattr(self, name)
            if value is not None:
                parse_timestamp(value, name)

    @property
    def history(self) -> bool:
        """Whether the search may see versions other than the latest."""
        return self.versions == "all" or self.as_of is not None


_RESTRICTION_NAMES = tuple(f.name for f in dataclasses.fields(Restrictions))
_RESTRICTION_SET = frozenset(_RESTRICTION_NAMES)


@dataclass(frozen=True)
class SearchOptions:
    """How a search ranks and cuts; see :meth:`ragdb.Database.search` for each option.
    ``offset`` skips that many hits: ``k=10, offset=10`` is hits 10..19 of ``k=20``.

    Scorer-specific options default to ``None`` ("not given"): giving one
    that the scorer does not use is an error. The properties ``lexical``,
    ``fusion_method``, ``fusion_alpha``, ``fusion_rrf_k``, ``pool_size`` and
    ``first_stage_k`` give the values in force, defaults filled in.
    """

    k: int = 10
    scorer: str = "bm25"
    restrictions: Restrictions = field(default_factory=Restrictions)
    min_score: float | None = None
    explain: bool = False
    k1: float | None = None            # bm25, and the lexical side of hybrid
    b: float | None = None             # bm25, and the lexical side of hybrid
    fusion: str | None = None          # hybrid
    alpha: float | None = None         # hybrid, fusion "weighted" (its weight) or "adaptive" (the base weight)
    rrf_k: float | None = None         # hybrid, fusion "rrf"
    pool: int | None = None            # hybrid: candidates taken from each side
    embedder: Any = None               # vector, hybrid: the query embedder (object or spec)
    reranker: Any = None               # any scorer: re-orders the first rerank_top hits
    rerank_top: int | None = None      # with reranker
    offset: int = 0                    # any scorer: skip this many hits (pages of results)
    syntax: str | None = None          # "query": the query language (ragdb.query.language); "plain": words only;
    #                                    None (not given): "query" for a search, "plain" for a question (as_question)
    fuzzy: int = 0                     # 1: every word also matches index terms one edit away
    highlight: bool = False            # fill Hit.highlights and Hit.snippet
    snippet_chars: int = 240           # with highlight: the snippet's length, at most
    collapse: bool = True              # one hit per passage: copies named in Hit.duplicates (False: every copy)

    def __post_init__(self) -> None:
        check_k(self.k)
        check_count(self.offset, "offset")
        if self.k + self.offset > MAX_K:
            raise InvalidInput(f"offset + k must be at most {MAX_K} (a page of results comes from the first "
                               f"offset + k), got offset {self.offset} and k {self.k}", param="offset")
        if self.scorer not in SCORERS:
            raise InvalidInput(f"scorer {self.scorer!r} is unknown; choose one of {', '.join(SCORERS)}", param="scorer")
        if not isinstance(self.restrictions, Restrictions):
            raise InvalidInput(f"restrictions must be a ragdb.options.Restrictions, "
                               f"got {type(self.restrictions).__name__}", param="restrictions")
        check_threshold(self.min_score)
        if not isinstance(self.explain, bool):
            raise InvalidInput(f"explain must be True or False, got {self.explain!r}", param="explain")
        scorer = self.scorer

        def only(name: str, allowed: Sequence[str], what: str | None = None) -> bool:
            if getattr(self, name) is None:
                return False
            if scorer not in allowed:
                raise InvalidInput(f"{name} applies to {what or _scorers(allowed)} only "
                                   f"(the search uses scorer {scorer!r})", param=name)
            return True

        # b past 1 makes BM25's length norm negative (a zero denominator: inf/NaN scores);
        # a k1 near the float range overflows it.
        for name, high in (("k1", MAX_K1), ("b", 1.0)):
            if only(name, ("bm25", "hybrid")):
                check_number(getattr(self, name), name, low=0.0, high=high)
        if only("fusion", ("hybrid",)) and self.fusion not in FUSIONS:
            raise InvalidInput(f"fusion {self.fusion!r} is unknown; choose one of {', '.join(FUSIONS)}", param="fusion")
        if only("alpha", ("hybrid",)):
            if (self.fusion or DEFAULT_FUSION) == "rrf":
                raise InvalidInput("alpha applies to fusion 'weighted' or fusion 'adaptive' only (the search "
                                   "uses fusion 'rrf')", param="alpha")
            check_number(self.alpha, "alpha", low=0.0, high=1.0)
        if only("rrf_k", ("hybrid",)):
            if self.fusion != "rrf":
                raise InvalidInput(f"rrf_k applies to fusion 'rrf' only (the search uses fusion "
                                   f"{self.fusion or DEFAULT_FUSION!r})", param="rrf_k")
            check_number(self.rrf_k, "rrf_k", low=0.0)
        if only("pool", ("hybrid",)):
            check_positive_int(self.pool, "pool")
        if only("embedder", VECTOR_SCORERS):
            check_embedder(self.embedder)
        if self.reranker is not None and not callable(getattr(self.reranker, "rerank", None)):
            raise InvalidInput("reranker must have a rerank(query, hits, top_n) method", param="reranker")
        if not isinstance(self.collapse, bool):
            raise InvalidInput(f"collapse must be True or False, got {self.collapse!r}", param="collapse")
        if self.syntax is not None and self.syntax not in SYNTAXES:
            raise InvalidInput(f"syntax must be one of {', '.join(map(repr, SYNTAXES))}, got {self.syntax!r}", param="syntax")
        if not isinstance(self.fuzzy, int) or isinstance(self.fuzzy, bool) or self.fuzzy not in (0, 1):
            raise InvalidInput(f"fuzzy must be 0 or 1 (edits a word may be away from an index term), "
                               f"got {self.fuzzy!r}", param="fuzzy")
        if not isinstance(self.highlight, bool):
            raise InvalidInput(f"highlight must be True or False, got {self.highlight!r}", param="highlight")
        if not isinstance(self.snippet_chars, int) or isinstance(self.snippet_chars, bool) \
                or not 1 <= self.snippet_chars <= MAX_SNIPPET_CHARS:
            raise InvalidInput(f"snippet_chars must be an integer between 1 and {MAX_SNIPPET_CHARS}, "
                               f"got {self.snippet_chars!r}", param="snippet_chars")
        if self.rerank_top is not None:
            if self.reranker is None:
                raise InvalidInput("rerank_top applies only with a reranker", param="rerank_top")
            check_positive_int(self.rerank_top, "rerank_top")

    # -- forms ------------------------------------------------------------------
    @classmethod
    def from_keywords(cls, base: SearchOptions | None = None, **keywords: Any) -> SearchOptions:
        """Options from keyword arguments (the names of this class's fields and of
        :class:`Restrictions`' fields), over ``base`` if given. An unknown name is an
        :class:`~ragdb.errors.InvalidInput`."""
        if base is None:
            base = _DEFAULT_OPTIONS
        if not keywords:
            return base
        key = _made_key(keywords) if base is _DEFAULT_OPTIONS else None
        if key is not None:
            made = _MADE.get(key)
            if made is not None:
                return made
        made = cls._made(base, keywords)
        if key is not None:
            if len(_MADE) >= _MADE_KEPT:
                _MADE.clear()
            _MADE[key] = made
        return made

    @classmethod
    def _made(cls, base: SearchOptions, keywords: dict[str, Any]) -> SearchOptions:
        unknown = keywords.keys() - _OPTION_NAMES - _RESTRICTION_SET
        if unknown:
            known = sorted((_OPTION_NAMES - {"restrictions"}) | _RESTRICTION_SET)
            raise InvalidInput(f"unknown search option{'s' * (len(unknown) > 1)} {', '.join(sorted(unknown))}; "
                               f"known: {', '.join(known)}")
        if not keywords.keys() & _RESTRICTION_SET:
            return dataclasses.replace(base, **keywords)
        restrict = {n: keywords.pop(n) for n in _RESTRICTION_NAMES if n in keywords}
        if "restrictions" in keywords:
            raise InvalidInput(f"give restrictions= or {', '.join(sorted(restrict))}, not both")
        keywords["restrictions"] = dataclasses.replace(base.restrictions, **restrict)
        return dataclasses.replace(base, **keywords)

    def replace(self, **keywords: Any) -> SearchOptions:
        """A copy with these options (and restrictions) changed, validated again."""
        return SearchOptions.from_keywords(self, **keywords)

    def as_question(self) -> SearchOptions:
        """These options for a question (:meth:`ragdb.Database.build_prompt`, ``ask``, the
        retrievers, the MCP and HTTP prompt): words as written (``syntax="plain"``) unless
        the caller asked for the query language (``syntax="query"``). A question holds
        ``-fPIC``, ``C++``, ``node -r`` or ``encoding:utf8`` as text, never as operators."""
        return self if self.syntax is not None else dataclasses.replace(self, syntax="plain")

    # -- defaults of what applies -------------------------------------------------------
    @property
    def lexical(self) -> str:
        """The lexical scorer of this search (hybrid fuses BM25)."""
        return self.scorer if self.scorer in LEXICAL_SCORERS else "bm25"

    @property
    def fusion_method(self) -> str:
        return self.fusion or DEFAULT_FUSION

    @property
    def fusion_alpha(self) -> float:
        return DEFAULT_ALPHA if self.alpha is None else float(self.alpha)

    @property
    def fusion_rrf_k(self) -> float:
        return DEFAULT_RRF_K if self.rrf_k is None else float(self.rrf_k)

    @property
    def depth(self) -> int:
        """``offset + k``: the hits ranked to return the page ``[offset, offset + k)``. Every
        stage depends on ``depth``, not on ``k`` and ``offset`` apart, so a page equals that
        slice of one search with ``k = depth``."""
        return self.offset + self.k

    @property
    def pool_size(self) -> int:
        return min(max(DEFAULT_POOL if self.pool is None else self.pool, self.depth), MAX_K)

    @property
    def first_stage_k(self) -> int:
        """Hits retrieved before a reranker cuts to ``depth``."""
        if self.reranker is None:
            return self.depth
        return min(max(self.depth, DEFAULT_RERANK_TOP if self.rerank_top is None else self.rerank_top), MAX_K)


_OPTION_NAMES = frozenset(f.name for f in dataclasses.fields(SearchOptions))
_DEFAULT_OPTIONS = SearchOptions()

# Options made from keywords of plain values over the defaults, kept: ``db.search(q, k=10)``
# built and validated a SearchOptions each call (~25 us here, a few % of a search at 10k
# chunks). The values are frozen, so one may serve every call with the same keywords; the
# key holds each value's type and repr too, so ``k=True`` is not ``k=1`` nor ``-0.0`` ``0.0``.
_MADE: dict[tuple[tuple[str, type, Any, str], ...], SearchOptions] = {}
_MADE_KEPT = 256
_PLAIN = (int, float, str, bool, type(None))


def _made_key(keywords: dict[str, Any]) -> tuple[tuple[str, type, Any, str], ...] | None:
    """The cache key of keywords whose values are all plain (None: not to be cached)."""
    items = []
    for name, value in keywords.items():
        kind = type(value)
        if kind not in _PLAIN:
            return None
        items.append((name, kind, value, repr(value) if kind is float else ""))
    return tuple(sorted(items, key=lambda item: item[0]))


def _scorers(names: Sequence[str]) -> str:
    quoted = [repr(n) for n in names]
    return f"scorer {quoted[0]}" if len(quoted) == 1 else "scorers " + " and ".join(quoted)
