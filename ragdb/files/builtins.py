"""Default plugin (:data:`ragdb.plugins.DEFAULT_PLUGINS`): the loaders that ship with ragdb
(text, markdown, rst, html, pdf, jsonl) and the file suffixes they read, registered through
the same hook as a third-party plugin's.

Importing this module costs nothing: the hook imports :mod:`ragdb.files.loaders` on the
first loader lookup, and pypdf loads only when a PDF is read.
"""

from __future__ import annotations

from collections.abc import Callable

from ragdb.plugins import hookimpl


@hookimpl
def register_loaders(register: Callable[..., None]) -> None:
    from ragdb.files import loaders

    loaders.register_builtins(register)
