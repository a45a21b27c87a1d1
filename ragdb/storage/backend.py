"""Which backend a database path names, and how to show it without its password.

A path is a PostgreSQL database when it is a libpq URL (``postgresql://...`` or
``postgres://...``) or a libpq key/value connection string that starts with one of
libpq's keywords (``service=kb``, ``host=db.internal dbname=kb``, ``dbname=kb``).
Anything else is a SQLite file (a file whose name starts like that is given as
``./service=kb``). libpq itself reads the rest: ``PG*`` environment variables
(``PGHOST``, ``PGUSER``, ``PGPASSWORD``, ``PGSERVICE``...), the service file
(``~/.pg_service.conf``, ``PGSERVICEFILE``) and the password file (``~/.pgpass``),
exactly as for psql.

Nothing here imports psycopg: deciding the backend costs a SQLite user nothing.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, quote, urlsplit, urlunsplit

from ragdb.patterns import LazyPattern

_URL = LazyPattern(r"^(postgresql|postgres)://", re.I)
# libpq's connection keywords (the ones a connection string plausibly starts with)
_KEYWORDS = ("service", "host", "hostaddr", "port", "dbname", "user", "password", "passfile", "options",
             "sslmode", "application_name", "connect_timeout", "target_session_attrs", "client_encoding")
_CONNINFO = LazyPattern(r"^\s*(?:" + "|".join(_KEYWORDS) + r")\s*=", re.I)
# password=VALUE in a key/value string: VALUE is a quoted string ('...' with \' and \\) or a bare word
_KV_PASSWORD = LazyPattern(r"(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|\S*)", re.I)
MASK = "***"


def is_postgres(path: str) -> bool:
    """Whether ``path`` names a PostgreSQL database (see the module docstring)."""
    return bool(_URL.match(path) or _CONNINFO.match(path))


def redact(path: str) -> str:
    """``path`` as messages, logs and ``stats`` show it: a URL's password (in its
    user info or a ``password=`` query parameter) and a key/value string's
    ``password=`` replaced by ``***``. A SQLite path is returned as it is."""
    if not is_postgres(path):
        return path
    if not _URL.match(path):
        return _KV_PASSWORD.sub(lambda m: m.group(1) + MASK, path)
    try:
        parts = urlsplit(path)
    except ValueError:  # not even a URL: show the scheme only
        return path.split("://", 1)[0] + "://" + MASK
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, hosts = netloc.rsplit("@", 1)
        if ":" in userinfo:
            userinfo = userinfo.split(":", 1)[0] + ":" + MASK
        netloc = f"{userinfo}@{hosts}"
    query = parts.query
    if query and re.search(r"(^|&)password=", query, re.I):
        query = "&".join(f"{quote(k, safe='')}={MASK if k.lower() == 'password' else quote(v, safe='/:,')}"
                         for k, v in parse_qsl(query, keep_blank_values=True))
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def password_of(path: str) -> str | None:
    """The password written in ``path`` (URL user info, ``password=`` parameter or
    key/value), if any: error texts are scrubbed of it before they are shown."""
    if _URL.match(path):
        try:
            parts = urlsplit(path)
        except ValueError:
            return None
        if parts.password:
            from urllib.parse import unquote

            return unquote(parts.password)
        for k, v in parse_qsl(parts.query, keep_blank_values=True):
            if k.lower() == "password":
                return v
        return None
    m = _KV_PASSWORD.search(path)
    if not m:
        return None
    value = m.group(2)
    if value.startswith("'") and value.endswith("'") and len(value) >= 2:
        value = re.sub(r"\\(.)", r"\1", value[1:-1])
    return value or None


def glob_regex(pattern: str) -> str | None:
    """A PostgreSQL regular expression (``~``) matching exactly the strings SQLite's
    ``GLOB pattern`` matches, or None when the pattern matches nothing.

    SQLite's rules (``patternCompare`` in its func.c): ``*`` any run of characters,
    ``?`` one character, ``[...]`` one character of the set (``[^...]`` not of it;
    a ``]`` first in the set is itself; ``a-z`` a range when ``-`` follows a
    character and precedes one that is not the closing ``]``; a set never closed
    matches nothing); every other character is itself, case-sensitively. Every
    character of the set is written as a ``\\uXXXX``/``\\UXXXXXXXX`` escape, so no
    character of the pattern is ever special to the regular expression."""
    out = ["^"]
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        i += 1
        if c == "*":
            if out[-1] != ".*":  # a run of * is one (1,600 of them were "too complex" for PostgreSQL)
                out.append(".*")
        elif c == "?":
            out.append(".")
        elif c == "[":
            invert = False
            if i < n and pattern[i] == "^":
                invert = True
                i += 1
            items: list[tuple[str, str]] = []
            if i < n and pattern[i] == "]":
                items.append(("]", "]"))
                i += 1
            prior = ""
            closed = False
            while i < n:
                c2 = pattern[i]
                i += 1
                if c2 == "]":
                    closed = True
                    break
                if c2 == "-" and i < n and pattern[i] != "]" and prior:
                    hi = pattern[i]
                    i += 1
                    items.pop()  # the prior character becomes the range's start
                    items.append((prior, hi))
                    prior = ""
                else:
                    items.append((c2, c2))
                    prior = c2
            if not closed:
                return None
            ranges = [(lo, hi) for lo, hi in items if lo <= hi]
            if not ranges:
                if not invert:
                    return None
                out.append(".")
                continue
            body = "".join(_esc(lo) if lo == hi else f"{_esc(lo)}-{_esc(hi)}" for lo, hi in ranges)
            out.append(f"[{'^' if invert else ''}{body}]")
        else:
            out.append(_esc(c))
    out.append("$")
    return "".join(out)


def _esc(c: str) -> str:
    cp = ord(c)
    return f"\\u{cp:04x}" if cp <= 0xFFFF else f"\\U{cp:08x}"
