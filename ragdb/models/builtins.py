"""Default plugin (:data:`ragdb.plugins.DEFAULT_PLUGINS`): the embedders and rerankers that
ship with ragdb, registered through the same hooks as a third-party plugin's.

Importing this module costs nothing: each hook imports the module it registers from
(:mod:`ragdb.models.embeddings`, :mod:`ragdb.models.rerank`) on the first lookup of its
kind, and the models' optional packages load only when a model is made.
"""

from __future__ import annotations

from collections.abc import Callable

from ragdb.plugins import hookimpl


@hookimpl
def register_embedders(register: Callable[..., None]) -> None:
    from ragdb.models import embeddings

    embeddings.register_builtins(register)


@hookimpl
def register_rerankers(register: Callable[..., None]) -> None:
    from ragdb.models import rerank

    rerank.register_builtins(register)
