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
import os
from typing import Any

import click

import ragdb
from ragdb.cli.commands import answering, databases, documents, maintenance, searching, serving
from ragdb.cli.output import one_line
from ragdb.errors import RagdbError
from ragdb.index import kernel


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
@click.version_option(ragdb.__version__, prog_name="ragdb",
                      message=f"%(prog)s (scoring kernel: {kernel.name()}), version %(version)s")
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


# --------------------------------------------------------------------------- its commands

#: The modules of :mod:`ragdb.cli.commands` whose ``COMMANDS`` make up the group.
COMMAND_MODULES = (databases, documents, searching, answering, maintenance, serving)


def _add_commands(group: click.Group) -> None:
    for module in COMMAND_MODULES:
        for command in module.COMMANDS:
            group.add_command(command)


_add_commands(cli)


# --------------------------------------------------------------------------- entry point

def main() -> None:
    """Console entry point (``ragdb``)."""
    cli(prog_name="ragdb")


if __name__ == "__main__":
    main()
