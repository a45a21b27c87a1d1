"""Search filters: parsed and validated here, turned into SQL only in the storage layer.

A filter is a mapping; every entry must hold (AND). The plain form, as before:

* ``"source"``: a source or a glob pattern (``"docs/*.md"``), or a list of them;
* ``"version"``: a version string or a list;
* ``"timestamp"``: the document timestamp (an ISO-8601 time, a datetime or
  epoch seconds) or a list, compared as instants;
* ``"tags"`` and any other key: equality with ``metadata[key]`` (a list means
  "any of"); a key holding a list in metadata matches when any element is equal.

The operator form (MongoDB/Chroma style) is a superset: a key's value may be a
mapping of operators, and ``$and``/``$or``/``$not``/``$contains`` stand at any
level where keys do::

    {"year": {"$gte": 2020, "$lt": 2024}, "lang": {"$in": ["en", "de"]}}
    {"$or": [{"team": "ops"}, {"published": {"$gte": "2024-01-01"}}]}
    {"$not": {"tags": "draft"}, "$contains": "退款"}

Operators on a key: ``$eq``, ``$ne``, ``$in``, ``$nin`` (equality, as the plain
form; on ``source`` a value with ``*?[`` is a glob), ``$gt``, ``$gte``, ``$lt``,
``$lte`` (a number compares with numeric values only, an ISO-8601 date or
date-time string with values that are ISO-8601 dates, as instants; booleans and
other strings are never in a range; ``source`` and ``version`` take no ranges),
``$exists`` (true/false) and ``$not`` (a mapping of these operators). Several
operators in one key's mapping hold for the same value of a list (``{"$gte": 2,
"$lt": 5}`` wants one element in [2, 5); ``$and`` of two mappings lets
different elements meet each). ``$contains`` is a substring (case-sensitive) of
the chunk's text.

A key's values are its scalars (string, number, boolean; booleans equal 1/0) and
the scalar elements of a list; a key whose value is null, an object or a list
without scalars has none. Negations are exact complements (MongoDB's rule):
``$ne``/``$nin``/``$not`` match documents without the key, ``$exists: false``
only those. Filters see the document's metadata (a chunk's own metadata, e.g.
``section``, is in hits but not filtered on); ``$contains`` alone is per chunk,
and a document (``documents``, ``count``, ``delete``) matches a filter with
``$contains`` when one of its chunks does.

Keys and values are data: they are bound as SQL parameters, never written
into SQL. A key that no document has simply matches nothing; a key starting
with ``$`` that is not an operator is an error.

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

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime, timezone
from typing import Any

from ragdb.errors import InvalidInput
from ragdb.options import ALL, PUBLIC, VERSIONS, Principals, check_principals, check_text, parse_timestamp
from ragdb.storage.codec import iso_instant

Scalar = str | int | float | bool

#: Operators that stand where keys do, and those of a key's mapping.
LOGICAL_OPS = ("$and", "$or", "$not", "$contains")
KEY_OPS = ("$eq", "$ne", "$gt", "$gte", "$lt", "$lte", "$in", "$nin", "$exists", "$not")
RANGE_OPS = {"$gt": "gt", "$gte": "ge", "$lt": "lt", "$lte": "le"}
#: Document fields a filter key may name (every other key is a metadata key).
DOC_FIELDS = ("source", "version", "timestamp")
#: How deep ``$and``/``$or``/``$not`` may nest.
MAX_DEPTH = 32
#: The most conditions (keys and operators, at any level) one filter may hold, and the
#: most values (the items of its lists, and its other values); docs/limits.md states them.
MAX_FILTER_CONDITIONS = 100
MAX_FILTER_VALUES = 10_000


@dataclass(frozen=True)
class Condition:
    """One condition on documents (or, for ``contains``, on chunks). ``kind``:

    * ``source``, ``source_glob``, ``version``, ``tags``, ``meta`` (``key``):
      equality with any of ``values`` (the plain form);
    * ``value`` (``key``): one value of the metadata key meets every test in
      ``values``: ``("in", (v, ...))``, ``("num", op, x)`` or ``("date", op, x)``
      with ``op`` one of gt/ge/lt/le (no tests: the key has a value);
    * ``version_set``: the document has a version;
    * ``ts``: ``values`` is ``("in", t, ...)`` or ``(op, t)``, epoch seconds;
    * ``any_meta``: equality on one of several metadata keys: ``values`` is
      ``((key, (v, ...)), ...)`` (what an ``$or`` of equalities on different keys becomes);
    * ``contains``: the chunk's text holds ``values[0]``;
    * ``and``, ``or`` (``values``: conditions; none: true, false) and ``not``;
    * ``since``, ``until``, ``as_of``, ``principals``: the restrictions.

    Values are plain hashable data: a query's conditions key its cached chunk mask."""

    kind: str
    key: str | None
    values: tuple[Any, ...]


TRUE = Condition("and", None, ())
FALSE = Condition("or", None, ())


@dataclass(frozen=True)
class Query:
    """Everything that restricts which chunks a search sees."""

    conditions: tuple[Condition, ...]
    versions: str  # "latest" or "all"
    public_unlabeled: bool

    @property
    def needs_sql(self) -> bool:
        return bool(self.conditions)

    @property
    def per_chunk(self) -> bool:
        """Whether a condition looks at chunks (``$contains``), not only documents."""
        return any(per_chunk(c) for c in self.conditions)


def per_chunk(c: Condition) -> bool:
    """Whether ``c`` (or a condition inside it) is a ``contains``."""
    if c.kind == "contains":
        return True
    return c.kind in ("and", "or", "not") and any(per_chunk(x) for x in c.values)


def _check_scalar(name: str, v: Any, op: str | None = None) -> Scalar:
    where = f"filter {name!r}: " + (f"{op} " if op else "")
    if v is None or not isinstance(v, (str, int, float, bool)):
        hint = " (use $exists: false for a missing key)" if v is None else ""
        raise InvalidInput(f"{where}values must be strings, numbers or booleans, got {v!r}{hint}")
    if isinstance(v, int) and not isinstance(v, bool) and not -2 ** 63 <= v < 2 ** 63:
        raise InvalidInput(f"{where}{v} is out of the 64-bit integer range")
    if isinstance(v, float) and not math.isfinite(v):  # (no metadata holds one: check_finite)
        raise InvalidInput(f"{where}values must be finite numbers, got {v!r}")
    if isinstance(v, str):
        check_text(v, f"filter {name!r}: value")
    return v


def _values(name: str, value: Any) -> tuple[Scalar, ...]:
    vals = tuple(value) if isinstance(value, (list, tuple, set, frozenset)) else (value,)
    if not vals:
        raise InvalidInput(f"filter {name!r}: an empty list matches nothing; leave the key out instead")
    for v in vals:
        _check_scalar(name, v)
    return tuple(sorted(set(vals), key=repr))


def _op_values(name: str, op: str, value: Any) -> tuple[Scalar, ...]:
    """The list of ``$in``/``$nin`` (may be empty), checked, distinct, in a stable order."""
    if not isinstance(value, (list, tuple, set, frozenset)):
        raise InvalidInput(f"filter {name!r}: {op} takes a list of values, got {value!r}")
    return tuple(sorted({_check_scalar(name, v, op) for v in value}, key=repr))


def _one_value(name: str, op: str, value: Any) -> Scalar:
    if isinstance(value, (list, tuple, set, frozenset, Mapping)):
        alt = "$in" if op == "$eq" else "$nin"
        raise InvalidInput(f"filter {name!r}: {op} takes one value, got {value!r} (use {alt} for a list)")
    return _check_scalar(name, value, op)


def _bound(name: str, op: str, value: Any) -> tuple[str, float]:
    """("num", x) or ("date", epoch seconds) of a metadata range operand."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if isinstance(value, float) and not math.isfinite(value):
            raise InvalidInput(f"filter {name!r}: {op} needs a finite number, got {value!r}")
        if isinstance(value, int) and not -2 ** 63 <= value < 2 ** 63:
            raise InvalidInput(f"filter {name!r}: {op}: {value} is out of the 64-bit integer range")
        return "num", value
    if isinstance(value, datetime):
        return "date", (value if value.tzinfo else value.replace(tzinfo=timezone.utc)).timestamp()
    if isinstance(value, date):
        return "date", datetime(value.year, value.month, value.day, tzinfo=timezone.utc).timestamp()
    if isinstance(value, str):
        t = iso_instant(value)
        if t is not None:
            return "date", t
    raise InvalidInput(f"filter {name!r}: {op} needs a number or an ISO date, got {value!r}")


def _instant(name: str, op: str | None, value: Any) -> float:
    """Epoch seconds of a ``timestamp`` operand (as ``since``/``until`` parse them)."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float, datetime)):
        raise InvalidInput(f"filter {name!r}: {op or 'a value'} needs an ISO-8601 time, a datetime or epoch "
                           f"seconds, got {value!r}")
    return parse_timestamp(value, f"filter {name!r}" + (f": {op}" if op else ""))[1]


def _not(c: Condition) -> Condition:
    if c == TRUE:
        return FALSE
    if c == FALSE:
        return TRUE
    return c.values[0] if c.kind == "not" else Condition("not", None, (c,))


def _all(conds: Sequence[Condition]) -> Condition:
    return conds[0] if len(conds) == 1 else Condition("and", None, tuple(conds))


# An ``$or`` of N equalities would be N subqueries, each probed for every document
# (seconds at a few thousand); equalities on the same field are one list of values, and
# equalities on different metadata keys one ``any_meta`` (one subquery over (key, value)
# pairs), so the SQL grows with the filter's size, not with its size times the documents.
def _group(c: Condition) -> str | None:
    """Which equalities ``c`` merges with under OR (their values united), None: none."""
    if c.kind in ("meta", "tags", "any_meta") or (c.kind == "value" and len(c.values) == 1
                                                  and c.values[0][0] == "in"):
        return "meta"
    if c.kind in ("source", "source_glob"):
        return "source"
    if c.kind == "version":
        return "version"
    if c.kind == "ts" and c.values[0] == "in":
        return "ts"
    return None


def _meta_pairs(c: Condition) -> list[tuple[str, tuple[Any, ...]]]:
    """(key, values) of a condition of the "meta" group."""
    if c.kind == "any_meta":
        return list(c.values)
    if c.kind == "value":
        return [(str(c.key), c.values[0][1])]
    return [("tags" if c.kind == "tags" else str(c.key), c.values)]


def _union(values: Sequence[tuple[Any, ...]]) -> tuple[Any, ...]:
    return tuple(sorted({v for vals in values for v in vals}, key=repr))


def _any(parts: Sequence[Condition]) -> Condition:
    """The OR of ``parts``: nested ORs flattened, equalities on one field merged."""
    flat: list[Condition] = []
    for p in parts:
        if p == TRUE:
            return TRUE
        flat.extend(p.values if p.kind == "or" else (p,))
    groups: dict[str, list[Condition]] = {}
    rest: list[Condition] = []
    for c in flat:
        g = _group(c)
        if g is None:
            rest.append(c)
        else:
            groups.setdefault(g, []).append(c)
    out: list[Condition] = []
    for g, conds in groups.items():
        if len(conds) == 1:
            out.append(conds[0])
        elif g == "meta":
            by_key: dict[str, list[tuple[Any, ...]]] = {}
            for c in conds:
                for key, vals in _meta_pairs(c):
                    by_key.setdefault(key, []).append(vals)
            pairs = [(k, u) for k, u in ((k, _union(v)) for k, v in sorted(by_key.items())) if u]
            if len(pairs) == 1:
                key, vals = pairs[0]
                out.append(Condition("tags", None, vals) if key == "tags" else Condition("meta", key, vals))
            elif pairs:
                out.append(Condition("any_meta", None, tuple(pairs)))
        elif g == "source":
            kind = "source_glob" if any(c.kind == "source_glob" for c in conds) else "source"
            out.append(Condition(kind, None, _union([c.values for c in conds])))
        elif g == "version":
            out.append(Condition("version", None, _union([c.values for c in conds])))
        else:  # ts
            out.append(Condition("ts", None, ("in", *sorted({t for c in conds for t in c.values[1:]}))))
    out += rest
    if not out:
        return FALSE
    return out[0] if len(out) == 1 else Condition("or", None, tuple(out))


def _every(parts: Sequence[Condition]) -> Condition:
    """The AND of ``parts``: nested ANDs flattened, negated equalities on one field merged
    (NOT a AND NOT b is NOT (a OR b))."""
    flat: list[Condition] = []
    for p in parts:
        if p == FALSE:
            return FALSE
        flat.extend(p.values if p.kind == "and" else (p,))
    negated = [c.values[0] for c in flat if c.kind == "not" and _group(c.values[0]) is not None]
    if len(negated) > 1:
        flat = [c for c in flat if not (c.kind == "not" and _group(c.values[0]) is not None)]
        flat.append(_not(_any(negated)))
    flat = [c for c in flat if c != TRUE]
    if FALSE in flat:
        return FALSE
    return _all(flat) if flat else TRUE


def _check_size(filter: Any) -> None:
    """InvalidInput when ``filter`` holds more than :data:`MAX_FILTER_CONDITIONS` conditions
    (a key or operator holding a value or a list of values: ``{"year": {"$gte": 2020,
    "$lt": 2024}}`` is two, ``$and``/``$or``/``$not`` themselves none) or more than
    :data:`MAX_FILTER_VALUES` values (each item of a list of values counts); checked
    before the filter is parsed, without recursion (a filter nested past
    :data:`MAX_DEPTH`, or holding itself, is refused too)."""
    conditions = values = nodes = 0
    stack = [filter]
    while stack:
        x = stack.pop()
        nodes += 1
        if isinstance(x, Mapping):
            for v in x.values():
                if isinstance(v, Mapping) or (isinstance(v, (list, tuple)) and v and all(isinstance(i, Mapping) for i in v)):
                    stack.append(v)  # operators of a key, $not's filter, the filters of $and / $or
                    continue
                conditions += 1
                values += len(v) if isinstance(v, (list, tuple, set, frozenset)) else 1
        elif isinstance(x, (list, tuple)):
            stack.extend(x)
        if conditions > MAX_FILTER_CONDITIONS or nodes > MAX_FILTER_CONDITIONS * (MAX_DEPTH + 1):
            raise InvalidInput(f"filter: more than {MAX_FILTER_CONDITIONS:,} conditions (a key or operator with "
                               f"its value); alternatives of one key are shorter as {{key: {{'$in': [...]}}}}",
                               param="filter")
        if values > MAX_FILTER_VALUES:
            raise InvalidInput(f"filter: more than {MAX_FILTER_VALUES:,} values", param="filter")


def _equal(name: str, vals: tuple[Scalar, ...]) -> Condition:
    """Equality with any of ``vals`` (none: false) on a key: the plain form's conditions."""
    if not vals:
        return FALSE
    if name == "source":
        # GLOB without metacharacters is plain (case-sensitive) equality
        globbing = any(isinstance(v, str) and _is_glob(v) for v in vals)
        return Condition("source_glob" if globbing else "source", None, tuple(str(v) for v in vals))
    if name == "version":
        return Condition("version", None, tuple(str(v) for v in vals))
    if name == "tags":
        return Condition("tags", None, vals)
    return Condition("meta", name, vals)


def _plain(name: str, value: Any) -> Condition:
    if name == "timestamp":
        vals = value if isinstance(value, (list, tuple, set, frozenset)) else (value,)
        if not vals:
            raise InvalidInput(f"filter {name!r}: an empty list matches nothing; leave the key out instead")
        return Condition("ts", None, ("in", *sorted({_instant(name, None, v) for v in vals})))
    return _equal(name, _values(name, value))


def _key_ops(name: str, ops: Mapping[Any, Any], depth: int) -> Condition:
    """The condition of ``{name: {op: operand, ...}}``."""
    if not ops:
        raise InvalidInput(f"filter {name!r}: an empty operator mapping; give operators such as "
                           f"$eq, $gt or $in")
    if not all(isinstance(op, str) and op.startswith("$") for op in ops):
        raise InvalidInput(f"filter {name!r}: values must be strings, numbers or booleans, or a mapping of "
                           f"operators such as {{'$gt': 5}}; got {dict(ops)!r}")
    tests: list[tuple[Any, ...]] = []  # metadata: tests one value must meet together
    conds: list[Condition] = []
    for op in sorted(ops, key=repr):
        operand = ops[op]
        if not isinstance(op, str) or op not in KEY_OPS:
            if isinstance(op, str) and op in LOGICAL_OPS:
                raise InvalidInput(f"filter {name!r}: {op} stands where keys do, not inside a key's "
                                   f"operators (e.g. {{{op!r}: ...}})")
            raise InvalidInput(f"filter {name!r}: unknown operator {op!r}; known: {', '.join(KEY_OPS)}")
        if op == "$not":
            if not isinstance(operand, Mapping):
                raise InvalidInput(f"filter {name!r}: $not takes a mapping of operators, got {operand!r}")
            conds.append(_not(_key_ops(name, operand, _deeper(depth))))
        elif op == "$exists":
            if not isinstance(operand, bool):
                raise InvalidInput(f"filter {name!r}: $exists takes true or false, got {operand!r}")
            if name in ("source", "timestamp"):
                has = TRUE
            else:
                has = Condition("version_set", None, ()) if name == "version" else Condition("value", name, ())
            conds.append(has if operand else _not(has))
        elif op in ("$eq", "$ne", "$in", "$nin") and name == "timestamp":
            one = op in ("$eq", "$ne")
            if one == isinstance(operand, (list, tuple, set, frozenset)):
                raise InvalidInput(f"filter {name!r}: {op} takes " + ("one value" if one else "a list of values")
                                   + f", got {operand!r}")
            times = sorted({_instant(name, op, v) for v in ((operand,) if one else operand)})
            eq = Condition("ts", None, ("in", *times)) if times else FALSE
            conds.append(eq if op in ("$eq", "$in") else _not(eq))
        elif op in ("$eq", "$ne", "$in", "$nin"):
            vals = (_one_value(name, op, operand),) if op in ("$eq", "$ne") else _op_values(name, op, operand)
            if name in ("source", "version") or op in ("$ne", "$nin"):
                eq = _equal(name, vals)
            else:
                tests.append(("in", vals))
                continue
            conds.append(eq if op in ("$eq", "$in") else _not(eq))
        else:  # a range
            rel = RANGE_OPS[op]
            if name in ("source", "version"):
                raise InvalidInput(f"filter {name!r}: {op} does not apply to {name} (use $eq, $ne, $in, $nin)")
            if name == "timestamp":
                conds.append(Condition("ts", None, (rel, _instant(name, op, operand))))
            else:
                kind, x = _bound(name, op, operand)
                tests.append((kind, rel, x))
    if tests:
        conds.append(Condition("value", name, tuple(sorted(tests, key=repr))))
    return _every(conds)


def _deeper(depth: int) -> int:
    if depth >= MAX_DEPTH:
        raise InvalidInput(f"filter: nested more than {MAX_DEPTH} levels deep")
    return depth + 1


def _conjunction(filter: Any, depth: int = 0, where: str = "filter") -> list[Condition]:
    """The conditions of a filter mapping, all of which must hold."""
    if not isinstance(filter, Mapping):
        raise InvalidInput(f"{where} must be a mapping of key to value(s), got {type(filter).__name__}")
    conds: list[Condition] = []
    for key in sorted(filter, key=repr):
        if not isinstance(key, str) or not key:
            raise InvalidInput(f"filter keys must be non-empty strings, got {key!r}")
        check_text(key, "filter key")
        value = filter[key]
        if key.startswith("$"):
            conds.append(_logical(key, value, depth))
        elif isinstance(value, Mapping):
            conds.append(_key_ops(key, value, depth))
        else:
            conds.append(_plain(key, value))
    return conds


def _logical(op: str, operand: Any, depth: int) -> Condition:
    if op in ("$and", "$or"):
        if not isinstance(operand, (list, tuple)) or not operand:
            raise InvalidInput(f"filter: {op} takes a non-empty list of filters, got {operand!r}")
        parts = [_every(_conjunction(f, _deeper(depth), f"filter: each item of {op}")) for f in operand]
        return _every(parts) if op == "$and" else _any(parts)
    if op == "$not":
        return _not(_every(_conjunction(operand, _deeper(depth), "filter: $not")))
    if op == "$contains":
        if not isinstance(operand, str) or not operand:
            raise InvalidInput(f"filter: $contains takes a non-empty string (a substring of the chunk's text), "
                               f"got {operand!r}")
        check_text(operand, "filter: $contains")
        return Condition("contains", None, (operand,))
    hint = " (a metadata key cannot start with '$')" if op not in KEY_OPS else \
        f" ({op} belongs in a key's mapping, e.g. {{'year': {{{op!r}: ...}}}})"
    raise InvalidInput(f"filter: unknown operator {op!r}{hint}; known here: {', '.join(LOGICAL_OPS)}")


def check_finite(metadata: Any, what: str) -> None:
    """InvalidInput if ``metadata`` holds NaN or infinity: JSON has neither (orjson
    writes them as null), so they would come back as None."""

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
        _check_size(filter)
        whole = _every(_conjunction(filter))
        conds += [] if whole == TRUE else list(whole.values) if whole.kind == "and" else [whole]
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
