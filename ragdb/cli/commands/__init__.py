"""The ``ragdb`` commands, one module a group (each lists its commands in ``COMMANDS``;
:mod:`ragdb.cli.main` names them in its ``COMMANDS`` table and imports a module when one of its commands runs):

* :mod:`~ragdb.cli.commands.databases`: init, collections, config;
* :mod:`~ragdb.cli.commands.documents`: add, sync, delete, show, list, export, import, copy;
* :mod:`~ragdb.cli.commands.searching`: search, facets, eval;
* :mod:`~ragdb.cli.commands.answering`: prompt, ask;
* :mod:`~ragdb.cli.commands.maintenance`: embed, stats, check, optimize, reindex, migrate, plugins;
* :mod:`~ragdb.cli.commands.serving`: mcp, serve.

The options they share are in :mod:`ragdb.cli.options`, what they print in
:mod:`ragdb.cli.output`, embedding with progress in :mod:`ragdb.cli.embedding`.
"""
