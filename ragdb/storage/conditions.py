"""Filter conditions as SQL: one walker, a dialect per database server.

:func:`condition_sql` turns a :class:`ragdb.query.filters.Condition` into a WHERE term on
``documents d`` (and, for ``contains``, ``chunks c``); :func:`doc_set_sql` turns a metadata
condition into ``SELECT doc_id FROM doc_meta ...``. The shape of the SQL (which tables,
how ``NOT``, ``$or``, access labels and kept versions combine) is written once here; what
differs between SQLite and PostgreSQL (a list of values, a glob, the text search function,
how booleans, times and numbers are bound) is a :class:`Dialect`'s: :data:`SQLITE` here,
``ragdb.storage.postgres.POSTGRES`` for PostgreSQL.

Every fragment is true or false, never NULL, so ``NOT`` is the complement; every key and
value is a bound parameter, appended to ``params`` in the order of the ``?`` marks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["COMPARE", "DOC_SETS", "Dialect", "SQLITE", "balanced", "condition_sql", "doc_set_sql", "mentions_chunks"]

COMPARE = {"gt": ">", "ge": ">=", "lt": "<", "le": "<="}  # ragdb.query.filters' range names -> SQL
DOC_SETS = ("meta", "tags", "value", "any_meta")  # conditions that are a set of document ids from doc_meta


def mentions_chunks(c: Any) -> bool:
    """Whether a condition (or one inside it) is on the chunk's text."""
    return c.kind == "contains" or (c.kind in ("and", "or", "not") and any(mentions_chunks(x) for x in c.values))


def balanced(parts: Sequence[str], op: str) -> str:
    """``(a OP b OP ...)`` nested as a balanced tree: SQLite refuses expressions deeper
    than 1000, which a left-deep chain of a long ``$or`` list would be."""
    if len(parts) <= 8:
        return "(" + f" {op} ".join(parts) + ")"
    mid = len(parts) // 2
    return f"({balanced(parts[:mid], op)} {op} {balanced(parts[mid:], op)})"


def _scalar(v: Any) -> Any:
    return int(v) if isinstance(v, bool) else v


class Dialect:
    """SQLite's SQL for the pieces that differ between servers (PostgreSQL's dialect
    overrides them)."""

    true, false = "1", "0"
    #: the function finding a substring: ``FN(text, needle) > 0`` (SQLite's ``instr`` on the text
    #: decoded: a stored text may be compressed, ragdb.storage.textcodec.register_functions)
    find = "ragdb_instr"

    def one_of(self, column: str, values: Sequence[Any], params: list[Any], sql_type: str) -> str:
        """``column`` equal to one of ``values`` (``sql_type``: their PostgreSQL type)."""
        params.extend(values)
        return f"{column} IN ({','.join('?' * len(values))})"

    def label_in(self, values: Sequence[Any], params: list[Any]) -> str:
        """``label`` is one of the caller's ``values`` (none: no label)."""
        params.extend(values)
        return f"label IN ({','.join('?' * len(values)) or 'NULL'})"

    def glob_any(self, column: str, patterns: Sequence[str], params: list[Any]) -> str:
        """``column`` matches one of the glob ``patterns``."""
        params.extend(patterns)
        return balanced([f"{column} GLOB ?"] * len(patterns), "OR")  # (1,000 patterns in a chain: too deep)

    def time(self, value: Any) -> Any:
        """A time bound (epoch seconds) as it is bound."""
        return value

    def flag(self, value: bool) -> Any:
        return int(value)

    def value_in(self, values: Sequence[Any], params: list[Any]) -> str:
        """A metadata ``value`` equal to one of ``values`` (JSON scalars)."""
        params.extend(_scalar(v) for v in values)
        return f"value IN ({','.join('?' * len(values))})"

    def bound(self, column: str, op: str, value: Any, params: list[Any]) -> str:
        """``num`` (exact numbers) or ``at`` (dates) compared with ``value``."""
        params.append(value)
        return f"{column} {COMPARE[op]} ?"

    def pairs_in(self, pairs: Sequence[tuple[str, Sequence[Any]]], params: list[Any]) -> str:
        """The ``doc_id`` of the ``doc_meta`` rows whose (key, value) is one of ``pairs``
        ((key, values), ...): one join over a list of pairs, read from the (key, value)
        index, however many keys there are."""
        rows = [(key, _scalar(v)) for key, values in pairs for v in values]
        for row in rows:
            params.extend(row)
        return ("SELECT m.doc_id FROM (VALUES " + ",".join(["(?,?)"] * len(rows))
                + ") v CROSS JOIN doc_meta m ON m.key = v.column1 AND m.value = v.column2")


SQLITE = Dialect()


def doc_set_sql(d: Dialect, c: Any, params: list[Any]) -> str:
    """``SELECT doc_id FROM doc_meta ...`` of a meta, tags or value condition, its
    parameters appended to ``params``."""
    if c.kind == "any_meta":
        return d.pairs_in(c.values, params)
    if c.kind in ("meta", "tags"):
        params.append(c.key if c.kind == "meta" else "tags")
        return f"SELECT doc_id FROM doc_meta WHERE key = ? AND {d.value_in(c.values, params)}"
    tests = ["key = ?"]
    params.append(c.key)
    for test in c.values:
        if test[0] == "in":
            tests.append(d.value_in(test[1], params) if test[1] else d.false)
        else:  # ("num" | "date", op, bound): numbers compare with numbers (num), dates with dates (at)
            tests.append(d.bound("num" if test[0] == "num" else "at", test[1], test[2], params))
    return f"SELECT doc_id FROM doc_meta WHERE {' AND '.join(tests)}"


def condition_sql(d: Dialect, c: Any, public_unlabeled: bool, params: list[Any]) -> str:
    """The SQL of one condition on ``documents d`` (and, for ``contains``, ``chunks c``),
    its parameters appended to ``params``."""
    kind = c.kind
    if kind in ("and", "or"):
        if not c.values:
            return d.true if kind == "and" else d.false
        return balanced([condition_sql(d, x, public_unlabeled, params) for x in c.values], kind.upper())
    if kind == "not":
        return f"NOT ({condition_sql(d, c.values[0], public_unlabeled, params)})"
    if kind in DOC_SETS:
        return f"d.id IN ({doc_set_sql(d, c, params)})"
    vals = [_scalar(v) for v in c.values]
    if kind == "source":
        return d.one_of("d.source", vals, params, "text")
    if kind == "source_glob":
        return d.glob_any("d.source", vals, params)
    if kind == "version":
        return f"coalesce({d.one_of('d.version', vals, params, 'text')}, {d.false})"  # no version: false, not NULL
    if kind == "version_set":
        return "d.version IS NOT NULL"
    if kind == "ts":
        if vals[0] == "in":
            return d.one_of("d.ts", [d.time(v) for v in vals[1:]], params, "double precision")
        params.append(d.time(vals[1]))
        return f"d.ts {COMPARE[str(vals[0])]} ?"
    if kind == "contains":  # a chunk's text: its own copy, or (NULL) the whole document's
        params.append(vals[0])
        return f"{d.find}(coalesce(c.text, d.text), ?) > 0"
    if kind == "since":
        params.append(d.time(vals[0]))
        return "d.ts >= ?"
    if kind == "until":
        params.append(d.time(vals[0]))
        return "d.ts <= ?"
    if kind == "as_of":
        params.extend([d.time(vals[0])] * 2)
        return "(d.ts <= ? AND (d.valid_to IS NULL OR d.valid_to > ?))"
    if kind == "principals":
        # A version is visible when its own labels allow it and, for a kept older version,
        # the latest version's labels allow it too: revoking access to a source revokes
        # it for its history.
        def allowed(t: str) -> str:  # t: a constant table alias
            labels = d.label_in(vals, params)
            params.append(d.flag(public_unlabeled))
            return f"({t}.id IN (SELECT doc_id FROM doc_acl WHERE {labels}) OR (? AND {t}.acl = '[]'))"

        mine = allowed("d")
        latest = allowed("l")
        return (f"({mine} AND (d.latest = 1 OR EXISTS (SELECT 1 FROM documents l "
                f"WHERE l.source = d.source AND l.latest = 1 AND {latest})))")
    raise ValueError(f"unknown condition {kind}")  # pragma: no cover - ragdb.query.filters makes only the kinds above
