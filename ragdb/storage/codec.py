"""How values are written into the tables: JSON text (sorted keys), ISO-8601 UTC times, and the
numbers range filters compare for a metadata value (:func:`meta_number`)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from typing import Any

import orjson

from ragdb.patterns import LazyPattern


def utcnow_iso() -> str:
    """Now as ISO-8601 UTC with microseconds (isoformat: several times faster than strftime)."""
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")[:-6] + "Z"


def _holds_a_huge_whole_float(value: Any) -> bool:
    stack = [value]
    while stack:
        v = stack.pop()
        kind = type(v)
        if kind is float:
            if abs(v) >= 9.223372036854775808e18 and v.is_integer():
                return True
        elif kind is dict:
            stack.extend(v.values())
        elif kind is list:
            stack.extend(v)
    return False


def dumps(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def loads(text: str | bytes) -> Any:
    return orjson.loads(text)


def loads_exact(text: str | bytes) -> Any:
    """JSON from outside ragdb (an imported record, a request body, a ``--where``), with every
    integer the number written. orjson reads an integer outside -2**63 .. 2**64-1 as a float
    that is another number (``2**70 + 1`` as ``1.1805916207174113e+21``), which would be stored
    or matched silently. A text whose reading holds such a float (whole, of magnitude 2**63 or
    more: the only floats such an integer becomes) is read again by the standard library, which
    keeps integers exact, so the library's checks refuse the number rather than store another.
    orjson reads it first: it checks the JSON (the standard library takes ``NaN`` and lone
    surrogates) and stays the fast path for every other text. (The walk over the values costs
    ~1 µs for a record; a regular expression looking for 19 digits in the text cost 20 µs for
    a 1.5 KB line.)"""
    value = orjson.loads(text)
    if not _holds_a_huge_whole_float(value):
        return value
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as e:
        # raised as orjson's, which callers catch: an integer of more than 4,300 digits, or nesting
        # orjson reads (up to 1,024 levels) and the standard library's recursion does not
        raise orjson.JSONDecodeError(str(e), text if isinstance(text, str) else text.decode("utf-8", "replace"), 0) from None


# An ISO-8601 date, optionally with a time (seconds and a fraction optional) and, with a
# time, a UTC offset: 2024-05-01, 2024-05-01T09:30, 2024-05-01 09:30:00.5+02:00, ...Z.
# One pattern for every Python version (fromisoformat accepts more forms from 3.11 on).
_ISO = LazyPattern(r"(\d{4})-(\d{2})-(\d{2})"
                  r"(?:[T ](\d{2}):(\d{2})(?::(\d{2})(?:[.,](\d{1,9}))?)?(Z|z|[+-]\d{2}:?\d{2})?)?")


def iso_instant(text: str) -> float | None:
    """Epoch seconds of ``text`` when it is an ISO-8601 date or date-time (see ``_ISO``;
    naive times are UTC, a fraction past microseconds is cut), else None."""
    m = _ISO.fullmatch(text)
    if m is None:
        return None
    year, month, day, hour, minute, second, frac, zone = m.groups()
    tz = timezone.utc
    if zone and zone not in "Zz":
        sign = -1 if zone[0] == "-" else 1
        digits = zone[1:].replace(":", "")
        hours, minutes = int(digits[:2]), int(digits[2:])
        if hours > 23 or minutes > 59:
            return None
        tz = timezone(sign * timedelta(hours=hours, minutes=minutes))
    try:
        dt = datetime(int(year), int(month), int(day), int(hour or 0), int(minute or 0), int(second or 0),
                      int((frac or "0")[:6].ljust(6, "0")), tzinfo=tz)
        return dt.timestamp()
    except (ValueError, OverflowError):
        return None


def meta_number(value: Any) -> tuple[int | float | None, float | None]:
    """``(num, at)`` of a metadata value in ``doc_meta``: a number is its own ``num``, an
    ISO-8601 date string's epoch seconds its ``at``; anything else (booleans, other
    strings) has neither. Range filters compare them: numbers with numbers, dates with dates."""
    if isinstance(value, bool):
        return None, None
    if isinstance(value, (int, float)):
        return value, None
    if isinstance(value, str):
        return None, iso_instant(value)
    return None, None
