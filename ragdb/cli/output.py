"""What the ``ragdb`` commands print, and how.

* errors and notes on stderr: :func:`one_line` (an exception as one line), :func:`warn`,
  :func:`hidden_note` (documents an empty result's caller cannot see);
* JSON: :func:`emit_json` (indented), :func:`json_default`;
* tables: :func:`emit_table` (as ``ragdb list`` prints), :func:`emit_pairs` (label/value lines);
* the formats of the listing commands (:class:`Output`: table, --json, --nl, --csv, --tsv):
  :func:`emit_records`, :func:`cell`;
* values as text: scores, sizes, plurals, analyzers, settings (a hit as JSON: :func:`ragdb.serve.shapes.hit_json`);
* terminals: :func:`stdout_is_tty`, and :func:`progress_bar` (a bar on stderr when it is a terminal).

The commands' options (``output_options`` chooses an :class:`Output`) are in :mod:`ragdb.cli.options`.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import io
import os
import sys
import unicodedata
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

import click
import orjson

import ragdb
import ragdb.index.confidence
from ragdb.cli.main import one_line as one_line  # where the group needs it without this module's imports
from ragdb.text.analysis import describe_config


# --------------------------------------------------------------------------- errors and notes on stderr


def warn(message: str) -> None:
    """A line on stderr (control characters shown as symbols: it names files and sources)."""
    click.echo(visible(message), err=True)


def hidden_note(db: ragdb.Database, who: Any) -> None:
    """On an empty result: say on stderr how many documents this caller cannot see, if any
    (an anonymous read of a labelled database, or of an old file whose public_unlabeled is off)."""
    if who is ragdb.ALL:
        return
    hidden = db.count(principals=ragdb.ALL) - db.count(principals=who)
    if hidden <= 0:
        return
    why = "" if db.settings.get("public_unlabeled") else \
        " (this database hides unlabelled documents: 'ragdb config public_unlabeled true' makes them public)"
    warn(f"note: {hidden} document{'s are' if hidden != 1 else ' is'} hidden from this caller by access labels"
         f"{why}; read with --principal LABEL, or --all-principals for everything")


# --------------------------------------------------------------------------- JSON

def emit_json(obj: Any) -> None:
    """Print ``obj`` as indented JSON."""
    try:
        data = orjson.dumps(obj, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS, default=json_default)
    except TypeError:
        # a path that is not valid UTF-8 (a lone surrogate from os.fsdecode): show it escaped
        data = orjson.dumps(_printable(obj), option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS,
                            default=json_default)
    click.echo(data.decode())


def _printable(obj: Any) -> Any:
    if isinstance(obj, str):
        return obj.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(obj, Mapping):
        return {_printable(k): _printable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [_printable(v) for v in obj]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return _printable(dataclasses.asdict(obj))
    return obj


def json_default(obj: Any) -> Any:
    """JSON for what orjson does not take itself: tuples and sets, mappings, paths."""
    if isinstance(obj, (tuple, set, frozenset)):
        return list(obj)
    if isinstance(obj, Mapping):
        return dict(obj)
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON serialisable")


# --------------------------------------------------------------------------- tables

class _CellWidth:
    """``wcswidth`` for tabulate when the optional wcwidth package is missing (tabulate then
    measures CJK text by code points and misaligns it). tabulate uses wcwidth when it is
    installed (``tabulate[widechars]``, a core dependency); this stand-in (East Asian wide
    and full-width characters take two columns, combining marks none) only keeps tables
    aligned where it is not."""

    @staticmethod
    def wcswidth(text: str) -> int:
        return sum(2 if unicodedata.east_asian_width(c) in "WF" else 0 if unicodedata.combining(c) else 1
                   for c in text)


def _tabulate() -> Any:
    """tabulate, imported on the first table (with wcwidth it takes ~0.1 s: more than a
    ``ragdb search`` without a table spends on everything else)."""
    import tabulate as tabulate_module

    if tabulate_module.wcwidth is None:  # pragma: no cover - depends on the environment
        tabulate_module.wcwidth = _CellWidth
        tabulate_module.WIDE_CHARS_MODE = True
    return tabulate_module.tabulate


# Control characters (but tab and newline) as the Unicode symbols that picture them, one for one:
# a file named or holding "\x1b[31m" sent an escape sequence to the user's terminal.
_VISIBLE = {**{c: 0x2400 + c for c in range(0x20) if c not in (0x09, 0x0A)}, 0x7F: 0x2421,
            **dict.fromkeys(range(0x80, 0xA0), 0xFFFD)}


def visible(text: str) -> str:
    """``text`` for a terminal: each control character but tab and newline shown as a symbol
    (``\x1b`` as ``␛``), one character for one, so offsets into it hold."""
    return text.translate(_VISIBLE)


def emit_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], right: Sequence[int] = ()) -> None:
    """A table as ``ragdb list`` prints it (tabulate's "simple" format: a header, a dashed
    rule, two spaces between columns; ``right``: the columns aligned right). Cells are
    shown as given (no number parsing: a version "1.10" stays "1.10")."""
    cells = [[("" if v is None else visible(str(v))) for v in row] for row in rows]
    align = ["right" if i in right else "left" for i in range(len(headers))]
    text = _tabulate()(cells, headers=list(headers), tablefmt="simple", disable_numparse=True,
                    colalign=align)
    for line in text.splitlines():
        click.echo(line.rstrip())


def emit_pairs(rows: Sequence[tuple[str, Any]]) -> None:
    """Label/value lines (``ragdb stats``): labels padded to one width, two spaces, the value."""
    if not rows:
        return
    text = _tabulate()([[k, "" if v is None else visible(str(v))] for k, v in rows], tablefmt="plain",
                    disable_numparse=True, colalign=["left", "left"])
    for line in text.splitlines():
        click.echo(line.rstrip())


# --------------------------------------------------------------------------- output formats of the listing commands

#: The machine-readable formats of listing commands, after the flags that select them.
OUTPUT_FORMATS = ("json", "nl", "csv", "tsv")


@dataclasses.dataclass(frozen=True)
class Output:
    """How a listing command prints: ``fmt`` "table" (readable text), "json" (an array, or the
    command's JSON object), "nl" (one JSON object a line), "csv" or "tsv" (a header row unless
    ``headers`` is False, then one row a record)."""

    fmt: str = "table"
    headers: bool = True

    @property
    def table(self) -> bool:
        return self.fmt == "table"

    @property
    def json(self) -> bool:
        return self.fmt == "json"


def _json_line(obj: Any) -> str:
    try:
        return orjson.dumps(obj, option=orjson.OPT_NON_STR_KEYS, default=json_default).decode()
    except TypeError:  # a path that is not valid UTF-8: escaped, as emit_json does
        return orjson.dumps(_printable(obj), option=orjson.OPT_NON_STR_KEYS, default=json_default).decode()


def cell(value: Any) -> str:
    """A CSV/TSV cell: strings as they are, no value empty, booleans and nested values as JSON."""
    if value is None:
        return ""
    if isinstance(value, str):
        return _printable(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    return _json_line(value)


def emit_records(output: Output, records: Sequence[Mapping[str, Any]], columns: Sequence[str],
                 json_value: Any = None) -> None:
    """Print ``records`` in a machine-readable ``output`` format (not "table"): --json the array
    (or ``json_value``, the command's JSON object, where it prints one), --nl one record a line,
    --csv/--tsv ``columns`` (then any other keys the records have) a column each."""
    if output.fmt == "json":
        emit_json(list(records) if json_value is None else json_value)
        return
    if output.fmt == "nl":
        for record in records:
            click.echo(_json_line(record))
        return
    names = list(columns)
    for record in records:
        names += [k for k in record if k not in names]
    buf = io.StringIO()
    # the csv module's dialects, as sqlite-utils writes them ("excel": CRLF line ends, quoting as needed)
    writer = csv.writer(buf, dialect="excel-tab" if output.fmt == "tsv" else "excel")
    if output.headers:
        writer.writerow(names)
    for record in records:
        writer.writerow([cell(record.get(n)) for n in names])
    click.echo(buf.getvalue(), nl=False, color=True)  # (data: never stripped of what looks like styles)


# --------------------------------------------------------------------------- values as text

def short(text: str, limit: int = 100) -> str:
    """``text`` on one line, cut to ``limit`` characters with "…"."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def fmt_score(x: float) -> str:
    """A score as the tables show it."""
    return f"{x:.4f}"


def fmt_size(n: int) -> str:
    """A size in bytes, in B, KiB, MiB or GiB."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"  # pragma: no cover


def plural(n: int, word: str) -> str:
    """``n word(s)`` with thousands separators; empty for 0."""
    return f"{n:,} {word}{'s' * (n != 1)}" if n else ""


def analyzer_name(config: Any) -> str:
    """An analyzer configuration, as a short description."""
    return describe_config(config)


def setting_text(key: str, value: Any) -> str:
    """The value of setting ``key`` as ``ragdb config`` shows it."""
    if key == "fields" and value is None:
        return "not indexed (made before fields: 'ragdb reindex' indexes titles and headings)"
    if key == "min_confidence" and value is None:
        return "default (the floor the database measures on itself: 'ragdb calibrate')"
    if isinstance(value, bool):
        return "true" if value else "false"
    if key == "analyzer":
        return analyzer_name(value)
    if isinstance(value, (Mapping, list)):
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
    return str(value)


# --------------------------------------------------------------------------- terminals and progress

def _stderr_is_tty() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def stdout_is_tty() -> bool:
    """Whether stdout is a terminal."""
    try:
        return sys.stdout.isatty()
    except (AttributeError, ValueError):
        return False


@contextlib.contextmanager
def _progress(label: str, length: int | None) -> Iterator[Callable[[int], None] | None]:
    """A progress callback showing a bar on a terminal; None (quiet) when stderr is not one."""
    if not _stderr_is_tty() or not length:
        yield None
        return
    with click.progressbar(length=length, label=label, file=sys.stderr) as bar:
        yield bar.update


def progress_bar(label: str, length: int | None) -> AbstractContextManager[Callable[[int], None] | None]:
    """The progress callback of long work (add, sync, import, embed, eval): a bar on stderr
    when it is a terminal and ``length`` is known, else None. Every command reaches
    :func:`_progress` through here (tests replace it, and ``_stderr_is_tty``, in this module)."""
    return _progress(label, length)
