"""Default plugin (:data:`ragdb.plugins.DEFAULT_PLUGINS`): the chunkers and analyzers that
ship with ragdb, registered through the same hooks as a third-party plugin's.

Importing this module costs nothing: each hook imports the module it registers from
(:mod:`ragdb.text.chunking`, :mod:`ragdb.text.analysis`) on the first lookup of its kind.
"""

from __future__ import annotations

from collections.abc import Callable

from ragdb.plugins import hookimpl


@hookimpl
def register_chunkers(register: Callable[..., None]) -> None:
    from ragdb.text import chunking

    chunking.register_builtins(register)


@hookimpl
def register_analyzers(register: Callable[..., None]) -> None:
    from ragdb.text import analysis

    analysis.register_builtins(register)
