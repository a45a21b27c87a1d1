"""The ``ragdb`` command line (click). :mod:`ragdb.cli.main` holds the group and ``main()``
(the console script ``ragdb = ragdb.cli.main:main``; ``python -m ragdb.cli`` runs it too).

Only the group is re-exported here: re-exporting the function ``main`` would hide the
module :mod:`ragdb.cli.main` behind it (``from ragdb.cli import main`` must give the module)."""

from ragdb.cli.main import cli

__all__ = ["cli"]
