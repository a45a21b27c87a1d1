"""Search filters: parsed and validated here, turned into SQL only in the storage layer.

A filter is a mapping:

* ``"source"``: a source or a glob pattern (``"docs/*.md"``), or a list of them;
* ``"version"``: a version string or a list;
* ``"tags"``: a tag or a list; matches documents whose ``metadata["tags"]``
  holds any of them;
* any other key: equality with ``metadata[key]`` (a list means "any of");
  a key holding a list in metadata matches when any element is equal.

Keys and values are data: they are bound as SQL parameters, never written
into SQL. A key that no document has simply matches nothing.

Time: ``since``/``until`` bound the document timestamp (inclusive);
``as_of`` answers as the knowledge base stood at that instant.
Permissions (the rule every read path follows): a chunk with access labels is
visible only to callers holding one of its labels, or to everyone when one of
them is :data:`ragdb.options.PUBLIC` (``"*"``); a chunk without labels is
public when the database's ``public_unlabeled`` setting is on. ``principals``
omitted (``None``/``()``) is an anonymous caller with no labels, who sees
public chunks only; :data:`ragdb.options.ALL` is the full view.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from collections.abc import Mapping, Sequence

from .errors import InvalidInput
from .options import ALL, PUBLIC, VERSIONS, Principals, check_principals, check_text

Scalar = str | int | float | bool


@dataclass(frozen=True)
class Condition:
    """One condition on documents. ``kind`` is one of: source, source_glob,
    version, tags, meta, since, until, as_of, principals."""

    kind: str
    key: str | None
    values: tuple[Any, ...]


@dataclass(frozen=True)
class Query:
    """Everything that restricts which chunks a search sees."""

    conditions: tuple[Condition, ...]
    versions: str  # "latest" or "all"
    public_unlabeled: bool

    @property
    def needs_sql(self) -> bool:
        return bool(self.conditions)


def _values(name: str, value: Any) -> tuple[Scalar, ...]:
    vals = tuple(value) if isinstance(value, (list, tuple, set, frozenset)) else (value,)
    if not vals:
        raise InvalidInput(f"filter {name!r}: an empty list matches nothing; leave the key out instead")
    for v in vals:
        if v is None or not isinstance(v, (str, int, float, bool)):
            raise InvalidInput(f"filter {name!r}: values must be strings, numbers or booleans, got {v!r}")
        if isinstance(v, int) and not isinstance(v, bool) and not -2 ** 63 <= v < 2 ** 63:
            raise InvalidInput(f"filter {name!r}: {v} is out of the 64-bit integer range")
        if isinstance(v, str):
            check_text(v, f"filter {name!r}: value")
    return tuple(sorted(set(vals), key=repr))


def check_finite(metadata: Any, what: str) -> None:
    """InvalidInput if ``metadata`` holds NaN or infinity: JSON has neither (orjson
    writes them as null), so they would come back as None."""
    import math

    def walk(value: Any, path: str) -> None:
        if isinstance(value, float) and not math.isfinite(value):
            raise InvalidInput(f"{what}: metadata {path!r} is {value!r}, which JSON cannot store")
        if isinstance(value, Mapping):
            for k, v in value.items():
                walk(v, f"{path}.{k}" if path else str(k))
        elif isinstance(value, (list, tuple)):
            for n, v in enumerate(value):
                walk(v, f"{path}[{n}]")

    walk(metadata, "")


def _is_glob(pattern: str) -> bool:
    return any(c in pattern for c in "*?[")


def build(filter: Mapping[str, Any] | None = None, *, since: Any = None, until: Any = None,
          as_of: Any = None, principals: Principals | Sequence[str] | None = None, versions: str = "latest",
          public_unlabeled: bool = False, to_epoch: Any) -> Query:
    """Validate the search restrictions; ``to_epoch(value, label)`` parses timestamps."""
    if versions not in VERSIONS:
        raise InvalidInput(f"versions must be 'latest' or 'all', got {versions!r}")
    conds: list[Condition] = []
    if filter is not None:
        if not isinstance(filter, Mapping):
            raise InvalidInput(f"filter must be a mapping of key to value(s), got {type(filter).__name__}")
        for key in sorted(filter, key=repr):
            if not isinstance(key, str) or not key:
                raise InvalidInput(f"filter keys must be non-empty strings, got {key!r}")
            check_text(key, "filter key")
            vals = _values(key, filter[key])
            if key == "source":
                # GLOB without metacharacters is plain (case-sensitive) equality
                globbing = any(isinstance(v, str) and _is_glob(v) for v in vals)
                conds.append(Condition("source_glob" if globbing else "source", None,
                                       tuple(str(v) for v in vals)))
            elif key == "version":
                conds.append(Condition("version", None, tuple(str(v) for v in vals)))
            elif key == "tags":
                conds.append(Condition("tags", None, vals))
            else:
                conds.append(Condition("meta", key, vals))
    if since is not None:
        conds.append(Condition("since", None, (to_epoch(since, "since"),)))
    if until is not None:
        conds.append(Condition("until", None, (to_epoch(until, "until"),)))
    if as_of is not None:
        if versions != "latest":
            raise InvalidInput("as_of and versions='all' cannot be combined: as_of picks the versions")
        conds.append(Condition("as_of", None, (to_epoch(as_of, "as_of"),)))
    labels = check_principals(principals)
    if labels is not ALL:
        assert isinstance(labels, tuple)
        conds.append(Condition("principals", None, (*labels, PUBLIC)))
    return Query(tuple(conds), versions, public_unlabeled)
