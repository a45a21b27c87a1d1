"""Queries as written: the query language (:mod:`ragdb.query.language`: phrases, exclusions,
OR, prefixes, fuzzy words, fields) and metadata filters (:mod:`ragdb.query.filters`)."""


import importlib

_SUBMODULES = frozenset(['filters', 'language'])


def __getattr__(name: str) -> object:
    # ``ragdb.query`` was the query-language module: its names still resolve here.
    if name.startswith("__") or name in _SUBMODULES:  # submodules load through the import system
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module("ragdb.query.language"), name)
