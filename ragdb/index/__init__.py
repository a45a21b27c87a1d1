"""Scoring through the index: the in-memory inverted index and its postings codec
(:mod:`~ragdb.index.inverted`), query-language matching, BM25/TF-IDF, confidence, dense
vectors and the ANN graph, hybrid fusion, and how scores become hits."""


import importlib

_SUBMODULES = frozenset(['ann', 'cache', 'cforward', 'ckernel', 'confidence', 'cpassages', 'cterms', 'forward', 'fusion', 'hits', 'inverted',
                         'kernel', 'matching', 'scoring', 'terms', 'unitables', 'vectors'])


def __getattr__(name: str) -> object:
    # ``ragdb.index`` was the inverted-index module: its names still resolve here.
    if name.startswith("__") or name in _SUBMODULES:  # submodules load through the import system
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module("ragdb.index.inverted"), name)
