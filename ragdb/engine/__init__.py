"""The stages of one open database: the state they share (:mod:`~ragdb.engine.state`),
preparing records (:mod:`~ragdb.engine.prepare`), writing, searching, facets, and checking
every invariant. :class:`ragdb.Database` is the facade over them."""


import importlib

_SUBMODULES = frozenset(['check', 'facets', 'prepare', 'search', 'state', 'write'])


def __getattr__(name: str) -> object:
    # ``ragdb.engine`` was the module of ``Engine``: its names still resolve here.
    if name.startswith("__") or name in _SUBMODULES:  # submodules load through the import system
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module("ragdb.engine.state"), name)
