"""Commands that make and configure a database: ``init``, ``collections`` (list, create,
drop) and ``config`` (its settings)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import click
import orjson

import ragdb
import ragdb.text.fields
from ragdb.cli.options import (
    refuse_readonly,
    check_analyzer,
    current_collection,
    database_missing,
    database_option,
    db_path,
    json_option,
    open_database,
    output_options,
    shown_path,
)
from ragdb.cli.output import (
    Output,
    analyzer_name,
    emit_json,
    emit_pairs,
    emit_records,
    emit_table,
    one_line,
    plural,
    setting_text,
)
from ragdb.errors import InvalidInput
from ragdb.storage import is_postgres


# --------------------------------------------------------------------------- init


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


@click.command()
@database_option
@click.option("--analyzer", default=None, metavar="NAME", callback=lambda _c, _p, v: check_analyzer(v),
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
    refuse_readonly("init")
    path = db_path(database)
    collection = current_collection()
    existed = _existed(path)
    if existed and collection is not None:
        with ragdb.open(path, create=False) as db:
            existed = collection in {c.name for c in db.collections()}
    with ragdb.open(path, analyzer=analyzer, chunker=chunker, keep_versions=keep_versions,
                    public_unlabeled=public_unlabeled, create=True, collection=collection) as db:
        settings = db.settings
        name = db.collection_name
    out = {"database": shown_path(path), "collection": name, "created": not existed, "analyzer": settings.get("analyzer"),
           "chunker": settings.get("chunker"), "keep_versions": bool(settings.get("keep_versions")),
           "public_unlabeled": bool(settings.get("public_unlabeled"))}
    if as_json:
        emit_json(out)
        return
    where = shown_path(path) if name == "default" else f"collection {name!r} of {shown_path(path)}"
    click.echo(f"{'created' if not existed else 'opened existing'} {where}")
    emit_pairs([("analyzer", analyzer_name(settings.get("analyzer"))), ("chunker", out["chunker"]),
                ("keep versions", "yes" if out["keep_versions"] else "no"),
                ("public unlabeled", "yes" if out["public_unlabeled"] else "no")])


# --------------------------------------------------------------------------- collections

@click.group("collections", invoke_without_command=True)
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
    path = db_path(database)
    readonly = bool(click.get_current_context().find_root().params.get("readonly"))
    if path == ":memory:" or database_missing(path):
        raise click.ClickException(f"{path}: no such database")
    with ragdb.open(path, create=False, readonly=readonly) as db:
        infos = db.collections()
    records = [dataclasses.asdict(c) for c in infos]
    if not output.table:
        emit_records(output, records, ("name", "documents", "chunks", "analyzer", "embedding_model", "created_at"))
        return
    emit_table(["collection", "documents", "chunks", "analyzer", "embedding model", "created"],
               [(c.name, c.documents, c.chunks, c.analyzer or "", c.embedding_model or "", c.created_at) for c in infos],
               right=(1, 2))


@collections_cmd.command("create")
@database_option
@click.argument("name")
@click.option("--analyzer", default=None, metavar="NAME", callback=lambda _c, _p, v: check_analyzer(v),
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
    refuse_readonly("collections create")
    path = db_path(database or (ctx.obj or {}).get("database"))
    with ragdb.open(path) as db:
        made = db.create_collection(name, analyzer=analyzer, chunker=chunker, keep_versions=keep_versions,
                                    public_unlabeled=public_unlabeled)
        settings = made.settings
    if as_json:
        emit_json({"database": shown_path(path), "collection": name, "analyzer": settings.get("analyzer"),
                   "chunker": settings.get("chunker"), "keep_versions": bool(settings.get("keep_versions")),
                   "public_unlabeled": bool(settings.get("public_unlabeled"))})
        return
    click.echo(f"created collection {name!r} in {shown_path(path)}")
    emit_pairs([("analyzer", analyzer_name(settings.get("analyzer"))), ("chunker", settings.get("chunker")),
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
    refuse_readonly("collections drop")
    path = db_path(database or (ctx.obj or {}).get("database"))
    if database_missing(path):
        raise click.ClickException(f"{path}: no such database")
    with ragdb.open(path, create=False) as db:
        info = next((c for c in db.collections() if c.name == name), None)
        if info is not None and not yes:
            click.confirm(f"drop collection {name!r} of {shown_path(path)} ({_documents(info.documents)})?",
                          abort=True, err=True)
        db.drop_collection(name)
    if as_json:
        emit_json({"database": shown_path(path), "dropped": name, "documents": info.documents if info else 0})
        return
    click.echo(f"dropped collection {name!r} ({_documents(info.documents if info else 0)})")


def _documents(n: int) -> str:
    return plural(n, "document") or "no documents"


# --------------------------------------------------------------------------- config

#: The settings 'ragdb config KEY VALUE' changes, and what VALUE is.
CONFIG_KEYS = {"public_unlabeled": "true|false", "keep_versions": "true|false", "chunker": "SPEC",
               "min_confidence": "0..1|default", "fields": "title=W,section=W"}


_FLAG_WORDS = {"true": True, "yes": True, "on": True, "1": True, "false": False, "no": False, "off": False, "0": False}


_SETTING_DEFAULTS = {"keep_versions": False, "public_unlabeled": False,  # what a missing row means
                     "min_confidence": None}


@click.command("config")
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
                                   default: measured by the database, 'ragdb calibrate')
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
    with open_database(database) as db:
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
            emit_records(output, [{"setting": k, "value": v} for k, v in settings.items()], ("setting", "value"),
                         json_value=settings)
        else:
            emit_pairs([(k, setting_text(k, v)) for k, v in settings.items()])
        return
    old = settings.get(key)
    if value is None:
        if as_json:
            emit_json({"setting": key, "value": old})
        else:
            click.echo(setting_text(key, old))
        return
    if key not in ("public_unlabeled", "min_confidence", "fields"):  # opening with chunker=/keep_versions= stores them
        with open_database(database, **{key: new}) as db:
            new = db.settings.get(key)  # the chunker spec as stored (canonical form)
    if as_json:
        emit_json({"setting": key, "old": old, "value": new, "changed": old != new})
    else:
        click.echo(f"{key}: {setting_text(key, old)} -> {setting_text(key, new)}"
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
        return ragdb.text.fields.check_weights(parsed, "fields")
    except InvalidInput as e:
        raise click.UsageError(one_line(e)) from None


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


#: The commands of this module (:mod:`ragdb.cli.main` adds them to the ``ragdb`` group).
COMMANDS: tuple[click.Command, ...] = (init, collections_cmd, config_cmd)
