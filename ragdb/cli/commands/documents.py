"""Commands that put documents in and take them out: ``add``, ``sync``, ``delete``, ``show``,
``list``, ``export``, ``import`` and ``copy``.

The work is the library's: :mod:`ragdb.files.sync` (add, sync) and :mod:`ragdb.files.transfer`
(export, import, copy).
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Sequence
from typing import Any

import click
import orjson

import ragdb
from ragdb.cli.embedding import check_model, embed_after_write, report_embedding, write_embedder
from ragdb.cli.options import (
    refuse_readonly,
    access_options,
    current_collection,
    database_missing,
    database_option,
    db_path,
    filter_arg,
    filter_only_option,
    json_option,
    key_values,
    load_embedder,
    metadata_value,
    open_database,
    output_options,
    principals_arg,
    write_model_option,
)
from ragdb.cli.output import (
    visible,
    Output,
    emit_json,
    emit_pairs,
    emit_records,
    emit_table,
    hidden_note,
    json_default,
    plural,
    progress_bar,
    warn,
)
from ragdb.serve.shapes import document_json


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


def _skip_json(skipped: Sequence[Any], unmatched: Sequence[tuple[str, str]]) -> dict[str, Any]:
    from ragdb.files import walk

    return {"skipped": [{"path": k.path, "reason": k.reason, "detail": k.detail} for k in skipped],
            "skip_counts": walk.skip_counts(skipped),
            "unmatched": [{"option": o, "pattern": p} for o, p in unmatched]}


def _report_skips(skipped: Sequence[Any], unmatched: Sequence[tuple[str, str]], verbose: bool) -> None:
    """``-v``: one line per skipped path; always: the one-line summary by reason, and a
    warning for each pattern that matched nothing."""
    from ragdb.files import walk

    if verbose:
        for k in skipped:
            click.echo(visible(f"skip {k.path} ({k.reason}{': ' + k.detail if k.detail else ''})"))
    if skipped:
        folders = sum(1 for k in skipped if k.path.endswith("/"))
        what = " and ".join(x for x in (plural(folders, "folder"), plural(len(skipped) - folders, "file")) if x)
        click.echo(f"skipped {what}: {walk.reason_summary(walk.skip_counts(skipped))}"
                   + ("" if verbose else " (-v lists them)"))
    for option, pattern in unmatched:
        warn(f"warning: --{option} {pattern!r} matched no file")


@click.command()
@database_option
@click.argument("paths", nargs=-1, required=True, metavar="PATH...")
@click.option("--recursive/--no-recursive", default=True, show_default=True, help="Descend into sub-folders.")
@click.option("--source-prefix", default="", metavar="PREFIX", help="Prepend PREFIX to every source.")
@click.option("--source", default=None, metavar="NAME", help="Source of the document (one input only).")
@click.option("--version", "doc_version", default=None, help="Version label of the documents.")
@click.option("--metadata", "metadata", multiple=True, metavar="KEY=VALUE",
              help="Metadata set on every document (repeatable): a JSON number or boolean is typed "
                   "(year=2024 is a number, draft=true a boolean), a JSON string forces text (year='\"2024\"'), "
                   "anything else is text.")
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
    source already stored is replaced (the summary says how many were),
    identical content is left alone. Standard input without --source is
    named stdin-HASH after its content (12 hex digits of its SHA-256): another
    text piped in is another document, never a replacement of the first.
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
    from ragdb.files import sync

    meta: dict[str, Any] = {}
    for k, v in key_values(metadata, "--metadata").items():
        values = [metadata_value(x) for x in v]
        meta[k] = values[0] if len(values) == 1 else values
    labels = _labels(acl, public)
    embedder = load_embedder(embed_model) if embed_model is not None else None
    selection = sync.select_paths(paths, recursive=recursive, include=[*include, *globs], exclude=exclude,
                                  source_prefix=source_prefix, relative_to=relative_to)
    stdin = sys.stdin.buffer.read() if "-" in paths else None
    embedded: int | None = None
    embed_error: str | None = None
    with open_database(database, create=True) as db:
        if embedder is not None:
            check_model(db, embedder, embed_model or "")  # refused before anything is written
        embedder = write_embedder(db, embedder, embed)
        with progress_bar("adding", len(selection.items)) as progress:
            report = sync.add_paths(db, selection, source=source, version=doc_version, metadata=meta,
                                    acl=labels, stdin=stdin, stdin_kind=kind, strict=strict, progress=progress,
                                    source_prefix=source_prefix)
        if embedder is not None:
            embedded, embed_error = embed_after_write(db, embedder)
    nothing = not report.added and not report.unchanged
    if as_json:
        emit_json({"added": report.added, "replaced": report.replaced, "unchanged": report.unchanged,
                   "failed": [{"source": f.source, "path": f.path, "error": f.error} for f in report.failed],
                   "documents": report.documents, "removed": report.removed,
                   **_skip_json(report.skipped, report.unmatched),
                   **report_embedding(embedder, embedded, embed_error, True, report.reused)})
    else:
        for f in report.failed:
            warn(f"failed {f.error}")
        replaced = f" ({len(report.replaced)} replacing a stored version)" if report.replaced else ""
        click.echo(f"added {len(report.added)} document{'s' * (len(report.added) != 1)}{replaced}, "
                   f"{len(report.unchanged)} unchanged, {len(report.failed)} failed"
                   + (f", {report.removed} stale record{'s' * (report.removed != 1)} removed"
                      if report.removed else ""))
        _report_skips(report.skipped, report.unmatched, verbose)
        report_embedding(embedder, embedded, embed_error, False, report.reused)
        if nothing and not report.failed:
            warn("Error: nothing to add: no file was selected" + (" (all were skipped)" if report.skipped else ""))
    if nothing or embed_error is not None:
        raise click.exceptions.Exit(1)


# --------------------------------------------------------------------------- sync

@click.command("sync")
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
    from ragdb.files import sync

    labels = _labels(acl, public)
    embedder = load_embedder(embed_model) if embed_model is not None else None
    embedded: int | None = None
    embed_error: str | None = None
    if not dry_run:
        refuse_readonly("sync")
    path = db_path(database)
    if dry_run and database_missing(path):
        path = ":memory:"  # nothing stored yet: plan against an empty database, create no file
    readonly = dry_run and path != ":memory:" and bool(click.get_current_context().find_root().params.get("readonly"))
    with ragdb.open(path, collection=current_collection(), readonly=readonly) as db:  # (--readonly: a dry run writes nothing)
        if embedder is not None:
            check_model(db, embedder, embed_model or "")
        if not dry_run:
            embedder = write_embedder(db, embedder, embed)
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
            with progress_bar("syncing", work) as progress:
                report = sync.apply_sync(db, plan, strict=strict, progress=progress)
            if embedder is not None:
                embedded, embed_error = embed_after_write(db, embedder)
    if dry_run:
        embedder = None  # nothing was written, nothing embedded
    if as_json:
        emit_json({"folder": report.root, "prefix": report.prefix, "dry_run": report.dry_run,
                   "added": report.added, "changed": report.changed, "deleted": report.deleted,
                   "unchanged": len(report.unchanged),
                   "failed": [{"source": f.source, "path": f.path, "error": f.error} for f in report.failed],
                   "documents": report.documents, "removed": report.removed,
                   **_skip_json(report.skipped, report.unmatched),
                   **report_embedding(embedder, embedded, embed_error, True, report.reused)})
        if embed_error is not None:
            raise click.exceptions.Exit(1)
        return
    for f in report.failed:
        warn(f"failed {f.error}")
    if dry_run or verbose:
        for mark, sources in (("A", report.added), ("M", report.changed), ("D", report.deleted)):
            for s in sources:
                click.echo(f"{mark} {visible(s)}")
    verb = "would " if dry_run else ""
    click.echo(f"{verb}add {len(report.added)}, {verb}replace {len(report.changed)}, "
               f"{verb}delete {len(report.deleted)}, unchanged {len(report.unchanged)}, "
               f"failed {len(report.failed)}")
    _report_skips(report.skipped, report.unmatched, verbose)
    if legacy:
        warn(legacy)
    report_embedding(embedder, embedded, embed_error, False, report.reused)
    if embed_error is not None:
        raise click.exceptions.Exit(1)


def _legacy_names(db: ragdb.Database, plan: Any, source_prefix: str, folder: str) -> str | None:
    """A warning when the sync finds nothing stored under its sources but documents under
    the bare prefix: most likely stored by a sync from before sources were named like
    'ragdb add' names them (PREFIX + path relative to FOLDER)."""
    from ragdb.files import sync

    if not source_prefix or plan.prefix == source_prefix or plan.changed or plan.unchanged or plan.deleted:
        return None
    if not plan.added or not db.documents(sync.escape_glob(source_prefix) + "*", limit=1, principals=ragdb.ALL):
        return None
    return (f"warning: nothing is stored under {plan.prefix!r} yet, but there are documents under "
            f"{source_prefix!r}: sync names files as 'ragdb add' does (PREFIX + the path from the working "
            f"folder); to keep names relative to the folder, pass --relative-to {folder}")


# --------------------------------------------------------------------------- delete / show / list

#: The CSV columns of ``ragdb list``.
DOC_COLUMNS = ("id", "source", "version", "timestamp", "content_hash", "metadata", "acl", "chunks", "latest")


def _doc_json(d: ragdb.Document) -> dict[str, Any]:
    return document_json(d)


@click.command()
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
    flt = filter_arg(filters, where)
    with open_database(database) as db:
        if doc_id is not None:
            n = db.delete(doc_id)
        else:
            n = db.delete(source=source, glob=True, filter=flt)
    if as_json:
        emit_json({"deleted": n})
    else:
        click.echo(f"deleted {n} document{'s' * (n != 1)}")


@click.command()
@database_option
@click.argument("document", metavar="ID|SOURCE")
@click.option("--full", is_flag=True, help="Print the whole text, not an excerpt.")
@access_options
@json_option
def show(database: str | None, document: str, full: bool, principals: tuple[str, ...], all_principals: bool,
         as_json: bool) -> None:
    """Show a document (by id, or the latest version of a source): metadata, chunk count, text."""
    who = principals_arg(principals, all_principals)
    with open_database(database) as db:
        doc = db.get(int(document), principals=who) if document.isdigit() else \
            db.get(source=document, principals=who)
    if as_json:
        emit_json(_doc_json(doc))
        return
    text = doc.text or ""
    emit_pairs([("id", doc.id), ("source", doc.source), ("version", doc.version or "-"),
                ("timestamp", doc.timestamp or "-"), ("latest", "yes" if doc.latest else "no"),
                ("chunks", doc.chunk_count), ("characters", len(text)), ("content hash", doc.content_hash),
                ("access labels", ", ".join(doc.acl) or "-")])
    if doc.metadata:
        click.echo("metadata:")
        for k in sorted(doc.metadata):
            click.echo(f"  {visible(k)}: {orjson.dumps(doc.metadata[k], default=json_default).decode()}")
    click.echo("")
    if full or len(text) <= 600:
        click.echo(visible(text))
    else:
        click.echo(visible(text[:600].rstrip()) + " …")
        click.echo(f"({len(text) - 600} more characters; --full shows them)")


@click.command("list")
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
    who = principals_arg(principals, all_principals)
    with open_database(database) as db:
        docs = db.documents(source, versions="all" if all_versions else "latest", limit=limit, offset=offset,
                            filter=filter_arg(filters, where), principals=who)
        if not docs and not offset:
            hidden_note(db, who)
    if not output.table:
        emit_records(output, [_doc_json(d) for d in docs], DOC_COLUMNS)
        return
    if not docs:
        click.echo("no documents")
        return
    rows = [(d.id, d.source, d.version or "", d.chunk_count, d.timestamp or "") + (("yes" if d.latest else "no",)
                                                                                 if all_versions else ())
            for d in docs]
    headers = ["id", "source", "version", "chunks", "timestamp"] + (["latest"] if all_versions else [])
    emit_table(headers, rows, right=(0, 3))


# --------------------------------------------------------------------------- export / copy / import

@click.command("export")
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
    from ragdb.files import transfer

    who = principals_arg(principals, all_principals)
    with open_database(database) as db:
        if file == "-":
            report = transfer.export_jsonl(db, sys.stdout.buffer, principals=who)
        else:
            report = transfer.export_jsonl(db, file, principals=who)
    if report.hidden:
        warn(f"{report.hidden} stored document{'s' * (report.hidden != 1)} not exported: hidden from this "
             f"caller by access labels (--all-principals exports everything)")
    if file == "-":
        return
    if as_json:
        emit_json({"file": report.path, "documents": report.documents, "latest": report.latest,
                   "hidden": report.hidden})
    else:
        click.echo(f"exported {report.documents} document{'s' * (report.documents != 1)} to {report.path}")


@click.command("copy")
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
    from ragdb.files import transfer

    report = transfer.copy_database(source, target, collections=list(collections) or None)
    problems: list[str] = []
    if not no_check:
        for c in report.collections:
            with ragdb.open(target, collection=c.name, create=False) as db:
                problems += [f"collection {c.name!r}: {p}" for p in db.check()]
    if as_json:
        emit_json({"source": report.source, "target": report.target,
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


@click.command("import")
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
    from ragdb.files import transfer

    embedder = load_embedder(embed_model) if embed_model is not None else None
    embedded: int | None = None
    embed_error: str | None = None
    total = None
    if file != "-":
        try:
            with open(file, "rb") as fh:
                total = sum(1 for line in fh if line.strip())
        except OSError as e:
            raise click.ClickException(f"{file}: cannot read: {e.strerror or e}") from None
    with open_database(database, create=True) as db:
        if embedder is not None:
            check_model(db, embedder, embed_model or "")
        embedder = write_embedder(db, embedder, embed)
        with progress_bar("importing", total) as progress:
            report = transfer.import_jsonl(db, sys.stdin.buffer if file == "-" else file, progress=progress)
        if embedder is not None:
            embedded, embed_error = embed_after_write(db, embedder)
    if as_json:
        emit_json({"file": report.path, "documents": report.documents, "unchanged": report.unchanged,
                   "skipped_versions": report.skipped_versions,
                   **report_embedding(embedder, embedded, embed_error, True)})
    else:
        msg = f"imported {report.documents} document{'s' * (report.documents != 1)}"
        if report.unchanged:
            msg += f", {report.unchanged} already identical"
        if report.skipped_versions:
            msg += (f", skipped {report.skipped_versions} older versions (the database does not keep versions; "
                    f"'ragdb init --keep-versions' first to import them)")
        click.echo(msg)
        report_embedding(embedder, embedded, embed_error, False)
    if embed_error is not None:
        raise click.exceptions.Exit(1)


#: The commands of this module (:mod:`ragdb.cli.main` adds them to the ``ragdb`` group).
COMMANDS: tuple[click.Command, ...] = (add, sync_cmd, delete, show, list_cmd, export_cmd, import_cmd, copy_cmd)
