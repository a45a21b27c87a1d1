"""Turn files into :class:`~ragdb.types.LoadedDocument` objects.

:func:`load_file` reads one file and picks a loader by its suffix (sniffing
the content when the suffix is unknown); :func:`load_bytes` does the same for
bytes in memory (standard input, tests); :func:`iter_files` walks a folder.

Loaders and what they add to ``metadata`` (every document also gets
``content_hash`` (SHA-256 hex of the raw bytes), ``size`` (bytes) and
``loader``; :func:`load_file` adds ``path`` (absolute) and ``mtime``
(ISO-8601, UTC, microseconds)):

* ``text`` -- any text encoding (UTF-8 first, then detection). ``encoding``.
* ``markdown`` -- markdown-it-py; the body is kept as Markdown source,
  YAML front matter becomes metadata (its ``acl``/``labels`` key becomes
  the document's access labels), headings become ``section`` spans. What
  is not content is left out: the front matter, HTML comments, link
  reference definitions (``[id]: http://...``), navigation link lists
  at the very top or bottom (see :func:`_clean_markdown`) and code fence
  lines (```` ```python ````, ``~~~``; the code stays; MyST directive
  fences such as ```` ```{note} ```` are read as RST directives, see
  :func:`_drop_fences`). ``encoding`` plus the front-matter keys.
* ``rst`` -- reStructuredText source; section titles (underline and
  overline adornments) become ``section`` spans and the first one the
  title, their adornment lines left out of the text; comments, hyperlink
  targets, substitution definitions, directive markup (``.. code-block::
  python``, ``.. note::``, option lines; ``toctree``, ``image`` ... whole)
  and ``::`` literal markers are left out, directive content stays (see
  :func:`_clean_rst`). ``encoding``.
* ``html`` -- visible text only; ``<title>`` (else the first ``<h1>``)
  becomes the title, ``<h1>``-``<h6>`` become ``section`` spans, page
  chrome (``<nav>``, page-level ``<header>``/``<footer>``, ARIA
  navigation/banner/contentinfo roles, breadcrumbs, "skip to content"
  links) is left out. ``encoding``.
* ``pdf`` -- pypdf; pages joined by a blank line, ``page`` spans (and ``section``, the
  heading path of the outline entry in force on the page, when the PDF has an outline). ``pages``
  (and ``author`` when the PDF names one).
* ``jsonl`` -- one document per line (ragdb layout or BEIR layout).
  ``line`` plus the record's ``metadata``, ``id``, ``version``, ``timestamp``;
  an ``acl`` field (a label or a list of labels) becomes its access labels.

Keys the loader sets itself (``path``, ``content_hash``, ``size``, ``mtime``,
``loader``, ``encoding``, ``pages``, ``line``) win over user keys of the same
name from front matter or a JSONL record's ``metadata``.

Nothing here prints. Every failure is a :class:`~ragdb.errors.LoaderError`
(or :class:`~ragdb.errors.MissingDependency` for a missing optional package)
whose message starts with the path or source and says what is wrong.
"""

from __future__ import annotations

import codecs
import contextlib
import dataclasses
import datetime as _dt
import hashlib
import importlib
import io
import logging
import math
import os
import re
import stat
import threading
import unicodedata
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import orjson

from ragdb import plugins
from ragdb.files import walk
from ragdb.text.analysis import is_blank
from ragdb.errors import InvalidInput, LoaderError, MissingDependency
from ragdb.records import LoadedDocument, Span
from ragdb.storage.codec import loads_exact

__all__ = ["SUPPORTED_SUFFIXES", "KINDS", "load_file", "load_read", "load_bytes", "iter_files", "all_kinds", "plugin_suffixes",
           "register_builtins"]

if TYPE_CHECKING:
    #: Suffixes :func:`load_file` recognises without sniffing (other files are sniffed, then read
    #: as text): those ragdb's own loaders register (see :func:`register_builtins`).
    SUPPORTED_SUFFIXES: frozenset[str]
    #: The loader kinds of ragdb itself accepted by :func:`load_bytes` (plugins add more:
    #: :func:`all_kinds`).
    KINDS: tuple[str, ...]
else:
    def __getattr__(name: str) -> Any:
        # computed from the plugin registry on use, not kept here: what register_builtins registers
        if name == "SUPPORTED_SUFFIXES":
            return plugins.builtin_suffixes()
        if name == "KINDS":
            return tuple(plugins.names("loader", builtin=True))
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

_SNIFF_BYTES = 8192
_MAX_HEADING_CHARS = 1000
_MAX_FRONT_MATTER_NODES = 10_000
_MAX_FRONT_MATTER_DEPTH = 50
# Above this (estimated) element nesting depth, lexbor's tree builder becomes
# quadratic (20 000 nested <div>s take a second, 100 000 take minutes), so such
# documents go to the streaming html.parser extractor, which is linear in depth
# (see _lexbor_fits).
_MAX_LEXBOR_DEPTH = 1000
# Above this many distinct tag and attribute names, lexbor's parse becomes quadratic (it
# interns each new name in a table searched linearly: 40,000 attributes on a tag took 5.5 s),
# so such documents go to html.parser too. Real pages use a few hundred at most.
_MAX_LEXBOR_NAMES = 5000
# MyST directives nested deeper than this are code kept as written, not Markdown read again:
# each level's content is parsed once more, so a document of n nested ```{note} lines (an
# unclosed fence runs to the end) was parsed n times (5,000 of them took 25 s).
_MAX_MYST_DEPTH = 10


# ============================================================================ public API


def load_file(path: str | os.PathLike[str], *, source: str | None = None,
              identity: walk.FileIdentity | None = None) -> list[LoadedDocument]:
    """Load one file as a list of documents (JSONL gives one per record, other kinds one).

    The loader is chosen by suffix (see :data:`SUPPORTED_SUFFIXES`); files
    with another suffix are sniffed (PDF header, HTML doctype) and otherwise
    read as plain text. ``source`` defaults to the path as given.
    ``identity``: the ``(device, inode)`` a walk saw (:attr:`ragdb.files.walk.Walk.identities`);
    a file that is not that file any more raises :class:`~ragdb.files.walk.FileChanged`
    (see :func:`ragdb.files.walk.read_file`: one descriptor, no FIFO blocks, no link followed out).
    Raises :class:`~ragdb.errors.LoaderError` naming ``path`` when the file
    cannot be read or is binary, empty, encrypted or broken.
    """
    where = os.fspath(path)
    if isinstance(where, bytes):  # pragma: no cover - os.PathLike[bytes]
        where = os.fsdecode(where)
    p = Path(where)
    if identity is None:
        try:
            st = p.stat()
        except FileNotFoundError:
            raise LoaderError(f"{where}: no such file") from None
        except OSError as e:
            raise LoaderError(f"{where}: cannot read: {e.strerror or e}") from None
        if stat.S_ISDIR(st.st_mode):
            raise LoaderError(f"{where}: is a directory, not a file")
        if not stat.S_ISREG(st.st_mode):
            raise LoaderError(f"{where}: not a regular file")
    try:
        data, st = walk.read_file(where, identity)
    except OSError as e:
        raise LoaderError(f"{where}: cannot read: {e.strerror or e}") from None
    return load_read(data, st, where=where, source=where if source is None else source)


def load_read(data: bytes, st: os.stat_result, *, where: str, source: str) -> list[LoadedDocument]:
    """Load the bytes ``data`` of the file ``where`` whose status was ``st`` (as
    :func:`ragdb.files.walk.read_file` gives them): :func:`load_file` once the file is read."""
    check_name(where, source)
    kind = plugins.suffix_kind(Path(where).suffix) or _sniff(data, jsonl=False)
    base: dict[str, Any] = {
        "path": os.path.abspath(where),
        "content_hash": hashlib.sha256(data).hexdigest(),
        "size": len(data),
        "mtime": _dt.datetime.fromtimestamp(st.st_mtime, _dt.timezone.utc).isoformat(timespec="microseconds"),
    }
    docs = _dispatch(data, kind, where=where, source=source, base=base)
    # A file's document is dated by its modification time, not by when it was added (issue 30,
    # item 13); a timestamp the file gives itself (a JSON Lines record's, front matter's) wins.
    return [doc if "timestamp" in doc.metadata else
            dataclasses.replace(doc, metadata={**doc.metadata, "timestamp": base["mtime"]}) for doc in docs]


def check_name(where: str, source: str) -> None:
    """Refuse a file whose name is not valid UTF-8 (Python holds its undecodable bytes as
    surrogates): ragdb stores sources and paths as text, and such a name has no text form."""
    for name in (where, source):
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:
            raise LoaderError(f"{name}: the file name is not valid UTF-8, and ragdb stores names as text; "
                              "rename the file") from None


def load_bytes(data: bytes, *, source: str, kind: str | None = None) -> list[LoadedDocument]:
    """Load bytes in memory (standard input, tests) as a list of documents.

    ``kind`` is one of :data:`KINDS` (``"text"``, ``"markdown"``, ``"html"``,
    ``"pdf"``, ``"jsonl"``; the suffixes ``"txt"``, ``"md"``, ``"htm"`` are
    accepted too) or ``None`` to sniff (PDF header, HTML doctype, a first
    line that is a JSON object with ``text`` or ``_id``; else plain text).
    Error messages name ``source``.
    """
    if not isinstance(source, str) or not source:
        raise InvalidInput(f"load_bytes needs a non-empty source string, got {source!r}")
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise InvalidInput(f"{source}: load_bytes needs bytes, got {type(data).__name__}")
    data = bytes(data)
    if kind is None:
        resolved = _sniff(data, jsonl=True)
    else:
        wanted = str(kind).lower().lstrip(".")
        found = plugins.find("loader", wanted) if ":" not in wanted else None
        resolved = found.provided.name if found is not None else ""
        if not resolved:
            raise InvalidInput(f"{source}: unknown kind {kind!r} (expected one of {', '.join(all_kinds())})")
    base: dict[str, Any] = {"content_hash": hashlib.sha256(data).hexdigest(), "size": len(data)}
    return _dispatch(data, resolved, where=source, source=source, base=base)


def iter_files(root: str | os.PathLike[str], *, recursive: bool = True, glob: str | None = None,
               include: Sequence[str] | None = None, exclude: Sequence[str] | None = None) -> Iterator[Path]:
    """Yield the files under ``root`` that ragdb indexes, in a deterministic (name-sorted, depth-first) order.

    The rules of :func:`ragdb.files.walk.walk` apply: version-control folders,
    virtualenvs, ``node_modules``, caches, build output, lockfiles,
    minified assets, binary types, hidden files and ``.gitignore``/
    ``.ragdbignore`` matches are left out (:func:`ragdb.files.walk.walk` says
    which and why). ``include``/``exclude`` are gitignore-style patterns
    relative to ``root``; ``glob`` (deprecated) is one more include pattern.
    Symbolic links to folders are followed, each real folder entered once.
    A ``root`` that is a file is yielded itself (if it matches). Raises
    :class:`~ragdb.errors.LoaderError` when ``root`` does not exist.
    """
    patterns = [*(include or ()), *([glob] if glob is not None else [])]
    found = walk.walk(root, recursive=recursive, include=patterns or None, exclude=exclude)
    for path, _rel in found.files:
        yield Path(path)


# ============================================================================ dispatch


def _dispatch(data: bytes, kind: str, *, where: str, source: str, base: dict[str, Any]) -> list[LoadedDocument]:
    found = plugins.find("loader", kind)
    if found is None or found.arg is not None:
        raise InvalidInput(f"{where}: unknown kind {kind!r}")  # pragma: no cover - guarded by callers
    if found.provided.builtin:
        docs: list[LoadedDocument] = found.provided.obj(data, source, where=where, base=base)
        return docs
    return _load_plugin(found.provided, data, where, source, base)


def _builtin(load: Callable[[bytes, str, str, Mapping[str, Any]], LoadedDocument | list[LoadedDocument]]
             ) -> Callable[..., list[LoadedDocument]]:
    """One of ragdb's own loaders as the registry holds it: callable as a plugin's loader is
    (``load(data, source)``, giving the documents with every loader's metadata), and by
    :func:`load_file` / :func:`load_bytes` with ``where`` (the path messages name) and the
    ``base`` metadata they computed."""

    def run(data: bytes, source: str, *, where: str | None = None,
            base: Mapping[str, Any] | None = None) -> list[LoadedDocument]:
        if base is None:
            base = {"content_hash": hashlib.sha256(data).hexdigest(), "size": len(data)}
        out = load(data, source if where is None else where, source, base)
        return out if isinstance(out, list) else [out]

    run.__name__ = run.__qualname__ = load.__name__.lstrip("_")
    run.__doc__ = load.__doc__
    return run


def register_builtins(register: Callable[..., None]) -> None:
    """Register ragdb's own loaders, the file suffixes they read and their other names (for
    ``load_bytes(kind=...)`` / ``--kind``) with the ``register`` callback of the
    ``register_loaders`` hook (called by the default plugin :mod:`ragdb.files.builtins`).
    :data:`SUPPORTED_SUFFIXES` and :data:`KINDS` are what this registers."""
    register("text", _builtin(_load_text), suffixes=[".txt", ".text"], aliases=["txt", "plain"])
    register("markdown", _builtin(_load_markdown), suffixes=[".md", ".markdown", ".mdown", ".mkd"],
             aliases=["md"])
    register("rst", _builtin(_load_rst), suffixes=[".rst", ".rest"], aliases=["rest", "restructuredtext"])
    register("html", _builtin(_load_html), suffixes=[".html", ".htm"], aliases=["htm"])
    register("pdf", _builtin(_load_pdf), suffixes=[".pdf"])
    register("jsonl", _builtin(_load_jsonl), suffixes=[".jsonl", ".ndjson"], aliases=["ndjson"])


# ============================================================================ plugin loaders


def all_kinds() -> tuple[str, ...]:
    """:data:`KINDS` and the loader kinds of installed plugins (see :mod:`ragdb.plugins`)."""
    return tuple(plugins.names("loader"))


def plugin_suffixes() -> dict[str, str]:
    """File suffix -> loader kind, for the loaders of installed plugins."""
    return {suffix: p.name for p in plugins.provided("loader").values() for suffix in p.suffixes}


def _load_plugin(found: Any, data: bytes, where: str, source: str, base: dict[str, Any]) -> list[LoadedDocument]:
    """Run a plugin's loader; its documents get the metadata every loader adds (``loader`` is
    the plugin's kind). Any failure is a :class:`LoaderError` naming the file and the plugin."""
    try:
        out = found.obj(data, source)
    except (LoaderError, MissingDependency):
        raise
    except Exception as e:  # a plugin's bug or a file it cannot read: one line, naming both
        raise LoaderError(f"{where}: the {found.name} loader (plugin {found.plugin!r}) failed: "
                          f"{type(e).__name__}: {' '.join(str(e).split())}") from e
    items: list[Any] = [out] if isinstance(out, (str, LoadedDocument)) else list(out) if out is not None else []
    docs: list[LoadedDocument] = []
    for item in items:
        if isinstance(item, str):
            item = LoadedDocument(text=item, source=source)
        if not isinstance(item, LoadedDocument):
            raise LoaderError(f"{where}: the {found.name} loader (plugin {found.plugin!r}) returned "
                              f"{type(item).__name__}, not a LoadedDocument or str")
        if not isinstance(item.text, str):
            raise LoaderError(f"{where}: the {found.name} loader (plugin {found.plugin!r}) returned a "
                              f"{type(item.text).__name__} text, not str")
        _require_text(item.text, where)
        docs.append(LoadedDocument(text=item.text, source=item.source or source, title=item.title,
                                   metadata=_meta(base, found.name, None, item.metadata), spans=item.spans,
                                   acl=item.acl))
    if not docs:
        raise LoaderError(f"{where}: the {found.name} loader (plugin {found.plugin!r}) found no document")
    return docs


def _sniff(data: bytes, *, jsonl: bool) -> str:
    """Guess the kind of unlabelled bytes: PDF, HTML, (JSON lines,) else text.

    Files are not sniffed as JSON lines: a ``.log`` of JSON records would
    otherwise silently turn into many documents with their own sources.
    """
    head = data[:1024]
    # a PDF's header may follow some junk (readers look in the first KiB), but then the file
    # ends as a PDF does: a script or README that mentions "%PDF-" is text
    if head.lstrip().startswith(b"%PDF-") or (b"%PDF-" in head and b"%%EOF" in data[-2048:]):
        return "pdf"
    start = data[:_SNIFF_BYTES]
    if start.startswith(codecs.BOM_UTF8):
        start = start[len(codecs.BOM_UTF8):]
    lead = start.lstrip().lower()
    if lead.startswith((b"<!doctype html", b"<html", b"<head", b"<body")):
        return "html"
    if jsonl and lead.startswith(b"{"):
        first = lead.split(b"\n", 1)[0]
        try:
            obj = orjson.loads(first)
        except orjson.JSONDecodeError:
            obj = None
        if isinstance(obj, dict) and (isinstance(obj.get("text"), str) or "_id" in obj):
            return "jsonl"
    return "text"


def _meta(base: Mapping[str, Any], loader: str, extra: Mapping[str, Any] | None = None,
          user: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """User keys first, then the loader's own keys (which win on a clash)."""
    out: dict[str, Any] = dict(user or {})
    out.update(base)
    out["loader"] = loader
    if extra:
        out.update(extra)
    return out


# ============================================================================ text decoding


_BOMS: tuple[tuple[bytes, str], ...] = (
    (codecs.BOM_UTF32_LE, "utf-32-le"),  # before UTF-16 LE: it starts with the same two bytes
    (codecs.BOM_UTF32_BE, "utf-32-be"),
    (codecs.BOM_UTF8, "utf-8"),
    (codecs.BOM_UTF16_LE, "utf-16-le"),
    (codecs.BOM_UTF16_BE, "utf-16-be"),
)
_NEWLINES = re.compile(r"\r\n?")


def _normalize(text: str) -> str:
    return _NEWLINES.sub("\n", text).replace("\x00", "")


def _codec_name(name: str) -> str | None:
    try:
        return codecs.lookup(name).name
    except (LookupError, TypeError, ValueError):
        return None


def _decode(data: bytes, where: str, declared: str | None = None) -> tuple[str, str]:
    """Bytes to text and the encoding used; refuses binary data and never fails on bad bytes."""
    if walk.looks_binary(data):
        raise LoaderError(f"{where}: looks binary (NUL or control bytes, or undecodable after a byte-order mark), "
                          "not text")
    for bom, enc in _BOMS:
        if data.startswith(bom):
            return _normalize(data[len(bom):].decode(enc, errors="replace")), enc.replace("-le", "").replace("-be", "")
    try:
        return _normalize(data.decode("utf-8")), "utf-8"
    except UnicodeDecodeError:
        pass
    if declared:
        name = _codec_name(declared)
        if name in ("iso8859-1", "ascii"):  # as browsers do (WHATWG Encoding): these labels mean windows-1252
            name = "cp1252"
        if name and name not in ("utf-8",) and not name.startswith(("utf-16", "utf-32")):
            try:
                return _normalize(data.decode(name)), name
            except (UnicodeDecodeError, LookupError):
                pass
    detected = _detect(data)
    if detected is not None:
        try:
            return _normalize(data.decode(detected, errors="replace")), detected
        except LookupError:  # pragma: no cover - charset-normalizer names are Python codecs
            pass
    try:
        return _normalize(data.decode("gb18030")), "gb18030"
    except UnicodeDecodeError:
        return _normalize(data.decode("latin-1")), "latin-1"


def _detect(data: bytes) -> str | None:
    """charset-normalizer's best guess, or None when it is not installed or has no guess."""
    try:
        from charset_normalizer import from_bytes
    except ImportError:
        return None
    try:
        best = from_bytes(data).best()
    except Exception:  # noqa: BLE001 - detection is best effort; decoding falls back below
        return None
    if best is None:
        return None
    return _codec_name(best.encoding)


def _require_text(text: str, where: str) -> None:
    if is_blank(text):
        raise LoaderError(f"{where}: empty (no text, or only whitespace and invisible characters)")


# ============================================================================ plain text


_ACL_LINE = re.compile(r"^(?:acl|labels)\s*[:=]", re.M)


def _leading_front_matter(text: str, where: str) -> tuple[dict[str, Any], str]:
    """Front matter of a text, reStructuredText or HTML file (Jekyll and Hugo put it on
    any page), read leniently: a leading ``---`` block that is not a YAML mapping is
    the file's own text (a rule line, say). Except when it names access labels
    (an ``acl:``/``labels:`` line): those are never silently dropped or indexed."""
    if not text.startswith(("---", "+++")):
        return {}, text
    try:
        return _split_front_matter(text, where)
    except (LoaderError, MissingDependency):
        head = text[:4096].split("\n---", 1)[0].split("\n+++", 1)[0]
        if _ACL_LINE.search(head):
            raise
        return {}, text


def _front_title(front: Mapping[str, Any]) -> str | None:
    value = front.get("title")
    if isinstance(value, (str, int, float)) and not isinstance(value, bool) and str(value).strip():
        return str(value).strip()
    return None


def _load_text(data: bytes, where: str, source: str, base: Mapping[str, Any]) -> LoadedDocument:
    text, encoding = _decode(data, where)
    _require_text(text, where)
    front, body = _leading_front_matter(text, where)
    acl = _take_acl(front, where)
    if front or body is not text:
        body = body.strip("\n").rstrip()
        if is_blank(body):
            raise LoaderError(f"{where}: empty (no text after the front matter)")
    return LoadedDocument(text=body, source=source, title=_front_title(front),
                          metadata=_meta(base, "text", {"encoding": encoding}, user=front), acl=acl)


# ============================================================================ markdown


_md_block: Any = None
_md_inline: Any = None


def _markdown_parsers(where: str) -> tuple[Any, Any]:
    global _md_block, _md_inline
    if _md_block is None:
        try:
            from markdown_it import MarkdownIt
        except ImportError:
            raise MissingDependency(
                f"{where}: reading Markdown needs markdown-it-py; install it with: pip install 'ragdb[markdown]'"
            ) from None
        # Block structure only for the whole document (inline parsing of every
        # paragraph is the slow part and is not needed); heading texts are
        # inline-parsed one by one with the second parser.
        block = MarkdownIt("commonmark")
        block.disable("inline")
        _md_inline = MarkdownIt("commonmark")
        _md_block = block
    return _md_block, _md_inline


def _toml_front_matter(text: str, where: str) -> tuple[dict[str, Any], str] | None:
    """(front matter, body) for TOML between a leading ``+++`` line and the next one (Hugo's
    form), or None when the text does not start so."""
    lines = text.split("\n")
    if lines[0].rstrip() != "+++":
        return None
    end = next((i for i in range(1, len(lines)) if lines[i].rstrip() == "+++"), None)
    if end is None:
        return None
    toml: Any = None
    for name in ("tomllib", "tomli"):  # the standard library's from Python 3.11; tomli before
        try:
            toml = importlib.import_module(name)
            break
        except ImportError:  # pragma: no cover - Python 3.10 without tomli
            continue
    if toml is None:  # pragma: no cover
        raise LoaderError(f"{where}: has TOML front matter, which needs Python 3.11 or the tomli package")
    try:
        loaded = toml.loads("\n".join(lines[1:end]))
        if isinstance(loaded.get("version"), float):
            # a version is text: "version = 1.10" is release 1.10, not the number 1.1, so
            # the version takes the float as written (parse_float hands over its text)
            loaded["version"] = toml.loads("\n".join(lines[1:end]), parse_float=str)["version"]
    except (toml.TOMLDecodeError, ValueError) as e:
        raise LoaderError(f"{where}: invalid TOML front matter: {e}") from None
    except RecursionError:  # tomllib recurses once per nested array or inline table
        raise LoaderError(f"{where}: invalid TOML front matter: nested too deeply") from None
    budget = [_MAX_FRONT_MATTER_NODES]
    out: dict[str, Any] = {}
    for key, value in loaded.items():
        conv = _jsonable(value, budget, 0, set(), where)
        if conv is not _DROP:
            out[str(key)] = conv
    return out, "\n".join(lines[end + 1:])


def _split_front_matter(text: str, where: str) -> tuple[dict[str, Any], str]:
    """(front matter, body): YAML between a leading ``---`` line and the next ``---``/``...``
    line, or TOML between two ``+++`` lines."""
    if text.startswith("+++"):
        toml_found = _toml_front_matter(text, where)
        if toml_found is not None:
            return toml_found
    if not text.startswith("---"):
        return {}, text
    lines = text.split("\n")
    if lines[0].rstrip() != "---":
        return {}, text
    end = None
    for i in range(1, len(lines)):
        if lines[i].rstrip() in ("---", "..."):
            end = i
            break
    if end is None:  # a lone leading '---' is a thematic break, not front matter
        return {}, text
    raw = "\n".join(lines[1:end])
    body = "\n".join(lines[end + 1:])
    try:
        import yaml
    except ImportError:
        raise LoaderError(
            f"{where}: has YAML front matter but PyYAML is not installed (pip install 'ragdb[loaders]')"
        ) from None
    try:
        loaded = yaml.safe_load(raw)
    except yaml.YAMLError as e:
        problem = " ".join(str(getattr(e, "problem", None) or e).split())
        mark = getattr(e, "problem_mark", None)
        if mark is not None:  # +2: the mark counts from 0 and the front matter starts on line 2
            problem += f" (line {mark.line + 2}, column {mark.column + 1})"
        raise LoaderError(f"{where}: invalid YAML front matter: {problem}") from None
    except RecursionError:
        raise LoaderError(f"{where}: invalid YAML front matter: nested too deeply") from None
    except (ValueError, TypeError, AttributeError, KeyError, OverflowError) as e:
        # PyYAML's constructors raise these for values such as "date: 2026-13-45" or "!!int abc"
        raise LoaderError(f"{where}: invalid value in YAML front matter: {e}") from None
    if loaded is None:
        return {}, body
    if not isinstance(loaded, dict):
        raise LoaderError(f"{where}: YAML front matter is a {type(loaded).__name__}, expected a mapping of keys")
    version = loaded.get("version")
    if isinstance(version, (int, float)) and not isinstance(version, bool):
        loaded["version"] = _yaml_scalar_text(yaml, raw, "version", version)
    budget = [_MAX_FRONT_MATTER_NODES]
    out: dict[str, Any] = {}
    for key, value in loaded.items():
        conv = _jsonable(value, budget, 0, set(), where)
        if conv is not _DROP:
            out[str(key)] = conv
    return out, body


def _yaml_scalar_text(yaml: Any, raw: str, key: str, value: Any) -> Any:
    """The text of the top-level YAML scalar ``key`` as written: a version is text, and YAML
    reads ``version: 1.10`` as the number 1.1 and ``version: 010`` as 8. ``value`` (what
    ``safe_load`` gave) when the node is not a plain scalar (an alias, a tagged value)."""
    node = yaml.compose(raw, Loader=yaml.SafeLoader)
    found: Any = value
    for key_node, value_node in getattr(node, "value", ()):  # the last of a key given twice, as safe_load
        if isinstance(key_node, yaml.ScalarNode) and key_node.value == key:
            found = value_node.value if isinstance(value_node, yaml.ScalarNode) and \
                not value_node.tag.startswith("!") else value
    return found


_DROP = object()
_INT64 = (-(2**63), 2**64 - 1)


def _jsonable(value: Any, budget: list[int], depth: int, active: set[int], where: str) -> Any:
    """A JSON-serialisable copy of a YAML value (dates to ISO strings); ``_DROP`` for what has no JSON form."""
    budget[0] -= 1
    if budget[0] < 0 or depth > _MAX_FRONT_MATTER_DEPTH:
        raise LoaderError(f"{where}: YAML front matter is too large or nested too deeply")
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return value if _INT64[0] <= value <= _INT64[1] else str(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else _DROP
    if isinstance(value, (_dt.datetime, _dt.date)):
        return value.isoformat()
    if isinstance(value, (list, tuple, set, frozenset, dict)):
        if id(value) in active:  # a YAML alias that contains itself
            return _DROP
        active.add(id(value))
        try:
            if isinstance(value, dict):
                out: dict[str, Any] = {}
                for k, v in value.items():
                    conv = _jsonable(v, budget, depth + 1, active, where)
                    if conv is not _DROP:
                        out[str(k)] = conv
                return out
            items = sorted(value, key=repr) if isinstance(value, (set, frozenset)) else value
            converted = (_jsonable(v, budget, depth + 1, active, where) for v in items)
            return [c for c in converted if c is not _DROP]
        finally:
            active.discard(id(value))
    return _DROP  # bytes (!!binary) and other exotic tags


def _one_line(text: str) -> str:
    """A heading or title as one line: runs of whitespace one space, and the invisible characters
    editors and converters leave in words (soft hyphen, zero-width space, word joiner, invisible
    operators, BOM) gone, so ``section`` and ``title`` read as a reader sees them (``Install guide``,
    not ``Install\\u200b guide``). Joiners (ZWJ, ZWNJ) and direction marks stay: they change how a
    script or an emoji is shown."""
    return " ".join(text.translate(_INVISIBLE).split())


_INVISIBLE = dict.fromkeys([0x00AD, 0x200B, 0x2060, 0x2061, 0x2062, 0x2063, 0x2064, 0xFEFF])


def _heading_text(inline_md: Any, content: str) -> str:
    try:
        tokens = inline_md.parseInline(content[:_MAX_HEADING_CHARS])
    except RecursionError:  # pragma: no cover - defensive
        return _one_line(content)
    parts: list[str] = []
    for tok in tokens:
        for child in tok.children or ():
            if child.type in ("text", "code_inline", "image"):
                parts.append(child.content)
            elif child.type in ("softbreak", "hardbreak"):
                parts.append(" ")
    return _one_line("".join(parts))


def _markdown_sections(text: str, where: str) -> tuple[list[Span], str | None, list[tuple[int, int, str, str]]]:
    """Section spans from heading tokens (each from its heading line to the next heading), the
    first H1, and the fenced code blocks (first line, end line, fence) of one parse."""
    block_md, inline_md = _markdown_parsers(where)
    try:
        tokens = block_md.parse(text)
    except RecursionError:
        raise LoaderError(f"{where}: Markdown nested too deeply to parse") from None
    line_starts = [0]
    line_starts.extend(m.end() for m in re.finditer("\n", text))
    headings: list[tuple[int, int, str]] = []  # (offset, level, text)
    fences: list[tuple[int, int, str, str]] = []  # first line, end line, fence, info string
    for i, tok in enumerate(tokens):
        if tok.type == "fence" and tok.map and tok.markup:
            fences.append((tok.map[0], tok.map[1], tok.markup, tok.info))
        if tok.type != "heading_open" or tok.level != 0 or not tok.map:
            continue
        inline = tokens[i + 1] if i + 1 < len(tokens) and tokens[i + 1].type == "inline" else None
        title = _heading_text(inline_md, inline.content) if inline is not None else ""
        if not title:
            continue
        line = tok.map[0]
        offset = line_starts[line] if line < len(line_starts) else len(text)
        headings.append((offset, int(tok.tag[1:]), title))
    return _section_spans(text, headings), _first_h1(headings), fences


_MYST_DIRECTIVE = re.compile(r"\{([\w][\w:+.-]*)\}\s*(.*)")


def _drop_fences(text: str, spans: Sequence[Span], fences: Sequence[tuple[int, int, str, str]],
                 where: str) -> tuple[str, list[Span]]:
    """``text`` without its code fence lines (```` ```python ````, ``~~~``), the code kept as
    written, and ``spans`` moved with it (issue 30, item 8). A fence line becomes one blank
    line between the code and what is around it (never two blank lines in a row, none at the start or end),
    so code blocks never run into each other or into prose; the fence of a list item's first
    line leaves the item's marker. A MyST directive (```` ```{note} ````) is read as the RST
    one is (see :func:`_clean_rst`): its content is Markdown, whose own fences go too; its
    option lines (``:caption: x``) go, and its argument stays where a reader sees it. A
    directive inside more than :data:`_MAX_MYST_DEPTH` others is a code block."""
    if not fences:
        return text, list(spans)
    lines = text.split("\n")
    n = len(lines)
    kind = [0] * n  # 0 text, 1 code, 2 fence line, 3 gone
    replace: dict[int, str] = {}
    todo = [(*fence, 1) for fence in fences]
    while todo:
        a, b, markup, info, depth = todo.pop()
        b = min(b, n)
        if a >= b:
            continue
        closing = re.compile(r"[ \t>]*" + re.escape(markup[0]) + "{" + str(len(markup)) + r",}[ \t]*")
        last = b - 1 if b - 1 > a and closing.fullmatch(lines[b - 1]) else b
        head = lines[a][:max(lines[a].find(markup), 0)]
        myst = _MYST_DIRECTIVE.fullmatch(info.strip()) if depth <= _MAX_MYST_DEPTH else None
        name = myst.group(1).lower() if myst else ""
        if myst and name in _RST_DROP_DIRECTIVES:
            for k in range(a, b):
                kind[k] = 3
            if head.strip(" \t>"):
                kind[a], replace[a] = 2, head.rstrip()
            continue
        for k in range(a + 1, b):
            kind[k] = 1
        kind[a] = 2
        if last < b:
            kind[last] = 2
        argument = myst.group(2).strip() if myst and name not in _RST_HIDDEN_ARGUMENT else ""
        if argument:  # a list item's marker ("- ```{note} x") or the indent, then the argument
            replace[a] = (head.rstrip() + " " if head.strip(" \t>") else head) + argument
        elif head.strip(" \t>"):
            replace[a] = head.rstrip()
        k = a + 1
        while myst and k < last and _RST_OPTION.match(lines[k].strip(" \t>")):
            kind[k] = 3  # the directive's options
            k += 1
        if myst and name not in _RST_LITERAL_DIRECTIVES and k < last:  # Markdown inside
            block_md, _ = _markdown_parsers(where)
            inner = block_md.parse("\n".join(lines[k:last]))
            for k2 in range(k, last):
                kind[k2] = 0
            todo.extend((k + t.map[0], k + t.map[1], t.markup, t.info, depth + 1) for t in inner
                        if t.type == "fence" and t.map and t.markup)
    out: list[str] = []
    new_start: list[int] = []  # each old line's offset in the new text
    size = 0
    squeeze = False  # since the last fence, blank lines do not pile up
    for k, line in enumerate(lines):
        new_start.append(size)
        if kind[k] >= 2:
            squeeze = True
            line = replace.get(k, "") if kind[k] == 2 else ""
            if not line and (kind[k] == 3 or not out or not out[-1].strip()):
                continue  # a blank line is there already
        elif not line.strip():
            if squeeze and (not out or not out[-1].strip()):
                continue
        else:
            squeeze = False
        size += len(line) + (1 if out else 0)
        if out:
            new_start[k] += 1  # the newline before this line
        out.append(line)
    while out and not out[-1].strip():
        out.pop()
    new = "\n".join(out)
    old_starts = [0]
    old_starts.extend(m.end() for m in re.finditer("\n", text))
    where_line = dict(zip(old_starts, new_start))

    def move(offset: int) -> int:
        return len(new) if offset >= len(text) else min(where_line.get(offset, len(new)), len(new))

    moved = [Span(move(sp.start), move(sp.end), sp.metadata) for sp in spans]
    return new, [sp for sp in moved if sp.end > sp.start]


def _section_spans(text: str, headings: Sequence[tuple[int, int, str]]) -> list[Span]:
    """``section`` spans of ``text`` from its headings (offset, level, title), in order:
    each from its heading to the next one, named by its heading path ("A > B")."""
    spans: list[Span] = []
    path: list[tuple[int, str]] = []
    for n, (offset, level, title) in enumerate(headings):
        while path and path[-1][0] >= level:
            path.pop()
        path.append((level, title))
        end = min(headings[n + 1][0] if n + 1 < len(headings) else len(text), len(text))
        if end > offset:
            spans.append(Span(offset, end, {"section": " > ".join(t for _, t in path)}))
    return spans


def _first_h1(headings: Sequence[tuple[int, int, str]]) -> str | None:
    return next((title for _offset, level, title in headings if level == 1), None)


#: Front-matter keys (and JSON Lines fields) that hold access labels instead of metadata.
ACL_KEYS: tuple[str, ...] = ("acl", "labels")


def _labels(value: Any, where: str, key: str) -> tuple[str, ...]:
    """Access labels from a front-matter value or JSON field: a label or a list of labels."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(v, str) and v.strip() for v in items):
        raise LoaderError(f"{where}: {key!r} must be a label or a list of labels (non-empty strings), "
                          f"got {value!r}")
    return tuple(sorted({v.strip() for v in items}))


def _take_acl(front: dict[str, Any], where: str) -> tuple[str, ...] | None:
    """Pop the access-label keys off front matter (they are not metadata)."""
    found: set[str] | None = None
    for key in ACL_KEYS:
        if key in front:
            value = front.pop(key)
            found = (found or set()) | set(_labels(value, where, key))
    return None if found is None else tuple(sorted(found))


_BACKTICKS = re.compile("`+")


def _drop_md_comments(text: str) -> str:
    """``text`` without its HTML comments (``<!-- ... -->`` with the spaces and tabs before
    it) outside code spans: what ``re.sub(r"(`+)[\\s\\S]*?\\1|[ \\t]*<!--[\\s\\S]*?-->", ...)``
    gives keeping the first alternative's matches (code spans) and dropping the second's,
    read in one pass. The pattern reads a ``<!--`` without ``-->`` after it, and a run of
    backticks whose length no later run reaches, to the end of the text from each one:
    quadratic (20,000 unclosed comments took 48 s).

    As the pattern does: a run of backticks opens a code span closed by the first run of
    its length after it, or by as many backticks as are in a later run (the first such run),
    or by backticks of its own run (a run of 2k backticks is the empty span of k); the
    longest of those lengths wins. A lone backtick with no backtick after it opens nothing.
    """
    if "<!--" not in text:
        return text
    runs = [(m.start(), m.end()) for m in _BACKTICKS.finditer(text)]
    longest_after = [0] * (len(runs) + 1)  # the longest run after each run
    for i in range(len(runs) - 1, -1, -1):
        longest_after[i] = max(longest_after[i + 1], runs[i][1] - runs[i][0])
    n = len(text)
    out: list[str] = []
    pos = kept = 0  # where the scan stands; text[kept:pos] is kept
    r = 0  # the first run ending after pos
    comment = text.find("<!--")  # the next "<!--" at or after pos (-1: none, or none closes)
    while True:
        while r < len(runs) and runs[r][1] <= pos:
            r += 1
        tick = max(pos, runs[r][0]) if r < len(runs) else n  # the next backtick
        if 0 <= comment < pos:
            comment = text.find("<!--", pos)
        start = n
        if comment >= 0:  # a comment's match starts at the spaces and tabs before it
            start = comment
            while start > pos and text[start - 1] in " \t":
                start -= 1
        if start < tick:
            close = text.find("-->", comment + 4)
            if close < 0:
                comment = -1  # no later "<!--" is closed either
                continue
            out.append(text[kept:start])
            pos = kept = close + 3
            continue
        if tick >= n:
            break
        length = runs[r][1] - tick  # the backticks from tick on
        k = min(length, max(length // 2, longest_after[r + 1]))  # the closing run's length
        if k == 0:  # the last backtick, alone
            pos = tick + 1
        elif 2 * k <= length:
            pos = tick + 2 * k
        else:
            j = r + 1
            while runs[j][1] - runs[j][0] < k:
                j += 1
            pos = runs[j][0] + k
    out.append(text[kept:])
    return "".join(out)


_MD_LINK = re.compile(r"!?\[(?:[^\[\]\n]|\[[^\[\]\n]*\])*\](?:\([^()\n]*(?:\([^()\n]*\)[^()\n]*)*\)|\[[^\]\n]*\])?"
                      r"|<(?:https?|mailto):[^>\s]+>|https?://\S+")
_MD_MARKER = re.compile(r"^\s*(?:[-*+]|\d{1,9}[.)])\s+", re.M)
#: Words a navigation line may hold besides its links ("← Previous | Next →", "Back to top").
_NAV_WORDS = frozenset("previous prev next back up home top index contents table of to go edit this page on github"
                       " source view raw main menu docs documentation".split())


def _link_only(block: str) -> bool:
    """A paragraph or list of nothing but links (and separators or navigation words)."""
    links = _MD_LINK.findall(block)
    if not links:
        return False
    rest = _MD_MARKER.sub(" ", _MD_LINK.sub(" ", block))
    words = [w.lower() for w in re.findall(r"\w+", rest)]
    if any(w not in _NAV_WORDS for w in words):
        return False
    if len(links) >= 2:
        return True
    text = re.sub(r"\]\(.*", "", links[0]).strip("![")  # one link: only a navigation one ("Back to top")
    return bool(re.findall(r"\w+", text)) and all(w.lower() in _NAV_WORDS for w in re.findall(r"\w+", text))


def _clean_markdown(body: str, where: str) -> str:
    """The Markdown ``body`` without what is not content.

    Removed: HTML comments (not inside code), link reference definitions
    (the lines the block parser consumes without making a block of them),
    and navigation link lists: a run of paragraphs or lists made only of
    links (plus separators, arrows and words such as "Previous", "Next",
    "Home", "Back to top") at the very start of the document or at its very
    end (not when it is a section's only content, after a heading, and never
    the whole document). Code blocks are kept byte for byte.
    """
    block_md, _ = _markdown_parsers(where)
    try:
        tokens = block_md.parse(body)
    except RecursionError:
        raise LoaderError(f"{where}: Markdown nested too deeply to parse") from None
    lines = body.split("\n")
    n = len(lines)
    covered = [False] * n
    protected = [False] * n
    blocks: list[tuple[int, int, str]] = []  # top-level blocks: first line, end line, token type
    for tok in tokens:
        if not tok.map:
            continue
        a, b = tok.map[0], min(tok.map[1], n)
        if tok.type in ("fence", "code_block"):
            for k in range(a, b):
                protected[k] = True
        if tok.level == 0 and tok.nesting >= 0:
            for k in range(a, b):
                covered[k] = True
            blocks.append((a, b, tok.type))
    drop = [not covered[k] and bool(lines[k].strip()) for k in range(n)]  # link reference definitions

    def nav(block: tuple[int, int, str]) -> bool:
        a, b, kind = block
        return kind in ("paragraph_open", "bullet_list_open", "ordered_list_open") and _link_only(
            "\n".join(lines[a:b]))

    def filler(block: tuple[int, int, str]) -> bool:
        """A rule, or an HTML block of nothing but comments (removed anyway): it neither
        ends nor makes a navigation run."""
        a, b, kind = block
        return kind == "hr" or (kind == "html_block" and is_blank(_drop_md_comments("\n".join(lines[a:b]))))

    def run(order: list[tuple[int, int, str]]) -> list[tuple[int, int, str]]:
        out: list[tuple[int, int, str]] = []
        for blk in order:
            if filler(blk) or nav(blk):
                out.append(blk)
            else:
                break
        return out if any(not filler(blk) for blk in out) else []

    if len(blocks) > 1:
        head = run(blocks)
        tail = run(blocks[::-1])
        if tail and len(tail) < len(blocks) and blocks[len(blocks) - len(tail) - 1][2] == "heading_open":
            # the links right after a heading are that section's content ("See also"); only what
            # follows a rule below them is the page's navigation
            rules = [k for k, blk in enumerate(tail) if blk[2] == "hr"]
            tail = tail[:rules[-1] + 1] if rules else []
        if len(head) + len(tail) < len(blocks):
            for a, b, _kind in head + tail:
                for k in range(a, b):
                    drop[k] = True
    if "<!--" not in body and not any(drop):
        return body
    kept: list[tuple[str, bool]] = []  # (line, protected)
    segment: list[str] = []

    def flush() -> None:  # comments out of a stretch of lines outside code
        if segment:
            text = _drop_md_comments("\n".join(segment))
            kept.extend((line, False) for line in text.split("\n"))
            segment.clear()

    for k in range(n):
        if drop[k]:
            continue
        if protected[k]:
            flush()
            kept.append((lines[k], True))
        else:
            segment.append(lines[k])
    flush()
    out: list[str] = []
    for line, code in kept:  # what was removed leaves no run of blank lines behind (code keeps its own)
        if not code and not line.strip() and (not out or not out[-1].strip()):
            continue
        out.append(line)
    return "\n".join(out)


def _load_markdown(data: bytes, where: str, source: str, base: Mapping[str, Any]) -> LoadedDocument:
    text, encoding = _decode(data, where)
    _require_text(text, where)
    _markdown_parsers(where)  # fail early with MissingDependency
    front, body = _split_front_matter(text, where)
    acl = _take_acl(front, where)
    body = _clean_markdown(body.lstrip("\n").rstrip(), where).strip("\n").rstrip()
    if is_blank(body):
        raise LoaderError(f"{where}: empty (no text after the front matter)")
    spans, first_h1, fences = _markdown_sections(body, where)
    body, spans = _drop_fences(body, spans, fences, where)
    if is_blank(body):
        raise LoaderError(f"{where}: empty (no text besides markup)")
    title: str | None = None
    fm_title = front.get("title")
    if isinstance(fm_title, (str, int, float)) and not isinstance(fm_title, bool) and str(fm_title).strip():
        title = str(fm_title).strip()
    elif first_h1:
        title = first_h1
    meta = _meta(base, "markdown", {"encoding": encoding}, user=front)
    return LoadedDocument(text=body, source=source, title=title, metadata=meta, spans=tuple(spans), acl=acl)


# ============================================================================ reStructuredText

# Section titles are found by the adornment rules below, by hand: docutils
# (not a dependency; a full parse builds a node tree and reports system
# messages for every construct it dislikes) would only be used for the
# titles, and the text is kept as RST source anyway, like Markdown's.
_RST_PUNCT = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"
_RST_DIRECTIVE = re.compile(r"^\.\.\s+(?:\|[^|]+\|\s+)?([\w][\w:+.-]*)::(.*)$")
_RST_OPTION = re.compile(r"^:[^:\s][^:]*:(?:\s|$)")
#: Directives dropped with their whole block: navigation the builder generates, files pulled in
#: from elsewhere, raw output, index entries and settings (none of it is read where it is written).
_RST_DROP_DIRECTIVES = frozenset({
    "toctree", "contents", "include", "literalinclude", "raw", "image", "index", "meta", "highlight",
    "default-role", "role", "default-domain", "currentmodule", "tabularcolumns", "sectnum", "section-numbering",
    "header", "footer", "target-notes", "title", "sectionauthor", "moduleauthor", "codeauthor", "todolist"})
#: Directives whose argument a reader does not see (a language, a path, a condition); their
#: content stays. Other directives' arguments (a note's text, a function's signature) stay.
_RST_HIDDEN_ARGUMENT = frozenset({
    "code-block", "code", "sourcecode", "figure", "only", "ifconfig", "module", "program", "class-prefix",
    "jupyter-execute", "ipython", "code-cell", "prompt", "doctest", "testcode", "testoutput", "testsetup",
    "testcleanup", "graphviz", "plot", "container", "csv-table", "list-table", "table"})
#: Directives whose content is a literal block (kept as written: no markup is read in it).
_RST_LITERAL_DIRECTIVES = frozenset({
    "code-block", "code", "sourcecode", "parsed-literal", "math", "productionlist", "doctest", "testcode",
    "testoutput", "testsetup", "testcleanup", "ipython", "jupyter-execute", "code-cell", "prompt", "graphviz"})


def _rst_adornment(line: str) -> bool:
    """A line of one punctuation character repeated (at least twice), from column 1."""
    body = line.rstrip()
    return len(body) >= 2 and body[0] in _RST_PUNCT and body == body[0] * len(body)


def _rst_width(text: str) -> int:
    return sum(2 if unicodedata.east_asian_width(c) in ("W", "F") else 1 for c in text)


def _rst_indent(line: str) -> int:
    return len(line) - len(line.lstrip(" \t"))


def _clean_rst(text: str) -> str:
    """RST as a reader sees it: without comments, hyperlink targets, substitution
    definitions, directive markup and literal-block markers (issue 30, item 8).

    An explicit markup block (``..`` first on its line, with the lines indented
    below it) is dropped when it is a comment (neither a directive, nor a
    footnote or citation), a hyperlink target (``.. _name: URL``, ``__ URL``),
    a substitution definition (``.. |name| replace:: text``) or a directive
    that shows nothing where it is written (``toctree``, ``contents``,
    ``image``, ``include``, ``raw``, ``index`` ...). Of any other directive
    the ``.. name::`` markup and its option lines (``:caption: x``) go; its
    argument stays where a reader sees it (``.. note:: text``, ``.. function::
    f(x)``), not where it is a language, path or condition (``.. code-block::
    python``, ``.. figure:: a.png``, ``.. only:: html``), and its content stays.
    A paragraph's ``::`` literal-block marker reads as a reader sees it
    (``Example::`` -> ``Example:``, ``Example ::`` -> ``Example``, a lone ``::``
    goes). Literal blocks and code directives' content are kept as written.
    """
    lines = text.split("\n")
    n = len(lines)
    out: list[str] = []
    literal: int | None = None  # inside a literal block: the indent at or below which it ends
    i = 0
    dropped = False

    def block_end(start: int, indent: int) -> int:
        j = start + 1
        while j < n and (not lines[j].strip() or _rst_indent(lines[j]) > indent):
            j += 1
        while j > start + 1 and not lines[j - 1].strip():  # the blank lines after the block stay
            j -= 1
        return j

    while i < n:
        line = lines[i]
        stripped = line.strip()
        indent = _rst_indent(line)
        keep: str | None = line
        skip_to = i + 1
        if literal is not None and stripped and indent <= literal:
            literal = None  # the literal block ended
        if literal is not None:
            pass  # a literal block's line, as written
        elif stripped.startswith("..") and (len(stripped) == 2 or stripped[2] in " \t"):
            rest = stripped[2:].strip()
            m = _RST_DIRECTIVE.match(stripped)
            if m is not None:
                name = m.group(1).lower()
                if name in _RST_DROP_DIRECTIVES or rest.startswith("|"):
                    # substitution definitions (".. |name| replace:: text") are read where |name| is
                    # used, not where they are defined: a block of them is no passage
                    keep, skip_to = None, block_end(i, indent)
                else:
                    argument = m.group(2).strip()
                    keep = None if name in _RST_HIDDEN_ARGUMENT or not argument else line[:indent] + argument
                    while skip_to < n and _RST_OPTION.match(lines[skip_to].strip()) and \
                            _rst_indent(lines[skip_to]) > indent:
                        skip_to += 1  # the option lines
                    if name in _RST_LITERAL_DIRECTIVES:
                        literal = indent
            elif not rest.startswith(("[", "|")):
                keep, skip_to = None, block_end(i, indent)  # a comment or a hyperlink target ("_name: url")
        elif stripped.startswith("__ "):
            keep, skip_to = None, block_end(i, indent)  # an anonymous hyperlink target
        elif stripped.endswith("::") and (i + 1 == n or not lines[i + 1].strip()):
            literal = indent  # the paragraph's end: a literal block follows
            if stripped == "::":
                keep = None
            elif stripped[-3] in " \t":
                keep = line.rstrip()[:-2].rstrip()
            else:
                keep = line.rstrip()[:-1]
        if keep is None:
            i = skip_to
            dropped = True
            continue
        if dropped and not keep.strip() and (not out or not out[-1].strip()):
            i += 1
            continue
        dropped = False
        out.append(keep)
        i += 1
        if skip_to > i:  # a directive's option lines
            i = skip_to
            dropped = True
    return "\n".join(out)


def _rst_sections(text: str) -> tuple[str, list[Span], str | None]:
    """``text`` without its section titles' adornments, the section spans of what is left and
    the first title. Titles are underlined, or over- and underlined, with one punctuation
    character (the order styles first appear in gives the levels); the title stays (stripped
    of the centring spaces an overline allows), its underline and overline go: a line of
    ``=====`` is no text a reader reads (issue 30, item 8)."""
    lines = text.split("\n")
    styles: list[tuple[str, bool]] = []
    found: list[tuple[int, int, str]] = []  # the title's line, level, title
    adornments: set[int] = set()
    i = 0
    n = len(lines)
    while i < n:
        line = lines[i]
        after_blank = i == 0 or not lines[i - 1].strip()
        if (after_blank and _rst_adornment(line) and i + 2 < n and lines[i + 1].strip()
                and not _rst_adornment(lines[i + 1]) and lines[i + 2].rstrip() == line.rstrip()
                and _rst_width(lines[i + 1].strip()) <= len(line.rstrip())):
            style, at, title, nxt = (line[0], True), i + 1, lines[i + 1].strip(), i + 3
            adornments.update((i, i + 2))
            lines[i + 1] = title
        elif (after_blank and line.strip() and line[0] not in " \t" and not _rst_adornment(line) and i + 1 < n
              and _rst_adornment(lines[i + 1]) and len(lines[i + 1].rstrip()) >= _rst_width(line.rstrip())
              and (i + 2 >= n or not lines[i + 2].strip() or not _rst_adornment(lines[i + 2]))):
            style, at, title, nxt = (lines[i + 1][0], False), i, line.strip(), i + 2
            adornments.add(i + 1)
        else:
            i += 1
            continue
        if style not in styles:
            styles.append(style)
        found.append((at, styles.index(style), _one_line(title)[:_MAX_HEADING_CHARS]))
        i = nxt
    kept: list[str] = []
    offset_of: dict[int, int] = {}  # a kept line -> its offset in the text kept
    offset = 0
    for number, line in enumerate(lines):
        if number in adornments:
            continue
        offset_of[number] = offset
        kept.append(line)
        offset += len(line) + 1
    out = "\n".join(kept).strip("\n")
    lead = len("\n".join(kept)) - len("\n".join(kept).lstrip("\n"))  # blank lines an overline left first
    titles = [(offset_of[at] - lead, level, title) for at, level, title in found]
    return out, _section_spans(out, titles), (titles[0][2] if titles else None)


def _load_rst(data: bytes, where: str, source: str, base: Mapping[str, Any]) -> LoadedDocument:
    text, encoding = _decode(data, where)
    _require_text(text, where)
    front, text = _leading_front_matter(text, where)
    acl = _take_acl(front, where)
    body = _clean_rst(text).strip("\n").rstrip()
    if is_blank(body):
        raise LoaderError(f"{where}: empty (no text besides comments and targets)")
    body, spans, title = _rst_sections(body)
    return LoadedDocument(text=body, source=source, title=_front_title(front) or title,
                          metadata=_meta(base, "rst", {"encoding": encoding}, user=front), spans=tuple(spans), acl=acl)


# ============================================================================ HTML


_SKIP_TAGS = frozenset({"script", "style", "noscript", "template", "head", "title", "svg-title", "button"})  # "copy" buttons
_HEAD_TAGS = frozenset({"title", "meta", "link", "style", "script", "noscript", "base", "template"})
_VOID_TAGS = frozenset({"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta",
                        "param", "source", "track", "wbr", "keygen"})
_PARAGRAPH_TAGS = frozenset({"p", "h1", "h2", "h3", "h4", "h5", "h6", "pre", "blockquote", "table", "ul", "ol",
                             "dl", "section", "article", "header", "footer", "nav", "aside", "main", "figure",
                             "hr", "form", "fieldset", "address", "details", "hgroup"})
_LINE_TAGS = frozenset({"div", "br", "li", "tr", "dt", "dd", "figcaption", "summary", "caption", "option",
                        "legend", "center", "dialog", "menu", "body", "html", "thead", "tbody", "tfoot"})
_CELL_TAGS = frozenset({"td", "th"})
# Tags whose end tag is commonly left out; not counted by the nesting estimate.
_AUTOCLOSE_TAGS = frozenset({"p", "li", "dt", "dd", "option", "optgroup", "tr", "td", "th", "thead", "tbody",
                             "tfoot", "colgroup", "rp", "rt", "html", "head", "body"})
_WS = re.compile(r"\s+")
# A tag for _lexbor_fits: each alternative starts with a different character, so the
# repetition never backtracks (an unclosed quote ends the tag where it opens).
_TAG_SPAN = re.compile(r"""</?([A-Za-z][^\s/>"']*)(?:[^>"']+|"[^"]*"|'[^']*')*""")
_TAG_WORD = re.compile(r"""[^\s/>="'<]+""")
_ATTR_VALUE = re.compile(r"""=\s*(?:"[^"]*"|'[^']*'|[^\s>"']*)""")
_META_CHARSET = re.compile(rb"""<meta[^>]{0,512}?charset\s*=\s*["']?\s*([A-Za-z0-9._:-]{1,40})""", re.I)


def _hidden(attrs: Mapping[str, Any]) -> bool:
    if "hidden" in attrs:
        return True
    style = attrs.get("style")
    if isinstance(style, str):
        compact = style.replace(" ", "").lower()
        return "display:none" in compact or "visibility:hidden" in compact
    return False


_CONTENT_TAGS = frozenset({"article", "main", "section"})
_CHROME_ROLES = frozenset({"navigation", "banner", "contentinfo"})
_SKIP_LINK = re.compile(r"\s*(?:skip|jump)\s+(?:to|navigation)\b", re.I)
_HEADING_TAGS = {f"h{k}": k for k in range(1, 7)}
# Private-use characters marking where headings start (one per level) and end in the
# extracted text; removed (with any the page itself held) before the text is stored.
_MARK_START = "\ue000"
_MARK_END = "\ue00f"
_MARKS = re.compile("[\ue000-\ue00f]")


def _chrome(tag: str, attrs: Mapping[str, Any], in_content: bool) -> bool:
    """Page chrome, not content: navigation, the page's own header and footer, breadcrumbs.

    ``<header>``/``<footer>`` inside ``<article>``, ``<main>`` or
    ``<section>`` belong to that content and stay.
    """
    if tag == "nav":
        return True
    if tag in ("header", "footer") and not in_content:
        return True
    role = attrs.get("role")
    if isinstance(role, str) and role.strip().lower() in _CHROME_ROLES:
        return True
    for key in ("class", "id", "aria-label"):
        value = attrs.get(key)
        if isinstance(value, str) and "breadcrumb" in value.lower():
            return True
    return False


#: Texts of links that are page chrome, not content: heading anchors (Sphinx's ``¶``, Node's
#: ``#``) and links to the source (``[src]``, ``[source]``) (issue 30, item 8).
_LINK_MARKS = frozenset({"#", "¶", "§", "🔗", "[src]", "[source]"})
_LINK_CHROME_CLASSES = ("headerlink", "viewcode-link", "srclink", "anchor-link")


def _skip_link(attrs: Mapping[str, Any], text: str) -> bool:
    """A link that is page chrome: "Skip to content" (to an anchor of the same page), a
    heading's anchor mark, a "[src]" link."""
    if text.strip() in _LINK_MARKS:
        return True
    cls = attrs.get("class")
    if isinstance(cls, str) and any(c in cls for c in _LINK_CHROME_CLASSES):
        return True
    href = attrs.get("href")
    return isinstance(href, str) and href.strip().startswith("#") and _SKIP_LINK.match(text) is not None


class _TextBuilder:
    """Collects visible text: collapses whitespace, separates blocks with line breaks.

    Headings (``h1``-``h6``) are bracketed with private-use marks that
    :func:`_html_headings` turns into offsets once the text is final.
    """

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.pending_break = 0  # 1: newline, 2: blank line
        self.pending_space = False
        self.pre = 0
        self.marks: list[str] = []  # heading starts not yet followed by text

    def start(self, tag: str) -> None:
        self._block(tag)
        if tag == "pre":
            self.pre += 1
        level = _HEADING_TAGS.get(tag)
        if level is not None:
            self.marks.append(chr(ord(_MARK_START) + level))

    def end(self, tag: str) -> None:
        if tag in _HEADING_TAGS:
            if self.marks:
                self.marks.pop()  # a heading without text
            else:
                self.parts.append(_MARK_END)
        self._block(tag)
        if tag == "pre" and self.pre:
            self.pre -= 1

    def snapshot(self) -> tuple[int, int, bool, int, list[str]]:
        return len(self.parts), self.pending_break, self.pending_space, self.pre, list(self.marks)

    def restore(self, state: tuple[int, int, bool, int, list[str]]) -> None:
        n, self.pending_break, self.pending_space, self.pre, self.marks = state
        del self.parts[n:]

    def _block(self, tag: str) -> None:
        if tag in _PARAGRAPH_TAGS:
            self._break(2)
        elif tag in _LINE_TAGS:
            self._break(1)
        elif tag in _CELL_TAGS:
            self.pending_space = True

    def _break(self, n: int) -> None:
        if self.parts:
            self.pending_break = max(self.pending_break, n)

    def text(self, data: str) -> None:
        if not data:
            return
        if self.pre:
            self._prefix()
            self.parts.append(data)
            return
        collapsed = _WS.sub(" ", data)
        stripped = collapsed.strip(" ")
        if not stripped:
            self.pending_space = True
            return
        if collapsed[0] == " ":
            self.pending_space = True
        self._prefix()
        self.parts.append(stripped)
        self.pending_space = collapsed[-1] == " "

    def _prefix(self) -> None:
        if self.parts:
            if self.pending_break:
                self.parts.append("\n" * self.pending_break)
            elif self.pending_space and not self.parts[-1].endswith((" ", "\n")):
                self.parts.append(" ")
        self.pending_break = 0
        self.pending_space = False
        if self.marks:
            self.parts.extend(self.marks)
            self.marks.clear()

    def result(self) -> str:
        text = "".join(self.parts)
        text = "\n".join(line.rstrip() for line in text.split("\n"))
        return re.sub(r"\n{3,}", "\n\n", text).strip("\n")


def _html_headings(marked: str) -> tuple[str, list[tuple[int, int, int]]]:
    """The text without heading marks, and (start, end, level) of each heading in it."""
    out: list[str] = []
    headings: list[tuple[int, int, int]] = []
    pos = 0
    open_at: tuple[int, int] | None = None
    last = 0
    for m in _MARKS.finditer(marked):
        piece = marked[last:m.start()]
        out.append(piece)
        pos += len(piece)
        last = m.end()
        ch = m.group(0)
        if ch == _MARK_END:
            if open_at is not None:
                headings.append((open_at[0], pos, open_at[1]))
                open_at = None
        elif open_at is None:
            open_at = (pos, ord(ch) - ord(_MARK_START))
    out.append(marked[last:])
    return "".join(out), headings


def _html_sections(text: str, headings: list[tuple[int, int, int]]) -> tuple[list[Span], str | None]:
    """Section spans like Markdown's: from each heading to the next, titled by the heading path."""
    titled = [(a, level, _one_line(text[a:b])[:_MAX_HEADING_CHARS]) for a, b, level in headings]
    titled = [t for t in titled if t[2]]
    return _section_spans(text, titled), _first_h1(titled)


def _lexbor_fits(html: str) -> bool:
    """Whether lexbor parses ``html`` in about linear time (a guard, not a parser).

    Two things make lexbor's tree builder quadratic: nesting (20,000 nested ``<div>`` take a
    second, 100,000 minutes) and distinct tag and attribute names (it interns each new name
    in a table it searches linearly: 40,000 attributes on one tag took 5.5 s, a million never
    ended; issue 32, item 5). Past :data:`_MAX_LEXBOR_DEPTH` levels (estimated from tag
    names) or :data:`_MAX_LEXBOR_NAMES` names, the page goes to the streaming html.parser
    extractor, which is linear in both.

    A tag here runs from ``<`` and a letter to the next ``>`` outside quotes (a quote anywhere
    in it opens a quoted stretch, so a ``>`` in an attribute value does not end it); its words
    outside attribute values are names. Comments count as tags: that can only over-count,
    and an over-count only sends a page to the slower parser.
    """
    depth = top = 0
    names: set[str] = set()
    for m in _TAG_SPAN.finditer(html):
        name = m.group(1).lower()
        span = m.group(0)
        if name not in _VOID_TAGS and name not in _AUTOCLOSE_TAGS and not span.endswith("/"):
            if span[1] == "/":
                depth = max(0, depth - 1)
            else:
                depth += 1
                top = max(top, depth)
        if m.end(1) < m.end():  # attributes after the name
            names.update(_TAG_WORD.findall(_ATTR_VALUE.sub(" ", span).lower()))
        else:
            names.add(name)
        if top > _MAX_LEXBOR_DEPTH or len(names) > _MAX_LEXBOR_NAMES:
            return False
    return True


def _in_foreign(node: Any) -> bool:
    """Whether a lexbor node lies in an ``<svg>`` or ``<math>`` element: an SVG's ``<title>``
    names the drawing (an icon's "Download"), not the page."""
    parent = node.parent
    while parent is not None:
        if parent.tag in _FOREIGN_TAGS:
            return True
        parent = parent.parent
    return False


_FOREIGN_TAGS = frozenset({"svg", "math"})
#: HTML start tags that end open <svg>/<math> elements (the HTML standard's "breakout" tags of
#: foreign content, the common ones), so that an unclosed <svg> ends where lexbor ends it
_FOREIGN_BREAKOUT = frozenset({"b", "big", "blockquote", "body", "br", "center", "code", "dd", "div", "dl", "dt",
                               "em", "embed", "h1", "h2", "h3", "h4", "h5", "h6", "head", "hr", "i", "img", "li",
                               "listing", "menu", "meta", "nobr", "ol", "p", "pre", "ruby", "s", "small", "span",
                               "strong", "strike", "sub", "sup", "table", "tt", "u", "ul", "var"})


def _html_selectolax(html: str) -> tuple[str, str | None] | None:
    """Text and title with selectolax/lexbor; None when selectolax is not installed."""
    try:
        from selectolax.lexbor import LexborHTMLParser, LexborNode
    except ImportError:
        return None
    tree = LexborHTMLParser(html)
    title = None
    head = tree.head
    title_node = (head.css_first("title") if head is not None else None) or next(
        (n for n in tree.css("title") if not _in_foreign(n)), None)
    if title_node is not None:
        title = _one_line(title_node.text(deep=True) or "") or None
    root = tree.root
    builder = _TextBuilder()
    if root is None:
        return "", title
    content = [0]  # depth of <article>/<main>/<section> elements around the node

    def enter(node: LexborNode) -> bool:
        tag = node.tag or ""
        if tag == "-text":
            builder.text(node.text_content or "")
            return False
        if tag.startswith(("-", "_", "!")) or tag in _SKIP_TAGS:
            return False
        attrs = node.attributes
        if _hidden(attrs) or _chrome(tag, attrs, content[0] > 0):
            return False
        if tag == "a" and _skip_link(attrs, node.text(deep=True) or ""):
            return False
        if tag in _CONTENT_TAGS:
            content[0] += 1
        builder.start(tag)
        return True

    def leave(tag: str) -> None:
        if tag in _CONTENT_TAGS and content[0]:
            content[0] -= 1
        builder.end(tag)

    # Iterative depth-first walk (deep documents must not exhaust the Python stack).
    node = root
    depth = 0
    while True:
        entered = enter(node)
        if entered and node.child is not None:
            node = node.child
            depth += 1
            continue
        if entered:
            leave(node.tag or "")
        while True:
            if depth == 0:
                return builder.result(), title
            nxt = node.next
            if nxt is not None:
                node = nxt
                break
            # depth > 0, so node is below root and has a parent
            node = cast(LexborNode, node.parent)
            depth -= 1
            leave(node.tag or "")


def _html_stdlib(html: str) -> tuple[str, str | None]:
    """Text and title with the standard library's html.parser.

    This fallback exists so that HTML loads without the optional selectolax
    dependency, and for pathologically deep documents: it streams events and
    builds no tree, so it is linear in nesting depth where lexbor is not.
    """
    from html import unescape
    from html.parser import HTMLParser

    builder = _TextBuilder()

    class _Extractor(HTMLParser):
        # <textarea> and <title> hold text, not markup (HTML's "escapable raw text": ``<b>`` in
        # them is read as written, ``&amp;`` as ``&``), as lexbor reads them. Python 3.14's parser
        # knows them (its RCDATA_CONTENT_ELEMENTS); older ones parse tags in them. So this parser
        # switches to raw text itself at their start tag and unescapes their text, in every
        # version (the parser's own switch turned off, lest it unescape a second time).
        RCDATA_CONTENT_ELEMENTS = ()  # type: ignore[misc]

        def __init__(self) -> None:
            super().__init__(convert_charrefs=True)
            self.skip_tag: str | None = None
            self.skip_depth = 0
            self.in_title = False
            self.title_parts: list[str] = []
            self.title_done = False
            self.content = 0
            self.link: tuple[dict[str, str | None], list[str], Any] | None = None  # an <a href="#..."> being read
            self.foreign = 0  # <svg>/<math> elements open around the parser (see _in_foreign)

        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            if tag in ("textarea", "title") and not self.foreign:
                self.set_cdata_mode(tag)  # (see RCDATA_CONTENT_ELEMENTS; ends at its end tag)
            self._start(tag, attrs)

        def _start(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            if tag in _FOREIGN_TAGS:
                self.foreign += 1
            elif self.foreign and tag in _FOREIGN_BREAKOUT:  # an unclosed <svg> ends here, as in HTML
                self.foreign = 0
            if tag == "title" and self.foreign:  # a drawing's title: skipped like other titles
                tag = "svg-title"
            if self.in_title:
                return
            if self.skip_tag is not None:
                if self.skip_tag == "head" and tag not in _HEAD_TAGS and tag != "head":
                    self.skip_tag, self.skip_depth = None, 0  # implicit end of <head>
                elif tag == "title" and self.skip_tag == "head" and not self.title_done:
                    self.in_title = True
                    return
                else:
                    if tag == self.skip_tag and tag not in _VOID_TAGS:
                        self.skip_depth += 1
                    return
            if tag == "title" and not self.title_done:
                self.in_title = True
                return
            attributes = dict(attrs)
            if tag in _SKIP_TAGS or _hidden(attributes) or _chrome(tag, attributes, self.content > 0):
                if tag not in _VOID_TAGS:
                    self.skip_tag, self.skip_depth = tag, 1
                return
            if tag == "a" and self.link is None:
                self.link = (attributes, [], builder.snapshot())
            if tag in _CONTENT_TAGS:
                self.content += 1
            builder.start(tag)
            if tag in _VOID_TAGS:
                builder.end(tag)

        def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            attributes = dict(attrs)
            if (self.in_title or self.skip_tag is not None or tag in _SKIP_TAGS or _hidden(attributes)
                    or _chrome(tag, attributes, self.content > 0)):
                return
            builder.start(tag)
            builder.end(tag)

        def handle_endtag(self, tag: str) -> None:
            if tag in _FOREIGN_TAGS and self.foreign:
                self.foreign -= 1
            if tag == "title" and self.foreign and not self.in_title:
                tag = "svg-title"
            if self.in_title:
                if tag == "title":
                    self.in_title = False
                    self.title_done = True
                return
            if self.skip_tag is not None:
                if tag == self.skip_tag:
                    self.skip_depth -= 1
                    if self.skip_depth <= 0:
                        self.skip_tag, self.skip_depth = None, 0
                return
            if tag not in _VOID_TAGS:
                builder.end(tag)
            if tag in _CONTENT_TAGS and self.content:
                self.content -= 1
            if tag == "a" and self.link is not None:
                attributes, texts, state = self.link
                self.link = None
                if _skip_link(attributes, "".join(texts)):
                    builder.restore(state)

        def handle_data(self, data: str) -> None:
            if self.cdata_elem in ("textarea", "title"):
                data = unescape(data)
            if self.in_title:
                self.title_parts.append(data)
            elif self.skip_tag is None:
                if self.link is not None:
                    self.link[1].append(data)
                builder.text(data)

    parser = _Extractor()
    parser.feed(html)
    parser.close()
    title = _one_line("".join(parser.title_parts)) or None
    return builder.result(), title


def _load_html(data: bytes, where: str, source: str, base: Mapping[str, Any]) -> LoadedDocument:
    m = _META_CHARSET.search(data[:4096])
    declared = m.group(1).decode("ascii", "replace") if m else None
    html, encoding = _decode(data, where, declared)
    _require_text(html, where)
    front, html = _leading_front_matter(html, where)
    acl = _take_acl(front, where)
    html = _MARKS.sub("", html)  # the heading marks must be the extractor's own
    try:
        result = None
        if _lexbor_fits(html):
            result = _html_selectolax(html)
        if result is None:
            result = _html_stdlib(html)
    except RecursionError:
        raise LoaderError(f"{where}: HTML nested too deeply to parse") from None
    except Exception as e:  # noqa: BLE001 - html.parser raises AssertionError on some malformed markup
        raise LoaderError(f"{where}: could not parse HTML ({type(e).__name__}: {e})") from None
    marked, title = result
    text, headings = _html_headings(marked.replace("\x00", ""))
    if is_blank(text):
        raise LoaderError(f"{where}: no visible text in the HTML")
    spans, first_h1 = _html_sections(text, headings)
    return LoadedDocument(text=text, source=source, title=_front_title(front) or title or first_h1,
                          metadata=_meta(base, "html", {"encoding": encoding}, user=front), spans=tuple(spans),
                          acl=acl)


# ============================================================================ PDF


_pypdf_lock = threading.Lock()
_pypdf_quiet = 0
_pypdf_saved_level = logging.NOTSET


@contextlib.contextmanager
def _quiet_pypdf() -> Iterator[None]:
    """Silence the ``pypdf`` logger (its warnings about malformed files) while a PDF is read."""
    global _pypdf_quiet, _pypdf_saved_level
    logger = logging.getLogger("pypdf")
    with _pypdf_lock:
        if _pypdf_quiet == 0:
            _pypdf_saved_level = logger.level
            logger.setLevel(logging.CRITICAL + 1)
        _pypdf_quiet += 1
    try:
        yield
    finally:
        with _pypdf_lock:
            _pypdf_quiet -= 1
            if _pypdf_quiet == 0:
                logger.setLevel(_pypdf_saved_level)


def _pdf_string(value: Any) -> str | None:
    if value is None:
        return None
    text = " ".join(_valid_unicode(str(value)).replace("\x00", "").split())
    return text or None


def _valid_unicode(text: str) -> str:
    """``text`` with each lone surrogate (no text form, and SQLite stores none) as U+FFFD, as
    undecodable bytes of a text file are: pypdf gives them where a font's ToUnicode map names
    one (``<41> <D800>``), and such a PDF ended a whole add or sync. A pair split in two code
    units is joined."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return text


def _load_pdf(data: bytes, where: str, source: str, base: Mapping[str, Any]) -> LoadedDocument:
    try:
        import pypdf
    except ImportError:
        raise MissingDependency(
            f"{where}: reading PDF needs pypdf; install it with: pip install 'ragdb[pdf]'"
        ) from None
    if not data.strip():
        raise LoaderError(f"{where}: empty (no bytes)")
    with _quiet_pypdf():
        try:
            reader = pypdf.PdfReader(io.BytesIO(data))
        except Exception as e:  # noqa: BLE001 - pypdf raises many types on broken input
            raise LoaderError(f"{where}: broken or truncated PDF ({_reason(e)})") from None
        if reader.is_encrypted:
            try:
                ok = reader.decrypt("")
            except Exception as e:  # noqa: BLE001 - e.g. AES without the cryptography package
                raise LoaderError(f"{where}: PDF is encrypted and cannot be opened ({_reason(e)})") from None
            if not ok:
                raise LoaderError(f"{where}: PDF is encrypted (a password is needed to open it)")
        texts: list[str] = []
        try:
            pages = reader.pages
            count = len(pages)
            for i in range(count):
                try:
                    texts.append(pages[i].extract_text() or "")
                except Exception as e:  # noqa: BLE001
                    raise LoaderError(f"{where}: broken PDF: page {i + 1} cannot be read ({_reason(e)})") from None
        except LoaderError:
            raise
        except Exception as e:  # noqa: BLE001
            raise LoaderError(f"{where}: broken or truncated PDF ({_reason(e)})") from None
        outline = _pdf_outline(reader, count)
        title = author = None
        try:
            info = reader.metadata
            if info is not None:
                title = _pdf_string(info.title)
                author = _pdf_string(info.author)
        except Exception:  # noqa: BLE001 - a damaged info dictionary only costs the title
            pass
    if count == 0:
        raise LoaderError(f"{where}: PDF has no pages")
    parts: list[str] = []
    spans: list[Span] = []
    pos = 0
    for n, raw in enumerate(texts, start=1):
        page_text = _normalize(_valid_unicode(raw)).strip()
        if not page_text:
            continue
        if parts:
            parts.append("\n\n")
            pos += 2
        parts.append(page_text)
        meta: dict[str, Any] = {"page": n}
        if outline.get(n):
            meta["section"] = outline[n]
        spans.append(Span(pos, pos + len(page_text), meta))
        pos += len(page_text)
    if not parts:
        raise LoaderError(f"{where}: PDF has no extractable text ({count} page(s); scanned images need OCR)")
    extra: dict[str, Any] = {"pages": count}
    if author:
        extra["author"] = author
    return LoadedDocument(text="".join(parts), source=source, title=title,
                          metadata=_meta(base, "pdf", extra), spans=tuple(spans))


def _pdf_outline(reader: Any, count: int) -> dict[int, str]:
    """page number (1-based) -> the heading path (``Part > Chapter``) in force on it, from the
    PDF's outline (bookmarks): the last outline entry starting on or before the page, with
    its parents. Empty when the PDF has none or it cannot be read (the text still loads)."""
    entries: list[tuple[int, int, str]] = []  # (page index, level, title) in outline order

    def walk(items: Any, level: int) -> None:
        for item in items:
            if isinstance(item, list):
                walk(item, level + 1)
                continue
            title = _pdf_string(getattr(item, "title", None))
            try:
                page = reader.get_destination_page_number(item)
            except Exception:  # noqa: BLE001 - a broken destination only costs its entry
                continue
            if title and page is not None and 0 <= page < count:
                entries.append((page, level, _one_line(title)))

    try:
        walk(reader.outline, 0)
    except Exception:  # noqa: BLE001 - a damaged outline only costs the headings
        return {}
    out: dict[int, str] = {}
    path: list[tuple[int, str]] = []
    by_page: dict[int, list[tuple[int, str]]] = {}
    for page, level, title in entries:
        by_page.setdefault(page, []).append((level, title))
    for page in range(count):
        for level, title in by_page.get(page, ()):
            while path and path[-1][0] >= level:
                path.pop()
            path.append((level, title))
        if path:
            out[page + 1] = " > ".join(t for _, t in path)
    return out


def _reason(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


# ============================================================================ JSONL


def _load_jsonl(data: bytes, where: str, source: str, base: Mapping[str, Any]) -> list[LoadedDocument]:
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8):]
    if b"\x00" in data[:_SNIFF_BYTES]:
        raise LoaderError(f"{where}: looks binary (NUL bytes), not JSON lines")
    docs: list[LoadedDocument] = []
    for lineno, line in enumerate(data.split(b"\n"), start=1):
        if not line.strip():
            continue
        try:
            rec = loads_exact(line)
        except orjson.JSONDecodeError as e:
            raise LoaderError(f"{where}: line {lineno}: invalid JSON ({e})") from None
        if not isinstance(rec, dict):
            raise LoaderError(f"{where}: line {lineno}: expected a JSON object, got {type(rec).__name__}")
        docs.append(_jsonl_record(rec, lineno, where, source, base))
    if not docs:
        raise LoaderError(f"{where}: empty (no JSON records)")
    return docs


def _jsonl_record(rec: dict[str, Any], lineno: int, where: str, source: str,
                  base: Mapping[str, Any]) -> LoadedDocument:
    label = f"{where}: line {lineno}"
    beir = "_id" in rec
    text = rec.get("text")
    title = rec.get("title")
    if text is None and not (beir and title):
        raise LoaderError(f"{label}: missing 'text'")
    if text is not None and not isinstance(text, str):
        raise LoaderError(f"{label}: 'text' must be a string, got {type(text).__name__}")
    if title is not None and not isinstance(title, str):
        raise LoaderError(f"{label}: 'title' must be a string, got {type(title).__name__}")
    title = title.strip() or None if title is not None else None
    user = rec.get("metadata")
    if user is not None and not isinstance(user, dict):
        raise LoaderError(f"{label}: 'metadata' must be an object, got {type(user).__name__}")
    extra: dict[str, Any] = {"line": lineno}
    if beir:  # BEIR corpus layout: _id, title, text
        rec_source: Any = rec["_id"]
        body = _normalize(text or "")
        if title:
            body = f"{title}\n\n{body}" if body.strip() else title
        if "id" in rec:
            extra["id"] = rec["id"]
    else:
        rec_source = rec.get("source")
        if rec_source is None:
            rec_source = rec.get("id")
        if "id" in rec:
            extra["id"] = rec["id"]
        body = _normalize(text or "")
    if rec_source is None:
        rec_source = f"{source}#{lineno}"
    elif isinstance(rec_source, (str, int)) and not isinstance(rec_source, bool):
        rec_source = str(rec_source)
    else:
        raise LoaderError(f"{label}: source/id must be a string or an integer, got {type(rec_source).__name__}")
    if not rec_source:
        raise LoaderError(f"{label}: source/id is empty")
    if is_blank(body):
        raise LoaderError(f"{label}: empty 'text'")
    for key in ("version", "timestamp"):
        value = rec.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise LoaderError(f"{label}: '{key}' must be a string or a number, got {type(value).__name__}")
        extra[key] = str(value) if key == "version" else value
    acl = _take_acl({k: rec[k] for k in ACL_KEYS if rec.get(k) is not None}, label)
    return LoadedDocument(text=body, source=rec_source, title=title,
                          metadata=_meta(base, "jsonl", extra, user=user), acl=acl)
