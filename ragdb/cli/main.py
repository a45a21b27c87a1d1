"""The ``ragdb`` command: a thin click layer over the library.

Every command takes ``-d/--database`` (before or after the command name; also
read from ``RAGDB_DATABASE``) and prints a readable table (drawn with tabulate),
or JSON with ``--json``; the listing commands also print ``--nl`` (JSON lines),
``--csv`` and ``--tsv`` (see :func:`ragdb.cli.options.output_options`). Exit
status: 0 success, 1 error (one line on stderr naming the input and the problem),
2 usage error, 3 refused (``prompt`` and ``ask``: no evidence passed selection, or
the model answered with the refusal sentence; the output is still printed, and
stderr says why). Long work (add, sync, import, embed, eval) shows a progress bar
when stderr is a terminal.

The logic lives in the library: :mod:`ragdb.files.sync` (add, sync),
:mod:`ragdb.files.transfer` (export, import), :mod:`ragdb.answers.evaluation`,
:mod:`ragdb.answers.prompt` and :mod:`ragdb.answers.llm` (prompt, ask).

This module holds the ``ragdb`` group (its own options: -d, -c, --readonly, --version;
library errors as one line), :func:`main`, and adds the commands of
:mod:`ragdb.cli.commands` (one module a group of commands) to the group. The options the
commands share are in :mod:`ragdb.cli.options`, their printing in :mod:`ragdb.cli.output`.
"""

from __future__ import annotations

import errno
import gc
import importlib
import os
from typing import Any

import click

import ragdb
from ragdb.errors import RagdbError


def one_line(err: BaseException) -> str:
    """An error's message on one line (whitespace collapsed); its class name when it has none."""
    text = " ".join(str(err).split())
    return text or type(err).__name__


# --------------------------------------------------------------------------- the group


class _Group(click.Group):
    """Turns library errors into one-line messages (exit 1), never a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except RagdbError as e:
            raise click.ClickException(one_line(e)) from None
        except OSError as e:
            if e.errno == errno.EPIPE:
                raise
            raise click.ClickException(_os_error(e)) from None
        except (KeyboardInterrupt, SystemExit):
            raise
        except Exception as e:  # a bug: still one line, unless RAGDB_DEBUG asks for the traceback
            if os.environ.get("RAGDB_DEBUG"):
                raise
            raise click.ClickException(f"internal error: {type(e).__name__}: {one_line(e)} "
                                       f"(set RAGDB_DEBUG=1 for the traceback)") from None


def _os_error(e: OSError) -> str:
    what = e.filename if e.filename is not None else ""
    reason = e.strerror or str(e)
    return f"{what}: {reason}" if what else reason


def _kernel_name() -> str:
    """The scoring kernel searches would use (:func:`ragdb.index.kernel.name`), without importing
    the compiled kernel where that is certain: importing it imports numpy (most of a ``--version``
    start). ``ragdb.index.kernel`` takes the compiled kernel unless ``RAGDB_KERNEL=numpy``, when
    the extension imports; the extension needs only Python and numpy's Python API (it does not
    ``cimport numpy``: no numpy C ABI to mismatch), so its file and numpy being found is its
    importing. Any other case (the kernel module loaded already, with perhaps a ``kernel.use()``;
    ``RAGDB_KERNEL=numpy``; the extension or numpy missing) asks the kernel module itself."""
    import importlib.util
    import sys

    if "ragdb.index.kernel" not in sys.modules and os.environ.get("RAGDB_KERNEL", "").strip().lower() != "numpy":
        try:
            found = (importlib.util.find_spec("ragdb.index.ckernel") is not None
                     and importlib.util.find_spec("numpy") is not None)
        except (ImportError, ValueError):
            found = False
        if found:
            return "compiled"
    from ragdb.index import kernel

    return kernel.name()


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    """``--version``: the version and the scoring kernel (see :func:`_kernel_name`)."""
    if not value or ctx.resilient_parsing:
        return
    click.echo(f"ragdb, version {ragdb.__version__} (scoring kernel: {_kernel_name()})")
    ctx.exit()


#: Each command of the group: the module of :mod:`ragdb.cli.commands` that defines it (in its
#: ``COMMANDS``) and the first paragraph of its help, which ``ragdb --help`` lists. A command's
#: module is imported when the command runs (or its own ``--help`` is asked), never for the
#: listing: a CLI start imports click and this table, not numpy, SQLite code or models.
#: tests/cli/test_cli_start.py checks the table against the modules.
COMMANDS: dict[str, tuple[str, str]] = {
    'init': ('databases',
            'Create a database with the chosen analyzer and chunker settings.'),
    'collections': ('databases',
                   'List the collections of the file (or create or drop one).'),
    'config': ('databases',
              "List the database's settings; show one (KEY); or change one (KEY VALUE)."),
    'add': ('documents',
           'Add files, folders, or - (standard input) to the database.'),
    'sync': ('documents',
            'Make the knowledge base mirror FOLDER: add new files, replace changed ones, delete vanished ones.'),
    'delete': ('documents',
              'Delete a document by id, every document whose source matches a pattern, or those matching --filter/--where.'),
    'show': ('documents',
            'Show a document (by id, or the latest version of a source): metadata, chunk count, text.'),
    'list': ('documents',
            'List stored documents (id, source, version, chunks, timestamp) the caller may see.'),
    'export': ('documents',
              'Write the stored documents (text, metadata, labels, chunker, versions) to a JSON Lines file (- for stdout).'),
    'import': ('documents',
              'Add the documents of an exported JSON Lines file (- for stdin), in one transaction.'),
    'copy': ('documents',
            'Copy a knowledge base from SRC to DST, between SQLite files and PostgreSQL databases (either way), with its ids, versions, timestamps, labels, metadata and vectors.'),
    'search': ('searching',
              'Search the knowledge base; the best chunks first.'),
    'facets': ('searching',
              'Count the values of metadata KEY (or source, version) over the chunks that match QUERY and the filters.'),
    'eval': ('searching',
            'Evaluate retrieval on a BEIR-layout collection: nDCG@10, Recall@k, MRR@10.'),
    'prompt': ('answering',
              "Print the grounded prompt that 'ask' would send for QUESTION; sends nothing."),
    'ask': ('answering',
           'Answer QUESTION from the knowledge base with a language model, listing the sources under it.'),
    'calibrate': ('answering',
                  'Choose the refusal floor (min_confidence) of prompt and ask.'),
    'embed': ('maintenance',
             'Embed the chunks that have no vector yet, for --scorer vector and hybrid.'),
    'stats': ('maintenance',
             'Collection statistics: documents, chunks, vocabulary, postings, file size, vectors.'),
    'check': ('maintenance',
             'Verify every invariant (df = real postings, statistics, no orphans, SQLite integrity, well-formed packed columns, the filter index = metadata and labels, texts matching their hashes).'),
    'optimize': ('maintenance',
                'Merge postings, drop deleted entries and reclaim space (ANALYZE, VACUUM).'),
    'reindex': ('maintenance',
               'Rebuild the lexical index with the current analyzer (or --analyzer), in place.'),
    'migrate': ('maintenance',
               'Apply pending schema migrations (opening a database applies them too).'),
    'plugins': ('maintenance',
               'List the installed plugins: name, version, what each provides (embedders, rerankers, loaders, analyzers) and any problem.'),
    'mcp': ('serving',
           'Serve the database to MCP clients (assistants, agents) over stdio, or HTTP with --http.'),
    'serve': ('serving',
             'Serve the database over HTTP (a JSON API; schema at /openapi.json).'),
}


class _LazyGroup(_Group):
    """The ``ragdb`` group: its commands load on first use (click's documented lazy-group pattern,
    https://click.palletsprojects.com/en/stable/complex/#lazily-loading-subcommands), and the
    listing in ``--help`` comes from :data:`COMMANDS`."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(COMMANDS))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        found = super().get_command(ctx, cmd_name)
        if found is not None or cmd_name not in COMMANDS:
            return found
        module = importlib.import_module(f"ragdb.cli.commands.{COMMANDS[cmd_name][0]}")
        for command in module.COMMANDS:
            self.add_command(command)
        if _start["gc_paused"]:
            # the library, which nearly every command opens, while the collector still rests
            importlib.import_module("ragdb.database")
        return super().get_command(ctx, cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        names = [n for n in self.list_commands(ctx) if n in COMMANDS or not self.commands[n].hidden]
        if not names:
            return
        limit = formatter.width - 6 - max(len(n) for n in names)
        rows = []
        for name in names:
            if name in self.commands:
                rows.append((name, self.commands[name].get_short_help_str(limit)))
            else:
                # a stand-in command with the same help shortens it the way click shortens the real one
                rows.append((name, click.Command(name, help=COMMANDS[name][1]).get_short_help_str(limit)))
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group("ragdb", cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("-d", "--database", envvar="RAGDB_DATABASE", default=None, metavar="PATH",
              help="Database file, or a PostgreSQL URL / libpq string (postgresql://..., service=NAME); "
                   "also read from RAGDB_DATABASE.")
@click.option("-c", "--collection", envvar="RAGDB_COLLECTION", default=None, metavar="NAME",
              help="Collection of the file to work on (also read from RAGDB_COLLECTION; default: 'default'). "
                   "'ragdb collections' lists them.")
@click.option("--readonly", is_flag=True, envvar="RAGDB_READONLY",
              help="Open the database read-only (nothing written, no migrations; on read-only media SQLite's "
                   "immutable mode). Commands that write fail.")
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_print_version,
              help="Show the version and the scoring kernel, and exit.")
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
    _resume_gc()  # (the command is loaded: what it runs may make garbage)


# --------------------------------------------------------------------------- its commands

# --------------------------------------------------------------------------- entry point

#: Whether :func:`main` paused Python's cyclic garbage collector for the command's start.
_start = {"gc_paused": False}


def _resume_gc() -> None:
    """The collector on again after :func:`main` paused it, the objects made until now (modules,
    classes, functions) frozen out of its reach (``gc.freeze``): they live as long as the
    process, and its later collections need not walk them (what ``gc.freeze`` is for)."""
    if _start["gc_paused"]:
        _start["gc_paused"] = False
        gc.freeze()
        gc.enable()


def main() -> None:
    """Console entry point (``ragdb``).

    The garbage collector rests while the command starts: its module, numpy and the library
    are imported then, which makes objects by the hundred thousand and no garbage, and the
    collector ran ~60 times over them in a ``ragdb search``, 12-18 ms of a ~270 ms command. It
    resumes when the command runs (the group's callback, :func:`_resume_gc`), or at the latest
    when this returns. Only here: a program calling :data:`cli` itself keeps its collector."""
    if gc.isenabled():
        gc.disable()
        _start["gc_paused"] = True
    try:
        cli(prog_name="ragdb")
    finally:
        _resume_gc()


if __name__ == "__main__":
    main()
