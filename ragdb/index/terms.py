"""A writer's term -> term id table (``Index.term_cache``): :class:`TermDict`, a dict, the
reference and the fallback, or the compiled ``cterms.TermTable`` (C, built with the kernel),
which holds the same pairs without a Python object a term (~50 MiB less in the writing process
of the realistic 100k bulk load). :func:`new_table` makes the one the kernel switch chooses
(:mod:`ragdb.index.kernel`); both answer the same."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Union

import numpy as np

from ragdb.index import kernel

try:  # built by setup.py with the compiled kernel
    from ragdb.index import cterms as _cterms_module
    _cterms: ModuleType | None = _cterms_module
except ImportError:  # pragma: no cover - a platform without the extension
    _cterms = None


class TermDict(dict[str, int]):
    """The table as a dict (the reference), with the batch calls of the compiled one."""

    def missing(self, terms: Iterable[str]) -> list[str]:
        """The terms of ``terms`` not held (a set's: by one difference in C)."""
        if isinstance(terms, (set, frozenset)):
            return list(terms.difference(self))
        return [t for t in terms if t not in self]

    def ids_of(self, terms: Sequence[str]) -> np.ndarray:
        """The ids of ``terms`` (every one held: KeyError otherwise), as an int64 array."""
        return np.fromiter(map(self.__getitem__, terms), np.int64, len(terms))


if TYPE_CHECKING:
    from ragdb.index.cterms import TermTable as CTermTable

#: What the writer asks of its term table: either kind answers the same calls.
TermTable = Union[TermDict, "CTermTable"]


def new_table() -> TermTable:
    """An empty table: the compiled one where the compiled kernel runs, else a :class:`TermDict`."""
    if _cterms is not None and kernel.compiled() is not None:
        return _cterms.TermTable()
    return TermDict()
