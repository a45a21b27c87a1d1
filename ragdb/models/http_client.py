"""The one HTTP layer of ragdb: JSON POSTs and Server-Sent-Event streams over httpx.

Chat (:mod:`ragdb.answers.llm`), embeddings (:mod:`ragdb.models.embeddings`) and rerank
(:mod:`ragdb.models.rerank`) all talk to their servers through an :class:`Endpoint`;
nothing else in ragdb does HTTP. The policy, the same for every endpoint:

* **Retries.** HTTP 408, 429 and 5xx answers, failed or timed-out connects, and
  connections that break before an answer are retried, at most ``max_retries``
  times (``max_retries + 1`` attempts in all). A read timeout (the server took
  the request but did not answer within ``timeout``) is retried only where the
  endpoint says so (``retry_read_timeout``; the chat client does not, as the
  model may still be generating); so is an answer whose body takes more than
  ``timeout`` to arrive after its headers (a server trickling it out).
  TLS certificate failures and other 4xx
  answers are not retried. Before retry ``n`` (0-based) ragdb waits the server's
  ``Retry-After`` (delta-seconds or an HTTP-date) if it sent one, else
  ``backoff * 2**n`` seconds plus up to 25 % jitter; either is capped at
  ``max_backoff``. A stream is retried only until the answer's status arrives;
  once text has been yielded, a failure raises.
* **Size.** An answer's body, a stream's too, is read up to :data:`MAX_REPLY_BYTES` (256 MiB,
  after decoding ``Content-Encoding``); a larger one raises, not retried.
* **Redirects are never followed.** A 3xx answer raises the endpoint's error
  naming the status and the (scrubbed) ``Location``: following it would send the
  ``Authorization`` header, or the body, to another server.
* **API keys** (:func:`resolve_api_key`): a key given explicitly or set in the
  client's ragdb variable (``RAGDB_LLM_API_KEY``, ``RAGDB_EMBED_API_KEY``,
  ``RAGDB_RERANK_API_KEY``), even to an empty string, goes to the configured
  server; otherwise ``OPENAI_API_KEY`` is used only for OpenAI's own API
  (``https://api.openai.com``) or for a base URL that came from
  ``OPENAI_BASE_URL``; otherwise no key (and no ``Authorization`` header).
  A URL's ``user:password@`` is never part of the URL sent or shown; it is sent
  as HTTP Basic authentication when no API key is set.
* **Redaction** (:func:`redact`): every error message and log line is passed
  through one function that masks every run of 4 or more characters of the API
  key in use and of the URL password (after a prefix such as ``sk-`` or
  ``Bearer``, which is not secret), as sent or JSON-escaped, %-encoded or
  HTML-escaped; also ``Bearer``/``Basic`` credentials, ``sk-...`` style keys and
  URL userinfo. Server text is redacted in full before it is cut to 300
  characters. Errors are raised outside ``except`` blocks, so no chained
  exception (``__cause__`` or ``__context__``) carries the request, its headers
  or the body.

Failures raise the error class the endpoint was built with
(:class:`~ragdb.errors.LLMError`, :class:`~ragdb.errors.EmbeddingError`,
:class:`~ragdb.errors.RerankError`, all :class:`~ragdb.errors.RemoteError`),
with a message naming what was requested, the URL and the problem. Bad
arguments raise :class:`~ragdb.errors.InvalidInput`. The module never prints;
retries are logged at DEBUG level on the ``ragdb.models.http_client`` logger.
"""

from __future__ import annotations

import ipaddress

import base64
import email.utils
import html
import json
import logging
import math
import os
import random
import re
import ssl
import time
import urllib.parse
from collections.abc import Callable, Generator, Iterable, Sequence
from typing import Any, TypeVar

import httpx

from ragdb.errors import InvalidInput, RemoteError

__all__ = [
    "Endpoint",
    "MAX_REPLY_BYTES",
    "RETRY_STATUSES",
    "OPENAI_HOST",
    "check_base_url",
    "display_url",
    "openai_key_for",
    "parse_retry_after",
    "redact",
    "resolve_api_key",
    "secret_part",
]

# how a retry waits (a test records the waits through it instead of timing them)
sleep = time.sleep

log = logging.getLogger("ragdb.models.http_client")
_T = TypeVar("_T")

#: Statuses answered by a retry (besides connection failures): 408, 429, 5xx.
RETRY_STATUSES = frozenset({408, 429, *range(500, 600)})
#: The host whose API may receive ``OPENAI_API_KEY`` without being named with it.
OPENAI_HOST = "api.openai.com"

_MAX_ERROR_BODY = 64 * 1024  # bytes of an error body read
#: The most bytes of an answer's body read (after gzip/deflate/br decoding): a bigger one
#: (a compressed bomb, a server gone wrong) raises instead of filling the memory.
MAX_REPLY_BYTES = 256 << 20
_MAX_QUOTE = 300  # characters of server text quoted in an error message
_GRAM = 4  # every run of this many characters of a secret's secret part is masked
_MASK = "***"
_MASK_CHARS = "*#~\u2022"  # the mask is 3 of the first of these that no secret holds
_MAX_ROUNDS = 8  # masking rounds at most (one is enough unless a secret holds all of those)

# Conventional key prefixes: not secret themselves, everything after them is.
_KEY_PREFIX_RE = re.compile(
    r"(?:(?i:bearer|basic|token)(?:\s+|%20))?"
    r"(?:sk-(?:proj-|svcacct-|admin-|ant-(?:api\d+-|admin\d+-)?|or-v1-)?"
    r"|[sprk]k_(?:live|test)_"
    r"|gh[pousr]_|github_pat_|glpat-|hf_|xox[abposr]-|gsk_|nvapi-|pplx-|r8_|AIza)?"
)
# "Bearer <token>" / "Basic <token>", where the token looks like one (a digit, one of
# + / = _ ~ % \, or a capital after its first letter): "Basic authentication" stays.
_AUTH_RE = re.compile(
    r"\b((?i:bearer|basic))(\s+|%20)"
    r"(?=[A-Za-z0-9_\-.+/=~%\\]*[0-9+/=_~%\\]|[A-Za-z][a-z]*[A-Z])[A-Za-z0-9_\-.+/=~%\\]+"
)
_SK_RE = re.compile(r"\bsk-[A-Za-z0-9_\-]{8,}")
# scheme://user:password@ (also with JSON-escaped slashes) and its URL-quoted form
_USERINFO_RE = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*:(?://|\\/\\/))[^\s/?#@]*@")
_QUOTED_USERINFO_RE = re.compile(
    r"(?i)\b([a-z][a-z0-9+.\-]*%3A%2F%2F)(?:[^\s/?#@%]|%(?!2F|3F|23|40)[0-9A-F]{2})*%40"
)
_KEY_CHARS_RE = re.compile(r"[\x21-\x7e]*")
# Decodings under which an echoed secret is looked for (see redact): backslash
# escapes (JSON's \/ \" \\ \uXXXX with surrogate pairs, Python's \xXX \UXXXXXXXX;
# any other \c as c), runs of %XX (UTF-8 where valid), HTML character references.
_BACKSLASH_RE = re.compile(
    r"\\(?:u([dD][89abAB][0-9a-fA-F]{2})\\u([dD][c-fC-F][0-9a-fA-F]{2})"
    r"|u([0-9a-fA-F]{4})|U([0-9a-fA-F]{8})|x([0-9a-fA-F]{2})|(.))",
    re.S,
)
# The same hex escapes wherever they start, even after a backslash: "\\\u0041" reads
# as a backslash and "u0041" above, but as "\\A" to someone who reads it otherwise.
_HEX_ESCAPE_RE = re.compile(
    r"\\(?:u([dD][89abAB][0-9a-fA-F]{2})\\u([dD][c-fC-F][0-9a-fA-F]{2})"
    r"|u([0-9a-fA-F]{4})|U([0-9a-fA-F]{8})|x([0-9a-fA-F]{2}))()"
)
_PERCENT_RE = re.compile(r"(?:%[0-9a-fA-F]{2})+")
# The same, only those that are printable ASCII: "%%a0%2F" reads as "%", byte A0 and
# "/" above, but as "%a0/" to someone who does not take %a0 for a byte.
_ASCII_PERCENT_RE = re.compile(r"%(?:2[0-9a-fA-F]|[3-6][0-9a-fA-F]|7[0-9a-eA-E])")
_ENTITY_RE = re.compile(r"&(?:#[0-9]{1,7}|#[xX][0-9a-fA-F]{1,6}|[A-Za-z][A-Za-z0-9]{1,31});")
_SHORT_BOUND = "A-Za-z0-9"  # a secret under 4 characters is masked only as a whole word


# --------------------------------------------------------------------------- redaction and URLs

# How redact() finds a secret (the key in use, a URL password), efficiently:
#
# * Its *secret part* is the secret without a conventional prefix (``sk-``,
#   ``sk-proj-``, ``Bearer ``..., see _KEY_PREFIX_RE); if fewer than 4 characters
#   are left, its last 4. Every 4-character window of the secret part goes into
#   one set of "grams" (a few hundred strings at most). The whole secret is
#   replaced first, prefix and all.
# * The text is read in *views*: as it is, and as decoded by each of the decoders
#   (backslash escapes; hex ones alone; %XX; printable ones alone; HTML references),
#   applied again to a decoded view (so \\u002F and %252F are seen too), only where
#   the view holds the decoder's trigger character. Each character of a view
#   remembers the span of the text it came from. If a secret part holds a backslash or a quote, views of the text
#   as repr() and json.dumps() write it are added too (so repr(error) is covered).
# * Every window of 4 view characters that is a gram marks its span of the text.
#   The union of the windows is exactly the union of the occurrences of the secret
#   part's substrings of 4+ characters (each such occurrence is a chain of
#   overlapping grams, and each gram is one), so no "extend the match" step is
#   needed. The marked spans are merged and each is replaced by "***" (or "###",
#   ... if a secret holds "*": a mask that no piece of a secret can overlap, so
#   one round is enough; rounds are repeated, up to 8, only in case a secret holds
#   every mask character). One round costs a set look-up per character and view:
#   linear in the text, whatever the length of the key.
#
# Matching is case-sensitive (the key as sent): masking "test" because a key holds
# "TEST" would blank ordinary words. No secret, no masking of words: then only the
# generic rules (Bearer/Basic credentials, sk-... keys, URL userinfo) apply.

# A view: its text; where in the text each of its characters starts and ends; the
# positions of its decoded characters (None for the text itself).
_View = tuple[str, Sequence[int], Sequence[int], "list[int] | None"]


def redact(text: str, *secrets: str | None) -> str:
    """``text`` with credentials removed: every run of 4+ characters of each of
    ``secrets``' secret part (the key in use, a URL password; without a prefix such
    as ``sk-`` or ``Bearer``), also where it is JSON-escaped, %-encoded or HTML-escaped;
    a secret under 4 characters where it is a whole word; ``Bearer``/``Basic``
    credentials, ``sk-...`` keys and URL ``user:password@`` parts.

    Redact the whole text and cut it after, never the other way round (a cut can
    leave a piece of the key that no longer matches the whole key)."""
    found = [s for s in secrets if s]
    # A mask made of a character no secret holds can never be part of a piece of one.
    mask = next((c * 3 for c in _MASK_CHARS if not any(c in s for s in found)), _MASK)
    grams: set[str] = set()
    escaped = False
    for secret in found:
        if len(secret) < _GRAM:  # so short a secret is masked only where it is a whole word
            if secret.strip(mask[0]):
                bounded = f"(?<![{_SHORT_BOUND}]){re.escape(secret)}(?![{_SHORT_BOUND}])"
                text = re.sub(bounded, mask, text)
            continue
        text = text.replace(secret, mask)  # whole, prefix and all; then the pieces
        part = secret_part(secret)
        grams.update(part[i : i + _GRAM] for i in range(len(part) - _GRAM + 1))
        escaped = escaped or any(c in part for c in "\\'\"")
    text = _AUTH_RE.sub(lambda m: f"{m.group(1)}{m.group(2)}{mask}", text)
    text = _SK_RE.sub("sk-" + mask, text)
    text = _USERINFO_RE.sub(r"\1", text)
    text = _QUOTED_USERINFO_RE.sub(r"\1", text)
    for _ in range(_MAX_ROUNDS if grams else 0):
        spans = sorted(span for view in _views(text, escaped) for span in _windows(view, grams))
        if not spans:
            break
        pieces, pos = [], -1  # pos: the end of the mask written last
        for start, end in spans:
            if start > pos:  # a new mask; one touching or overlapping the last extends it
                pieces += [text[max(pos, 0) : start], mask]
            pos = max(pos, end)
        pieces.append(text[pos:])
        text = "".join(pieces)
    return text


def secret_part(secret: str) -> str:
    """The part of ``secret`` that :func:`redact` masks every 4-character run of:
    ``secret`` without a conventional prefix (``sk-``, ``sk-proj-``, ``Bearer ``,
    ``ghp_``, ...), or its last 4 characters (all of it if shorter) if fewer
    would be left."""
    match = _KEY_PREFIX_RE.match(secret)
    rest = secret[match.end() :] if match else secret
    return rest if len(rest) >= _GRAM else secret[-_GRAM:]


def _windows(view: _View, grams: set[str]) -> Generator[tuple[int, int], None, None]:
    """The spans of the text under each window of ``view`` that is one of ``grams``.

    Only the windows of a decoded view that hold a decoded character are looked at:
    any other window is one of the view it was decoded from, looked at already."""
    s, starts, ends, changed = view
    last = len(s) - _GRAM
    if changed is None:
        places: Iterable[int] = range(last + 1)
    else:
        places = sorted({k for c in changed for k in range(max(c - _GRAM + 1, 0), min(c, last) + 1)})
    for k in places:
        if s[k : k + _GRAM] in grams:
            yield starts[k], ends[k + _GRAM - 1]


def _views(text: str, escaped: bool) -> list[_View]:
    """``text`` itself and its decodings, up to two levels deep (see the comment above)."""
    first: _View = (text, range(len(text)), range(1, len(text) + 1), None)
    views, level, seen = [first], [first], {text}
    for _ in range(2):
        deeper = []
        for view in level:
            for trigger, pattern, convert in _DECODERS:
                if trigger in view[0]:
                    decoded = _decode(view, pattern, convert)
                    if decoded[0] not in seen:
                        seen.add(decoded[0])
                        deeper.append(decoded)
        views += deeper
        level = deeper
    if escaped and text:
        # As repr() or json.dumps() show the text: \\, \n, \x00, \u00e9, \' or \" escapes,
        # between the quotes they add (shown as parts of the first and last character).
        for escape, enclose, ascii_only in _ESCAPINGS:
            s, starts, ends, changed = _decode(first, _ESCAPED_RE, _escaper(escape, ascii_only))
            assert changed is not None
            views.append((
                enclose + s + enclose,
                [0, *starts, len(text) - 1],
                [1, *ends, len(text)],
                [0, *(c + 1 for c in changed), len(s) + 1],
            ))
    return views


_Pieces = list[tuple[str, int, int]]  # decoded characters with their span in the match


def _decode(view: _View, pattern: re.Pattern[str], convert: Callable[[re.Match[str]], _Pieces]) -> _View:
    """``view`` with each match of ``pattern`` replaced by what ``convert`` makes of it."""
    s, starts, ends, _ = view
    out: list[str] = []
    new_starts: list[int] = []
    new_ends: list[int] = []
    changed: list[int] = []
    pos = 0
    for m in pattern.finditer(s):
        pieces = convert(m)
        if not pieces:
            continue  # left as it is
        a = m.start()
        out.append(s[pos:a])
        new_starts.extend(starts[pos:a])
        new_ends.extend(ends[pos:a])
        for char, i, j in pieces:
            changed.append(len(new_starts))
            out.append(char)
            new_starts.append(starts[a + i])
            new_ends.append(ends[a + j - 1])
        pos = m.end()
    out.append(s[pos:])
    new_starts.extend(starts[pos:])
    new_ends.extend(ends[pos:])
    return "".join(out), new_starts, new_ends, changed


def _code_point(hex_digits: str) -> str | None:
    value = int(hex_digits, 16)
    return chr(value) if value <= 0x10FFFF else None


def _backslash(m: re.Match[str]) -> _Pieces:
    high, low, u4, u8, x2, other = m.groups()
    n = len(m.group(0))
    if high:
        value = 0x10000 + ((int(high, 16) - 0xD800) << 10) + (int(low, 16) - 0xDC00)
        return [(chr(value), 0, n)]
    # "\n" reads as "n", not as a newline: a key holds no newline, and a backslash
    # in front of an echoed key ("\" "bb") must not hide its first character.
    char = _code_point(u4 or u8 or x2) if (u4 or u8 or x2) else other
    return [(char, 0, n)] if char is not None else []


def _percent(m: re.Match[str]) -> _Pieces:
    data = bytes.fromhex(m.group(0).replace("%", ""))
    pieces: _Pieces = []
    i = 0
    while i < len(data):
        lead = data[i]
        size = 1 if lead < 0xC0 else 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4
        try:
            char = data[i : i + size].decode("utf-8")
        except UnicodeDecodeError:
            char, size = chr(lead), 1  # not UTF-8: the byte as Latin-1
        pieces.append((char, 3 * i, 3 * (i + size)))
        i += size
    return pieces


def _ascii_percent(m: re.Match[str]) -> _Pieces:
    return [(chr(int(m.group(0)[1:], 16)), 0, 3)]


def _entity(m: re.Match[str]) -> _Pieces:
    char = html.unescape(m.group(0))
    return [(char, 0, len(m.group(0)))] if len(char) == 1 else []


_ESCAPED_RE = re.compile(r"[^\x20-\x7e]|[\\'\"]")
# (quotes escaped, quotes around, \uXXXX for all non-ASCII): repr() of a text
# without ' or without ", repr() of one with both, json.dumps (ensure_ascii or not)
_ESCAPINGS = (("", "'", False), ("", '"', False), ("'", "'", False), ('"', '"', False), ('"', '"', True))


def _escaper(quotes: str, ascii_only: bool) -> Callable[[re.Match[str]], _Pieces]:
    """A converter writing a character as repr() does (backslash escapes, and
    ``quotes`` escaped), or as json.dumps() does by default (``ascii_only``)."""

    def escape(m: re.Match[str]) -> _Pieces:
        char = m.group(0)
        if char in "'\"":
            shown = "\\" + char if char in quotes else char
        elif ascii_only:
            shown = json.dumps(char)[1:-1]
        else:
            shown = "\\\\" if char == "\\" else repr(char)[1:-1]
        return [(c, 0, 1) for c in shown]

    return escape


_DECODERS: tuple[tuple[str, re.Pattern[str], Callable[[re.Match[str]], _Pieces]], ...] = (
    ("\\", _BACKSLASH_RE, _backslash),
    ("\\", _HEX_ESCAPE_RE, _backslash),
    ("%", _PERCENT_RE, _percent),
    ("%", _ASCII_PERCENT_RE, _ascii_percent),
    ("&", _ENTITY_RE, _entity),
)


def display_url(url: str) -> str:
    """``url`` as shown in messages: no ``user:password@``, no query, no fragment."""
    try:
        parts = urllib.parse.urlsplit(str(url))
    except ValueError:
        return "<invalid url>"
    netloc = parts.netloc.rpartition("@")[2]
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def check_base_url(base_url: object, *, name: str = "base_url") -> str:
    """``base_url`` stripped of spaces and trailing slashes; :class:`InvalidInput`
    unless it is an ``http://`` or ``https://`` URL with a host."""
    if not isinstance(base_url, str):
        raise InvalidInput(f"{name} must be a string, got {type(base_url).__name__}")
    base_url = base_url.strip().rstrip("/")
    try:
        parts = urllib.parse.urlsplit(base_url)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        raise InvalidInput(f"{name} is not a valid URL: {display_url(base_url)!r}") from None
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        raise InvalidInput(f"{name} must be an http(s) URL, got {display_url(base_url)!r}")
    return base_url


def openai_key_for(base_url: str) -> str:
    """``OPENAI_API_KEY`` when ``base_url`` is OpenAI's own API (https://api.openai.com),
    else "": an OpenAI key is never sent to another server unless it is passed or set
    in a ragdb variable explicitly."""
    parts = urllib.parse.urlsplit(str(base_url).strip())
    if parts.scheme.lower() == "https" and (parts.hostname or "").lower() == OPENAI_HOST:
        return os.environ.get("OPENAI_API_KEY", "")
    return ""


def resolve_api_key(
    explicit: str | None, env_var: str, base_url: str, *, openai_paired: bool = False
) -> str:
    """The API key for a client of ``base_url`` ("" for none); the one rule of ragdb.

    ``explicit`` (not None, even "") wins; then the ragdb variable ``env_var`` if it
    is set (even to ""); then ``OPENAI_API_KEY`` if ``openai_paired`` (the base URL
    came from ``OPENAI_BASE_URL``) or ``base_url`` is OpenAI's own API; else "".
    The key must be printable ASCII without spaces (:class:`InvalidInput` otherwise,
    naming where it came from but never showing it).
    """
    source = "api_key"
    if explicit is not None:
        key: Any = explicit
    elif env_var in os.environ:
        key, source = os.environ[env_var], f"api_key (from {env_var})"
    elif openai_paired:
        key, source = os.environ.get("OPENAI_API_KEY", ""), "api_key (from OPENAI_API_KEY)"
    else:
        key = openai_key_for(base_url)
        source = "api_key (from OPENAI_API_KEY)" if key else source
    if not isinstance(key, str):
        raise InvalidInput(f"{source} must be a string, got {type(key).__name__}")
    # Checked here because an HTTP library would quote an invalid header value
    # (the key) in its own error message.
    if not _KEY_CHARS_RE.fullmatch(key):
        raise InvalidInput(f"{source} must be printable ASCII with no spaces")
    return key


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` value: delta-seconds (a float is
    accepted) or an HTTP-date (seconds from ``now``, at least 0); None if absent
    or unreadable."""
    if value is None:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:  # RFC 9110 dates are GMT
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
        return max(0.0, seconds)
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def _number(name: str, value: Any, *, strict: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidInput(f"{name} must be a finite number of seconds, got {value!r}")
    if value < 0 or (strict and value == 0):
        raise InvalidInput(f"{name} must be {'> 0' if strict else '>= 0'} seconds, got {value!r}")
    return float(value)


def _ssl_failure(exc: BaseException) -> bool:
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, ssl.SSLCertVerificationError):
            return True
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return False


class _TooLarge(Exception):
    """A stream went past :data:`MAX_REPLY_BYTES`."""


_NEWLINE = re.compile(r"\r\n|\r|\n")


def _lines(response: httpx.Response) -> Generator[str, None, None]:
    """The lines of a stream (ended by CRLF, LF or CR, as ``response.iter_lines()`` reads them),
    with at most :data:`MAX_REPLY_BYTES` characters of it read (after ``Content-Encoding``);
    past that :class:`_TooLarge`. httpx's ``iter_lines`` holds a line until its end comes: a
    stream of one endless line (a gzip bomb) was read whole into memory."""
    total = 0
    pending = ""
    for piece in response.iter_text():
        total += len(piece)
        if total > MAX_REPLY_BYTES:
            raise _TooLarge()
        held = pending.endswith("\r")  # (held back from the piece before)
        pending += piece
        if not held and "\n" not in piece and "\r" not in piece:
            continue
        # a CR at the end may be the first half of a CRLF: it waits for the next piece
        cut = len(pending) - 1 if pending.endswith("\r") else len(pending)
        lines = _NEWLINE.split(pending[:cut])
        pending = lines.pop() + pending[cut:]
        yield from lines
    if pending:
        yield pending.removesuffix("\r")


class _Give(Exception):
    """An attempt failed: ``problem`` says how; ``retry`` whether to try again."""

    def __init__(self, problem: str, retry: bool, wait: float | None = None) -> None:
        super().__init__(problem)
        self.problem, self.retry, self.wait = problem, retry, wait


# --------------------------------------------------------------------------- endpoint


class Endpoint:
    """One remote URL with its key, timeout, retry policy and error class.

    ``url`` is the full URL POSTed to (``user:password@`` is taken out of it and
    sent as Basic authentication when ``api_key`` is empty). ``what`` names the
    request in messages (``"LLM request"``, ``"embedding request (model 'x')"``).
    ``error`` is the :class:`~ragdb.errors.RemoteError` subclass raised.
    See the module docstring for the policy.
    """

    def __init__(
        self,
        url: str,
        *,
        error: type[RemoteError],
        what: str,
        api_key: str = "",
        timeout: float = 60.0,
        max_retries: int = 2,
        backoff: float = 0.5,
        max_backoff: float = 30.0,
        retry_read_timeout: bool = True,
    ) -> None:
        if not (isinstance(error, type) and issubclass(error, RemoteError)):
            raise InvalidInput(f"error must be a RemoteError subclass, got {error!r}")
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise InvalidInput(f"max_retries must be an integer >= 0, got {max_retries!r}")
        self.timeout = _number("timeout", timeout, strict=True)
        self.backoff = _number("backoff", backoff, strict=False)
        self.max_backoff = _number("max_backoff", max_backoff, strict=False)
        self.max_retries = max_retries
        self.retry_read_timeout = bool(retry_read_timeout)
        self.error_class = error
        self.what = what
        check_base_url(url, name="url")
        parts = urllib.parse.urlsplit(url.strip())
        host = parts.netloc.rpartition("@")[2]
        self._url = urllib.parse.urlunsplit((parts.scheme, host, parts.path, parts.query, ""))
        self.shown = display_url(url)
        self._api_key = api_key
        password = urllib.parse.unquote(parts.password) if parts.password else None
        self._auth: httpx.BasicAuth | None = None
        basic = None
        if not api_key and (parts.username or parts.password):
            user = urllib.parse.unquote(parts.username or "")
            self._auth = httpx.BasicAuth(user, password or "")
            basic = base64.b64encode(f"{user}:{password or ''}".encode()).decode("ascii")
        # What redact() masks: the key, the URL password and the Basic credential sent.
        self._secrets = tuple(s for s in (api_key, password, basic if password else None) if s)

    def __repr__(self) -> str:
        return (
            f"Endpoint({self.shown!r}, what={self.what!r}, error={self.error_class.__name__}, "
            f"api_key={'***' if self._api_key else ''!r}, timeout={self.timeout:g}, "
            f"max_retries={self.max_retries})"
        )

    # ------------------------------------------------------------------ messages

    def redact(self, text: str) -> str:
        """:func:`redact` with this endpoint's key and URL password."""
        return redact(text, *self._secrets)

    def quote(self, raw: bytes | str) -> str:
        """Server text for a message: one line, at most 300 characters, redacted.

        The whole text is redacted before it is cut (a key echoed across the cut
        would otherwise be cut into a piece that no longer matches), and the cut
        text is redacted again (cutting, or joining lines, can change how it reads)."""
        text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
        text = " ".join(self.redact(text).split())
        if len(text) > _MAX_QUOTE:
            text = text[:_MAX_QUOTE] + "..."
        return self.redact(text)

    def error(self, problem: str) -> RemoteError:
        """The error to raise: ``"<what> to <url>: <problem>"``, redacted. Raise it
        outside any ``except`` block (or ``from None``) so it carries no other error."""
        return self.error_class(self.redact(f"{self.what} to {self.shown}: {problem}"))

    # ------------------------------------------------------------------ requests

    def session(self) -> httpx.Client:
        """An httpx client for several requests over kept-alive connections; use
        it as a context manager and pass it to :meth:`post_json`."""
        return httpx.Client(
            timeout=httpx.Timeout(self.timeout), follow_redirects=False, auth=self._auth
        )

    def post_json(self, payload: Any, *, client: httpx.Client | None = None) -> Any:
        """POST ``payload`` (JSON-able, or already encoded ``bytes``) and return the
        decoded JSON reply, retrying as the policy says. ``client``: one from
        :meth:`session`, to reuse its connections; by default a new one is used."""
        body = self._encode(payload)
        if client is None:
            with self.session() as http:
                raw = self._send(http, body)
        else:
            raw = self._send(client, body)
        try:
            return json.loads(raw)
        except (ValueError, UnicodeDecodeError, RecursionError):  # (nested too deeply to decode)
            pass  # raised below, so that the error has no __context__ holding the body
        raise self.error(f"the reply is not valid JSON: {self.quote(raw) or '(empty body)'}") from None

    def stream_events(self, payload: Any) -> Generator[str, None, None]:
        """POST ``payload`` asking for ``text/event-stream`` and yield the ``data`` of
        each Server-Sent Event (several ``data:`` lines of one event joined by
        newlines) as it arrives. Retried as the policy says until the answer
        starts; a stream that breaks or stalls for ``timeout`` midway raises."""
        body = self._encode(payload)
        failure = None
        with self.session() as http:
            response = self._send_stream(http, body)
            try:
                data: list[str] = []
                for line in _lines(response):
                    if not line:
                        if data:
                            yield "\n".join(data)
                            data = []
                        continue
                    field, _, value = line.partition(":")
                    if field == "data":
                        data.append(value[1:] if value.startswith(" ") else value)
                    # ": comment", "event:", "id:", "retry:" lines carry no data
                if data:  # a last event without its blank line
                    yield "\n".join(data)
            except _TooLarge:
                failure = f"the stream is larger than {MAX_REPLY_BYTES:,} bytes"
            except httpx.TimeoutException:
                failure = f"the stream stalled: timed out after {self.timeout:g}s waiting for more"
            except httpx.HTTPError as exc:
                failure = f"the stream broke: {self._describe(exc)}"
            finally:
                response.close()
        if failure is not None:  # raised here, so that the error has no __context__
            raise self.error(failure) from None

    # ------------------------------------------------------------------ internals

    def _encode(self, payload: Any) -> bytes:
        if isinstance(payload, bytes):
            return payload
        try:
            return json.dumps(payload, ensure_ascii=False).encode("utf-8")
        except (TypeError, ValueError) as exc:
            raise InvalidInput(f"{self.what}: the request is not JSON-serialisable: {exc}") from None

    def _headers(self, stream: bool) -> dict[str, str]:
        headers = {
            "Content-Type": "application/json",
            "Accept": "text/event-stream" if stream else "application/json",
            "User-Agent": "ragdb",
        }
        if self._api_key:
            headers["Authorization"] = "Bearer " + self._api_key
        return headers

    def _describe(self, exc: BaseException) -> str:
        text = str(exc)
        return f"{type(exc).__name__}: {text}" if text else type(exc).__name__

    def _send(self, http: httpx.Client, body: bytes) -> bytes:
        """The body of a 2xx answer, after retries; else raise."""

        def attempt() -> bytes:
            response = self._attempt(http, body, False)
            # httpx's timeout bounds each read, not the answer: a server sending a byte
            # now and then would hold the call for ever. The whole body gets one timeout.
            deadline = time.monotonic() + self.timeout
            raw = bytearray()
            too_big = False
            try:
                for piece in response.iter_bytes():
                    raw += piece
                    if len(raw) > MAX_REPLY_BYTES:
                        too_big = True
                        break
                    if time.monotonic() > deadline:
                        break
                else:
                    return bytes(raw)
            except httpx.ReadTimeout:
                raise _Give(f"timed out after {self.timeout:g}s waiting for the answer", self.retry_read_timeout) from None
            except httpx.HTTPError as exc:
                raise _Give(f"the connection broke: {self._describe(exc)}", True) from None
            finally:
                response.close()
            if too_big:
                raise _Give(f"the answer is larger than {MAX_REPLY_BYTES:,} bytes", False)
            raise _Give(f"timed out after {self.timeout:g}s reading the answer (it came too slowly)",
                        self.retry_read_timeout)

        return self._retrying(attempt)

    def _send_stream(self, http: httpx.Client, body: bytes) -> httpx.Response:
        """A 2xx answer whose body is not read yet, after retries; else raise."""
        return self._retrying(lambda: self._attempt(http, body, True))

    def _retrying(self, attempt: Callable[[], _T]) -> _T:
        """``attempt()`` until it succeeds or the policy gives up."""
        n = 0
        while True:
            try:
                return attempt()
            except _Give as caught:
                give = caught
            # Raised outside the except block, the error has no __context__ (the
            # _Give, and the httpx error under it); from None, no __cause__ either.
            if not give.retry or n >= self.max_retries:
                tries = f" after {n + 1} attempts" if n else ""
                raise self.error_class(
                    self.redact(f"{self.what} to {self.shown} failed{tries}: {give.problem}")
                ) from None
            if give.wait is not None:
                delay = give.wait
            else:
                delay = self.backoff * (2**n) * (1.0 + 0.25 * random.random())
            delay = min(delay, self.max_backoff)
            if log.isEnabledFor(logging.DEBUG):  # the whole line redacted, like an error
                log.debug("%s", self.redact(
                    f"{self.what} to {self.shown} failed ({give.problem}); "
                    f"retry {n + 1}/{self.max_retries} in {delay:.2f}s"
                ))
            sleep(delay)
            n += 1

    def _attempt(self, http: httpx.Client, body: bytes, stream: bool) -> httpx.Response:
        try:
            request = http.build_request("POST", self._url, content=body, headers=self._headers(stream))
            response = http.send(request, stream=True, follow_redirects=False)
        except (httpx.ConnectTimeout, httpx.PoolTimeout):
            raise _Give(f"timed out after {self.timeout:g}s connecting", True) from None
        except httpx.ReadTimeout:
            raise _Give(f"timed out after {self.timeout:g}s waiting for the answer", self.retry_read_timeout) from None
        except httpx.WriteTimeout:
            raise _Give(f"timed out after {self.timeout:g}s sending the request", True) from None
        except (httpx.ConnectError, httpx.ProxyError) as exc:
            problem = f"connection failed: {self._describe(exc)}"
            raise _Give(problem, not _ssl_failure(exc)) from None
        except (httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError) as exc:
            raise _Give(f"connection failed: {self._describe(exc)}", True) from None
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            raise _Give(f"request failed: {self._describe(exc)}", False) from None
        status = response.status_code
        if 200 <= status < 300:
            return response
        try:
            detail = "" if 300 <= status < 400 else self._error_detail(response)
        finally:
            response.close()
        if 300 <= status < 400:
            location = response.headers.get("Location")
            target = f" to {display_url(location)!r}" if location else ""
            raise _Give(
                f"HTTP {status} redirect{target} refused: ragdb never follows redirects, "
                "so credentials never go to another server",
                False,
            )
        if status in RETRY_STATUSES:
            wait = parse_retry_after(response.headers.get("Retry-After"))
            raise _Give(f"HTTP {status}{detail}", True, wait)
        raise _Give(f"HTTP {status}{detail}", False)

    def _error_detail(self, response: httpx.Response) -> str:
        """``": <message>"`` from an error body (JSON ``error.message`` / ``detail`` or the text)."""
        raw = bytearray()
        try:
            for piece in response.iter_bytes():
                raw += piece
                if len(raw) >= _MAX_ERROR_BODY:
                    break
        except (httpx.HTTPError, httpx.StreamError):
            pass
        text = bytes(raw[:_MAX_ERROR_BODY]).decode("utf-8", "replace").strip()
        try:
            data = json.loads(text)
        except (ValueError, RecursionError):  # not JSON, or nested too deeply to decode
            data = None
        if isinstance(data, dict):
            err = data.get("error", data)
            if isinstance(err, dict):
                err = err.get("message") or err.get("detail") or err
            elif isinstance(data.get("detail"), str):
                err = data["detail"]
            text = err if isinstance(err, str) else json.dumps(err, ensure_ascii=False)
        return f": {self.quote(text)}" if text else ""


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine only (127.0.0.0/8, ::1 or localhost): where
    ``ragdb serve`` and ``ragdb mcp --http`` listen unless told otherwise."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
